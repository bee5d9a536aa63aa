//! fsx (the File System eXerciser, `cargo install fsx`) against a strait mount: random
//! reads, writes, truncates, close/reopen, fsync and mmap reads and writes on one file,
//! every read checked against fsx's own copy. It found a race between a flush and a
//! concurrent readahead request.

use std::process::Command;

use crate::support::mount::TestFs;

fn run_fsx(dir: &std::path::Path, name: &str, config: &str, seed: u64) {
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(&cfg, config).unwrap();
    let artifacts = tempfile::tempdir().unwrap();
    let out = Command::new("fsx")
        .args(["-N", "5000", "-S", &seed.to_string(), "-f"])
        .arg(&cfg)
        .arg("-P")
        .arg(artifacts.path())
        .arg(dir.join(name))
        .output()
        .expect("run fsx");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(30).collect();
    assert!(
        out.status.success(),
        "fsx {name} with seed {seed} failed:\n{}",
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn fsx_finds_no_difference() {
    if !crate::support::require_fuse() || !crate::support::require_program("fsx") {
        return;
    }
    let seed = crate::support::seed("fsx");
    let fs = TestFs::rocks_local(&["--block-size", "64K"]);
    let m = fs.mount(&[]);
    // small blocks, so reads and writes cross block boundaries all the time
    run_fsx(
        &m.point,
        "plain",
        "[weights]\nmapread = 0\nmapwrite = 0\nclose_open = 1\nfsync = 1\n",
        seed,
    );
    run_fsx(
        &m.point,
        "mapped",
        "[weights]\nclose_open = 1\nfsync = 1\n",
        seed.wrapping_add(1),
    );
    m.unmount();
}
