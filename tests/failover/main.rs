//! Integration tests: losing a region and promoting a mirror, switching over and back, rejoining, and what a fenced primary must not do.
//!
//! One test binary per topic (cargo builds the `strait` binary they run first, and
//! `support::strait_bin` is its path). Tests of a binary share its process: none may change
//! the process's environment or working directory.

#[path = "../support/mod.rs"]
mod support;

mod failover;
