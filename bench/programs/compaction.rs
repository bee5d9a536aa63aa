//! `cargo bench --bench compaction`: what random small writes cost the stores and the link (issue "training
//! at a mirror", item 5).
//!
//! Region A (a three-node replicator, the primary daemon, a mount) on a Garage of its own,
//! and an eager mirror in region B on another Garage, reaching A's store only through a fault
//! proxy with a one-way delay and a bandwidth cap (the link). fio writes at A's mount: random
//! writes of `--bs-kib` into `--files` files of `--file-mib` each, `--io-mib` per file, one
//! job per file. It prints side by side:
//! - bytes the application wrote (fio's count);
//! - bytes in each region's store at the end: the file system is formatted with the default
//!   `--gc-delay` (600 s), so nothing is deleted during the run and A's store holds every
//!   byte PUT to it; B's holds every byte the mirror copied;
//! - bytes across the link toward B (the proxy's count);
//! - the peak size of each store, sampled every `--sample-s` seconds;
//! - each as a multiple of the application's bytes (the link, the stores) or of the files'
//!   size (the peak);
//! - the mirror's skipped dead blocks, and CPU seconds per process.
//!
//! Run it with `cargo bench --bench compaction -- [--files 2] [--file-mib 256] [--io-mib 360]
//! [--bs-kib 64] [--bw-mb-s 200] [--delay-ms 15] [--sample-s 2]`: a release build of the
//! program and of the `strait` binary it runs, which cargo builds first. Needs fio, Garage and
//! FUSE.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::garage::Garage;
use crate::support::mount::TestFs;
use crate::support::replicator::RegionA;
use crate::support::site::{mirror_row, primary_version, wait_applied};
use anyhow::{bail, Context, Result};
use strait_devkit::usage::process_cpu_s;
use strait_devkit::{Faults, Link, Proxy};
use strait_fs_core::object::DynStore;

struct Opts {
    files: usize,
    file_mib: u64,
    io_mib: u64,
    bs_kib: u64,
    bw_mb_s: f64,
    delay_ms: u64,
    sample_s: f64,
}

fn opts() -> Result<Opts> {
    let mut o = Opts {
        files: 2,
        file_mib: 256,
        io_mib: 360,
        bs_kib: 64,
        bw_mb_s: 200.0,
        delay_ms: 15,
        sample_s: 2.0,
    };
    let args: Vec<String> = std::env::args()
        .skip(1)
        // `cargo bench` passes it to every bench program
        .filter(|a| a != "--bench")
        .collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "cargo bench --bench compaction -- [--files 2] [--file-mib 256] [--io-mib 360] [--bs-kib 64] \
             [--bw-mb-s 200] [--delay-ms 15] [--sample-s 2]\n\
             Random writes with fio at region A; bytes in each store, across the link, and \
             the stores' peak size. Needs fio, garage and FUSE."
        );
        std::process::exit(0);
    }
    let mut i = 0;
    while i < args.len() {
        let v = args
            .get(i + 1)
            .with_context(|| format!("{} needs a value", args[i]))?;
        match args[i].as_str() {
            "--files" => o.files = v.parse::<usize>()?.max(1),
            "--file-mib" => o.file_mib = v.parse()?,
            "--io-mib" => o.io_mib = v.parse()?,
            "--bs-kib" => o.bs_kib = v.parse()?,
            "--bw-mb-s" => o.bw_mb_s = v.parse()?,
            "--delay-ms" => o.delay_ms = v.parse()?,
            "--sample-s" => o.sample_s = v.parse()?,
            other => bail!("unknown option {other}"),
        }
        i += 2;
    }
    Ok(o)
}

/// Bytes and objects under `chunks/` in a store.
async fn stored(store: &DynStore) -> Result<(u64, u64)> {
    let (mut bytes, mut objects) = (0, 0);
    let mut after: Option<String> = None;
    loop {
        let page = store.list("chunks/", after.as_deref(), 1000).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.key.clone());
        objects += page.len() as u64;
        bytes += page.iter().map(|o| o.size).sum::<u64>();
    }
    Ok((bytes, objects))
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

