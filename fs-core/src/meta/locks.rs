//! Lock tables for flock(2) and POSIX byte-range locks (pure functions over the tables).

use super::types::{LockType, PosixLock};
use crate::error::{sys, Result};

/// Apply a flock request of (`sid`, `owner`) to `table` of (sid, owner, type).
pub fn flock_apply(
    table: &mut Vec<(u64, u64, LockType)>,
    sid: u64,
    owner: u64,
    typ: LockType,
) -> Result<()> {
    let mine = |e: &(u64, u64, LockType)| e.0 == sid && e.1 == owner;
    if typ == LockType::Unlock {
        table.retain(|e| !mine(e));
        return Ok(());
    }
    let conflict = table
        .iter()
        .any(|e| !mine(e) && (typ == LockType::Write || e.2 == LockType::Write));
    if conflict {
        return sys(libc::EAGAIN);
    }
    table.retain(|e| !mine(e));
    table.push((sid, owner, typ));
    Ok(())
}

/// The first lock of another owner that conflicts with `typ` on `[start, end]`.
pub fn posix_conflict(
    table: &[PosixLock],
    sid: u64,
    owner: u64,
    typ: LockType,
    start: u64,
    end: u64,
) -> Option<&PosixLock> {
    if typ == LockType::Unlock {
        return None;
    }
    table.iter().find(|l| {
        !(l.sid == sid && l.owner == owner)
            && l.start <= end
            && start <= l.end
            && (typ == LockType::Write || l.typ == LockType::Write)
    })
}

/// Set (or, with Unlock, clear) `[start, end]` for (`sid`, `owner`): the owner's existing
/// locks over the range are cut away, then the new one is added and merged with adjacent
/// locks of the same type.
pub fn posix_set(
    table: &mut Vec<PosixLock>,
    sid: u64,
    owner: u64,
    pid: u32,
    typ: LockType,
    start: u64,
    end: u64,
) {
    let mut out = Vec::with_capacity(table.len() + 2);
    for l in table.drain(..) {
        if !(l.sid == sid && l.owner == owner) || l.end < start || l.start > end {
            out.push(l);
            continue;
        }
        if l.start < start {
            out.push(PosixLock {
                end: start - 1,
                ..l.clone()
            });
        }
        if l.end > end {
            out.push(PosixLock {
                start: end + 1,
                ..l
            });
        }
    }
    if typ != LockType::Unlock {
        let mut new = PosixLock {
            sid,
            owner,
            pid,
            typ,
            start,
            end,
        };
        // merge with touching locks of the same owner and type
        out.retain(|l| {
            let same = l.sid == sid && l.owner == owner && l.typ == typ;
            let touches = l.end.checked_add(1).is_some_and(|e| e >= new.start)
                && new.end.checked_add(1).is_none_or(|e| e >= l.start);
            if same && touches {
                new.start = new.start.min(l.start);
                new.end = new.end.max(l.end);
                false
            } else {
                true
            }
        });
        out.push(new);
    }
    out.sort_by_key(|l| (l.start, l.sid, l.owner));
    *table = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flock_shared_and_exclusive() {
        let mut t = vec![];
        flock_apply(&mut t, 1, 10, LockType::Read).unwrap();
        flock_apply(&mut t, 1, 11, LockType::Read).unwrap();
        assert!(flock_apply(&mut t, 1, 12, LockType::Write).is_err());
        flock_apply(&mut t, 1, 10, LockType::Unlock).unwrap();
        flock_apply(&mut t, 1, 11, LockType::Unlock).unwrap();
        flock_apply(&mut t, 1, 12, LockType::Write).unwrap();
        assert!(flock_apply(&mut t, 2, 12, LockType::Read).is_err());
        // the holder may convert its own lock
        flock_apply(&mut t, 1, 12, LockType::Read).unwrap();
        assert_eq!(t, vec![(1, 12, LockType::Read)]);
    }

    #[test]
    fn posix_ranges_split_merge_and_conflict() {
        let mut t = vec![];
        posix_set(&mut t, 1, 7, 100, LockType::Write, 0, 99);
        assert!(posix_conflict(&t, 1, 8, LockType::Read, 50, 60).is_some());
        assert!(posix_conflict(&t, 1, 8, LockType::Read, 100, 200).is_none());
        assert!(posix_conflict(&t, 1, 7, LockType::Write, 0, 10).is_none());
        // unlocking the middle splits the lock in two
        posix_set(&mut t, 1, 7, 100, LockType::Unlock, 40, 59);
        assert_eq!(
            t.iter().map(|l| (l.start, l.end)).collect::<Vec<_>>(),
            vec![(0, 39), (60, 99)]
        );
        assert!(posix_conflict(&t, 1, 8, LockType::Write, 40, 59).is_none());
        // relocking joins them again
        posix_set(&mut t, 1, 7, 100, LockType::Write, 40, 59);
        assert_eq!(
            t.iter().map(|l| (l.start, l.end)).collect::<Vec<_>>(),
            vec![(0, 99)]
        );
        // a read lock inside a write lock of the same owner converts that range
        posix_set(&mut t, 1, 7, 100, LockType::Read, 10, 19);
        assert_eq!(t.len(), 3);
        assert!(posix_conflict(&t, 1, 8, LockType::Read, 10, 19).is_none());
        // whole-file unlock clears everything of that owner
        posix_set(&mut t, 1, 7, 100, LockType::Unlock, 0, u64::MAX);
        assert!(t.is_empty());
    }
}
