//! The block cache: a bounded memory LRU in front of an optional bounded disk cache, both
//! keyed by block key. Blocks are immutable, so a cached block never goes stale; every block
//! read from the disk cache or the object store is checked against its recorded CRC32.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::error::{Error, Result};

/// A byte-bounded LRU map from key to value size, with the values kept by the caller or here.
struct Lru<V> {
    map: HashMap<String, (V, u64, u64)>,
    order: BTreeMap<u64, String>,
    tick: u64,
    bytes: u64,
    capacity: u64,
}

impl<V: Clone> Lru<V> {
    fn new(capacity: u64) -> Self {
        Lru {
            map: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            bytes: 0,
            capacity,
        }
    }
    fn get(&mut self, key: &str) -> Option<V> {
        let (v, size, old) = self.map.get(key).cloned()?;
        self.tick += 1;
        self.order.remove(&old);
        self.order.insert(self.tick, key.to_string());
        self.map
            .insert(key.to_string(), (v.clone(), size, self.tick));
        Some(v)
    }
    /// Insert and return the keys evicted to stay within capacity.
    fn insert(&mut self, key: &str, v: V, size: u64) -> Vec<String> {
        if let Some((_, old_size, old_tick)) = self.map.remove(key) {
            self.order.remove(&old_tick);
            self.bytes -= old_size;
        }
        self.tick += 1;
        self.map.insert(key.to_string(), (v, size, self.tick));
        self.order.insert(self.tick, key.to_string());
        self.bytes += size;
        let mut evicted = vec![];
        while self.bytes > self.capacity {
            let Some((&t, _)) = self.order.iter().next() else {
                break;
            };
            if let Some(k) = self.order.remove(&t) {
                if let Some((_, s, _)) = self.map.remove(&k) {
                    self.bytes -= s;
                }
                evicted.push(k);
            }
        }
        evicted
    }
    fn remove(&mut self, key: &str) {
        if let Some((_, size, tick)) = self.map.remove(key) {
            self.order.remove(&tick);
            self.bytes -= size;
        }
    }
}

pub struct BlockCache {
    mem: Mutex<Lru<Bytes>>,
    disk: Option<DiskCache>,
}

struct DiskCache {
    dir: PathBuf,
    index: Mutex<Lru<()>>,
}

/// Check a block against its recorded size and CRC32.
pub fn verify(key: &str, data: &[u8], len: u32, crc: u32) -> Result<()> {
    if data.len() != len as usize {
        return Err(Error::CorruptBlock {
            key: key.to_string(),
            reason: format!("{} bytes, expected {len}", data.len()),
        });
    }
    let got = crc32fast::hash(data);
    if got != crc {
        return Err(Error::CorruptBlock {
            key: key.to_string(),
            reason: format!("crc32 {got:08x}, expected {crc:08x}"),
        });
    }
    Ok(())
}

impl BlockCache {
    /// `disk_dir`: where cached blocks are kept on disk (None: memory only).
    pub fn new(mem_bytes: u64, disk_dir: Option<&Path>, disk_bytes: u64) -> Result<Self> {
        let disk = match disk_dir {
            Some(dir) if disk_bytes > 0 => {
                // the cache holds the file system's bytes: its owner's alone (0700), and
                // refused where other users could plant blocks in it
                strait_ids::private::private_dir(dir, "cache directory").map_err(Error::Invalid)?;
                let mut index = Lru::new(disk_bytes);
                // rebuild the index from what an earlier mount left, oldest first
                let mut found = vec![];
                scan_dir(dir, dir, &mut found);
                found.sort_by_key(|(_, _, mtime)| *mtime);
                for (key, size, _) in found {
                    for k in index.insert(&key, (), size) {
                        let _ = std::fs::remove_file(dir.join(&k));
                    }
                }
                Some(DiskCache {
                    dir: dir.to_path_buf(),
                    index: Mutex::new(index),
                })
            }
            _ => None,
        };
        Ok(BlockCache {
            mem: Mutex::new(Lru::new(mem_bytes)),
            disk,
        })
    }

    pub fn get_mem(&self, key: &str) -> Option<Bytes> {
        self.mem.lock().get(key)
    }

    pub fn put_mem(&self, key: &str, data: Bytes) {
        let size = data.len() as u64;
        self.mem.lock().insert(key, data, size);
    }

    /// A block from the disk cache, verified; a corrupt copy is dropped.
    pub fn get_disk(&self, key: &str, len: u32, crc: u32) -> Option<Bytes> {
        let disk = self.disk.as_ref()?;
        disk.index.lock().get(key)?;
        let path = disk.dir.join(key);
        match std::fs::read(&path) {
            Ok(data) => match verify(key, &data, len, crc) {
                Ok(()) => Some(Bytes::from(data)),
                Err(e) => {
                    tracing::warn!("drop cached copy: {e}");
                    disk.index.lock().remove(key);
                    let _ = std::fs::remove_file(&path);
                    None
                }
            },
            Err(_) => {
                disk.index.lock().remove(key);
                None
            }
        }
    }

