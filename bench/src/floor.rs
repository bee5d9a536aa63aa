//! `strait replicator floor`: what this machine's disk alone allows for the commit latency
//! that `strait replicator bench` measures.
//!
//! It models only the I/O a commit must wait for, with no Raft, no RPC and no database:
//! three threads ("nodes") each append an append's bytes to a file of their own and
//! `fdatasync` it, and an append commits when two of the three have synced (a quorum).
//! With `--leader-first`, node 1 (the leader) syncs before the other two are sent the
//! append, and the append commits when one of them has synced too: the order openraft 0.9
//! imposes, whose Raft core waits for the leader's own log flush before it replicates.
//! Records arrive at `--rate` and each append takes every record that has arrived (up to
//! `--batch`), with one append in flight, exactly as in the benchmark's phase 2, and the same
//! latency is reported: from a record's arrival to the commit of the append that carried it.
//!
//! `--background-mbps` adds what a store built on an LSM tree also writes while it runs: data
//! written through the page cache and sent to the disk every MiB (RocksDB's `bytes_per_sync`),
//! a 64 MiB file synced at its end and the one before it deleted (a memtable flush, then the
//! write-ahead log it replaces). `--copies` is how many times each record's bytes go into
//! the synced file (the Raft entry and the state machine's copy share RocksDB's log: 2).

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::replicator_bench::Latencies;

#[derive(clap::Args, Clone)]
pub struct FloorArgs {
    /// Records/s offered.
    #[arg(long, default_value_t = 50_000.0)]
    pub rate: f64,
    /// Seconds to run.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Bytes per record.
    #[arg(long, default_value_t = 128)]
    pub record_size: usize,
    /// Most records per append.
    #[arg(long, default_value_t = 4096)]
    pub batch: u64,
    /// How many times a record's bytes are written to each node's synced file.
    #[arg(long, default_value_t = 2.0)]
    pub copies: f64,
    /// MB/s written in the background, as flushes of an LSM tree (0: none).
    #[arg(long, default_value_t = 0.0)]
    pub background_mbps: f64,
    /// The leader syncs its copy before the followers are sent it (openraft 0.9's order),
    /// instead of all three syncing at once.
    #[arg(long)]
    pub leader_first: bool,
    /// Scratch directory (default: a new one under the system's temporary directory,
    /// removed after). Put it on the disk the benchmark uses.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// What a node thread is sent: an append's sequence number and its bytes.
type ToNode = mpsc::SyncSender<(u64, usize)>;

const NODES: usize = 3;
const QUORUM: usize = 2;
const MIB: usize = 1 << 20;
/// A background file is synced and the previous one deleted after this many MiB.
const BACKGROUND_FILE_MIB: usize = 64;

pub fn run(a: FloorArgs) -> Result<()> {
    if !(a.rate.is_finite() && a.rate > 0.0) {
        bail!("--rate must be a positive number of records per second");
    }
    if a.batch == 0 || a.record_size == 0 || a.seconds == 0 {
        bail!("--batch, --record-size and --seconds must be positive");
    }
    if !(a.copies.is_finite() && a.copies > 0.0 && a.copies <= 16.0) {
        bail!("--copies must be above 0 and at most 16");
    }
    if !(a.background_mbps.is_finite() && a.background_mbps >= 0.0) {
        bail!("--background-mbps must be 0 or more");
    }
    let (dir, remove) = match &a.dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
            (d.clone(), false)
        }
        None => (
            super::replicator_bench::tempfile_dir("replicator-floor")?,
            true,
        ),
    };
    let res = measure(&a, &dir);
    if remove {
        let _ = std::fs::remove_dir_all(&dir);
    }
    res
}

/// One node: append what it is sent and sync, report each append's sequence when synced.
fn node(
    file: &Path,
    rx: mpsc::Receiver<(u64, usize)>,
    done: mpsc::Sender<(u64, Duration)>,
) -> Result<()> {
    let mut f = File::create(file).with_context(|| format!("create {}", file.display()))?;
    let buf = vec![0x5au8; 4 * MIB];
    while let Ok((seq, mut bytes)) = rx.recv() {
        let t = Instant::now();
        while bytes > 0 {
            let n = bytes.min(buf.len());
            f.write_all(&buf[..n])
                .with_context(|| format!("write {}", file.display()))?;
            bytes -= n;
        }
        f.sync_data()
            .with_context(|| format!("fdatasync {}", file.display()))?;
        if done.send((seq, t.elapsed())).is_err() {
            break;
        }
    }
    Ok(())
}

/// Writes `mbps` in the background until `stop`, as an LSM tree's flushes do. Returns the
/// bytes written.
fn background(dir: &Path, mbps: f64, stop: &AtomicBool) -> Result<u64> {
    let chunk = vec![0xa5u8; MIB];
    let start = Instant::now();
    let mut written = 0u64;
    let mut file_no = 0u64;
    let mut prev: Option<PathBuf> = None;
    while !stop.load(Ordering::Relaxed) {
        let path = dir.join(format!("background-{file_no}"));
        let mut f = File::create(&path).with_context(|| format!("create {}", path.display()))?;
        for i in 0..BACKGROUND_FILE_MIB {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let due = start + Duration::from_secs_f64(written as f64 / (mbps * 1e6));
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            f.write_all(&chunk)
                .with_context(|| format!("write {}", path.display()))?;
            // start write-back of this MiB now, as RocksDB does with bytes_per_sync
            // SAFETY: the descriptor is open for the whole call; the range is within the file
            let r = unsafe {
                libc::sync_file_range(
                    f.as_raw_fd(),
                    (i * MIB) as libc::off64_t,
                    MIB as libc::off64_t,
                    libc::SYNC_FILE_RANGE_WRITE,
                )
            };
            if r != 0 {
                bail!(
                    "sync_file_range {}: {}",
                    path.display(),
                    std::io::Error::last_os_error()
                );
            }
            written += MIB as u64;
        }
        f.sync_all()
            .with_context(|| format!("fsync {}", path.display()))?;
        if let Some(p) = prev.take() {
            std::fs::remove_file(&p).with_context(|| format!("remove {}", p.display()))?;
        }
        prev = Some(path);
        file_no += 1;
    }
    Ok(written)
}

