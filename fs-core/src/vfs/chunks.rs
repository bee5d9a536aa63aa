//! The slice lists of chunks, cached in memory for the readers, the prefetcher and
//! compaction; a write or a compaction drops a chunk's entry.
//!
//! A list is fetched from the metadata service without the cache's lock held, so a change
//! made through this mount (a write's commit, a truncate, a compaction, an open's
//! close-to-open forget) can land while a fetch is on its way. The list that fetch brings back
//! may be from before the change, and keeping it would let later reads pair the new length
//! with the old slices: a hole of zeros where committed bytes are. So every change counts
//! itself in its inode's stripe of [`ChunkCache::changes`], a fetch notes the count before it
//! starts ([`ChangeMark`]), and [`Shared::keep_chunk`] keeps the list only when the count has
//! not moved (the caller still uses the list: it is what the service answered).

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::Result;
use crate::meta::{Ino, SliceRef};
use crate::SliceId;

use super::Shared;

/// Chunks whose slice lists are kept in memory.
const CHUNK_CACHE_ENTRIES_MAX: usize = 4096;

/// Stripes of inodes whose changes are counted together: a change to one inode of a stripe
/// keeps the fetches of the others in flight then from being cached (they are read again).
const CHANGE_STRIPES: usize = 256;

/// A chunk's slice list, shared by the readers of the chunk cache.
pub(super) type SliceList = Arc<ChunkView>;

/// A chunk's slices and, at a mirror, which of their blocks the region's store does not hold
/// yet (by slice id: bit `i % 8` of byte `i / 8` stands for block `i`).
#[derive(Default)]
pub(super) struct ChunkView {
    pub(super) slices: Vec<SliceRef>,
    pub(super) unsynced: HashMap<SliceId, Vec<u8>>,
}

impl ChunkView {
    pub(super) fn unsynced(&self, id: SliceId, index: u32) -> bool {
        self.unsynced
            .get(&id)
            .and_then(|m| m.get(index as usize / 8))
            .is_some_and(|b| b & (1 << (index % 8)) != 0)
    }
}

/// The cached slice lists, and the changes counted per stripe of inodes.
pub(super) struct ChunkCache {
    lists: HashMap<(Ino, u32), SliceList>,
    changes: Vec<u64>,
}

impl Default for ChunkCache {
    fn default() -> Self {
        ChunkCache {
            lists: HashMap::new(),
            changes: vec![0; CHANGE_STRIPES],
        }
    }
}

/// The count of changes to an inode's stripe when a fetch of one of its chunks started.
#[derive(Clone, Copy)]
pub(super) struct ChangeMark(u64);

impl ChunkCache {
    fn stripe(ino: Ino) -> usize {
        (ino % CHANGE_STRIPES as u64) as usize
    }

    fn mark(&self, ino: Ino) -> ChangeMark {
        ChangeMark(self.changes[Self::stripe(ino)])
    }

    fn changed(&mut self, ino: Ino) {
        let c = &mut self.changes[Self::stripe(ino)];
        *c = c.wrapping_add(1);
    }
}

impl Shared {
    /// A write through this mount committed a slice to chunk `idx` of `ino`.
    pub(super) fn chunk_changed(self: &Arc<Self>, ino: Ino, idx: u32) {
        self.drop_chunk(ino, idx);
        self.maybe_compact(ino, idx);
    }

    /// Drop the cached list of one chunk: it changed.
    pub(super) fn drop_chunk(&self, ino: Ino, idx: u32) {
        let mut c = self.chunks.lock();
        c.lists.remove(&(ino, idx));
        c.changed(ino);
    }

    /// Drop the cached lists of every chunk of `ino`: it changed, or an open or a lock asks
    /// for every change committed anywhere (close-to-open).
    pub(super) fn forget_inode(&self, ino: Ino) {
        let mut c = self.chunks.lock();
        c.lists.retain(|k, _| k.0 != ino);
        c.changed(ino);
    }

    /// Note the changes to `ino` so far, before fetching one of its chunks.
    pub(super) fn change_mark(&self, ino: Ino) -> ChangeMark {
        self.chunks.lock().mark(ino)
    }

