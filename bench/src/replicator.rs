//! `strait replicator bench`: three replicator nodes in this process, talking gRPC over
//! loopback sockets (through fault proxies adding a one-way delay when asked), each with its
//! own RocksDB. Phase 1 appends batches back to back and reports committed records/s;
//! phase 2 appends at half that rate and reports the commit latency of each append. On plain
//! loopback, the disk's floor for that latency follows ([`super::replicator_floor`]).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strait_auth::Role;
use strait_devkit::{Faults, Proxy};
use strait_proto::replicator as pb;
use strait_proto::replicator::replicator_client::ReplicatorClient;
use strait_replicator::node::{Node, NodeAuth, NodeConfig};

#[derive(clap::Args, Clone)]
pub struct BenchArgs {
    /// One-way delay added to every link between nodes, in ms (0: plain loopback).
    #[arg(long, default_value_t = 0)]
    pub delay_ms: u64,
    /// Most records per append: the writer sends whatever has arrived, up to this many, with
    /// one append in flight (as the primary's shipper does).
    #[arg(long, default_value_t = 4096)]
    pub batch: u64,
    /// Bytes per record.
    #[arg(long, default_value_t = 128)]
    pub record_size: usize,
    /// Seconds per phase.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Records/s offered in phase 2 (default: half the rate measured in phase 1).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Scratch directory (default: a new one under /tmp, removed after).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
    /// Build a snapshot after this many Raft entries (default: a node's default). With no
    /// mirror in the cluster every record is retained, so a small interval shows what
    /// snapshots of a large log cost.
    #[arg(long)]
    pub snapshot_every: Option<u64>,
    /// Skip the disk floors printed after phase 2 on plain loopback (`strait replicator
    /// floor` at phase 2's rate, in the same directory, after the nodes have stopped: with
    /// the three syncs at once, then with `--leader-first`).
    #[arg(long)]
    pub no_floor: bool,
}

/// Latencies in microseconds to 3 significant figures (an HDR histogram): percentiles without
/// keeping and sorting every sample.
pub(super) struct Latencies(hdrhistogram::Histogram<u64>);

impl Latencies {
    pub(super) fn new() -> Self {
        Latencies(hdrhistogram::Histogram::new(3).expect("3 significant figures are allowed"))
    }

    pub(super) fn record(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        // `record` grows the histogram to fit (`saturating_record` does not: it clamped every
        // latency to the initial range, about 2 ms); only a value past what any histogram can
        // hold is clamped
        if self.0.record(us).is_err() {
            self.0.saturating_record(us);
        }
    }

    /// The `q` quantile (0..=1) in ms (0 with no samples).
    pub(super) fn ms(&self, q: f64) -> f64 {
        self.0.value_at_quantile(q) as f64 / 1000.0
    }

    pub(super) fn max_ms(&self) -> f64 {
        self.0.max() as f64 / 1000.0
    }

    pub(super) fn len(&self) -> u64 {
        self.0.len()
    }
}

