//! Sessions: registering mounts, their heartbeats, and closing them (with what they held).

use crate::clock::now_ns;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

use super::Meta;
use crate::changelog::{decode, encode};
use crate::error::{Error, Result};
use crate::kv;
use crate::meta::keys;
use crate::meta::types::*;
use crate::meta::Committed;

/// Tries at a free random session id before giving up (a collision among 2^63 ids is
/// already unlikely once).
const SESSION_ID_TRIES_MAX: usize = 16;

/// A new session id: random, above 0, below 2^63 (it fits every signed 64-bit field a tool
/// may read it into).
fn random_session_id() -> u64 {
    (rand::random::<u64>() >> 1).max(1)
}

/// A session's record: its last heartbeat (ns), its description and its owner. Records of
/// earlier releases have no owner (read as empty); a record with one reads as the two fields
/// in those releases (postcard ignores what follows).
fn decode_session(b: &[u8]) -> Result<(i64, String, String)> {
    match decode::<(i64, String, String)>(b) {
        Ok(v) => Ok(v),
        Err(_) => {
            let (hb, info): (i64, String) = decode(b)?;
            Ok((hb, info, String::new()))
        }
    }
}

impl Meta {
    /// Register this client as a session. Sessions and locks are region-local runtime state:
    /// they are not file system content and are not written to the change log.
    pub fn new_session(&self, info: &str) -> Result<u64> {
        self.new_session_owned(info, "")
    }

    /// [`Meta::new_session`] for the caller `owner` (who opened it, as a site daemon knows
    /// its callers; empty: anyone who names it). The id is random, not the next of a count:
    /// a session's id is all a call names, so it must not be guessed.
    pub fn new_session_owned(&self, info: &str, owner: &str) -> Result<u64> {
        let value = encode(&(now_ns(), info.to_string(), owner.to_string()))?;
        for _ in 0..SESSION_ID_TRIES_MAX {
            let sid = random_session_id();
            let taken = kv::txn(self.kv.as_ref(), |t| {
                if t.get(&keys::session(sid))?.is_some() {
                    return Ok(true);
                }
                t.put(&keys::session(sid), &value);
                Ok(false)
            })?;
            if !taken.0 {
                self.sid.store(sid, Ordering::Relaxed);
                return Ok(sid);
            }
        }
        Err(Error::Sys(libc::EAGAIN))
    }

    /// Who opened session `sid` (empty: a session of an earlier release, or of an embedded
    /// mount, owned by no one in particular); None when no such session is listed.
    pub fn session_owner(&self, sid: u64) -> Result<Option<String>> {
        kv::read(self.kv.as_ref(), |t| match t.get(&keys::session(sid))? {
            Some(b) => Ok(Some(decode_session(&b)?.2)),
            None => Ok(None),
        })
    }

    /// Heartbeat this view's session, and make `owner` its owner when it has none (a
    /// session of an earlier release, resumed).
    pub fn claim_session(&self, owner: &str) -> Result<()> {
        self.touch_session(Some(owner))
    }

    pub fn heartbeat(&self) -> Result<()> {
        self.touch_session(None)
    }

    fn touch_session(&self, claim: Option<&str>) -> Result<()> {
        let sid = self.session_id();
        if sid == 0 {
            return Ok(());
        }
        kv::txn(self.kv.as_ref(), |t| {
            let (info, owner) = match t.get(&keys::session(sid))? {
                Some(b) => {
                    let (_, info, owner) = decode_session(&b)?;
                    (info, owner)
                }
                None => (String::new(), String::new()),
            };
            let owner = match claim {
                Some(c) if owner.is_empty() => c.to_string(),
                _ => owner,
            };
            t.put(&keys::session(sid), &encode(&(now_ns(), info, owner))?);
            Ok(())
        })?;
        Ok(())
    }

    /// All sessions with their last heartbeat (ns) and description.
    pub fn sessions(&self) -> Result<Vec<(u64, i64, String)>> {
        kv::read(self.kv.as_ref(), |t| {
            let mut out = vec![];
            for (k, v) in t.scan(&keys::group(keys::SESSION, 0), None, usize::MAX)? {
                let sid = keys::u64_at(&k, 9).ok_or_else(|| Error::corrupt("session key"))?;
                let (hb, info, _) = decode_session(&v)?;
                out.push((sid, hb, info));
            }
            Ok(out)
        })
    }