    pub(super) fn slices(&self, ino: Ino, idx: u32) -> Result<SliceList> {
        let mark = {
            let c = self.chunks.lock();
            if let Some(s) = c.lists.get(&(ino, idx)) {
                return Ok(s.clone());
            }
            c.mark(ino)
        };
        let (slices, unsynced) = self.meta.read_chunk_unsynced(ino, idx)?;
        Ok(self.keep_chunk(ino, idx, mark, slices, unsynced))
    }

    /// The slice list of a chunk as the metadata service gave it (with, at a mirror, the
    /// bitmaps of the blocks the region's store does not hold yet), kept in the cache unless
    /// `ino` changed since `mark` was taken, before the fetch.
    pub(super) fn keep_chunk(
        &self,
        ino: Ino,
        idx: u32,
        mark: ChangeMark,
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
        if c.mark(ino).0 != mark.0 {
            return s;
        }
        if c.lists.len() >= CHUNK_CACHE_ENTRIES_MAX {
            c.lists.clear();
        }
        c.lists.insert((ino, idx), s.clone());
        s
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parking_lot::Mutex;

    use crate::error::Result;
    use crate::kv::{memory::MemoryKv, DynKv};
    use crate::meta::conformance::test_format;
    use crate::meta::*;
    use crate::object::memory::MemoryStore;
    use crate::vfs::{Vfs, VfsOptions};
    use crate::SliceId;

    type Hook = Box<dyn FnOnce() + Send>;

    /// The embedded engine, answering an open with chunk 0 (as a site daemon does) and
    /// running a hook once, after the next fetch of a slice list and before its answer
    /// returns: a change the hook makes lands while the fetch is on its way.
    struct Racy {
        inner: Arc<Meta>,
        hook: Mutex<Option<Hook>>,
    }

    impl Racy {
        fn fetched(&self) {
            let hook = self.hook.lock().take();
            if let Some(h) = hook {
                h();
            }
        }
    }

    impl MetaClient for Racy {
        fn settings(&self) -> &Format {
            MetaClient::settings(&*self.inner)
        }
        fn is_read_only(&self) -> bool {
            MetaClient::is_read_only(&*self.inner)
        }
        fn open_session(&self, info: &str) -> Result<u64> {
            self.inner.open_session(info)
        }
        fn heartbeat(&self) -> Result<()> {
            MetaClient::heartbeat(&*self.inner)
        }
        fn close_session(&self) -> Result<()> {
            MetaClient::close_session(&*self.inner)
        }
        fn getattr(&self, ino: Ino) -> Result<Attr> {
            MetaClient::getattr(&*self.inner, ino)
        }
        fn lookup(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<(Ino, Attr)> {
            MetaClient::lookup(&*self.inner, ctx, parent, name)
        }
        fn access(&self, ctx: &Ctx, ino: Ino, mask: u32) -> Result<()> {
            MetaClient::access(&*self.inner, ctx, ino, mask)
        }
        fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
            MetaClient::readlink(&*self.inner, ino)
        }
        fn readdir(&self, ctx: &Ctx, ino: Ino) -> Result<Vec<DirEntry>> {
            MetaClient::readdir(&*self.inner, ctx, ino)
        }
        fn statfs(&self) -> Result<StatFs> {
            MetaClient::statfs(&*self.inner)
        }
        fn setattr(&self, ctx: &Ctx, ino: Ino, req: &SetAttr) -> Result<Attr> {
            MetaClient::setattr(&*self.inner, ctx, ino, req)
        }
        fn mknod(
            &self,
            ctx: &Ctx,
            parent: Ino,
            name: &[u8],
            mode: u32,
            umask: u32,
            rdev: u32,
        ) -> Result<(Ino, Attr)> {
            MetaClient::mknod(&*self.inner, ctx, parent, name, mode, umask, rdev)
        }
        fn mkdir(
            &self,
            ctx: &Ctx,
            parent: Ino,
            name: &[u8],
            mode: u32,
            umask: u32,
        ) -> Result<(Ino, Attr)> {
            MetaClient::mkdir(&*self.inner, ctx, parent, name, mode, umask)
        }
        fn create(
            &self,
            ctx: &Ctx,
            parent: Ino,
            name: &[u8],
            mode: u32,
            umask: u32,
        ) -> Result<(Ino, Attr)> {
            MetaClient::create(&*self.inner, ctx, parent, name, mode, umask)
        }
        fn symlink(
            &self,
            ctx: &Ctx,
            parent: Ino,
            name: &[u8],
            target: &[u8],
        ) -> Result<(Ino, Attr)> {
            MetaClient::symlink(&*self.inner, ctx, parent, name, target)
        }
        fn link(&self, ctx: &Ctx, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr> {
            MetaClient::link(&*self.inner, ctx, ino, parent, name)
        }
        fn unlink(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
            MetaClient::unlink(&*self.inner, ctx, parent, name)
        }
        fn rmdir(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
            MetaClient::rmdir(&*self.inner, ctx, parent, name)
        }
        fn rename(
            &self,
            ctx: &Ctx,
            sp: Ino,
            sn: &[u8],
            dp: Ino,
            dn: &[u8],
            flags: u32,
        ) -> Result<()> {
            MetaClient::rename(&*self.inner, ctx, sp, sn, dp, dn, flags)
        }
        fn open_inode(&self, ctx: &Ctx, ino: Ino, flags: i32) -> Result<Attr> {
            MetaClient::open_inode(&*self.inner, ctx, ino, flags)
        }
        fn open_inode_chunk0(
            &self,
            ctx: &Ctx,
            ino: Ino,
            flags: i32,
        ) -> Result<(Attr, Option<(Vec<SliceRef>, Vec<Vec<u8>>)>)> {
            let a = MetaClient::open_inode(&*self.inner, ctx, ino, flags)?;
            let chunk0 = MetaClient::read_chunk(&*self.inner, ino, 0)?;
            self.fetched();
            Ok((a, Some((chunk0, vec![]))))
        }
        fn release(&self, ino: Ino) -> Result<()> {
            MetaClient::release(&*self.inner, ino)
        }
        fn read_chunk(&self, ino: Ino, idx: u32) -> Result<Vec<SliceRef>> {
            let list = MetaClient::read_chunk(&*self.inner, ino, idx)?;
            self.fetched();
            Ok(list)
        }
        fn next_slice_id(&self) -> Result<SliceId> {
            MetaClient::next_slice_id(&*self.inner)
        }
        fn write_slice(&self, ino: Ino, idx: u32, slice: SliceRef, mtime_ns: i64) -> Result<Attr> {
            MetaClient::write_slice(&*self.inner, ino, idx, slice, mtime_ns)
        }
        fn compact_chunk(
            &self,
            ino: Ino,
            idx: u32,
            old: &[SliceRef],
            new: Vec<SliceRef>,
        ) -> Result<bool> {
            MetaClient::compact_chunk(&*self.inner, ino, idx, old, new)
        }
        fn getxattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
            MetaClient::getxattr(&*self.inner, ctx, ino, name)
        }
        fn listxattr(&self, ctx: &Ctx, ino: Ino) -> Result<Vec<Vec<u8>>> {
            MetaClient::listxattr(&*self.inner, ctx, ino)
        }
        fn setxattr(
            &self,
            ctx: &Ctx,
            ino: Ino,
            name: &[u8],
            value: &[u8],
            flags: i32,
        ) -> Result<()> {
            MetaClient::setxattr(&*self.inner, ctx, ino, name, value, flags)
        }
        fn removexattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<()> {
            MetaClient::removexattr(&*self.inner, ctx, ino, name)
        }
        fn flock(&self, ino: Ino, owner: u64, typ: LockType) -> Result<()> {
            MetaClient::flock(&*self.inner, ino, owner, typ)
        }
        fn getlk(
            &self,
            ino: Ino,
            owner: u64,
            typ: LockType,
            start: u64,
            end: u64,
        ) -> Result<Option<PosixLock>> {
            MetaClient::getlk(&*self.inner, ino, owner, typ, start, end)
        }
        fn setlk(
            &self,
            ino: Ino,
            owner: u64,
            pid: u32,
            typ: LockType,
            start: u64,
            end: u64,
        ) -> Result<()> {
            MetaClient::setlk(&*self.inner, ino, owner, pid, typ, start, end)
        }
        fn sync(&self) -> Result<()> {
            MetaClient::sync(&*self.inner)
        }
    }

    fn racy_vfs() -> (Arc<Racy>, Arc<Vfs>) {
        let kv: DynKv = Arc::new(MemoryKv::new());
        Meta::format(&kv, test_format()).unwrap();
        let inner = Meta::open(kv, MetaOptions::default()).unwrap();
        inner.new_session("mount").unwrap();
        let racy = Arc::new(Racy {
            inner,
            hook: Mutex::new(None),
        });
        let vfs = Vfs::new(
            racy.clone() as Arc<dyn MetaClient>,
            Arc::new(MemoryStore::default()),
            VfsOptions::default(),
            None,
        )
        .unwrap();
        (racy, vfs)
    }

    /// The chaos soak's hole (seed 51): a reader's open fetched chunk 0 while a writer's
    /// close at the same mount committed the file's first bytes; the list from before the
    /// commit stayed cached, and the reader, told the new length, read zeros.
    #[test]
    fn an_open_racing_a_commit_at_the_same_mount_reads_the_committed_bytes() {
        let (racy, vfs) = racy_vfs();
        let root = Ctx::root();
        let (w, ino, _) = vfs.create(&root, ROOT_INO, b"cell", 0o644, 0).unwrap();
        vfs.write(ino, 0, b"committed").unwrap();
        let v = vfs.clone();
        *racy.hook.lock() = Some(Box::new(move || {
            v.flush_handle(w, ino).unwrap();
            v.release(w).unwrap();
        }));
        let r = vfs.open(&root, ino, libc::O_RDONLY).unwrap().fh;
        assert!(racy.hook.lock().is_none(), "the open fetched chunk 0");
        // the kernel asks for the attributes: the committed length
        assert_eq!(vfs.getattr(ino).unwrap().length, 9);
        assert_eq!(&vfs.read(r, ino, 0, 64).unwrap()[..], b"committed");
    }

    /// The same race on the read path: a read's fetch of a chunk's list crossed a commit to
    /// the chunk through this mount.
    #[test]
    fn a_read_racing_a_commit_at_the_same_mount_does_not_keep_the_old_list() {
        let (racy, vfs) = racy_vfs();
        let root = Ctx::root();
        let (w, ino, _) = vfs.create(&root, ROOT_INO, b"cell", 0o644, 0).unwrap();
        vfs.write(ino, 0, b"one").unwrap();
        vfs.flush_handle(w, ino).unwrap();
        vfs.release(w).unwrap();
        let r = vfs.open(&root, ino, libc::O_RDONLY).unwrap().fh;
        // a commit through this mount drops chunk 0's list, so the next read fetches it
        let w = vfs.open(&root, ino, libc::O_WRONLY).unwrap().fh;
        vfs.write(ino, 0, b"0").unwrap();
        vfs.flush_handle(w, ino).unwrap();
        vfs.shared.forget_inode(ino);
        let v = vfs.clone();
        *racy.hook.lock() = Some(Box::new(move || {
            v.write(ino, 0, b"two").unwrap();
            v.flush_handle(w, ino).unwrap();
        }));
        // the write lands after the read's fetch: either answer is one the file held
        let first = vfs.read(r, ino, 0, 64);
        assert!(racy.hook.lock().is_none(), "the read fetched chunk 0");
        let first = first.unwrap();
        assert!(&first[..] == b"0ne" || &first[..] == b"two", "{first:?}");
        vfs.release(w).unwrap();
        assert_eq!(&vfs.read(r, ino, 0, 64).unwrap()[..], b"two");
    }
}
