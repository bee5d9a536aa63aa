//! deploy/README.md's three-region installation, carried out on one machine: the guide's
//! hosts (a1 in region A: the primary, replicator node 1 and a mount; b1 in region B: the
//! mirror, node 3 and a mount; c1 in region C: node 2), its files (`deploy/config/`, the
//! units of `deploy/systemd/`) and its steps in its order: the tokens made with `strait certs
//! token`, an S3 store per region, the configuration files copied to each host and checked,
//! each unit's `ExecStartPre` and `ExecStart` run with its `EnvironmentFile`s, `replicator
//! init` and `replicator status` until there is a leader, `strait format`, the primary and a1's
//! mount, the mirror and b1's mount.
//!
//! Where the hosts run is a [`Placement`], and so is all that differs from real hosts:
//! - `strait_lab::netns` (`strait-lab netns`): a network namespace per host at the guide's own
//!   addresses; only the paths differ;
//! - [`crate::cluster`] (`strait dev up`): this machine's loopback, each listener on a port of
//!   its own, a fault proxy on every link between two regions, and dev up's settings (its
//!   stores, window, durability...) laid over the guide's files.
//!
//! [`Installation`] runs the steps, keeps the services it started (and starts them again, for
//! the fault tests), and stops everything in order.

pub mod files;
mod unit;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub use files::DeployFiles;

use crate::mounts::is_mount_point;
use crate::process::{open_log, output_tied_with, spawn_tied_with};
use crate::Garage;
use unit::{expand, parse_env, parse_unit};

/// A host of the guide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Host {
    pub name: &'static str,
    /// Its region, as deploy/config names it (`a`, `b`, `c`).
    pub region: &'static str,
    /// Its address in the guide.
    pub ip: Ipv4Addr,
    /// The id of the replicator node it runs.
    pub node: u64,
}

/// The hosts of deploy/README.md, at its addresses.
pub const HOSTS: [Host; 3] = [
    Host {
        name: "a1",
        region: "a",
        ip: Ipv4Addr::new(10, 0, 1, 10),
        node: 1,
    },
    Host {
        name: "b1",
        region: "b",
        ip: Ipv4Addr::new(10, 0, 2, 10),
        node: 3,
    },
    Host {
        name: "c1",
        region: "c",
        ip: Ipv4Addr::new(10, 0, 3, 10),
        node: 2,
    },
];

/// Host `name` of the guide.
pub fn host(name: &str) -> Result<&'static Host> {
    HOSTS
        .iter()
        .find(|h| h.name == name)
        .with_context(|| format!("no host {name:?} in the guide (a1, b1, c1)"))
}

/// The certificates of the guide's section 2: each host's, with the roles of what runs there.
pub const CERTIFICATES: [(&str, &str); 3] = [
    ("a1", "primary,peer"),
    ("b1", "mirror,peer"),
    ("c1", "peer"),
];

/// The tokens of the guide's section 2, each in `/etc/strait/tokens/NAME.token`.
pub const TOKENS: [&str; 6] = [
    "mount",
    "mirror",
    "admin",
    "replicator-primary",
    "replicator-mirror",
    "replicator-peer",
];
/// The paths of a real host that a [`Placement`] puts somewhere of its own.
pub const HOST_PATHS: [&str; 4] = [
    "/etc/strait",
    "/var/lib/strait",
    "/var/cache/strait",
    "/mnt/strait",
];
/// Where the guide installs the program.
pub const INSTALLED_BIN: &str = "/usr/local/bin/strait";
/// Longest wait for a daemon to serve, a mount to appear, the replicator to elect.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// Longest wait for a service to stop after SIGTERM or `strait umount` (the units allow 60 s).
const STOP_WITHIN: Duration = Duration::from_secs(30);

/// Drop the caller's own `STRAIT_*` settings from `c`'s environment (a token, a metadata URL,
/// TLS files for the operator's commands): an installed service or command takes its
/// settings from its unit and files alone, as on a real host, where the operator's shell is
/// not the service's. A setting given to `c` afterwards (`envs`) stays. The log filter and
/// the trace exporter pass, as the guide's units leave them to the environment.
fn without_operator_env(c: &mut Command) {
    for (k, _) in std::env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        if k.starts_with("STRAIT_") && k != "STRAIT_LOG" && k != "STRAIT_OTLP_ENDPOINT" {
            c.env_remove(k);
        }
    }
}

