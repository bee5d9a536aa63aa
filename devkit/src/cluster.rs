//! The two regions of `strait dev up`, started on this machine: region A runs the primary and
//! replicator nodes 1 and 2; region B runs replicator node 3 and a mirror. Each region has its
//! own RocksDB metadata and its own object store, a local directory or a Garage S3 server
//! ([`crate::Garage`]): the mirror copies blocks from A's store into B's, and B's mounts read
//! B's first. Traffic between the regions goes through fault proxies with a one-way delay and
//! a bandwidth cap; a control socket changes them at run time (`strait dev fault`: delay,
//! bandwidth, partition, heal).
//!
//! The daemons and mounts are the `strait` program itself ([`ClusterConfig::strait_bin`]),
//! each with its log in its region's directory; they listen on ports from
//! [`crate::free_port`] and end with this process ([`crate::process::spawn_tied_with`]).
//!
//! Known simplifications:
//! - a proxy sits in front of each cross-region *listener*, so a connection delays both ways
//!   whichever region opened it;
//! - the bandwidth cap holds per proxy (per cross-region listener), not for all of them
//!   together;
//! - with a directory store the mirror reads region A's store as a directory, so block copies
//!   do not cross the proxies; with Garage they do (the mirror reaches A's Garage through a
//!   proxy).

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::process::{open_log, output_tied_with, spawn_tied_with};
use crate::{free_port, Faults, Garage, Proxy};

/// What [`Cluster::start`] starts. The CLI checks the values (`strait dev up`'s flags).
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The `strait` program that runs the daemons and the mounts.
    pub strait_bin: PathBuf,
    /// Working directory (emptied first): region-a/, region-b/, logs, dev.json.
    pub dir: PathBuf,
    /// One-way delay between the regions, in ms.
    pub delay_ms: u64,
    /// Mount both regions (region-a/mnt, region-b/mnt).
    pub mount: bool,
    /// The mirror's staleness window, ms.
    pub window_ms: u64,
    /// The mirror's policy outside its window: forward, wait or serve.
    pub policy: String,
    /// Which replicator node the mirror subscribes to first: `local` (node 3) or `leader`
    /// (node 1, across the link).
    pub source: String,
    /// The mirror's background block copy: eager or lazy.
    pub sync: String,
    /// A Garage S3 server per region instead of a local directory.
    pub garage: bool,
    /// Bandwidth cap between the regions, MB/s per proxy (0: none).
    pub link_mb_s: f64,
    /// Also put a (fault-free) proxy between the primary and each replicator node, so that
    /// the primary alone can be cut off from the replicator (the chaos harness does).
    pub primary_proxies: bool,
    /// More arguments for `strait primary`, `strait mirror` and each `strait mount`
    /// (`--durability replicated`, `--attr-ttl 0`, ...).
    pub primary_args: Vec<String>,
    pub mirror_args: Vec<String>,
    pub mount_args: Vec<String>,
    /// More arguments for `strait format` (`--gc-delay 60`, ...).
    pub format_args: Vec<String>,
    /// Every link over mutual TLS: a CA and a certificate per daemon, mount and operator in
    /// DIR/pki ([`crate::pki`]), on top of the tokens per role.
    pub tls: bool,
    /// Where the chaos harness's faults reach in: proxies in front of the object stores,
    /// data directories on file systems of its own, daemons' environments. Default: none.
    pub hooks: FaultHooks,
}

/// Makes the proxy that goes in front of one region's Garage: called with the region (0: A,
/// 1: B) and Garage's S3 address, it returns the address that every client of that store
/// (`format`'s data URL, the mirror's `--data-url` and `--primary-data-url`, and through them
/// the daemons and the mounts) uses instead.
#[derive(Clone)]
pub struct S3Front(pub Arc<dyn Fn(usize, SocketAddr) -> Result<SocketAddr> + Send + Sync>);

impl std::fmt::Debug for S3Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("S3Front(..)")
    }
}

