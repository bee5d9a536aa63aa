//! `cargo bench --bench mirror_data`: the mirror's data path across a capped link (issue "mirror data path").
//!
//! Two regions on this machine, each with its own Garage S3 store: region A (a three-node
//! replicator, the primary daemon, a mount) and region B (an eager and a lazy mirror, each
//! with a Garage of its own). Every Garage runs without compression (the data is random). The
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
//! Run it with `cargo bench --bench mirror_data -- [--small 8192] [--small-kib 128] [--big 4]
//! [--big-mib 256] [--bw-mb-s 100] [--delay-ms 15] [--readers 64] [--threads N]` (`--threads`:
//! the mounts' FUSE threads; their default when not given): a release build of the program
//! and of the `strait` binary it runs, which cargo builds first. Needs Garage and FUSE.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::daemon::Primary;
use crate::support::garage::Garage;
use crate::support::mount::TestFs;
use crate::support::replicator::RegionA;
use crate::support::site::{mirror_row, primary_version, wait_applied};
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use strait_devkit::usage::{cpu_busy_since, cpu_ticks, process_cpu_s};
use strait_devkit::{Faults, Link, Proxy};

struct Opts {
    small: usize,
    small_kib: usize,
    big: usize,
    big_mib: usize,
    bw_mb_s: f64,
    delay_ms: u64,
    readers: usize,
    threads: usize,
    progress_s: f64,
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
        threads: 0,
        progress_s: 5.0,
    };
    let args: Vec<String> = std::env::args()
        .skip(1)
        // `cargo bench` passes it to every bench program
        .filter(|a| a != "--bench")
        .collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "cargo bench --bench mirror_data -- [--small 8192] [--small-kib 128] [--big 4] [--big-mib 256] \
             [--bw-mb-s 100] [--delay-ms 15] [--readers 64] [--threads N] [--progress-s 5]\n\
             --progress-s: a line every so many seconds during the lazy read (0: none).\n\
             Needs garage and FUSE."
        );
        std::process::exit(0);
    }
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
            "--threads" => o.threads = v.parse()?,
            "--progress-s" => o.progress_s = v.parse()?,
            other => bail!("unknown option {other}"),
        }
        i += 2;
    }
    Ok(o)
}

/// File `i`'s bytes.
fn content(i: usize, n: usize) -> Vec<u8> {
    crate::support::random_bytes(i as u64, n)
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

/// The order the readers take the files in: shuffled, as a training job's data loader does
/// (in the order written, the big files would come last, each read by one reader alone).
fn read_order(n: usize) -> Vec<usize> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(7));
    order
}

/// A file's SHA-256 and length, read through one buffer per reader thread (as a training
/// job's loader reads): reading a file whole into a new buffer made the kernel fault in and
/// zero fresh pages for every byte, which cost this program more CPU than its hashing.
fn stream_sha256(path: &Path) -> std::io::Result<(String, u64)> {
    use std::io::Read;
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; 1 << 20]);
    }
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut n = 0u64;
    BUF.with_borrow_mut(|buf| loop {
        match f.read(buf) {
            Ok(0) => return Ok((hex::encode(h.finalize_reset()), n)),
            Ok(k) => {
                h.update(&buf[..k]);
                n += k as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    })
}

/// Read every file under `root` (`files` relative), `readers` at once, in `order`; returns
/// (seconds, bytes, SHA-256 of each file and the seconds its read took, in the order of
/// `files`).
fn read_all(
    root: &Path,
    files: &[(String, usize)],
    order: &[usize],
    readers: usize,
    progress: Option<(Duration, &(dyn Fn() -> u64 + Sync))>,
) -> (f64, u64, Vec<(String, f64)>) {
    let t0 = Instant::now();
    let done = AtomicUsize::new(0);
    let done_bytes = std::sync::atomic::AtomicU64::new(0);
    let finished = std::sync::atomic::AtomicBool::new(false);
    let sums = std::thread::scope(|s| {
        if let Some((every, link_bytes)) = progress {
            // a line every `every`: files and bytes done, the link's rate and the CPUs' use
            // over the last interval
            let (done, done_bytes, finished) = (&done, &done_bytes, &finished);
            s.spawn(move || {
                let (mut cpu, mut link, mut at) = (cpu_ticks(), link_bytes(), Instant::now());
                while !finished.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(100));
                    if at.elapsed() < every {
                        continue;
                    }
                    let l = link_bytes();
                    println!(
                        "    {:>5.1} s: {} of {} files, {:.0} MB; link {:.1} MB/s, CPUs {:.0} % busy",
                        t0.elapsed().as_secs_f64(),
                        done.load(Ordering::Relaxed),
                        files.len(),
                        done_bytes.load(Ordering::Relaxed) as f64 / 1e6,
                        mb_s(l - link, at.elapsed().as_secs_f64()),
                        cpu_busy_since(cpu)
                    );
                    (cpu, link, at) = (cpu_ticks(), l, Instant::now());
                }
            });
        }
        let sums = parallel(order, readers, |&i| {
            let rel = &files[i].0;
            let t = Instant::now();
            let (sum, n) =
                stream_sha256(&root.join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"));
            let secs = t.elapsed().as_secs_f64();
            done.fetch_add(1, Ordering::Relaxed);
            done_bytes.fetch_add(n, Ordering::Relaxed);
            (i, (sum, secs))
        });
        finished.store(true, Ordering::Relaxed);
        sums
    });
    let secs = t0.elapsed().as_secs_f64();
    let mut by_file = vec![(String::new(), 0.0); files.len()];
    for (i, sum) in sums {
        by_file[i] = sum;
    }
    let bytes: u64 = files.iter().map(|f| f.1 as u64).sum();
    (secs, bytes, by_file)
}

