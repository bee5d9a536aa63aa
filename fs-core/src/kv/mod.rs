//! A small transactional key-value trait: the only thing a metadata backend implements.
//!
//! The metadata semantic layer ([`crate::meta`]) is written once over this trait; a backend
//! knows nothing about inodes or directories.
//!
//! # Key space
//! Every key starts with a [`GROUP_LEN`]-byte *group* (a tag byte and a big-endian u64 owner,
//! for example the directory inode whose entries follow). [`KvTxn::scan`] is only ever asked
//! for keys within one group, in byte order. Backends that are not ordered (Redis) keep a
//! per-group index on that promise.
//!
//! # To ensure correctness
//! - [`KvEngine::txn`] runs its closure as a serializable transaction: either all of its
//!   writes become visible together, or none. A backend may run the closure several times
//!   (optimistic concurrency); the closure must therefore have no side effects besides the
//!   transaction's own writes, and must read everything it depends on through the transaction.
//! - Writes inside a transaction are visible to later reads of the same transaction.
//! - [`KvTxn::append_log`] appends one change record whose version is assigned at commit: the
//!   next one after the last committed version, without gaps, even when the closure ran
//!   several times or concurrent transactions committed in between.
//! - [`KvTxn::add`] is a blind counter increment applied at commit; it never causes a conflict.
//! - [`KvTxn::put_versioned`] writes its value followed by the version the transaction's
//!   change record gets at commit (8 bytes, big-endian), so a key can name the version of the
//!   change it was written with although that version is assigned only at commit. A
//!   transaction that writes one must append a change record; it fails otherwise, and nothing
//!   it wrote is applied. The write is applied after the transaction's other writes, and
//!   reads of the same transaction do not see it.
//! - When the closure returns an error, that error comes back unchanged and nothing it wrote
//!   is applied; the error was computed from a consistent view (optimistic backends rerun the
//!   closure when its reads went stale).
//! - A committed transaction survives a crash of the calling process. [`KvEngine::sync`]
//!   additionally makes it survive a crash of the machine where the backend can promise it
//!   (RocksDB syncs its log; Redis durability is the server's `appendfsync` setting).
//! - Counters wrap around on overflow in every backend; callers keep them far from the
//!   limits (byte and inode counts, versions).

pub mod conformance;
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "rocksdb")]
pub mod rocks;
pub mod tags;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::Version;

/// Length of the group prefix every key starts with.
pub const GROUP_LEN: usize = 9;

/// Group of the change-log keys: `L` followed by owner 0; the version follows as 8 bytes BE.
pub const LOG_GROUP: [u8; GROUP_LEN] = [tags::LOG, 0, 0, 0, 0, 0, 0, 0, 0];

/// Maximum number of times a transaction is retried after a conflict before giving up.
pub const TXN_RETRIES_MAX: usize = 100;

pub type KvPairs = Vec<(Vec<u8>, Vec<u8>)>;

/// One transaction's view of the store.
pub trait KvTxn {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Keys that start with `prefix` (which is at least [`GROUP_LEN`] bytes), strictly after
    /// `start_after` if given, in byte order, at most `limit` of them.
    fn scan(&mut self, prefix: &[u8], start_after: Option<&[u8]>, limit: usize) -> Result<KvPairs>;
    fn put(&mut self, key: &[u8], value: &[u8]);
    fn delete(&mut self, key: &[u8]);
    /// Add `delta` to the little-endian i64 counter at `key` when the transaction commits.
    fn add(&mut self, key: &[u8], delta: i64);
    /// Append a change record to the log; its version is assigned at commit.
    /// At most one record per transaction.
    fn append_log(&mut self, record: Vec<u8>);
    /// Put `value` followed by the 8-byte big-endian version of this transaction's change
    /// record, assigned at commit; see the module documentation.
    fn put_versioned(&mut self, key: &[u8], value: &[u8]);
}

