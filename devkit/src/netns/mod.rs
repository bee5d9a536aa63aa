//! deploy/README.md's three-region installation, rehearsed on this machine: a network
//! namespace per host at the guide's addresses (a1 10.0.1.10, b1 10.0.2.10, c1 10.0.3.10,
//! and an operator's host, 10.0.0.1), a Garage per region, and the guide's steps in its order
//! with its files: the tokens made with `strait certs token`, `deploy/config/` copied to each
//! host, each unit's `ExecStart` (from `deploy/systemd/`, with its `EnvironmentFile`s) run in
//! the host's namespace, the replicator formed with `replicator init`, the file system
//! formatted, the primary, the mirror and a mount per region started. What differs from real
//! hosts, and only that: each host's `/etc/strait`, `/var/lib/strait`, `/var/cache/strait`
//! and `/mnt/strait` are directories under [`NetnsConfig::dir`], the daemons run as root
//! (no `strait` user, no systemd sandbox), and the WAN's delay comes from a proxy in each host
//! ([`network`]). Every operator command it runs is kept ([`Deployment::commands`]) in the
//! guide's words, so a test can hold the guide to them.
//!
//! `strait dev netns` runs it until Ctrl-C; `tests/tests/netns.rs` checks it.

pub mod network;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub use network::{in_ns, ns_of, nsenter, Host, Network, HOSTS, OPS};

use crate::garage::OnHost;
use crate::process::{open_log, spawn_tied_with};
use crate::Garage;

/// The tokens of the guide's section 2.
pub const TOKENS: [&str; 6] = [
    "mount",
    "mirror",
    "admin",
    "replicator-primary",
    "replicator-mirror",
    "replicator-peer",
];
/// The paths of a real host that live under the host's directory here.
const HOST_PATHS: [&str; 4] = [
    "/etc/strait",
    "/var/lib/strait",
    "/var/cache/strait",
    "/mnt/strait",
];
const INSTALLED_BIN: &str = "/usr/local/bin/strait";
/// Longest wait for a daemon to serve, a mount to appear, the replicator to elect.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// Longest wait for a daemon to stop after SIGTERM (the units allow 60 s).
const STOP_WITHIN: Duration = Duration::from_secs(30);

/// What to bring up.
#[derive(Debug, Clone)]
pub struct NetnsConfig {
    /// Each host's directories, logs and the Garages' data (emptied first).
    pub dir: PathBuf,
    /// The `strait` program, installed as the guide's `/usr/local/bin/strait`.
    pub strait_bin: PathBuf,
    /// The `deploy/` directory whose files are used.
    pub deploy: PathBuf,
    /// One-way delay between hosts.
    pub delay: Duration,
    /// Each host's link cap, MB/s each way (0: none).
    pub link_mb_s: u64,
    /// Start the mounts of regions A and B.
    pub mount: bool,
    /// `STRAIT_LOG` of every daemon.
    pub log: String,
}

/// A process started from a unit.
struct Service {
    host: &'static str,
    unit: String,
    child: Child,
    log: PathBuf,
    /// `ExecStop`, for a mount: its mount point.
    mountpoint: Option<PathBuf>,
}

/// The hosts, running. Dropping it unmounts the mounts, stops the daemons (SIGTERM, then
/// SIGKILL), stops the Garages and removes the namespaces.
pub struct Deployment {
    cfg: NetnsConfig,
    services: Vec<Service>,
    garages: Vec<Garage>,
    commands: Vec<String>,
    // last: removed after every process in it has stopped
    network: Option<Network>,
}

/// `host`'s directory standing for its root.
fn root_of(dir: &Path, host: &str) -> PathBuf {
    dir.join(host)
}

