//! `strait bench s3`: what a plain S3 client reads from a bucket, the limit an `s3://`
//! store's cold read is judged against (issue 42, item 1).
//!
//! The client is the AWS SDK for Rust as any program would set it up (its defaults, path-style
//! addressing for a local server, credentials from the usual `AWS_*` variables), none of
//! strait's code in between. It puts `--objects` objects of `--object-size` (strait's block
//! size by default) under a scratch prefix, then for each count in `--in-flight` drops the
//! page cache (so the server reads its disk, as for a cold read through a mount) and GETs
//! every object with that many requests in flight, in key order, as a sequential reader
//! would; it deletes what it put at the end, whatever happened. Rows are printed as `strait
//! bench DIR` prints them, with the CPU time per MiB of this program and of `--cpu-of`
//! processes (the S3 server).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::Client;
use tokio::sync::Semaphore;

use super::fs::{drop_caches, CpuOf};

#[derive(clap::Args)]
pub struct S3Args {
    /// The bucket, as a data URL: `s3://BUCKET[/PREFIX]?endpoint=URL&region=REGION`
    /// (credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY).
    #[arg(long)]
    pub url: String,
    /// Objects to put and read.
    #[arg(long, default_value_t = 1024)]
    pub objects: usize,
    /// Size of each object (strait's block size).
    #[arg(long, default_value = "4M")]
    pub object_size: String,
    /// Requests in flight while reading, one row each (comma-separated).
    #[arg(long, default_value = "1,4,16")]
    pub in_flight: String,
    /// Label printed with the results.
    #[arg(long, default_value = "")]
    pub label: String,
    /// Processes whose CPU time to count per MiB, as NAME=PID[,PID...] (the S3 server).
    #[arg(long = "cpu-of", value_name = "NAME=PIDS")]
    pub cpu_of: Vec<String>,
}

/// Requests in flight while putting the objects.
const PUT_IN_FLIGHT: usize = 8;

