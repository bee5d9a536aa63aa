//! The trash (docs/operations.md, "The trash"): what an unlink, an rmdir or a rename over a
//! file takes away is kept, nameless (nlink 0), for the file system's `trash_days`, and
//! shown in `/.trash`, a directory no key holds: its entries are the trash's, each named
//! `PARENT-INO-NAME` (as JuiceFS names them), where PARENT is the directory it was in.
//!
//! - The state machine keeps the entries (`T 0 ino`, [`crate::changelog::TrashEntry`]), so
//!   every region shows the same trash; the inodes keep their chunks, so GC, the mirrors'
//!   horizons and the orphan sweep count their blocks (snapshots walk them as roots).
//! - Only root and an entry's owner see it in the listing, look it up or open it.
//! - `strait trash restore` gives an entry its name back (in the directory it was in, or
//!   another), through the virtual xattr `strait.trash.restore`; at a mirror, the mount
//!   forwards it to the primary as every change. `strait trash purge` (root only) deletes
//!   one for good, and a GC pass deletes those older than the retention.
//! - The trash itself is read-only: nothing is created, removed or renamed in it.

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use super::{need_attr, need_live_dir, touch_dir, Meta};
use crate::changelog::{get_dentry, get_trash, trash_days, Change, TrashEntry, Unlinked};
use crate::clock::now_ns;
use crate::error::{sys, Error, Result};
use crate::kv::{self, KvTxn};
use crate::meta::keys;
use crate::meta::perm::{access, MAY_EXEC, MAY_WRITE};
use crate::meta::types::*;
use crate::meta::Committed;

/// The virtual xattrs of the trash:
/// - `strait.trash.entry` (get, on an entry): `parent=INO deleted_ns=NS name=NAME` (the
///   name last, whole: a listed name is cut to fit 255 bytes).
/// - `strait.trash.restore` (set, on an entry; its owner or root): the value empty puts it
///   back in the directory it was in, a directory's inode number puts it there.
/// - `strait.trash.purge` (set, on an entry; root only): delete it for good.
/// - `strait.trash.days` (get anywhere; set by root): the retention in days (0: no trash).
pub mod trash_xattr {
    pub const PREFIX: &[u8] = b"strait.trash.";
    pub const ENTRY: &[u8] = b"strait.trash.entry";
    pub const RESTORE: &[u8] = b"strait.trash.restore";
    pub const PURGE: &[u8] = b"strait.trash.purge";
    pub const DAYS: &[u8] = b"strait.trash.days";
}

/// How often a GC pass looks through the whole trash for what its retention let go.
const SWEEP_EVERY_NS: i64 = 10 * 60 * 1_000_000_000;
/// Most entries a pass deletes.
pub const EXPIRE_PER_PASS_MAX: usize = 10_000;
const DAY_NS: i64 = 86_400 * 1_000_000_000;

/// One entry of the trash as listed.
#[derive(Clone, Debug, PartialEq)]
pub struct TrashItem {
    pub ino: Ino,
    pub entry: TrashEntry,
    pub attr: Attr,
}

/// The name of inode `ino`, once `name` in directory `parent`, in `/.trash`: cut (at a
/// character boundary where it can) to [`NAME_LEN_MAX`] bytes.
pub fn trash_name(parent: Ino, ino: Ino, name: &[u8]) -> Vec<u8> {
    let mut out = format!("{parent}-{ino}-").into_bytes();
    let room = NAME_LEN_MAX.saturating_sub(out.len());
    let mut cut = name.len().min(room);
    if let Ok(s) = std::str::from_utf8(name) {
        while cut > 0 && !s.is_char_boundary(cut) {
            cut -= 1;
        }
    }
    out.extend_from_slice(&name[..cut]);
    out
}

/// The (parent, inode) a name in `/.trash` stands for.
fn parse_trash_name(name: &[u8]) -> Option<(Ino, Ino)> {
    let mut parts = name.splitn(3, |&b| b == b'-');
    let number = |b: &[u8]| std::str::from_utf8(b).ok()?.parse::<u64>().ok();
    let parent = number(parts.next()?)?;
    let ino = number(parts.next()?)?;
    parts.next()?;
    Some((parent, ino))
}

/// Whether `ctx` may see `attr`'s entry in the trash: root and its owner.
fn sees(ctx: &Ctx, attr: &Attr) -> bool {
    ctx.uid == 0 || ctx.uid == attr.uid
}

impl Meta {
    /// The trash directory's attributes: root's, read and search for everyone.
    pub fn trash_attr(&self) -> Attr {
        let t = self.format.created_ns;
        Attr {
            kind: FileKind::Dir,
            perm: 0o555,
            uid: 0,
            gid: 0,
            nlink: 2,
            length: 0,
            rdev: 0,
            atime_ns: t,
            mtime_ns: t,
            ctime_ns: t,
            parent: ROOT_INO,
        }
    }

    /// The file system's trash retention in days (0: no trash).
    pub fn trash_days(&self) -> Result<u32> {
        kv::read(self.kv.as_ref(), trash_days)
    }

