//! A mirror's data blocks (docs/architecture.md, "The data path"): the persistent copy queue, the copy workers, the
//! read fallback that jumps the queue, the deletion of blocks whose slices the primary purged,
//! and the upload of blocks written at this region to the primary's store.
//!
//! # The queue
//! Each applied record that brings new blocks (a written slice, a compaction's new slices,
//! a truncation's hole) queues them, when their file's path is under an `eager` policy, in
//! the transaction that applies the record ([`Blocks::hook`]). A crash therefore never
//! loses a queued block nor queues one twice. A `PurgeSlices` record queues the deletion of
//! the purged slices' local copies the same way. After a snapshot load every block the
//! snapshot references is queued ([`Blocks::index_all`]).
//!
//! Keys, in the mirror's own engine, beside its metadata and never part of a digest or a
//! snapshot (the walk in `strait_fs_core::snapshot` does not visit these groups):
//! - `J version id index` -> `len crc` (big-endian u32s): a block to copy;
//! - `G version id` -> `size`: the local blocks of a purged slice to delete;
//! - `H ino` -> `parent name`: one name of each inode, for the per-path policies;
//! - `P 0 name`: counters (blocks and bytes queued) and the indexed snapshot's version.
//! - `B id index` (no value): block `index` of slice `id` is in this region's store. (These
//!   marks were `L id index`, under the change log's tag, until they got their own; a start
//!   moves any old ones, see `synced.rs`.)
//!
//! The tags are registered in `strait_fs_core::kv::tags`.
//!
//! # To ensure correctness
//! - A block is copied only after its CRC32 matches the slice's record of it, and a block
//!   in the local store that fails its check is deleted and fetched again: no reader is ever
//!   given a corrupt block (the mount checks again).
//! - A copy already in the local store (read through, written here, copied before a
//!   restart) is not copied again: blocks are immutable, so its presence is enough.
//! - A copied block is made durable (the store's `sync`, one for many concurrent copies)
//!   before it is marked present and leaves the queue: after a power loss the marks and the
//!   queue never count a block the store lost.
//!
//! # Layout
//! Key encoding in `keys.rs`; the sync policy in `policy.rs`; the marks of the blocks this
//! region's store holds in `synced.rs`; the persistent copy queue in `queue.rs`; the copier,
//! the deleter, the read-through fetch and the upload each in a file of its own. This file
//! holds [`Blocks`], its counters and status.

mod copier;
mod deleter;
mod fetch;
mod keys;
mod policy;
mod queue;
mod synced;
mod upload;
mod warmup;

pub use deleter::add_queued_deletions;
pub use policy::Rules;
pub use synced::Missing;
pub use warmup::{WarmBlock, Warmup, WarmupError, WARMUP_BLOCKS_MAX, WARMUP_CONCURRENCY};

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strait_fs_core::kv::{self, DynKv};
use strait_fs_core::object::{DynStore, ObjectError};
use tokio::sync::{Notify, Semaphore};

use crate::config::MirrorConfig;
use copier::Limiter;
use fetch::Cell;

/// Queue entries read per scan of the queue.
const SCAN_PAGE: usize = 256;
/// Attempts of one object store call that fails transiently.
const STORE_ATTEMPTS_MAX: u32 = 5;
/// A queued block whose copy failed is tried again after this long.
const RETRY_PAUSE: Duration = Duration::from_secs(10);
/// Fetches for waiting readers at once.
const PRIORITY_SLOTS: usize = 64;
/// Seconds of history for the copy and fallback rates.
const RATE_WINDOW_S: usize = 10;

/// Run a short call on the metadata engine: in place for one in this process (see
/// [`kv::in_process`]; a read at a mirror makes two such calls per block), on the blocking
/// pool otherwise. `None` if the call panicked there.
async fn kv_call<T: Send + 'static>(
    kv: &DynKv,
    f: impl FnOnce(&dyn kv::KvEngine) -> T + Send + 'static,
) -> Option<T> {
    if kv::in_process(kv.as_ref()) {
        return Some(f(kv.as_ref()));
    }
    let kv = kv.clone();
    tokio::task::spawn_blocking(move || f(kv.as_ref()))
        .await
        .ok()
}

