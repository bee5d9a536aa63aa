//! Open files: the per-session handle counts, and deleting an unlinked file at its last close.

use super::Meta;
use crate::changelog::{commit, get_attr, get_chunk, get_trash, Change};
use crate::clock::now_ns;
use crate::error::{sys, Result};
use crate::kv;
use crate::meta::perm::{access, MAY_READ, MAY_WRITE};
use crate::meta::types::*;
use crate::meta::Committed;
use crate::Version;

impl Meta {
    pub(super) fn opened(&self, ino: Ino) {
        let sid = self.session_id();
        *self
            .open_files
            .lock()
            .entry(ino)
            .or_default()
            .entry(sid)
            .or_insert(0) += 1;
    }

    /// Count one more handle on `ino` for this view's session without an access check: a
    /// mirror counts so the handle a create forwarded to the primary opened.
    pub fn count_handle(&self, ino: Ino) {
        self.opened(ino);
    }

    /// Every inode some session holds a handle on, with its handles in all.
    pub fn open_handles(&self) -> Vec<(Ino, u32)> {
        self.open_files
            .lock()
            .iter()
            .map(|(&ino, by_session)| (ino, by_session.values().sum()))
            .filter(|&(_, n)| n > 0)
            .collect()
    }

    /// The handles this view's session holds on `ino`.
    pub fn holds(&self, ino: Ino) -> u32 {
        let sid = self.session_id();
        self.open_files
            .lock()
            .get(&ino)
            .and_then(|by_session| by_session.get(&sid).copied())
            .unwrap_or(0)
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
        self.open_inode_with_chunk0(ctx, ino, flags, false)
            .map(|(a, _)| a)
    }

    /// [`Self::open_inode`], and with `chunk0` the slices of the file's chunk 0, read in the
    /// same snapshot as its attributes: a length with the slices of a later state (a file
    /// deleted between two reads has no slices) would read as zeros.
    pub fn open_inode_with_chunk0(
        &self,
        ctx: &Ctx,
        ino: Ino,
        flags: i32,
        chunk0: bool,
    ) -> Result<(Attr, Option<Vec<SliceRef>>)> {
        // counted before the file is read: a change that may delete it (unlink, rename over
        // it, a last close) then either sees the handle and keeps the file, or has claimed it
        // and this open fails, or has committed before the read below, which finds it gone
        self.count_unless_deleting(ino)?;
        let checked = self.check_open(ctx, ino, flags, chunk0);
        if checked.is_err() {
            self.drop_handle(ino);
        }
        checked
    }

    fn check_open(
        &self,
        ctx: &Ctx,
        ino: Ino,
        flags: i32,
        chunk0: bool,
    ) -> Result<(Attr, Option<Vec<SliceRef>>)> {
        if ino == TRASH_INO {
            // read-only, for everyone
            if flags & libc::O_ACCMODE != libc::O_RDONLY {
                return sys(libc::EISDIR);
            }
            return Ok((self.trash_attr(), None));
        }
        let (a, slices) = kv::read(self.kv.as_ref(), |t| {
            let a = get_attr(t, ino)?.ok_or(crate::error::Error::Sys(libc::ENOENT))?;
            Self::trash_open_check(t, ctx, ino, &a)?;
            let slices = if chunk0 && a.kind == FileKind::File {
                Some(get_chunk(t, ino, 0)?)
            } else {
                None
            };
            Ok((a, slices))
        })?;
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
        Ok((a, slices))
    }

    /// Count a handle on `ino` for this view's session, unless a change has claimed the file
    /// for deletion ([`Self::claim_deletion`]): ENOENT then.
    fn count_unless_deleting(&self, ino: Ino) -> Result<()> {
        let sid = self.session_id();
        let mut of = self.open_files.lock();
        if self.deleting.lock().contains(&ino) {
            return sys(libc::ENOENT);
        }
        *of.entry(ino).or_default().entry(sid).or_insert(0) += 1;
        Ok(())
    }

    /// Take one of this session's handles on `ino` off the table; true when it was the last
    /// handle on the file anywhere.
    fn drop_handle(&self, ino: Ino) -> bool {
        let sid = self.session_id();
        let mut of = self.open_files.lock();
        let Some(by_session) = of.get_mut(&ino) else {
            return false;
        };
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

    /// Before a change that deletes `ino` when no handle is open on it: false when one is;
    /// otherwise the file is claimed, and opens of it fail (ENOENT) until
    /// [`Self::end_deletions`]. Count and claim are decided under the table's lock, which no
    /// I/O is done under.
    pub(super) fn claim_deletion(&self, ino: Ino) -> bool {
        let of = self.open_files.lock();
        if of.get(&ino).is_some_and(|s| s.values().any(|&n| n > 0)) {
            return false;
        }
        self.deleting.lock().insert(ino);
        true
    }

    /// The changes that claimed `inos` committed (or failed): their claims end.
    pub(super) fn end_deletions(&self, inos: &[Ino]) {
        let mut d = self.deleting.lock();
        for ino in inos {
            d.remove(ino);
        }
    }

    /// A handle on `ino` closed; the last close of an unlinked file deletes it.
    pub fn release_versioned(&self, ino: Ino) -> Result<Committed<()>> {
        let last = self.drop_handle(ino);
        let mut version = None;
        if last && !self.is_read_only() {
            version = self.delete_unlinked(ino)?;
        }
        Ok(Committed::new((), version))
    }

    /// Delete `ino` if no entry links it any more and no handle is open on it; returns the
    /// version that did. An open of the unlinked file by inode (a kernel's cached entry)
    /// between the last close and this deletion keeps it ([`Self::claim_deletion`]).
    pub(super) fn delete_unlinked(&self, ino: Ino) -> Result<Option<Version>> {
        // a file still linked is never claimed (opens of it would fail meanwhile); one
        // unlinked stays so, only its deletion can change it
        let unlinked = kv::read(self.kv.as_ref(), |t| {
            let a = get_attr(t, ino)?;
            // an inode in the trash stays there until it is restored or purged
            Ok(a.is_some_and(|a| a.nlink == 0) && get_trash(t, ino)?.is_none())
        })?;
        if !unlinked {
            return Ok(None);
        }
        // kept, unlinked, while deletions are refused: a later close or session end, or a
        // restart's, deletes it once they are allowed again
        if let Some(why) = self.deletions_refused() {
            tracing::info!("unlinked inode {ino} is kept: {why}");
            return Ok(None);
        }
        if !self.claim_deletion(ino) {
            return Ok(None);
        }
        let done = kv::txn(self.kv.as_ref(), |t| match get_attr(t, ino)? {
            Some(a) if a.nlink == 0 && get_trash(t, ino)?.is_none() => {
                commit(t, Change::DeleteInode { ino }, now_ns())
            }
            _ => Ok(()),
        });
        self.end_deletions(&[ino]);
        Ok(done?.1)
    }
}
