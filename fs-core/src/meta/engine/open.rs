//! Open files: the per-session handle counts, and deleting an unlinked file at its last close.

use super::Meta;
use crate::changelog::{commit, get_attr, get_chunk, Change};
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
        let _gate = self.open_gate.read();
        let (a, slices) = kv::read(self.kv.as_ref(), |t| {
            let a = get_attr(t, ino)?.ok_or(crate::error::Error::Sys(libc::ENOENT))?;
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
        self.opened(ino);
        Ok((a, slices))
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

    /// Delete `ino` if no entry links it any more and no handle is open on it; returns the
    /// version that did. The count is read under the open gate: an open of the unlinked
    /// file by inode (a kernel's cached entry) between the last close and this deletion
    /// keeps it.
    pub(super) fn delete_unlinked(&self, ino: Ino) -> Result<Option<Version>> {
        let _gate = self.open_gate.write();
        if self.open_count(ino) > 0 {
            return Ok(None);
        }
        let ((), version) = kv::txn(self.kv.as_ref(), |t| match get_attr(t, ino)? {
            Some(a) if a.nlink == 0 => commit(t, Change::DeleteInode { ino }, now_ns()),
            _ => Ok(()),
        })?;
        Ok(version)
    }
}
