//! POSIX locks through the mount (a blocked F_SETLKW gives up with EINTR when its process is
//! signalled, and the mount stays responsive), and deletion of dead slices' blocks.

use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::mount::TestFs;
use crate::support::strait_ok;

fn count_blocks(dir: &std::path::Path) -> usize {
    let mut n = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                n += count_blocks(&p);
            } else {
                n += 1;
            }
        }
    }
    n
}

#[test]
fn a_signalled_lock_waiter_gets_eintr_and_the_mount_stays_responsive() {
    if !crate::support::require_fuse() || !crate::support::require_program("python3") {
        return;
    }
    let fs = TestFs::rocks_local(&[]);
    let m = fs.mount(&[]);
    let path = m.path("locked");
    std::fs::write(&path, b"data").unwrap();
    // this process takes a write lock on the whole file
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &fl) };
    assert_eq!(rc, 0, "take the lock: {}", std::io::Error::last_os_error());
    // another process blocks in F_SETLKW; an alarm interrupts it after one second, and its
    // handler raises, so the process only gets on if the request was answered with EINTR
    let script2 = r#"
import fcntl, signal, sys
def boom(*a):
    raise TimeoutError()
signal.signal(signal.SIGALRM, boom)
signal.alarm(1)
f = open(sys.argv[1], "r+")
try:
    fcntl.lockf(f, fcntl.LOCK_EX)
    print("acquired")
except TimeoutError:
    print("interrupted")
"#;
    let start = Instant::now();
    let out = Command::new("timeout")
        .args(["-s", "KILL", "20", "python3", "-c", script2])
        .arg(&path)
        .output()
        .unwrap();
    let took = start.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(
        stdout,
        "interrupted",
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        took < Duration::from_secs(20),
        "the interrupted waiter hung for {took:?}"
    );
    // the mount still answers
    assert_eq!(std::fs::read(&path).unwrap(), b"data");
    // after we unlock, a blocking waiter gets the lock
    fl.l_type = libc::F_UNLCK as i16;
    assert_eq!(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &fl) }, 0);
    let script3 = r#"
import fcntl, sys
f = open(sys.argv[1], "r+")
fcntl.lockf(f, fcntl.LOCK_EX)
print("acquired")
"#;
    let out = Command::new("timeout")
        .args(["-s", "KILL", "20", "python3", "-c", script3])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "acquired");
    drop(f);
    m.unmount();
}

#[test]
fn dead_slices_blocks_are_deleted_after_the_delay() {
    if !crate::support::require_fuse() {
        return;
    }
    let fs = TestFs::rocks_local(&[
        "--gc-delay",
        "0",
        "--trash-days",
        "0",
        "--block-size",
        "64K",
    ]);
    let m = fs.mount(&[]);
    std::fs::write(m.path("keep"), vec![1u8; 100_000]).unwrap();
    std::fs::write(m.path("drop"), vec![2u8; 300_000]).unwrap();
    std::fs::write(m.path("shrink"), vec![3u8; 200_000]).unwrap();
    m.unmount();
    let all = count_blocks(&fs.data_dir());
    assert_eq!(all, 2 + 5 + 4, "blocks before deletion");
    let m = fs.mount(&[]);
    std::fs::remove_file(m.path("drop")).unwrap();
    // truncating to zero kills the slice of "shrink"; a rewrite adds one block
    std::fs::write(m.path("shrink"), b"small").unwrap();
    m.unmount();
    let out = strait_ok(&["gc", &fs.meta_url]);
    assert!(out.contains("deleted the blocks of 2 dead slices"), "{out}");
    assert_eq!(count_blocks(&fs.data_dir()), 2 + 1, "blocks after deletion");
    let m = fs.mount(&[]);
    assert_eq!(std::fs::read(m.path("keep")).unwrap(), vec![1u8; 100_000]);
    assert_eq!(std::fs::read(m.path("shrink")).unwrap(), b"small");
    m.unmount();
    let status = strait_ok(&["status", &fs.meta_url]);
    assert!(status.contains("dead slices:   0"), "{status}");
}
