//! The metadata service of a mirror, with the staleness window (docs/consistency.md, "The staleness window and its policies").
//!
//! Every call has passed the guard (the caller's credentials name a role its method admits),
//! then:
//! - mutations (under `writes = "forward"`) are sent to the primary, under the mirror's own
//!   session there. A written slice's blocks are first uploaded from this region's store to
//!   the primary's, once the mirror has checked that the primary gave the slice's id to
//!   this mirror for that mount (it sees the `AllocSliceIds` answers it forwards); an upload
//!   never replaces an object the primary's store holds. The answer goes back to the mount only once this mirror has applied the
//!   version the primary committed the change as, so the writer reads its own writes here.
//!   Under `writes = "refuse"` the mirror's read-only engine answers them: EROFS;
//! - reads, while the mirror is inside its window `W` (its lag, an upper bound, is known and
//!   at most `W`) and has applied every version a forwarded answer showed the region, are
//!   answered from its own metadata. The second condition keeps a mount from going back in
//!   time: after the primary answered a `GetAttr` at version 9, a `ReadChunk` answered from
//!   version 7 would give slices older than the size the mount holds, and read as zeros;
//! - reads outside the window follow the policy: `forward` sends the call as it is to the
//!   primary (under the mirror's own session there and the primary's token), `wait` holds it
//!   until the mirror is back inside the window (EAGAIN after `wait_timeout_ms`), `serve`
//!   answers from the stale metadata and counts it;
//! - `Open` is the region's (the mirror counts its handles), but its answer carries the
//!   file's attributes and, when asked, chunk 0's slices, so it obeys the window too: outside
//!   it, `wait` waits as a read does, and `forward` opens the file at the primary (which
//!   finds it and checks the caller's permission), holding that handle for the region.
//!
//! Forwarding works on the HTTP/2 request, below the generated code: the primary answers the
//! same protobuf messages the mirror would, so the call needs no decoding.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use strait_fs_core::layout::written_by_compaction;
use strait_fs_core::{SliceId, Version};
use strait_proto::meta as w;
use strait_proto::meta::meta_service_server::MetaServiceServer;
use strait_proto::{
    ERRNO_HEADER, READ_VERSION_HEADER, RESUME_HEADER, RETRY_HEADER, SESSION_HEADER, VERSION_HEADER,
};
use strait_server::MetaServer;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::Status;
use tower::Service;

use crate::calls::{classify, Class};
use crate::config::{Policy, Writes};
use crate::forward::{chain, never_sent, ForwardSession, Forwarding};
use crate::state::{Mirror, Phase};

/// The first wait before a change whose answer was lost is sent to the primary again.
const RESEND_DELAY_MIN: Duration = Duration::from_millis(100);
/// The longest wait between two sendings of one change.
const RESEND_DELAY_MAX: Duration = Duration::from_secs(2);

/// The message of a unary gRPC request or reply body (no compression).
fn grpc_message(b: &[u8]) -> Result<&[u8], Status> {
    match b {
        [0, l0, l1, l2, l3, rest @ ..] => {
            let n = u32::from_be_bytes([*l0, *l1, *l2, *l3]) as usize;
            rest.get(..n)
                .ok_or_else(|| Status::invalid_argument("a truncated gRPC message"))
        }
        [1, ..] => Err(Status::invalid_argument(
            "compressed messages are not accepted",
        )),
        _ => Err(Status::invalid_argument("a malformed gRPC message")),
    }
}

fn decode<M: prost::Message + Default>(b: &[u8]) -> Result<M, Status> {
    M::decode(grpc_message(b)?).map_err(|e| Status::invalid_argument(format!("decode: {e}")))
}

fn errno_status(errno: i32, msg: String) -> Status {
    let code = if errno == libc::EAGAIN {
        tonic::Code::Unavailable
    } else {
        tonic::Code::Internal
    };
    let mut s = Status::new(code, msg);
    if let Ok(v) = errno.to_string().parse() {
        s.metadata_mut().insert(ERRNO_HEADER, v);
    }
    s
}

