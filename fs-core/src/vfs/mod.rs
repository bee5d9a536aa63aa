//! The VFS: file handles, the read path (slice resolution, block cache, readahead), the write
//! path ([`writer::FileWriter`]), compaction of fragmented chunks and deletion of dead
//! slices' blocks. It is synchronous (called from FUSE threads) and drives the asynchronous
//! object store on its own tokio runtime.
//!
//! Do not call the VFS from inside a tokio runtime: it blocks on its own.
//!
//! This file holds [`Vfs`] (file handles and the calls FUSE makes) and [`Shared`], what the
//! writer and the readers share. Beside it: `chunks` (the cached slice lists), `read` (the
//! read path), `fallback` (at a mirror, blocks not in the region's store yet), `compact`
//! (compaction), `store` (object store calls with retries), `writer` (the write path),
//! `cache` (the block cache), `gc` (deletion of dead slices' blocks) and `orphans` (deletion
//! of objects no slice references).

pub mod cache;
mod chunks;
mod compact;
mod fallback;
pub mod gc;
pub mod orphans;
mod read;
mod store;
mod writer;

use bytes::Bytes;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{sys, Error, Result};
use crate::layout::CHUNK_SIZE;
use crate::meta::{Attr, Ctx, DirEntry, FileKind, Ino, MetaClient, SetAttr, FILE_SIZE_MAX};
use crate::object::DynStore;
pub use cache::BlockCache;
use chunks::ChunkCache;
pub use compact::{plan as compact_plan, CompactPlan, COMPACT_BYTES_PER_SLICE, COMPACT_WINDOW};
pub use fallback::{BlockFallback, Fallback};
use read::BlockCell;
pub use store::{retry_store, STORE_ATTEMPTS_MAX};
use writer::FileWriter;

/// Files whose size and mtime as last reported to the kernel are remembered.
const SEEN_ENTRIES_MAX: usize = 100_000;

/// A directory listing kept by its handle: entries with their attributes (readdirplus).
pub type Listing = Arc<Vec<(DirEntry, Option<Attr>)>>;

#[derive(Clone, Debug)]
pub struct VfsOptions {
    pub mem_cache_bytes: u64,
    pub cache_dir: Option<PathBuf>,
    pub disk_cache_bytes: u64,
    /// Most blocks read ahead of a sequential reader.
    pub readahead_blocks_max: u32,
    /// How far ahead the kernel reads on the mount (its `read_ahead_kb`): its requests for
    /// one reader are in flight over that span at once, so they arrive up to that far out of
    /// order and still come from a sequential reader.
    pub kernel_read_ahead: u64,
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
            kernel_read_ahead: 128 << 10,
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
    chunks: Mutex<ChunkCache>,
    inflight: Mutex<HashMap<String, Arc<BlockCell>>>,
    /// Blocks already reported corrupt, so each is logged once (bounded).
    reported_corrupt: Mutex<std::collections::HashSet<String>>,
    compacting: Mutex<std::collections::HashSet<(Ino, u32)>>,
    fallback: Option<Fallback>,
}

struct Handle {
    ino: Ino,
    /// How far this handle's reads have come, and how many blocks to read ahead.
    next_off: u64,
    window_blocks: u32,
    dir: Option<Listing>,
    /// The count of the file's failed flushes this handle has reported (see
    /// [`FileWriter::errors`]).
    failures_reported: u64,
}

/// A handle's read-ahead after a read of `[off, end)`, from how far its reads had come and
/// its window (in blocks) before: the window doubles (up to `max`) while the reads stay
/// sequential and drops to none on a jump. A read within `slack` of where the reads had come
/// counts as sequential: the kernel sends a file's reads on several FUSE threads at once, so
/// a sequential reader's requests arrive slightly out of order (in a 1 GiB read at a mirror,
/// one request in nine came before the one it followed, and each reset the window).
fn readahead(
    (next_off, window): (u64, u32),
    (off, end): (u64, u64),
    slack: u64,
    max: u32,
) -> (u64, u32) {
    if off == 0 && next_off == 0 {
        // the first read of the file: nothing says yet that the reader is sequential
        (end, window)
    } else if off.abs_diff(next_off) <= slack {
        (next_off.max(end), (window * 2).clamp(1, max))
    } else {
        (end, 0)
    }
}