fn measure(a: &FloorArgs, dir: &Path) -> Result<()> {
    let (done_tx, done_rx) = mpsc::channel::<(u64, Duration)>();
    let mut senders = vec![];
    let mut nodes = vec![];
    for i in 0..NODES {
        let (tx, rx): (ToNode, _) = mpsc::sync_channel(1024);
        // a file of its own per order: truncating the other order's file would free blocks,
        // and their discard would stall this run's first syncs
        let file = dir.join(format!(
            "node{}{}.log",
            i + 1,
            if a.leader_first { "-leader-first" } else { "" }
        ));
        let done = done_tx.clone();
        nodes.push(std::thread::spawn(move || node(&file, rx, done)));
        senders.push(tx);
    }
    drop(done_tx);
    let stop = Arc::new(AtomicBool::new(false));
    let bg = (a.background_mbps > 0.0).then(|| {
        let stop = stop.clone();
        let dir = dir.to_path_buf();
        let mbps = a.background_mbps;
        std::thread::spawn(move || background(&dir, mbps, &stop))
    });

    let phase = Duration::from_secs(a.seconds);
    let t0 = Instant::now();
    let arrival = |i: u64| t0 + Duration::from_secs_f64(i as f64 / a.rate);
    let (mut sent, mut seq) = (0u64, 0u64);
    let (mut lat, mut calls, mut syncs) = (Latencies::new(), Latencies::new(), Latencies::new());
    while t0.elapsed() < phase {
        let arrived = (t0.elapsed().as_secs_f64() * a.rate) as u64 + 1;
        if arrived <= sent {
            if let Some(wait) = arrival(sent).checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            continue;
        }
        let n = (arrived - sent).min(a.batch);
        let bytes = (n as f64 * a.record_size as f64 * a.copies) as usize + 64;
        let started = Instant::now();
        // each stage: the nodes sent the append, and how many of their syncs it waits for
        let stages: &[(&[ToNode], usize)] = if a.leader_first {
            &[(&senders[..1], 1), (&senders[1..], 1)]
        } else {
            &[(&senders[..], QUORUM)]
        };
        for &(group, need) in stages {
            for tx in group {
                tx.send((seq, bytes))
                    .context("a node thread stopped (see its error below)")?;
            }
            let mut acks = 0;
            while acks < need {
                let (s, took) = done_rx
                    .recv()
                    .context("the node threads stopped (see their errors below)")?;
                syncs.record(took);
                if s == seq {
                    acks += 1;
                }
            }
        }
        let committed = Instant::now();
        calls.record(committed - started);
        for i in sent..sent + n {
            lat.record(committed.duration_since(arrival(i)));
        }
        sent += n;
        seq += 1;
    }
    let elapsed = t0.elapsed();
    drop(senders);
    stop.store(true, Ordering::Relaxed);
    let mut errors = vec![];
    for h in nodes {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(format!("{e:#}")),
            Err(_) => errors.push("a node thread panicked".into()),
        }
    }
    for (_, d) in done_rx.try_iter() {
        syncs.record(d);
    }
    let bg_bytes = match bg.map(|h| h.join()) {
        None => 0,
        Some(Ok(Ok(b))) => b,
        Some(Ok(Err(e))) => {
            errors.push(format!("background: {e:#}"));
            0
        }
        Some(Err(_)) => {
            errors.push("the background thread panicked".into());
            0
        }
    };
    if !errors.is_empty() {
        bail!("{}", errors.join("; "));
    }
    println!(
        "disk floor: {} nodes writing to {}, {}, records of {} B \
         written {}x, {:.0} records/s offered, {} s, background {:.1} MB/s",
        NODES,
        dir.display(),
        if a.leader_first {
            "commit when the leader has synced and then one of two followers (openraft 0.9's order)"
        } else {
            "commit on 2 of 3 fdatasyncs at once"
        },
        a.record_size,
        a.copies,
        a.rate,
        a.seconds,
        bg_bytes as f64 / 1e6 / elapsed.as_secs_f64()
    );
    println!(
        "  {:.0} records/s committed   commit latency p50 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms   ({} appends, {:.0} records each)",
        sent as f64 / elapsed.as_secs_f64(),
        lat.ms(0.5),
        lat.ms(0.99),
        lat.max_ms(),
        calls.len(),
        sent as f64 / calls.len().max(1) as f64
    );
    println!(
        "  append p50 {:>6.2} ms  p99 {:>6.2} ms   fdatasync p50 {:.2} ms  p99 {:.2} ms  p99.9 {:.2} ms  max {:.2} ms",
        calls.ms(0.5),
        calls.ms(0.99),
        syncs.ms(0.5),
        syncs.ms(0.99),
        syncs.ms(0.999),
        syncs.max_ms()
    );
    Ok(())
}
