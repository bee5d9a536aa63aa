//! Snapshots of the state machine as files: building one from a consistent view of the
//! database, recording it as the node's current one, and installing a received one.

use std::path::PathBuf;
use std::sync::Arc;

use openraft::storage::Snapshot;
use openraft::{RaftSnapshotBuilder, SnapshotMeta, StorageIOError};
use rocksdb::{IteratorMode, WriteBatch, DB};
use serde::{Deserialize, Serialize};

use super::state_machine::{SmState, StateMachine};
use super::{
    any, cf, decode, encode, synced, SErr, CF_RECORDS, CF_SM, INSTALL_BATCH_BYTES, KEY_INSTALLING,
    KEY_SM, KEY_SNAPSHOT, KEY_SNAPSHOT_OLD,
};
use crate::log::{self as clog, LogState as ChangeLogState};
use crate::snapfile::{self, SnapFile};
use crate::{NodeId, TypeConfig};

/// A snapshot: what openraft knows of it, and the file in the snapshot directory.
#[derive(Serialize, Deserialize)]
pub(super) struct StoredSnapshot {
    pub(super) meta: SnapshotMeta<NodeId, openraft::BasicNode>,
    pub(super) file: String,
}

pub(super) fn snap_dir(db: &DB) -> PathBuf {
    db.path().join(snapfile::DIR)
}

pub(super) fn io_snap(e: impl std::fmt::Display) -> SErr {
    StorageIOError::write_snapshot(None, any(e)).into()
}

/// The largest record a snapshot file may hold.
pub(super) const RECORD_MAX: usize = clog::APPEND_BYTES_MAX;

/// Held by an install for its whole length, and by a snapshot build to take its view of the
/// database and to record its file: openraft builds snapshots in a task of their own, which
/// could otherwise read a half-installed database, or replace a newer snapshot's file.
pub(super) type SnapLock = Arc<std::sync::Mutex<()>>;

pub(super) fn lock(l: &SnapLock) -> std::sync::MutexGuard<'_, ()> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

