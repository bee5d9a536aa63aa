//! A mirror's data blocks (DESIGN.md §4): the persistent copy queue, the copy workers, the
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
//!
//! # To ensure correctness
//! - A block is copied only after its CRC32 matches the slice's record of it, and a block
//!   in the local store that fails its check is deleted and fetched again: no reader is ever
//!   given a corrupt block (the mount checks again).
//! - A copy already in the local store (read through, written here, copied before a
//!   restart) is not copied again: blocks are immutable, so its presence is enough.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strait_fs_core::changelog::{decode, Change, ChangeRecord, DeadSlice, Unlinked};
use strait_fs_core::kv::{self, decode_counter, DynKv, KvTxn};
use strait_fs_core::layout::{block_count, block_key, block_len};
use strait_fs_core::meta::{keys, Format, Ino, SliceRef, ROOT_INO};
use strait_fs_core::object::{Bytes, DynStore, ObjectError};
use strait_fs_core::vfs::cache::verify;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::config::{MirrorConfig, SyncPolicy};

const COPY: u8 = b'J';
const DELETE: u8 = b'G';
const NAME: u8 = b'H';
const STATS: u8 = b'P';
/// `L id index` (no value): block `index` of slice `id` is in this region's store.
const SYNCED: u8 = b'L';
const PENDING_BLOCKS: &str = "pending_blocks";
const PENDING_BYTES: &str = "pending_bytes";
const INDEXED: &str = "indexed";

/// Queue entries read per scan of the queue.
const SCAN_PAGE: usize = 256;
/// Pairs written per transaction while indexing a snapshot.
const INDEX_BATCH: usize = 1000;
/// Attempts of one object store call that fails transiently.
const STORE_ATTEMPTS_MAX: u32 = 5;
/// A queued block whose copy failed is tried again after this long.
const RETRY_PAUSE: Duration = Duration::from_secs(10);
/// Fetches for waiting readers at once.
const PRIORITY_SLOTS: usize = 64;
/// Deepest directory nesting walked to find a file's path.
const PATH_DEPTH_MAX: usize = 4096;
/// Seconds of history for the copy and fallback rates.
const RATE_WINDOW_S: usize = 10;

fn group(tag: u8, owner: u64) -> Vec<u8> {
    keys::group(tag, owner)
}

fn copy_key(version: u64, id: u64, index: u32) -> Vec<u8> {
    let mut k = group(COPY, version);
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(&index.to_be_bytes());
    k
}

fn delete_key(version: u64, id: u64) -> Vec<u8> {
    let mut k = group(DELETE, version);
    k.extend_from_slice(&id.to_be_bytes());
    k
}

fn synced_key(id: u64, index: u32) -> Vec<u8> {
    let mut k = group(SYNCED, id);
    k.extend_from_slice(&index.to_be_bytes());
    k
}

/// Which of a slice's `blocks` blocks are not among `synced` (their indexes): a bitmap, empty
/// when none.
fn unsynced_bitmap(blocks: usize, synced: &HashSet<u32>) -> Vec<u8> {
    let mut map = vec![0u8; blocks.div_ceil(8)];
    let mut any = false;
    for i in 0..blocks {
        if !synced.contains(&(i as u32)) {
            map[i / 8] |= 1 << (i % 8);
            any = true;
        }
    }
    if any {
        map
    } else {
        vec![]
    }
}

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

/// Record that block `index` of slice `id` is in this region's store (`synced`) or not.
async fn mark(kv: &DynKv, id: u64, index: u32, synced: bool) -> Result<(), String> {
    let r = kv_call(kv, move |kv| {
        kv::txn(kv, |t| {
            let k = synced_key(id, index);
            if synced {
                t.put(&k, &[]);
            } else {
                t.delete(&k);
            }
            Ok(())
        })
    })
    .await;
    match r {
        Some(Ok(_)) => Ok(()),
        Some(Err(e)) => Err(format!("mark block {index} of slice {id}: {e}")),
        None => Err(format!(
            "mark block {index} of slice {id}: the call panicked"
        )),
    }
}

fn name_key(ino: Ino) -> Vec<u8> {
    group(NAME, ino)
}

