//! A FUSE layer that loses what was not synced, for the `power-loss` nemesis (after LazyFS,
//! Ramos et al., 2023): a directory of the machine's disk mounted again, through this process,
//! where a daemon keeps its data.
//!
//! Every call passes through to the directory underneath, and every change of a file's bytes
//! (a write, a truncate, a `fallocate` that grows it) first keeps what it replaces: the old
//! bytes, and the file's length before its first change since it was last synced. `fsync` and
//! `fdatasync` of a file forget what was kept for it: from then on its bytes are on "stable
//! storage". [`LazyFs::power_loss`], called once the daemon above is dead, puts every file
//! back as it was at its last sync: the kept bytes written back in reverse order, the length
//! cut back. So a power loss loses, as a real one may, every byte written since the last
//! sync of its file. An fsync of the layer's root directory counts as a sync of every file:
//! it stands for the `syncfs(2)` that FUSE does not pass on (see `fsyncdir`).
//!
//! Hard links pass through (a `file://` store's put that must not replace an object links a
//! temporary file to its key).
//!
//! What it does not model: names. Creating, renaming and removing files and directories is
//! kept at once, as if the directory were synced after each (a real file system may lose a
//! rename not followed by an `fsync` of its directory; RocksDB syncs the directory where it
//! must). Nor torn writes within one call, nor reordering between files. The kernel keeps
//! nothing: files are opened with `direct_io` and entries and attributes have no time to
//! live, so after a power loss the daemon started again reads what the directory holds.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

/// No time to live: the kernel asks again for every entry and attribute.
const TTL: Duration = Duration::ZERO;

/// What a file had at its last sync: its length, and the bytes changed since, oldest first.
#[derive(Default)]
struct Unsynced {
    len: u64,
    /// (offset, the bytes there before a change), in the order of the changes.
    before: Vec<(u64, Vec<u8>)>,
}

#[derive(Default)]
struct Inner {
    /// Inode number (the directory's own, the root's 1) to its path underneath.
    paths: HashMap<u64, PathBuf>,
    /// Open handles: inode and file.
    handles: HashMap<u64, (u64, Arc<File>)>,
    next_fh: u64,
    /// By inode: what a power loss puts back.
    unsynced: HashMap<u64, Unsynced>,
}

/// What one power loss undid.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Lost {
    pub files: u64,
    /// Bytes written back, and bytes cut from the ends of files.
    pub bytes_restored: u64,
    pub bytes_cut: u64,
}

struct Layer {
    root: PathBuf,
    inner: Arc<Mutex<Inner>>,
}

/// A directory mounted through the layer; unmounted when dropped.
pub struct LazyFs {
    point: PathBuf,
    inner: Arc<Mutex<Inner>>,
    session: Option<fuser::BackgroundSession>,
}

impl LazyFs {
    /// Mount `backing` (created) at `point` (created) through the layer.
    pub fn mount(backing: &Path, point: &Path) -> Result<LazyFs> {
        std::fs::create_dir_all(backing)
            .with_context(|| format!("create {}", backing.display()))?;
        std::fs::create_dir_all(point).with_context(|| format!("create {}", point.display()))?;
        let inner = Arc::new(Mutex::new(Inner {
            next_fh: 1,
            ..Inner::default()
        }));
        inner.lock().paths.insert(1, backing.to_path_buf());
        let layer = Layer {
            root: backing.to_path_buf(),
            inner: inner.clone(),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("chaos-lazyfs".into()),
            fuser::MountOption::RW,
        ];
        config.n_threads = Some(4);
        let session = fuser::Session::new(layer, point, &config)
            .with_context(|| format!("mount the power-loss layer at {}", point.display()))?
            .spawn()
            .context("serve the power-loss layer")?;
        crate::interrupt::detach_on_signal(point);
        Ok(LazyFs {
            point: point.to_path_buf(),
            inner,
            session: Some(session),
        })
    }

    /// Where it is mounted.
    pub fn point(&self) -> &Path {
        &self.point
    }

