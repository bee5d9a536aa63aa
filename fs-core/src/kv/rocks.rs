//! RocksDB backend, the embedded default. One process owns the database. Read-write
//! transactions are serialized by a mutex held from the closure's start to the write batch's
//! commit, so reads inside a transaction always see the latest committed state; read-only
//! closures run against a RocksDB snapshot without the mutex.
//!
//! Writes go to the WAL without fsync (a committed transaction survives a crash of the
//! process); [`KvEngine::sync`] fsyncs the WAL (called on fsync(2) and on unmount). Counters
//! ([`KvEngine::incr`]) are written with fsync: they hand out ids in batches, and must not
//! go back after a power loss.

use std::path::Path;

use parking_lot::Mutex;
use rocksdb::{Direction, IteratorMode, Options, ReadOptions, WriteBatch, WriteOptions, DB};

use super::{
    decode_counter, log_key, versioned_value, KvEngine, KvPairs, KvTxn, WriteSet, LAST_VERSION_KEY,
};
use crate::error::{Error, Result};
use crate::Version;

/// The block cache of one engine: the tables' data blocks kept in memory.
const BLOCK_CACHE_BYTES: usize = 256 << 20;
/// Bits of bloom filter per key: about 1 % false positives, so a lookup of a name that does
/// not exist (every create asks) reads no table that cannot hold it.
const BLOOM_BITS_PER_KEY: f64 = 10.0;
/// The size of one partition of a table's index or filter (RocksDB's advice: 4 KiB).
const METADATA_BLOCK_BYTES: usize = 4096;

/// Tables with bloom filters, everything they read kept in one bounded cache.
///
/// Measured with `scripts/bench-scale.sh` (many files in 10,000 directories through `dev up`):
/// - RocksDB's defaults (no filters, a small cache): at 3 million files the mirror's CPU per
///   create had grown from 38 to 218 µs, most of it reading and decompressing blocks;
/// - whole filters kept in the block cache (`cache_index_and_filter_blocks` alone): a
///   table's filter is one block of several MiB, larger than a shard of the cache can hold,
///   so it was read again and its checksum computed on every lookup: 3.3 ms of the primary's
///   CPU per create at 1.4 million files;
/// - filters and indexes kept with the table readers, outside the cache: fast, but their
///   memory grows with the number of keys (about 1.25 bytes of filter per key, and the
///   indexes), without bound.
///
/// So the indexes and filters are partitioned ([`METADATA_BLOCK_BYTES`] a partition, as
/// RocksDB advises for large databases): the partitions live in the cache like data blocks,
/// and only each table's top-level index of its partitions stays pinned (a few bytes per
/// partition). What the engine holds is then the cache, the memtables and those top levels,
/// whatever the number of files.
fn table_options() -> rocksdb::BlockBasedOptions {
    let mut t = rocksdb::BlockBasedOptions::default();
    t.set_block_cache(&rocksdb::Cache::new_lru_cache(BLOCK_CACHE_BYTES));
    t.set_bloom_filter(BLOOM_BITS_PER_KEY, false);
    t.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
    t.set_partition_filters(true);
    t.set_metadata_block_size(METADATA_BLOCK_BYTES);
    t.set_cache_index_and_filter_blocks(true);
    t.set_cache_index_and_filter_blocks_with_high_priority(true);
    t.set_pin_top_level_index_and_filter(true);
    t.set_pin_l0_filter_and_index_blocks_in_cache(true);
    t
}

pub struct RocksKv {
    db: DB,
    write_lock: Mutex<()>,
    read_only: bool,
}

fn err(context: &str, e: rocksdb::Error) -> Error {
    Error::Meta(format!("{context}: {e}"))
}

impl RocksKv {
    pub fn open(path: &Path) -> Result<Self> {
        std::fs::create_dir_all(path)
            .map_err(|e| Error::io(format!("create metadata directory {}", path.display()), e))?;
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        opts.increase_parallelism(2);
        opts.set_max_open_files(512);
        opts.set_block_based_table_factory(&table_options());
        let db = DB::open(&opts, path).map_err(|e| {
            if e.to_string().contains("lock") {
                Error::Meta(format!(
                    "the RocksDB metadata at {} is in use by another process (a running mount?): \
                     unmount it first, or use a shared engine such as Redis",
                    path.display()
                ))
            } else {
                err(&format!("open rocksdb at {}", path.display()), e)
            }
        })?;
        Ok(Self {
            db,
            write_lock: Mutex::new(()),
            read_only: false,
        })
    }

