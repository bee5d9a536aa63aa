//! `strait mirror bench`: a create/rename/setattr storm at a fixed rate against the primary,
//! and the mirror's lag during it.
//!
//! Two lag figures are printed:
//! - commit-to-apply: for every record of the storm, the mirror's wall clock when it applied
//!   the record minus the primary's clock when it committed it. Exact when both run on one
//!   machine (as `strait dev up` does); the mirror keeps these for the last minute.
//! - the mirror's own lag estimate (docs/consistency.md, "Lag", on the primary's clock readings, immune to
//!   skew), sampled every 100 ms by this command.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strait_fs_core::meta::{Ctx, MetaClient, SetAttr};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// A `strait dev up` directory to take the addresses and the token from.
    #[arg(long, default_value = "/tmp/strait-dev")]
    pub dev: PathBuf,
    /// The primary's address (instead of --dev).
    #[arg(long, requires = "mirror")]
    pub primary: Option<String>,
    /// The mirror's address (instead of --dev).
    #[arg(long, requires = "primary")]
    pub mirror: Option<String>,
    #[arg(long, env = "STRAIT_TOKEN", hide_env_values = true, default_value = "")]
    pub token: String,
    /// Operations per second at the primary (a third each create, rename and chmod).
    #[arg(long, default_value_t = 5_000)]
    pub rate: u64,
    /// Length of the storm (at most 50 s: the mirror keeps one minute of apply times).
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
}

/// Seconds of apply times the mirror keeps, less a margin.
const STORM_SECONDS_MAX: u64 = 50;

fn ms(us: u64) -> String {
    format!("{:.1}", us as f64 / 1000.0)
}

pub fn run(a: BenchArgs) -> Result<()> {
    let (primary, mirror, creds) = match (&a.primary, &a.mirror) {
        (Some(p), Some(m)) => (
            p.clone(),
            m.clone(),
            strait_auth::Credentials::token(&a.token).context("--token")?,
        ),
        _ => {
            let path = a.dev.join("dev.json");
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!(
                    "read {} (start `strait dev up` or give --primary and --mirror)",
                    path.display()
                )
            })?;
            let t: strait_devkit::cluster::Topology = serde_json::from_str(&text)?;
            let creds = t.credentials("mount")?;
            (t.primary, t.mirror, creds)
        }
    };
    let s = storm(&primary, &mirror, &creds, a.rate, a.seconds, a.clients)?;
    s.print(a.rate);
    Ok(())
}

/// What a storm measured.
pub struct Storm {
    pub ops: u64,
    pub took_s: f64,
    pub errors: u64,
    pub versions: (u64, u64),
    /// Commit-to-apply lag: samples, p50, p99, max (µs).
    pub apply_lag: (u64, u64, u64, u64),
    /// The mirror's own estimate, sampled: count, p50, p99, max (µs).
    pub estimate: (usize, u64, u64, u64),
    pub source: String,
    pub worst_state: String,
    pub state: String,
}

impl Storm {
    pub fn print(&self, rate: u64) {
        println!(
            "storm: {} operations in {:.1} s = {:.0} ops/s (target {rate}), {} errors, versions {}..{}",
            self.ops,
            self.took_s,
            self.ops as f64 / self.took_s,
            self.errors,
            self.versions.0,
            self.versions.1
        );
        let (n, p50, p99, max) = self.apply_lag;
        println!(
            "commit-to-apply lag over {n} records (ms): p50 {}  p99 {}  max {}",
            ms(p50),
            ms(p99),
            ms(max)
        );
        let (n, p50, p99, max) = self.estimate;
        println!(
            "mirror's lag estimate, {n} samples (ms): p50 {}  p99 {}  max {}",
            ms(p50),
            ms(p99),
            ms(max)
        );
        println!(
            "mirror: subscribed at {}, state during the storm: {}, now {}",
            self.source, self.worst_state, self.state
        );
    }
}

