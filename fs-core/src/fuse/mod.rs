//! The FUSE adapter: turns kernel requests (fuser) into VFS calls and VFS errors into errnos.
//! Requests are served by several threads at once; nothing here holds a lock across a call.
//!
//! It stays one file (about 870 lines): it is one `fuser::Filesystem` implementation whose
//! methods each translate one kernel request the same way (arguments in, errno out); split,
//! one trait's implementation would be scattered without any part standing on its own.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::error::Error;
use crate::meta::{Attr, Ctx, FileKind, LockType, SetAttr, TimeSet, NAME_LEN_MAX};
use crate::vfs::Vfs;

/// How long a blocked lock request waits between attempts.
const LOCK_POLL_MS_MAX: u64 = 100;

#[derive(Clone, Debug)]
pub struct FuseOptions {
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
    pub threads: usize,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            attr_ttl: Duration::from_secs(1),
            entry_ttl: Duration::from_secs(1),
            threads: 64,
        }
    }
}

pub struct StraitFs {
    vfs: Arc<Vfs>,
    opts: FuseOptions,
    /// Set once the session exists: tells the kernel to drop attributes another mount changed.
    notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
    /// Inodes on which this mount ever asked for a POSIX lock: only their closes need to
    /// release locks at the metadata service (one call saved on every other close).
    locked: parking_lot::Mutex<std::collections::HashSet<u64>>,
    /// Names whose kernel entries must be dropped after a call that changed them failed with
    /// an unknown outcome (see [`StraitFs::unsure`]); served by one thread.
    unsure: std::sync::mpsc::SyncSender<(u64, Vec<u8>)>,
}

/// Names waiting to be dropped from the kernel's entry cache; beyond it they are dropped
/// from the queue (their entries expire with the entry TTL anyway).
const UNSURE_QUEUE_MAX: usize = 1024;

/// Whether a failed call that changes names may have changed them all the same: EIO,
/// ETIMEDOUT and the like come from a change committed but not known to be (durability
/// `replicated` after a local commit, a lost answer); a clean refusal (ENOENT, EEXIST, ...)
/// changed nothing.
fn outcome_unknown(e: &Error) -> bool {
    matches!(
        e.errno(),
        libc::EIO | libc::ETIMEDOUT | libc::EAGAIN | libc::ENOTCONN | libc::ECONNRESET
    )
}

fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

pub fn file_attr(ino: u64, a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: a.length,
        blocks: a.length.div_ceil(512),
        atime: time(a.atime_ns),
        mtime: time(a.mtime_ns),
        ctime: time(a.ctime_ns),
        crtime: time(a.ctime_ns),
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 1 << 17,
        flags: 0,
    }
}

fn errno(e: &Error) -> Errno {
    if !e.is_sys() && !matches!(e, Error::CorruptBlock { .. }) {
        tracing::error!("{e}");
    }
    Errno::from_i32(e.errno())
}

