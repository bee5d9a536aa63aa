//! The caches `strait bench cache` compares, each behind [`BenchCache`], used as the read
//! path uses the block cache (`fs-core/src/vfs/read.rs`): memory first, then the disk cache
//! (a block found there is verified and put into memory), else the block is fetched and put
//! into memory and, off the read path, onto disk.
//!
//! - [`Layered`] over [`HandWritten`]: strait's [`BlockCache`] as it is;
//! - [`Layered`] over [`Moka`]: `moka::sync::Cache` (a byte weigher) for memory, in front of
//!   the hand-written disk cache (moka has no disk tier);
//! - [`FoyerMemory`] and [`FoyerHybrid`]: `foyer::Cache`, and `foyer::HybridCache` (memory
//!   and its own disk engine) for both tiers.
//!
//! The crates are built only with the feature `bench-cache-crates`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use strait_fs_core::vfs::BlockCache;

/// Where a read found its block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    Memory,
    Disk,
}

/// A cache under test.
pub trait BenchCache: Send + Sync {
    /// The block under `key` from memory, else from disk (verified against `len` and `crc`,
    /// and kept in memory from then on); None: a miss.
    fn get(&self, key: &str, len: u32, crc: u32) -> Option<(Bytes, Found)>;

    /// Keep a fetched block: in memory, and on disk when the cache has a disk tier (that
    /// write may be left to run after the call, as the read path leaves it).
    fn put(&self, key: &str, block: Bytes);

    /// Wait for the disk writes that `put` left running.
    fn settle(&self) -> Result<()>;

    /// Settle, and stop what the cache runs in the background.
    fn close(&self) -> Result<()> {
        self.settle()
    }
}

/// A memory tier.
pub trait MemoryTier: Send + Sync {
    fn get(&self, key: &str) -> Option<Bytes>;
    fn put(&self, key: &str, block: Bytes);
}

/// strait's memory LRU (the memory half of a [`BlockCache`]).
pub struct HandWritten(pub Arc<BlockCache>);

impl MemoryTier for HandWritten {
    fn get(&self, key: &str) -> Option<Bytes> {
        self.0.get_mem(key)
    }

    fn put(&self, key: &str, block: Bytes) {
        self.0.put_mem(key, block)
    }
}

/// The hand-written disk cache (the disk half of a [`BlockCache`]), whose writes run on a
/// blocking thread as the read path's do (`spawn_blocking`, not awaited).
pub struct DiskTier {
    cache: Arc<BlockCache>,
    rt: tokio::runtime::Runtime,
    writes_pending: Arc<AtomicU64>,
}

impl DiskTier {
    pub fn new(cache: Arc<BlockCache>) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("bench-disk-writer")
            .build()
            .context("start the disk writers' runtime")?;
        Ok(DiskTier {
            cache,
            rt,
            writes_pending: Arc::new(AtomicU64::new(0)),
        })
    }
}

/// A memory tier in front of an optional hand-written disk tier.
pub struct Layered<M> {
    pub mem: M,
    pub disk: Option<DiskTier>,
}

impl<M: MemoryTier> BenchCache for Layered<M> {
    fn get(&self, key: &str, len: u32, crc: u32) -> Option<(Bytes, Found)> {
        if let Some(b) = self.mem.get(key) {
            return Some((b, Found::Memory));
        }
        let b = self.disk.as_ref()?.cache.get_disk(key, len, crc)?;
        self.mem.put(key, b.clone());
        Some((b, Found::Disk))
    }

    fn put(&self, key: &str, block: Bytes) {
        self.mem.put(key, block.clone());
        if let Some(disk) = &self.disk {
            let (cache, pending, key) = (
                disk.cache.clone(),
                disk.writes_pending.clone(),
                key.to_string(),
            );
            pending.fetch_add(1, Ordering::SeqCst);
            disk.rt.spawn_blocking(move || {
                cache.put_disk(&key, &block);
                pending.fetch_sub(1, Ordering::SeqCst);
            });
        }
    }

    fn settle(&self) -> Result<()> {
        if let Some(disk) = &self.disk {
            while disk.writes_pending.load(Ordering::SeqCst) > 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(())
    }
}

#[cfg(feature = "bench-cache-crates")]
pub use crates::{foyer_hybrid, foyer_memory, moka};

#[cfg(feature = "bench-cache-crates")]
mod crates {
    use std::path::Path;

