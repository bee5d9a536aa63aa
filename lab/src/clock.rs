//! Clock jumps for one process: the daemon runs with libfaketime preloaded (Debian package
//! `faketime`), reading its offset from a control file that the nemesis rewrites, so the
//! process's wall clock (`CLOCK_REALTIME`, `time`, `gettimeofday`) steps forward or back by
//! minutes while the rest of the machine's does not, as after an NTP step or a VM resumed.
//!
//! How libfaketime 0.9.10 behaves here (checked with a script that steps the file and reads
//! both clocks; see docs/chaos.md):
//! - `FAKETIME_NO_CACHE=1` is needed: with `FAKETIME_CACHE_DURATION` the cache expires by
//!   the faked clock, so after a step back the new offset is not read for minutes;
//! - `FAKETIME_DONT_FAKE_MONOTONIC=1` leaves `CLOCK_MONOTONIC` alone, as a real clock step
//!   does (without it the monotonic clock reads the faked wall time); but with it,
//!   `clock_nanosleep(TIMER_ABSTIME)` fails with EINVAL (Python's `time.sleep` does). Rust's
//!   `thread::sleep` (nanosleep) and tokio's timers (epoll timeouts) do not use it.
//! - The multi-threaded variant (`libfaketimeMT`) is the one for tokio and RocksDB.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Where Debian and others install the multi-threaded libfaketime.
const LIBFAKETIME: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
    "/usr/local/lib/faketime/libfaketimeMT.so.1",
];

/// The library to preload, or why there is none.
pub fn library() -> Result<PathBuf> {
    match LIBFAKETIME.iter().map(Path::new).find(|p| p.exists()) {
        Some(p) => Ok(p.to_path_buf()),
        None => bail!(
            "libfaketime is not installed (apt-get install faketime): looked for {}",
            LIBFAKETIME.join(", ")
        ),
    }
}

/// One process's clock, steered through its control file.
pub struct FakeClock {
    file: PathBuf,
    lib: PathBuf,
}

impl FakeClock {
    /// A clock at offset 0, steered through `file` (written now).
    pub fn new(file: &Path) -> Result<FakeClock> {
        let c = FakeClock {
            file: file.to_path_buf(),
            lib: library()?,
        };
        c.set_offset_s(0)?;
        Ok(c)
    }

    /// The environment the process must start with.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), self.lib.to_string_lossy().into_owned()),
            (
                "FAKETIME_TIMESTAMP_FILE".into(),
                self.file.to_string_lossy().into_owned(),
            ),
            ("FAKETIME_NO_CACHE".into(), "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ]
    }

    /// Step the process's wall clock to `offset_s` seconds from the machine's (negative:
    /// back). The file is replaced whole (a rename), so the library never reads half of it.
    pub fn set_offset_s(&self, offset_s: i64) -> Result<()> {
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, format!("{offset_s:+}\n"))
            .with_context(|| format!("write {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.file)
            .with_context(|| format!("replace {}", self.file.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process under the clock sees its wall clock step back and forward with the file,
    /// and its monotonic clock go on as before. Skipped (with a line saying so) without
    /// libfaketime, unless CI is set.
    #[test]
    fn a_process_under_the_clock_steps_with_its_file() {
        if let Err(why) = library() {
            assert!(std::env::var("CI").is_err(), "{why:#}");
            eprintln!("skipped: {why:#}");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let c = FakeClock::new(&t.path().join("clock")).unwrap();
        // `date +%s` three times, the file stepped in between by the shell itself
        let script = format!(
            "date +%s; echo -600 > {f}.tmp && mv {f}.tmp {f}; date +%s; echo +3600 > {f}.tmp && mv {f}.tmp {f}; date +%s",
            f = t.path().join("clock").display()
        );
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .envs(c.env())
            .output()
            .unwrap();
        let secs: Vec<i64> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect();
        let now = strait_ids::clock::now_s() as i64;
        assert_eq!(secs.len(), 3, "{out:?}");
        assert!((secs[0] - now).abs() < 5, "{secs:?} at {now}");
        assert!((secs[1] - (now - 600)).abs() < 5, "{secs:?} at {now}");
        assert!((secs[2] - (now + 3600)).abs() < 5, "{secs:?} at {now}");
        // this process's file, read by the library the same way
        c.set_offset_s(-120).unwrap();
        assert_eq!(
            std::fs::read_to_string(t.path().join("clock")).unwrap(),
            "-120\n"
        );
    }
}
