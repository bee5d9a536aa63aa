//! A single-node Garage S3 server on 127.0.0.1 (or on a host of [`crate::netns`]), killed
//! when dropped.
//!
//! Set-up follows Garage's own test harness: start `garage server`, assign this node a role
//! in layout version 1, wait until the admin API's `/health` says every partition has its
//! quorum, then create a bucket, import a key with a fixed id and secret and allow the key
//! on the bucket. Every step waits for a condition, never for a fixed time.
//!
//! `strait dev up --store garage` runs one per region; the tests and benchmarks run one per
//! test (through ``tests/support/garage.rs``, which adds a temporary directory).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::ports::distinct_free_ports;
use crate::process::{open_log, spawn_tied_with};

/// The region Garage signs with (`[s3_api] s3_region`); clients must use the same.
pub const REGION: &str = "garage";
pub const BUCKET: &str = "strait-test";
const KEY_NAME: &str = "strait-test";
/// Fixed credentials, so a failing test can be replayed by hand against its server (and
/// every server of `dev up` takes the same ones).
pub const ACCESS_KEY: &str = "GK5e1f0c2b9a8d7e6f5a4b3c2d";
pub const SECRET_KEY: &str = "9c4b0d6e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4";

/// Longest wait for any one readiness condition.
const READY_TIMEOUT_MS: u64 = 30_000;
const POLL_INTERVAL_MS: u64 = 20;
/// Per-connection bound of the readiness probes.
const PROBE_TIMEOUT_MS: u64 = 1_000;
/// Lines of Garage's log shown when something fails while it runs.
const LOG_TAIL_LINES: usize = 40;

/// Held from choosing ports until Garage listens on them. Garage keeps running without its
/// S3 API when that port is taken, so two servers started at once in one process must never
/// be handed the same port: the second one's clients would talk to the first.
static PORTS_LOCK: Mutex<()> = Mutex::new(());

/// Whether the `garage` program is on the PATH.
pub fn installed() -> bool {
    Command::new("garage")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

pub struct Garage {
    child: Child,
    dir: PathBuf,
    config: PathBuf,
    s3_port: u16,
    admin_port: u16,
    startup: Duration,
    /// Where it runs: this machine's loopback, or a host of [`crate::netns`].
    place: Place,
}

pub use crate::netns::OnHost;

#[derive(Debug, Clone)]
struct Place {
    netns: Option<String>,
    ip: Ipv4Addr,
    bucket: String,
}

impl Place {
    fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::from((self.ip, port))
    }

    /// `garage` run where the server runs.
    fn garage(&self) -> Command {
        match &self.netns {
            Some(ns) => crate::netns::nsenter(ns, "garage"),
            None => Command::new("garage"),
        }
    }

    fn port_open(&self, port: u16) -> bool {
        let addr = self.addr(port);
        self.probe(move || port_open(addr))
    }

    fn http_status(&self, port: u16, path: &'static str) -> Option<u16> {
        let addr = self.addr(port);
        self.probe(move || http_status(addr, path))
    }

    /// Run a probe from the server's network namespace.
    fn probe<T: Default + Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        match &self.netns {
            Some(ns) => crate::netns::in_ns(ns, f).unwrap_or_default(),
            None => f(),
        }
    }
}

impl Garage {
    /// Start a ready Garage keeping its config, metadata, data and `garage.log` in `dir`
    /// (created if missing; it should be empty).
    pub fn start_in(dir: &Path) -> Result<Garage> {
        Garage::start_with_data(dir, dir)
    }

    /// [`Garage::start_in`] with its metadata and data (`meta/`, `data/`) under `data_root`
    /// instead (a small file system of its own, say), its config and log still in `dir`.
    pub fn start_with_data(dir: &Path, data_root: &Path) -> Result<Garage> {
        Garage::start(dir, data_root, None)
    }

    /// A ready Garage on a host of [`crate::netns`], its config, data and log in `dir`.
    pub fn start_on_host(dir: &Path, host: OnHost) -> Result<Garage> {
        Garage::start(dir, dir, Some(host))
    }

