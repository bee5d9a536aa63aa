//! Extended attributes through a mount, for the commands that speak to strait's virtual
//! `strait.*` xattrs (`strait quota`, `strait trash`): each answers 0 or an errno.

use std::ffi::CString;

/// The errno of the system call just made, EIO if there is none.
pub(super) fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// A system call's 0 (done) or -1 (its errno).
fn done(r: libc::c_int) -> std::result::Result<(), i32> {
    if r == 0 {
        Ok(())
    } else {
        Err(last_errno())
    }
}

pub(super) fn getxattr(path: &CString, name: &[u8]) -> std::result::Result<Vec<u8>, i32> {
    let n = CString::new(name).map_err(|_| libc::EINVAL)?;
    let mut buf = vec![0u8; 64 << 10];
    for _ in 0..4 {
        // SAFETY: the strings are NUL-terminated; the buffer is writable for its length.
        let r = unsafe {
            libc::getxattr(
                path.as_ptr(),
                n.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if r >= 0 {
            buf.truncate(r as usize);
            return Ok(buf);
        }
        let e = last_errno();
        if e != libc::ERANGE {
            return Err(e);
        }
        buf = vec![0u8; buf.len() * 16];
    }
    Err(libc::ERANGE)
}

/// setxattr(2) of `name` on `path`.
pub(super) fn setxattr(path: &CString, name: &[u8], value: &[u8]) -> std::result::Result<(), i32> {
    let n = CString::new(name).map_err(|_| libc::EINVAL)?;
    // SAFETY: both strings are NUL-terminated and live across the call; the value is a slice
    // with its length.
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    done(r)
}

/// lsetxattr(2) of `name` on `path` (a symlink itself, not what it points to).
pub(super) fn setxattr_nofollow(
    path: &CString,
    name: &[u8],
    value: &[u8],
) -> std::result::Result<(), i32> {
    let n = CString::new(name).map_err(|_| libc::EINVAL)?;
    // SAFETY: both strings are NUL-terminated and live across the call; the value is a slice
    // with its length.
    let r = unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    done(r)
}

/// removexattr(2) of `name` on `path`.
pub(super) fn removexattr(path: &CString, name: &[u8]) -> std::result::Result<(), i32> {
    let n = CString::new(name).map_err(|_| libc::EINVAL)?;
    // SAFETY: both strings are NUL-terminated and live across the call.
    let r = unsafe { libc::removexattr(path.as_ptr(), n.as_ptr()) };
    done(r)
}