type Local = MetaServiceServer<MetaServer>;

/// The mirror's `strait.meta.v1.MetaService`.
#[derive(Clone)]
pub struct Router {
    local: Local,
    /// The service behind `local`: the region's sessions, checked before a call is forwarded.
    server: Arc<MetaServer>,
    mirror: Arc<Mirror>,
    forward: Arc<ForwardSession>,
    block_size: u32,
}

impl Router {
    pub fn new(
        server: Arc<MetaServer>,
        mirror: Arc<Mirror>,
        forward: Arc<ForwardSession>,
        block_size: u32,
    ) -> Self {
        let local = MetaServiceServer::from_arc(server.clone())
            .max_decoding_message_size(strait_server::MESSAGE_BYTES_MAX)
            .max_encoding_message_size(strait_server::MESSAGE_BYTES_MAX);
        Router {
            local,
            server,
            mirror,
            forward,
            block_size,
        }
    }
}

impl NamedService for Router {
    const NAME: &'static str = <Local as NamedService>::NAME;
}

type Reply = http::Response<Body>;

fn status_reply(s: Status) -> Reply {
    s.into_http()
}

impl Router {
    async fn local_call(mut local: Local, req: http::Request<Body>) -> Reply {
        match local.call(req).await {
            Ok(r) => r.map(Body::new),
            Err(never) => match never {},
        }
    }

    async fn forward_call(&self, req: http::Request<Body>) -> Reply {
        self.mirror.metrics.forwarded_reads.inc();
        // the body is a single gRPC message: keep it, to send the call again after a resume
        let (parts, body) = req.into_parts();
        let bytes = match http_body_util_collect(body).await {
            Ok(b) => b,
            Err(s) => return status_reply(s),
        };
        // a squashed mount reads a file's data through a handle it holds here (the primary
        // takes the mirror's word for it)
        if parts.uri.path().ends_with("/ReadChunk") {
            if let Err(s) = self.check_read(&parts, &bytes) {
                return status_reply(s);
            }
        }
        match self.send_to_primary(&parts, bytes, true, None).await {
            Ok((r, _)) => r,
            Err(e) => status_reply(errno_status(
                libc::EIO,
                format!("forward a read to the primary: {e}"),
            )),
        }
    }

    /// Refuse a forwarded `ReadChunk` of a file the mount's session holds no handle on, when
    /// its ids are squashed or fixed (as the local service refuses it).
    fn check_read(&self, parts: &http::request::Parts, bytes: &[u8]) -> Result<(), Status> {
        let caller = parts.extensions.get::<strait_auth::Caller>();
        let (rules, _) = self.server.data_rules_of(&parts.headers, caller)?;
        if !rules.restricts_ids() {
            return Ok(());
        }
        let ino = decode::<w::ChunkRequest>(bytes)?.ino;
        let md = tonic::metadata::MetadataMap::from_headers(parts.headers.clone());
        if self.server.session_holds(&md, caller, ino)? > 0 {
            return Ok(());
        }
        Err(strait_proto::to_status(&strait_fs_core::Error::Sys(
            libc::EBADF,
        )))
    }

    /// The version a forwarded read's answer names (see [`READ_VERSION_HEADER`]): the region
    /// has now been shown the primary's state up to it.
    fn note_seen(&self, reply: &Reply) {
        if let Some(v) = reply_version(reply) {
            self.mirror.note_seen(v);
        }
    }