fn main() -> Result<()> {
    let o = opts()?;
    if std::process::Command::new("fio")
        .arg("--version")
        .output()
        .is_err()
    {
        bail!("fio is not installed (apt-get install fio)");
    }
    let rt = crate::support::runtime();
    let ga = Garage::start().context("Garage is not installed")?;
    let gb = Garage::start().context("Garage is not installed")?;
    let region = RegionA::start_on(&rt, TestFs::rocks_on(ga.data_url(), ga.env()));
    let primary = region.primary(&[]);
    let link = Proxy::start_blocking("127.0.0.1:0".parse()?, ga.s3_addr())?;
    let l = Link {
        latency: Duration::from_millis(o.delay_ms),
        bandwidth: Some((o.bw_mb_s * 1e6) as u64),
        blackhole: false,
    };
    link.set(Faults {
        up: l,
        down: l,
        refuse: false,
    });
    let mirror = crate::support::daemon::Primary::mirror(
        &primary,
        "b",
        &region.addrs,
        &[
            "--data-url",
            &gb.data_url_at("", &gb.s3_addr().to_string()),
            "--primary-data-url",
            &ga.data_url_at("", &link.addr().to_string()),
            "--sync",
            "eager",
        ],
    );
    let a = primary.mount(&[]);
    let (store_a, store_b) = rt.block_on(async { (ga.store().await, gb.store().await) });
    let dir = a.path("amp");
    std::fs::create_dir_all(&dir)?;
    println!(
        "fio: random {} KiB writes, {} files of {} MiB, {} MiB per file; eager mirror over \
         {} MB/s, {} ms one way; gc-delay 600 s (nothing deleted during the run)",
        o.bs_kib, o.files, o.file_mib, o.io_mib, o.bw_mb_s, o.delay_ms
    );

    // the stores' peak size, sampled while fio runs and until the mirror has caught up
    let done = Arc::new(AtomicBool::new(false));
    let peak_a = Arc::new(AtomicU64::new(0));
    let peak_b = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (done, peak_a, peak_b) = (done.clone(), peak_a.clone(), peak_b.clone());
        let (sa, sb) = (store_a.clone(), store_b.clone());
        let every = Duration::from_secs_f64(o.sample_s.max(0.1));
        let handle = rt.handle().clone();
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if let Ok((b, _)) = handle.block_on(stored(&sa)) {
                    peak_a.fetch_max(b, Ordering::Relaxed);
                }
                if let Ok((b, _)) = handle.block_on(stored(&sb)) {
                    peak_b.fetch_max(b, Ordering::Relaxed);
                }
                std::thread::sleep(every);
            }
        })
    };
    let procs: Vec<(&str, Option<u32>)> = vec![
        ("A's mount", a.pid()),
        ("primary", primary.pid()),
        ("mirror", mirror.pid()),
        ("A's Garage", Some(ga.pid())),
        ("B's Garage", Some(gb.pid())),
        ("this program (link proxy)", Some(std::process::id())),
    ];
    let cpu0: Vec<f64> = procs
        .iter()
        .map(|(_, p)| p.map(process_cpu_s).unwrap_or(0.0))
        .collect();
    let down0 = link.stats().bytes_down.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let out = std::process::Command::new("fio")
        .arg(format!("--directory={}", dir.display()))
        .args([
            "--name=amp",
            "--rw=randwrite",
            "--ioengine=psync",
            "--fallocate=none",
            "--end_fsync=1",
            "--group_reporting",
            "--output-format=json",
        ])
        .arg(format!("--bs={}k", o.bs_kib))
        .arg(format!("--size={}m", o.file_mib))
        .arg(format!("--io_size={}m", o.io_mib))
        .arg(format!("--numjobs={}", o.files))
        .output()
        .context("run fio")?;
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let fio_s = t0.elapsed().as_secs_f64();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).context("fio's json")?;
    let app = report["jobs"][0]["write"]["io_bytes"]
        .as_u64()
        .context("fio's json has no write io_bytes")?;
    println!(
        "fio wrote {} in {fio_s:.1} s ({:.1} MB/s)",
        mib(app),
        app as f64 / 1e6 / fio_s
    );

    // compactions run after the writes' commits: wait until the primary's version stands
    // still for 5 s, then until the mirror applied it and copied its queue
    let mut v = primary_version(&primary);
    let mut still = Instant::now();
    while still.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(500));
        let now = primary_version(&primary);
        if now != v {
            v = now;
            still = Instant::now();
        }
    }
    wait_applied(&mirror, v, Duration::from_secs(600));
    let t_sync = Instant::now();
    loop {
        let row = mirror_row(&mirror.addr, &mirror.token);
        if row["blocks"]["pending_blocks"].as_u64() == Some(0) {
            break;
        }
        if t_sync.elapsed() > Duration::from_secs(3600) {
            bail!("the mirror's copy queue did not empty in an hour: {row}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let total_s = t0.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let down = link.stats().bytes_down.load(Ordering::Relaxed) - down0;
    let ((bytes_a, objs_a), (bytes_b, objs_b)) = rt.block_on(async {
        Ok::<_, anyhow::Error>((stored(&store_a).await?, stored(&store_b).await?))
    })?;
    let pa = peak_a.load(Ordering::Relaxed).max(bytes_a);
    let pb = peak_b.load(Ordering::Relaxed).max(bytes_b);
    let files = o.files as u64 * (o.file_mib << 20);
    let row = mirror_row(&mirror.addr, &mirror.token);
    let x = |b: u64, of: u64| b as f64 / of.max(1) as f64;

    println!();
    println!("| measure | bytes | × app bytes | × files' size |");
    println!("|---|---|---|---|");
    println!(
        "| written by the application (fio) | {} | 1.00 | {:.2} |",
        mib(app),
        x(app, files)
    );
    println!(
        "| in A's store at the end = PUT to it ({objs_a} objects) | {} | {:.2} | {:.2} |",
        mib(bytes_a),
        x(bytes_a, app),
        x(bytes_a, files)
    );
    println!(
        "| in B's store at the end = copied to it ({objs_b} objects) | {} | {:.2} | {:.2} |",
        mib(bytes_b),
        x(bytes_b, app),
        x(bytes_b, files)
    );
    println!(
        "| across the link toward B | {} | {:.2} | {:.2} |",
        mib(down),
        x(down, app),
        x(down, files)
    );
    println!(
        "| peak of A's store | {} | {:.2} | {:.2} |",
        mib(pa),
        x(pa, app),
        x(pa, files)
    );
    println!(
        "| peak of B's store | {} | {:.2} | {:.2} |",
        mib(pb),
        x(pb, app),
        x(pb, files)
    );
    println!();
    println!(
        "files' size {}; from fio's start to B caught up {total_s:.1} s; mirror: {} blocks \
         copied, {} queued blocks skipped as dead ({})",
        mib(files),
        row["blocks"]["copied_blocks"],
        row["blocks"]["skipped_dead_blocks"],
        mib(row["blocks"]["skipped_dead_bytes"].as_u64().unwrap_or(0)),
    );
    let used: Vec<f64> = procs
        .iter()
        .zip(cpu0)
        .map(|((_, p), c0)| p.map(process_cpu_s).unwrap_or(0.0) - c0)
        .collect();
    let each: Vec<String> = procs
        .iter()
        .zip(&used)
        .map(|((n, _), s)| format!("{n} {s:.1}"))
        .collect();
    println!(
        "CPU seconds over the run: {}; {:.1} ms per MiB written, all of them together",
        each.join(", "),
        1e3 * used.iter().sum::<f64>() / (app as f64 / (1u64 << 20) as f64)
    );
    drop(a);
    Ok(())
}
