//! openraft's own storage test suite (`openraft::testing::Suite`) against the replicator's
//! RocksDB storage: the log store and the state machine of a fresh database per case, as a node
//! opens them. It checks what openraft relies on from any storage: the log state after appends,
//! truncations and purges, the vote, membership read back from the log and the state machine,
//! the initial state a restarted node computes, and a snapshot built on one state machine and
//! installed on another.

use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;
use strait_replicator::store::{open_db, LogStore, StateMachine};
use strait_replicator::{NodeId, TypeConfig};
use tempfile::TempDir;

/// A new database in a temporary directory for every case; the directory is the guard that
/// removes it when the case is done.
struct RocksBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for RocksBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError<NodeId>> {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let db = open_db(&dir.path().join("db")).expect("open the database");
        let log = LogStore::new(db.clone()).expect("start the log store");
        let (sm, _change_log) = StateMachine::open(db).expect("open the state machine");
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite_passes() {
    Suite::test_all(RocksBuilder).expect("openraft's storage suite");
}