impl StateMachine {
    /// Write a snapshot of the database as it is now into a new file of the snapshot
    /// directory, streaming the records. Returns the state it holds and the file's name.
    pub(super) fn write_snapshot_file(
        db: &DB,
        snap_lock: &SnapLock,
    ) -> Result<(SmState, String), SErr> {
        // one RocksDB snapshot: the state and the records it describes, as of one batch, and
        // never in the middle of an install
        let snap = {
            let _g = lock(snap_lock);
            db.snapshot()
        };
        let sm = cf(db, CF_SM)?;
        let state: SmState = match snap
            .get_cf(sm, KEY_SM)
            .map_err(|e| StorageIOError::read_state_machine(any(e)))?
        {
            Some(b) => super::state_machine::decode_state("the state machine's state", &b)?,
            None => SmState {
                log: ChangeLogState::new(),
                ..SmState::default()
            },
        };
        let dir = snap_dir(db);
        std::fs::create_dir_all(&dir).map_err(io_snap)?;
        let index = state.applied.map(|l| l.index).unwrap_or(0);
        let tmp = dir.join(snapfile::unique_name("tmp", index));
        let name = snapfile::unique_name("snap", index);
        let write = || -> Result<(), SErr> {
            let f = std::fs::File::create(&tmp).map_err(io_snap)?;
            let mut w = snapfile::Writer::new(f, &encode(&state)?).map_err(io_snap)?;
            let rc = cf(db, CF_RECORDS)?;
            for item in snap.iterator_cf(rc, IteratorMode::Start) {
                let (k, v) = item.map_err(|e| StorageIOError::read_state_machine(any(e)))?;
                let version = u64::from_be_bytes(k.as_ref().try_into().map_err(|_| {
                    StorageIOError::read_state_machine(any("a record key is not 8 bytes"))
                })?);
                w.record(version, &v).map_err(io_snap)?;
            }
            w.finish().map_err(io_snap)?;
            std::fs::rename(&tmp, dir.join(&name)).map_err(io_snap)?;
            snapfile::sync_dir(&dir).map_err(io_snap)
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        Ok((state, name))
    }

    /// Replace the state machine by the snapshot in file `stored.file`, which was checked.
    /// Marks the install first, so a node that stops half-way finishes it when it starts.
    pub(super) fn install_file(db: &DB, stored: &StoredSnapshot) -> Result<SmState, SErr> {
        let path = snap_dir(db).join(&stored.file);
        let (mut reader, state) = snapfile::Reader::open(&path, RECORD_MAX).map_err(io_snap)?;
        let mut state = super::state_machine::decode_state("a snapshot's state", &state)?;
        state.applied = stored.meta.last_log_id;
        state.membership = stored.meta.last_membership.clone();
        let rc = cf(db, CF_RECORDS)?;
        let sm = cf(db, CF_SM)?;
        db.put_cf_opt(sm, KEY_INSTALLING, encode(stored)?, &synced())
            .map_err(io_snap)?;
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(rc, 0u64.to_be_bytes(), u64::MAX.to_be_bytes());
        batch.delete_cf(rc, u64::MAX.to_be_bytes());
        let mut bytes = 0;
        while let Some((v, r)) = reader.next_record().map_err(io_snap)? {
            bytes += r.len() + 8;
            batch.put_cf(rc, v.to_be_bytes(), &r);
            if bytes >= INSTALL_BATCH_BYTES {
                db.write(std::mem::take(&mut batch)).map_err(io_snap)?;
                bytes = 0;
            }
        }
        batch.put_cf(sm, KEY_SM, encode(&state)?);
        batch.put_cf(sm, KEY_SNAPSHOT, encode(stored)?);
        batch.delete_cf(sm, KEY_SNAPSHOT_OLD);
        batch.delete_cf(sm, KEY_INSTALLING);
        db.write_opt(batch, &synced()).map_err(io_snap)?;
        snapfile::remove_all_but(&snap_dir(db), Some(&stored.file), false).map_err(io_snap)?;
        Ok(state)
    }
}

/// Record a snapshot just written to `file` as the node's current one, and remove the older
/// files; unless a newer snapshot was installed meanwhile, which is kept (and returned).
fn record_built(
    db: &DB,
    snap_lock: &SnapLock,
    state: &SmState,
    file: String,
    seq: u64,
) -> Result<StoredSnapshot, SErr> {
    let meta = SnapshotMeta {
        last_log_id: state.applied,
        last_membership: state.membership.clone(),
        snapshot_id: format!("{}-{seq}", state.applied.map(|l| l.index).unwrap_or(0)),
    };
    let stored = StoredSnapshot { meta, file };
    let sm = cf(db, CF_SM)?;
    let _g = lock(snap_lock);
    // a snapshot installed while this one was written is newer: keep it instead
    if let Some(b) = db
        .get_cf(sm, KEY_SNAPSHOT)
        .map_err(|e| StorageIOError::read_snapshot(None, any(e)))?
    {
        let current: StoredSnapshot = decode("the stored snapshot", &b)?;
        if current.meta.last_log_id > stored.meta.last_log_id {
            let _ = std::fs::remove_file(snap_dir(db).join(&stored.file));
            return Ok(current);
        }
    }
    let mut batch = WriteBatch::default();
    batch.put_cf(sm, KEY_SNAPSHOT, encode(&stored)?);
    batch.delete_cf(sm, KEY_SNAPSHOT_OLD);
    if let Err(e) = db.write_opt(batch, &synced()) {
        let _ = std::fs::remove_file(snap_dir(db).join(&stored.file));
        return Err(io_snap(e));
    }
    // the older files go; one being sent to a follower stays readable until closed
    snapfile::remove_all_but(&snap_dir(db), Some(&stored.file), false).map_err(io_snap)?;
    Ok(stored)
}

/// Builds snapshots from a consistent view of the database.
pub struct SnapshotBuilder {
    pub(super) db: Arc<DB>,
    pub(super) seq: u64,
    pub(super) snap_lock: SnapLock,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, SErr> {
        let db = self.db.clone();
        let seq = self.seq;
        let snap_lock = self.snap_lock.clone();
        let stored = tokio::task::spawn_blocking(move || -> Result<StoredSnapshot, SErr> {
            let start = std::time::Instant::now();
            let (state, file) = StateMachine::write_snapshot_file(&db, &snap_lock)?;
            let stored = record_built(&db, &snap_lock, &state, file, seq)?;
            tracing::info!(
                "snapshot {} built in {} ms ({} versions)",
                stored.meta.snapshot_id,
                start.elapsed().as_millis(),
                state.log.last_version.0 + 1
                    - state
                        .log
                        .earliest_version
                        .min(state.log.last_version.next())
                        .0,
            );
            Ok(stored)
        })
        .await
        .map_err(io_snap)??;
        let path = snap_dir(&self.db).join(&stored.file);
        let file = SnapFile::open(path).await.map_err(io_snap)?;
        Ok(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(file),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use openraft::storage::RaftStateMachine;
    use openraft::{CommittedLeaderId, LogId, StoredMembership};
    use tokio::io::AsyncWriteExt;

    use super::*;
    use crate::store::open_db;
    use crate::store::test_util::records;

    /// A database holding versions 1..=n and a state that says so, applied up to index 40.
    fn source(dir: &Path, n: u64) -> (Arc<DB>, SnapshotMeta<NodeId, openraft::BasicNode>) {
        let db = open_db(dir).unwrap();
        let mut state = SmState {
            log: ChangeLogState::new(),
            ..SmState::default()
        };
        state.applied = Some(LogId::new(CommittedLeaderId::new(3, 1), 40));
        state.log.last_version = strait_ids::Version(n);
        let rc = cf(&db, CF_RECORDS).unwrap();
        for v in 1..=n {
            db.put_cf(
                rc,
                v.to_be_bytes(),
                format!("record {v}").repeat(v as usize % 50),
            )
            .unwrap();
        }
        db.put_cf(cf(&db, CF_SM).unwrap(), KEY_SM, encode(&state).unwrap())
            .unwrap();
        let meta = SnapshotMeta {
            last_log_id: state.applied,
            last_membership: StoredMembership::default(),
            snapshot_id: "40-1".into(),
        };
        (db, meta)
    }

    /// A node that stopped half-way through installing a snapshot finishes the install when
    /// it opens its state machine again: the records are the snapshot's, not a mix.
    #[test]
    fn an_install_cut_short_is_finished_at_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let (src, meta) = source(&dir.path().join("a"), 300);
        let (_, file) = StateMachine::write_snapshot_file(&src, &SnapLock::default()).unwrap();

        let db = open_db(&dir.path().join("b")).unwrap();
        std::fs::create_dir_all(snap_dir(&db)).unwrap();
        std::fs::copy(snap_dir(&src).join(&file), snap_dir(&db).join(&file)).unwrap();
        // what the node had written when it stopped: the mark, old records, a few new ones
        let rc = cf(&db, CF_RECORDS).unwrap();
        for v in 250..400u64 {
            db.put_cf(rc, v.to_be_bytes(), b"stale").unwrap();
        }
        let stored = StoredSnapshot {
            meta: meta.clone(),
            file: file.clone(),
        };
        db.put_cf(
            cf(&db, CF_SM).unwrap(),
            KEY_INSTALLING,
            encode(&stored).unwrap(),
        )
        .unwrap();
        // a file being received when it stopped
        std::fs::write(snap_dir(&db).join("incoming-0-1-2"), b"half").unwrap();

        let (sm, log) = StateMachine::open(db.clone()).unwrap();
        assert_eq!(records(&db), records(&src));
        assert_eq!(sm.state.applied, meta.last_log_id);
        assert_eq!(log.state().last_version, strait_ids::Version(300));
        let smcf = cf(&db, CF_SM).unwrap();
        assert!(db.get_cf(smcf, KEY_INSTALLING).unwrap().is_none());
        assert!(db.get_cf(smcf, KEY_SNAPSHOT).unwrap().is_some());
        let left: Vec<_> = std::fs::read_dir(snap_dir(&db))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, vec![file]);
    }

