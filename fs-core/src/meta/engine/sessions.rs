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

impl Meta {
    /// Register this client as a session. Sessions and locks are region-local runtime state:
    /// they are not file system content and are not written to the change log.
    pub fn new_session(&self, info: &str) -> Result<u64> {
        let sid = self.kv.incr(&keys::counter(keys::NEXT_SESSION), 1)? as u64;
        let value = encode(&(now_ns(), info.to_string()))?;
        kv::txn(self.kv.as_ref(), |t| {
            t.put(&keys::session(sid), &value);
            Ok(())
        })?;
        self.sid.store(sid, Ordering::Relaxed);
        Ok(sid)
    }

    pub fn heartbeat(&self) -> Result<()> {
        let sid = self.session_id();
        if sid == 0 {
            return Ok(());
        }
        kv::txn(self.kv.as_ref(), |t| {
            let info = match t.get(&keys::session(sid))? {
                Some(b) => decode::<(i64, String)>(&b)?.1,
                None => String::new(),
            };
            t.put(&keys::session(sid), &encode(&(now_ns(), info))?);
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
                let (hb, info): (i64, String) = decode(&v)?;
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
}