    /// Send a call to the primary under the mirror's session there (opening it, or opening
    /// another when the primary forgot it); returns the answer and the session it was sent
    /// under. A `read` asks the primary to name its version in the answer, and the version
    /// is noted as seen by the region.
    async fn send_to_primary(
        &self,
        parts: &http::request::Parts,
        bytes: bytes::Bytes,
        read: bool,
        resend: Option<u32>,
    ) -> Result<(Reply, u64), Forwarding> {
        let mut headers = parts.headers.clone();
        // the primary's span of the call is a child of this mirror's
        strait_auth::trace::inject(&mut headers);
        // the mount's rules (its squashing, its subtree) go with its call: the primary holds
        // the call to them; a mount's own header of that name is never passed on
        headers.remove(strait_auth::rules::RULES_HEADER);
        let rules = self
            .server
            .rules_of(
                &parts.headers,
                parts.extensions.get::<strait_auth::Caller>(),
            )
            .map_err(|s| Forwarding::NotSent(s.message().to_string()))?;
        if !rules.is_open() {
            let v = http::HeaderValue::from_str(&rules.to_text())
                .map_err(|e| Forwarding::NotSent(format!("the mount's rules: {e}")))?;
            headers.insert(strait_auth::rules::RULES_HEADER, v);
        }
        if let Some(n) = resend {
            // a change sent again after an attempt that may have arrived: the primary answers
            // it from its request record, and never runs it when the record may be gone
            headers.insert(RETRY_HEADER, http::HeaderValue::from(n));
        }
        if read {
            headers.insert(READ_VERSION_HEADER, http::HeaderValue::from_static("1"));
        } else {
            headers.remove(READ_VERSION_HEADER);
        }
        let mut stale = 0;
        for _ in 0..2 {
            let sid = self.forward.sid(stale).await.map_err(|s| {
                Forwarding::NotSent(format!("the primary cannot be reached: {}", s.message()))
            })?;
            // the mirror's own credentials, never the mount's
            headers.remove(http::header::AUTHORIZATION);
            if let Some(v) = &self.forward.primary.authorization {
                headers.insert(http::header::AUTHORIZATION, v.clone());
            }
            if let Ok(v) = sid.to_string().parse() {
                headers.insert(SESSION_HEADER, v);
            }
            let mut uri = http::Uri::builder().scheme("http").authority("primary");
            if let Some(pq) = parts.uri.path_and_query() {
                uri = uri.path_and_query(pq.clone());
            }
            let mut req = http::Request::new(Body::new(http_body_full(bytes.clone())));
            *req.method_mut() = parts.method.clone();
            *req.headers_mut() = headers.clone();
            *req.uri_mut() = uri
                .build()
                .map_err(|e| Forwarding::NotSent(format!("forward uri: {e}")))?;
            let mut ch = self.forward.primary.channel();
            let ch = match tower::ServiceExt::ready(&mut ch).await {
                Ok(ch) => ch,
                Err(e) => return Err(Forwarding::NotSent(chain(&e))),
            };
            let sent = ch.call(req).await;
            match sent {
                Ok(r) if r.headers().get(RESUME_HEADER).is_some() => {
                    stale = sid;
                    continue;
                }
                Ok(r) => {
                    if read {
                        self.note_seen(&r);
                    }
                    return Ok((r, sid));
                }
                Err(e) if never_sent(&e) => return Err(Forwarding::NotSent(chain(&e))),
                Err(e) => return Err(Forwarding::Lost(chain(&e))),
            }
        }
        Err(Forwarding::NotSent(
            "the primary refused the mirror's session twice".into(),
        ))
    }

