//! The trash at both regions (docs/operations.md, "The trash"): a file deleted at the
//! primary's mount, and a tree removed with `rm -rf`, show in `/.trash` at the mirror's
//! mount too; `strait trash restore` at the mirror (forwarded to the primary) puts them back
//! with their bytes, the tree whole; a file deleted at the mirror is restored at the primary;
//! `strait trash purge` empties it at both; bad requests get one readable line and change
//! nothing.

use std::process::Command;
use std::time::Duration;

use crate::support::daemon::Primary;
use crate::support::replicator::RegionA;
use crate::support::{strait_bin, wait_until};

const PATIENCE: Duration = Duration::from_secs(30);

fn trash(args: &[&str]) -> (bool, String) {
    let out = Command::new(strait_bin())
        .arg("trash")
        .args(args)
        .output()
        .expect("run strait trash");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The names in a mount's `/.trash`, sorted.
fn listed(root: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root.join(".trash"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Bytes that differ from block to block (a lost or misplaced block shows).
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

#[test]
fn what_is_deleted_in_one_region_is_restored_from_the_other_with_its_bytes() {
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
    let (a_root, b_root) = (a.path(""), b.path(""));
    let (a_s, b_s) = (a_root.to_str().unwrap(), b_root.to_str().unwrap());

    let (ok, out) = trash(&["days", b_s]);
    assert!(ok && out.contains("for 1 days"), "{out}");
    let model = pattern(9 << 20, 1);
    std::fs::create_dir_all(a.path("proj/sub/deeper")).unwrap();
    std::fs::write(a.path("proj/model.bin"), &model).unwrap();
    std::fs::write(a.path("proj/sub/x.txt"), b"x").unwrap();
    std::fs::write(a.path("proj/sub/deeper/y.txt"), pattern(100_000, 2)).unwrap();
    wait_until("the tree reaches the mirror", PATIENCE, || {
        b.path("proj/sub/deeper/y.txt").exists()
    });

    // deleted at A: at once in the trash at both, nameless
    std::fs::remove_file(a.path("proj/model.bin")).unwrap();
    std::fs::remove_dir_all(a.path("proj/sub")).unwrap();
    assert!(!a.path("proj/model.bin").exists());
    assert_eq!(listed(&a_root).len(), 5, "{:?}", listed(&a_root));
    wait_until("the trash reaches the mirror", PATIENCE, || {
        listed(&b_root) == listed(&a_root)
    });
    let (ok, out) = trash(&["list", b.path("proj").to_str().unwrap()]);
    assert!(ok && out.contains("5 entries"), "{out}");
    assert!(
        out.contains("-model.bin") && out.contains("9.0 MiB"),
        "{out}"
    );
    // its bytes can be read where it lies
    let entry = listed(&b_root)
        .into_iter()
        .find(|n| n.ends_with("-model.bin"))
        .unwrap();
    assert_eq!(
        std::fs::read(b_root.join(".trash").join(&entry)).unwrap(),
        model
    );
    // the trash is read-only
    let e = std::fs::remove_file(a_root.join(".trash").join(&entry)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");

    // restored from B: forwarded to the primary, back at both with its bytes
    let (ok, out) = trash(&["restore", b_s, &entry]);
    assert!(ok && out.contains("restored 1 of 1"), "{out}");
    assert_eq!(std::fs::read(a.path("proj/model.bin")).unwrap(), model);
    wait_until("the restore reaches the mirror", PATIENCE, || {
        b.path("proj/model.bin").exists()
    });
    assert_eq!(std::fs::read(b.path("proj/model.bin")).unwrap(), model);
    // the tree by its top: every entry under it follows
    let sub = listed(&b_root)
        .into_iter()
        .find(|n| n.ends_with("-sub"))
        .unwrap();
    let (ok, out) = trash(&["restore", b_s, &sub]);
    assert!(ok && out.contains("restored 4 of 4"), "{out}");
    assert_eq!(std::fs::read(a.path("proj/sub/x.txt")).unwrap(), b"x");
    assert_eq!(
        std::fs::read(a.path("proj/sub/deeper/y.txt")).unwrap(),
        pattern(100_000, 2)
    );
    assert!(listed(&a_root).is_empty(), "{:?}", listed(&a_root));
    wait_until("the tree is back at the mirror", PATIENCE, || {
        b.path("proj/sub/deeper/y.txt").exists() && listed(&b_root).is_empty()
    });

    // deleted at B (forwarded), restored at A; a name taken meanwhile: restored elsewhere
    std::fs::write(b.path("proj/from-b"), b"written at b").unwrap();
    std::fs::remove_file(b.path("proj/from-b")).unwrap();
    std::fs::write(a.path("proj/from-b"), b"a new one").unwrap();
    let entry = listed(&a_root).pop().unwrap();
    assert!(entry.ends_with("-from-b"), "{entry}");
    let (ok, out) = trash(&["restore", a_s, &entry]);
    assert!(!ok && out.contains("File exists"), "{out}");
    assert_eq!(out.trim().lines().count(), 3, "{out}");
    let (ok, out) = trash(&[
        "restore",
        a_s,
        &entry,
        "--to",
        a.path("proj/sub").to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    assert_eq!(
        std::fs::read(a.path("proj/sub/from-b")).unwrap(),
        b"written at b"
    );
    assert_eq!(std::fs::read(a.path("proj/from-b")).unwrap(), b"a new one");

    // bad requests: one line, nothing changed
    let (ok, out) = trash(&["restore", b_s, "1-2-nothing"]);
    assert!(!ok && out.contains("no such entry in the trash"), "{out}");
    let (ok, out) = trash(&["list", "/tmp"]);
    assert!(!ok && out.contains("has no .trash"), "{out}");
    let (ok, out) = trash(&["restore", b_s]);
    assert!(!ok && out.contains("--all"), "{out}");

    // purged from B: gone at both
    std::fs::remove_file(a.path("proj/model.bin")).unwrap();
    std::fs::remove_dir_all(a.path("proj/sub")).unwrap();
    wait_until("the deletes reach the mirror", PATIENCE, || {
        listed(&b_root).len() == 6
    });
    let (ok, out) = trash(&["purge", b_s, "--all"]);
    assert!(ok && out.contains("purged 6 entries"), "{out}");
    assert!(listed(&a_root).is_empty());
    wait_until("the purge reaches the mirror", PATIENCE, || {
        listed(&b_root).is_empty()
    });
    let (ok, out) = trash(&["list", a_s]);
    assert!(ok && out.contains("the trash is empty"), "{out}");
}
