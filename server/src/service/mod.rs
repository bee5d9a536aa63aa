//! [`MetaServer`]: fs-core's metadata API served over gRPC to the mounts of a region.
//!
//! Each mount is a session with its own view of the engine ([`Meta::session_view`]): the
//! views share the engine and the table of open handles, so a file unlinked at one mount
//! stays readable at another that holds it open. Engine calls block (RocksDB, Redis), so each
//! runs on tokio's blocking pool.
//!
//! Here: the service and its calls; in `run.rs`, how one engine call runs (timing, errors,
//! `replicated` durability, request ids, the fence).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::RwLock;
use strait_auth::{Slot, Slots};
use strait_fs_core::error::Error;
use strait_fs_core::layout::written_by_compaction;
use strait_fs_core::meta::{Attr, Committed, Ino, Meta, SliceRef};
use strait_fs_core::Version;
use strait_proto::meta as w;
use strait_proto::meta::meta_service_server::MetaService;
use strait_proto::{WireError, READ_VERSION_HEADER, RESUME_HEADER, SESSION_HEADER, VERSION_HEADER};
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::heard::Heard;
use crate::metrics::Metrics;
use crate::slice_ranges::SliceRanges;

mod replay;
mod run;
mod scope;

use crate::requests::{is_retry, request_id, Requests};
use replay::{replay, replay_create, Recorded, Replay};
use run::unversioned;
use scope::Scope;
use strait_auth::Rules;

/// Whether this daemon may commit mutations at all: a primary whose epoch was superseded may
/// not (another primary was promoted), and every mutation then answers EROFS.
pub trait WriteFence: Send + Sync + 'static {
    /// Why mutations are refused, or None while they are allowed. Asked after
    /// [`Self::unsettled`].
    fn refused(&self) -> Pin<Box<dyn Future<Output = Option<String>> + Send + '_>>;

    /// Why the daemon's state may still lack changes it acknowledged before it went back (a
    /// primary catching up after a power loss, or one that has not yet compared its state
    /// with the replicator's since it started), after waiting a moment for that to end; None
    /// when every call may be answered from it. Every call but a session's opening asks:
    /// until then, a read could see a state older than one it saw before.
    fn unsettled(&self) -> Pin<Box<dyn Future<Output = Option<String>> + Send + '_>> {
        Box::pin(async { None })
    }

    /// The calls past this fence that may still commit, counted for a planned hand-over
    /// (see [`crate::in_flight`]); None: not counted. A call enters before it asks the fence
    /// and leaves once its engine call returned.
    fn in_flight(&self) -> Option<Arc<crate::InFlight>> {
        None
    }

    /// Why reads of the metadata are refused now (None: they are answered): a primary fenced
    /// for a while holds a history that no longer goes on.
    fn reads_refused(&self) -> Option<String> {
        None
    }
}

/// The calls that read the file system's metadata (a fenced primary refuses them after a
/// while: [`WriteFence::reads_refused`]).
const METADATA_READS: [&str; 10] = [
    "lookup",
    "getattr",
    "access",
    "readlink",
    "readdir",
    "statfs",
    "open",
    "read_chunk",
    "getxattr",
    "listxattr",
];

/// `replicated` durability: a mutation is answered only once the replicator holds its version.
pub trait ReplicationWait: Send + Sync + 'static {
    /// Resolve when every version up to `version` is replicated, or say why it will not be
    /// (shipping stopped, or it took too long).
    fn wait(
        &self,
        version: Version,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>>;
}

/// Most slice ids one call may take.
pub const ALLOC_SLICE_IDS_MAX: u32 = 100_000;
/// Most locks a resumed session may name.
pub const HELD_LOCKS_MAX: usize = 100_000;
/// Longest free-text session description kept.
const SESSION_INFO_LEN_MAX: usize = 1024;

type Reply<T> = Result<Response<T>, Status>;

/// The metadata service of one site.
pub struct MetaServer {
    engine: Arc<Meta>,
    /// The engine answers in microseconds from local storage (RocksDB, memory): run its calls
    /// on the serving thread instead of handing them to the blocking pool, which costs two
    /// thread switches per call. Network engines (Redis) go to the blocking pool.
    inline: bool,
    /// Each session this daemon holds: its view of the engine, and who opened it (a call
    /// naming it from anyone else is refused).
    sessions: RwLock<HashMap<u64, (Arc<Meta>, String)>>,
    session_timeout_ms: u64,
    metrics: Arc<Metrics>,
    /// In `replicated` durability: waits until the replicator holds a version.
    replicated: Option<Arc<dyn ReplicationWait>>,
    /// At a mirror: the region's own object store (told to mounts instead of the primary's)
    /// and what serves FetchBlock.
    blocks: Option<(String, Arc<dyn BlockSource>)>,
    /// Mutations by request id, for their retries.
    requests: Arc<Requests>,
    /// At a primary: refuses every mutation once its epoch is superseded.
    fence: Option<Arc<dyn WriteFence>>,
    /// When this daemon started (ns since the epoch): a request record older than this was
    /// committed by an earlier run.
    started_ns: i64,
    /// The slice ids each session was given: a written slice must name one of its own.
    slice_ranges: Arc<parking_lot::Mutex<SliceRanges>>,
    /// When each session was last heard from, by the monotonic clock (session expiry).
    heard: Arc<Heard>,
    /// The bound on sessions, in all and per peer address, and the slot each session holds.
    session_slots: Slots,
    slot_of: parking_lot::Mutex<HashMap<u64, Slot>>,
    /// Where the engine's commits are told to the mounts' Watch streams (None: Watch is
    /// UNIMPLEMENTED, and mounts keep nothing).
    watch: Option<Arc<crate::watch::WatchHub>>,
    /// Why the mounts may not keep what the stream tells them now (a mirror outside its
    /// staleness window); None: they may.
    watch_refused: Option<WatchRefused>,
    /// The inodes each session opened for writing (and still holds a handle on): a caller
    /// whose ids are squashed or fixed may write a file's data only through one of them.
    writers: Arc<parking_lot::Mutex<HashMap<u64, HashSet<Ino>>>>,
}

