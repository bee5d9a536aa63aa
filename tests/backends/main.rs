//! Integration tests: the metadata and object store backends on real servers (Redis, Garage S3), their conformance suites, TLS, and faults in front of S3.
//!
//! One test binary per topic (cargo builds the `strait` binary they run first, and
//! `support::strait_bin` is its path). Tests of a binary share its process: none may change
//! the process's environment or working directory.

#[path = "../support/mod.rs"]
mod support;

mod kv_conformance;
mod meta_conformance;
mod object_conformance;
mod object_store_faults;
mod redis_s3_mount;
mod redis_tls;
mod s3_tls;
