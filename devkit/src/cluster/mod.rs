//! `strait dev up`: deploy/README.md's installation ([`crate::install`]) on this machine's
//! loopback ([`placement::Loopback`]), the guide's hosts as regions: region A (host a1) runs
//! the primary, replicator node 1 and a mount; region B (b1) the mirror, node 3 and a mount;
//! node 2 (host c1) runs in region A, or with [`ClusterConfig::witness`] in a third region,
//! C, so that no region holds a majority of the replicator. The daemons start from the
//! guide's units and configuration files, with dev up's settings laid over them. Each region
//! has its own RocksDB metadata and its own object store, a local directory or a Garage S3
//! server ([`crate::Garage`]): the mirror copies blocks from A's store into B's, and B's
//! mounts read B's first. Traffic between the regions goes through fault proxies with a
//! one-way delay and a bandwidth cap; a control socket changes them at run time (`strait dev
//! fault`: delay, bandwidth, partition, heal). On top, what the fault tests and the chaos
//! harness do to the regions: signals, restarts, remounts, switchovers ([`switchover`]).
//!
//! The daemons and mounts are the `strait` program itself ([`ClusterConfig::strait_bin`]),
//! each with its log in its region's directory; they end with this process
//! ([`crate::process::spawn_tied_with`]).
//!
//! Known simplifications:
//! - a proxy sits in front of each cross-region *listener*, so a connection delays both ways
//!   whichever region opened it;
//! - the bandwidth cap holds per proxy (per cross-region listener), not for all of them
//!   together;
//! - with a directory store the mirror reads region A's store as a directory, so block copies
//!   do not cross the proxies; with Garage they do (the mirror reaches A's Garage through a
//!   proxy).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::install::{DeployFiles, Installation, Service, HOSTS};
use crate::Proxy;

mod children;
mod config;
mod control;
mod placement;
mod switchover;

pub use crate::mounts::{detach, detach_all_under};
pub use children::run_strait;
pub use config::{ClusterConfig, FaultHooks, S3Front, Topology, MIRROR_ID};

use crate::mounts::is_mount_point;
use children::{process_runs, s};
use control::serve_control;
use placement::{guide, Loopback};

/// How long a mount may take to appear again ([`Cluster::remount`]).
const MOUNT_WITHIN: Duration = Duration::from_secs(60);

/// The running regions. Dropping it unmounts the regions, stops the daemons (SIGTERM, then
/// SIGKILL after 30 s), then the Garages.
pub struct Cluster {
    topology: Topology,
    /// The working directory (`DIR` of `dev up`): regions, tokens, logs.
    dir: PathBuf,
    strait_bin: PathBuf,
    /// Every fault proxy, by name: `a-to-replicator3`, `b-to-replicator1`,
    /// `b-to-replicator2`, `b-to-primary`, `b-to-s3` (with Garage) cross the link between the
    /// regions (with a witness also `a-to-replicator2`, `c-to-replicator1`, `c-to-replicator3`);
    /// `primary-to-replicatorN` (with [`ClusterConfig::primary_proxies`]) do not.
    proxies: Vec<(String, Arc<Proxy>)>,
    install: Installation<Loopback>,
}

/// The two regions a link proxy joins, from its name `x-to-TARGET` (`a-to-replicator3`,
/// `b-to-primary`, ...): region X, and the region of TARGET (`replicatorN`: where node N runs;
/// the primary and its object store: A).
fn link_ends(name: &str, node_region: &[&str; 3]) -> [String; 2] {
    let (from, target) = name.split_once("-to-").unwrap_or(("", name));
    let to = target
        .strip_prefix("replicator")
        .and_then(|n| n.parse::<usize>().ok())
        .and_then(|n| node_region.get(n.wrapping_sub(1)))
        .copied()
        .unwrap_or("A");
    [from.to_uppercase(), to.to_string()]
}

