//! Mounts served by a `strait primary` daemon over gRPC: several mounts sharing one file
//! system (close-to-open, locks, no lost update), a mount that dies, a daemon that dies, and
//! the daemon's metrics and health endpoints.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::daemon::Primary;
use crate::support::mount::TestFs;
use crate::support::{later, wait_until};
use sha2::{Digest, Sha256};

fn set_lock(f: &std::fs::File, typ: i32, wait: bool) -> std::io::Result<()> {
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    let cmd = if wait { libc::F_SETLKW } else { libc::F_SETLK };
    loop {
        let rc = unsafe { libc::fcntl(f.as_raw_fd(), cmd, &fl) };
        if rc == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

fn count_files(dir: &Path) -> usize {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            n += if p.is_dir() { count_files(&p) } else { 1 };
        }
    }
    n
}

fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut x = seed | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

#[test]
fn two_mounts_share_one_file_system_with_close_to_open_and_no_lost_update() {
    if !crate::support::require_fuse() {
        return;
    }
    let fs = TestFs::rocks_local(&["--block-size", "1M"]);
    let daemon = Primary::start(&fs.meta_url, &[], &[]);
    let a = daemon.mount(&[]);
    let b = daemon.mount(&[]);
    let seed = crate::support::seed("two_mounts");

    // a shared counter, incremented under an fcntl lock by one writer at each mount: every
    // open sees the value the previous close left, so no increment is lost
    const ROUNDS: usize = 60;
    std::fs::write(a.path("counter"), format!("{:020}", 0)).unwrap();
    let bump = |path: PathBuf| {
        std::thread::spawn(move || {
            for _ in 0..ROUNDS {
                let mut f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .unwrap();
                set_lock(&f, libc::F_WRLCK, true).unwrap();
                let mut s = String::new();
                f.read_to_string(&mut s).unwrap();
                let n: u64 = s
                    .trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("counter holds {s:?}"));
                f.seek(SeekFrom::Start(0)).unwrap();
                f.write_all(format!("{:020}", n + 1).as_bytes()).unwrap();
                // close commits the write, then releases the lock
                drop(f);
            }
        })
    };
    // meanwhile, writers at each mount write files that readers at the other mount check
    // as soon as each is closed
    let writer_reader = |from: PathBuf, to: PathBuf, tag: u64| {
        std::thread::spawn(move || {
            for i in 0..25u64 {
                let len = ((seed ^ (tag * 1000 + i)) % 3_000_000) as usize + 1;
                let data = content(seed ^ (tag << 32) ^ i, len);
                let name = format!("w{tag}-{i}");
                std::fs::write(from.join(&name), &data).unwrap();
                let got = std::fs::read(to.join(&name)).unwrap();
                assert_eq!(
                    sha(&got),
                    sha(&data),
                    "{name}: closed at one mount, opened at the other (seed {seed})"
                );
                // and a rewrite that shrinks the file is seen whole too
                let short = content(i, len / 2);
                std::fs::write(from.join(&name), &short).unwrap();
                assert_eq!(sha(&std::fs::read(to.join(&name)).unwrap()), sha(&short));
            }
        })
    };
    let threads = vec![
        bump(a.path("counter")),
        bump(b.path("counter")),
        writer_reader(a.point.clone(), b.point.clone(), 1),
        writer_reader(b.point.clone(), a.point.clone(), 2),
    ];
    for t in threads {
        t.join().expect("worker");
    }
    let total: u64 = std::fs::read_to_string(b.path("counter"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(total, 2 * ROUNDS as u64, "an increment was lost");

    // directory changes at one mount show at the other within the entry/attribute TTL (1 s)
    std::fs::create_dir(a.path("made-at-a")).unwrap();
    std::fs::write(a.path("made-at-a/x"), b"x").unwrap();
    std::fs::remove_file(a.path("w1-0")).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(std::fs::read(b.path("made-at-a/x")).unwrap(), b"x");
    assert!(!b.path("w1-0").exists());
    a.unmount();
    b.unmount();
}

/// How many of `path`'s pages are in the page cache (mincore over a shared mapping).
fn resident_pages(path: &Path) -> usize {
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let page = 4096;
    let pages = len.div_ceil(page);
    // SAFETY: a read-only shared mapping of `len` bytes of an open file, unmapped below; mincore
    // writes one byte per page into a vector of that many bytes
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "mmap {}", path.display());
        let mut vec = vec![0u8; pages];
        let rc = libc::mincore(p, len, vec.as_mut_ptr());
        libc::munmap(p, len);
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|b| **b & 1 == 1).count()
    }
}

