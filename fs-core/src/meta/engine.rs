//! [`Meta`]: the metadata API over any [`KvEngine`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::committed::Committed;
use super::keys;
use super::locks;
use super::perm::{access, sticky_ok, MAY_EXEC, MAY_READ, MAY_WRITE};
use super::types::*;
use crate::changelog::{
    self, commit, decode, encode, get_attr, get_chunk, get_dentry, Change, DeadSlice, Name,
    Replaced, Unlinked,
};
use crate::error::{sys, Error, Result};
use crate::kv::{self, DynKv, KvTxn};
use crate::layout::CHUNK_SIZE;

/// How many inode numbers / slice ids a client takes from the shared counter at once.
const INODE_BATCH: i64 = 100;
const SLICE_BATCH: i64 = 1000;
/// Most entries a directory listing returns in one call of the KV scan.
const READDIR_PAGE: usize = 4096;
/// Deepest directory nesting walked when checking a rename.
const PARENT_CHAIN_MAX: usize = 1 << 20;

#[derive(Clone, Debug, Default)]
pub struct MetaOptions {
    pub read_only: bool,
    /// With `read_only`: this engine's mutations are made elsewhere (a mirror forwards them
    /// to the primary), so opening for writing and access(W_OK) are allowed; the mutations
    /// themselves still answer EROFS here.
    pub writes_elsewhere: bool,
}

/// Handles open on each inode, per session. The views of one daemon's sessions share one
/// table, so a file unlinked at one mount stays alive while another mount holds it open.
type OpenTable = Arc<Mutex<HashMap<Ino, HashMap<u64, u32>>>>;

pub struct Meta {
    kv: DynKv,
    format: Format,
    read_only: bool,
    writes_elsewhere: bool,
    sid: AtomicU64,
    inodes: Mutex<(u64, u64)>,
    slices: Mutex<(u64, u64)>,
    /// Handles open on each inode, by session.
    open_files: OpenTable,
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return sys(libc::EINVAL);
    }
    if name.len() > NAME_LEN_MAX {
        return sys(libc::ENAMETOOLONG);
    }
    Ok(())
}

/// Refuse a slice reference that could not have been written: out of its chunk, beyond its
/// object, or with a checksum list that does not match its blocks. A client is never trusted
/// with this: a bad reference would make readers fail or read past an object.
fn check_slice(s: &SliceRef, block_size: u32) -> Result<()> {
    let inside_chunk = s.pos as u64 + s.len as u64 <= CHUNK_SIZE;
    let ok = if s.id == 0 {
        s.crcs.is_empty() && inside_chunk
    } else {
        inside_chunk
            && s.size as u64 <= CHUNK_SIZE
            && s.off as u64 + s.len as u64 <= s.size as u64
            && s.crcs.len() as u64 == crate::layout::block_count(s.size, block_size) as u64
    };
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "slice {} (size {}, off {}, len {}, pos {}, {} checksums) does not fit its chunk or its blocks",
            s.id,
            s.size,
            s.off,
            s.len,
            s.pos,
            s.crcs.len()
        )))
    }
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

fn need_attr(t: &mut dyn KvTxn, ino: Ino) -> Result<Attr> {
    get_attr(t, ino)?.ok_or(Error::Sys(libc::ENOENT))
}

fn need_dir_attr(t: &mut dyn KvTxn, ino: Ino) -> Result<Attr> {
    let a = need_attr(t, ino)?;
    if !a.is_dir() {
        return sys(libc::ENOTDIR);
    }
    Ok(a)
}

fn touch_dir(a: &mut Attr, now: i64) {
    a.mtime_ns = now;
    a.ctime_ns = now;
}

/// Whether directory `dir` is `ancestor` or lies below it.
fn is_ancestor(t: &mut dyn KvTxn, ancestor: Ino, dir: Ino) -> Result<bool> {
    let mut cur = dir;
    // a parent chain longer than this is corrupt (a loop)
    for _ in 0..PARENT_CHAIN_MAX {
        if cur == ancestor {
            return Ok(true);
        }
        if cur == ROOT_INO {
            return Ok(false);
        }
        cur = need_attr(t, cur)?.parent;
    }
    Err(Error::corrupt(format!(
        "the parents of directory {dir} form a loop"
    )))
}

fn dir_is_empty(t: &mut dyn KvTxn, ino: Ino) -> Result<bool> {
    Ok(t.scan(&keys::group(keys::DENTRY, ino), None, 1)?.is_empty())
}

impl Meta {
    /// Write a new file system's settings and root directory into an empty engine.
    pub fn format(kv: &DynKv, format: Format) -> Result<()> {
        let now = now_ns();
        let root = Attr {
            kind: FileKind::Dir,
            perm: 0o777,
            uid: 0,
            gid: 0,
            nlink: 2,
            length: 4096,
            rdev: 0,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            parent: ROOT_INO,
        };
        kv::txn(kv.as_ref(), |t| {
            if let Some(b) = t.get(&keys::setting(keys::FORMAT))? {
                let existing: Format = decode(&b)?;
                return Err(Error::Invalid(format!(
                    "this metadata engine already holds file system {:?} (uuid {}); refusing to format it again",
                    existing.name, existing.uuid
                )));
            }
            commit(
                t,
                Change::Format {
                    format: format.clone(),
                    root: root.clone(),
                },
                now,
            )
        })?;
        kv.sync()
    }

    /// The settings of the file system in `kv`, or an error if it was never formatted.
    pub fn load_format(kv: &dyn kv::KvEngine) -> Result<Format> {
        kv::read(kv, |t| match t.get(&keys::setting(keys::FORMAT))? {
            Some(b) => decode(&b),
            None => Err(Error::Invalid(format!(
                "the {} metadata engine holds no strait file system: run `strait format` first",
                kv.name()
            ))),
        })
    }

    pub fn open(kv: DynKv, opts: MetaOptions) -> Result<Arc<Self>> {
        let format = Self::load_format(kv.as_ref())?;
        Ok(Arc::new(Meta {
            kv,
            format,
            read_only: opts.read_only,
            writes_elsewhere: opts.writes_elsewhere,
            sid: AtomicU64::new(0),
            inodes: Mutex::new((0, 0)),
            slices: Mutex::new((0, 0)),
            open_files: Arc::new(Mutex::new(HashMap::new())),
        }))
    }

    /// A view of this engine for session `sid` (a mount served by a daemon): it shares the
    /// engine and the table of open handles with every other view, and has its own session id
    /// and id ranges.
    pub fn session_view(&self, sid: u64) -> Arc<Meta> {
        Arc::new(Meta {
            kv: self.kv.clone(),
            format: self.format.clone(),
            read_only: self.read_only,
            writes_elsewhere: self.writes_elsewhere,
            sid: AtomicU64::new(sid),
            inodes: Mutex::new((0, 0)),
            slices: Mutex::new((0, 0)),
            open_files: self.open_files.clone(),
        })
    }

