//! The Raft log on RocksDB: entries by index in `raft_log`, the vote, the committed id and the
//! purge point in `raft_meta`.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, RaftLogReader, StorageIOError, Vote};
use rocksdb::{Direction, IteratorMode, WriteBatch, DB};
use serde::{Deserialize, Serialize};

use super::{
    any, cf, decode, encode, synced, SErr, CF_LOG, CF_META, KEY_COMMITTED, KEY_PURGED, KEY_VOTE,
    SLOW_IO,
};
use crate::{NodeId, TypeConfig};

/// Appends waiting for their write-ahead log sync, in order.
const FLUSH_QUEUE: usize = 4096;

/// Syncs the write-ahead log on its own thread and reports appends durable, in their order.
/// An append writes its entries at once (readable, as openraft requires) and leaves the fsync
/// to this thread, so no runtime worker blocks in fsync: the other nodes' tasks and the RPCs
/// run meanwhile. openraft 0.9's Raft core itself waits for the report (`append_to_log`
/// awaits the flush) before it replicates or takes the next write, so a leader's sync comes
/// before its followers are sent the entries, and a node has one append to sync at a time.
///
/// When the last [`LogStore`] clone goes, the flusher closes its queue and waits for its thread
/// to finish what is queued: the thread's handle on the database is gone before the store's
/// owner goes on. (Left to end on its own, the thread could be the last holder of the database
/// and close it while the process exits, which RocksDB answers with "pthread lock: Invalid
/// argument" and an abort; openraft's storage suite, opening a database per case, hit it.)
struct Flusher {
    tx: Option<std::sync::mpsc::SyncSender<LogFlushed<TypeConfig>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flusher {
    fn tx(&self) -> &std::sync::mpsc::SyncSender<LogFlushed<TypeConfig>> {
        self.tx
            .as_ref()
            .expect("the queue is open until the flusher is dropped")
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("the Raft log's fsync thread panicked");
            }
        }
    }
}

impl Flusher {
    fn start(db: Arc<DB>) -> anyhow::Result<Flusher> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<LogFlushed<TypeConfig>>(FLUSH_QUEUE);
        let thread = std::thread::Builder::new()
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
        Ok(Flusher {
            tx: Some(tx),
            thread: Some(thread),
        })
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
        let cb = match self.flusher.tx().try_send(callback) {
            Ok(()) => return Ok(()),
            Err(std::sync::mpsc::TrySendError::Full(cb)) => match self.flusher.tx().send(cb) {
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