/// The words of a unit's command line, systemd's way: `${VAR}` is one word, a word that is
/// `$VAR` alone splits its value at whitespace.
fn expand(line: &str, env: &BTreeMap<String, String>) -> Vec<String> {
    let mut words = vec![];
    for w in line.split_whitespace() {
        if let Some(name) = w.strip_prefix('$').filter(|n| !n.starts_with('{')) {
            words.extend(
                env.get(name)
                    .map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
                    .unwrap_or_default(),
            );
            continue;
        }
        let mut out = w.to_string();
        for (k, v) in env {
            out = out.replace(&format!("${{{k}}}"), v);
        }
        words.push(out);
    }
    words
}

/// `KEY=VALUE` lines of an environment file.
fn parse_env(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// A unit's `ExecStartPre`, `ExecStart` and `EnvironmentFile` lines (`-` marks a file that
/// may be missing), `%i` replaced by `instance`.
struct Unit {
    pre: Vec<String>,
    start: String,
    env_files: Vec<(String, bool)>,
}

fn read_unit(path: &Path, instance: &str) -> Result<Unit> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let mut u = Unit {
        pre: vec![],
        start: String::new(),
        env_files: vec![],
    };
    for l in text.lines().map(|l| l.trim().replace("%i", instance)) {
        if let Some(v) = l.strip_prefix("ExecStartPre=") {
            u.pre.push(v.to_string());
        } else if let Some(v) = l.strip_prefix("ExecStart=") {
            u.start = v.to_string();
        } else if let Some(v) = l.strip_prefix("EnvironmentFile=") {
            match v.strip_prefix('-') {
                Some(v) => u.env_files.push((v.to_string(), true)),
                None => u.env_files.push((v.to_string(), false)),
            }
        }
    }
    if u.start.is_empty() {
        bail!("{} has no ExecStart", path.display());
    }
    Ok(u)
}

impl Deployment {
    /// Bring everything up, in the guide's order. On an error, what was started is stopped.
    pub fn up(cfg: NetnsConfig) -> Result<Deployment> {
        if !cfg.deploy.join("README.md").exists() {
            bail!(
                "{} is not strait's deploy/ directory (no README.md)",
                cfg.deploy.display()
            );
        }
        if cfg.dir.exists() {
            std::fs::remove_dir_all(&cfg.dir)
                .with_context(|| format!("empty {}", cfg.dir.display()))?;
        }
        let network = Network::create(cfg.delay, cfg.link_mb_s)?;
        let mut d = Deployment {
            cfg,
            services: vec![],
            garages: vec![],
            commands: vec![],
            network: Some(network),
        };
        d.install()?;
        d.start()?;
        Ok(d)
    }

