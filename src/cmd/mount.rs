//! `strait mount` and `strait umount`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strait_fs_core::fuse::{mount_config, FuseOptions, StraitFs};
use strait_fs_core::meta::{Meta, MetaClient, MetaOptions};
use strait_fs_core::vfs::{Vfs, VfsOptions};

/// An embedded mount considers a session whose heartbeat is older than this dead.
const SESSION_TIMEOUT_S: i64 = 60;
const GC_INTERVAL_S: u64 = 30;
/// How long `mount -d` and `umount` wait for the mount process.
const WAIT_S_MAX: u64 = 60;

#[derive(clap::Args, Clone)]
pub struct Args {
    /// Metadata: a site daemon (strait://host:port) or an engine opened in this process
    /// (rocksdb:///path, redis://host:port/db)
    pub meta_url: String,
    pub mountpoint: PathBuf,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Run in the background (returns once the file system is mounted).
    #[arg(short = 'd', long)]
    pub background: bool,
    /// Directory for the disk block cache.
    #[arg(long, default_value = "/var/cache/strait")]
    pub cache_dir: PathBuf,
    /// Size of the disk block cache (0 disables it).
    #[arg(long, default_value = "10G")]
    pub cache_size: String,
    /// Size of the memory block cache.
    #[arg(long, default_value = "256M")]
    pub mem_cache_size: String,
    /// Mount read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Threads serving FUSE requests. Each waits for one request's blocks, so reads that wait
    /// on another region (at a mirror, before a block is copied) need many.
    #[arg(long, default_value_t = 64)]
    pub threads: usize,
    /// Blocks downloaded from the object store at once.
    #[arg(long, default_value_t = 64)]
    pub max_downloads: usize,
    /// Blocks uploaded to the object store at once.
    #[arg(long, default_value_t = 16)]
    pub max_uploads: usize,
    /// Seconds the kernel caches attributes and entries. 0: every lookup and stat asks the
    /// metadata service (a mount of a site daemon then keeps no names and attributes of its
    /// own either; see docs/consistency.md).
    #[arg(long, default_value_t = 1.0)]
    pub attr_ttl: f64,
    /// How far ahead the kernel reads a file read in order (its `read_ahead_kb` for this
    /// mount; needs root, else the kernel's 128 KiB stays). The kernel then asks in requests
    /// of up to 1 MiB, several at once. 0 leaves the kernel's setting.
    #[arg(long, default_value = "16M")]
    pub read_ahead: String,
    /// Log file of a background mount.
    #[arg(long)]
    pub log_file: Option<PathBuf>,
}

/// How to reach a site daemon (only for strait:// addresses).
#[derive(clap::Args, Clone)]
pub struct RemoteArgs {
    /// The site daemon's token (one it accepts for the role mount; optional with a client
    /// certificate naming that role).
    #[arg(long, env = "STRAIT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File whose first line is the site daemon's token.
    #[arg(long, env = "STRAIT_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// CA certificate (PEM) the daemon's certificate must chain to; turns TLS on.
    #[arg(long, env = "STRAIT_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM), for daemons that require mutual TLS.
    #[arg(long, env = "STRAIT_TLS_CLIENT_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Client key (PEM), with --tls-cert.
    #[arg(long, env = "STRAIT_TLS_CLIENT_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Name the daemon's certificate must carry (default: the host of the address).
    #[arg(long, env = "STRAIT_TLS_DOMAIN")]
    pub tls_domain: Option<String>,
    /// Seconds a call keeps retrying an unreachable daemon before failing with EIO.
    #[arg(long, default_value_t = 60)]
    pub reconnect_timeout_s: u64,
}

impl RemoteArgs {
    pub fn options(&self) -> Result<strait_site_client::ConnectOptions> {
        let read = |p: &PathBuf, what: &str| {
            std::fs::read(p).with_context(|| format!("read the {what} {}", p.display()))
        };
        let token = match (&self.token_file, &self.token) {
            (Some(f), _) => Some(strait_auth::read_token_file(f)?),
            (None, Some(t)) => Some(t.clone()),
            (None, None) => None,
        }
        .filter(|t| !t.is_empty());
        let tls = match &self.tls_ca {
            Some(ca) => Some(strait_site_client::ClientTls {
                ca_pem: read(ca, "CA certificate")?,
                identity: match (&self.tls_cert, &self.tls_key) {
                    (Some(c), Some(k)) => Some((
                        read(c, "client certificate")?,
                        strait_auth::read_key_file(k)?,
                    )),
                    (None, None) => None,
                    _ => bail!("--tls-cert and --tls-key go together"),
                },
                domain: self.tls_domain.clone(),
            }),
            None if self.tls_cert.is_some() => bail!("--tls-cert needs --tls-ca"),
            None => None,
        };
        if token.is_none() && tls.as_ref().is_none_or(|t| t.identity.is_none()) {
            bail!(
                "a site daemon needs credentials: pass --token, --token-file or STRAIT_TOKEN, or \
                 a client certificate (--tls-ca, --tls-cert, --tls-key)"
            );
        }
        Ok(strait_site_client::ConnectOptions {
            creds: strait_site_client::Credentials::new(token.as_deref(), tls)?,
            reconnect_timeout: Duration::from_secs(self.reconnect_timeout_s),
            ..Default::default()
        })
    }
}

