//! Starting a replicator node: its database, its Raft instance and its gRPC service.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use strait_auth::{Credentials, Guard, Refusal, Role, Tokens};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::ServerTlsConfig;

use strait_proto::limits::RAFT_MESSAGE_BYTES_MAX;

use crate::early::Early;
use crate::metrics::{Metrics, Observer};
use crate::network::Network;
use crate::pb::replicator_server::ReplicatorServer;
use crate::service::ReplicatorService;
use crate::store::{open_db, ChangeLog, LogStore, StateMachine};
use crate::{NodeId, Raft};

/// A node's settings.
/// The default heartbeat interval, in ms.
pub const HEARTBEAT_MS_DEFAULT: u64 = 250;
/// Most entries in one replication call. An entry is one append (at most 256 KiB from
/// strait's shipper), so a call carries at most about 16 MiB and finishes within a heartbeat
/// interval over a 100 MB/s link; openraft's default (300) could make calls that never finish
/// in time, so a lagging follower would never catch up. openraft keeps one call in flight per
/// follower: a follower across a link with round trip `r` takes at most 64 entries per `r`,
/// which must exceed the shipper's appends per `r` under a light load, when each append holds
/// few records (16 did not: at 1,000 operations/s and a 30 ms round trip, the mirror's
/// region fell behind by seconds).
pub const PAYLOAD_ENTRIES_MAX: u64 = 64;

#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub id: NodeId,
    /// Address the service listens on (other nodes, the primary, mirrors).
    pub listen: SocketAddr,
    /// The RocksDB directory of the Raft log and the change log.
    pub data_dir: PathBuf,
    /// Raft heartbeat interval; elections start after 3 to 6 intervals without one. It is also
    /// openraft's timeout for each replication call, so it must exceed the round trip between
    /// nodes plus the time to send [`PAYLOAD_ENTRIES_MAX`] entries over the slowest link.
    pub heartbeat_ms: u64,
    /// Build a snapshot (and purge the Raft log below it) after this many entries.
    pub snapshot_every: u64,
    /// Addresses this node uses for some peers instead of their membership addresses.
    pub peers: BTreeMap<NodeId, String>,
    /// Who may call this node, its TLS, and what it presents to its peers.
    pub auth: NodeAuth,
}

/// A node's security: the tokens it accepts (per role), its server TLS, and the credentials it
/// presents to other nodes (a peer token and/or a certificate naming the role `peer`).
#[derive(Clone, Default)]
pub struct NodeAuth {
    pub tokens: Tokens,
    pub tls: Option<ServerTlsConfig>,
    /// Client certificates are required (and name the caller's roles).
    pub mutual_tls: bool,
    pub peer_credentials: Credentials,
}

impl std::fmt::Debug for NodeAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeAuth")
            .field("roles with tokens", &self.tokens.roles().to_string())
            .field("tls", &self.tls.is_some())
            .field("mutual_tls", &self.mutual_tls)
            .field("peer_credentials", &self.peer_credentials)
            .finish()
    }
}

impl NodeAuth {
    /// One token per role, plain text: for tests and benchmarks on loopback.
    pub fn tokens(tokens: &[(Role, &str)]) -> anyhow::Result<NodeAuth> {
        let mut t = Tokens::new();
        let mut peer = None;
        for (r, tok) in tokens {
            t.add(*r, tok)?;
            if *r == Role::Peer {
                peer = Some(*tok);
            }
        }
        Ok(NodeAuth {
            tokens: t,
            tls: None,
            mutual_tls: false,
            peer_credentials: Credentials::new(peer, None)?,
        })
    }
}

impl NodeConfig {
    pub fn new(id: NodeId, listen: SocketAddr, data_dir: PathBuf) -> Self {
        NodeConfig {
            id,
            listen,
            data_dir,
            heartbeat_ms: HEARTBEAT_MS_DEFAULT,
            snapshot_every: 20_000,
            peers: BTreeMap::new(),
            auth: NodeAuth::default(),
        }
    }

    fn raft_config(&self) -> anyhow::Result<openraft::Config> {
        let c = openraft::Config {
            cluster_name: "strait-replicator".into(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.heartbeat_ms * 3,
            election_timeout_max: self.heartbeat_ms * 6,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_every),
            max_in_snapshot_log_to_keep: 1000,
            max_payload_entries: PAYLOAD_ENTRIES_MAX,
            ..Default::default()
        };
        c.validate().context("the Raft settings")
    }
}

/// How long a shutdown waits for the database to close.
const DB_CLOSE_WAIT: Duration = Duration::from_secs(5);