    /// The guide's sections 1–3 and each region's S3 store: the host directories, tokens,
    /// configuration files, checked.
    fn install(&mut self) -> Result<()> {
        for h in HOSTS {
            for p in HOST_PATHS {
                let local = self.local(h.name, p);
                std::fs::create_dir_all(&local).with_context(|| format!("create {local}"))?;
            }
            std::fs::create_dir_all(self.local(h.name, "/etc/strait/tokens"))?;
        }
        // 2. tokens, made once and copied to every host
        for t in TOKENS {
            let token = self.strait("a1", &["certs", "token"], &[])?;
            for h in HOSTS {
                let path = self.local(h.name, &format!("/etc/strait/tokens/{t}.token"));
                write_private(Path::new(&path), token.trim().as_bytes())?;
            }
        }
        self.commands.push("strait certs token".into());
        // each region's S3 store (the guide's "an S3 store"), at its host's address
        for (h, bucket) in [(&HOSTS[0], "strait-a"), (&HOSTS[1], "strait-b")] {
            let g = Garage::start_on_host(
                &root_of(&self.cfg.dir, h.name).join("garage"),
                OnHost {
                    netns: ns_of(h.name),
                    ip: h.ip,
                    bucket: bucket.into(),
                },
            )
            .with_context(|| format!("start {}'s S3 store", h.name))?;
            let env = format!(
                "AWS_ACCESS_KEY_ID={}\nAWS_SECRET_ACCESS_KEY={}\n",
                g.access_key(),
                g.secret_key()
            );
            write_private(
                Path::new(&self.local(h.name, "/etc/strait/s3.env")),
                env.as_bytes(),
            )?;
            self.garages.push(g);
        }
        // 3. configuration files, then checked as the daemons will read them
        for h in HOSTS {
            let from = self
                .cfg
                .deploy
                .join("config")
                .join(format!("region-{}", h.region));
            let entries =
                std::fs::read_dir(&from).with_context(|| format!("read {}", from.display()))?;
            for e in entries {
                let e = e?;
                let name = e.file_name().to_string_lossy().into_owned();
                let text = std::fs::read_to_string(e.path())
                    .with_context(|| format!("read {}", e.path().display()))?;
                let to = self.local(h.name, &format!("/etc/strait/{name}"));
                std::fs::write(&to, self.local(h.name, &text))
                    .with_context(|| format!("write {to}"))?;
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
            self.operator(h, &[role, "--config", &config, "--check-config"], &[])?;
        }
        Ok(())
    }

    /// The guide's section 4.
    fn start(&mut self) -> Result<()> {
        for h in ["a1", "b1", "c1"] {
            self.service(
                h,
                "strait-replicator",
                "",
                Some("/etc/strait/replicator.toml"),
            )?;
        }
        let admin = [("STRAIT_TOKEN_FILE", "/etc/strait/tokens/admin.token")];
        self.operator(
            "a1",
            &[
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
            ],
            &admin,
        )?;
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let status = self.operator(
                "a1",
                &["replicator", "status", "--addr", "10.0.3.10:7430"],
                &admin,
            );
            match status {
                Ok(s) if s.contains("leader") && !s.contains("no leader") => break,
                _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
                Ok(s) => bail!("the replicator has no leader after {READY_WITHIN:?}:\n{s}"),
                Err(e) => return Err(e.context("the replicator's status")),
            }
        }
        let s3 = parse_env(&std::fs::read_to_string(
            self.local("a1", "/etc/strait/s3.env"),
        )?);
        let s3: Vec<(&str, &str)> = s3.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.operator(
            "a1",
            &[
                "format",
                "rocksdb:///var/lib/strait/meta",
                "s3://strait-a?endpoint=http://10.0.1.10:3900&region=garage",
                "--name",
                "data",
            ],
            &s3,
        )?;
        self.service("a1", "strait-primary", "", Some("/etc/strait/primary.toml"))?;
        if self.cfg.mount {
            self.service("a1", "strait-mount@", "data", None)?;
        }
        self.service("b1", "strait-mirror", "", Some("/etc/strait/mirror.toml"))?;
        if self.cfg.mount {
            self.service("b1", "strait-mount@", "data", None)?;
        }
        Ok(())
    }

    /// `text` (a path, a command line, a file) with a real host's paths made `host`'s here.
    pub fn local(&self, host: &str, text: &str) -> String {
        let root = root_of(&self.cfg.dir, host);
        let mut out = text.replace(INSTALLED_BIN, &self.cfg.strait_bin.to_string_lossy());
        for p in HOST_PATHS {
            out = out.replace(p, &format!("{}{p}", root.display()));
        }
        out
    }

