//! Mount points: whether a path is one, and detaching what is mounted there even when its
//! server died (a run that was killed leaves such mounts behind).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::process::output_tied_with;

/// Whether `point` is a mount point (any file system), by /proc/self/mountinfo.
pub fn is_mount_point(point: &Path) -> bool {
    let Ok(canon) = std::fs::canonicalize(point) else {
        return false;
    };
    let target = canon.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(target.as_str()))
}

/// Detach every file system mounted under `dir` (left by a run that was killed), the deepest
/// first.
pub fn detach_all_under(dir: &Path) -> Result<()> {
    let Ok(canon) = std::fs::canonicalize(dir) else {
        return Ok(());
    };
    let mut points: Vec<PathBuf> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(&canon))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        detach(&p)?;
    }
    Ok(())
}

/// Detach the file system mounted at `point` at once, even when it is busy or its server is
/// dead (`umount -l`; `fusermount3 -u -z` when not root).
pub fn detach(point: &Path) -> Result<()> {
    if !is_mount_point(point) {
        return Ok(());
    }
    let c =
        std::ffi::CString::new(point.as_os_str().as_encoded_bytes()).context("mount point path")?;
    // SAFETY: c is a valid NUL-terminated path that outlives the call
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    let point_owned = point.to_path_buf();
    let ok = output_tied_with(move || {
        let mut cmd = Command::new("fusermount3");
        cmd.args(["-u", "-z"])
            .arg(point_owned)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        Ok(cmd)
    })
    .map(|o| o.status.success())
    .unwrap_or(false);
    if !ok {
        bail!("detach {}: {err}", point.display());
    }
    Ok(())
}
