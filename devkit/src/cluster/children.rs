//! What a cluster's processes need beside [`crate::install`]: free addresses, the `strait`
//! commands it runs, whether a process runs, and detaching mounts whose server died.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::free_port;
use crate::install::is_mount_point;
use crate::process::output_tied_with;

pub(super) fn free_addr() -> Result<SocketAddr> {
    let port = free_port().context("find a free port")?;
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

/// Run `strait ARGS` (the program `bin`, with `env`) to its end: its standard output, or an
/// error with its standard error.
pub fn run_strait(bin: &Path, env: &[(String, String)], args: &[&str]) -> Result<String> {
    let (bin, env) = (bin.to_path_buf(), env.to_vec());
    let argv: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    // from a file table without this process's files (`output_tied_with`): `strait mount`
    // and the rest may run while this process holds files open on a strait mount
    let out = output_tied_with(move || {
        let mut cmd = Command::new(bin);
        cmd.args(argv).envs(env);
        Ok(cmd)
    })
    .with_context(|| format!("run strait {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "strait {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(super) fn s(v: impl ToString) -> String {
    v.to_string()
}

/// Whether process `pid` runs (a zombie counts as gone).
pub(super) fn process_runs(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next()),
            Some("Z") | Some("X")
        ),
        Err(_) => false,
    }
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