/// Where the hosts run, and what differs there from the guide's real hosts.
pub trait Placement {
    /// Where `host` keeps what a real host keeps under `path` (one of [`HOST_PATHS`]).
    fn host_path(&self, host: &Host, path: &str) -> PathBuf;
    /// `program`, to be run on `host` (its network).
    fn command(&self, host: &Host, program: &Path) -> Command;
    /// Whether `addr` accepts a connection made from `host`.
    fn accepts(&self, host: &Host, addr: SocketAddr) -> bool;
    /// Start the S3 store of `host`'s region, for the guide's bucket `bucket`; None when this
    /// placement's regions have no S3 store (their data is in local directories).
    fn start_store(&mut self, host: &Host, bucket: &str) -> Result<Option<Garage>>;
    /// Whether [`Placement::start_store`] starts S3 stores.
    fn has_stores(&self) -> bool {
        true
    }
    /// The log file of service `name` (`replicatorN`, `primary`, `mirror`, `mount-a`...).
    fn log(&self, host: &Host, name: &str) -> PathBuf;
    /// The configuration file `/etc/strait/NAME` of `host` (its paths this placement's
    /// already), as the host reads it here. By default as the guide wrote it.
    fn config(&mut self, _host: &Host, _name: &str, text: String) -> Result<String> {
        Ok(text)
    }
    /// An operator's command run on `host` (its paths this placement's already), as it runs
    /// here. By default as the guide wrote it.
    fn operator_args(&mut self, _host: &Host, args: Vec<String>) -> Result<Vec<String>> {
        Ok(args)
    }
    /// The environment of an operator's command, as it runs here. By default as the guide
    /// wrote it.
    fn operator_env(&self, env: Vec<(String, String)>) -> Vec<(String, String)> {
        env
    }
    /// More arguments for service `name`, after its unit's.
    fn service_args(&self, _name: &str) -> Vec<String> {
        vec![]
    }
    /// More environment for service `name`.
    fn service_env(&self, _name: &str) -> Vec<(String, String)> {
        vec![]
    }
}

/// How a service's process is started, and started again.
#[derive(Debug, Clone)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub log: PathBuf,
}

/// A service started from a unit.
pub struct Service {
    pub host: &'static Host,
    /// `replicatorN`, `primary`, `mirror`, `mount-a`, `mount-b`.
    pub name: String,
    /// The unit (`strait-primary`, `strait-mount@data`).
    pub unit: String,
    pub launch: Launch,
    pub child: Child,
    /// A mount's mount point.
    pub mountpoint: Option<PathBuf>,
}

/// The guide's installation on a placement. Dropping it stops everything ([`Installation::down`]).
pub struct Installation<P: Placement> {
    pub placement: P,
    files: DeployFiles,
    /// The `strait` program, installed as the guide's `/usr/local/bin/strait`.
    bin: PathBuf,
    /// `STRAIT_LOG` of every daemon (empty: their default).
    log_filter: String,
    tokens: BTreeMap<String, String>,
    services: Vec<Service>,
    garages: Vec<Garage>,
    commands: Vec<String>,
}

/// Replace every `from` of `pairs` in `text` by its `to`, in one pass: a replacement is
/// never searched again (a directory standing for `/etc/strait` may hold `/mnt/strait`).
fn replace_once(text: &str, pairs: &[(String, String)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    'scan: while !rest.is_empty() {
        for (from, to) in pairs {
            if !from.is_empty() && rest.starts_with(from.as_str()) {
                out.push_str(to);
                rest = &rest[from.len()..];
                continue 'scan;
            }
        }
        let c = rest.chars().next().expect("rest is not empty");
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// The line a site daemon prints once it serves, by the program it runs.
fn serving_line(args: &[String]) -> Option<&'static str> {
    match args.first().map(String::as_str) {
        Some("primary") => Some("strait primary: serving"),
        Some("mirror") => Some("strait mirror: serving"),
        _ => None,
    }
}

/// The last 20 lines of a log.
pub(crate) fn tail(log: &Path) -> String {
    let t = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Write `bytes` to `path`, readable by its owner only.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    strait_ids::private::write_private(path, bytes)
        .with_context(|| format!("write {}", path.display()))
}

/// The value of the top-level `listen = "..."` line of a TOML file (before any table).
fn top_level_listen(text: &str) -> Option<String> {
    text.lines()
        .take_while(|l| !l.trim_start().starts_with('['))
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == "listen")
        .map(|(_, v)| v.trim().trim_matches('"').to_string())
}

