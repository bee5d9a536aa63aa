//! The locks a mount holds, as its daemon granted them: named again when the session is
//! resumed, so that a daemon whose locks are gone (its metadata replaced at a rejoin or a
//! bootstrap, a power loss) takes them back in its grace period before it grants new ones
//! (`strait_fs_core::meta::LOCK_GRACE`).

use std::collections::HashMap;

use strait_fs_core::meta::locks::{flock_apply, posix_set};
use strait_fs_core::meta::{HeldLock, Ino, LockType, PosixLock};
use strait_proto::meta as w;

/// This mount's locks: POSIX byte-range locks and flock(2) locks, per inode. Kept with the
/// daemon's own rules (the same pure functions), under one session id of 0: the mount's.
#[derive(Debug, Default)]
pub(crate) struct HeldLocks {
    posix: HashMap<Ino, Vec<PosixLock>>,
    flock: HashMap<Ino, Vec<(u64, u64, LockType)>>,
}

impl HeldLocks {
    /// The daemon granted (or released) a POSIX lock.
    pub(crate) fn setlk(
        &mut self,
        ino: Ino,
        owner: u64,
        pid: u32,
        typ: LockType,
        start: u64,
        end: u64,
    ) {
        let table = self.posix.entry(ino).or_default();
        posix_set(table, 0, owner, pid, typ, start, end);
        if table.is_empty() {
            self.posix.remove(&ino);
        }
    }

    /// The daemon granted (or released) a flock.
    pub(crate) fn flock(&mut self, ino: Ino, owner: u64, typ: LockType) {
        let table = self.flock.entry(ino).or_default();
        if typ != LockType::Unlock {
            // the daemon granted it: drop whatever this mount's table says against it
            table.retain(|e| e.1 == owner);
        }
        let _ = flock_apply(table, 0, owner, typ);
        if table.is_empty() {
            self.flock.remove(&ino);
        }
    }

    /// Every lock held, as a resumed session names them.
    pub(crate) fn all(&self) -> Vec<w::HeldLock> {
        let posix = self.posix.iter().flat_map(|(&ino, t)| {
            t.iter().map(move |l| {
                strait_proto::held_lock_to_wire(
                    ino,
                    &HeldLock {
                        owner: l.owner,
                        pid: l.pid,
                        typ: l.typ,
                        start: l.start,
                        end: l.end,
                        flock: false,
                    },
                )
            })
        });
        let flock = self.flock.iter().flat_map(|(&ino, t)| {
            t.iter().map(move |&(_, owner, typ)| {
                strait_proto::held_lock_to_wire(
                    ino,
                    &HeldLock {
                        owner,
                        pid: 0,
                        typ,
                        start: 0,
                        end: 0,
                        flock: true,
                    },
                )
            })
        });
        posix.chain(flock).collect()
    }

    /// The daemon could not give these back (another holds a conflicting lock now): they are
    /// no longer held.
    pub(crate) fn forget(&mut self, lost: &[w::HeldLock]) {
        for l in lost {
            if l.flock {
                self.flock(l.ino, l.owner, LockType::Unlock);
            } else {
                self.setlk(l.ino, l.owner, l.pid, LockType::Unlock, l.start, l.end);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_follows_what_the_daemon_granted_and_released() {
        let mut h = HeldLocks::default();
        h.setlk(7, 1, 100, LockType::Write, 0, 99);
        h.setlk(7, 1, 100, LockType::Unlock, 10, 19);
        h.flock(8, 2, LockType::Read);
        let mut all = h.all();
        all.sort_by_key(|l| (l.ino, l.start));
        assert_eq!(all.len(), 3, "{all:?}");
        assert_eq!((all[0].start, all[0].end), (0, 9));
        assert_eq!((all[1].start, all[1].end), (20, 99));
        assert!(all[2].flock && all[2].ino == 8);
        // a lock lost at a resumption is no longer held
        h.forget(&all[1..2]);
        h.flock(8, 2, LockType::Unlock);
        let left = h.all();
        assert_eq!(left.len(), 1);
        assert_eq!((left[0].start, left[0].end), (0, 9));
    }
}
