//! The VFS: file handles, the read path (slice resolution, block cache, readahead), the write
//! path ([`writer::FileWriter`]), compaction of fragmented chunks and deletion of dead
//! slices' blocks. It is synchronous (called from FUSE threads) and drives the asynchronous
//! object store on its own tokio runtime.
//!
//! Do not call the VFS from inside a tokio runtime: it blocks on its own.

pub mod cache;
pub mod gc;
mod writer;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::error::{sys, Error, Result};
use crate::layout::{block_key, block_len, visible_segments, CHUNK_SIZE};
use crate::meta::{
    Attr, Ctx, DirEntry, FileKind, Ino, MetaClient, SetAttr, SliceRef, FILE_SIZE_MAX,
};
use crate::object::{DynStore, ObjectError};
pub use cache::BlockCache;
use writer::FileWriter;

/// Slices in one chunk above which the chunk is compacted.
pub const COMPACT_SLICES_MIN: usize = 24;
/// Attempts for one object store call that fails transiently.
pub const STORE_ATTEMPTS_MAX: u32 = 5;
/// Chunks whose slice lists are kept in memory.
const CHUNK_CACHE_ENTRIES_MAX: usize = 4096;
/// Files whose size and mtime as last reported to the kernel are remembered.
const SEEN_ENTRIES_MAX: usize = 100_000;
/// Distinct corrupt blocks remembered for logging once.
const REPORTED_CORRUPT_MAX: usize = 10_000;

/// A chunk's slice list, shared by the readers of the chunk cache.
type SliceList = Arc<ChunkView>;

/// A chunk's slices and, at a mirror, which of their blocks the region's store does not hold
/// yet (by slice id: bit `i % 8` of byte `i / 8` stands for block `i`).
#[derive(Default)]
struct ChunkView {
    slices: Vec<SliceRef>,
    unsynced: HashMap<u64, Vec<u8>>,
}

impl ChunkView {
    fn unsynced(&self, id: u64, index: u32) -> bool {
        self.unsynced
            .get(&id)
            .and_then(|m| m.get(index as usize / 8))
            .is_some_and(|b| b & (1 << (index % 8)) != 0)
    }
}
/// One block fetch that concurrent readers share.
type BlockCell = tokio::sync::OnceCell<Result<Bytes, BlockError>>;
/// A directory listing kept by its handle: entries with their attributes (readdirplus).
pub type Listing = Arc<Vec<(DirEntry, Option<Attr>)>>;

#[derive(Clone, Debug)]
enum BlockError {
    Corrupt(String),
    Other(String),
}

/// Where a mount at a mirror gets a block that its region's object store does not hold yet,
/// or holds corrupt: the mirror daemon, which fetches it from the primary's store ahead of
/// its copy queue, keeps a copy and answers with the bytes (checked again by the caller).
pub trait BlockFallback: Send + Sync {
    /// `reason`: "missing" or "corrupt".
    fn fetch<'a>(
        &'a self,
        key: &'a str,
        len: u32,
        crc: u32,
        reason: &'a str,
    ) -> crate::object::BoxFut<'a, Bytes>;
}

/// A [`BlockFallback`] in [`VfsOptions`].
#[derive(Clone)]
pub struct Fallback(pub Arc<dyn BlockFallback>);

impl std::fmt::Debug for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fallback")
    }
}

#[derive(Clone, Debug)]
pub struct VfsOptions {
    pub mem_cache_bytes: u64,
    pub cache_dir: Option<PathBuf>,
    pub disk_cache_bytes: u64,
    /// Most blocks read ahead of a sequential reader.
    pub readahead_blocks_max: u32,
    pub upload_concurrency: usize,
    pub download_concurrency: usize,
    /// At a mirror: blocks fetched through the mirror daemon at once.
    pub fallback_concurrency: usize,
    /// Memory for full blocks waiting for or in upload; writers wait when it is used up.
    pub write_buffer_bytes: u64,
    /// At a mirror: where blocks missing from (or corrupt in) the region's store come from.
    pub block_fallback: Option<Fallback>,
}