    /// Send a change to the primary until it answers or `deadline` (`write_timeout_ms`)
    /// passes. An attempt that broke after it may have arrived is sent again, with the
    /// mount's request id and marked as sent before, so the primary answers it from its first
    /// result: the mount then gets the change's real outcome, not an error for a change that
    /// was made (an application told "failed" would act on a wrong belief, and the kernel
    /// would keep its entries from before the change). Only when the primary was never
    /// reached (and the mount did not send the call before) is the answer "nothing was
    /// changed", at once.
    async fn send_change(
        &self,
        method: &str,
        parts: &http::request::Parts,
        bytes: bytes::Bytes,
        deadline: tokio::time::Instant,
    ) -> Result<(Reply, u64), Status> {
        let limit = Duration::from_millis(self.mirror.cfg.write_timeout_ms);
        let mut delay = RESEND_DELAY_MIN;
        // whether an attempt (the mount's earlier ones included) may have reached the primary
        let mut maybe_arrived = parts.headers.contains_key(RETRY_HEADER);
        let mut resends = 0u32;
        loop {
            let resend = maybe_arrived.then_some(resends.saturating_add(1));
            let sent = tokio::time::timeout_at(
                deadline,
                self.send_to_primary(parts, bytes.clone(), false, resend),
            )
            .await;
            let why = match sent {
                Ok(Ok(r)) => return Ok(r),
                Ok(Err(Forwarding::NotSent(e))) if !maybe_arrived => {
                    tracing::error!("{method} at the mirror: the primary cannot be reached: {e}");
                    return Err(errno_status(
                        libc::EIO,
                        format!(
                            "{method}: the primary cannot be reached from this mirror ({e}); \
                             nothing was changed"
                        ),
                    ));
                }
                Ok(Err(Forwarding::NotSent(e) | Forwarding::Lost(e))) => e,
                Err(_) => String::from("no answer"),
            };
            maybe_arrived = true;
            let now = tokio::time::Instant::now();
            if now + delay >= deadline {
                tracing::error!(
                    "{method} at the mirror: no answer from the primary within {limit:?} \
                     (last: {why}); the change may have been made"
                );
                return Err(errno_status(
                    libc::ETIMEDOUT,
                    format!(
                        "{method}: no answer from the primary within {limit:?} \
                         (write_timeout_ms); the change was made there only if it arrived"
                    ),
                ));
            }
            if resends == 0 {
                tracing::warn!(
                    "{method} at the mirror: the primary's answer was lost ({why}); sending it \
                     again with its request id until {limit:?} have passed"
                );
            }
            resends = resends.saturating_add(1);
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(RESEND_DELAY_MAX);
        }
    }

    /// A mutation: blocks to the primary's store, the call to the primary, then wait until
    /// this mirror has applied its version.
    async fn forward_write(&self, method: &str, req: http::Request<Body>) -> Reply {
        // a child of the mount's span; the primary's is a child of this one
        let span =
            strait_auth::trace::child_of(tracing::info_span!("forward", method), req.headers());
        tracing::Instrument::instrument(self.forward_write_traced(method, req), span).await
    }