    fn start(dir: &Path, data_root: &Path, host: Option<OnHost>) -> Result<Garage> {
        if !installed() {
            bail!(
                "the `garage` program is not installed (Garage S3, https://garagehq.deuxfleurs.fr): \
                 `cargo install garage --version 2.5.0 --locked`, or run ./scripts/test.sh once, \
                 which installs it"
            );
        }
        let started = Instant::now();
        for d in [dir, data_root] {
            std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
        }
        let ports_guard = PORTS_LOCK
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (place, [s3_port, rpc_port, admin_port]) = match host {
            None => (
                Place {
                    netns: None,
                    ip: Ipv4Addr::LOCALHOST,
                    bucket: BUCKET.to_string(),
                },
                distinct_free_ports().context("find a free port")?,
            ),
            Some(h) => (
                Place {
                    netns: Some(h.netns),
                    ip: h.ip,
                    bucket: h.bucket,
                },
                [3900, 3901, 3903],
            ),
        };
        let ip = place.ip;

        let config = dir.join("garage.toml");
        let root = data_root.display();
        std::fs::write(
            &config,
            format!(
                r#"metadata_dir = "{root}/meta"
data_dir = "{root}/data"
db_engine = "lmdb"
replication_factor = 1
# blocks are checked, random or already compressed data: zstd would only cost CPU
compression_level = "none"
# one Garage block per strait block (4 MiB): a PUT writes one file and one reference, not four
block_size = 4194304

rpc_bind_addr = "{ip}:{rpc_port}"
rpc_public_addr = "{ip}:{rpc_port}"
rpc_secret = "{rpc_secret}"

[s3_api]
s3_region = "{REGION}"
api_bind_addr = "{ip}:{s3_port}"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "{ip}:{admin_port}"
admin_token = "{admin_token}"
"#,
                rpc_secret = hex::encode(rand::random::<[u8; 32]>()),
                admin_token = hex::encode(rand::random::<[u8; 16]>()),
            ),
        )
        .context("write garage.toml")?;

        let child = launch(&place, &config, &dir.join("garage.log"), false)
            .context("spawn garage server")?;
        // From here on, Drop kills the server if a step fails.
        let mut g = Garage {
            child,
            dir: dir.to_path_buf(),
            config,
            s3_port,
            admin_port,
            startup: Duration::ZERO,
            place,
        };

        g.wait_until("the S3 and admin APIs to accept connections", |g| {
            Ok(g.place.port_open(s3_port) && g.place.port_open(admin_port))
        })?;
        drop(ports_guard);
        g.wait_until("RPC to answer `garage status`", |g| {
            Ok(g.cli(&["status"]).is_ok())
        })?;

        // Give this node all partitions. Until the layout is applied every partition lacks
        // its quorum and bucket and key commands fail.
        let node = g.cli(&["node", "id", "-q"])?;
        let node = node
            .trim()
            .split('@')
            .next()
            .unwrap_or_default()
            .to_string();
        if node.is_empty() {
            bail!("`garage node id -q` printed no node id");
        }
        g.cli(&["layout", "assign", "-z", "dc1", "-c", "1G", &node])?;
        g.cli(&["layout", "apply", "--version", "1"])?;
        g.wait_until("the admin API /health to report quorum (HTTP 200)", |g| {
            Ok(g.place.http_status(g.admin_port, "/health") == Some(200))
        })?;

        let bucket = g.place.bucket.clone();
        g.cli(&["bucket", "create", &bucket])?;
        g.cli(&[
            "key", "import", "--yes", "-n", KEY_NAME, ACCESS_KEY, SECRET_KEY,
        ])?;
        g.cli(&[
            "bucket", "allow", "--read", "--write", "--owner", &bucket, "--key", KEY_NAME,
        ])?;
        g.startup = started.elapsed();
        Ok(g)
    }

