//! strait's file system core: everything one region needs to be a POSIX file system.
//!
//! Layers, bottom-up:
//! - [`kv`]: a small transactional key-value trait with RocksDB, Redis and in-memory backends.
//! - [`meta`]: the metadata semantic layer written once over [`kv`]; every mutation writes a
//!   self-contained [`changelog::ChangeRecord`] into the outbox in the same transaction.
//! - [`object`]: the object store trait with local-directory and S3 backends.
//! - [`layout`]: chunk / slice / block arithmetic (pure functions).
//! - [`vfs`]: read and write paths, caches, readahead, compaction and block GC.
//! - [`fuse`]: the adapter between the kernel (fuser) and the VFS.

pub mod backup;
pub mod changelog;
pub mod error;
pub mod fuse;
pub mod kv;
pub mod layout;
pub mod meta;
pub mod object;
pub mod snapshot;
pub mod url;
pub mod vfs;

pub use error::{Error, Result};
/// The numbers shared with the other crates, defined once in `strait-ids`.
pub use strait_ids::{clock, Epoch, SliceId, Version};
