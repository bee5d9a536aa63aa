//! The mirror's data path (docs/architecture.md, "The data path"), with real processes: a three-node replicator, the
//! primary daemon, a mirror daemon with its own object store, FUSE mounts in both regions.
//!
//! - Blocks reach the mirror's store on first read (served at once from the primary's
//!   store) and in the background (eager), and a corrupt local copy is fetched again.
//! - A writer at the mirror: its changes are made at the primary, its blocks are in both
//!   stores, it reads its own writes, and nothing it was told is written is lost when the
//!   mirror is killed. With the primary down, writes fail with a clear errno.
//! - GC: the primary keeps a dead slice's blocks while a (paused) mirror still references
//!   them; once the mirror applies the deletion, both stores drop them.
//! - Per-path policies: only eager paths are copied in the background.
//! - A file open at the mirror lives until its last close anywhere, as at the primary.

use std::time::{Duration, Instant};

use crate::support::daemon::Primary;
use crate::support::replicator::RegionA;
use crate::support::site::{block_files, mirror_row, primary_version, wait_applied, wait_synced};

use crate::support::random_bytes as bytes;
use crate::support::wait_until;

/// The slice ids of block keys (`.../{slice}_{index}_{len}`).
fn slice_ids(
    blocks: &std::collections::BTreeMap<String, Vec<u8>>,
) -> std::collections::BTreeSet<String> {
    blocks
        .keys()
        .filter_map(|k| k.rsplit('/').next()?.split('_').next().map(str::to_owned))
        .collect()
}

#[test]
fn blocks_reach_the_mirror_on_first_read_and_in_the_background_and_a_corrupt_copy_is_fetched_again()
{
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let primary = region.primary(&[]);
    let a = primary.mount(&[]);
    // many small files and a few multi-block ones (a block is 4 MiB)
    std::fs::create_dir_all(a.path("ds/small")).unwrap();
    std::fs::create_dir_all(a.path("ds/big")).unwrap();
    let mut files = vec![];
    for i in 0..60u64 {
        files.push((format!("ds/small/{i}"), bytes(i, 128 << 10)));
    }
    for i in 0..3u64 {
        files.push((format!("ds/big/{i}"), bytes(1000 + i, (9 << 20) + 12345)));
    }
    for (p, d) in &files {
        std::fs::write(a.path(p), d).unwrap();
    }
    let total: usize = files.iter().map(|f| f.1.len()).sum();

    // a slow background copy (2 MB/s for ~36 MB), so the reads below come first
    let mirror = Primary::mirror(
        &primary,
        "region-b",
        &region.addrs,
        &["--sync-bandwidth-mb-s", "2"],
    );
    wait_applied(&mirror, primary_version(&primary), Duration::from_secs(30));
    let b = mirror.mount(&[]);
    let t0 = Instant::now();
    for (p, d) in &files {
        let got = std::fs::read(b.path(p)).unwrap();
        assert!(&got == d, "{p}: the mirror read other bytes");
    }
    let took = t0.elapsed();
    let row = mirror_row(&mirror.addr, &mirror.token);
    let blocks = &row["blocks"];
    assert!(
        blocks["fallback_reads"].as_u64().unwrap() > 0,
        "no read came from the primary's store: {row}"
    );
    eprintln!(
        "read {total} bytes at the mirror before sync in {took:?}; {} blocks came across regions",
        blocks["fallback_reads"]
    );

    // the background copy finishes; the mirror's store then holds every block, intact
    let row = wait_synced(&mirror, Duration::from_secs(120));
    let a_blocks = block_files(&region.fs.data_dir());
    let b_blocks = block_files(&mirror.data_dir());
    assert_eq!(
        a_blocks.keys().collect::<Vec<_>>(),
        b_blocks.keys().collect::<Vec<_>>(),
        "the stores hold other blocks: {row}"
    );
    assert!(a_blocks == b_blocks, "a block differs between the stores");
    assert_eq!(row["blocks"]["errors"], 0, "{row}");

    // corrupt one block of a big file in the mirror's store: a fresh mount still reads the
    // right bytes, and the mirror's log names the block
    b.unmount();
    let victim = b_blocks
        .keys()
        .find(|k| b_blocks[*k].len() == 4 << 20)
        .expect("a full block")
        .clone();
    let path = mirror.data_dir().join(&victim);
    let mut data = std::fs::read(&path).unwrap();
    data[12345] ^= 0xff;
    std::fs::write(&path, &data).unwrap();
    let b = mirror.mount(&[]);
    for (p, d) in files.iter().filter(|f| f.0.starts_with("ds/big")) {
        let got = std::fs::read(b.path(p)).unwrap();
        assert!(&got == d, "{p}: a corrupt block reached a reader");
    }
    let log = mirror.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains(&victim) && l.contains("corrupt")),
        "the mirror's log does not name {victim}:\n{log}"
    );
    // the fetched block is written back behind the reader
    wait_until(
        "the corrupt copy is replaced",
        Duration::from_secs(10),
        || std::fs::read(&path).is_ok_and(|d| d == a_blocks[&victim]),
    );
    let row = mirror_row(&mirror.addr, &mirror.token);
    assert!(
        row["blocks"]["corrupt_blocks"].as_u64().unwrap() >= 1,
        "{row}"
    );
}

