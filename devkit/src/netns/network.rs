//! The network of the hosts: a namespace per host, each with one address on a bridge that
//! lives in a namespace of its own (`strait-wan`), a bandwidth cap (`tc` tbf) on both ends of
//! each host's link, and the WAN's delay from a transparent proxy in each host: an nftables
//! rule sends every TCP connection to another host through it, and it delays each direction
//! (this kernel has no netem; on real hosts the WAN supplies the delay).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::install::{Host, HOSTS};
use crate::{Faults, Proxy};

/// The operator's host: Prometheus and the operator's commands run there. Its link has no
/// cap and no delay (it stands for a host beside each region's, as a scraper is).
pub const OPS: Host = Host {
    name: "ops",
    region: "-",
    ip: Ipv4Addr::new(10, 0, 0, 1),
    node: 0,
};

/// Every namespace this module makes starts with this.
pub const PREFIX: &str = "strait-";
const WAN: &str = "strait-wan";
const BRIDGE: &str = "br0";
/// The transparent proxy's port on each host's loopback.
const PROXY_PORT: u16 = 7499;
/// The mark of the proxy's own connections, which the redirect rule lets pass.
const PROXY_MARK: u32 = 0x5753;

/// The namespace of host `name`.
pub fn ns_of(name: &str) -> String {
    format!("{PREFIX}{name}")
}

fn ns_path(ns: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(ns)
}

/// `program` to be run in network namespace `ns` (`nsenter --net`; the mount namespace stays
/// this machine's, so a FUSE mount made there is seen everywhere, which `ip netns exec` would
/// not give).
pub fn nsenter(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net={}", ns_path(ns).display()))
        .arg("--")
        .arg(program);
    c
}

/// Run `f` on a thread that has entered network namespace `ns`: the sockets it makes, and
/// the threads it starts, are that namespace's.
pub fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    let path = ns_path(ns);
    let h = std::thread::Builder::new()
        .name(format!("in-{ns}"))
        .spawn(move || -> Result<T> {
            use std::os::fd::AsRawFd;
            let fd =
                std::fs::File::open(&path).with_context(|| format!("open {}", path.display()))?;
            // SAFETY: setns only changes this thread's network namespace
            if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error())
                    .with_context(|| format!("enter {}", path.display()));
            }
            Ok(f())
        })
        .context("start a thread")?;
    h.join()
        .map_err(|_| anyhow::anyhow!("a thread in {ns} panicked"))?
}

