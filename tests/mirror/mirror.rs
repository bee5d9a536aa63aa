//! A mirror follows the primary through a three-node replicator cluster.
//!
//! Invariants checked (docs/guarantees.md):
//! - prefix consistency: during a create/rename/setattr storm, every sampled
//!   `strait fsck --compare` finds the mirror's digest equal to the primary's at one version;
//! - exactly once across a crash: the mirror is SIGKILLed mid-storm and restarted; after the
//!   catch-up its digest equals the primary's (a skipped or repeated record would differ, and
//!   the apply transaction refuses both);
//! - bad input changes nothing: an invalid record in the log halts the applier at the version
//!   before it, with the record named in `mirror status`;
//! - the mirror serves its region: reads answer from its own metadata; with writes refused,
//!   mutations get EROFS (`mirror_data` covers writes forwarded to the primary).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::daemon::Primary;
use crate::support::replicator::RegionA;
use crate::support::site::{compare, mirror_row, primary_version, status_json, wait_applied, Site};
use crate::support::wait_until;

/// Writers making, renaming and chmod-ing entries at the primary until `stop`.
async fn storm(addr: String, token: String, writer: usize, stop: Arc<AtomicBool>) -> usize {
    let mut s = Site::connect(&addr, &token).await;
    let mut ops = 0;
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let d = s.mkdir(1, &format!("w{writer}-d{i}")).await.expect("mkdir");
        let f = s.mknod(d, "f").await.expect("mknod");
        s.rename(d, "f", "g").await.expect("rename");
        s.chmod(f, 0o600).await.expect("chmod");
        ops += 4;
        i += 1;
    }
    ops
}

