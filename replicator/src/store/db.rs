//! Opening a node's database: its column families and how RocksDB is tuned for the Raft log.

use std::path::Path;
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, Options, DB};

use super::{CF_LOG, CF_META, CF_RECORDS, CF_SM};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::cf;
    use crate::store::test_util::records;

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
}