    /// Put every file back as it was at its last sync. Call it only once nothing uses the
    /// files (the daemon above is dead).
    pub fn power_loss(&self) -> Result<Lost> {
        let mut inner = self.inner.lock();
        let unsynced = std::mem::take(&mut inner.unsynced);
        let mut lost = Lost::default();
        for (ino, u) in unsynced {
            let Some(path) = inner.paths.get(&ino) else {
                continue; // removed since: nothing to put back
            };
            let f = match std::fs::OpenOptions::new().write(true).open(path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e).with_context(|| format!("open {}", path.display())),
            };
            for (off, bytes) in u.before.iter().rev() {
                f.write_all_at(bytes, *off)
                    .with_context(|| format!("put back {}", path.display()))?;
                lost.bytes_restored += bytes.len() as u64;
            }
            let now = f.metadata()?.len();
            lost.bytes_cut += now.saturating_sub(u.len);
            f.set_len(u.len)
                .with_context(|| format!("cut {} back", path.display()))?;
            lost.files += 1;
        }
        Ok(lost)
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            if s.umount_and_join().is_err() {
                let _ = strait_devkit::cluster::detach(&self.point);
            }
        }
        crate::interrupt::forget(&self.point);
    }
}

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

macro_rules! tri {
    ($reply:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => {
                $reply.error(io_errno(&e));
                return;
            }
        }
    };
}

fn kind_of(m: &std::fs::Metadata) -> FileType {
    let t = m.file_type();
    if t.is_dir() {
        FileType::Directory
    } else if t.is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    }
}

fn time(s: i64, ns: i64) -> SystemTime {
    if s >= 0 {
        UNIX_EPOCH + Duration::new(s as u64, ns as u32)
    } else {
        UNIX_EPOCH
    }
}

fn not_found() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::ENOENT)
}

fn cpath(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

impl Layer {
    fn attr(&self, ino: u64, m: &std::fs::Metadata) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size: m.len(),
            blocks: m.blocks(),
            atime: time(m.atime(), m.atime_nsec()),
            mtime: time(m.mtime(), m.mtime_nsec()),
            ctime: time(m.ctime(), m.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind: kind_of(m),
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
            blksize: 4096,
            flags: 0,
        }
    }

    /// The inode number the layer shows for `path` with metadata `m`.
    fn ino_of(&self, path: &Path, m: &std::fs::Metadata) -> u64 {
        if path == self.root {
            1
        } else {
            m.ino()
        }
    }

    fn path(&self, ino: u64) -> std::io::Result<PathBuf> {
        self.inner
            .lock()
            .paths
            .get(&ino)
            .cloned()
            .ok_or_else(not_found)
    }

    fn child(&self, parent: u64, name: &OsStr) -> std::io::Result<PathBuf> {
        Ok(self.path(parent)?.join(name))
    }

    /// Look `path` up and remember it.
    fn entry(&self, path: PathBuf) -> std::io::Result<FileAttr> {
        let m = std::fs::symlink_metadata(&path)?;
        let ino = self.ino_of(&path, &m);
        let a = self.attr(ino, &m);
        self.inner.lock().paths.insert(ino, path);
        Ok(a)
    }

    fn handle(&self, fh: u64) -> std::io::Result<(u64, Arc<File>)> {
        self.inner
            .lock()
            .handles
            .get(&fh)
            .cloned()
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EBADF))
    }

    fn new_handle(&self, ino: u64, f: File) -> u64 {
        let mut inner = self.inner.lock();
        let fh = inner.next_fh;
        inner.next_fh += 1;
        inner.handles.insert(fh, (ino, Arc::new(f)));
        fh
    }

    /// Before `f` (inode `ino`) changes in `[off, off + len)`: keep the bytes there, and the
    /// length at the last sync.
    fn keep(&self, ino: u64, f: &File, off: u64, len: u64) -> std::io::Result<()> {
        let size = f.metadata()?.len();
        let mut old = vec![];
        if off < size && len > 0 {
            let n = len.min(size - off) as usize;
            old = vec![0u8; n];
            f.read_exact_at(&mut old, off)?;
        }
        let mut inner = self.inner.lock();
        let u = inner.unsynced.entry(ino).or_insert_with(|| Unsynced {
            len: size,
            before: vec![],
        });
        if !old.is_empty() {
            u.before.push((off, old));
        }
        Ok(())
    }

    /// Cut or extend the file at `path` to `size`, keeping what it loses.
    fn truncate(&self, ino: u64, path: &Path, size: u64) -> std::io::Result<()> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let len = f.metadata()?.len();
        self.keep(ino, &f, size, len.saturating_sub(size))?;
        f.set_len(size)
    }

    /// A name is gone from the directory: if it was the file's last, nothing of it is put
    /// back. (A file with other names keeps the one remembered: a link remembers the new name,
    /// see `link`.)
    fn forget_if_last(&self, m: &std::fs::Metadata, path: &Path) {
        if m.is_dir() || m.nlink() <= 1 {
            let ino = self.ino_of(path, m);
            let mut inner = self.inner.lock();
            inner.unsynced.remove(&ino);
            inner.paths.remove(&ino);
        }
    }

    /// `from` was renamed to `to`: every remembered path under `from` moves.
    fn moved(&self, from: &Path, to: &Path) {
        let mut inner = self.inner.lock();
        for p in inner.paths.values_mut() {
            if let Ok(rest) = p.strip_prefix(from) {
                *p = if rest.as_os_str().is_empty() {
                    to.to_path_buf()
                } else {
                    to.join(rest)
                };
            }
        }
    }

    fn open_file(&self, path: &Path, flags: i32, create: Option<u32>) -> std::io::Result<File> {
        let acc = flags & libc::O_ACCMODE;
        let mut o = std::fs::OpenOptions::new();
        o.read(acc == libc::O_RDONLY || acc == libc::O_RDWR)
            .write(acc == libc::O_WRONLY || acc == libc::O_RDWR);
        // the kernel gives every write its offset: O_APPEND would make pwrite ignore it;
        // O_TRUNC is done by hand, to keep what it cuts
        let keep = flags & !(libc::O_ACCMODE | libc::O_APPEND | libc::O_TRUNC | libc::O_CREAT);
        let keep = keep & !(libc::O_EXCL | libc::O_DIRECT);
        o.custom_flags(keep);
        if let Some(mode) = create {
            o.create(true).mode(mode);
            if flags & libc::O_EXCL != 0 {
                o.create_new(true);
            }
            if acc == libc::O_RDONLY {
                o.write(true);
            }
        }
        o.open(path)
    }
}