pub fn run(a: S3Args) -> Result<()> {
    let size = strait_ids::units::parse_size(&a.object_size)? as usize;
    if size == 0 || a.objects == 0 {
        bail!("--objects and --object-size must be positive");
    }
    let mut in_flight = vec![];
    for part in a.in_flight.split(',') {
        let n: usize = part
            .trim()
            .parse()
            .with_context(|| format!("--in-flight {:?}: {part:?} is not a count", a.in_flight))?;
        if n == 0 {
            bail!("--in-flight: counts must be positive");
        }
        in_flight.push(n);
    }
    let (bucket, prefix, endpoint, region) = match strait_fs_core::url::DataUrl::parse(&a.url)? {
        strait_fs_core::url::DataUrl::S3 {
            bucket,
            prefix,
            endpoint,
            region,
            ..
        } => (bucket, prefix, endpoint, region),
        _ => bail!("--url {:?}: expected an s3:// URL", a.url),
    };
    let cpu = CpuOf::parse(&a.cpu_of)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start a runtime")?;
    let client = rt.block_on(client(endpoint, region))?;
    if let Err(e) = rt.block_on(client.head_bucket().bucket(&bucket).send()) {
        let status = e.raw_response().map(|r| r.status().as_u16());
        bail!(
            "reach bucket {bucket} at {}: {}",
            a.url,
            match status {
                Some(s) => format!("HTTP {s}"),
                None => format!("{}", aws_sdk_s3::error::DisplayErrorContext(&e)),
            }
        );
    }
    let scratch = format!(
        "{}strait-bench-s3-{}/",
        if prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", prefix.trim_matches('/'))
        },
        std::process::id()
    );
    let keys: Vec<String> = (0..a.objects).map(|i| format!("{scratch}{i:08}")).collect();
    let mib = (a.objects * size) as f64 / (1 << 20) as f64;
    let mut rows = vec![];
    let res = rt.block_on(async {
        let data = bytes::Bytes::from((0..size).map(|i| (i * 131 % 251) as u8).collect::<Vec<_>>());
        let t = Instant::now();
        let ((), detail) = cpu
            .measure_async("MiB", async {
                for_each(&keys, PUT_IN_FLIGHT, |key| {
                    let (client, bucket, data) = (client.clone(), bucket.clone(), data.clone());
                    async move {
                        client
                            .put_object()
                            .bucket(bucket)
                            .key(&key)
                            .body(ByteStream::from(data))
                            .send()
                            .await
                            .map(|_| 0)
                            .with_context(|| format!("put {key}"))
                    }
                })
                .await?;
                Ok(((), mib))
            })
            .await?;
        rows.push((
            format!("S3 PUT, {PUT_IN_FLIGHT} in flight"),
            mib / t.elapsed().as_secs_f64(),
            detail,
        ));
        for &n in &in_flight {
            if !drop_caches() {
                eprintln!(
                    "strait bench s3: cannot drop the page cache (not root): the reads may be warm"
                );
            }
            let t = Instant::now();
            let (got, detail) = cpu
                .measure_async("MiB", async {
                    let got = for_each(&keys, n, |key| {
                        let (client, bucket) = (client.clone(), bucket.clone());
                        async move {
                            let out = client
                                .get_object()
                                .bucket(bucket)
                                .key(&key)
                                .send()
                                .await
                                .with_context(|| format!("get {key}"))?;
                            let body = out
                                .body
                                .collect()
                                .await
                                .with_context(|| format!("read the body of {key}"))?;
                            Ok(body.into_bytes().len() as u64)
                        }
                    })
                    .await?;
                    Ok((got, mib))
                })
                .await?;
            if got != (a.objects * size) as u64 {
                bail!("read {got} bytes, put {}", a.objects * size);
            }
            rows.push((
                format!("S3 GET, {n} in flight"),
                mib / t.elapsed().as_secs_f64(),
                detail,
            ));
        }
        Ok(())
    });
    // whatever happened: the scratch objects go
    let removed = rt.block_on(for_each(&keys, PUT_IN_FLIGHT, |key| {
        let (client, bucket) = (client.clone(), bucket.clone());
        async move {
            client
                .delete_object()
                .bucket(bucket)
                .key(&key)
                .send()
                .await
                .map(|_| 0)
                .with_context(|| format!("delete {key}"))
        }
    }));
    res?;
    removed?;
    let label = if a.label.is_empty() {
        a.url.clone()
    } else {
        a.label.clone()
    };
    println!(
        "benchmark of {label}: {} objects of {}",
        a.objects, a.object_size
    );
    println!("{:<26} {:>14} {:<10} DETAIL", "ITEM", "VALUE", "UNIT");
    for (name, value, detail) in rows {
        println!("{name:<26} {value:>14.1} {:<10} {detail}", "MiB/s");
    }
    Ok(())
}

/// A client with the credentials of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (a benchmark
/// is not the place to search the credential chain, instance metadata included).
async fn client(endpoint: Option<String>, region: Option<String>) -> Result<Client> {
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .with_context(|| format!("set {name} (the bucket's credentials)"))
    };
    let credentials = aws_sdk_s3::config::Credentials::new(
        var("AWS_ACCESS_KEY_ID")?,
        var("AWS_SECRET_ACCESS_KEY")?,
        None,
        None,
        "environment",
    );
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .credentials_provider(credentials);
    if let Some(region) = region {
        loader = loader.region(aws_config::Region::new(region));
    }
    let sdk = loader.load().await;
    let mut conf = aws_sdk_s3::config::Builder::from(&sdk).force_path_style(true);
    if let Some(endpoint) = endpoint {
        conf = conf.endpoint_url(endpoint);
    }
    Ok(Client::from_conf(conf.build()))
}

/// Run `f` on every key with at most `n` running at once, in key order; the sum of what they
/// return, or the first error.
async fn for_each<F, Fut>(keys: &[String], n: usize, f: F) -> Result<u64>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<u64>> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(n));
    let mut tasks = Vec::with_capacity(keys.len());
    for key in keys {
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .context("the request limit closed")?;
        let fut = f(key.clone());
        tasks.push(tokio::spawn(async move {
            let r = fut.await;
            drop(permit);
            r
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.context("a request task failed")??;
    }
    Ok(total)
}
