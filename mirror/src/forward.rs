//! The mirror's session at the primary: forwarded calls run under it, and it holds the
//! region's open files there.
//!
//! A mount at the mirror opens files at the mirror (the region counts its own handles), so
//! the primary, which decides when an unlinked file's data goes, would not know they are
//! open: an unlink (at the primary, or forwarded from the mirror) of a file open only in this
//! region would free it under its readers. So the mirror holds, under this session, one
//! handle at the primary on every file its region has open (and the handle a create
//! forwarded to the primary opened, for as long as the region keeps that file open), and
//! gives them back once the region closed them: the primary then keeps an unlinked file
//! until its last close anywhere.
//!
//! # To ensure correctness
//! - Before the mirror forwards a call that can unlink a file (`Unlink`, `Rename`), it
//!   brings the holds up to date ([`ForwardSession::sync_holds`]), so a file opened in this
//!   region is held before its unlink reaches the primary. An unlink made elsewhere can still
//!   pass a hold not yet in place (one link round trip after the open: holds are taken in the
//!   background, so an open at the mirror does not wait for the primary).
//! - Holds are recounted from the engine's table of open handles, the one truth (a mount's
//!   session that expires drops its handles there), under one lock, so a sync never gives
//!   back a hold a create just took.
//! - When the primary forgot the session (it restarted), the session is opened again naming
//!   the handles it held, as a mount resumes its own.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use strait_fs_core::meta::Meta;
use strait_proto::meta as w;
use strait_proto::meta::meta_service_client::MetaServiceClient;
use strait_proto::{ERRNO_HEADER, RESUME_HEADER, SESSION_HEADER};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::follower::Primary;
use strait_fs_core::SliceId;
use strait_server::slice_ranges::SliceRanges;

/// Holds taken at the primary at once.
const HOLD_CONCURRENCY: usize = 16;
/// Inodes named in one Release call.
const RELEASE_BATCH: usize = 4096;
/// How often the holds are brought up to date when nothing asks sooner (handles closed in
/// the region are given back at the primary within this).
const SYNC_EVERY: Duration = Duration::from_secs(1);
/// The longest one call to the primary for holds may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The mirror's session at the primary.
pub struct ForwardSession {
    pub(crate) primary: Primary,
    sid: AtomicU64,
    /// The session at the previous primary, named when the first session at a new one is
    /// opened (a promoted mirror's engine lists the sessions the old primary had).
    resume: AtomicU64,
    info: String,
    lock: tokio::sync::Mutex<()>,
    /// The region's handles (the mirror's engine: its table is shared by every session).
    engine: Arc<Meta>,
    /// Handles this session holds at the primary, per inode.
    held: Mutex<HashMap<u64, u32>>,
    /// One sync of the holds at a time; a create's hold is recorded under it too.
    sync_lock: tokio::sync::Mutex<()>,
    wake: tokio::sync::Notify,
    /// The slice ids the primary gave this session, by the mount (its session here) each
    /// range was forwarded for; emptied whenever the session at the primary is opened again,
    /// since the primary knows ranges only by the session that took them (and forgets them
    /// when it restarts).
    granted: Mutex<Granted>,
}

/// [`ForwardSession::granted`]: the ranges, and the session at the primary they belong to.
#[derive(Default)]
struct Granted {
    at_primary: u64,
    by_mount: SliceRanges,
}

impl ForwardSession {
    pub fn new(primary: Primary, mirror_id: &str, engine: Arc<Meta>) -> Arc<Self> {
        Arc::new(ForwardSession {
            primary,
            sid: AtomicU64::new(0),
            resume: AtomicU64::new(0),
            info: format!("mirror {mirror_id}: forwarded calls and the region's open files"),
            lock: tokio::sync::Mutex::new(()),
            engine,
            held: Mutex::new(HashMap::new()),
            sync_lock: tokio::sync::Mutex::new(()),
            wake: tokio::sync::Notify::new(),
            granted: Mutex::new(Granted::default()),
        })
    }

    /// The primary gave `count` slice ids from `first` to session `at_primary` for the
    /// mount whose session here is `mount`. A range given to a session since replaced is
    /// not kept: the primary would refuse its ids under the new one.
    pub(crate) fn granted(&self, at_primary: u64, mount: u64, first: SliceId, count: u32) {
        let mut g = self.granted.lock();
        if g.at_primary == at_primary {
            g.by_mount.grant(mount, first, count);
        }
    }

