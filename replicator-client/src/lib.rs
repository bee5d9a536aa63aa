//! A light client of the replicator: what the primary, the mirrors and the CLI need to talk to
//! the change log's Raft cluster, without linking openraft or RocksDB.
//!
//! - [`channel`]: a lazily connected gRPC channel to one node with the caller's
//!   [`Credentials`] (token, TLS), tuned as every replicator connection is (keep-alives, large
//!   HTTP/2 frames).
//! - [`LogClient`]: the calls only the leader takes (append, heartbeat, bump epoch, ack,
//!   retention, membership), following the leader by itself.
//! - A subscription is served by any node: open one with
//!   `ReplicatorClient::new(channel(addr, creds)?)` and `subscribe` (the mirror's follower
//!   does).
//!
//! The messages are `strait_proto::replicator`'s; [`record_digest`] is how a record is
//! summed in `StatusReply.purged_last_digest`.

use std::time::Duration;

pub use strait_auth::{Conn, Credentials};

mod log_client;

pub use log_client::{refusal, transient, LogClient, ATTEMPTS_MAX, ATTEMPT_TIMEOUT};

/// The SHA-256 of a change record, as the replicator keeps it for the last version it purged
/// (`StatusReply.purged_last_digest`).
pub fn record_digest(record: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(record).to_vec()
}

/// A lazily connected channel to `addr` (`host:port`) whose calls carry `creds`.
pub fn channel(addr: &str, creds: &Credentials) -> Result<Conn, strait_auth::Error> {
    let ep = creds
        .endpoint(addr)?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .max_frame_size(strait_proto::limits::HTTP2_FRAME_BYTES)
        .tcp_keepalive(Some(Duration::from_secs(10)))
        .http2_keep_alive_interval(Duration::from_secs(2))
        .keep_alive_timeout(Duration::from_secs(4))
        .keep_alive_while_idle(true);
    Ok(creds.connect_lazy(ep))
}

/// The leader the node at `addr` follows (its `Status`, asked with `creds`, which must hold
/// the admin role, within 2 s); none when it knows no leader or cannot be reached.
pub async fn leader_of(addr: &str, creds: &Credentials) -> Option<u64> {
    let ch = channel(addr, creds).ok()?;
    let mut c = strait_proto::replicator::replicator_client::ReplicatorClient::new(ch);
    let status = c.status(strait_proto::replicator::Empty {});
    let reply = tokio::time::timeout(Duration::from_secs(2), status)
        .await
        .ok()?
        .ok()?;
    reply.into_inner().leader
}

/// Whether the node at `addr` knows a leader ([`leader_of`]).
pub async fn has_leader(addr: &str, creds: &Credentials) -> bool {
    leader_of(addr, creds).await.is_some()
}