impl Default for VfsOptions {
    fn default() -> Self {
        VfsOptions {
            mem_cache_bytes: 256 << 20,
            cache_dir: None,
            disk_cache_bytes: 0,
            readahead_blocks_max: 8,
            upload_concurrency: 16,
            download_concurrency: 64,
            fallback_concurrency: 64,
            write_buffer_bytes: 256 << 20,
            block_fallback: None,
        }
    }
}

/// What the writer and the readers share.
pub struct Shared {
    pub meta: Arc<dyn MetaClient>,
    pub store: DynStore,
    pub rt: tokio::runtime::Handle,
    pub cache: Arc<BlockCache>,
    pub block_size: u32,
    pub upload_slots: tokio::sync::Semaphore,
    /// Full blocks buffered or uploading, across all files (bounds the write buffer memory).
    pub buffer_slots: Arc<tokio::sync::Semaphore>,
    download_slots: Arc<tokio::sync::Semaphore>,
    /// Blocks being fetched through the mirror (they wait across regions).
    fallback_slots: tokio::sync::Semaphore,
    chunks: Mutex<HashMap<(Ino, u32), SliceList>>,
    inflight: Mutex<HashMap<String, Arc<BlockCell>>>,
    /// Blocks already reported corrupt, so each is logged once (bounded).
    reported_corrupt: Mutex<std::collections::HashSet<String>>,
    compacting: Mutex<std::collections::HashSet<(Ino, u32)>>,
    fallback: Option<Fallback>,
}

impl Shared {
    fn chunk_changed(self: &Arc<Self>, ino: Ino, idx: u32) {
        self.chunks.lock().remove(&(ino, idx));
        self.maybe_compact(ino, idx);
    }

    fn forget_inode(&self, ino: Ino) {
        self.chunks.lock().retain(|k, _| k.0 != ino);
    }

    fn slices(&self, ino: Ino, idx: u32) -> Result<SliceList> {
        if let Some(s) = self.chunks.lock().get(&(ino, idx)) {
            return Ok(s.clone());
        }
        let (slices, unsynced) = self.meta.read_chunk_unsynced(ino, idx)?;
        Ok(self.keep_chunk(ino, idx, slices, unsynced))
    }

    /// Cache the slice list of a chunk as the metadata service gave it (with, at a mirror,
    /// the bitmaps of the blocks the region's store does not hold yet).
    fn keep_chunk(
        &self,
        ino: Ino,
        idx: u32,
        slices: Vec<SliceRef>,
        unsynced: Vec<Vec<u8>>,
    ) -> SliceList {
        let unsynced = if unsynced.len() == slices.len() {
            slices
                .iter()
                .zip(unsynced)
                .filter(|(_, m)| !m.is_empty())
                .map(|(s, m)| (s.id, m))
                .collect()
        } else {
            HashMap::new()
        };
        let s = Arc::new(ChunkView { slices, unsynced });
        let mut c = self.chunks.lock();
        if c.len() >= CHUNK_CACHE_ENTRIES_MAX {
            c.clear();
        }
        c.insert((ino, idx), s.clone());
        s
    }