    async fn forward_write_traced(&self, method: &str, req: http::Request<Body>) -> Reply {
        let limit = Duration::from_millis(self.mirror.cfg.write_timeout_ms);
        let deadline = tokio::time::Instant::now() + limit;
        let (parts, body) = req.into_parts();
        let bytes = match http_body_util_collect(body).await {
            Ok(b) => b,
            Err(s) => return status_reply(s),
        };
        let mount = mount_session(&parts.headers);
        // a mount whose ids are squashed or fixed writes a file's data only through a handle
        // it opened for writing (the primary takes the mirror's word for it)
        let writers = match self.server.data_rules_of(
            &parts.headers,
            parts.extensions.get::<strait_auth::Caller>(),
        ) {
            Ok((_, w)) => w,
            Err(s) => return status_reply(s),
        };
        match data_written(method, &bytes) {
            Ok(Some(ino)) => {
                if let Err(e) = writers.check(mount, ino) {
                    return status_reply(strait_proto::to_status(&e));
                }
            }
            Ok(None) => {}
            Err(s) => return status_reply(s),
        }
        // a file this region holds open must be held at the primary before an unlink or a
        // rename over it arrives there
        if method == "Unlink" || method == "Rename" {
            match tokio::time::timeout_at(deadline, self.forward.sync_holds()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!("{method} at the mirror: the region's open files: {e}"),
                Err(_) => tracing::warn!(
                    "{method} at the mirror: the region's open files were not held at the primary within {limit:?}"
                ),
            }
        }
        let slices = match written_slices(method, &bytes) {
            Ok(s) => s,
            Err(s) => return status_reply(s),
        };
        if let Some(id) = self.forward.foreign(mount, slices.iter().map(|s| s.id)) {
            // nothing is uploaded: the id may be one the primary gave someone else, whose
            // blocks an upload would overwrite
            let why = format!(
                "{method}: slice {id} was not given to this mount (session {mount}) by the \
                 primary through this mirror (the mirror or the primary restarted since, or \
                 the id was never handed out); nothing was uploaded or changed"
            );
            tracing::warn!("{why}");
            self.mirror.metrics.write_errors.inc();
            return status_reply(strait_proto::to_status(
                &strait_fs_core::Error::SliceNotAllocated(why),
            ));
        }
        if !slices.is_empty() {
            let bs = self.block_size;
            let up =
                tokio::time::timeout_at(deadline, self.mirror.blocks.upload(&slices, bs)).await;
            let why = match up {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some((libc::EIO, e)),
                Err(_) => Some((
                    libc::ETIMEDOUT,
                    format!(
                        "the blocks of a write were not in the primary's store within {limit:?}"
                    ),
                )),
            };
            if let Some((errno, why)) = why {
                tracing::error!("{method} at the mirror: {why}; nothing was changed");
                self.mirror.metrics.write_errors.inc();
                return status_reply(errno_status(errno, format!("{why}; nothing was changed")));
            }
        }
        let reply = match self.send_change(method, &parts, bytes, deadline).await {
            Ok((r, at_primary)) if method == "AllocSliceIds" => {
                self.note_granted(r, at_primary, mount).await
            }
            Ok((r, _)) => r,
            Err(status) => {
                self.mirror.metrics.write_errors.inc();
                return status_reply(status);
            }
        };
        let version = reply_version(&reply);
        self.mirror.metrics.forwarded_writes.inc();
        let reply = if method == "Create" {
            self.created(Some(mount).filter(|&m| m != 0), reply, &writers)
                .await
        } else {
            reply
        };
        let Some(version) = version else {
            return reply; // an error, or a call that changed nothing
        };
        // read-your-writes: answer once the change is applied here
        let mut changed = self.mirror.changed.subscribe();
        let applied = tokio::time::timeout_at(deadline, async {
            while self.mirror.applied() < version {
                let _ = tokio::time::timeout(Duration::from_millis(50), changed.changed()).await;
            }
        })
        .await;
        match applied {
            Ok(()) => {
                self.mirror.applies.trace(version);
                reply
            }
            Err(_) => {
                tracing::error!(
                    "{method}: committed at the primary as version {version}, not applied here within {limit:?} (applied {})",
                    self.mirror.applied()
                );
                self.mirror.metrics.write_errors.inc();
                status_reply(errno_status(
                    libc::ETIMEDOUT,
                    format!(
                        "{method}: committed at the primary as version {version}, but this mirror \
                         has not applied it within {limit:?}: it is not visible here yet"
                    ),
                ))
            }
        }
    }

