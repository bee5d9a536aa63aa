//! Integration tests: one region without a daemon: a mount on its own engine and store (errors, crash safety, the differential and fsx runs, locks, dead slices).
//!
//! One test binary per topic (cargo builds the `strait` binary they run first, and
//! `support::strait_bin` is its path). Tests of a binary share its process: none may change
//! the process's environment or working directory.

#[path = "../support/mod.rs"]
mod support;

mod bad_input;
mod crash;
mod differential;
mod fsx;
mod locks_and_gc;
mod mount_roundtrip;
