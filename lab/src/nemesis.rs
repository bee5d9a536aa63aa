//! The nemesis: a seeded schedule of faults, and the code that injects and heals them on a
//! running [`Cluster`].
//!
//! The schedule is a pure function of the seed, the run's length and the kinds allowed, so a
//! seed replays the same faults at the same offsets (the workload's timing, and with it the
//! exact interleaving, still varies from run to run).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use strait_devkit::cluster::Cluster;
use strait_devkit::Faults;

use crate::clock::FakeClock;
use crate::disk::LoopDisk;
use crate::lazyfs::LazyFs;
use crate::s3proxy::{S3Faults, S3Mode, S3Proxy};
use crate::workload::MountState;

/// The kinds of fault, as `--nemesis` names them.
pub const KINDS: [&str; 20] = [
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
    "kill-mount",
    "stop-mount",
    "kill-garage",
    "object-store",
    "disk-full",
    "clock-jump",
    "power-loss",
    "switchover",
    "failover",
    "gc",
];

/// What a `disk-full` fault may fill: the primary's or the mirror's metadata directory
/// (RocksDB), region A's or B's mount's disk cache, or region A's or B's Garage (its
/// metadata and blocks).
pub const DISKS: [&str; 6] = [
    "primary", "mirror", "mount-a", "mount-b", "garage-a", "garage-b",
];

/// Whose wall clock a `clock-jump` steps.
pub const CLOCKS: [&str; 2] = ["primary", "mirror"];

/// Whose data directory a `power-loss` loses the unsynced bytes of: the primary's and the
/// mirror's RocksDB, and each replicator node's (its Raft log, vote and state machine).
pub const POWERED: [&str; 5] = [
    "primary",
    "mirror",
    "replicator1",
    "replicator2",
    "replicator3",
];

/// What a `power-loss` may hit: one daemon of [`POWERED`], or a whole region at once (region
/// A: the primary and replicator nodes 1 and 2, a quorum; region B: the mirror and node 3).
pub const POWER_TARGETS: [&str; 7] = [
    "primary",
    "mirror",
    "replicator1",
    "replicator2",
    "replicator3",
    "region-a",
    "region-b",
];

/// The daemons a `power-loss` of `target` ([`POWER_TARGETS`]) hits.
fn powered_by(target: &str) -> Vec<&str> {
    match target {
        "region-a" => vec!["primary", "replicator1", "replicator2"],
        "region-b" => vec!["mirror", "replicator3"],
        one => vec![one],
    }
}

/// The `file://` object stores under a power-loss layer of their own (with `--store dir`),
/// by region (A, then B). A store loses its power with its whole region, the region's mount
/// with it (then mounted again at the heal).
pub const STORES: [&str; 2] = ["store-a", "store-b"];

/// The region (0: A, 1: B) whose store a `power-loss` of `target` hits, if a whole region.
fn region_of(target: &str) -> Option<usize> {
    match target {
        "region-a" => Some(0),
        "region-b" => Some(1),
        _ => None,
    }
}

/// Kinds that need a Garage per region (`--store garage`).
const GARAGE_KINDS: [&str; 3] = ["stop-garage", "kill-garage", "object-store"];

/// How long a killed mount process may take to be gone.
const MOUNT_EXIT_MS_MAX: u64 = 10_000;
/// How long a SIGKILLed daemon may take to be gone.
const DAEMON_EXIT_MS_MAX: u64 = 300_000;
/// A step of an injection that takes longer is named in its note.
const SLOW_STEP_MS: u64 = 1_000;

fn note_slow(notes: &mut Vec<String>, what: &str, since: Instant) {
    let took = since.elapsed();
    if took > Duration::from_millis(SLOW_STEP_MS) {
        notes.push(format!("{what} took {:.1} s", took.as_secs_f64()));
    }
}

