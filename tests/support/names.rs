//! Clients that keep names and attributes as a mount does (site-client's `meta_cache.rs`),
//! and what the tests of that ask of them and of their daemon.

use std::sync::Arc;

use strait_fs_core::error::Error;
use strait_fs_core::meta::{Ctx, MetaClient, SetAttr};
use strait_site_client::{ConnectOptions, Credentials, RemoteMeta};

use super::daemon::Primary;

/// A client of the daemon at `url`, with its session open; `keep_names` as a mount's.
pub fn client(url: &str, token: &str, keep_names: bool) -> Arc<RemoteMeta> {
    let c = RemoteMeta::connect(
        url,
        ConnectOptions {
            creds: Credentials::new(Some(token), None).unwrap(),
            keep_names,
            ..Default::default()
        },
    )
    .unwrap();
    c.open_session("names_kept test").unwrap();
    c
}

/// Whether `name` in `parent` is absent, as `c` answers.
pub fn absent(c: &RemoteMeta, parent: u64, name: &[u8]) -> bool {
    match c.lookup(&Ctx::root(), parent, name) {
        Err(Error::Sys(libc::ENOENT)) => true,
        Ok(_) => false,
        Err(e) => panic!("lookup: {e}"),
    }
}

/// Calls of `op` the daemon answered, whatever the outcome (its metrics).
pub fn calls(d: &Primary, op: &str) -> u64 {
    let (_, text) = d.http_get("/metrics");
    let prefix = format!("strait_rpc_duration_seconds_count{{op=\"{op}\",");
    text.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<u64>().ok())
        .sum()
}

/// chmod `ino` to `mode` through `c`, as root.
pub fn chmod(c: &RemoteMeta, ino: u64, mode: u32) {
    c.setattr(
        &Ctx::root(),
        ino,
        &SetAttr {
            mode: Some(mode),
            ..Default::default()
        },
    )
    .unwrap();
}
