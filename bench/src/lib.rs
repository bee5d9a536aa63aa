//! The benchmarks: programs that print figures, never timed assertions in the test suite.
//!
//! - [`fs`]: `strait bench DIR`, any mounted file system (strait's or a peer's);
//!   `bench/scripts/vs-juicefs.sh` runs it against strait and JuiceFS side by side;
//! - [`cache`]: `strait bench cache`, the block cache against the `moka` and `foyer` crates
//!   (those with the feature `bench-cache-crates`);
//! - [`mirror`]: `strait mirror bench`, a mirror's lag and reads against a running `dev up`;
//! - [`tls`]: `strait bench tls`, plain text against mutual TLS on every link, in one run;
//! - [`s3`]: `strait bench s3`, a plain S3 client's GET rate from a bucket (the limit of a
//!   cold read from an `s3://` store);
//! - [`replicator`]: `strait replicator bench`, a three-node replicator cluster's commit
//!   latency and throughput, then [`floor`]: `strait replicator floor`, the disk's floor for
//!   that latency.
//!
//! The `strait` binary parses these commands' flags and calls [`run`] and its peers here.
//! Beside this crate, in the same home:
//! - `bench/programs/`: `cargo bench --bench mirror_data` (the mirror's data path across a
//!   capped link) and `cargo bench --bench compaction` (what random writes cost the stores and
//!   the link), programs of the root package that build their regions with the test harness
//!   (`tests/support/`), which the `strait` binary does not link;
//! - `bench/scripts/`: `vs-juicefs.sh` (strait and JuiceFS side by side on this machine),
//!   `warmup.sh` (`strait warmup` across a capped link), `dlio.sh` (MLPerf Storage's DLIO
//!   training at a mirror).
//!
//! Figures and how they were taken: docs/benchmarks/.

pub mod cache;
pub mod floor;
pub mod fs;
pub mod mirror;
pub mod replicator;
pub mod s3;
pub mod tls;

use anyhow::Result;

/// `strait bench DIR` (a mounted directory) or `strait bench cache` (the block cache).
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: Option<What>,
    #[command(flatten)]
    pub fs: fs::Args,
}

#[derive(clap::Subcommand)]
pub enum What {
    /// Compare the block cache (memory LRU and disk cache) with the moka and foyer crates
    /// on the same reads (docs/benchmarks/cache.md).
    Cache(cache::CacheArgs),
    /// What mutual TLS on every link costs: `dev up` in plain text and with `--tls`, the
    /// metadata benchmark at both regions' mounts and the mirror-lag storm, side by side.
    Tls(tls::TlsArgs),
    /// A plain S3 client's PUT and GET rates against a bucket (the AWS SDK, none of strait's
    /// code): the limit an `s3://` store's cold read is judged against.
    S3(s3::S3Args),
}

pub fn run(a: BenchArgs) -> Result<()> {
    match a.what {
        Some(What::Cache(c)) => cache::run(c),
        Some(What::Tls(t)) => tls::run(t),
        Some(What::S3(s)) => s3::run(s),
        None => fs::run(a.fs),
    }
}

/// A tokio runtime for the benchmarks that talk to daemons.
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("start the tokio runtime: {e}"))
}

// the names by which the replicator benchmark and its floor refer to each other
use floor as replicator_floor;
use replicator as replicator_bench;