    /// One block, from memory, the disk cache or the object store (checked against its CRC).
    /// `unsynced`: at a mirror, the region's store does not hold it yet (ask the mirror
    /// without asking the store first).
    async fn block(
        self: &Arc<Self>,
        slice: &SliceRef,
        index: u32,
        unsynced: bool,
    ) -> Result<Bytes> {
        let len = block_len(slice.size, self.block_size, index);
        let key = block_key(slice.id, index, len);
        if let Some(b) = self.cache.get_mem(&key) {
            return Ok(b);
        }
        let crc = *slice.crcs.get(index as usize).ok_or_else(|| {
            Error::corrupt(format!("slice {} has no crc for block {index}", slice.id))
        })?;
        let cell = {
            let mut inflight = self.inflight.lock();
            inflight.entry(key.clone()).or_default().clone()
        };
        let me = self.clone();
        let k2 = key.clone();
        let got = cell
            .get_or_init(|| async move {
                me.fetch(&k2, len, crc, unsynced)
                    .await
                    .map_err(|e| match e {
                        Error::CorruptBlock { reason, .. } => BlockError::Corrupt(reason),
                        other => BlockError::Other(other.to_string()),
                    })
            })
            .await
            .clone();
        self.inflight.lock().remove(&key);
        match got {
            Ok(b) => Ok(b),
            Err(BlockError::Corrupt(reason)) => Err(Error::CorruptBlock { key, reason }),
            Err(BlockError::Other(msg)) => Err(Error::Object(ObjectError::Fatal(msg))),
        }
    }

    /// Log a corrupt block once per mount (a reader retrying must not flood the log).
    fn report_corrupt(&self, e: &Error) {
        if let Error::CorruptBlock { key, .. } = e {
            let mut seen = self.reported_corrupt.lock();
            if seen.len() < REPORTED_CORRUPT_MAX && seen.insert(key.clone()) {
                tracing::error!("{e}: the read fails with EIO");
            }
        }
    }

    async fn fetch(
        self: &Arc<Self>,
        key: &str,
        len: u32,
        crc: u32,
        unsynced: bool,
    ) -> Result<Bytes> {
        if self.cache.has_disk() {
            let cache = self.cache.clone();
            let k = key.to_string();
            if let Ok(Some(b)) =
                tokio::task::spawn_blocking(move || cache.get_disk(&k, len, crc)).await
            {
                self.cache.put_mem(key, b.clone());
                return Ok(b);
            }
        }
        let data = if unsynced && self.fallback.is_some() {
            // the mirror says this region's store does not hold it yet: no store slot, no miss
            self.fetch_fallback(key, len, crc, "unsynced").await?
        } else {
            self.fetch_store(key, len, crc).await?
        };
        self.cache.put_mem(key, data.clone());
        if self.cache.has_disk() {
            let cache = self.cache.clone();
            let k = key.to_string();
            let d = data.clone();
            tokio::task::spawn_blocking(move || cache.put_disk(&k, &d));
        }
        Ok(data)
    }

    /// A block from this region's object store (through the mirror when it is missing there
    /// or corrupt), checked.
    async fn fetch_store(&self, key: &str, len: u32, crc: u32) -> Result<Bytes> {
        let permit = self
            .download_slots
            .acquire()
            .await
            .map_err(|_| Error::Meta("download slots closed".into()))?;
        let mut attempt = 0;
        let data = loop {
            attempt += 1;
            let got = retry_store(&format!("read block {key}"), || self.store.get(key)).await;
            let data = match got {
                Ok(d) => d,
                // not in this region's store yet: the mirror gets it from the primary's
                Err(Error::CorruptBlock { .. }) if self.fallback.is_some() => {
                    // the wait across regions holds a fallback slot, not a download slot
                    drop(permit);
                    break self.fetch_fallback(key, len, crc, "missing").await?;
                }
                Err(e) => return Err(e),
            };
            match cache::verify(key, &data, len, crc) {
                Ok(()) => break data,
                // read it once more in case it was damaged on the way
                Err(_) if attempt < 2 => {}
                Err(e) if self.fallback.is_some() => {
                    tracing::warn!(
                        "{e}: in this region's object store; the mirror fetches it again from the primary's"
                    );
                    drop(permit);
                    break self.fetch_fallback(key, len, crc, "corrupt").await?;
                }
                Err(e) => {
                    self.report_corrupt(&e);
                    return Err(e);
                }
            }
        };
        Ok(data)
    }

