//! A mount's connection to its region's site daemon: [`RemoteMeta`] implements fs-core's
//! [`MetaClient`] over the daemon's gRPC `MetaService`.
//!
//! - **Auth**: every call carries `authorization: Bearer <token>`; TLS (rustls) verifies the
//!   daemon against a CA, and presents a client certificate when the daemon asks for one.
//! - **Reconnection**: the channel reconnects by itself. A call the daemon never received
//!   (connection refused, connect timeout) is retried with exponential backoff until
//!   [`ConnectOptions::reconnect_timeout`] passes. A call that broke while in flight is retried
//!   too: a read as it is, a mutation with the request id of its first attempt
//!   ([`strait_proto::REQUEST_ID_HEADER`]), which the daemon runs once and answers again with
//!   the first result, so it is not applied twice.
//! - **Sessions**: after a daemon restart the daemon asks the client to resume its session
//!   ([`strait_proto::RESUME_HEADER`]); the client sends its open handle counts back so
//!   unlinked-but-open files stay alive, then retries the call.
//! - **Closes** are sent in the background: `release` returns at once and a releaser thread
//!   sends the closed handles in batches (a create then costs the kernel's lookup and the
//!   create, not a third round trip). The daemon keeps an unlinked file until the batch naming
//!   its last handle arrives, a few milliseconds later. The handle counts sent on a resumption
//!   include the closes not yet sent, so a close is never applied twice.
//! - **Names and attributes kept**: the daemon's Watch stream tells the mount every change
//!   to names and attributes as it commits; the mount answers lookups and stats from what it
//!   has seen while the stream is heard from, and asks the daemon otherwise
//!   ([`meta_cache`]). An open always asks (close-to-open).
//! - **Tracing**: each call is a span, and its OpenTelemetry context travels in the
//!   `traceparent` metadata entry, so the daemon's span joins the mount's trace.
//!
//! The crate, by responsibility: [`RemoteMeta`] and its options (`remote_meta.rs`); each
//! thread's runtime and connection, with the metadata every call carries (`connection.rs`);
//! how a failed call is classified and retried, the session's resumption among them
//! (`call.rs`); the background sender of closes (`releaser.rs`); the names and attributes
//! kept (`meta_cache.rs`) and the thread that follows the daemon's changes (`watcher.rs`); blocks fetched from a mirror
//! (`block_fetch.rs`); and the [`MetaClient`] methods themselves (`meta_api.rs`).
//!
//! [`MetaClient`]: strait_fs_core::meta::MetaClient

mod block_fetch;
mod call;
mod connection;
mod held_locks;
mod meta_api;
pub mod meta_cache;
mod releaser;
mod remote_meta;
mod stamp;
mod watcher;

pub use meta_api::SLICE_IDS_PER_ALLOC;
pub use remote_meta::{ConnectOptions, RemoteMeta};
pub use strait_auth::{ClientTls, Credentials};

/// Whether `url` names a site daemon rather than an engine to open in this process.
pub fn is_daemon_url(url: &str) -> bool {
    url.starts_with("strait://")
}
