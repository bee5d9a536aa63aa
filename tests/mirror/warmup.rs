//! `strait warmup` at a lazy mirror: the blocks of a tree land in region B's store ahead of
//! any reader, byte for byte the primary's, so that reading the tree at B then crosses the
//! link for nothing; the figures say what was here and what was copied; a second warm-up
//! copies nothing; `--background` returns at once and `mirror status` shows it; bad paths and
//! the primary are refused with a clear line.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::dev_up::start_cluster;
use crate::support::site::{block_files, mirror_row};
use crate::support::wait_until;
use strait_devkit::cluster::ClusterConfig;

fn strait(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(crate::support::strait_bin())
        .args(args)
        .output()
        .expect("run strait");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write_synced(path: impl AsRef<Path>, data: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::File::create(path.as_ref()).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

/// Wait until `path` has `len` bytes (the mirror applied its create and its writes).
fn wait_len(path: &Path, len: u64) {
    wait_until(
        &format!("{} never had its {len} bytes", path.display()),
        Duration::from_secs(30),
        || std::fs::metadata(path).map(|m| m.len()).unwrap_or(0) == len,
    );
}

/// Two regions, the mirror copying lazily, on directories or Garage; dropped in this order.
struct Regions {
    _mounts: crate::support::dev_up::ClusterMounts,
    cluster: strait_devkit::cluster::Cluster,
    _rt: tokio::runtime::Runtime,
    dir: std::path::PathBuf,
    work: tempfile::TempDir,
}

fn lazy_regions(garage: bool) -> Regions {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("dev");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cfg = ClusterConfig {
        delay_ms: 5,
        sync: "lazy".into(),
        garage,
        ..ClusterConfig::new(crate::support::strait_bin(), dir.clone())
    };
    let (cluster, mounts) = start_cluster(&cfg, &rt);
    Regions {
        _mounts: mounts,
        cluster,
        _rt: rt,
        dir,
        work,
    }
}

#[test]
fn a_warm_up_at_a_lazy_mirror_copies_a_tree_before_anyone_reads_it() {
    if !crate::support::require_fuse() {
        return; // not under CI=true (said on stderr)
    }
    let r = lazy_regions(false);
    let dir = r.dir.clone();
    let topo = r.cluster.topology().clone();
    let (ma, mb) = (topo.mount_a.clone().unwrap(), topo.mount_b.clone().unwrap());
    let admin = dir.join("tokens/admin.token");
    let admin = admin.to_str().unwrap();
    let store = |r: &str| dir.join(format!("region-{r}/data"));

    // a tree written at A: 9 MiB (three blocks), 1 MiB, and 5 MiB one level down (two)
    std::fs::create_dir_all(ma.join("data/sub")).unwrap();
    let files = [
        ("data/big", 9 << 20),
        ("data/small", 1 << 20),
        ("data/sub/mid", 5 << 20),
    ];
    for (i, (name, len)) in files.iter().enumerate() {
        write_synced(ma.join(name), &crate::support::random_bytes(i as u64, *len));
    }
    for (name, len) in &files {
        wait_len(&mb.join(name), *len as u64);
    }
    let at_a = block_files(&store("a"));
    assert!(at_a.len() >= 6, "A's store: {:?}", at_a.keys());
    assert!(
        block_files(&store("b")).is_empty(),
        "a lazy mirror copied blocks before they were read"
    );

    // the warm-up: every block lands in B's store, the primary's bytes
    let start = Instant::now();
    let (ok, out, err) = strait(&[
        "warmup",
        "--addr",
        &topo.mirror,
        "--token-file",
        admin,
        "/data",
    ]);
    assert!(ok, "warmup: {out}{err}");
    eprintln!(
        "warmup: {} ({:.2} s)",
        out.trim(),
        start.elapsed().as_secs_f64()
    );
    assert!(
        out.contains("3 files, 15.0 MiB of 15.0 MiB here (100%): 0 B were, 15.0 MiB copied"),
        "{out}"
    );
    assert_eq!(
        block_files(&store("b")),
        at_a,
        "B's store after the warm-up"
    );
    let row = mirror_row(&topo.mirror, &topo.admin_token);
    let w = &row["warmup"];
    assert_eq!(w["done"], true, "{row:#}");
    assert_eq!(w["copied_blocks"], at_a.len(), "{row:#}");
    assert_eq!(w["failed_blocks"], 0, "{row:#}");

    // reading the tree at B crosses the link for nothing now
    let before = mirror_row(&topo.mirror, &topo.admin_token)["blocks"]["fallback_reads"].clone();
    for (i, (name, len)) in files.iter().enumerate() {
        let got = std::fs::read(mb.join(name)).unwrap();
        assert!(
            got == crate::support::random_bytes(i as u64, *len),
            "{name} read at B"
        );
    }
    let after = mirror_row(&topo.mirror, &topo.admin_token)["blocks"]["fallback_reads"].clone();
    assert_eq!(before, after, "reads at B fell back to A's store");

    // again, named under B's mount: everything is here already
    let (ok, out, err) = strait(&[
        "warmup",
        "--addr",
        &topo.mirror,
        "--token-file",
        admin,
        mb.join("data").to_str().unwrap(),
    ]);
    assert!(ok, "warmup again: {out}{err}");
    assert!(
        out.contains("15.0 MiB were, 0 B copied"),
        "the second warm-up copied: {out}"
    );

    // --background returns at once; mirror status follows it to the end
    write_synced(ma.join("more"), &crate::support::random_bytes(9, 4 << 20));
    wait_len(&mb.join("more"), 4 << 20);
    let (ok, out, err) = strait(&[
        "warmup",
        "--addr",
        &topo.mirror,
        "--token-file",
        admin,
        "--background",
        "/more",
    ]);
    assert!(ok, "warmup --background: {out}{err}");
    // one block, or two when the kernel wrote the file back in two flushes (two slices)
    let blocks: u64 = out
        .split("in the background: 1 files, ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        (1..=2).contains(&blocks) && out.contains("(4.0 MiB)"),
        "{out}"
    );
    wait_until(
        "the background warm-up is not done",
        Duration::from_secs(30),
        || {
            let row = mirror_row(&topo.mirror, &topo.admin_token);
            if row["warmup"]["done"] == true {
                assert_eq!(row["warmup"]["copied_blocks"], blocks, "{row:#}");
                return Ok(());
            }
            Err(format!("{row:#}"))
        },
    );
    let (ok, status, _) = strait(&[
        "mirror",
        "status",
        "--addr",
        &topo.mirror,
        "--token-file",
        admin,
    ]);
    assert!(ok, "{status}");
    assert!(
        status.contains("warm-up of /more (done): 1 files, 4.0 MiB of 4.0 MiB here"),
        "{status}"
    );

    // the mirror's background workers, listed by `mirror status` and /health, each running
    let row = mirror_row(&topo.mirror, &topo.admin_token);
    let workers: std::collections::BTreeMap<&str, &str> = row["workers"]
        .as_array()
        .unwrap_or_else(|| panic!("no workers in {row:#}"))
        .iter()
        .map(|w| (w["name"].as_str().unwrap(), w["state"].as_str().unwrap()))
        .collect();
    for name in [
        "follower",
        "copier",
        "deleter",
        "session-expiry",
        "ack",
        "tick",
    ] {
        assert_eq!(workers.get(name), Some(&"running"), "{row:#}");
    }
    let n = workers.len();
    assert!(
        status.contains(&format!("{n} of {n} workers running")),
        "{status}"
    );
    let (code, health) = crate::support::http_get(&topo.mirror_metrics, "/health");
    assert_eq!(code, 200, "{health}");
    assert!(health.contains("\nworker copier: running\n"), "{health}");

    // refused, with one clear line, and nothing copied
    let copied = block_files(&store("b")).len();
    for (args, says) in [
        (vec!["/nope"], "no such file or directory"),
        (vec!["relative/path"], "from the file system's root"),
    ] {
        let mut all = vec!["warmup", "--addr", &topo.mirror, "--token-file", admin];
        all.extend(args.iter().copied());
        let (ok, out, err) = strait(&all);
        assert!(!ok, "{args:?} was taken: {out}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
    let (ok, _, err) = strait(&[
        "warmup",
        "--addr",
        &topo.primary,
        "--token-file",
        admin,
        "/data",
    ]);
    assert!(!ok);
    assert!(err.contains("this is the primary"), "{err}");
    let mount_token = dir.join("tokens/mount.token");
    let (ok, _, err) = strait(&[
        "warmup",
        "--addr",
        &topo.mirror,
        "--token-file",
        mount_token.to_str().unwrap(),
        "/data",
    ]);
    assert!(!ok, "a mount's token warmed up");
    assert!(err.contains("Warmup is for the roles admin"), "{err}");
    assert_eq!(block_files(&store("b")).len(), copied);
}

/// Regular files under `dir`.
fn file_count(dir: &Path) -> usize {
    let mut n = 0;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                n += 1;
            }
        }
    }
    n
}

/// Without `--addr`, `strait warmup` reads a tree through a strait mount on this machine, and
/// the mount's disk cache keeps its blocks (a region's store in Garage: the mount caches).
#[test]
fn a_warm_up_of_a_mounts_path_fills_the_mounts_cache() {
    if !crate::support::require_fuse() || !crate::support::require_program("garage") {
        return; // not under CI=true (said on stderr)
    }
    let r = lazy_regions(true);
    let dir = r.dir.clone();
    let topo = r.cluster.topology().clone();
    let (ma, mb) = (topo.mount_a.clone().unwrap(), topo.mount_b.clone().unwrap());
    std::fs::create_dir_all(ma.join("set")).unwrap();
    for i in 0..4u64 {
        write_synced(
            ma.join(format!("set/f{i}")),
            &crate::support::random_bytes(i, 3 << 20),
        );
    }
    for i in 0..4 {
        wait_len(&mb.join(format!("set/f{i}")), 3 << 20);
    }
    let cache_b = dir.join("region-b/cache");
    let before = file_count(&cache_b);

    let (ok, out, err) = strait(&["warmup", mb.join("set").to_str().unwrap()]);
    assert!(ok, "warmup of B's mount: {out}{err}");
    eprintln!("warmup: {}", out.trim());
    assert!(
        out.contains("4 of 4 files, 12.0 MiB of 12.0 MiB read"),
        "{out}"
    );
    let after = file_count(&cache_b);
    assert!(
        after >= before + 4,
        "B's mount cache holds {before} files before, {after} after"
    );

    // a path that is not under a strait mount, with no mirror named: refused, one line
    let (ok, out, err) = strait(&["warmup", r.work.path().to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(err.contains("is not under a strait mount"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
