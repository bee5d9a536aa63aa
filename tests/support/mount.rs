//! Formatting and mounting strait file systems with the real binary.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::strait_bin;

/// A file system in a temporary directory: metadata and data URLs.
pub struct TestFs {
    pub dir: tempfile::TempDir,
    pub meta_url: String,
    pub data_url: String,
    pub env: Vec<(String, String)>,
}

impl TestFs {
    /// RocksDB metadata and a local-directory object store, formatted.
    pub fn rocks_local(extra: &[&str]) -> TestFs {
        let dir = tempfile::tempdir().expect("tempdir");
        let meta_url = format!("rocksdb://{}", dir.path().join("meta").display());
        let data_url = format!("file://{}", dir.path().join("data").display());
        let fs = TestFs {
            dir,
            meta_url,
            data_url,
            env: vec![],
        };
        fs.format(extra);
        fs
    }

    /// RocksDB metadata in the file system's own directory and the object store `data_url`
    /// (with `env` for its credentials), formatted.
    pub fn rocks_on(data_url: String, env: Vec<(String, String)>) -> TestFs {
        let dir = tempfile::tempdir().expect("tempdir");
        let meta_url = format!("rocksdb://{}", dir.path().join("meta").display());
        let fs = TestFs {
            dir,
            meta_url,
            data_url,
            env,
        };
        fs.format(&[]);
        fs
    }

    pub fn new(
        meta_url: String,
        data_url: String,
        env: Vec<(String, String)>,
        extra: &[&str],
    ) -> TestFs {
        let dir = tempfile::tempdir().expect("tempdir");
        let fs = TestFs {
            dir,
            meta_url,
            data_url,
            env,
        };
        fs.format(extra);
        fs
    }

    fn format(&self, extra: &[&str]) {
        let mut args = vec!["format", &self.meta_url, &self.data_url];
        args.extend_from_slice(extra);
        let out = Command::new(strait_bin())
            .args(&args)
            .envs(self.env.iter().cloned())
            .output()
            .expect("format");
        assert!(
            out.status.success(),
            "format: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn mount(&self, extra: &[&str]) -> Mount {
        Mount::start(self, extra)
    }
}

/// A running `strait mount` process (foreground mode, as a child).
pub struct Mount {
    pub point: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

fn mounted(point: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let target = point.to_string_lossy().to_string();
    info.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let dash = f.iter().position(|x| *x == "-").unwrap_or(0);
        dash > 4 && f[4] == target && f.get(dash + 2).is_some_and(|s| s.starts_with("strait:"))
    })
}

impl Mount {
    pub fn start(fs: &TestFs, extra: &[&str]) -> Mount {
        Mount::start_at(&fs.meta_url, &fs.env, extra)
    }

    /// Mount `meta_url` (an engine or a site daemon's strait:// address).
    pub fn start_at(meta_url: &str, env: &[(String, String)], extra: &[&str]) -> Mount {
        let dir = tempfile::tempdir().expect("tempdir");
        let point = dir.path().join("mnt");
        std::fs::create_dir(&point).expect("mkdir mountpoint");
        let point = std::fs::canonicalize(&point).expect("canonicalize");
        let log = dir.path().join("mount.log");
        let cache = dir.path().join("cache");
        let mut args: Vec<String> = vec![
            "mount".into(),
            meta_url.to_string(),
            point.display().to_string(),
            "--cache-dir".into(),
            cache.display().to_string(),
        ];
        if !extra.contains(&"--cache-size") {
            args.extend(["--cache-size".into(), "1G".into()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let child = super::spawn_strait(args, env.to_vec(), log.clone(), false)
            .expect("spawn strait mount");
        let mut m = Mount {
            point,
            log,
            child: Some(child),
            _dir: dir,
        };
        super::wait_until(
            "strait mount did not mount",
            Duration::from_secs(30),
            || {
                if mounted(&m.point) {
                    return Ok(());
                }
                if let Some(c) = m.child.as_mut() {
                    if let Ok(Some(status)) = c.try_wait() {
                        panic!("strait mount exited ({status}): {}", m.log_text());
                    }
                }
                Err(m.log_text())
            },
        );
        m
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.point.join(rel)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL the mount process and clear the dead mount point.
    pub fn kill(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        lazy_umount(&self.point);
    }

    /// Unmount cleanly and wait for the process to exit successfully.
    pub fn unmount(mut self) {
        let out = Command::new(strait_bin())
            .arg("umount")
            .arg(&self.point)
            .output()
            .expect("umount");
        assert!(
            out.status.success(),
            "umount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(mut c) = self.child.take() {
            let status = c.wait().expect("wait mount");
            assert!(
                status.success(),
                "mount process exited with {status}: {}",
                self.log_text()
            );
        }
    }
}

fn lazy_umount(point: &Path) {
    if let Ok(c) = std::ffi::CString::new(point.as_os_str().as_encoded_bytes()) {
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new(strait_bin())
                .arg("umount")
                .arg(&self.point)
                .output();
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
            lazy_umount(&self.point);
        }
    }
}
