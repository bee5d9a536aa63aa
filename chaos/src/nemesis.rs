//! The nemesis: a seeded schedule of faults, and the code that injects and heals them on a
//! running [`Cluster`].
//!
//! The schedule is a pure function of the seed, the run's length and the kinds allowed, so a
//! seed replays the same faults at the same offsets (the workload's timing, and with it the
//! exact interleaving, still varies from run to run).

use std::time::Duration;

use anyhow::{bail, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use strait_devkit::cluster::Cluster;
use strait_devkit::Faults;

/// The kinds of fault, as `--nemesis` names them.
pub const KINDS: [&str; 10] = [
    "kill",
    "stop",
    "partition",
    "partition-one-way",
    "partition-mirror-primary",
    "partition-replication",
    "partition-primary-replicator",
    "latency",
    "bandwidth",
    "stop-garage",
];

/// Processes a kill or a stop may hit.
pub const TARGETS: [&str; 5] = [
    "primary",
    "mirror",
    "replicator1",
    "replicator2",
    "replicator3",
];

/// One fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fault {
    /// SIGKILL a daemon; it is started again when the fault ends.
    Kill(String),
    /// SIGSTOP a daemon; SIGCONT when the fault ends.
    Stop(String),
    /// Nothing crosses between the regions.
    Partition,
    /// Bytes from region A to region B (`a_to_b`) or the other way are dropped.
    PartitionOneWay { a_to_b: bool },
    /// The mirror cannot reach the primary (forwarded calls), while replication flows.
    PartitionMirrorPrimary,
    /// Region B's replicator node and the mirror are cut off from region A's nodes (the
    /// mirror falls behind), while the mirror still reaches the primary.
    PartitionReplication,
    /// The primary cannot reach any replicator node.
    PartitionPrimaryReplicator,
    /// The link's one-way delay rises to this many ms.
    Latency(u64),
    /// The link's bandwidth falls to 50 kB/s.
    Bandwidth,
    /// SIGSTOP a region's Garage (0: A, 1: B).
    StopGarage(usize),
}

/// A fault and when it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scheduled {
    pub at_ms: u64,
    pub hold_ms: u64,
    pub fault: Fault,
}