#[test]
fn a_mirror_follows_the_primary_exactly_through_a_storm_and_a_crash() {
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let addrs = region.addrs.clone();
    let mut primary = region.primary(&[]);
    let token = primary.token.clone();

    // some history before the mirror exists: it bootstraps from a snapshot, not from version 1
    rt.block_on(async {
        let mut s = Site::connect(&primary.addr, &token).await;
        for i in 0..50 {
            s.mkdir(1, &format!("before-{i}")).await.unwrap();
        }
    });
    let mut mirror = Primary::mirror(
        &primary,
        "region-b",
        &addrs,
        &["--window-ms", "60000", "--writes", "refuse"],
    );
    assert!(
        mirror.log_text().contains("bootstrapped at version"),
        "{}",
        mirror.log_text()
    );
    let v0 = primary_version(&primary);
    let row = wait_applied(&mirror, v0, Duration::from_secs(30));
    assert_eq!(row["state"], "following", "{row}");
    let (same, at, text) = compare(&primary, &mirror);
    assert!(same, "digests differ after the bootstrap: {text}");
    assert!(at >= v0);

    // the region's reads come from the mirror; a mutation there is refused (EROFS, under
    // writes = "refuse")
    rt.block_on(async {
        let mut m = Site::connect(&mirror.addr, &token).await;
        assert!(m.lookup(1, "before-7").await.is_ok());
        let names = m.names(1).await.unwrap();
        assert_eq!(names.len(), 50, "{names:?}");
        let e = m.mkdir(1, "written-at-b").await.unwrap_err();
        let errno = strait_proto::status_errno(&e);
        assert_eq!(errno, Some(libc::EROFS), "{e:?}");
    });

    // a storm at the primary; digests are compared at sampled versions while it runs, and the
    // mirror is SIGKILLed and restarted in the middle of it
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..3)
        .map(|w| rt.spawn(storm(primary.addr.clone(), token.clone(), w, stop.clone())))
        .collect();
    let mut samples = vec![];
    for round in 0..6 {
        std::thread::sleep(Duration::from_millis(700));
        if round == 3 {
            mirror.kill();
            std::thread::sleep(Duration::from_millis(500));
            mirror.restart();
            continue;
        }
        let (same, at, text) = compare(&primary, &mirror);
        assert!(same, "prefix consistency broken during the storm: {text}");
        samples.push(at);
    }
    stop.store(true, Ordering::Relaxed);
    let ops: usize = writers.into_iter().map(|h| rt.block_on(h).unwrap()).sum();
    assert!(samples.windows(2).all(|w| w[0] <= w[1]), "{samples:?}");
    assert!(
        samples.last() > samples.first(),
        "the samples did not move: {samples:?}"
    );

    // after the storm: the mirror catches up; same digest at the same version
    let end = primary_version(&primary);
    let row = wait_applied(&mirror, end, Duration::from_secs(60));
    assert_eq!(row["applied_version"].as_u64(), Some(end), "{row}");
    let (same, at, text) = compare(&primary, &mirror);
    assert!(same && at == end, "after the crash and catch-up: {text}");
    println!(
        "storm: {ops} operations, versions {v0}..{end}; digests equal at {samples:?} and at {end}; \
         mirror killed and restarted once"
    );

    // the replicator holds the mirror's cursor; status through the primary lists it
    wait_until(
        &format!("the replicator never showed the mirror's cursor at {end}"),
        Duration::from_secs(10),
        || {
            let rep = status_json(&primary.addr, &token);
            let row = rep["mirrors"]
                .as_array()
                .and_then(|a| a.iter().find(|m| m["mirror"] == "region-b").cloned());
            if row.as_ref().and_then(|r| r["applied_version"].as_u64()) == Some(end) {
                return Ok(());
            }
            Err(rep)
        },
    );

    // an invalid record reaches the log (the primary is stopped, and a record about an inode
    // that does not exist is appended at the next version): the applier halts before it
    assert!(primary.terminate(), "{}", primary.log_text());
    let bogus = strait_fs_core::changelog::ChangeRecord {
        ts_ns: 1,
        change: strait_fs_core::changelog::Change::DeleteInode { ino: 999_999_999 },
        request: None,
    };
    let bogus2 = strait_fs_core::changelog::ChangeRecord {
        ts_ns: 1,
        change: strait_fs_core::changelog::Change::Rmdir {
            parent: 999_999_998,
            name: strait_fs_core::changelog::Name(b"x".to_vec()),
            ino: 999_999_999,
            parent_attr: serde_default_attr(),
        },
        request: None,
    };
    rt.block_on(async {
        let c = crate::support::replicator::log_client(&addrs);
        c.append(strait_proto::replicator::AppendRequest {
            epoch: 0,
            first_version: end + 1,
            records: vec![bogus.encode().unwrap(), bogus2.encode().unwrap()],
        })
        .await
        .expect("append the invalid records");
    });
    let row = wait_until("the mirror did not halt", Duration::from_secs(20), || {
        let row = mirror_row(&mirror.addr, &token);
        if row["state"] == "halted" {
            return Ok(row);
        }
        Err(row)
    });
    // record end+1 (deleting a missing inode is a no-op) applies; end+2 is refused and named
    let bad = end + 2;
    assert_eq!(row["applied_version"].as_u64(), Some(end + 1), "{row}");
    assert!(
        row["error"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("record {bad}")),
        "{row}"
    );
    assert!(mirror
        .log_text()
        .contains(&format!("record {bad} is invalid")));
    mirror.terminate();
}

/// Attributes for a record whose target does not exist (their values do not matter).
fn serde_default_attr() -> strait_fs_core::meta::Attr {
    strait_fs_core::meta::Attr {
        kind: strait_fs_core::meta::FileKind::Dir,
        perm: 0o755,
        uid: 0,
        gid: 0,
        nlink: 2,
        length: 0,
        rdev: 0,
        atime_ns: 0,
        mtime_ns: 0,
        ctime_ns: 0,
        parent: 1,
    }
}