/// A transactional key-value store. See the module documentation for the contract.
pub trait KvEngine: Send + Sync + 'static {
    /// A short name for messages: `rocksdb`, `redis`, `memory`.
    fn name(&self) -> &'static str;
    /// Run `f` in a read-write transaction. Returns the version given to the change record
    /// appended by `f`, if any.
    fn txn(&self, f: &mut dyn FnMut(&mut dyn KvTxn) -> Result<()>) -> Result<Option<Version>>;
    /// Run `f` with read access only; writes made by `f` are discarded. Cheaper than
    /// [`KvEngine::txn`]: backends need not isolate it from concurrent writers.
    fn read(&self, f: &mut dyn FnMut(&mut dyn KvTxn) -> Result<()>) -> Result<()>;
    /// Atomically add `delta` to the counter at `key` outside any transaction; returns the new value.
    fn incr(&self, key: &[u8], delta: i64) -> Result<i64>;
    /// Make every committed transaction durable on stable storage.
    fn sync(&self) -> Result<()>;
    /// The version of the last committed change record ([`Version::ZERO`] when none).
    fn last_version(&self) -> Result<Version>;
    /// Delete every key of this store (used by `load` into a fresh engine and by tests).
    fn wipe(&self) -> Result<()>;
    /// What the engine holds in this process's memory, in bytes by part (RocksDB: its block
    /// cache, memtables and table readers); empty for an engine that keeps nothing here or
    /// does not say.
    fn memory(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}

pub type DynKv = Arc<dyn KvEngine>;

/// Whether `kv` runs in this process (RocksDB, memory): its short calls take microseconds and
/// are cheaper made in place on an async worker than handed to the blocking pool and back;
/// a call to an engine across the network (Redis) belongs on the blocking pool.
pub fn in_process(kv: &dyn KvEngine) -> bool {
    matches!(kv.name(), "rocksdb" | "memory")
}

/// Run a read-write transaction that returns a value.
pub fn txn<T>(
    kv: &dyn KvEngine,
    mut f: impl FnMut(&mut dyn KvTxn) -> Result<T>,
) -> Result<(T, Option<Version>)> {
    let mut out = None;
    let version = kv.txn(&mut |t| {
        out = Some(f(t)?);
        Ok(())
    })?;
    let value = out.ok_or_else(|| Error::Meta("transaction finished without a result".into()))?;
    Ok((value, version))
}

/// Run a read-only transaction that returns a value.
pub fn read<T>(kv: &dyn KvEngine, mut f: impl FnMut(&mut dyn KvTxn) -> Result<T>) -> Result<T> {
    let mut out = None;
    kv.read(&mut |t| {
        out = Some(f(t)?);
        Ok(())
    })?;
    out.ok_or_else(|| Error::Meta("read finished without a result".into()))
}

/// The key of change record `version`.
pub fn log_key(version: Version) -> Vec<u8> {
    let mut k = LOG_GROUP.to_vec();
    k.extend_from_slice(&version.to_be_bytes());
    k
}

/// Key of the last-version counter kept beside the log: its tag, owner 0, then `last`.
#[rustfmt::skip]
pub const LAST_VERSION_KEY: &[u8] =
    &[tags::LAST_VERSION, 0, 0, 0, 0, 0, 0, 0, 0, b'l', b'a', b's', b't'];

pub fn decode_counter(v: Option<Vec<u8>>) -> Result<i64> {
    match v {
        None => Ok(0),
        Some(b) => {
            let arr: [u8; 8] = b
                .as_slice()
                .try_into()
                .map_err(|_| Error::corrupt(format!("counter of {} bytes", b.len())))?;
            Ok(i64::from_le_bytes(arr))
        }
    }
}

/// The smallest key greater than every key starting with `prefix`, or None if there is none.
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// `value` followed by `version` as [`KvTxn::put_versioned`] writes it.
pub fn versioned_value(value: &[u8], version: Version) -> Vec<u8> {
    let mut v = Vec::with_capacity(value.len() + 8);
    v.extend_from_slice(value);
    v.extend_from_slice(&version.to_be_bytes());
    v
}

/// A value written by [`KvTxn::put_versioned`], split into what was put and the version.
pub fn split_versioned(stored: &[u8]) -> Result<(&[u8], Version)> {
    let at = stored
        .len()
        .checked_sub(8)
        .ok_or_else(|| Error::corrupt(format!("a versioned value of {} bytes", stored.len())))?;
    let (value, version) = stored.split_at(at);
    let version: [u8; 8] = version
        .try_into()
        .map_err(|_| Error::corrupt("a versioned value's version"))?;
    Ok((value, Version(u64::from_be_bytes(version))))
}