    /// A block from the mirror (see [`BlockFallback`]), checked again here.
    async fn fetch_fallback(&self, key: &str, len: u32, crc: u32, reason: &str) -> Result<Bytes> {
        let Some(fb) = &self.fallback else {
            return Err(Error::Meta("no block fallback".into()));
        };
        let _slot = self
            .fallback_slots
            .acquire()
            .await
            .map_err(|_| Error::Meta("fallback slots closed".into()))?;
        let data =
            fb.0.fetch(key, len, crc, reason)
                .await
                .map_err(|e| match e {
                    ObjectError::NotFound(_) => Error::CorruptBlock {
                        key: key.to_string(),
                        reason: "missing from this region's store and from the primary's".into(),
                    },
                    other => Error::Object(other),
                })?;
        if let Err(e) = cache::verify(key, &data, len, crc) {
            self.report_corrupt(&e);
            return Err(e);
        }
        Ok(data)
    }

    /// Read `[off, off + buf.len())` of chunk `idx` into `buf` (the range lies in the chunk).
    async fn read_chunk(
        self: &Arc<Self>,
        view: &ChunkView,
        from: u32,
        buf: &mut [u8],
    ) -> Result<()> {
        let to = from + buf.len() as u32;
        let bs = self.block_size;
        for seg in visible_segments(&view.slices, from, to) {
            let out = &mut buf[(seg.pos - from) as usize..(seg.pos - from + seg.len) as usize];
            let Some(slice) = seg.slice else {
                out.fill(0);
                continue;
            };
            let mut done = 0u32;
            while done < seg.len {
                let at = seg.off + done;
                let index = at / bs;
                let in_block = at % bs;
                let block = self
                    .block(slice, index, view.unsynced(slice.id, index))
                    .await?;
                let n = (seg.len - done).min(block.len() as u32 - in_block);
                if n == 0 {
                    return Err(Error::corrupt(format!(
                        "slice {} is shorter than its references",
                        slice.id
                    )));
                }
                out[done as usize..(done + n) as usize]
                    .copy_from_slice(&block[in_block as usize..(in_block + n) as usize]);
                done += n;
            }
        }
        Ok(())
    }

    /// Start fetching the blocks of `[off, off + len)` of `ino` into the cache.
    fn prefetch(self: &Arc<Self>, ino: Ino, off: u64, len: u64, file_len: u64) {
        let end = (off + len).min(file_len);
        let mut pos = off;
        while pos < end {
            let idx = (pos / CHUNK_SIZE) as u32;
            let from = (pos % CHUNK_SIZE) as u32;
            let to = ((end - idx as u64 * CHUNK_SIZE).min(CHUNK_SIZE)) as u32;
            let Ok(slices) = self.slices(ino, idx) else {
                return;
            };
            for seg in visible_segments(&slices.slices, from, to) {
                let Some(slice) = seg.slice else { continue };
                let first = seg.off / self.block_size;
                let last = (seg.off + seg.len - 1) / self.block_size;
                for index in first..=last {
                    let key = block_key(
                        slice.id,
                        index,
                        block_len(slice.size, self.block_size, index),
                    );
                    if self.cache.get_mem(&key).is_some() || self.inflight.lock().contains_key(&key)
                    {
                        continue;
                    }
                    let me = self.clone();
                    let s = slice.clone();
                    let unsynced = slices.unsynced(slice.id, index);
                    self.rt.spawn(async move {
                        let _ = me.block(&s, index, unsynced).await;
                    });
                }
            }
            pos = idx as u64 * CHUNK_SIZE + to as u64;
        }
    }

    fn maybe_compact(self: &Arc<Self>, ino: Ino, idx: u32) {
        let Ok(slices) = self.slices(ino, idx) else {
            return;
        };
        if slices.slices.len() < COMPACT_SLICES_MIN || !self.compacting.lock().insert((ino, idx)) {
            return;
        }
        let me = self.clone();
        std::thread::spawn(move || {
            if let Err(e) = me.compact(ino, idx) {
                tracing::warn!("compact chunk {idx} of inode {ino}: {e}");
            }
            me.compacting.lock().remove(&(ino, idx));
        });
    }

