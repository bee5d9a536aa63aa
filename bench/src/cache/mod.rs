//! `strait bench cache`: the block cache ([`BlockCache`]: a hand-written memory LRU in front
//! of a bounded disk cache) against the crates that could replace it, `moka` and `foyer`,
//! on the same reads in the same run (docs/benchmarks/cache.md).
//!
//! Readers ask for blocks of one size from a working set larger than the memory tier (a
//! Zipf distribution, [`workload::Workload`]), as the read path does: memory, then disk,
//! else a fetch (a buffer standing for a block from the object store) put into the cache,
//! which evicts. Every case (tier × block size × readers × cache) runs in a process of its own, so
//! its CPU time and resident memory are its own, and prints reads/s, latency p50/p99, the
//! hit ratio, CPU time per read and the growth of resident memory.
//!
//! The crates are compiled only with the cargo feature `bench-cache-crates`; without it the
//! command measures the hand-written cache alone.

mod candidates;
mod workload;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use strait_devkit::usage;
use strait_fs_core::vfs::BlockCache;

use candidates::{BenchCache, DiskTier, Found, HandWritten, Layered};
use workload::{CaseResult, Figures, Tally, Workload};

#[derive(clap::Args, Clone, Debug)]
pub struct CacheArgs {
    /// Seconds each case reads for, after a warm-up of twice as many reads as blocks.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Memory capacity of every cache (the mount's default is 256M).
    #[arg(long, default_value = "256M")]
    pub mem: String,
    /// Disk capacity in the memory+disk cases.
    #[arg(long, default_value = "512M")]
    pub disk: String,
    /// Bytes of distinct blocks the readers ask for: more than --mem (and --disk), so reads
    /// miss and the caches evict.
    #[arg(long, default_value = "1G")]
    pub working_set: String,
    /// Block sizes, each a set of cases.
    #[arg(long, default_value = "4M,64K", value_delimiter = ',')]
    pub sizes: Vec<String>,
    /// Reader threads, each a set of cases.
    #[arg(long, default_value = "1,2", value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Tiers: memory (memory only) and disk (memory in front of a disk cache).
    #[arg(long, value_enum, default_values_t = [Tier::Memory, Tier::Disk], value_delimiter = ',')]
    pub tiers: Vec<Tier>,
    /// Caches to compare (default: every one built; moka and foyer need the feature
    /// bench-cache-crates).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub caches: Vec<Kind>,
    /// The size of the regions foyer's disk engine writes and evicts whole (its default:
    /// 16M); every entry is aligned to 4 KiB in them.
    #[arg(long, default_value = "16M")]
    pub foyer_region: String,
    /// Skew of the reads: block i is read 1/(i+1)^zipf as often as the most read one.
    #[arg(long, default_value_t = 0.9)]
    pub zipf: f64,
    /// How many times the whole set of cases runs (the caches' order rotates each round).
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Seed of the reads (the same for every cache).
    #[arg(long, default_value_t = 20)]
    pub seed: u64,
    /// Where the disk caches go (default: the system's temporary directory); removed after
    /// each case.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Run one case, TIER/BLOCK_BYTES/THREADS/CACHE, here and print its result as JSON (the
    /// command starts itself so for each case).
    #[arg(long, hide = true)]
    pub case: Option<String>,
}

/// The tiers of a case.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Memory only.
    Memory,
    /// Memory in front of a disk cache.
    Disk,
}

/// A cache under comparison.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// strait's `BlockCache`.
    HandWritten,
    /// `moka::sync::Cache` (in front of the hand-written disk cache in the disk cases).
    Moka,
    /// `foyer::Cache`, and `foyer::HybridCache` in the disk cases.
    Foyer,
}

impl Kind {
    /// The caches this binary was built with.
    fn built() -> Vec<Kind> {
        if cfg!(feature = "bench-cache-crates") {
            vec![Kind::HandWritten, Kind::Moka, Kind::Foyer]
        } else {
            vec![Kind::HandWritten]
        }
    }
}

