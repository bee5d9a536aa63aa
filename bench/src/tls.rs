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
    /// Rounds of (plain, TLS), the order turned around every round; each figure is the
    /// median of its rounds.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Length of each timed cold-cache stat phase in seconds.
    #[arg(long, default_value_t = 5)]
    pub stat_seconds: u64,
}

/// One set-up's figures: name -> value (ops/s, ms or CPU ms per op).
type Figures = BTreeMap<String, f64>;

pub fn run(a: TlsArgs) -> Result<()> {
    if a.rounds == 0 || a.meta_files == 0 || a.threads == 0 || a.stat_seconds == 0 {
        bail!("--rounds, --meta-files, --threads and --stat-seconds must be positive");
    }
    if unsafe { libc::geteuid() } != 0 {
        bail!("strait bench tls mounts both regions: run it as root");
    }
    let mut plain: Vec<Figures> = vec![];
    let mut tls: Vec<Figures> = vec![];
    for round in 1..=a.rounds {
        // turned around every round, so that a drift of the machine during the run (another
        // tenant, a warming cache) does not always favour the same set-up
        let order = if round % 2 == 1 {
            [false, true]
        } else {
            [true, false]
        };
        for with_tls in order {
            eprintln!(
                "strait bench tls: round {round} of {}, {}",
                a.rounds,
                if with_tls { "mutual TLS" } else { "plain text" }
            );
            let f = measure(&a, with_tls)?;
            if with_tls { &mut tls } else { &mut plain }.push(f);
        }
    }
    let (plain_m, tls_m) = (median(&plain), median(&tls));
    println!(
        "strait bench tls: {} rounds, medians ({} files x {} threads per metadata run; storm {} ops/s x {} s; {} ms one way)",
        a.rounds, a.meta_files, a.threads, a.rate, a.seconds, a.delay_ms
    );
    println!(
        "{:<52} {:>12} {:>12} {:>9} {:>11}",
        "FIGURE", "PLAIN", "TLS", "TLS vs", "PLAIN SPAN"
    );
    for (k, p) in &plain_m {
        let t = tls_m.get(k).copied().unwrap_or(f64::NAN);
        // higher is better for rates, lower for times: the sign says which way TLS went
        let worse = if k.contains("ops/s") {
            (p - t) / p * 100.0
        } else {
            (t - p) / p * 100.0
        };
        println!(
            "{k:<52} {p:>12.2} {t:>12.2} {:>+8.1}% {:>10.1}%",
            -worse,
            span(&plain, k) * 100.0
        );
    }
    println!(
        "(TLS vs: + is better with TLS, - worse; rates in ops/s, lags in ms, CPU per operation)"
    );
    println!("(PLAIN SPAN: (largest - smallest) / median of the plain-text rounds: how much the same set-up moved between rounds)");
    Ok(())
}

