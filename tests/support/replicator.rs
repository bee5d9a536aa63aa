//! A cluster of `strait replicator` processes run by a test: each node is reached by the
//! others through a fault proxy, so tests can partition it; nodes can be SIGKILLed and
//! restarted on the same address and data directory.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use strait_devkit::process::{open_log, spawn_tied_with};

use strait_devkit::Proxy;
use strait_proto::replicator as pb;
use strait_proto::replicator::replicator_client::ReplicatorClient;

use super::{free_port, strait_bin};

pub use super::tokens::{
    token_args, ADMIN_TOKEN, HARNESS_TOKEN, MIRROR_TOKEN, MIRROR_TOKEN_2, PEER_TOKEN, PRIMARY_TOKEN,
};

/// The harness's credentials ([`HARNESS_TOKEN`]).
pub fn creds() -> strait_replicator_client::Credentials {
    strait_replicator_client::Credentials::token(HARNESS_TOKEN).expect("a valid token")
}

/// A leader-following client of the nodes at `addrs`, with the harness's credentials.
pub fn log_client(addrs: &[String]) -> strait_replicator_client::LogClient {
    strait_replicator_client::LogClient::new(addrs, &creds()).expect("replicator addresses")
}

pub struct Replica {
    pub id: u64,
    pub addr: SocketAddr,
    /// Its `/metrics` and `/health`.
    pub metrics: SocketAddr,
    pub dir: PathBuf,
    pub log: PathBuf,
    /// `ID=HOST:PORT`: how this node reaches each peer (through its egress proxies).
    pub peers: Vec<String>,
    child: Option<Child>,
    starts: usize,
}

impl Replica {
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Start the node's process, its output appended to its log.
    fn launch(&self) -> Child {
        let mut cmd = Command::new(strait_bin());
        cmd.args(["replicator", "--id", &self.id.to_string()])
            .args(["--listen", &self.addr.to_string()])
            .args(["--metrics-listen", &self.metrics.to_string()])
            .arg("--data-dir")
            .arg(&self.dir)
            .args(self.peers.iter().flat_map(|p| ["--peer", p.as_str()]))
            .args(token_args())
            .stdin(Stdio::null());
        let log = self.log.clone();
        spawn_tied_with(move || {
            let (out, err) = open_log(&log, true)?;
            cmd.stdout(out).stderr(err);
            Ok(cmd)
        })
        .expect("spawn strait replicator")
    }