pub async fn run(a: BenchArgs) -> Result<()> {
    if a.batch == 0 || a.batch > strait_proto::limits::APPEND_RECORDS_MAX as u64 {
        bail!(
            "--batch must be between 1 and {}",
            strait_proto::limits::APPEND_RECORDS_MAX
        );
    }
    if a.snapshot_every == Some(0) {
        bail!("--snapshot-every must be at least 1");
    }
    if a.record_size == 0
        || a.batch as usize * a.record_size > strait_proto::limits::APPEND_BYTES_MAX
    {
        bail!(
            "--record-size must be positive and a batch at most {} bytes",
            strait_proto::limits::APPEND_BYTES_MAX
        );
    }
    let tmp;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile_dir("replicator-bench")?;
            tmp.clone()
        }
    };
    let mut nodes = vec![];
    let mut proxies = vec![];
    let mut members = std::collections::HashMap::new();
    // one token for the roles the benchmark plays (peer, primary, admin), as `dev up` gives
    // one per role: authentication is on, as in any real cluster
    let token = strait_auth::new_token();
    let auth = NodeAuth::tokens(&[
        (Role::Peer, &token),
        (Role::Primary, &token),
        (Role::Admin, &token),
    ])?;
    let creds = strait_replicator_client::Credentials::token(&token)?;
    for id in 1..=3u64 {
        let mut cfg = NodeConfig::new(id, "127.0.0.1:0".parse()?, dir.join(format!("node{id}")));
        cfg.auth = auth.clone();
        if let Some(n) = a.snapshot_every {
            cfg.snapshot_every = n;
        }
        let n = Node::start(cfg).await?;
        let addr = if a.delay_ms > 0 {
            let p = Proxy::start("127.0.0.1:0".parse()?, n.addr).await?;
            p.set(Faults::delay(Duration::from_millis(a.delay_ms)));
            let pa = p.addr();
            proxies.push(p);
            pa
        } else {
            n.addr
        };
        members.insert(id, addr.to_string());
        nodes.push(n);
    }
    let direct: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
    let mut c = ReplicatorClient::new(strait_replicator_client::channel(
        &direct[0].to_string(),
        &creds,
    )?);
    c.init(pb::InitRequest { members })
        .await
        .context("form the cluster")?;
    // the writer talks to the leader directly (as the primary would to the node in its region)
    let start = Instant::now();
    let leader = loop {
        if let Some(l) = nodes[0].raft.metrics().borrow().current_leader {
            break l;
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("no leader was elected within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut lc = ReplicatorClient::new(strait_replicator_client::channel(
        &direct[(leader - 1) as usize].to_string(),
        &creds,
    )?);
    let record = vec![0x5au8; a.record_size];
    println!(
        "replicator benchmark: 3 nodes on loopback{}, records of {} B, at most {} per append, \
         one append in flight, {} s per phase",
        if a.delay_ms > 0 {
            format!(" with {} ms one-way delay between nodes", a.delay_ms)
        } else {
            String::new()
        },
        a.record_size,
        a.batch,
        a.seconds
    );
    let phase = Duration::from_secs(a.seconds);
    let mut next = 1u64;
    // phase 1: records arrive faster than they can be committed
    let max = run_phase(&mut lc, &record, a.batch, None, phase, &mut next).await?;
    max.print("max rate (always a full batch)");
    let retained: u64 = nodes
        .iter()
        .map(|n| n.log.state().held_bytes())
        .max()
        .unwrap_or(0);
    let snapshots = nodes
        .iter()
        .filter(|n| n.raft.metrics().borrow().snapshot.is_some())
        .count();
    println!(
        "{:<40} {:>10.1} MB of records retained (no mirror), {} of 3 nodes hold a snapshot",
        "",
        retained as f64 / 1e6,
        snapshots
    );
    // phase 2: records arrive at half that rate (or --rate); each waits for the append that
    // takes it
    let (offered, name) = match a.rate {
        Some(r) => (r, "given rate"),
        None => (max.rate / 2.0, "half rate"),
    };
    if !(offered.is_finite() && offered > 0.0) {
        bail!("--rate must be a positive number of records per second");
    }
    let r = run_phase(&mut lc, &record, a.batch, Some(offered), phase, &mut next).await?;
    r.print(&format!("{name} ({offered:.0} records/s offered)"));
    drop(proxies);
    for n in nodes {
        n.shutdown().await;
    }
    // the same latency for the disk alone, at the same rate, in the same directory: with the
    // three syncs at once, then in openraft 0.9's order (the leader's before the followers')
    if a.delay_ms == 0 && !a.no_floor {
        for leader_first in [false, true] {
            let f = super::replicator_floor::FloorArgs {
                rate: offered,
                seconds: a.seconds,
                record_size: a.record_size,
                batch: a.batch,
                copies: 2.0,
                background_mbps: 0.0,
                leader_first,
                dir: Some(dir.join("floor")),
            };
            tokio::task::spawn_blocking(move || super::replicator_floor::run(f))
                .await
                .context("the disk floor stopped")??;
        }
    }
    if a.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

struct PhaseResult {
    rate: f64,
    appends: usize,
    records: u64,
    /// From a record's arrival to the commit of the append that carried it.
    record_latency: Latencies,
    /// Of each append call.
    append_latency: Latencies,
}

impl PhaseResult {
    fn print(&self, name: &str) {
        println!(
            "{:<40} {:>10.0} records/s committed   commit latency p50 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms   ({} appends, {:.0} records each)",
            name,
            self.rate,
            self.record_latency.ms(0.5),
            self.record_latency.ms(0.99),
            self.record_latency.max_ms(),
            self.appends,
            self.records as f64 / self.appends.max(1) as f64
        );
        println!(
            "{:<40} {:>10}                       append call    p50 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms",
            "",
            "",
            self.append_latency.ms(0.5),
            self.append_latency.ms(0.99),
            self.append_latency.max_ms(),
        );
    }
}

/// Append for `phase`: records arrive at `rate` per second (None: always as many as an
/// append takes), and each append takes every record that has arrived, up to `batch`.
async fn run_phase(
    lc: &mut ReplicatorClient<strait_replicator_client::Conn>,
    record: &[u8],
    batch: u64,
    rate: Option<f64>,
    phase: Duration,
    next: &mut u64,
) -> Result<PhaseResult> {
    let t0 = Instant::now();
    // the arrival time of the i-th record of this phase
    let arrival = |i: u64| match rate {
        Some(r) => t0 + Duration::from_secs_f64(i as f64 / r),
        None => t0,
    };
    let mut sent = 0u64; // records of this phase sent so far
    let mut appends = 0;
    let mut lat = Latencies::new();
    let mut calls = Latencies::new();
    while t0.elapsed() < phase {
        let now = Instant::now();
        let arrived = match rate {
            Some(r) => (now.duration_since(t0).as_secs_f64() * r) as u64 + 1,
            None => sent + batch,
        };
        if arrived <= sent {
            tokio::time::sleep_until(arrival(sent).into()).await;
            continue;
        }
        let n = (arrived - sent).min(batch);
        let req = pb::AppendRequest {
            epoch: 0,
            first_version: *next,
            records: vec![record.to_vec(); n as usize],
        };
        let started = Instant::now();
        lc.append(req).await.context("append")?;
        let done = Instant::now();
        calls.record(done.duration_since(started));
        for i in sent..sent + n {
            // unbounded arrivals: a record arrives when its append is sent
            let at = if rate.is_some() { arrival(i) } else { started };
            lat.record(done.duration_since(at));
        }
        *next += n;
        sent += n;
        appends += 1;
    }
    Ok(PhaseResult {
        rate: sent as f64 / t0.elapsed().as_secs_f64(),
        appends,
        records: sent,
        record_latency: lat,
        append_latency: calls,
    })
}

/// A new empty directory under the system's temporary directory, named after `what`.
pub(super) fn tempfile_dir(what: &str) -> Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!(
        "strait-{what}.{}.{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Latencies far past the histogram's first range (milliseconds to seconds) come back as
    /// recorded, to 3 significant figures, not clamped.
    #[test]
    fn latencies_keep_large_values() {
        let mut l = Latencies::new();
        for ms in [1u64, 10, 100, 1000, 5000] {
            l.record(Duration::from_millis(ms));
        }
        assert_eq!(l.len(), 5);
        let close = |got: f64, want: f64| (got - want).abs() <= want * 0.001;
        assert!(close(l.ms(0.5), 100.0), "p50 {}", l.ms(0.5));
        assert!(close(l.max_ms(), 5000.0), "max {}", l.max_ms());
        assert!(close(l.ms(0.0), 1.0), "min {}", l.ms(0.0));
    }
}