/// One case: which cache, which tiers, which block size, how many readers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Case {
    tier: Tier,
    block_bytes: u64,
    threads: usize,
    cache: Kind,
}

fn value_name<T: clap::ValueEnum>(v: &T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

impl Case {
    fn spec(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            value_name(&self.tier),
            self.block_bytes,
            self.threads,
            value_name(&self.cache)
        )
    }

    fn parse(spec: &str) -> Result<Case> {
        let parts: Vec<&str> = spec.split('/').collect();
        let [tier, block, threads, cache] = parts[..] else {
            bail!("case {spec:?}: expected TIER/BLOCK_BYTES/THREADS/CACHE");
        };
        fn enum_of<T: clap::ValueEnum>(spec: &str, s: &str) -> Result<T> {
            T::from_str(s, false).map_err(|e| anyhow::anyhow!("case {spec:?}: {e}"))
        }
        let case = Case {
            tier: enum_of(spec, tier)?,
            block_bytes: block
                .parse()
                .with_context(|| format!("case {spec:?}: block size"))?,
            threads: threads
                .parse()
                .with_context(|| format!("case {spec:?}: threads"))?,
            cache: enum_of(spec, cache)?,
        };
        if case.block_bytes == 0 || case.block_bytes > u32::MAX as u64 || case.threads == 0 {
            bail!("case {spec:?}: the block size and the threads must be positive");
        }
        Ok(case)
    }
}

/// The sizes every case shares.
struct Sizes {
    mem: u64,
    disk: u64,
    working_set: u64,
    foyer_region: u64,
}

impl Sizes {
    fn of(a: &CacheArgs) -> Result<Sizes> {
        let s = Sizes {
            mem: strait_ids::units::parse_size(&a.mem)?,
            disk: strait_ids::units::parse_size(&a.disk)?,
            working_set: strait_ids::units::parse_size(&a.working_set)?,
            foyer_region: strait_ids::units::parse_size(&a.foyer_region)?,
        };
        if s.working_set == 0 {
            bail!("--working-set must be positive");
        }
        Ok(s)
    }
}