    use anyhow::{Context, Result};
    use bytes::Bytes;
    use foyer::{
        BlockEngineConfig, DeviceBuilder, FsDeviceBuilder, HybridCache, HybridCacheBuilder,
        HybridCachePolicy,
    };

    use super::{BenchCache, Found, MemoryTier};

    /// `moka::sync::Cache`, weighed in bytes (its default policy: TinyLFU admission, LRU
    /// eviction).
    pub struct Moka(moka::sync::Cache<String, Bytes>);

    pub fn moka(mem_bytes: u64) -> Moka {
        Moka(
            moka::sync::Cache::builder()
                .weigher(|_key: &String, block: &Bytes| {
                    u32::try_from(block.len()).unwrap_or(u32::MAX)
                })
                .max_capacity(mem_bytes)
                .build(),
        )
    }

    impl MemoryTier for Moka {
        fn get(&self, key: &str) -> Option<Bytes> {
            self.0.get(key)
        }

        fn put(&self, key: &str, block: Bytes) {
            self.0.insert(key.to_string(), block)
        }
    }

    /// `foyer::Cache` alone, weighed in bytes (its defaults: LRU, 8 shards).
    pub struct FoyerMemory(foyer::Cache<String, Bytes>);

    pub fn foyer_memory(mem_bytes: u64) -> FoyerMemory {
        FoyerMemory(
            foyer::CacheBuilder::new(usize::try_from(mem_bytes).unwrap_or(usize::MAX))
                .with_weighter(|_key: &String, block: &Bytes| block.len())
                .build(),
        )
    }

    impl MemoryTier for FoyerMemory {
        fn get(&self, key: &str) -> Option<Bytes> {
            self.0.get(key).map(|e| e.value().clone())
        }

        fn put(&self, key: &str, block: Bytes) {
            self.0.insert(key.to_string(), block);
        }
    }

    /// `foyer::HybridCache`: its memory cache in front of its block engine on a directory,
    /// each block written to disk when it is inserted (as strait's cache does), read back
    /// through its own runtime. A block found on disk is verified against its CRC as the
    /// read path verifies every block from the disk cache.
    pub struct FoyerHybrid {
        cache: HybridCache<String, Bytes>,
        rt: tokio::runtime::Runtime,
    }

    pub fn foyer_hybrid(
        mem_bytes: u64,
        dir: &Path,
        disk_bytes: u64,
        region_bytes: u64,
    ) -> Result<FoyerHybrid> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("bench-foyer")
            .enable_all()
            .build()
            .context("start foyer's runtime")?;
        let device = FsDeviceBuilder::new(dir)
            .with_capacity(usize::try_from(disk_bytes).unwrap_or(usize::MAX))
            .build()
            .context("create foyer's disk device")?;
        let cache = rt
            .block_on(
                HybridCacheBuilder::new()
                    .with_policy(HybridCachePolicy::WriteOnInsertion)
                    .memory(usize::try_from(mem_bytes).unwrap_or(usize::MAX))
                    .with_weighter(|_key: &String, block: &Bytes| block.len())
                    .storage()
                    .with_engine_config(
                        BlockEngineConfig::new(device)
                            .with_block_size(usize::try_from(region_bytes).unwrap_or(usize::MAX)),
                    )
                    .build(),
            )
            .context("open foyer's hybrid cache")?;
        Ok(FoyerHybrid { cache, rt })
    }

    impl BenchCache for FoyerHybrid {
        fn get(&self, key: &str, len: u32, crc: u32) -> Option<(Bytes, Found)> {
            if let Some(e) = self.cache.memory().get(key) {
                return Some((e.value().clone(), Found::Memory));
            }
            let e = self.rt.block_on(self.cache.get(key)).ok()??;
            let b = e.value().clone();
            strait_fs_core::vfs::cache::verify(key, &b, len, crc).ok()?;
            Some((b, Found::Disk))
        }

        fn put(&self, key: &str, block: Bytes) {
            self.cache.insert(key.to_string(), block);
        }

        fn settle(&self) -> Result<()> {
            self.rt.block_on(self.cache.storage().wait());
            Ok(())
        }

        fn close(&self) -> Result<()> {
            self.rt
                .block_on(self.cache.close())
                .context("close foyer's hybrid cache")
        }
    }
}