impl Filesystem for Layer {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let p = tri!(reply, self.child(parent.0, name));
        let a = tri!(reply, self.entry(p));
        reply.entry(&TTL, &a, Generation(0));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        if let Some(fh) = fh {
            if let Ok((_, f)) = self.handle(fh.0) {
                let m = tri!(reply, f.metadata());
                return reply.attr(&TTL, &self.attr(ino.0, &m));
            }
        }
        let p = tri!(reply, self.path(ino.0));
        let m = tri!(reply, std::fs::symlink_metadata(&p));
        reply.attr(&TTL, &self.attr(ino.0, &m));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let p = tri!(reply, self.path(ino.0));
        if let Some(size) = size {
            tri!(reply, self.truncate(ino.0, &p, size));
        }
        if let Some(mode) = mode {
            use std::os::unix::fs::PermissionsExt;
            tri!(
                reply,
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
            );
        }
        if uid.is_some() || gid.is_some() {
            tri!(reply, std::os::unix::fs::lchown(&p, uid, gid));
        }
        if atime.is_some() || mtime.is_some() {
            let ts = |t: Option<TimeOrNow>| match t {
                None => libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_OMIT,
                },
                Some(TimeOrNow::Now) => libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_NOW,
                },
                Some(TimeOrNow::SpecificTime(t)) => {
                    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
                    libc::timespec {
                        tv_sec: d.as_secs() as libc::time_t,
                        tv_nsec: d.subsec_nanos() as libc::c_long,
                    }
                }
            };
            let c = tri!(reply, cpath(&p));
            let times = [ts(atime), ts(mtime)];
            // SAFETY: c is a valid C string and times an array of two timespecs
            let r = unsafe {
                libc::utimensat(
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    times.as_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if r != 0 {
                return reply.error(io_errno(&std::io::Error::last_os_error()));
            }
        }
        let m = tri!(reply, std::fs::symlink_metadata(&p));
        reply.attr(&TTL, &self.attr(ino.0, &m));
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        use std::os::unix::fs::DirBuilderExt;
        let p = tri!(reply, self.child(parent.0, name));
        tri!(
            reply,
            std::fs::DirBuilder::new().mode(mode & !umask).create(&p)
        );
        let a = tri!(reply, self.entry(p));
        reply.entry(&TTL, &a, Generation(0));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let p = tri!(reply, self.child(parent.0, name));
        let m = tri!(reply, std::fs::symlink_metadata(&p));
        tri!(reply, std::fs::remove_file(&p));
        self.forget_if_last(&m, &p);
        reply.ok();
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let p = tri!(reply, self.child(parent.0, name));
        let m = tri!(reply, std::fs::symlink_metadata(&p));
        tri!(reply, std::fs::remove_dir(&p));
        self.forget_if_last(&m, &p);
        reply.ok();
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let from = tri!(reply, self.child(parent.0, name));
        let to = tri!(reply, self.child(newparent.0, newname));
        let replaced = std::fs::symlink_metadata(&to).ok();
        let (cf, ct) = (tri!(reply, cpath(&from)), tri!(reply, cpath(&to)));
        // SAFETY: both are valid C strings
        let r = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                cf.as_ptr(),
                libc::AT_FDCWD,
                ct.as_ptr(),
                flags.bits(),
            )
        };
        if r != 0 {
            return reply.error(io_errno(&std::io::Error::last_os_error()));
        }
        if flags.bits() & libc::RENAME_EXCHANGE != 0 {
            // swap the two: through a name neither has
            let tmp = from.with_extension("chaos-lazyfs-swap");
            self.moved(&to, &tmp);
            self.moved(&from, &to);
            self.moved(&tmp, &from);
        } else {
            if let Some(m) = replaced {
                self.forget_if_last(&m, &to);
            }
            self.moved(&from, &to);
        }
        reply.ok();
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let from = tri!(reply, self.path(ino.0));
        let to = tri!(reply, self.child(newparent.0, newname));
        tri!(reply, std::fs::hard_link(&from, &to));
        let m = tri!(reply, std::fs::symlink_metadata(&to));
        // the file is known by its newest name: a `file://` store links a temporary file to
        // its key and removes the temporary name
        self.inner.lock().paths.insert(ino.0, to);
        reply.entry(&TTL, &self.attr(ino.0, &m), Generation(0));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let p = tri!(reply, self.path(ino.0));
        if flags.0 & libc::O_TRUNC != 0 {
            tri!(reply, self.truncate(ino.0, &p, 0));
        }
        let f = tri!(reply, self.open_file(&p, flags.0, None));
        let fh = self.new_handle(ino.0, f);
        reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let p = tri!(reply, self.child(parent.0, name));
        let existed = std::fs::symlink_metadata(&p).ok();
        let f = tri!(reply, self.open_file(&p, flags, Some(mode & !umask)));
        let m = tri!(reply, f.metadata());
        let ino = self.ino_of(&p, &m);
        self.inner.lock().paths.insert(ino, p.clone());
        if existed.is_some() && flags & libc::O_TRUNC != 0 {
            tri!(reply, self.truncate(ino, &p, 0));
        }
        let m = tri!(reply, f.metadata());
        let a = self.attr(ino, &m);
        let fh = self.new_handle(ino, f);
        reply.created(
            &TTL,
            &a,
            Generation(0),
            FileHandle(fh),
            FopenFlags::FOPEN_DIRECT_IO,
        );
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let (_, f) = tri!(reply, self.handle(fh.0));
        let mut buf = vec![0u8; size as usize];
        let mut n = 0;
        while n < buf.len() {
            match f.read_at(&mut buf[n..], offset + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return reply.error(io_errno(&e)),
            }
        }
        reply.data(&buf[..n]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let (ino, f) = tri!(reply, self.handle(fh.0));
        tri!(reply, self.keep(ino, &f, offset, data.len() as u64));
        tri!(reply, f.write_all_at(data, offset));
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.inner.lock().handles.remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // on stable storage from now on (the directory underneath is not synced: only a
        // power loss of this layer is modelled, not one of the machine)
        self.inner.lock().unsynced.remove(&ino.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        tri!(reply, self.path(ino.0));
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let p = tri!(reply, self.path(ino.0));
        let rd = tri!(reply, std::fs::read_dir(&p));
        let mut entries: Vec<(u64, FileType, std::ffi::OsString)> = vec![
            (ino.0, FileType::Directory, ".".into()),
            (ino.0, FileType::Directory, "..".into()),
        ];
        for e in rd {
            let e = tri!(reply, e);
            let Ok(m) = e.metadata() else { continue };
            entries.push((m.ino(), kind_of(&m), e.file_name()));
        }
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // syncfs(2) does not reach a file system in user space (the kernel sends FUSE_SYNCFS
        // only to virtiofs); a sync of the whole file system (a `file://` object store's
        // `sync`) follows its syncfs with an fsync of its root directory, which this layer
        // takes for the syncfs it stands for: every file is on stable storage from now on
        if ino.0 == 1 {
            self.inner.lock().unsynced.clear();
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = match nix::sys::statvfs::statvfs(&self.root) {
            Ok(s) => s,
            Err(e) => return reply.error(Errno::from_i32(e as i32)),
        };
        reply.statfs(
            s.blocks() as u64,
            s.blocks_free() as u64,
            s.blocks_available() as u64,
            s.files() as u64,
            s.files_free() as u64,
            s.block_size() as u32,
            s.name_max() as u32,
            s.fragment_size() as u32,
        );
    }

    // no extended attributes (the daemons use none): ENOSYS tells the kernel not to ask again
    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        reply.error(Errno::from_i32(libc::ENOSYS));
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: fuser::ReplyXattr) {
        reply.error(Errno::from_i32(libc::ENOSYS));
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // the daemons run as root: existence is all there is to check
        match self.path(ino.0) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(io_errno(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // RocksDB preallocates its files (FALLOC_FL_KEEP_SIZE); a mode that changes bytes
        // (punching or zeroing a range) is not modelled
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        let (ino, f) = tri!(reply, self.handle(fh.0));
        tri!(reply, self.keep(ino, &f, offset, 0));
        // SAFETY: the descriptor is open for the call's duration
        let r = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                mode,
                offset as libc::off_t,
                length as libc::off_t,
            )
        };
        if r != 0 {
            return reply.error(io_errno(&std::io::Error::last_os_error()));
        }
        reply.ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Root only (FUSE); skipped elsewhere, and fails under CI=true without /dev/fuse.
    fn can_mount() -> bool {
        // SAFETY: geteuid has no preconditions
        let root = unsafe { libc::geteuid() } == 0;
        let fuse = Path::new("/dev/fuse").exists();
        if std::env::var_os("CI").is_some() {
            assert!(
                root && fuse,
                "CI=true: the power-loss layer's test needs root and /dev/fuse"
            );
        }
        root && fuse
    }

    #[test]
    fn a_power_loss_keeps_what_was_synced_and_loses_the_rest() {
        if !can_mount() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let fs = LazyFs::mount(&dir.path().join("backing"), &dir.path().join("point")).unwrap();
        let p = fs.point().join("wal");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        use std::io::Write;
        f.write_all(b"synced.").unwrap();
        f.sync_all().unwrap();
        f.write_all(b"lost").unwrap();
        f.write_all_at(b"S", 0).unwrap();
        // a file made and written, never synced: kept, empty
        std::fs::write(fs.point().join("new"), b"never synced").unwrap();
        // renamed after a sync: its synced bytes stay under the new name
        let mut g = File::create(fs.point().join("a")).unwrap();
        g.write_all(b"kept").unwrap();
        g.sync_data().unwrap();
        g.write_all(b" and lost").unwrap();
        std::fs::rename(fs.point().join("a"), fs.point().join("b")).unwrap();
        // truncated: the cut bytes come back
        let h = File::create(fs.point().join("cut")).unwrap();
        h.write_all_at(b"0123456789", 0).unwrap();
        h.sync_all().unwrap();
        h.set_len(3).unwrap();
        drop((f, g, h));
        assert_eq!(std::fs::read(&p).unwrap(), b"Synced.lost");
        let lost = fs.power_loss().unwrap();
        assert_eq!(lost.files, 4, "{lost:?}");
        assert_eq!(std::fs::read(&p).unwrap(), b"synced.");
        assert_eq!(std::fs::read(fs.point().join("new")).unwrap(), b"");
        assert_eq!(std::fs::read(fs.point().join("b")).unwrap(), b"kept");
        assert_eq!(
            std::fs::read(fs.point().join("cut")).unwrap(),
            b"0123456789"
        );
        // nothing left to lose
        assert_eq!(fs.power_loss().unwrap(), Lost::default());
        // the directory underneath holds the same
        assert_eq!(
            std::fs::read(dir.path().join("backing/wal")).unwrap(),
            b"synced."
        );
    }

    /// A `file://` store's put and its sync through the layer: a file linked to its key and
    /// its temporary name removed reads under the key; an fsync of the root directory (the
    /// store's sync, after its syncfs) keeps every file; what was written after it is lost.
    #[test]
    fn a_hard_link_passes_through_and_a_sync_of_the_root_keeps_everything() {
        if !can_mount() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let fs = LazyFs::mount(&dir.path().join("backing"), &dir.path().join("point")).unwrap();
        let (tmp, key) = (fs.point().join(".tmp"), fs.point().join("block"));
        std::fs::write(&tmp, b"block bytes").unwrap();
        std::fs::hard_link(&tmp, &key).unwrap();
        std::fs::remove_file(&tmp).unwrap();
        assert_eq!(std::fs::read(&key).unwrap(), b"block bytes");
        std::fs::write(fs.point().join("other"), b"also written").unwrap();
        File::open(fs.point()).unwrap().sync_all().unwrap();
        std::fs::write(fs.point().join("late"), b"after the sync").unwrap();
        let lost = fs.power_loss().unwrap();
        assert_eq!(lost.files, 1, "{lost:?}");
        assert_eq!(std::fs::read(&key).unwrap(), b"block bytes");
        assert_eq!(
            std::fs::read(fs.point().join("other")).unwrap(),
            b"also written"
        );
        assert_eq!(std::fs::read(fs.point().join("late")).unwrap(), b"");
    }
}
