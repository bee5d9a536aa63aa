//! `strait-lab netns`: deploy/README.md's three hosts as network namespaces (a1 10.0.1.10, b1
//! 10.0.2.10, c1 10.0.3.10) and an operator's host, set up as the guide says from deploy/'s
//! files ([`strait_lab::netns`]); Ctrl-C or SIGTERM removes everything. Needs root, iproute2,
//! nftables and garage.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use strait_lab::netns::{Deployment, NetnsConfig, HOSTS, OPS};

#[derive(clap::Args)]
pub struct Args {
    /// Working directory (emptied first): each host's /etc/strait, /var/lib/strait,
    /// /var/cache/strait, /mnt/strait and its services' logs.
    #[arg(long, default_value = "/tmp/strait-netns")]
    pub dir: PathBuf,
    /// strait's deploy/ directory, whose units and configuration files are used.
    #[arg(long, default_value = "deploy")]
    pub deploy: PathBuf,
    /// One-way delay between the hosts, in ms.
    #[arg(long, default_value_t = 15)]
    pub delay_ms: u64,
    /// Each host's link, MB/s each way (0: no cap).
    #[arg(long, default_value_t = 100)]
    pub link_mb_s: u64,
    /// Do not start the mounts.
    #[arg(long)]
    pub no_mount: bool,
    /// Stop by itself after this many seconds (0: run until a signal).
    #[arg(long, default_value_t = 0)]
    pub seconds: u64,
}

pub fn run(a: Args, strait: Option<&std::path::Path>) -> Result<()> {
    let rt = super::runtime()?;
    let cfg = NetnsConfig {
        dir: a.dir.clone(),
        strait_bin: super::strait_bin(strait)?,
        deploy: a.deploy.clone(),
        delay: Duration::from_millis(a.delay_ms),
        link_mb_s: a.link_mb_s,
        mount: !a.no_mount,
        log: std::env::var("STRAIT_LOG").unwrap_or_else(|_| "info".into()),
    };
    println!(
        "strait-lab netns: bringing up deploy/README.md's hosts in network namespaces ({} ms one way, {})",
        a.delay_ms,
        if a.link_mb_s > 0 {
            format!("{} MB/s per host", a.link_mb_s)
        } else {
            "no cap".into()
        }
    );
    let mut d = Deployment::up(cfg)?;
    for h in HOSTS.iter().chain([&OPS]) {
        let runs: Vec<String> = d
            .services()
            .into_iter()
            .filter(|(host, _, _)| *host == h.name)
            .map(|(_, unit, pid)| format!("{unit} (pid {pid})"))
            .collect();
        println!(
            "  {} {} (namespace strait-{}): {}",
            h.name,
            h.ip,
            h.name,
            if runs.is_empty() {
                "-".into()
            } else {
                runs.join(", ")
            }
        );
    }
    if !a.no_mount {
        println!(
            "  mounts: a1 at {}, b1 at {}",
            d.mountpoint("a1").display(),
            d.mountpoint("b1").display()
        );
    }
    println!(
        "  try: nsenter --net=/run/netns/strait-ops strait mirror status --addr 10.0.2.10:7440 --token-file {} --tls-ca {}",
        d.local("a1", "/etc/strait/tokens/admin.token"),
        d.local("a1", "/etc/strait/pki/ca.pem")
    );
    println!("strait-lab netns: ready");
    std::io::stdout().flush().ok();
    super::run_until_stopped(&rt, a.seconds);
    println!("strait-lab netns: stopping");
    let errors = d.down();
    for e in &errors {
        eprintln!("strait-lab netns: {e}");
    }
    if !errors.is_empty() {
        bail!("{} things did not stop cleanly", errors.len());
    }
    Ok(())
}
