//! deploy/README.md's three-region installation ([`strait_devkit::install`]), rehearsed on this
//! machine with a network namespace per host at the guide's addresses (a1 10.0.1.10, b1
//! 10.0.2.10, c1 10.0.3.10, and an operator's host, 10.0.0.1) and a Garage per region at its
//! host's address. The guide's files are used as they stand, read from a `deploy/` directory.
//! What differs from real hosts, and only that: each host's `/etc/strait`, `/var/lib/strait`,
//! `/var/cache/strait` and `/mnt/strait` are directories under [`NetnsConfig::dir`], the
//! daemons run as root (no `strait` user, no systemd sandbox), and the WAN's delay comes from a
//! proxy in each host ([`network`]). Every operator command it runs is kept
//! ([`Deployment::commands`]) in the guide's words, so a test can hold the guide to them.
//!
//! `strait-lab netns` runs it until Ctrl-C; `tests/deploy/netns.rs` checks it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Result};

pub use strait_devkit::install::{Host, HOSTS, TOKENS};
pub use strait_devkit::netns::network::{self, in_ns, ns_of, nsenter, Network, OPS};
pub use strait_devkit::netns::OnHost;

use strait_devkit::install::{host, DeployFiles, Installation, Placement};
use strait_devkit::Garage;

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

/// The hosts as network namespaces: `DIR/HOST/` stands for each host's root.
pub struct Namespaces {
    dir: PathBuf,
}

impl Placement for Namespaces {
    fn host_path(&self, host: &Host, path: &str) -> PathBuf {
        PathBuf::from(format!("{}{path}", self.dir.join(host.name).display()))
    }

    fn command(&self, host: &Host, program: &Path) -> Command {
        nsenter(&ns_of(host.name), program)
    }

    fn accepts(&self, host: &Host, addr: SocketAddr) -> bool {
        in_ns(&ns_of(host.name), move || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
        })
        .unwrap_or(false)
    }

    fn start_store(&mut self, host: &Host, bucket: &str) -> Result<Option<Garage>> {
        let g = Garage::start_on_host(
            &self.dir.join(host.name).join("garage"),
            OnHost {
                netns: ns_of(host.name),
                ip: host.ip,
                bucket: bucket.into(),
            },
        )?;
        Ok(Some(g))
    }

    fn log(&self, host: &Host, name: &str) -> PathBuf {
        self.dir.join(host.name).join(format!("{name}.log"))
    }
}

/// The hosts, running. Dropping it stops everything and removes the namespaces.
pub struct Deployment {
    install: Installation<Namespaces>,
    // last: removed after every process in it has stopped
    network: Option<Network>,
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
                .map_err(|e| anyhow::anyhow!("empty {}: {e}", cfg.dir.display()))?;
        }
        let network = Network::create(cfg.delay, cfg.link_mb_s)?;
        let mut d = Deployment {
            install: Installation::new(
                Namespaces {
                    dir: cfg.dir.clone(),
                },
                DeployFiles::Dir(cfg.deploy.clone()),
                cfg.strait_bin.clone(),
                cfg.log.clone(),
            ),
            network: Some(network),
        };
        d.install.up(cfg.mount, &mut |_| {})?;
        Ok(d)
    }

    /// `text` (a path, a command line, a file) with a real host's paths made `host`'s here.
    pub fn local(&self, host_name: &str, text: &str) -> String {
        match host(host_name) {
            Ok(h) => self.install.local(h, text),
            Err(_) => text.to_string(),
        }
    }

    /// An operator's command of the guide, run on `host` and kept in its words.
    pub fn operator(
        &mut self,
        host_name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<String> {
        self.install.operator(host(host_name)?, args, env)
    }

    /// Region `host`'s mount point (a1 or b1).
    pub fn mountpoint(&self, host_name: &str) -> PathBuf {
        PathBuf::from(self.local(host_name, "/mnt/strait"))
    }

    /// The operator's commands run so far, in the guide's words (`strait ...`,
    /// `systemctl enable --now UNIT`).
    pub fn commands(&self) -> &[String] {
        self.install.commands()
    }

    /// The hosts' network (the WAN proxies' counts).
    pub fn network(&self) -> Option<&Network> {
        self.network.as_ref()
    }

    /// Each running service: (host, unit, pid).
    pub fn services(&self) -> Vec<(&'static str, String, u32)> {
        self.install
            .services()
            .iter()
            .map(|s| (s.host.name, s.unit.clone(), s.child.id()))
            .collect()
    }

    /// Stop everything: the mounts, the daemons, the Garages ([`Installation::down`]), then
    /// the namespaces. Errors are collected, not stopped at: whatever can be stopped is.
    pub fn down(&mut self) -> Vec<String> {
        let mut errors = self.install.down();
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
