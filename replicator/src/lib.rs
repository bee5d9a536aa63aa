//! The replicator: the primary's change log, made durable across regions by a Raft cluster
//! (openraft) and delivered in order, exactly once, to every mirror (docs/changelog.md, "The replicator").
//!
//! - [`log`]: the rules of the change log itself, a pure state machine: an append is taken
//!   only as `last + 1` under the current epoch, an exact duplicate is acknowledged without
//!   change, and a gap, a differing overlap or a stale epoch is refused with its own error.
//! - [`store`]: openraft's log storage and state machine on RocksDB; [`snapfile`]: its
//!   snapshots, as files.
//! - [`network`] and [`service`]: the nodes talk gRPC (tonic); the same service answers the
//!   primary (append, heartbeat), the mirrors (subscribe, ack) and operators (status,
//!   membership).
//! - [`early`]: a follower serves records its leader has applied as soon as it holds them.
//! - [`node`]: starting a node; [`metrics`]: what it shows Prometheus.
//!
//! Its clients (the primary, the mirrors, the CLI) talk to it through
//! `strait-replicator-client`, which links neither openraft nor RocksDB.

pub mod early;
pub mod log;
pub mod metrics;
pub mod network;
pub mod node;
pub mod service;
pub mod snapfile;
pub mod store;

/// The generated gRPC code of `proto/proto/replicator.proto` (strait-proto's), under the name
/// the node's own code uses.
pub use strait_proto::replicator as pb;

pub use log::{AppendError, Command, Outcome};

pub type NodeId = u64;

openraft::declare_raft_types!(
    /// openraft's types for the change log.
    pub TypeConfig:
        D = Command,
        R = Outcome,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = snapfile::SnapFile,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub use strait_proto::replicator::{APPEND_HEADER, LEADER_HEADER};