/// Why a Watch stream may not go on now, or None; see [`MetaServer::watch_while`].
pub type WatchRefused = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// Most sessions a site daemon holds at once (as many as it keeps slice ranges for).
pub const SESSIONS_MAX: usize = crate::slice_ranges::SESSIONS_MAX;
/// Most sessions one peer address may hold at once (a host of many mounts; a mirror forwards
/// its whole region's calls under one).
pub const SESSIONS_PER_PEER_MAX: usize = 4_096;

/// What serves FetchBlock at a mirror: a block its region's store lacks, from the primary's.
pub trait BlockSource: Send + Sync + 'static {
    /// For each of `slices`, the blocks this region's store does not hold yet (see
    /// `ReadChunkReply.unsynced`). Runs on a blocking thread.
    fn unsynced(&self, slices: &[SliceRef]) -> Vec<Vec<u8>>;

    fn fetch(
        &self,
        req: w::FetchBlockRequest,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<strait_fs_core::object::Bytes, Status>> + Send>,
    >;
}

fn invalid(e: WireError) -> Error {
    Error::Invalid(e.0)
}

/// Refuse slices whose ids session view `m` was not given (a read-only engine answers its
/// own EROFS instead): nothing is changed, and the mount takes a new range.
fn own_slices<'a>(
    ranges: &parking_lot::Mutex<SliceRanges>,
    m: &Meta,
    slices: impl IntoIterator<Item = &'a SliceRef>,
) -> Result<(), Error> {
    if m.is_read_only() {
        return Ok(());
    }
    let sid = m.session_id();
    match ranges
        .lock()
        .first_foreign(sid, slices.into_iter().map(|s| s.id))
    {
        None => Ok(()),
        Some(id) => Err(Error::SliceNotAllocated(format!(
            "slice {id} was not given to session {sid} by this daemon (it restarted since, \
             the session was replaced, or the id was never handed out); nothing was changed"
        ))),
    }
}

/// A chunk's slice list as ReadChunk answers it, with, at a mirror, the blocks its region's
/// store does not hold yet.
fn chunk_reply(source: Option<Arc<dyn BlockSource>>, slices: &[SliceRef]) -> w::ReadChunkReply {
    w::ReadChunkReply {
        unsynced: source.map(|s| s.unsynced(slices)).unwrap_or_default(),
        slices: strait_proto::slices_to_wire(slices),
    }
}

fn attr_reply(a: &Attr) -> w::AttrReply {
    w::AttrReply {
        attr: Some(a.into()),
        chunk0: None,
    }
}

fn entry_reply((ino, a): (Ino, Attr)) -> w::EntryReply {
    w::EntryReply {
        ino,
        attr: Some((&a).into()),
    }
}

/// The span of one call, a child of the caller's trace when it sent a `traceparent`.
fn rpc_span(op: &'static str, md: &MetadataMap) -> tracing::Span {
    let session = md
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string();
    strait_auth::trace::child_of(
        tracing::info_span!("rpc", op, session = %session),
        md.as_ref(),
    )
}

impl MetaServer {
    pub fn new(engine: Arc<Meta>, session_timeout_ms: u64, metrics: Arc<Metrics>) -> Self {
        let inline = strait_fs_core::kv::in_process(engine.kv().as_ref());
        MetaServer {
            engine,
            inline,
            sessions: RwLock::new(HashMap::new()),
            session_timeout_ms,
            metrics,
            replicated: None,
            blocks: None,
            requests: Arc::new(Requests::default()),
            fence: None,
            started_ns: strait_fs_core::clock::now_ns(),
            slice_ranges: Arc::new(parking_lot::Mutex::new(SliceRanges::default())),
            heard: Arc::new(Heard::default()),
            session_slots: Slots::new("sessions", SESSIONS_MAX, SESSIONS_PER_PEER_MAX),
            slot_of: parking_lot::Mutex::new(HashMap::new()),
            watch: None,
            watch_refused: None,
            writers: Arc::new(parking_lot::Mutex::new(HashMap::new())),
        }
    }

    /// Serve Watch from `hub`, which the engine's [`crate::watch::WatchedKv`] tells of
    /// each commit.
    pub fn watched_by(mut self, hub: Arc<crate::watch::WatchHub>) -> Self {
        self.watch = Some(hub);
        self
    }

    /// Serve Watch only while `refused` says nothing: a stream is refused (UNAVAILABLE) or
    /// ended (after a reset) when it says why not, and the mounts ask for everything until
    /// their stream is open again.
    pub fn watch_while(mut self, refused: WatchRefused) -> Self {
        self.watch_refused = Some(refused);
        self
    }

    /// At a mirror: mounts use `data_url` (the region's store) and ask `source` for blocks
    /// not there yet.
    pub fn with_blocks(mut self, data_url: String, source: Arc<dyn BlockSource>) -> Self {
        self.blocks = Some((data_url, source));
        self
    }

    /// Refuse every mutation (EROFS) while `fence` says so.
    pub fn fenced_by(mut self, fence: Arc<dyn WriteFence>) -> Self {
        self.fence = Some(fence);
        self
    }

    /// Answer a mutation only once `wait` says the replicator holds its version.
    pub fn replicated(mut self, wait: Arc<dyn ReplicationWait>) -> Self {
        self.replicated = Some(wait);
        self
    }

    pub fn engine(&self) -> &Arc<Meta> {
        &self.engine
    }

    /// A call enters the fence's count of calls in flight (when it counts them).
    fn enter(&self) -> Option<crate::InFlightGuard> {
        self.fence
            .as_ref()
            .and_then(|f| f.in_flight())
            .map(|i| i.enter())
    }

    /// Session `sid` holds `count` slice ids from `first`, given elsewhere (a promoted
    /// mirror takes over the ranges the old primary gave its mounts through it), so its
    /// writes under them are taken here.
    pub fn grant_slices(&self, sid: u64, first: strait_fs_core::SliceId, count: u32) {
        self.slice_ranges.lock().grant(sid, first, count);
    }

    /// Forget the in-memory views of sessions the engine no longer lists (closed or timed out).
    /// When each session was last heard from (see [`crate::sessions`]).
    pub fn heard(&self) -> Arc<Heard> {
        self.heard.clone()
    }

    pub fn drop_sessions(&self, closed: &[u64]) {
        let mut s = self.sessions.write();
        let mut ranges = self.slice_ranges.lock();
        let mut slots = self.slot_of.lock();
        let mut writers = self.writers.lock();
        for sid in closed {
            s.remove(sid);
            ranges.forget(*sid);
            slots.remove(sid);
            writers.remove(sid);
        }
        self.metrics.sessions.set(s.len() as i64);
    }

