//! A gRPC client of a site daemon's metadata service, for tests that drive a primary or a
//! mirror without a mount: a session, and the few calls the stories need.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use strait_proto::meta as w;
use strait_proto::meta::meta_service_client::MetaServiceClient;
use tonic::transport::Channel;
use tonic::{Request, Status};

use super::daemon::Primary;
use super::strait_bin;
use super::{later, wait_until};

pub struct Site {
    pub c: MetaServiceClient<Channel>,
    token: String,
    pub sid: u64,
}

fn ctx() -> Option<w::Ctx> {
    Some(w::Ctx::default())
}

/// A client of the metadata service at `addr` (each call's time bounded to 60 s).
pub async fn meta_client(addr: &str) -> MetaServiceClient<Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(60))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    MetaServiceClient::new(ch)
}

/// `msg` with `token` and, unless 0, `session` in its metadata.
pub fn request<T>(msg: T, token: &str, session: u64) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    if session != 0 {
        r.metadata_mut()
            .insert("x-strait-session", session.to_string().parse().unwrap());
    }
    r
}

impl Site {
    /// Connect to the daemon at `addr` and open a session.
    pub async fn connect(addr: &str, token: &str) -> Site {
        let mut s = Site {
            c: meta_client(addr).await,
            token: token.to_string(),
            sid: 0,
        };
        let r =
            s.c.open_session(s.req(w::OpenSessionRequest {
                info: "test client".into(),
                ..Default::default()
            }))
            .await
            .expect("open a session");
        s.sid = r.into_inner().session;
        s
    }

    pub fn req<T>(&self, msg: T) -> Request<T> {
        request(msg, &self.token, self.sid)
    }

    pub async fn mkdir(&mut self, parent: u64, name: &str) -> Result<u64, Status> {
        let r = self.req(w::MkNodRequest {
            ctx: ctx(),
            parent,
            name: name.as_bytes().to_vec(),
            mode: 0o755,
            umask: 0,
            rdev: 0,
        });
        Ok(self.c.mk_dir(r).await?.into_inner().ino)
    }

    /// A regular file made with mknod (no handle stays open).
    pub async fn mknod(&mut self, parent: u64, name: &str) -> Result<u64, Status> {
        let r = self.req(w::MkNodRequest {
            ctx: ctx(),
            parent,
            name: name.as_bytes().to_vec(),
            mode: libc::S_IFREG | 0o644,
            umask: 0,
            rdev: 0,
        });
        Ok(self.c.mk_nod(r).await?.into_inner().ino)
    }

    pub async fn rename(&mut self, parent: u64, from: &str, to: &str) -> Result<(), Status> {
        let r = self.req(w::RenameRequest {
            ctx: ctx(),
            parent,
            name: from.as_bytes().to_vec(),
            new_parent: parent,
            new_name: to.as_bytes().to_vec(),
            flags: 0,
        });
        self.c.rename(r).await.map(|_| ())
    }

    pub async fn chmod(&mut self, ino: u64, mode: u32) -> Result<(), Status> {
        let r = self.req(w::SetAttrRequest {
            ctx: ctx(),
            ino,
            mode: Some(mode),
            ..Default::default()
        });
        self.c.set_attr(r).await.map(|_| ())
    }

    pub async fn lookup(&mut self, parent: u64, name: &str) -> Result<u64, Status> {
        let r = self.req(w::LookupRequest {
            ctx: ctx(),
            parent,
            name: name.as_bytes().to_vec(),
        });
        Ok(self.c.lookup(r).await?.into_inner().ino)
    }

    pub async fn names(&mut self, dir: u64) -> Result<BTreeSet<String>, Status> {
        let r = self.req(w::InodeRequest {
            ctx: ctx(),
            ino: dir,
        });
        Ok(self
            .c
            .read_dir(r)
            .await?
            .into_inner()
            .entries
            .into_iter()
            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
            .filter(|n| n != "." && n != "..")
            .collect())
    }
}

/// `strait mirror status` against `addr`, with `more` arguments: its standard output.
fn status_out(addr: &str, token: &str, more: &[&str]) -> Vec<u8> {
    let out = Command::new(strait_bin())
        .args([
            "mirror",
            "status",
            "--addr",
            addr,
            "--token",
            token,
            "--replicator-token",
            super::replicator::ADMIN_TOKEN,
        ])
        .args(more)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mirror status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `strait mirror status --json` against `addr`.
pub fn status_json(addr: &str, token: &str) -> serde_json::Value {
    serde_json::from_slice(&status_out(addr, token, &["--json"]))
        .expect("mirror status --json is JSON")
}

/// `strait mirror status` against `addr`, as a person reads it.
pub fn status_text(addr: &str, token: &str) -> String {
    String::from_utf8_lossy(&status_out(addr, token, &[])).into_owned()
}

pub fn mirror_row(addr: &str, token: &str) -> serde_json::Value {
    status_json(addr, token)["mirrors"][0].clone()
}

/// `strait fsck --compare`: (matched, version).
pub fn compare(primary: &Primary, mirror: &Primary) -> (bool, u64, String) {
    let out = Command::new(strait_bin())
        .args([
            "fsck",
            "--compare",
            &primary.addr,
            &mirror.addr,
            "--token",
            &primary.token,
            "--digest",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut it = text.split_whitespace();
    let verdict = it.next().unwrap_or_default().to_string();
    let version = it.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!(
        verdict == "match" || verdict == "DIFFER",
        "fsck --compare failed: {} {}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    (verdict == "match", version, text)
}

/// Wait until the mirror has applied `version`.
pub fn wait_applied(mirror: &Primary, version: u64, within: Duration) -> serde_json::Value {
    wait_until(
        &format!("the mirror did not reach version {version}"),
        within,
        || {
            let row = mirror_row(&mirror.addr, &mirror.token);
            if row["applied_version"].as_u64().unwrap_or(0) >= version {
                return Ok(row);
            }
            Err(later(move || format!("{row}\n{}", mirror.log_text())))
        },
    )
}

pub fn primary_version(p: &Primary) -> u64 {
    let out = Command::new(strait_bin())
        .args([
            "mirror", "status", "--addr", &p.addr, "--token", &p.token, "--json",
        ])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["primary_version"].as_u64().unwrap_or(0)
}

/// Wait until the mirror's copy queue is empty; returns its status row.
pub fn wait_synced(mirror: &Primary, within: Duration) -> serde_json::Value {
    wait_until("the mirror's copy queue did not empty", within, || {
        let row = mirror_row(&mirror.addr, &mirror.token);
        if row["blocks"]["pending_blocks"].as_u64() == Some(0) {
            return Ok(row);
        }
        Err(later(move || format!("{row}\n{}", mirror.log_text())))
    })
}

/// The blocks in a local-directory object store: key -> bytes.
pub fn block_files(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.join("chunks")];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                // a put in progress is a temporary name beside its key
                if rel
                    .rsplit('/')
                    .next()
                    .is_some_and(|n| n.split('_').count() == 3)
                {
                    // GC may delete a block between the listing and the read
                    match std::fs::read(&p) {
                        Ok(bytes) => {
                            out.insert(rel, bytes);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => panic!("reading {}: {e}", p.display()),
                    }
                }
            }
        }
    }
    out
}
