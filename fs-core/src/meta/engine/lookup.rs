//! Lookups: attributes, names, access checks, symlink targets, directory listings, statfs.

use super::{check_name, need_attr, need_dir_attr, Meta, READDIR_PAGE};
use crate::changelog::{self, get_attr, get_dentry};
use crate::error::{sys, Error, Result};
use crate::kv;
use crate::meta::keys;
use crate::meta::perm::{access, MAY_EXEC, MAY_READ, MAY_WRITE};
use crate::meta::types::*;

impl Meta {
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        if ino == TRASH_INO {
            return Ok(self.trash_attr());
        }
        kv::read(self.kv.as_ref(), |t| need_attr(t, ino))
    }

    pub fn lookup(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<(Ino, Attr)> {
        if name.len() > NAME_LEN_MAX {
            return sys(libc::ENAMETOOLONG);
        }
        if parent == TRASH_INO {
            return match name {
                b"." => Ok((TRASH_INO, self.trash_attr())),
                b".." => Ok((ROOT_INO, self.getattr(ROOT_INO)?)),
                _ => self.trash_lookup(ctx, name),
            };
        }
        kv::read(self.kv.as_ref(), |t| {
            let pa = need_dir_attr(t, parent)?;
            access(&pa, ctx, MAY_EXEC)?;
            if name == b"." {
                return Ok((parent, pa));
            }
            if name == b".." {
                return Ok((pa.parent, need_attr(t, pa.parent)?));
            }
            check_name(name)?;
            let Some((ino, _)) = get_dentry(t, parent, name)? else {
                // the trash, at the root: an entry of that name, made before there was a
                // trash, hides it
                if parent == ROOT_INO && name == TRASH_NAME {
                    return Ok((TRASH_INO, self.trash_attr()));
                }
                return sys(libc::ENOENT);
            };
            let attr = get_attr(t, ino)?.ok_or_else(|| {
                Error::corrupt(format!(
                    "entry {parent}/{} points at missing inode {ino}",
                    String::from_utf8_lossy(name)
                ))
            })?;
            Ok((ino, attr))
        })
    }

    pub fn access(&self, ctx: &Ctx, ino: Ino, mask: u32) -> Result<()> {
        let a = self.getattr(ino)?;
        if mask & MAY_WRITE != 0 && self.is_read_only() && !self.writes_elsewhere {
            return sys(libc::EROFS);
        }
        access(&a, ctx, mask)
    }

    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        kv::read(self.kv.as_ref(), |t| {
            let a = need_attr(t, ino)?;
            if a.kind != FileKind::Symlink {
                return sys(libc::EINVAL);
            }
            t.get(&keys::symlink(ino))?
                .ok_or_else(|| Error::corrupt(format!("symlink {ino} has no target")))
        })
    }

    /// Every entry of directory `ino` (without `.` and `..`), in name order.
    pub fn readdir(&self, ctx: &Ctx, ino: Ino) -> Result<Vec<DirEntry>> {
        if ino == TRASH_INO {
            return self.trash_readdir(ctx);
        }
        kv::read(self.kv.as_ref(), |t| {
            let a = need_dir_attr(t, ino)?;
            access(&a, ctx, MAY_READ)?;
            let prefix = keys::group(keys::DENTRY, ino);
            let mut out = vec![];
            let mut after: Option<Vec<u8>> = None;
            loop {
                let page = t.scan(&prefix, after.as_deref(), READDIR_PAGE)?;
                let n = page.len();
                for (k, v) in page {
                    let (child, kind) = changelog::decode_dentry(&v)?;
                    out.push(DirEntry {
                        name: k[9..].to_vec(),
                        ino: child,
                        kind,
                    });
                    after = Some(k);
                }
                if n < READDIR_PAGE {
                    return Ok(out);
                }
            }
        })
    }

    pub fn statfs(&self) -> Result<StatFs> {
        let (used, inodes) = kv::read(self.kv.as_ref(), |t| {
            let used = kv::decode_counter(t.get(&keys::counter(keys::USED_SPACE))?)?;
            let inodes = kv::decode_counter(t.get(&keys::counter(keys::TOTAL_INODES))?)?;
            Ok((used, inodes))
        })?;
        let total = if self.format.capacity_bytes == 0 {
            1 << 50
        } else {
            self.format.capacity_bytes
        };
        Ok(StatFs {
            total_bytes: total,
            used_bytes: used.max(0) as u64,
            inodes: inodes.max(0) as u64,
            block_size: self.format.block_size,
        })
    }
}
