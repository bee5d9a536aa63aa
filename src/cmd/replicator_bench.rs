//! `strait replicator bench`: three replicator nodes in this process, talking gRPC over
//! loopback sockets (through fault proxies adding a one-way delay when asked), each with its
//! own RocksDB. Phase 1 appends batches back to back and reports committed records/s;
//! phase 2 appends at half that rate and reports the commit latency of each append.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strait_chaos::{Faults, Proxy};
use strait_replicator::node::{Node, NodeConfig};
use strait_replicator::pb;
use strait_replicator::pb::replicator_client::ReplicatorClient;

use super::replicator::BenchArgs;

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub async fn run(a: BenchArgs) -> Result<()> {
    if a.batch == 0 || a.batch > strait_replicator::log::APPEND_RECORDS_MAX as u64 {
        bail!(
            "--batch must be between 1 and {}",
            strait_replicator::log::APPEND_RECORDS_MAX
        );
    }
    if a.record_size == 0
        || a.batch as usize * a.record_size > strait_replicator::log::APPEND_BYTES_MAX
    {
        bail!(
            "--record-size must be positive and a batch at most {} bytes",
            strait_replicator::log::APPEND_BYTES_MAX
        );
    }
    let tmp;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile_dir()?;
            tmp.clone()
        }
    };
    let mut nodes = vec![];
    let mut proxies = vec![];
    let mut members = std::collections::HashMap::new();
    for id in 1..=3u64 {
        let cfg = NodeConfig::new(id, "127.0.0.1:0".parse()?, dir.join(format!("node{id}")));
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
    let mut c = ReplicatorClient::new(strait_replicator::network::channel(&direct[0].to_string())?);
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
    let mut lc = ReplicatorClient::new(strait_replicator::network::channel(
        &direct[(leader - 1) as usize].to_string(),
    )?);
    let record = vec![0x5au8; a.record_size];
    let mut next = 1u64;
    let mut append = |n: u64| {
        let req = pb::AppendRequest {
            epoch: 0,
            first_version: next,
            records: vec![record.clone(); n as usize],
        };
        next += n;
        req
    };
    println!(
        "replicator benchmark: 3 nodes on loopback{}, batches of {} records of {} B, {} s per phase",
        if a.delay_ms > 0 {
            format!(" with {} ms one-way delay between nodes", a.delay_ms)
        } else {
            String::new()
        },
        a.batch,
        a.record_size,
        a.seconds
    );

    // phase 1: back to back
    let phase = Duration::from_secs(a.seconds);
    let t = Instant::now();
    let mut lat = vec![];
    let mut records = 0u64;
    while t.elapsed() < phase {
        let req = append(a.batch);
        let s = Instant::now();
        lc.append(req).await.context("append")?;
        lat.push(s.elapsed());
        records += a.batch;
    }
    let rate = records as f64 / t.elapsed().as_secs_f64();
    lat.sort();
    println!(
        "{:<34} {:>12.0} records/s   commit p50 {:>7.2} ms  p99 {:>7.2} ms  ({} appends)",
        "max rate (back to back)",
        rate,
        ms(pct(&lat, 0.5)),
        ms(pct(&lat, 0.99)),
        lat.len()
    );

    // phase 2: half that rate, in batches sent on a fixed schedule
    let target = rate / 2.0;
    let interval = Duration::from_secs_f64(a.batch as f64 / target.max(1.0));
    let t = Instant::now();
    let mut lat = vec![];
    let mut records = 0u64;
    let mut due = Instant::now();
    while t.elapsed() < phase {
        tokio::time::sleep_until(due.into()).await;
        let req = append(a.batch);
        let s = Instant::now();
        lc.append(req).await.context("append")?;
        lat.push(s.elapsed());
        records += a.batch;
        due += interval;
    }
    let achieved = records as f64 / t.elapsed().as_secs_f64();
    lat.sort();
    println!(
        "{:<34} {:>12.0} records/s   commit p50 {:>7.2} ms  p99 {:>7.2} ms  ({} appends)",
        format!("half rate (target {target:.0}/s)"),
        achieved,
        ms(pct(&lat, 0.5)),
        ms(pct(&lat, 0.99)),
        lat.len()
    );
    drop(proxies);
    for n in nodes {
        n.shutdown().await;
    }
    if a.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// A new empty directory under the system's temporary directory.
fn tempfile_dir() -> Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!(
        "strait-replicator-bench.{}.{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    Ok(d)
}
