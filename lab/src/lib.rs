//! A Jepsen-style harness for strait (`strait-lab chaos run`): it starts a two-region cluster on
//! this machine (the primary and replicator nodes 1–2 in region A; node 3 and a mirror in
//! region B; a Garage S3 server per region; every link between the regions, and between the
//! primary and the replicator, through a fault proxy), drives a workload at both regions'
//! FUSE mounts ([`workload`]), injects a seeded schedule of faults ([`nemesis`]), records
//! every call with its invoke and completion times and outcome, heals everything, and checks
//! the history ([`check`]):
//!
//! 1. no acknowledged write is lost (every client's files, read at the primary after the heal,
//!    are a state its history allows);
//! 2. a mount's reads of a register never go back;
//! 3. read-your-writes: every read a client makes of its own files, at either region, is a
//!    state its history allows (a write applied twice, a stale read at the writer's own
//!    mount, a clean error that no state explains, ENOENT where the name exists, all fail
//!    it);
//! 4. a read at the mirror started more than the window (plus one link round trip and the
//!    kernel's attribute cache) after a write at the primary was acknowledged sees it (while
//!    a `switchover` has the primary in region B, the same bound holds region A's reads of
//!    B's writes);
//! 5. every byte read is a byte some write wrote ([`payload`]);
//! 6. after the heal, `strait fsck --compare` agrees within 30 s and the mirror's mount reads
//!    every client's files as the primary's does;
//! 7. after checker 6, `strait gc` with a grace of 0 against both regions' stores (the
//!    workload has stopped and every upload finished) leaves no object unreferenced (a dry
//!    run afterwards counts none), and every client's files read the same at both mounts as
//!    before the GC;
//! 11. each client's directory quota (fewer inodes than the names it uses: creates and clones
//!     are refused with EDQUOT now and then) is never exceeded at either region, its usage is
//!     what its listing counts and what a recount finds;
//! 12. after the GC, the trash at each region holds an entry for every unlink and rmdir that
//!     succeeded, and every file in it reads as bytes its client wrote.
//!
//! The clients also clone their files (`strait clone`, through the virtual xattr), which the
//! models of checkers 1, 3 and 6 follow: a clone's bytes are its source's when it was taken.
//!
//! Besides the cluster's own processes and links, the nemesis reaches a region's FUSE mount
//! (killed and mounted again), its object store (an HTTP fault proxy in front of Garage,
//! [`s3proxy`]), a daemon's or a mount's disk (a small loop-mounted file system it fills,
//! [`disk`]) and a daemon's wall clock (libfaketime, [`clock`]); each is set up only when its
//! kind is chosen. Power loss (a FUSE layer that drops unsynced writes) is not built yet.

pub mod check;
pub mod clock;
pub mod disk;
pub mod interrupt;
pub mod lazyfs;
pub mod locks;
pub mod model;
pub mod nemesis;
pub mod payload;
pub mod s3proxy;
pub mod workload;

/// deploy/README.md's installation rehearsed in network namespaces (`strait-lab netns`).
pub mod netns;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use strait_devkit::cluster::{Cluster, ClusterConfig, FaultHooks, S3Front};

use crate::check::{Bounds, Tally, CHECKERS};
use crate::nemesis::{Fault, Instruments, Nemesis, Scheduled};
use crate::s3proxy::S3Proxy;
use crate::workload::{Client, History, MountState, Region};

/// Size of each small file system of `disk-full` (sparse files: only what is written takes
/// room; a fault's filler is `fallocate`d, which writes no data), and of a Garage's. A Garage
/// holds the live blocks, the dead ones until the primary's GC deletes them (the harness's
/// [`GC_DELAY_S`], a 60 s grace for the mirror, a pass every 30 s), and Garage keeps a
/// deleted block's file 10 minutes more: with the workload's few MiB/s, about 3 GiB at any
/// time however long the run.
const DISK_MIB: u64 = 256;
const GARAGE_DISK_MIB: u64 = 6144;
/// The file system's `--gc-delay`: short, so that dead slices' blocks are deleted during the
/// run, under the faults, and the stores do not grow with the run's length.
const GC_DELAY_S: u64 = 60;
/// A mount's disk cache when it lives on such a file system: well under its size, so that
/// only the fault fills it.
const DISK_CACHE_SIZE: &str = "64M";

