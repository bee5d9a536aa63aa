//! Integration tests: mirrors: following the primary, the data path and its copy, partitions, traces across regions, warmup, compaction, orphan sweeps, directory quotas, the trash and clones.
//!
//! One test binary per topic (cargo builds the `strait` binary they run first, and
//! `support::strait_bin` is its path). Tests of a binary share its process: none may change
//! the process's environment or working directory.

#[path = "../support/mod.rs"]
mod support;

mod clones;
mod compaction;
mod gc_orphans;
mod mirror;
mod mirror_data;
mod mirror_partition;
mod mirror_trace;
mod names_kept;
mod quotas;
mod trash;
mod warmup;
