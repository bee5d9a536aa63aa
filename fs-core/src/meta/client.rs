//! [`MetaClient`]: the metadata API as the VFS sees it, whether the engine is in this process
//! ([`Meta`], the embedded mode) or behind a site daemon (the gRPC client in `strait-site-client`).

use super::types::*;
use super::{Committed, Meta};
use crate::error::Result;
use crate::SliceId;

/// What a mount needs from the metadata service.
///
/// To ensure correctness, an implementation must:
/// - check permissions against `ctx` for every call that takes one, exactly as [`Meta`] does
///   (the conformance suite is the reference);
/// - make each mutation atomic: it either happens whole or returns an error and changes nothing;
/// - count handles per session: a file unlinked while some session holds it open stays
///   readable until the last handle anywhere is released (or its session times out);
/// - hand out slice ids that are never handed out again, to any client;
/// - return from [`MetaClient::sync`] only when every change acknowledged before the call is
///   on stable storage.
///
/// Errors map to an errno with [`crate::Error::errno`].
pub trait MetaClient: Send + Sync {
    /// The file system's settings.
    fn settings(&self) -> &Format;
    /// Whether every mutation answers EROFS.
    fn is_read_only(&self) -> bool;
    /// Register this client; returns its session id.
    fn open_session(&self, info: &str) -> Result<u64>;
    /// Tell the session's owner this client is alive.
    fn heartbeat(&self) -> Result<()>;
    /// How often to call [`MetaClient::heartbeat`].
    fn heartbeat_interval(&self) -> std::time::Duration {
        std::time::Duration::from_secs(10)
    }
    /// Unregister: release this session's locks and delete the unlinked files it kept open.
    fn close_session(&self) -> Result<()>;

