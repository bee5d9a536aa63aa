//! What every site daemon serves, whichever role it has (the primary, `strait primary`, or a
//! mirror, `strait mirror`): both daemons are built on this crate, and neither depends on the
//! other.
//!
//! - [`service`]: fs-core's metadata API over gRPC to the mounts of a region ([`MetaServer`]),
//!   The guard in front of it (roles, tokens, certificates) is `strait_auth`'s; see [`serve`].
//! - [`requests`]: a mutation sent again after its connection broke runs once.
//! - [`sessions`]: closing the sessions of mounts that went silent.
//! - [`slice_ranges`]: the slice ids each session was given, which alone it may commit.
//! - [`orphans`]: sweeping a site's store of objects its metadata does not reference.
//! - [`watch`]: telling mounts each change to names and attributes as it commits.
//! - [`snapshot`]: metadata snapshots and digests streamed to mirrors and `fsck --compare`.
//! - [`metrics`]: the Prometheus metrics every site daemon has, and the one HTTP listener
//!   serving `/metrics` and `/health`.
//! - [`signal`]: waiting for SIGTERM or SIGINT.
//! - [`config`]: the settings both daemons share: tokens per role, TLS, sessions.
//! - [`serve`]: the server builder both daemons use: TLS and the guard.

pub mod config;
pub mod heard;
pub mod in_flight;
pub mod metrics;
pub mod orphans;
pub mod requests;
pub mod serve;
pub mod service;
pub mod sessions;
pub mod signal;
pub mod slice_ranges;
pub mod snapshot;
pub mod watch;
pub mod workers;

pub use config::SiteConfig;
pub use in_flight::{InFlight, InFlightGuard};
pub use metrics::Metrics;
pub use service::{BlockSource, MetaServer, ReplicationWait, WriteFence, Writers};
pub use signal::wait_for_signal;

/// Largest request or reply message a site daemon's services accept or send: the one limit
/// in `strait_proto::limits`.
pub use strait_proto::limits::META_MESSAGE_BYTES_MAX as MESSAGE_BYTES_MAX;

/// The stream of `SiteService.Warmup` (a mirror's; a primary has none to serve).
pub type WarmupStream = std::pin::Pin<
    Box<
        dyn tokio_stream::Stream<Item = Result<strait_proto::site::WarmupProgress, tonic::Status>>
            + Send,
    >,
>;