    /// Open for reading only, beside a process that has the database open for writing
    /// (status, changelog and fsck of a mounted file system). It sees the state of the moment
    /// it was opened; writes fail with EROFS.
    pub fn open_read_only(path: &Path) -> Result<Self> {
        if !path.join("CURRENT").exists() {
            return Err(Error::Invalid(format!(
                "no RocksDB metadata at {}: run `strait format` first",
                path.display()
            )));
        }
        let opts = Options::default();
        let db = DB::open_for_read_only(&opts, path, false).map_err(|e| {
            err(
                &format!("open rocksdb at {} for reading", path.display()),
                e,
            )
        })?;
        Ok(Self {
            db,
            write_lock: Mutex::new(()),
            read_only: true,
        })
    }

    fn writable(&self) -> Result<()> {
        if self.read_only {
            Err(Error::Sys(libc::EROFS))
        } else {
            Ok(())
        }
    }
}

enum View<'a> {
    Db(&'a DB),
    Snap(rocksdb::SnapshotWithThreadMode<'a, DB>),
}

struct RocksTxn<'a> {
    view: View<'a>,
    ws: WriteSet,
}

impl RocksTxn<'_> {
    fn raw_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match &self.view {
            View::Db(db) => db.get(key).map_err(|e| err("read key", e)),
            View::Snap(s) => s.get(key).map_err(|e| err("read key", e)),
        }
    }
    fn raw_scan(&self, prefix: &[u8], start_after: Option<&[u8]>, limit: usize) -> Result<KvPairs> {
        let mut ro = ReadOptions::default();
        if let Some(end) = super::prefix_end(prefix) {
            ro.set_iterate_upper_bound(end);
        }
        let mut from = prefix.to_vec();
        if let Some(a) = start_after {
            if a >= prefix {
                from = a.to_vec();
                from.push(0);
            }
        }
        let mode = IteratorMode::From(&from, Direction::Forward);
        let iter = match &self.view {
            View::Db(db) => db.iterator_opt(mode, ro),
            View::Snap(s) => s.iterator_opt(mode, ro),
        };
        let mut out = Vec::new();
        for item in iter {
            let (k, v) = item.map_err(|e| err("scan keys", e))?;
            if !k.starts_with(prefix) || out.len() >= limit {
                break;
            }
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }
}

impl KvTxn for RocksTxn<'_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(v) = self.ws.lookup(key) {
            return Ok(v);
        }
        self.raw_get(key)
    }
    fn scan(&mut self, prefix: &[u8], start_after: Option<&[u8]>, limit: usize) -> Result<KvPairs> {
        let extra = self.ws.writes.len();
        let base = self.raw_scan(prefix, start_after, limit.saturating_add(extra))?;
        Ok(self.ws.overlay_scan(base, prefix, start_after, limit))
    }
    fn put(&mut self, key: &[u8], value: &[u8]) {
        self.ws.put(key, value)
    }
    fn delete(&mut self, key: &[u8]) {
        self.ws.delete(key)
    }
    fn add(&mut self, key: &[u8], delta: i64) {
        self.ws.add(key, delta)
    }
    fn append_log(&mut self, record: Vec<u8>) {
        self.ws.append_log(record)
    }
    fn put_versioned(&mut self, key: &[u8], value: &[u8]) {
        self.ws.put_versioned(key, value)
    }
}