    /// A snapshot built from the database as it was before an install finished is not
    /// recorded over the installed (newer) one: the newer one stays current, with its file.
    #[test]
    fn a_build_that_loses_the_race_with_an_install_keeps_the_installed_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let lock = SnapLock::default();
        let (db, _) = source(&dir.path().join("a"), 50);
        let (old_state, old_file) = StateMachine::write_snapshot_file(&db, &lock).unwrap();

        // a newer snapshot (applied up to 90) arrives and is installed meanwhile
        let (newer, mut meta) = source(&dir.path().join("b"), 120);
        meta.last_log_id = Some(LogId::new(CommittedLeaderId::new(3, 1), 90));
        let (_, file) = StateMachine::write_snapshot_file(&newer, &lock).unwrap();
        std::fs::copy(snap_dir(&newer).join(&file), snap_dir(&db).join(&file)).unwrap();
        let installed = StoredSnapshot { meta, file };
        StateMachine::install_file(&db, &installed).unwrap();

        let kept = record_built(&db, &lock, &old_state, old_file.clone(), 1).unwrap();
        assert_eq!(kept.meta, installed.meta);
        assert_eq!(kept.file, installed.file);
        assert!(!snap_dir(&db).join(&old_file).exists());
        assert!(snap_dir(&db).join(&installed.file).exists());
        assert_eq!(records(&db), records(&newer));
    }

    /// A snapshot that arrives damaged is refused, and the state machine keeps what it had.
    #[tokio::test]
    async fn a_damaged_snapshot_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (src, meta) = source(&dir.path().join("a"), 200);
        let (_, file) = StateMachine::write_snapshot_file(&src, &SnapLock::default()).unwrap();
        let mut bytes = std::fs::read(snap_dir(&src).join(&file)).unwrap();

        let (db, _) = source(&dir.path().join("b"), 20);
        let before = records(&db);
        let (mut sm, _) = StateMachine::open(db.clone()).unwrap();
        let applied = sm.state.applied;
        let mid = bytes.len() / 2;
        bytes[mid] ^= 1;
        let mut f = sm.begin_receiving_snapshot().await.unwrap();
        f.write_all(&bytes).await.unwrap();
        let err = sm.install_snapshot(&meta, f).await.unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
        assert_eq!(records(&db), before);
        assert_eq!(sm.state.applied, applied);
        assert!(std::fs::read_dir(snap_dir(&db)).unwrap().next().is_none());

        // the same snapshot, whole, is taken
        bytes[mid] ^= 1;
        let mut f = sm.begin_receiving_snapshot().await.unwrap();
        f.write_all(&bytes).await.unwrap();
        sm.install_snapshot(&meta, f).await.unwrap();
        assert_eq!(records(&db), records(&src));
        assert_eq!(sm.state.applied, meta.last_log_id);
        let current = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, meta);
    }
}
