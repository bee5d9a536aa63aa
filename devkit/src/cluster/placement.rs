//! The guide's hosts on this machine's loopback ([`Loopback`]), for `strait dev up`: every
//! listener of the guide (`10.0.X.10:PORT`) gets a port of its own on 127.0.0.1, a host
//! reaches a listener in another region through a fault proxy (one per region and listener,
//! named `x-to-SERVICE`: `b-to-primary`, `a-to-replicator3`...), and dev up's settings are
//! laid over the guide's files:
//!
//! - the stores: local directories (`DIR/region-x/data`) unless `--store garage`, the mirror's
//!   view of region A's store through the link (`b-to-s3`);
//! - the primary: `durability = "local"`, no lease (`--durability` overrides); the mirror:
//!   the window, policy, block copy and first replicator node of dev up's flags, and a
//!   promotion in `local` durability without a lease, naming its own listener;
//! - each replicator node's `peers`: the addresses it reaches the others at (the proxies);
//! - with `--tls`, each daemon's certificate and the CA as flags ([`crate::pki`]);
//! - the chaos harness's [`FaultHooks`]: other directories, proxies in front of the stores
//!   and of the primary's links to the replicator, a daemon's environment.
//!
//! Without [`ClusterConfig::witness`] host c1 (node 2) is in region A: no proxy between it and
//! a1. Each host's directories are `DIR/region-{a,b,c}` (c1's is `region-c` either way).

