//! The processes of a cluster: its daemons, started and started again the same way
//! ([`Children`]), its mounts ([`MountProc`]), and the `strait` commands it runs.

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::free_port;
use crate::process::{open_log, output_tied_with, spawn_tied_with};

pub(super) fn free_addr() -> Result<SocketAddr> {
    let port = free_port().context("find a free port")?;
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

pub(super) struct Children {
    /// The `strait` program.
    pub(super) bin: PathBuf,
    pub(super) list: Vec<Kid>,
    /// Environment of every child (the S3 credentials of `--store garage`).
    pub(super) env: Vec<(String, String)>,
    /// More environment for some of them ([`FaultHooks::daemon_env`]).
    pub(super) daemon_env: Vec<(String, Vec<(String, String)>)>,
}

/// One daemon: how it was started, so that it can be started again the same way.
pub(super) struct Kid {
    pub(super) name: String,
    pub(super) log: PathBuf,
    pub(super) args: Vec<String>,
    pub(super) child: Child,
}

/// A region's mount: how it was mounted, so that it can be mounted again the same way, and
/// the process that serves it (`strait mount --background` leaves it in a session of its own,
/// so it is not a child of this process).
pub(super) struct MountProc {
    pub(super) point: PathBuf,
    pub(super) args: Vec<String>,
    pub(super) pid: u32,
}

impl Children {
    pub(super) fn spawn(&mut self, name: &str, log: &Path, args: &[String]) -> Result<()> {
        let child = self.start(name, log, args, false)?;
        self.list.push(Kid {
            name: name.to_string(),
            log: log.to_path_buf(),
            args: args.to_vec(),
            child,
        });
        Ok(())
    }

    pub(super) fn start(
        &self,
        name: &str,
        log: &Path,
        args: &[String],
        append: bool,
    ) -> Result<Child> {
        let own_env: Vec<(String, String)> = self
            .daemon_env
            .iter()
            .filter(|(n, _)| n == name)
            .flat_map(|(_, e)| e.iter().cloned())
            .collect();
        let (bin, env, log, args) = (
            self.bin.clone(),
            self.env.clone(),
            log.to_path_buf(),
            args.to_vec(),
        );
        // the log is opened by the thread that starts the daemon (`spawn_tied_with`)
        spawn_tied_with(move || {
            let (out, err) = open_log(&log, append)?;
            let mut cmd = Command::new(bin);
            cmd.args(args)
                .envs(env)
                .envs(own_env)
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                // a Ctrl-C at the terminal reaches `dev up` alone, which unmounts before it
                // stops the daemons; if `dev up` dies, the daemons get SIGTERM
                .process_group(0);
            Ok(cmd)
        })
        .with_context(|| format!("start {name}"))
    }

    pub(super) fn kid(&mut self, name: &str) -> Result<&mut Kid> {
        let names: Vec<String> = self.list.iter().map(|k| k.name.clone()).collect();
        self.list
            .iter_mut()
            .find(|k| k.name == name)
            .with_context(|| format!("no process {name:?} (there are: {})", names.join(", ")))
    }

    /// Wait until `log` holds `line`; fail when the child exits first.
    pub(super) fn wait_for(
        &mut self,
        name: &str,
        log: &Path,
        line: &str,
        within: Duration,
    ) -> Result<()> {
        let start = Instant::now();
        loop {
            if std::fs::read_to_string(log)
                .unwrap_or_default()
                .contains(line)
            {
                return Ok(());
            }
            if let Some(k) = self.list.iter_mut().find(|k| k.name == name) {
                if let Ok(Some(st)) = k.child.try_wait() {
                    bail!(
                        "{name} exited ({st}); its log {}:\n{}",
                        log.display(),
                        tail(log)
                    );
                }
            }
            if start.elapsed() > within {
                bail!(
                    "{name} did not start within {within:?}; its log {}:\n{}",
                    log.display(),
                    tail(log)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub(super) fn stop_all(&mut self) {
        for k in self.list.iter_mut().rev() {
            // a stopped process would not act on SIGTERM
            unsafe { libc::kill(k.child.id() as i32, libc::SIGCONT) };
            unsafe { libc::kill(k.child.id() as i32, libc::SIGTERM) };
        }
        let start = Instant::now();
        for k in self.list.iter_mut().rev() {
            loop {
                match k.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if start.elapsed() > Duration::from_secs(10) => {
                        eprintln!(
                            "strait dev: {} did not stop within 10 s: killing it",
                            k.name
                        );
                        let _ = k.child.kill();
                        let _ = k.child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
    }
}

pub(crate) fn tail(log: &Path) -> String {
    let t = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
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

/// Run `strait mount ARGS --background` and return the pid of the process that serves the
/// mount, which it prints as `mounted URL at DIR (pid N, log FILE)`.
pub(super) fn mount_with(bin: &Path, env: &[(String, String)], args: &[String]) -> Result<u32> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_strait(bin, env, &args)?;
    out.split("(pid ")
        .nth(1)
        .and_then(|rest| rest.split([',', ')']).next())
        .and_then(|pid| pid.trim().parse().ok())
        .with_context(|| format!("no pid in what `strait mount` printed: {:?}", out.trim()))
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

/// Whether `point` is a mount point (any file system), by /proc/self/mountinfo.
pub(crate) fn is_mount_point(point: &Path) -> bool {
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

/// Write `text` to `path`, readable by its owner only.
pub(super) fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    writeln!(f, "{text}").with_context(|| format!("write {}", path.display()))
}
