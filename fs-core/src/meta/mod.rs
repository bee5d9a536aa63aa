//! The metadata semantic layer: the whole POSIX metadata API, written once over [`crate::kv`].
//!
//! Every mutation runs in one KV transaction that (1) reads and checks the current state,
//! (2) computes a self-contained [`crate::changelog::Change`], (3) applies it with the same
//! [`crate::changelog::apply`] a replica uses and (4) appends it to the outbox.

mod committed;
pub mod conformance;
mod engine;
pub mod keys;
pub mod locks;
pub mod perm;
pub mod requests;
pub mod types;

mod client;
pub use client::MetaClient;
pub use committed::Committed;
pub use engine::{
    clone_value, clone_xattr, parse_clone_value, CloneListing, CloneProgress, CloneRequest,
    CALL_BUDGET, CLONE_IDLE_MAX_NS,
};
pub use engine::{
    lock_grace_from_now, mark_locks_lost, quota_xattr, trash_name, trash_xattr, DeletionGate, Meta,
    MetaOptions, QuotaCheck, TrashItem, LOCK_GRACE,
};
pub use types::*;