    /// Keep a copy of a block on disk (best effort: a full disk only costs cache hits).
    pub fn put_disk(&self, key: &str, data: &[u8]) {
        let Some(disk) = self.disk.as_ref() else {
            return;
        };
        let path = disk.dir.join(key);
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
            if let Some(parent) = path.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(strait_ids::private::DIR_MODE)
                    .create(parent)?;
            }
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(strait_ids::private::FILE_MODE)
                .open(&tmp)?
                .write_all(data)?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            tracing::debug!("cache block {key} on disk: {e}");
            return;
        }
        let evicted = disk.index.lock().insert(key, (), data.len() as u64);
        for k in evicted {
            let _ = std::fs::remove_file(disk.dir.join(&k));
        }
    }

    /// Forget a block, in memory and on disk: its key may name another block later (a slice
    /// id the metadata service refused can be handed to another writer).
    pub fn remove(&self, key: &str) {
        self.mem.lock().remove(key);
        if let Some(disk) = self.disk.as_ref() {
            disk.index.lock().remove(key);
            let _ = std::fs::remove_file(disk.dir.join(key));
        }
    }

    pub fn has_disk(&self) -> bool {
        self.disk.is_some()
    }
}

fn scan_dir(root: &Path, dir: &Path, out: &mut Vec<(String, u64, std::time::SystemTime)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in rd.flatten() {
        let path = entry.path();
        let Ok(md) = entry.metadata() else { continue };
        if md.is_dir() {
            scan_dir(root, &path, out);
        } else if let Ok(rel) = path.strip_prefix(root) {
            let key = rel.to_string_lossy().to_string();
            if key.contains(".tmp") {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            out.push((
                key,
                md.len(),
                md.modified().unwrap_or(std::time::UNIX_EPOCH),
            ));
        }
    }
}

pub type SharedCache = Arc<BlockCache>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_lru_evicts_oldest_within_capacity() {
        let c = BlockCache::new(10, None, 0).unwrap();
        c.put_mem("a", Bytes::from_static(b"12345"));
        c.put_mem("b", Bytes::from_static(b"12345"));
        assert!(c.get_mem("a").is_some()); // a is now the most recent
        c.put_mem("c", Bytes::from_static(b"12345"));
        assert!(c.get_mem("b").is_none());
        assert!(c.get_mem("a").is_some());
        assert!(c.get_mem("c").is_some());
    }

    #[test]
    fn disk_cache_is_bounded_verified_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let c = BlockCache::new(0, Some(dir.path()), 10).unwrap();
        let a = b"hello";
        c.put_disk("chunks/0/0/1_0_5", a);
        assert_eq!(
            c.get_disk("chunks/0/0/1_0_5", 5, crc32fast::hash(a))
                .unwrap(),
            &a[..]
        );
        // a wrong crc drops the copy
        assert!(c.get_disk("chunks/0/0/1_0_5", 5, 1).is_none());
        assert!(c
            .get_disk("chunks/0/0/1_0_5", 5, crc32fast::hash(a))
            .is_none());
        c.put_disk("k1", b"12345");
        c.put_disk("k2", b"12345");
        c.put_disk("k3", b"12345");
        assert!(c.get_disk("k1", 5, crc32fast::hash(b"12345")).is_none());
        drop(c);
        let c = BlockCache::new(0, Some(dir.path()), 10).unwrap();
        assert!(c.get_disk("k3", 5, crc32fast::hash(b"12345")).is_some());
    }

    /// Issue 43, item 3: cached blocks were written with the default mode (0644) under a
    /// 0755 directory, readable by every user of the host; and a directory others may write
    /// was used, where anyone could plant blocks. Now the directory is 0700 (an earlier one
    /// narrowed), blocks 0600, and a directory others may write is refused.
    #[test]
    fn the_disk_cache_is_its_owners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o755)).unwrap();
        let c = BlockCache::new(0, Some(&cache), 1 << 20).unwrap();
        assert_eq!(mode(&cache), 0o700);
        c.put_disk("chunks/0/0/1_0_5", b"hello");
        assert_eq!(mode(&cache.join("chunks/0/0/1_0_5")), 0o600);
        assert_eq!(mode(&cache.join("chunks/0/0")), 0o700);
        drop(c);
        // a directory other users may write: refused, and left as it was
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = BlockCache::new(0, Some(&shared), 1 << 20).err().unwrap();
        assert!(e.to_string().contains("written by other users"), "{e}");
        assert_eq!(mode(&shared), 0o1777);
        assert_eq!(std::fs::read_dir(&shared).unwrap().count(), 0);
    }
}