/// Every entry under `root`, relative, sorted, with what it is: a directory, a symlink with
/// its target, or a file with its mode and bytes.
fn tree(root: &std::path::Path) -> Vec<(String, String, Vec<u8>)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = vec![];
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.file_type().is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.push((rel, format!("symlink {}", t.display()), vec![]));
            } else if m.is_dir() {
                out.push((rel, "dir".into(), vec![]));
                stack.push(p);
            } else {
                let mode = format!("file {:o}", m.permissions().mode() & 0o7777);
                out.push((rel, mode, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_mount_at_the_mirror_lists_the_tree_and_reads_the_primarys_bytes() {
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let addrs = region.addrs.clone();
    let primary = region.primary(&[]);

    // a tree written through a mount at the primary: empty, small and multi-block files (a
    // block is 4 MiB), nested directories, a symlink, a chmod
    let a = primary.mount(&[]);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut bytes = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    };
    std::fs::create_dir_all(a.path("data/train/shard-0")).unwrap();
    std::fs::create_dir_all(a.path("data/empty-dir")).unwrap();
    std::fs::write(a.path("data/empty"), b"").unwrap();
    std::fs::write(a.path("data/small"), bytes(4095)).unwrap();
    std::fs::write(a.path("data/train/shard-0/big"), bytes(9 << 20)).unwrap();
    for i in 0..20 {
        std::fs::write(a.path(&format!("data/train/f{i}")), bytes(1000 * i + 1)).unwrap();
    }
    std::os::unix::fs::symlink("train/shard-0/big", a.path("data/link")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(a.path("data/small"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let written = tree(&a.path("data"));
    assert_eq!(
        written.len(),
        27,
        "{:?}",
        written.iter().map(|e| &e.0).collect::<Vec<_>>()
    );

    let mirror = Primary::mirror(&primary, "region-b", &addrs, &[]);
    let v = primary_version(&primary);
    wait_applied(&mirror, v, Duration::from_secs(30));
    let b = mirror.mount(&[]);
    let seen = tree(&b.path("data"));
    assert_eq!(
        seen.iter().map(|e| (&e.0, &e.1)).collect::<Vec<_>>(),
        written.iter().map(|e| (&e.0, &e.1)).collect::<Vec<_>>(),
        "the mirror's mount lists another tree"
    );
    for (s, w) in seen.iter().zip(&written) {
        assert!(s.2 == w.2, "{}: the mirror read other bytes", s.0);
    }
    // the link resolves at the mirror too
    assert_eq!(
        std::fs::read(b.path("data/link")).unwrap(),
        std::fs::read(a.path("data/train/shard-0/big")).unwrap()
    );

    // a file written at the primary after the mirror's mount started is there after apply
    std::fs::create_dir(a.path("later")).unwrap();
    std::fs::write(a.path("later/f"), b"written later").unwrap();
    let v = primary_version(&primary);
    wait_applied(&mirror, v, Duration::from_secs(30));
    assert_eq!(std::fs::read(b.path("later/f")).unwrap(), b"written later");

    // a writer at the mirror's mount: its changes go to the primary, it reads them back at
    // once, and so does the primary's mount
    std::fs::write(b.path("data/new"), b"written at b").unwrap();
    assert_eq!(std::fs::read(b.path("data/new")).unwrap(), b"written at b");
    std::fs::remove_file(b.path("data/small")).unwrap();
    assert!(!b.path("data/small").exists());
    assert_eq!(tree(&b.path("data")).len(), written.len());
    assert_eq!(std::fs::read(a.path("data/new")).unwrap(), b"written at b");
    // the primary's mount may hold the old entry for its attribute timeout (1 s)
    wait_until(
        "data/small is still at the primary",
        Duration::from_secs(5),
        || !a.path("data/small").exists(),
    );
}

#[test]
fn a_mirror_left_behind_by_the_logs_retention_bootstraps_again_by_itself() {
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let (addrs, leader) = (region.addrs.clone(), region.leader);
    let primary = region.primary(&[]);
    let token = primary.token.clone();
    let mkdirs = |prefix: &str, n: usize| {
        rt.block_on(async {
            let mut s = Site::connect(&primary.addr, &token).await;
            for i in 0..n {
                s.mkdir(1, &format!("{prefix}-{i}")).await.unwrap();
            }
        })
    };
    mkdirs("first", 20);
    let mut mirror = Primary::mirror(&primary, "region-b", &addrs, &[]);
    let v = primary_version(&primary);
    wait_applied(&mirror, v, Duration::from_secs(30));
    // its cursor at the replicator (acknowledged every 500 ms) reaches v before it stops
    std::thread::sleep(Duration::from_millis(1200));
    assert!(mirror.terminate(), "{}", mirror.log_text());

    // the log may hold only 1 KiB: what the stopped mirror needs next is purged
    let leader_addr = &addrs[(leader - 1) as usize];
    crate::support::strait_ok(&[
        "replicator",
        "retention",
        "--token",
        crate::support::replicator::ADMIN_TOKEN,
        "--addr",
        leader_addr,
        "--max-bytes",
        "1K",
        "--max-age",
        "7d",
    ]);
    mkdirs("while-away", 300);
    let status = |a: &str| {
        rt.block_on(async {
            crate::support::replicator::client(a.parse().unwrap())
                .await
                .status(strait_proto::replicator::Empty {})
                .await
                .unwrap()
                .into_inner()
        })
    };
    // the primary (local durability) ships behind its answers: wait until the log holds
    // every change above, so the cap had them all to purge
    let shipped_to = primary_version(&primary);
    let start = std::time::Instant::now();
    let st = loop {
        let st = status(leader_addr);
        if st.last_version >= shipped_to || start.elapsed() > Duration::from_secs(30) {
            break st;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let cursor = st
        .cursors
        .iter()
        .find(|c| c.mirror == "region-b")
        .unwrap_or_else(|| panic!("no cursor for region-b: {st:?}"));
    assert!(cursor.needs_bootstrap, "{st:?}");
    assert!(st.earliest_version > v + 1, "nothing was purged: {st:?}");

    // restarted, it finds its next version gone, says so, and bootstraps again on its own
    mirror.restart();
    let end = primary_version(&primary);
    let row = wait_applied(&mirror, end, Duration::from_secs(60));
    assert_eq!(row["bootstraps"].as_u64(), Some(1), "{row}");
    assert!(
        row["error"]
            .as_str()
            .is_some_and(|e| e.contains("re-bootstrapped")),
        "the status does not say why it bootstrapped again: {row}"
    );
    let log = mirror.log_text();
    assert!(
        log.contains("bootstrapping again from the primary's snapshot"),
        "{log}"
    );
    assert_eq!(log.matches("bootstrapped at version").count(), 2, "{log}");
    let (same, at, text) = compare(&primary, &mirror);
    assert!(same && at >= end, "{text}");
    // following again, and its cursor no longer needs a bootstrap
    wait_until(
        "the cursor of region-b still needs a bootstrap",
        Duration::from_secs(10),
        || {
            let st = status(leader_addr);
            if st
                .cursors
                .iter()
                .any(|c| c.mirror == "region-b" && !c.needs_bootstrap && c.applied_version >= end)
            {
                return Ok(());
            }
            Err(format!("{st:?}"))
        },
    );
    assert_eq!(mirror_row(&mirror.addr, &token)["state"], "following");
}

/// A bootstrapping mirror sets its cursor at the snapshot's version before it loads (a
/// mirror with no cursor holds nothing back, so the primary's GC could delete blocks the
/// snapshot references while it loads). With acknowledgements every 60 s, only that
/// registration can put the cursor there right after the bootstrap.
#[test]
fn a_bootstrapping_mirror_registers_its_cursor_before_it_loads() {
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let addrs = region.addrs.clone();
    let primary = region.primary(&[]);
    let token = primary.token.clone();
    rt.block_on(async {
        let mut s = Site::connect(&primary.addr, &token).await;
        for i in 0..5 {
            s.mkdir(1, &format!("d{i}")).await.unwrap();
        }
    });
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(cfg.path(), "ack_interval_ms = 60000\n").unwrap();
    let cfg_path = cfg.path().to_string_lossy().to_string();
    let mirror = Primary::mirror(
        &primary,
        "region-b",
        &addrs,
        &["--config", &cfg_path, "--writes", "refuse"],
    );
    let text = mirror.log_text();
    assert!(text.contains("bootstrapped at version"), "{text}");
    assert!(
        text.contains("registered this mirror's cursor at version"),
        "{text}"
    );
    // the node asked may be a follower a moment behind the leader: look for 5 s (the first
    // acknowledgement is 60 s away)
    let c = wait_until("no cursor for region-b", Duration::from_secs(5), || {
        let cursors = rt.block_on(async {
            crate::support::replicator::client(addrs[0].parse().unwrap())
                .await
                .status(strait_proto::replicator::Empty {})
                .await
                .unwrap()
                .into_inner()
                .cursors
        });
        if let Some(c) = cursors.iter().find(|c| c.mirror == "region-b") {
            return Ok(c.clone());
        }
        Err(format!("{cursors:?}"))
    });
    assert!(c.applied_version > 0 && !c.needs_bootstrap, "{c:?}");
}