/// What a run does; written to DIR/run.json so that `--replay DIR` can run it again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunConfig {
    pub seed: u64,
    pub seconds: u64,
    /// Fault kinds ([`nemesis::KINDS`]).
    pub nemesis: Vec<String>,
    /// Writing clients per region.
    pub clients: u32,
    /// Clients per region that only read the writers' registers.
    #[serde(default)]
    pub readers: u32,
    /// Lock holders per region, each a process of its own ([`locks`], checker 9).
    #[serde(default)]
    pub lockers: u32,
    /// The primary's durability: `local` or `replicated`.
    pub durability: String,
    /// The mirror's policy outside its window (`forward`, `wait`, `serve`) and the window.
    pub policy: String,
    pub window_ms: u64,
    /// One-way delay between the regions, ms.
    pub delay_ms: u64,
    /// A Garage per region (otherwise a directory per region).
    pub garage: bool,
    /// One store for both regions (region A's).
    #[serde(default)]
    pub shared_store: bool,
    /// The mirror's block copy: `eager` or `lazy`.
    #[serde(default = "eager")]
    pub sync: String,
    /// The file system's GC delay, s ([`GC_DELAY_S`] by default); below it GC runs fast in
    /// every region (a pass a second, the mirrors' grace the same delay).
    #[serde(default = "gc_delay_default")]
    pub gc_delay_s: u64,
    /// Where the cluster, its logs and the history go.
    pub dir: PathBuf,
    /// The `strait` program.
    pub strait_bin: PathBuf,
    /// Only the schedule, from a replayed run; otherwise computed from the seed.
    #[serde(default)]
    pub schedule: Option<Vec<Scheduled>>,
}

fn eager() -> String {
    "eager".into()
}

fn gc_delay_default() -> u64 {
    GC_DELAY_S
}

/// The arguments that make GC fast for a run whose GC delay is `delay_s` (none at the
/// default): for the primary, and for a mirror once promoted.
fn fast_gc(delay_s: u64) -> (Vec<String>, Vec<String>) {
    if delay_s >= GC_DELAY_S {
        return (vec![], vec![]);
    }
    let grace_ms = (delay_s * 1000).to_string();
    (
        vec![
            "--gc-interval-s".into(),
            "1".into(),
            "--gc-mirror-grace-ms".into(),
            grace_ms.clone(),
        ],
        vec![
            "--promotion-gc-interval-s".into(),
            "1".into(),
            "--promotion-gc-mirror-grace-ms".into(),
            grace_ms,
        ],
    )
}

/// What a run found.
pub struct Report {
    pub tally: Tally,
    pub operations: usize,
    pub faults: Vec<(Scheduled, Option<String>)>,
    pub unknown: usize,
    pub failed: usize,
    /// Changes made on a mount whose process was dead, and clean errors on one being killed
    /// (they changed nothing).
    pub not_run: usize,
    /// More lines for the summary: what the object-store proxies did, how the workload fared
    /// after the last fault.
    pub notes: Vec<String>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.tally.violations.is_empty()
    }
}

