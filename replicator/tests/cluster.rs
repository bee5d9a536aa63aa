//! Three replicator nodes on 127.0.0.1, talking gRPC over real sockets, each with its own
//! RocksDB: the append rules through Raft, and a subscriber that sees every version exactly
//! once and in order while leaders are stopped and restarted under a steady writer.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use strait_auth::{Conn, Credentials, Role};
use strait_ids::Version;
use strait_replicator::node::{Node, NodeAuth, NodeConfig};
use strait_replicator::pb;
use strait_replicator::pb::replicator_client::ReplicatorClient;

/// The one token of this test's nodes: it grants every role the test plays.
const TOKEN: &str = "cluster-test-token-0123456789";

struct Cluster {
    dir: tempfile::TempDir,
    nodes: BTreeMap<u64, Option<Node>>,
    addrs: BTreeMap<u64, SocketAddr>,
}

/// A port below the ephemeral range: a node stopped and started again binds it once more,
/// and an outgoing connection of another test can never have taken it meanwhile.
fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], strait_devkit::free_port().unwrap()))
}

impl Cluster {
    async fn start(n: u64) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Cluster {
            dir,
            nodes: BTreeMap::new(),
            addrs: BTreeMap::new(),
        };
        for id in 1..=n {
            c.addrs.insert(id, free_addr());
        }
        for id in 1..=n {
            c.up(id).await;
        }
        let members = c.addrs.iter().map(|(id, a)| (*id, a.to_string())).collect();
        client(c.addrs[&1])
            .await
            .init(pb::InitRequest { members })
            .await
            .unwrap();
        c.leader().await;
        c
    }

    fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node{id}"))
    }

    async fn up(&mut self, id: u64) {
        let mut cfg = NodeConfig::new(id, self.addrs[&id], self.data_dir(id));
        cfg.snapshot_every = 500;
        cfg.auth = NodeAuth::tokens(&[
            (Role::Peer, TOKEN),
            (Role::Primary, TOKEN),
            (Role::Mirror, TOKEN),
            (Role::Admin, TOKEN),
        ])
        .unwrap();
        // the port may still be held by the previous incarnation for a moment
        let start = Instant::now();
        let node = loop {
            match Node::start(cfg.clone()).await {
                Ok(n) => break n,
                Err(e) if start.elapsed() < Duration::from_secs(10) => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("start node {id}: {e:#}"),
            }
        };
        self.nodes.insert(id, Some(node));
    }

    /// Shut every node down, their databases closed (a test process that exits while
    /// RocksDB is closing aborts).
    async fn stop(mut self) {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            self.down(id).await;
        }
    }

    async fn down(&mut self, id: u64) {
        if let Some(Some(n)) = self.nodes.insert(id, None) {
            n.shutdown().await;
        }
    }

    /// A running node's Raft metrics now.
    fn metrics(&self, id: u64) -> openraft::RaftMetrics<u64, openraft::BasicNode> {
        self.nodes[&id]
            .as_ref()
            .unwrap()
            .raft
            .metrics()
            .borrow()
            .clone()
    }

    /// The leader all running nodes agree on.
    async fn leader(&self) -> u64 {
        let start = Instant::now();
        loop {
            let mut seen = vec![];
            for (id, n) in &self.nodes {
                if let Some(n) = n {
                    seen.push((*id, n.raft.metrics().borrow().current_leader));
                }
            }
            if let Some((_, Some(l))) = seen.first() {
                if seen.iter().all(|(_, x)| *x == Some(*l))
                    && self.nodes.get(l).is_some_and(|n| n.is_some())
                {
                    return *l;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no leader agreed on: {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn client(addr: SocketAddr) -> ReplicatorClient<Conn> {
    let creds = Credentials::token(TOKEN).unwrap();
    ReplicatorClient::new(strait_replicator::network::channel(&addr.to_string(), &creds).unwrap())
}

fn append(epoch: u64, first: u64, recs: &[&str]) -> pb::AppendRequest {
    pb::AppendRequest {
        epoch,
        first_version: first,
        records: recs.iter().map(|r| r.as_bytes().to_vec()).collect(),
    }
}

fn refusal(s: &tonic::Status) -> String {
    s.metadata()
        .get(strait_replicator::APPEND_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_follow_the_log_rules_through_raft() {
    let c = Cluster::start(3).await;
    let l = c.leader().await;
    let mut lc = client(c.addrs[&l]).await;
    let r = lc
        .append(append(0, 1, &["a", "b", "c"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.last_version, r.duplicate), (3, false));
    let r = lc
        .append(append(0, 1, &["a", "b", "c"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.last_version, r.duplicate), (3, true));
    // refused by the log as it applies them: FAILED_PRECONDITION; a malformed batch is
    // refused before it is proposed to Raft: INVALID_ARGUMENT; each names why
    for (req, kind, code) in [
        (append(0, 5, &["e"]), "gap", tonic::Code::FailedPrecondition),
        (
            append(0, 2, &["b", "X"]),
            "overlap",
            tonic::Code::FailedPrecondition,
        ),
        (
            append(7, 4, &["d"]),
            "future-epoch",
            tonic::Code::FailedPrecondition,
        ),
        (append(0, 4, &[]), "malformed", tonic::Code::InvalidArgument),
    ] {
        let s = lc.append(req).await.unwrap_err();
        assert_eq!(s.code(), code, "{s:?}");
        assert_eq!(refusal(&s), kind, "{s:?}");
    }
    // a promotion: the new epoch names its primary, and every node shows it
    let named = pb::PrimaryAt {
        id: "region-b".into(),
        addr: "127.0.0.1:7440".into(),
        data_url: "file:///srv/region-b".into(),
        epoch: 2,
    };
    let e = lc
        .bump_epoch(pb::BumpEpochRequest {
            epoch: 2,
            primary: Some(pb::PrimaryAt {
                epoch: 0,
                ..named.clone()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((e.epoch, e.last_version), (2, 3));
    let s = lc.append(append(0, 4, &["d"])).await.unwrap_err();
    assert_eq!(refusal(&s), "stale-epoch");

    // a follower refuses writes and names the leader
    let f = *c.addrs.keys().find(|&&id| id != l).unwrap();
    let s = client(c.addrs[&f])
        .await
        .append(append(2, 4, &["d"]))
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::Unavailable);
    let hint = s
        .metadata()
        .get(strait_replicator::LEADER_HEADER)
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(hint, format!("{l}@{}", c.addrs[&l]));

    // every node holds the same log, unchanged by the refusals
    let start = Instant::now();
    for (id, addr) in &c.addrs {
        loop {
            let st = client(*addr)
                .await
                .status(pb::Empty {})
                .await
                .unwrap()
                .into_inner();
            if st.last_version == 3 && st.epoch == 2 {
                assert_eq!(st.members.len(), 3);
                assert_eq!(st.primary.as_ref(), Some(&named), "node {id}");
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "node {id}: {st:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let mut got = vec![];
    let mut s = client(c.addrs[&f])
        .await
        .subscribe(pb::SubscribeRequest { after_version: 0 })
        .await
        .unwrap()
        .into_inner();
    while got.len() < 3 {
        if let Some(pb::subscribe_reply::Kind::Records(r)) =
            s.message().await.unwrap().unwrap().kind
        {
            got.extend(r.records);
        }
    }
    assert_eq!(got, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
    c.stop().await;
}

/// Append through whichever node leads, following redirections, until it is taken.
async fn append_somewhere(c: &Cluster, req: pb::AppendRequest) -> pb::AppendReply {
    let start = Instant::now();
    loop {
        for (id, n) in &c.nodes {
            if n.is_none() {
                continue;
            }
            match client(c.addrs[id]).await.append(req.clone()).await {
                Ok(r) => return r.into_inner(),
                Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                    panic!("append refused: {s:?}")
                }
                Err(_) => {}
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no node took the append"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_gets_every_version_once_in_order_while_leaders_restart() {
    let mut c = Cluster::start(3).await;
    const TOTAL: u64 = 3000;
    const BATCH: u64 = 20;
    let addrs = c.addrs.clone();
    // the subscriber: follows any node, resubscribing after the last version it got
    let sub = tokio::spawn(async move {
        let mut got: Vec<u64> = vec![];
        let mut last = 0u64;
        let mut resubscribed = 0;
        'outer: while last < TOTAL {
            for addr in addrs.values() {
                let Ok(r) = client(*addr)
                    .await
                    .subscribe(pb::SubscribeRequest {
                        after_version: last,
                    })
                    .await
                else {
                    continue;
                };
                resubscribed += 1;
                let mut s = r.into_inner();
                while let Ok(Some(m)) = s.message().await {
                    if let Some(pb::subscribe_reply::Kind::Records(r)) = m.kind {
                        assert_eq!(r.first_version, last + 1, "a gap or a repeat");
                        for rec in r.records {
                            let v: u64 = String::from_utf8(rec).unwrap().parse().unwrap();
                            got.push(v);
                            last += 1;
                            assert_eq!(v, last, "record {v} arrived as version {last}");
                        }
                    }
                    if last >= TOTAL {
                        break 'outer;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (got, resubscribed)
    });
    let mut next = 1u64;
    let mut restarts = 0;
    let mut since_restart = 0;
    while next <= TOTAL {
        let recs: Vec<String> = (next..next + BATCH).map(|v| v.to_string()).collect();
        let recs: Vec<&str> = recs.iter().map(String::as_str).collect();
        // a retried batch after a leader change may have been taken already: a duplicate
        let r = append_somewhere(&c, append(0, next, &recs)).await;
        assert!(r.last_version >= next + BATCH - 1);
        next += BATCH;
        since_restart += BATCH;
        // stop the leader every 400 versions, and start it again from its data directory
        if since_restart >= 400 {
            let l = c.leader().await;
            c.down(l).await;
            c.up(l).await;
            restarts += 1;
            since_restart = 0;
        }
    }
    let (got, resubscribed) = tokio::time::timeout(Duration::from_secs(60), sub)
        .await
        .expect("the subscriber caught up")
        .unwrap();
    assert_eq!(got, (1..=TOTAL).collect::<Vec<_>>());
    assert!(restarts >= 3, "only {restarts} leader restarts");
    eprintln!("{TOTAL} versions, {restarts} leader restarts, {resubscribed} subscriptions");
    c.stop().await;
}

/// A follower that was down while the others wrote more than a snapshot's worth and purged
/// their Raft logs is caught up from a snapshot: a file sent in chunks (the records here are
/// several times openraft's chunk size), checked and written into its database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_left_behind_is_caught_up_from_a_snapshot_file() {
    let mut c = Cluster::start(3).await;
    let leader = c.leader().await;
    let behind = if leader == 3 { 2 } else { 3 };
    let behind_last = c.metrics(behind).last_log_index.unwrap_or(0);
    c.down(behind).await;
    // each append is one Raft entry: 2,000 of them pass the snapshot interval (500) by more
    // than the entries kept after a snapshot (1,000), so the log the follower needs is gone
    const TOTAL: u64 = 2000;
    let rec = |v: u64| format!("{v:08}").repeat(1024); // 8 KiB, 16 MB in all
    for v in 1..=TOTAL {
        let r = rec(v);
        let reply = append_somewhere(&c, append(0, v, &[r.as_str()])).await;
        assert_eq!(reply.last_version, v);
    }
    let up_id = if behind == 3 { 2 } else { 3 };
    let snapshotted = c.metrics(up_id).purged.map(|l| l.index);
    assert!(
        snapshotted.is_some_and(|i| i > behind_last),
        "node {up_id} purged its log only to {snapshotted:?}; node {behind} has it to {behind_last}"
    );
    c.up(behind).await;
    let start = Instant::now();
    loop {
        let n = c.nodes[&behind].as_ref().unwrap();
        if n.log.state().last_version == Version(TOTAL) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "node {behind} reached only version {}",
            n.log.state().last_version
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let n = c.nodes[&behind].as_ref().unwrap();
    let installed = n.raft.metrics().borrow().snapshot;
    assert!(
        installed.is_some(),
        "node {behind} caught up without a snapshot"
    );
    // every record, byte for byte, served from the follower's own database
    let mut v = 1;
    while v <= TOTAL {
        let got = n.log.read(Version(v), 100, usize::MAX).unwrap();
        assert!(!got.is_empty(), "version {v} is missing on node {behind}");
        for r in got {
            assert_eq!(
                r,
                rec(v).into_bytes(),
                "version {v} differs on node {behind}"
            );
            v += 1;
        }
    }
    // one complete snapshot file is left, and nothing half-received (the follower may be
    // building its own snapshot just now: wait for it; a build renames its file into place
    // before it removes the older one, so two complete files can be seen for a moment)
    let snap_dir = c.data_dir(behind).join("snapshots");
    let start = Instant::now();
    let files = loop {
        let files: Vec<String> = std::fs::read_dir(&snap_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let settled = files.len() == 1 && !files.iter().any(|f| f.starts_with("tmp-"));
        if settled || start.elapsed() > Duration::from_secs(10) {
            break files;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(files.len(), 1, "snapshot files left: {files:?}");
    assert!(
        files[0].starts_with("snap-"),
        "snapshot files left: {files:?}"
    );
    // and the follower restarts from it
    c.down(behind).await;
    c.up(behind).await;
    let n = c.nodes[&behind].as_ref().unwrap();
    assert_eq!(n.log.state().last_version, Version(TOTAL));
    c.stop().await;
}