fn corrupt(what: String) -> strait_fs_core::Error {
    strait_fs_core::Error::corrupt(what)
}

/// Where a mirror writes the marker that tells whether its store is also a primary's
/// ([`Blocks::shared_with_a_primary`]); not a block key, so no sweep ever deletes it.
pub const MARKER_PREFIX: &str = "strait-markers/";

/// Counters kept in memory (the queue's size is in the engine).
#[derive(Default)]
pub struct Counters {
    pub copied_blocks: AtomicU64,
    pub copied_bytes: AtomicU64,
    /// Blocks readers waited for, fetched from the primary's store.
    pub fallback_reads: AtomicU64,
    pub fallback_bytes: AtomicU64,
    /// Local blocks that failed their CRC check and were fetched again.
    pub corrupt_local: AtomicU64,
    pub deleted_blocks: AtomicU64,
    /// Queued blocks not copied: their slice was dead here when their turn came.
    pub skipped_dead_blocks: AtomicU64,
    pub skipped_dead_bytes: AtomicU64,
    /// Blocks uploaded to the primary's store for writes made here.
    pub uploaded_blocks: AtomicU64,
    pub errors: AtomicU64,
    pub pending_blocks: AtomicU64,
    pub pending_bytes: AtomicU64,
}

/// What `mirror status` shows about blocks.
#[derive(Clone, Debug, Default)]
pub struct BlockStats {
    pub pending_blocks: u64,
    pub pending_bytes: u64,
    pub copied_blocks: u64,
    pub copied_bytes: u64,
    pub copy_bytes_per_s: f64,
    pub fallback_reads: u64,
    pub fallback_bytes: u64,
    pub fallback_reads_per_s: f64,
    pub corrupt_local: u64,
    pub deleted_blocks: u64,
    pub skipped_dead_blocks: u64,
    pub skipped_dead_bytes: u64,
    pub uploaded_blocks: u64,
    pub errors: u64,
    pub last_error: String,
    pub policy: String,
    pub store: String,
}

/// The region's blocks.
pub struct Blocks {
    rules: Rules,
    kv: DynKv,
    /// This region's store (None: the mirror has none; its mounts read the primary's).
    local: Option<DynStore>,
    /// The store of the primary this mirror first followed, with its URL.
    primary: tokio::sync::OnceCell<(String, DynStore)>,
    primary_url: String,
    /// The stores of the primaries promoted since (newest first): blocks are read from the
    /// newest that holds them, and uploaded to the newest.
    promoted: parking_lot::RwLock<Vec<(String, DynStore)>>,
    block_size: AtomicU32,
    concurrency: usize,
    limiter: Limiter,
    wake: Notify,
    priority: Semaphore,
    /// Write-throughs of fetched blocks in flight.
    priority_puts: Arc<Semaphore>,
    inflight: Mutex<HashMap<String, Arc<Cell>>>,
    pub counters: Counters,
    last_error: Mutex<String>,
    /// (second, copied bytes, fallback reads) once a second, for the rates.
    rates: Mutex<VecDeque<(Instant, u64, u64)>>,
    /// The last warm-up (`strait warmup`), running or done.
    warmup: Mutex<Option<Arc<Mutex<Warmup>>>>,
    /// Syncs of this region's store, shared by the copies that wait for one before their
    /// blocks are marked present.
    sync_group: strait_fs_core::object::SyncGroup,
}

/// An object store call with bounded retries of transient failures.
async fn retry<T, F, Fut>(what: &str, f: F) -> Result<T, ObjectError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ObjectError>>,
{
    strait_fs_core::object::retry(what, STORE_ATTEMPTS_MAX, f).await
}