    /// Every entry of the trash `ctx` may see, by inode.
    pub fn trash_items(&self, ctx: &Ctx) -> Result<Vec<TrashItem>> {
        kv::read(self.kv.as_ref(), |t| {
            let mut out = vec![];
            for (ino, entry) in trash_entries(t)? {
                let attr = need_attr(t, ino)?;
                if sees(ctx, &attr) {
                    out.push(TrashItem { ino, entry, attr });
                }
            }
            Ok(out)
        })
    }

    /// `/.trash` listed as `ctx` may see it.
    pub(super) fn trash_readdir(&self, ctx: &Ctx) -> Result<Vec<DirEntry>> {
        Ok(self
            .trash_items(ctx)?
            .into_iter()
            .map(|i| DirEntry {
                name: trash_name(i.entry.parent, i.ino, &i.entry.name),
                ino: i.ino,
                kind: i.attr.kind,
            })
            .collect())
    }

    /// A name in `/.trash`: ENOENT for one no entry has, EACCES for another's.
    pub(super) fn trash_lookup(&self, ctx: &Ctx, name: &[u8]) -> Result<(Ino, Attr)> {
        let (parent, ino) = parse_trash_name(name).ok_or(Error::Sys(libc::ENOENT))?;
        kv::read(self.kv.as_ref(), |t| {
            let e = get_trash(t, ino)?.ok_or(Error::Sys(libc::ENOENT))?;
            if e.parent != parent || trash_name(parent, ino, &e.name) != name {
                return sys(libc::ENOENT);
            }
            let a = need_attr(t, ino)?;
            if !sees(ctx, &a) {
                return sys(libc::EACCES);
            }
            Ok((ino, a))
        })
    }

    /// Whether `ctx` may open `ino`, as far as the trash is concerned: an inode in it only by
    /// root and its owner (EACCES).
    pub(super) fn trash_open_check(t: &mut dyn KvTxn, ctx: &Ctx, ino: Ino, a: &Attr) -> Result<()> {
        if a.nlink == 0 && !sees(ctx, a) && get_trash(t, ino)?.is_some() {
            return sys(libc::EACCES);
        }
        Ok(())
    }

    /// The trash entry of `ino`, if it is in the trash.
    pub fn trash_entry(&self, ino: Ino) -> Result<Option<TrashEntry>> {
        kv::read(self.kv.as_ref(), |t| get_trash(t, ino))
    }

