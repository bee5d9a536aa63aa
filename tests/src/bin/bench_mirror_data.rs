//! `bench_mirror_data`: the mirror's data path across a capped link (issue "mirror data path").
//!
//! Two regions on this machine, each with its own Garage S3 store: region A (a three-node
//! replicator, the primary daemon, a mount) and region B (mirrors with their own stores). The
//! mirrors reach A's store only through a fault proxy with a one-way delay and a bandwidth cap
//! shared by every connection (the inter-region link). It writes a dataset of many small
//! files and some big ones at A and prints, side by side:
//! - the write at A;
//! - an eager mirror's background copy: time from the last write to an empty queue, against
//!   bytes / link bandwidth;
//! - reads at a lazy mirror before any copy (every block crosses the link), against the link
//!   bandwidth, with every file's SHA-256 checked against A's;
//! - reads at the eager mirror after its copy (from B's store), against a read at A from A's
//!   store.
//!
//! Run it from the workspace's `tests/` directory after `cargo build --workspace
//! --all-targets`: `$CARGO_TARGET_DIR/debug/bench_mirror_data [--small 8192] [--small-kib
//! 128] [--big 4] [--big-mib 256] [--bw-mb-s 100] [--delay-ms 15] [--readers 64]`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use strait_chaos::{Faults, Link, Proxy};
use strait_tests::daemon::Primary;
use strait_tests::garage::Garage;
use strait_tests::mount::TestFs;
use strait_tests::replicator::RegionA;
use strait_tests::site::{mirror_row, primary_version, wait_applied};

struct Opts {
    small: usize,
    small_kib: usize,
    big: usize,
    big_mib: usize,
    bw_mb_s: f64,
    delay_ms: u64,
    readers: usize,
}

fn opts() -> Result<Opts> {
    let mut o = Opts {
        small: 8192,
        small_kib: 128,
        big: 4,
        big_mib: 256,
        bw_mb_s: 100.0,
        delay_ms: 15,
        readers: 64,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = args
            .get(i + 1)
            .with_context(|| format!("{} needs a value", args[i]))?;
        match args[i].as_str() {
            "--small" => o.small = v.parse()?,
            "--small-kib" => o.small_kib = v.parse()?,
            "--big" => o.big = v.parse()?,
            "--big-mib" => o.big_mib = v.parse()?,
            "--bw-mb-s" => o.bw_mb_s = v.parse()?,
            "--delay-ms" => o.delay_ms = v.parse()?,
            "--readers" => o.readers = v.parse::<usize>()?.max(1),
            other => bail!("unknown option {other}"),
        }
        i += 2;
    }
    Ok(o)
}

/// File `i`'s bytes.
fn content(i: usize, n: usize) -> Vec<u8> {
    strait_tests::random_bytes(i as u64, n)
}

/// Run `f` over `items` with `threads` workers.
fn parallel<T: Send + Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let out: Vec<parking_lot::Mutex<Option<R>>> = items
        .iter()
        .map(|_| parking_lot::Mutex::new(None))
        .collect();
    std::thread::scope(|s| {
        for _ in 0..threads.min(items.len()).max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(it) = items.get(i) else { break };
                *out[i].lock() = Some(f(it));
            });
        }
    });
    out.into_iter()
        .map(|m| m.into_inner().expect("every item ran"))
        .collect()
}