impl Cluster {
    /// Start the regions, following deploy/README.md ([`crate::install`]), and write
    /// DIR/dev.json. `progress`: a line to show for each step that may take a while.
    pub fn start(
        cfg: &ClusterConfig,
        rt: &tokio::runtime::Runtime,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Cluster> {
        if cfg.dir.exists() {
            std::fs::remove_dir_all(&cfg.dir)
                .with_context(|| format!("empty the working directory {}", cfg.dir.display()))?;
        }
        std::fs::create_dir_all(&cfg.dir)
            .with_context(|| format!("create {}", cfg.dir.display()))?;
        // with --tls, a certificate for each daemon, the mounts and the operators
        let pki = if cfg.tls {
            progress("creating a CA and certificates (mutual TLS on every link)");
            let holders: Vec<(&str, &[strait_auth::Role])> = vec![
                ("primary", &[strait_auth::Role::Primary]),
                // promoted, it appends to the log: its certificate is its credential
                (
                    MIRROR_ID,
                    &[strait_auth::Role::Mirror, strait_auth::Role::Primary],
                ),
                ("replicator1", &[strait_auth::Role::Peer]),
                ("replicator2", &[strait_auth::Role::Peer]),
                ("replicator3", &[strait_auth::Role::Peer]),
                ("mount", &[strait_auth::Role::Mount]),
                ("admin", &[strait_auth::Role::Admin]),
            ];
            Some(crate::pki::Pki::create(&cfg.dir.join("pki"), &holders)?)
        } else {
            None
        };
        let pki_dir = pki.as_ref().map(|p| p.dir.clone());
        let mut install = Installation::new(
            Loopback::new(cfg, rt, pki),
            DeployFiles::BuiltIn,
            cfg.strait_bin.clone(),
            String::new(),
        );
        install.up(cfg.mount, progress)?;

        // the operators' copy of the tokens, by the guide's names
        let tokens = install.tokens().clone();
        let tokens_dir = cfg.dir.join("tokens");
        strait_ids::private::private_dir(&tokens_dir, "tokens directory")
            .map_err(anyhow::Error::msg)?;
        for (name, t) in &tokens {
            crate::install::write_private(&tokens_dir.join(format!("{name}.token")), t.as_bytes())?;
        }
        let token = |name: &str| tokens.get(name).cloned().unwrap_or_default();

        let l = &mut install.placement;
        // nodes 1, 2, 3: on hosts a1, c1, b1
        let node_hosts = [&HOSTS[0], &HOSTS[2], &HOSTS[1]];
        let node_region = node_hosts.map(|h| l.region(h));
        let mut replicator = vec![];
        let mut replicator_metrics = vec![];
        for h in node_hosts {
            replicator.push(l.addr(guide(h, 7430))?.to_string());
            replicator_metrics.push(l.addr(guide(h, 7431))?.to_string());
        }
        let proxies = l.proxies.clone();
        // the control socket of `strait dev fault`
        let control = std::net::TcpListener::bind("127.0.0.1:0").context("control socket")?;
        let control_addr = control.local_addr().context("control socket")?;
        {
            // the link between the regions, not the primary's own proxies
            let link: Vec<control::Link> = proxies
                .iter()
                .filter(|(n, _)| !n.starts_with("primary-to-"))
                .map(|(n, p)| control::Link {
                    ends: link_ends(n, &node_region),
                    proxy: p.clone(),
                })
                .collect();
            let admin = token("admin");
            std::thread::spawn(move || serve_control(control, link, admin));
        }
        let (a1, b1) = (&HOSTS[0], &HOSTS[1]);
        let mount = |region: &str| {
            install
                .services()
                .iter()
                .find(|s| s.name == format!("mount-{region}"))
                .and_then(|s| s.mountpoint.clone())
        };
        let (mount_a, mount_b) = (mount("a"), mount("b"));
        let l = &mut install.placement;
        let topo = Topology {
            token: token("mount"),
            admin_token: token("admin"),
            pki: pki_dir,
            replicator_tokens: [
                ("primary", "replicator-primary"),
                ("mirror", "replicator-mirror"),
                ("admin", "admin"),
                ("peer", "replicator-peer"),
            ]
            .into_iter()
            .map(|(role, name)| (role.to_string(), token(name)))
            .collect(),
            primary: l.addr(guide(a1, 7420))?.to_string(),
            mirror: l.addr(guide(b1, 7440))?.to_string(),
            primary_metrics: l.addr(guide(a1, 7421))?.to_string(),
            mirror_metrics: l.addr(guide(b1, 7441))?.to_string(),
            replicator,
            replicator_metrics,
            control: s(control_addr),
            mount_a,
            mount_b,
            replicator_regions: node_region.iter().map(|r| r.to_string()).collect(),
            data_a: l.data_url(0),
            data_b: l.data_url(1),
            mirror_data_a: l.mirror_data_a()?,
        };
        let json = serde_json::to_string_pretty(&topo)?;
        // it holds the admin token: its owner's alone
        crate::install::write_private(&cfg.dir.join("dev.json"), json.as_bytes())?;
        Ok(Cluster {
            topology: topo,
            dir: cfg.dir.clone(),
            strait_bin: cfg.strait_bin.clone(),
            proxies,
            install,
        })
    }

    /// The fault proxies, by name (see [`Cluster`]'s field).
    pub fn proxies(&self) -> &[(String, Arc<Proxy>)] {
        &self.proxies
    }

    /// The daemons' names: `replicator1..3`, `primary`, `mirror`.
    pub fn daemons(&self) -> Vec<String> {
        self.install
            .services()
            .iter()
            .filter(|s| s.mountpoint.is_none())
            .map(|s| s.name.clone())
            .collect()
    }

    /// The process ids of the Garage servers, region A's first (none with a directory store).
    pub fn garage_pids(&self) -> Vec<u32> {
        self.install.garages().iter().map(|g| g.pid()).collect()
    }

    /// Region `i`'s Garage (0: A, 1: B), if it has exited: its exit status.
    pub fn garage_exited(&mut self, i: usize) -> Option<std::process::ExitStatus> {
        self.install
            .garages_mut()
            .get_mut(i)
            .and_then(|g| g.exited())
    }

    /// Start region `i`'s Garage again on its data (after it exited).
    pub fn restart_garage(&mut self, i: usize) -> Result<()> {
        self.install
            .garages_mut()
            .get_mut(i)
            .with_context(|| format!("no Garage {i}"))?
            .restart()
    }

    fn service(&mut self, name: &str) -> Result<&mut Service> {
        self.install.service_mut(name)
    }

    /// The process id of daemon `name` (its current incarnation).
    pub fn pid(&mut self, name: &str) -> Result<u32> {
        Ok(self.service(name)?.child.id())
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
        Ok(self.service(name)?.child.try_wait()?.is_some())
    }

    /// SIGKILL daemon `name` and start it again with the same arguments, its output appended
    /// to the same log; wait for its "serving" line (primary, mirror) when `wait`.
    pub fn restart(&mut self, name: &str, wait: Option<Duration>) -> Result<()> {
        self.install.respawn(name, None, wait)
    }

    /// Replace daemon `name` (stopped already, or SIGKILLed now) by `strait ARGS`, its output
    /// appended to the same log; wait for its "serving" line when `wait`.
    pub(super) fn replace(
        &mut self,
        name: &str,
        args: Vec<String>,
        wait: Option<Duration>,
    ) -> Result<()> {
        self.install.respawn(name, Some(args), wait)
    }

    /// The arguments daemon `name` runs with (after the program).
    pub(super) fn args_of(&mut self, name: &str) -> Result<Vec<String>> {
        Ok(self.service(name)?.launch.args.clone())
    }

    /// Region `region`'s mount (0: A, 1: B).
    fn mount_service(&self, region: usize) -> Result<&Service> {
        let name = match region {
            0 => "mount-a",
            1 => "mount-b",
            _ => bail!("no region {region} with a mount (0: A, 1: B)"),
        };
        self.install
            .services()
            .iter()
            .find(|s| s.name == name)
            .with_context(|| format!("no mount in region {region}"))
    }

    /// The pid of the process serving region `region`'s mount (0: A, 1: B).
    pub fn mount_pid(&self, region: usize) -> Result<u32> {
        Ok(self.mount_service(region)?.child.id())
    }

    /// Whether region `region`'s mount process runs.
    pub fn mount_runs(&self, region: usize) -> Result<bool> {
        Ok(process_runs(self.mount_pid(region)?))
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
        let m = self.mount_service(region)?;
        let (pid, name) = (m.child.id(), m.name.clone());
        let point = m
            .mountpoint
            .clone()
            .context("a mount without a mount point")?;
        if process_runs(pid) {
            bail!("region {region}'s mount process (pid {pid}) still runs: not mounting over it");
        }
        detach(&point)?;
        let start = Instant::now();
        while is_mount_point(&point) {
            if start.elapsed() > Duration::from_secs(10) {
                bail!(
                    "{} is still mounted 10 s after a lazy unmount",
                    point.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.install
            .respawn(&name, None, Some(MOUNT_WITHIN))
            .with_context(|| format!("mount region {region} again"))
    }

    /// The operator's commands the start ran, in deploy/README.md's words (`strait ...`,
    /// `systemctl enable --now UNIT`): the guide's steps, as `strait-lab netns` runs them.
    pub fn commands(&self) -> &[String] {
        self.install.commands()
    }

    /// What DIR/dev.json says: addresses, token, object stores, mount points.
    /// The `strait` program the cluster runs.
    pub fn strait_bin(&self) -> &std::path::Path {
        &self.strait_bin
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Unmount region B, then region A; the errors of those that failed.
    pub fn unmount(&self) -> Vec<anyhow::Error> {
        self.install.unmount()
    }
}

#[cfg(test)]
mod tests {
    use super::link_ends;

    #[test]
    fn a_link_joins_the_region_it_starts_in_and_the_region_of_its_target() {
        let witness = ["A", "C", "B"];
        let ends = |n: &str| link_ends(n, &witness);
        assert_eq!(ends("a-to-replicator3"), ["A", "B"]);
        assert_eq!(ends("a-to-replicator2"), ["A", "C"]);
        assert_eq!(ends("b-to-replicator2"), ["B", "C"]);
        assert_eq!(ends("c-to-replicator1"), ["C", "A"]);
        assert_eq!(ends("b-to-primary"), ["B", "A"]);
        assert_eq!(ends("b-to-s3"), ["B", "A"]);
        assert_eq!(link_ends("b-to-replicator2", &["A", "A", "B"]), ["B", "A"]);
    }
}