pub fn run(a: CacheArgs) -> Result<()> {
    if !(a.seconds > 0.0 && a.seconds.is_finite()) {
        bail!("--seconds must be positive");
    }
    if !(a.zipf >= 0.0 && a.zipf.is_finite()) {
        bail!("--zipf must be 0 or more");
    }
    let sizes = Sizes::of(&a)?;
    if let Some(spec) = &a.case {
        let result = run_case(&a, &sizes, Case::parse(spec)?)?;
        println!("{}", serde_json::to_string(&result)?);
        return Ok(());
    }
    let caches = if a.caches.is_empty() {
        Kind::built()
    } else {
        a.caches.clone()
    };
    if let Some(c) = caches.iter().find(|c| !Kind::built().contains(c)) {
        bail!(
            "this strait was built without {}: build it with `--features bench-cache-crates`",
            value_name(c)
        );
    }
    let mut blocks = vec![];
    for s in &a.sizes {
        let b = strait_ids::units::parse_size(s)?;
        if b == 0 || b > u32::MAX as u64 {
            bail!("block size {s:?} must be positive and below 4 GiB");
        }
        blocks.push(b);
    }
    if a.threads.contains(&0) {
        bail!("--threads must be positive");
    }
    let human = strait_ids::units::human_bytes;
    println!(
        "block cache benchmark: memory {}, disk {}, working set {} (Zipf {}), {} s per case \
         after a warm-up; each case in its own process; this machine has {} CPUs, shared with \
         whatever else runs (the last column: how busy other processes kept them)",
        human(sizes.mem),
        human(sizes.disk),
        human(sizes.working_set),
        a.zipf,
        a.seconds,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    if caches.contains(&Kind::Foyer) && a.tiers.contains(&Tier::Disk) {
        println!(
            "  foyer's disk engine: regions of {}",
            human(sizes.foyer_region)
        );
    }
    for &b in &blocks {
        // what a cache holding exactly the most read blocks would hit: the hit ratio's ceiling
        let count = (sizes.working_set / b).max(1) as usize;
        let w = Workload::new(count, a.zipf, a.seed);
        let fit = |bytes: u64| (bytes / b) as usize;
        println!(
            "  {} blocks: {count} of them; memory holds {} (best hit ratio {:.1} %), memory and \
             disk {} ({:.1} %)",
            human(b),
            fit(sizes.mem),
            100.0 * w.top_share(fit(sizes.mem)),
            fit(sizes.mem + sizes.disk),
            100.0 * w.top_share(fit(sizes.mem + sizes.disk)),
        );
    }
    println!(
        "{:<7} {:>9} {:>3} {:<13} {:>10} {:>9} {:>9} {:>17} {:>9} {:>8} {:>8}",
        "TIER",
        "BLOCK",
        "THR",
        "CACHE",
        "READS/S",
        "P50 µs",
        "P99 µs",
        "HIT % (MEM+DISK)",
        "CPU µs/rd",
        "RSS +MiB",
        "OTHERS %"
    );
    for round in 0..a.rounds.max(1) {
        for &tier in &a.tiers {
            for &block_bytes in &blocks {
                for &threads in &a.threads {
                    let mut order = caches.clone();
                    let turn = round % order.len().max(1);
                    order.rotate_left(turn);
                    for &cache in &order {
                        let case = Case {
                            tier,
                            block_bytes,
                            threads,
                            cache,
                        };
                        let r = run_child(&a, case)?;
                        print_row(case, &r);
                    }
                }
            }
        }
    }
    println!(
        "READS/S: every reader's reads per second; P50/P99: one read's calls into the cache \
         (memory, disk, and on a miss the put); CPU µs/rd: the process's CPU time (every \
         thread: the readers' and the caches' own) per read; RSS +MiB: peak growth of resident \
         memory while reading (the cache was full before); OTHERS %: the machine's CPUs busy \
         with other processes, in percent of all"
    );
    Ok(())
}

fn print_row(c: Case, r: &CaseResult) {
    let f = Figures::of(r);
    let hits = match c.tier {
        Tier::Memory => format!("{:.1}", f.mem_hit_pct),
        Tier::Disk => format!(
            "{:.1} ({:.1}+{:.1})",
            f.mem_hit_pct + f.disk_hit_pct,
            f.mem_hit_pct,
            f.disk_hit_pct
        ),
    };
    println!(
        "{:<7} {:>9} {:>3} {:<13} {:>10.0} {:>9.2} {:>9.2} {:>17} {:>9.2} {:>8.1} {:>8.0}",
        value_name(&c.tier),
        strait_ids::units::human_bytes(c.block_bytes),
        c.threads,
        value_name(&c.cache),
        f.reads_per_s,
        f.p50_us,
        f.p99_us,
        hits,
        f.cpu_us_per_read,
        f.rss_growth_mib,
        f.others_busy_pct
    );
}

/// Run one case in a process of its own (this program, `--case`) and read its result.
fn run_child(a: &CacheArgs, case: Case) -> Result<CaseResult> {
    let exe = std::env::current_exe().context("find this program")?;
    let mut cmd = Command::new(exe);
    cmd.args(["--log", "warn", "bench", "cache", "--case", &case.spec()])
        .args(["--seconds", &a.seconds.to_string()])
        .args(["--mem", &a.mem, "--disk", &a.disk])
        .args(["--working-set", &a.working_set])
        .args(["--foyer-region", &a.foyer_region])
        .args(["--zipf", &a.zipf.to_string(), "--seed", &a.seed.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(d) = &a.dir {
        cmd.arg("--dir").arg(d);
    }
    // its stdout pipe is made by the thread that starts it, which reads it to the end
    let out = strait_devkit::process::output_tied_with(move || Ok(cmd)).context("run a case")?;
    if !out.status.success() {
        bail!("case {} failed ({})", case.spec(), out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line)
        .with_context(|| format!("read the result of case {}: {line:?}", case.spec()))
}

/// The blocks that are read: their keys in the cache, and what a fetch of one returns.
struct Blocks {
    keys: Vec<String>,
    /// Every block's contents (not compressible, like most file data).
    template: Vec<u8>,
    crc: u32,
    /// Buffers of blocks the caches have dropped, for the next fetches: each cached block is
    /// an allocation of its own, as a block from the object store is, yet a fetch costs
    /// next to nothing once the caches evict (no copy, no page faults, no allocator), the
    /// same for every cache, so the figures are the caches' own. Not bounded: a cache that
    /// drops evicted blocks late, in batches (moka), would find it empty and pay for
    /// copies the others do not; the buffers allocated are as many as were ever alive at
    /// once.
    free: Arc<Mutex<Vec<Vec<u8>>>>,
}

/// A fetched block's buffer, handed back to [`Blocks::free`] when the last copy of the
/// block is dropped (by the cache that evicted it, or the reader).
struct Fetched {
    buf: Vec<u8>,
    free: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl AsRef<[u8]> for Fetched {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Fetched {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        self.free
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(buf);
    }
}

impl Blocks {
    fn new(count: usize, block_bytes: u64) -> Blocks {
        let len = block_bytes as u32;
        let keys = (0..count)
            .map(|i| {
                strait_fs_core::layout::block_key(strait_fs_core::SliceId(1_000 + i as u64), 0, len)
            })
            .collect();
        let template: Vec<u8> = (0..block_bytes)
            .map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8)
            .collect();
        let crc = crc32fast::hash(&template);
        Blocks {
            keys,
            template,
            crc,
            free: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// A block as the object store would return it: a buffer of its own.
    fn fetch(&self) -> Bytes {
        let reused = self
            .free
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop();
        Bytes::from_owner(Fetched {
            buf: reused.unwrap_or_else(|| self.template.clone()),
            free: self.free.clone(),
        })
    }
}

/// One reader's counts.
struct Reader {
    tally: Tally,
    latency_ns: hdrhistogram::Histogram<u64>,
}

impl Reader {
    fn new() -> Reader {
        Reader {
            tally: Tally::default(),
            latency_ns: hdrhistogram::Histogram::new(3).expect("3 significant figures are allowed"),
        }
    }

    /// Read block `i` as the read path does; time the calls into the cache (the fetch of a
    /// miss left out).
    fn read(&mut self, cache: &dyn BenchCache, blocks: &Blocks, i: usize) {
        let key = &blocks.keys[i];
        let len = blocks.template.len() as u32;
        let start = Instant::now();
        let got = cache.get(key, len, blocks.crc);
        let mut in_cache = start.elapsed();
        match got {
            Some((b, found)) => {
                std::hint::black_box(b);
                match found {
                    Found::Memory => self.tally.mem_hits += 1,
                    Found::Disk => self.tally.disk_hits += 1,
                }
            }
            None => {
                let b = blocks.fetch();
                let put = Instant::now();
                cache.put(key, b);
                in_cache += put.elapsed();
                self.tally.misses += 1;
            }
        }
        let ns = u64::try_from(in_cache.as_nanos()).unwrap_or(u64::MAX);
        // `record` grows the histogram to fit; only a value past any histogram is clamped
        if self.latency_ns.record(ns).is_err() {
            self.latency_ns.saturating_record(ns);
        }
    }

    /// Read what `w` asks for until `until` (a count of reads, or a deadline).
    fn run(&mut self, cache: &dyn BenchCache, blocks: &Blocks, w: &mut Workload, until: Until) {
        let mut n = 0u64;
        loop {
            match until {
                Until::Reads(max) if n >= max => return,
                Until::Deadline(t) if Instant::now() >= t => return,
                _ => {}
            }
            self.read(cache, blocks, w.next_key());
            n += 1;
        }
    }
}

#[derive(Clone, Copy)]
enum Until {
    Reads(u64),
    Deadline(Instant),
}

fn open_cache(case: Case, sizes: &Sizes, dir: &Path) -> Result<Box<dyn BenchCache>> {
    let (mem, disk) = (sizes.mem, sizes.disk);
    let hand_disk =
        || -> Result<DiskTier> { DiskTier::new(Arc::new(BlockCache::new(0, Some(dir), disk)?)) };
    Ok(match (case.cache, case.tier) {
        (Kind::HandWritten, Tier::Memory) => Box::new(Layered {
            mem: HandWritten(Arc::new(BlockCache::new(mem, None, 0)?)),
            disk: None,
        }),
        (Kind::HandWritten, Tier::Disk) => {
            // one BlockCache with both tiers, as a mount has
            let c = Arc::new(BlockCache::new(mem, Some(dir), disk)?);
            Box::new(Layered {
                mem: HandWritten(c.clone()),
                disk: Some(DiskTier::new(c)?),
            })
        }
        #[cfg(feature = "bench-cache-crates")]
        (Kind::Moka, tier) => Box::new(Layered {
            mem: candidates::moka(mem),
            disk: if tier == Tier::Disk {
                Some(hand_disk()?)
            } else {
                None
            },
        }),
        #[cfg(feature = "bench-cache-crates")]
        (Kind::Foyer, Tier::Memory) => Box::new(Layered {
            mem: candidates::foyer_memory(mem),
            disk: None,
        }),
        #[cfg(feature = "bench-cache-crates")]
        (Kind::Foyer, Tier::Disk) => Box::new(candidates::foyer_hybrid(
            mem,
            dir,
            disk,
            sizes.foyer_region,
        )?),
        #[cfg(not(feature = "bench-cache-crates"))]
        (other, _) => {
            let _ = hand_disk;
            bail!(
                "this strait was built without {}: build it with `--features bench-cache-crates`",
                value_name(&other)
            )
        }
    })
}

/// Run one case in this process: warm the cache up, then read with `case.threads` readers
/// for `--seconds`, measuring this process.
fn run_case(a: &CacheArgs, sizes: &Sizes, case: Case) -> Result<CaseResult> {
    let count = (sizes.working_set / case.block_bytes).max(1) as usize;
    let blocks = Blocks::new(count, case.block_bytes);
    let base = match &a.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir(),
    };
    let dir = base.join(format!("strait-cache-bench.{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let result = (|| {
        let cache = open_cache(case, sizes, &dir)?;
        measure(cache.as_ref(), &blocks, a, case.threads)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn measure(
    cache: &dyn BenchCache,
    blocks: &Blocks,
    a: &CacheArgs,
    threads: usize,
) -> Result<CaseResult> {
    let keys = blocks.keys.len();
    // warm-up: the cache fills and starts evicting before anything is measured
    let mut warm = Workload::new(keys, a.zipf, a.seed);
    Reader::new().run(cache, blocks, &mut warm, Until::Reads(2 * keys as u64));
    cache.settle()?;
    let me = std::process::id();
    usage::reset_peak_rss(me);
    let rss_start = usage::rss_bytes(me).map_or(0, |r| r.0);
    let cpu_start = usage::process_cpu_s(me);
    let machine = usage::cpu_ticks();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(a.seconds);
    let readers: Vec<Reader> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let seed = a.seed.wrapping_add(1 + t as u64);
                s.spawn(move || {
                    let mut w = Workload::new(keys, a.zipf, seed);
                    let mut r = Reader::new();
                    r.run(cache, blocks, &mut w, Until::Deadline(deadline));
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a reader panicked"))
            .collect()
    });
    let wall_s = start.elapsed().as_secs_f64();
    let cpu_s = usage::process_cpu_s(me) - cpu_start;
    let machine_busy_pct = usage::cpu_busy_since(machine);
    let rss_peak = usage::rss_bytes(me).map_or(0, |r| r.1);
    cache.close()?;
    let mut tally = Tally::default();
    let mut latency = hdrhistogram::Histogram::<u64>::new(3).expect("3 significant figures");
    for r in &readers {
        tally.add(&r.tally);
        latency
            .add(&r.latency_ns)
            .context("merge the readers' latencies")?;
    }
    Ok(CaseResult {
        tally,
        threads,
        wall_s,
        cpu_s,
        p50_ns: latency.value_at_quantile(0.5),
        p99_ns: latency.value_at_quantile(0.99),
        rss_start_bytes: rss_start,
        rss_peak_bytes: rss_peak,
        machine_busy_pct,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A case goes to its process and back unchanged; malformed ones are refused.
    #[test]
    fn case_specs_round_trip() {
        let c = Case {
            tier: Tier::Disk,
            block_bytes: 65536,
            threads: 2,
            cache: Kind::HandWritten,
        };
        assert_eq!(c.spec(), "disk/65536/2/hand-written");
        assert_eq!(Case::parse(&c.spec()).unwrap(), c);
        assert!(Case::parse("disk/65536/2").is_err());
        assert!(Case::parse("tape/65536/2/moka").is_err());
        assert!(Case::parse("memory/0/2/moka").is_err());
        assert!(Case::parse("memory/4096/0/moka").is_err());
    }

    /// The readers' accounting against the hand-written cache: every read is a hit or a
    /// miss; a working set that fits misses once per block, one that does not keeps
    /// missing; with a disk tier, blocks evicted from memory are found on disk.
    #[test]
    fn reads_are_counted_as_hits_and_misses() {
        let blocks = Blocks::new(8, 1024);
        let read_all = |cache: &dyn BenchCache, reads: u64| {
            let mut r = Reader::new();
            let mut w = Workload::new(8, 0.0, 3);
            r.run(cache, &blocks, &mut w, Until::Reads(reads));
            cache.settle().unwrap();
            r
        };
        // it fits: the first read of each block misses, every other read hits
        let fits = Layered {
            mem: HandWritten(Arc::new(BlockCache::new(8 * 1024, None, 0).unwrap())),
            disk: None,
        };
        let r = read_all(&fits, 1000);
        assert_eq!(
            r.tally,
            Tally {
                mem_hits: 992,
                disk_hits: 0,
                misses: 8
            }
        );
        assert_eq!(r.latency_ns.len(), 1000);
        // half fits: misses go on, and reads still add up
        let half = Layered {
            mem: HandWritten(Arc::new(BlockCache::new(4 * 1024, None, 0).unwrap())),
            disk: None,
        };
        let r = read_all(&half, 1000);
        assert_eq!(r.tally.reads(), 1000);
        assert!(
            r.tally.misses > 100 && r.tally.mem_hits > 100,
            "{:?}",
            r.tally
        );
        // the blocks it evicted came back for the next fetches: no more buffers than blocks
        // held and one being fetched
        assert!(blocks.free.lock().unwrap().len() <= 5);
        // a disk tier holding them all: after the first reads, what memory lost is on disk
        let dir = crate::replicator::tempfile_dir("cache-bench-test").unwrap();
        let c = Arc::new(BlockCache::new(4 * 1024, Some(&dir), 64 * 1024).unwrap());
        let both = Layered {
            mem: HandWritten(c.clone()),
            disk: Some(DiskTier::new(c).unwrap()),
        };
        read_all(&both, 100);
        let r = read_all(&both, 1000);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(r.tally.reads(), 1000);
        assert!(
            r.tally.disk_hits > 100 && r.tally.mem_hits > 100,
            "{:?}",
            r.tally
        );
        assert_eq!(r.tally.misses, 0);
    }
}