/// Read every file under `root` (`files` relative), `readers` at once; returns (seconds,
/// bytes, SHA-256 of each file).
fn read_all(root: &Path, files: &[(String, usize)], readers: usize) -> (f64, u64, Vec<String>) {
    let t0 = Instant::now();
    let sums = parallel(files, readers, |(rel, _)| {
        let data = std::fs::read(root.join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"));
        hex::encode(Sha256::digest(&data))
    });
    let bytes: u64 = files.iter().map(|f| f.1 as u64).sum();
    (t0.elapsed().as_secs_f64(), bytes, sums)
}

fn mb_s(bytes: u64, s: f64) -> f64 {
    bytes as f64 / 1e6 / s
}

fn wait_synced(m: &Primary, within: Duration) -> Result<Instant> {
    let t0 = Instant::now();
    loop {
        let row = mirror_row(&m.addr, &m.token);
        if row["blocks"]["pending_blocks"].as_u64() == Some(0) {
            return Ok(Instant::now());
        }
        if t0.elapsed() > within {
            bail!("the copy queue did not empty within {within:?}: {row}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn main() -> Result<()> {
    let o = opts()?;
    let rt = strait_tests::runtime();
    let ga = Garage::start().context("Garage is not installed")?;
    let gb = Garage::start().context("Garage is not installed")?;
    let work = tempfile::tempdir()?;
    let fs = TestFs::new(
        format!("rocksdb://{}", work.path().join("meta").display()),
        ga.data_url(),
        ga.env(),
        &[],
    );
    let region = RegionA::start_on(&rt, fs);
    let primary = region.primary(&[]);

    // the link between the regions, in front of A's S3 endpoint
    let a_s3: std::net::SocketAddr = ga
        .endpoint()
        .trim_start_matches("http://")
        .parse()
        .context("Garage's endpoint")?;
    let link = Proxy::start_blocking("127.0.0.1:0".parse()?, a_s3)?;
    let bw = (o.bw_mb_s * 1e6) as u64;
    let l = Link {
        latency: Duration::from_millis(o.delay_ms),
        bandwidth: Some(bw),
        blackhole: false,
    };
    link.set(Faults {
        up: l,
        down: l,
        refuse: false,
    });
    let across = format!(
        "s3://{}?endpoint=http://{}&region={}",
        ga.bucket(),
        link.addr(),
        ga.region()
    );
    let b_store = |prefix: &str| {
        format!(
            "s3://{}/{prefix}?endpoint={}&region={}",
            gb.bucket(),
            gb.endpoint(),
            gb.region()
        )
    };
    let eager = Primary::mirror(
        &primary,
        "b-eager",
        &region.addrs,
        &[
            "--data-url",
            &b_store("eager"),
            "--primary-data-url",
            &across,
            "--sync",
            "eager",
        ],
    );
    let lazy = Primary::mirror(
        &primary,
        "b-lazy",
        &region.addrs,
        &[
            "--data-url",
            &b_store("lazy"),
            "--primary-data-url",
            &across,
            "--sync",
            "lazy",
        ],
    );

    // the dataset, written at A
    let mut files: Vec<(String, usize)> = vec![];
    for i in 0..o.small {
        files.push((format!("ds/small/{:03}/{i}", i % 64), o.small_kib << 10));
    }
    for i in 0..o.big {
        files.push((format!("ds/big/{i}"), o.big_mib << 20));
    }
    let total: u64 = files.iter().map(|f| f.1 as u64).sum();
    let a = primary.mount(&["--cache-size", "0"]);
    for i in 0..64 {
        std::fs::create_dir_all(a.path(&format!("ds/small/{i:03}")))?;
    }
    std::fs::create_dir_all(a.path("ds/big"))?;
    println!(
        "dataset: {} files of {} KiB and {} of {} MiB, {:.2} GiB; link {} MB/s, {} ms one way",
        o.small,
        o.small_kib,
        o.big,
        o.big_mib,
        total as f64 / (1u64 << 30) as f64,
        o.bw_mb_s,
        o.delay_ms
    );
    let indexed: Vec<(usize, (String, usize))> = files.iter().cloned().enumerate().collect();
    let t0 = Instant::now();
    let sums_a = parallel(&indexed, 8, |(i, (rel, n))| {
        let data = content(*i, *n);
        let p: PathBuf = a.path(rel);
        std::fs::write(&p, &data).unwrap_or_else(|e| panic!("write {rel}: {e}"));
        hex::encode(Sha256::digest(&data))
    });
    let last_write = Instant::now();
    let write_s = t0.elapsed().as_secs_f64();
    println!(
        "write at A:                     {:>8.1} s  {:>7.1} MB/s",
        write_s,
        mb_s(total, write_s)
    );

    // the eager mirror's copy, running since the first write: from the last write to an
    // empty queue
    let done = wait_synced(&eager, Duration::from_secs(3600))?;
    let sync_s = done.duration_since(last_write).as_secs_f64();
    let ideal = total as f64 / bw as f64;
    println!(
        "eager copy done after last write: {:>6.1} s  (bytes / link = {:.1} s; ×{:.2})",
        sync_s,
        ideal,
        sync_s / ideal
    );

    // reads at the lazy mirror, which copied nothing: every block crosses the link (now free)
    let v = primary_version(&primary);
    wait_applied(&lazy, v, Duration::from_secs(120));
    let lb = lazy.mount(&["--cache-size", "0"]);
    let (s, bytes, sums_b) = read_all(&lb.path(""), &files, o.readers);
    let mismatched = sums_a.iter().zip(&sums_b).filter(|(x, y)| x != y).count();
    println!(
        "read at B before sync (lazy):   {:>8.1} s  {:>7.1} MB/s  = {:.0} % of the link; {} of {} files differ",
        s,
        mb_s(bytes, s),
        100.0 * mb_s(bytes, s) / o.bw_mb_s,
        mismatched,
        files.len()
    );
    drop(lb);
    let row = mirror_row(&lazy.addr, &lazy.token);
    println!(
        "  lazy mirror: {} fallback reads, {} bytes across regions",
        row["blocks"]["fallback_reads"], row["blocks"]["cross_region_read_bytes"]
    );

    // after the copy: reads at B from B's store, against reads at A from A's store
    let eb = eager.mount(&["--cache-size", "0"]);
    let (sb, bytes_b, sums_e) = read_all(&eb.path(""), &files, o.readers);
    drop(eb);
    drop(a);
    let a2 = primary.mount(&["--cache-size", "0"]);
    let (sa, bytes_a, _) = read_all(&a2.path(""), &files, o.readers);
    let mismatched = sums_a.iter().zip(&sums_e).filter(|(x, y)| x != y).count();
    println!(
        "read at A from A's store:       {:>8.1} s  {:>7.1} MB/s",
        sa,
        mb_s(bytes_a, sa)
    );
    println!(
        "read at B after sync:           {:>8.1} s  {:>7.1} MB/s  = {:.0} % of A's; {} files differ",
        sb,
        mb_s(bytes_b, sb),
        100.0 * mb_s(bytes_b, sb) / mb_s(bytes_a, sa),
        mismatched
    );
    let row = mirror_row(&eager.addr, &eager.token);
    println!(
        "  eager mirror: {} blocks copied ({} bytes), {} fallback reads, {} errors",
        row["blocks"]["copied_blocks"],
        row["blocks"]["copied_bytes"],
        row["blocks"]["fallback_reads"],
        row["blocks"]["errors"]
    );
    let st = link.stats();
    println!(
        "  link: {} bytes toward B, {} toward A",
        st.bytes_down.load(Ordering::Relaxed),
        st.bytes_up.load(Ordering::Relaxed)
    );
    let _keep = Arc::new(work);
    Ok(())
}