    /// `Open` outside the window under `forward`: answered as the primary answers it. The
    /// open is sent to the primary as the mount asked it (its caller, its flags, chunk 0 when
    /// asked), under the mirror's session there, so the file is found and the permission
    /// checked by the primary's metadata, not this mirror's older one (a file created at the
    /// primary since is not here yet: opening it here failed with ESTALE; a mode changed
    /// since was checked as it was). The handle the primary opened is held there for the
    /// region and counted here for the mount's session, as a create forwarded to the primary
    /// is: the region's close gives it back (see [`crate::forward`]).
    async fn open_forwarded(&self, req: http::Request<Body>) -> Reply {
        self.mirror.metrics.forwarded_reads.inc();
        // the mount's session here, checked as the local open would check it
        let md = tonic::metadata::MetadataMap::from_headers(req.headers().clone());
        let mount = match self
            .server
            .held_session(&md, req.extensions().get::<strait_auth::Caller>())
        {
            Ok(sid) => sid,
            Err(s) => return status_reply(s),
        };
        let (parts, body) = req.into_parts();
        let bytes = match http_body_util_collect(body).await {
            Ok(b) => b,
            Err(s) => return status_reply(s),
        };
        let (ino, flags) = match decode::<w::OpenRequest>(&bytes) {
            Ok(o) => (o.ino, o.flags),
            Err(s) => return status_reply(s),
        };
        let writers = match self.server.data_rules_of(
            &parts.headers,
            parts.extensions.get::<strait_auth::Caller>(),
        ) {
            Ok((_, w)) => w,
            Err(s) => return status_reply(s),
        };
        let reply = match self.send_to_primary(&parts, bytes, true, None).await {
            Ok((r, _)) => r,
            Err(e) => {
                return status_reply(errno_status(
                    libc::EIO,
                    format!("open outside the window: the primary cannot be reached: {e}"),
                ))
            }
        };
        let (rparts, data, trailers) = match collect_reply(reply).await {
            Ok(got) => got,
            Err(failed) => return failed,
        };
        // opened at the primary (an answer with a message): the handle is counted for the
        // mount here and held at the primary until the region closes the file
        if !data.is_empty() && decode::<w::AttrReply>(&data).is_ok() {
            self.forward.created(Some(mount), ino).await;
            if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
                writers.note(mount, ino);
            }
        }
        rebuild(rparts, data, trailers)
    }

    /// The primary's answer to a forwarded `AllocSliceIds`: the range is the mount's, under
    /// the session at the primary it was taken by (see [`ForwardSession::granted`]).
    async fn note_granted(&self, reply: Reply, at_primary: u64, mount: u64) -> Reply {
        let (parts, data, trailers) = match collect_reply(reply).await {
            Ok(got) => got,
            Err(failed) => return failed,
        };
        if !data.is_empty() {
            if let Ok(r) = decode::<w::AllocReply>(&data) {
                self.forward
                    .granted(at_primary, mount, SliceId(r.first), r.count);
            }
        }
        rebuild(parts, data, trailers)
    }

    /// A file created through the mirror is opened at the primary under the mirror's session
    /// there: count that handle in the region for the creating mount's session, and keep it
    /// held at the primary until the region closes the file (see [`crate::forward`]).
    async fn created(
        &self,
        mount_sid: Option<u64>,
        reply: Reply,
        writers: &strait_server::Writers,
    ) -> Reply {
        let (parts, data, trailers) = match collect_reply(reply).await {
            Ok(got) => got,
            Err(failed) => return failed,
        };
        if !data.is_empty() {
            if let Ok(r) = decode::<w::EntryReply>(&data) {
                self.forward.created(mount_sid, r.ino).await;
                if let Some(sid) = mount_sid {
                    writers.note(sid, r.ino);
                }
            }
        }
        rebuild(parts, data, trailers)
    }

    async fn route(self, req: http::Request<Body>) -> Reply {
        // the caller's credentials were checked by the guard in front of every service
        let method = req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_string();
        let method = method.as_str();
        // a method the service does not have goes to the local service, which says so
        let class = classify(method).unwrap_or(Class::Local);
        let forward = self.forward.clone();
        let reply = self.answer(method, class, req).await;
        if method == "Open" {
            // the region opened a file: hold it at the primary too (in the background)
            forward.wake();
        }
        reply
    }

    /// At a mirror promoted to primary: every call is answered here. A write's blocks are in
    /// this region's store (its mount wrote them there): marked so before it commits, so that
    /// readers here never look for them elsewhere.
    async fn answer_promoted(self, method: &str, req: http::Request<Body>) -> Reply {
        if method != "WriteSlice" && method != "CompactChunk" {
            return Self::local_call(self.local.clone(), req).await;
        }
        let (parts, body) = req.into_parts();
        let bytes = match http_body_util_collect(body).await {
            Ok(b) => b,
            Err(s) => return status_reply(s),
        };
        // a request that does not decode goes on as it is: the service says what is wrong
        if let Ok(slices) = written_slices(method, &bytes) {
            self.mirror
                .blocks
                .mark_written(&slices, self.block_size)
                .await;
        }
        let req = http::Request::from_parts(parts, Body::new(http_body_full(bytes)));
        Self::local_call(self.local.clone(), req).await
    }

    async fn answer(self, method: &str, class: Class, req: http::Request<Body>) -> Reply {
        if self.mirror.promoted() {
            return self.answer_promoted(method, req).await;
        }
        // a call of a session this mirror does not hold is refused as the primary refuses
        // it (the local service asks for itself); it is never forwarded under the mirror's
        if class != Class::Local {
            let md = tonic::metadata::MetadataMap::from_headers(req.headers().clone());
            if let Err(s) = self
                .server
                .held_session(&md, req.extensions().get::<strait_auth::Caller>())
            {
                return status_reply(s);
            }
        }
        if class == Class::Mutation && self.mirror.cfg.writes == Writes::Forward {
            return self.forward_write(method, req).await;
        }
        // Open answers attributes and slices: it obeys the window as a read does
        let windowed = class == Class::Read || method == "Open";
        if !windowed || self.mirror.fresh() {
            return Self::local_call(self.local.clone(), req).await;
        }
        match self.mirror.cfg.policy {
            // a mirror bootstrapping again has replaced its metadata with nothing yet: there
            // is no stale answer to give
            Policy::Serve if self.mirror.phase() == Phase::Bootstrapping => {
                status_reply(errno_status(
                    libc::EAGAIN,
                    "the mirror is loading a new snapshot (policy serve): try again".into(),
                ))
            }
            Policy::Serve => {
                self.mirror.metrics.stale_reads.inc();
                Self::local_call(self.local.clone(), req).await
            }
            Policy::Forward if method == "Open" => self.open_forwarded(req).await,
            Policy::Forward => self.forward_call(req).await,
            Policy::Wait => {
                self.mirror.metrics.waited_reads.inc();
                let limit = Duration::from_millis(self.mirror.cfg.wait_timeout_ms);
                let mut changed = self.mirror.changed.subscribe();
                let waited = tokio::time::timeout(limit, async {
                    while !self.mirror.fresh() {
                        // the lag also moves with time alone: look again at least every 50 ms
                        let _ = tokio::time::timeout(Duration::from_millis(50), changed.changed())
                            .await;
                    }
                })
                .await;
                match waited {
                    Ok(()) => Self::local_call(self.local.clone(), req).await,
                    Err(_) => status_reply(errno_status(
                        libc::EAGAIN,
                        format!(
                            "the mirror stayed outside its {} ms window for {limit:?} (policy wait)",
                            self.mirror.cfg.window_ms
                        ),
                    )),
                }
            }
        }
    }
}

