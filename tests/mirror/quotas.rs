//! Directory quotas at both regions (docs/operations.md, "Directory quotas"): a quota set
//! from a mirror's mount is forwarded to the primary; creates and writes at either region's
//! mount are held to it at the primary (a mirror's forwarded ones too) and refused with
//! EDQUOT; the usage travels in the change log, so the mirror shows the primary's numbers,
//! and `df` under the directory shows the quota.

use std::io::Write;
use std::process::Command;
use std::time::Duration;

use crate::support::daemon::Primary;
use crate::support::replicator::RegionA;
use crate::support::{strait_bin, wait_until};

const PATIENCE: Duration = Duration::from_secs(30);

fn quota(args: &[&str]) -> (bool, String) {
    let out = Command::new(strait_bin())
        .arg("quota")
        .args(args)
        .output()
        .expect("run strait quota");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Write `len` bytes to `path` and close it: the first error, from the write, the sync or
/// the close.
fn write_file(path: &std::path::Path, len: usize) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(&vec![7u8; len])?;
    f.sync_all()
}

fn edquot(r: std::io::Result<impl std::fmt::Debug>) -> bool {
    match r {
        Err(e) => e.raw_os_error() == Some(libc::EDQUOT),
        Ok(_) => false,
    }
}

#[test]
fn a_quota_holds_at_both_regions_and_the_mirror_shows_the_primarys_usage() {
    if !crate::support::require_fuse() {
        return;
    }
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let primary = region.primary(&[]);
    let mirror = Primary::mirror(
        &primary,
        "region-b",
        &region.addrs,
        &["--window-ms", "60000"],
    );
    let a = primary.mount(&[]);
    let b = mirror.mount(&[]);
    std::fs::create_dir(a.path("team")).unwrap();
    wait_until("team reaches the mirror", PATIENCE, || {
        b.path("team").is_dir()
    });

    // set from the mirror's mount: forwarded to the primary
    let (ok, out) = quota(&[
        "set",
        b.path("team").to_str().unwrap(),
        "--capacity",
        "10M",
        "--inodes",
        "100",
    ]);
    assert!(ok, "{out}");
    let (ok, out) = quota(&["get", a.path("team").to_str().unwrap()]);
    assert!(
        ok && out.contains("of 10.0 MiB") && out.contains("0 inodes of 100"),
        "{out}"
    );

    // 100 files, half at each region; the 101st is refused at both
    for i in 0..50 {
        std::fs::write(a.path(&format!("team/a{i}")), b"").unwrap();
        std::fs::write(b.path(&format!("team/b{i}")), b"").unwrap();
    }
    assert!(
        edquot(std::fs::write(a.path("team/a-101"), b"")),
        "the 101st at A"
    );
    assert!(
        edquot(std::fs::write(b.path("team/b-101"), b"")),
        "the 101st at B"
    );
    assert!(!a.path("team/a-101").exists() && !b.path("team/b-101").exists());

    // space: 6 MiB at A is taken, 6 MiB more at B is not, and a write at A past it neither
    write_file(&a.path("team/a0"), 6 << 20).unwrap();
    assert!(
        edquot(write_file(&b.path("team/b0"), 6 << 20)),
        "past 10 MiB at B"
    );
    assert!(
        edquot(write_file(&a.path("team/a1"), 5 << 20)),
        "past 10 MiB at A"
    );
    // within it, at B
    write_file(&b.path("team/b1"), 3 << 20).unwrap();

    // the mirror shows the primary's numbers once it applied them
    let at_a = quota(&["get", a.path("team").to_str().unwrap()]).1;
    // 9 MiB, and what a write refused at close had committed of its first slices before
    // the limit (a write past a quota may leave some of its bytes, as on NFS)
    let used: f64 = at_a
        .split("used ")
        .nth(1)
        .and_then(|r| r.split(" MiB").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{at_a}"));
    assert!(
        (9.0..=10.0).contains(&used) && at_a.contains("of 10.0 MiB") && at_a.contains("100 inodes"),
        "{at_a}"
    );
    let at_b = wait_until("the mirror shows the usage", PATIENCE, || {
        let (ok, out) = quota(&["get", b.path("team").to_str().unwrap()]);
        let same = out.replace(b.path("team").to_str().unwrap(), "T")
            == at_a.replace(a.path("team").to_str().unwrap(), "T");
        (ok && same).then_some(out)
    });
    eprintln!("quota at A: {at_a}quota at B: {at_b}");

    // `df` under the directory shows the quota, at both
    for m in [&a, &b] {
        let out = Command::new("df")
            .args(["-B1", m.path("team").to_str().unwrap()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let size: u64 = text
            .lines()
            .nth(1)
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("df: {text}"));
        assert_eq!(size, 10 << 20, "{text}");
    }

    // a recount agrees with the usage kept, at the primary
    let (ok, out) = quota(&["check", a.path("team").to_str().unwrap()]);
    assert!(ok && out.contains("consistent"), "{out}");
    // removed from the mirror's mount: the creates are taken again at both
    let (ok, out) = quota(&["delete", b.path("team").to_str().unwrap()]);
    assert!(ok, "{out}");
    std::fs::write(a.path("team/a-101"), b"").unwrap();
    wait_until("the removal reaches the mirror", PATIENCE, || {
        !quota(&["get", b.path("team").to_str().unwrap()]).0
    });
    std::fs::write(b.path("team/b-101"), b"").unwrap();
}