    fn getattr(&self, ino: Ino) -> Result<Attr>;
    fn lookup(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<(Ino, Attr)>;
    fn access(&self, ctx: &Ctx, ino: Ino, mask: u32) -> Result<()>;
    fn readlink(&self, ino: Ino) -> Result<Vec<u8>>;
    fn readdir(&self, ctx: &Ctx, ino: Ino) -> Result<Vec<DirEntry>>;
    fn statfs(&self) -> Result<StatFs>;

    fn setattr(&self, ctx: &Ctx, ino: Ino, req: &SetAttr) -> Result<Attr>;
    #[allow(clippy::too_many_arguments)]
    fn mknod(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<(Ino, Attr)>;
    fn mkdir(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<(Ino, Attr)>;
    /// Create a regular file and count one open handle on it.
    fn create(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<(Ino, Attr)>;
    fn symlink(&self, ctx: &Ctx, parent: Ino, name: &[u8], target: &[u8]) -> Result<(Ino, Attr)>;
    fn link(&self, ctx: &Ctx, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr>;
    fn unlink(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()>;
    fn rmdir(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()>;
    fn rename(&self, ctx: &Ctx, sp: Ino, sn: &[u8], dp: Ino, dn: &[u8], flags: u32) -> Result<()>;

    /// Check access for open(2) with `flags` and count the handle.
    fn open_inode(&self, ctx: &Ctx, ino: Ino, flags: i32) -> Result<Attr>;
    /// [`Self::open_inode`], plus chunk 0 as [`Self::read_chunk_unsynced`] answers it when
    /// the inode is a regular file and the service sends it along (a remote daemon does, in
    /// the open's reply: the first read of the file then needs no call of its own).
    #[allow(clippy::type_complexity)]
    fn open_inode_chunk0(
        &self,
        ctx: &Ctx,
        ino: Ino,
        flags: i32,
    ) -> Result<(Attr, Option<(Vec<SliceRef>, Vec<Vec<u8>>)>)> {
        Ok((self.open_inode(ctx, ino, flags)?, None))
    }
    /// A handle closed; the last close of an unlinked file deletes it.
    fn release(&self, ino: Ino) -> Result<()>;

    fn read_chunk(&self, ino: Ino, idx: u32) -> Result<Vec<SliceRef>>;
    /// [`Self::read_chunk`] and, at a mirror, for each slice the blocks its region's store
    /// does not hold yet (a bitmap, empty when it holds them all); no bitmaps when unknown.
    fn read_chunk_unsynced(&self, ino: Ino, idx: u32) -> Result<(Vec<SliceRef>, Vec<Vec<u8>>)> {
        Ok((self.read_chunk(ino, idx)?, vec![]))
    }
    /// A fresh slice id, never handed out before.
    fn next_slice_id(&self) -> Result<SliceId>;
    fn write_slice(&self, ino: Ino, idx: u32, slice: SliceRef, mtime_ns: i64) -> Result<Attr>;
    /// Replace the prefix `old` of a chunk's slice list by `new`; false if the list changed.
    fn compact_chunk(
        &self,
        ino: Ino,
        idx: u32,
        old: &[SliceRef],
        new: Vec<SliceRef>,
    ) -> Result<bool>;

    fn getxattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<Vec<u8>>;
    fn listxattr(&self, ctx: &Ctx, ino: Ino) -> Result<Vec<Vec<u8>>>;
    fn setxattr(&self, ctx: &Ctx, ino: Ino, name: &[u8], value: &[u8], flags: i32) -> Result<()>;
    fn removexattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<()>;

    fn flock(&self, ino: Ino, owner: u64, typ: LockType) -> Result<()>;
    fn getlk(
        &self,
        ino: Ino,
        owner: u64,
        typ: LockType,
        start: u64,
        end: u64,
    ) -> Result<Option<PosixLock>>;
    /// Take or release a POSIX lock; a conflict is EAGAIN (callers that may wait retry).
    fn setlk(
        &self,
        ino: Ino,
        owner: u64,
        pid: u32,
        typ: LockType,
        start: u64,
        end: u64,
    ) -> Result<()>;

    /// Make every acknowledged change durable.
    fn sync(&self) -> Result<()>;

    /// Release every POSIX lock of `owner` on `ino` (close(2) semantics).
    fn release_posix_locks(&self, ino: Ino, owner: u64) -> Result<()> {
        self.setlk(ino, owner, 0, LockType::Unlock, 0, u64::MAX)
    }
}

/// The embedded mode: the mount's calls go to the engine in this process, and the versions
/// the mutations committed are dropped (nothing here waits for replication).
impl MetaClient for Meta {
    fn settings(&self) -> &Format {
        Meta::settings(self)
    }
    fn is_read_only(&self) -> bool {
        Meta::is_read_only(self)
    }
    fn open_session(&self, info: &str) -> Result<u64> {
        self.new_session(info)
    }
    fn heartbeat(&self) -> Result<()> {
        Meta::heartbeat(self)
    }
    fn close_session(&self) -> Result<()> {
        self.close_session_versioned(self.session_id())
            .map(Committed::into_value)
    }
    fn getattr(&self, ino: Ino) -> Result<Attr> {
        Meta::getattr(self, ino)
    }
    fn lookup(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<(Ino, Attr)> {
        Meta::lookup(self, ctx, parent, name)
    }
    fn access(&self, ctx: &Ctx, ino: Ino, mask: u32) -> Result<()> {
        Meta::access(self, ctx, ino, mask)
    }
    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        Meta::readlink(self, ino)
    }
    fn readdir(&self, ctx: &Ctx, ino: Ino) -> Result<Vec<DirEntry>> {
        Meta::readdir(self, ctx, ino)
    }
    fn statfs(&self) -> Result<StatFs> {
        Meta::statfs(self)
    }
    fn setattr(&self, ctx: &Ctx, ino: Ino, req: &SetAttr) -> Result<Attr> {
        self.setattr_versioned(ctx, ino, req)
            .map(Committed::into_value)
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
        self.mknod_versioned(ctx, parent, name, mode, umask, rdev)
            .map(Committed::into_value)
    }
    fn mkdir(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<(Ino, Attr)> {
        self.mkdir_versioned(ctx, parent, name, mode, umask)
            .map(Committed::into_value)
    }
    fn create(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<(Ino, Attr)> {
        self.create_versioned(ctx, parent, name, mode, umask)
            .map(Committed::into_value)
    }
    fn symlink(&self, ctx: &Ctx, parent: Ino, name: &[u8], target: &[u8]) -> Result<(Ino, Attr)> {
        self.symlink_versioned(ctx, parent, name, target)
            .map(Committed::into_value)
    }
    fn link(&self, ctx: &Ctx, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr> {
        self.link_versioned(ctx, ino, parent, name)
            .map(Committed::into_value)
    }
    fn unlink(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
        self.unlink_versioned(ctx, parent, name)
            .map(Committed::into_value)
    }
    fn rmdir(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
        self.rmdir_versioned(ctx, parent, name)
            .map(Committed::into_value)
    }
    fn rename(&self, ctx: &Ctx, sp: Ino, sn: &[u8], dp: Ino, dn: &[u8], flags: u32) -> Result<()> {
        self.rename_versioned(ctx, sp, sn, dp, dn, flags)
            .map(Committed::into_value)
    }
    fn open_inode(&self, ctx: &Ctx, ino: Ino, flags: i32) -> Result<Attr> {
        Meta::open_inode(self, ctx, ino, flags)
    }
    fn release(&self, ino: Ino) -> Result<()> {
        self.release_versioned(ino).map(Committed::into_value)
    }
    fn read_chunk(&self, ino: Ino, idx: u32) -> Result<Vec<SliceRef>> {
        Meta::read_chunk(self, ino, idx)
    }
    fn next_slice_id(&self) -> Result<SliceId> {
        Meta::next_slice_id(self)
    }
    fn write_slice(&self, ino: Ino, idx: u32, slice: SliceRef, mtime_ns: i64) -> Result<Attr> {
        self.write_slice_versioned(ino, idx, slice, mtime_ns)
            .map(Committed::into_value)
    }
    fn compact_chunk(
        &self,
        ino: Ino,
        idx: u32,
        old: &[SliceRef],
        new: Vec<SliceRef>,
    ) -> Result<bool> {
        self.compact_chunk_versioned(ino, idx, old, new)
            .map(Committed::into_value)
    }
    fn getxattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        Meta::getxattr(self, ctx, ino, name)
    }
    fn listxattr(&self, ctx: &Ctx, ino: Ino) -> Result<Vec<Vec<u8>>> {
        Meta::listxattr(self, ctx, ino)
    }
    fn setxattr(&self, ctx: &Ctx, ino: Ino, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        self.setxattr_versioned(ctx, ino, name, value, flags)
            .map(Committed::into_value)
    }
    fn removexattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<()> {
        self.removexattr_versioned(ctx, ino, name)
            .map(Committed::into_value)
    }
    fn flock(&self, ino: Ino, owner: u64, typ: LockType) -> Result<()> {
        Meta::flock(self, ino, owner, typ)
    }
    fn getlk(
        &self,
        ino: Ino,
        owner: u64,
        typ: LockType,
        start: u64,
        end: u64,
    ) -> Result<Option<PosixLock>> {
        Meta::getlk(self, ino, owner, typ, start, end)
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
        Meta::setlk(self, ino, owner, pid, typ, start, end)
    }
    fn sync(&self) -> Result<()> {
        self.kv().sync()
    }
}