#[test]
fn a_reopened_file_keeps_its_page_cache_until_another_mount_changes_it() {
    if !crate::support::require_fuse() {
        return;
    }
    let fs = TestFs::rocks_local(&["--block-size", "1M"]);
    let daemon = Primary::start(&fs.meta_url, &[], &[]);
    let a = daemon.mount(&[]);
    let b = daemon.mount(&[]);
    const LEN: usize = (2 << 20) + 4096;
    let pages = LEN.div_ceil(4096);
    let first = content(1, LEN);
    std::fs::write(a.path("f"), &first).unwrap();
    assert_eq!(sha(&std::fs::read(b.path("f")).unwrap()), sha(&first));
    // the file did not change: B's next open keeps what its first read cached (the open in
    // resident_pages is that open)
    assert_eq!(
        resident_pages(&b.path("f")),
        pages,
        "an unchanged file lost its page cache at open"
    );
    assert_eq!(sha(&std::fs::read(b.path("f")).unwrap()), sha(&first));

    // rewritten at A, with the same length: B's next open drops what it cached
    let second = content(2, LEN);
    std::fs::write(a.path("f"), &second).unwrap();
    assert_eq!(
        resident_pages(&b.path("f")),
        0,
        "a changed file kept its page cache"
    );
    assert_eq!(sha(&std::fs::read(b.path("f")).unwrap()), sha(&second));

    // rewritten at A with the same length and its mtime put back (as `cp -p` and `tar` do):
    // only the ctime tells, and it is enough
    let mtime = std::fs::metadata(a.path("f")).unwrap().modified().unwrap();
    let third = content(3, LEN);
    std::fs::write(a.path("f"), &third).unwrap();
    let f = std::fs::File::options()
        .write(true)
        .open(a.path("f"))
        .unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    assert_eq!(
        std::fs::metadata(b.path("f")).unwrap().modified().unwrap(),
        mtime,
        "the mtime was put back"
    );
    assert_eq!(
        sha(&std::fs::read(b.path("f")).unwrap()),
        sha(&third),
        "B read the bytes it had cached of a file A rewrote with the same length and mtime"
    );

    // B's own writes: B reads them back, and so does A after B's close
    let fourth = content(4, LEN);
    std::fs::write(b.path("f"), &fourth).unwrap();
    assert_eq!(sha(&std::fs::read(b.path("f")).unwrap()), sha(&fourth));
    assert_eq!(sha(&std::fs::read(a.path("f")).unwrap()), sha(&fourth));
    a.unmount();
    b.unmount();
}

#[test]
fn an_unlinked_file_lives_until_its_last_close_at_any_mount() {
    if !crate::support::require_fuse() {
        return;
    }
    let fs = TestFs::rocks_local(&["--block-size", "1M", "--gc-delay", "0", "--trash-days", "0"]);
    let daemon = Primary::start(&fs.meta_url, &[], &["--gc-interval-s", "1"]);
    let a = daemon.mount(&[]);
    let b = daemon.mount(&[]);
    let baseline = count_files(&fs.data_dir());
    let data = content(11, (3 << 20) + 12345);
    std::fs::write(a.path("shared"), &data).unwrap();
    // many short-lived handles at both mounts (their closes travel in batches), then one
    // handle kept open at B
    for _ in 0..50 {
        drop(std::fs::File::open(a.path("shared")).unwrap());
        drop(std::fs::File::open(b.path("shared")).unwrap());
    }
    let mut held = std::fs::File::open(b.path("shared")).unwrap();
    std::fs::remove_file(a.path("shared")).unwrap();
    assert!(!a.path("shared").exists());
    // A's closes have all reached the daemon by now, and B's last handle keeps the file
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        count_files(&fs.data_dir()) > baseline,
        "a file open at B lost its blocks when A unlinked it"
    );
    let mut got = Vec::new();
    held.read_to_end(&mut got).unwrap();
    assert_eq!(sha(&got), sha(&data), "B reads the unlinked file whole");
    // the last close, at B, deletes it
    drop(held);
    wait_until(
        "the unlinked file's blocks outlived its last close",
        Duration::from_secs(20),
        || {
            if count_files(&fs.data_dir()) <= baseline {
                return Ok(());
            }
            Err(later(|| daemon.log_text()))
        },
    );
    a.unmount();
    b.unmount();
}