/// How long the clients of a dead mount may take to leave it before it is mounted again.
const MOUNT_GATE_MS_MAX: u64 = 60_000;

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
    /// SIGKILL the process serving a region's FUSE mount (0: A, 1: B); when the fault ends,
    /// the dead mount point is detached and mounted again with the same command.
    KillMount(usize),
    /// SIGSTOP the process serving a region's FUSE mount (0: A, 1: B); SIGCONT when the
    /// fault ends (its clients' calls wait meanwhile, as the kernel holds them).
    StopMount(usize),
    /// SIGKILL a region's Garage (0: A, 1: B); it is started again on its data when the
    /// fault ends.
    KillGarage(usize),
    /// `percent` of the requests to a region's object store are spoilt by `mode` (the fault
    /// proxy in front of its Garage, [`crate::s3proxy`]).
    ObjectStore {
        region: usize,
        mode: S3Mode,
        percent: u32,
    },
    /// The small file system under one of [`DISKS`] is filled to the last block; the filler
    /// is deleted when the fault ends. With `restart` (the primary's and the mirror's only),
    /// the daemon is also SIGKILLed and started again on the full disk: RocksDB preallocates
    /// its write-ahead log, so a daemon that runs on takes no new space for a long while.
    DiskFull { target: String, restart: bool },
    /// One daemon's wall clock ([`CLOCKS`]) steps by `offset_s` seconds, and back to the
    /// machine's when the fault ends.
    ClockJump { target: String, offset_s: i64 },
    /// A daemon's ([`POWERED`]) power fails: it is SIGKILLed and every byte of its data
    /// directory not synced since it was written is lost ([`crate::lazyfs`]); it is started
    /// again when the fault ends.
    PowerLoss(String),
    /// The primary moves to region B (a planned switchover: B's mirror promoted, A's old
    /// primary rejoined and serving as B's mirror at its own address), and back when the
    /// fault ends ([`Cluster::switch_to_b`], [`Cluster::switch_back_to_a`]).
    Switchover,
    /// Region A is lost (its primary, replicator node 1 and mount SIGKILLed) and region B's
    /// mirror promoted; when the fault ends region A rejoins as B's mirror, its mount is
    /// mounted again, and the primary is switched back to A ([`Cluster::lose_region_a`],
    /// [`Cluster::region_a_rejoins`]). Runs with the witness placement (replicator node 2 in a
    /// third region) and `replicated` durability.
    Failover,
    /// `strait gc` (the dead slices' pass, then an orphan sweep with a grace of a minute) at
    /// the site daemons of both regions, whatever they are then (a primary, a mirror, one
    /// fenced or handing over): each deletes only what no history still needs, or refuses.
    Gc,
}

/// The grace of the `gc` nemesis's orphan sweeps: far above the time between a block's
/// upload and its commit under the other faults (a mount stopped for at most 6 s).
pub const GC_NEMESIS_GRACE: &str = "60s";

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
        .filter(|k| garage || !GARAGE_KINDS.contains(&k.as_str()))
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
            "kill-mount" => Fault::KillMount(rng.random_range(0..2)),
            "stop-mount" => Fault::StopMount(rng.random_range(0..2)),
            "kill-garage" => Fault::KillGarage(rng.random_range(0..2)),
            "object-store" => Fault::ObjectStore {
                region: rng.random_range(0..2),
                mode: S3Mode::ALL[rng.random_range(0..S3Mode::ALL.len())],
                percent: rng.random_range(20..=80),
            },
            "disk-full" => {
                let disks: Vec<&str> = DISKS
                    .into_iter()
                    .filter(|d| garage || !d.starts_with("garage"))
                    .collect();
                let target = disks[rng.random_range(0..disks.len())];
                let daemon = target == "primary" || target == "mirror";
                Fault::DiskFull {
                    target: target.to_string(),
                    restart: daemon && rng.random_bool(0.5),
                }
            }
            "clock-jump" => {
                let s = rng.random_range(1..=10) * 60;
                Fault::ClockJump {
                    target: CLOCKS[rng.random_range(0..CLOCKS.len())].to_string(),
                    offset_s: if rng.random_bool(0.5) { s } else { -s },
                }
            }
            "power-loss" => Fault::PowerLoss(
                POWER_TARGETS[rng.random_range(0..POWER_TARGETS.len())].to_string(),
            ),
            "switchover" => Fault::Switchover,
            "failover" => Fault::Failover,
            "gc" => Fault::Gc,
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