#[test]
fn a_writer_at_the_mirror_reaches_the_primary_and_loses_nothing_when_the_mirror_is_killed() {
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let mut primary = region.primary(&[]);
    let mut mirror = Primary::mirror(
        &primary,
        "region-b",
        &region.addrs,
        &["--write-timeout-ms", "3000"],
    );
    let a = primary.mount(&[]);
    let b = mirror.mount(&[]);

    // write at B, read back at B and at A
    std::fs::create_dir(b.path("fromb")).unwrap();
    let big = bytes(7, (9 << 20) + 7);
    std::fs::write(b.path("fromb/big"), &big).unwrap();
    std::fs::write(b.path("fromb/small"), b"hello from b").unwrap();
    std::fs::rename(b.path("fromb/small"), b.path("fromb/hello")).unwrap();
    assert!(std::fs::read(b.path("fromb/big")).unwrap() == big);
    assert_eq!(
        std::fs::read(b.path("fromb/hello")).unwrap(),
        b"hello from b"
    );
    assert!(std::fs::read(a.path("fromb/big")).unwrap() == big);
    assert_eq!(
        std::fs::read(a.path("fromb/hello")).unwrap(),
        b"hello from b"
    );
    // the blocks are in both regions' stores
    let (ab, bb) = (
        block_files(&region.fs.data_dir()),
        block_files(&mirror.data_dir()),
    );
    // 4 blocks, or more if a FLUSH from another thread's fork+exec cut a write in two
    assert!(ab.len() >= 4, "{:?}", ab.keys().collect::<Vec<_>>());
    assert!(ab == bb, "the regions' stores differ");

    // read-your-writes at the metadata level: each mkdir through the mirror is answered
    // once the mirror has applied it (the primary names the version in x-strait-version),
    // so the lookup right after it, answered by the mirror's own metadata, finds it
    rt.block_on(async {
        let mut m = crate::support::site::Site::connect(&mirror.addr, &mirror.token).await;
        let r = m.req(strait_proto::meta::MkNodRequest {
            ctx: Some(Default::default()),
            parent: 1,
            name: b"ryw".to_vec(),
            mode: 0o755,
            umask: 0,
            rdev: 0,
        });
        let reply = m.c.mk_dir(r).await.unwrap();
        let v: u64 = reply
            .metadata()
            .get(strait_proto::VERSION_HEADER)
            .expect("a mutation's reply names its version")
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(v > 0);
        let dir = reply.into_inner().ino;
        for i in 0..100 {
            let name = format!("d{i}");
            let ino = m.mkdir(dir, &name).await.unwrap();
            assert_eq!(
                m.lookup(dir, &name).await.unwrap(),
                ino,
                "{name}: not read back"
            );
        }
    });

    // a write storm at B; the mirror is SIGKILLed and restarted in the middle of it
    std::fs::create_dir(b.path("storm")).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dir = b.path("storm");
    let s2 = stop.clone();
    let writer = std::thread::spawn(move || {
        let mut ok = vec![];
        let mut failed = 0;
        let mut i = 0u64;
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            let n = 1000 + (i as usize % 7) * 20_000;
            match std::fs::write(dir.join(format!("f{i}")), bytes(i, n)) {
                Ok(()) => ok.push(i),
                Err(_) => failed += 1,
            }
            i += 1;
        }
        (ok, failed)
    });
    std::thread::sleep(Duration::from_secs(2));
    mirror.kill();
    std::thread::sleep(Duration::from_millis(500));
    mirror.restart();
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = writer.join().unwrap();
    eprintln!(
        "{} writes at the mirror returned success, {failed} failed",
        ok.len()
    );
    assert!(ok.len() > 10, "too few writes to mean anything");
    for i in &ok {
        let n = 1000 + (*i as usize % 7) * 20_000;
        let got = std::fs::read(a.path(&format!("storm/f{i}"))).unwrap_or_else(|e| {
            panic!("storm/f{i} returned success at the mirror, missing at the primary: {e}")
        });
        assert!(got == bytes(*i, n), "storm/f{i} differs at the primary");
    }

    // the primary is down: a write at B fails within the write timeout, with a log line
    drop(b);
    let b = mirror.mount(&[]);
    primary.kill();
    let t0 = Instant::now();
    let e = std::fs::write(b.path("fromb/while-down"), b"x").unwrap_err();
    let took = t0.elapsed();
    assert!(
        matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::ETIMEDOUT)),
        "{e}"
    );
    assert!(took < Duration::from_secs(20), "the write took {took:?}");
    assert!(
        mirror.log_text().contains("the primary cannot be reached")
            || mirror.log_text().contains("no answer from the primary"),
        "{}",
        mirror.log_text()
    );
    primary.restart();
    drop(a);
    let a = primary.mount(&[]);
    assert!(
        !a.path("fromb/while-down").exists(),
        "a write that failed left a file behind"
    );
}

