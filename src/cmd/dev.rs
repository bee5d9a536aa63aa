//! `strait dev up`: two regions on this machine, in one command. Region A runs the primary
//! and replicator nodes 1 and 2; region B runs replicator node 3 and a mirror. Each region has
//! its own RocksDB metadata and its own object store, a local directory (`--store dir`, the
//! default) or a Garage S3 server (`--store garage`): the mirror copies blocks from A's store
//! into B's, and B's mounts read B's first. Traffic between the regions goes through fault
//! proxies with a configurable one-way delay and bandwidth cap; `strait dev fault` changes
//! them at run time (delay, bandwidth, partition, heal).
//!
//! The dev kit starts the regions ([`strait_devkit::cluster`], which also lists the known
//! simplifications); this file parses the flags and prints what runs where.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
pub use strait_devkit::cluster::Topology;
use strait_devkit::cluster::{Cluster, ClusterConfig};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(clap::Subcommand)]
pub enum Action {
    /// Start both regions (and mount both unless --no-mount); Ctrl-C or SIGTERM stops all.
    Up(UpArgs),
    /// Change the link between the regions of a running `dev up`.
    Fault(FaultArgs),
}

#[derive(clap::Args)]
pub struct UpArgs {
    /// Working directory (emptied first): region-a/, region-b/, region-c/ (the guide's hosts a1, b1, c1: files, data, logs), tokens/, dev.json.
    #[arg(long, default_value = "/tmp/strait-dev")]
    pub dir: PathBuf,
    /// One-way delay between the regions, in ms.
    #[arg(long, default_value_t = 15)]
    pub delay_ms: u64,
    /// Do not mount the regions.
    #[arg(long)]
    pub no_mount: bool,
    /// The mirror's staleness window, ms.
    #[arg(long, default_value_t = 5_000)]
    pub window_ms: u64,
    /// The mirror's policy outside its window: forward, wait or serve.
    #[arg(long, default_value = "forward")]
    pub policy: String,
    /// Which replicator node the mirror subscribes to first: `local` (node 3, in its region)
    /// or `leader` (node 1, across the link).
    #[arg(long, default_value = "local")]
    pub source: String,
    /// The mirror's background block copy: eager or lazy.
    #[arg(long, default_value = "eager")]
    pub sync: String,
    /// Each region's object store: `dir` (a local directory) or `garage` (a Garage S3 server
    /// per region, which needs the `garage` program).
    #[arg(long, default_value = "dir")]
    pub store: String,
    /// Bandwidth cap between the regions, MB/s per proxy (0: none).
    #[arg(long, default_value_t = 0.0)]
    pub link_mb_s: f64,
    /// Stop by itself after this many seconds (0: run until a signal).
    #[arg(long, default_value_t = 0)]
    pub seconds: u64,
    /// Mutual TLS on every link, with a CA and a certificate per daemon, mount and operator
    /// in DIR/pki (on top of the tokens per role, which every set-up has).
    #[arg(long)]
    pub tls: bool,
    /// A third region, C, with replicator node 2 alone (a witness), so that no region holds a
    /// majority of the replicator: losing all of region A loses no committed change
    #[arg(long)]
    pub witness: bool,
    /// The primary's durability: `local` (a change is acknowledged once committed at A) or
    /// `replicated` (once a majority of the replicator holds it)
    #[arg(long, default_value = "local")]
    pub durability: String,
    /// The file system's GC delay, in seconds (`strait format --gc-delay`; default its own,
    /// 600): dead slices' blocks are deleted that long after their death. Given, the primary
    /// (and a promoted mirror) also run a GC pass every second and keep a slice's blocks
    /// for at most this long after every mirror applied its death, so that deletions across
    /// regions can be watched in seconds.
    #[arg(long)]
    pub gc_delay: Option<u64>,
    /// One object store for both regions (region A's), as a store replicated across regions
    /// would be: the mirror copies nothing, and refuses to sweep it for orphans.
    #[arg(long)]
    pub shared_store: bool,
}

#[derive(clap::Args)]
pub struct FaultArgs {
    /// The working directory of the running `dev up`.
    #[arg(long, default_value = "/tmp/strait-dev")]
    pub dir: PathBuf,
    /// `partition` (every region from every other), `isolate=REGION` (one region, `a`, `b` or
    /// `c`, from the others, which still reach each other), `heal`, `delay=MS` or
    /// `bandwidth=MB_PER_S` (0: no cap).
    pub what: String,
}

pub fn run(a: Args) -> Result<()> {
    match a.action {
        Action::Up(u) => up(u),
        Action::Fault(f) => fault(f),
    }
}

