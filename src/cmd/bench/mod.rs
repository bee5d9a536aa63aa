//! The benchmarks: programs that print figures, never timed assertions in the test suite.
//!
//! - [`fs`]: `strait bench DIR`, any mounted file system (strait's or a peer's);
//!   `scripts/bench-vs-juicefs.sh` runs it against strait and JuiceFS side by side;
//! - [`mirror`]: `strait mirror bench`, a mirror's lag and reads against a running `dev up`;
//! - [`replicator`]: `strait replicator bench`, a three-node replicator cluster's commit
//!   latency and throughput, then [`floor`]: `strait replicator floor`, the disk's floor for
//!   that latency.
//!
//! `bench_mirror_data` (the mirror's data path across a capped link) stays a program of the
//! `tests` crate: it builds its regions with the test harness (`strait_tests`), which this
//! binary does not link.

pub mod floor;
pub mod fs;
pub mod mirror;
pub mod replicator;

// the names by which the replicator benchmark and its floor refer to each other
use floor as replicator_floor;
use replicator as replicator_bench;