/// What the nemesis reaches besides the cluster's daemons and link proxies; each part is
/// there only when a kind that needs it was chosen (see [`crate::run`]).
#[derive(Default)]
pub struct Instruments {
    /// Each region's mount as the clients use it (A, then B).
    pub mounts: Vec<Arc<MountState>>,
    /// The fault proxy in front of each region's Garage (A, then B).
    pub s3: Vec<Arc<S3Proxy>>,
    /// The small file systems of `disk-full`, by the names of [`DISKS`].
    pub disks: Vec<(String, LoopDisk)>,
    /// The steered clocks of `clock-jump`, by the names of [`CLOCKS`].
    pub clocks: Vec<(String, FakeClock)>,
    /// The power-loss layers under the data directories of `power-loss`, by the names of
    /// [`POWERED`].
    pub lazy: Vec<(String, LazyFs)>,
}

impl Instruments {
    fn disk(&self, name: &str) -> Result<&LoopDisk> {
        self.disks
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, d)| d)
            .with_context(|| format!("no loop disk {name:?} in this run"))
    }

    fn clock(&self, name: &str) -> Result<&FakeClock> {
        self.clocks
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c)
            .with_context(|| format!("{name} does not run under libfaketime in this run"))
    }

    /// The power-loss layer under region `region`'s store, if it has one.
    fn store_layer(&self, region: usize) -> Option<&LazyFs> {
        let name = STORES.get(region)?;
        self.lazy.iter().find(|(n, _)| n == name).map(|(_, l)| l)
    }

    fn lazy(&self, name: &str) -> Result<&LazyFs> {
        self.lazy
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, l)| l)
            .with_context(|| format!("{name}'s data is not under a power-loss layer in this run"))
    }

    fn s3(&self, region: usize) -> Result<&S3Proxy> {
        self.s3
            .get(region)
            .map(|p| p.as_ref())
            .with_context(|| format!("no object-store proxy in region {region} in this run"))
    }

    /// One line per object-store proxy: what it did to the requests.
    pub fn s3_stats(&self) -> Vec<String> {
        self.s3
            .iter()
            .enumerate()
            .map(|(i, p)| {
                format!(
                    "object-store proxy {}: {}",
                    ["A", "B"].get(i).unwrap_or(&"?"),
                    p.stats()
                )
            })
            .collect()
    }
}

/// Start region `i`'s Garage again if it exited (Garage 2.5.0 exits when its disk fills).
fn restart_exited_garage(c: &mut Cluster, i: usize) -> Result<Option<String>> {
    let Some(status) = c.garage_exited(i) else {
        return Ok(None);
    };
    let region = ["A", "B"].get(i).unwrap_or(&"?");
    c.restart_garage(i)
        .with_context(|| format!("start region {region}'s Garage again"))?;
    Ok(Some(format!(
        "region {region}'s Garage had exited ({status}); started again"
    )))
}

