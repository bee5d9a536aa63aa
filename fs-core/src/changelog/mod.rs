//! Change records: the outbox that replicates a file system.
//!
//! Every metadata transaction at the primary computes one [`Change`] from the current state,
//! applies it with [`apply`] and appends it to the log, all in one KV transaction. A replica
//! replays the same records with the same [`apply`], so the primary and every replica run one
//! piece of code for every state change.
//!
//! # To ensure correctness
//! - A record is self-contained: it carries every value a replica cannot recompute (inode
//!   numbers, slice ids, timestamps, resulting attributes). [`apply`] reads nothing but the
//!   record and the replica's own state; it never reads a clock or allocates an id.
//! - [`apply`] validates what it touches (a dentry's parent must exist and be a directory, a
//!   slice's inode must be a file, ...). An invalid record is an error that aborts the
//!   transaction; it never half-applies.
//!
//! # Layout
//! The record's schema and encoding in `record.rs` (at the bottom: it imports nothing of the
//! others); the state machine, [`apply`], in `state.rs`; the primary's side of the log (commit,
//! read, trim) in `outbox.rs`; a replica's batches in `replica.rs`; the directory quotas'
//! accounting, which [`apply`] keeps, in `quota.rs`.

pub mod outbox;
pub mod quota;
pub mod record;
pub mod replica;
pub mod state;

pub use outbox::{commit, commit_record, read_log, read_log_raw, trim_log};
pub use record::{
    decode, encode, line, Change, ChangeRecord, CloneFrame, CloneItem, CloneJob, DeadSlice, Name,
    QuotaLimits, Replaced, TrashEntry, Unlinked, REQUEST_ID_LEN_MAX,
};
pub use replica::{apply_replica, apply_replica_with, replay, ReplicaError, ReplicaHook};
pub use state::{apply, get_chunk};
pub(crate) use state::{
    decode_dentry, get_attr, get_clone, get_dentry, get_trash, slice_extra_refs, trash_days,
};
