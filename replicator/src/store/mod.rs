//! openraft's storage on RocksDB: the Raft log ([`LogStore`]) and the change log it drives
//! ([`StateMachine`]), in one database with a column family each.
//!
//! - `raft_log`: Raft entries by index (big-endian), postcard-encoded.
//! - `raft_meta`: the vote, the committed log id and the last purged log id.
//! - `records`: the change log's records by version (big-endian), the primary's bytes as sent.
//! - `sm`: the state machine's state (epoch, versions, cursors, heartbeat), its last applied
//!   log id and membership, written in the same batch as the records they describe; which
//!   file holds the last snapshot; and, while a snapshot is being installed, which one.
//!
//! Snapshots are files ([`crate::snapfile`]), built and installed as streams.
//!
//! - [`db`]: opening the database (column families, tuning);
//! - [`log_store`]: the Raft log ([`LogStore`]), synced by a thread of its own;
//! - [`state_machine`]: the change log as openraft's state machine ([`StateMachine`]) and
//!   the read side the subscriptions use ([`ChangeLog`]);
//! - [`snapshot`]: building, recording and installing snapshot files.
//!
//! openraft's own storage test suite runs against them (`tests/storage_suite.rs`).
//!
//! Every write that openraft relies on for safety (log entries, votes, the committed id,
//! purges, snapshots) is synced before it is reported done. Applying committed entries is not
//! synced: the entries are durable in the Raft log, every column family shares one write-ahead
//! log (so the next synced write makes every earlier apply durable too), and after a machine
//! crash openraft applies again the committed entries after the last applied id on disk.

// openraft's trait methods return its `StorageError` (over 200 bytes); the helpers here return
// the same type so `?` carries it through unchanged.
#![allow(clippy::result_large_err)]

use openraft::{AnyError, StorageError, StorageIOError};
use rocksdb::DB;
use serde::{Deserialize, Serialize};

use crate::NodeId;

mod db;
mod log_store;
mod snapshot;
mod state_machine;

pub use db::open_db;
pub use log_store::LogStore;
pub use snapshot::SnapshotBuilder;
pub use state_machine::{ChangeLog, StateMachine};

const CF_LOG: &str = "raft_log";
const CF_META: &str = "raft_meta";
const CF_RECORDS: &str = "records";
const CF_SM: &str = "sm";

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_PURGED: &[u8] = b"last_purged";
const KEY_SM: &[u8] = b"state";
/// Which file holds the last snapshot (`StoredSnapshot`). (`snapshot`, the key before it, held
/// a whole snapshot as one value; it is deleted when the next snapshot is taken.)
const KEY_SNAPSHOT: &[u8] = b"snapshot_file";
const KEY_SNAPSHOT_OLD: &[u8] = b"snapshot";
/// Set while a received snapshot is written into the database (`StoredSnapshot`): a node that
/// stopped half-way finishes the install when it starts again.
const KEY_INSTALLING: &[u8] = b"installing";
/// Records are written into the database in batches of about this many bytes when a snapshot
/// is installed.
const INSTALL_BATCH_BYTES: usize = 4 << 20;

type SErr = StorageError<NodeId>;

fn any(e: impl std::fmt::Display) -> AnyError {
    AnyError::error(e.to_string())
}

fn synced() -> rocksdb::WriteOptions {
    let mut o = rocksdb::WriteOptions::default();
    o.set_sync(true);
    o
}

fn cf<'a>(db: &'a DB, name: &str) -> Result<&'a rocksdb::ColumnFamily, SErr> {
    db.cf_handle(name)
        .ok_or_else(|| StorageIOError::read(any(format!("column family {name} is missing"))).into())
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, SErr> {
    postcard::to_allocvec(v).map_err(|e| StorageIOError::write(any(e)).into())
}

fn decode<T: for<'de> Deserialize<'de>>(what: &str, b: &[u8]) -> Result<T, SErr> {
    postcard::from_bytes(b)
        .map_err(|e| StorageIOError::read(any(format!("decode {what}: {e}"))).into())
}

/// A storage call slower than this is logged: it delays every commit.
const SLOW_IO: std::time::Duration = std::time::Duration::from_millis(50);

#[cfg(test)]
mod test_util {
    use rocksdb::{IteratorMode, DB};

    use super::{cf, CF_RECORDS};

    /// Every record in the database, by version.
    pub(super) fn records(db: &DB) -> Vec<(u64, Vec<u8>)> {
        let rc = cf(db, CF_RECORDS).unwrap();
        db.iterator_cf(rc, IteratorMode::Start)
            .map(|i| {
                let (k, v) = i.unwrap();
                (
                    u64::from_be_bytes(k.as_ref().try_into().unwrap()),
                    v.to_vec(),
                )
            })
            .collect()
    }
}
