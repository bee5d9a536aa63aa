//! Locks: flock(2) and POSIX record locks, region-local state outside the change log.

use super::Meta;
use crate::changelog::{decode, encode};
use crate::error::{sys, Error, Result};
use crate::kv::{self, KvTxn};
use crate::meta::types::*;
use crate::meta::{keys, locks};

/// How long after an engine's locks may have been lost (its metadata replaced by a snapshot
/// at a rejoin or a bootstrap, its daemon restarted) it grants no new lock: the mounts that
/// held locks take them again first, as they resume their sessions (NFSv4's grace period).
/// Longer than a mount's heartbeat interval (at most 10 s), after which it finds its daemon
/// replaced and resumes.
pub const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(15);

/// Why a new lock is refused at `now_ns` in `t` (the grace period), if it is.
fn in_grace(t: &mut dyn KvTxn, now_ns: i64) -> Result<Option<String>> {
    let Some(b) = t.get(&keys::lock_grace())? else {
        return Ok(None);
    };
    let from = i64::from_le_bytes(
        b.as_slice()
            .try_into()
            .map_err(|_| Error::corrupt("the lock grace key"))?,
    );
    let until = from.saturating_add(LOCK_GRACE.as_nanos() as i64);
    Ok((now_ns < until).then(|| {
        format!(
            "locks are being taken back by the mounts that held them (the grace period ends \
             in {} ms): no new lock until then",
            (until - now_ns) / 1_000_000
        )
    }))
}

/// Note in `kv` (an engine whose metadata was just replaced, with its locks: a rejoin, a
/// set-aside) that the daemon that next starts on it begins a grace period
/// ([`Meta::lock_grace_at_start`]).
pub fn mark_locks_lost(kv: &dyn kv::KvEngine) -> Result<()> {
    kv::txn(kv, |t| {
        t.put(&keys::lock_grace(), &0i64.to_le_bytes());
        Ok(())
    })?;
    Ok(())
}

/// [`Meta::begin_lock_grace`] on the engine `kv` (a mirror whose metadata a new bootstrap
/// just replaced, with its locks).
pub fn lock_grace_from_now(kv: &dyn kv::KvEngine) -> Result<()> {
    let now = crate::clock::now_ns();
    kv::txn(kv, |t| {
        t.put(&keys::lock_grace(), &now.to_le_bytes());
        Ok(())
    })?;
    Ok(())
}

impl Meta {
    /// At a daemon's start: begin a grace period ([`Self::begin_lock_grace`]) when the engine
    /// lists sessions (mounts that will resume, whose locks a power loss may have taken) or
    /// its locks were noted lost ([`mark_locks_lost`]). Whether it began one.
    pub fn lock_grace_at_start(&self) -> Result<bool> {
        let pending = kv::read(self.kv.as_ref(), |t| {
            Ok(t.get(&keys::lock_grace())?.as_deref() == Some(&0i64.to_le_bytes()[..]))
        })?;
        let own = self.session_id();
        let listed = self.sessions()?.iter().any(|s| s.0 != own);
        if pending || listed {
            self.begin_lock_grace()?;
            return Ok(true);
        }
        Ok(false)
    }

    /// From now on, for [`LOCK_GRACE`], grant no new lock: this engine's locks may be
    /// missing (its metadata was replaced, or its daemon restarted), and the mounts that held
    /// them take them again first ([`Self::reclaim_lock`]).
    pub fn begin_lock_grace(&self) -> Result<()> {
        lock_grace_from_now(self.kv.as_ref())
    }

    /// A lock this view's session held before its daemon's locks were lost, taken again as
    /// the session resumes: granted in the grace period too, unless another holds a
    /// conflicting one (then EAGAIN: it is lost).
    pub fn reclaim_lock(&self, ino: Ino, lock: &HeldLock) -> Result<()> {
        if lock.flock {
            self.flock_as(ino, lock.owner, lock.typ, true)
        } else {
            self.setlk_as(
                ino, lock.owner, lock.pid, lock.typ, lock.start, lock.end, true,
            )
        }
    }

    /// flock(2) on `ino` for handle `owner`. Never blocks: a conflict is EAGAIN (and so is a
    /// new lock in the grace period).
    pub fn flock(&self, ino: Ino, owner: u64, typ: LockType) -> Result<()> {
        self.flock_as(ino, owner, typ, false)
    }

    fn flock_as(&self, ino: Ino, owner: u64, typ: LockType, reclaim: bool) -> Result<()> {
        let sid = self.session_id();
        let now = crate::clock::now_ns();
        kv::txn(self.kv.as_ref(), |t| {
            if typ != LockType::Unlock && !reclaim {
                if let Some(why) = in_grace(t, now)? {
                    tracing::debug!("flock of inode {ino}: {why}");
                    return sys(libc::EAGAIN);
                }
            }
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

    /// F_SETLK: take or release a POSIX lock; a conflict is EAGAIN (callers that may wait
    /// retry), and so is a new lock in the grace period.
    pub fn setlk(
        &self,
        ino: Ino,
        owner: u64,
        pid: u32,
        typ: LockType,
        start: u64,
        end: u64,
    ) -> Result<()> {
        self.setlk_as(ino, owner, pid, typ, start, end, false)
    }

    #[allow(clippy::too_many_arguments)]
    fn setlk_as(
        &self,
        ino: Ino,
        owner: u64,
        pid: u32,
        typ: LockType,
        start: u64,
        end: u64,
        reclaim: bool,
    ) -> Result<()> {
        if start > end {
            return sys(libc::EINVAL);
        }
        let sid = self.session_id();
        let now = crate::clock::now_ns();
        kv::txn(self.kv.as_ref(), |t| {
            if typ != LockType::Unlock && !reclaim {
                if let Some(why) = in_grace(t, now)? {
                    tracing::debug!("setlk of inode {ino}: {why}");
                    return sys(libc::EAGAIN);
                }
            }
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

    pub(super) fn release_session_locks(&self, sid: u64) -> Result<()> {
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
}

fn store_table<T: serde::Serialize>(t: &mut dyn KvTxn, key: &[u8], table: &[T]) -> Result<()> {
    if table.is_empty() {
        t.delete(key);
    } else {
        t.put(key, &encode(&table)?);
    }
    Ok(())
}
