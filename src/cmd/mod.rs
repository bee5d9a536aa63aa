//! Implementations of the CLI commands.

pub mod backup;
pub mod certs;
pub mod changelog;
pub mod clone;
pub mod creds;
pub mod daemon_flags;
pub mod dev;
pub mod dump;
pub mod format;
pub mod fsck;
pub mod gc;
pub mod mirror;
pub mod mirror_status;
pub mod mirror_watch;
pub mod mount;
pub mod primary;
pub mod quota;
pub mod replicator;
pub mod status;
pub mod trash;
pub mod warmup;
mod xattrs;

use anyhow::{Context, Result};

pub use strait_ids::units::{human_bytes, parse_duration_ms, parse_size};

/// A tokio runtime for commands that talk to object stores.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .context("start the tokio runtime")
}