use std::collections::BTreeMap;
use std::net::{SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use super::children::free_addr;
use super::config::{ClusterConfig, MIRROR_ID};
use crate::install::{Host, Placement, HOSTS};
use crate::pki::Pki;
use crate::{Faults, Garage, Proxy};

/// The guide's listeners by port: what serves there.
const SERVICES: [(u16, &str); 6] = [
    (7420, "primary"),
    (7421, "primary-metrics"),
    (7430, "replicator"),
    (7431, "replicator-metrics"),
    (7440, "mirror"),
    (7441, "mirror-metrics"),
];

pub(super) struct Loopback {
    cfg: ClusterConfig,
    rt: tokio::runtime::Handle,
    /// What a link between two regions does (delay, cap).
    link: Faults,
    pub(super) pki: Option<Pki>,
    /// Each guide listener's address here.
    addrs: BTreeMap<SocketAddrV4, SocketAddr>,
    /// The proxies, by name, and the one for each (region, listener here).
    pub(super) proxies: Vec<(String, Arc<Proxy>)>,
    proxy_of: BTreeMap<(&'static str, SocketAddr), SocketAddr>,
    /// Each region's S3 address, as its clients reach it (A, B).
    s3_at: Vec<SocketAddr>,
    garage_urls: Vec<(String, String)>,
}

impl Loopback {
    pub(super) fn new(
        cfg: &ClusterConfig,
        rt: &tokio::runtime::Runtime,
        pki: Option<Pki>,
    ) -> Loopback {
        let mut link = Faults::delay(Duration::from_millis(cfg.delay_ms));
        let cap = (cfg.link_mb_s > 0.0).then_some((cfg.link_mb_s * 1e6) as u64);
        link.up.bandwidth = cap;
        link.down.bandwidth = cap;
        Loopback {
            cfg: cfg.clone(),
            rt: rt.handle().clone(),
            link,
            pki,
            addrs: BTreeMap::new(),
            proxies: vec![],
            proxy_of: BTreeMap::new(),
            s3_at: vec![],
            garage_urls: vec![],
        }
    }

    /// The region host `h` is in here (`A`, `B`, `C`).
    pub(super) fn region(&self, h: &Host) -> &'static str {
        match h.region {
            "a" => "A",
            "b" => "B",
            _ if self.cfg.witness => "C",
            _ => "A",
        }
    }

    /// Host `h`'s directory: `DIR/region-x`.
    pub(super) fn host_dir(&self, h: &Host) -> PathBuf {
        self.cfg.dir.join(format!("region-{}", h.region))
    }

    /// The guide's listener `guide` here.
    pub(super) fn addr(&mut self, guide: SocketAddrV4) -> Result<SocketAddr> {
        if let Some(a) = self.addrs.get(&guide) {
            return Ok(*a);
        }
        let a = free_addr()?;
        self.addrs.insert(guide, a);
        Ok(a)
    }

    /// The address at which host `from` reaches the guide's listener `guide`: the listener
    /// itself in the same region, else the proxy of `from`'s region in front of it.
    fn reach(&mut self, from: &Host, guide: SocketAddrV4) -> Result<SocketAddr> {
        let to = HOSTS
            .iter()
            .find(|h| h.ip == *guide.ip())
            .with_context(|| format!("{guide} is no host of the guide"))?;
        let target = self.addr(guide)?;
        let from_region = self.region(from);
        if from_region == self.region(to) {
            return Ok(target);
        }
        let service = match SERVICES.iter().find(|(p, _)| *p == guide.port()) {
            Some((7430, _)) => format!("replicator{}", to.node),
            Some((_, s)) => s.to_string(),
            None => format!("port{}", guide.port()),
        };
        let name = format!("{}-to-{service}", from_region.to_lowercase());
        self.proxy(from_region, &name, target)
    }

    /// The proxy named `name`, for region `region`, in front of `target` (made once).
    fn proxy(
        &mut self,
        region: &'static str,
        name: &str,
        target: SocketAddr,
    ) -> Result<SocketAddr> {
        if let Some(a) = self.proxy_of.get(&(region, target)) {
            return Ok(*a);
        }
        let p = self
            .rt
            .block_on(Proxy::start("127.0.0.1:0".parse().expect("addr"), target))
            .with_context(|| format!("start the fault proxy {name}"))?;
        p.set(self.link);
        let at = p.addr();
        self.proxies.push((name.to_string(), Arc::new(p)));
        self.proxy_of.insert((region, target), at);
        Ok(at)
    }

    /// `text` with every listener of the guide (`10.0.X.10:PORT`) made the address at which
    /// host `from` reaches it here. An address of another port (the S3 stores') is left.
    fn map_addresses(&mut self, from: &Host, text: &str) -> Result<String> {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find("10.0.") {
            out.push_str(&rest[..at]);
            let tail = &rest[at..];
            let len = tail
                .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ':'))
                .unwrap_or(tail.len());
            let word = &tail[..len];
            match word.parse::<SocketAddrV4>() {
                Ok(g)
                    if SERVICES.iter().any(|(p, _)| *p == g.port())
                        && HOSTS.iter().any(|h| h.ip == *g.ip()) =>
                {
                    out.push_str(&self.reach(from, g)?.to_string());
                }
                _ => out.push_str(word),
            }
            rest = &tail[len..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// Region `i`'s (0: A, 1: B) object store, as its own clients reach it.
    /// With [`ClusterConfig::shared_store`] both regions use region A's.
    pub(super) fn data_url(&self, i: usize) -> String {
        let i = if self.cfg.shared_store { 0 } else { i };
        match self.garage_urls.get(i) {
            Some((url, _)) => url.clone(),
            None => match self.cfg.hooks.store_dirs.get(i).cloned().flatten() {
                Some(d) => format!("file://{}", d.display()),
                None => {
                    let h = &HOSTS[i];
                    format!("file://{}", self.host_dir(h).join("data").display())
                }
            },
        }
    }

    /// Region A's object store as the mirror reaches it: through the link with Garage; read
    /// as a directory otherwise (so block copies do not cross the proxies).
    pub(super) fn mirror_data_a(&mut self) -> Result<String> {
        match self.s3_at.first().copied() {
            Some(a) => {
                let through = self.proxy("B", "b-to-s3", a)?;
                Ok(self
                    .garage_urls
                    .first()
                    .map(|(_, bucket)| {
                        format!(
                            "s3://{bucket}?endpoint=http://{through}&region={}",
                            crate::REGION
                        )
                    })
                    .unwrap_or_default())
            }
            None => Ok(self.data_url(0)),
        }
    }

    fn server_tls(&self, name: &str) -> Vec<String> {
        self.pki
            .as_ref()
            .map(|p| p.server_args(name))
            .unwrap_or_default()
    }

    pub(super) fn client_tls(&self, name: &str) -> Vec<String> {
        self.pki
            .as_ref()
            .map(|p| p.client_args(name))
            .unwrap_or_default()
    }

    /// The guide's TOML file `name` of host `h`, with dev up's settings laid over it.
    fn settings(&mut self, h: &Host, name: &str, t: &mut toml::Table) -> Result<()> {
        use toml::Value;
        let hooks = self.cfg.hooks.clone();
        let path_url = |p: &Path| Value::String(format!("rocksdb://{}", p.display()));
        match name {
            "replicator.toml" => {
                // how this node reaches the others: through the link from another region
                let mut peers = toml::Table::new();
                for other in HOSTS.iter().filter(|o| o.name != h.name) {
                    let at = self.reach(h, SocketAddrV4::new(other.ip, 7430))?;
                    peers.insert(other.node.to_string(), Value::String(at.to_string()));
                }
                t.insert("peers".into(), Value::Table(peers));
                let i = (h.node as usize).wrapping_sub(1);
                if let Some(Some(d)) = hooks.replicator_dirs.get(i) {
                    t.insert("data_dir".into(), Value::String(d.display().to_string()));
                }
            }
            "primary.toml" => {
                t.insert("durability".into(), Value::String("local".into()));
                t.insert("lease_ms".into(), Value::Integer(0));
                if let Some(d) = &hooks.meta_dirs[0] {
                    t.insert("meta_url".into(), path_url(d));
                }
                if self.cfg.primary_proxies {
                    // a fault-free proxy on each of the primary's links to the replicator
                    let list: Vec<String> = match t.get("replicator") {
                        Some(Value::Array(a)) => a
                            .iter()
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect(),
                        _ => vec![],
                    };
                    let mut through = vec![];
                    for (i, to) in list.iter().enumerate() {
                        let to: SocketAddr = to.parse().context("a replicator address")?;
                        let p = self
                            .rt
                            .block_on(Proxy::start("127.0.0.1:0".parse().expect("addr"), to))
                            .context("start a fault proxy")?;
                        through.push(Value::String(p.addr().to_string()));
                        self.proxies
                            .push((format!("primary-to-replicator{}", i + 1), Arc::new(p)));
                    }
                    t.insert("replicator".into(), Value::Array(through));
                }
            }
            "mirror.toml" => {
                t.insert(
                    "window_ms".into(),
                    Value::Integer(self.cfg.window_ms as i64),
                );
                t.insert("policy".into(), Value::String(self.cfg.policy.clone()));
                t.insert("sync".into(), Value::String(self.cfg.sync.clone()));
                if let Some(d) = &hooks.meta_dirs[1] {
                    t.insert("meta_url".into(), path_url(d));
                }
                t.insert("data_url".into(), Value::String(self.data_url(1)));
                t.insert(
                    "primary_data_url".into(),
                    Value::String(self.mirror_data_a()?),
                );
                if self.cfg.source == "leader" {
                    // node 1 first, across the link
                    let node1 = self
                        .reach(h, SocketAddrV4::new(HOSTS[0].ip, 7430))?
                        .to_string();
                    if let Some(Value::Array(a)) = t.get_mut("replicator") {
                        a.sort_by_key(|v| v.as_str() != Some(node1.as_str()));
                    }
                }
                if let Some(Value::Table(p)) = t.get_mut("promotion") {
                    p.insert("durability".into(), Value::String("local".into()));
                    p.insert("lease_ms".into(), Value::Integer(0));
                    // this region's own listener and store
                    p.remove("advertise");
                    p.remove("advertise_data_url");
                    if self.pki.is_some() {
                        // its certificate names the role primary
                        p.remove("replicator_token_file");
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

impl Placement for Loopback {
    fn host_path(&self, host: &Host, path: &str) -> PathBuf {
        let d = self.host_dir(host);
        match path {
            "/etc/strait" => d.join("etc"),
            "/var/cache/strait" => d.join("cache"),
            "/mnt/strait" => d.join("mnt"),
            _ => d,
        }
    }

    fn command(&self, _host: &Host, program: &Path) -> Command {
        Command::new(program)
    }

    fn accepts(&self, _host: &Host, addr: SocketAddr) -> bool {
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
    }

    fn has_stores(&self) -> bool {
        self.cfg.garage
    }

    fn start_store(&mut self, host: &Host, bucket: &str) -> Result<Option<Garage>> {
        if !self.cfg.garage {
            return Ok(None);
        }
        let i = usize::from(host.region != "a");
        let dir = self.host_dir(host).join("garage");
        let data = self.cfg.hooks.garage_data_dirs[i]
            .clone()
            .unwrap_or_else(|| dir.clone());
        let g = Garage::start_with_data(&dir, &data)
            .with_context(|| format!("start region {}'s Garage ({bucket})", self.region(host)))?;
        let at = match &self.cfg.hooks.s3_front {
            Some(front) => (front.0)(i, g.s3_addr())
                .with_context(|| format!("put a proxy in front of Garage {i}"))?,
            None => g.s3_addr(),
        };
        self.s3_at.push(at);
        self.garage_urls
            .push((g.data_url_at("", &at.to_string()), g.bucket().to_string()));
        Ok(Some(g))
    }

    fn log(&self, host: &Host, name: &str) -> PathBuf {
        let file = if name.starts_with("mount") {
            "mount.log".to_string()
        } else {
            format!("{name}.log")
        };
        self.host_dir(host).join(file)
    }

    fn config(&mut self, host: &Host, name: &str, text: String) -> Result<String> {
        let text = self.map_addresses(host, &text)?;
        if let Some(i) = name
            .ends_with(".env")
            .then(|| usize::from(host.region != "a"))
        {
            // every link is on loopback: the guide's TLS is left out (`--tls` gives its own)
            let text: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("STRAIT_TLS_"))
                .map(|l| format!("{l}\n"))
                .collect();
            // a mount's environment: its cache directory may be elsewhere
            return Ok(match &self.cfg.hooks.cache_dirs[i] {
                Some(d) => text.replace(
                    &format!(
                        "--cache-dir {}",
                        self.host_dir(host).join("cache").display()
                    ),
                    &format!("--cache-dir {}", d.display()),
                ),
                None => text,
            });
        }
        if !name.ends_with(".toml") {
            return Ok(text);
        }
        let mut t: toml::Table = toml::from_str(&text).with_context(|| format!("parse {name}"))?;
        // every link is on loopback: the guide's TLS is left out (`--tls` gives its own)
        for k in GUIDE_TLS_KEYS {
            t.remove(k);
        }
        self.settings(host, name, &mut t)?;
        Ok(format!(
            "# deploy/config/region-{}/{name}, with strait dev up's settings\n{}",
            host.region,
            toml::to_string(&t).context("write the settings")?
        ))
    }

    fn operator_args(&mut self, host: &Host, args: Vec<String>) -> Result<Vec<String>> {
        let mut args = args
            .iter()
            .map(|a| self.map_addresses(host, a))
            .collect::<Result<Vec<_>>>()?;
        match args.first().map(String::as_str) {
            Some("format") => {
                if let Some(d) = &self.cfg.hooks.meta_dirs[0] {
                    args[1] = format!("rocksdb://{}", d.display());
                }
                if args.len() > 2 {
                    args[2] = self.data_url(0);
                }
                args.extend(self.cfg.format_args.iter().cloned());
            }
            Some("replicator") => args.extend(self.client_tls("admin")),
            _ => {}
        }
        Ok(args)
    }

    fn operator_env(&self, env: Vec<(String, String)>) -> Vec<(String, String)> {
        // the guide's CA is not this cluster's (`--tls` passes its own as flags)
        env.into_iter()
            .filter(|(k, _)| !k.starts_with("STRAIT_TLS_"))
            .collect()
    }

    fn service_args(&self, name: &str) -> Vec<String> {
        let c = &self.cfg;
        match name {
            "primary" => [self.server_tls("primary"), c.primary_args.clone()].concat(),
            "mirror" => [self.server_tls(MIRROR_ID), c.mirror_args.clone()].concat(),
            n if n.starts_with("mount") => {
                [self.client_tls("mount"), c.mount_args.clone()].concat()
            }
            n => self.server_tls(n),
        }
    }

    fn service_env(&self, name: &str) -> Vec<(String, String)> {
        let own = self
            .cfg
            .hooks
            .daemon_env
            .iter()
            .filter(|(n, _)| n == name)
            .flat_map(|(_, e)| e.iter().cloned());
        self.cfg.env.iter().cloned().chain(own).collect()
    }
}

/// The TLS settings of the guide's configuration files, which dev up leaves out: its links are
/// on loopback, and `--tls` gives each daemon its own certificate as flags.
const GUIDE_TLS_KEYS: [&str; 3] = ["tls_cert_file", "tls_key_file", "tls_ca_file"];

/// The guide's listener of `port` on host `h`.
pub(super) fn guide(h: &Host, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(h.ip, port)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback(witness: bool) -> (Loopback, tokio::runtime::Runtime) {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let mut cfg = ClusterConfig::new(PathBuf::from("strait"), PathBuf::from("/d"));
        cfg.witness = witness;
        (Loopback::new(&cfg, &rt, None), rt)
    }

    #[test]
    fn a_listener_in_another_region_is_reached_through_a_proxy() {
        let (mut l, _rt) = loopback(true);
        let (a1, b1, c1) = (&HOSTS[0], &HOSTS[1], &HOSTS[2]);
        let text = "primary = \"10.0.1.10:7420\"\nreplicator = [\"10.0.2.10:7430\", \"10.0.3.10:7430\", \"10.0.1.10:7430\"]\ndata = \"http://10.0.1.10:3900\"";
        let at_b = l.map_addresses(b1, text).unwrap();
        let primary = l.addr(guide(a1, 7420)).unwrap().to_string();
        let node3 = l.addr(guide(b1, 7430)).unwrap().to_string();
        assert!(!at_b.contains(&primary), "{at_b}");
        assert!(at_b.contains(&node3), "{at_b}");
        assert!(at_b.contains("http://10.0.1.10:3900"), "{at_b}");
        let names: Vec<&str> = l.proxies.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["b-to-primary", "b-to-replicator2", "b-to-replicator1"]
        );
        // the same listener from the same region: the same proxy
        l.map_addresses(b1, "10.0.1.10:7420").unwrap();
        assert_eq!(l.proxies.len(), 3);
        // c1 is region C with a witness, region A without
        assert_eq!(l.region(c1), "C");
        let (mut l, _rt) = loopback(false);
        assert_eq!(l.region(c1), "A");
        let at_a = l.map_addresses(a1, "10.0.3.10:7430").unwrap();
        assert_eq!(at_a, l.addr(guide(c1, 7430)).unwrap().to_string());
        assert!(l.proxies.is_empty());
    }
}