impl Blocks {
    pub async fn open(cfg: &MirrorConfig, kv: DynKv) -> anyhow::Result<Arc<Self>> {
        use anyhow::Context;
        let local = if cfg.data_url.is_empty() {
            None
        } else {
            Some(
                strait_fs_core::object::open(&cfg.data_url)
                    .await
                    .with_context(|| format!("open this region's object store {}", cfg.data_url))?,
            )
        };
        let moved = {
            let kv = kv.clone();
            tokio::task::spawn_blocking(move || synced::move_old_marks(kv.as_ref()))
                .await
                .context("move the marks of this region's blocks to their own key tag")?
                .context("move the marks of this region's blocks to their own key tag")?
        };
        if moved > 0 {
            tracing::info!(
                "moved {moved} marks of blocks in this region's store from the change log's key tag to their own"
            );
        }
        Ok(Arc::new(Blocks {
            rules: Rules::new(cfg),
            kv,
            local,
            primary: tokio::sync::OnceCell::new(),
            primary_url: cfg.primary_data_url.clone(),
            promoted: parking_lot::RwLock::new(Vec::new()),
            block_size: AtomicU32::new(0),
            concurrency: cfg.sync_concurrency.max(1),
            limiter: Limiter {
                rate: cfg.sync_bandwidth_mb_s * 1e6,
                state: tokio::sync::Mutex::new((0.0, Instant::now())),
            },
            wake: Notify::new(),
            priority: Semaphore::new(PRIORITY_SLOTS),
            priority_puts: Arc::new(Semaphore::new(PRIORITY_SLOTS * 2)),
            inflight: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            last_error: Mutex::new(String::new()),
            rates: Mutex::new(VecDeque::new()),
            warmup: Mutex::new(None),
            sync_group: Default::default(),
        }))
    }

    pub fn has_local(&self) -> bool {
        self.local.is_some()
    }

    /// This region's store, if the mirror has one.
    pub fn local_store(&self) -> Option<DynStore> {
        self.local.clone()
    }

    /// The store of the primary first followed: `primary_data_url`, or the one in the file
    /// system's settings.
    async fn first_primary(&self) -> Result<&(String, DynStore), String> {
        self.primary
            .get_or_try_init(|| async {
                let url = if self.primary_url.is_empty() {
                    let kv = self.kv.clone();
                    tokio::task::spawn_blocking(move || {
                        strait_fs_core::meta::Meta::load_format(kv.as_ref())
                    })
                    .await
                    .map_err(|e| format!("read the settings: {e}"))?
                    .map_err(|e| format!("read the settings: {e}"))?
                    .data_url
                } else {
                    self.primary_url.clone()
                };
                let store = strait_fs_core::object::open(&url)
                    .await
                    .map_err(|e| format!("open the primary's object store {url}: {e}"))?;
                Ok((url, store))
            })
            .await
    }

    /// The current primary's store: where blocks written here are uploaded.
    async fn primary(&self) -> Result<DynStore, String> {
        if let Some((_, s)) = self.promoted.read().first() {
            return Ok(s.clone());
        }
        Ok(self.first_primary().await?.1.clone())
    }

    /// Every primary's store, the current one first: a block the current primary's store
    /// lacks (not copied there yet, or never) is looked for in the ones before it.
    async fn primary_stores(&self) -> Result<Vec<(String, DynStore)>, String> {
        let mut v = self.promoted.read().clone();
        match self.first_primary().await {
            Ok((url, s)) => {
                if !v.iter().any(|(u, _)| u == url) {
                    v.push((url.clone(), s.clone()));
                }
            }
            Err(e) if v.is_empty() => return Err(e),
            Err(e) => tracing::debug!("{e}"),
        }
        Ok(v)
    }

    /// The epoch names a new primary whose store is `url`: blocks are uploaded there from now
    /// on, and looked for there first. False when it was the current one already.
    pub async fn primary_moved(&self, url: &str) -> anyhow::Result<bool> {
        use anyhow::Context;
        if self.promoted.read().first().is_some_and(|(u, _)| u == url) {
            return Ok(false);
        }
        if self.promoted.read().is_empty() && self.primary.get().is_some_and(|(u, _)| u == url) {
            return Ok(false);
        }
        let store = strait_fs_core::object::open(url)
            .await
            .with_context(|| format!("open the new primary's object store {url}"))?;
        let mut l = self.promoted.write();
        l.retain(|(u, _)| u != url);
        l.insert(0, (url.to_string(), store));
        Ok(true)
    }

