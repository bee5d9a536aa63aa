//! A throwaway `redis-server` on 127.0.0.1 for one test: no persistence, its own directory,
//! killed when dropped (the tests reach it through `strait_tests::redis_server`, which skips
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
}

impl RedisServer {
    /// Start a server that answers PING, on a free port and in a temporary directory.
    pub fn start() -> anyhow::Result<Self> {
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS_MAX {
            let port = free_port().context("find a free port for redis-server")?;
            match Self::spawn_on(port) {
                Ok(server) => return Ok(server),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("no attempt made")))
    }

    fn spawn_on(port: u16) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().context("create a directory for redis-server")?;
        let child = launch(port, dir.path())?;
        let mut server = Self { child, port, dir };
        server.wait_ready()?;
        Ok(server)
    }

    /// Kill the server and start a new one on the same port (with no data: nothing is
    /// persisted), as a crash and restart of the Redis machine.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let restarted = launch(self.port, self.dir.path()).and_then(|child| {
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
}

fn launch(port: u16, dir: &std::path::Path) -> anyhow::Result<Child> {
    let dir = dir.to_path_buf();
    // the log is opened by the thread that starts the server (`spawn_tied_with`)
    spawn_tied_with(move || {
        let (log, log_err) = open_log(&dir.join("redis.log"), true)?;
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
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