/// What the chaos harness changes in the layout of [`Cluster::start`] to put faults in; each
/// field defaults to the plain layout of `strait dev up`.
#[derive(Clone, Debug, Default)]
pub struct FaultHooks {
    /// A proxy in front of each region's Garage (ignored with a directory store).
    pub s3_front: Option<S3Front>,
    /// Region A's (the primary's) and region B's (the mirror's) RocksDB directory instead of
    /// `region-x/meta`: somewhere outside [`ClusterConfig::dir`], as a small file system of
    /// its own that a fault can fill.
    pub meta_dirs: [Option<PathBuf>; 2],
    /// Each region's mount's disk cache directory instead of `region-x/cache`.
    pub cache_dirs: [Option<PathBuf>; 2],
    /// Where each region's Garage keeps its metadata and data instead of `region-x/garage`
    /// (its config and log stay there).
    pub garage_data_dirs: [Option<PathBuf>; 2],
    /// Each replicator node's data directory instead of `region-x/replicatorN`.
    pub replicator_dirs: [Option<PathBuf>; 3],
    /// More environment for one daemon, by name (`primary`, `mirror`, `replicatorN`), at each
    /// of its starts (libfaketime's, for clock jumps).
    pub daemon_env: Vec<(String, Vec<(String, String)>)>,
}

/// The roles of `dev up`'s tokens, each in `DIR/tokens/ROLE.token`: one token per role, which
/// every daemon that serves the role accepts (the replicator: primary, mirror, admin, peer; the
/// primary: mount, mirror, admin; the mirror: mount, admin).
pub const TOKEN_ROLES: [&str; 5] = ["mount", "mirror", "primary", "admin", "peer"];
/// The roles whose tokens the replicator accepts.
pub const REPLICATOR_ROLES: [&str; 4] = ["primary", "mirror", "admin", "peer"];
/// The mirror's id (its cursor at the replicator, its certificate's name).
pub const MIRROR_ID: &str = "region-b";

/// What `dev up` writes to DIR/dev.json once everything runs.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
pub struct Topology {
    /// The mounts' token (role mount, at the primary and the mirror).
    pub token: String,
    /// The operators' token (role admin: `strait gc`, `fsck --compare`, `mirror pause`, the
    /// replicator's membership and retention).
    #[serde(default)]
    pub admin_token: String,
    /// With `--tls`: the directory of the CA (`ca.pem`) and of each holder's certificate and
    /// key (`mount`, `admin`, `primary`, `region-b`, `replicatorN`).
    #[serde(default)]
    pub pki: Option<PathBuf>,
    /// The replicator's tokens by role (`primary`, `mirror`, `admin`, `peer`); also in
    /// `DIR/tokens/ROLE.token`.
    #[serde(default)]
    pub replicator_tokens: std::collections::BTreeMap<String, String>,
    pub primary: String,
    pub mirror: String,
    pub primary_metrics: String,
    pub mirror_metrics: String,
    pub replicator: Vec<String>,
    pub control: String,
    pub mount_a: Option<PathBuf>,
    pub mount_b: Option<PathBuf>,
    /// Each region's object store (data URL) and how the mirror reaches A's.
    #[serde(default)]
    pub data_a: String,
    #[serde(default)]
    pub data_b: String,
    #[serde(default)]
    pub mirror_data_a: String,
}

impl Topology {
    /// What a client of role `mount` or `admin` presents to these regions: the role's token,
    /// and its certificate when they run TLS.
    pub fn credentials(&self, role: &str) -> Result<strait_auth::Credentials> {
        let token = match role {
            "mount" => &self.token,
            "admin" => &self.admin_token,
            other => bail!("dev.json holds no token for the role {other:?}"),
        };
        let pki = self.pki.clone().map(|dir| crate::pki::Pki { dir });
        crate::pki::credentials(token, pki.as_ref(), role)
    }
}

/// The running regions. Dropping it stops the daemons (SIGTERM, then SIGKILL after 10 s),
/// then the Garages; [`Cluster::unmount`] first unmounts the regions.
pub struct Cluster {
    topology: Topology,
    strait_bin: PathBuf,
    /// Every fault proxy, by name: `a-to-replicator3`, `b-to-replicator1`,
    /// `b-to-replicator2`, `b-to-primary`, `b-to-s3` (with Garage) cross the link between the
    /// regions; `primary-to-replicatorN` (with [`ClusterConfig::primary_proxies`]) do not.
    proxies: Vec<(String, Arc<Proxy>)>,
    /// Region A's mount, then region B's (none without [`ClusterConfig::mount`]).
    mounts: Vec<MountProc>,
    // dropped after `kids` has been stopped (see `Parts`'s Drop)
    parts: Parts,
}

/// What a cluster that is starting already holds: dropped on a failed start as on a stop.
struct Parts {
    kids: Children,
    /// A Garage per region (killed when `dev up` ends), or none.
    garages: Vec<Garage>,
}