impl<P: Placement> Installation<P> {
    /// Nothing installed yet; `bin` stands for the guide's `/usr/local/bin/strait`.
    pub fn new(placement: P, files: DeployFiles, bin: PathBuf, log_filter: String) -> Self {
        Installation {
            placement,
            files,
            bin,
            log_filter,
            tokens: BTreeMap::new(),
            services: vec![],
            garages: vec![],
            commands: vec![],
        }
    }

    /// The guide's sections 1–4: everything installed and started, a mount per region when
    /// `mount`. `progress`: a line for each step that may take a while.
    pub fn up(&mut self, mount: bool, progress: &mut dyn FnMut(&str)) -> Result<()> {
        self.install(progress)?;
        self.start(mount, progress)
    }

    /// The guide's sections 1–3 and each region's S3 store: the host directories, tokens,
    /// configuration files, checked.
    fn install(&mut self, progress: &mut dyn FnMut(&str)) -> Result<()> {
        for h in &HOSTS {
            for p in HOST_PATHS {
                let local = self.placement.host_path(h, p);
                std::fs::create_dir_all(&local)
                    .with_context(|| format!("create {}", local.display()))?;
            }
            let tokens = self.placement.host_path(h, "/etc/strait").join("tokens");
            std::fs::create_dir_all(&tokens)
                .with_context(|| format!("create {}", tokens.display()))?;
        }
        // 2. tokens, made once and copied to every host
        progress("making the tokens (strait certs token)");
        for t in TOKENS {
            let token = self.strait(&HOSTS[0], &["certs".into(), "token".into()], &[])?;
            let token = token.trim().to_string();
            for h in &HOSTS {
                let path = self.local(h, &format!("/etc/strait/tokens/{t}.token"));
                write_private(Path::new(&path), token.as_bytes())?;
            }
            self.tokens.insert(t.to_string(), token);
        }
        self.commands.push("strait certs token".into());
        // TLS: a CA and a certificate per host, made on a1, copied to each host's pki
        progress("making the certificates (strait certs)");
        let a1 = &HOSTS[0];
        self.operator(a1, &["certs", "ca", "--dir", "/etc/strait/ca"], &[])?;
        for (name, roles) in CERTIFICATES {
            let ip = host(name)?.ip.to_string();
            self.operator(
                a1,
                &[
                    "certs",
                    "issue",
                    "--dir",
                    "/etc/strait/ca",
                    "--name",
                    name,
                    "--role",
                    roles,
                    "--host",
                    &ip,
                ],
                &[],
            )?;
        }
        let ca = PathBuf::from(self.local(a1, "/etc/strait/ca"));
        for h in &HOSTS {
            let pki = PathBuf::from(self.local(h, "/etc/strait/pki"));
            std::fs::create_dir_all(&pki).with_context(|| format!("create {}", pki.display()))?;
            for f in ["ca.pem".to_string(), format!("{}.pem", h.name)] {
                std::fs::copy(ca.join(&f), pki.join(&f))
                    .with_context(|| format!("copy {f} to {}", pki.display()))?;
            }
            let key = format!("{}.key", h.name);
            let bytes = std::fs::read(ca.join(&key)).with_context(|| format!("read {key}"))?;
            write_private(&pki.join(&key), &bytes)?;
        }
        // each region's S3 store (the guide's "an S3 store")
        for (h, bucket) in [(&HOSTS[0], "strait-a"), (&HOSTS[1], "strait-b")] {
            if self.placement.has_stores() {
                progress(&format!(
                    "starting region {}'s S3 store",
                    h.region.to_uppercase()
                ));
            }
            let Some(g) = self.placement.start_store(h, bucket)? else {
                continue;
            };
            let env = format!(
                "AWS_ACCESS_KEY_ID={}\nAWS_SECRET_ACCESS_KEY={}\n",
                g.access_key(),
                g.secret_key()
            );
            write_private(
                Path::new(&self.local(h, "/etc/strait/s3.env")),
                env.as_bytes(),
            )?;
            self.garages.push(g);
        }
        // 3. configuration files, then checked as the daemons will read them
        for h in &HOSTS {
            for name in self.files.config_files(h.region)? {
                let text = self
                    .files
                    .read(&format!("config/region-{}/{name}", h.region))?;
                let text = self.local(h, &text);
                let text = self
                    .placement
                    .config(h, &name, text)
                    .with_context(|| format!("{name} of {}", h.name))?;
                let to = self.local(h, &format!("/etc/strait/{name}"));
                std::fs::write(&to, text).with_context(|| format!("write {to}"))?;
            }
        }
        for (h, role) in [
            ("a1", "replicator"),
            ("b1", "replicator"),
            ("c1", "replicator"),
            ("a1", "primary"),
            ("b1", "mirror"),
        ] {
            let config = format!("/etc/strait/{role}.toml");
            self.operator(
                host(h)?,
                &[role, "--config", &config, "--check-config"],
                &[],
            )?;
        }
        Ok(())
    }

