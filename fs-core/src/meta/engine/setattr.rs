//! Attribute changes: setattr(2) and the truncate it may carry.

use super::{need_attr, Meta};
use crate::changelog::Change;
use crate::clock::now_ns;
use crate::error::{sys, Error, Result};
use crate::kv;
use crate::layout::CHUNK_SIZE;
use crate::meta::perm::{access, MAY_WRITE};
use crate::meta::types::*;
use crate::meta::Committed;
use crate::SliceId;

impl Meta {
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
            self.commit(t, change, now)?;
            Ok(a)
        })
        .map(Committed::from)
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
        id: SliceId::HOLE,
        size: 0,
        off: 0,
        len: hole_end as u32 - in_chunk,
        pos: in_chunk,
        crcs: vec![],
    };
    (first_dropped, Some((idx, hole)))
}

#[cfg(test)]
mod tests {
    use super::super::check_slice;
    use super::*;

    const C: u64 = CHUNK_SIZE;

    /// The hole `truncate_plan` should hide in chunk `idx`: bytes `pos..pos + len` of it.
    fn hole(idx: u32, pos: u64, len: u64) -> Option<(u32, SliceRef)> {
        Some((
            idx,
            SliceRef {
                id: SliceId::HOLE,
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
