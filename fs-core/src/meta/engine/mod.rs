//! [`Meta`]: the metadata API over any [`KvEngine`].

mod clone;
mod create;
mod data;
mod digest;
mod locking;
mod lookup;
mod open;
mod quota;
mod remove;
mod requests;
mod sessions;
mod setattr;
mod trash;
mod xattr;

pub use clone::{
    clone_value, clone_xattr, parse_clone_value, CloneListing, CloneProgress, CloneRequest,
    CALL_BUDGET, IDLE_MAX_NS as CLONE_IDLE_MAX_NS,
};
pub use locking::{lock_grace_from_now, mark_locks_lost, LOCK_GRACE};
pub use quota::QuotaCheck;
pub use trash::{trash_name, trash_xattr, TrashItem};
pub use xattr::quota_xattr;

use crate::clock::now_ns;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::keys;
use super::types::*;
use crate::changelog::{commit, decode, get_attr, Change};
use crate::error::{sys, Error, Result};
use crate::kv::{self, DynKv, KvTxn};
use crate::layout::CHUNK_SIZE;
use crate::SliceId;

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

/// Asked before a deletion a daemon commits on its own, for no client's change: the last
/// close of an unlinked file, the end of a session that kept one open, a GC pass. Some(why)
/// refuses it (a primary that was fenced, whose histories diverged, that has not compared its
/// history with the replicator's yet, or whose lease ran out: what it commits may be in no
/// history that goes on, and the blocks it would free may be live in one).
pub type DeletionGate = Arc<dyn Fn() -> Option<String> + Send + Sync>;

pub struct Meta {
    kv: DynKv,
    format: Format,
    /// Shared by every view: a mirror promoted to primary lifts it for all of them at once
    /// ([`Meta::allow_writes`]).
    read_only: Arc<AtomicBool>,
    writes_elsewhere: bool,
    sid: AtomicU64,
    /// Inode numbers and slice ids taken from the shared counters and not used yet:
    /// `[next, end)`, shared by a session's view and its views for one request.
    inodes: Arc<Mutex<(u64, u64)>>,
    slices: Arc<Mutex<(u64, u64)>>,
    /// Handles open on each inode, by session.
    open_files: OpenTable,
    /// Files a change is deleting because no handle is open on them (unlink, rename over a
    /// file, a last close), from its decision to its commit: opens of them fail meanwhile.
    /// Without it an open could count a handle just after the decision and keep a handle on
    /// a deleted file. Locked after `open_files`, never across I/O.
    deleting: Arc<Mutex<HashSet<Ino>>>,
    /// In a view for one call made under a request id ([`Meta::for_request`]): the id, whose
    /// record each change commits with.
    request: Option<Vec<u8>>,
    /// Shared by every view: see [`DeletionGate`] ([`Meta::gate_deletions`]).
    deletion_gate: Arc<parking_lot::RwLock<Option<DeletionGate>>>,
    /// Shared by every view: when a GC pass last looked through the whole trash for what its
    /// retention let go ([`Meta::expire_trash_due`]), in ns.
    trash_swept: Arc<std::sync::atomic::AtomicI64>,
    /// Shared by every view: when a GC pass last looked for clones to drop
    /// ([`Meta::drop_idle_clones_due`]), in ns.
    clones_swept: Arc<std::sync::atomic::AtomicI64>,
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
    let ok = if s.id.is_hole() {
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

/// A directory a change adds or removes entries in: not the trash (EPERM: only `strait trash`
/// changes it), nor a directory that is itself in the trash (ENOENT, as a removed directory
/// is).
fn need_live_dir(t: &mut dyn KvTxn, ino: Ino) -> Result<Attr> {
    if ino == TRASH_INO {
        return sys(libc::EPERM);
    }
    let a = need_dir_attr(t, ino)?;
    if a.nlink == 0 {
        return sys(libc::ENOENT);
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
            read_only: Arc::new(AtomicBool::new(opts.read_only)),
            writes_elsewhere: opts.writes_elsewhere,
            sid: AtomicU64::new(0),
            inodes: Arc::new(Mutex::new((0, 0))),
            slices: Arc::new(Mutex::new((0, 0))),
            open_files: Arc::new(Mutex::new(HashMap::new())),
            deleting: Arc::new(Mutex::new(HashSet::new())),
            request: None,
            deletion_gate: Arc::new(parking_lot::RwLock::new(None)),
            trash_swept: Arc::new(std::sync::atomic::AtomicI64::new(i64::MIN)),
            clones_swept: Arc::new(std::sync::atomic::AtomicI64::new(i64::MIN)),
        }))
    }

    /// A view of this engine for session `sid` (a mount served by a daemon): it shares the
    /// engine and the table of open handles with every other view, and has its own session id
    /// and id ranges.
    pub fn session_view(&self, sid: u64) -> Arc<Meta> {
        Arc::new(Meta {
            kv: self.kv.clone(),
            format: self.format.clone(),
            read_only: self.read_only.clone(),
            writes_elsewhere: self.writes_elsewhere,
            sid: AtomicU64::new(sid),
            inodes: Arc::new(Mutex::new((0, 0))),
            slices: Arc::new(Mutex::new((0, 0))),
            open_files: self.open_files.clone(),
            deleting: self.deleting.clone(),
            request: None,
            deletion_gate: self.deletion_gate.clone(),
            trash_swept: self.trash_swept.clone(),
            clones_swept: self.clones_swept.clone(),
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
    pub fn alloc_slice_ids(&self, count: u32) -> Result<SliceId> {
        let count = count.max(1) as i64;
        let end = self.kv.incr(&keys::counter(keys::NEXT_SLICE), count)? as u64;
        // slice id 0 means a hole; ids at or below the root's inode number are never used
        let first = end + 1 - count as u64;
        if first <= ROOT_INO {
            return self.alloc_slice_ids(count as u32);
        }
        Ok(SliceId(first))
    }

    pub fn kv(&self) -> &DynKv {
        &self.kv
    }
    pub fn settings(&self) -> &Format {
        &self.format
    }
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    /// Take mutations from now on, in this engine and every view of it (sessions' views
    /// included): a mirror promoted to primary, once it has applied everything committed
    /// before the promotion and raised its id counters past every id in use.
    pub fn allow_writes(&self) {
        self.read_only.store(false, Ordering::Release);
    }
    /// Ask `gate` before every deletion this engine (and every view of it) would commit on
    /// its own: an unlinked file's last close, a session's end, a GC pass.
    pub fn gate_deletions(&self, gate: DeletionGate) {
        *self.deletion_gate.write() = Some(gate);
    }

    /// Why deletions this engine would commit on its own are refused now (None: allowed).
    pub fn deletions_refused(&self) -> Option<String> {
        let gate = self.deletion_gate.read().clone();
        gate.and_then(|g| g())
    }

    /// Whether this read-only engine's mutations are made elsewhere (see [`MetaOptions`]).
    pub fn writes_elsewhere(&self) -> bool {
        self.writes_elsewhere
    }
    pub fn session_id(&self) -> u64 {
        self.sid.load(Ordering::Relaxed)
    }

    fn writable(&self) -> Result<()> {
        if self.is_read_only() {
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

    pub fn next_slice_id(&self) -> Result<SliceId> {
        self.alloc(&self.slices, keys::NEXT_SLICE, SLICE_BATCH)
            .map(SliceId)
    }
}