fn stat_key(name: &str) -> Vec<u8> {
    let mut k = group(STATS, 0);
    k.extend_from_slice(name.as_bytes());
    k
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)
        .and_then(|x| x.try_into().ok())
        .map(u32::from_be_bytes)
}

fn corrupt(what: String) -> strait_fs_core::Error {
    strait_fs_core::Error::corrupt(what)
}

/// Which policy each path gets.
#[derive(Clone, Debug)]
pub struct Rules {
    default: SyncPolicy,
    /// (prefix, policy), longest prefix first.
    rules: Vec<(Vec<u8>, SyncPolicy)>,
}

impl Rules {
    pub fn new(cfg: &MirrorConfig) -> Self {
        let mut rules: Vec<(Vec<u8>, SyncPolicy)> = cfg
            .sync_rules
            .iter()
            .map(|r| (r.path().as_bytes().to_vec(), r.policy))
            .collect();
        rules.sort_by_key(|r| std::cmp::Reverse(r.0.len()));
        Rules {
            default: cfg.sync,
            rules,
        }
    }

    pub fn policy_of(&self, path: &[u8]) -> SyncPolicy {
        self.rules
            .iter()
            .find(|(p, _)| path.starts_with(p))
            .map(|r| r.1)
            .unwrap_or(self.default)
    }

    /// Whether every path gets the same policy (no path needs resolving).
    fn uniform(&self) -> Option<SyncPolicy> {
        if self.rules.iter().all(|r| r.1 == self.default) {
            Some(self.default)
        } else {
            None
        }
    }

    pub fn describe(&self) -> String {
        let mut s = self.default.to_string();
        for (p, pol) in &self.rules {
            s.push_str(&format!(", {}*={pol}", String::from_utf8_lossy(p)));
        }
        s
    }
}

/// The path of `ino` as far as the name index knows it (None: not known, or too deep).
fn path_of(t: &mut dyn KvTxn, ino: Ino) -> strait_fs_core::Result<Option<Vec<u8>>> {
    let mut parts: Vec<Vec<u8>> = vec![];
    let mut cur = ino;
    for _ in 0..PATH_DEPTH_MAX {
        if cur == ROOT_INO {
            let mut p = vec![];
            for part in parts.iter().rev() {
                p.push(b'/');
                p.extend_from_slice(part);
            }
            if p.is_empty() {
                p.push(b'/');
            }
            return Ok(Some(p));
        }
        let Some(v) = t.get(&name_key(cur))? else {
            return Ok(None);
        };
        let parent = keys::u64_at(&v, 0).ok_or_else(|| corrupt("name index entry".into()))?;
        parts.push(v[8..].to_vec());
        cur = parent;
    }
    Ok(None)
}

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
    pub uploaded_blocks: u64,
    pub errors: u64,
    pub last_error: String,
    pub policy: String,
    pub store: String,
}

/// A token bucket over bytes (the background copy's bandwidth limit).
struct Limiter {
    rate: f64,
    state: tokio::sync::Mutex<(f64, Instant)>,
}

