//! POSIX permission checks (pure functions).

use super::types::{Attr, Ctx};
use crate::error::{sys, Result};

pub const MAY_READ: u32 = 4;
pub const MAY_WRITE: u32 = 2;
pub const MAY_EXEC: u32 = 1;

/// Check that `ctx` may access `attr` with `mask` (a combination of MAY_* bits).
pub fn access(attr: &Attr, ctx: &Ctx, mask: u32) -> Result<()> {
    if mask == 0 {
        return Ok(());
    }
    let perm = attr.perm as u32;
    if ctx.uid == 0 {
        // root may read and write anything, and execute what anybody may execute.
        if mask & MAY_EXEC != 0 && !attr.is_dir() && perm & 0o111 == 0 {
            return sys(libc::EACCES);
        }
        return Ok(());
    }
    let bits = if ctx.uid == attr.uid {
        (perm >> 6) & 7
    } else if ctx.in_group(attr.gid) {
        (perm >> 3) & 7
    } else {
        perm & 7
    };
    if bits & mask == mask {
        Ok(())
    } else {
        sys(libc::EACCES)
    }
}

/// The sticky-bit rule for removing or renaming `victim` out of directory `dir`.
pub fn sticky_ok(dir: &Attr, victim: &Attr, ctx: &Ctx) -> Result<()> {
    if dir.perm as u32 & libc::S_ISVTX == 0
        || ctx.uid == 0
        || ctx.uid == dir.uid
        || ctx.uid == victim.uid
    {
        Ok(())
    } else {
        sys(libc::EPERM)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::types::FileKind;

    fn file(perm: u16, uid: u32, gid: u32) -> Attr {
        Attr {
            kind: FileKind::File,
            perm,
            uid,
            gid,
            nlink: 1,
            length: 0,
            rdev: 0,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            parent: 0,
        }
    }

    #[test]
    fn owner_group_other_and_supplementary_groups() {
        let a = file(0o640, 10, 20);
        assert!(access(&a, &Ctx::new(10, 99), MAY_READ | MAY_WRITE).is_ok());
        assert!(access(&a, &Ctx::new(11, 20), MAY_READ).is_ok());
        assert!(access(&a, &Ctx::new(11, 20), MAY_WRITE).is_err());
        let mut c = Ctx::new(11, 99);
        assert!(access(&a, &c, MAY_READ).is_err());
        c.groups = vec![20];
        assert!(access(&a, &c, MAY_READ).is_ok());
        // the owner class applies even when it grants less than the group class
        assert!(access(&file(0o070, 10, 20), &Ctx::new(10, 20), MAY_READ).is_err());
        // root reads anything, but executes only what has an x bit
        assert!(access(&file(0, 10, 20), &Ctx::root(), MAY_READ | MAY_WRITE).is_ok());
        assert!(access(&file(0o600, 10, 20), &Ctx::root(), MAY_EXEC).is_err());
        assert!(access(&file(0o601, 10, 20), &Ctx::root(), MAY_EXEC).is_ok());
    }

    #[test]
    fn sticky_directory_protects_other_users_entries() {
        let mut dir = file(0o1777, 0, 0);
        dir.kind = FileKind::Dir;
        let victim = file(0o644, 10, 10);
        assert!(sticky_ok(&dir, &victim, &Ctx::new(10, 10)).is_ok());
        assert!(sticky_ok(&dir, &victim, &Ctx::new(11, 10)).is_err());
        assert!(sticky_ok(&dir, &victim, &Ctx::root()).is_ok());
    }
}