    /// Remove session `sid`: drop its handles, release its locks and delete the unlinked files
    /// that no live session holds open any more (those `sid` sustained, and those whose
    /// sustaining session is gone).
    pub fn close_session_versioned(&self, sid: u64) -> Result<Committed<()>> {
        {
            let mut of = self.open_files.lock();
            for by_session in of.values_mut() {
                by_session.remove(&sid);
            }
            of.retain(|_, by_session| !by_session.is_empty());
        }
        kv::txn(self.kv.as_ref(), |t| {
            t.delete(&keys::session(sid));
            Ok(())
        })?;
        let live: HashSet<u64> = self.sessions()?.into_iter().map(|s| s.0).collect();
        let sustained: Vec<Ino> = kv::read(self.kv.as_ref(), |t| {
            let mut v = vec![];
            for (k, val) in t.scan(&keys::group(keys::DELFILE, 0), None, usize::MAX)? {
                let owner = keys::u64_at(&val, 0).unwrap_or(0);
                if owner == sid || !live.contains(&owner) {
                    v.push(keys::u64_at(&k, 9).ok_or_else(|| Error::corrupt("delfile key"))?);
                }
            }
            Ok(v)
        })?;
        let mut version = None;
        // a read-only engine (a mirror's) deletes nothing itself: the primary decides when an
        // unlinked file goes, and the mirror applies that
        let sustained = if self.is_read_only() {
            vec![]
        } else {
            sustained
        };
        for ino in sustained {
            // kept while some other session holds it open
            version = version.max(self.delete_unlinked(ino)?);
        }
        self.release_session_locks(sid)?;
        Ok(Committed::new((), version))
    }

    /// Close every session whose heartbeat is older than `timeout_ns`; returns their ids.
    pub fn clean_stale_sessions(&self, timeout_ns: i64) -> Result<Vec<u64>> {
        let now = now_ns();
        let mut closed = vec![];
        for (sid, hb, _) in self.sessions()? {
            if sid != self.session_id() && now - hb > timeout_ns {
                self.close_session_versioned(sid)?;
                closed.push(sid);
            }
        }
        Ok(closed)
    }
}

#[cfg(test)]
mod tests {
    use crate::kv;
    use crate::meta::conformance::fresh;
    use crate::meta::keys;
    use crate::meta::types::*;
    use crate::meta::{Meta, MetaOptions};

    #[test]
    fn a_read_only_engine_deletes_no_unlinked_file_when_a_session_ends() {
        let (kv, meta) = fresh(&|| std::sync::Arc::new(kv::memory::MemoryKv::new()) as kv::DynKv);
        let ctx = Ctx::root();
        let ino = meta
            .create_versioned(&ctx, ROOT_INO, b"f", 0o644, 0)
            .unwrap()
            .value
            .0;
        meta.unlink_versioned(&ctx, ROOT_INO, b"f").unwrap();
        // at a mirror the session that sustains the file is the primary's, unknown here
        kv::txn(kv.as_ref(), |t| {
            t.delete(&keys::session(meta.session_id()));
            Ok(())
        })
        .unwrap();
        let ro = Meta::open(
            kv.clone(),
            MetaOptions {
                read_only: true,
                writes_elsewhere: true,
            },
        )
        .unwrap();
        let sid = ro.new_session("a mount at a mirror").unwrap();
        ro.close_session_versioned(sid).unwrap();
        assert_eq!(
            ro.getattr(ino).map(|a| a.nlink).ok(),
            Some(0),
            "a session ending at a read-only engine deleted an unlinked file"
        );
    }

    /// Issue 43, item 1: session ids were a count, so any mount could name another's. Now
    /// they are random, each records who opened it, a heartbeat keeps that, and a record of
    /// an earlier release (no owner) still reads, and is claimed by the first to resume it.
    #[test]
    fn sessions_have_random_ids_and_keep_their_owner() {
        let (kv, meta) = fresh(&|| std::sync::Arc::new(kv::memory::MemoryKv::new()) as kv::DynKv);
        let a = meta.new_session_owned("a", "token:aaaa").unwrap();
        let b = meta.new_session_owned("b", "cert:team-b").unwrap();
        assert!(
            a.abs_diff(b) > 1_000_000,
            "ids {a} and {b} follow each other"
        );
        assert!(a < 1 << 63 && b < 1 << 63);
        assert_eq!(
            meta.session_owner(a).unwrap().as_deref(),
            Some("token:aaaa")
        );
        assert_eq!(
            meta.session_owner(b).unwrap().as_deref(),
            Some("cert:team-b")
        );
        assert_eq!(meta.session_owner(12345).unwrap(), None);
        // a heartbeat keeps the owner; a claim does not replace one
        let va = meta.session_view(a);
        va.heartbeat().unwrap();
        va.claim_session("token:other").unwrap();
        assert_eq!(
            meta.session_owner(a).unwrap().as_deref(),
            Some("token:aaaa")
        );
        // an earlier release's record: (heartbeat, info), no owner
        let old = 77;
        kv::txn(kv.as_ref(), |t| {
            t.put(
                &keys::session(old),
                &crate::changelog::encode(&(5i64, "old".to_string()))?,
            );
            Ok(())
        })
        .unwrap();
        assert_eq!(meta.session_owner(old).unwrap().as_deref(), Some(""));
        assert!(meta
            .sessions()
            .unwrap()
            .iter()
            .any(|s| s.0 == old && s.2 == "old"));
        meta.session_view(old).claim_session("token:first").unwrap();
        assert_eq!(
            meta.session_owner(old).unwrap().as_deref(),
            Some("token:first")
        );
        // and the new record reads in an earlier release, as its two fields
        let raw = kv::read(kv.as_ref(), |t| t.get(&keys::session(a)))
            .unwrap()
            .unwrap();
        let (_, info): (i64, String) = crate::changelog::decode(&raw).unwrap();
        assert_eq!(info, "a");
    }
}