/// The slices a `WriteSlice` or `CompactChunk` request writes (none for another method).
fn written_slices(
    method: &str,
    bytes: &[u8],
) -> Result<Vec<strait_fs_core::meta::SliceRef>, Status> {
    let slices = match method {
        "WriteSlice" => decode::<w::WriteSliceRequest>(bytes)?
            .slice
            .into_iter()
            .collect::<Vec<_>>(),
        "CompactChunk" => {
            // only the slices it wrote: the ones it kept from the old list, as they were,
            // have their blocks where they are
            let r = decode::<w::CompactChunkRequest>(bytes)?;
            let old =
                strait_proto::slices_from_wire(r.old).map_err(|e| Status::invalid_argument(e.0))?;
            let new =
                strait_proto::slices_from_wire(r.new).map_err(|e| Status::invalid_argument(e.0))?;
            return Ok(written_by_compaction(&old, &new)
                .into_iter()
                .cloned()
                .collect());
        }
        _ => return Ok(vec![]),
    };
    strait_proto::slices_from_wire(slices).map_err(|e| Status::invalid_argument(e.0))
}

/// The inode whose data a forwarded call writes: a slice, a compaction, or a truncate through
/// a handle (None for any other call).
fn data_written(method: &str, bytes: &[u8]) -> Result<Option<u64>, Status> {
    Ok(match method {
        "WriteSlice" => Some(decode::<w::WriteSliceRequest>(bytes)?.ino),
        "CompactChunk" => Some(decode::<w::CompactChunkRequest>(bytes)?.ino),
        "SetAttr" => {
            let r = decode::<w::SetAttrRequest>(bytes)?;
            (r.size.is_some() && r.via_handle).then_some(r.ino)
        }
        _ => None,
    })
}

