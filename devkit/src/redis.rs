//! A throwaway `redis-server` on 127.0.0.1 for one test: no persistence, its own directory,
//! killed when dropped (the tests reach it through ``tests/support/redis_server.rs``, which skips
//! or fails when the program is missing).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::free_port;
use crate::process::{open_log, spawn_tied_with};

/// How long a started server may take to answer PING.
const START_TIMEOUT_MS: u64 = 10_000;
/// Ports tried before giving up (another process may take the port `free_port` found).
const START_ATTEMPTS_MAX: usize = 5;

pub struct RedisServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
    /// With TLS: the TLS port and its flags (the plain port stays, for the harness's PING).
    tls: Option<(u16, Vec<String>)>,
}

/// A TLS listener for [`RedisServer::start_tls`]: the server's certificate and key, the CA
/// client certificates must chain to, and whether clients must present one.
pub struct RedisTls {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    pub ca: std::path::PathBuf,
    pub client_certificates: bool,
}

impl RedisServer {
    /// Start a server that answers PING, on a free port and in a temporary directory.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(None)
    }

    /// [`RedisServer::start`] that also listens for TLS (`rediss://`, [`RedisServer::tls_url`]).
    pub fn start_tls(tls: &RedisTls) -> anyhow::Result<Self> {
        Self::start_with(Some(tls))
    }

    fn start_with(tls: Option<&RedisTls>) -> anyhow::Result<Self> {
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS_MAX {
            let port = free_port().context("find a free port for redis-server")?;
            let tls = match tls {
                Some(t) => {
                    let tls_port = free_port().context("find a free port for redis-server")?;
                    let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
                    let flags = vec![
                        "--tls-port".to_string(),
                        tls_port.to_string(),
                        "--tls-cert-file".into(),
                        path(&t.cert),
                        "--tls-key-file".into(),
                        path(&t.key),
                        "--tls-ca-cert-file".into(),
                        path(&t.ca),
                        "--tls-auth-clients".into(),
                        if t.client_certificates { "yes" } else { "no" }.into(),
                    ];
                    Some((tls_port, flags))
                }
                None => None,
            };
            match Self::spawn_on(port, tls) {
                Ok(server) => return Ok(server),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("no attempt made")))
    }

    fn spawn_on(port: u16, tls: Option<(u16, Vec<String>)>) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().context("create a directory for redis-server")?;
        let extra = tls.as_ref().map(|t| t.1.clone()).unwrap_or_default();
        let child = launch(port, dir.path(), &extra)?;
        let mut server = Self {
            child,
            port,
            dir,
            tls,
        };
        server.wait_ready()?;
        Ok(server)
    }

    /// Kill the server and start a new one on the same port (with no data: nothing is
    /// persisted), as a crash and restart of the Redis machine.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let extra = self.tls.as_ref().map(|t| t.1.clone()).unwrap_or_default();
        let restarted = launch(self.port, self.dir.path(), &extra).and_then(|child| {
            self.child = child;
            self.wait_ready()
        });
        if let Err(e) = restarted {
            panic!("restart redis-server on port {}: {e:#}", self.port);
        }
    }

    /// Send one command and return the first line of its reply (`+OK`, `:1`, `$5`, `-ERR …`).
    pub fn command(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut s =
            TcpStream::connect(("127.0.0.1", self.port)).context("connect to redis-server")?;
        s.set_read_timeout(Some(Duration::from_millis(START_TIMEOUT_MS)))?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        s.write_all(req.as_bytes())
            .context("send a command to redis-server")?;
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while !line.ends_with(b"\r\n") {
            s.read_exact(&mut byte)
                .context("read a reply from redis-server")?;
            line.push(byte[0]);
        }
        line.truncate(line.len() - 2);
        Ok(String::from_utf8_lossy(&line).into_owned())
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_millis(START_TIMEOUT_MS);
        loop {
            if let Some(status) = self.child.try_wait().context("wait for redis-server")? {
                bail!(
                    "redis-server on port {} exited with {status}:\n{}",
                    self.port,
                    self.log()
                );
            }
            if self.ping() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "redis-server on port {} did not answer PING within {START_TIMEOUT_MS} ms:\n{}",
                    self.port,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let timeout = Some(Duration::from_millis(500));
        if s.set_read_timeout(timeout).is_err() || s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    /// The server's log so far, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// URL of database `db` on this server.
    pub fn url(&self, db: u32) -> String {
        format!("redis://127.0.0.1:{}/{db}", self.port)
    }

    /// URL of database `db` over TLS (a server started with [`RedisServer::start_tls`]), with
    /// strait's parameters `query` (`ca=...`, `cert=...&key=...`), or None without TLS.
    pub fn tls_url(&self, db: u32, query: &str) -> Option<String> {
        let (port, _) = self.tls.as_ref()?;
        let q = if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        };
        Some(format!("rediss://127.0.0.1:{port}/{db}{q}"))
    }
}

fn launch(port: u16, dir: &std::path::Path, extra: &[String]) -> anyhow::Result<Child> {
    let dir = dir.to_path_buf();
    let extra = extra.to_vec();
    // the log is opened by the thread that starts the server (`spawn_tied_with`)
    spawn_tied_with(move || {
        let (log, log_err) = open_log(&dir.join("redis.log"), true)?;
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(&extra)
            .arg("--dir")
            .arg(&dir)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        Ok(cmd)
    })
    .context("spawn redis-server")
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
