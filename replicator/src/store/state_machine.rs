//! The change log as openraft's state machine: records by version in `records`, the log's
//! state, last applied id and membership in `sm`, all written in one batch per apply; and
//! [`ChangeLog`], the read side the subscriptions and the status use.

use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::Entry;
use openraft::{EntryPayload, LogId, OptionalSend, SnapshotMeta, StorageIOError, StoredMembership};
use rocksdb::{Direction, IteratorMode, WriteBatch, DB};
use serde::{Deserialize, Serialize};
use strait_ids::Version;
use tokio::sync::watch;

use super::snapshot::{
    io_snap, lock, snap_dir, SnapLock, SnapshotBuilder, StoredSnapshot, RECORD_MAX,
};
use super::{
    any, cf, decode, encode, SErr, CF_RECORDS, CF_SM, KEY_INSTALLING, KEY_SM, KEY_SNAPSHOT, SLOW_IO,
};
use crate::log::{self as clog, LogState as ChangeLogState, Outcome};
use crate::snapfile::{self, SnapFile};
use crate::{NodeId, TypeConfig};

/// What the state machine persists besides records.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct SmState {
    pub(super) applied: Option<LogId<NodeId>>,
    pub(super) membership: StoredMembership<NodeId, openraft::BasicNode>,
    pub(super) log: ChangeLogState,
}

/// Decode a stored [`SmState`]. A state written before [`ChangeLogState::purged_last`],
/// [`ChangeLogState::primary`] or [`ChangeLogState::cursor_owners`] existed ends one to three
/// fields short; those are the encoding's last fields, so a `None` or an empty map each
/// (postcard: one zero byte) completes it.
pub(super) fn decode_state(what: &str, b: &[u8]) -> Result<SmState, SErr> {
    let e = match decode(what, b) {
        Ok(s) => return Ok(s),
        Err(e) => e,
    };
    (1..=3)
        .find_map(|missing| {
            let mut longer = b.to_vec();
            longer.resize(b.len() + missing, 0);
            postcard::from_bytes(&longer).ok()
        })
        .ok_or(e)
}

/// The change log as a Raft state machine. Readers (subscriptions, status) use [`ChangeLog`].
pub struct StateMachine {
    pub(super) db: Arc<DB>,
    pub(super) state: SmState,
    snapshots_built: u64,
    progress: watch::Sender<ChangeLogState>,
    snap_lock: SnapLock,
}

/// Read access to a node's applied change log, shared with the subscriptions.
#[derive(Clone)]
pub struct ChangeLog {
    db: Arc<DB>,
    progress: watch::Receiver<ChangeLogState>,
}

impl ChangeLog {
    /// The log's state after the last apply; changes wake [`ChangeLog::watch`]ers.
    pub fn state(&self) -> ChangeLogState {
        self.progress.borrow().clone()
    }

    pub fn watch(&self) -> watch::Receiver<ChangeLogState> {
        self.progress.clone()
    }

    /// Up to `max` records from version `from` on, with their total size capped near
    /// `max_bytes` (at least one record is returned when there is one).
    pub fn read(
        &self,
        from: Version,
        max: usize,
        max_bytes: usize,
    ) -> anyhow::Result<Vec<Vec<u8>>> {
        let cf = self
            .db
            .cf_handle(CF_RECORDS)
            .ok_or_else(|| anyhow::anyhow!("column family {CF_RECORDS} is missing"))?;
        let mut out = Vec::new();
        let mut bytes = 0;
        let key = from.to_be_bytes();
        for (item, expect) in self
            .db
            .iterator_cf(cf, IteratorMode::From(&key, Direction::Forward))
            .zip(from.0..)
        {
            let (k, v) = item?;
            let v_no = u64::from_be_bytes(
                k.as_ref()
                    .try_into()
                    .map_err(|_| anyhow::anyhow!("a record key is not 8 bytes"))?,
            );
            if v_no != expect {
                // a purge raced this read; the caller sees the shorter batch
                break;
            }
            if !out.is_empty() && (out.len() >= max || bytes + v.len() > max_bytes) {
                break;
            }
            bytes += v.len();
            out.push(v.to_vec());
        }
        Ok(out)
    }
}

