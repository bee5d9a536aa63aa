//! Integration tests: the site daemon that serves mounts (`strait primary`): shared mounts, hostile and malformed calls, traces, request ids and slice ids, metadata backups.
//!
//! One test binary per topic (cargo builds the `strait` binary they run first, and
//! `support::strait_bin` is its path). Tests of a binary share its process: none may change
//! the process's environment or working directory.

#[path = "../support/mod.rs"]
mod support;

mod backup;
mod daemon;
mod daemon_hostile;
mod daemon_tracing;
mod names_kept;
mod request_ids;
mod sessions_owned;
mod site_hostile;
mod slice_ids;
mod slice_ids_restart;
mod tenants;
