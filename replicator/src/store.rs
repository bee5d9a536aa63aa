//! openraft's storage on RocksDB: the Raft log ([`LogStore`]) and the change log it drives
//! ([`StateMachine`]), in one database with a column family each.
//!
//! - `raft_log`: Raft entries by index (big-endian), postcard-encoded.
//! - `raft_meta`: the vote, the committed log id and the last purged log id.
//! - `records`: the change log's records by version (big-endian), the primary's bytes as sent.
//! - `sm`: the state machine's state (epoch, versions, cursors, heartbeat), its last applied
//!   log id and membership, written in the same batch as the records they describe; and the
//!   last snapshot.
//!
//! Every write that openraft relies on for safety (log entries, votes, the committed id,
//! purges, snapshots) is synced before it is reported done. Applying committed entries is not
//! synced: the entries are durable in the Raft log, every column family shares one write-ahead
//! log (so the next synced write makes every earlier apply durable too), and after a machine
//! crash openraft applies again the committed entries after the last applied id on disk.

// openraft's trait methods return its `StorageError` (over 200 bytes); the helpers here return
// the same type so `?` carries it through unchanged.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use rocksdb::{ColumnFamilyDescriptor, Direction, IteratorMode, Options, WriteBatch, DB};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::log::{self as clog, LogState as ChangeLogState, Outcome};
use crate::{NodeId, TypeConfig};

const CF_LOG: &str = "raft_log";
const CF_META: &str = "raft_meta";
const CF_RECORDS: &str = "records";
const CF_SM: &str = "sm";

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_PURGED: &[u8] = b"last_purged";
const KEY_SM: &[u8] = b"state";
const KEY_SNAPSHOT: &[u8] = b"snapshot";

type SErr = StorageError<NodeId>;

fn any(e: impl std::fmt::Display) -> AnyError {
    AnyError::error(e.to_string())
}

fn synced() -> rocksdb::WriteOptions {
    let mut o = rocksdb::WriteOptions::default();
    o.set_sync(true);
    o
}

/// Open (or create) a node's database.
pub fn open_db(dir: &Path) -> anyhow::Result<Arc<DB>> {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    // write files out as they grow: without it, flushes and compactions leave gigabytes of
    // dirty pages that the next fsync of the Raft log waits for (stalls of 0.2-0.5 s seen)
    opts.set_bytes_per_sync(1 << 20);
    opts.set_wal_bytes_per_sync(1 << 20);
    // the Raft log and the records are written once, read soon and deleted in ranges: large
    // memtables mean fewer flushes on the commit path, and the Raft log is not compressed
    // (its entries are purged after the next snapshot)
    let cfs = [CF_LOG, CF_META, CF_RECORDS, CF_SM].into_iter().map(|n| {
        let mut o = Options::default();
        if n == CF_LOG || n == CF_RECORDS {
            o.set_write_buffer_size(64 << 20);
        }
        if n == CF_LOG {
            o.set_compression_type(rocksdb::DBCompressionType::None);
        }
        ColumnFamilyDescriptor::new(n, o)
    });
    let db = DB::open_cf_descriptors(&opts, dir, cfs)
        .map_err(|e| anyhow::anyhow!("open the replicator database at {}: {e}", dir.display()))?;
    Ok(Arc::new(db))
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

// ---- the Raft log -------------------------------------------------------------------------

/// A storage call slower than this is logged: it delays every commit.
const SLOW_IO: std::time::Duration = std::time::Duration::from_millis(50);

/// Appends waiting for their write-ahead log sync, in order.
const FLUSH_QUEUE: usize = 4096;

/// Syncs the write-ahead log on its own thread and reports appends durable, in their order.
/// An append writes its entries at once (readable, as openraft requires) and leaves the fsync
/// to this thread, so a Raft core never blocks in fsync and appends that arrive during one
/// sync share the next (group commit).
struct Flusher {
    tx: std::sync::mpsc::SyncSender<LogFlushed<TypeConfig>>,
}

impl Flusher {
    fn start(db: Arc<DB>) -> anyhow::Result<Flusher> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<LogFlushed<TypeConfig>>(FLUSH_QUEUE);
        std::thread::Builder::new()
            .name("strait-raft-fsync".into())
            .spawn(move || {
                // ends when every LogStore (every sender) is gone
                while let Ok(first) = rx.recv() {
                    let mut group = vec![first];
                    group.extend(rx.try_iter());
                    let start = std::time::Instant::now();
                    let res = db.flush_wal(true);
                    let took = start.elapsed();
                    if took > SLOW_IO {
                        tracing::warn!(
                            "syncing the Raft log took {} ms ({} appends waited)",
                            took.as_millis(),
                            group.len()
                        );
                    }
                    for cb in group {
                        cb.log_io_completed(
                            res.as_ref()
                                .map(|_| ())
                                .map_err(|e| std::io::Error::other(e.to_string())),
                        );
                    }
                }
            })?;
        Ok(Flusher { tx })
    }
}