/// The mount's session at this mirror, as its call names it (0: none).
fn mount_session(headers: &http::HeaderMap) -> u64 {
    headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
}

/// The version a primary's answer names in [`VERSION_HEADER`], if any.
fn reply_version(reply: &Reply) -> Option<Version> {
    reply
        .headers()
        .get(VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map(Version)
}

/// A reply's head, its one message (or none) and its trailers, read whole; a reply that
/// cannot be read becomes an EIO answer.
async fn collect_reply(
    reply: Reply,
) -> Result<(http::response::Parts, bytes::Bytes, Option<http::HeaderMap>), Reply> {
    use http_body_util::BodyExt;
    let (parts, body) = reply.into_parts();
    match body.collect().await {
        Ok(c) => {
            let trailers = c.trailers().cloned();
            Ok((parts, c.to_bytes(), trailers))
        }
        Err(e) => Err(status_reply(errno_status(
            libc::EIO,
            format!("read the primary's answer: {e}"),
        ))),
    }
}

/// A reply from its head, its one message (or none) and its trailers.
fn rebuild(
    parts: http::response::Parts,
    data: bytes::Bytes,
    trailers: Option<http::HeaderMap>,
) -> Reply {
    let mut frames: Vec<Result<http_body::Frame<bytes::Bytes>, Status>> = vec![];
    if !data.is_empty() {
        frames.push(Ok(http_body::Frame::data(data)));
    }
    if let Some(t) = trailers {
        frames.push(Ok(http_body::Frame::trailers(t)));
    }
    let body = http_body_util::StreamBody::new(tokio_stream::iter(frames));
    http::Response::from_parts(parts, Body::new(body))
}

/// Most bytes of a request body the mirror reads whole to forward it: one gRPC message of the
/// largest size the metadata service accepts, with its 5-byte frame header.
const FORWARDED_BODY_BYTES_MAX: usize = strait_server::MESSAGE_BYTES_MAX + 5;

/// Read a whole request body (one gRPC message), at most [`FORWARDED_BODY_BYTES_MAX`] bytes:
/// a larger one is refused (RESOURCE_EXHAUSTED) once that much has arrived, and nothing is
/// forwarded.
async fn http_body_util_collect(body: Body) -> Result<bytes::Bytes, Status> {
    use http_body_util::BodyExt;
    http_body_util::Limited::new(body, FORWARDED_BODY_BYTES_MAX)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                return Status::resource_exhausted(format!(
                    "a request of more than {FORWARDED_BODY_BYTES_MAX} bytes; nothing was forwarded"
                ));
            }
            // the guard's size limit ends the body with its status: pass that on
            match Status::from_error(e) {
                s if s.code() == tonic::Code::Unknown => {
                    Status::internal(format!("read the request: {}", s.message()))
                }
                s => s,
            }
        })
}

fn http_body_full(b: bytes::Bytes) -> http_body_util::Full<bytes::Bytes> {
    http_body_util::Full::new(b)
}

impl Service<http::Request<Body>> for Router {
    type Response = Reply;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Reply, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.route(req).await) })
    }
}