    /// Poll `ready` until it holds, failing early if the server exits.
    fn wait_until(
        &mut self,
        what: &str,
        mut ready: impl FnMut(&Self) -> Result<bool>,
    ) -> Result<()> {
        let deadline = Instant::now() + Duration::from_millis(READY_TIMEOUT_MS);
        loop {
            if let Some(status) = self.child.try_wait().context("check garage server")? {
                bail!(
                    "garage server exited ({status}) while waiting for {what}\n{}",
                    self.log_tail()
                );
            }
            if ready(self)? {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "timed out after {READY_TIMEOUT_MS} ms waiting for {what}\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
        }
    }

    /// Run `garage -c CONFIG ARGS...` against this server; its stdout on success.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        let out = self
            .place
            .garage()
            .arg("-c")
            .arg(&self.config)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("run garage {}", args.join(" ")))?;
        if !out.status.success() {
            bail!(
                "garage {}: {}\n{}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `http://IP:PORT`, the S3 API.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.s3_addr())
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the server has exited (and its status, reaped).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Start the server again on the same configuration, ports and data (after it exited or
    /// was killed), its output appended to `garage.log`; wait until its S3 API answers and
    /// the admin API reports quorum.
    pub fn restart(&mut self) -> Result<()> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = launch(
            &self.place,
            &self.config,
            &self.dir.join("garage.log"),
            true,
        )
        .context("spawn garage server again")?;
        let (s3, admin) = (self.s3_port, self.admin_port);
        self.wait_until("the S3 API and quorum after a restart", |g| {
            Ok(g.place.port_open(s3) && g.place.http_status(admin, "/health") == Some(200))
        })
    }

    /// The S3 API's address.
    pub fn s3_addr(&self) -> SocketAddr {
        self.place.addr(self.s3_port)
    }

    pub fn bucket(&self) -> &str {
        &self.place.bucket
    }

    pub fn access_key(&self) -> &str {
        ACCESS_KEY
    }

    pub fn secret_key(&self) -> &str {
        SECRET_KEY
    }

    pub fn region(&self) -> &str {
        REGION
    }

    /// The data URL strait takes: `s3://BUCKET?endpoint=http://127.0.0.1:PORT&region=garage`.
    pub fn data_url(&self) -> String {
        format!(
            "s3://{}?endpoint={}&region={REGION}",
            self.place.bucket,
            self.endpoint()
        )
    }

    /// [`Self::data_url`] with `prefix` for the keys and `endpoint` (`host:port`, a proxy in
    /// front of this server, say) instead of this server's own.
    pub fn data_url_at(&self, prefix: &str, endpoint: &str) -> String {
        let bucket = if prefix.is_empty() {
            self.place.bucket.clone()
        } else {
            format!("{}/{prefix}", self.place.bucket)
        };
        format!("s3://{bucket}?endpoint=http://{endpoint}&region={REGION}")
    }

    /// Environment for child processes that talk to this server with the usual AWS chain.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY".into(), SECRET_KEY.into()),
            ("AWS_REGION".into(), REGION.into()),
        ]
    }

    /// Time from the start until the bucket and key were usable.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// The directory holding config, data and `garage.log`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last lines of `garage.log`, under a heading.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("garage.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        format!("--- last lines of garage.log ---\n{tail}")
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        // SIGKILL: the data is thrown away, and a clean stop takes Garage ~1.5 s.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn port_open(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(PROBE_TIMEOUT_MS)).is_ok()
}

/// Status code of a plain `GET path`, or None if the server did not answer.
fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let timeout = Duration::from_millis(PROBE_TIMEOUT_MS);
    let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    s.read_to_string(&mut response).ok()?;
    // "HTTP/1.1 200 OK"
    response.split_whitespace().nth(1)?.parse().ok()
}

/// Start `garage server` on `config`, its output written to `log` (appended to it when
/// `append`).
fn launch(place: &Place, config: &Path, log: &Path, append: bool) -> std::io::Result<Child> {
    let (config, log, place) = (config.to_path_buf(), log.to_path_buf(), place.clone());
    // the log is opened by the thread that starts the server (`spawn_tied_with`)
    spawn_tied_with(move || {
        let (out, err) = open_log(&log, append)?;
        let mut cmd = place.garage();
        cmd.arg("-c")
            .arg(config)
            .arg("server")
            .env("RUST_LOG", "garage=info,garage_api_common=info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        Ok(cmd)
    })
}