    /// Rewrite the visible bytes of a fragmented chunk as one slice.
    pub fn compact(self: &Arc<Self>, ino: Ino, idx: u32) -> Result<()> {
        let old = self.meta.read_chunk(ino, idx)?;
        if old.len() < 2 {
            return Ok(());
        }
        let end = old.iter().map(|s| s.pos + s.len).max().unwrap_or(0);
        let mut data = vec![0u8; end as usize];
        let view = ChunkView {
            slices: old.clone(),
            unsynced: HashMap::new(),
        };
        self.rt.block_on(self.read_chunk(&view, 0, &mut data))?;
        let id = self.meta.next_slice_id()?;
        let bs = self.block_size as usize;
        let mut crcs = vec![];
        for (index, block) in data.chunks(bs).enumerate() {
            let key = block_key(id, index as u32, block.len() as u32);
            let bytes = Bytes::copy_from_slice(block);
            self.rt
                .block_on(retry_store(&format!("upload block {key}"), || {
                    self.store.put(&key, bytes.clone())
                }))?;
            crcs.push(crc32fast::hash(block));
        }
        let new = SliceRef {
            id,
            size: end,
            off: 0,
            len: end,
            pos: 0,
            crcs,
        };
        if self.meta.compact_chunk(ino, idx, &old, vec![new])? {
            tracing::debug!(
                "compacted chunk {idx} of inode {ino}: {} slices into one",
                old.len()
            );
        }
        self.chunks.lock().remove(&(ino, idx));
        Ok(())
    }
}

