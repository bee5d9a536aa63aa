//! A mount's connection to its region's site daemon: [`RemoteMeta`] implements fs-core's
//! [`MetaClient`] over the daemon's gRPC `MetaService`.
//!
//! - **Auth**: every call carries `authorization: Bearer <token>`; TLS (rustls) verifies the
//!   daemon against a CA, and presents a client certificate when the daemon asks for one.
//! - **Reconnection**: the channel reconnects by itself. A call the daemon never received
//!   (connection refused, connect timeout) is retried with exponential backoff until
//!   [`ConnectOptions::reconnect_timeout`] passes. A call that broke while in flight is retried
//!   only if it reads; a mutation that may have been applied is reported as EIO rather than
//!   applied twice.
//! - **Sessions**: after a daemon restart the daemon asks the client to resume its session
//!   ([`strait_proto::RESUME_HEADER`]); the client sends its open handle counts back so
//!   unlinked-but-open files stay alive, then retries the call.
//! - **Closes** are sent in the background: `release` returns at once and a releaser thread
//!   sends the closed handles in batches (a create then costs the kernel's lookup and the
//!   create, not a third round trip). The daemon keeps an unlinked file until the batch naming
//!   its last handle arrives, a few milliseconds later. The handle counts sent on a resumption
//!   include the closes not yet sent, so a close is never applied twice.
//! - **Tracing**: each call is a span, and its OpenTelemetry context travels in the
//!   `traceparent` metadata entry, so the daemon's span joins the mount's trace.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strait_fs_core::error::{Error, Result};
use strait_fs_core::meta::*;
use strait_proto::meta as w;
use strait_proto::meta::meta_service_client::MetaServiceClient;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Status};
use tracing::Instrument;

/// Slice ids taken from the daemon per call.
pub const SLICE_IDS_PER_ALLOC: u32 = 1000;
/// First and largest wait between attempts to reach the daemon.
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Resumptions of the session tried for one call before giving up.
const RESUME_ATTEMPTS_MAX: u32 = 3;
/// How long closing the session at unmount waits for an unreachable daemon.
const CLOSE_PATIENCE: Duration = Duration::from_secs(5);
/// Closed handles waiting for the releaser; when the queue is full, closes are sent inline.
const RELEASE_QUEUE: usize = 4096;
/// How long the releaser gathers closes into one call: a few closes per call instead of one
/// call per close, for a delay far below what anyone waiting on a deletion would notice.
const RELEASE_GATHER: Duration = Duration::from_millis(2);

/// Whether `url` names a site daemon rather than an engine to open in this process.
pub fn is_daemon_url(url: &str) -> bool {
    url.starts_with("strait://")
}

/// TLS settings of a connection, as PEM bytes.
#[derive(Clone, Debug, Default)]
pub struct TlsOptions {
    /// CA certificate(s) the daemon's certificate must chain to.
    pub ca_pem: Vec<u8>,
    /// Client certificate and key, for daemons that require mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Name to verify the daemon's certificate against (default: the host of the URL).
    pub domain: Option<String>,
}

#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// The daemon's token (sent as `authorization: Bearer ...`).
    pub token: String,
    pub tls: Option<TlsOptions>,
    /// Open the session read-only: every mutation answers EROFS at the mount.
    pub read_only: bool,
    /// How long a call keeps trying to reach an unreachable daemon before failing with EIO.
    pub reconnect_timeout: Duration,
    /// Deadline of one call.
    pub rpc_timeout: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            token: String::new(),
            tls: None,
            read_only: false,
            reconnect_timeout: Duration::from_secs(60),
            rpc_timeout: Duration::from_secs(30),
        }
    }
}

/// Adds the token, the session id and the trace context to every call.
#[derive(Clone)]
struct Stamp {
    auth: AsciiMetadataValue,
    session: Arc<AtomicU64>,
}

impl tonic::service::Interceptor for Stamp {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        let md = req.metadata_mut();
        md.insert("authorization", self.auth.clone());
        let sid = self.session.load(Ordering::Relaxed);
        if sid != 0 {
            if let Ok(v) = sid.to_string().parse() {
                md.insert(strait_proto::SESSION_HEADER, v);
            }
        }
        inject_trace_context(md);
        Ok(req)
    }
}

