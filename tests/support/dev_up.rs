//! A running `strait dev up` for a test: started with the flags given, ready once it says so,
//! stopped (SIGTERM: it unmounts and stops its daemons) when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `strait dev up`, stopped with SIGTERM when dropped (it unmounts both regions
/// and stops its daemons and Garages).
pub struct DevUp {
    child: Child,
    pub dir: PathBuf,
    log: PathBuf,
}

impl DevUp {
    pub fn start(dir: &Path, extra: &[&str]) -> DevUp {
        Self::start_with_env(dir, extra, &[])
    }

    /// [`DevUp::start`] with more variables in dev up's environment (an operator's own).
    pub fn start_with_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> DevUp {
        let log = dir.with_extension("log");
        let mut cmd = Command::new(super::strait_bin());
        cmd.args(["dev", "up", "--dir"])
            .arg(dir)
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null());
        let log_path = log.clone();
        let child = strait_devkit::process::spawn_tied_with(move || {
            let (out, err) = strait_devkit::process::open_log(&log_path, false)?;
            cmd.stdout(out).stderr(err);
            Ok(cmd)
        })
        .expect("start strait dev up");
        let mut d = DevUp {
            child,
            dir: dir.to_path_buf(),
            log,
        };
        super::wait_until(
            "strait dev up was not ready",
            Duration::from_secs(180),
            || {
                let text = std::fs::read_to_string(&d.log).unwrap_or_default();
                if text.contains("strait dev: ready") {
                    return Ok(());
                }
                if let Ok(Some(st)) = d.child.try_wait() {
                    panic!("strait dev up exited ({st}):\n{text}");
                }
                Err(format!("\n{text}"))
            },
        );
        d
    }

    pub fn topology(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.dir.join("dev.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    pub fn fault(&self, what: &str) -> String {
        let out = Command::new(super::strait_bin())
            .args(["dev", "fault", "--dir"])
            .arg(&self.dir)
            .arg(what)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "dev fault {what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for DevUp {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A [`strait_devkit::cluster::Cluster`]'s mounts (regions A and B), unmounted (lazily) and
/// their processes killed when dropped: a test that fails leaves no mount behind (the
/// cluster stops only its daemons).
pub struct ClusterMounts(Vec<(PathBuf, u32)>);

impl ClusterMounts {
    pub fn of(cluster: &strait_devkit::cluster::Cluster) -> ClusterMounts {
        let t = cluster.topology();
        ClusterMounts(
            [&t.mount_a, &t.mount_b]
                .into_iter()
                .enumerate()
                .filter_map(|(i, m)| Some((m.clone()?, cluster.mount_pid(i).ok()?)))
                .collect(),
        )
    }
}

impl Drop for ClusterMounts {
    fn drop(&mut self) {
        for (point, pid) in &self.0 {
            let mounted = std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap_or_default()
                .contains(&format!(" {} ", point.display()));
            if mounted {
                let _ = Command::new("umount").arg("-l").arg(point).status();
            }
            // a mount whose daemon is gone may outlive its unmount, retrying a call
            kill_mount_process(*pid, point);
        }
    }
}

/// SIGKILL `pid` if it still is the `strait mount` of `point`.
pub fn kill_mount_process(pid: u32, point: &Path) {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let ours =
        args.contains(&b"mount".as_slice()) && args.contains(&point.as_os_str().as_encoded_bytes());
    if ours {
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
    }
}

/// Start `cfg`'s cluster, waiting for the replicator's leader as `strait dev up` does, with
/// the guard of its mounts.
pub fn start_cluster(
    cfg: &strait_devkit::cluster::ClusterConfig,
    rt: &tokio::runtime::Runtime,
) -> (strait_devkit::cluster::Cluster, ClusterMounts) {
    let cluster =
        strait_devkit::cluster::Cluster::start(cfg, rt, &mut |_| {}).expect("start the regions");
    let mounts = ClusterMounts::of(&cluster);
    (cluster, mounts)
}
