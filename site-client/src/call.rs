//! How a failed call is classified, and the retry loop around every call (the session's
//! resumption included).

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use backon::{BlockingRetryable, ExponentialBuilder};
use strait_fs_core::error::{Error, Result};
use strait_proto::meta as w;
use tonic::{Code, Status};
use tracing::Instrument;

use crate::connection::Client;
use crate::remote_meta::RemoteMeta;

/// Waits between attempts to reach the daemon: 50 ms first, doubling up to 2 s, for as long as
/// the call's patience lasts.
const BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(50))
    .with_max_delay(Duration::from_secs(2))
    .with_factor(2.0)
    .without_max_times();
/// Resumptions of the session tried for one call before giving up.
const RESUME_ATTEMPTS_MAX: u32 = 3;

/// How a failed call ended, for the retry loop.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The daemon could not be reached, or the call broke in flight: send it again. Safe for
    /// a change too, which is sent with the request id of its first attempt: the daemon
    /// answers a change it already made, even before a restart of its own, with the first
    /// result (site's `requests.rs`).
    Transport,
    /// The daemon does not hold our session: resume it, then send again.
    Resume,
    /// A final answer.
    Final,
}

/// How one attempt of a call failed, for the retry around it.
enum Attempt {
    /// A final error.
    Fail(Error),
    /// The daemon could not be reached, or the call broke in flight: try again.
    Unreachable(Status),
}

/// A status's message with the chain of errors under it (TLS and connection failures hide
/// their cause there).
pub(crate) fn describe(s: &Status) -> String {
    strait_proto::with_causes(s.message().to_string(), std::error::Error::source(s))
}

pub(crate) fn classify(s: &Status) -> Failure {
    if s.metadata().get(strait_proto::RESUME_HEADER).is_some() {
        return Failure::Resume;
    }
    if s.metadata().get(strait_proto::ERRNO_HEADER).is_some() {
        return Failure::Final;
    }
    match s.code() {
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded => {
            let t = describe(s).to_ascii_lowercase();
            if t.contains("certificate") || t.contains("alert") || t.contains("tls") {
                // the daemon refused our certificate or we refused its: waiting cannot help
                Failure::Final
            } else if s.code() == Code::Unknown
                && !t.contains("transport")
                && !t.contains("h2")
                && !t.contains("connect")
            {
                Failure::Final
            } else {
                // never sent (connection refused) or broken in flight (connection reset or
                // closed, stream gone): the two cannot be told apart reliably, and need not be
                Failure::Transport
            }
        }
        _ => Failure::Final,
    }
}

/// The fs-core error for a final status.
fn to_error(op: &str, s: &Status) -> Error {
    if strait_proto::is_slice_not_allocated(s) {
        return Error::SliceNotAllocated(format!("{op}: {}", s.message()));
    }
    if let Some(errno) = strait_proto::status_errno(s) {
        if errno != libc::EIO {
            return Error::Sys(errno);
        }
    }
    match s.code() {
        Code::Unauthenticated => Error::Meta(format!(
            "{op}: the site daemon refused our token: {}",
            s.message()
        )),
        Code::Unavailable | Code::Unknown => Error::Meta(format!(
            "{op}: cannot talk to the site daemon: {}",
            describe(s)
        )),
        _ => Error::Meta(format!("{op} at the site daemon: {}", s.message())),
    }
}

/// The version an answer names (`x-strait-version`), if any.
fn version_of<T>(r: &tonic::Response<T>) -> Option<u64> {
    r.metadata()
        .get(strait_proto::VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// `msg` as a request that asks the daemon to name its latest version in the answer (see
/// [`strait_proto::READ_VERSION_HEADER`]): for the reads after which what a mount keeps must
/// be at least as new as what the read saw (an open, for close-to-open; a lock taken, for
/// the writes committed before it).
pub(crate) fn naming_version<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        strait_proto::READ_VERSION_HEADER,
        tonic::metadata::AsciiMetadataValue::from_static("1"),
    );
    r
}

