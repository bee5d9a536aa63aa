//! The pure parts of `strait bench cache`: which block each read asks for, what a run of
//! reads found (hits per tier, misses), and the figures printed from a case's counts.

use serde::{Deserialize, Serialize};

/// Which block each read asks for: a Zipf distribution over `keys` blocks (block 0 the most
/// read, block `i` read `1 / (i + 1)^exponent` as often), drawn from a seeded generator, so
/// every cache is given the same sequence of reads. An exponent of 0 reads every block
/// equally often.
pub struct Workload {
    /// `cdf[i]`: the share of reads that ask for blocks 0..=i (the last is 1).
    cdf: Vec<f64>,
    state: u64,
}

impl Workload {
    pub fn new(keys: usize, exponent: f64, seed: u64) -> Self {
        assert!(keys > 0, "a workload needs at least one block");
        let weights: Vec<f64> = (0..keys)
            .map(|i| 1.0 / ((i + 1) as f64).powf(exponent))
            .collect();
        let total: f64 = weights.iter().sum();
        let mut sum = 0.0;
        let mut cdf: Vec<f64> = weights
            .iter()
            .map(|w| {
                sum += w;
                sum / total
            })
            .collect();
        // rounding must not leave a draw just below 1 without a block
        *cdf.last_mut().expect("keys > 0") = 1.0;
        Workload { cdf, state: seed }
    }

    /// The next block to read (an index below `keys`).
    pub fn next_key(&mut self) -> usize {
        // SplitMix64: fast, and the same numbers on every machine
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // 53 random bits: a uniform draw in [0, 1)
        let u = (z >> 11) as f64 / (1u64 << 53) as f64;
        self.cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1)
    }

    /// The share of reads that ask for the `n` most read blocks: what a cache holding
    /// exactly those would hit at best.
    pub fn top_share(&self, n: usize) -> f64 {
        match n {
            0 => 0.0,
            n => self.cdf[n.min(self.cdf.len()) - 1],
        }
    }
}

/// What reads found: in memory, on disk, or nowhere (a miss: the block is fetched and put
/// into the cache, which evicts others once it is full).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub mem_hits: u64,
    pub disk_hits: u64,
    pub misses: u64,
}

impl Tally {
    pub fn reads(&self) -> u64 {
        self.mem_hits + self.disk_hits + self.misses
    }

    pub fn add(&mut self, other: &Tally) {
        self.mem_hits += other.mem_hits;
        self.disk_hits += other.disk_hits;
        self.misses += other.misses;
    }

    /// Hits in memory and on disk, in percent of the reads (0 without reads).
    pub fn hit_pct(&self) -> (f64, f64) {
        let reads = self.reads().max(1) as f64;
        (
            100.0 * self.mem_hits as f64 / reads,
            100.0 * self.disk_hits as f64 / reads,
        )
    }
}

/// What one case measured, as a case's process reports it to the command that started it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CaseResult {
    pub tally: Tally,
    pub threads: usize,
    pub wall_s: f64,
    /// This process's CPU time over the measured reads (every thread: readers, and the
    /// caches' own, such as disk writers and maintenance).
    pub cpu_s: f64,
    /// Latency of each read's calls into the cache (a miss's fetch left out), in
    /// nanoseconds.
    pub p50_ns: u64,
    pub p99_ns: u64,
    /// Resident memory when the reads started, and its peak while they ran.
    pub rss_start_bytes: u64,
    pub rss_peak_bytes: u64,
    /// How busy this machine's CPUs were (every process) while the reads ran, and how many
    /// there are.
    pub machine_busy_pct: f64,
    pub cpus: usize,
}

/// The figures of one case, as printed.
#[derive(Clone, Debug, PartialEq)]
pub struct Figures {
    /// Reads per second of all readers together.
    pub reads_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mem_hit_pct: f64,
    pub disk_hit_pct: f64,
    /// CPU time of the process (every thread) per read.
    pub cpu_us_per_read: f64,
    pub rss_growth_mib: f64,
    /// How busy the machine's CPUs were with other processes than this case's, in percent
    /// of all of them.
    pub others_busy_pct: f64,
}