    /// The session `md` names, when this daemon holds it and `caller` opened it; else the
    /// status a call without one gets (FAILED_PRECONDITION, asking the mount to open or resume
    /// its session), or PERMISSION_DENIED for a session another credential opened. A mirror
    /// asks before it forwards a mount's call, as the primary would ask.
    pub fn held_session(
        &self,
        md: &MetadataMap,
        caller: Option<&strait_auth::Caller>,
    ) -> Result<u64, Status> {
        self.session(md, caller).map(|m| m.session_id())
    }

    /// The rules a call is held to: its caller's ([`strait_auth::Caller::rules`]), or, from a
    /// mirror forwarding a mount's call, the rules it names in [`strait_auth::rules::RULES_HEADER`]
    /// (taken from no other caller).
    pub fn rules_of(
        &self,
        headers: &tonic::codegen::http::HeaderMap,
        caller: Option<&strait_auth::Caller>,
    ) -> Result<Arc<Rules>, Status> {
        let Some(c) = caller else {
            return Ok(Arc::new(Rules::default()));
        };
        if c.roles.contains(strait_auth::Role::Mirror) {
            if let Some(v) = headers.get(strait_auth::rules::RULES_HEADER) {
                let text = v
                    .to_str()
                    .map_err(|_| Status::invalid_argument("the forwarded rules are not ASCII"))?;
                let rules = Rules::from_text(text)
                    .map_err(|e| Status::invalid_argument(format!("the forwarded rules: {e}")))?;
                return Ok(Arc::new(rules));
            }
        }
        Ok(c.rules.clone())
    }

    fn rules_of_req<T>(&self, req: &Request<T>) -> Result<Arc<Rules>, Status> {
        self.rules_of(req.metadata().as_ref(), strait_auth::caller(req))
    }

    /// The rules of a call, and how its session's writes of file data are checked
    /// ([`Writers`]): against what it opened for writing when the caller's ids are squashed or
    /// fixed, unless a mirror forwards the call (the mirror checked its mount's session).
    pub fn data_rules_of(
        &self,
        headers: &tonic::codegen::http::HeaderMap,
        caller: Option<&strait_auth::Caller>,
    ) -> Result<(Arc<Rules>, Writers), Status> {
        let rules = self.rules_of(headers, caller)?;
        let forwarded = caller.is_some_and(|c| c.roles.contains(strait_auth::Role::Mirror));
        let enforce = rules.restricts_ids() && !forwarded;
        Ok((
            rules,
            Writers {
                set: self.writers.clone(),
                enforce,
            },
        ))
    }

    fn data_rules<T>(&self, req: &Request<T>) -> Result<(Arc<Rules>, Writers), Status> {
        self.data_rules_of(req.metadata().as_ref(), strait_auth::caller(req))
    }

    /// The handles the session `md` names holds on `ino` (the session checked as
    /// [`MetaServer::held_session`] checks it).
    pub fn session_holds(
        &self,
        md: &MetadataMap,
        caller: Option<&strait_auth::Caller>,
        ino: Ino,
    ) -> Result<u32, Status> {
        self.session(md, caller).map(|m| m.holds(ino))
    }

    /// The session of `req`, as [`MetaServer::held_session`] finds it.
    fn session_of<T>(&self, req: &Request<T>) -> Result<Arc<Meta>, Status> {
        self.session(req.metadata(), strait_auth::caller(req))
    }

    /// The caller's session view, or a status asking it to open (or resume) its session, or
    /// refusing it someone else's.
    fn session(
        &self,
        md: &MetadataMap,
        caller: Option<&strait_auth::Caller>,
    ) -> Result<Arc<Meta>, Status> {
        let sid = md
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let Some(sid) = sid else {
            return Err(Status::failed_precondition(format!(
                "the call names no session (metadata entry {SESSION_HEADER}): call OpenSession first"
            )));
        };
        if let Some((m, owner)) = self.sessions.read().get(&sid) {
            check_owner(sid, owner, caller)?;
            return Ok(m.clone());
        }
        let mut s = Status::failed_precondition(format!(
            "this daemon holds no session {sid} (it restarted or the session timed out): open it again"
        ));
        s.metadata_mut()
            .insert(RESUME_HEADER, "1".parse().expect("ascii"));
        Err(s)
    }
}

/// The inodes each session opened for writing, for one call: a caller whose ids are squashed
/// or fixed may write a file's data (a slice, a compaction, a truncate through a handle) only
/// through a handle it opened for writing, since its word on who it is is not taken and those
/// calls carry no ids: the permission its open was checked for is what allows them.
pub struct Writers {
    set: Arc<parking_lot::Mutex<HashMap<u64, HashSet<Ino>>>>,
    /// Whether this call's session is checked (and its opens for writing noted).
    enforce: bool,
}

impl Writers {
    /// Session `sid` opened `ino` for writing (a create, an open for writing).
    pub fn note(&self, sid: u64, ino: Ino) {
        if self.enforce {
            self.set.lock().entry(sid).or_default().insert(ino);
        }
    }

    /// Whether this call's session is checked (its caller's ids are squashed or fixed).
    pub fn enforced(&self) -> bool {
        self.enforce
    }

    /// Session `sid` holds no handle on `ino` any more.
    pub fn forget(&self, sid: u64, ino: Ino) {
        let mut set = self.set.lock();
        if let Some(s) = set.get_mut(&sid) {
            s.remove(&ino);
            if s.is_empty() {
                set.remove(&sid);
            }
        }
    }

    /// Refuse a write of `ino`'s data from session `sid` that did not open it for writing
    /// (EBADF, as a write through a handle opened for reading).
    pub fn check(&self, sid: u64, ino: Ino) -> Result<(), Error> {
        if !self.enforce || self.set.lock().get(&sid).is_some_and(|s| s.contains(&ino)) {
            return Ok(());
        }
        Err(Error::Sys(libc::EBADF))
    }