/// Check `--nemesis` names.
pub fn parse_kinds(list: &str) -> Result<Vec<String>> {
    let mut out = vec![];
    for k in list.split(',').map(str::trim).filter(|k| !k.is_empty()) {
        if k == "all" {
            out.extend(KINDS.iter().map(|k| k.to_string()));
        } else if k == "none" {
        } else if KINDS.contains(&k) {
            out.push(k.to_string());
        } else {
            bail!(
                "unknown nemesis {k:?}: expected all, none or some of {}",
                KINDS.join(", ")
            );
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The faults of a run of `seconds`: one at a time, the first after 3 s of quiet, each held
/// 1–6 s, 1–4 s apart, the last healed at least 5 s before the end.
pub fn schedule(seed: u64, seconds: u64, kinds: &[String], garage: bool) -> Vec<Scheduled> {
    let kinds: Vec<&String> = kinds
        .iter()
        .filter(|k| garage || k.as_str() != "stop-garage")
        .collect();
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6e656d65);
    let mut out = vec![];
    if kinds.is_empty() {
        return out;
    }
    let end = seconds.saturating_mul(1000).saturating_sub(5_000);
    let mut t = 3_000;
    loop {
        let hold = rng.random_range(1_000..6_000);
        if t + hold > end {
            break;
        }
        let target = |rng: &mut StdRng| TARGETS[rng.random_range(0..TARGETS.len())].to_string();
        let fault = match kinds[rng.random_range(0..kinds.len())].as_str() {
            "kill" => Fault::Kill(target(&mut rng)),
            "stop" => Fault::Stop(target(&mut rng)),
            "partition" => Fault::Partition,
            "partition-one-way" => Fault::PartitionOneWay {
                a_to_b: rng.random_bool(0.5),
            },
            "partition-mirror-primary" => Fault::PartitionMirrorPrimary,
            "partition-replication" => Fault::PartitionReplication,
            "partition-primary-replicator" => Fault::PartitionPrimaryReplicator,
            "latency" => Fault::Latency(rng.random_range(100..500)),
            "bandwidth" => Fault::Bandwidth,
            _ => Fault::StopGarage(rng.random_range(0..2)),
        };
        out.push(Scheduled {
            at_ms: t,
            hold_ms: hold,
            fault,
        });
        t += hold + rng.random_range(1_000..4_000);
    }
    out
}

/// Injects and heals faults, remembering each proxy's faults from before the run.
pub struct Nemesis {
    baseline: Vec<(String, Faults)>,
}

fn crosses(name: &str) -> bool {
    !name.starts_with("primary-to-")
}

/// Whether bytes going `up` (client to server) through proxy `name` travel from A to B.
fn up_is_a_to_b(name: &str) -> bool {
    name.starts_with("a-to-")
}

impl Nemesis {
    pub fn new(c: &Cluster) -> Self {
        Nemesis {
            baseline: c
                .proxies()
                .iter()
                .map(|(n, p)| (n.clone(), p.faults()))
                .collect(),
        }
    }

    fn each_proxy(&self, c: &Cluster, pick: impl Fn(&str) -> bool, f: impl Fn(&str, &mut Faults)) {
        for (n, p) in c.proxies() {
            if pick(n) {
                p.update(|x| f(n, x));
            }
        }
    }

    pub fn inject(&self, c: &mut Cluster, fault: &Fault) -> Result<()> {
        match fault {
            Fault::Kill(name) => c.signal(name, libc::SIGKILL)?,
            Fault::Stop(name) => c.signal(name, libc::SIGSTOP)?,
            Fault::Partition => self.each_proxy(c, crosses, |_, f| {
                f.up.blackhole = true;
                f.down.blackhole = true;
            }),
            Fault::PartitionOneWay { a_to_b } => self.each_proxy(c, crosses, |n, f| {
                // the direction of the proxy that carries A → B bytes
                if up_is_a_to_b(n) == *a_to_b {
                    f.up.blackhole = true;
                } else {
                    f.down.blackhole = true;
                }
            }),
            Fault::PartitionMirrorPrimary => self.each_proxy(
                c,
                |n| n == "b-to-primary",
                |_, f| {
                    f.up.blackhole = true;
                    f.down.blackhole = true;
                },
            ),
            Fault::PartitionReplication => self.each_proxy(
                c,
                |n| n.contains("-to-replicator") && !n.starts_with("primary-to-"),
                |_, f| {
                    f.up.blackhole = true;
                    f.down.blackhole = true;
                },
            ),
            Fault::PartitionPrimaryReplicator => self.each_proxy(
                c,
                |n| n.starts_with("primary-to-"),
                |_, f| {
                    f.up.blackhole = true;
                    f.down.blackhole = true;
                },
            ),
            Fault::Latency(ms) => self.each_proxy(c, crosses, |_, f| {
                f.up.latency = Duration::from_millis(*ms);
                f.down.latency = Duration::from_millis(*ms);
            }),
            Fault::Bandwidth => self.each_proxy(c, crosses, |_, f| {
                f.up.bandwidth = Some(50_000);
                f.down.bandwidth = Some(50_000);
            }),
            Fault::StopGarage(i) => {
                if let Some(pid) = c.garage_pids().get(*i) {
                    // SAFETY: kill has no memory effects
                    unsafe { libc::kill(*pid as i32, libc::SIGSTOP) };
                }
            }
        }
        Ok(())
    }

    pub fn heal(&self, c: &mut Cluster, fault: &Fault) -> Result<()> {
        match fault {
            Fault::Kill(name) => c.restart(name, Some(Duration::from_secs(120)))?,
            Fault::Stop(name) => c.signal(name, libc::SIGCONT)?,
            Fault::StopGarage(i) => {
                if let Some(pid) = c.garage_pids().get(*i) {
                    // SAFETY: kill has no memory effects
                    unsafe { libc::kill(*pid as i32, libc::SIGCONT) };
                }
            }
            _ => self.restore_links(c),
        }
        Ok(())
    }

    /// Every proxy back to its faults from before the run.
    pub fn restore_links(&self, c: &Cluster) {
        for (n, p) in c.proxies() {
            if let Some((_, f)) = self.baseline.iter().find(|(b, _)| b == n) {
                p.set(*f);
            }
        }
    }

    /// End every fault: links restored, stopped processes continued, exited daemons started.
    pub fn heal_all(&self, c: &mut Cluster) -> Vec<String> {
        let mut errors = vec![];
        self.restore_links(c);
        for pid in c.garage_pids() {
            // SAFETY: kill has no memory effects
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
        for name in c.daemons() {
            let _ = c.signal(&name, libc::SIGCONT);
            match c.exited(&name) {
                Ok(true) => {
                    if let Err(e) = c.restart(&name, Some(Duration::from_secs(120))) {
                        errors.push(format!("restart {name}: {e:#}"));
                    }
                }
                Ok(false) => {}
                Err(e) => errors.push(format!("{name}: {e:#}")),
            }
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_schedule_within_the_run() {
        let all = parse_kinds("all").unwrap();
        let a = schedule(7, 120, &all, true);
        assert_eq!(a, schedule(7, 120, &all, true));
        assert_ne!(a, schedule(8, 120, &all, true));
        assert!(a.len() >= 10, "{} faults in 120 s", a.len());
        let mut end = 0;
        for s in &a {
            assert!(s.at_ms >= end, "faults overlap: {a:?}");
            end = s.at_ms + s.hold_ms;
        }
        assert!(end <= 115_000);
        // without Garage, no Garage faults
        assert!(schedule(7, 600, &all, false)
            .iter()
            .all(|s| !matches!(s.fault, Fault::StopGarage(_))));
    }

    #[test]
    fn nemesis_names_are_checked() {
        assert_eq!(parse_kinds("kill, stop").unwrap(), vec!["kill", "stop"]);
        assert!(parse_kinds("none").unwrap().is_empty());
        assert!(parse_kinds("kill,fire").is_err());
    }
}
