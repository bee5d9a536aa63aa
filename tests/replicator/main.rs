//! Integration tests: the replicator (`strait replicator` nodes), the primary's shipping to it, and where its voters live.
//!
//! One test binary per topic (cargo builds the `strait` binary they run first, and
//! `support::strait_bin` is its path). Tests of a binary share its process: none may change
//! the process's environment or working directory.

#[path = "../support/mod.rs"]
mod support;

mod placement;
mod replicator;
mod replicator_hostile;
mod shipping;