    /// Refuse a read of a file's data (its slices) by a session that holds no handle on it
    /// (EBADF): a caller whose ids are squashed or fixed reads what its open was checked for.
    pub fn check_read(&self, view: &Meta, ino: Ino) -> Result<(), Error> {
        if !self.enforce || view.holds(ino) > 0 {
            return Ok(());
        }
        Err(Error::Sys(libc::EBADF))
    }
}

/// Who a caller is, for the sessions it opens (empty behind no guard).
fn principal_of(caller: Option<&strait_auth::Caller>) -> &str {
    caller.map(|c| c.principal.as_str()).unwrap_or("")
}

/// Refuse a call naming session `sid`, which `owner` opened, from any other caller. A session
/// of no owner (an earlier release's, kept across an upgrade) may be named by anyone, as before.
fn check_owner(sid: u64, owner: &str, caller: Option<&strait_auth::Caller>) -> Result<(), Status> {
    if owner.is_empty() || owner == principal_of(caller) {
        return Ok(());
    }
    Err(Status::permission_denied(format!(
        "session {sid} was opened with other credentials: a call may name only a session its own          credentials opened; nothing was changed"
    )))
}

/// MkNod, MkDir and Create: one request, three kinds of entry.
#[derive(Clone, Copy)]
enum NewEntry {
    Node,
    Dir,
    File,
}

fn make_entry(
    m: &Meta,
    sc: &Scope,
    what: NewEntry,
    r: w::MkNodRequest,
) -> Result<Committed<w::EntryReply>, Error> {
    let ctx = sc.ctx(r.ctx)?;
    let parent = sc.ino(m, r.parent)?;
    let made = match what {
        NewEntry::Node => m.mknod_versioned(&ctx, parent, &r.name, r.mode, r.umask, r.rdev),
        NewEntry::Dir => m.mkdir_versioned(&ctx, parent, &r.name, r.mode, r.umask),
        NewEntry::File => m.create_versioned(&ctx, parent, &r.name, r.mode, r.umask),
    }?;
    Ok(made.map(|e| entry_out(sc, e)))
}

/// An entry as the caller of scope `sc` knows it.
fn entry_out(sc: &Scope, (ino, a): (Ino, Attr)) -> w::EntryReply {
    entry_reply((sc.out(ino), sc.attr_out(ino, a)))
}

/// Whether `flags` (open(2)'s) open a file for writing.
fn opens_for_writing(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0
}

/// One mutation: find the session, then run `$body` (with `$m` the session view and `$r` the
/// request message) on the blocking pool, inside the call's span. `$body` returns a
/// [`Committed`] value: its version is named in the reply and, in `replicated` durability,
/// waited for. A change is refused while the daemon is fenced; made under a request id, it
/// commits its request record and a retry is answered from it (with `replay`, or the reply
/// the record's outcome gives). `@unrecorded`: a call that is not refused while fenced and
/// commits no record (closing handles and sessions, reads), run again after a restart.
macro_rules! mutation {
    ($self:ident, $req:ident, $op:literal, |$m:ident, $r:ident| $body:expr) => {
        mutation!(@run true, Some(replay), $self, $req, $op, |$m, $r| $body)
    };
    ($self:ident, $req:ident, $op:literal, replay = $replay:expr, |$m:ident, $r:ident| $body:expr) => {
        mutation!(@run true, Some($replay), $self, $req, $op, |$m, $r| $body)
    };
    (@unrecorded $self:ident, $req:ident, $op:literal, |$m:ident, $r:ident| $body:expr) => {
        mutation!(@run false, None, $self, $req, $op, |$m, $r| $body)
    };
    (@run $change:expr, $replay:expr, $self:ident, $req:ident, $op:literal, |$m:ident, $r:ident| $body:expr) => {{
        let span = rpc_span($op, $req.metadata());
        async {
            // counted from before the fence is asked until the engine call returned (the
            // guard moves into the call), so a hand-over waits for it (`crate::in_flight`)
            let in_flight = $self.enter();
            if $change {
                $self.check_fence($op).await?;
            } else {
                $self.check_settled($op).await?;
            }
            let $m = $self.session_of(&$req)?;
            let id = request_id($req.metadata())?;
            let retry = is_retry($req.metadata());
            let $r = $req.into_inner();
            let (out, version) = match id {
                Some(id) => {
                    // a read-only engine (a mirror's) commits no change here, and no record
                    let replay: Option<Replay<_>> = $replay;
                    let recorded = replay
                        .filter(|_| !$m.is_read_only())
                        .map(|replay| Recorded { view: $m.clone(), replay });
                    let $m = match &recorded {
                        Some(_) => $m.for_request(&id),
                        None => $m,
                    };
                    $self.once(id, retry, $op, recorded, move || {
                        let _in_flight = in_flight;
                        $body
                    }).await?
                }
                None => $self.blocking_v($op, move || {
                    let _in_flight = in_flight;
                    $body
                }).await?,
            };
            let mut resp = Response::new(out);
            if let Some(version) = version {
                if let Ok(v) = version.to_string().parse() {
                    resp.metadata_mut().insert(VERSION_HEADER, v);
                }
            }
            Ok(resp)
        }
        .instrument(span)
        .await
    }};
}

/// One call that commits nothing: [`mutation!`] with a plain value. Asked with
/// [`READ_VERSION_HEADER`] (a read a mirror forwards), the reply names the latest version
/// once the read is done: at least that of any state the read saw.
macro_rules! rpc {
    ($self:ident, $req:ident, $op:literal, |$m:ident, $r:ident| $body:expr) => {{
        if METADATA_READS.contains(&$op) {
            $self.check_reads($op)?;
        }
        let stamp = $req.metadata().get(READ_VERSION_HEADER).is_some();
        let resp: Result<Response<_>, Status> =
            mutation!(@unrecorded $self, $req, $op, |$m, $r| unversioned(move || $body)());
        let mut resp = resp?;
        if stamp {
            $self.stamp_version(&mut resp).await?;
        }
        Ok(resp)
    }};
}

/// The stream of `MetaService.Watch`.
pub type WatchStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<w::WatchBatch, Status>> + Send>>;

/// Batches buffered for one Watch stream before its feed waits for the mount.
const WATCH_BUFFER: usize = 16;

#[tonic::async_trait]
impl MetaService for MetaServer {
    type WatchStream = WatchStream;