impl StateMachine {
    /// Load the state machine from `db` (empty on a new node).
    pub fn open(db: Arc<DB>) -> anyhow::Result<(StateMachine, ChangeLog)> {
        let cf = db
            .cf_handle(CF_SM)
            .ok_or_else(|| anyhow::anyhow!("column family {CF_SM} is missing"))?;
        if let Some(b) = db.get_cf(cf, KEY_INSTALLING)? {
            let stored: StoredSnapshot = postcard::from_bytes(&b)
                .map_err(|e| anyhow::anyhow!("decode the snapshot being installed: {e}"))?;
            tracing::warn!(
                "finishing the install of snapshot {} (file {}), cut short when the node stopped",
                stored.meta.snapshot_id,
                stored.file
            );
            Self::install_file(&db, &stored).map_err(|e| {
                anyhow::anyhow!(
                    "finish installing snapshot {}: {e}",
                    stored.meta.snapshot_id
                )
            })?;
        }
        // files of snapshots being built or received when the node stopped, and old ones
        let current = match db.get_cf(cf, KEY_SNAPSHOT)? {
            Some(b) => Some(
                postcard::from_bytes::<StoredSnapshot>(&b)
                    .map_err(|e| anyhow::anyhow!("decode the stored snapshot: {e}"))?
                    .file,
            ),
            None => None,
        };
        snapfile::remove_all_but(&snap_dir(&db), current.as_deref(), true)
            .map_err(|e| anyhow::anyhow!("clean {}: {e}", snap_dir(&db).display()))?;
        let state = match db.get_cf(cf, KEY_SM)? {
            Some(b) => {
                decode_state("the state machine's state", &b).map_err(|e| anyhow::anyhow!("{e}"))?
            }
            None => SmState {
                log: ChangeLogState::new(),
                ..SmState::default()
            },
        };
        let (tx, rx) = watch::channel(state.log.clone());
        Ok((
            StateMachine {
                db: db.clone(),
                state,
                snapshots_built: 0,
                progress: tx,
                snap_lock: SnapLock::default(),
            },
            ChangeLog { db, progress: rx },
        ))
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<
        (
            Option<LogId<NodeId>>,
            StoredMembership<NodeId, openraft::BasicNode>,
        ),
        SErr,
    > {
        Ok((self.state.applied, self.state.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcome>, SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let db = self.db.clone();
        let rc = cf(&db, CF_RECORDS)?;
        let mut batch = WriteBatch::default();
        let mut out = vec![];
        let mut read_err = None;
        // records written by earlier entries of this batch, for the overlap check
        let mut pending: std::collections::HashMap<Version, Vec<u8>> = Default::default();
        for e in entries {
            self.state.applied = Some(e.log_id);
            let outcome = match e.payload {
                EntryPayload::Blank => Outcome::None,
                EntryPayload::Membership(m) => {
                    self.state.membership = StoredMembership::new(Some(e.log_id), m);
                    Outcome::None
                }
                EntryPayload::Normal(cmd) => {
                    let before = self.state.log.earliest_version;
                    let effect = clog::apply(&mut self.state.log, cmd, |v| {
                        if let Some(r) = pending.get(&v) {
                            return Some(r.clone());
                        }
                        match db.get_cf(rc, v.to_be_bytes()) {
                            Ok(r) => r,
                            Err(e) => {
                                read_err.get_or_insert(e.to_string());
                                None
                            }
                        }
                    });
                    if let Some(e) = read_err.take() {
                        // deciding on a record that could not be read would make this node
                        // disagree with the others: stop instead
                        return Err(StorageIOError::read_state_machine(any(e)).into());
                    }
                    for (v, r) in effect.put {
                        batch.put_cf(rc, v.to_be_bytes(), &r);
                        pending.insert(v, r);
                    }
                    if let Some(p) = effect.purge_below {
                        batch.delete_range_cf(rc, before.to_be_bytes(), p.to_be_bytes());
                        pending.retain(|&v, _| v >= p);
                    }
                    effect.outcome
                }
            };
            out.push(outcome);
        }
        let sm = cf(&self.db, CF_SM)?;
        batch.put_cf(sm, KEY_SM, encode(&self.state)?);
        // not synced: see the module documentation
        let start = std::time::Instant::now();
        self.db
            .write(batch)
            .map_err(|e| StorageIOError::write_state_machine(any(e)))?;
        if start.elapsed() > SLOW_IO {
            tracing::warn!(
                "applying committed entries took {} ms",
                start.elapsed().as_millis()
            );
        }
        self.progress.send_replace(self.state.log.clone());
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshots_built += 1;
        SnapshotBuilder {
            db: self.db.clone(),
            seq: self.snapshots_built,
            snap_lock: self.snap_lock.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapFile>, SErr> {
        let dir = snap_dir(&self.db);
        tokio::fs::create_dir_all(&dir).await.map_err(io_snap)?;
        let path = dir.join(snapfile::unique_name("incoming", 0));
        Ok(Box::new(SnapFile::create(path).await.map_err(io_snap)?))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, openraft::BasicNode>,
        snapshot: Box<SnapFile>,
    ) -> Result<(), SErr> {
        let incoming = snapshot.finish().await.map_err(io_snap)?;
        let db = self.db.clone();
        let meta = meta.clone();
        let snap_lock = self.snap_lock.clone();
        let state = tokio::task::spawn_blocking(move || -> Result<SmState, SErr> {
            let _g = lock(&snap_lock);
            // check the whole file before anything is replaced
            if let Err(e) = snapfile::verify(&incoming, RECORD_MAX) {
                let _ = std::fs::remove_file(&incoming);
                return Err(io_snap(format!("snapshot {}: {e}", meta.snapshot_id)));
            }
            let dir = snap_dir(&db);
            let file =
                snapfile::unique_name("snap", meta.last_log_id.map(|l| l.index).unwrap_or(0));
            std::fs::rename(&incoming, dir.join(&file)).map_err(io_snap)?;
            snapfile::sync_dir(&dir).map_err(io_snap)?;
            StateMachine::install_file(&db, &StoredSnapshot { meta, file })
        })
        .await
        .map_err(io_snap)??;
        self.state = state;
        self.progress.send_replace(self.state.log.clone());
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, SErr> {
        let sm = cf(&self.db, CF_SM)?;
        let Some(b) = self
            .db
            .get_cf(sm, KEY_SNAPSHOT)
            .map_err(|e| StorageIOError::read_snapshot(None, any(e)))?
        else {
            return Ok(None);
        };
        let stored: StoredSnapshot = decode("the stored snapshot", &b)?;
        let path = snap_dir(&self.db).join(&stored.file);
        match SnapFile::open(path.clone()).await {
            Ok(file) => Ok(Some(Snapshot {
                meta: stored.meta,
                snapshot: Box::new(file),
            })),
            Err(e) => {
                // openraft builds a new one when it needs one
                tracing::warn!("snapshot {} unreadable: {e}", path.display());
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state stored before `purged_last` or `primary` existed (two or one fields short)
    /// reads as one with none.
    #[test]
    fn a_state_stored_before_purged_last_or_primary_reads_with_none() {
        let mut state = SmState {
            log: ChangeLogState::new(),
            ..SmState::default()
        };
        state.log.earliest_version = Version(7);
        let mut old = encode(&state).unwrap();
        assert_eq!(
            old.pop(),
            Some(0),
            "the empty cursor_owners ends the encoding"
        );
        assert_eq!(old.pop(), Some(0), "the None of primary before it");
        assert_eq!(old.pop(), Some(0), "the None of purged_last before that");
        let read = decode_state("an old state", &old).unwrap();
        assert_eq!(read.log, state.log);
        state.log.purged_last = Some((Version(6), vec![1; 32]));
        // one written before `primary` existed
        let mut old = encode(&state).unwrap();
        assert_eq!(
            old.pop(),
            Some(0),
            "the empty cursor_owners ends the encoding"
        );
        assert_eq!(old.pop(), Some(0), "the None of primary before it");
        let read = decode_state("a state without primary", &old).unwrap();
        assert_eq!(read.log, state.log);
        state.log.primary = Some((
            strait_ids::Epoch(2),
            crate::log::PrimaryAt {
                id: "b".into(),
                addr: "10.0.0.2:7100".into(),
                data_url: "s3://b".into(),
            },
        ));
        // one written before `cursor_owners` existed
        let mut old = encode(&state).unwrap();
        assert_eq!(
            old.pop(),
            Some(0),
            "the empty cursor_owners ends the encoding"
        );
        let read = decode_state("a state without cursor owners", &old).unwrap();
        assert_eq!(read.log, state.log);
        state
            .log
            .cursor_owners
            .insert("b".into(), "token:0123456789abcdef".into());
        let read = decode_state("a new state", &encode(&state).unwrap()).unwrap();
        assert_eq!(read.log, state.log);
        assert!(decode_state("garbage", &[0xff; 3]).is_err());
    }
}
