//! Integration tests: what an operator installs: `deploy/`'s files, `strait dev up`, the guide on network namespaces, and every listening port.
//!
//! One test binary per topic (cargo builds the `strait` binary they run first, and
//! `support::strait_bin` is its path). Tests of a binary share its process: none may change
//! the process's environment or working directory.

#[path = "../support/mod.rs"]
mod support;

mod deploy;
mod dev_up;
mod netns;
mod ports;