/// A buffered write set used by backends that apply writes at commit.
#[derive(Default, Debug, Clone)]
pub struct WriteSet {
    /// key -> Some(value) for a put, None for a delete; later writes replace earlier ones.
    pub writes: std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    pub adds: Vec<(Vec<u8>, i64)>,
    pub log: Option<Vec<u8>>,
    /// [`KvTxn::put_versioned`]: key -> the value the version is appended to.
    pub versioned: std::collections::BTreeMap<Vec<u8>, Vec<u8>>,
}

impl WriteSet {
    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        self.writes.insert(key.to_vec(), Some(value.to_vec()));
    }
    pub fn delete(&mut self, key: &[u8]) {
        self.writes.insert(key.to_vec(), None);
    }
    pub fn add(&mut self, key: &[u8], delta: i64) {
        self.adds.push((key.to_vec(), delta));
    }
    pub fn append_log(&mut self, record: Vec<u8>) {
        assert!(self.log.is_none(), "one change record per transaction");
        self.log = Some(record);
    }
    pub fn put_versioned(&mut self, key: &[u8], value: &[u8]) {
        self.versioned.insert(key.to_vec(), value.to_vec());
    }
    /// Refuse to commit versioned writes without a change record to take the version of.
    pub fn check_versioned(&self) -> Result<()> {
        if !self.versioned.is_empty() && self.log.is_none() {
            return Err(Error::Invalid(format!(
                "{} versioned writes in a transaction that appends no change record",
                self.versioned.len()
            )));
        }
        Ok(())
    }
    /// What this write set says about `key`: Some(Some(v)) written, Some(None) deleted, None untouched.
    pub fn lookup(&self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        self.writes.get(key).cloned()
    }
    /// Merge a backend's scan result with this write set's own writes under `prefix`.
    /// `base` must hold at least `limit` plus the number of this set's writes keys (when that
    /// many exist), or deletes in this set could leave fewer than `limit` results.
    pub fn overlay_scan(
        &self,
        mut base: KvPairs,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> KvPairs {
        let mut merged: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = base.drain(..).collect();
        let lower = std::ops::Bound::Included(prefix.to_vec());
        for (k, v) in self.writes.range((lower, std::ops::Bound::Unbounded)) {
            if !k.starts_with(prefix) {
                break;
            }
            if let Some(after) = start_after {
                if k.as_slice() <= after {
                    continue;
                }
            }
            match v {
                Some(v) => merged.insert(k.clone(), v.clone()),
                None => merged.remove(k),
            };
        }
        merged.into_iter().take(limit).collect()
    }
}

/// Open a metadata engine for reading only: RocksDB then works beside a running mount.
pub fn open_read_only(url: &str) -> Result<DynKv> {
    match crate::url::MetaUrl::parse(url)? {
        #[cfg(feature = "rocksdb")]
        crate::url::MetaUrl::RocksDb(path) => Ok(Arc::new(rocks::RocksKv::open_read_only(&path)?)),
        _ => open(url),
    }
}

/// Open a metadata engine from its URL (`rocksdb:///path`, `redis://host:port/db`, `memory://`).
/// Why the engine at `url` may lose a commit it acknowledged when its server crashes or the
/// power fails (None: it does not, as far as it can tell). Only a Redis server can: its
/// `appendfsync` decides (RocksDB's commits are synced by the code that needs them).
pub fn durability_problem(url: &str) -> Result<Option<String>> {
    match crate::url::MetaUrl::parse(url)? {
        #[cfg(feature = "redis")]
        crate::url::MetaUrl::Redis(u) => redis::RedisKv::open(&u)?.durability_problem(),
        _ => Ok(None),
    }
}

pub fn open(url: &str) -> Result<DynKv> {
    let parsed = crate::url::MetaUrl::parse(url)?;
    match parsed {
        crate::url::MetaUrl::Memory => Ok(Arc::new(memory::MemoryKv::new())),
        #[cfg(feature = "rocksdb")]
        crate::url::MetaUrl::RocksDb(path) => Ok(Arc::new(rocks::RocksKv::open(&path)?)),
        #[cfg(feature = "redis")]
        crate::url::MetaUrl::Redis(u) => Ok(Arc::new(redis::RedisKv::open(&u)?)),
        #[allow(unreachable_patterns)]
        other => Err(Error::Invalid(format!(
            "metadata engine {other:?} is not built into this binary"
        ))),
    }
}