#[test]
fn a_killed_mount_frees_its_locks_and_unlinked_files_after_the_session_timeout() {
    if !crate::support::require_fuse() {
        return;
    }
    let fs = TestFs::rocks_local(&["--block-size", "1M", "--gc-delay", "0", "--trash-days", "0"]);
    let daemon = Primary::start(
        &fs.meta_url,
        &[],
        &["--session-timeout-ms", "2000", "--gc-interval-s", "1"],
    );
    let doomed = daemon.mount(&[]);
    let other = daemon.mount(&[]);
    std::fs::write(doomed.path("lockme"), b"l").unwrap();
    let baseline = count_files(&fs.data_dir());
    std::fs::write(doomed.path("big"), content(7, 5 << 20)).unwrap();
    let blocks = count_files(&fs.data_dir());
    assert!(
        blocks >= baseline + 5,
        "the file's blocks are in the store ({blocks})"
    );

    // through the doomed mount: hold a lock, and hold a file open after unlinking it
    let locked = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(doomed.path("lockme"))
        .unwrap();
    set_lock(&locked, libc::F_WRLCK, false).unwrap();
    let held = std::fs::File::open(doomed.path("big")).unwrap();
    std::fs::remove_file(doomed.path("big")).unwrap();
    let contender = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(other.path("lockme"))
        .unwrap();
    let e = set_lock(&contender, libc::F_WRLCK, false).unwrap_err();
    assert_eq!(
        e.raw_os_error(),
        Some(libc::EAGAIN),
        "the lock is held elsewhere"
    );
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        count_files(&fs.data_dir()),
        blocks,
        "an unlinked file held open keeps its blocks"
    );

    // SIGKILL the mount: nothing releases anything but the session timeout
    doomed.kill();
    let start = Instant::now();
    wait_until(
        "the dead mount's lock was never released",
        Duration::from_secs(20),
        || match set_lock(&contender, libc::F_WRLCK, false) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Err(later(|| daemon.log_text())),
            Err(e) => panic!("take the freed lock: {e}"),
        },
    );
    let freed_after = start.elapsed();
    assert!(
        freed_after >= Duration::from_millis(500),
        "the lock must outlive the mount until its session times out ({freed_after:?})"
    );
    // within 30 s of the kill, as the lock
    wait_until(
        "the unlinked file's blocks were never deleted",
        Duration::from_secs(30).saturating_sub(start.elapsed()),
        || {
            if count_files(&fs.data_dir()) <= baseline {
                return Ok(());
            }
            Err(later(|| daemon.log_text()))
        },
    );
    drop(held);
    drop(locked);
    drop(contender);
    assert!(daemon.log_text().contains("no heartbeat"));
    other.unmount();
}

#[test]
fn a_killed_daemon_loses_nothing_and_its_mounts_carry_on() {
    if !crate::support::require_fuse() || !crate::support::require_program("python3") {
        return;
    }
    let fs = TestFs::rocks_local(&["--block-size", "1M"]);
    let mut daemon = Primary::start(&fs.meta_url, &[], &["--session-timeout-ms", "5000"]);
    let m = daemon.mount(&[]);
    for i in 0..20u64 {
        std::fs::write(
            m.path(&format!("before-{i}")),
            content(i, 100_000 + i as usize),
        )
        .unwrap();
    }
    std::fs::create_dir(m.path("dir")).unwrap();
    std::fs::rename(m.path("before-0"), m.path("dir/moved")).unwrap();
    // a file open for writing across the restart, and a lock held across it, by a helper
    // process (a process holding files on the mount must not start the daemon: the fork's
    // exec closes them, and closing a file on the mount waits for the daemon)
    let holder_script = r#"
import fcntl, os, sys
f = open(sys.argv[1], "w+b")
f.write(b"first half|"); f.flush(); os.fsync(f.fileno())
fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
sys.stdin.readline()
f.write(b"second half"); f.flush(); os.fsync(f.fileno())
f.close()
print("done", flush=True)
"#;
    let mut holder = std::process::Command::new("python3")
        .arg("-c")
        .arg(holder_script)
        .arg(m.path("open-across"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut holder_out = std::io::BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut holder_out, &mut line).unwrap();
    assert_eq!(line.trim(), "held");

    daemon.kill();
    // a call made while the daemon is down waits for it and then succeeds
    let p = m.path("made-during-outage");
    let during = std::thread::spawn(move || std::fs::write(p, b"patient"));
    std::thread::sleep(Duration::from_millis(1500));
    daemon.restart();
    during
        .join()
        .unwrap()
        .expect("the call made during the outage succeeds");

    // the lock is still held across the restart: another owner cannot take it
    let contender = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("open-across"))
        .unwrap();
    let e = set_lock(&contender, libc::F_WRLCK, false).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
    drop(contender);
    holder.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut holder_out, &mut line).unwrap();
    assert_eq!(line.trim(), "done");
    assert!(holder.wait().unwrap().success());
    assert_eq!(
        std::fs::read(m.path("open-across")).unwrap(),
        b"first half|second half"
    );
    for i in 1..20u64 {
        let got = std::fs::read(m.path(&format!("before-{i}"))).unwrap();
        assert_eq!(
            sha(&got),
            sha(&content(i, 100_000 + i as usize)),
            "before-{i}"
        );
    }
    assert_eq!(
        sha(&std::fs::read(m.path("dir/moved")).unwrap()),
        sha(&content(0, 100_000))
    );
    assert_eq!(
        std::fs::read(m.path("made-during-outage")).unwrap(),
        b"patient"
    );
    assert!(
        m.log_text().contains("resumed session"),
        "the mount resumed its session: {}",
        m.log_text()
    );
    // a second mount started now sees everything too
    let m2 = daemon.mount(&[]);
    assert_eq!(std::fs::read_dir(m2.path("")).unwrap().count(), 22);
    m2.unmount();
    m.unmount();
    assert!(daemon.terminate(), "SIGTERM stops the daemon cleanly");
}