/// The CPU time of named processes over a phase.
struct CpuShare(Vec<(&'static str, u32, f64)>);

impl CpuShare {
    fn start(procs: &[(&'static str, Option<u32>)]) -> CpuShare {
        CpuShare(
            procs
                .iter()
                .filter_map(|(name, pid)| Some((*name, (*pid)?, process_cpu_s((*pid)?))))
                .collect(),
        )
    }

    /// "name X ms, ..." per `per` (files), the biggest first.
    fn per(&self, per: usize) -> String {
        let mut v: Vec<(&str, f64)> = self
            .0
            .iter()
            .map(|(n, pid, s0)| (*n, (process_cpu_s(*pid) - s0).max(0.0)))
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        v.iter()
            .map(|(n, s)| format!("{n} {:.2} ms", 1e3 * s / per.max(1) as f64))
            .collect::<Vec<_>>()
            .join(", ")
    }
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
    let rt = crate::support::runtime();
    let ga = Garage::start().context("Garage is not installed")?;
    // region B: one Garage per mirror, so that the eager mirror's store holds what A's holds
    // and nothing else
    let gb = Garage::start().context("Garage is not installed")?;
    let gl = Garage::start().context("Garage is not installed")?;
    let region = RegionA::start_on(&rt, TestFs::rocks_on(ga.data_url(), ga.env()));
    let primary = region.primary(&[]);

    // the link between the regions, in front of A's S3 endpoint
    let link = Proxy::start_blocking("127.0.0.1:0".parse()?, ga.s3_addr())?;
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
    let across = ga.data_url_at("", &link.addr().to_string());
    // a mirror on its own Garage, reaching A's store across the link
    let mirror = |id: &str, store: &Garage, sync: &str| {
        Primary::mirror(
            &primary,
            id,
            &region.addrs,
            &[
                "--data-url",
                &store.data_url_at("", &store.s3_addr().to_string()),
                "--primary-data-url",
                &across,
                "--sync",
                sync,
            ],
        )
    };
    let eager = mirror("b-eager", &gb, "eager");
    let lazy = mirror("b-lazy", &gl, "lazy");

    // the dataset, written at A
    let mut files: Vec<(String, usize)> = vec![];
    for i in 0..o.small {
        files.push((format!("ds/small/{:03}/{i}", i % 64), o.small_kib << 10));
    }
    for i in 0..o.big {
        files.push((format!("ds/big/{i}"), o.big_mib << 20));
    }
    let total: u64 = files.iter().map(|f| f.1 as u64).sum();
    let threads = o.threads.to_string();
    let mut margs = vec!["--cache-size", "0"];
    if o.threads > 0 {
        margs.extend(["--threads", threads.as_str()]);
    }
    let a = primary.mount(&margs);
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
    let v = primary_version(&primary);
    wait_applied(&eager, v, Duration::from_secs(600));
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
    wait_applied(&lazy, v, Duration::from_secs(120));
    let order = read_order(files.len());
    let lb = lazy.mount(&margs);
    let cpu = cpu_ticks();
    let share = CpuShare::start(&[
        ("mount", lb.pid()),
        ("mirror", lazy.pid()),
        ("B's Garage", Some(gl.pid())),
        ("A's Garage", Some(ga.pid())),
        (
            "this program (readers, link proxy)",
            Some(std::process::id()),
        ),
    ]);
    let down0 = link.stats().bytes_down.load(Ordering::Relaxed);
    let link_down = || link.stats().bytes_down.load(Ordering::Relaxed);
    let progress = (o.progress_s > 0.0).then(|| {
        (
            Duration::from_secs_f64(o.progress_s),
            &link_down as &(dyn Fn() -> u64 + Sync),
        )
    });
    let (s, bytes, sums_b) = read_all(&lb.path(""), &files, &order, o.readers, progress);
    let down = link.stats().bytes_down.load(Ordering::Relaxed) - down0;
    let busy = cpu_busy_since(cpu);
    let shares = share.per(files.len());
    let mismatched = sums_a
        .iter()
        .zip(&sums_b)
        .filter(|(x, y)| **x != y.0)
        .count();
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
        "  lazy mirror: {} fallback reads, {} bytes across regions; CPUs {busy:.0} % busy ({} cores)",
        row["blocks"]["fallback_reads"],
        row["blocks"]["cross_region_read_bytes"],
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    // the proof that the link held its cap while the readers ran, and that no block crossed
    // it twice (the dataset's bytes, plus the calls' own)
    println!(
        "  link toward B meanwhile: {down} bytes = {:.1} MB/s (cap {} MB/s) = {:.3} × the dataset",
        mb_s(down, s),
        o.bw_mb_s,
        down as f64 / total.max(1) as f64
    );
    // how the readers of the big files, read at the same time as each other and the small
    // ones, shared the link: each file's own rate
    let mut big: Vec<f64> = files
        .iter()
        .zip(&sums_b)
        .filter(|(f, _)| f.1 == o.big_mib << 20)
        .map(|(f, r)| mb_s(f.1 as u64, r.1))
        .collect();
    if !big.is_empty() {
        big.sort_by(f64::total_cmp);
        println!(
            "  each big file's own read rate: min {:.1}, median {:.1}, max {:.1} MB/s ({} files)",
            big[0],
            big[big.len() / 2],
            big[big.len() - 1],
            big.len()
        );
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    println!(
        "  CPU per file read: {:.2} ms on all cores; {shares}",
        1e3 * busy / 100.0 * cores * s / files.len().max(1) as f64
    );

    // after the copy: reads at B from B's store, against reads at A from A's store, in turn
    // (A, B, A, B, A, B: this machine is shared, and one pass each would measure its
    // neighbours); the best of each is compared;
    // each round with fresh mounts, so that no block comes from a mount's memory
    drop(a);
    let (mut best_a, mut best_b) = (f64::MAX, f64::MAX);
    let mut mismatched = 0;
    for round in 1..=3 {
        let a2 = primary.mount(&margs);
        let (sa, _, _) = read_all(&a2.path(""), &files, &order, o.readers, None);
        drop(a2);
        let eb = eager.mount(&margs);
        let (sb, _, sums_e) = read_all(&eb.path(""), &files, &order, o.readers, None);
        drop(eb);
        mismatched += sums_a
            .iter()
            .zip(&sums_e)
            .filter(|(x, y)| **x != y.0)
            .count();
        println!(
            "  round {round}: read at A from A's store {:>6.1} MB/s, at B from B's store {:>6.1} MB/s",
            mb_s(total, sa),
            mb_s(total, sb)
        );
        best_a = best_a.min(sa);
        best_b = best_b.min(sb);
    }
    println!(
        "read at A from A's store (best): {:>7.1} s  {:>7.1} MB/s",
        best_a,
        mb_s(total, best_a)
    );
    println!(
        "read at B after sync (best):     {:>7.1} s  {:>7.1} MB/s  = {:.0} % of A's; {} files differ",
        best_b,
        mb_s(total, best_b),
        100.0 * best_a / best_b,
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
    Ok(())
}