impl Drop for Parts {
    fn drop(&mut self) {
        self.kids.stop_all();
    }
}

fn free_addr() -> Result<SocketAddr> {
    let port = free_port().context("find a free port")?;
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

struct Children {
    /// The `strait` program.
    bin: PathBuf,
    list: Vec<Kid>,
    /// Environment of every child (the S3 credentials of `--store garage`).
    env: Vec<(String, String)>,
    /// More environment for some of them ([`FaultHooks::daemon_env`]).
    daemon_env: Vec<(String, Vec<(String, String)>)>,
}

/// One daemon: how it was started, so that it can be started again the same way.
struct Kid {
    name: String,
    log: PathBuf,
    args: Vec<String>,
    child: Child,
}

/// A region's mount: how it was mounted, so that it can be mounted again the same way, and
/// the process that serves it (`strait mount --background` leaves it in a session of its own,
/// so it is not a child of this process).
struct MountProc {
    point: PathBuf,
    args: Vec<String>,
    pid: u32,
}

impl Children {
    fn spawn(&mut self, name: &str, log: &Path, args: &[String]) -> Result<()> {
        let child = self.start(name, log, args, false)?;
        self.list.push(Kid {
            name: name.to_string(),
            log: log.to_path_buf(),
            args: args.to_vec(),
            child,
        });
        Ok(())
    }

    fn start(&self, name: &str, log: &Path, args: &[String], append: bool) -> Result<Child> {
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

    fn kid(&mut self, name: &str) -> Result<&mut Kid> {
        let names: Vec<String> = self.list.iter().map(|k| k.name.clone()).collect();
        self.list
            .iter_mut()
            .find(|k| k.name == name)
            .with_context(|| format!("no process {name:?} (there are: {})", names.join(", ")))
    }

    /// Wait until `log` holds `line`; fail when the child exits first.
    fn wait_for(&mut self, name: &str, log: &Path, line: &str, within: Duration) -> Result<()> {
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

    fn stop_all(&mut self) {
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

fn tail(log: &Path) -> String {
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

fn s(v: impl ToString) -> String {
    v.to_string()
}

/// Run `strait mount ARGS --background` and return the pid of the process that serves the
/// mount, which it prints as `mounted URL at DIR (pid N, log FILE)`.
fn mount_with(bin: &Path, env: &[(String, String)], args: &[String]) -> Result<u32> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_strait(bin, env, &args)?;
    out.split("(pid ")
        .nth(1)
        .and_then(|rest| rest.split([',', ')']).next())
        .and_then(|pid| pid.trim().parse().ok())
        .with_context(|| format!("no pid in what `strait mount` printed: {:?}", out.trim()))
}

/// Whether process `pid` runs (a zombie counts as gone).
fn process_runs(pid: u32) -> bool {
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
fn is_mount_point(point: &Path) -> bool {
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
fn write_private(path: &Path, text: &str) -> Result<()> {
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

impl Cluster {
    /// Start both regions and write DIR/dev.json. `has_leader(node, admin)`: whether the
    /// replicator node at that address knows a leader (the caller asks it over gRPC with the
    /// operators' credentials `admin`);
    /// `progress`: a line to show for each step that may take a while.
    pub fn start(
        cfg: &ClusterConfig,
        rt: &tokio::runtime::Runtime,
        has_leader: &dyn Fn(SocketAddr, &strait_auth::Credentials) -> bool,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Cluster> {
        let a = cfg;
        if a.dir.exists() {
            std::fs::remove_dir_all(&a.dir)
                .with_context(|| format!("empty the working directory {}", a.dir.display()))?;
        }
        let ra = a.dir.join("region-a");
        let rb = a.dir.join("region-b");
        for d in [&ra, &rb] {
            std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
        }
        // one token per role, in files the daemons read
        let tokens_dir = a.dir.join("tokens");
        std::fs::create_dir_all(&tokens_dir).context("create the tokens directory")?;
        let mut tokens = std::collections::BTreeMap::new();
        for role in TOKEN_ROLES {
            let t = format!("{role}-{}", hex::encode(rand::random::<[u8; 16]>()));
            write_private(&tokens_dir.join(format!("{role}.token")), &t)?;
            tokens.insert(role.to_string(), t);
        }
        let replicator_tokens: std::collections::BTreeMap<String, String> = REPLICATOR_ROLES
            .iter()
            .map(|r| (r.to_string(), tokens[*r].clone()))
            .collect();
        let token = tokens["mount"].clone();
        let token_file = |role: &str| {
            tokens_dir
                .join(format!("{role}.token"))
                .to_string_lossy()
                .into_owned()
        };
        // with --tls, a certificate for each daemon, the mounts and the operators
        let pki = if a.tls {
            progress("creating a CA and certificates (mutual TLS on every link)");
            let holders: Vec<(&str, &[strait_auth::Role])> = vec![
                ("primary", &[strait_auth::Role::Primary]),
                (MIRROR_ID, &[strait_auth::Role::Mirror]),
                ("replicator1", &[strait_auth::Role::Peer]),
                ("replicator2", &[strait_auth::Role::Peer]),
                ("replicator3", &[strait_auth::Role::Peer]),
                ("mount", &[strait_auth::Role::Mount]),
                ("admin", &[strait_auth::Role::Admin]),
            ];
            Some(crate::pki::Pki::create(&a.dir.join("pki"), &holders)?)
        } else {
            None
        };
        let server_tls = |name: &str| {
            pki.as_ref()
                .map(|p| p.server_args(name))
                .unwrap_or_default()
        };
        let client_tls = |name: &str| {
            pki.as_ref()
                .map(|p| p.client_args(name))
                .unwrap_or_default()
        };
        let admin_creds = crate::pki::credentials(&tokens["admin"], pki.as_ref(), "admin")?;

        let mut delay = Faults::delay(Duration::from_millis(a.delay_ms));
        let cap = (a.link_mb_s > 0.0).then_some((a.link_mb_s * 1e6) as u64);
        delay.up.bandwidth = cap;
        delay.down.bandwidth = cap;
        let mut parts = Parts {
            kids: Children {
                bin: cfg.strait_bin.clone(),
                list: vec![],
                env: vec![],
                daemon_env: cfg.hooks.daemon_env.clone(),
            },
            garages: vec![],
        };
        let Parts { kids, garages } = &mut parts;
        if a.garage {
            for (i, (region, name)) in [(&ra, "A"), (&rb, "B")].into_iter().enumerate() {
                progress(&format!("starting region {name}'s Garage S3 server"));
                let dir = region.join("garage");
                let data = a.hooks.garage_data_dirs[i]
                    .clone()
                    .unwrap_or_else(|| dir.clone());
                let g = Garage::start_with_data(&dir, &data)
                    .with_context(|| format!("start region {name}'s Garage"))?;
                garages.push(g);
            }
            // both servers take the same fixed key
            kids.env = garages[0].env();
        }
        let env = kids.env.clone();
        let bin = cfg.strait_bin.as_path();
        // region A's file system
        let meta_dir = |i: usize, region: &Path| {
            a.hooks.meta_dirs[i]
                .clone()
                .unwrap_or_else(|| region.join("meta"))
        };
        let meta_a = format!("rocksdb://{}", meta_dir(0, &ra).display());
        // where each region's clients reach its Garage
        let mut s3_at = vec![];
        for (i, g) in garages.iter().enumerate() {
            s3_at.push(match &a.hooks.s3_front {
                Some(front) => (front.0)(i, g.s3_addr())
                    .with_context(|| format!("put a proxy in front of Garage {i}"))?,
                None => g.s3_addr(),
            });
        }
        let (data_a, data_b) = match (garages.as_slice(), s3_at.as_slice()) {
            ([ga, gb], [sa, sb]) => (
                ga.data_url_at("", &sa.to_string()),
                gb.data_url_at("", &sb.to_string()),
            ),
            _ => (
                format!("file://{}", ra.join("data").display()),
                format!("file://{}", rb.join("data").display()),
            ),
        };
        let mut format = vec!["format", meta_a.as_str(), data_a.as_str(), "--name", "dev"];
        format.extend(a.format_args.iter().map(String::as_str));
        run_strait(bin, &env, &format)?;

        // replicator nodes 1, 2 (A) and 3 (B); node 3 is reached through the link
        let nodes: Vec<SocketAddr> = (0..3).map(|_| free_addr()).collect::<Result<_>>()?;
        let mut proxies: Vec<(String, Arc<Proxy>)> = vec![];
        let link = |target: SocketAddr| -> Result<Arc<Proxy>> {
            let p = rt
                .block_on(Proxy::start("127.0.0.1:0".parse().expect("addr"), target))
                .context("start a fault proxy")?;
            p.set(delay);
            Ok(Arc::new(p))
        };
        let p3 = link(nodes[2])?;
        // region B reaches nodes 1 and 2 through the link too (node 3, and the mirror)
        let to_n1 = link(nodes[0])?;
        let to_n2 = link(nodes[1])?;
        proxies.extend([
            (s("a-to-replicator3"), p3.clone()),
            (s("b-to-replicator1"), to_n1.clone()),
            (s("b-to-replicator2"), to_n2.clone()),
        ]);
        for (i, addr) in nodes.iter().enumerate() {
            let region = if i < 2 { &ra } else { &rb };
            let name = format!("replicator{}", i + 1);
            let mut args = vec![
                s("replicator"),
                s("--id"),
                s(i + 1),
                s("--listen"),
                s(addr),
                s("--data-dir"),
                a.hooks.replicator_dirs[i]
                    .clone()
                    .unwrap_or_else(|| region.join(&name))
                    .to_string_lossy()
                    .into_owned(),
            ];
            for role in REPLICATOR_ROLES {
                args.extend([s("--token-file"), format!("{role}={}", token_file(role))]);
            }
            args.extend(server_tls(&name));
            if i == 2 {
                args.extend([
                    s("--peer"),
                    format!("1={}", to_n1.addr()),
                    s("--peer"),
                    format!("2={}", to_n2.addr()),
                ]);
            }
            kids.spawn(&name, &region.join(format!("{name}.log")), &args)?;
        }
        let members = [
            format!("1={}", nodes[0]),
            format!("2={}", nodes[1]),
            format!("3={}", p3.addr()),
        ];
        let start = Instant::now();
        loop {
            let mut init = vec![
                s("replicator"),
                s("init"),
                s("--token-file"),
                token_file("admin"),
                s("--addr"),
                nodes[0].to_string(),
                s("--member"),
                members[0].clone(),
                s("--member"),
                members[1].clone(),
                s("--member"),
                members[2].clone(),
            ];
            init.extend(client_tls("admin"));
            let init: Vec<&str> = init.iter().map(String::as_str).collect();
            let r = run_strait(bin, &env, &init);
            match r {
                Ok(_) => break,
                Err(e) if start.elapsed() > Duration::from_secs(20) => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
        let start = Instant::now();
        while !has_leader(nodes[0], &admin_creds) {
            if start.elapsed() > Duration::from_secs(30) {
                bail!("the replicator elected no leader within 30 s");
            }
            std::thread::sleep(Duration::from_millis(200));
        }

        // the primary (A) ships to the three nodes
        let mut shipping_to = [nodes[0], nodes[1], p3.addr()];
        if a.primary_proxies {
            for (i, to) in shipping_to.iter_mut().enumerate() {
                let p = rt
                    .block_on(Proxy::start("127.0.0.1:0".parse().expect("addr"), *to))
                    .context("start a fault proxy")?;
                let p = Arc::new(p);
                *to = p.addr();
                proxies.push((format!("primary-to-replicator{}", i + 1), p));
            }
        }
        let shipping_to: Vec<String> = shipping_to.iter().map(|a| a.to_string()).collect();
        let primary = free_addr()?;
        let primary_metrics = free_addr()?;
        let plog = ra.join("primary.log");
        kids.spawn(
            "primary",
            &plog,
            &[
                s("primary"),
                s("--meta-url"),
                meta_a.clone(),
                s("--listen"),
                s(primary),
                s("--metrics-listen"),
                s(primary_metrics),
                s("--role-token-file"),
                format!("mount={}", token_file("mount")),
                s("--role-token-file"),
                format!("mirror={}", token_file("mirror")),
                s("--role-token-file"),
                format!("admin={}", token_file("admin")),
                s("--replicator-token-file"),
                token_file("primary"),
                s("--replicator"),
                shipping_to.join(","),
            ]
            .into_iter()
            .chain(server_tls("primary"))
            .chain(a.primary_args.iter().cloned())
            .collect::<Vec<_>>(),
        )?;
        kids.wait_for(
            "primary",
            &plog,
            "strait primary: serving",
            Duration::from_secs(30),
        )?;

        // the mirror (B) reaches region A through the link, its object store too
        let to_primary = link(primary)?;
        proxies.push((s("b-to-primary"), to_primary.clone()));
        let mirror_data_a = match (garages.first(), s3_at.first()) {
            (Some(ga), Some(sa)) => {
                let to_s3 = link(*sa)?;
                proxies.push((s("b-to-s3"), to_s3.clone()));
                ga.data_url_at("", &to_s3.addr().to_string())
            }
            // read as a directory, so not through the link
            _ => data_a.clone(),
        };
        let mut sources = [s(nodes[2]), s(to_n1.addr()), s(to_n2.addr())];
        if a.source == "leader" {
            sources.rotate_left(1);
        }
        let mirror = free_addr()?;
        let mirror_metrics = free_addr()?;
        let mlog = rb.join("mirror.log");
        kids.spawn(
            "mirror",
            &mlog,
            &[
                s("mirror"),
                s("--id"),
                s(MIRROR_ID),
                s("--meta-url"),
                format!("rocksdb://{}", meta_dir(1, &rb).display()),
                s("--listen"),
                s(mirror),
                s("--metrics-listen"),
                s(mirror_metrics),
                s("--role-token-file"),
                format!("mount={}", token_file("mount")),
                s("--role-token-file"),
                format!("admin={}", token_file("admin")),
                s("--primary-token-file"),
                token_file("mirror"),
                s("--replicator-token-file"),
                token_file("mirror"),
                s("--primary"),
                s(to_primary.addr()),
                s("--replicator"),
                sources.join(","),
                s("--window-ms"),
                s(a.window_ms),
                s("--policy"),
                a.policy.clone(),
                s("--data-url"),
                data_b.clone(),
                s("--primary-data-url"),
                mirror_data_a.clone(),
                s("--sync"),
                a.sync.clone(),
            ]
            .into_iter()
            .chain(server_tls(MIRROR_ID))
            .chain(a.mirror_args.iter().cloned())
            .collect::<Vec<_>>(),
        )?;
        kids.wait_for(
            "mirror",
            &mlog,
            "strait mirror: serving",
            Duration::from_secs(60),
        )?;

        // the control socket of `strait dev fault`
        let control = std::net::TcpListener::bind("127.0.0.1:0").context("control socket")?;
        let control_addr = control.local_addr().context("control socket")?;
        {
            // the link between the regions, not the primary's own proxies
            let link: Vec<Arc<Proxy>> = proxies
                .iter()
                .filter(|(n, _)| !n.starts_with("primary-to-"))
                .map(|(_, p)| p.clone())
                .collect();
            let admin = tokens["admin"].clone();
            std::thread::spawn(move || serve_control(control, link, admin));
        }

        let mut topo = Topology {
            token: token.clone(),
            admin_token: tokens["admin"].clone(),
            pki: pki.as_ref().map(|p| p.dir.clone()),
            replicator_tokens: replicator_tokens.clone(),
            primary: s(primary),
            mirror: s(mirror),
            primary_metrics: s(primary_metrics),
            mirror_metrics: s(mirror_metrics),
            replicator: nodes.iter().map(|n| n.to_string()).collect(),
            control: s(control_addr),
            mount_a: None,
            mount_b: None,
            data_a: data_a.clone(),
            data_b: data_b.clone(),
            mirror_data_a: mirror_data_a.clone(),
        };
        let mut mounts = vec![];
        if a.mount {
            for (i, (region, addr, which)) in [(&ra, primary, "a"), (&rb, mirror, "b")]
                .into_iter()
                .enumerate()
            {
                let mnt = region.join("mnt");
                std::fs::create_dir_all(&mnt).context("mount point")?;
                let cache = a.hooks.cache_dirs[i]
                    .clone()
                    .unwrap_or_else(|| region.join("cache"));
                let mut args = vec![
                    s("mount"),
                    format!("strait://{addr}"),
                    mnt.to_string_lossy().into_owned(),
                    s("--token-file"),
                    token_file("mount"),
                    s("--background"),
                    s("--cache-dir"),
                    cache.to_string_lossy().into_owned(),
                    s("--log-file"),
                    region.join("mount.log").to_string_lossy().into_owned(),
                ];
                args.extend(client_tls("mount"));
                args.extend(a.mount_args.iter().cloned());
                let pid = mount_with(bin, &env, &args)
                    .with_context(|| format!("mount region {which}"))?;
                mounts.push(MountProc {
                    point: mnt.clone(),
                    args,
                    pid,
                });
                if which == "a" {
                    topo.mount_a = Some(mnt);
                } else {
                    topo.mount_b = Some(mnt);
                }
            }
        }
        let json = serde_json::to_string_pretty(&topo)?;
        std::fs::write(a.dir.join("dev.json"), &json).context("write dev.json")?;
        Ok(Cluster {
            topology: topo,
            strait_bin: cfg.strait_bin.clone(),
            proxies,
            mounts,
            parts,
        })
    }

    /// The fault proxies, by name (see [`Cluster`]'s field).
    pub fn proxies(&self) -> &[(String, Arc<Proxy>)] {
        &self.proxies
    }

    /// The daemons' names: `replicator1..3`, `primary`, `mirror`.
    pub fn daemons(&self) -> Vec<String> {
        self.parts
            .kids
            .list
            .iter()
            .map(|k| k.name.clone())
            .collect()
    }

    /// The process ids of the Garage servers, region A's first (none with a directory store).
    pub fn garage_pids(&self) -> Vec<u32> {
        self.parts.garages.iter().map(|g| g.pid()).collect()
    }

    /// Region `i`'s Garage (0: A, 1: B), if it has exited: its exit status.
    pub fn garage_exited(&mut self, i: usize) -> Option<std::process::ExitStatus> {
        self.parts.garages.get_mut(i).and_then(|g| g.exited())
    }

    /// Start region `i`'s Garage again on its data (after it exited).
    pub fn restart_garage(&mut self, i: usize) -> Result<()> {
        self.parts
            .garages
            .get_mut(i)
            .with_context(|| format!("no Garage {i}"))?
            .restart()
    }

    /// The process id of daemon `name` (its current incarnation).
    pub fn pid(&mut self, name: &str) -> Result<u32> {
        Ok(self.parts.kids.kid(name)?.child.id())
    }

    /// Send `signal` to daemon `name`.
    pub fn signal(&mut self, name: &str, signal: i32) -> Result<()> {
        let pid = self.pid(name)? as i32;
        // SAFETY: kill has no memory effects; the pid is our own child's (not yet reaped)
        if unsafe { libc::kill(pid, signal) } != 0 {
            bail!(
                "signal {signal} to {name} (pid {pid}): {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// Whether daemon `name` has exited (and reap it if so).
    pub fn exited(&mut self, name: &str) -> Result<bool> {
        Ok(self.parts.kids.kid(name)?.child.try_wait()?.is_some())
    }

    /// SIGKILL daemon `name` and start it again with the same arguments, its output appended
    /// to the same log; wait for its "serving" line (primary, mirror) when `wait`.
    pub fn restart(&mut self, name: &str, wait: Option<Duration>) -> Result<()> {
        let kids = &mut self.parts.kids;
        let k = kids.kid(name)?;
        let _ = k.child.kill();
        let _ = k.child.wait();
        let (log, args) = (k.log.clone(), k.args.clone());
        let mark = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let child = kids.start(name, &log, &args, true)?;
        kids.kid(name)?.child = child;
        let line = match name {
            "primary" => "strait primary: serving",
            "mirror" => "strait mirror: serving",
            _ => return Ok(()),
        };
        let Some(within) = wait else { return Ok(()) };
        let start = Instant::now();
        loop {
            let text = std::fs::read(&log).unwrap_or_default();
            let new = String::from_utf8_lossy(text.get(mark as usize..).unwrap_or_default());
            if new.contains(line) {
                return Ok(());
            }
            if kids.kid(name)?.child.try_wait()?.is_some() {
                bail!(
                    "{name} exited on restart; its log {}:\n{}",
                    log.display(),
                    tail(&log)
                );
            }
            if start.elapsed() > within {
                bail!("{name} did not serve within {within:?} of its restart");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn mount_proc(&self, region: usize) -> Result<&MountProc> {
        self.mounts
            .get(region)
            .with_context(|| format!("no mount in region {region}"))
    }

    /// The pid of the process serving region `region`'s mount (0: A, 1: B).
    pub fn mount_pid(&self, region: usize) -> Result<u32> {
        Ok(self.mount_proc(region)?.pid)
    }

    /// Whether region `region`'s mount process runs.
    pub fn mount_runs(&self, region: usize) -> Result<bool> {
        Ok(process_runs(self.mount_proc(region)?.pid))
    }

    /// Send `signal` to the process serving region `region`'s mount.
    pub fn signal_mount(&self, region: usize, signal: i32) -> Result<()> {
        let pid = self.mount_pid(region)?;
        if !process_runs(pid) {
            bail!("region {region}'s mount process (pid {pid}) is not running");
        }
        // SAFETY: kill has no memory effects; the pid was checked to be running just now
        if unsafe { libc::kill(pid as i32, signal) } != 0 {
            bail!(
                "signal {signal} to the mount process {pid}: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// Mount region `region` again, as it was mounted at the start, after its process died:
    /// the dead mount point is detached first (`umount -l`). Fails when the process still
    /// runs (a live mount is not taken from under its users).
    pub fn remount(&mut self, region: usize) -> Result<()> {
        let m = self.mount_proc(region)?;
        if process_runs(m.pid) {
            bail!(
                "region {region}'s mount process (pid {}) still runs: not mounting over it",
                m.pid
            );
        }
        detach(&m.point)?;
        let start = Instant::now();
        while is_mount_point(&m.point) {
            if start.elapsed() > Duration::from_secs(10) {
                bail!(
                    "{} is still mounted 10 s after a lazy unmount",
                    m.point.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let pid = mount_with(&self.strait_bin, &self.parts.kids.env, &m.args)
            .with_context(|| format!("mount region {region} again"))?;
        if let Some(m) = self.mounts.get_mut(region) {
            m.pid = pid;
        }
        Ok(())
    }

    /// What DIR/dev.json says: addresses, token, object stores, mount points.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Unmount region B, then region A; the errors of those that failed.
    pub fn unmount(&self) -> Vec<anyhow::Error> {
        let t = &self.topology;
        [&t.mount_b, &t.mount_a]
            .into_iter()
            .flatten()
            .filter_map(|m| {
                run_strait(&self.strait_bin, &[], &["umount", &m.to_string_lossy()]).err()
            })
            .collect()
    }
}

/// Longest line the control socket reads.
const CONTROL_LINE_BYTES_MAX: u64 = 1024;

fn serve_control(l: std::net::TcpListener, proxies: Vec<Arc<Proxy>>, admin_token: String) {
    use std::io::Read;
    for conn in l.incoming().flatten() {
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        let mut r = BufReader::new(match conn.try_clone() {
            Ok(c) => c.take(CONTROL_LINE_BYTES_MAX),
            Err(_) => continue,
        });
        let mut w = conn;
        let mut line = String::new();
        if r.read_line(&mut line).is_err() {
            continue;
        }
        // `ADMIN_TOKEN FAULT`: only an operator changes the link
        let (token, cmd) = line.trim().split_once(' ').unwrap_or(("", ""));
        if !strait_auth::Tokens::equal(token, &admin_token) {
            let _ = writeln!(
                w,
                "error: the control socket takes `ADMIN_TOKEN FAULT` with dev up's admin token"
            );
            continue;
        }
        let reply = match cmd {
            "partition" => {
                for p in &proxies {
                    p.update(|f| {
                        f.up.blackhole = true;
                        f.down.blackhole = true;
                    });
                }
                "partitioned: nothing crosses between the regions".to_string()
            }
            "heal" => {
                for p in &proxies {
                    p.update(|f| {
                        f.up.blackhole = false;
                        f.down.blackhole = false;
                    });
                }
                "healed".to_string()
            }
            c if c.starts_with("delay=") => match c[6..].parse::<u64>() {
                Ok(ms) => {
                    for p in &proxies {
                        p.update(|f| {
                            f.up.latency = Duration::from_millis(ms);
                            f.down.latency = Duration::from_millis(ms);
                        });
                    }
                    format!("one-way delay now {ms} ms")
                }
                Err(_) => format!("error: {c:?}: delay=MS with MS a number"),
            },
            c if c.starts_with("bandwidth=") => match c["bandwidth=".len()..].parse::<f64>() {
                Ok(mb) if mb >= 0.0 && mb.is_finite() => {
                    let cap = (mb > 0.0).then_some((mb * 1e6) as u64);
                    for p in &proxies {
                        p.update(|f| {
                            f.up.bandwidth = cap;
                            f.down.bandwidth = cap;
                        });
                    }
                    match cap {
                        Some(_) => format!("bandwidth now {mb} MB/s per proxy"),
                        None => "no bandwidth cap now".to_string(),
                    }
                }
                _ => format!("error: {c:?}: bandwidth=MB_PER_S with a number, 0 for none"),
            },
            other => format!(
                "error: unknown fault {other:?} (partition, heal, delay=MS, bandwidth=MB_PER_S)"
            ),
        };
        let _ = writeln!(w, "{reply}");
    }
}