    pub fn spawn(&mut self) {
        self.child = Some(self.launch());
        self.starts += 1;
        let start = Instant::now();
        let what = format!("node {} did not start", self.id);
        super::wait_until(&what, Duration::from_secs(30), || {
            if self.log_text().matches("strait replicator: node").count() >= self.starts {
                return Ok(());
            }
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
            }
            Err(self.log_text())
        });
    }

    pub fn kill(&mut self) {
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

/// A client of the node at `addr` with the harness's credentials.
pub async fn client(addr: SocketAddr) -> ReplicatorClient<strait_replicator_client::Conn> {
    ReplicatorClient::new(strait_replicator_client::channel(&addr.to_string(), &creds()).unwrap())
}

pub async fn leader(addrs: &[SocketAddr]) -> Option<u64> {
    for a in addrs {
        if let Ok(s) = client(*a).await.status(pb::Empty {}).await {
            if let Some(l) = s.into_inner().leader {
                return Some(l);
            }
        }
    }
    None
}

/// Three (or `n`) nodes on 127.0.0.1, each behind its own proxy, formed into a cluster with
/// `strait replicator init`.
pub struct Cluster {
    pub nodes: BTreeMap<u64, Replica>,
    /// The proxy in front of each node, through which the other nodes' Raft calls reach it
    /// (its membership address).
    pub proxies: BTreeMap<u64, Proxy>,
    /// (from, to): the proxy through which node `from` itself calls node `to` (`--peer`), so
    /// that a node can be cut off in both directions.
    pub egress: BTreeMap<(u64, u64), Proxy>,
}

impl Cluster {
    pub fn start(work: &Path, n: u64) -> Cluster {
        let addrs: BTreeMap<u64, SocketAddr> = (1..=n)
            .map(|id| (id, format!("127.0.0.1:{}", free_port()).parse().unwrap()))
            .collect();
        let proxy = |to: SocketAddr| Proxy::start_blocking("127.0.0.1:0".parse().unwrap(), to);
        let mut egress = BTreeMap::new();
        for from in 1..=n {
            for (&to, &addr) in &addrs {
                if to != from {
                    egress.insert((from, to), proxy(addr).unwrap());
                }
            }
        }
        let mut nodes = BTreeMap::new();
        let mut proxies = BTreeMap::new();
        for (&id, &addr) in &addrs {
            let mut r = Replica {
                id,
                addr,
                metrics: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
                dir: work.join(format!("node{id}")),
                log: work.join(format!("node{id}.log")),
                peers: egress
                    .iter()
                    .filter(|((f, _), _)| *f == id)
                    .map(|((_, t), p): (&(u64, u64), &Proxy)| format!("{t}={}", p.addr()))
                    .collect(),
                child: None,
                starts: 0,
            };
            r.spawn();
            proxies.insert(id, proxy(addr).unwrap());
            nodes.insert(id, r);
        }
        let direct: Vec<SocketAddr> = nodes.values().map(|n: &Replica| n.addr).collect();
        let mut init = Command::new(strait_bin());
        init.args(["replicator", "init", "--token", ADMIN_TOKEN]);
        init.args(["--addr", &direct[0].to_string()]);
        for (id, p) in &proxies {
            init.args(["--member", &format!("{id}={}", p.addr())]);
        }
        let out = init.output().unwrap();
        assert!(
            out.status.success(),
            "init: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Cluster {
            nodes,
            proxies,
            egress,
        }
    }

    /// Every proxy on a path into or out of node `id`.
    pub fn links_of(&self, id: u64) -> Vec<&Proxy> {
        let node = self
            .egress
            .iter()
            .filter(|((f, t), _)| *f == id || *t == id)
            .map(|(_, p)| p);
        self.proxies.get(&id).into_iter().chain(node).collect()
    }

    /// Cut node `id` off from the others in both directions (`on`), or heal it.
    pub fn isolate(&self, id: u64, on: bool) {
        for p in self.links_of(id) {
            p.update(|f| {
                f.up.blackhole = on;
                f.down.blackhole = on;
            });
        }
    }

    /// The nodes' own addresses (not through their proxies).
    pub fn direct(&self) -> Vec<SocketAddr> {
        self.nodes.values().map(|n| n.addr).collect()
    }

    /// The leader's id, waiting up to `within` for one to be elected.
    pub async fn wait_leader(&self, within: Duration) -> u64 {
        let start = Instant::now();
        loop {
            if let Some(l) = leader(&self.direct()).await {
                return l;
            }
            assert!(start.elapsed() < within, "no leader within {within:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every record the cluster has committed after `after`, read from any node by a
    /// subscription, in order, with their versions; checks that versions follow without gap.
    pub async fn read_log(&self, after: u64, within: Duration) -> Vec<(u64, Vec<u8>)> {
        let start = Instant::now();
        let direct = self.direct();
        let mut out: Vec<(u64, Vec<u8>)> = vec![];
        let mut turn = 0;
        loop {
            assert!(
                start.elapsed() < within,
                "the log could not be read within {within:?}"
            );
            // the end: the leader's committed last version
            let l = self.wait_leader(within).await;
            let end = match client(self.nodes[&l].addr).await.status(pb::Empty {}).await {
                Ok(s) => s.into_inner().last_version,
                Err(_) => continue,
            };
            let have = out.last().map(|(v, _)| *v).unwrap_or(after);
            if have >= end {
                return out;
            }
            let a = direct[turn % direct.len()];
            turn += 1;
            let Ok(r) = client(a)
                .await
                .subscribe(pb::SubscribeRequest {
                    after_version: have,
                })
                .await
            else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let mut s = r.into_inner();
            while let Ok(Ok(Some(m))) =
                tokio::time::timeout(Duration::from_secs(2), s.message()).await
            {
                match m.kind {
                    Some(pb::subscribe_reply::Kind::Records(r)) => {
                        let have = out.last().map(|(v, _)| *v).unwrap_or(after);
                        assert_eq!(r.first_version, have + 1, "a gap or a repeat");
                        for (i, rec) in r.records.into_iter().enumerate() {
                            out.push((r.first_version + i as u64, rec));
                        }
                        if out.last().map(|(v, _)| *v).unwrap_or(after) >= end {
                            break;
                        }
                    }
                    Some(pb::subscribe_reply::Kind::TruncatedEarliest(e)) => {
                        panic!("the log was purged up to {e}; the reader wanted {have}")
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Region A of a test: a three-node cluster with a leader elected, and a file system (RocksDB
/// metadata, a local-directory object store) for a primary that ships to it.
pub struct RegionA {
    pub cluster: Cluster,
    pub fs: super::mount::TestFs,
    /// The nodes' own addresses, as `--replicator` takes them.
    pub addrs: Vec<String>,
    pub leader: u64,
    /// The nodes' directories (dropped last, after the nodes).
    _work: tempfile::TempDir,
}

impl RegionA {
    pub fn start(rt: &tokio::runtime::Runtime) -> RegionA {
        Self::start_with(rt, &[])
    }

    /// [`RegionA::start`] with more `strait format` flags.
    pub fn start_with(rt: &tokio::runtime::Runtime, format: &[&str]) -> RegionA {
        Self::start_on(rt, super::mount::TestFs::rocks_local(format))
    }

    /// [`RegionA::start`] on a formatted file system of the caller's.
    pub fn start_on(rt: &tokio::runtime::Runtime, fs: super::mount::TestFs) -> RegionA {
        let work = tempfile::tempdir().unwrap();
        let cluster = Cluster::start(work.path(), 3);
        let addrs = cluster.direct().iter().map(|a| a.to_string()).collect();
        let leader = rt.block_on(cluster.wait_leader(Duration::from_secs(30)));
        RegionA {
            cluster,
            fs,
            addrs,
            leader,
            _work: work,
        }
    }

    /// A primary daemon on the file system, shipping to the cluster (no GC), with `extra` flags.
    pub fn primary(&self, extra: &[&str]) -> super::daemon::Primary {
        let replicator = self.addrs.join(",");
        let mut args = vec!["--replicator", &replicator, "--gc-interval-s", "0"];
        args.extend_from_slice(extra);
        super::daemon::Primary::start(&self.fs.meta_url, &self.fs.env, &args)
    }
}