impl Limiter {
    async fn take(&self, n: u64) {
        if self.rate <= 0.0 {
            return;
        }
        let wait = {
            let mut s = self.state.lock().await;
            let now = Instant::now();
            // at most a tenth of a second's worth saved up
            let burst = self.rate / 10.0;
            s.0 = (s.0 + now.duration_since(s.1).as_secs_f64() * self.rate).min(burst);
            s.1 = now;
            s.0 -= n as f64;
            if s.0 < 0.0 {
                Duration::from_secs_f64(-s.0 / self.rate)
            } else {
                Duration::ZERO
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

type Cell = tokio::sync::OnceCell<Result<Bytes, Status>>;

/// The region's blocks.
pub struct Blocks {
    rules: Rules,
    kv: DynKv,
    /// This region's store (None: the mirror has none; its mounts read the primary's).
    local: Option<DynStore>,
    primary: tokio::sync::OnceCell<DynStore>,
    primary_url: String,
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
}

/// An object store call with bounded retries of transient failures.
async fn retry<T, F, Fut>(what: &str, f: F) -> Result<T, ObjectError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ObjectError>>,
{
    strait_fs_core::object::retry(what, STORE_ATTEMPTS_MAX, f).await
}

/// The parts of a block key: (slice id, index, size of the block).
fn parse_block_key(key: &str) -> Option<(u64, u32, u32)> {
    let name = key.strip_prefix("chunks/")?.rsplit('/').next()?;
    let mut it = name.split('_');
    let id = it.next()?.parse().ok()?;
    let index = it.next()?.parse().ok()?;
    let len = it.next()?.parse().ok()?;
    if it.next().is_some() || block_key(id, index, len) != key {
        return None;
    }
    Some((id, index, len))
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
        Ok(Arc::new(Blocks {
            rules: Rules::new(cfg),
            kv,
            local,
            primary: tokio::sync::OnceCell::new(),
            primary_url: cfg.primary_data_url.clone(),
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
        }))
    }

    pub fn has_local(&self) -> bool {
        self.local.is_some()
    }

    /// For each of `slices`, the blocks this region's store does not hold yet: a bitmap per
    /// slice, empty when it holds them all (`ReadChunkReply.unsynced`). On a metadata error,
    /// no bitmaps: the mounts then ask their store first.
    pub fn unsynced(&self, slices: &[SliceRef]) -> Vec<Vec<u8>> {
        let r = kv::read(self.kv.as_ref(), |t| {
            let mut out = Vec::with_capacity(slices.len());
            for s in slices {
                if s.id == 0 || s.crcs.is_empty() {
                    out.push(vec![]);
                    continue;
                }
                let synced: HashSet<u32> = t
                    .scan(&group(SYNCED, s.id), None, s.crcs.len())?
                    .iter()
                    .filter_map(|(k, _)| u32_at(k, 9))
                    .collect();
                out.push(unsynced_bitmap(s.crcs.len(), &synced));
            }
            Ok(out)
        });
        r.unwrap_or_else(|e| {
            self.error(format!("read which blocks are in this region's store: {e}"));
            vec![]
        })
    }

    async fn is_marked(&self, id: u64, index: u32) -> bool {
        kv_call(&self.kv, move |kv| {
            kv::read(kv, |t| Ok(t.get(&synced_key(id, index))?.is_some()))
        })
        .await
        .and_then(|r| r.ok())
        .unwrap_or(false)
    }

    async fn mark(&self, id: u64, index: u32, synced: bool) {
        if let Err(e) = mark(&self.kv, id, index, synced).await {
            self.error(e);
        }
    }

    /// The primary's store: `primary_data_url`, or the one in the file system's settings.
    async fn primary(&self) -> Result<&DynStore, String> {
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
                strait_fs_core::object::open(&url)
                    .await
                    .map_err(|e| format!("open the primary's object store {url}: {e}"))
            })
            .await
    }

    fn error(&self, msg: String) {
        self.counters.errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("{msg}");
        *self.last_error.lock() = msg;
    }

    fn block_size_in(&self, t: &mut dyn KvTxn) -> strait_fs_core::Result<u32> {
        let bs = self.block_size.load(Ordering::Relaxed);
        if bs != 0 {
            return Ok(bs);
        }
        let Some(v) = t.get(&keys::setting(keys::FORMAT))? else {
            return Err(corrupt("the mirror has no settings yet".into()));
        };
        let f: Format = decode(&v)?;
        self.block_size.store(f.block_size, Ordering::Relaxed);
        Ok(f.block_size)
    }

    fn eager(&self, t: &mut dyn KvTxn, ino: Ino) -> strait_fs_core::Result<bool> {
        if let Some(p) = self.rules.uniform() {
            return Ok(p == SyncPolicy::Eager);
        }
        Ok(match path_of(t, ino)? {
            Some(path) => self.rules.policy_of(&path) == SyncPolicy::Eager,
            None => self.rules.default == SyncPolicy::Eager,
        })
    }

    fn enqueue(
        &self,
        t: &mut dyn KvTxn,
        version: u64,
        s: &SliceRef,
        bs: u32,
    ) -> strait_fs_core::Result<()> {
        if s.id == 0 {
            return Ok(());
        }
        for index in 0..block_count(s.size, bs) {
            let Some(crc) = s.crcs.get(index as usize) else {
                continue; // a slice without its CRCs: the apply itself rejects nothing here
            };
            let len = block_len(s.size, bs, index);
            let k = copy_key(version, s.id, index);
            if t.get(&k)?.is_none() {
                let mut v = len.to_be_bytes().to_vec();
                v.extend_from_slice(&crc.to_be_bytes());
                t.put(&k, &v);
                t.add(&stat_key(PENDING_BLOCKS), 1);
                t.add(&stat_key(PENDING_BYTES), len as i64);
            }
        }
        Ok(())
    }

    /// Queue the real slices of `slices` when `ino` is under an eager policy.
    fn enqueue_eager<'a>(
        &self,
        t: &mut dyn KvTxn,
        version: u64,
        ino: Ino,
        slices: impl IntoIterator<Item = &'a SliceRef>,
    ) -> strait_fs_core::Result<()> {
        let real: Vec<&SliceRef> = slices.into_iter().filter(|s| s.id != 0).collect();
        if real.is_empty() || !self.eager(t, ino)? {
            return Ok(());
        }
        let bs = self.block_size_in(t)?;
        for s in real {
            self.enqueue(t, version, s, bs)?;
        }
        Ok(())
    }

