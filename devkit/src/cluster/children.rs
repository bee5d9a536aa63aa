//! What a cluster's processes need beside [`crate::install`]: free addresses, the `strait`
//! commands it runs, whether a process runs.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::free_port;
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