/// Run a command to its end; its stdout, or an error with its stderr.
pub fn run(mut c: Command) -> Result<String> {
    let what = format!("{c:?}");
    let out = c
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {what}"))?;
    if !out.status.success() {
        bail!(
            "{what}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<()> {
    let mut c = Command::new("ip");
    c.args(args);
    run(c).map(|_| ())
}

fn in_ns_run(ns: &str, program: &str, args: &[&str]) -> Result<String> {
    let mut c = nsenter(ns, program);
    c.args(args);
    run(c)
}

/// The namespaces of this module that exist now.
pub fn existing() -> Result<Vec<String>> {
    let mut c = Command::new("ip");
    c.args(["netns", "list"]);
    Ok(run(c)?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(PREFIX))
        .map(str::to_string)
        .collect())
}

/// The processes inside namespace `ns`.
fn pids_in(ns: &str) -> Vec<i32> {
    let mut c = Command::new("ip");
    c.args(["netns", "pids", ns]);
    run(c)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Kill every process in the namespaces of this module and delete them. A namespace with a
/// process left after 10 s is an error.
pub fn remove_all() -> Result<()> {
    for ns in existing()? {
        for pid in pids_in(&ns) {
            // SAFETY: kill has no memory effects
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !pids_in(&ns).is_empty() {
            if std::time::Instant::now() > deadline {
                bail!("processes {:?} stay in namespace {ns}", pids_in(&ns));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        ip(&["netns", "del", &ns])?;
    }
    Ok(())
}

/// Whether this machine can make the network: root, and `ip`, `tc`, `nft` and `nsenter`.
pub fn missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions
    if unsafe { libc::geteuid() } != 0 {
        return Some("network namespaces need root".into());
    }
    for (p, pkg) in [
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("nft", "nftables"),
        ("nsenter", "util-linux"),
    ] {
        let found = Command::new(p)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!("`{p}` is not installed (apt-get install {pkg})"));
        }
    }
    None
}

/// The hosts' network, removed when dropped.
pub struct Network {
    /// One transparent delay proxy per host (not the operator's).
    proxies: Vec<Proxy>,
}

impl Network {
    /// Make the namespaces, the bridge, the links with their caps (`link_mb_s` MB/s each way
    /// on each host's link, 0: none) and the delay (`delay` each way through each host's
    /// proxy). Namespaces left by an earlier run are removed first.
    pub fn create(delay: Duration, link_mb_s: u64) -> Result<Network> {
        if let Some(m) = missing() {
            bail!("cannot make the hosts' network: {m}");
        }
        remove_all().context("remove the namespaces of an earlier run")?;
        let mut net = Network { proxies: vec![] };
        ip(&["netns", "add", WAN])?;
        ip(&["-n", WAN, "link", "set", "lo", "up"])?;
        ip(&["-n", WAN, "link", "add", BRIDGE, "type", "bridge"])?;
        ip(&["-n", WAN, "link", "set", BRIDGE, "up"])?;
        for h in HOSTS.iter().chain([&OPS]) {
            let ns = ns_of(h.name);
            let wan_end = format!("{}-wan", h.name);
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link", "add", &wan_end, "netns", WAN, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ])?;
            ip(&["-n", WAN, "link", "set", &wan_end, "master", BRIDGE, "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/16", h.ip),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            if h.name == OPS.name {
                continue;
            }
            if link_mb_s > 0 {
                let rate = format!("{}mbit", link_mb_s * 8);
                // a burst of 4 ms at the rate (the timer's tick), at least 64 KiB
                let burst = (link_mb_s * 4_000).max(64 << 10).to_string();
                for (ns, dev) in [(ns.as_str(), "eth0"), (WAN, wan_end.as_str())] {
                    in_ns_run(
                        ns,
                        "tc",
                        &[
                            "qdisc", "add", "dev", dev, "root", "tbf", "rate", &rate, "burst",
                            &burst, "latency", "100ms",
                        ],
                    )?;
                }
            }
            if !delay.is_zero() {
                net.delay_host(h, delay)?;
            }
        }
        Ok(net)
    }

    /// Send host `h`'s connections to the other hosts through a proxy that delays them.
    fn delay_host(&mut self, h: &Host, delay: Duration) -> Result<()> {
        let ns = ns_of(h.name);
        let rules = format!(
            "table ip strait_wan {{
    chain out {{
        type nat hook output priority -100; policy accept;
        meta mark {PROXY_MARK:#x} return
        ip daddr != 10.0.0.0/16 return
        ip daddr {{ {own}, {ops} }} return
        tcp dport != {PROXY_PORT} redirect to :{PROXY_PORT}
    }}
}}
",
            own = h.ip,
            ops = OPS.ip,
        );
        let mut c = nsenter(&ns, "nft");
        c.args(["-f", "-"]);
        let what = format!("nft -f - in {ns}");
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("run {what}"))?;
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().context("nft's stdin")?;
            stdin
                .write_all(rules.as_bytes())
                .with_context(|| format!("write to {what}"))?;
        }
        let out = child
            .wait_with_output()
            .with_context(|| format!("wait for {what}"))?;
        if !out.status.success() {
            bail!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let listen = SocketAddr::from(([127, 0, 0, 1], PROXY_PORT));
        let proxy = in_ns(&ns, move || {
            Proxy::start_transparent_blocking(listen, PROXY_MARK)
        })?
        .with_context(|| format!("start the WAN proxy of {}", h.name))?;
        proxy.set(Faults::delay(delay));
        self.proxies.push(proxy);
        Ok(())
    }

    /// Connections the hosts' WAN proxies carried.
    pub fn wan_connections(&self) -> u64 {
        self.proxies
            .iter()
            .map(|p| {
                p.stats()
                    .accepted
                    .load(std::sync::atomic::Ordering::Relaxed)
            })
            .sum()
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.proxies.clear();
        if let Err(e) = remove_all() {
            eprintln!("strait: remove the hosts' namespaces: {e:#}");
        }
    }
}