/// Poll `gone` every 10 ms until it holds; an error naming `what` after `max_ms`.
fn wait_gone(what: &str, max_ms: u64, mut gone: impl FnMut() -> Result<bool>) -> Result<()> {
    let t = Instant::now();
    while !gone()? {
        if t.elapsed() > Duration::from_millis(max_ms) {
            bail!("{what} still runs {max_ms} ms after SIGKILL");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// SIGKILL daemon `target` and wait until it is gone.
fn kill_and_wait(c: &mut Cluster, target: &str) -> Result<()> {
    c.signal(target, libc::SIGKILL)?;
    wait_gone(target, DAEMON_EXIT_MS_MAX, || c.exited(target))
}

/// The `gc` nemesis: `strait gc` at the site daemon of each region, a line on what each did
/// (or why it refused: a mirror not following, a store a primary uses too, a fenced primary).
fn collect_everywhere(c: &Cluster) -> String {
    let t = c.topology();
    let mut lines = vec![];
    for (region, addr) in [("A", &t.primary), ("B", &t.mirror)] {
        let out = std::process::Command::new(c.strait_bin())
            .args(["gc", &format!("strait://{addr}"), "--token", &t.admin_token])
            .args(["--orphan-grace", GC_NEMESIS_GRACE, "--json"])
            .output();
        let said = match out {
            Ok(o) => {
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
                let last = text
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("");
                let cut: String = last.chars().take(200).collect();
                if o.status.success() {
                    format!("ran: {cut}")
                } else {
                    format!("refused: {cut}")
                }
            }
            Err(e) => format!("could not run strait gc: {e}"),
        };
        lines.push(format!("{region} {said}"));
    }
    lines.join("; ")
}

/// Injects and heals faults, remembering each proxy's faults from before the run.
pub struct Nemesis {
    baseline: Vec<(String, Faults)>,
    pub instruments: Instruments,
}

fn crosses(name: &str) -> bool {
    !name.starts_with("primary-to-")
}

/// Whether bytes going `up` (client to server) through proxy `name` travel from A to B.
fn up_is_a_to_b(name: &str) -> bool {
    name.starts_with("a-to-")
}

impl Nemesis {
    pub fn new(c: &Cluster, instruments: Instruments) -> Self {
        Nemesis {
            baseline: c
                .proxies()
                .iter()
                .map(|(n, p)| (n.clone(), p.faults()))
                .collect(),
            instruments,
        }
    }

    fn mount_state(&self, region: usize) -> Result<&MountState> {
        self.instruments
            .mounts
            .get(region)
            .map(|m| m.as_ref())
            .with_context(|| format!("no mount in region {region}"))
    }

    /// SIGKILL region `region`'s mount process and wait until it is gone; from then on a
    /// call that finds the mount dead never reached it ([`MountState::dead`]).
    fn kill_mount(&self, c: &mut Cluster, region: usize) -> Result<()> {
        self.mount_state(region)?
            .dying
            .store(true, Ordering::SeqCst);
        c.signal_mount(region, libc::SIGKILL)?;
        wait_gone(
            &format!("the mount process of region {region}"),
            MOUNT_EXIT_MS_MAX,
            || Ok(!c.mount_runs(region)?),
        )?;
        self.mount_state(region)?.dead.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Mount region `region` again, once no client is inside a call on it (its calls on the
    /// dead mount end at once with ENOTCONN), so that no client ever works in the empty
    /// directory under the mount point between the unmount and the mount.
    fn remount(&self, c: &mut Cluster, region: usize) -> Result<()> {
        let st = self.mount_state(region)?;
        let _gate = st
            .gate
            .try_write_for(Duration::from_millis(MOUNT_GATE_MS_MAX))
            .with_context(|| {
                format!("the clients of region {region} stayed in calls on its dead mount for {MOUNT_GATE_MS_MAX} ms")
            })?;
        c.remount(region)?;
        st.dead.store(false, Ordering::SeqCst);
        st.dying.store(false, Ordering::SeqCst);
        Ok(())
    }

    fn each_proxy(&self, c: &Cluster, pick: impl Fn(&str) -> bool, f: impl Fn(&str, &mut Faults)) {
        for (n, p) in c.proxies() {
            if pick(n) {
                p.update(|x| f(n, x));
            }
        }
    }

    /// Start `fault`; a line about what it did, for some kinds.
    pub fn inject(&self, c: &mut Cluster, fault: &Fault) -> Result<Option<String>> {
        match fault {
            Fault::Kill(name) => c.signal(name, libc::SIGKILL)?,
            Fault::Stop(name) => c.signal(name, libc::SIGSTOP)?,
            Fault::Gc => return Ok(Some(collect_everywhere(c))),
            Fault::Switchover => return Ok(Some(c.switch_to_b()?)),
            Fault::Failover => {
                self.kill_mount(c, 0)?;
                return Ok(Some(c.lose_region_a()?));
            }
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
            Fault::KillMount(region) => self.kill_mount(c, *region)?,
            Fault::StopMount(region) => c.signal_mount(*region, libc::SIGSTOP)?,
            Fault::KillGarage(i) => {
                let pid = *c
                    .garage_pids()
                    .get(*i)
                    .with_context(|| format!("no Garage in region {i}"))?;
                // SAFETY: kill has no memory effects
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                wait_gone(&format!("region {i}'s Garage"), DAEMON_EXIT_MS_MAX, || {
                    Ok(c.garage_exited(*i).is_some())
                })?;
            }
            Fault::ObjectStore {
                region,
                mode,
                percent,
            } => self.instruments.s3(*region)?.set(S3Faults {
                mode: Some(*mode),
                percent: *percent,
            }),
            Fault::DiskFull { target, restart } => {
                // each step timed: a daemon once took a minute to be done with (docs/chaos.md)
                let mut slow = vec![];
                let t = Instant::now();
                let filled = self.instruments.disk(target)?.fill()?;
                note_slow(&mut slow, "the fill", t);
                if *restart {
                    let t = Instant::now();
                    kill_and_wait(c, target)?;
                    note_slow(&mut slow, &format!("{target}'s exit after SIGKILL"), t);
                    let t = Instant::now();
                    c.restart(target, None)?;
                    note_slow(&mut slow, "its start", t);
                }
                return Ok(Some(format!(
                    "{target}'s disk filled to ENOSPC with {} MiB{}{}",
                    filled >> 20,
                    if *restart {
                        ", and it was restarted"
                    } else {
                        ""
                    },
                    if slow.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", slow.join(", "))
                    }
                )));
            }
            Fault::ClockJump { target, offset_s } => {
                self.instruments.clock(target)?.set_offset_s(*offset_s)?
            }
            Fault::PowerLoss(target) => {
                let hit = powered_by(target);
                let layers = hit
                    .iter()
                    .map(|d| self.instruments.lazy(d))
                    .collect::<Result<Vec<_>>>()?;
                // a whole region's store goes with it, and so does its mount
                let store =
                    region_of(target).and_then(|r| Some((r, self.instruments.store_layer(r)?)));
                if let Some((r, _)) = store {
                    self.kill_mount(c, r)?;
                }
                // every daemon of a region dies before any of them is waited for
                for d in &hit {
                    c.signal(d, libc::SIGKILL)?;
                }
                let mut lines = vec![];
                for (d, layer) in hit.iter().zip(layers) {
                    kill_and_wait(c, d)?;
                    let lost = layer
                        .power_loss()
                        .with_context(|| format!("{d}'s power loss"))?;
                    lines.push(format!(
                        "{d}: {} files put back to their last sync ({} bytes written back, {} cut)",
                        lost.files, lost.bytes_restored, lost.bytes_cut
                    ));
                }
                if let Some((r, layer)) = store {
                    // region A's store is written by the mirror too (its forwarded writes'
                    // blocks): it waits while the store is put back
                    let pause = r == 0 && !c.exited("mirror")?;
                    if pause {
                        c.signal("mirror", libc::SIGSTOP)?;
                    }
                    let lost = layer.power_loss();
                    if pause {
                        c.signal("mirror", libc::SIGCONT)?;
                    }
                    let lost = lost.with_context(|| format!("{}'s power loss", STORES[r]))?;
                    lines.push(format!(
                        "{}: {} files put back to their last sync ({} bytes written back, {} \
                         cut), the region's mount killed",
                        STORES[r], lost.files, lost.bytes_restored, lost.bytes_cut
                    ));
                }
                return Ok(Some(format!(
                    "{target} lost its power: {}",
                    lines.join("; ")
                )));
            }
        }
        Ok(None)
    }

    /// End `fault`; a line about what it found, for some kinds.
    pub fn heal(&self, c: &mut Cluster, fault: &Fault) -> Result<Option<String>> {
        match fault {
            Fault::Kill(name) => c.restart(name, Some(Duration::from_secs(120)))?,
            Fault::Switchover => return Ok(Some(c.switch_back_to_a()?)),
            Fault::Failover => {
                let rejoined = c.region_a_rejoins()?;
                self.remount(c, 0)?;
                let back = c.switch_back_to_a()?;
                return Ok(Some(format!("{rejoined}; {back}")));
            }
            Fault::PowerLoss(target) => {
                // the replicator nodes first: a primary may wait for them before it serves
                for d in powered_by(target).into_iter().rev() {
                    c.restart(d, Some(Duration::from_secs(120)))?
                }
                if let Some(r) =
                    region_of(target).filter(|&r| self.instruments.store_layer(r).is_some())
                {
                    self.remount(c, r)?;
                }
            }
            Fault::Gc => {}
            Fault::Stop(name) => c.signal(name, libc::SIGCONT)?,
            Fault::StopGarage(i) => {
                if let Some(pid) = c.garage_pids().get(*i) {
                    // SAFETY: kill has no memory effects
                    unsafe { libc::kill(*pid as i32, libc::SIGCONT) };
                }
            }
            Fault::KillMount(region) => self.remount(c, *region)?,
            Fault::StopMount(region) => c.signal_mount(*region, libc::SIGCONT)?,
            Fault::KillGarage(i) => return restart_exited_garage(c, *i),
            Fault::ObjectStore { region, .. } => {
                self.instruments.s3(*region)?.set(S3Faults::default())
            }
            Fault::DiskFull { target, restart } => {
                self.instruments.disk(target)?.unfill()?;
                // a daemon that could not start on the full disk starts now
                if *restart && c.exited(target)? {
                    c.restart(target, Some(Duration::from_secs(120)))?;
                    return Ok(Some(format!("{target} had exited; started again")));
                }
                if let Some(i) = ["garage-a", "garage-b"].iter().position(|g| g == target) {
                    return restart_exited_garage(c, i);
                }
            }
            Fault::ClockJump { target, .. } => self.instruments.clock(target)?.set_offset_s(0)?,
            Fault::Partition
            | Fault::PartitionOneWay { .. }
            | Fault::PartitionMirrorPrimary
            | Fault::PartitionReplication
            | Fault::PartitionPrimaryReplicator
            | Fault::Latency(_)
            | Fault::Bandwidth => self.restore_links(c),
        }
        Ok(None)
    }

    /// Every proxy back to its faults from before the run.
    pub fn restore_links(&self, c: &Cluster) {
        for (n, p) in c.proxies() {
            if let Some((_, f)) = self.baseline.iter().find(|(b, _)| b == n) {
                p.set(*f);
            }
        }
    }

    /// End every fault: links restored, object stores passing every request, disks emptied of
    /// their fillers, clocks back to the machine's, stopped processes continued, exited
    /// daemons started, dead mounts mounted again.
    pub fn heal_all(&self, c: &mut Cluster) -> Vec<String> {
        let mut errors = vec![];
        self.restore_links(c);
        for p in &self.instruments.s3 {
            p.set(S3Faults::default());
        }
        for (name, d) in &self.instruments.disks {
            if let Err(e) = d.unfill() {
                errors.push(format!("empty {name}'s disk: {e:#}"));
            }
        }
        for (name, clock) in &self.instruments.clocks {
            if let Err(e) = clock.set_offset_s(0) {
                errors.push(format!("{name}'s clock: {e:#}"));
            }
        }
        for pid in c.garage_pids() {
            // SAFETY: kill has no memory effects
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
        for region in 0..2 {
            // a dead mount is mounted again below
            let _ = c.signal_mount(region, libc::SIGCONT);
        }
        for i in 0..c.garage_pids().len() {
            match restart_exited_garage(c, i) {
                Ok(None) => {}
                Ok(Some(note)) => errors.push(note),
                Err(e) => errors.push(format!("{e:#}")),
            }
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
        // the primary back in region A, where the checkers look for it
        match c.primary_in_b() {
            Ok(false) => {}
            Ok(true) => {
                if let Err(e) = c.switch_back_to_a() {
                    errors.push(format!("switch the primary back to region A: {e:#}"));
                }
            }
            Err(e) => errors.push(format!("{e:#}")),
        }
        for region in 0..self.instruments.mounts.len() {
            match c.mount_runs(region) {
                Ok(true) => {}
                Ok(false) => {
                    if let Err(e) = self.remount(c, region) {
                        errors.push(format!("mount region {region} again: {e:#}"));
                    }
                }
                Err(e) => errors.push(format!("mount of region {region}: {e:#}")),
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
            .all(|s| match &s.fault {
                Fault::StopGarage(_) | Fault::KillGarage(_) | Fault::ObjectStore { .. } => false,
                Fault::DiskFull { target, .. } => !target.starts_with("garage"),
                _ => true,
            }));
        // every kind comes up in a long run, each within its bounds
        let long = schedule(3, 3_600, &all, true);
        for k in KINDS {
            let one = schedule(3, 600, &[k.to_string()], true);
            assert!(!one.is_empty(), "{k}: no fault in 600 s");
        }
        for s in &long {
            match &s.fault {
                Fault::ObjectStore {
                    region, percent, ..
                } => assert!(*region < 2 && (20..=80).contains(percent)),
                Fault::ClockJump { target, offset_s } => {
                    assert!(CLOCKS.contains(&target.as_str()));
                    assert!((60..=600).contains(&offset_s.abs()) && offset_s % 60 == 0);
                }
                Fault::DiskFull { target, restart } => {
                    assert!(DISKS.contains(&target.as_str()));
                    assert!(!restart || target == "primary" || target == "mirror");
                }
                Fault::KillMount(r) | Fault::StopMount(r) | Fault::KillGarage(r) => {
                    assert!(*r < 2)
                }
                Fault::PowerLoss(t) => assert!(POWER_TARGETS.contains(&t.as_str())),
                _ => {}
            }
        }
    }

    /// CI's short schedule (`scripts/test.sh`, `chaos_short`) keeps reproductions as
    /// regressions: adding a kind, or a target to a kind CI does not name, must not change
    /// what its seeds draw. The faults below are those CI ran on 2026-11-25 (at 0.1 s).
    #[test]
    fn cis_regression_schedules_stay_as_recorded() {
        let shown = |seed: u64, kinds: &str| -> Vec<(u64, u64, Fault)> {
            let kinds = parse_kinds(kinds).unwrap();
            schedule(seed, 40, &kinds, true)
                .into_iter()
                .map(|s| ((s.at_ms + 50) / 100, (s.hold_ms + 50) / 100, s.fault))
                .collect()
        };
        let ci_1 = "kill,stop,partition,partition-one-way,partition-mirror-primary,\
                    partition-replication,partition-primary-replicator,latency,bandwidth,stop-garage";
        assert_eq!(
            shown(1, ci_1),
            vec![
                (30, 34, Fault::Stop("replicator2".into())),
                (90, 43, Fault::Bandwidth),
                (169, 41, Fault::PartitionMirrorPrimary),
                (248, 23, Fault::Stop("mirror".into())),
                (288, 45, Fault::Bandwidth),
            ]
        );
        assert_eq!(
            shown(4, "partition-replication,partition-mirror-primary"),
            vec![
                (30, 52, Fault::PartitionReplication),
                (118, 42, Fault::PartitionReplication),
                (185, 35, Fault::PartitionReplication),
                (258, 59, Fault::PartitionMirrorPrimary),
            ]
        );
    }

    #[test]
    fn nemesis_names_are_checked() {
        assert_eq!(parse_kinds("kill, stop").unwrap(), vec!["kill", "stop"]);
        assert_eq!(
            parse_kinds("disk-full,kill-mount").unwrap(),
            vec!["disk-full", "kill-mount"]
        );
        assert_eq!(parse_kinds("all").unwrap().len(), KINDS.len());
        assert!(parse_kinds("none").unwrap().is_empty());
        assert!(parse_kinds("kill,fire").is_err());
    }
}
