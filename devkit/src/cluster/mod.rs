//! The regions of `strait dev up`, started on this machine: region A runs the primary and
//! replicator nodes 1 and 2; region B runs replicator node 3 and a mirror. With
//! [`ClusterConfig::witness`] node 2 runs in a third region, C, instead, so that no region
//! holds a majority of the replicator. Each region has its
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

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{Faults, Garage, Proxy};

mod children;
mod config;
mod control;
mod switchover;

pub use children::{detach, detach_all_under, run_strait};
pub use config::{
    ClusterConfig, FaultHooks, S3Front, Topology, MIRROR_ID, REPLICATOR_ROLES, TOKEN_ROLES,
};

use children::{free_addr, mount_with, process_runs, s, write_private, Children, MountProc};
pub(crate) use children::{is_mount_point, tail};
use control::serve_control;

/// The running regions. Dropping it stops the daemons (SIGTERM, then SIGKILL after 10 s),
/// then the Garages; [`Cluster::unmount`] first unmounts the regions.
pub struct Cluster {
    topology: Topology,
    /// The working directory (`DIR` of `dev up`): regions, tokens, logs.
    dir: PathBuf,
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
        let rc = a.dir.join("region-c");
        let regions_used: Vec<&PathBuf> = if a.witness {
            vec![&ra, &rb, &rc]
        } else {
            vec![&ra, &rb]
        };
        for d in regions_used {
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

        // replicator nodes 1, 2 (A, or C with a witness) and 3 (B); a node in another region
        // is reached through the link
        let nodes: Vec<SocketAddr> = (0..3).map(|_| free_addr()).collect::<Result<_>>()?;
        let node_region: [(&PathBuf, &str); 3] = if a.witness {
            [(&ra, "A"), (&rc, "C"), (&rb, "B")]
        } else {
            [(&ra, "A"), (&ra, "A"), (&rb, "B")]
        };
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
        // with a witness, region A reaches node 2 through the link, and node 2 reaches nodes 1
        // and 3 through it; without one, node 2 is region A's
        let mut member2 = nodes[1];
        let mut witness_peers = vec![];
        if a.witness {
            let a_to_n2 = link(nodes[1])?;
            let c_to_n1 = link(nodes[0])?;
            let c_to_n3 = link(nodes[2])?;
            member2 = a_to_n2.addr();
            witness_peers = vec![
                s("--peer"),
                format!("1={}", c_to_n1.addr()),
                s("--peer"),
                format!("3={}", c_to_n3.addr()),
            ];
            proxies.extend([
                (s("a-to-replicator2"), a_to_n2),
                (s("c-to-replicator1"), c_to_n1),
                (s("c-to-replicator3"), c_to_n3),
            ]);
        }
        let mut replicator_metrics = vec![];
        for (i, addr) in nodes.iter().enumerate() {
            let region = node_region[i].0;
            let name = format!("replicator{}", i + 1);
            let metrics = free_addr()?;
            replicator_metrics.push(s(metrics));
            let mut args = vec![
                s("replicator"),
                s("--id"),
                s(i + 1),
                s("--listen"),
                s(addr),
                s("--metrics-listen"),
                s(metrics),
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
            if i == 1 {
                args.extend(witness_peers.iter().cloned());
            }
            kids.spawn(&name, &region.join(format!("{name}.log")), &args)?;
        }
        let members = [
            format!("1={}", nodes[0]),
            format!("2={member2}"),
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
        let mut shipping_to = [nodes[0], member2, p3.addr()];
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
                // promoted, it serves other mirrors (the old primary rejoined as one)
                s("--role-token-file"),
                format!("mirror={}", token_file("mirror")),
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
            // `strait mirror promote` makes it the primary: the replicator's token of that
            // role, or with TLS its certificate alone, which names the role too
            .chain(match a.tls {
                false => vec![s("--promotion-token-file"), token_file("primary")],
                true => vec![],
            })
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
            let link: Vec<control::Link> = proxies
                .iter()
                .filter(|(n, _)| !n.starts_with("primary-to-"))
                .map(|(n, p)| control::Link {
                    ends: link_ends(n, &node_region.map(|(_, r)| r)),
                    proxy: p.clone(),
                })
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
            replicator_metrics,
            control: s(control_addr),
            mount_a: None,
            mount_b: None,
            replicator_regions: node_region.iter().map(|(_, r)| r.to_string()).collect(),
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
            dir: a.dir.clone(),
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
        self.wait_serving(name, mark, wait)
    }

    /// Replace daemon `name` (stopped already, or SIGKILLed now) by `strait ARGS`, its output
    /// appended to the same log; wait for its "serving" line when `wait`.
    pub(super) fn replace(
        &mut self,
        name: &str,
        args: Vec<String>,
        wait: Option<Duration>,
    ) -> Result<()> {
        let kids = &mut self.parts.kids;
        let k = kids.kid(name)?;
        let _ = k.child.kill();
        let _ = k.child.wait();
        let log = k.log.clone();
        let mark = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let child = kids.start(name, &log, &args, true)?;
        let k = kids.kid(name)?;
        k.child = child;
        k.args = args;
        self.wait_serving(name, mark, wait)
    }

    /// Wait until daemon `name` prints its "serving" line (`strait primary` or `strait
    /// mirror`, by the program it runs) past byte `mark` of its log.
    fn wait_serving(&mut self, name: &str, mark: u64, wait: Option<Duration>) -> Result<()> {
        let kids = &mut self.parts.kids;
        let (log, program) = {
            let k = kids.kid(name)?;
            (k.log.clone(), k.args.first().cloned().unwrap_or_default())
        };
        let line = match program.as_str() {
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