    /// The guide's section 4.
    fn start(&mut self, mount: bool, progress: &mut dyn FnMut(&str)) -> Result<()> {
        progress("starting the replicator nodes");
        for h in &HOSTS {
            self.service(
                h,
                "strait-replicator",
                "",
                Some("/etc/strait/replicator.toml"),
            )?;
        }
        let admin = [
            ("STRAIT_TOKEN_FILE", "/etc/strait/tokens/admin.token"),
            ("STRAIT_TLS_CA", "/etc/strait/pki/ca.pem"),
        ];
        let a1 = &HOSTS[0];
        let init = [
            "replicator",
            "init",
            "--addr",
            "10.0.1.10:7430",
            "--member",
            "1=10.0.1.10:7430",
            "--member",
            "2=10.0.3.10:7430",
            "--member",
            "3=10.0.2.10:7430",
        ];
        // a node that serves may still be opening its log
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            match self.operator(a1, &init, &admin) {
                Ok(_) => break,
                Err(_) if Instant::now() < deadline => {
                    self.commands.pop();
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
        progress("waiting for the replicator's leader (replicator status)");
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let status = self.operator(
                a1,
                &["replicator", "status", "--addr", "10.0.3.10:7430"],
                &admin,
            );
            match status {
                Ok(s) if s.contains("leader") && !s.contains("no leader") => break,
                _ if Instant::now() < deadline => {
                    self.commands.pop();
                    std::thread::sleep(Duration::from_millis(200));
                }
                Ok(s) => bail!("the replicator has no leader after {READY_WITHIN:?}:\n{s}"),
                Err(e) => return Err(e.context("the replicator's status")),
            }
        }
        let s3_env = self.local(a1, "/etc/strait/s3.env");
        let s3 = match std::fs::read_to_string(&s3_env) {
            Ok(t) => parse_env(&t),
            Err(_) if self.garages.is_empty() => BTreeMap::new(),
            Err(e) => bail!("read {s3_env}: {e}"),
        };
        let s3: Vec<(&str, &str)> = s3.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.operator(
            a1,
            &[
                "format",
                "rocksdb:///var/lib/strait/meta",
                "s3://strait-a?endpoint=http://10.0.1.10:3900&region=garage",
                "--name",
                "data",
            ],
            &s3,
        )?;
        progress("starting the primary");
        self.service(a1, "strait-primary", "", Some("/etc/strait/primary.toml"))?;
        if mount {
            self.service(a1, "strait-mount@", "data", None)?;
        }
        progress("starting the mirror");
        let b1 = &HOSTS[1];
        self.service(b1, "strait-mirror", "", Some("/etc/strait/mirror.toml"))?;
        if mount {
            self.service(b1, "strait-mount@", "data", None)?;
        }
        Ok(())
    }

    /// `text` (a path, a command line, a file) with a real host's paths made `host`'s here,
    /// and the installed program this one.
    pub fn local(&self, host: &Host, text: &str) -> String {
        let mut pairs = vec![(
            INSTALLED_BIN.to_string(),
            self.bin.to_string_lossy().into_owned(),
        )];
        for p in HOST_PATHS {
            let to = self.placement.host_path(host, p);
            pairs.push((p.to_string(), to.to_string_lossy().into_owned()));
        }
        replace_once(text, &pairs)
    }

    /// Run `strait ARGS` on `host` to its end: its stdout.
    fn strait(&self, host: &Host, args: &[String], env: &[(String, String)]) -> Result<String> {
        let line = args.join(" ");
        let mut c = self.placement.command(host, &self.bin);
        without_operator_env(&mut c);
        c.args(args).envs(env.iter().cloned());
        let out = output_tied_with(move || Ok(c))
            .with_context(|| format!("run strait {line} on {}", host.name))?;
        if !out.status.success() {
            bail!(
                "on {}: strait {}: {}",
                host.name,
                line,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// An operator's command of the guide, run on `host` and kept in its words.
    pub fn operator(&mut self, host: &Host, args: &[&str], env: &[(&str, &str)]) -> Result<String> {
        self.commands.push(format!("strait {}", args.join(" ")));
        let args: Vec<String> = args.iter().map(|a| self.local(host, a)).collect();
        let args = self.placement.operator_args(host, args)?;
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), self.local(host, v)))
            .collect();
        let env = self.placement.operator_env(env);
        self.strait(host, &args, &env)
    }

    /// The name a service goes by: `replicatorN`, `primary`, `mirror`, `mount-REGION`.
    fn service_name(host: &Host, unit: &str) -> String {
        match unit {
            "strait-replicator" => format!("replicator{}", host.node),
            "strait-mount@" => format!("mount-{}", host.region),
            u => u.trim_start_matches("strait-").to_string(),
        }
    }

    /// `systemctl enable --now UNIT` on `host`: the unit's `ExecStartPre`s, then its
    /// `ExecStart` on the host with the unit's environment, until it serves (a daemon: the
    /// `listen` address of `config` accepts connections, and a site daemon has said it
    /// serves; a mount: its mount point is mounted).
    fn service(
        &mut self,
        host: &'static Host,
        unit: &str,
        instance: &str,
        config: Option<&str>,
    ) -> Result<()> {
        let unit_name = format!("{unit}{instance}");
        self.commands
            .push(format!("systemctl enable --now {unit_name}"));
        let u = parse_unit(
            &unit_name,
            &self.files.read(&format!("systemd/{unit}.service"))?,
            instance,
        )?;
        let mut env = BTreeMap::new();
        for (file, optional) in &u.env_files {
            let local = self.local(host, file);
            match std::fs::read_to_string(&local) {
                Ok(t) => env.extend(parse_env(&t)),
                Err(_) if *optional => {}
                Err(e) => bail!(
                    "{unit_name} on {}: environment file {local}: {e}",
                    host.name
                ),
            }
        }
        // (the files in the host's /etc/strait hold the host's paths already)
        for pre in &u.pre {
            let words = expand(&self.local(host, pre), &env);
            let (prog, args) = words.split_first().context("an empty ExecStartPre")?;
            let mut c = self.placement.command(host, Path::new(prog));
            without_operator_env(&mut c);
            c.args(args);
            let out = c
                .stdin(Stdio::null())
                .output()
                .with_context(|| format!("{unit_name} on {}: run {prog}", host.name))?;
            if !out.status.success() {
                bail!(
                    "{unit_name} on {}: ExecStartPre {pre}: {}",
                    host.name,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        let words = expand(&self.local(host, &u.start), &env);
        let (program, args) = words.split_first().context("an empty ExecStart")?;
        let name = Self::service_name(host, unit);
        let args = unit::with_settings(args, &self.placement.service_args(&name));
        let mut process_env: Vec<(String, String)> = env.clone().into_iter().collect();
        if !self.log_filter.is_empty() {
            process_env.push(("STRAIT_LOG".into(), self.log_filter.clone()));
        }
        process_env.extend(self.placement.service_env(&name));
        let log = self.placement.log(host, &name);
        let mountpoint = unit
            .starts_with("strait-mount")
            .then(|| env.get("STRAIT_MOUNTPOINT").map(PathBuf::from))
            .flatten();
        let launch = Launch {
            program: PathBuf::from(program),
            args,
            env: process_env,
            log,
        };
        let child = self.spawn(host, &unit_name, &launch, false)?;
        let s = Service {
            host,
            name,
            unit: unit_name.clone(),
            launch,
            child,
            mountpoint,
        };
        let listen = match config {
            Some(c) => {
                let path = self.local(host, c);
                let text =
                    std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
                let listen = top_level_listen(&text)
                    .with_context(|| format!("no listen address in {path}"))?;
                Some(
                    listen
                        .parse::<SocketAddr>()
                        .with_context(|| format!("listen {listen:?} of {path}"))?,
                )
            }
            None => None,
        };
        self.services.push(s);
        let i = self.services.len() - 1;
        self.wait_ready(i, listen, 0)
    }

    /// Start `launch`'s process on `host` (its log appended to when `append`).
    fn spawn(&self, host: &Host, unit: &str, launch: &Launch, append: bool) -> Result<Child> {
        let mut c = self.placement.command(host, &launch.program);
        without_operator_env(&mut c);
        c.args(&launch.args)
            .envs(launch.env.iter().cloned())
            .stdin(Stdio::null())
            // a Ctrl-C at the terminal reaches the caller alone, which unmounts before it
            // stops the daemons; if the caller dies, they get SIGTERM
            .process_group(0);
        let log = launch.log.clone();
        spawn_tied_with(move || {
            let (out, err) = open_log(&log, append)?;
            c.stdout(out).stderr(err);
            Ok(c)
        })
        .with_context(|| format!("start {unit} on {}", host.name))
    }

    /// Wait until service `i` serves: `listen` accepts connections, its log (past byte `mark`)
    /// says it serves, its mount point is mounted.
    fn wait_ready(&mut self, i: usize, listen: Option<SocketAddr>, mark: u64) -> Result<()> {
        let deadline = Instant::now() + READY_WITHIN;
        let mut accepted = listen.is_none();
        loop {
            let s = &self.services[i];
            if !accepted {
                accepted = listen.is_some_and(|a| self.placement.accepts(s.host, a));
            }
            let said = match serving_line(&s.launch.args) {
                Some(line) => {
                    let text = std::fs::read(&s.launch.log).unwrap_or_default();
                    String::from_utf8_lossy(text.get(mark as usize..).unwrap_or_default())
                        .contains(line)
                }
                None => true,
            };
            let mounted = s.mountpoint.as_deref().is_none_or(is_mount_point);
            if accepted && said && mounted {
                return Ok(());
            }
            let s = &mut self.services[i];
            if let Some(status) = s.child.try_wait()? {
                bail!(
                    "{} on {} exited ({status}) before it served; its log {}:\n{}",
                    s.unit,
                    s.host.name,
                    s.launch.log.display(),
                    tail(&s.launch.log)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{} on {} did not serve within {READY_WITHIN:?}; its log {}:\n{}",
                    s.unit,
                    s.host.name,
                    s.launch.log.display(),
                    tail(&s.launch.log)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn index(&self, name: &str) -> Result<usize> {
        self.services
            .iter()
            .position(|s| s.name == name)
            .with_context(|| {
                let names: Vec<&str> = self.services.iter().map(|s| s.name.as_str()).collect();
                format!("no service {name:?} (there are: {})", names.join(", "))
            })
    }

    /// Service `name` (`replicatorN`, `primary`, `mirror`, `mount-a`, `mount-b`).
    pub fn service_mut(&mut self, name: &str) -> Result<&mut Service> {
        let i = self.index(name)?;
        Ok(&mut self.services[i])
    }

    /// Every service, in the order of their start.
    pub fn services(&self) -> &[Service] {
        &self.services
    }

    /// SIGKILL service `name` (if it runs) and start it again, with `args` in place of its
    /// arguments when given, its output appended to its log; then, unless `wait` is None,
    /// wait that long for it to serve (a site daemon's "serving" line, a mount point).
    pub fn respawn(
        &mut self,
        name: &str,
        args: Option<Vec<String>>,
        wait: Option<Duration>,
    ) -> Result<()> {
        let i = self.index(name)?;
        let s = &mut self.services[i];
        let _ = s.child.kill();
        let _ = s.child.wait();
        if let Some(args) = args {
            s.launch.args = args;
        }
        let mark = std::fs::metadata(&s.launch.log)
            .map(|m| m.len())
            .unwrap_or(0);
        let s = &self.services[i];
        let child = self.spawn(s.host, &s.unit, &s.launch, true)?;
        self.services[i].child = child;
        if wait.is_none() {
            return Ok(());
        }
        self.wait_ready(i, None, mark)
    }

    /// The tokens, by the guide's names ([`TOKENS`]).
    pub fn tokens(&self) -> &BTreeMap<String, String> {
        &self.tokens
    }

    /// Each region's S3 store (none when the placement has none).
    pub fn garages(&self) -> &[Garage] {
        &self.garages
    }

    pub fn garages_mut(&mut self) -> &mut [Garage] {
        &mut self.garages
    }

    /// The operator's commands run so far, in the guide's words (`strait ...`,
    /// `systemctl enable --now UNIT`).
    pub fn commands(&self) -> &[String] {
        &self.commands
    }

    /// `strait umount` each mount that is mounted, the last started first; the errors.
    pub fn unmount(&self) -> Vec<anyhow::Error> {
        let mut errors = vec![];
        for s in self.services.iter().rev() {
            let Some(m) = s.mountpoint.as_deref().filter(|m| is_mount_point(m)) else {
                continue;
            };
            let (bin, m) = (self.bin.clone(), m.to_path_buf());
            let out = output_tied_with(move || {
                let mut c = Command::new(bin);
                c.arg("umount").arg(m);
                Ok(c)
            });
            match out {
                Ok(o) if o.status.success() => {}
                Ok(o) => errors.push(anyhow::anyhow!(
                    "strait umount {}: {}",
                    s.mountpoint.as_deref().unwrap_or(Path::new("")).display(),
                    String::from_utf8_lossy(&o.stderr).trim()
                )),
                Err(e) => errors.push(anyhow::Error::new(e).context("run strait umount")),
            }
        }
        errors
    }

    /// Stop everything: the mounts (`ExecStop`: `strait umount`), then the daemons (SIGTERM,
    /// the last started first, SIGKILL after [`STOP_WITHIN`]), then the S3 stores. Errors are
    /// collected, not stopped at: whatever can be stopped is.
    pub fn down(&mut self) -> Vec<String> {
        let mut errors: Vec<String> = self.unmount().iter().map(|e| format!("{e:#}")).collect();
        for s in self.services.iter().rev() {
            let pid = s.child.id() as i32;
            // SAFETY: kill has no memory effects; the pid is our child's, not yet reaped
            // (a stopped process would not act on SIGTERM)
            unsafe {
                libc::kill(pid, libc::SIGCONT);
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + STOP_WITHIN;
        while let Some(mut s) = self.services.pop() {
            loop {
                match s.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Ok(None) => {
                        errors.push(format!(
                            "{} on {} did not stop within {STOP_WITHIN:?}: killed",
                            s.unit, s.host.name
                        ));
                        let _ = s.child.kill();
                        let _ = s.child.wait();
                        break;
                    }
                }
            }
            if let Some(m) = s.mountpoint.as_deref().filter(|m| is_mount_point(m)) {
                if let Err(e) = crate::mounts::detach(m) {
                    errors.push(format!("{e:#}"));
                }
            }
        }
        self.garages.clear();
        errors
    }
}

impl<P: Placement> Drop for Installation<P> {
    fn drop(&mut self) {
        for e in self.down() {
            eprintln!("strait: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listen_address_is_the_top_level_ones() {
        let t = "# x\nid = 1\nlisten = \"10.0.1.10:7430\"\n[promotion]\nlisten = \"no\"\n";
        assert_eq!(top_level_listen(t).as_deref(), Some("10.0.1.10:7430"));
    }

    #[test]
    fn paths_are_replaced_once() {
        let pairs = vec![
            ("/etc/strait".to_string(), "/mnt/strait/x/etc".to_string()),
            ("/mnt/strait".to_string(), "/mnt/strait/x/mnt".to_string()),
        ];
        assert_eq!(
            replace_once("a=/etc/strait/t b=/mnt/strait", &pairs),
            "a=/mnt/strait/x/etc/t b=/mnt/strait/x/mnt"
        );
        assert_eq!(replace_once("é/etc/straité", &pairs), "é/mnt/strait/x/etcé");
    }
}