#[test]
fn gc_keeps_the_blocks_a_paused_mirror_still_reads_and_both_regions_drop_them_after() {
    let rt = crate::support::runtime();
    let region = RegionA::start_with(&rt, &["--gc-delay", "0", "--trash-days", "0"]);
    let primary = region.primary(&["--gc-mirror-grace-ms", "0"]);
    // lazy: the mirror copies nothing by itself, so its reads below go to the primary's store
    let mirror = Primary::mirror(&primary, "region-b", &region.addrs, &["--sync", "lazy"]);
    let a = primary.mount(&[]);
    std::fs::create_dir(a.path("gc")).unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..4u64)
        .map(|i| (format!("gc/f{i}"), bytes(50 + i, (5 << 20) + 3)))
        .collect();
    for (p, d) in &files {
        std::fs::write(a.path(p), d).unwrap();
    }
    // 2 blocks a file, or more: a close of the file by another process (a FLUSH from any
    // fork+exec in this test binary while a write is open) commits the slice early
    let before = block_files(&region.fs.data_dir());
    let n_blocks = before.len();
    let n_slices = slice_ids(&before).len();
    assert!(n_blocks >= 8 && n_slices >= 4, "{:?}", before.keys());
    wait_applied(&mirror, primary_version(&primary), Duration::from_secs(30));
    assert!(
        block_files(&mirror.data_dir()).is_empty(),
        "lazy copied blocks"
    );

    // B stops applying; A deletes the files and collects garbage
    let out = crate::support::strait_ok(&[
        "mirror",
        "pause",
        "--addr",
        &mirror.addr,
        "--token",
        &mirror.token,
        "--seconds",
        "120",
    ]);
    // "mirror ADDR paused at version V for 120 s (...)"
    let held_at: u64 = out
        .split("paused at version ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("strait mirror pause printed {out:?}"));
    assert_eq!(
        mirror_row(&mirror.addr, &mirror.token)["applied_version"].as_u64(),
        Some(held_at)
    );
    for (p, _) in &files {
        std::fs::remove_file(a.path(p)).unwrap();
    }
    let v = primary_version(&primary);
    assert!(v > held_at);
    // the mirror's cursor reaches the replicator on its next ack (every 500 ms)
    std::thread::sleep(Duration::from_secs(1));
    let out = crate::support::strait_ok(&["gc", &primary.url(), "--token", &primary.token]);
    assert!(out.contains(&format!("kept {n_slices}")), "{out}");
    assert_eq!(
        block_files(&region.fs.data_dir()).len(),
        n_blocks,
        "GC deleted blocks a mirror still references"
    );

    // B, still before the deletion, reads the files: right bytes, from the primary's store
    let b = mirror.mount(&[]);
    for (p, d) in &files {
        let got = std::fs::read(b.path(p)).unwrap();
        assert!(&got == d, "{p}: the paused mirror read other bytes");
    }
    wait_until("the blocks read are kept", Duration::from_secs(10), || {
        block_files(&mirror.data_dir()).len() == n_blocks
    });

    // B catches up; GC at A now deletes, and B drops its copies when it applies that
    assert_eq!(
        mirror_row(&mirror.addr, &mirror.token)["applied_version"].as_u64(),
        Some(held_at),
        "the pause held while A deleted and collected"
    );
    let out = crate::support::strait_ok(&[
        "mirror",
        "resume",
        "--addr",
        &mirror.addr,
        "--token",
        &mirror.token,
    ]);
    assert!(out.contains("resumed from version"), "{out}");
    wait_applied(&mirror, v, Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(1));
    let out = crate::support::strait_ok(&["gc", &primary.url(), "--token", &primary.token]);
    assert!(
        out.contains(&format!("deleted the blocks of {n_slices} dead slices")),
        "{out}"
    );
    assert!(block_files(&region.fs.data_dir()).is_empty());
    wait_applied(&mirror, primary_version(&primary), Duration::from_secs(30));
    wait_until(
        "the mirror drops its copies",
        Duration::from_secs(20),
        || block_files(&mirror.data_dir()).is_empty(),
    );
    let row = mirror_row(&mirror.addr, &mirror.token);
    assert_eq!(row["blocks"]["deleted_blocks"], n_blocks, "{row}");
}