    async fn watch(&self, req: Request<w::WatchRequest>) -> Reply<Self::WatchStream> {
        let Some(hub) = self.watch.clone() else {
            return Err(Status::unimplemented(
                "this daemon does not tell its mounts what changes (its engine is across the \
                 network): mounts ask it for every lookup",
            ));
        };
        // a state that may lack acknowledged changes, or one no longer read, is not told
        self.check_settled("watch").await?;
        self.check_reads("watch")?;
        // a credential confined to a subtree is told the changes in it alone
        let rules = self.rules_of_req(&req)?;
        let filter: Option<crate::watch::BatchFilter> = if rules.subtree().is_some() {
            let engine = self.engine.clone();
            let (e, r) = (engine.clone(), rules.clone());
            let sc = self
                .blocking("watch", move || match Scope::of(&e, &r) {
                    Ok(s) => Ok(Some(s)),
                    Err(Error::Sys(libc::ENOENT)) => Ok(None),
                    Err(e) => Err(e),
                })
                .await?
                .ok_or_else(|| Status::failed_precondition(scope::missing_message(&rules)))?;
            Some(Box::new(move |b: &mut w::WatchBatch| {
                sc.confine_batch(&engine, b)
            }))
        } else {
            None
        };
        let refused = self.watch_refused.clone();
        if let Some(why) = refused.as_ref().and_then(|r| r()) {
            return Err(Status::unavailable(format!("watch: {why}")));
        }
        let fence = self.fence.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
        tokio::spawn(crate::watch::feed(
            hub,
            tx,
            move || {
                fence
                    .as_ref()
                    .and_then(|f| f.reads_refused())
                    .or_else(|| refused.as_ref().and_then(|r| r()))
            },
            filter,
        ));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn open_session(
        &self,
        req: Request<w::OpenSessionRequest>,
    ) -> Reply<w::OpenSessionReply> {
        let span = rpc_span("open_session", req.metadata());
        let peer = req
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|| "?".into());
        let ip = req.remote_addr().map(|a| a.ip());
        let owner = principal_of(strait_auth::caller(&req)).to_string();
        let rules = self.rules_of_req(&req)?;
        let r = req.into_inner();
        // a confined credential's subtree must be there before a mount can use it
        let scope = {
            let (engine, wanted_rules) = (self.engine.clone(), rules.clone());
            let found = self
                .blocking("open_session", move || {
                    match Scope::of(&engine, &wanted_rules) {
                        Ok(s) => Ok(Some(s)),
                        Err(Error::Sys(libc::ENOENT)) => Ok(None),
                        Err(e) => Err(e),
                    }
                })
                .await?;
            found.ok_or_else(|| Status::failed_precondition(scope::missing_message(&rules)))?
        };
        // a session another credential opened is not taken up, here or in the engine
        if r.resume_session != 0 {
            let held = self
                .sessions
                .read()
                .get(&r.resume_session)
                .map(|(_, o)| o.clone());
            let recorded = match held {
                Some(o) => Some(o),
                None => {
                    let (engine, sid) = (self.engine.clone(), r.resume_session);
                    self.blocking("open_session", move || engine.session_owner(sid))
                        .await?
                }
            };
            if let Some(o) = recorded {
                if !o.is_empty() && o != owner {
                    return Err(Status::permission_denied(format!(
                        "session {} was opened with other credentials: it can be resumed only \
                         with them; nothing was changed",
                        r.resume_session
                    )));
                }
            }
        }
        // a session this daemon holds keeps its slot; any other takes one, or is refused
        let slot = if r.resume_session != 0 && self.slot_of.lock().contains_key(&r.resume_session) {
            None
        } else {
            Some(self.session_slots.take(ip)?)
        };
        let engine = self.engine.clone();
        let mut info: String = r.info.chars().take(SESSION_INFO_LEN_MAX).collect();
        info.push_str(&format!(" (from {peer})"));
        let wanted = r.resume_session;
        let mut handles: Vec<(Ino, u32)> =
            r.open_inodes.iter().map(|o| (o.ino, o.handles)).collect();
        if r.locks.len() > HELD_LOCKS_MAX {
            return Err(Status::invalid_argument(format!(
                "the session names {} held locks; at most {HELD_LOCKS_MAX}",
                r.locks.len()
            )));
        }
        let mut held = r
            .locks
            .iter()
            .map(strait_proto::held_lock_from_wire)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Status::invalid_argument(format!("a held lock: {}", e.0)))?;
        let owner_kept = owner.clone();
        let (sid, view, resumed, lost) = self
            .blocking("open_session", move || {
                // a session the engine still lists is taken up again; any other is new
                let listed = wanted != 0 && engine.sessions()?.iter().any(|s| s.0 == wanted);
                let (sid, view) = if listed {
                    let view = engine.session_view(wanted);
                    // one of an earlier release, owned by no one, is its resumer's from now
                    view.claim_session(&owner_kept)?;
                    (wanted, view)
                } else {
                    let view = engine.session_view(0);
                    let sid = view.new_session_owned(&info, &owner_kept)?;
                    (sid, view)
                };
                if scope.confined() {
                    // a confined session takes back only what lies in its subtree: the
                    // handles and locks it names are its word, not a proof
                    let keep = |ino: &mut Ino| match scope.ino(&view, *ino) {
                        Ok(i) => {
                            *ino = i;
                            true
                        }
                        Err(_) => false,
                    };
                    handles.retain_mut(|(ino, _)| keep(ino));
                    held.retain_mut(|(ino, _)| keep(ino));
                }
                view.restore_open_handles(&handles);
                // the locks it holds, taken again (its daemon's may be gone: a rejoin, a
                // bootstrap, a power loss); one another holds now is lost
                let mut lost = vec![];
                for (ino, lock) in &held {
                    match view.reclaim_lock(*ino, lock) {
                        Ok(()) => {}
                        Err(Error::Sys(libc::EAGAIN)) => lost.push((*ino, lock.clone())),
                        Err(e) => return Err(e),
                    }
                }
                Ok((sid, view, listed, lost))
            })
            .instrument(span)
            .await?;
        self.heard.note(sid, Instant::now());
        {
            let mut s = self.sessions.write();
            s.insert(sid, (view, owner));
            self.metrics.sessions.set(s.len() as i64);
        }
        if let Some(slot) = slot {
            // a session taken up again under a new slot gives its old one back
            self.slot_of.lock().insert(sid, slot);
        }
        if resumed {
            tracing::info!("session {sid} resumed by {peer}");
        } else {
            tracing::info!("session {sid} opened by {peer}");
        }
        if !r.locks.is_empty() {
            tracing::info!(
                "session {sid} took back {} of the {} locks it held{}",
                r.locks.len() - lost.len(),
                r.locks.len(),
                if lost.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; {} are held by another now, and lost: {lost:?}",
                        lost.len()
                    )
                }
            );
        }
        let mut format: w::Format = self.engine.settings().into();
        if let Some((url, _)) = &self.blocks {
            format.data_url = url.clone();
        }
        Ok(Response::new(w::OpenSessionReply {
            session: sid,
            format: Some(format),
            read_only: self.engine.is_read_only() && !self.engine.writes_elsewhere(),
            session_timeout_ms: self.session_timeout_ms,
            resumed,
            block_fallback: self.blocks.is_some(),
            lost_locks: lost
                .iter()
                .map(|(ino, l)| strait_proto::held_lock_to_wire(*ino, l))
                .collect(),
        }))
    }

    async fn heartbeat(&self, req: Request<w::HeartbeatRequest>) -> Reply<w::Empty> {
        let heard = self.heard.clone();
        rpc!(self, req, "heartbeat", |m, _r| {
            m.heartbeat()?;
            heard.note(m.session_id(), Instant::now());
            Ok(w::Empty {})
        })
    }

    async fn close_session(&self, req: Request<w::Empty>) -> Reply<w::Empty> {
        let out: Reply<w::Empty> = mutation!(@unrecorded self, req, "close_session", |m, _r| {
            let sid = m.session_id();
            Ok(m.close_session_versioned(sid)?.map(|()| w::Empty {}))
        });
        if out.is_ok() {
            // the engine forgot the session; forget its view too
            let sids: Vec<u64> = {
                let listed: HashSet<u64> = self
                    .engine
                    .sessions()
                    .map(|v| v.into_iter().map(|s| s.0).collect())
                    .unwrap_or_default();
                self.sessions
                    .read()
                    .keys()
                    .copied()
                    .filter(|s| !listed.contains(s))
                    .collect()
            };
            self.drop_sessions(&sids);
        }
        out
    }

    async fn lookup(&self, req: Request<w::LookupRequest>) -> Reply<w::EntryReply> {
        let rules = self.rules_of_req(&req)?;
        rpc!(self, req, "lookup", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let ctx = sc.ctx(r.ctx)?;
            let parent = sc.ino(&m, r.parent)?;
            // the subtree's directory is its own parent
            let name: &[u8] = if sc.is_top(parent) && r.name == b".." {
                b"."
            } else {
                &r.name
            };
            Ok(entry_out(&sc, m.lookup(&ctx, parent, name)?))
        })
    }

    async fn get_attr(&self, req: Request<w::InodeRequest>) -> Reply<w::AttrReply> {
        let rules = self.rules_of_req(&req)?;
        rpc!(self, req, "getattr", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let ino = sc.ino(&m, r.ino)?;
            Ok(attr_reply(&sc.attr_out(ino, m.getattr(ino)?)))
        })
    }

    async fn access(&self, req: Request<w::AccessRequest>) -> Reply<w::Empty> {
        let rules = self.rules_of_req(&req)?;
        rpc!(self, req, "access", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            m.access(&sc.ctx(r.ctx)?, sc.ino(&m, r.ino)?, r.mask)?;
            Ok(w::Empty {})
        })
    }

    async fn read_link(&self, req: Request<w::InodeRequest>) -> Reply<w::ReadLinkReply> {
        let rules = self.rules_of_req(&req)?;
        rpc!(self, req, "readlink", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            Ok(w::ReadLinkReply {
                target: m.readlink(sc.ino(&m, r.ino)?)?,
            })
        })
    }

    async fn read_dir(&self, req: Request<w::InodeRequest>) -> Reply<w::ReadDirReply> {
        let rules = self.rules_of_req(&req)?;
        rpc!(self, req, "readdir", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let ino = sc.ino(&m, r.ino)?;
            let entries = m.readdir(&sc.ctx(r.ctx)?, ino)?;
            Ok(w::ReadDirReply {
                entries: entries
                    .iter()
                    .map(|e| {
                        let mut e: w::DirEntry = e.into();
                        e.ino = sc.out(e.ino);
                        e
                    })
                    .collect(),
            })
        })
    }

    async fn stat_fs(&self, req: Request<w::Empty>) -> Reply<w::StatFsReply> {
        rpc!(self, req, "statfs", |m, _r| Ok((&m.statfs()?).into()))
    }

    async fn set_attr(&self, req: Request<w::SetAttrRequest>) -> Reply<w::AttrReply> {
        let (rules, writers) = self.data_rules(&req)?;
        mutation!(self, req, "setattr", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let ino = sc.held_or_inside(&m, r.ino)?;
            let set = strait_proto::setattr_from_wire(&r).map_err(invalid)?;
            if set.size.is_some() && set.via_handle {
                // a truncate through a handle skips the write check: the handle must be one
                // opened for writing
                writers.check(m.session_id(), ino)?;
            }
            Ok(m.setattr_versioned(&sc.ctx(r.ctx)?, ino, &set)?
                .map(|a| attr_reply(&sc.attr_out(ino, a))))
        })
    }

    async fn mk_nod(&self, req: Request<w::MkNodRequest>) -> Reply<w::EntryReply> {
        let rules = self.rules_of_req(&req)?;
        mutation!(self, req, "mknod", |m, r| {
            make_entry(&m, &Scope::of(&m, &rules)?, NewEntry::Node, r)
        })
    }

    async fn mk_dir(&self, req: Request<w::MkNodRequest>) -> Reply<w::EntryReply> {
        let rules = self.rules_of_req(&req)?;
        mutation!(self, req, "mkdir", |m, r| {
            make_entry(&m, &Scope::of(&m, &rules)?, NewEntry::Dir, r)
        })
    }

    async fn create(&self, req: Request<w::MkNodRequest>) -> Reply<w::EntryReply> {
        let (rules, writers) = self.data_rules(&req)?;
        mutation!(self, req, "create", replay = replay_create, |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let made = make_entry(&m, &sc, NewEntry::File, r)?;
            // the handle a create opens is one for writing
            let ino = if made.value.ino == strait_fs_core::meta::ROOT_INO {
                sc.root()
            } else {
                made.value.ino
            };
            writers.note(m.session_id(), ino);
            Ok(made)
        })
    }

    async fn symlink(&self, req: Request<w::SymlinkRequest>) -> Reply<w::EntryReply> {
        let rules = self.rules_of_req(&req)?;
        mutation!(self, req, "symlink", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let parent = sc.ino(&m, r.parent)?;
            Ok(
                m.symlink_versioned(&sc.ctx(r.ctx)?, parent, &r.name, &r.target)?
                    .map(|e| entry_out(&sc, e)),
            )
        })
    }

    async fn link(&self, req: Request<w::LinkRequest>) -> Reply<w::AttrReply> {
        let rules = self.rules_of_req(&req)?;
        mutation!(self, req, "link", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let (ino, parent) = (sc.ino(&m, r.ino)?, sc.ino(&m, r.new_parent)?);
            Ok(m.link_versioned(&sc.ctx(r.ctx)?, ino, parent, &r.new_name)?
                .map(|a| attr_reply(&sc.attr_out(ino, a))))
        })
    }

    async fn unlink(&self, req: Request<w::NameRequest>) -> Reply<w::Empty> {
        let rules = self.rules_of_req(&req)?;
        mutation!(self, req, "unlink", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let parent = sc.ino(&m, r.parent)?;
            Ok(m.unlink_versioned(&sc.ctx(r.ctx)?, parent, &r.name)?
                .map(|()| w::Empty {}))
        })
    }

    async fn rm_dir(&self, req: Request<w::NameRequest>) -> Reply<w::Empty> {
        let rules = self.rules_of_req(&req)?;
        mutation!(self, req, "rmdir", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let parent = sc.ino(&m, r.parent)?;
            Ok(m.rmdir_versioned(&sc.ctx(r.ctx)?, parent, &r.name)?
                .map(|()| w::Empty {}))
        })
    }

    async fn rename(&self, req: Request<w::RenameRequest>) -> Reply<w::Empty> {
        let rules = self.rules_of_req(&req)?;
        mutation!(self, req, "rename", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE;
            if r.flags & !known != 0 {
                return Err(Error::Invalid(format!(
                    "unknown rename flags {:#x}",
                    r.flags
                )));
            }
            let (parent, new_parent) = (sc.ino(&m, r.parent)?, sc.ino(&m, r.new_parent)?);
            Ok(m.rename_versioned(
                &sc.ctx(r.ctx)?,
                parent,
                &r.name,
                new_parent,
                &r.new_name,
                r.flags,
            )?
            .map(|()| w::Empty {}))
        })
    }

    async fn open(&self, req: Request<w::OpenRequest>) -> Reply<w::AttrReply> {
        let source = self.blocks.as_ref().map(|(_, s)| s.clone());
        let (rules, writers) = self.data_rules(&req)?;
        rpc!(self, req, "open", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let ino = sc.ino(&m, r.ino)?;
            // chunk 0 in the same snapshot as the attributes (see Meta::open_inode_with_chunk0)
            let (a, chunk0) = m.open_inode_with_chunk0(&sc.ctx(r.ctx)?, ino, r.flags, r.chunk0)?;
            if opens_for_writing(r.flags) {
                writers.note(m.session_id(), ino);
            }
            let mut reply = attr_reply(&sc.attr_out(ino, a));
            if let Some(slices) = chunk0 {
                reply.chunk0 = Some(chunk_reply(source, &slices));
            }
            Ok(reply)
        })
    }

    async fn release(&self, req: Request<w::ReleaseRequest>) -> Reply<w::Empty> {
        let (rules, writers) = self.data_rules(&req)?;
        mutation!(@unrecorded self, req, "release", |m, r| {
            // a handle is given back wherever its file is now (it may have moved out of the
            // caller's subtree since it was opened): only the subtree's own number is mapped
            let sc = Scope::of(&m, &rules)?;
            if r.inos.len() > strait_proto::RELEASE_BATCH_MAX {
                return Err(Error::Invalid(format!(
                    "the request names {} handles; at most {} are allowed",
                    r.inos.len(),
                    strait_proto::RELEASE_BATCH_MAX
                )));
            }
            // every handle is released even when deleting one unlinked file fails
            let mut first_err = None;
            let mut version = None;
            for ino in r.inos {
                let ino = if ino == strait_fs_core::meta::ROOT_INO {
                    sc.root()
                } else {
                    ino
                };
                let released = m.release_versioned(ino);
                if writers.enforced() && m.holds(ino) == 0 {
                    writers.forget(m.session_id(), ino);
                }
                match released {
                    Ok(c) => version = version.max(c.version),
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            first_err.map_or(Ok(Committed::new(w::Empty {}, version)), Err)
        })
    }

    async fn read_chunk(&self, req: Request<w::ChunkRequest>) -> Reply<w::ReadChunkReply> {
        let source = self.blocks.as_ref().map(|(_, s)| s.clone());
        let (rules, handles) = self.data_rules(&req)?;
        rpc!(self, req, "read_chunk", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let ino = sc.held_or_inside(&m, r.ino)?;
            // a squashed caller reads a file's data through a handle it holds
            handles.check_read(&m, ino)?;
            Ok(chunk_reply(source, &m.read_chunk(ino, r.index)?))
        })
    }

    async fn write_slice(&self, req: Request<w::WriteSliceRequest>) -> Reply<w::AttrReply> {
        let ranges = self.slice_ranges.clone();
        let (rules, writers) = self.data_rules(&req)?;
        mutation!(self, req, "write_slice", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let ino = sc.held_or_inside(&m, r.ino)?;
            writers.check(m.session_id(), ino)?;
            let slice: SliceRef = r
                .slice
                .ok_or_else(|| Error::Invalid("the request names no slice".into()))?
                .try_into()
                .map_err(invalid)?;
            own_slices(&ranges, &m, [&slice])?;
            Ok(m.write_slice_versioned(ino, r.index, slice, r.mtime_ns)?
                .map(|a| attr_reply(&sc.attr_out(ino, a))))
        })
    }

    async fn compact_chunk(
        &self,
        req: Request<w::CompactChunkRequest>,
    ) -> Reply<w::CompactChunkReply> {
        let ranges = self.slice_ranges.clone();
        let (rules, writers) = self.data_rules(&req)?;
        mutation!(self, req, "compact_chunk", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let ino = sc.held_or_inside(&m, r.ino)?;
            writers.check(m.session_id(), ino)?;
            let old = strait_proto::slices_from_wire(r.old).map_err(invalid)?;
            let new = strait_proto::slices_from_wire(r.new).map_err(invalid)?;
            // the slices it kept as they were are the chunk's already (the engine checks the
            // list starts with `old`); the ones it wrote must be under this session's ids
            own_slices(&ranges, &m, written_by_compaction(&old, &new))?;
            Ok(m.compact_chunk_versioned(ino, r.index, &old, new)?
                .map(|done| w::CompactChunkReply { done }))
        })
    }

    async fn alloc_slice_ids(&self, req: Request<w::AllocRequest>) -> Reply<w::AllocReply> {
        // no ids from a counter a catch-up is about to raise, nor from a fenced primary
        let _in_flight = self.enter();
        self.check_fence("alloc_slice_ids").await?;
        let ranges = self.slice_ranges.clone();
        rpc!(self, req, "alloc_slice_ids", |m, r| {
            if r.count == 0 || r.count > ALLOC_SLICE_IDS_MAX {
                return Err(Error::Invalid(format!(
                    "asked for {} slice ids; ask for 1 to {ALLOC_SLICE_IDS_MAX}",
                    r.count
                )));
            }
            let first = m.alloc_slice_ids(r.count)?;
            // before the answer leaves: the session may use the ids as soon as it has them
            ranges.lock().grant(m.session_id(), first, r.count);
            Ok(w::AllocReply {
                first: first.0,
                count: r.count,
            })
        })
    }

    async fn get_xattr(&self, req: Request<w::XattrRequest>) -> Reply<w::XattrValueReply> {
        let rules = self.rules_of_req(&req)?;
        rpc!(self, req, "getxattr", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let ino = sc.ino(&m, r.ino)?;
            Ok(w::XattrValueReply {
                value: m.getxattr(&sc.ctx(r.ctx)?, ino, &r.name)?,
            })
        })
    }

    async fn list_xattr(&self, req: Request<w::InodeRequest>) -> Reply<w::ListXattrReply> {
        let rules = self.rules_of_req(&req)?;
        rpc!(self, req, "listxattr", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let ino = sc.ino(&m, r.ino)?;
            Ok(w::ListXattrReply {
                names: m.listxattr(&sc.ctx(r.ctx)?, ino)?,
            })
        })
    }

    async fn set_xattr(&self, req: Request<w::SetXattrRequest>) -> Reply<w::Empty> {
        let rules = self.rules_of_req(&req)?;
        mutation!(self, req, "setxattr", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let ino = sc.ino(&m, r.ino)?;
            let value = sc.xattr_value(&m, &r.name, &r.value)?;
            Ok(
                m.setxattr_versioned(&sc.ctx(r.ctx)?, ino, &r.name, &value, r.flags)?
                    .map(|()| w::Empty {}),
            )
        })
    }

    async fn remove_xattr(&self, req: Request<w::XattrRequest>) -> Reply<w::Empty> {
        let rules = self.rules_of_req(&req)?;
        mutation!(self, req, "removexattr", |m, r| {
            let sc = Scope::of(&m, &rules)?;
            let ino = sc.ino(&m, r.ino)?;
            Ok(m.removexattr_versioned(&sc.ctx(r.ctx)?, ino, &r.name)?
                .map(|()| w::Empty {}))
        })
    }

    async fn flock(&self, req: Request<w::FlockRequest>) -> Reply<w::Empty> {
        let rules = self.rules_of_req(&req)?;
        rpc!(self, req, "flock", |m, r| {
            let typ = strait_proto::lock_type_from_wire(r.typ).map_err(invalid)?;
            let ino = Scope::of(&m, &rules)?.held_or_inside(&m, r.ino)?;
            m.getattr(ino)?;
            m.flock(ino, r.owner, typ)?;
            Ok(w::Empty {})
        })
    }

    async fn get_lk(&self, req: Request<w::LockRequest>) -> Reply<w::GetLkReply> {
        let rules = self.rules_of_req(&req)?;
        rpc!(self, req, "getlk", |m, r| {
            let typ = strait_proto::lock_type_from_wire(r.typ).map_err(invalid)?;
            if r.start > r.end {
                return Err(Error::Sys(libc::EINVAL));
            }
            let ino = Scope::of(&m, &rules)?.held_or_inside(&m, r.ino)?;
            let conflict = m.getlk(ino, r.owner, typ, r.start, r.end)?;
            Ok(w::GetLkReply {
                conflict: conflict.as_ref().map(Into::into),
            })
        })
    }

    async fn set_lk(&self, req: Request<w::LockRequest>) -> Reply<w::Empty> {
        let rules = self.rules_of_req(&req)?;
        rpc!(self, req, "setlk", |m, r| {
            let typ = strait_proto::lock_type_from_wire(r.typ).map_err(invalid)?;
            let ino = Scope::of(&m, &rules)?.held_or_inside(&m, r.ino)?;
            if typ != strait_fs_core::meta::LockType::Unlock {
                // a lock on an inode that does not exist would never be cleaned up
                m.getattr(ino)?;
            }
            m.setlk(ino, r.owner, r.pid, typ, r.start, r.end)?;
            Ok(w::Empty {})
        })
    }

    async fn fetch_block(&self, req: Request<w::FetchBlockRequest>) -> Reply<w::FetchBlockReply> {
        let Some((_, source)) = &self.blocks else {
            return Err(Status::unimplemented(
                "FetchBlock is served by a mirror; this daemon's mounts read its object store directly",
            ));
        };
        let start = Instant::now();
        let r = source.fetch(req.into_inner()).await;
        self.metrics.observe(
            "fetch_block",
            if r.is_ok() { "ok" } else { "EIO" },
            start.elapsed(),
        );
        Ok(Response::new(w::FetchBlockReply { data: r? }))
    }

    async fn sync(&self, req: Request<w::Empty>) -> Reply<w::Empty> {
        rpc!(self, req, "sync", |m, _r| {
            m.kv().sync()?;
            Ok(w::Empty {})
        })
    }
}
