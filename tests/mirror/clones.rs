//! Clones at both regions (docs/operations.md, "Clones"): a tree of 10,000 files written at
//! the primary's mount is cloned with `strait clone` at the mirror's mount (forwarded to the
//! primary); the clone is byte for byte its source at both regions, the two regions' digests
//! match (`strait fsck --compare`), and the primary's object store did not grow by the tree's
//! size (the clone shares its blocks). A change to the clone leaves its source as it was; a
//! clone onto a taken name, across mounts or past a quota gets one readable line and leaves
//! nothing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::daemon::Primary;
use crate::support::replicator::RegionA;
use crate::support::site::{compare, primary_version, wait_applied};
use crate::support::{strait_bin, wait_until};

const PATIENCE: Duration = Duration::from_secs(60);
const DIRS: usize = 100;
const FILES_PER_DIR: usize = 100;

fn clone(src: &Path, dst: &Path) -> (bool, String) {
    let out = Command::new(strait_bin())
        .arg("clone")
        .arg(src)
        .arg(dst)
        .output()
        .expect("run strait clone");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The bytes of file `i` of directory `d`: distinct for each file.
fn content(d: usize, i: usize) -> Vec<u8> {
    format!("file {i} of directory {d}\n")
        .repeat(1 + (d * i) % 40)
        .into_bytes()
}

/// Bytes of the files under `dir` (0 when there is none).
fn bytes_under(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.map(|e| {
        let e = e.unwrap();
        let md = e.metadata().unwrap();
        if md.is_dir() {
            bytes_under(&e.path())
        } else {
            md.len()
        }
    })
    .sum()
}

/// Every file under `root` by its path from it, with its bytes, sorted.
fn tree(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = vec![];
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(root.join(&rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                stack.push(r);
            } else {
                out.push((r.clone(), std::fs::read(root.join(&r)).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_tree_cloned_at_the_mirror_shares_its_blocks_and_is_identical_at_both_regions() {
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

    // 10,000 files in 100 directories, and a file of several blocks, written at A
    let data = a.path("data");
    std::fs::create_dir_all(&data).unwrap();
    std::thread::scope(|s| {
        for part in 0..4 {
            let data = &data;
            s.spawn(move || {
                for d in (part..DIRS).step_by(4) {
                    let dir = data.join(format!("d{d:03}"));
                    std::fs::create_dir(&dir).unwrap();
                    for i in 0..FILES_PER_DIR {
                        std::fs::write(dir.join(format!("f{i:03}")), content(d, i)).unwrap();
                    }
                }
            });
        }
    });
    let big: Vec<u8> = (0..9u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 8) as u8)
        .collect();
    std::fs::write(data.join("model.bin"), &big).unwrap();
    let last = format!("data/d{:03}/f{:03}", DIRS - 1, FILES_PER_DIR - 1);
    wait_until("the tree reaches the mirror", PATIENCE, || {
        b.path(&last).exists() && b.path("data/model.bin").exists()
    });
    let chunks = region.fs.data_dir().join("chunks");
    let stored = bytes_under(&chunks);
    let tree_bytes = bytes_under(&data);
    assert!(
        stored >= tree_bytes,
        "the primary's blocks are not under {}: {stored} bytes there, the tree has {tree_bytes}",
        chunks.display()
    );

    // cloned at B: forwarded to the primary, seen whole at both
    let (ok, out) = clone(&b.path("data"), &b.path("data-copy"));
    assert!(ok && out.contains("cloned"), "{out}");
    let source = tree(&b.path("data"));
    assert_eq!(source.len(), DIRS * FILES_PER_DIR + 1);
    assert!(
        source == tree(&b.path("data-copy")),
        "the clone differs at B"
    );
    wait_until("the clone reaches the primary's mount", PATIENCE, || {
        a.path("data-copy/model.bin").exists()
    });
    assert!(
        source == tree(&a.path("data-copy")),
        "the clone differs at A"
    );
    // the blocks are shared: the store did not grow by the tree's size
    let grown = bytes_under(&chunks).saturating_sub(stored);
    assert!(
        grown < tree_bytes / 10,
        "the store grew by {grown} bytes for a clone of {tree_bytes}"
    );
    // the two regions hold the same metadata
    let v = primary_version(&primary);
    wait_applied(&mirror, v, PATIENCE);
    let (same, _, text) = compare(&primary, &mirror);
    assert!(same, "the digests differ after the clone: {text}");

    // a change to the clone leaves its source as it was
    std::fs::write(b.path("data-copy/d000/f000"), b"changed in the clone").unwrap();
    std::fs::remove_file(b.path("data-copy/model.bin")).unwrap();
    assert_eq!(
        std::fs::read(a.path("data/d000/f000")).unwrap(),
        content(0, 0)
    );
    assert_eq!(std::fs::read(a.path("data/model.bin")).unwrap(), big);
    // a file cloned at A
    let (ok, out) = clone(&a.path("data/model.bin"), &a.path("model-copy.bin"));
    assert!(ok, "{out}");
    assert_eq!(std::fs::read(a.path("model-copy.bin")).unwrap(), big);

    // refused with one line, leaving nothing: a taken name, another mount, past a quota
    let (ok, out) = clone(&b.path("data"), &b.path("data-copy"));
    assert!(!ok && out.contains("File exists"), "{out}");
    assert_eq!(out.trim().lines().count(), 1, "{out}");
    let (ok, out) = clone(&b.path("data"), Path::new("/tmp/strait-clone-elsewhere"));
    assert!(!ok && out.contains("not on the same strait mount"), "{out}");
    std::fs::create_dir(a.path("small")).unwrap();
    let q = Command::new(strait_bin())
        .args(["quota", "set"])
        .arg(a.path("small"))
        .args(["--inodes", "100"])
        .output()
        .unwrap();
    assert!(q.status.success(), "{}", String::from_utf8_lossy(&q.stderr));
    wait_until("the quota reaches the mirror", PATIENCE, || {
        Command::new(strait_bin())
            .args(["quota", "get"])
            .arg(b.path("small"))
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    });
    let (ok, out) = clone(&b.path("data"), &b.path("small/copy"));
    assert!(!ok && out.contains("Disk quota exceeded"), "{out}");
    assert!(!a.path("small/copy").exists());
    assert_eq!(std::fs::read_dir(b.path("small")).unwrap().count(), 0);
    // what the refused clone copied is gone: no clone is left being made
    assert_eq!(jobs(&a.path("")), "", "clones left at A");
}

/// The clones being made, as `strait.clone.jobs` lists them at the mount of `path`.
fn jobs(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    // SAFETY: NUL-terminated strings; the buffer is writable for its length.
    let n = unsafe {
        libc::getxattr(
            p.as_ptr(),
            c"strait.clone.jobs".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert!(
        n >= 0,
        "getxattr strait.clone.jobs: {}",
        std::io::Error::last_os_error()
    );
    buf.truncate(n as usize);
    String::from_utf8_lossy(&buf).into_owned()
}