pub(crate) fn wire_err(op: &str, e: strait_proto::WireError) -> Error {
    Error::Meta(format!(
        "{op}: the site daemon sent an invalid reply: {}",
        e.0
    ))
}

impl RemoteMeta {
    /// Run one call with retries (see the crate docs); `reads` marks calls safe to repeat.
    pub(crate) fn call<T, F, Fut>(&self, op: &'static str, reads: bool, f: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, Status>>,
    {
        self.call_for(op, reads, self.opts.reconnect_timeout, f)
    }

    /// [`Self::call`], giving up on an unreachable daemon after `patience`.
    pub(crate) fn call_for<T, F, Fut>(
        &self,
        op: &'static str,
        reads: bool,
        patience: Duration,
        f: F,
    ) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, Status>>,
    {
        self.call_versioned(op, reads, patience, f).map(|(r, _)| r)
    }

    /// [`Self::call_for`], with the version a change committed as (the daemon's
    /// `x-strait-version`), once the mount's change stream has reached it (see
    /// `meta_cache.rs`): what the mount keeps shows the change before the caller goes on. A
    /// change that may or may not have been made (it failed on the way) forgets everything
    /// kept.
    pub(crate) fn call_versioned<T, F, Fut>(
        &self,
        op: &'static str,
        reads: bool,
        patience: Duration,
        f: F,
    ) -> Result<(T, Option<u64>)>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, Status>>,
    {
        let r = self.call_response(op, reads, patience, f);
        if reads {
            // a read asked with READ_VERSION_HEADER (an open, a lock taken): what is kept
            // here must show at least the state it saw before the caller goes on
            return r.map(|r| {
                let version = version_of(&r).filter(|&v| self.cache.settle(v));
                (r.into_inner(), version)
            });
        }
        match r {
            Ok(r) => {
                // no version: the change committed nothing
                let version = version_of(&r).filter(|&v| self.cache.settle(v));
                Ok((r.into_inner(), version))
            }
            Err(e) => {
                if !matches!(e, Error::Sys(_) | Error::SliceNotAllocated(_)) {
                    // an answer that is not the file system's: the change may have been made
                    self.cache.forget_all();
                }
                Err(e)
            }
        }
    }

    /// One call with its retries; the whole answer.
    fn call_response<T, F, Fut>(
        &self,
        op: &'static str,
        reads: bool,
        patience: Duration,
        f: F,
    ) -> Result<tonic::Response<T>>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, Status>>,
    {
        let span = tracing::info_span!("meta_rpc", op);
        let start = Instant::now();
        // a mutation keeps one request id over all its attempts: the daemon runs it once
        // (site's requests.rs), so one broken in flight is safe to send again
        let request_id = if reads {
            None
        } else {
            Some(self.next_request_id()?)
        };
        let resumes = Cell::new(0);
        let warned = Cell::new(false);
        // attempts that failed on the way (they may have been applied): a change sent after
        // one says so, and its number (the daemon answers EIO rather than run it when its
        // record may be gone; site's requests.rs)
        let failed = Cell::new(0u32);
        // one attempt: the call, sent again at once after each resumption of the session
        let attempt = || -> std::result::Result<tonic::Response<T>, Attempt> {
            loop {
                let (rt, channel) = self.connection().map_err(Attempt::Fail)?;
                let retry = (request_id.is_some() && failed.get() > 0).then(|| failed.get() + 1);
                let client = self.client(channel, request_id.clone(), retry);
                // the connection's tasks only run inside block_on: let them first take in what
                // arrived while this thread was idle (a closed connection is then known closed,
                // and the call goes to a new one instead of failing on the dead one)
                rt.block_on(tokio::task::yield_now());
                let s = match rt.block_on(f(client).instrument(span.clone())) {
                    Ok(r) => return Ok(r),
                    Err(s) => s,
                };
                return Err(match classify(&s) {
                    Failure::Resume if resumes.get() < RESUME_ATTEMPTS_MAX => {
                        resumes.set(resumes.get() + 1);
                        self.resume().map_err(Attempt::Fail)?;
                        continue;
                    }
                    Failure::Final | Failure::Resume => Attempt::Fail(to_error(op, &s)),
                    Failure::Transport => {
                        failed.set(failed.get().saturating_add(1));
                        Attempt::Unreachable(s)
                    }
                });
            }
        };
        let r = attempt
            .retry(BACKOFF)
            .sleep(std::thread::sleep)
            .when(|a| matches!(a, Attempt::Unreachable(_)) && start.elapsed() < patience)
            .notify(|a, _| {
                if let (Attempt::Unreachable(s), false) = (a, warned.get()) {
                    tracing::warn!(
                        "{op}: cannot reach the site daemon {}; retrying: {}",
                        self.target,
                        describe(s)
                    );
                    warned.set(true);
                }
            })
            .call();
        match r {
            Ok(v) => {
                if warned.get() {
                    tracing::info!("reached the site daemon {} again", self.target);
                }
                Ok(v)
            }
            Err(Attempt::Fail(e)) => Err(e),
            Err(Attempt::Unreachable(s)) => {
                let e = Error::Meta(format!(
                    "{op}: the site daemon {} has been unreachable for {:?}: {}",
                    self.target,
                    patience,
                    describe(&s)
                ));
                tracing::error!("{e}");
                Err(e)
            }
        }
    }

    /// Open the session again after the daemon lost it (restart or timeout).
    fn resume(&self) -> Result<()> {
        let old = self.session.load(Ordering::Relaxed);
        let open_inodes: Vec<w::OpenInode> = self
            .open
            .lock()
            .iter()
            .map(|(&ino, &handles)| w::OpenInode { ino, handles })
            .collect();
        let locks = self.locks.lock().all();
        self.session.store(0, Ordering::Relaxed);
        let req = w::OpenSessionRequest {
            info: self.info.lock().clone(),
            resume_session: old,
            open_inodes,
            locks,
        };
        let r = self.call("resume session", true, |mut c| {
            let req = req.clone();
            async move { c.open_session(req).await }
        })?;
        self.session.store(r.session, Ordering::Relaxed);
        // the daemon may be another program now (a primary replaced by a mirror at a
        // switchover, or the other way round): take its answer as at the open
        self.read_only.store(r.read_only as u64, Ordering::Relaxed);
        self.block_fallback
            .store(r.block_fallback, Ordering::Relaxed);
        self.session_timeout_ms
            .store(r.session_timeout_ms, Ordering::Relaxed);
        if r.resumed {
            tracing::info!("resumed session {} with the site daemon", r.session);
        } else {
            tracing::warn!(
                "the site daemon had closed session {old} (it timed out, or its metadata was \
                 replaced); continuing as session {}, with the locks it held taken back",
                r.session
            );
        }
        if !r.lost_locks.is_empty() {
            tracing::error!(
                "{} locks this mount held are held by another now, and lost: {:?}",
                r.lost_locks.len(),
                r.lost_locks
            );
            self.locks.lock().forget(&r.lost_locks);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_call_is_sent_again_like_one_never_sent() {
        let is = |s: Status| classify(&s);
        // broken in flight: sent again (with a change's request id, which the daemon answers
        // from its first result even across its own restart)
        for broken in [
            "h2 protocol error: stream no longer needed",
            "transport error: connection reset by peer",
            "h2 protocol error: connection closed",
        ] {
            assert_eq!(
                is(Status::unavailable(broken)),
                Failure::Transport,
                "{broken}"
            );
        }
        // never sent: the same
        assert_eq!(
            is(Status::unavailable(
                "transport error: tcp connect error: Connection refused (os error 111)"
            )),
            Failure::Transport
        );
        // a certificate refused, an error the daemon answered: final
        assert_eq!(
            is(Status::unavailable(
                "transport error: invalid peer certificate"
            )),
            Failure::Final
        );
        assert_eq!(is(Status::unknown("the engine said no")), Failure::Final);
        assert_eq!(is(Status::not_found("x")), Failure::Final);
    }
}
