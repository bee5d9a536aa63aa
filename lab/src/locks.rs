//! Lock holders, for checker 9 (fcntl locks exclude each other across the faults, switchovers
//! and failovers included): processes of their own (POSIX locks belong to a process, so
//! threads of the harness could not contend), each taking a write lock on its region's lock
//! file through its region's mount, writing its token at the file's start, holding the lock a
//! moment, reading the token back and letting go. Each hold is one JSON line on stdout.
//!
//! Two holders of one region whose holds overlap in time, or a token read back changed while
//! the lock was held, mean the lock did not exclude. A hold whose I/O failed (its mount died,
//! a daemon was replaced) proves nothing and is left out. Locks taken through a mirror live
//! in the mirror's engine and exclude within its region only (docs/consistency.md), so each
//! region has a lock file of its own.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// One hold of the lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub client: u32,
    /// Wall clock, ms since 1970: just after the lock was granted, and just before it was let
    /// go (the real hold contains both).
    pub acquired_ms: u64,
    pub released_ms: u64,
    /// Every call of the hold succeeded.
    pub ok: bool,
    /// The token read back was another's: someone wrote the file while this one held it.
    pub changed: bool,
    pub note: String,
}

/// F_SETLK of the whole file: Ok(true) taken, Ok(false) held by another (or refused for
/// now: the grace period after a daemon lost its locks), Err otherwise.
fn set_lock(f: &std::fs::File, typ: i32) -> std::io::Result<bool> {
    let lock = libc::flock {
        l_type: typ as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    // SAFETY: a valid descriptor and a valid flock structure
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &lock) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// Hold the lock on `path` again and again for `seconds`, as holder `client`, a line per
/// hold on `out`.
pub fn hold_locks(
    path: &Path,
    client: u32,
    seconds: u64,
    seed: u64,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut rng = StdRng::seed_from_u64(seed ^ (client as u64) << 32 ^ 0x6c6f636b);
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut seq = 0u64;
    while Instant::now() < end {
        let f = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
        {
            Ok(f) => f,
            Err(_) => {
                // the mount dead or being mounted again
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        match set_lock(&f, libc::F_WRLCK) {
            Ok(true) => {}
            Ok(false) => {
                std::thread::sleep(Duration::from_millis(rng.random_range(10..100)));
                continue;
            }
            Err(_) => {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        }
        let acquired_ms = strait_ids::clock::now_ms();
        seq += 1;
        let token = format!("holder {client:>4} hold {seq:>12}\n");
        let mut note = String::new();
        // written and committed (a write buffered at the mount reports a failed commit only
        // at fsync or close: then the hold proves nothing)
        let mut ok = f.write_all_at(token.as_bytes(), 0).is_ok() && f.sync_data().is_ok();
        std::thread::sleep(Duration::from_millis(rng.random_range(20..300)));
        let mut back = vec![0u8; token.len()];
        let read = f.read_exact_at(&mut back, 0);
        let changed = match read {
            // another's token, or the dots the file began with: someone else wrote it since
            Ok(()) => ok && back != token.as_bytes(),
            Err(e) => {
                ok = false;
                note = format!("read back: {e}");
                false
            }
        };
        if changed {
            note = format!("read back {:?}", String::from_utf8_lossy(&back));
        }
        let released_ms = strait_ids::clock::now_ms();
        if let Err(e) = set_lock(&f, libc::F_UNLCK) {
            ok = false;
            note = format!("let go: {e}");
        }
        drop(f);
        let hold = Hold {
            client,
            acquired_ms,
            released_ms,
            ok,
            changed,
            note,
        };
        writeln!(out, "{}", serde_json::to_string(&hold)?)?;
        out.flush()?;
        std::thread::sleep(Duration::from_millis(rng.random_range(10..200)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_takes_writes_reads_back_and_lets_go_the_lock_of_a_local_file() {
        // the holder against a local file system's locks, alone: the mechanics (checker 9's
        // pairs come from holders in separate processes)
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lock");
        std::fs::write(&p, vec![0u8; 64]).unwrap();
        let mut out = vec![];
        hold_locks(&p, 7, 1, 3, &mut out).unwrap();
        let holds: Vec<Hold> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(!holds.is_empty());
        assert!(holds.iter().all(|h| h.ok && !h.changed && h.client == 7));
    }
}
