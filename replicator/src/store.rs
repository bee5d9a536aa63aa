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
//! Every write that openraft relies on for safety (log entries, votes, the committed id,
//! purges, snapshots) is synced before it is reported done. Applying committed entries is not
//! synced: the entries are durable in the Raft log, every column family shares one write-ahead
//! log (so the next synced write makes every earlier apply durable too), and after a machine
//! crash openraft applies again the committed entries after the last applied id on disk.

// openraft's trait methods return its `StorageError` (over 200 bytes); the helpers here return
// the same type so `?` carries it through unchanged.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
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
use crate::snapfile::{self, SnapFile};
use crate::{NodeId, TypeConfig};

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

/// Open (or create) a node's database.
pub fn open_db(dir: &Path) -> anyhow::Result<Arc<DB>> {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    // write files out as they grow: without it, flushes and compactions leave gigabytes of
    // dirty pages that the next fsync of the Raft log waits for (stalls of 0.2-0.5 s seen)
    opts.set_bytes_per_sync(1 << 20);
    opts.set_wal_bytes_per_sync(1 << 20);
    // flushes and compactions write around the page cache: their megabytes then never wait
    // in it for write-back in front of the Raft log's synced writes (alternating 10 runs each
    // of `replicator bench --rate 50000`: without it 2 runs had commit stalls of 157 and 313
    // ms, with it none went past 27 ms). Only where the file system takes O_DIRECT.
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("create the replicator database at {}: {e}", dir.display()))?;
    if direct_io_works(dir) {
        opts.set_use_direct_io_for_flush_and_compaction(true);
    } else {
        tracing::info!(
            "{} does not take O_DIRECT: RocksDB flushes and compactions go through the page cache",
            dir.display()
        );
    }
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

/// Whether a file in `dir` can be opened with O_DIRECT (some file systems refuse it, and
/// RocksDB would then fail every flush).
fn direct_io_works(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let probe = dir.join(".direct-io-probe");
    let ok = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
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
/// to this thread, so no runtime worker blocks in fsync: the other nodes' tasks and the RPCs
/// run meanwhile. openraft 0.9's Raft core itself waits for the report (`append_to_log`
/// awaits the flush) before it replicates or takes the next write, so a leader's sync comes
/// before its followers are sent the entries, and a node has one append to sync at a time.
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

/// A snapshot: what openraft knows of it, and the file in the snapshot directory.
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, openraft::BasicNode>,
    file: String,
}

fn snap_dir(db: &DB) -> PathBuf {
    db.path().join(snapfile::DIR)
}

fn io_snap(e: impl std::fmt::Display) -> SErr {
    StorageIOError::write_snapshot(None, any(e)).into()
}

/// The largest record a snapshot file may hold.
const RECORD_MAX: usize = clog::APPEND_BYTES_MAX;

/// The change log as a Raft state machine. Readers (subscriptions, status) use [`ChangeLog`].
pub struct StateMachine {
    db: Arc<DB>,
    state: SmState,
    snapshots_built: u64,
    progress: watch::Sender<ChangeLogState>,
    snap_lock: SnapLock,
}

/// Held by an install for its whole length, and by a snapshot build to take its view of the
/// database and to record its file: openraft builds snapshots in a task of their own, which
/// could otherwise read a half-installed database, or replace a newer snapshot's file.
type SnapLock = Arc<std::sync::Mutex<()>>;

fn lock(l: &SnapLock) -> std::sync::MutexGuard<'_, ()> {
    l.lock().unwrap_or_else(|e| e.into_inner())
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
                snap_lock: SnapLock::default(),
            },
            ChangeLog { db, progress: rx },
        ))
    }

    /// Write a snapshot of the database as it is now into a new file of the snapshot
    /// directory, streaming the records. Returns the state it holds and the file's name.
    fn write_snapshot_file(db: &DB, snap_lock: &SnapLock) -> Result<(SmState, String), SErr> {
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
            Some(b) => decode("the state machine's state", &b)?,
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
    fn install_file(db: &DB, stored: &StoredSnapshot) -> Result<SmState, SErr> {
        let path = snap_dir(db).join(&stored.file);
        let (mut reader, state) = snapfile::Reader::open(&path, RECORD_MAX).map_err(io_snap)?;
        let mut state: SmState = decode("a snapshot's state", &state)?;
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
    db: Arc<DB>,
    seq: u64,
    snap_lock: SnapLock,
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
                state.log.last_version + 1
                    - state.log.earliest_version.min(state.log.last_version + 1),
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
    use openraft::CommittedLeaderId;
    use tokio::io::AsyncWriteExt;

    fn records(db: &DB) -> Vec<(u64, Vec<u8>)> {
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

    /// Flushed tables (written with O_DIRECT where the file system takes it, as here) are
    /// read back after the database is opened again; the probe leaves no file behind, and a
    /// directory that cannot be written is reported as not taking O_DIRECT.
    #[test]
    fn flushed_tables_read_back_and_the_direct_io_probe_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            let db = open_db(&path).unwrap();
            let rc = cf(&db, CF_RECORDS).unwrap();
            for v in 1..=2000u64 {
                db.put_cf(rc, v.to_be_bytes(), vec![(v % 251) as u8; 1000])
                    .unwrap();
            }
            db.flush_cf(rc).unwrap();
        }
        let tables = std::fs::read_dir(&path)
            .unwrap()
            .filter(|e| {
                let n = e.as_ref().unwrap().file_name();
                n.to_string_lossy().ends_with(".sst")
            })
            .count();
        assert!(tables >= 1, "no table was flushed");
        assert!(!path.join(".direct-io-probe").exists());
        let db = open_db(&path).unwrap();
        let got = records(&db);
        assert_eq!(got.len(), 2000);
        for (v, bytes) in got {
            assert_eq!(bytes, vec![(v % 251) as u8; 1000], "version {v}");
        }
        assert!(direct_io_works(&path));
        assert!(!direct_io_works(&dir.path().join("missing")));
    }

    /// A database holding versions 1..=n and a state that says so, applied up to index 40.
    fn source(dir: &Path, n: u64) -> (Arc<DB>, SnapshotMeta<NodeId, openraft::BasicNode>) {
        let db = open_db(dir).unwrap();
        let mut state = SmState {
            log: ChangeLogState::new(),
            ..SmState::default()
        };
        state.applied = Some(LogId::new(CommittedLeaderId::new(3, 1), 40));
        state.log.last_version = n;
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
        assert_eq!(log.state().last_version, 300);
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
