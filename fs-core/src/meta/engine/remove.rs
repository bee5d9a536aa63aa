//! Removing entries: unlink, rmdir and rename (which may replace or exchange an entry).

use crate::clock::now_ns;
use std::cell::RefCell;

use super::{
    check_name, dir_is_empty, is_ancestor, is_dot, need_attr, need_live_dir, touch_dir, Meta,
};
use crate::changelog::{get_dentry, trash_days, Change, Replaced, Unlinked};
use crate::error::{sys, Error, Result};
use crate::kv;
use crate::meta::perm::{access, sticky_ok, MAY_EXEC, MAY_WRITE};
use crate::meta::types::*;
use crate::meta::Committed;

impl Meta {
    pub fn unlink_versioned(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Committed<()>> {
        self.writable()?;
        if is_dot(name) {
            return sys(libc::EISDIR);
        }
        check_name(name)?;
        let sid = self.session_id();
        // files claimed for deletion (see Meta::claim_deletion), released after the commit
        let claimed = RefCell::new(vec![]);
        let done = kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let mut pa = need_live_dir(t, parent)?;
            access(&pa, ctx, MAY_WRITE | MAY_EXEC)?;
            let (ino, kind) = get_dentry(t, parent, name)?.ok_or(Error::Sys(libc::ENOENT))?;
            if kind == FileKind::Dir {
                return sys(libc::EISDIR);
            }
            let a = need_attr(t, ino)?;
            sticky_ok(&pa, &a, ctx)?;
            let trash = trash_days(t)? > 0;
            let (a, unlinked) = self.fate(ino, a, now, sid, trash, &claimed);
            touch_dir(&mut pa, now);
            self.commit(
                t,
                Change::Unlink {
                    parent,
                    name: name.into(),
                    ino,
                    parent_attr: pa,
                    attr: a,
                    unlinked,
                },
                now,
            )
        });
        self.end_deletions(&claimed.into_inner());
        done.map(Committed::from)
    }

    /// What becomes of `ino` when it loses a link: still linked, moved to the trash (with
    /// `trash`), kept for the handles open on it, or deleted (claimed in `claimed` first, so
    /// no open counts a handle on it meanwhile).
    fn fate(
        &self,
        ino: Ino,
        mut a: Attr,
        now: i64,
        sid: u64,
        trash: bool,
        claimed: &RefCell<Vec<Ino>>,
    ) -> (Attr, Unlinked) {
        a.nlink = a.nlink.saturating_sub(1);
        a.ctime_ns = now;
        if a.nlink > 0 {
            (a, Unlinked::Linked)
        } else if trash {
            (a, Unlinked::Trash)
        } else if a.kind == FileKind::File && !self.claim_deletion(ino) {
            (a, Unlinked::Sustain { sid })
        } else {
            claimed.borrow_mut().push(ino);
            (a, Unlinked::Delete)
        }
    }

    pub fn rmdir_versioned(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Committed<()>> {
        self.writable()?;
        if name == b"." {
            return sys(libc::EINVAL);
        }
        if name == b".." {
            return sys(libc::ENOTEMPTY);
        }
        check_name(name)?;
        kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let mut pa = need_live_dir(t, parent)?;
            access(&pa, ctx, MAY_WRITE | MAY_EXEC)?;
            let (ino, kind) = get_dentry(t, parent, name)?.ok_or(Error::Sys(libc::ENOENT))?;
            if kind != FileKind::Dir {
                return sys(libc::ENOTDIR);
            }
            let a = need_attr(t, ino)?;
            sticky_ok(&pa, &a, ctx)?;
            if !dir_is_empty(t, ino)? {
                return sys(libc::ENOTEMPTY);
            }
            pa.nlink = pa.nlink.saturating_sub(1);
            touch_dir(&mut pa, now);
            if trash_days(t)? > 0 {
                // to the trash, so that the files removed under it can be restored there
                let mut a = a;
                a.nlink = 0;
                a.ctime_ns = now;
                return self.commit(
                    t,
                    Change::Unlink {
                        parent,
                        name: name.into(),
                        ino,
                        parent_attr: pa,
                        attr: a,
                        unlinked: Unlinked::Trash,
                    },
                    now,
                );
            }
            self.commit(
                t,
                Change::Rmdir {
                    parent,
                    name: name.into(),
                    ino,
                    parent_attr: pa,
                },
                now,
            )
        })
        .map(Committed::from)
    }

    /// rename(2) with RENAME_NOREPLACE and RENAME_EXCHANGE (`flags` as in renameat2).
    pub fn rename_versioned(
        &self,
        ctx: &Ctx,
        sp: Ino,
        sn: &[u8],
        dp: Ino,
        dn: &[u8],
        flags: u32,
    ) -> Result<Committed<()>> {
        self.writable()?;
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 || (noreplace && exchange)
        {
            return sys(libc::EINVAL);
        }
        if is_dot(sn) || is_dot(dn) {
            return sys(libc::EINVAL);
        }
        check_name(sn)?;
        check_name(dn)?;
        let sid = self.session_id();
        // a file replaced may be deleted: as in unlink
        let claimed = RefCell::new(vec![]);
        let done = kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let mut spa = need_live_dir(t, sp)?;
            let mut dpa = if dp == sp {
                spa.clone()
            } else {
                need_live_dir(t, dp)?
            };
            access(&spa, ctx, MAY_WRITE | MAY_EXEC)?;
            access(&dpa, ctx, MAY_WRITE | MAY_EXEC)?;
            let (ino, kind) = get_dentry(t, sp, sn)?.ok_or(Error::Sys(libc::ENOENT))?;
            let mut a = need_attr(t, ino)?;
            sticky_ok(&spa, &a, ctx)?;
            let target = get_dentry(t, dp, dn)?;
            if target.is_none() && dp == ROOT_INO && dn == TRASH_NAME {
                // the trash is there, and no rename replaces it
                return sys(libc::EPERM);
            }
            if exchange && target.is_none() {
                return sys(libc::ENOENT);
            }
            if let Some((tino, _)) = target {
                if tino == ino {
                    // both names are links to the same inode: POSIX says do nothing
                    return Ok(());
                }
                if noreplace {
                    return sys(libc::EEXIST);
                }
            }
            // a directory may not move under itself
            if kind == FileKind::Dir && sp != dp {
                if is_ancestor(t, ino, dp)? {
                    return sys(libc::EINVAL);
                }
                // moving a directory rewrites its "..": that needs write access to it
                access(&a, ctx, MAY_WRITE)?;
            }
            let mut replaced = None;
            let trash = target.is_some() && trash_days(t)? > 0;
            if let Some((tino, tkind)) = target {
                let mut ta = need_attr(t, tino)?;
                sticky_ok(&dpa, &ta, ctx)?;
                if exchange {
                    if tkind == FileKind::Dir && sp != dp {
                        if is_ancestor(t, tino, sp)? {
                            return sys(libc::EINVAL);
                        }
                        access(&ta, ctx, MAY_WRITE)?;
                    }
                    if tkind == FileKind::Dir || ta.parent == dp {
                        ta.parent = sp;
                    }
                    ta.ctime_ns = now;
                    // a directory that changes parent takes its ".." link with it
                    if kind == FileKind::Dir && tkind != FileKind::Dir && sp != dp {
                        spa.nlink = spa.nlink.saturating_sub(1);
                        dpa.nlink += 1;
                    } else if kind != FileKind::Dir && tkind == FileKind::Dir && sp != dp {
                        spa.nlink += 1;
                        dpa.nlink = dpa.nlink.saturating_sub(1);
                    }
                    replaced = Some(Replaced {
                        ino: tino,
                        attr: ta,
                        exchange: true,
                        unlinked: Unlinked::Linked,
                    });
                } else {
                    if kind == FileKind::Dir && tkind != FileKind::Dir {
                        return sys(libc::ENOTDIR);
                    }
                    if kind != FileKind::Dir && tkind == FileKind::Dir {
                        return sys(libc::EISDIR);
                    }
                    if tkind == FileKind::Dir {
                        if !dir_is_empty(t, tino)? {
                            return sys(libc::ENOTEMPTY);
                        }
                        dpa.nlink = dpa.nlink.saturating_sub(1);
                        ta.nlink = 0;
                        replaced = Some(Replaced {
                            ino: tino,
                            attr: ta,
                            exchange: false,
                            unlinked: Unlinked::Delete,
                        });
                    } else {
                        let (ta, fate) = self.fate(tino, ta, now, sid, trash, &claimed);
                        replaced = Some(Replaced {
                            ino: tino,
                            attr: ta,
                            exchange: false,
                            unlinked: fate,
                        });
                    }
                }
            }
            // the link that moves is the one its parent names (or it named none yet)
            if kind != FileKind::Dir && (a.parent == sp || a.parent == 0) {
                a.parent = dp;
            }
            if kind == FileKind::Dir {
                a.parent = dp;
                if sp != dp && !exchange {
                    spa.nlink = spa.nlink.saturating_sub(1);
                    dpa.nlink += 1;
                }
            }
            a.ctime_ns = now;
            touch_dir(&mut spa, now);
            touch_dir(&mut dpa, now);
            if sp == dp {
                // one directory: only the destination copy carries link-count changes
                spa = dpa.clone();
            }
            self.commit(
                t,
                Change::Rename {
                    src_parent: sp,
                    src_name: sn.into(),
                    dst_parent: dp,
                    dst_name: dn.into(),
                    ino,
                    attr: a,
                    src_parent_attr: spa,
                    dst_parent_attr: dpa,
                    replaced,
                },
                now,
            )
        });
        self.end_deletions(&claimed.into_inner());
        done.map(Committed::from)
    }
}