    /// Every range the primary gave this mirror for its mounts: (mount, first id, end).
    pub(crate) fn granted_ranges(&self) -> Vec<(u64, SliceId, u64)> {
        self.granted.lock().by_mount.ranges()
    }

    /// The first of `ids` the primary did not give this mirror for `mount`, if any.
    pub(crate) fn foreign(
        &self,
        mount: u64,
        ids: impl IntoIterator<Item = SliceId>,
    ) -> Option<SliceId> {
        self.granted.lock().by_mount.first_foreign(mount, ids)
    }

    fn client(&self) -> MetaServiceClient<strait_replicator_client::Conn> {
        self.primary.meta()
    }

    /// The session id, opening a session when there is none (or `stale` is the one refused:
    /// it is taken up again, or a new one opened, with the handles held).
    pub(crate) async fn sid(&self, stale: u64) -> Result<u64, Status> {
        let _g = self.lock.lock().await;
        let cur = self.sid.load(Ordering::Relaxed);
        if cur != 0 && cur != stale {
            return Ok(cur);
        }
        let open_inodes = self
            .held
            .lock()
            .iter()
            .map(|(&ino, &handles)| w::OpenInode { ino, handles })
            .collect();
        let r = self
            .client()
            .open_session(w::OpenSessionRequest {
                info: self.info.clone(),
                resume_session: if stale != 0 {
                    stale
                } else {
                    self.resume.load(Ordering::Relaxed)
                },
                open_inodes,
                // the region's locks are its own (the mirror's engine): none held here
                locks: vec![],
            })
            .await?
            .into_inner();
        self.resume.store(0, Ordering::Relaxed);
        self.sid.store(r.session, Ordering::Relaxed);
        {
            let mut g = self.granted.lock();
            g.at_primary = r.session;
            g.by_mount.clear();
        }
        tracing::info!(
            "{} session {} at the primary for forwarded calls ({} files held open)",
            if r.resumed { "resumed" } else { "opened" },
            r.session,
            self.held.lock().len()
        );
        Ok(r.session)
    }

    /// The primary moved (the epoch named another): the next call opens the session at the
    /// new one (taking the old one up when its engine lists it), with the files held, and no
    /// slice id the old primary gave is taken any more (the new one knows nothing of them; a
    /// mount writes such a slice again under an id from the new primary).
    pub(crate) async fn primary_moved(&self) {
        let _g = self.lock.lock().await;
        let old = self.sid.swap(0, Ordering::Relaxed);
        if old != 0 {
            self.resume.store(old, Ordering::Relaxed);
        }
        let mut g = self.granted.lock();
        g.at_primary = 0;
        g.by_mount.clear();
    }

    /// Ask for a sync of the holds soon (a handle was opened in the region).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Record the handle a create forwarded to the primary opened there, for the session
    /// `mount_sid` of this region: it is counted in the region and held at the primary until
    /// the region closes the file. Without a session to count it for, it is given back.
    pub(crate) async fn created(&self, mount_sid: Option<u64>, ino: u64) {
        let Some(mount_sid) = mount_sid else {
            self.release(&[ino]).await;
            return;
        };
        let _g = self.sync_lock.lock().await;
        self.engine.session_view(mount_sid).count_handle(ino);
        *self.held.lock().entry(ino).or_insert(0) += 1;
    }

