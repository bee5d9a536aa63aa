//! The replicator: the primary's change log, made durable across regions by a Raft cluster
//! (openraft) and delivered in order, exactly once, to every mirror (DESIGN.md §3).
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
//! - [`node`]: starting a node.

pub mod client;
pub mod early;
pub mod log;
pub mod network;
pub mod node;
pub mod service;
pub mod snapfile;
pub mod store;

/// The generated gRPC code of `proto/replicator.proto`.
pub mod pb {
    tonic::include_proto!("strait.replicator.v1");
}

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

/// The metadata entry naming why an append was refused.
pub const APPEND_HEADER: &str = "x-strait-append";
/// The metadata entry naming the leader (`<id>@<address>`) on a call a follower cannot take.
pub const LEADER_HEADER: &str = "x-strait-leader";