/// Supplementary groups of a process, read from /proc (FUSE requests carry only uid and gid).
fn groups_of(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return vec![];
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether process `pid` has a signal pending that it does not block (its syscall is being
/// interrupted). fuser does not deliver FUSE_INTERRUPT, so a waiting lock polls this.
fn signal_pending(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        // the process is gone: stop waiting for it
        return true;
    };
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    let pending = field("SigPnd:") | field("ShdPnd:");
    let blocked = field("SigBlk:");
    pending & !blocked != 0
}

impl StraitFs {
    pub fn new(vfs: Arc<Vfs>, opts: FuseOptions) -> Self {
        let notifier: Arc<std::sync::OnceLock<fuser::Notifier>> =
            Arc::new(std::sync::OnceLock::new());
        let (unsure, names) = std::sync::mpsc::sync_channel::<(u64, Vec<u8>)>(UNSURE_QUEUE_MAX);
        let n = notifier.clone();
        // notifications go out from a thread of their own, never from a request's handler:
        // the kernel holds the directory's lock until the request is answered, and dropping
        // an entry takes it
        let spawned = std::thread::Builder::new()
            .name("strait-unsure".into())
            .spawn(move || {
                for (parent, name) in names {
                    if let Some(n) = n.get() {
                        if let Err(e) = n.inval_entry(INodeNo(parent), OsStr::from_bytes(&name)) {
                            tracing::debug!(
                                "drop the kernel's entry for a name under {parent}: {e}"
                            );
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("no thread to drop kernel entries after failed calls: {e}");
        }
        StraitFs {
            vfs,
            opts,
            notifier,
            locked: parking_lot::Mutex::new(std::collections::HashSet::new()),
            unsure,
        }
    }

    /// A call changing `names` (parent, name) failed with `e`: when its outcome is unknown,
    /// the change may have been made although the kernel was told it failed, so its cached
    /// entries (the name's old inode, a negative entry) would show the state from before for
    /// up to the entry TTL. They are dropped once the call is answered.
    fn unsure(&self, e: &Error, names: &[(u64, &[u8])]) {
        if !outcome_unknown(e) {
            return;
        }
        for &(parent, name) in names {
            let _ = self.unsure.try_send((parent, name.to_vec()));
        }
    }

    /// Where to put the session's notifier once the session is made (close-to-open: a file
    /// changed by another mount gets its cached attributes dropped when it is opened here).
    pub fn notifier_slot(&self) -> Arc<std::sync::OnceLock<fuser::Notifier>> {
        self.notifier.clone()
    }

    fn ctx(&self, req: &Request) -> Ctx {
        let groups = if req.uid() == 0 {
            vec![]
        } else {
            groups_of(req.pid())
        };
        Ctx {
            uid: req.uid(),
            gid: req.gid(),
            groups,
            pid: req.pid(),
        }
    }

    fn entry(&self, reply: ReplyEntry, ino: u64, a: &Attr) {
        self.vfs.saw(ino, a);
        reply.entry(&self.opts.entry_ttl, &file_attr(ino, a), Generation(0));
    }
}

fn name_ok(name: &OsStr) -> Result<&[u8], Errno> {
    let b = name.as_bytes();
    if b.len() > NAME_LEN_MAX {
        return Err(Errno::from_i32(libc::ENAMETOOLONG));
    }
    Ok(b)
}

macro_rules! tri {
    ($reply:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => {
                $reply.error(errno(&e));
                return;
            }
        }
    };
}

/// [`tri!`] for a call that changes names: on a failure whose outcome is unknown, the names'
/// kernel entries are dropped after the answer ([`StraitFs::unsure`]).
macro_rules! tri_names {
    ($self:ident, $reply:expr, $e:expr, $names:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => {
                $reply.error(errno(&e));
                $self.unsure(&e, $names);
                return;
            }
        }
    };
}

/// [`tri!`] for a call on an inode the kernel named by number (getattr, open, ...): an inode
/// that no longer exists is ESTALE, not ENOENT. The kernel may hold a name's old inode in its
/// caches (for up to the entry TTL, or in a path walk that raced with a rename at any mount);
/// on ESTALE it looks the name up again and retries once (LOOKUP_REVAL), so `open("reg")`
/// while another process renames a new `reg` over it opens the new file instead of failing
/// with ENOENT for a name that always existed.
macro_rules! tri_ino {
    ($reply:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => {
                $reply.error(errno_ino(&e));
                return;
            }
        }
    };
}

fn errno_ino(e: &Error) -> Errno {
    if e.errno() == libc::ENOENT {
        return Errno::from_i32(libc::ESTALE);
    }
    errno(e)
}

macro_rules! name {
    ($reply:expr, $n:expr) => {
        match name_ok($n) {
            Ok(v) => v,
            Err(e) => {
                $reply.error(e);
                return;
            }
        }
    };
}

impl Filesystem for StraitFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.add_capabilities(InitFlags::FUSE_POSIX_LOCKS);
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(e) = self.vfs.flush_all() {
            tracing::error!("flush on unmount: {e}");
        }
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let n = name!(reply, name);
        let (ino, a) = tri!(reply, self.vfs.lookup(&self.ctx(req), parent.0, n));
        self.entry(reply, ino, &a);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let a = tri_ino!(reply, self.vfs.getattr(ino.0));
        reply.attr(&self.opts.attr_ttl, &file_attr(ino.0, &a));
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let conv = |t: Option<TimeOrNow>| {
            t.map(|t| match t {
                TimeOrNow::Now => TimeSet::Now,
                TimeOrNow::SpecificTime(s) => TimeSet::At(ns(s)),
            })
        };
        let sa = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: conv(atime),
            mtime: conv(mtime),
            ctime_ns: ctime.map(ns),
            via_handle: fh.is_some(),
        };
        let a = tri_ino!(reply, self.vfs.setattr(&self.ctx(req), ino.0, &sa));
        reply.attr(&self.opts.attr_ttl, &file_attr(ino.0, &a));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let t = tri_ino!(reply, self.vfs.meta().readlink(ino.0));
        reply.data(&t);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let n = name!(reply, name);
        let (ino, a) = tri_names!(
            self,
            reply,
            self.vfs
                .meta()
                .mknod(&self.ctx(req), parent.0, n, mode, umask, rdev),
            &[(parent.0, n)]
        );
        self.entry(reply, ino, &a);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let n = name!(reply, name);
        let (ino, a) = tri_names!(
            self,
            reply,
            self.vfs
                .meta()
                .mkdir(&self.ctx(req), parent.0, n, mode, umask),
            &[(parent.0, n)]
        );
        self.entry(reply, ino, &a);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let n = name!(reply, name);
        tri_names!(
            self,
            reply,
            self.vfs.meta().unlink(&self.ctx(req), parent.0, n),
            &[(parent.0, n)]
        );
        reply.ok();
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let n = name!(reply, name);
        tri_names!(
            self,
            reply,
            self.vfs.meta().rmdir(&self.ctx(req), parent.0, n),
            &[(parent.0, n)]
        );
        reply.ok();
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let n = name!(reply, link_name);
        let (ino, a) = tri_names!(
            self,
            reply,
            self.vfs
                .meta()
                .symlink(&self.ctx(req), parent.0, n, target.as_os_str().as_bytes()),
            &[(parent.0, n)]
        );
        self.entry(reply, ino, &a);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let n = name!(reply, name);
        let nn = name!(reply, newname);
        tri_names!(
            self,
            reply,
            self.vfs
                .meta()
                .rename(&self.ctx(req), parent.0, n, newparent.0, nn, flags.bits()),
            &[(parent.0, n), (newparent.0, nn)]
        );
        reply.ok();
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let n = name!(reply, newname);
        let a = tri_names!(
            self,
            reply,
            self.vfs.meta().link(&self.ctx(req), ino.0, newparent.0, n),
            &[(newparent.0, n)]
        );
        self.entry(reply, ino.0, &a);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let o = tri_ino!(reply, self.vfs.open(&self.ctx(req), ino.0, flags.0));
        if o.changed {
            if let Some(n) = self.notifier.get() {
                // offset -1: attributes only; the page cache is dropped by the open itself
                // unless it holds the file's bytes now (FOPEN_KEEP_CACHE)
                if let Err(e) = n.inval_inode(ino, -1, 0) {
                    tracing::debug!("invalidate the attributes of inode {}: {e}", ino.0);
                }
            }
        }
        let flags = if o.keep_cache {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        reply.opened(FileHandle(o.fh), flags);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let data = tri_ino!(reply, self.vfs.read(fh.0, ino.0, offset, size));
        reply.data(&data);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let n = tri!(reply, self.vfs.write(ino.0, offset, data));
        reply.written(n);
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) releases the POSIX locks the closing process holds on the file
        let res = self.vfs.flush_handle(fh.0, ino.0);
        if self.locked.lock().contains(&ino.0) {
            tri!(
                reply,
                self.vfs.meta().release_posix_locks(ino.0, lock_owner.0)
            );
        }
        tri!(reply, res);
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        tri!(reply, self.vfs.release(fh.0));
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        tri!(reply, self.vfs.fsync(fh.0, ino.0));
        reply.ok();
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let fh = tri_ino!(reply, self.vfs.opendir(&self.ctx(req), ino.0));
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let list = tri!(
            reply,
            self.vfs.readdir(&self.ctx(req), fh.0, ino.0, offset, false)
        );
        for (i, (e, _)) in list.iter().enumerate().skip(offset as usize) {
            if reply.add(
                INodeNo(e.ino),
                i as u64 + 1,
                kind(e.kind),
                OsStr::from_bytes(&e.name),
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.vfs.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        tri!(reply, self.vfs.meta().sync());
        reply.ok();
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let mut s = tri!(reply, self.vfs.meta().statfs());
        let mut files = (1u64 << 40).max(s.inodes + 1);
        // under a directory quota, `df` shows the nearest quota (as JuiceFS does)
        let applied =
            self.vfs
                .meta()
                .getxattr(&self.ctx(req), ino.0, crate::meta::quota_xattr::APPLIED);
        if let Some((max_bytes, max_files, used_bytes, used_files)) = applied
            .ok()
            .and_then(|t| crate::meta::quota_xattr::parse(&t))
        {
            let used_bytes = used_bytes.max(0) as u64;
            let used_files = used_files.max(0) as u64;
            if max_bytes > 0 {
                s.total_bytes = max_bytes;
                s.used_bytes = used_bytes;
            }
            if max_files > 0 {
                files = max_files.max(used_files);
                s.inodes = used_files;
            }
        }
        let bsize = 4096u64;
        let blocks = s.total_bytes / bsize;
        let used = s.used_bytes.div_ceil(bsize);
        let free = blocks.saturating_sub(used);
        reply.statfs(
            blocks,
            free,
            free,
            files,
            files.saturating_sub(s.inodes),
            bsize as u32,
            NAME_LEN_MAX as u32,
            bsize as u32,
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        tri_ino!(
            reply,
            self.vfs
                .meta()
                .setxattr(&self.ctx(req), ino.0, name.as_bytes(), value, flags)
        );
        reply.ok();
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let v = tri_ino!(
            reply,
            self.vfs
                .meta()
                .getxattr(&self.ctx(req), ino.0, name.as_bytes())
        );
        if size == 0 {
            reply.size(v.len() as u32);
        } else if (size as usize) < v.len() {
            reply.error(Errno::from_i32(libc::ERANGE));
        } else {
            reply.data(&v);
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let names = tri_ino!(reply, self.vfs.meta().listxattr(&self.ctx(req), ino.0));
        let mut buf = vec![];
        for n in names {
            buf.extend_from_slice(&n);
            buf.push(0);
        }
        if size == 0 {
            reply.size(buf.len() as u32);
        } else if (size as usize) < buf.len() {
            reply.error(Errno::from_i32(libc::ERANGE));
        } else {
            reply.data(&buf);
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        tri_ino!(
            reply,
            self.vfs
                .meta()
                .removexattr(&self.ctx(req), ino.0, name.as_bytes())
        );
        reply.ok();
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        tri_ino!(
            reply,
            self.vfs
                .meta()
                .access(&self.ctx(req), ino.0, mask.bits() as u32 & 7)
        );
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let n = name!(reply, name);
        let (fh, ino, a) = tri_names!(
            self,
            reply,
            self.vfs.create(&self.ctx(req), parent.0, n, mode, umask),
            &[(parent.0, n)]
        );
        reply.created(
            &self.opts.entry_ttl,
            &file_attr(ino, &a),
            Generation(0),
            FileHandle(fh),
            FopenFlags::empty(),
        );
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let Some(t) = LockType::from_libc(typ) else {
            reply.error(Errno::from_i32(libc::EINVAL));
            return;
        };
        match tri!(
            reply,
            self.vfs.meta().getlk(ino.0, lock_owner.0, t, start, end)
        ) {
            Some(l) => reply.locked(l.start, l.end, l.typ.to_libc(), l.pid),
            None => reply.locked(start, end, libc::F_UNLCK, pid),
        }
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let Some(t) = LockType::from_libc(typ) else {
            reply.error(Errno::from_i32(libc::EINVAL));
            return;
        };
        if t != LockType::Unlock {
            self.locked.lock().insert(ino.0);
        }
        let meta = self.vfs.meta();
        let mut wait = Duration::from_millis(1);
        loop {
            match meta.setlk(ino.0, lock_owner.0, pid, t, start, end) {
                Ok(()) if t == LockType::Unlock => return reply.ok(),
                Ok(()) => {
                    // as NFS does: taking a lock revalidates the file, so that a read under
                    // the lock sees every write committed before the lock was granted (the
                    // open's view may be older)
                    match self.vfs.lock_acquired(ino.0) {
                        Ok(true) => {
                            if let Some(n) = self.notifier.get() {
                                if let Err(e) = n.inval_inode(ino, 0, 0) {
                                    tracing::debug!("invalidate inode {}: {e}", ino.0);
                                }
                            }
                        }
                        Ok(false) => {}
                        Err(e) => tracing::debug!("revalidate inode {} after a lock: {e}", ino.0),
                    }
                    return reply.ok();
                }
                Err(Error::Sys(libc::EAGAIN)) if sleep => {
                    // F_SETLKW: wait, but give up with EINTR as soon as the caller is signalled
                    if signal_pending(req.pid()) {
                        return reply.error(Errno::from_i32(libc::EINTR));
                    }
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_millis(LOCK_POLL_MS_MAX));
                }
                Err(e) => return reply.error(errno(&e)),
            }
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::from_i32(libc::EOPNOTSUPP));
    }
}

/// Set how far ahead the kernel reads files of the FUSE mount at `mountpoint` (the
/// `read_ahead_kb` of its backing device, found in `/proc/self/mountinfo`, so no request
/// reaches the mount to find it). The FUSE default is 128 KiB, which makes every read request
/// 128 KiB; with more the kernel sends requests as large as the mount allows (1 MiB), several
/// at once. Only root may write it. Returns the device's sysfs path.
pub fn set_read_ahead(mountpoint: &std::path::Path, bytes: u64) -> std::io::Result<String> {
    let want = mountpoint
        .canonicalize()
        .unwrap_or_else(|_| mountpoint.to_path_buf());
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    // "id parent major:minor root mountpoint ..."; the newest mount at the point is last
    let dev = table
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let point = f.get(4)?.replace("\\040", " ");
            (std::path::Path::new(&point) == want).then(|| f.get(2).map(|d| d.to_string()))?
        })
        .next_back()
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{} is not in the mount table", want.display()),
            )
        })?;
    let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    std::fs::write(&path, (bytes / 1024).max(4).to_string())
        .map_err(|e| std::io::Error::new(e.kind(), format!("write {path}: {e}")))?;
    Ok(path)
}

/// Mount options for a strait mount.
pub fn mount_config(fsname: &str, read_only: bool, threads: usize) -> fuser::Config {
    let mut c = fuser::Config::default();
    c.mount_options = vec![
        fuser::MountOption::FSName(format!("strait:{fsname}")),
        fuser::MountOption::Subtype("strait".into()),
        if read_only {
            fuser::MountOption::RO
        } else {
            fuser::MountOption::RW
        },
    ];
    c.acl = fuser::SessionACL::All;
    c.n_threads = Some(threads.max(1));
    c.clone_fd = true;
    c
}