/// What [`Vfs::open`] answers.
#[derive(Debug)]
pub struct Opened {
    pub fh: u64,
    pub attr: Attr,
    /// The attributes differ from those the kernel was last told.
    pub changed: bool,
    /// The kernel may keep the file's page cache.
    pub keep_cache: bool,
}

pub struct Vfs {
    shared: Arc<Shared>,
    opts: VfsOptions,
    _runtime: Option<tokio::runtime::Runtime>,
    writers: Mutex<HashMap<Ino, Arc<FileWriter>>>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    /// The version of files as last reported to the kernel (see [`Vfs::open`]).
    seen: Mutex<HashMap<Ino, Version>>,
    /// The version of each file at its last open through this mount, while no write through
    /// this mount followed: the version whose bytes the kernel's page cache may hold.
    opened: Mutex<HashMap<Ino, Version>>,
}

/// What identifies a file's bytes at one moment: its length, mtime and ctime. Every change of
/// a file's data moves its ctime, which no caller can set, so two different contents never
/// share a version (close-to-open compares versions, as NFS compares its change attribute).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Version {
    length: u64,
    mtime_ns: i64,
    ctime_ns: i64,
}

impl Version {
    fn of(a: &Attr) -> Self {
        Version {
            length: a.length,
            mtime_ns: a.mtime_ns,
            ctime_ns: a.ctime_ns,
        }
    }
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
            chunks: Mutex::new(ChunkCache::default()),
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
            opened: Mutex::new(HashMap::new()),
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

