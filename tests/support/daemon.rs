//! A site daemon (`strait primary`, or `strait mirror` via [`Primary::mirror`]) run by a
//! test: free ports, a random token, a log that survives restarts, and helpers to mount it,
//! kill it and read its metrics.

use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use super::free_port;
use super::mount::Mount;
use super::wait_until;

pub struct Primary {
    /// host:port of the metadata service
    pub addr: String,
    /// host:port of /metrics and /health
    pub metrics_addr: String,
    pub token: String,
    pub log: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
    starts: usize,
    /// The line the daemon prints on stdout once it serves.
    ready: &'static str,
    dir: tempfile::TempDir,
}

impl Primary {
    /// The daemon's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Start a daemon serving the formatted engine `meta_url`; `extra` are more flags.
    pub fn start(meta_url: &str, env: &[(String, String)], extra: &[&str]) -> Primary {
        let dir = tempfile::tempdir().expect("tempdir");
        let addr = format!("127.0.0.1:{}", free_port());
        let metrics_addr = format!("127.0.0.1:{}", free_port());
        let token = format!("test-token-{:016x}", rand::random::<u64>());
        let mut args: Vec<String> = vec![
            "primary".into(),
            "--meta-url".into(),
            meta_url.into(),
            "--listen".into(),
            addr.clone(),
            "--metrics-listen".into(),
            metrics_addr.clone(),
            "--token".into(),
            token.clone(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        // a primary that ships presents the test clusters' primary token
        if extra.contains(&"--replicator") && !extra.contains(&"--replicator-token") {
            args.push("--replicator-token".into());
            args.push(super::tokens::PRIMARY_TOKEN.into());
        }
        let mut p = Primary {
            addr,
            metrics_addr,
            token,
            log: dir.path().join("primary.log"),
            args,
            env: env.to_vec(),
            child: None,
            starts: 0,
            ready: "strait primary: serving",
            dir,
        };
        p.spawn();
        p
    }

    /// Start a mirror of `primary` (same token) that follows the replicator nodes `replicator`,
    /// with its own RocksDB and object store in a directory of its own (unless `extra` names a
    /// `--data-url`), and the primary's environment; `extra` are more flags.
    pub fn mirror(primary: &Primary, id: &str, replicator: &[String], extra: &[&str]) -> Primary {
        Self::mirror_via(primary, &primary.addr, id, replicator, extra)
    }

    /// [`Primary::mirror`] that reaches the primary at `via` (a proxy in front of it).
    pub fn mirror_via(
        primary: &Primary,
        via: &str,
        id: &str,
        replicator: &[String],
        extra: &[&str],
    ) -> Primary {
        let dir = tempfile::tempdir().expect("tempdir");
        let addr = format!("127.0.0.1:{}", free_port());
        let metrics_addr = format!("127.0.0.1:{}", free_port());
        let mut args: Vec<String> = vec![
            "mirror".into(),
            "--id".into(),
            id.into(),
            "--meta-url".into(),
            format!("rocksdb://{}", dir.path().join("meta").display()),
            "--listen".into(),
            addr.clone(),
            "--metrics-listen".into(),
            metrics_addr.clone(),
            "--token".into(),
            primary.token.clone(),
            "--primary".into(),
            via.to_string(),
            "--replicator".into(),
            replicator.join(","),
            "--replicator-token".into(),
            super::tokens::MIRROR_TOKEN.into(),
        ];
        if !extra.contains(&"--data-url") {
            args.push("--data-url".into());
            args.push(format!("file://{}", dir.path().join("data").display()));
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut m = Primary {
            addr,
            metrics_addr,
            token: primary.token.clone(),
            log: dir.path().join("mirror.log"),
            args,
            // the primary's environment: object store credentials
            env: primary.env.clone(),
            child: None,
            starts: 0,
            ready: "strait mirror: serving",
            dir,
        };
        m.spawn();
        m
    }

    /// The daemon's own directory (kept across restarts).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// A mirror's own object store (a local directory).
    pub fn data_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    pub fn url(&self) -> String {
        format!("strait://{}", self.addr)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn launch(&self) -> std::process::Child {
        super::spawn_strait(self.args.clone(), self.env.clone(), self.log.clone(), true)
            .expect("spawn strait primary")
    }

    fn spawn(&mut self) {
        self.child = Some(self.launch());
        self.starts += 1;
        let start = Instant::now();
        let what = format!("strait {} did not start", self.args[0]);
        wait_until(&what, Duration::from_secs(30), || {
            if self.log_text().matches(self.ready).count() >= self.starts {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    // on a restart, the port of the killed daemon may have been taken as the
                    // local port of some outgoing connection meanwhile: try again for a while
                    let text = self.log_text();
                    if self.starts > 1
                        && text.contains("Address already in use")
                        && start.elapsed() < Duration::from_secs(20)
                    {
                        std::thread::sleep(Duration::from_millis(200));
                        self.child = Some(self.launch());
                        return Err(text);
                    }
                    panic!("{} exited ({status}): {text}", self.args[0]);
                }
            }
            Err(self.log_text())
        });
    }

    /// SIGKILL the daemon.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start the daemon again with the same settings (after [`Primary::kill`]).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGTERM the daemon and wait for it; returns whether it exited successfully.
    pub fn terminate(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return false;
        };
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        c.wait().map(|s| s.success()).unwrap_or(false)
    }

    /// Whether the daemon process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Mount the daemon's file system with its token.
    pub fn mount(&self, extra: &[&str]) -> Mount {
        let mut args: Vec<&str> = vec!["--token", &self.token];
        args.extend_from_slice(extra);
        Mount::start_at(&self.url(), &self.env, &args)
    }

    /// GET `path` from the metrics endpoint: (status code, body).
    pub fn http_get(&self, path: &str) -> (u16, String) {
        super::http_get(&self.metrics_addr, path)
    }
}

impl Drop for Primary {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