impl KvEngine for RocksKv {
    fn name(&self) -> &'static str {
        "rocksdb"
    }

    fn txn(&self, f: &mut dyn FnMut(&mut dyn KvTxn) -> Result<()>) -> Result<Option<Version>> {
        self.writable()?;
        let _guard = self.write_lock.lock();
        let mut t = RocksTxn {
            view: View::Db(&self.db),
            ws: WriteSet::default(),
        };
        f(&mut t)?;
        let ws = t.ws;
        ws.check_versioned()?;
        let mut batch = WriteBatch::default();
        let mut counters: std::collections::BTreeMap<Vec<u8>, i64> = Default::default();
        for (k, v) in &ws.writes {
            match v {
                Some(v) => batch.put(k, v),
                None => batch.delete(k),
            }
        }
        for (k, d) in &ws.adds {
            let cur = match counters.get(k) {
                Some(c) => *c,
                None => match ws.writes.get(k) {
                    Some(v) => decode_counter(v.clone())?,
                    None => decode_counter(self.db.get(k).map_err(|e| err("read counter", e))?)?,
                },
            };
            counters.insert(k.clone(), cur.wrapping_add(*d));
        }
        for (k, v) in &counters {
            batch.put(k, v.to_le_bytes());
        }
        let mut version = None;
        if let Some(record) = ws.log {
            let last = decode_counter(
                self.db
                    .get(LAST_VERSION_KEY)
                    .map_err(|e| err("read version", e))?,
            )? as u64;
            let v = Version(last + 1);
            batch.put(LAST_VERSION_KEY, (v.0 as i64).to_le_bytes());
            batch.put(log_key(v), record);
            for (k, value) in &ws.versioned {
                batch.put(k, versioned_value(value, v));
            }
            version = Some(v);
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(false);
        self.db
            .write_opt(batch, &wo)
            .map_err(|e| err("commit transaction", e))?;
        Ok(version)
    }

    fn read(&self, f: &mut dyn FnMut(&mut dyn KvTxn) -> Result<()>) -> Result<()> {
        let mut t = RocksTxn {
            view: View::Snap(self.db.snapshot()),
            ws: WriteSet::default(),
        };
        f(&mut t)
    }

    fn incr(&self, key: &[u8], delta: i64) -> Result<i64> {
        self.writable()?;
        let _guard = self.write_lock.lock();
        let v = decode_counter(self.db.get(key).map_err(|e| err("read counter", e))?)?
            .wrapping_add(delta);
        // synced: a counter hands out ids (inodes, slices, sessions) in batches, and one that
        // went back after a power loss would hand out ids already in use (a slice id names
        // objects in the store); one fsync per batch
        let mut wo = WriteOptions::default();
        wo.set_sync(delta != 0);
        self.db
            .put_opt(key, v.to_le_bytes(), &wo)
            .map_err(|e| err("write counter", e))?;
        Ok(v)
    }

    fn sync(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.db.flush_wal(true).map_err(|e| err("sync wal", e))
    }

    fn last_version(&self) -> Result<Version> {
        Ok(Version(decode_counter(
            self.db
                .get(LAST_VERSION_KEY)
                .map_err(|e| err("read version", e))?,
        )? as u64))
    }

    fn wipe(&self) -> Result<()> {
        self.writable()?;
        let _guard = self.write_lock.lock();
        let mut batch = WriteBatch::default();
        for item in self.db.iterator(IteratorMode::Start) {
            let (k, _) = item.map_err(|e| err("scan keys", e))?;
            batch.delete(k);
        }
        self.db.write(batch).map_err(|e| err("wipe", e))
    }
    fn memory(&self) -> Vec<(&'static str, u64)> {
        MEMORY_PROPERTIES
            .iter()
            .filter_map(|(part, property)| {
                let bytes = self.db.property_int_value(*property).ok().flatten()?;
                Some((*part, bytes))
            })
            .collect()
    }
}

/// The parts of [`KvEngine::memory`] and the RocksDB properties that measure them.
const MEMORY_PROPERTIES: [(&str, &str); 4] = [
    ("block_cache", "rocksdb.block-cache-usage"),
    ("block_cache_pinned", "rocksdb.block-cache-pinned-usage"),
    ("memtables", "rocksdb.cur-size-all-mem-tables"),
    ("table_readers", "rocksdb.estimate-table-readers-mem"),
];

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::RocksKv;
    use crate::kv::{conformance, KvEngine};

    #[test]
    fn passes_the_conformance_suite() {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let n = AtomicUsize::new(0);
        // A fresh database per case: one process may open a RocksDB directory only once.
        let make = || -> Arc<dyn KvEngine> {
            let path = dir
                .path()
                .join(n.fetch_add(1, Ordering::Relaxed).to_string());
            Arc::new(RocksKv::open(&path).expect("open rocksdb"))
        };
        conformance::run_all(&make);
    }

    /// The tables an engine writes carry bloom filters, which stay with the table readers
    /// rather than in the block cache (see `table_options`); what RocksDB writes in its
    /// OPTIONS file says how it runs.
    #[test]
    fn tables_have_partitioned_bloom_filters_read_through_the_block_cache() {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let kv = RocksKv::open(dir.path()).expect("open rocksdb");
        drop(kv);
        let mut options = String::new();
        for entry in std::fs::read_dir(dir.path()).expect("list the database") {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().map(|n| n.to_string_lossy().to_string());
            if name.is_some_and(|n| n.starts_with("OPTIONS-")) {
                options = std::fs::read_to_string(&path).expect("read the OPTIONS file");
            }
        }
        assert!(!options.is_empty(), "RocksDB wrote no OPTIONS file");
        let setting = |name: &str| -> String {
            options
                .lines()
                .map(str::trim)
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("no {name} in the OPTIONS file"))
                .to_string()
        };
        assert!(
            setting("filter_policy").contains("bloomfilter"),
            "filter_policy={}",
            setting("filter_policy")
        );
        // the filters and indexes in partitions, read through the cache (bounded), and each
        // table's top level pinned
        assert_eq!(setting("cache_index_and_filter_blocks"), "true");
        assert_eq!(setting("partition_filters"), "true");
        assert_eq!(setting("index_type"), "kTwoLevelIndexSearch");
        assert_eq!(setting("metadata_block_size"), "4096");
        assert_eq!(setting("pin_top_level_index_and_filter"), "true");
        assert_eq!(setting("no_block_cache"), "false");
    }
}
