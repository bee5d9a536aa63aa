//! Data: chunks' slice lists, written slices, compaction, and dead slices for GC.

use super::{check_slice, need_attr, Meta};
use crate::changelog::{decode, get_chunk, Change, DeadSlice};
use crate::clock::now_ns;
use crate::error::{sys, Error, Result};
use crate::kv;
use crate::layout::CHUNK_SIZE;
use crate::meta::keys;
use crate::meta::types::*;
use crate::meta::Committed;
use crate::SliceId;

impl Meta {
    /// The slices of chunk `idx` of `ino`. ENOENT when the inode is gone: a chunk with no
    /// slices reads as zeros up to the file's length, which a reader that learned the length
    /// before the file was deleted (at a mirror, where the deletion arrives through the log
    /// between a mount's open and its read) would take for the file's bytes.
    pub fn read_chunk(&self, ino: Ino, idx: u32) -> Result<Vec<SliceRef>> {
        kv::read(self.kv.as_ref(), |t| {
            let slices = get_chunk(t, ino, idx)?;
            if slices.is_empty() {
                // one more read, only for an empty chunk, in the same snapshot
                need_attr(t, ino)?;
            }
            Ok(slices)
        })
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
            self.commit(
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
            self.commit(
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
    pub fn dead_slices(&self, before_ns: i64, limit: usize) -> Result<Vec<(SliceId, DeadSlice)>> {
        kv::read(self.kv.as_ref(), |t| {
            let mut out = vec![];
            for (k, v) in t.scan(&keys::group(keys::DEADSLICE, 0), None, usize::MAX)? {
                let d: DeadSlice = decode(&v)?;
                if d.freed_ns < before_ns {
                    out.push((
                        keys::u64_at(&k, 9)
                            .map(SliceId)
                            .ok_or_else(|| Error::corrupt("dead slice key"))?,
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
    pub fn purge_slices(&self, ids: Vec<SliceId>) -> Result<Committed<()>> {
        if ids.is_empty() {
            return Ok(Committed::unversioned(()));
        }
        kv::txn(self.kv.as_ref(), |t| {
            self.commit(t, Change::PurgeSlices { ids: ids.clone() }, now_ns())
        })
        .map(Committed::from)
    }
}