/// One figure's values across rounds, in order (rounds that lack it left out).
fn sorted(runs: &[Figures], k: &str) -> Vec<f64> {
    let mut v: Vec<f64> = runs.iter().filter_map(|r| r.get(k).copied()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// (largest - smallest) / median of one figure across rounds.
fn span(runs: &[Figures], k: &str) -> f64 {
    let v = sorted(runs, k);
    match (v.first(), v.last()) {
        (Some(lo), Some(hi)) => (hi - lo) / v[v.len() / 2],
        _ => f64::NAN,
    }
}

fn median(runs: &[Figures]) -> Figures {
    let mut out = Figures::new();
    if let Some(first) = runs.first() {
        for k in first.keys() {
            let v = sorted(runs, k);
            out.insert(k.clone(), v[v.len() / 2]);
        }
    }
    out
}

fn measure(a: &TlsArgs, tls: bool) -> Result<Figures> {
    let rt = crate::runtime()?;
    let cfg = ClusterConfig {
        delay_ms: a.delay_ms,
        tls,
        ..ClusterConfig::new(
            std::env::current_exe().context("this program's path")?,
            a.dir.clone(),
        )
    };
    let mut cluster = Cluster::start(&cfg, &rt, &mut |_| {})?;
    let topo = cluster.topology().clone();
    let pids = [
        cluster.pid("primary")?,
        cluster.pid("mirror")?,
        cluster.mount_pid(0)?,
        cluster.mount_pid(1)?,
    ];
    let cpu = || pids.map(strait_devkit::usage::process_cpu_s);
    let mut f = Figures::new();
    let result = (|| -> Result<()> {
        for (region, mnt) in [("A", &topo.mount_a), ("B", &topo.mount_b)] {
            let mnt = mnt.clone().context("the regions are mounted")?;
            let work = mnt.join(format!("bench-tls-{}-{region}", std::process::id()));
            std::fs::create_dir(&work).with_context(|| format!("create {}", work.display()))?;
            let before = cpu();
            let mut rows = vec![];
            super::fs::bench_meta(
                &work,
                a.meta_files,
                a.threads,
                &super::fs::CpuOf::parse(&[])?,
                &mut rows,
            )?;
            let after = cpu();
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
            // timed phases of stats that reach the file system: one caller (the latency a
            // caller sees when the machine is not busy) and `threads` callers (the rate when
            // it is: here every process shares 2 cores, so CPU added anywhere costs rate)
            let files = cold_stat_files(&work, a.meta_files)?;
            let mount = if region == "A" { 2 } else { 3 };
            for threads in [1, a.threads] {
                let before = cpu();
                let (ops, rate) = cold_stats(&files, threads, a.stat_seconds)?;
                let after = cpu();
                let per_op = |i: usize| (after[i] - before[i]) * 1e6 / ops.max(1) as f64;
                let phase = format!("{region}: stat, cold cache, {threads} thread(s)");
                if threads == 1 {
                    f.insert(format!("{phase}: latency (us)"), 1e6 / rate.max(1e-9));
                } else {
                    f.insert(format!("{phase} (ops/s)"), rate);
                }
                f.insert(format!("{phase}: primary CPU (us/op)"), per_op(0));
                if region == "B" {
                    f.insert(format!("{phase}: mirror CPU (us/op)"), per_op(1));
                }
                f.insert(format!("{phase}: mount CPU (us/op)"), per_op(mount));
            }
            let _ = std::fs::remove_dir_all(&work);
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

/// `n` empty files under `work/cold` for the cold-cache stat phases.
fn cold_stat_files(work: &std::path::Path, n: usize) -> Result<Vec<PathBuf>> {
    let dir = work.join("cold");
    std::fs::create_dir(&dir).with_context(|| format!("create {}", dir.display()))?;
    let files: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("f{i}"))).collect();
    for p in &files {
        std::fs::File::create(p).with_context(|| format!("create {}", p.display()))?;
    }
    Ok(files)
}

/// Stat every file with `threads` callers, again and again for `seconds`, dropping the
/// kernel's dentry and inode caches before each pass so that every stat reaches the mount
/// (and the mount asks its daemon). Returns (stats, stats per second of the passes' time).
fn cold_stats(files: &[PathBuf], threads: usize, seconds: u64) -> Result<(u64, f64)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    let (mut ops, mut busy) = (0u64, 0f64);
    while std::time::Instant::now() < deadline {
        if !super::fs::drop_caches() {
            bail!("cannot drop the kernel's caches (/proc/sys/vm/drop_caches)");
        }
        let t = std::time::Instant::now();
        let failed: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|k| {
                    s.spawn(move || {
                        files.iter().skip(k).step_by(threads).find_map(|p| {
                            std::fs::metadata(p)
                                .err()
                                .map(|e| format!("{}: {e}", p.display()))
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Some("a stat thread panicked".into()))
                })
                .collect()
        });
        if let Some(e) = failed.first() {
            bail!("stat {e}");
        }
        busy += t.elapsed().as_secs_f64();
        ops += files.len() as u64;
    }
    Ok((ops, ops as f64 / busy.max(1e-9)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(values: &[f64]) -> Vec<Figures> {
        values
            .iter()
            .map(|v| Figures::from([("x (ops/s)".to_string(), *v)]))
            .collect()
    }

    #[test]
    fn the_median_and_the_span_are_taken_per_figure_across_rounds() {
        let r = runs(&[300.0, 100.0, 200.0]);
        assert_eq!(median(&r)["x (ops/s)"], 200.0);
        // (300 - 100) / 200
        assert_eq!(span(&r, "x (ops/s)"), 1.0);
        assert!(span(&r, "missing").is_nan());
        assert!(median(&[]).is_empty());
    }
}
