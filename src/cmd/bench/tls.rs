//! `strait bench tls`: what mutual TLS on every link costs. Both set-ups of `strait dev up` in
//! one run, in turns: plain text (tokens per role) and `--tls` (mutual TLS on every link, the
//! same tokens on top). Each is measured the same way: the metadata part of `strait bench`
//! (create, stat, rename, unlink) at region A's mount (the primary) and at region B's (the
//! mirror, which forwards changes to the primary), then the storm of `strait mirror bench` and
//! the mirror's commit-to-apply lag during it; with the CPU time of the primary and the mirror
//! per operation. Printed side by side, with TLS's difference to plain text.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use strait_devkit::cluster::{Cluster, ClusterConfig};

#[derive(clap::Args)]
pub struct TlsArgs {
    /// Working directory of the regions (emptied for each set-up).
    #[arg(long, default_value = "/tmp/strait-bench-tls")]
    pub dir: PathBuf,
    /// Files in each metadata benchmark.
    #[arg(long, default_value_t = 2000)]
    pub meta_files: usize,
    /// Threads of the metadata benchmark.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Operations per second of the mirror storm.
    #[arg(long, default_value_t = 2000)]
    pub rate: u64,
    /// Length of the storm in seconds.
    #[arg(long, default_value_t = 15)]
    pub seconds: u64,
    /// Clients of the storm.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// One-way delay between the regions in ms.
    #[arg(long, default_value_t = 1)]
    pub delay_ms: u64,
    /// Rounds of (plain, TLS); each figure is the median of its rounds.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
}

/// One set-up's figures: name -> value (ops/s, ms or CPU ms per op).
type Figures = BTreeMap<String, f64>;

pub fn run(a: TlsArgs) -> Result<()> {
    if a.rounds == 0 || a.meta_files == 0 || a.threads == 0 {
        bail!("--rounds, --meta-files and --threads must be positive");
    }
    if unsafe { libc::geteuid() } != 0 {
        bail!("strait bench tls mounts both regions: run it as root");
    }
    let mut plain: Vec<Figures> = vec![];
    let mut tls: Vec<Figures> = vec![];
    for round in 1..=a.rounds {
        for with_tls in [false, true] {
            eprintln!(
                "strait bench tls: round {round} of {}, {}",
                a.rounds,
                if with_tls { "mutual TLS" } else { "plain text" }
            );
            let f = measure(&a, with_tls)?;
            if with_tls { &mut tls } else { &mut plain }.push(f);
        }
    }
    let (plain, tls) = (median(&plain), median(&tls));
    println!(
        "strait bench tls: {} rounds, medians ({} files x {} threads per metadata run; storm {} ops/s x {} s; {} ms one way)",
        a.rounds, a.meta_files, a.threads, a.rate, a.seconds, a.delay_ms
    );
    println!(
        "{:<44} {:>12} {:>12} {:>9}",
        "FIGURE", "PLAIN", "TLS", "TLS vs"
    );
    for (k, p) in &plain {
        let t = tls.get(k).copied().unwrap_or(f64::NAN);
        // higher is better for rates, lower for times: the sign says which way TLS went
        let worse = if k.contains("ops/s") {
            (p - t) / p * 100.0
        } else {
            (t - p) / p * 100.0
        };
        println!("{k:<44} {p:>12.2} {t:>12.2} {:>+8.1}%", -worse);
    }
    println!("(TLS vs: + is better with TLS, - worse; rates in ops/s, lags in ms, CPU in ms per operation)");
    Ok(())
}

fn median(runs: &[Figures]) -> Figures {
    let mut out = Figures::new();
    if let Some(first) = runs.first() {
        for k in first.keys() {
            let mut v: Vec<f64> = runs.iter().filter_map(|r| r.get(k).copied()).collect();
            v.sort_by(|a, b| a.total_cmp(b));
            out.insert(k.clone(), v[v.len() / 2]);
        }
    }
    out
}

fn measure(a: &TlsArgs, tls: bool) -> Result<Figures> {
    let rt = crate::cmd::runtime()?;
    let cfg = ClusterConfig {
        strait_bin: std::env::current_exe().context("this program's path")?,
        dir: a.dir.clone(),
        delay_ms: a.delay_ms,
        mount: true,
        window_ms: 5_000,
        policy: "forward".into(),
        source: "local".into(),
        sync: "eager".into(),
        garage: false,
        link_mb_s: 0.0,
        primary_proxies: false,
        primary_args: vec![],
        mirror_args: vec![],
        mount_args: vec![],
        format_args: vec![],
        tls,
        hooks: Default::default(),
    };
    let mut cluster = Cluster::start(
        &cfg,
        &rt,
        &|node, admin| rt.block_on(crate::cmd::dev::has_leader(node, admin)),
        &mut |_| {},
    )?;
    let topo = cluster.topology().clone();
    let pids = [cluster.pid("primary")?, cluster.pid("mirror")?];
    let cpu = || pids.map(strait_devkit::usage::process_cpu_s);
    let mut f = Figures::new();
    let result = (|| -> Result<()> {
        for (region, mnt) in [("A", &topo.mount_a), ("B", &topo.mount_b)] {
            let mnt = mnt.clone().context("the regions are mounted")?;
            let work = mnt.join(format!("bench-tls-{}-{region}", std::process::id()));
            std::fs::create_dir(&work).with_context(|| format!("create {}", work.display()))?;
            let before = cpu();
            let mut rows = vec![];
            super::fs::bench_meta(&work, a.meta_files, a.threads, &mut rows)?;
            let after = cpu();
            let _ = std::fs::remove_dir_all(&work);
            let mut ops = 0;
            for r in &rows {
                f.insert(format!("{region}: {} (ops/s)", r.name), r.value);
                ops += a.meta_files;
            }
            f.insert(
                format!("{region}: primary CPU per metadata op (ms)"),
                (after[0] - before[0]) * 1e3 / ops as f64,
            );
            f.insert(
                format!("{region}: mirror CPU per metadata op (ms)"),
                (after[1] - before[1]) * 1e3 / ops as f64,
            );
        }
        let creds = topo.credentials("mount")?;
        let before = cpu();
        let s = super::mirror::storm(
            &topo.primary,
            &topo.mirror,
            &creds,
            a.rate,
            a.seconds,
            a.clients,
        )?;
        let after = cpu();
        f.insert("storm: operations (ops/s)".into(), s.ops as f64 / s.took_s);
        f.insert(
            "storm: apply lag p50 (ms)".into(),
            s.apply_lag.1 as f64 / 1e3,
        );
        f.insert(
            "storm: apply lag p99 (ms)".into(),
            s.apply_lag.2 as f64 / 1e3,
        );
        let ops = s.ops.max(1) as f64;
        f.insert(
            "storm: primary CPU per op (ms)".into(),
            (after[0] - before[0]) * 1e3 / ops,
        );
        f.insert(
            "storm: mirror CPU per op (ms)".into(),
            (after[1] - before[1]) * 1e3 / ops,
        );
        Ok(())
    })();
    for e in cluster.unmount() {
        eprintln!("strait bench tls: {e:#}");
    }
    drop(cluster);
    result?;
    Ok(f)
}