    /// Run `strait ARGS` on `host` (the network of its namespace) to its end: its stdout.
    fn strait(&self, host: &str, args: &[&str], env: &[(&str, &str)]) -> Result<String> {
        let args: Vec<String> = args.iter().map(|a| self.local(host, a)).collect();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), self.local(host, v)))
            .collect();
        let ns = ns_of(host);
        let bin = self.cfg.strait_bin.clone();
        let line = args.join(" ");
        let out = crate::process::output_tied_with(move || {
            let mut c = nsenter(&ns, bin);
            c.args(&args).envs(env);
            Ok(c)
        })
        .with_context(|| format!("run strait {line} on {host}"))?;
        if !out.status.success() {
            bail!(
                "on {host}: strait {}: {}",
                line,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// An operator's command of the guide, run on `host` and kept in its words.
    pub fn operator(&mut self, host: &str, args: &[&str], env: &[(&str, &str)]) -> Result<String> {
        self.commands.push(format!("strait {}", args.join(" ")));
        self.strait(host, args, env)
    }

    /// `systemctl enable --now UNIT` on `host`: the unit's `ExecStartPre`s, then its
    /// `ExecStart` in the host's namespace with the unit's environment, until it serves (a
    /// daemon: its `listen` address of `config` accepts connections; a mount: its mount
    /// point is mounted).
    fn service(
        &mut self,
        host: &'static str,
        unit: &str,
        instance: &str,
        config: Option<&str>,
    ) -> Result<()> {
        let name = format!("{unit}{instance}");
        self.commands.push(format!("systemctl enable --now {name}"));
        let u = read_unit(
            &self
                .cfg
                .deploy
                .join("systemd")
                .join(format!("{unit}.service")),
            instance,
        )?;
        let mut env = BTreeMap::new();
        for (file, optional) in &u.env_files {
            let local = self.local(host, file);
            match std::fs::read_to_string(&local) {
                Ok(t) => env.extend(parse_env(&t)),
                Err(_) if *optional => {}
                Err(e) => bail!("{name} on {host}: environment file {local}: {e}"),
            }
        }
        // (the files in the host's /etc/strait hold the host's paths already)
        for pre in &u.pre {
            let words = expand(&self.local(host, pre), &env);
            let (prog, args) = words.split_first().context("an empty ExecStartPre")?;
            let mut c = nsenter(&ns_of(host), prog);
            c.args(args);
            network::run(c).with_context(|| format!("{name} on {host}: ExecStartPre"))?;
        }
        let words = expand(&self.local(host, &u.start), &env);
        let log = root_of(&self.cfg.dir, host).join(format!("{name}.log"));
        let (ns, log2, words2) = (ns_of(host), log.clone(), words.clone());
        let mut process_env: Vec<(String, String)> = env.clone().into_iter().collect();
        process_env.push(("STRAIT_LOG".into(), self.cfg.log.clone()));
        let child = spawn_tied_with(move || {
            let (out, err) = open_log(&log2, false)?;
            let (prog, args) = words2
                .split_first()
                .ok_or_else(|| std::io::Error::other("an empty ExecStart"))?;
            let mut c = nsenter(&ns, prog);
            c.args(args)
                .envs(process_env)
                .stdin(std::process::Stdio::null())
                .stdout(out)
                .stderr(err);
            Ok(c)
        })
        .with_context(|| format!("start {name} on {host}"))?;
        let mountpoint = unit
            .starts_with("strait-mount")
            .then(|| env.get("STRAIT_MOUNTPOINT").map(PathBuf::from))
            .flatten();
        self.services.push(Service {
            host,
            unit: name.clone(),
            child,
            log,
            mountpoint: mountpoint.clone(),
        });
        let listen = match config {
            Some(c) => Some(listen_of(&self.local(host, c))?),
            None => None,
        };
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let ready = match (&listen, &mountpoint) {
                (Some(addr), _) => {
                    let addr = *addr;
                    in_ns(&ns_of(host), move || {
                        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
                    })?
                }
                (None, Some(m)) => crate::cluster::is_mount_point(m),
                (None, None) => true,
            };
            if ready {
                return Ok(());
            }
            let s = self.services.last_mut().context("the service")?;
            if let Some(status) = s.child.try_wait()? {
                bail!(
                    "{name} on {host} exited ({status}) before it served:\n{}",
                    crate::cluster::tail(&s.log)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{name} on {host} did not serve within {READY_WITHIN:?}:\n{}",
                    crate::cluster::tail(&s.log)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Region `host`'s mount point (a1 or b1).
    pub fn mountpoint(&self, host: &str) -> PathBuf {
        PathBuf::from(self.local(host, "/mnt/strait"))
    }

    /// The operator's commands run so far, in the guide's words (`strait ...`,
    /// `systemctl enable --now UNIT`).
    pub fn commands(&self) -> &[String] {
        &self.commands
    }

    /// The hosts' network (the WAN proxies' counts).
    pub fn network(&self) -> Option<&Network> {
        self.network.as_ref()
    }

    /// Each running service: (host, unit, pid).
    pub fn services(&self) -> Vec<(&'static str, String, u32)> {
        self.services
            .iter()
            .map(|s| (s.host, s.unit.clone(), s.child.id()))
            .collect()
    }

    /// Stop everything: the mounts (`ExecStop`: `strait umount`), the daemons in the reverse
    /// order of their start, the Garages, the namespaces. Errors are collected, not stopped
    /// at: whatever can be stopped is.
    pub fn down(&mut self) -> Vec<String> {
        let mut errors = vec![];
        while let Some(mut s) = self.services.pop() {
            if let Some(m) = &s.mountpoint {
                let mut c = Command::new(&self.cfg.strait_bin);
                c.arg("umount").arg(m);
                if let Err(e) = network::run(c) {
                    errors.push(format!("{} on {}: umount: {e:#}", s.unit, s.host));
                    let _ = Command::new("fusermount3")
                        .arg("-u")
                        .arg("-z")
                        .arg(m)
                        .status();
                }
            } else {
                // SAFETY: kill has no memory effects
                unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
            }
            let deadline = Instant::now() + STOP_WITHIN;
            loop {
                match s.child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    _ => {
                        errors.push(format!(
                            "{} on {} did not stop within {STOP_WITHIN:?}: killed",
                            s.unit, s.host
                        ));
                        let _ = s.child.kill();
                        let _ = s.child.wait();
                        break;
                    }
                }
            }
        }
        self.garages.clear();
        self.network.take();
        match network::existing() {
            Ok(left) if !left.is_empty() => errors.push(format!("namespaces left: {left:?}")),
            Err(e) => errors.push(format!("list the namespaces: {e:#}")),
            _ => {}
        }
        errors
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        for e in self.down() {
            eprintln!("strait: {e}");
        }
    }
}

/// The `listen` address of a daemon's configuration file.
fn listen_of(config: &str) -> Result<std::net::SocketAddr> {
    let text = std::fs::read_to_string(config).with_context(|| format!("read {config}"))?;
    let listen =
        top_level_listen(&text).with_context(|| format!("no listen address in {config}"))?;
    listen
        .parse()
        .with_context(|| format!("listen {listen:?} of {config}"))
}

/// The value of the top-level `listen = "..."` line of a TOML file (before any table).
fn top_level_listen(text: &str) -> Option<String> {
    text.lines()
        .take_while(|l| !l.trim_start().starts_with('['))
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == "listen")
        .map(|(_, v)| v.trim().trim_matches('"').to_string())
}

/// Write `bytes` to `path`, readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    f.write_all(bytes)
        .with_context(|| format!("write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_units_command_line_expands_as_systemd_does() {
        let env: BTreeMap<String, String> = [
            ("STRAIT_URL", "strait://10.0.2.10:7440"),
            ("STRAIT_MOUNT_ARGS", "--cache-dir /c --cache-size 50G"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            expand(
                "strait mount ${STRAIT_URL} /m $STRAIT_MOUNT_ARGS $UNSET",
                &env
            ),
            vec![
                "strait",
                "mount",
                "strait://10.0.2.10:7440",
                "/m",
                "--cache-dir",
                "/c",
                "--cache-size",
                "50G"
            ]
        );
    }

    #[test]
    fn the_listen_address_is_the_top_level_ones() {
        let t = "# x\nid = 1\nlisten = \"10.0.1.10:7430\"\n[promotion]\nlisten = \"no\"\n";
        assert_eq!(top_level_listen(t).as_deref(), Some("10.0.1.10:7430"));
    }
}
