//! Extended attributes: the namespaces' access rules, get, list, set and remove.

use super::clone::clone_xattr;
use super::trash::trash_xattr;
use super::{need_attr, Meta};
use crate::changelog::Change;
use crate::clock::now_ns;
use crate::error::{sys, Error, Result};
use crate::kv;
use crate::meta::keys;
use crate::meta::perm::{access, MAY_READ, MAY_WRITE};
use crate::meta::types::*;
use crate::meta::Committed;

/// The virtual xattrs of the directory quotas (as CephFS's `ceph.quota.*`): they work through
/// every mount, at the primary and at a mirror (which forwards the changes), with the caller's
/// identity; none is stored or listed.
/// - `strait.quota` (get): the directory's quota, `max_bytes=N max_files=N used_bytes=N
///   used_files=N`; remove: remove the quota.
/// - `strait.quota.max_bytes`, `strait.quota.max_files` (set, get, remove): one limit
///   (decimal; 0 or remove: none); setting one gives the directory a quota.
/// - `strait.quota.applied` (get): the nearest quota at or above the directory, `dir=INO ...`
///   (what `df` shows).
/// - `strait.quota.list` (get): the quotas at or under the directory, a line each, `PATH
///   max_bytes=...`, paths from it.
/// - `strait.quota.check` (get): a recount of the subtree beside the usage kept;
///   `strait.quota.repair` (set): the recount replaces the usage when they differ.
pub mod quota_xattr {
    pub const QUOTA: &[u8] = b"strait.quota";
    pub const MAX_BYTES: &[u8] = b"strait.quota.max_bytes";
    pub const MAX_FILES: &[u8] = b"strait.quota.max_files";
    pub const APPLIED: &[u8] = b"strait.quota.applied";
    pub const LIST: &[u8] = b"strait.quota.list";
    pub const CHECK: &[u8] = b"strait.quota.check";
    pub const REPAIR: &[u8] = b"strait.quota.repair";
    /// The namespace of strait's own xattrs.
    pub const PREFIX: &[u8] = b"strait.";

    /// (max_bytes, max_files, used_bytes, used_files) of a quota's text.
    pub fn parse(text: &[u8]) -> Option<(u64, u64, i64, i64)> {
        let text = std::str::from_utf8(text).ok()?;
        let field = |name: &str| -> Option<&str> {
            text.split_whitespace()
                .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
        };
        Some((
            field("max_bytes")?.parse().ok()?,
            field("max_files")?.parse().ok()?,
            field("used_bytes")?.parse().ok()?,
            field("used_files")?.parse().ok()?,
        ))
    }
}

fn quota_text(q: &crate::changelog::quota::Quota) -> String {
    format!(
        "max_bytes={} max_files={} used_bytes={} used_files={}",
        q.limits.space_max, q.limits.inodes_max, q.used_space, q.used_inodes
    )
}

impl Meta {
    /// A virtual `strait.quota*` xattr's value ([`quota_xattr`]).
    fn quota_getxattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        use quota_xattr as x;
        let dir = kv::read(self.kv.as_ref(), |t| need_attr(t, ino))?;
        if !dir.is_dir() {
            return sys(if name.starts_with(x::QUOTA) {
                libc::ENODATA
            } else {
                libc::ENOTSUP
            });
        }
        let text = match name {
            x::QUOTA => quota_text(&self.quota(ino)?.ok_or(Error::Sys(libc::ENODATA))?),
            x::MAX_BYTES => {
                let q = self.quota(ino)?.ok_or(Error::Sys(libc::ENODATA))?;
                q.limits.space_max.to_string()
            }
            x::MAX_FILES => {
                let q = self.quota(ino)?.ok_or(Error::Sys(libc::ENODATA))?;
                q.limits.inodes_max.to_string()
            }
            x::APPLIED => {
                let above = self.quotas_above(ino)?;
                let (d, q) = above.first().ok_or(Error::Sys(libc::ENODATA))?;
                format!("dir={d} {}", quota_text(q))
            }
            x::LIST => self
                .quotas_under(ino)?
                .iter()
                .map(|(path, q)| format!("{path} {}\n", quota_text(q)))
                .collect(),
            x::CHECK => {
                let c = self.check_quota(ctx, ino, false)?;
                format!(
                    "{} used_bytes={} used_files={} counted_bytes={} counted_files={}",
                    if c.consistent() {
                        "consistent"
                    } else {
                        "inconsistent"
                    },
                    c.stored.used_space,
                    c.stored.used_inodes,
                    c.counted.0,
                    c.counted.1
                )
            }
            _ => return sys(libc::ENOTSUP),
        };
        Ok(text.into_bytes())
    }

    /// Setting a virtual `strait.quota*` xattr ([`quota_xattr`]).
    fn quota_setxattr(
        &self,
        ctx: &Ctx,
        ino: Ino,
        name: &[u8],
        value: &[u8],
    ) -> Result<Committed<()>> {
        use quota_xattr as x;
        let number = || -> Result<u64> {
            std::str::from_utf8(value)
                .ok()
                .map(|v| v.trim_matches(|c: char| c.is_whitespace() || c == '\0'))
                .and_then(|v| v.parse().ok())
                .ok_or(Error::Sys(libc::EINVAL))
        };
        match name {
            x::MAX_BYTES | x::MAX_FILES => {
                let n = number()?;
                let mut limits = self.quota(ino)?.map(|q| q.limits).unwrap_or_default();
                if name == x::MAX_BYTES {
                    limits.space_max = n;
                } else {
                    limits.inodes_max = n;
                }
                self.set_quota_versioned(ctx, ino, limits)
            }
            x::REPAIR => {
                self.check_quota(ctx, ino, true)?;
                Ok(Committed::unversioned(()))
            }
            _ => sys(libc::ENOTSUP),
        }
    }

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
        if name.starts_with(clone_xattr::PREFIX) {
            return self.clone_getxattr(ctx, name);
        }
        if name.starts_with(trash_xattr::PREFIX) {
            return self.trash_getxattr(ctx, ino, name);
        }
        if ino == TRASH_INO {
            return sys(libc::ENODATA);
        }
        if name.starts_with(quota_xattr::PREFIX) {
            return self.quota_getxattr(ctx, ino, name);
        }
        kv::read(self.kv.as_ref(), |t| {
            let a = need_attr(t, ino)?;
            Self::xattr_access(&a, ctx, name, false)?;
            t.get(&keys::xattr(ino, name))?
                .ok_or(Error::Sys(libc::ENODATA))
        })
    }

    pub fn listxattr(&self, _ctx: &Ctx, ino: Ino) -> Result<Vec<Vec<u8>>> {
        if ino == TRASH_INO {
            return Ok(vec![]);
        }
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
        if name.starts_with(trash_xattr::PREFIX) {
            return self.trash_setxattr(ctx, ino, name, value);
        }
        if name.starts_with(clone_xattr::PREFIX) {
            return self.clone_setxattr(ctx, ino, name, value);
        }
        if name.starts_with(quota_xattr::PREFIX) {
            return self.quota_setxattr(ctx, ino, name, value);
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
        if name == quota_xattr::QUOTA {
            return self.delete_quota_versioned(ctx, ino);
        }
        if name == quota_xattr::MAX_BYTES || name == quota_xattr::MAX_FILES {
            return self.quota_setxattr(ctx, ino, name, b"0");
        }
        if name.starts_with(quota_xattr::PREFIX) {
            return sys(libc::ENOTSUP);
        }
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