/// Writes the current span's OpenTelemetry context into `md` (`traceparent`).
fn inject_trace_context(md: &mut MetadataMap) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    struct Injector<'a>(&'a mut MetadataMap);
    impl opentelemetry::propagation::Injector for Injector<'_> {
        fn set(&mut self, key: &str, value: String) {
            if let (Ok(k), Ok(v)) = (
                tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
                value.parse(),
            ) {
                self.0.insert(k, v);
            }
        }
    }
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut Injector(md)));
}

type Client = MetaServiceClient<InterceptedService<Channel, Stamp>>;
/// A thread's runtime and connection for one client.
type Connection = (std::rc::Rc<tokio::runtime::Runtime>, Client);

static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// Each calling thread (a FUSE worker) has its own single-threaded runtime and HTTP/2
    /// connection per client: a call then runs start to finish on the caller's thread, with
    /// no hand-off to runtime workers (each hand-off is a thread wake-up, which on a small
    /// machine costs more than the call itself).
    static CONNECTIONS: std::cell::RefCell<HashMap<u64, Connection>> =
        std::cell::RefCell::new(HashMap::new());
}

/// Largest FetchBlock reply (a 4 MiB block and its framing, with room for larger blocks).
const BLOCK_MESSAGE_BYTES_MAX: usize = 80 << 20;
/// Attempts of one FetchBlock that fails for want of a connection.
const FETCH_ATTEMPTS_MAX: u32 = 4;

/// [`strait_fs_core::vfs::BlockFallback`] over a mirror's FetchBlock.
struct BlockFetcher {
    endpoint: Endpoint,
    auth: AsciiMetadataValue,
    channel: tokio::sync::OnceCell<Channel>,
}

impl BlockFetcher {
    async fn once(
        &self,
        req: &w::FetchBlockRequest,
    ) -> std::result::Result<strait_fs_core::object::Bytes, Status> {
        let ch = self
            .channel
            .get_or_init(|| async { self.endpoint.connect_lazy() })
            .await
            .clone();
        let mut c = MetaServiceClient::new(ch)
            .max_decoding_message_size(BLOCK_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(BLOCK_MESSAGE_BYTES_MAX);
        let mut r = Request::new(req.clone());
        r.metadata_mut().insert("authorization", self.auth.clone());
        Ok(c.fetch_block(r).await?.into_inner().data)
    }
}

impl strait_fs_core::vfs::BlockFallback for BlockFetcher {
    fn fetch<'a>(
        &'a self,
        key: &'a str,
        len: u32,
        crc: u32,
        reason: &'a str,
    ) -> strait_fs_core::object::BoxFut<'a, strait_fs_core::object::Bytes> {
        use strait_fs_core::object::ObjectError;
        Box::pin(async move {
            let req = w::FetchBlockRequest {
                key: key.to_string(),
                len,
                crc,
                reason: reason.to_string(),
            };
            let mut delay = Duration::from_millis(100);
            let mut attempt = 0;
            loop {
                attempt += 1;
                match self.once(&req).await {
                    Ok(data) => return Ok(data),
                    Err(s) if s.code() == Code::NotFound => {
                        return Err(ObjectError::NotFound(format!("{key}: {}", s.message())))
                    }
                    Err(s) => {
                        let again = matches!(classify(&s), Failure::NotSent | Failure::Broken);
                        let msg = format!("fetch block {key} from the mirror: {}", describe(&s));
                        if !again || attempt >= FETCH_ATTEMPTS_MAX {
                            return Err(if again {
                                ObjectError::Transient(msg)
                            } else {
                                ObjectError::Fatal(msg)
                            });
                        }
                        tracing::warn!("{msg} (attempt {attempt} of {FETCH_ATTEMPTS_MAX})");
                        tokio::time::sleep(delay).await;
                        delay *= 2;
                    }
                }
            }
        })
    }
}

/// [`MetaClient`] over a site daemon's gRPC service.
pub struct RemoteMeta {
    /// Key of this client's connections in each thread's `CONNECTIONS`.
    id: u64,
    target: String,
    endpoint: Endpoint,
    stamp: Stamp,
    opts: ConnectOptions,
    session: Arc<AtomicU64>,
    info: Mutex<String>,
    format: OnceLock<Format>,
    read_only: AtomicU64,
    session_timeout_ms: AtomicU64,
    /// Handles this mount holds open per inode, as the daemon counts them (closes still
    /// queued for the releaser included): sent back when the session is resumed.
    open: Mutex<HashMap<Ino, u32>>,
    /// The releaser's queue and thread, from the session's opening to its close.
    releaser: Mutex<Option<(SyncSender<Ino>, std::thread::JoinHandle<()>)>>,
    me: Weak<RemoteMeta>,
    /// Slice ids taken from the daemon and not used yet: `[next, end)`.
    slice_ids: Mutex<(u64, u64)>,
    /// The daemon is a mirror that serves FetchBlock.
    block_fallback: std::sync::atomic::AtomicBool,
}

