//! Locks: flock(2) and POSIX record locks, region-local state outside the change log.

use super::Meta;
use crate::changelog::{decode, encode};
use crate::error::{sys, Error, Result};
use crate::kv::{self, KvTxn};
use crate::meta::types::*;
use crate::meta::{keys, locks};

impl Meta {
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
