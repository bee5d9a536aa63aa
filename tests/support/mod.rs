//! Shared harness for strait's integration tests and benchmark programs: real servers (Redis,
//! Garage S3) started on 127.0.0.1 for the duration of a test, and helpers to run the real
//! `strait` binary. A module of each test binary (and of each program in `bench/programs/`), not a
//! crate: cargo gives those the path of the `strait` binary it built for them.

// Each binary uses part of it.
#![allow(dead_code, unused_imports)]

pub mod daemon;
pub mod dev_up;
pub mod garage;
pub mod mount;
pub mod names;
pub mod otlp;
pub mod raw_grpc;
pub mod redis_server;
pub mod replicator;
pub mod site;
pub mod tokens;
pub mod wait;

pub use wait::{later, wait_until};

use std::path::PathBuf;
use std::process::Command;

/// True when the test must not skip anything (CI sets `CI=true`).
pub fn strict() -> bool {
    std::env::var("CI")
        .map(|v| v == "true" || v == "1")
        .unwrap_or(false)
}

/// Whether an external program is on PATH. When it is missing the test skips with a message,
/// except under `CI=true`, where it fails loudly: CI must never turn a missing server into a pass.
pub fn require_program(name: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !found {
        if strict() {
            panic!(
                "{name} is required for this test and is not installed (CI=true: refusing to skip)"
            );
        }
        eprintln!("SKIPPED: {name} is not installed (set CI=true to make this a failure)");
    }
    found
}

/// Whether FUSE mounts can be made here (/dev/fuse exists and we are root or have fusermount3).
pub fn require_fuse() -> bool {
    let ok = std::path::Path::new("/dev/fuse").exists();
    if !ok {
        if strict() {
            panic!(
                "/dev/fuse is required for this test and is missing (CI=true: refusing to skip)"
            );
        }
        eprintln!("SKIPPED: /dev/fuse is missing (set CI=true to make this a failure)");
    }
    ok
}

/// A multi-threaded runtime of two workers for a test's async parts (clients, proxies).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A free TCP port on 127.0.0.1 for a test server, below the ephemeral range (see
/// `strait_devkit::free_port`).
pub fn free_port() -> u16 {
    strait_devkit::free_port().expect("find a free port on 127.0.0.1")
}

/// Path of the `strait` binary cargo built for this test binary (or benchmark program), before
/// it built this one: never a stale binary from an earlier build.
pub fn strait_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_strait"))
}

/// Run `strait ARGS` to its end: whether it succeeded, and what it printed (stdout, then
/// stderr).
pub fn strait(args: &[&str]) -> (bool, String) {
    let out = Command::new(strait_bin())
        .args(args)
        .output()
        .expect("run strait");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Run `strait ARGS`, which must succeed: its stdout. Panics with its stderr otherwise.
pub fn strait_ok(args: &[&str]) -> String {
    let out = Command::new(strait_bin())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {} {args:?}: {e}", strait_bin().display()));
    if !out.status.success() {
        panic!(
            "strait {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Run `strait ARGS`, which must fail: its exit code and stderr.
pub fn strait_fails(args: &[&str]) -> (i32, String) {
    let out = Command::new(strait_bin())
        .args(args)
        .output()
        .expect("run strait");
    assert!(!out.status.success(), "strait {args:?} should have failed");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Start `strait ARGS` with `env`, tied to this process, its output going to the log at
/// `log` (appended to with `append`); the log is opened in the thread that starts children
/// ([`strait_devkit::process::spawn_tied_with`]).
pub fn spawn_strait(
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    append: bool,
) -> std::io::Result<std::process::Child> {
    let bin = strait_bin();
    strait_devkit::process::spawn_tied_with(move || {
        let (out, err) = strait_devkit::process::open_log(&log, append)?;
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .envs(env)
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err);
        Ok(cmd)
    })
}

/// The seed of a randomized test: `STRAIT_SEED` when set (to replay a failure), otherwise a
/// random one. It is printed, so a failing run can be replayed.
pub fn seed(test: &str) -> u64 {
    let seed = std::env::var("STRAIT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{test} seed = {seed} (replay with STRAIT_SEED={seed})");
    seed
}

/// `n` pseudo-random bytes, different for each `seed`: test data that compresses poorly.
pub fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}

/// GET `path` from the HTTP endpoint at `addr` (a daemon's metrics address, Prometheus):
/// (status code, body). HTTP/1.0, so that no server answers in chunks.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect metrics");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .ok();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("send");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|b| b.1)
        .unwrap_or("")
        .to_string();
    (code, body)
}

/// The value of the sample `series` (a name with its labels, as the text exposition writes
/// it, e.g. `strait_replicator_cursor_version{mirror="m"}`) in `text`.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The metrics `/metrics` text `text` declares (`# TYPE` lines) that docs/metrics.md's table
/// does not list.
pub fn undocumented_metrics(text: &str) -> Vec<String> {
    let doc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md");
    let table =
        std::fs::read_to_string(&doc).unwrap_or_else(|e| panic!("read {}: {e}", doc.display()));
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| !table.contains(&format!("| `{n}` |")))
        .map(str::to_string)
        .collect()
}
