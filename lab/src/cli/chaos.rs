//! `strait-lab chaos run`: the Jepsen-style harness of [`strait_lab`] (a two-region cluster on
//! this machine, a workload at both regions' mounts, a seeded nemesis, checkers over the
//! history). Exit status 0 only when every checker passed.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use strait_lab::{nemesis, RunConfig};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(clap::Subcommand)]
pub enum Action {
    /// Start a cluster, run the workload under faults, check the history.
    Run(RunArgs),
    /// (For `run`) a lock holder: take a write lock on FILE again and again, write a token,
    /// read it back, let go; a JSON line per hold on stdout.
    #[command(hide = true)]
    LockClient(LockClientArgs),
}

#[derive(clap::Args)]
pub struct LockClientArgs {
    #[arg(long)]
    pub file: PathBuf,
    #[arg(long)]
    pub client: u32,
    #[arg(long)]
    pub seconds: u64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// Seed of the fault schedule and the workload (default: a random one, printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// How long the workload runs.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Fault kinds, comma-separated: all, none, or some of kill, stop, partition,
    /// partition-one-way, partition-mirror-primary, partition-replication,
    /// partition-primary-replicator, latency, bandwidth, stop-garage, kill-mount,
    /// stop-mount, kill-garage, object-store, disk-full (root: loop-mounted file systems), clock-jump (libfaketime),
    /// power-loss (a daemon's unsynced writes are lost: the primary, the mirror, a
    /// replicator node, or a whole region, with its `file://` store under --store dir),
    /// switchover, failover, gc (`strait gc` at both regions' daemons).
    #[arg(long, default_value = "all")]
    pub nemesis: String,
    /// Writing clients per region.
    #[arg(long, default_value_t = 2)]
    pub clients: u32,
    /// Clients per region that only read the writers' registers.
    #[arg(long, default_value_t = 2)]
    pub readers: u32,
    /// Lock holders per region (processes of their own; checker 9).
    #[arg(long, default_value_t = 2)]
    pub lockers: u32,
    /// The primary's durability: local or replicated.
    #[arg(long, default_value = "replicated")]
    pub durability: String,
    /// The mirror's policy outside its window: forward, wait or serve.
    #[arg(long, default_value = "forward")]
    pub policy: String,
    /// The mirror's staleness window, ms.
    #[arg(long, default_value_t = 2000)]
    pub window_ms: u64,
    /// One-way delay between the regions, ms.
    #[arg(long, default_value_t = 5)]
    pub delay_ms: u64,
    /// Object store per region: garage or dir.
    #[arg(long, default_value = "garage")]
    pub store: String,
    /// One object store for both regions (region A's), as a store replicated across regions
    /// would be.
    #[arg(long)]
    pub shared_store: bool,
    /// The mirror's background block copy: eager or lazy (lazy: a block crosses only when
    /// read, so the new primary of a failover reads from the old one's store).
    #[arg(long, default_value = "eager")]
    pub sync: String,
    /// The file system's GC delay, s. Below 60 GC runs fast everywhere: a pass a second at
    /// the primary (and at a promoted mirror), the mirrors' grace the same delay.
    #[arg(long, default_value_t = 60)]
    pub gc_delay_s: u64,
    /// Working directory (emptied first): the cluster, its logs, run.json, history.jsonl.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Run again what DIR/run.json of an earlier run describes (seed, schedule, settings).
    #[arg(long, value_name = "DIR")]
    pub replay: Option<PathBuf>,
}

pub fn run(a: Args, strait: Option<&std::path::Path>) -> Result<()> {
    match a.action {
        Action::Run(r) => run_harness(r, strait),
        Action::LockClient(l) => strait_lab::locks::hold_locks(
            &l.file,
            l.client,
            l.seconds,
            l.seed,
            &mut std::io::stdout().lock(),
        ),
    }
}