/// How a failed call ended, for the retry loop.
enum Failure {
    /// The daemon never received the call: safe to send again.
    NotSent,
    /// The call broke in flight: it may or may not have been applied.
    Broken,
    /// The daemon does not hold our session: resume it, then send again.
    Resume,
    /// A final answer.
    Final,
}

/// A status's message with the chain of errors under it (TLS and connection failures hide
/// their cause there).
fn describe(s: &Status) -> String {
    let mut text = s.message().to_string();
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    while let Some(e) = src {
        let t = e.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        src = e.source();
    }
    text
}

fn classify(s: &Status) -> Failure {
    if s.metadata().get(strait_proto::RESUME_HEADER).is_some() {
        return Failure::Resume;
    }
    if s.metadata().get(strait_proto::ERRNO_HEADER).is_some() {
        return Failure::Final;
    }
    match s.code() {
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded => {
            // tonic reports both "could not connect" and "connection broke" as Unavailable;
            // only the first says "connect" in its source chain
            let t = describe(s).to_ascii_lowercase();
            if t.contains("certificate") || t.contains("alert") || t.contains("tls") {
                // the daemon refused our certificate or we refused its: waiting cannot help
                Failure::Final
            } else if t.contains("connect") || t.contains("connection refused") {
                Failure::NotSent
            } else if s.code() == Code::Unknown && !t.contains("transport") && !t.contains("h2") {
                Failure::Final
            } else {
                Failure::Broken
            }
        }
        _ => Failure::Final,
    }
}