fn wait_visible(p: &Path, within: Duration) -> Result<()> {
    let start = Instant::now();
    while !p.exists() {
        if start.elapsed() > within {
            bail!("{} did not appear within {within:?}", p.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Run the harness; `say` gets progress lines.
pub fn run(cfg: &RunConfig, say: &mut dyn FnMut(&str)) -> Result<Report> {
    if cfg.clients == 0 {
        bail!("--clients must be at least 1");
    }
    if cfg.nemesis.iter().any(|k| k == "failover") && cfg.durability != "replicated" {
        bail!(
            "--nemesis failover needs --durability replicated: in local durability a primary \
             lost with its region takes the changes it had not shipped with it (`strait \
             primary rejoin` lists them), which checker 1 would count as lost"
        );
    }
    let schedule = match &cfg.schedule {
        Some(s) => s.clone(),
        None => nemesis::schedule(cfg.seed, cfg.seconds, &cfg.nemesis, cfg.garage),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start a runtime for the fault proxies")?;
    let cluster_dir = cfg.dir.join("cluster");
    let chosen = |k: &str| cfg.nemesis.iter().any(|n| n == k);
    let mut hooks = FaultHooks::default();
    let mut instruments = Instruments::default();
    let mut mount_args = vec![];
    // the object-store proxies, by region, as the cluster makes them
    type Made = parking_lot::Mutex<Vec<(usize, Arc<S3Proxy>)>>;
    let s3_made: Arc<Made> = Default::default();
    if chosen("object-store") && cfg.garage {
        let (made, handle) = (s3_made.clone(), rt.handle().clone());
        // each region's proxy draws from a stream of its own, given by the run's seed
        let proxy_seed = cfg.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        hooks.s3_front = Some(S3Front(Arc::new(move |region, garage| {
            let listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
            let seed = proxy_seed ^ (region as u64 + 1);
            let p = Arc::new(handle.block_on(S3Proxy::start(listen, garage, seed))?);
            let addr = p.addr();
            made.lock().push((region, p));
            Ok(addr)
        })));
    }
    if chosen("disk-full") {
        disk::available().context("--nemesis disk-full")?;
        let dir = cfg.dir.join("disks");
        for name in nemesis::DISKS {
            if name.starts_with("garage") && !cfg.garage {
                continue;
            }
            let mib = if name.starts_with("garage") {
                GARAGE_DISK_MIB
            } else {
                DISK_MIB
            };
            say(&format!("a {mib} MiB loop-mounted ext4 for {name}"));
            let d = disk::LoopDisk::create(&dir.join(format!("{name}.img")), &dir.join(name), mib)
                .with_context(|| format!("make {name}'s disk"))?;
            instruments.disks.push((name.to_string(), d));
        }
        let under = |name: &str, sub: &str| {
            instruments
                .disks
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, d)| d.point().join(sub))
        };
        hooks.meta_dirs = [under("primary", "meta"), under("mirror", "meta")];
        hooks.cache_dirs = [under("mount-a", "cache"), under("mount-b", "cache")];
        hooks.garage_data_dirs = [under("garage-a", "garage"), under("garage-b", "garage")];
        mount_args.extend(["--cache-size".to_string(), DISK_CACHE_SIZE.to_string()]);
    }
    if chosen("power-loss") {
        // the daemon's RocksDB directory through the layer, over where it would have been
        // (on its loop disk under `disk-full`)
        for (i, name) in nemesis::POWERED.into_iter().enumerate() {
            let top = cfg.dir.join("lazyfs").join(name);
            let on_disk = hooks.meta_dirs.get(i).cloned().flatten();
            let backing = match on_disk {
                Some(d) => d.with_file_name("lazy"),
                None => top.join("backing"),
            };
            say(&format!(
                "{name}'s data directory through a power-loss layer"
            ));
            let l = lazyfs::LazyFs::mount(&backing, &top.join("point"))
                .with_context(|| format!("--nemesis power-loss: {name}'s layer"))?;
            let data = Some(l.point().join("data"));
            match i {
                0 | 1 => hooks.meta_dirs[i] = data,
                _ => hooks.replicator_dirs[i - 2] = data,
            }
            instruments.lazy.push((name.to_string(), l));
        }
    }
    if chosen("power-loss") && !cfg.garage {
        // each region's `file://` store through a layer of its own, its root the layer's
        // (a store's sync fsyncs its root, which the layer takes for a syncfs)
        for (i, name) in nemesis::STORES.into_iter().enumerate() {
            if i == 1 && cfg.shared_store {
                continue; // region B uses region A's
            }
            let top = cfg.dir.join("lazyfs").join(name);
            say(&format!("{name} (a directory) through a power-loss layer"));
            let l = lazyfs::LazyFs::mount(&top.join("backing"), &top.join("point"))
                .with_context(|| format!("--nemesis power-loss: {name}'s layer"))?;
            hooks.store_dirs[i] = Some(l.point().to_path_buf());
            instruments.lazy.push((name.to_string(), l));
        }
    }
    if chosen("clock-jump") {
        for name in nemesis::CLOCKS {
            let c = clock::FakeClock::new(&cfg.dir.join(format!("clock-{name}")))
                .context("--nemesis clock-jump")?;
            hooks.daemon_env.push((name.to_string(), c.env()));
            instruments.clocks.push((name.to_string(), c));
        }
    }
    let ccfg = ClusterConfig {
        strait_bin: cfg.strait_bin.clone(),
        dir: cluster_dir.clone(),
        delay_ms: cfg.delay_ms,
        mount: true,
        window_ms: cfg.window_ms,
        policy: cfg.policy.clone(),
        source: "local".into(),
        sync: cfg.sync.clone(),
        garage: cfg.garage,
        link_mb_s: 0.0,
        primary_proxies: true,
        primary_args: [
            vec!["--durability".into(), cfg.durability.clone()],
            fast_gc(cfg.gc_delay_s).0,
        ]
        .concat(),
        // promoted (switchover, failover), the mirror commits as the primary does
        mirror_args: [
            vec!["--promotion-durability".into(), cfg.durability.clone()],
            fast_gc(cfg.gc_delay_s).1,
        ]
        .concat(),
        mount_args,
        format_args: vec!["--gc-delay".into(), cfg.gc_delay_s.to_string()],
        tls: false,
        // losing region A leaves a quorum only with a node in a third region
        witness: chosen("failover"),
        shared_store: cfg.shared_store,
        env: vec![],
        hooks,
    };
    say("starting the cluster (2 regions, 3 replicator nodes, proxies on every link)");
    let mut cluster = Cluster::start(&ccfg, &rt, &mut |s| say(s))?;
    let mounts: Vec<PathBuf> = [&cluster.topology().mount_a, &cluster.topology().mount_b]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    for m in &mounts {
        interrupt::detach_on_signal(m);
    }
    let mut made = std::mem::take(&mut *s3_made.lock());
    made.sort_by_key(|(region, _)| *region);
    instruments.s3 = made.into_iter().map(|(_, p)| p).collect();
    instruments.mounts = mounts
        .iter()
        .map(|_| Arc::new(MountState::default()))
        .collect();
    let nemesis = Nemesis::new(&cluster, instruments);
    let result = drive(cfg, &schedule, &mut cluster, &nemesis, say);
    for e in cluster.unmount() {
        say(&format!("unmount: {e:#}"));
    }
    for m in &mounts {
        interrupt::forget(m);
    }
    // the daemons stop before their disks are detached; their logs on those disks are kept
    drop(cluster);
    for (name, d) in &nemesis.instruments.disks {
        save_logs(d.point(), &cfg.dir.join("disk-logs").join(name));
    }
    drop(nemesis);
    result
}

/// Copy the logs under `from` (RocksDB's `LOG*`, `garage.log`) to `to`, keeping their paths.
fn save_logs(from: &Path, to: &Path) {
    let Ok(entries) = std::fs::read_dir(from) else {
        return;
    };
    for e in entries.flatten() {
        let (p, name) = (e.path(), e.file_name().to_string_lossy().into_owned());
        if p.is_dir() {
            save_logs(&p, &to.join(&name));
        } else if name.starts_with("LOG") || name.ends_with(".log") {
            let _ = std::fs::create_dir_all(to);
            let _ = std::fs::copy(&p, to.join(&name));
        }
    }
}

fn drive(
    cfg: &RunConfig,
    schedule: &[Scheduled],
    cluster: &mut Cluster,
    nemesis: &Nemesis,
    say: &mut dyn FnMut(&str),
) -> Result<Report> {
    let topo = cluster.topology().clone();
    let (Some(ma), Some(mb)) = (topo.mount_a.clone(), topo.mount_b.clone()) else {
        bail!("the cluster started without mounts");
    };
    let n = cfg.clients * 2;
    let all = n + cfg.readers * 2;
    for id in 0..n {
        let d = workload::dir_of(&ma, id);
        std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
        // a directory quota below the names a client uses (checker 11)
        set_xattr(
            &d,
            "strait.quota.max_files",
            check::QUOTA_FILES.to_string().as_bytes(),
        )
        .with_context(|| format!("set the quota of {}", d.display()))?;
    }
    wait_visible(&workload::dir_of(&mb, n - 1), Duration::from_secs(60))?;
    // each region's lock file, for its lock holders (locks exclude within a region)
    let lock_file = |mount: &Path, r: &str| mount.join("chaos").join(format!("lock-{r}"));
    if cfg.lockers > 0 {
        for r in ["a", "b"] {
            std::fs::write(lock_file(&ma, r), vec![b'.'; 64])
                .with_context(|| format!("create the lock file of region {r}"))?;
        }
        wait_visible(&lock_file(&mb, "b"), Duration::from_secs(60))?;
    }

    let state_of = |region: Region| {
        let i = if region == Region::A { 0 } else { 1 };
        nemesis.instruments.mounts[i].clone()
    };
    let history = Arc::new(History::default());
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut threads = vec![];
    for id in 0..all {
        let a = if id < n {
            id < cfg.clients
        } else {
            id - n < cfg.readers
        };
        let (region, mount) = if a {
            (Region::A, ma.clone())
        } else {
            (Region::B, mb.clone())
        };
        let c = Client {
            id,
            region,
            mount,
            clients: n,
            reader: id >= n,
            seed: cfg.seed,
            mount_state: state_of(region),
        };
        let (h, s) = (history.clone(), stop.clone());
        threads.push(
            std::thread::Builder::new()
                .name(format!("client-{id}"))
                .spawn(move || c.run(&h, start, s))
                .context("start a client")?,
        );
    }
    // the lock holders: processes of their own, their holds in a file each
    let lab = std::env::current_exe().context("this program's path")?;
    let mut holders = vec![];
    for i in 0..cfg.lockers * 2 {
        let (region, mount, r) = if i < cfg.lockers {
            (Region::A, &ma, "a")
        } else {
            (Region::B, &mb, "b")
        };
        let out = cfg.dir.join(format!("locks-{i}.jsonl"));
        // this program (`strait-lab`), as a lock holder
        let mut cmd = std::process::Command::new(&lab);
        cmd.args(["chaos", "lock-client", "--file"])
            .arg(lock_file(mount, r))
            .args(["--client", &i.to_string()])
            .args(["--seconds", &cfg.seconds.to_string()])
            .args(["--seed", &cfg.seed.to_string()])
            .stdout(std::fs::File::create(&out).context("a lock holder's output")?)
            .stderr(std::process::Stdio::null());
        let child = strait_devkit::process::spawn_tied(cmd).context("start a lock holder")?;
        holders.push((region, out, child));
    }
    say(&format!(
        "workload: {n} writers, {} readers and {} lock holders for {} s, {} faults scheduled",
        all - n,
        holders.len(),
        cfg.seconds,
        schedule.len()
    ));
    let mut faults = vec![];
    let mut last_heal_ms = 0;
    // when the primary was in region B (the checkers bound region A's reads as a mirror's)
    let mut swapped: Vec<(u64, u64)> = vec![];
    let mut swapped_since: Option<u64> = None;
    for s in schedule {
        sleep_until(start, s.at_ms);
        let began = start.elapsed();
        if matches!(s.fault, Fault::Switchover | Fault::Failover) {
            swapped_since.get_or_insert(began.as_millis() as u64);
        }
        let (note, err) = match nemesis.inject(cluster, &s.fault) {
            Ok(note) => (note, None),
            Err(e) => (None, Some(e)),
        };
        say(&format!(
            "{:>6.1} s  {:?} for {:.1} s{}{}{}",
            began.as_secs_f64(),
            s.fault,
            s.hold_ms as f64 / 1000.0,
            note.map(|n| format!(": {n}")).unwrap_or_default(),
            slow(start.elapsed() - began),
            err.as_ref()
                .map(|e| format!(" (failed: {e:#})"))
                .unwrap_or_default()
        ));
        sleep_until(start, s.at_ms + s.hold_ms);
        let began = start.elapsed();
        let healed = nemesis.heal(cluster, &s.fault);
        let took = start.elapsed() - began;
        last_heal_ms = start.elapsed().as_millis() as u64;
        if let (Fault::Switchover | Fault::Failover, Ok(_), Some(from)) =
            (&s.fault, &healed, swapped_since)
        {
            swapped.push((from, last_heal_ms));
            swapped_since = None;
        }
        let healed = match healed {
            Ok(note) => {
                if note.is_some() || took > SLOW_STEP {
                    say(&format!(
                        "    healed{}{}",
                        slow(took),
                        note.map(|n| format!(": {n}")).unwrap_or_default()
                    ));
                }
                None
            }
            Err(e) => {
                say(&format!("    heal failed{}: {e:#}", slow(took)));
                Some(e)
            }
        };
        faults.push((s.clone(), err.or(healed).map(|e| format!("{e:#}"))));
    }
    sleep_until(start, cfg.seconds * 1000);
    stop.store(true, Ordering::Relaxed);
    for e in nemesis.heal_all(cluster) {
        say(&format!("heal: {e}"));
    }
    if let Some(from) = swapped_since {
        swapped.push((from, start.elapsed().as_millis() as u64));
    }
    // clients finish their last call; one stuck long after the heal is a liveness failure
    let mut tally = Tally::default();
    let deadline = Instant::now() + Duration::from_secs(120);
    for (id, t) in threads.into_iter().enumerate() {
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        if !t.is_finished() {
            tally.violated(
                3,
                format!("client c{id} is still in a call 120 s after the final heal"),
                vec![],
            );
        } else if t.join().is_err() {
            bail!("client c{id} panicked");
        }
    }
    let events = history.snapshot();
    say(&format!("{} operations recorded; checking", events.len()));
    // 9: the lock holders' holds (they stop by themselves at the end of the workload)
    let mut holds = vec![];
    for (region, out, mut child) in holders {
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        if child.try_wait().ok().flatten().is_none() {
            let _ = child.kill();
            let _ = child.wait();
            tally.violated(
                9,
                format!("a lock holder of {region:?} was still in a call 60 s after the end"),
                vec![],
            );
        }
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        for line in text.lines() {
            match serde_json::from_str::<locks::Hold>(line) {
                Ok(h) => holds.push((region, h)),
                Err(e) => bail!("a lock holder wrote {line:?}: {e}"),
            }
        }
    }
    check::locks_exclude(&holds, &mut tally);

    let mut models = check::replay(&events, &mut tally);
    let max_delay = schedule
        .iter()
        .filter_map(|s| match s.fault {
            Fault::Latency(ms) => Some(ms),
            _ => None,
        })
        .max()
        .unwrap_or(0)
        .max(cfg.delay_ms);
    // attribute/entry cache of a mount (strait mount's default, 1 s) and a margin
    let attr_ms = 1_000 + 200;
    let bounds = Bounds {
        mirror_bounded: cfg.policy != "serve",
        mirror_ms: cfg.window_ms + 2 * max_delay + attr_ms,
        other_mount_ms: attr_ms,
        swapped,
    };
    check::registers(&events, bounds, &mut tally);

    // 1: the final state at the primary, once its mount's kernel caches no longer hold an
    // entry or attributes older than a write acknowledged at the other mount (up to 1 s): a
    // register renamed over at B just before the end read as its previous file at A
    std::thread::sleep(Duration::from_millis(1_500));
    let mut before_gc = vec![];
    let reader = |region, id| Client {
        id,
        region,
        mount: if region == Region::A {
            ma.clone()
        } else {
            mb.clone()
        },
        clients: n,
        reader: false,
        seed: 0,
        mount_state: state_of(region),
    };
    for id in 0..n {
        for name in workload::NAMES {
            let (_, _, observed) = reader(Region::A, id).read_own(name);
            before_gc.push((Region::A, id, name, observed.clone()));
            check::final_read(
                &mut models,
                check::FinalRead {
                    client: id,
                    name,
                    region: Region::A,
                    checker: 1,
                },
                &observed,
                &mut tally,
                &events,
            );
        }
    }
    // 6: the mirror converges, then reads as the primary does
    say("waiting for the mirror to agree with the primary (fsck --compare, 30 s)");
    let agreed = converge(cfg, &topo.primary, &topo.mirror, &topo.admin_token);
    tally.checked[6] += 1;
    if let Err(e) = agreed {
        tally.violated(
            6,
            format!("no agreement 30 s after the heal: {e:#}"),
            vec![],
        );
    }
    // the mount's kernel caches hold attributes for up to 1 s
    std::thread::sleep(Duration::from_millis(1_500));
    for id in 0..n {
        for name in workload::NAMES {
            let (_, _, observed) = reader(Region::B, id).read_own(name);
            before_gc.push((Region::B, id, name, observed.clone()));
            check::final_read(
                &mut models,
                check::FinalRead {
                    client: id,
                    name,
                    region: Region::B,
                    checker: 6,
                },
                &observed,
                &mut tally,
                &events,
            );
        }
    }
    // 7: GC leaves no orphan object in either region's store, and takes no referenced one
    say("collecting garbage in both regions' stores (grace 0), then counting what is left");
    for (region, addr) in [("A", &topo.primary), ("B", &topo.mirror)] {
        if region == "B" && cfg.shared_store {
            // one store: the primary swept it; the mirror must refuse to
            mirror_refuses_a_shared_store(cfg, addr, &topo.admin_token, &mut tally, say);
            continue;
        }
        no_orphans_after_gc(cfg, region, addr, &topo.admin_token, &mut tally, say);
    }
    std::thread::sleep(Duration::from_millis(1_500));
    for (region, id, name, before) in &before_gc {
        if before.is_none() {
            continue; // unreadable before the GC already: checkers 1 and 6 said so
        }
        let (_, _, after) = reader(*region, *id).read_own(name);
        tally.checked[7] += 1;
        if after != *before {
            tally.violated(
                7,
                format!(
                    "c{id}'s {name} at {region:?} read {after:?} after the GC, {before:?} before"
                ),
                vec![],
            );
        }
    }
    // 11: each client's quota holds at both regions, its usage what the listing counts, and
    // a recount at the primary finds what is kept
    for id in 0..n {
        let mut used = vec![];
        for (region, mount) in [(Region::A, &ma), (Region::B, &mb)] {
            let d = workload::dir_of(mount, id);
            let names = std::fs::read_dir(&d)
                .map(|rd| rd.count())
                .unwrap_or(usize::MAX);
            let quota = get_xattr(&d, "strait.quota").map_err(|e| format!("{e:#}"));
            used.push(check::quota_holds((region, id), quota, names, &mut tally));
        }
        tally.checked[11] += 1;
        if used[0] != used[1] {
            tally.violated(
                11,
                format!("c{id}'s quota usage differs between the regions: {used:?}"),
                vec![],
            );
        }
        let d = workload::dir_of(&ma, id);
        match get_xattr(&d, "strait.quota.check") {
            Ok(t) if t.starts_with("consistent") => {}
            other => tally.violated(
                11,
                format!("c{id}'s quota recount at the primary: {other:?}"),
                vec![],
            ),
        }
    }
    // 12: the trash, after the GC, holds what the clients removed, readable, at both regions
    for (region, mount) in [(Region::A, &ma), (Region::B, &mb)] {
        match trash_entries(mount, n) {
            Ok(entries) => check::trash_kept(&events, region, &entries, &mut tally),
            Err(e) => tally.violated(12, format!("list the trash at {region:?}: {e:#}"), vec![]),
        }
    }
    // 8: no read outside the faults (and a settling time after each) failed with EIO: a
    // block some history still references was never deleted nor lost
    let windows: Vec<(u64, u64)> = faults
        .iter()
        .map(|(s, _)| (s.at_ms, s.at_ms + s.hold_ms))
        .collect();
    check::no_block_lost(&events, &windows, &mut tally);
    // 10: no change was applied twice: no request id was committed twice in either region's
    // history
    for (region, metrics) in [("A", &topo.primary_metrics), ("B", &topo.mirror_metrics)] {
        tally.checked[10] += 1;
        match applied_twice(metrics) {
            Ok(0) => {}
            Ok(n) => tally.violated(
                10,
                format!(
                    "region {region}'s history holds {n} changes committed under a request id \
                     another change had committed under (strait_requests_applied_twice)"
                ),
                vec![],
            ),
            Err(e) => tally.violated(
                10,
                format!("read region {region}'s strait_requests_applied_twice: {e:#}"),
                vec![],
            ),
        }
    }
    let unknown = events
        .iter()
        .filter(|e| e.outcome == model::Outcome::Unknown)
        .count();
    let failed = events
        .iter()
        .filter(|e| e.outcome == model::Outcome::Failed)
        .count();
    let not_run = events
        .iter()
        .filter(|e| e.outcome == model::Outcome::NotRun)
        .count();
    write_history(&cfg.dir, &events)?;
    let mut notes = nemesis.instruments.s3_stats();
    notes.push(after_the_faults(last_heal_ms, &events));
    Ok(Report {
        tally,
        operations: events.len(),
        faults,
        unknown,
        failed,
        not_run,
        notes,
    })
}

/// setxattr(2) of a virtual `strait.*` xattr through a mount.
fn set_xattr(p: &Path, name: &str, value: &[u8]) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let (path, name) = (
        std::ffi::CString::new(p.as_os_str().as_bytes())?,
        std::ffi::CString::new(name)?,
    );
    // SAFETY: NUL-terminated strings and a value slice with its length, live across the call
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// getxattr(2) of a virtual `strait.*` xattr through a mount, as text.
fn get_xattr(p: &Path, name: &str) -> Result<String> {
    use std::os::unix::ffi::OsStrExt;
    let (path, cname) = (
        std::ffi::CString::new(p.as_os_str().as_bytes())?,
        std::ffi::CString::new(name)?,
    );
    let mut buf = vec![0u8; 1 << 16];
    // SAFETY: NUL-terminated strings; the buffer is writable for its length
    let r = unsafe {
        libc::getxattr(
            path.as_ptr(),
            cname.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if r < 0 {
        return Err(anyhow::Error::from(std::io::Error::last_os_error())
            .context(format!("getxattr {name} of {}", p.display())));
    }
    buf.truncate(r as usize);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The entries of a mount's `/.trash` that the `n` clients' directories held, per client: the
/// name each had, and what reading it gave (a file's runs, or bytes its client did not write).
fn trash_entries(
    mount: &Path,
    n: u32,
) -> Result<std::collections::BTreeMap<u32, Vec<(String, workload::Observed)>>> {
    use std::os::unix::fs::MetadataExt;
    let mut client_of = std::collections::HashMap::new();
    for id in 0..n {
        let d = workload::dir_of(mount, id);
        client_of.insert(std::fs::metadata(&d)?.ino(), id);
    }
    let mut out: std::collections::BTreeMap<u32, Vec<_>> = Default::default();
    let trash = mount.join(".trash");
    for e in std::fs::read_dir(&trash).with_context(|| format!("list {}", trash.display()))? {
        let e = e?;
        let full = e.file_name().to_string_lossy().into_owned();
        let mut parts = full.splitn(3, '-');
        let (Some(parent), Some(_), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Some(&client) = parent.parse::<u64>().ok().and_then(|p| client_of.get(&p)) else {
            continue;
        };
        let seen = match std::fs::read(e.path()) {
            Ok(bytes) => match payload::decode(&bytes) {
                Ok(recs) => match model::runs_of(&recs, client) {
                    Some(r) => workload::Observed::Node(model::Node::File(r)),
                    None => {
                        workload::Observed::Garbage("records written by another client".to_string())
                    }
                },
                Err(g) => workload::Observed::Garbage(g.to_string()),
            },
            Err(err) if err.raw_os_error() == Some(libc::EISDIR) => {
                workload::Observed::Node(model::Node::Dir)
            }
            Err(err) => workload::Observed::Garbage(format!("nothing readable: {err}")),
        };
        out.entry(client)
            .or_default()
            .push((name.to_string(), seen));
    }
    Ok(out)
}

/// An injection or a heal that takes longer is reported: the faults after it fire late.
const SLOW_STEP: Duration = Duration::from_secs(1);

fn slow(took: Duration) -> String {
    if took > SLOW_STEP {
        format!(" (took {:.1} s)", took.as_secs_f64())
    } else {
        String::new()
    }
}

/// How the writers fared once the last fault was healed: a daemon that never recovered from
/// a fault shows here (no checker fails when every change is refused).
fn after_the_faults(healed_ms: u64, events: &[workload::Event]) -> String {
    let mut s = format!(
        "changes begun after the last fault was healed ({:.1} s):",
        healed_ms as f64 / 1000.0
    );
    for region in [Region::A, Region::B] {
        let (mut ok, mut clean, mut unknown) = (0, 0, 0);
        for e in events.iter().filter(|e| {
            e.region == region
                && e.invoke_ms >= healed_ms
                && matches!(e.op, workload::Op::Mutate { .. })
        }) {
            match e.outcome {
                model::Outcome::Ok => ok += 1,
                model::Outcome::Failed => clean += 1,
                model::Outcome::Unknown | model::Outcome::NotRun => unknown += 1,
            }
        }
        s.push_str(&format!(
            " {region:?} {ok} succeeded, {clean} failed cleanly, {unknown} other errors;"
        ));
    }
    s.pop();
    s
}

fn sleep_until(start: Instant, ms: u64) {
    let at = start + Duration::from_millis(ms);
    let now = Instant::now();
    if at > now {
        std::thread::sleep(at - now);
    }
}

fn converge(cfg: &RunConfig, primary: &str, mirror: &str, token: &str) -> Result<()> {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < Duration::from_secs(30) {
        match strait_devkit::cluster::run_strait(
            &cfg.strait_bin,
            &[],
            &[
                "fsck",
                "--compare",
                primary,
                mirror,
                "--token",
                token,
                "--timeout-ms",
                "10000",
                "--digest",
            ],
        ) {
            Ok(out) if out.starts_with("match") => return Ok(()),
            Ok(out) => last = Some(anyhow::anyhow!("{}", out.trim())),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no comparison finished")))
}

/// Checker 7 for one region's store: `strait gc` with a grace of 0 through its site daemon,
/// then a dry run, which must find no object unreferenced.
/// `strait_requests_applied_twice` on the daemon whose metrics listen at `addr`.
fn applied_twice(addr: &str) -> Result<u64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let line = text
        .lines()
        .find(|l| l.starts_with("strait_requests_applied_twice "))
        .with_context(|| format!("{addr}/metrics has no strait_requests_applied_twice"))?;
    let v: f64 = line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("read {line:?}"))?;
    Ok(v as u64)
}

/// Checker 7 with one store for both regions: the primary swept it; the mirror must refuse
/// (its metadata is behind the primary's: its sweep would delete what the primary committed
/// since), and say so.
fn mirror_refuses_a_shared_store(
    cfg: &RunConfig,
    addr: &str,
    token: &str,
    tally: &mut Tally,
    say: &mut dyn FnMut(&str),
) {
    tally.checked[7] += 1;
    match gc(cfg, &format!("strait://{addr}"), token, true) {
        Err(e) if format!("{e:#}").contains("also the primary's") => {
            say("region B's mirror refuses to sweep the store it shares with the primary")
        }
        Err(e) => tally.violated(
            7,
            format!("the mirror's sweep of the shared store failed otherwise: {e:#}"),
            vec![],
        ),
        Ok(r) => tally.violated(
            7,
            format!(
                "the mirror swept the store it shares with the primary ({} objects listed)",
                r.listed
            ),
            vec![],
        ),
    }
}

fn no_orphans_after_gc(
    cfg: &RunConfig,
    region: &str,
    addr: &str,
    token: &str,
    tally: &mut Tally,
    say: &mut dyn FnMut(&str),
) {
    let url = format!("strait://{addr}");
    tally.checked[7] += 1;
    // a mirror sweeps only while it follows within its window: after the faults it may need
    // a moment (a subscription being made again)
    let started = Instant::now();
    let swept = loop {
        let r = gc(cfg, &url, token, false);
        match &r {
            Err(e)
                if format!("{e:#}").contains("sweeps only while it follows")
                    && started.elapsed() < Duration::from_secs(30) =>
            {
                std::thread::sleep(Duration::from_millis(500))
            }
            _ => break r,
        }
    };
    match &swept {
        Ok(r) => say(&format!(
            "region {region}'s store {}: {} objects, {} orphans ({} bytes) deleted, {} failed",
            r.store, r.listed, r.deleted, r.deleted_bytes, r.failed
        )),
        Err(e) => {
            tally.violated(7, format!("GC of region {region}'s store: {e:#}"), vec![]);
            return;
        }
    }
    match gc(cfg, &url, token, true) {
        Ok(r) if r.orphans + r.young == 0 => {}
        Ok(r) => tally.violated(
            7,
            format!(
                "{} objects ({} bytes) of region {region}'s store {} are unreferenced after GC",
                r.orphans + r.young,
                r.orphan_bytes + r.young_bytes,
                r.store
            ),
            vec![],
        ),
        Err(e) => tally.violated(
            7,
            format!("count the orphans of region {region}'s store after GC: {e:#}"),
            vec![],
        ),
    }
}

/// What `strait gc --json` printed about a sweep.
#[derive(Debug, Deserialize)]
struct Swept {
    store: String,
    listed: u64,
    young: u64,
    young_bytes: u64,
    orphans: u64,
    orphan_bytes: u64,
    deleted: u64,
    deleted_bytes: u64,
    failed: u64,
}

fn gc(cfg: &RunConfig, url: &str, token: &str, dry_run: bool) -> Result<Swept> {
    let mut args = vec!["gc", url, "--token", token, "--orphan-grace", "0", "--json"];
    if dry_run {
        args.push("--dry-run");
    }
    let out = strait_devkit::cluster::run_strait(&cfg.strait_bin, &[], &args)?;
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("strait gc {url} printed no result: {out}"))?;
    serde_json::from_str(line).with_context(|| format!("strait gc {url} printed {line}"))
}

fn write_history(dir: &Path, events: &[workload::Event]) -> Result<()> {
    use std::io::Write;
    let p = dir.join("history.jsonl");
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(&p).with_context(|| format!("create {}", p.display()))?,
    );
    for e in events {
        serde_json::to_writer(&mut f, e)?;
        writeln!(f)?;
    }
    f.flush()?;
    Ok(())
}

/// The summary table of a run.
pub fn summary(r: &Report) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{} operations ({} failed cleanly, {} with unknown outcome{}), {} faults\n",
        r.operations,
        r.failed,
        r.unknown,
        if r.not_run > 0 {
            format!(
                ", {} changes on a dead or dying mount changed nothing",
                r.not_run
            )
        } else {
            String::new()
        },
        r.faults.len()
    ));
    s.push_str(&format!(
        "{:<3} {:<40} {:>9} {:>10}\n",
        "#", "checker", "checked", "violations"
    ));
    for (i, name) in CHECKERS.iter().enumerate().skip(1) {
        let checked = r.tally.checked[i].to_string();
        s.push_str(&format!(
            "{i:<3} {name:<40} {checked:>9} {:>10}\n",
            r.tally.count(i)
        ));
    }
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    for (f, _) in &r.faults {
        let k = format!("{:?}", f.fault);
        let k = k.split(['(', ' ']).next().unwrap_or("").to_string();
        *kinds.entry(k).or_default() += 1;
    }
    s.push_str("faults fired:");
    for (k, n) in kinds {
        s.push_str(&format!(" {k}×{n}"));
    }
    s.push('\n');
    for n in &r.notes {
        s.push_str(n);
        s.push('\n');
    }
    s
}