fn run_harness(a: RunArgs, strait: Option<&std::path::Path>) -> Result<()> {
    let mut cfg = match &a.replay {
        Some(d) => {
            let p = d.join("run.json");
            let text = std::fs::read_to_string(&p)
                .with_context(|| format!("read {} (the run to replay)", p.display()))?;
            let mut c: RunConfig = serde_json::from_str(&text)
                .with_context(|| format!("{}: not a chaos run description", p.display()))?;
            c.dir = a.dir.clone().unwrap_or_else(|| d.with_extension("replay"));
            c
        }
        None => {
            for (flag, v, ok) in [
                ("--durability", &a.durability, &["local", "replicated"][..]),
                ("--policy", &a.policy, &["forward", "wait", "serve"][..]),
                ("--store", &a.store, &["garage", "dir"][..]),
                ("--sync", &a.sync, &["eager", "lazy"][..]),
            ] {
                if !ok.contains(&v.as_str()) {
                    bail!("{flag} {v:?}: expected one of {}", ok.join(", "));
                }
            }
            if a.seconds < 10 {
                bail!("--seconds {}: at least 10", a.seconds);
            }
            if a.clients == 0 || a.clients > 16 {
                bail!("--clients {}: 1 to 16 per region", a.clients);
            }
            if a.readers > 16 {
                bail!("--readers {}: 0 to 16 per region", a.readers);
            }
            if a.lockers > 8 {
                bail!("--lockers {}: 0 to 8 per region", a.lockers);
            }
            let seed = a.seed.unwrap_or_else(rand::random);
            RunConfig {
                seed,
                seconds: a.seconds,
                nemesis: nemesis::parse_kinds(&a.nemesis)?,
                clients: a.clients,
                readers: a.readers,
                lockers: a.lockers,
                durability: a.durability.clone(),
                policy: a.policy.clone(),
                window_ms: a.window_ms,
                delay_ms: a.delay_ms,
                garage: a.store == "garage",
                shared_store: a.shared_store,
                sync: a.sync.clone(),
                gc_delay_s: a.gc_delay_s,
                dir: a
                    .dir
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(format!("/tmp/strait-chaos-{seed}"))),
                strait_bin: PathBuf::new(),
                schedule: None,
            }
        }
    };
    cfg.strait_bin = super::strait_bin(strait)?;
    if cfg.garage && !strait_devkit::garage::installed() {
        bail!("--store garage needs the garage program on PATH (or use --store dir)");
    }
    if cfg.schedule.is_none() {
        cfg.schedule = Some(nemesis::schedule(
            cfg.seed,
            cfg.seconds,
            &cfg.nemesis,
            cfg.garage,
        ));
    }
    if cfg.dir.exists() {
        // a run killed outright may have left its mounts (FUSE, loop disks) in there
        strait_devkit::cluster::detach_all_under(&cfg.dir)?;
        std::fs::remove_dir_all(&cfg.dir)
            .with_context(|| format!("empty {}", cfg.dir.display()))?;
    }
    std::fs::create_dir_all(&cfg.dir).with_context(|| format!("create {}", cfg.dir.display()))?;
    std::fs::write(
        cfg.dir.join("run.json"),
        serde_json::to_string_pretty(&cfg)?,
    )
    .context("write run.json")?;
    println!(
        "strait-lab chaos: seed {} for {} s, nemesis {}, durability {}, policy {}; in {}",
        cfg.seed,
        cfg.seconds,
        if cfg.nemesis.is_empty() {
            "none".to_string()
        } else {
            cfg.nemesis.join(",")
        },
        cfg.durability,
        cfg.policy,
        cfg.dir.display()
    );
    let rt = super::runtime()?;
    // Ctrl-C detaches what the run mounted
    strait_lab::interrupt::install(rt.handle()).context("take Ctrl-C")?;
    let report = strait_lab::run(&cfg, &mut |s| println!("strait-lab chaos: {s}"))?;
    for v in &report.tally.violations {
        println!(
            "\nVIOLATION of checker {} ({}): {}",
            v.checker,
            strait_lab::check::CHECKERS[v.checker],
            v.what
        );
        for l in &v.excerpt {
            println!("    {l}");
        }
    }
    println!("\n{}", strait_lab::summary(&report));
    if !report.passed() {
        bail!(
            "{} violations (seed {}; replay with --replay {})",
            report.tally.violations.len(),
            cfg.seed,
            cfg.dir.display()
        );
    }
    println!("strait-lab chaos: every checker passed (seed {})", cfg.seed);
    Ok(())
}