fn up(a: UpArgs) -> Result<()> {
    let _: strait_mirror::Policy = a.policy.parse()?;
    let _: strait_mirror::config::SyncPolicy = a.sync.parse()?;
    if a.source != "local" && a.source != "leader" {
        bail!("--source {:?}: expected `local` or `leader`", a.source);
    }
    if a.store != "dir" && a.store != "garage" {
        bail!("--store {:?}: expected `dir` or `garage`", a.store);
    }
    if a.durability != "local" && a.durability != "replicated" {
        bail!(
            "--durability {:?}: expected `local` or `replicated`",
            a.durability
        );
    }
    if !(a.link_mb_s >= 0.0 && a.link_mb_s.is_finite()) {
        bail!(
            "--link-mb-s {}: expected a number of MB/s, 0 for none",
            a.link_mb_s
        );
    }
    let rt = super::runtime()?;
    let mut primary_args = vec!["--durability".into(), a.durability.clone()];
    // a promoted mirror keeps the primary's durability
    let mut mirror_args = vec!["--promotion-durability".into(), a.durability.clone()];
    let mut format_args = vec![];
    if let Some(delay) = a.gc_delay {
        let grace_ms = (delay * 1000).min(60_000).to_string();
        format_args.extend(["--gc-delay".into(), delay.to_string()]);
        primary_args.extend([
            "--gc-interval-s".into(),
            "1".into(),
            "--gc-mirror-grace-ms".into(),
            grace_ms.clone(),
        ]);
        mirror_args.extend([
            "--promotion-gc-interval-s".into(),
            "1".into(),
            "--promotion-gc-mirror-grace-ms".into(),
            grace_ms,
        ]);
    }
    let cfg = ClusterConfig {
        strait_bin: std::env::current_exe().context("this program's path")?,
        dir: a.dir.clone(),
        delay_ms: a.delay_ms,
        mount: !a.no_mount,
        window_ms: a.window_ms,
        policy: a.policy.clone(),
        source: a.source.clone(),
        sync: a.sync.clone(),
        garage: a.store == "garage",
        link_mb_s: a.link_mb_s,
        primary_proxies: false,
        primary_args,
        mirror_args,
        mount_args: vec![],
        format_args,
        tls: a.tls,
        witness: a.witness,
        shared_store: a.shared_store,
        env: vec![],
        hooks: Default::default(),
    };
    let cluster = Cluster::start(&cfg, &rt, &mut |step| println!("strait dev: {step}"))?;
    let topo = cluster.topology();
    let token = &topo.token;
    let (primary, mirror) = (&topo.primary, &topo.mirror);
    let nodes = &topo.replicator;
    let (data_a, data_b) = (&topo.data_a, &topo.data_b);
    let cap = if a.link_mb_s > 0.0 {
        format!(", {} MB/s", a.link_mb_s)
    } else {
        String::new()
    };
    println!(
        "strait dev: {} regions up ({} ms one way between them{cap}; durability {})",
        if a.witness { "three" } else { "two" },
        a.delay_ms,
        a.durability
    );
    let in_region = |r: &str| -> String {
        let list: Vec<String> = topo
            .replicator_regions
            .iter()
            .zip(nodes)
            .enumerate()
            .filter(|(_, (region, _))| region.as_str() == r)
            .map(|(i, (_, addr))| format!("{} {addr}", i + 1))
            .collect();
        match list.len() {
            0 => String::new(),
            1 => format!(", replicator node {}", list[0]),
            _ => format!(", replicator nodes {}", list.join(" and ")),
        }
    };
    println!("  region A: primary {primary}{}", in_region("A"));
    println!("  region B: mirror {mirror}{}", in_region("B"));
    if a.witness {
        println!(
            "  region C (witness){}: no region holds a majority of the replicator",
            in_region("C")
        );
    }
    println!("  object stores: A {data_a}, B {data_b}");
    if cfg.garage {
        println!(
            "    (credentials: AWS_ACCESS_KEY_ID={} AWS_SECRET_ACCESS_KEY={} AWS_REGION={})",
            strait_devkit::ACCESS_KEY,
            strait_devkit::SECRET_KEY,
            strait_devkit::REGION
        );
    }
    if let (Some(ma), Some(mb)) = (&topo.mount_a, &topo.mount_b) {
        println!("  mounts: A at {}, B at {}", ma.display(), mb.display());
    }
    let tokens = a.dir.join("tokens");
    println!(
        "  tokens (deploy/README.md's, by the same names; mount {token}): {}/NAME.token, also in {}",
        tokens.display(),
        a.dir.join("dev.json").display()
    );
    let tls = match &topo.pki {
        Some(pki) => {
            println!(
                "  mutual TLS on every link: CA and certificates in {}",
                pki.display()
            );
            format!(
                " --tls-ca {0}/ca.pem --tls-cert {0}/admin.pem --tls-key {0}/admin.key",
                pki.display()
            )
        }
        None => String::new(),
    };
    println!(
        "  try: strait mirror status --addr {mirror} --token-file {}{tls} --watch",
        tokens.join("admin.token").display()
    );
    println!(
        "       strait dev fault --dir {} partition | isolate=a | heal | delay=MS | bandwidth=MB_PER_S",
        a.dir.display()
    );
    println!("strait dev: ready");
    std::io::stdout().flush().ok();

    run_until_stopped(&rt, a.seconds);
    println!("strait dev: stopping");
    for e in cluster.unmount() {
        eprintln!("strait dev: {e:#}");
    }
    Ok(())
}

/// Wait for Ctrl-C or SIGTERM, or `seconds` (0: no limit).
fn run_until_stopped(rt: &tokio::runtime::Runtime, seconds: u64) {
    let stop = tokio_util::sync::CancellationToken::new();
    rt.spawn(strait_server::wait_for_signal(stop.clone()));
    let limit = (seconds > 0).then(|| Duration::from_secs(seconds));
    rt.block_on(async {
        match limit {
            Some(d) => {
                tokio::select! { _ = stop.cancelled() => {}, _ = tokio::time::sleep(d) => {} }
            }
            None => stop.cancelled().await,
        }
    });
}

fn fault(a: FaultArgs) -> Result<()> {
    let path = a.dir.join("dev.json");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "read {} (is `strait dev up` running there?)",
            path.display()
        )
    })?;
    let topo: Topology =
        serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
    let mut c = std::net::TcpStream::connect(&topo.control).with_context(|| {
        format!(
            "reach `strait dev up` at {} (has it stopped?)",
            topo.control
        )
    })?;
    writeln!(c, "{} {}", topo.admin_token, a.what).context("send the fault")?;
    let mut reply = String::new();
    BufReader::new(c)
        .read_line(&mut reply)
        .context("read the reply")?;
    let reply = reply.trim();
    if let Some(e) = reply.strip_prefix("error: ") {
        bail!("{e}");
    }
    println!("{reply}");
    Ok(())
}