#[test]
fn only_eager_paths_are_copied_in_the_background() {
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let primary = region.primary(&[]);
    let mirror = Primary::mirror(
        &primary,
        "region-b",
        &region.addrs,
        &["--sync", "lazy", "--sync-rule", "/datasets/*=eager"],
    );
    let a = primary.mount(&[]);
    std::fs::create_dir_all(a.path("datasets/imgs")).unwrap();
    std::fs::create_dir_all(a.path("scratch")).unwrap();
    // the lazy file first, so its blocks are known by name whatever the writes were cut into
    std::fs::write(a.path("scratch/y"), bytes(2, 200_000)).unwrap();
    let lazy_keys: Vec<String> = block_files(&region.fs.data_dir()).into_keys().collect();
    assert!(!lazy_keys.is_empty());
    std::fs::write(a.path("datasets/imgs/x"), bytes(1, 300_000)).unwrap();
    // renamed into the eager tree before it is written: its path at write time decides
    std::fs::write(a.path("scratch/z"), b"").unwrap();
    std::fs::rename(a.path("scratch/z"), a.path("datasets/z")).unwrap();
    std::fs::write(a.path("datasets/z"), bytes(3, 100_000)).unwrap();
    let all_keys: Vec<String> = block_files(&region.fs.data_dir()).into_keys().collect();
    let eager_keys: Vec<String> = all_keys
        .iter()
        .filter(|k| !lazy_keys.contains(k))
        .cloned()
        .collect();
    let eager_bytes: usize = block_files(&region.fs.data_dir())
        .iter()
        .filter(|(k, _)| eager_keys.contains(k))
        .map(|(_, v)| v.len())
        .sum();
    assert_eq!(eager_bytes, 400_000);
    wait_applied(&mirror, primary_version(&primary), Duration::from_secs(30));
    wait_synced(&mirror, Duration::from_secs(30));
    assert_eq!(
        block_files(&mirror.data_dir())
            .into_keys()
            .collect::<Vec<_>>(),
        eager_keys,
        "only /datasets is copied"
    );
    // a lazy file comes over when read
    let b = mirror.mount(&[]);
    assert!(std::fs::read(b.path("scratch/y")).unwrap() == bytes(2, 200_000));
    // kept behind the reader's back
    wait_until(
        "the blocks read at B are kept in B's store",
        Duration::from_secs(10),
        || block_files(&mirror.data_dir()).len() >= all_keys.len(),
    );
    assert_eq!(
        block_files(&mirror.data_dir())
            .into_keys()
            .collect::<Vec<_>>(),
        all_keys
    );
    // and marked: a fresh mount reads it from B's store, without the mirror
    let before = mirror_row(&mirror.addr, &mirror.token)["blocks"]["fallback_reads"].as_u64();
    drop(b);
    let b = mirror.mount(&[]);
    assert!(std::fs::read(b.path("scratch/y")).unwrap() == bytes(2, 200_000));
    let after = mirror_row(&mirror.addr, &mirror.token)["blocks"]["fallback_reads"].as_u64();
    assert_eq!(before, after, "read from B's store");
}