    /// Remember the version (size, mtime, ctime) of a file as last told to the kernel;
    /// returns whether it differs from what it was told before (or nothing was). Every reply that gives the
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
        seen.insert(ino, Version::of(a)) != Some(Version::of(a))
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
        if req.size.is_some() {
            self.touched(ino);
        }
        let a = self.shared.meta.setattr(ctx, ino, req)?;
        if req.size.is_some() {
            self.shared.forget_inode(ino);
        }
        self.saw(ino, &a);
        Ok(a)
    }

    fn new_handle(&self, ino: Ino) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        // a failure before this open is not this handle's to report
        let failures_reported = self.existing_writer(ino).map_or(0, |w| w.errors().0);
        self.handles.lock().insert(
            fh,
            Handle {
                ino,
                next_off: 0,
                window_blocks: 0,
                dir: None,
                failures_reported,
            },
        );
        fh
    }

    /// Open `ino`; the flag is true when the file changed since the kernel last heard of it
    /// (another mount wrote it), so the caller must drop the kernel's cached attributes.
    /// Open `ino`: the handle, the attributes, whether they changed since the kernel last
    /// heard of them, and whether the kernel may keep the file's page cache (the file is at
    /// the version it had at its last open here, and nothing was written to it through this
    /// mount since, so the cached pages are the file's bytes now).
    pub fn open(&self, ctx: &Ctx, ino: Ino, flags: i32) -> Result<Opened> {
        // close-to-open: forget cached slice lists so this open sees every committed write
        self.shared.forget_inode(ino);
        let mark = self.shared.change_mark(ino);
        let (mut a, chunk0) = self.shared.meta.open_inode_chunk0(ctx, ino, flags)?;
        if let Some((slices, unsynced)) = chunk0 {
            // read with the open: the first read needs no call of its own (kept unless a
            // commit through this mount raced the open)
            self.shared.keep_chunk(ino, 0, mark, slices, unsynced);
        }
        let writing = self.existing_writer(ino).is_some();
        self.overlay(ino, &mut a);
        let changed = self.saw(ino, &a);
        let keep_cache = a.kind == FileKind::File && !writing && {
            let mut opened = self.opened.lock();
            if opened.len() >= SEEN_ENTRIES_MAX {
                opened.clear();
            }
            opened.insert(ino, Version::of(&a)) == Some(Version::of(&a))
        };
        Ok(Opened {
            fh: self.new_handle(ino),
            attr: a,
            changed,
            keep_cache,
        })
    }

    /// Data of `ino` is changing through this mount: its next open drops the page cache.
    fn touched(&self, ino: Ino) {
        self.opened.lock().remove(&ino);
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

    pub fn read(&self, fh: u64, ino: Ino, off: u64, size: u32) -> Result<Bytes> {
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
            None => self.seen.lock().get(&ino).map(|v| v.length),
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
            return Ok(Bytes::new());
        }
        let end = (off + size as u64).min(length);
        // readahead: grow the window while the reader stays sequential
        let window = {
            let mut hs = self.handles.lock();
            match hs.get_mut(&fh) {
                Some(h) => {
                    (h.next_off, h.window_blocks) = readahead(
                        (h.next_off, h.window_blocks),
                        (off, end),
                        self.shared.block_size as u64 + self.opts.kernel_read_ahead,
                        self.opts.readahead_blocks_max,
                    );
                    h.window_blocks
                }
                None => 0,
            }
        };
        let shared = self.shared.clone();
        let data = self.read_range(ino, off, end)?;
        if window > 0 {
            shared.prefetch(ino, end, window as u64 * shared.block_size as u64, length);
        }
        Ok(data)
    }

    /// The bytes `[off, end)` of `ino`: a view of one block when the range lies in one
    /// (see [`Shared::read_in_one_block`]), else gathered into a buffer of their own.
    fn read_range(&self, ino: Ino, off: u64, end: u64) -> Result<Bytes> {
        let shared = &self.shared;
        let idx = (off / CHUNK_SIZE) as u32;
        if (end - 1) / CHUNK_SIZE == idx as u64 {
            let from = (off % CHUNK_SIZE) as u32;
            let to = from + (end - off) as u32;
            let slices = shared.slices(ino, idx)?;
            if let Some(b) = shared
                .rt
                .block_on(shared.read_in_one_block(&slices, from, to))?
            {
                return Ok(b);
            }
        }
        let mut buf = vec![0u8; (end - off) as usize];
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
        Ok(Bytes::from(buf))
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
        self.touched(ino);
        let w = self.writer(ino);
        w.write(&self.shared, off, data)?;
        if w.tails_full() {
            // bound the buffer: commit now, as a flush would (a failure is also counted for
            // the handles' next close or fsync)
            w.flush(&self.shared)?;
        }
        Ok(data.len() as u32)
    }

    pub fn flush_inode(&self, ino: Ino) -> Result<()> {
        match self.existing_writer(ino) {
            Some(w) => w.flush(&self.shared),
            None => Ok(()),
        }
    }

    /// Commit `ino`'s buffered writes for handle `fh` (close, fsync): an error when this
    /// flush failed, or when an earlier flush of the file failed (one by another handle, or
    /// a read's at this mount) and this handle has not said so yet, as the writes lost may
    /// have been this handle's.
    pub fn flush_handle(&self, fh: u64, ino: Ino) -> Result<()> {
        let Some(w) = self.existing_writer(ino) else {
            return Ok(());
        };
        let res = w.flush(&self.shared);
        let (failures, errno) = w.errors();
        let unreported = match self.handles.lock().get_mut(&fh) {
            Some(h) if h.ino == ino => {
                let before = h.failures_reported;
                h.failures_reported = failures;
                before < failures
            }
            _ => false,
        };
        match res {
            Ok(()) if unreported => {
                let errno = match errno {
                    libc::ENOSPC | libc::EDQUOT | libc::EFBIG => errno,
                    _ => libc::EIO,
                };
                Err(crate::error::Error::Sys(errno))
            }
            res => res,
        }
    }

    pub fn fsync(&self, fh: u64, ino: Ino) -> Result<()> {
        self.flush_handle(fh, ino)?;
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

/// A VFS over the in-memory engine and store, for unit tests.
#[cfg(test)]
pub(crate) fn memory_vfs() -> (
    crate::kv::DynKv,
    Arc<crate::meta::Meta>,
    Arc<crate::object::memory::MemoryStore>,
    Arc<Vfs>,
) {
    use crate::meta::{Meta, MetaOptions};
    let kv: crate::kv::DynKv = Arc::new(crate::kv::memory::MemoryKv::new());
    Meta::format(&kv, crate::meta::conformance::test_format()).expect("format");
    let meta = Meta::open(kv.clone(), MetaOptions::default()).expect("open");
    meta.new_session("mount").expect("session");
    let store = Arc::new(crate::object::memory::MemoryStore::default());
    let vfs = Vfs::new(
        meta.clone() as Arc<dyn MetaClient>,
        store.clone(),
        VfsOptions::default(),
        None,
    )
    .expect("vfs");
    (kv, meta, store, vfs)
}

#[cfg(test)]
mod tests {
    use super::{memory_vfs, readahead};
    use crate::meta::{Ctx, ROOT_INO};

    const K: u64 = 128 << 10;
    const SLACK: u64 = 4 << 20;

    #[test]
    fn the_window_doubles_while_reads_stay_near_and_closes_on_a_jump() {
        let read = |before, off| readahead(before, (off, off + K), SLACK, 8);
        // the first read says nothing yet; the next sequential ones double the window
        assert_eq!(read((0, 0), 0), (K, 0));
        assert_eq!(read((K, 0), K), (2 * K, 1));
        assert_eq!(read((2 * K, 1), 2 * K), (3 * K, 2));
        assert_eq!(read((3 * K, 4), 3 * K), (4 * K, 8));
        assert_eq!(read((4 * K, 8), 4 * K), (5 * K, 8));
        // a request that arrived before the one it follows (another FUSE thread's) keeps the
        // window, and how far the reads had come
        assert_eq!(read((6 * K, 8), 5 * K), (6 * K, 8));
        assert_eq!(read((6 * K, 8), 7 * K), (8 * K, 8));
        // a jump further than the slack, either way, is a random reader
        let far = 6 * K + SLACK + 1;
        assert_eq!(read((6 * K, 8), far), (far + K, 0));
        assert_eq!(read((SLACK + 7 * K, 8), 6 * K), (7 * K, 0));
    }

    /// Through `read`: a sequential reader whose requests arrive pairwise swapped (as two
    /// FUSE threads deliver them) keeps its full window; a jump closes it.
    #[test]
    fn reads_arriving_out_of_order_keep_the_handles_window() {
        let (_, _, _, vfs) = memory_vfs();
        let root = Ctx::root();
        let (fh, ino, _) = vfs.create(&root, ROOT_INO, b"f", 0o644, 0).unwrap();
        let data = vec![7u8; (64 << 20) as usize];
        vfs.write(ino, 0, &data).unwrap();
        vfs.flush_handle(fh, ino).unwrap();
        let window = || vfs.handles.lock()[&fh].window_blocks;
        let max = vfs.opts.readahead_blocks_max;
        for pair in 0..16u64 {
            for off in [(2 * pair + 1) * K, 2 * pair * K] {
                assert_eq!(vfs.read(fh, ino, off, K as u32).unwrap().len(), K as usize);
            }
        }
        assert_eq!(window(), max);
        vfs.read(fh, ino, 40 << 20, K as u32).unwrap();
        assert_eq!(window(), 0);
    }

    /// With the kernel reading 16 MiB ahead, its 1 MiB requests for one sequential reader
    /// arrive as much as 16 MiB out of order: the window stays open.
    #[test]
    fn requests_out_of_order_within_the_kernels_read_ahead_keep_the_window() {
        const MIB: u64 = 1 << 20;
        let (_, meta, store, _) = memory_vfs();
        let vfs = super::Vfs::new(
            meta as std::sync::Arc<dyn crate::meta::MetaClient>,
            store,
            super::VfsOptions {
                kernel_read_ahead: 16 * MIB,
                ..super::VfsOptions::default()
            },
            None,
        )
        .unwrap();
        let root = Ctx::root();
        let (fh, ino, _) = vfs.create(&root, ROOT_INO, b"f", 0o644, 0).unwrap();
        vfs.write(ino, 0, &vec![7u8; (64 * MIB) as usize]).unwrap();
        vfs.flush_handle(fh, ino).unwrap();
        let window = || vfs.handles.lock()[&fh].window_blocks;
        // 16 requests in order, then the one left behind at the start
        for m in (1..17).chain([0]) {
            vfs.read(fh, ino, m * MIB, MIB as u32).unwrap();
        }
        assert_eq!(window(), vfs.opts.readahead_blocks_max);
    }
}
