//! Three `strait replicator` processes on 127.0.0.1, each reached by the others through a
//! fault proxy. A writer appends without pause while the leader is SIGKILLed and restarted
//! every few seconds and a follower is partitioned and healed; a subscriber, itself restarted
//! from its last ack now and then, must see every version exactly once and in order.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use strait_chaos::{Faults, Link, Proxy};
use strait_replicator::pb;
use strait_replicator::pb::replicator_client::ReplicatorClient;
use strait_tests::{free_port, strait_bin};

struct Replica {
    id: u64,
    addr: SocketAddr,
    dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    starts: usize,
}

impl Replica {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Start the node's process, its output appended to its log.
    fn launch(&self) -> Child {
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        Command::new(strait_bin())
            .args(["replicator", "--id", &self.id.to_string()])
            .args(["--listen", &self.addr.to_string()])
            .arg("--data-dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .expect("spawn strait replicator")
    }

    fn spawn(&mut self) {
        self.child = Some(self.launch());
        self.starts += 1;
        let start = Instant::now();
        while self.log_text().matches("strait replicator: node").count() < self.starts {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                // the port of the killed incarnation may linger for a moment: try again
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "node {} exited ({st}): {}",
                    self.id,
                    self.log_text()
                );
                std::thread::sleep(Duration::from_millis(200));
                self.child = Some(self.launch());
                continue;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "node {} did not start: {}",
                self.id,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn client(addr: SocketAddr) -> ReplicatorClient<tonic::transport::Channel> {
    ReplicatorClient::new(strait_replicator::network::channel(&addr.to_string()).unwrap())
}

async fn leader(addrs: &[SocketAddr]) -> Option<u64> {
    for a in addrs {
        if let Ok(s) = client(*a).await.status(pb::Empty {}).await {
            if let Some(l) = s.into_inner().leader {
                return Some(l);
            }
        }
    }
    None
}

#[test]
fn every_version_once_in_order_through_leader_kills_partitions_and_subscriber_restarts() {
    let work = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut nodes: BTreeMap<u64, Replica> = BTreeMap::new();
    let mut proxies: BTreeMap<u64, Proxy> = BTreeMap::new();
    for id in 1..=3u64 {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let mut r = Replica {
            id,
            addr,
            dir: work.path().join(format!("node{id}")),
            log: work.path().join(format!("node{id}.log")),
            child: None,
            starts: 0,
        };
        r.spawn();
        // the other nodes reach this one through its proxy
        proxies.insert(
            id,
            Proxy::start_blocking("127.0.0.1:0".parse().unwrap(), addr).unwrap(),
        );
        nodes.insert(id, r);
    }
    let direct: Vec<SocketAddr> = nodes.values().map(|n| n.addr).collect();
    // form the cluster with the CLI
    let mut init = Command::new(strait_bin());
    init.args(["replicator", "init", "--addr", &direct[0].to_string()]);
    for (id, p) in &proxies {
        init.args(["--member", &format!("{id}={}", p.addr())]);
    }
    let out = init.output().unwrap();
    assert!(
        out.status.success(),
        "init: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    const BATCH: u64 = 25;
    // the last version written; set once the writer stops
    let written = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));

    // the writer: appends batches through whichever node takes them
    let w_direct = direct.clone();
    let w_written = written.clone();
    let w_stop = stop.clone();
    let writer = rt.spawn(async move {
        let mut next = 1u64;
        let mut start = Instant::now();
        while !w_stop.load(Ordering::Relaxed) {
            let req = pb::AppendRequest {
                epoch: 0,
                first_version: next,
                records: (next..next + BATCH)
                    .map(|v| v.to_string().into_bytes())
                    .collect(),
            };
            let mut taken = false;
            for a in &w_direct {
                match client(*a).await.append(req.clone()).await {
                    Ok(r) => {
                        assert!(r.into_inner().last_version >= next + BATCH - 1);
                        taken = true;
                        break;
                    }
                    Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                        panic!("append of {next}.. refused: {s:?}")
                    }
                    Err(_) => {}
                }
            }
            if taken {
                next += BATCH;
                start = Instant::now();
                // a steady stream, not a flood: the chaos has time to happen
                tokio::time::sleep(Duration::from_millis(2)).await;
            } else {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "the cluster took no append for 30 s, at {next}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        w_written.store(next - 1, Ordering::Relaxed);
        next - 1
    });

    // the subscriber: applies records, acks every 500, and now and then "restarts": forgets
    // what it applied after its last ack and subscribes again from there
    let s_direct = direct.clone();
    let s_written = written.clone();
    let subscriber = rt.spawn(async move {
        let mut applied: Vec<u64> = vec![];
        let mut acked = 0u64;
        let mut restarts = 0u32;
        let mut last_restart = Instant::now();
        let mut turn = 0usize;
        let start = Instant::now();
        let total = || match s_written.load(Ordering::Relaxed) {
            0 => u64::MAX,
            n => n,
        };
        while (applied.len() as u64) < total() {
            assert!(
                start.elapsed() < Duration::from_secs(180),
                "the subscriber is stuck at {}",
                applied.len()
            );
            let a = s_direct[turn % s_direct.len()];
            turn += 1;
            let Ok(r) = client(a)
                .await
                .subscribe(pb::SubscribeRequest {
                    after_version: applied.len() as u64,
                })
                .await
            else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let mut s = r.into_inner();
            loop {
                // a node cut off by a partition sends nothing: move on
                let m = match tokio::time::timeout(Duration::from_secs(2), s.message()).await {
                    Ok(Ok(Some(m))) => m,
                    _ => break,
                };
                match m.kind {
                    Some(pb::subscribe_reply::Kind::Records(r)) => {
                        assert_eq!(
                            r.first_version,
                            applied.len() as u64 + 1,
                            "a gap or a repeat"
                        );
                        for rec in r.records {
                            let v: u64 = String::from_utf8(rec).unwrap().parse().unwrap();
                            assert_eq!(v, applied.len() as u64 + 1);
                            applied.push(v);
                        }
                    }
                    Some(pb::subscribe_reply::Kind::TruncatedEarliest(e)) => {
                        panic!(
                            "truncated at {e} while the subscriber was at {}",
                            applied.len()
                        )
                    }
                    _ => {}
                }
                let at = applied.len() as u64;
                if at >= acked + 500 {
                    for a in &s_direct {
                        let ack = pb::AckRequest {
                            mirror: "test-mirror".into(),
                            applied_version: at,
                        };
                        if client(*a).await.ack(ack).await.is_ok() {
                            acked = at;
                            break;
                        }
                    }
                }
                if at >= total() {
                    break;
                }
                if last_restart.elapsed() > Duration::from_secs(2) {
                    // restart: back to the last ack
                    applied.truncate(acked as usize);
                    restarts += 1;
                    last_restart = Instant::now();
                    break;
                }
            }
        }
        (applied, restarts)
    });

    // the chaos: kill the leader every 3 s, partition a follower in between; 3 kills and
    // 2 partitions, then the writer stops
    let mut kills = 0;
    let mut partitions = 0;
    let chaos_start = Instant::now();
    while kills < 3 || partitions < 2 {
        assert!(!writer.is_finished(), "the writer stopped early");
        std::thread::sleep(Duration::from_millis(1500));
        let Some(l) = rt.block_on(leader(&direct)) else {
            continue;
        };
        if kills <= partitions {
            let n = nodes.get_mut(&l).unwrap();
            n.kill();
            std::thread::sleep(Duration::from_millis(500));
            n.spawn();
            kills += 1;
        } else {
            let f = *nodes.keys().find(|&&id| id != l).unwrap();
            let cut = Link {
                blackhole: true,
                ..Link::default()
            };
            proxies[&f].set(Faults {
                up: cut,
                down: cut,
                refuse: false,
            });
            std::thread::sleep(Duration::from_millis(1500));
            proxies[&f].heal();
            partitions += 1;
        }
        assert!(chaos_start.elapsed() < Duration::from_secs(150));
    }
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::Relaxed);
    let total = rt.block_on(writer).unwrap();
    let (applied, restarts) = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(120), subscriber).await })
        .expect("the subscriber finished")
        .unwrap();
    assert_eq!(applied, (1..=total).collect::<Vec<_>>());
    assert!(restarts >= 1, "the subscriber never restarted");
    eprintln!(
        "{total} versions; {kills} leader kills, {partitions} partitions, {restarts} subscriber restarts"
    );

    // status through the CLI names the leader, the members and the log
    let out = Command::new(strait_bin())
        .args(["replicator", "status", "--addr", &direct[0].to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("leader"), "{text}");
    assert!(text.contains(&format!("..={total}")), "{text}");
    assert_eq!(text.matches("voter").count(), 3, "{text}");
    assert!(text.contains("test-mirror"), "{text}");
}
