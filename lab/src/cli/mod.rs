//! The command line of `strait-lab`: it parses, calls the harness or the installer, and
//! prints.

pub mod chaos;
pub mod netns;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// The `strait` program the cluster runs: `--strait`, else `strait` beside this program (where
/// cargo puts both).
pub fn strait_bin(given: Option<&Path>) -> Result<PathBuf> {
    let p = match given {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()
            .context("this program's path")?
            .with_file_name("strait"),
    };
    if !p.is_file() {
        bail!(
            "no strait program at {} (build it with `cargo build`, or name it with --strait PATH)",
            p.display()
        );
    }
    Ok(p)
}

pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .context("start the tokio runtime")
}

/// Block until SIGTERM or SIGINT, or until `seconds` passed (0: no limit).
pub fn run_until_stopped(rt: &tokio::runtime::Runtime, seconds: u64) {
    let limit = (seconds > 0).then(|| Duration::from_secs(seconds));
    rt.block_on(async {
        let signals = async {
            use tokio::signal::unix::{signal, SignalKind};
            match (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) {
                (Ok(mut t), Ok(mut i)) => {
                    tokio::select! { _ = t.recv() => {}, _ = i.recv() => {} }
                }
                // no handler: only the time limit (or a kill) ends it
                _ => std::future::pending::<()>().await,
            }
        };
        match limit {
            Some(d) => tokio::select! { _ = signals => {}, _ = tokio::time::sleep(d) => {} },
            None => signals.await,
        }
    });
}
