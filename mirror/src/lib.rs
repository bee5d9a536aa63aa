//! The mirror site daemon (`strait mirror`, docs/architecture.md, "Processes"): a region of its own that follows
//! the primary's metadata exactly and measurably. It serves the metadata API of
//! [`strait_server`], as the primary does.
//!
//! - [`follower`]: bootstrap from the primary's snapshot, then subscribe to the replicator
//!   and apply the change log in order, exactly once, halting on an invalid record.
//! - [`lag`]: lag on the primary's clock (plain functions).
//! - [`state`]: what the mirror knows about itself, shared by every part.
//! - [`forward`]: the mirror's session at the primary, for forwarded calls, holding the
//!   region's open files there so an unlink does not free them.
//! - [`router`]: the metadata service for the region's mounts, with the staleness window:
//!   reads outside it are forwarded to the primary, wait, or are served stale, by policy;
//!   [`calls`] says which calls are reads, mutations or the region's own.
//! - [`site`]: digests at a chosen version and the mirror's status, for `fsck --compare`
//!   and `mirror status`.
//! - [`promote`]: becoming the primary in place (`strait mirror promote`).
//! - [`new_primary`]: following a primary promoted elsewhere (its name is in the epoch).
//! - [`daemon`]: starting and stopping it all.

pub mod blocks;
pub mod calls;
pub mod config;
pub mod daemon;
pub mod follower;
pub mod forward;
pub mod lag;
pub mod metrics;
pub mod new_primary;
pub mod promote;
pub mod router;
pub mod site;
pub mod state;

pub use config::{MirrorConfig, Policy};