/// The Raft log. Cheap to clone: clones share the database.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
    flusher: Arc<Flusher>,
}

impl LogStore {
    pub fn new(db: Arc<DB>) -> anyhow::Result<Self> {
        let flusher = Arc::new(Flusher::start(db.clone())?);
        Ok(LogStore { db, flusher })
    }

    fn get_meta<T: for<'de> Deserialize<'de>>(&self, key: &[u8]) -> Result<Option<T>, SErr> {
        let cf = cf(&self.db, CF_META)?;
        match self
            .db
            .get_cf(cf, key)
            .map_err(|e| StorageIOError::read(any(e)))?
        {
            Some(b) => Ok(Some(decode("Raft metadata", &b)?)),
            None => Ok(None),
        }
    }

    fn put_meta<T: Serialize>(&self, key: &[u8], v: &T, sync: bool) -> Result<(), SErr> {
        let cf = cf(&self.db, CF_META)?;
        let opts = if sync {
            synced()
        } else {
            rocksdb::WriteOptions::default()
        };
        self.db
            .put_cf_opt(cf, key, encode(v)?, &opts)
            .map_err(|e| StorageIOError::write(any(e)).into())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, SErr> {
        use std::ops::Bound;
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let cf = cf(&self.db, CF_LOG)?;
        let mut out = vec![];
        let from = start.to_be_bytes();
        for item in self
            .db
            .iterator_cf(cf, IteratorMode::From(&from, Direction::Forward))
        {
            let (k, v) = item.map_err(|e| StorageIOError::read_logs(any(e)))?;
            let idx = u64::from_be_bytes(
                k.as_ref()
                    .try_into()
                    .map_err(|_| StorageIOError::read_logs(any("a log key is not 8 bytes")))?,
            );
            if !range.contains(&idx) {
                break;
            }
            out.push(decode("a log entry", &v)?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, SErr> {
        let last_purged: Option<LogId<NodeId>> = self.get_meta(KEY_PURGED)?;
        let cf = cf(&self.db, CF_LOG)?;
        let last = match self.db.iterator_cf(cf, IteratorMode::End).next() {
            Some(item) => {
                let (_, v) = item.map_err(|e| StorageIOError::read_logs(any(e)))?;
                let e: Entry<TypeConfig> = decode("a log entry", &v)?;
                Some(e.log_id)
            }
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), SErr> {
        self.put_meta(KEY_VOTE, vote, true)
            .map_err(|e| StorageIOError::write_vote(any(e)).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, SErr> {
        self.get_meta(KEY_VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), SErr> {
        // a hint for re-applying after a restart (openraft allows it to be lost): not synced
        self.put_meta(KEY_COMMITTED, &committed, false)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, SErr> {
        Ok(self
            .get_meta::<Option<LogId<NodeId>>>(KEY_COMMITTED)?
            .flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let cf = cf(&self.db, CF_LOG)?;
        let mut batch = WriteBatch::default();
        for e in entries {
            batch.put_cf(cf, e.log_id.index.to_be_bytes(), encode(&e)?);
        }
        // readable now; durable when the flusher has synced the write-ahead log
        let start = std::time::Instant::now();
        if let Err(e) = self.db.write(batch) {
            callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
            return Err(StorageIOError::write_logs(any(e)).into());
        }
        if start.elapsed() > SLOW_IO {
            tracing::warn!(
                "writing Raft log entries took {} ms",
                start.elapsed().as_millis()
            );
        }
        // in order: a full queue waits for room rather than syncing out of turn
        let cb = match self.flusher.tx.try_send(callback) {
            Ok(()) => return Ok(()),
            Err(std::sync::mpsc::TrySendError::Full(cb)) => match self.flusher.tx.send(cb) {
                Ok(()) => return Ok(()),
                Err(std::sync::mpsc::SendError(cb)) => cb,
            },
            Err(std::sync::mpsc::TrySendError::Disconnected(cb)) => cb,
        };
        // the flusher thread is gone: sync here
        match self.db.flush_wal(true) {
            Ok(()) => {
                cb.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                cb.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(StorageIOError::write_logs(any(e)).into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), SErr> {
        let cf = cf(&self.db, CF_LOG)?;
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(cf, log_id.index.to_be_bytes(), u64::MAX.to_be_bytes());
        batch.delete_cf(cf, u64::MAX.to_be_bytes());
        self.db
            .write_opt(batch, &synced())
            .map_err(|e| StorageIOError::write_logs(any(e)).into())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), SErr> {
        // record the purge point first: a crash between the two leaves extra entries, which
        // is harmless, never a hole
        self.put_meta(KEY_PURGED, &log_id, true)?;
        let cf = cf(&self.db, CF_LOG)?;
        self.db
            .delete_range_cf(cf, 0u64.to_be_bytes(), (log_id.index + 1).to_be_bytes())
            .map_err(|e| StorageIOError::write_logs(any(e)).into())
    }
}

// ---- the change log (state machine) ---------------------------------------------------------

/// What the state machine persists besides records.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct SmState {
    applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, openraft::BasicNode>,
    log: ChangeLogState,
}

/// A whole state machine, as a snapshot carries it.
#[derive(Serialize, Deserialize)]
struct Image {
    state: SmState,
    #[serde(with = "crate::log::versioned_bufs")]
    records: Vec<(u64, Vec<u8>)>,
}

#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, openraft::BasicNode>,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

/// The change log as a Raft state machine. Readers (subscriptions, status) use [`ChangeLog`].
pub struct StateMachine {
    db: Arc<DB>,
    state: SmState,
    snapshots_built: u64,
    progress: watch::Sender<ChangeLogState>,
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
    pub fn read(&self, from: u64, max: usize, max_bytes: usize) -> anyhow::Result<Vec<Vec<u8>>> {
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
            .zip(from..)
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
        let state = match db.get_cf(cf, KEY_SM)? {
            Some(b) => postcard::from_bytes(&b)
                .map_err(|e| anyhow::anyhow!("decode the state machine's state: {e}"))?,
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
            },
            ChangeLog { db, progress: rx },
        ))
    }

    fn image(db: &DB) -> Result<Image, SErr> {
        // one RocksDB snapshot: the state and the records it describes, as of one batch
        let snap = db.snapshot();
        let sm = cf(db, CF_SM)?;
        let state: SmState = match snap
            .get_cf(sm, KEY_SM)
            .map_err(|e| StorageIOError::read_state_machine(any(e)))?
        {
            Some(b) => decode("the state machine's state", &b)?,
            None => SmState {
                log: ChangeLogState::new(),
                ..SmState::default()
            },
        };
        let rc = cf(db, CF_RECORDS)?;
        let mut records = vec![];
        for item in snap.iterator_cf(rc, IteratorMode::Start) {
            let (k, v) = item.map_err(|e| StorageIOError::read_state_machine(any(e)))?;
            let version = u64::from_be_bytes(k.as_ref().try_into().map_err(|_| {
                StorageIOError::read_state_machine(any("a record key is not 8 bytes"))
            })?);
            records.push((version, v.to_vec()));
        }
        Ok(Image { state, records })
    }
}

/// Builds snapshots from a consistent view of the database.
pub struct SnapshotBuilder {
    db: Arc<DB>,
    seq: u64,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, SErr> {
        let db = self.db.clone();
        let seq = self.seq;
        let stored = tokio::task::spawn_blocking(move || -> Result<StoredSnapshot, SErr> {
            let image = StateMachine::image(&db)?;
            let meta = SnapshotMeta {
                last_log_id: image.state.applied,
                last_membership: image.state.membership.clone(),
                snapshot_id: format!(
                    "{}-{seq}",
                    image.state.applied.map(|l| l.index).unwrap_or(0)
                ),
            };
            let data = encode(&image)?;
            let stored = StoredSnapshot { meta, data };
            let sm = cf(&db, CF_SM)?;
            db.put_cf_opt(sm, KEY_SNAPSHOT, encode(&stored)?, &synced())
                .map_err(|e| StorageIOError::write_snapshot(None, any(e)))?;
            Ok(stored)
        })
        .await
        .map_err(|e| StorageIOError::write_snapshot(None, any(e)))??;
        Ok(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        })
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
        let mut pending: std::collections::HashMap<u64, Vec<u8>> = Default::default();
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
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, SErr> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, openraft::BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), SErr> {
        let data = snapshot.into_inner();
        let image: Image = decode("a snapshot", &data)?;
        let rc = cf(&self.db, CF_RECORDS)?;
        let sm = cf(&self.db, CF_SM)?;
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(rc, 0u64.to_be_bytes(), u64::MAX.to_be_bytes());
        batch.delete_cf(rc, u64::MAX.to_be_bytes());
        for (v, r) in &image.records {
            batch.put_cf(rc, v.to_be_bytes(), r);
        }
        let mut state = image.state;
        state.applied = meta.last_log_id;
        state.membership = meta.last_membership.clone();
        batch.put_cf(sm, KEY_SM, encode(&state)?);
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        batch.put_cf(sm, KEY_SNAPSHOT, encode(&stored)?);
        self.db
            .write_opt(batch, &synced())
            .map_err(|e| StorageIOError::write_snapshot(None, any(e)))?;
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
        Ok(Some(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        }))
    }
}