impl Figures {
    pub fn of(r: &CaseResult) -> Figures {
        let reads = r.tally.reads().max(1) as f64;
        let (mem_hit_pct, disk_hit_pct) = r.tally.hit_pct();
        Figures {
            reads_per_s: r.tally.reads() as f64 / r.wall_s.max(1e-9),
            p50_us: r.p50_ns as f64 / 1e3,
            p99_us: r.p99_ns as f64 / 1e3,
            mem_hit_pct,
            disk_hit_pct,
            cpu_us_per_read: 1e6 * r.cpu_s / reads,
            rss_growth_mib: r.rss_peak_bytes.saturating_sub(r.rss_start_bytes) as f64
                / (1u64 << 20) as f64,
            others_busy_pct: (r.machine_busy_pct
                - 100.0 * r.cpu_s / (r.wall_s.max(1e-9) * r.cpus.max(1) as f64))
                .max(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same seed gives the same reads; every read names a block of the working set;
    /// the Zipf skew makes block 0 the most read and the top blocks' share what the
    /// distribution says.
    #[test]
    fn workload_is_seeded_skewed_and_in_range() {
        let draw = |seed| {
            let mut w = Workload::new(1000, 0.9, seed);
            (0..200_000).map(|_| w.next_key()).collect::<Vec<_>>()
        };
        let a = draw(7);
        assert_eq!(a, draw(7));
        assert_ne!(a, draw(8));
        assert!(a.iter().all(|&k| k < 1000));
        let mut counts = vec![0u64; 1000];
        for &k in &a {
            counts[k] += 1;
        }
        assert!(counts[0] > counts[1] && counts[1] > counts[10] && counts[10] > counts[500]);
        // the 250 most read blocks take their share of the draws, to within a percent
        let w = Workload::new(1000, 0.9, 7);
        let top: u64 = counts[..250].iter().sum();
        let share = top as f64 / a.len() as f64;
        assert!(
            (share - w.top_share(250)).abs() < 0.01,
            "{share} vs {}",
            w.top_share(250)
        );
        assert!(w.top_share(250) > 0.7 && w.top_share(250) < 0.9);
        assert_eq!(w.top_share(0), 0.0);
        assert_eq!(w.top_share(5000), 1.0);
    }

    /// Exponent 0 reads every block about equally often.
    #[test]
    fn exponent_zero_is_uniform() {
        let mut w = Workload::new(4, 0.0, 1);
        let mut counts = [0u64; 4];
        for _ in 0..40_000 {
            counts[w.next_key()] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
    }

    /// Hits and misses add up over readers; the figures are derived from the counts and
    /// times alone.
    #[test]
    fn tallies_add_up_and_figures_follow() {
        let mut t = Tally {
            mem_hits: 50,
            disk_hits: 20,
            misses: 30,
        };
        t.add(&Tally {
            mem_hits: 10,
            disk_hits: 0,
            misses: 90,
        });
        assert_eq!(t.reads(), 200);
        assert_eq!(t.hit_pct(), (30.0, 10.0));
        assert_eq!(Tally::default().hit_pct(), (0.0, 0.0));
        let r = CaseResult {
            tally: t,
            threads: 2,
            wall_s: 2.0,
            cpu_s: 0.5,
            p50_ns: 1_500,
            p99_ns: 40_000,
            rss_start_bytes: 100 << 20,
            rss_peak_bytes: 164 << 20,
            machine_busy_pct: 80.0,
            cpus: 2,
        };
        let f = Figures::of(&r);
        assert_eq!(f.reads_per_s, 100.0);
        assert_eq!((f.p50_us, f.p99_us), (1.5, 40.0));
        assert_eq!((f.mem_hit_pct, f.disk_hit_pct), (30.0, 10.0));
        assert_eq!(f.cpu_us_per_read, 2_500.0);
        assert_eq!(f.rss_growth_mib, 64.0);
        // the case used 0.5 s of the 4 CPU seconds (12.5 %), others the rest of the 80 %
        assert_eq!(f.others_busy_pct, 67.5);
    }
}