    /// Give `ino`, in the trash, its name back: in directory `to`, or the one it was in. Its
    /// owner or root, with write access to the directory; EEXIST when the name is taken
    /// there, ENOENT when the directory is gone or in the trash itself (restore it first),
    /// EDQUOT past a quota.
    pub fn restore_versioned(
        &self,
        ctx: &Ctx,
        ino: Ino,
        to: Option<Ino>,
    ) -> Result<Committed<Attr>> {
        self.writable()?;
        kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let e = get_trash(t, ino)?.ok_or(Error::Sys(libc::ENOENT))?;
            let mut a = need_attr(t, ino)?;
            if !sees(ctx, &a) {
                return sys(libc::EACCES);
            }
            let parent = to.unwrap_or(e.parent);
            let mut pa = need_live_dir(t, parent)?;
            access(&pa, ctx, MAY_WRITE | MAY_EXEC)?;
            if get_dentry(t, parent, &e.name)?.is_some() {
                return sys(libc::EEXIST);
            }
            if a.is_dir() {
                // empty: what was under it comes back entry by entry, each subdirectory
                // adding its link
                a.nlink = 2;
                pa.nlink += 1;
            } else {
                a.nlink = 1;
            }
            a.parent = parent;
            a.ctime_ns = now;
            touch_dir(&mut pa, now);
            self.commit(
                t,
                Change::Restore {
                    ino,
                    parent,
                    name: e.name.as_slice().into(),
                    attr: a.clone(),
                    parent_attr: pa,
                },
                now,
            )?;
            Ok(a)
        })
        .map(Committed::from)
    }

    /// Delete `ino` from the trash for good (root only): its blocks go at the next GC passes;
    /// a file still open is kept until its last handle closes.
    pub fn purge_trash_versioned(&self, ctx: &Ctx, ino: Ino) -> Result<Committed<()>> {
        self.writable()?;
        if ctx.uid != 0 {
            return sys(libc::EPERM);
        }
        self.purge_one(ino, None)
    }

    /// Purge `ino` if it is in the trash (and, with `older_than`, went there before that
    /// time).
    fn purge_one(&self, ino: Ino, older_than: Option<i64>) -> Result<Committed<()>> {
        let sid = self.session_id();
        let claimed = RefCell::new(vec![]);
        let done = kv::txn(self.kv.as_ref(), |t| {
            let e = get_trash(t, ino)?.ok_or(Error::Sys(libc::ENOENT))?;
            if older_than.is_some_and(|o| e.deleted_ns > o) {
                return Ok(());
            }
            let a = need_attr(t, ino)?;
            let unlinked = if a.kind == FileKind::File && !self.claim_deletion(ino) {
                Unlinked::Sustain { sid }
            } else {
                claimed.borrow_mut().push(ino);
                Unlinked::Delete
            };
            self.commit(t, Change::PurgeTrash { ino, unlinked }, now_ns())
        });
        self.end_deletions(&claimed.into_inner());
        done.map(Committed::from)
    }

    /// Set the trash retention (root only); 0 turns the trash off (what it holds goes at the
    /// next GC pass).
    pub fn set_trash_days_versioned(&self, ctx: &Ctx, days: u32) -> Result<Committed<()>> {
        self.writable()?;
        if ctx.uid != 0 {
            return sys(libc::EPERM);
        }
        kv::txn(self.kv.as_ref(), |t| {
            self.commit(t, Change::SetTrashDays { days }, now_ns())
        })
        .map(Committed::from)
    }

    /// A virtual `strait.trash.*` xattr's value ([`trash_xattr`]).
    pub(super) fn trash_getxattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        use trash_xattr as x;
        match name {
            x::DAYS => Ok(self.trash_days()?.to_string().into_bytes()),
            x::ENTRY => kv::read(self.kv.as_ref(), |t| {
                let e = get_trash(t, ino)?.ok_or(Error::Sys(libc::ENODATA))?;
                if !sees(ctx, &need_attr(t, ino)?) {
                    return sys(libc::EACCES);
                }
                let mut v =
                    format!("parent={} deleted_ns={} name=", e.parent, e.deleted_ns).into_bytes();
                v.extend_from_slice(&e.name);
                Ok(v)
            }),
            _ => sys(libc::ENODATA),
        }
    }

    /// Setting a virtual `strait.trash.*` xattr ([`trash_xattr`]).
    pub(super) fn trash_setxattr(
        &self,
        ctx: &Ctx,
        ino: Ino,
        name: &[u8],
        value: &[u8],
    ) -> Result<Committed<()>> {
        use trash_xattr as x;
        let text = std::str::from_utf8(value)
            .map(|v| v.trim_matches(|c: char| c.is_whitespace() || c == '\0'))
            .map_err(|_| Error::Sys(libc::EINVAL))?;
        match name {
            x::RESTORE => {
                let to = if text.is_empty() {
                    None
                } else {
                    Some(text.parse().map_err(|_| Error::Sys(libc::EINVAL))?)
                };
                let done = self.restore_versioned(ctx, ino, to)?;
                Ok(Committed::new((), done.version))
            }
            x::PURGE => self.purge_trash_versioned(ctx, ino),
            x::DAYS => {
                let days = text.parse().map_err(|_| Error::Sys(libc::EINVAL))?;
                self.set_trash_days_versioned(ctx, days)
            }
            _ => sys(libc::ENOTSUP),
        }
    }

    /// Delete what the trash has kept past its retention, as of `now` (ns): at most `limit`
    /// entries. Returns how many went. Nothing while deletions are refused (a fenced
    /// primary).
    pub fn expire_trash(&self, now: i64, limit: usize) -> Result<usize> {
        if self.is_read_only() || self.deletions_refused().is_some() {
            return Ok(0);
        }
        let (before, old) = kv::read(self.kv.as_ref(), |t| {
            let days = trash_days(t)?;
            let before = now.saturating_sub((days as i64).saturating_mul(DAY_NS));
            let old: Vec<Ino> = trash_entries(t)?
                .into_iter()
                .filter(|(_, e)| e.deleted_ns <= before)
                .map(|(ino, _)| ino)
                .take(limit)
                .collect();
            Ok((before, old))
        })?;
        let mut n = 0;
        for ino in old {
            match self.purge_one(ino, Some(before)) {
                Ok(c) if c.version.is_some() => n += 1,
                Ok(_) | Err(Error::Sys(libc::ENOENT)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    /// [`Self::expire_trash`] from a GC pass: the whole trash is looked through at most once
    /// every 10 minutes, unless the last pass hit its limit.
    pub fn expire_trash_due(&self, now: i64) -> Result<usize> {
        let last = self.trash_swept.load(Ordering::Acquire);
        if last != i64::MIN && now.saturating_sub(last) < SWEEP_EVERY_NS && now >= last {
            return Ok(0);
        }
        let n = self.expire_trash(now, EXPIRE_PER_PASS_MAX)?;
        // a full pass leaves more: the next pass looks again
        let swept = if n >= EXPIRE_PER_PASS_MAX {
            i64::MIN
        } else {
            now
        };
        self.trash_swept.store(swept, Ordering::Release);
        Ok(n)
    }
}

/// Every trash entry, by inode.
fn trash_entries(t: &mut dyn KvTxn) -> Result<Vec<(Ino, TrashEntry)>> {
    let prefix = keys::group(keys::TRASH, 0);
    let mut out = vec![];
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = t.scan(&prefix, after.as_deref(), 1000)?;
        let n = page.len();
        for (k, v) in page {
            let ino = keys::u64_at(&k, 9).ok_or_else(|| Error::corrupt("trash key"))?;
            out.push((ino, crate::changelog::decode(&v)?));
            after = Some(k);
        }
        if n < 1000 {
            return Ok(out);
        }
    }
}