    /// Set this session's open handle counts, as a client reports them when it takes its
    /// session up again after the daemon restarted.
    pub fn restore_open_handles(&self, handles: &[(Ino, u32)]) {
        let sid = self.session_id();
        let mut of = self.open_files.lock();
        for &(ino, n) in handles {
            if n > 0 {
                of.entry(ino).or_default().insert(sid, n);
            }
        }
    }

    /// Take `count` ids (at least 1) from the shared slice counter: `[first, first + count)`.
    pub fn alloc_slice_ids(&self, count: u32) -> Result<u64> {
        let count = count.max(1) as i64;
        let end = self.kv.incr(&keys::counter(keys::NEXT_SLICE), count)? as u64;
        // slice id 0 means a hole; ids at or below the root's inode number are never used
        let first = end + 1 - count as u64;
        if first <= ROOT_INO {
            return self.alloc_slice_ids(count as u32);
        }
        Ok(first)
    }

    pub fn kv(&self) -> &DynKv {
        &self.kv
    }
    pub fn settings(&self) -> &Format {
        &self.format
    }
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }
    /// Whether this read-only engine's mutations are made elsewhere (see [`MetaOptions`]).
    pub fn writes_elsewhere(&self) -> bool {
        self.writes_elsewhere
    }
    pub fn session_id(&self) -> u64 {
        self.sid.load(Ordering::Relaxed)
    }

    fn writable(&self) -> Result<()> {
        if self.read_only {
            sys(libc::EROFS)
        } else {
            Ok(())
        }
    }

    fn alloc(&self, which: &Mutex<(u64, u64)>, counter: &str, batch: i64) -> Result<u64> {
        let mut r = which.lock();
        loop {
            if r.0 < r.1 {
                let id = r.0;
                r.0 += 1;
                return Ok(id);
            }
            let end = self.kv.incr(&keys::counter(counter), batch)? as u64;
            *r = (end - batch as u64 + 1, end + 1);
            // inode numbers up to the root's are reserved; slice id 0 means a hole
            if r.0 <= ROOT_INO {
                r.0 = ROOT_INO + 1;
            }
        }
    }

    pub fn next_inode(&self) -> Result<Ino> {
        self.alloc(&self.inodes, keys::NEXT_INODE, INODE_BATCH)
    }

    pub fn next_slice_id(&self) -> Result<u64> {
        self.alloc(&self.slices, keys::NEXT_SLICE, SLICE_BATCH)
    }

    // ---- sessions -------------------------------------------------------------------------

    /// Register this client as a session. Sessions and locks are region-local runtime state:
    /// they are not file system content and are not written to the change log.
    pub fn new_session(&self, info: &str) -> Result<u64> {
        let sid = self.kv.incr(&keys::counter(keys::NEXT_SESSION), 1)? as u64;
        let value = encode(&(now_ns(), info.to_string()))?;
        kv::txn(self.kv.as_ref(), |t| {
            t.put(&keys::session(sid), &value);
            Ok(())
        })?;
        self.sid.store(sid, Ordering::Relaxed);
        Ok(sid)
    }

    pub fn heartbeat(&self) -> Result<()> {
        let sid = self.session_id();
        if sid == 0 {
            return Ok(());
        }
        kv::txn(self.kv.as_ref(), |t| {
            let info = match t.get(&keys::session(sid))? {
                Some(b) => decode::<(i64, String)>(&b)?.1,
                None => String::new(),
            };
            t.put(&keys::session(sid), &encode(&(now_ns(), info))?);
            Ok(())
        })?;
        Ok(())
    }

    /// All sessions with their last heartbeat (ns) and description.
    pub fn sessions(&self) -> Result<Vec<(u64, i64, String)>> {
        kv::read(self.kv.as_ref(), |t| {
            let mut out = vec![];
            for (k, v) in t.scan(&keys::group(keys::SESSION, 0), None, usize::MAX)? {
                let sid = keys::u64_at(&k, 9).ok_or_else(|| Error::corrupt("session key"))?;
                let (hb, info): (i64, String) = decode(&v)?;
                out.push((sid, hb, info));
            }
            Ok(out)
        })
    }

    /// Remove session `sid`: drop its handles, release its locks and delete the unlinked files
    /// that no live session holds open any more (those `sid` sustained, and those whose
    /// sustaining session is gone).
    pub fn close_session_versioned(&self, sid: u64) -> Result<Committed<()>> {
        {
            let mut of = self.open_files.lock();
            for by_session in of.values_mut() {
                by_session.remove(&sid);
            }
            of.retain(|_, by_session| !by_session.is_empty());
        }
        kv::txn(self.kv.as_ref(), |t| {
            t.delete(&keys::session(sid));
            Ok(())
        })?;
        let live: HashSet<u64> = self.sessions()?.into_iter().map(|s| s.0).collect();
        let sustained: Vec<Ino> = kv::read(self.kv.as_ref(), |t| {
            let mut v = vec![];
            for (k, val) in t.scan(&keys::group(keys::DELFILE, 0), None, usize::MAX)? {
                let owner = keys::u64_at(&val, 0).unwrap_or(0);
                if owner == sid || !live.contains(&owner) {
                    v.push(keys::u64_at(&k, 9).ok_or_else(|| Error::corrupt("delfile key"))?);
                }
            }
            Ok(v)
        })?;
        let mut version = None;
        for ino in sustained {
            if self.open_count(ino) == 0 {
                version = version.max(self.delete_unlinked(ino)?);
            }
        }
        self.release_session_locks(sid)?;
        Ok(Committed::new((), version))
    }

    /// Close every session whose heartbeat is older than `timeout_ns`; returns their ids.
    pub fn clean_stale_sessions(&self, timeout_ns: i64) -> Result<Vec<u64>> {
        let now = now_ns();
        let mut closed = vec![];
        for (sid, hb, _) in self.sessions()? {
            if sid != self.session_id() && now - hb > timeout_ns {
                self.close_session_versioned(sid)?;
                closed.push(sid);
            }
        }
        Ok(closed)
    }

    // ---- lookups --------------------------------------------------------------------------

    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        kv::read(self.kv.as_ref(), |t| need_attr(t, ino))
    }

    pub fn lookup(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<(Ino, Attr)> {
        if name.len() > NAME_LEN_MAX {
            return sys(libc::ENAMETOOLONG);
        }
        kv::read(self.kv.as_ref(), |t| {
            let pa = need_dir_attr(t, parent)?;
            access(&pa, ctx, MAY_EXEC)?;
            if name == b"." {
                return Ok((parent, pa));
            }
            if name == b".." {
                return Ok((pa.parent, need_attr(t, pa.parent)?));
            }
            check_name(name)?;
            let (ino, _) = get_dentry(t, parent, name)?.ok_or(Error::Sys(libc::ENOENT))?;
            let attr = get_attr(t, ino)?.ok_or_else(|| {
                Error::corrupt(format!(
                    "entry {parent}/{} points at missing inode {ino}",
                    String::from_utf8_lossy(name)
                ))
            })?;
            Ok((ino, attr))
        })
    }

    pub fn access(&self, ctx: &Ctx, ino: Ino, mask: u32) -> Result<()> {
        let a = self.getattr(ino)?;
        if mask & MAY_WRITE != 0 && self.read_only && !self.writes_elsewhere {
            return sys(libc::EROFS);
        }
        access(&a, ctx, mask)
    }

    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        kv::read(self.kv.as_ref(), |t| {
            let a = need_attr(t, ino)?;
            if a.kind != FileKind::Symlink {
                return sys(libc::EINVAL);
            }
            t.get(&keys::symlink(ino))?
                .ok_or_else(|| Error::corrupt(format!("symlink {ino} has no target")))
        })
    }

    /// Every entry of directory `ino` (without `.` and `..`), in name order.
    pub fn readdir(&self, ctx: &Ctx, ino: Ino) -> Result<Vec<DirEntry>> {
        kv::read(self.kv.as_ref(), |t| {
            let a = need_dir_attr(t, ino)?;
            access(&a, ctx, MAY_READ)?;
            let prefix = keys::group(keys::DENTRY, ino);
            let mut out = vec![];
            let mut after: Option<Vec<u8>> = None;
            loop {
                let page = t.scan(&prefix, after.as_deref(), READDIR_PAGE)?;
                let n = page.len();
                for (k, v) in page {
                    let (child, kind) = changelog::decode_dentry(&v)?;
                    out.push(DirEntry {
                        name: k[9..].to_vec(),
                        ino: child,
                        kind,
                    });
                    after = Some(k);
                }
                if n < READDIR_PAGE {
                    return Ok(out);
                }
            }
        })
    }

    pub fn statfs(&self) -> Result<StatFs> {
        let (used, inodes) = kv::read(self.kv.as_ref(), |t| {
            let used = kv::decode_counter(t.get(&keys::counter(keys::USED_SPACE))?)?;
            let inodes = kv::decode_counter(t.get(&keys::counter(keys::TOTAL_INODES))?)?;
            Ok((used, inodes))
        })?;
        let total = if self.format.capacity_bytes == 0 {
            1 << 50
        } else {
            self.format.capacity_bytes
        };
        Ok(StatFs {
            total_bytes: total,
            used_bytes: used.max(0) as u64,
            inodes: inodes.max(0) as u64,
            block_size: self.format.block_size,
        })
    }

    // ---- attribute changes -------------------------------------------------------------------

    pub fn setattr_versioned(&self, ctx: &Ctx, ino: Ino, req: &SetAttr) -> Result<Committed<Attr>> {
        self.writable()?;
        kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let old = need_attr(t, ino)?;
            let mut a = old.clone();
            let owner = ctx.uid == 0 || ctx.uid == old.uid;
            if let Some(uid) = req.uid {
                if ctx.uid != 0 && (uid != old.uid || ctx.uid != old.uid) {
                    return sys(libc::EPERM);
                }
                a.uid = uid;
            }
            if let Some(gid) = req.gid {
                if ctx.uid != 0 && (ctx.uid != old.uid || (gid != old.gid && !ctx.in_group(gid))) {
                    return sys(libc::EPERM);
                }
                a.gid = gid;
            }
            if (req.uid.is_some() || req.gid.is_some()) && req.mode.is_none() && !a.is_dir() {
                // chown clears setuid, and setgid where it means "set group id on exec"
                a.perm &= !(libc::S_ISUID as u16);
                if a.perm & 0o010 != 0 {
                    a.perm &= !(libc::S_ISGID as u16);
                }
            }
            if let Some(mode) = req.mode {
                if !owner {
                    return sys(libc::EPERM);
                }
                let mut m = (mode & 0o7777) as u16;
                if ctx.uid != 0 && !ctx.in_group(a.gid) {
                    m &= !(libc::S_ISGID as u16);
                }
                a.perm = m;
            }
            for (set, slot) in [(req.atime, &mut a.atime_ns), (req.mtime, &mut a.mtime_ns)] {
                match set {
                    None => {}
                    Some(TimeSet::Now) => {
                        if !owner {
                            access(&old, ctx, MAY_WRITE).map_err(|_| Error::Sys(libc::EACCES))?;
                        }
                        *slot = now;
                    }
                    Some(TimeSet::At(ns)) => {
                        if !owner {
                            return sys(libc::EPERM);
                        }
                        *slot = ns;
                    }
                }
            }
            a.ctime_ns = req.ctime_ns.unwrap_or(now);
            let change = match req.size {
                Some(_) if old.kind == FileKind::Dir => return sys(libc::EISDIR),
                Some(_) if old.kind != FileKind::File => return sys(libc::EINVAL),
                Some(size) => {
                    if size > FILE_SIZE_MAX {
                        return sys(libc::EFBIG);
                    }
                    if !req.via_handle {
                        access(&old, ctx, MAY_WRITE)?;
                    }
                    if size != old.length && req.mtime.is_none() {
                        a.mtime_ns = now;
                    }
                    a.length = size;
                    let (first_dropped_chunk, hole) = truncate_plan(old.length, size);
                    Change::Truncate {
                        ino,
                        attr: a.clone(),
                        first_dropped_chunk,
                        hole,
                    }
                }
                None => Change::SetAttr {
                    ino,
                    attr: a.clone(),
                },
            };
            commit(t, change, now)?;
            Ok(a)
        })
        .map(Committed::from)
    }

    // ---- creating entries -------------------------------------------------------------------

    fn new_attr(ctx: &Ctx, parent: &Attr, kind: FileKind, mode: u32, umask: u32, now: i64) -> Attr {
        // directories take only the permission and sticky bits from the mode (as Linux does)
        let allowed = if kind == FileKind::Dir {
            0o1777
        } else {
            0o7777
        };
        let mut perm = (mode & allowed & !(umask & 0o777)) as u16;
        let mut gid = ctx.gid;
        if parent.perm as u32 & libc::S_ISGID != 0 {
            gid = parent.gid;
            if kind == FileKind::Dir {
                perm |= libc::S_ISGID as u16;
            }
        }
        if kind != FileKind::Dir
            && perm as u32 & libc::S_ISGID != 0
            && ctx.uid != 0
            && !ctx.in_group(gid)
        {
            perm &= !(libc::S_ISGID as u16);
        }
        Attr {
            kind,
            perm,
            uid: ctx.uid,
            gid,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            length: if kind == FileKind::Dir { 4096 } else { 0 },
            rdev: 0,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            parent: 0,
        }
    }

    // The arguments are those of the creating system calls; a struct would only rename them.
    #[allow(clippy::too_many_arguments)]
    fn create_entry(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        umask: u32,
        rdev: u32,
        target: Option<&[u8]>,
    ) -> Result<Committed<(Ino, Attr)>> {
        self.writable()?;
        if is_dot(name) {
            return sys(libc::EEXIST);
        }
        check_name(name)?;
        let ino = self.next_inode()?;
        let (attr, version) = kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let mut pa = need_dir_attr(t, parent)?;
            access(&pa, ctx, MAY_WRITE | MAY_EXEC)?;
            if pa.nlink == 0 {
                // the directory was removed while we held its inode number
                return sys(libc::ENOENT);
            }
            if get_dentry(t, parent, name)?.is_some() {
                return sys(libc::EEXIST);
            }
            let mut a = Self::new_attr(ctx, &pa, kind, mode, umask, now);
            a.rdev = rdev;
            if kind == FileKind::Dir {
                a.parent = parent;
                if pa.nlink >= NLINK_MAX {
                    return sys(libc::EMLINK);
                }
                pa.nlink += 1;
            }
            if let Some(target) = target {
                a.length = target.len() as u64;
            }
            touch_dir(&mut pa, now);
            commit(
                t,
                Change::Create {
                    parent,
                    name: name.into(),
                    ino,
                    attr: a.clone(),
                    parent_attr: pa,
                    target: target.map(Name::from),
                },
                now,
            )?;
            Ok(a)
        })?;
        Ok(Committed::new((ino, attr), version))
    }

    pub fn mknod_versioned(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Committed<(Ino, Attr)>> {
        let kind = FileKind::from_mode(mode).ok_or(Error::Sys(libc::EINVAL))?;
        if kind == FileKind::Dir || kind == FileKind::Symlink {
            return sys(libc::EINVAL);
        }
        if matches!(kind, FileKind::CharDev | FileKind::BlockDev) && ctx.uid != 0 {
            return sys(libc::EPERM);
        }
        self.create_entry(ctx, parent, name, kind, mode, umask, rdev, None)
    }

    pub fn mkdir_versioned(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Committed<(Ino, Attr)>> {
        self.create_entry(ctx, parent, name, FileKind::Dir, mode, umask, 0, None)
    }

    /// Create a regular file and count it open (O_CREAT); an existing name is EEXIST.
    pub fn create_versioned(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Committed<(Ino, Attr)>> {
        let made = self.create_entry(ctx, parent, name, FileKind::File, mode, umask, 0, None)?;
        self.opened(made.value.0);
        Ok(made)
    }

    pub fn symlink_versioned(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        target: &[u8],
    ) -> Result<Committed<(Ino, Attr)>> {
        if target.is_empty() || target.contains(&0) {
            return sys(libc::EINVAL);
        }
        if target.len() > SYMLINK_LEN_MAX {
            return sys(libc::ENAMETOOLONG);
        }
        self.create_entry(
            ctx,
            parent,
            name,
            FileKind::Symlink,
            0o777,
            0,
            0,
            Some(target),
        )
    }

    pub fn link_versioned(
        &self,
        ctx: &Ctx,
        ino: Ino,
        parent: Ino,
        name: &[u8],
    ) -> Result<Committed<Attr>> {
        self.writable()?;
        if is_dot(name) {
            return sys(libc::EEXIST);
        }
        check_name(name)?;
        kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let mut pa = need_dir_attr(t, parent)?;
            access(&pa, ctx, MAY_WRITE | MAY_EXEC)?;
            let mut a = need_attr(t, ino)?;
            if a.is_dir() {
                return sys(libc::EPERM);
            }
            if a.nlink == 0 {
                return sys(libc::ENOENT);
            }
            if a.nlink >= NLINK_MAX {
                return sys(libc::EMLINK);
            }
            if get_dentry(t, parent, name)?.is_some() {
                return sys(libc::EEXIST);
            }
            a.nlink += 1;
            a.ctime_ns = now;
            touch_dir(&mut pa, now);
            commit(
                t,
                Change::Link {
                    parent,
                    name: name.into(),
                    ino,
                    attr: a.clone(),
                    parent_attr: pa,
                },
                now,
            )?;
            Ok(a)
        })
        .map(Committed::from)
    }

    // ---- removing entries -------------------------------------------------------------------

    pub fn unlink_versioned(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Committed<()>> {
        self.writable()?;
        if is_dot(name) {
            return sys(libc::EISDIR);
        }
        check_name(name)?;
        let sid = self.session_id();
        kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let mut pa = need_dir_attr(t, parent)?;
            access(&pa, ctx, MAY_WRITE | MAY_EXEC)?;
            let (ino, kind) = get_dentry(t, parent, name)?.ok_or(Error::Sys(libc::ENOENT))?;
            if kind == FileKind::Dir {
                return sys(libc::EISDIR);
            }
            let a = need_attr(t, ino)?;
            sticky_ok(&pa, &a, ctx)?;
            let (a, unlinked) = self.fate(ino, a, now, sid);
            touch_dir(&mut pa, now);
            commit(
                t,
                Change::Unlink {
                    parent,
                    name: name.into(),
                    ino,
                    parent_attr: pa,
                    attr: a,
                    unlinked,
                },
                now,
            )
        })
        .map(Committed::from)
    }

    fn fate(&self, ino: Ino, mut a: Attr, now: i64, sid: u64) -> (Attr, Unlinked) {
        a.nlink = a.nlink.saturating_sub(1);
        a.ctime_ns = now;
        if a.nlink > 0 {
            (a, Unlinked::Linked)
        } else if a.kind == FileKind::File && self.open_count(ino) > 0 {
            (a, Unlinked::Sustain { sid })
        } else {
            (a, Unlinked::Delete)
        }
    }

    pub fn rmdir_versioned(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Committed<()>> {
        self.writable()?;
        if name == b"." {
            return sys(libc::EINVAL);
        }
        if name == b".." {
            return sys(libc::ENOTEMPTY);
        }
        check_name(name)?;
        kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let mut pa = need_dir_attr(t, parent)?;
            access(&pa, ctx, MAY_WRITE | MAY_EXEC)?;
            let (ino, kind) = get_dentry(t, parent, name)?.ok_or(Error::Sys(libc::ENOENT))?;
            if kind != FileKind::Dir {
                return sys(libc::ENOTDIR);
            }
            let a = need_attr(t, ino)?;
            sticky_ok(&pa, &a, ctx)?;
            if !dir_is_empty(t, ino)? {
                return sys(libc::ENOTEMPTY);
            }
            pa.nlink = pa.nlink.saturating_sub(1);
            touch_dir(&mut pa, now);
            commit(
                t,
                Change::Rmdir {
                    parent,
                    name: name.into(),
                    ino,
                    parent_attr: pa,
                },
                now,
            )
        })
        .map(Committed::from)
    }

    /// rename(2) with RENAME_NOREPLACE and RENAME_EXCHANGE (`flags` as in renameat2).
    pub fn rename_versioned(
        &self,
        ctx: &Ctx,
        sp: Ino,
        sn: &[u8],
        dp: Ino,
        dn: &[u8],
        flags: u32,
    ) -> Result<Committed<()>> {
        self.writable()?;
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 || (noreplace && exchange)
        {
            return sys(libc::EINVAL);
        }
        if is_dot(sn) || is_dot(dn) {
            return sys(libc::EINVAL);
        }
        check_name(sn)?;
        check_name(dn)?;
        let sid = self.session_id();
        kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let mut spa = need_dir_attr(t, sp)?;
            let mut dpa = if dp == sp {
                spa.clone()
            } else {
                need_dir_attr(t, dp)?
            };
            access(&spa, ctx, MAY_WRITE | MAY_EXEC)?;
            access(&dpa, ctx, MAY_WRITE | MAY_EXEC)?;
            let (ino, kind) = get_dentry(t, sp, sn)?.ok_or(Error::Sys(libc::ENOENT))?;
            let mut a = need_attr(t, ino)?;
            sticky_ok(&spa, &a, ctx)?;
            let target = get_dentry(t, dp, dn)?;
            if exchange && target.is_none() {
                return sys(libc::ENOENT);
            }
            if let Some((tino, _)) = target {
                if tino == ino {
                    // both names are links to the same inode: POSIX says do nothing
                    return Ok(());
                }
                if noreplace {
                    return sys(libc::EEXIST);
                }
            }
            // a directory may not move under itself
            if kind == FileKind::Dir && sp != dp {
                if is_ancestor(t, ino, dp)? {
                    return sys(libc::EINVAL);
                }
                // moving a directory rewrites its "..": that needs write access to it
                access(&a, ctx, MAY_WRITE)?;
            }
            let mut replaced = None;
            if let Some((tino, tkind)) = target {
                let mut ta = need_attr(t, tino)?;
                sticky_ok(&dpa, &ta, ctx)?;
                if exchange {
                    if tkind == FileKind::Dir && sp != dp {
                        if is_ancestor(t, tino, sp)? {
                            return sys(libc::EINVAL);
                        }
                        access(&ta, ctx, MAY_WRITE)?;
                    }
                    if tkind == FileKind::Dir {
                        ta.parent = sp;
                    }
                    ta.ctime_ns = now;
                    // a directory that changes parent takes its ".." link with it
                    if kind == FileKind::Dir && tkind != FileKind::Dir && sp != dp {
                        spa.nlink = spa.nlink.saturating_sub(1);
                        dpa.nlink += 1;
                    } else if kind != FileKind::Dir && tkind == FileKind::Dir && sp != dp {
                        spa.nlink += 1;
                        dpa.nlink = dpa.nlink.saturating_sub(1);
                    }
                    replaced = Some(Replaced {
                        ino: tino,
                        attr: ta,
                        exchange: true,
                        unlinked: Unlinked::Linked,
                    });
                } else {
                    if kind == FileKind::Dir && tkind != FileKind::Dir {
                        return sys(libc::ENOTDIR);
                    }
                    if kind != FileKind::Dir && tkind == FileKind::Dir {
                        return sys(libc::EISDIR);
                    }
                    if tkind == FileKind::Dir {
                        if !dir_is_empty(t, tino)? {
                            return sys(libc::ENOTEMPTY);
                        }
                        dpa.nlink = dpa.nlink.saturating_sub(1);
                        ta.nlink = 0;
                        replaced = Some(Replaced {
                            ino: tino,
                            attr: ta,
                            exchange: false,
                            unlinked: Unlinked::Delete,
                        });
                    } else {
                        let (ta, fate) = self.fate(tino, ta, now, sid);
                        replaced = Some(Replaced {
                            ino: tino,
                            attr: ta,
                            exchange: false,
                            unlinked: fate,
                        });
                    }
                }
            }
            if kind == FileKind::Dir {
                a.parent = dp;
                if sp != dp && !exchange {
                    spa.nlink = spa.nlink.saturating_sub(1);
                    dpa.nlink += 1;
                }
            }
            a.ctime_ns = now;
            touch_dir(&mut spa, now);
            touch_dir(&mut dpa, now);
            if sp == dp {
                // one directory: only the destination copy carries link-count changes
                spa = dpa.clone();
            }
            commit(
                t,
                Change::Rename {
                    src_parent: sp,
                    src_name: sn.into(),
                    dst_parent: dp,
                    dst_name: dn.into(),
                    ino,
                    attr: a,
                    src_parent_attr: spa,
                    dst_parent_attr: dpa,
                    replaced,
                },
                now,
            )
        })
        .map(Committed::from)
    }

    // ---- open files ---------------------------------------------------------------------------

    fn opened(&self, ino: Ino) {
        let sid = self.session_id();
        *self
            .open_files
            .lock()
            .entry(ino)
            .or_default()
            .entry(sid)
            .or_insert(0) += 1;
    }

    pub fn open_count(&self, ino: Ino) -> u32 {
        self.open_files
            .lock()
            .get(&ino)
            .map(|by_session| by_session.values().sum())
            .unwrap_or(0)
    }

    /// Check access for open(2) with `flags` and count the handle.
    pub fn open_inode(&self, ctx: &Ctx, ino: Ino, flags: i32) -> Result<Attr> {
        let a = self.getattr(ino)?;
        let mut mask = match flags & libc::O_ACCMODE {
            libc::O_RDONLY => MAY_READ,
            libc::O_WRONLY => MAY_WRITE,
            _ => MAY_READ | MAY_WRITE,
        };
        if flags & libc::O_TRUNC != 0 {
            mask |= MAY_WRITE;
        }
        if mask & MAY_WRITE != 0 {
            if a.is_dir() {
                return sys(libc::EISDIR);
            }
            if !self.writes_elsewhere {
                self.writable()?;
            }
        }
        access(&a, ctx, mask)?;
        self.opened(ino);
        Ok(a)
    }

    /// A handle on `ino` closed; the last close of an unlinked file deletes it.
    pub fn release_versioned(&self, ino: Ino) -> Result<Committed<()>> {
        let sid = self.session_id();
        let last = {
            let mut of = self.open_files.lock();
            match of.get_mut(&ino) {
                Some(by_session) => {
                    match by_session.get_mut(&sid) {
                        Some(n) if *n > 1 => *n -= 1,
                        Some(_) => {
                            by_session.remove(&sid);
                        }
                        None => {}
                    }
                    if by_session.is_empty() {
                        of.remove(&ino);
                        true
                    } else {
                        false
                    }
                }
                None => false,
            }
        };
        let mut version = None;
        if last && !self.read_only {
            version = self.delete_unlinked(ino)?;
        }
        Ok(Committed::new((), version))
    }

    /// Delete `ino` if no entry links it any more; returns the version that did.
    fn delete_unlinked(&self, ino: Ino) -> Result<Option<u64>> {
        let ((), version) = kv::txn(self.kv.as_ref(), |t| match get_attr(t, ino)? {
            Some(a) if a.nlink == 0 => commit(t, Change::DeleteInode { ino }, now_ns()),
            _ => Ok(()),
        })?;
        Ok(version)
    }

    // ---- data -------------------------------------------------------------------------------

    pub fn read_chunk(&self, ino: Ino, idx: u32) -> Result<Vec<SliceRef>> {
        kv::read(self.kv.as_ref(), |t| get_chunk(t, ino, idx))
    }

    /// Commit a written slice into chunk `idx` of `ino`; returns the new attributes.
    pub fn write_slice_versioned(
        &self,
        ino: Ino,
        idx: u32,
        slice: SliceRef,
        mtime_ns: i64,
    ) -> Result<Committed<Attr>> {
        self.writable()?;
        check_slice(&slice, self.format.block_size)?;
        let end = idx as u64 * CHUNK_SIZE + slice.pos as u64 + slice.len as u64;
        if end > FILE_SIZE_MAX {
            return sys(libc::EFBIG);
        }
        kv::txn(self.kv.as_ref(), |t| {
            let mut a = need_attr(t, ino)?;
            if a.kind != FileKind::File {
                return sys(libc::EBADF);
            }
            a.length = a.length.max(end);
            a.mtime_ns = mtime_ns;
            a.ctime_ns = mtime_ns;
            commit(
                t,
                Change::WriteSlice {
                    ino,
                    chunk: idx,
                    slice: slice.clone(),
                    attr: a.clone(),
                },
                now_ns(),
            )?;
            Ok(a)
        })
        .map(Committed::from)
    }

    /// Replace the first `old.len()` slices of a chunk with `new` — only if the chunk still
    /// starts with exactly `old` (writers may have appended meanwhile). Returns false if not.
    pub fn compact_chunk_versioned(
        &self,
        ino: Ino,
        idx: u32,
        old: &[SliceRef],
        new: Vec<SliceRef>,
    ) -> Result<Committed<bool>> {
        self.writable()?;
        for s in &new {
            check_slice(s, self.format.block_size)?;
        }
        kv::txn(self.kv.as_ref(), |t| {
            let list = get_chunk(t, ino, idx)?;
            if list.len() < old.len() || list[..old.len()] != *old {
                return Ok(false);
            }
            commit(
                t,
                Change::Compact {
                    ino,
                    chunk: idx,
                    replaced: old.len() as u32,
                    slices: new.clone(),
                },
                now_ns(),
            )?;
            Ok(true)
        })
        .map(Committed::from)
    }

    /// Dead slices freed before `before_ns`, at most `limit`.
    pub fn dead_slices(&self, before_ns: i64, limit: usize) -> Result<Vec<(u64, DeadSlice)>> {
        kv::read(self.kv.as_ref(), |t| {
            let mut out = vec![];
            for (k, v) in t.scan(&keys::group(keys::DEADSLICE, 0), None, usize::MAX)? {
                let d: DeadSlice = decode(&v)?;
                if d.freed_ns < before_ns {
                    out.push((
                        keys::u64_at(&k, 9).ok_or_else(|| Error::corrupt("dead slice key"))?,
                        d,
                    ));
                    if out.len() >= limit {
                        break;
                    }
                }
            }
            Ok(out)
        })
    }

    /// Record that the blocks of these dead slices are deleted.
    pub fn purge_slices(&self, ids: Vec<u64>) -> Result<Committed<()>> {
        if ids.is_empty() {
            return Ok(Committed::unversioned(()));
        }
        kv::txn(self.kv.as_ref(), |t| {
            commit(t, Change::PurgeSlices { ids: ids.clone() }, now_ns())
        })
        .map(Committed::from)
    }

    // ---- xattrs -------------------------------------------------------------------------------

    fn xattr_access(a: &Attr, ctx: &Ctx, name: &[u8], write: bool) -> Result<()> {
        if name.is_empty() || name.len() > XATTR_NAME_LEN_MAX {
            return sys(libc::ERANGE);
        }
        if name.starts_with(b"user.") {
            if !matches!(a.kind, FileKind::File | FileKind::Dir) {
                return sys(if write { libc::EPERM } else { libc::ENODATA });
            }
            if a.is_dir()
                && a.perm as u32 & libc::S_ISVTX != 0
                && write
                && ctx.uid != 0
                && ctx.uid != a.uid
            {
                return sys(libc::EPERM);
            }
            return access(a, ctx, if write { MAY_WRITE } else { MAY_READ });
        }
        if name.starts_with(b"trusted.") {
            return if ctx.uid == 0 {
                Ok(())
            } else {
                sys(libc::EPERM)
            };
        }
        if name.starts_with(b"security.") {
            return if write && ctx.uid != 0 && ctx.uid != a.uid {
                sys(libc::EPERM)
            } else {
                Ok(())
            };
        }
        // system.* (POSIX ACLs) and unknown namespaces
        sys(libc::ENOTSUP)
    }

    pub fn getxattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        kv::read(self.kv.as_ref(), |t| {
            let a = need_attr(t, ino)?;
            Self::xattr_access(&a, ctx, name, false)?;
            t.get(&keys::xattr(ino, name))?
                .ok_or(Error::Sys(libc::ENODATA))
        })
    }

    pub fn listxattr(&self, _ctx: &Ctx, ino: Ino) -> Result<Vec<Vec<u8>>> {
        kv::read(self.kv.as_ref(), |t| {
            need_attr(t, ino)?;
            Ok(t.scan(&keys::group(keys::XATTR, ino), None, usize::MAX)?
                .into_iter()
                .map(|(k, _)| k[9..].to_vec())
                .collect())
        })
    }

    /// setxattr with XATTR_CREATE (fail if it exists) / XATTR_REPLACE (fail if it does not).
    pub fn setxattr_versioned(
        &self,
        ctx: &Ctx,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Result<Committed<()>> {
        self.writable()?;
        if value.len() > XATTR_VALUE_LEN_MAX {
            return sys(libc::E2BIG);
        }
        if flags & !(libc::XATTR_CREATE | libc::XATTR_REPLACE) != 0 {
            return sys(libc::EINVAL);
        }
        kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let mut a = need_attr(t, ino)?;
            Self::xattr_access(&a, ctx, name, true)?;
            let exists = t.get(&keys::xattr(ino, name))?.is_some();
            if flags & libc::XATTR_CREATE != 0 && exists {
                return sys(libc::EEXIST);
            }
            if flags & libc::XATTR_REPLACE != 0 && !exists {
                return sys(libc::ENODATA);
            }
            a.ctime_ns = now;
            commit(
                t,
                Change::SetXattr {
                    ino,
                    name: name.into(),
                    value: value.to_vec(),
                    attr: a,
                },
                now,
            )
        })
        .map(Committed::from)
    }

    pub fn removexattr_versioned(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<Committed<()>> {
        self.writable()?;
        kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let mut a = need_attr(t, ino)?;
            Self::xattr_access(&a, ctx, name, true)?;
            if t.get(&keys::xattr(ino, name))?.is_none() {
                return sys(libc::ENODATA);
            }
            a.ctime_ns = now;
            commit(
                t,
                Change::RemoveXattr {
                    ino,
                    name: name.into(),
                    attr: a,
                },
                now,
            )
        })
        .map(Committed::from)
    }

    // ---- locks --------------------------------------------------------------------------------

    /// flock(2) on `ino` for handle `owner`. Never blocks: a conflict is EAGAIN.
    pub fn flock(&self, ino: Ino, owner: u64, typ: LockType) -> Result<()> {
        let sid = self.session_id();
        kv::txn(self.kv.as_ref(), |t| {
            let mut table: Vec<(u64, u64, LockType)> = match t.get(&keys::flock(ino))? {
                Some(b) => decode(&b)?,
                None => vec![],
            };
            locks::flock_apply(&mut table, sid, owner, typ)?;
            store_table(t, &keys::flock(ino), &table)?;
            if typ != LockType::Unlock {
                t.put(&keys::locked(sid, ino), b"");
            }
            Ok(())
        })?;
        Ok(())
    }

    /// F_GETLK: the first lock that conflicts with the one described, if any.
    pub fn getlk(
        &self,
        ino: Ino,
        owner: u64,
        typ: LockType,
        start: u64,
        end: u64,
    ) -> Result<Option<PosixLock>> {
        let sid = self.session_id();
        kv::read(self.kv.as_ref(), |t| {
            let table = self.plocks(t, ino)?;
            Ok(locks::posix_conflict(&table, sid, owner, typ, start, end).cloned())
        })
    }

    fn plocks(&self, t: &mut dyn KvTxn, ino: Ino) -> Result<Vec<PosixLock>> {
        match t.get(&keys::plock(ino))? {
            Some(b) => decode(&b),
            None => Ok(vec![]),
        }
    }

    /// F_SETLK: take or release a POSIX lock; a conflict is EAGAIN (callers that may wait retry).
    pub fn setlk(
        &self,
        ino: Ino,
        owner: u64,
        pid: u32,
        typ: LockType,
        start: u64,
        end: u64,
    ) -> Result<()> {
        if start > end {
            return sys(libc::EINVAL);
        }
        let sid = self.session_id();
        kv::txn(self.kv.as_ref(), |t| {
            let mut table = self.plocks(t, ino)?;
            if typ != LockType::Unlock
                && locks::posix_conflict(&table, sid, owner, typ, start, end).is_some()
            {
                return sys(libc::EAGAIN);
            }
            locks::posix_set(&mut table, sid, owner, pid, typ, start, end);
            store_table(t, &keys::plock(ino), &table)?;
            if typ != LockType::Unlock {
                t.put(&keys::locked(sid, ino), b"");
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Release every POSIX lock of `owner` on `ino` (close(2) semantics).
    pub fn release_posix_locks(&self, ino: Ino, owner: u64) -> Result<()> {
        self.setlk(ino, owner, 0, LockType::Unlock, 0, u64::MAX)
    }

    fn release_session_locks(&self, sid: u64) -> Result<()> {
        let inodes: Vec<Ino> = kv::read(self.kv.as_ref(), |t| {
            let page = t.scan(&keys::group(keys::LOCKED, sid), None, usize::MAX)?;
            page.iter()
                .map(|(k, _)| keys::u64_at(k, 9).ok_or_else(|| Error::corrupt("locked key")))
                .collect()
        })?;
        for ino in inodes {
            kv::txn(self.kv.as_ref(), |t| {
                let mut plocks = self.plocks(t, ino)?;
                plocks.retain(|l| l.sid != sid);
                let mut flocks: Vec<(u64, u64, LockType)> = match t.get(&keys::flock(ino))? {
                    Some(b) => decode(&b)?,
                    None => vec![],
                };
                flocks.retain(|l| l.0 != sid);
                store_table(t, &keys::plock(ino), &plocks)?;
                store_table(t, &keys::flock(ino), &flocks)?;
                t.delete(&keys::locked(sid, ino));
                Ok(())
            })?;
        }
        Ok(())
    }

    // ---- digest -------------------------------------------------------------------------------

    /// A digest of the whole file system tree (attributes, entries, chunks, symlinks, xattrs
    /// and unlinked-but-open inodes). Two engines with the same content have the same digest,
    /// whatever their backend.
    pub fn digest(kv: &DynKv) -> Result<String> {
        kv::read(kv.as_ref(), |t| Self::digest_in(t))
    }

    /// The digest and the version it was taken at, read together (on RocksDB, from one
    /// snapshot; on Redis, compare [`kv::KvEngine::last_version`] before and after).
    pub fn digest_at(kv: &dyn kv::KvEngine) -> Result<(String, u64)> {
        kv::read(kv, |t| {
            let version = crate::snapshot::version_in(t)?;
            Ok((Self::digest_in(t)?, version))
        })
    }

    /// [`Meta::digest`] inside a transaction.
    pub fn digest_in(t: &mut dyn KvTxn) -> Result<String> {
        {
            let mut h = Sha256::new();
            let mut seen = HashSet::new();
            let mut stack = vec![ROOT_INO];
            let mut extra: BTreeMap<Ino, ()> = BTreeMap::new();
            for (k, _) in t.scan(&keys::group(keys::DELFILE, 0), None, usize::MAX)? {
                if let Some(ino) = keys::u64_at(&k, 9) {
                    extra.insert(ino, ());
                }
            }
            stack.extend(extra.keys().rev().copied());
            while let Some(ino) = stack.pop() {
                if !seen.insert(ino) {
                    continue;
                }
                let a = get_attr(t, ino)?.ok_or_else(|| {
                    Error::corrupt(format!("inode {ino} is referenced but missing"))
                })?;
                h.update(b"I");
                h.update(ino.to_be_bytes());
                h.update(encode(&a)?);
                for (k, v) in t.scan(&keys::group(keys::XATTR, ino), None, usize::MAX)? {
                    h.update(b"X");
                    h.update(&k);
                    h.update(&v);
                }
                match a.kind {
                    FileKind::Dir => {
                        let entries = t.scan(&keys::group(keys::DENTRY, ino), None, usize::MAX)?;
                        let mut children = vec![];
                        for (k, v) in entries {
                            h.update(b"D");
                            h.update(&k);
                            h.update(&v);
                            children.push(changelog::decode_dentry(&v)?.0);
                        }
                        stack.extend(children.into_iter().rev());
                    }
                    FileKind::File => {
                        for (k, v) in t.scan(&keys::group(keys::CHUNK, ino), None, usize::MAX)? {
                            h.update(b"C");
                            h.update(&k);
                            h.update(&v);
                        }
                    }
                    FileKind::Symlink => {
                        h.update(b"S");
                        h.update(t.get(&keys::symlink(ino))?.unwrap_or_default());
                    }
                    _ => {}
                }
            }
            Ok(hex::encode(h.finalize()))
        }
    }
}

/// How a truncate from `old` to `new` bytes changes the chunks: the first chunk deleted
/// entirely, and the hole that hides old bytes past `new` inside the last kept chunk.
pub fn truncate_plan(old: u64, new: u64) -> (u32, Option<(u32, SliceRef)>) {
    let first_dropped = new.div_ceil(CHUNK_SIZE) as u32;
    if new >= old {
        return (u32::MAX, None);
    }
    let in_chunk = (new % CHUNK_SIZE) as u32;
    if in_chunk == 0 {
        return (first_dropped, None);
    }
    let idx = (new / CHUNK_SIZE) as u32;
    let chunk_end = (idx as u64 + 1) * CHUNK_SIZE;
    let hole_end = old.min(chunk_end) - idx as u64 * CHUNK_SIZE;
    let hole = SliceRef {
        id: 0,
        size: 0,
        off: 0,
        len: hole_end as u32 - in_chunk,
        pos: in_chunk,
        crcs: vec![],
    };
    (first_dropped, Some((idx, hole)))
}

fn store_table<T: serde::Serialize>(t: &mut dyn KvTxn, key: &[u8], table: &[T]) -> Result<()> {
    if table.is_empty() {
        t.delete(key);
    } else {
        t.put(key, &encode(&table)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: u64 = CHUNK_SIZE;

    /// The hole `truncate_plan` should hide in chunk `idx`: bytes `pos..pos + len` of it.
    fn hole(idx: u32, pos: u64, len: u64) -> Option<(u32, SliceRef)> {
        Some((
            idx,
            SliceRef {
                id: 0,
                size: 0,
                off: 0,
                len: len as u32,
                pos: pos as u32,
                crcs: vec![],
            },
        ))
    }

    #[test]
    fn growing_or_keeping_the_size_changes_no_chunk() {
        assert_eq!(truncate_plan(0, 0), (u32::MAX, None));
        assert_eq!(truncate_plan(0, 1), (u32::MAX, None));
        assert_eq!(truncate_plan(10, 10), (u32::MAX, None));
        assert_eq!(truncate_plan(10, 3 * C + 5), (u32::MAX, None));
        assert_eq!(truncate_plan(C, C), (u32::MAX, None));
    }

    #[test]
    fn truncating_to_zero_drops_every_chunk() {
        assert_eq!(truncate_plan(1, 0), (0, None));
        assert_eq!(truncate_plan(C, 0), (0, None));
        assert_eq!(truncate_plan(3 * C + 5, 0), (0, None));
    }

    #[test]
    fn truncating_to_a_chunk_boundary_drops_the_chunks_after_it() {
        assert_eq!(truncate_plan(C + 1, C), (1, None));
        assert_eq!(truncate_plan(2 * C, C), (1, None));
        assert_eq!(truncate_plan(5 * C + 7, 3 * C), (3, None));
    }

    #[test]
    fn shrinking_within_a_chunk_hides_the_old_bytes_behind_a_hole() {
        // one chunk: the hole runs from the new end to the old one
        assert_eq!(truncate_plan(1000, 100), (1, hole(0, 100, 900)));
        assert_eq!(truncate_plan(C, 10), (1, hole(0, 10, C - 10)));
        // a byte before the boundary
        assert_eq!(truncate_plan(C, C - 1), (1, hole(0, C - 1, 1)));
        // in a later chunk
        assert_eq!(
            truncate_plan(2 * C + 300, 2 * C + 100),
            (3, hole(2, 100, 200))
        );
    }

    #[test]
    fn shrinking_across_chunks_drops_the_later_ones_and_holes_the_rest_of_the_last() {
        // the hole ends at the end of the kept chunk, not at the old size
        assert_eq!(truncate_plan(3 * C, C + 10), (2, hole(1, 10, C - 10)));
        assert_eq!(truncate_plan(2 * C, C - 1), (1, hole(0, C - 1, 1)));
        assert_eq!(truncate_plan(C + 1, 1), (1, hole(0, 1, C - 1)));
    }

    #[test]
    fn the_largest_file_is_planned_without_overflow() {
        let (dropped, h) = truncate_plan(FILE_SIZE_MAX, FILE_SIZE_MAX - 1);
        let last = (FILE_SIZE_MAX / C - 1) as u32;
        assert_eq!((dropped, h), (last + 1, hole(last, C - 1, 1)));
    }

    #[test]
    fn every_hole_is_a_slice_the_engine_accepts() {
        let sizes = [0, 1, 100, C - 1, C, C + 1, 2 * C + 5, 3 * C];
        for &old in &sizes {
            for &new in &sizes {
                if let (_, Some((_, s))) = truncate_plan(old, new) {
                    check_slice(&s, 4 << 20).unwrap_or_else(|e| panic!("{old} -> {new}: {e}"));
                    assert!(s.len > 0, "{old} -> {new}: an empty hole");
                }
            }
        }
    }
}