#[test]
fn two_regions_on_garage_s3_the_mirror_serves_its_copies_with_the_link_cut() {
    use strait_devkit::{Faults, Proxy};
    let Some(ga) = crate::support::garage::Garage::start() else {
        return; // not under CI=true, and Garage is not installed (said on stderr)
    };
    let gb = crate::support::garage::Garage::start().expect("a second Garage");
    let rt = crate::support::runtime();
    let region = RegionA::start_on(
        &rt,
        crate::support::mount::TestFs::rocks_on(ga.data_url(), ga.env()),
    );
    let primary = region.primary(&[]);
    // region B reaches A's store only through the link
    let link = Proxy::start_blocking("127.0.0.1:0".parse().unwrap(), ga.s3_addr()).unwrap();
    link.set(Faults::delay(Duration::from_millis(5)));
    let across = ga.data_url_at("", &link.addr().to_string());
    let b_store = gb.data_url_at("region-b", &gb.s3_addr().to_string());
    let mirror = Primary::mirror(
        &primary,
        "region-b",
        &region.addrs,
        &["--data-url", &b_store, "--primary-data-url", &across],
    );
    let a = primary.mount(&[]);
    std::fs::create_dir(a.path("d")).unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..20u64)
        .map(|i| {
            (
                format!("d/f{i}"),
                bytes(i, 100_000 + (i as usize) * 300_000),
            )
        })
        .collect();
    for (p, d) in &files {
        std::fs::write(a.path(p), d).unwrap();
    }
    wait_applied(&mirror, primary_version(&primary), Duration::from_secs(30));
    let row = wait_synced(&mirror, Duration::from_secs(120));
    assert!(
        row["blocks"]["copied_blocks"].as_u64().unwrap() > 0,
        "{row}"
    );
    assert!(
        link.stats()
            .bytes_down
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );

    // cut the link: the mirror's mount reads everything from region B's own store
    link.set(Faults {
        refuse: true,
        ..Faults::delay(Duration::ZERO)
    });
    link.reset();
    let b = mirror.mount(&["--cache-size", "0"]);
    for (p, d) in &files {
        let got = std::fs::read(b.path(p)).unwrap();
        assert!(&got == d, "{p}: other bytes at the mirror");
    }
    let row = mirror_row(&mirror.addr, &mirror.token);
    assert_eq!(row["blocks"]["fallback_reads"], 0, "{row}");

    // a writer at B with S3 in both regions: the blocks reach A's store (link healed)
    link.heal();
    std::fs::write(b.path("d/from-b"), bytes(99, 5 << 20)).unwrap();
    assert!(std::fs::read(a.path("d/from-b")).unwrap() == bytes(99, 5 << 20));
}

/// GetAttr of `ino` at the daemon `m` is connected to: its link count, or the errno.
async fn nlink(m: &mut crate::support::site::Site, ino: u64) -> Result<u32, i32> {
    let r =
        m.c.get_attr(m.req(strait_proto::meta::InodeRequest {
            ctx: Some(Default::default()),
            ino,
        }))
        .await;
    match r {
        Ok(r) => Ok(r.into_inner().attr.map(|a| a.nlink).unwrap_or(u32::MAX)),
        Err(s) => Err(s
            .metadata()
            .get(strait_proto::ERRNO_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1)),
    }
}