    /// Whether this region's store is also a primary's (the same bucket or directory, under
    /// another URL perhaps): a marker with a value of its own is written to this region's
    /// store under [`MARKER_PREFIX`] and read back through each primary's store. Some(url)
    /// names the primary's store that showed it; Err when a primary's store could not say.
    pub async fn shared_with_a_primary(&self, mirror_id: &str) -> Result<Option<String>, String> {
        let Some(local) = &self.local else {
            return Ok(None);
        };
        let key = format!("{MARKER_PREFIX}{mirror_id}");
        let value = format!(
            "mirror {mirror_id}, pid {}, at {} ns",
            std::process::id(),
            strait_fs_core::clock::now_ns()
        );
        retry(&format!("write the marker {key}"), || {
            local.put(&key, bytes::Bytes::from(value.clone()))
        })
        .await
        .map_err(|e| format!("write the marker {key} to this region's store: {e}"))?;
        for (url, store) in self.primary_stores().await? {
            match retry(&format!("read the marker {key}"), || store.get(&key)).await {
                Ok(b) if b.as_ref() == value.as_bytes() => return Ok(Some(url)),
                Ok(_) | Err(ObjectError::NotFound(_)) => {}
                Err(e) => {
                    return Err(format!(
                        "look for this region's marker {key} in the primary's store {url}: {e}"
                    ))
                }
            }
        }
        Ok(None)
    }

    /// The URL of the current primary's store, when known.
    pub fn primary_url(&self) -> Option<String> {
        if let Some((u, _)) = self.promoted.read().first() {
            return Some(u.clone());
        }
        self.primary.get().map(|(u, _)| u.clone())
    }

    fn error(&self, msg: String) {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("{msg}");
        *self.last_error.lock() = msg;
    }

    /// Once a second: the queue's size and the rates.
    pub fn tick(&self) {
        if let Ok((b, n)) = self.read_pending() {
            self.counters.pending_blocks.store(b, Ordering::Relaxed);
            self.counters.pending_bytes.store(n, Ordering::Relaxed);
        }
        let mut r = self.rates.lock();
        r.push_back((
            Instant::now(),
            self.counters.copied_bytes.load(Ordering::Relaxed),
            self.counters.fallback_reads.load(Ordering::Relaxed),
        ));
        while r.len() > RATE_WINDOW_S + 1 {
            r.pop_front();
        }
    }

    pub fn stats(&self) -> BlockStats {
        let c = &self.counters;
        let (copy_rate, fallback_rate) = {
            let r = self.rates.lock();
            match (r.front(), r.back()) {
                (Some(a), Some(b)) if b.0 > a.0 => {
                    let s = b.0.duration_since(a.0).as_secs_f64();
                    ((b.1 - a.1) as f64 / s, (b.2 - a.2) as f64 / s)
                }
                _ => (0.0, 0.0),
            }
        };
        // the queue's size as of now (a status taken right after an apply must count what
        // it queued), or the last tick's when the store cannot be read
        let (pending_blocks, pending_bytes) = self.read_pending().unwrap_or((
            c.pending_blocks.load(Ordering::Relaxed),
            c.pending_bytes.load(Ordering::Relaxed),
        ));
        BlockStats {
            pending_blocks,
            pending_bytes,
            copied_blocks: c.copied_blocks.load(Ordering::Relaxed),
            copied_bytes: c.copied_bytes.load(Ordering::Relaxed),
            copy_bytes_per_s: copy_rate,
            fallback_reads: c.fallback_reads.load(Ordering::Relaxed),
            fallback_bytes: c.fallback_bytes.load(Ordering::Relaxed),
            fallback_reads_per_s: fallback_rate,
            corrupt_local: c.corrupt_local.load(Ordering::Relaxed),
            deleted_blocks: c.deleted_blocks.load(Ordering::Relaxed),
            skipped_dead_blocks: c.skipped_dead_blocks.load(Ordering::Relaxed),
            skipped_dead_bytes: c.skipped_dead_bytes.load(Ordering::Relaxed),
            uploaded_blocks: c.uploaded_blocks.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            last_error: self.last_error.lock().clone(),
            policy: self.rules.describe(),
            store: self
                .local
                .as_ref()
                .map(|l| l.describe())
                .unwrap_or_default(),
        }
    }
}