    /// Bring the holds at the primary up to date with the region's open handles: hold the
    /// files opened since, give back those closed.
    pub async fn sync_holds(self: &Arc<Self>) -> Result<(), String> {
        let _g = self.sync_lock.lock().await;
        let open: HashSet<u64> = self
            .engine
            .open_handles()
            .into_iter()
            .map(|(ino, _)| ino)
            .collect();
        let (take, give): (Vec<u64>, Vec<(u64, u32)>) = {
            let held = self.held.lock();
            let take = open
                .iter()
                .filter(|ino| !held.contains_key(ino))
                .copied()
                .collect();
            let give = held
                .iter()
                .filter(|(ino, _)| !open.contains(ino))
                .map(|(&ino, &n)| (ino, n))
                .collect();
            (take, give)
        };
        let mut failed = None;
        if !give.is_empty() {
            let inos: Vec<u64> = give
                .iter()
                .flat_map(|&(ino, n)| std::iter::repeat_n(ino, n as usize))
                .collect();
            match self.release_checked(&inos).await {
                Ok(()) => {
                    let mut held = self.held.lock();
                    for (ino, _) in &give {
                        held.remove(ino);
                    }
                }
                Err(e) => failed = Some(format!("give back {} holds: {e}", give.len())),
            }
        }
        let mut results: Vec<(u64, Result<(), Status>)> = Vec::with_capacity(take.len());
        for chunk in take.chunks(HOLD_CONCURRENCY) {
            let mut calls = tokio::task::JoinSet::new();
            for &ino in chunk {
                let me = self.clone();
                calls.spawn(async move { (ino, me.hold(ino).await) });
            }
            while let Some(done) = calls.join_next().await {
                if let Ok(r) = done {
                    results.push(r);
                }
            }
        }
        for (ino, r) in results {
            match r {
                Ok(()) => *self.held.lock().entry(ino).or_insert(0) += 1,
                // gone at the primary already (its delete is on its way here): nothing to hold
                Err(s) if matches!(errno_of(&s), Some(libc::ENOENT | libc::ESTALE)) => {}
                Err(s) => {
                    failed.get_or_insert_with(|| {
                        format!("hold inode {ino} open at the primary: {}", s.message())
                    });
                }
            }
        }
        match failed {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// Open one handle on `ino` at the primary under this session.
    async fn hold(&self, ino: u64) -> Result<(), Status> {
        let mut stale = 0;
        for _ in 0..2 {
            let sid = self.sid(stale).await?;
            let mut req = tonic::Request::new(w::OpenRequest {
                ctx: Some(w::Ctx {
                    uid: 0,
                    gid: 0,
                    groups: vec![],
                    pid: 0,
                }),
                ino,
                flags: libc::O_RDONLY,
                chunk0: false,
            });
            req.set_timeout(CALL_TIMEOUT);
            set_session(&mut req, sid);
            match self.client().open(req).await {
                Ok(_) => return Ok(()),
                Err(s) if s.metadata().get(RESUME_HEADER).is_some() => stale = sid,
                Err(s) => return Err(s),
            }
        }
        Err(Status::unavailable(
            "the primary refused the mirror's session twice",
        ))
    }

    /// Give back handles held by this session at the primary (one entry per handle).
    async fn release_checked(&self, inos: &[u64]) -> Result<(), Status> {
        let sid = self.sid.load(Ordering::Relaxed);
        if sid == 0 {
            return Ok(()); // no session: nothing is held
        }
        for batch in inos.chunks(RELEASE_BATCH) {
            let mut req = tonic::Request::new(w::ReleaseRequest {
                inos: batch.to_vec(),
            });
            req.set_timeout(CALL_TIMEOUT);
            set_session(&mut req, sid);
            match self.client().release(req).await {
                Ok(_) => {}
                // the primary forgot the session, and its handles with it
                Err(s) if s.metadata().get(RESUME_HEADER).is_some() => return Ok(()),
                Err(s) => return Err(s),
            }
        }
        Ok(())
    }

    /// Give back handles, logging a failure (a handle not given back is held until the
    /// session ends).
    pub(crate) async fn release(&self, inos: &[u64]) {
        if let Err(e) = self.release_checked(inos).await {
            tracing::warn!("release {inos:?} at the primary: {}", e.message());
        }
    }

    /// Keep the holds up to date: at once when the region opened a file, else every second.
    /// After a failure (the primary unreachable), only every second, and said once until it
    /// works again: every open in the region would otherwise retry at once, and log.
    pub async fn run_holds(self: Arc<Self>, stop: CancellationToken) {
        let mut failing = false;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.wake.notified(), if !failing => {}
                _ = tokio::time::sleep(SYNC_EVERY) => {}
            }
            match self.sync_holds().await {
                Ok(()) => {
                    if failing {
                        tracing::info!("the region's open files are held at the primary again");
                    }
                    failing = false;
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(
                            "the region's open files at the primary: {e} (tried again every {SYNC_EVERY:?})"
                        );
                    }
                    failing = true;
                }
            }
        }
    }

    /// Keep the session alive while it exists (opening it again, with its holds, when the
    /// primary forgot it), and close it at the end.
    pub async fn heartbeat(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
            let sid = self.sid.load(Ordering::Relaxed);
            if sid == 0 {
                continue;
            }
            let mut req = tonic::Request::new(w::HeartbeatRequest {});
            set_session(&mut req, sid);
            if let Err(e) = self.client().heartbeat(req).await {
                if e.metadata().get(RESUME_HEADER).is_some() {
                    // the primary forgot it: take it up again now, with the files held
                    if let Err(e) = self.sid(sid).await {
                        tracing::warn!("open the session at the primary again: {e}");
                        let _ =
                            self.sid
                                .compare_exchange(sid, 0, Ordering::Relaxed, Ordering::Relaxed);
                    }
                }
            }
        }
        // a session holding files stays until the primary expires it: a mirror restarted
        // meanwhile holds them again as its mounts take their sessions up, before it ends
        let sid = self.sid.load(Ordering::Relaxed);
        if sid != 0 && self.held.lock().is_empty() {
            let mut req = tonic::Request::new(w::Empty {});
            set_session(&mut req, sid);
            let _ = tokio::time::timeout(Duration::from_secs(1), self.client().close_session(req))
                .await;
        }
    }
}