/// Call an object store operation, retrying transient failures with exponential backoff
/// ([`crate::object::retry`]); a missing object is a [`Error::CorruptBlock`].
pub async fn retry_store<T, F, Fut>(what: &str, f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ObjectError>>,
{
    crate::object::retry(what, STORE_ATTEMPTS_MAX, f)
        .await
        .map_err(|e| match e {
            ObjectError::NotFound(_) => Error::CorruptBlock {
                key: what.to_string(),
                reason: "missing from the object store".into(),
            },
            other => Error::Object(other),
        })
}

struct Handle {
    ino: Ino,
    /// Where the last read ended, and how many blocks to read ahead.
    next_off: u64,
    window_blocks: u32,
    dir: Option<Listing>,
}

pub struct Vfs {
    shared: Arc<Shared>,
    opts: VfsOptions,
    _runtime: Option<tokio::runtime::Runtime>,
    writers: Mutex<HashMap<Ino, Arc<FileWriter>>>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    /// Size and mtime of files as last reported to the kernel (see [`Vfs::open`]).
    seen: Mutex<HashMap<Ino, (u64, i64)>>,
}

impl Vfs {
    /// Build a VFS over `meta` and `store`, running object I/O on `rt` (or on a runtime of its own).
    pub fn new(
        meta: Arc<dyn MetaClient>,
        store: DynStore,
        opts: VfsOptions,
        rt: Option<tokio::runtime::Handle>,
    ) -> Result<Arc<Self>> {
        let (runtime, handle) = match rt {
            Some(h) => (None, h),
            None => {
                let r = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(4)
                    .thread_name("strait-io")
                    .enable_all()
                    .build()
                    .map_err(|e| Error::io("start the I/O runtime", e))?;
                let h = r.handle().clone();
                (Some(r), h)
            }
        };
        let block_size = meta.settings().block_size;
        let cache_dir = opts
            .cache_dir
            .as_ref()
            .map(|d| d.join(&meta.settings().uuid));
        let cache = Arc::new(BlockCache::new(
            opts.mem_cache_bytes,
            cache_dir.as_deref(),
            opts.disk_cache_bytes,
        )?);
        let shared = Arc::new(Shared {
            meta,
            store,
            rt: handle,
            cache,
            block_size,
            upload_slots: tokio::sync::Semaphore::new(opts.upload_concurrency.max(1)),
            buffer_slots: Arc::new(tokio::sync::Semaphore::new(
                (opts.write_buffer_bytes / block_size as u64).max(2) as usize,
            )),
            download_slots: Arc::new(tokio::sync::Semaphore::new(
                opts.download_concurrency.max(1),
            )),
            fallback_slots: tokio::sync::Semaphore::new(opts.fallback_concurrency.max(1)),
            chunks: Mutex::new(HashMap::new()),
            inflight: Mutex::new(HashMap::new()),
            compacting: Mutex::new(Default::default()),
            reported_corrupt: Mutex::new(Default::default()),
            fallback: opts.block_fallback.clone(),
        });
        Ok(Arc::new(Vfs {
            shared,
            opts,
            _runtime: runtime,
            writers: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            seen: Mutex::new(HashMap::new()),
        }))
    }

    pub fn meta(&self) -> &Arc<dyn MetaClient> {
        &self.shared.meta
    }
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    fn writer(&self, ino: Ino) -> Arc<FileWriter> {
        self.writers
            .lock()
            .entry(ino)
            .or_insert_with(|| Arc::new(FileWriter::new(ino)))
            .clone()
    }

    fn existing_writer(&self, ino: Ino) -> Option<Arc<FileWriter>> {
        self.writers.lock().get(&ino).cloned()
    }

    /// Take buffered (not yet committed) writes into account in `a`.
    fn overlay(&self, ino: Ino, a: &mut Attr) {
        if let Some(w) = self.existing_writer(ino) {
            let (end, mtime_ns) = w.buffered();
            if end > 0 || w.is_dirty() {
                a.length = a.length.max(end);
                a.mtime_ns = a.mtime_ns.max(mtime_ns);
                a.ctime_ns = a.ctime_ns.max(mtime_ns);
            }
        }
    }

    /// Remember the size and mtime of a file as last told to the kernel; returns whether
    /// they differ from what it was told before (or nothing was). Every reply that gives the
    /// kernel a file's attributes goes through here: [`Self::read`] reads up to the length
    /// the kernel was last told, as the kernel itself does.
    pub fn saw(&self, ino: Ino, a: &Attr) -> bool {
        if a.kind != FileKind::File {
            return false;
        }
        let mut seen = self.seen.lock();
        if seen.len() >= SEEN_ENTRIES_MAX {
            seen.clear();
        }
        seen.insert(ino, (a.length, a.mtime_ns)) != Some((a.length, a.mtime_ns))
    }

    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        let mut a = self.shared.meta.getattr(ino)?;
        self.overlay(ino, &mut a);
        self.saw(ino, &a);
        Ok(a)
    }

    pub fn lookup(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<(Ino, Attr)> {
        let (ino, mut a) = self.shared.meta.lookup(ctx, parent, name)?;
        self.overlay(ino, &mut a);
        self.saw(ino, &a);
        Ok((ino, a))
    }

    pub fn setattr(&self, ctx: &Ctx, ino: Ino, req: &SetAttr) -> Result<Attr> {
        // buffered writes commit first, so they neither outlive a truncate nor overwrite
        // the times set here
        self.flush_inode(ino)?;
        let a = self.shared.meta.setattr(ctx, ino, req)?;
        if req.size.is_some() {
            self.shared.forget_inode(ino);
        }
        self.saw(ino, &a);
        Ok(a)
    }

    fn new_handle(&self, ino: Ino) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(
            fh,
            Handle {
                ino,
                next_off: 0,
                window_blocks: 0,
                dir: None,
            },
        );
        fh
    }

    /// Open `ino`; the flag is true when the file changed since the kernel last heard of it
    /// (another mount wrote it), so the caller must drop the kernel's cached attributes.
    pub fn open(&self, ctx: &Ctx, ino: Ino, flags: i32) -> Result<(u64, Attr, bool)> {
        let (mut a, chunk0) = self.shared.meta.open_inode_chunk0(ctx, ino, flags)?;
        // close-to-open: forget cached slice lists so this open sees every committed write
        self.shared.forget_inode(ino);
        if let Some((slices, unsynced)) = chunk0 {
            // read with the open: the first read needs no call of its own
            self.shared.keep_chunk(ino, 0, slices, unsynced);
        }
        self.overlay(ino, &mut a);
        let changed = self.saw(ino, &a);
        Ok((self.new_handle(ino), a, changed))
    }

    /// A POSIX lock on `ino` was granted: forget what this mount read of the file since its
    /// open (slice lists, length), so reads under the lock see every write committed before
    /// it. True when the file changed since the kernel last heard of it.
    pub fn lock_acquired(&self, ino: Ino) -> Result<bool> {
        self.shared.forget_inode(ino);
        if self.existing_writer(ino).is_some() {
            // its reads flush and measure the file at the service anyway
            return Ok(false);
        }
        let mut a = self.shared.meta.getattr(ino)?;
        self.overlay(ino, &mut a);
        Ok(self.saw(ino, &a))
    }

    pub fn create(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<(u64, Ino, Attr)> {
        let (ino, a) = self.shared.meta.create(ctx, parent, name, mode, umask)?;
        self.saw(ino, &a);
        Ok((self.new_handle(ino), ino, a))
    }

    pub fn read(&self, fh: u64, ino: Ino, off: u64, size: u32) -> Result<Vec<u8>> {
        // Commit this file's buffered writes first. Always call flush: it also waits for a
        // flush already running on another thread (a concurrent readahead request must not
        // see the length from before that flush's commits).
        // The length: with writes of this mount behind it, the metadata's (after that flush);
        // otherwise the one the kernel was last told (open, lookup and getattr tell it), as
        // the slices read are those seen since the open (close-to-open). That saves a call
        // to the metadata service per read.
        let told = match self.existing_writer(ino) {
            Some(w) => {
                w.flush(&self.shared)?;
                None
            }
            None => self.seen.lock().get(&ino).map(|(length, _)| *length),
        };
        let length = match told {
            Some(length) => length,
            None => {
                let attr = self.shared.meta.getattr(ino)?;
                if attr.kind == FileKind::Dir {
                    return sys(libc::EISDIR);
                }
                attr.length
            }
        };
        if off >= length || size == 0 {
            return Ok(vec![]);
        }
        let end = (off + size as u64).min(length);
        let mut buf = vec![0u8; (end - off) as usize];
        // readahead: grow the window while the reader stays sequential
        let window = {
            let mut hs = self.handles.lock();
            match hs.get_mut(&fh) {
                Some(h) => {
                    if h.next_off == off && off > 0 {
                        h.window_blocks =
                            (h.window_blocks * 2).clamp(1, self.opts.readahead_blocks_max);
                    } else if h.next_off != off {
                        h.window_blocks = 0;
                    }
                    h.next_off = end;
                    h.window_blocks
                }
                None => 0,
            }
        };
        let shared = self.shared.clone();
        let mut pos = off;
        while pos < end {
            let idx = (pos / CHUNK_SIZE) as u32;
            let from = (pos % CHUNK_SIZE) as u32;
            let to = ((end - idx as u64 * CHUNK_SIZE).min(CHUNK_SIZE)) as u32;
            let slices = shared.slices(ino, idx)?;
            let dst = &mut buf[(pos - off) as usize..(pos - off + (to - from) as u64) as usize];
            shared.rt.block_on(shared.read_chunk(&slices, from, dst))?;
            pos = idx as u64 * CHUNK_SIZE + to as u64;
        }
        if window > 0 {
            shared.prefetch(ino, end, window as u64 * shared.block_size as u64, length);
        }
        Ok(buf)
    }

    pub fn write(&self, ino: Ino, off: u64, data: &[u8]) -> Result<u32> {
        if off
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > FILE_SIZE_MAX)
        {
            return sys(libc::EFBIG);
        }
        if self.shared.meta.is_read_only() {
            return sys(libc::EROFS);
        }
        self.writer(ino).write(&self.shared, off, data)?;
        Ok(data.len() as u32)
    }

    pub fn flush_inode(&self, ino: Ino) -> Result<()> {
        match self.existing_writer(ino) {
            Some(w) => w.flush(&self.shared),
            None => Ok(()),
        }
    }

    pub fn fsync(&self, ino: Ino) -> Result<()> {
        self.flush_inode(ino)?;
        self.sync_stores()
    }

    /// Blocks first, then the metadata that points at them.
    fn sync_stores(&self) -> Result<()> {
        let store = self.shared.store.clone();
        self.shared
            .rt
            .block_on(retry_store("sync the object store", || store.sync()))?;
        self.shared.meta.sync()
    }

    pub fn release(&self, fh: u64) -> Result<()> {
        let h = self.handles.lock().remove(&fh);
        let Some(h) = h else { return Ok(()) };
        let res = self.flush_inode(h.ino);
        let still_open = self.handles.lock().values().any(|o| o.ino == h.ino);
        if !still_open {
            let mut ws = self.writers.lock();
            if ws.get(&h.ino).is_some_and(|w| !w.is_dirty()) {
                ws.remove(&h.ino);
            }
        }
        self.shared.meta.release(h.ino)?;
        res
    }

    pub fn opendir(&self, ctx: &Ctx, ino: Ino) -> Result<u64> {
        let a = self.shared.meta.getattr(ino)?;
        if !a.is_dir() {
            return sys(libc::ENOTDIR);
        }
        self.shared
            .meta
            .access(ctx, ino, crate::meta::perm::MAY_READ)?;
        Ok(self.new_handle(ino))
    }

    /// The directory listing of handle `fh` with `.` and `..`: taken when the listing starts
    /// (offset 0) and kept for the handle, so offsets stay stable while entries change.
    pub fn readdir(&self, ctx: &Ctx, fh: u64, ino: Ino, off: u64, plus: bool) -> Result<Listing> {
        if off > 0 {
            if let Some(d) = self.handles.lock().get(&fh).and_then(|h| h.dir.clone()) {
                return Ok(d);
            }
        }
        let me = self.shared.meta.getattr(ino)?;
        let entries = self.shared.meta.readdir(ctx, ino)?;
        let mut list = Vec::with_capacity(entries.len() + 2);
        list.push((
            DirEntry {
                name: b".".to_vec(),
                ino,
                kind: FileKind::Dir,
            },
            None,
        ));
        list.push((
            DirEntry {
                name: b"..".to_vec(),
                ino: me.parent.max(1),
                kind: FileKind::Dir,
            },
            None,
        ));
        for e in entries {
            let attr = if plus { self.getattr(e.ino).ok() } else { None };
            list.push((e, attr));
        }
        let list = Arc::new(list);
        if let Some(h) = self.handles.lock().get_mut(&fh) {
            h.dir = Some(list.clone());
        }
        Ok(list)
    }

    pub fn releasedir(&self, fh: u64) {
        self.handles.lock().remove(&fh);
    }

    /// Flush every file with buffered writes (unmount).
    pub fn flush_all(&self) -> Result<()> {
        let ws: Vec<Arc<FileWriter>> = self.writers.lock().values().cloned().collect();
        let mut first_err = None;
        for w in ws {
            if let Err(e) = w.flush(&self.shared) {
                first_err.get_or_insert(e);
            }
        }
        self.sync_stores()?;
        first_err.map_or(Ok(()), Err)
    }
}