    /// Called for each record in the transaction that applies it, before it is applied.
    pub fn hook(
        &self,
        t: &mut dyn KvTxn,
        version: u64,
        rec: &ChangeRecord,
    ) -> strait_fs_core::Result<()> {
        if self.local.is_none() {
            return Ok(());
        }
        let names = self.rules.uniform().is_none();
        let name_entry = |parent: Ino, name: &[u8]| {
            let mut v = parent.to_be_bytes().to_vec();
            v.extend_from_slice(name);
            v
        };
        match &rec.change {
            Change::Create {
                parent, name, ino, ..
            } if names => t.put(&name_key(*ino), &name_entry(*parent, &name.0)),
            Change::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
                ino,
                replaced,
                ..
            } if names => {
                t.put(&name_key(*ino), &name_entry(*dst_parent, &dst_name.0));
                if let Some(r) = replaced.as_ref().filter(|r| r.exchange) {
                    t.put(&name_key(r.ino), &name_entry(*src_parent, &src_name.0));
                }
            }
            Change::Unlink {
                ino,
                unlinked: Unlinked::Delete,
                ..
            }
            | Change::Rmdir { ino, .. }
            | Change::DeleteInode { ino }
                if names =>
            {
                t.delete(&name_key(*ino))
            }
            Change::WriteSlice { ino, slice, .. } => {
                self.enqueue_eager(t, version, *ino, [slice])?
            }
            Change::Compact { ino, slices, .. } => self.enqueue_eager(t, version, *ino, slices)?,
            Change::Truncate {
                ino,
                hole: Some((_, s)),
                ..
            } => self.enqueue_eager(t, version, *ino, [s])?,
            Change::PurgeSlices { ids } => {
                for id in ids {
                    if let Some(v) = t.get(&keys::deadslice(*id))? {
                        let d: DeadSlice = decode(&v)?;
                        t.put(&delete_key(version, *id), &d.size.to_be_bytes());
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether the blocks of the snapshot the engine holds are queued (see [`Self::index_all`]).
    pub fn indexed(&self) -> strait_fs_core::Result<bool> {
        if self.local.is_none() {
            return Ok(true);
        }
        kv::read(self.kv.as_ref(), |t| {
            Ok(t.get(&stat_key(INDEXED))?.is_some())
        })
    }

    /// After a snapshot load: index every name and queue every block the metadata
    /// references (under an eager policy), in batches. Idempotent, so a crash in the middle
    /// is finished by the next start.
    pub fn index_all(&self, version: u64) -> strait_fs_core::Result<(u64, u64)> {
        if self.local.is_none() {
            return Ok((0, 0));
        }
        let kvr = self.kv.as_ref();
        if self.rules.uniform().is_none() {
            let mut after: Option<Vec<u8>> = None;
            loop {
                let page = kv::read(kvr, |t| {
                    t.scan(&[keys::DENTRY], after.as_deref(), INDEX_BATCH)
                })?;
                let n = page.len();
                kv::txn(kvr, |t| {
                    for (k, v) in &page {
                        let parent =
                            keys::u64_at(k, 1).ok_or_else(|| corrupt("dentry key".into()))?;
                        let child =
                            keys::u64_at(v, 0).ok_or_else(|| corrupt("dentry value".into()))?;
                        let mut e = parent.to_be_bytes().to_vec();
                        e.extend_from_slice(&k[9..]);
                        t.put(&name_key(child), &e);
                    }
                    Ok(())
                })?;
                after = page.last().map(|p| p.0.clone());
                if n < INDEX_BATCH {
                    break;
                }
            }
        }
        let mut after: Option<Vec<u8>> = None;
        let (mut slices, mut blocks) = (0u64, 0u64);
        loop {
            let page = kv::read(kvr, |t| {
                t.scan(&[keys::CHUNK], after.as_deref(), INDEX_BATCH)
            })?;
            let n = page.len();
            kv::txn(kvr, |t| {
                let bs = self.block_size_in(t)?;
                for (k, v) in &page {
                    let ino = keys::u64_at(k, 1).ok_or_else(|| corrupt("chunk key".into()))?;
                    if !self.eager(t, ino)? {
                        continue;
                    }
                    let list: Vec<SliceRef> = decode(v)?;
                    for s in list.iter().filter(|s| s.id != 0) {
                        slices += 1;
                        blocks += block_count(s.size, bs) as u64;
                        self.enqueue(t, version, s, bs)?;
                    }
                }
                Ok(())
            })?;
            after = page.last().map(|p| p.0.clone());
            if n < INDEX_BATCH {
                break;
            }
        }
        kv::txn(kvr, |t| {
            t.put(&stat_key(INDEXED), &version.to_be_bytes());
            Ok(())
        })?;
        self.wake.notify_one();
        Ok((slices, blocks))
    }

    /// Something was queued: wake the workers.
    pub fn queued(&self) {
        self.wake.notify_waiters();
        self.wake.notify_one();
    }

    fn read_pending(&self) -> strait_fs_core::Result<(u64, u64)> {
        kv::read(self.kv.as_ref(), |t| {
            let b = decode_counter(t.get(&stat_key(PENDING_BLOCKS))?)?;
            let n = decode_counter(t.get(&stat_key(PENDING_BYTES))?)?;
            Ok((b.max(0) as u64, n.max(0) as u64))
        })
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

    /// Take a queue entry off, with its share of the counters.
    async fn done(&self, k: Vec<u8>, len: u32) {
        let kv = self.kv.clone();
        let r = tokio::task::spawn_blocking(move || {
            kv::txn(kv.as_ref(), |t| {
                if t.get(&k)?.is_some() {
                    t.delete(&k);
                    t.add(&stat_key(PENDING_BLOCKS), -1);
                    t.add(&stat_key(PENDING_BYTES), -(len as i64));
                }
                Ok(())
            })
        })
        .await;
        match r {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => self.error(format!("take a copied block off the queue: {e}")),
            Err(e) => self.error(format!("take a copied block off the queue: {e}")),
        }
    }

    /// Fetch a block from the primary's store and check it (twice, in case it was damaged
    /// on the way).
    async fn fetch_primary(&self, key: &str, len: u32, crc: u32) -> Result<Bytes, ObjectError> {
        let primary = self.primary().await.map_err(ObjectError::Fatal)?;
        let mut last = String::new();
        for _ in 0..2 {
            let data = retry(
                &format!("read block {key} from the primary's store"),
                || primary.get(key),
            )
            .await?;
            match verify(key, &data, len, crc) {
                Ok(()) => return Ok(data),
                Err(e) => last = e.to_string(),
            }
        }
        Err(ObjectError::Fatal(format!(
            "{last} (the primary's copy of the block)"
        )))
    }

    /// Copy one queued block.
    async fn copy_one(&self, k: Vec<u8>, v: Vec<u8>) -> Result<(), String> {
        let (Some(id), Some(index), Some(len), Some(crc)) = (
            keys::u64_at(&k, 9),
            u32_at(&k, 17),
            u32_at(&v, 0),
            u32_at(&v, 4),
        ) else {
            self.error(format!(
                "a malformed entry in the copy queue ({} bytes): dropped",
                k.len()
            ));
            self.done(k, 0).await;
            return Ok(());
        };
        let Some(local) = &self.local else {
            return Ok(());
        };
        let key = block_key(id, index, len);
        if let Ok(Some(n)) = local.head(&key).await {
            if n == len as u64 {
                self.mark(id, index, true).await;
                self.done(k, len).await;
                return Ok(());
            }
        }
        self.limiter.take(len as u64).await;
        let data = match self.fetch_primary(&key, len, crc).await {
            Ok(d) => d,
            Err(ObjectError::NotFound(_)) => {
                // purged at the primary: a later record frees the slice here too
                let kv = self.kv.clone();
                let dead = tokio::task::spawn_blocking(move || {
                    kv::read(kv.as_ref(), |t| Ok(t.get(&keys::deadslice(id))?.is_some()))
                })
                .await
                .ok()
                .and_then(|r| r.ok())
                .unwrap_or(false);
                if !dead {
                    self.error(format!(
                        "block {key} is missing from the primary's store: not copied"
                    ));
                }
                self.done(k, len).await;
                return Ok(());
            }
            Err(e) => return Err(format!("copy block {key}: {e}")),
        };
        retry(&format!("write block {key} to this region's store"), || {
            local.put(&key, data.clone())
        })
        .await
        .map_err(|e| format!("write block {key} to this region's store: {e}"))?;
        self.counters.copied_blocks.fetch_add(1, Ordering::Relaxed);
        self.counters
            .copied_bytes
            .fetch_add(len as u64, Ordering::Relaxed);
        self.mark(id, index, true).await;
        self.done(k, len).await;
        Ok(())
    }

    /// The copy workers: take queued blocks in version order, `sync_concurrency` at a time.
    pub async fn run_copier(self: Arc<Self>, stop: CancellationToken) {
        if self.local.is_none() {
            return;
        }
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let busy: Arc<Mutex<HashSet<Vec<u8>>>> = Arc::default();
        let mut failed: HashMap<Vec<u8>, Instant> = HashMap::new();
        let failures: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let mut after: Option<Vec<u8>> = None;
        loop {
            if stop.is_cancelled() {
                return;
            }
            for k in failures.lock().drain(..) {
                failed.insert(k, Instant::now() + RETRY_PAUSE);
            }
            let now = Instant::now();
            failed.retain(|_, until| *until > now);
            let kv = self.kv.clone();
            let from = after.clone();
            let page = tokio::task::spawn_blocking(move || {
                kv::read(kv.as_ref(), |t| t.scan(&[COPY], from.as_deref(), SCAN_PAGE))
            })
            .await;
            let page = match page {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => {
                    self.error(format!("read the copy queue: {e}"));
                    Vec::new()
                }
                Err(e) => {
                    self.error(format!("read the copy queue: {e}"));
                    Vec::new()
                }
            };
            if page.is_empty() {
                after = None;
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
            let full = page.len() == SCAN_PAGE;
            after = page.last().map(|p| p.0.clone());
            let mut started = 0;
            for (k, v) in page {
                if failed.contains_key(&k) || busy.lock().contains(&k) {
                    continue;
                }
                let permit = tokio::select! {
                    _ = stop.cancelled() => return,
                    p = slots.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                };
                busy.lock().insert(k.clone());
                started += 1;
                let me = self.clone();
                let busy = busy.clone();
                let failures = failures.clone();
                tokio::spawn(async move {
                    let r = me.copy_one(k.clone(), v).await;
                    if let Err(msg) = r {
                        me.error(format!("{msg}; tried again in {RETRY_PAUSE:?}"));
                        failures.lock().push(k.clone());
                    }
                    busy.lock().remove(&k);
                    drop(permit);
                });
            }
            if full && started == 0 {
                // a page of blocks all busy or waiting to be tried again: do not spin
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if !full {
                // the end of the queue: start over from its head once the workers free up
                after = None;
                if started == 0 {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = self.wake.notified() => {}
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    }
                }
            }
        }
    }

    /// Delete the local copies of purged slices, as their records are applied.
    pub async fn run_deleter(self: Arc<Self>, stop: CancellationToken) {
        let Some(local) = self.local.clone() else {
            return;
        };
        loop {
            let kv = self.kv.clone();
            let page = tokio::task::spawn_blocking(move || {
                kv::read(kv.as_ref(), |t| {
                    let bs = decode::<Format>(
                        &t.get(&keys::setting(keys::FORMAT))?
                            .ok_or_else(|| corrupt("no settings".into()))?,
                    )?
                    .block_size;
                    Ok((bs, t.scan(&[DELETE], None, SCAN_PAGE)?))
                })
            })
            .await;
            let (bs, page) = match page {
                Ok(Ok(p)) => p,
                _ => (0, vec![]),
            };
            if page.is_empty() {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
            for (k, v) in page {
                if stop.is_cancelled() {
                    return;
                }
                let (Some(id), Some(size)) = (keys::u64_at(&k, 9), u32_at(&v, 0)) else {
                    self.error("a malformed entry in the deletion queue: dropped".into());
                    continue;
                };
                let mut ok = true;
                for index in 0..block_count(size, bs) {
                    let key = block_key(id, index, block_len(size, bs, index));
                    match retry(&format!("delete block {key}"), || local.delete(&key)).await {
                        Ok(()) => {
                            self.counters.deleted_blocks.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            self.error(format!("delete this region's copy of block {key}: {e}"));
                            ok = false;
                            break;
                        }
                    }
                }
                if ok {
                    let kv = self.kv.clone();
                    let n = block_count(size, bs);
                    let _ = tokio::task::spawn_blocking(move || {
                        kv::txn(kv.as_ref(), |t| {
                            t.delete(&k);
                            for index in 0..n {
                                t.delete(&synced_key(id, index));
                            }
                            Ok(())
                        })
                    })
                    .await;
                } else {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(RETRY_PAUSE) => {}
                    }
                }
            }
        }
    }

    /// A block a mount is waiting for (FetchBlock): from this region's store when it is
    /// there and sound, else from the primary's, ahead of the queue, kept here on the way.
    pub async fn fetch(
        &self,
        key: &str,
        len: u32,
        crc: u32,
        reason: &str,
    ) -> Result<Bytes, Status> {
        let (id, index) = match parse_block_key(key) {
            Some((id, index, l)) if l == len => (id, index),
            _ => {
                return Err(Status::invalid_argument(format!(
                    "{key:?} (of {len} bytes) is not a block key"
                )))
            }
        };
        let check_local = match reason {
            // the mount found it missing a moment ago: ask the primary's store at once
            "missing" => {
                self.mark(id, index, false).await;
                false
            }
            // the mount's view of the marks may be older than the marks
            "unsynced" => self.is_marked(id, index).await,
            _ => true,
        };
        if let (Some(local), true) = (&self.local, check_local) {
            match local.get(key).await {
                Ok(d) => match verify(key, &d, len, crc) {
                    Ok(()) => return Ok(d),
                    Err(e) => {
                        self.counters.corrupt_local.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(
                            "{e}: this region's copy is corrupt; discarded, fetched again from the primary's store"
                        );
                        self.mark(id, index, false).await;
                        if let Err(e) = local.delete(key).await {
                            tracing::warn!("delete the corrupt block {key}: {e}");
                        }
                    }
                },
                Err(ObjectError::NotFound(_)) => {
                    if reason == "corrupt" {
                        tracing::warn!(
                            "block {key}: a mount found it corrupt; it is gone here now"
                        );
                    }
                    self.mark(id, index, false).await;
                }
                Err(e) => tracing::warn!("read block {key} from this region's store: {e}"),
            }
        }
        let cell = {
            let mut m = self.inflight.lock();
            m.entry(key.to_string()).or_default().clone()
        };
        let got = cell
            .get_or_init(|| async {
                let permit = self.priority.acquire().await;
                let r = self.fetch_primary(key, len, crc).await;
                drop(permit);
                match r {
                    Ok(d) => {
                        self.counters.fallback_reads.fetch_add(1, Ordering::Relaxed);
                        self.counters
                            .fallback_bytes
                            .fetch_add(len as u64, Ordering::Relaxed);
                        // kept in the region's store behind the reader's back, holding a
                        // slot so that these writes stay bounded (without one, the block is
                        // left to the queue or the next read)
                        if let (Some(local), Ok(slot)) = (
                            self.local.clone(),
                            self.priority_puts.clone().try_acquire_owned(),
                        ) {
                            let (k, data, kv) = (key.to_string(), d.clone(), self.kv.clone());
                            tokio::spawn(async move {
                                match retry(&format!("write block {k}"), || {
                                    local.put(&k, data.clone())
                                })
                                .await
                                {
                                    Ok(()) => {
                                        if let Err(e) = mark(&kv, id, index, true).await {
                                            tracing::warn!("{e}");
                                        }
                                    }
                                    Err(e) => {
                                        tracing::warn!("keep block {k} in this region's store: {e}")
                                    }
                                }
                                drop(slot);
                            });
                        }
                        Ok(d)
                    }
                    Err(ObjectError::NotFound(e)) => {
                        // not asked above: this region's copy is the last resort
                        if let (Some(local), false) = (&self.local, check_local) {
                            if let Ok(d) = local.get(key).await {
                                if verify(key, &d, len, crc).is_ok() {
                                    return Ok(d);
                                }
                            }
                        }
                        Err(Status::not_found(format!(
                            "block {key} is in neither this region's store nor the primary's ({e})"
                        )))
                    }
                    Err(e) => Err(Status::unavailable(format!(
                        "fetch block {key} from the primary's store: {e}"
                    ))),
                }
            })
            .await
            .clone();
        self.inflight.lock().remove(key);
        if let Err(st) = &got {
            self.error(st.message().to_string());
        }
        got
    }

    /// Before a write made here is committed at the primary: every block of `slices` must be
    /// in the primary's store (the mount wrote them to this region's).
    pub async fn upload(&self, slices: &[SliceRef], bs: u32) -> Result<(), String> {
        // without a store of its own, the region's mounts wrote to the primary's directly
        let Some(local) = &self.local else {
            return Ok(());
        };
        let primary = self.primary().await?;
        for s in slices.iter().filter(|s| s.id != 0) {
            for index in 0..block_count(s.size, bs) {
                let len = block_len(s.size, bs, index);
                let key = block_key(s.id, index, len);
                // blocks are immutable and new: a put of one the primary has (a retried
                // write) is harmless, so no round trip asks first
                let data = retry(&format!("read block {key}"), || local.get(&key))
                    .await
                    .map_err(|e| format!("read block {key} written in this region: {e}"))?;
                if let Some(crc) = s.crcs.get(index as usize) {
                    verify(&key, &data, len, *crc).map_err(|e| e.to_string())?;
                }
                retry(&format!("upload block {key}"), || {
                    primary.put(&key, data.clone())
                })
                .await
                .map_err(|e| format!("upload block {key} to the primary's store: {e}"))?;
                self.counters
                    .uploaded_blocks
                    .fetch_add(1, Ordering::Relaxed);
                // written here by the mount: in this region's store as well
                self.mark(s.id, index, true).await;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SyncRule;

    #[test]
    fn the_longest_prefix_decides() {
        let cfg = MirrorConfig {
            sync: SyncPolicy::Lazy,
            sync_rules: vec![
                SyncRule {
                    prefix: "/datasets/*".into(),
                    policy: SyncPolicy::Eager,
                },
                SyncRule {
                    prefix: "/datasets/scratch/".into(),
                    policy: SyncPolicy::Lazy,
                },
            ],
            ..Default::default()
        };
        let r = Rules::new(&cfg);
        assert_eq!(r.policy_of(b"/datasets/a/b"), SyncPolicy::Eager);
        assert_eq!(r.policy_of(b"/datasets/scratch/x"), SyncPolicy::Lazy);
        assert_eq!(r.policy_of(b"/home/x"), SyncPolicy::Lazy);
        assert!(r.uniform().is_none());
    }

    #[test]
    fn block_keys_parse_back() {
        let k = block_key(1_234_567, 3, 4 << 20);
        assert_eq!(parse_block_key(&k), Some((1_234_567, 3, 4 << 20)));
        for bad in [
            "",
            "chunks/",
            "chunks/1/1/1_2",
            "chunks/0/0/1_2_3_4",
            "x/0/0/1_2_3",
            "chunks/9/9/1_2_3",
        ] {
            assert_eq!(parse_block_key(bad), None, "{bad}");
        }
    }
}