fn set_session<T>(req: &mut tonic::Request<T>, sid: u64) {
    if let Ok(v) = sid.to_string().parse() {
        req.metadata_mut().insert(SESSION_HEADER, v);
    }
}

/// The errno a status names, if any.
fn errno_of(s: &Status) -> Option<i32> {
    s.metadata()
        .get(ERRNO_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Why a call forwarded to the primary got no answer.
#[derive(Debug)]
pub(crate) enum Forwarding {
    /// It never left the mirror (no connection could be made, no session opened).
    NotSent(String),
    /// It broke after it may have reached the primary.
    Lost(String),
}

impl std::fmt::Display for Forwarding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Forwarding::NotSent(e) => write!(f, "{e}"),
            Forwarding::Lost(e) => write!(f, "{e} (the call may have arrived)"),
        }
    }
}

/// An error with the chain of causes under it.
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    strait_proto::with_causes(e.to_string(), e.source())
}

/// Whether a failed call certainly never reached the primary: it failed while the
/// connection was being made (refused, no route, the connector's own error). A call that
/// broke on an open connection (reset, closed, stream gone) may have arrived.
pub(crate) fn never_sent(e: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind;
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::HostUnreachable
                    | ErrorKind::NetworkUnreachable
                    | ErrorKind::AddrNotAvailable
            ) {
                return true;
            }
        }
        let t = c.to_string();
        if t.contains("tcp connect error") || t.contains("error trying to connect") {
            return true;
        }
        cur = c.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::body::Body;
    use tower::Service;

    #[derive(Debug)]
    struct Wrap(&'static str, std::io::Error);
    impl std::fmt::Display for Wrap {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for Wrap {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.1)
        }
    }

    #[test]
    fn only_a_failure_to_connect_means_the_call_never_left() {
        use std::io::{Error, ErrorKind};
        let refused = Wrap("transport error", Error::from(ErrorKind::ConnectionRefused));
        assert!(never_sent(&refused));
        let unreachable = Wrap("transport error", Error::from(ErrorKind::HostUnreachable));
        assert!(never_sent(&unreachable));
        let connector = Wrap("tcp connect error", Error::other("timed out"));
        assert!(never_sent(&connector));
        for kind in [
            ErrorKind::ConnectionReset,
            ErrorKind::BrokenPipe,
            ErrorKind::UnexpectedEof,
            ErrorKind::TimedOut,
        ] {
            let broken = Wrap("transport error", Error::from(kind));
            assert!(!never_sent(&broken), "{kind:?}");
        }
        assert!(chain(&refused).starts_with("transport error: "));
    }

    #[tokio::test]
    async fn a_call_to_a_closed_port_is_known_never_sent() {
        // a port nobody listens on: bound, then closed
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let mut ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect_lazy();
        let mut req = http::Request::new(Body::empty());
        *req.uri_mut() = http::Uri::from_static("http://primary/strait.meta.MetaService/GetAttr");
        let ready = tower::ServiceExt::ready(&mut ch).await;
        let e = match ready {
            Ok(ch) => ch.call(req).await.expect_err("nobody listens"),
            Err(e) => e,
        };
        assert!(never_sent(&e), "{}", chain(&e));
    }
}