/// The fs-core error for a final status.
fn to_error(op: &str, s: &Status) -> Error {
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

fn wire_err(op: &str, e: strait_proto::WireError) -> Error {
    Error::Meta(format!(
        "{op}: the site daemon sent an invalid reply: {}",
        e.0
    ))
}

impl RemoteMeta {
    /// Prepare a connection to the daemon at `url` (`strait://host:port`). Nothing is sent
    /// until [`MetaClient::open_session`].
    pub fn connect(url: &str, opts: ConnectOptions) -> Result<Arc<Self>> {
        let hostport = url
            .strip_prefix("strait://")
            .map(|r| r.trim_end_matches('/'))
            .filter(|r| !r.is_empty() && !r.contains('/'))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{url:?} is not a site daemon address: expected strait://HOST:PORT"
                ))
            })?;
        let host = hostport
            .rsplit_once(':')
            .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']'))
            .ok_or_else(|| Error::Invalid(format!("{url:?} has no port")))?
            .to_string();
        let scheme = if opts.tls.is_some() { "https" } else { "http" };
        let mut ep = Endpoint::from_shared(format!("{scheme}://{hostport}"))
            .map_err(|e| Error::Invalid(format!("site daemon address {url:?}: {e}")))?
            .connect_timeout(Duration::from_secs(5))
            .timeout(opts.rpc_timeout)
            .tcp_nodelay(true)
            .tcp_keepalive(Some(Duration::from_secs(30)))
            .max_frame_size(strait_proto::HTTP2_FRAME_BYTES);
        if let Some(tls) = &opts.tls {
            let mut cfg = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&tls.ca_pem))
                .domain_name(tls.domain.clone().unwrap_or(host));
            if let Some((cert, key)) = &tls.identity {
                cfg = cfg.identity(Identity::from_pem(cert, key));
            }
            ep = ep
                .tls_config(cfg)
                .map_err(|e| Error::Invalid(format!("TLS settings for {url}: {e}")))?;
        }
        let auth = format!("Bearer {}", opts.token).parse().map_err(|_| {
            Error::Invalid("the token holds characters not allowed in a header".into())
        })?;
        let session = Arc::new(AtomicU64::new(0));
        let stamp = Stamp {
            auth,
            session: session.clone(),
        };
        Ok(Arc::new_cyclic(|me| RemoteMeta {
            me: me.clone(),
            releaser: Mutex::new(None),
            id: NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
            target: url.to_string(),
            endpoint: ep,
            stamp,
            opts,
            session,
            info: Mutex::new(String::new()),
            format: OnceLock::new(),
            read_only: AtomicU64::new(0),
            session_timeout_ms: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
            slice_ids: Mutex::new((0, 0)),
            block_fallback: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// At a mirror (known once the session is open): where the VFS gets blocks its region's
    /// store lacks. It has its own connection, made on the caller's runtime, so block
    /// transfers neither wait for nor hold up metadata calls.
    pub fn block_fallback(&self) -> Option<Arc<dyn strait_fs_core::vfs::BlockFallback>> {
        if !self.block_fallback.load(Ordering::Relaxed) {
            return None;
        }
        Some(Arc::new(BlockFetcher {
            endpoint: self.endpoint.clone(),
            auth: self.stamp.auth.clone(),
            channel: tokio::sync::OnceCell::new(),
        }))
    }

    /// The session timeout the daemon announced (zero before the session opens).
    pub fn session_timeout(&self) -> Duration {
        Duration::from_millis(self.session_timeout_ms.load(Ordering::Relaxed))
    }

    /// Run one call with retries (see the crate docs); `reads` marks calls safe to repeat.
    fn call<T, F, Fut>(&self, op: &'static str, reads: bool, f: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, Status>>,
    {
        self.call_for(op, reads, self.opts.reconnect_timeout, f)
    }

    /// [`Self::call`], giving up on an unreachable daemon after `patience`.
    fn call_for<T, F, Fut>(
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
        let span = tracing::info_span!("meta_rpc", op);
        let start = Instant::now();
        let mut backoff = BACKOFF_FIRST;
        let mut resumes = 0;
        let mut warned = false;
        loop {
            let (rt, client) = self.connection()?;
            // the connection's tasks only run inside block_on: let them first take in what
            // arrived while this thread was idle (a closed connection is then known closed,
            // and the call goes to a new one instead of failing on the dead one)
            rt.block_on(tokio::task::yield_now());
            let res = rt.block_on(f(client).instrument(span.clone()));
            let s = match res {
                Ok(r) => {
                    if warned {
                        tracing::info!("reached the site daemon {} again", self.target);
                    }
                    return Ok(r.into_inner());
                }
                Err(s) => s,
            };
            match classify(&s) {
                Failure::Final => return Err(to_error(op, &s)),
                Failure::Resume if resumes < RESUME_ATTEMPTS_MAX => {
                    resumes += 1;
                    self.resume()?;
                    continue;
                }
                Failure::Resume => return Err(to_error(op, &s)),
                Failure::Broken if !reads => {
                    let e = Error::Meta(format!(
                        "{op}: the connection to {} broke while the call was in flight; \
                         it may or may not have been applied: {}",
                        self.target,
                        s.message()
                    ));
                    tracing::error!("{e}");
                    return Err(e);
                }
                Failure::NotSent | Failure::Broken => {
                    if start.elapsed() >= patience {
                        let e = Error::Meta(format!(
                            "{op}: the site daemon {} has been unreachable for {:?}: {}",
                            self.target,
                            patience,
                            describe(&s)
                        ));
                        tracing::error!("{e}");
                        return Err(e);
                    }
                    if !warned {
                        tracing::warn!(
                            "{op}: cannot reach the site daemon {}; retrying: {}",
                            self.target,
                            describe(&s)
                        );
                        warned = true;
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// This thread's runtime and connection to the daemon (made on first use).
    fn connection(&self) -> Result<Connection> {
        CONNECTIONS.with(|c| {
            let mut c = c.borrow_mut();
            if let Some((rt, client)) = c.get(&self.id) {
                return Ok((rt.clone(), client.clone()));
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::io("start the RPC runtime", e))?;
            // the channel's background tasks run on this runtime, driven by block_on
            let channel = {
                let _guard = rt.enter();
                self.endpoint.connect_lazy()
            };
            let client = MetaServiceClient::with_interceptor(channel, self.stamp.clone())
                .max_decoding_message_size(64 << 20);
            let rt = std::rc::Rc::new(rt);
            c.insert(self.id, (rt.clone(), client.clone()));
            Ok((rt, client))
        })
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
        self.session.store(0, Ordering::Relaxed);
        let req = w::OpenSessionRequest {
            info: self.info.lock().clone(),
            resume_session: old,
            open_inodes,
        };
        let r = self.call("resume session", true, |mut c| {
            let req = req.clone();
            async move { c.open_session(req).await }
        })?;
        self.session.store(r.session, Ordering::Relaxed);
        if r.resumed {
            tracing::info!("resumed session {} with the site daemon", r.session);
        } else {
            tracing::warn!(
                "the site daemon had closed session {old} (it timed out); continuing as session {}; \
                 locks held before are lost",
                r.session
            );
        }
        Ok(())
    }

    fn counted_open(&self, ino: Ino) {
        *self.open.lock().entry(ino).or_insert(0) += 1;
    }

    /// Send closed handles to the daemon, then stop counting them.
    fn send_releases(&self, inos: Vec<Ino>) -> Result<()> {
        let req = w::ReleaseRequest { inos };
        let res = self.call("release", false, |mut c| {
            let req = req.clone();
            async move { c.release(req).await }
        });
        // Counted off even when the call failed: a close that broke in flight may have been
        // applied, and the daemon drops whatever is left with the session.
        let mut open = self.open.lock();
        for ino in &req.inos {
            if let Some(n) = open.get_mut(ino) {
                *n -= 1;
                if *n == 0 {
                    open.remove(ino);
                }
            }
        }
        res.map(|_| ())
    }

    fn start_releaser(&self) -> Result<()> {
        let mut r = self.releaser.lock();
        if r.is_some() {
            return Ok(());
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(RELEASE_QUEUE);
        let me = self.me.clone();
        let handle = std::thread::Builder::new()
            .name("strait-releaser".into())
            .spawn(move || releaser(me, rx))
            .map_err(|e| Error::io("start the releaser thread", e))?;
        *r = Some((tx, handle));
        Ok(())
    }

    /// Send every queued close and stop the releaser.
    fn stop_releaser(&self) {
        let r = self.releaser.lock().take();
        if let Some((tx, handle)) = r {
            drop(tx);
            if handle.join().is_err() {
                tracing::error!("the releaser thread panicked");
            }
        }
    }
}

impl RemoteMeta {
    /// Open `ino`, with chunk 0's slice list in the reply when `chunk0` asks for it.
    #[allow(clippy::type_complexity)]
    fn open_with(
        &self,
        c: &Ctx,
        ino: Ino,
        flags: i32,
        chunk0: bool,
    ) -> Result<(Attr, Option<(Vec<SliceRef>, Vec<Vec<u8>>)>)> {
        let req = w::OpenRequest {
            ctx: ctx(c),
            ino,
            flags,
            chunk0,
        };
        // opening only checks access and counts a handle: repeating it after a broken
        // connection can at worst count a handle the daemon drops with the session
        let mut r = self.call("open", true, |mut c| {
            let req = req.clone();
            async move { c.open(req).await }
        })?;
        self.counted_open(ino);
        // the handle is open at the daemon now: a chunk list that does not decode is only
        // asked again by the first read
        let chunk = match r.chunk0.take() {
            Some(ch) if chunk0 => match strait_proto::slices_from_wire(ch.slices) {
                Ok(slices) => Some((slices, ch.unsynced)),
                Err(e) => {
                    tracing::warn!("{}", wire_err("open: chunk 0 in the reply", e));
                    None
                }
            },
            _ => None,
        };
        Ok((attr("open", r)?, chunk))
    }
}

/// The releaser thread: sends queued closes in batches until the queue's sender is dropped.
/// A batch gathers the closes of [`RELEASE_GATHER`] after its first one.
fn releaser(me: Weak<RemoteMeta>, rx: Receiver<Ino>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        let deadline = Instant::now() + RELEASE_GATHER;
        while batch.len() < strait_proto::RELEASE_BATCH_MAX {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(ino) => batch.push(ino),
                Err(_) => break,
            }
        }
        let Some(me) = me.upgrade() else { return };
        if let Err(e) = me.send_releases(batch) {
            tracing::warn!("closing handles at the site daemon: {e}");
        }
    }
}

fn ctx(c: &Ctx) -> Option<w::Ctx> {
    Some(c.into())
}

fn entry(op: &str, r: w::EntryReply) -> Result<(Ino, Attr)> {
    Ok((
        r.ino,
        strait_proto::attr_from_wire(r.attr).map_err(|e| wire_err(op, e))?,
    ))
}

fn attr(op: &str, r: w::AttrReply) -> Result<Attr> {
    strait_proto::attr_from_wire(r.attr).map_err(|e| wire_err(op, e))
}

impl MetaClient for RemoteMeta {
    fn settings(&self) -> &Format {
        static UNSET: OnceLock<Format> = OnceLock::new();
        self.format.get().unwrap_or_else(|| {
            UNSET.get_or_init(|| Format {
                name: String::new(),
                uuid: String::new(),
                data_url: String::new(),
                block_size: 4 << 20,
                capacity_bytes: 0,
                trash_delay_s: 0,
                created_ns: 0,
            })
        })
    }

    fn is_read_only(&self) -> bool {
        self.opts.read_only || self.read_only.load(Ordering::Relaxed) != 0
    }

    fn open_session(&self, info: &str) -> Result<u64> {
        *self.info.lock() = info.to_string();
        let req = w::OpenSessionRequest {
            info: info.to_string(),
            resume_session: 0,
            open_inodes: vec![],
        };
        let r = self.call("open session", true, |mut c| {
            let req = req.clone();
            async move { c.open_session(req).await }
        })?;
        let format =
            strait_proto::format_from_wire(r.format).map_err(|e| wire_err("open session", e))?;
        let _ = self.format.set(format);
        self.read_only.store(r.read_only as u64, Ordering::Relaxed);
        self.block_fallback
            .store(r.block_fallback, Ordering::Relaxed);
        self.session_timeout_ms
            .store(r.session_timeout_ms, Ordering::Relaxed);
        self.session.store(r.session, Ordering::Relaxed);
        self.start_releaser()?;
        Ok(r.session)
    }

    fn heartbeat(&self) -> Result<()> {
        self.call("heartbeat", true, |mut c| async move {
            c.heartbeat(w::HeartbeatRequest {}).await
        })?;
        Ok(())
    }

    fn heartbeat_interval(&self) -> Duration {
        let t = self.session_timeout();
        if t.is_zero() {
            Duration::from_secs(10)
        } else {
            (t / 4).clamp(Duration::from_millis(100), Duration::from_secs(10))
        }
    }

    fn close_session(&self) -> Result<()> {
        self.stop_releaser();
        // an unreachable daemon expires the session by itself: an unmount does not wait the
        // whole reconnect timeout for it
        self.call_for("close session", false, CLOSE_PATIENCE, |mut c| async move {
            c.close_session(w::Empty {}).await
        })?;
        self.session.store(0, Ordering::Relaxed);
        Ok(())
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        let r = self.call("getattr", true, |mut c| async move {
            c.get_attr(w::InodeRequest { ctx: None, ino }).await
        })?;
        attr("getattr", r)
    }

    fn lookup(&self, c: &Ctx, parent: Ino, name: &[u8]) -> Result<(Ino, Attr)> {
        let req = w::LookupRequest {
            ctx: ctx(c),
            parent,
            name: name.to_vec(),
        };
        let r = self.call("lookup", true, |mut c| {
            let req = req.clone();
            async move { c.lookup(req).await }
        })?;
        entry("lookup", r)
    }

    fn access(&self, c: &Ctx, ino: Ino, mask: u32) -> Result<()> {
        let req = w::AccessRequest {
            ctx: ctx(c),
            ino,
            mask,
        };
        self.call("access", true, |mut c| {
            let req = req.clone();
            async move { c.access(req).await }
        })?;
        Ok(())
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let r = self.call("readlink", true, |mut c| async move {
            c.read_link(w::InodeRequest { ctx: None, ino }).await
        })?;
        Ok(r.target)
    }

    fn readdir(&self, c: &Ctx, ino: Ino) -> Result<Vec<DirEntry>> {
        let req = w::InodeRequest { ctx: ctx(c), ino };
        let r = self.call("readdir", true, |mut c| {
            let req = req.clone();
            async move { c.read_dir(req).await }
        })?;
        r.entries
            .into_iter()
            .map(|e| DirEntry::try_from(e).map_err(|e| wire_err("readdir", e)))
            .collect()
    }

    fn statfs(&self) -> Result<StatFs> {
        let r = self.call("statfs", true, |mut c| async move {
            c.stat_fs(w::Empty {}).await
        })?;
        Ok(r.into())
    }

    fn setattr(&self, c: &Ctx, ino: Ino, req: &SetAttr) -> Result<Attr> {
        let req = strait_proto::setattr_to_wire(c, ino, req);
        let r = self.call("setattr", false, |mut c| {
            let req = req.clone();
            async move { c.set_attr(req).await }
        })?;
        attr("setattr", r)
    }

    fn mknod(
        &self,
        c: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<(Ino, Attr)> {
        let req = w::MkNodRequest {
            ctx: ctx(c),
            parent,
            name: name.to_vec(),
            mode,
            umask,
            rdev,
        };
        let r = self.call("mknod", false, |mut c| {
            let req = req.clone();
            async move { c.mk_nod(req).await }
        })?;
        entry("mknod", r)
    }

    fn mkdir(
        &self,
        c: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<(Ino, Attr)> {
        let req = w::MkNodRequest {
            ctx: ctx(c),
            parent,
            name: name.to_vec(),
            mode,
            umask,
            rdev: 0,
        };
        let r = self.call("mkdir", false, |mut c| {
            let req = req.clone();
            async move { c.mk_dir(req).await }
        })?;
        entry("mkdir", r)
    }

    fn create(
        &self,
        c: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<(Ino, Attr)> {
        let req = w::MkNodRequest {
            ctx: ctx(c),
            parent,
            name: name.to_vec(),
            mode,
            umask,
            rdev: 0,
        };
        let r = self.call("create", false, |mut c| {
            let req = req.clone();
            async move { c.create(req).await }
        })?;
        let (ino, a) = entry("create", r)?;
        self.counted_open(ino);
        Ok((ino, a))
    }

    fn symlink(&self, c: &Ctx, parent: Ino, name: &[u8], target: &[u8]) -> Result<(Ino, Attr)> {
        let req = w::SymlinkRequest {
            ctx: ctx(c),
            parent,
            name: name.to_vec(),
            target: target.to_vec(),
        };
        let r = self.call("symlink", false, |mut c| {
            let req = req.clone();
            async move { c.symlink(req).await }
        })?;
        entry("symlink", r)
    }

    fn link(&self, c: &Ctx, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr> {
        let req = w::LinkRequest {
            ctx: ctx(c),
            ino,
            new_parent: parent,
            new_name: name.to_vec(),
        };
        let r = self.call("link", false, |mut c| {
            let req = req.clone();
            async move { c.link(req).await }
        })?;
        attr("link", r)
    }

    fn unlink(&self, c: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
        let req = w::NameRequest {
            ctx: ctx(c),
            parent,
            name: name.to_vec(),
        };
        self.call("unlink", false, |mut c| {
            let req = req.clone();
            async move { c.unlink(req).await }
        })?;
        Ok(())
    }

    fn rmdir(&self, c: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
        let req = w::NameRequest {
            ctx: ctx(c),
            parent,
            name: name.to_vec(),
        };
        self.call("rmdir", false, |mut c| {
            let req = req.clone();
            async move { c.rm_dir(req).await }
        })?;
        Ok(())
    }

    fn rename(&self, c: &Ctx, sp: Ino, sn: &[u8], dp: Ino, dn: &[u8], flags: u32) -> Result<()> {
        let req = w::RenameRequest {
            ctx: ctx(c),
            parent: sp,
            name: sn.to_vec(),
            new_parent: dp,
            new_name: dn.to_vec(),
            flags,
        };
        self.call("rename", false, |mut c| {
            let req = req.clone();
            async move { c.rename(req).await }
        })?;
        Ok(())
    }

    fn open_inode(&self, c: &Ctx, ino: Ino, flags: i32) -> Result<Attr> {
        Ok(self.open_with(c, ino, flags, false)?.0)
    }

    fn open_inode_chunk0(
        &self,
        c: &Ctx,
        ino: Ino,
        flags: i32,
    ) -> Result<(Attr, Option<(Vec<SliceRef>, Vec<Vec<u8>>)>)> {
        self.open_with(c, ino, flags, true)
    }

    fn release(&self, ino: Ino) -> Result<()> {
        let queued = match &*self.releaser.lock() {
            Some((tx, _)) => match tx.try_send(ino) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
            },
            None => false,
        };
        if queued {
            Ok(())
        } else {
            self.send_releases(vec![ino])
        }
    }

    fn read_chunk(&self, ino: Ino, idx: u32) -> Result<Vec<SliceRef>> {
        Ok(self.read_chunk_unsynced(ino, idx)?.0)
    }

    fn read_chunk_unsynced(&self, ino: Ino, idx: u32) -> Result<(Vec<SliceRef>, Vec<Vec<u8>>)> {
        let r = self.call("read chunk", true, |mut c| async move {
            c.read_chunk(w::ChunkRequest { ino, index: idx }).await
        })?;
        let slices =
            strait_proto::slices_from_wire(r.slices).map_err(|e| wire_err("read chunk", e))?;
        Ok((slices, r.unsynced))
    }

    fn next_slice_id(&self) -> Result<u64> {
        let mut ids = self.slice_ids.lock();
        if ids.0 >= ids.1 {
            // a lost reply only wastes the ids it carried
            let r = self.call("allocate slice ids", true, |mut c| async move {
                c.alloc_slice_ids(w::AllocRequest {
                    count: SLICE_IDS_PER_ALLOC,
                })
                .await
            })?;
            if r.first == 0 || r.count == 0 {
                return Err(Error::Meta(
                    "allocate slice ids: the site daemon returned an empty range".into(),
                ));
            }
            *ids = (r.first, r.first.saturating_add(r.count as u64));
        }
        let id = ids.0;
        ids.0 += 1;
        Ok(id)
    }

    fn write_slice(&self, ino: Ino, idx: u32, slice: SliceRef, mtime_ns: i64) -> Result<Attr> {
        let req = w::WriteSliceRequest {
            ino,
            index: idx,
            slice: Some((&slice).into()),
            mtime_ns,
        };
        let r = self.call("write slice", false, |mut c| {
            let req = req.clone();
            async move { c.write_slice(req).await }
        })?;
        attr("write slice", r)
    }

    fn compact_chunk(
        &self,
        ino: Ino,
        idx: u32,
        old: &[SliceRef],
        new: Vec<SliceRef>,
    ) -> Result<bool> {
        let req = w::CompactChunkRequest {
            ino,
            index: idx,
            old: strait_proto::slices_to_wire(old),
            new: strait_proto::slices_to_wire(&new),
        };
        // compaction checks the old list under its transaction: a repeat is refused harmlessly
        let r = self.call("compact chunk", true, |mut c| {
            let req = req.clone();
            async move { c.compact_chunk(req).await }
        })?;
        Ok(r.done)
    }

    fn getxattr(&self, c: &Ctx, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        let req = w::XattrRequest {
            ctx: ctx(c),
            ino,
            name: name.to_vec(),
        };
        let r = self.call("getxattr", true, |mut c| {
            let req = req.clone();
            async move { c.get_xattr(req).await }
        })?;
        Ok(r.value)
    }

    fn listxattr(&self, c: &Ctx, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let req = w::InodeRequest { ctx: ctx(c), ino };
        let r = self.call("listxattr", true, |mut c| {
            let req = req.clone();
            async move { c.list_xattr(req).await }
        })?;
        Ok(r.names)
    }

    fn setxattr(&self, c: &Ctx, ino: Ino, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        let req = w::SetXattrRequest {
            ctx: ctx(c),
            ino,
            name: name.to_vec(),
            value: value.to_vec(),
            flags,
        };
        self.call("setxattr", false, |mut c| {
            let req = req.clone();
            async move { c.set_xattr(req).await }
        })?;
        Ok(())
    }

    fn removexattr(&self, c: &Ctx, ino: Ino, name: &[u8]) -> Result<()> {
        let req = w::XattrRequest {
            ctx: ctx(c),
            ino,
            name: name.to_vec(),
        };
        self.call("removexattr", false, |mut c| {
            let req = req.clone();
            async move { c.remove_xattr(req).await }
        })?;
        Ok(())
    }

    fn flock(&self, ino: Ino, owner: u64, typ: LockType) -> Result<()> {
        let req = w::FlockRequest {
            ino,
            owner,
            typ: w::LockType::from(typ) as i32,
        };
        // taking or releasing a lock the owner already holds changes nothing: safe to repeat
        self.call("flock", true, |mut c| async move { c.flock(req).await })?;
        Ok(())
    }

    fn getlk(
        &self,
        ino: Ino,
        owner: u64,
        typ: LockType,
        start: u64,
        end: u64,
    ) -> Result<Option<PosixLock>> {
        let req = w::LockRequest {
            ino,
            owner,
            pid: 0,
            typ: w::LockType::from(typ) as i32,
            start,
            end,
        };
        let r = self.call("getlk", true, |mut c| async move { c.get_lk(req).await })?;
        r.conflict
            .map(|l| PosixLock::try_from(l).map_err(|e| wire_err("getlk", e)))
            .transpose()
    }

    fn setlk(
        &self,
        ino: Ino,
        owner: u64,
        pid: u32,
        typ: LockType,
        start: u64,
        end: u64,
    ) -> Result<()> {
        let req = w::LockRequest {
            ino,
            owner,
            pid,
            typ: w::LockType::from(typ) as i32,
            start,
            end,
        };
        self.call("setlk", true, |mut c| async move { c.set_lk(req).await })?;
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.call(
            "sync",
            true,
            |mut c| async move { c.sync(w::Empty {}).await },
        )?;
        Ok(())
    }
}
