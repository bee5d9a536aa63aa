//! Creating entries: mknod, mkdir, create, symlink and link, all through one transaction shape.

use super::{check_name, is_dot, need_attr, need_live_dir, touch_dir, Meta};
use crate::changelog::{get_dentry, Change, Name};
use crate::clock::now_ns;
use crate::error::{sys, Error, Result};
use crate::kv;
use crate::meta::perm::{access, MAY_EXEC, MAY_WRITE};
use crate::meta::types::*;
use crate::meta::Committed;

impl Meta {
    fn new_attr(ctx: &Ctx, parent: &Attr, kind: FileKind, mode: u32, umask: u32, now: i64) -> Attr {
        // directories take only the permission and sticky bits from the mode (as Linux does)
        let allowed = if kind == FileKind::Dir {
            0o1777
        } else {
            0o7777
        };
        let mut perm = (mode & allowed & !(umask & 0o777)) as u16;
        let mut gid = ctx.gid;
        if parent.perm as u32 & libc::S_ISGID != 0 {
            gid = parent.gid;
            if kind == FileKind::Dir {
                perm |= libc::S_ISGID as u16;
            }
        }
        if kind != FileKind::Dir
            && perm as u32 & libc::S_ISGID != 0
            && ctx.uid != 0
            && !ctx.in_group(gid)
        {
            perm &= !(libc::S_ISGID as u16);
        }
        Attr {
            kind,
            perm,
            uid: ctx.uid,
            gid,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            length: if kind == FileKind::Dir { 4096 } else { 0 },
            rdev: 0,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            parent: 0,
        }
    }

    // The arguments are those of the creating system calls; a struct would only rename them.
    #[allow(clippy::too_many_arguments)]
    fn create_entry(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        umask: u32,
        rdev: u32,
        target: Option<&[u8]>,
    ) -> Result<Committed<(Ino, Attr)>> {
        self.writable()?;
        if is_dot(name) {
            return sys(libc::EEXIST);
        }
        check_name(name)?;
        if parent == ROOT_INO && name == TRASH_NAME {
            // the trash is there
            return sys(libc::EEXIST);
        }
        let ino = self.next_inode()?;
        let (attr, version) = kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let mut pa = need_live_dir(t, parent)?;
            access(&pa, ctx, MAY_WRITE | MAY_EXEC)?;
            if pa.nlink == 0 {
                // the directory was removed while we held its inode number
                return sys(libc::ENOENT);
            }
            if get_dentry(t, parent, name)?.is_some() {
                return sys(libc::EEXIST);
            }
            let mut a = Self::new_attr(ctx, &pa, kind, mode, umask, now);
            a.rdev = rdev;
            // every kind knows its directory (a subtree's confinement follows it)
            a.parent = parent;
            if kind == FileKind::Dir {
                if pa.nlink >= NLINK_MAX {
                    return sys(libc::EMLINK);
                }
                pa.nlink += 1;
            }
            if let Some(target) = target {
                a.length = target.len() as u64;
            }
            touch_dir(&mut pa, now);
            self.commit(
                t,
                Change::Create {
                    parent,
                    name: name.into(),
                    ino,
                    attr: a.clone(),
                    parent_attr: pa,
                    target: target.map(Name::from),
                },
                now,
            )?;
            Ok(a)
        })?;
        Ok(Committed::new((ino, attr), version))
    }

    pub fn mknod_versioned(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Committed<(Ino, Attr)>> {
        let kind = FileKind::from_mode(mode).ok_or(Error::Sys(libc::EINVAL))?;
        if kind == FileKind::Dir || kind == FileKind::Symlink {
            return sys(libc::EINVAL);
        }
        if matches!(kind, FileKind::CharDev | FileKind::BlockDev) && ctx.uid != 0 {
            return sys(libc::EPERM);
        }
        self.create_entry(ctx, parent, name, kind, mode, umask, rdev, None)
    }

    pub fn mkdir_versioned(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Committed<(Ino, Attr)>> {
        self.create_entry(ctx, parent, name, FileKind::Dir, mode, umask, 0, None)
    }

    /// Create a regular file and count it open (O_CREAT); an existing name is EEXIST.
    pub fn create_versioned(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Committed<(Ino, Attr)>> {
        let made = self.create_entry(ctx, parent, name, FileKind::File, mode, umask, 0, None)?;
        self.opened(made.value.0);
        Ok(made)
    }

    pub fn symlink_versioned(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        target: &[u8],
    ) -> Result<Committed<(Ino, Attr)>> {
        if target.is_empty() || target.contains(&0) {
            return sys(libc::EINVAL);
        }
        if target.len() > SYMLINK_LEN_MAX {
            return sys(libc::ENAMETOOLONG);
        }
        self.create_entry(
            ctx,
            parent,
            name,
            FileKind::Symlink,
            0o777,
            0,
            0,
            Some(target),
        )
    }

    pub fn link_versioned(
        &self,
        ctx: &Ctx,
        ino: Ino,
        parent: Ino,
        name: &[u8],
    ) -> Result<Committed<Attr>> {
        self.writable()?;
        if is_dot(name) {
            return sys(libc::EEXIST);
        }
        check_name(name)?;
        if parent == ROOT_INO && name == TRASH_NAME {
            return sys(libc::EEXIST);
        }
        kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let mut pa = need_live_dir(t, parent)?;
            access(&pa, ctx, MAY_WRITE | MAY_EXEC)?;
            let mut a = need_attr(t, ino)?;
            if a.is_dir() {
                return sys(libc::EPERM);
            }
            if a.nlink == 0 {
                return sys(libc::ENOENT);
            }
            if a.nlink >= NLINK_MAX {
                return sys(libc::EMLINK);
            }
            if get_dentry(t, parent, name)?.is_some() {
                return sys(libc::EEXIST);
            }
            a.nlink += 1;
            a.ctime_ns = now;
            touch_dir(&mut pa, now);
            self.commit(
                t,
                Change::Link {
                    parent,
                    name: name.into(),
                    ino,
                    attr: a.clone(),
                    parent_attr: pa,
                },
                now,
            )?;
            Ok(a)
        })
        .map(Committed::from)
    }
}