/// A running node.
pub struct Node {
    pub raft: Raft,
    pub log: ChangeLog,
    pub addr: SocketAddr,
    /// What `/metrics` and `/health` read.
    pub observer: Observer,
    stop: CancellationToken,
    server: tokio::task::JoinHandle<()>,
    /// The database, to see it closed at shutdown.
    db: std::sync::Weak<rocksdb::DB>,
}

impl Node {
    /// Open the node's storage, start Raft and serve on `cfg.listen` (port 0 picks one).
    pub async fn start(cfg: NodeConfig) -> anyhow::Result<Node> {
        if cfg.auth.tokens.is_empty() && !cfg.auth.mutual_tls {
            anyhow::bail!(
                "no way to authenticate callers: give the node tokens per role or a client CA \
                 (mutual TLS); anyone who reaches an open node can rewrite the log"
            );
        }
        let db = open_db(&cfg.data_dir)?;
        let weak_db = Arc::downgrade(&db);
        let log_store = LogStore::new(db.clone())?;
        let (sm, log) = StateMachine::open(db)?;
        let peers = Arc::new(cfg.peers.clone());
        let network = Network {
            peers: peers.clone(),
            creds: cfg.auth.peer_credentials.clone(),
        };
        let raft = Raft::new(cfg.id, Arc::new(cfg.raft_config()?), network, log_store, sm)
            .await
            .context("start Raft")?;
        let stop = CancellationToken::new();
        let early = Early::start(
            raft.clone(),
            log.clone(),
            peers,
            cfg.auth.peer_credentials.clone(),
            stop.clone(),
        );
        let listener = TcpListener::bind(cfg.listen)
            .await
            .with_context(|| format!("listen on {}", cfg.listen))?;
        let addr = listener.local_addr()?;
        let metrics = Metrics::new()?;
        let subscriptions = crate::service::subscription_slots();
        let observer = Observer {
            metrics: metrics.clone(),
            raft: raft.clone(),
            log: log.clone(),
            snapshot_dir: cfg.data_dir.join(crate::snapfile::DIR),
            subscriptions: subscriptions.clone(),
        };
        let svc = ReplicatorServer::new(ReplicatorService::new(
            raft.clone(),
            log.clone(),
            early,
            subscriptions,
            metrics.clone(),
        ))
        .max_decoding_message_size(RAFT_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(RAFT_MESSAGE_BYTES_MAX);
        let s2 = stop.clone();
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let mut builder = tonic::transport::Server::builder()
            .max_frame_size(strait_proto::limits::HTTP2_FRAME_BYTES)
            .http2_keepalive_interval(Some(Duration::from_secs(2)))
            .http2_keepalive_timeout(Some(Duration::from_secs(4)));
        if let Some(tls) = cfg.auth.tls.clone() {
            strait_auth::use_ring_for_tls();
            builder = builder.tls_config(tls).context("TLS settings")?;
        }
        let refused = metrics.refused.clone();
        let guard = Guard::counted(
            format!("replicator node {}", cfg.id),
            cfg.auth.tokens.clone(),
            move |why| {
                let reason = match why {
                    Refusal::Unauthenticated => "unauthenticated",
                    Refusal::PermissionDenied => "permission_denied",
                };
                refused.with_label_values(&[reason]).inc();
            },
        );
        let server = tokio::spawn(async move {
            let r = builder
                .layer(guard)
                .add_service(svc)
                .serve_with_incoming_shutdown(incoming, s2.cancelled())
                .await;
            if let Err(e) = r {
                tracing::error!("the replicator service stopped: {e}");
            }
        });
        Ok(Node {
            raft,
            log,
            addr,
            observer,
            stop,
            server,
            db: weak_db,
        })
    }

    /// Stop serving, shut Raft down, and wait (a few seconds at most) for the database to be
    /// closed: its last holders (Raft's tasks, the log sync thread, the relay) let go of it
    /// shortly after, and a process that exits while RocksDB is closing aborts.
    pub async fn shutdown(self) {
        let Node {
            raft,
            log,
            stop,
            server,
            db,
            ..
        } = self;
        stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
        if let Err(e) = raft.shutdown().await {
            tracing::warn!("shut Raft down: {e}");
        }
        drop(raft);
        drop(log);
        let start = std::time::Instant::now();
        while db.strong_count() > 0 {
            if start.elapsed() > DB_CLOSE_WAIT {
                tracing::warn!(
                    "the node's database is still open {DB_CLOSE_WAIT:?} after shutdown"
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