#[test]
fn metrics_and_health_are_served() {
    if !crate::support::require_fuse() {
        return;
    }
    let fs = TestFs::rocks_local(&[]);
    let daemon = Primary::start(&fs.meta_url, &[], &[]);
    let m = daemon.mount(&[]);
    std::fs::write(m.path("f"), b"x").unwrap();
    // healthy, then its background workers, each running
    let (code, body) = daemon.http_get("/health");
    assert_eq!(code, 200, "{body}");
    let mut lines = body.lines();
    assert_eq!(lines.next(), Some("ok"), "{body}");
    let workers: Vec<&str> = lines.collect();
    for w in [
        "worker session-expiry: running",
        "worker metrics-http: running",
    ] {
        assert!(workers.contains(&w), "{body}");
    }
    assert!(workers.iter().all(|w| w.ends_with(": running")), "{body}");
    let (code, text) = daemon.http_get("/metrics");
    assert_eq!(code, 200);
    assert!(
        text.contains("strait_rpc_duration_seconds_bucket{op=\"create\",outcome=\"ok\""),
        "{text}"
    );
    assert!(text.contains("strait_sessions 1"), "{text}");
    // what the RocksDB engine holds in memory, by part, and the daemon's resident memory
    let gauge = |name: &str| -> i64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in {text}"))
    };
    let memtables = gauge("strait_engine_memory_bytes{part=\"memtables\"} ");
    assert!(
        memtables > 0,
        "the writes made are in a memtable: {memtables}"
    );
    gauge("strait_engine_memory_bytes{part=\"block_cache\"} ");
    gauge("strait_engine_memory_bytes{part=\"table_readers\"} ");
    let resident = gauge("strait_resident_memory_bytes ");
    assert!(
        resident > memtables && resident < 4 << 30,
        "resident {resident} bytes, memtables {memtables}"
    );
    let missing = crate::support::undocumented_metrics(&text);
    assert!(missing.is_empty(), "not in docs/metrics.md: {missing:?}");
    let version: i64 = text
        .lines()
        .find_map(|l| l.strip_prefix("strait_primary_version "))
        .and_then(|v| v.trim().parse().ok())
        .expect("strait_primary_version");
    assert!(version >= 2, "format and create are versions ({version})");
    let (code, _) = daemon.http_get("/nowhere");
    assert_eq!(code, 404);

    // an open brings chunk 0's slice list along: a fresh mount reads a small file whole
    // with one Open and no ReadChunk
    let ok_calls = |text: &str, op: &str| -> u64 {
        let prefix = format!("strait_rpc_duration_seconds_count{{op=\"{op}\",outcome=\"ok\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let data = content(7, 300_000);
    std::fs::write(m.path("g"), &data).unwrap();
    let (_, before) = daemon.http_get("/metrics");
    let m2 = daemon.mount(&[]);
    assert!(
        std::fs::read(m2.path("g")).unwrap() == data,
        "g read back differs"
    );
    let (_, after) = daemon.http_get("/metrics");
    assert_eq!(
        ok_calls(&after, "open"),
        ok_calls(&before, "open") + 1,
        "{after}"
    );
    assert_eq!(
        ok_calls(&after, "read_chunk"),
        ok_calls(&before, "read_chunk"),
        "the first read asked ReadChunk although the open answered chunk 0"
    );
    m2.unmount();
    m.unmount();

    // a mount with a wrong token, or none, fails with one clear line
    let dir = tempfile::tempdir().unwrap();
    let url = daemon.url();
    let mnt = dir.path().to_str().unwrap();
    let (code, err) = crate::support::strait_fails(&["mount", &url, mnt, "--token", "wrong"]);
    assert_eq!(code, 1);
    assert!(err.contains("at least 16 characters"), "{err}");
    let (code, err) =
        crate::support::strait_fails(&["mount", &url, mnt, "--token", "a-wrong-token-0123456789"]);
    assert_eq!(code, 1);
    assert!(
        err.trim_end()
            .lines()
            .last()
            .unwrap_or("")
            .contains("refused our token"),
        "{err}"
    );
    let (code, err) = crate::support::strait_fails(&["mount", &url, mnt]);
    assert_eq!(code, 1);
    assert!(err.contains("needs credentials"), "{err}");
}