#[derive(clap::Args)]
pub struct UmountArgs {
    pub mountpoint: PathBuf,
}

fn pid_file(mountpoint: &Path) -> PathBuf {
    let canon = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let name: String = canon
        .to_string_lossy()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    std::env::temp_dir()
        .join("strait-mounts")
        .join(format!("{name}.pid"))
}

/// Whether `path` is a mount point of a strait file system.
pub fn is_strait_mount(path: &Path) -> bool {
    let Ok(canon) = std::fs::canonicalize(path) else {
        return false;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let target = canon.to_string_lossy().to_string();
    info.lines().any(|l| mountinfo_is_strait(l, &target))
}

/// One /proc/self/mountinfo line: `... MOUNTPOINT ... - FSTYPE SOURCE OPTIONS`.
pub fn mountinfo_is_strait(line: &str, target: &str) -> bool {
    let f: Vec<&str> = line.split(' ').collect();
    let Some(dash) = f.iter().position(|x| *x == "-") else {
        return false;
    };
    f.len() > dash + 2
        && f.get(4) == Some(&target)
        && f[dash + 1].starts_with("fuse")
        && f[dash + 2].starts_with("strait:")
}

pub fn run(a: Args) -> Result<()> {
    if !a.mountpoint.is_dir() {
        bail!("mount point {} is not a directory", a.mountpoint.display());
    }
    if is_strait_mount(&a.mountpoint) {
        bail!("{} is already a strait mount", a.mountpoint.display());
    }
    if a.background {
        return run_background(a);
    }
    run_foreground(a)
}

fn run_background(a: Args) -> Result<()> {
    let log = a.log_file.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!(
            "strait-mount-{}.log",
            pid_file(&a.mountpoint)
                .file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_default()
        ))
    });
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("open log file {}", log.display()))?;
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|x| x != "-d" && x != "--background")
        .collect();
    let exe = std::env::current_exe().context("find the strait binary")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(logf.try_clone().context("duplicate log handle")?)
        .stderr(logf);
    // a new session, so the mount survives the shell that started it
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("start the mount process")?;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(WAIT_S_MAX) {
        if is_strait_mount(&a.mountpoint) {
            println!(
                "mounted {} at {} (pid {}, log {})",
                a.meta_url,
                a.mountpoint.display(),
                child.id(),
                log.display()
            );
            return Ok(());
        }
        if let Some(status) = child.try_wait().context("wait for the mount process")? {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            let last: Vec<&str> = tail.lines().rev().take(5).collect();
            bail!(
                "the mount process exited ({status}) before mounting: {}",
                last.into_iter().rev().collect::<Vec<_>>().join(" | ")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!(
        "{} was not mounted after {WAIT_S_MAX} s; see {}",
        a.mountpoint.display(),
        log.display()
    )
}

fn block_signals() -> nix::sys::signal::SigSet {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGHUP);
    let _ = set.thread_block();
    set
}

fn run_foreground(a: Args) -> Result<()> {
    // Signals are taken by one thread (below), so every thread started from here blocks them.
    let sigset = block_signals();
    let rt = super::runtime()?;
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().to_string())
        .unwrap_or_default();
    let info = format!(
        "mount {} on {host} pid {}",
        a.mountpoint.display(),
        std::process::id()
    );
    // `embedded` is the engine when this process owns it (no daemon): then this mount also
    // cleans up dead sessions and deletes dead slices' blocks, which a daemon does otherwise.
    let mut remote = None;
    let (meta, embedded): (Arc<dyn MetaClient>, Option<Arc<Meta>>) =
        if strait_site_client::is_daemon_url(&a.meta_url) {
            let mut opts = a.remote.options()?;
            opts.read_only = a.read_only;
            // `--attr-ttl 0` asks the daemon for every lookup: the mount keeps nothing either
            opts.keep_names = a.attr_ttl > 0.0;
            let client = strait_site_client::RemoteMeta::connect(&a.meta_url, opts)?;
            remote = Some(client.clone());
            (client, None)
        } else {
            let kv = strait_fs_core::kv::open(&a.meta_url)?;
            let meta = Meta::open(
                kv,
                MetaOptions {
                    read_only: a.read_only,
                    ..Default::default()
                },
            )?;
            (meta.clone(), Some(meta))
        };
    let sid = meta.open_session(&info)?;
    let format = meta.settings().clone();
    let store = rt.block_on(strait_fs_core::object::open(&format.data_url))?;
    if let Some(engine) = &embedded {
        match engine.clean_stale_sessions(SESSION_TIMEOUT_S * 1_000_000_000) {
            Ok(closed) if !closed.is_empty() => {
                tracing::info!("cleaned up stale sessions {closed:?}")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("clean up stale sessions: {e}"),
        }
    }
    let mut cache_size = super::parse_size(&a.cache_size)?;
    if format.data_url.starts_with("file://") && cache_size > 0 {
        // the object store is a local directory already: a disk cache would only write
        // every block twice to local disks
        tracing::info!(
            "no disk cache: the object store {} is local",
            format.data_url
        );
        cache_size = 0;
    }
    let read_ahead = super::parse_size(&a.read_ahead).context("--read-ahead")?;
    let opts = VfsOptions {
        mem_cache_bytes: super::parse_size(&a.mem_cache_size)?,
        cache_dir: (cache_size > 0).then(|| a.cache_dir.clone()),
        disk_cache_bytes: cache_size,
        // at a mirror: blocks not in the region's store yet come through its daemon (asked
        // at each read whether it offers that: the daemon can change role under the mount)
        block_fallback: remote
            .as_ref()
            .map(|r| strait_fs_core::vfs::Fallback(r.block_fallback())),
        download_concurrency: a.max_downloads.max(1),
        fallback_concurrency: a.max_downloads.max(1),
        upload_concurrency: a.max_uploads.max(1),
        kernel_read_ahead: if read_ahead > 0 {
            read_ahead
        } else {
            VfsOptions::default().kernel_read_ahead
        },
        ..VfsOptions::default()
    };
    let vfs = Vfs::new(meta.clone(), store.clone(), opts, Some(rt.handle().clone()))?;
    let ttl = Duration::from_secs_f64(a.attr_ttl.max(0.0));
    let fs = StraitFs::new(
        vfs.clone(),
        FuseOptions {
            attr_ttl: ttl,
            entry_ttl: ttl,
            threads: a.threads,
        },
    );
    let config = mount_config(&format.name, a.read_only, a.threads);
    let notifier_slot = fs.notifier_slot();
    let mut session = fuser::Session::new(fs, &a.mountpoint, &config)
        .with_context(|| format!("mount at {}", a.mountpoint.display()))?;
    let _ = notifier_slot.set(session.notifier());
    if read_ahead > 0 {
        // after the kernel's INIT is answered: answering it lowers the read-ahead to what
        // the reply names (at most the kernel's 128 KiB); a stat of the root is answered
        // only after it
        let mp = a.mountpoint.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            while std::fs::metadata(&mp).is_err() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            match strait_fs_core::fuse::set_read_ahead(&mp, read_ahead) {
                Ok(bdi) => tracing::info!(
                    "the kernel reads ahead {} on this mount ({bdi})",
                    strait_ids::units::human_bytes(read_ahead)
                ),
                Err(e) => tracing::info!("the kernel's read-ahead stays as it is: {e}"),
            }
        });
    }
    let pidf = pid_file(&a.mountpoint);
    if let Some(dir) = pidf.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::write(&pidf, std::process::id().to_string());
    tracing::info!(
        "mounted {} ({}) at {} as session {sid}",
        format.name,
        a.meta_url,
        a.mountpoint.display()
    );

    let mut unmounter = session.unmount_callable();
    let mp = a.mountpoint.clone();
    std::thread::spawn(move || {
        if let Ok(sig) = sigset.wait() {
            tracing::info!("received {sig:?}: unmounting {}", mp.display());
            if let Err(e) = unmounter.unmount() {
                tracing::error!(
                    "unmount {}: {e} (use `umount -l` if it is busy)",
                    mp.display()
                );
            }
        }
    });
    let bg_meta = meta.clone();
    std::thread::spawn(move || loop {
        std::thread::sleep(bg_meta.heartbeat_interval());
        if let Err(e) = bg_meta.heartbeat() {
            tracing::warn!("session heartbeat: {e}");
        }
    });
    if let (Some(engine), false) = (embedded, a.read_only) {
        let rt = rt.handle().clone();
        std::thread::spawn(move || {
            let period = Duration::from_secs(GC_INTERVAL_S);
            let mut pause = period;
            loop {
                std::thread::sleep(pause);
                pause = period;
                match strait_fs_core::vfs::gc::gc_once(&engine, &store, &rt) {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!("deleted the blocks of {n} dead slices");
                        // no mirror holds anything here: every slice listed was deleted
                        pause = strait_fs_core::vfs::gc::next_pass_in(n, n, period);
                    }
                    Err(e) => tracing::warn!("delete dead slices: {e}"),
                }
            }
        });
    }

    let res = session.run();
    // the kernel has let go: commit what is still buffered, then leave the session
    let flushed = vfs.flush_all();
    if let Err(e) = meta.close_session() {
        tracing::warn!("close session {sid}: {e}");
    }
    let _ = std::fs::remove_file(&pidf);
    tracing::info!("unmounted {}", a.mountpoint.display());
    res.context("serve FUSE requests")?;
    flushed?;
    Ok(())
}