/// A storm of `rate` operations a second for `seconds` by `clients` clients at the primary
/// `primary`, presenting `creds`, and the lag of the mirror at `mirror` during it.
pub fn storm(
    primary: &str,
    mirror: &str,
    creds: &strait_auth::Credentials,
    rate: u64,
    seconds: u64,
    clients: usize,
) -> Result<Storm> {
    if seconds == 0 || seconds > STORM_SECONDS_MAX {
        bail!("--seconds must be 1 to {STORM_SECONDS_MAX}");
    }
    if rate == 0 || clients == 0 {
        bail!("--rate and --clients must be positive");
    }
    let (primary, mirror) = (primary.to_string(), mirror.to_string());
    let rt = crate::runtime()?;
    let status = |addr: &str| rt.block_on(strait_mirror::follower::site_status(addr, creds));
    let before = status(&mirror)?;
    if before.role != "mirror" {
        bail!("{mirror} is not a mirror (it says it is a {})", before.role);
    }
    let start_version = status(&primary)?.version;

    // the storm: each client paces itself to rate / clients
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let per_client = rate as f64 / clients as f64;
    let t0 = Instant::now();
    let mut threads = vec![];
    for c in 0..clients {
        let client = strait_site_client::RemoteMeta::connect(
            &format!("strait://{primary}"),
            strait_site_client::ConnectOptions {
                creds: creds.clone(),
                // a load generator: it reads nothing back
                keep_names: false,
                ..Default::default()
            },
        )?;
        client.open_session("strait mirror bench")?;
        let (stop, done, errors) = (stop.clone(), done.clone(), errors.clone());
        threads.push(std::thread::spawn(move || -> Result<()> {
            let ctx = Ctx::root();
            let dir_name = format!("bench-{}-{c}", std::process::id());
            let (dir, _) = client.mkdir(&ctx, 1, dir_name.as_bytes(), 0o755, 0)?;
            let mut i = 0u64;
            let mut n = 0u64;
            let begin = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                // pace: operation n is due at n / per_client seconds
                let due = Duration::from_secs_f64(n as f64 / per_client);
                if let Some(wait) = due.checked_sub(begin.elapsed()) {
                    std::thread::sleep(wait);
                }
                let name = format!("f{i}");
                let r = match n % 3 {
                    0 => client
                        .mknod(&ctx, dir, name.as_bytes(), libc::S_IFREG | 0o644, 0, 0)
                        .map(|_| ()),
                    1 => client.rename(
                        &ctx,
                        dir,
                        name.as_bytes(),
                        dir,
                        format!("g{i}").as_bytes(),
                        0,
                    ),
                    _ => {
                        let r = client
                            .lookup(&ctx, dir, format!("g{i}").as_bytes())
                            .and_then(|(ino, _)| {
                                client.setattr(
                                    &ctx,
                                    ino,
                                    &SetAttr {
                                        mode: Some(0o600),
                                        ..Default::default()
                                    },
                                )
                            })
                            .map(|_| ());
                        i += 1;
                        r
                    }
                };
                match r {
                    Ok(()) => done.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
                n += 1;
            }
            let _ = client.close_session();
            Ok(())
        }));
    }

    // sample the mirror's own estimate while the storm runs
    let mut estimates = vec![];
    let mut worst_state = String::from("following");
    while t0.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_millis(100));
        if let Ok(st) = status(&mirror) {
            if let Some(m) = st.mirror {
                estimates.push(m.lag_ms * 1000);
                if m.state != "following" {
                    worst_state = m.state;
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
    }
    let took = t0.elapsed().as_secs_f64();
    let end_version = status(&primary)?.version;

    // the mirror catches up; then its apply times cover the whole storm
    let caught = Instant::now();
    let after = loop {
        let st = status(&mirror)?;
        if st.version >= end_version {
            break st;
        }
        if caught.elapsed() > Duration::from_secs(60) {
            bail!(
                "the mirror did not reach version {end_version} within 60 s (at {})",
                st.version
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let m = after.mirror.context("the mirror sent no mirror state")?;
    let mut est = estimates;
    let q = |v: &mut Vec<u64>, p: f64| strait_mirror::lag::quantile(v, p);
    Ok(Storm {
        ops: done.load(Ordering::Relaxed),
        took_s: took,
        errors: errors.load(Ordering::Relaxed),
        versions: (start_version, end_version),
        apply_lag: (
            m.apply_lag_samples,
            m.apply_lag_p50_us,
            m.apply_lag_p99_us,
            m.apply_lag_max_us,
        ),
        estimate: (
            est.len(),
            q(&mut est, 0.5),
            q(&mut est, 0.99),
            q(&mut est, 1.0),
        ),
        source: m.source,
        worst_state,
        state: m.state,
    })
}
