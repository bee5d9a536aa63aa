//! Extended attributes: the namespaces' access rules, get, list, set and remove.

use super::{need_attr, Meta};
use crate::changelog::Change;
use crate::clock::now_ns;
use crate::error::{sys, Error, Result};
use crate::kv;
use crate::meta::keys;
use crate::meta::perm::{access, MAY_READ, MAY_WRITE};
use crate::meta::types::*;
use crate::meta::Committed;

impl Meta {
    fn xattr_access(a: &Attr, ctx: &Ctx, name: &[u8], write: bool) -> Result<()> {
        if name.is_empty() || name.len() > XATTR_NAME_LEN_MAX {
            return sys(libc::ERANGE);
        }
        if name.starts_with(b"user.") {
            if !matches!(a.kind, FileKind::File | FileKind::Dir) {
                return sys(if write { libc::EPERM } else { libc::ENODATA });
            }
            if a.is_dir()
                && a.perm as u32 & libc::S_ISVTX != 0
                && write
                && ctx.uid != 0
                && ctx.uid != a.uid
            {
                return sys(libc::EPERM);
            }
            return access(a, ctx, if write { MAY_WRITE } else { MAY_READ });
        }
        if name.starts_with(b"trusted.") {
            return if ctx.uid == 0 {
                Ok(())
            } else {
                sys(libc::EPERM)
            };
        }
        if name.starts_with(b"security.") {
            return if write && ctx.uid != 0 && ctx.uid != a.uid {
                sys(libc::EPERM)
            } else {
                Ok(())
            };
        }
        // system.* (POSIX ACLs) and unknown namespaces
        sys(libc::ENOTSUP)
    }

    pub fn getxattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        kv::read(self.kv.as_ref(), |t| {
            let a = need_attr(t, ino)?;
            Self::xattr_access(&a, ctx, name, false)?;
            t.get(&keys::xattr(ino, name))?
                .ok_or(Error::Sys(libc::ENODATA))
        })
    }

    pub fn listxattr(&self, _ctx: &Ctx, ino: Ino) -> Result<Vec<Vec<u8>>> {
        kv::read(self.kv.as_ref(), |t| {
            need_attr(t, ino)?;
            Ok(t.scan(&keys::group(keys::XATTR, ino), None, usize::MAX)?
                .into_iter()
                .map(|(k, _)| k[9..].to_vec())
                .collect())
        })
    }

    /// setxattr with XATTR_CREATE (fail if it exists) / XATTR_REPLACE (fail if it does not).
    pub fn setxattr_versioned(
        &self,
        ctx: &Ctx,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Result<Committed<()>> {
        self.writable()?;
        if value.len() > XATTR_VALUE_LEN_MAX {
            return sys(libc::E2BIG);
        }
        if flags & !(libc::XATTR_CREATE | libc::XATTR_REPLACE) != 0 {
            return sys(libc::EINVAL);
        }
        kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let mut a = need_attr(t, ino)?;
            Self::xattr_access(&a, ctx, name, true)?;
            let exists = t.get(&keys::xattr(ino, name))?.is_some();
            if flags & libc::XATTR_CREATE != 0 && exists {
                return sys(libc::EEXIST);
            }
            if flags & libc::XATTR_REPLACE != 0 && !exists {
                return sys(libc::ENODATA);
            }
            a.ctime_ns = now;
            self.commit(
                t,
                Change::SetXattr {
                    ino,
                    name: name.into(),
                    value: value.to_vec(),
                    attr: a,
                },
                now,
            )
        })
        .map(Committed::from)
    }

    pub fn removexattr_versioned(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<Committed<()>> {
        self.writable()?;
        kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let mut a = need_attr(t, ino)?;
            Self::xattr_access(&a, ctx, name, true)?;
            if t.get(&keys::xattr(ino, name))?.is_none() {
                return sys(libc::ENODATA);
            }
            a.ctime_ns = now;
            self.commit(
                t,
                Change::RemoveXattr {
                    ino,
                    name: name.into(),
                    attr: a,
                },
                now,
            )
        })
        .map(Committed::from)
    }
}