/// Whether process `pid` is still running. A zombie waiting for its parent counts as gone,
/// but only once every thread of it has exited: when the main thread returns, the process's
/// leader is a zombie at once while its other threads (RocksDB's, the heartbeat's) are still
/// being torn down, and its files (the metadata engine's lock among them) are closed only when
/// the last thread is gone. Counting that leader as gone let `umount` return while the lock was
/// still held, and a mount started right after failed with "in use by another process".
fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // the state follows the command name, which is in parentheses
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            if !matches!(state, Some("Z") | Some("X")) {
                return true;
            }
            threads_left(pid) > 1
        }
        Err(_) => false,
    }
}

/// The threads of process `pid` not yet gone, its leader included (0 when it is gone).
fn threads_left(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// How long `strait umount` tries a busy mount again.
const UMOUNT_BUSY_RETRY_MS: u64 = 2_000;

pub fn umount(a: UmountArgs) -> Result<()> {
    let pidf = pid_file(&a.mountpoint);
    let pid: Option<i32> = std::fs::read_to_string(&pidf)
        .ok()
        .and_then(|s| s.trim().parse().ok());
    if !is_strait_mount(&a.mountpoint) {
        bail!("{} is not a strait mount", a.mountpoint.display());
    }
    let c = std::ffi::CString::new(a.mountpoint.as_os_str().as_encoded_bytes())
        .context("mount point path")?;
    // a file closed just now may hold the mount for a moment (its release is still on its
    // way through the kernel): a busy mount is tried again, for a bounded time
    let start = Instant::now();
    let rc = loop {
        // SAFETY: c is a valid NUL-terminated path that outlives the call
        let rc = unsafe { libc::umount2(c.as_ptr(), 0) };
        let busy = rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBUSY);
        if !busy || start.elapsed() >= Duration::from_millis(UMOUNT_BUSY_RETRY_MS) {
            break rc;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        // not root: let fusermount3 do it
        let ok = std::process::Command::new("fusermount3")
            .arg("-u")
            .arg(&a.mountpoint)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            bail!("unmount {}: {err}", a.mountpoint.display());
        }
    }
    if let Some(pid) = pid {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(WAIT_S_MAX) {
            if !process_alive(pid) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    println!("unmounted {}", a.mountpoint.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process whose main thread has exited while another thread still runs is a zombie
    /// leader with its files still open: `umount` must keep waiting for it, and stop waiting
    /// once its last thread is gone.
    #[test]
    fn a_zombie_leader_with_threads_left_is_still_alive() {
        // Python's main thread leaves through the raw exit syscall (60 on x86_64: this thread
        // only), so the leader turns zombie while the sleeping thread lives on for a second.
        let script = "import threading, time, ctypes\n\
                      threading.Thread(target=time.sleep, args=(1.0,)).start()\n\
                      time.sleep(0.1)\n\
                      ctypes.CDLL(None).syscall(60, 0)\n";
        let mut child = std::process::Command::new("python3")
            .args(["-c", script])
            .spawn()
            .expect("python3 runs (it is on every machine this project supports)");
        let pid = child.id() as i32;

        // once the leader is a zombie, the other thread still holds the process
        let start = Instant::now();
        let mut saw_zombie_leader = false;
        while start.elapsed() < Duration::from_millis(900) {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat
                .rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
                == Some(true)
                && threads_left(pid) > 1
            {
                saw_zombie_leader = true;
                assert!(
                    process_alive(pid),
                    "a zombie leader with a thread left counts as alive"
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            saw_zombie_leader,
            "the test process never became a zombie leader"
        );

        // when the last thread is gone, the unreaped zombie counts as gone
        let start = Instant::now();
        while process_alive(pid) && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            !process_alive(pid),
            "a zombie with no thread left counts as gone"
        );
        assert!(child.wait().expect("reap the child").success());
    }
}