#[test]
fn a_file_open_at_the_mirror_lives_until_its_last_close_anywhere() {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::{FileExt, MetadataExt};
    let rt = crate::support::runtime();
    // deleted at its last close, not kept in the trash
    let region = RegionA::start_with(&rt, &["--trash-days", "0"]);
    let primary = region.primary(&[]);
    let mirror = Primary::mirror(&primary, "region-b", &region.addrs, &[]);
    let a = primary.mount(&[]);
    let b = mirror.mount(&[]);

    // created at B, unlinked at B: still written and read through its handle (the pattern
    // of a temporary file; pjdfstest's unlink::open_file_not_freed)
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(b.path("tmpfile"))
        .unwrap();
    f.write_all(b"first").unwrap();
    f.sync_all().unwrap();
    let tmp_ino = f.metadata().unwrap().ino();
    std::fs::remove_file(b.path("tmpfile")).unwrap();
    assert!(!b.path("tmpfile").exists());
    f.write_all_at(b"second", 5)
        .expect("a write to an unlinked file still open at the mirror");
    f.sync_all()
        .expect("an fsync of an unlinked file still open at the mirror");
    let mut got = String::new();
    f.rewind().unwrap();
    f.read_to_string(&mut got).unwrap();
    assert_eq!(got, "firstsecond");

    // written at A, opened at B, unlinked at A: B still reads it whole
    let data = bytes(11, 300_000);
    std::fs::write(a.path("shared"), &data).unwrap();
    wait_applied(&mirror, primary_version(&primary), Duration::from_secs(30));
    let g = std::fs::File::open(b.path("shared")).unwrap();
    let shared_ino = g.metadata().unwrap().ino();
    // a change forwarded from B first holds every file open in B at the primary (the
    // background does too, within a second; this makes the order certain)
    std::fs::write(b.path("other"), b"x").unwrap();
    std::fs::rename(b.path("other"), b.path("other2")).unwrap();
    std::fs::remove_file(a.path("shared")).unwrap();
    wait_applied(&mirror, primary_version(&primary), Duration::from_secs(30));
    rt.block_on(async {
        let mut pm = crate::support::site::Site::connect(&primary.addr, &primary.token).await;
        let mut mm = crate::support::site::Site::connect(&mirror.addr, &mirror.token).await;
        for ino in [tmp_ino, shared_ino] {
            assert_eq!(
                nlink(&mut pm, ino).await,
                Ok(0),
                "inode {ino}, unlinked and open at the mirror, at the primary"
            );
            assert_eq!(
                nlink(&mut mm, ino).await,
                Ok(0),
                "inode {ino}, unlinked and open at the mirror, at the mirror"
            );
        }
    });
    let mut back = vec![0; data.len()];
    g.read_exact_at(&mut back, 0).unwrap();
    assert!(back == data, "the unlinked file read back differs at B");

    // open at A, unlinked at A: a mount at B that ends its session deletes nothing at the
    // mirror (the primary decides when the file goes; the mirror applies that)
    std::fs::write(a.path("held-at-a"), b"kept").unwrap();
    let h = std::fs::File::open(a.path("held-at-a")).unwrap();
    let held_ino = h.metadata().unwrap().ino();
    std::fs::remove_file(a.path("held-at-a")).unwrap();
    wait_applied(&mirror, primary_version(&primary), Duration::from_secs(30));
    drop(mirror.mount(&[]));
    rt.block_on(async {
        let mut mm = crate::support::site::Site::connect(&mirror.addr, &mirror.token).await;
        assert_eq!(
            nlink(&mut mm, held_ino).await,
            Ok(0),
            "inode {held_ino}, open at A and unlinked, at the mirror after a session there ended"
        );
    });
    let (same, _, why) = crate::support::site::compare(&primary, &mirror);
    assert!(same, "the regions differ: {why}");
    drop(h);

    // closed at B: the primary deletes both, and the mirror follows
    drop(f);
    drop(g);
    rt.block_on(async {
        let mut pm = crate::support::site::Site::connect(&primary.addr, &primary.token).await;
        let start = Instant::now();
        for ino in [tmp_ino, shared_ino] {
            loop {
                match nlink(&mut pm, ino).await {
                    Err(e) if e == libc::ENOENT || e == libc::ESTALE => break,
                    r => assert!(
                        start.elapsed() < Duration::from_secs(60),
                        "inode {ino} still at the primary after its last close at B: {r:?}\n{}",
                        mirror.log_text()
                    ),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
}
