//! [`RemoteMeta`], its options, and how it is made.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use strait_auth::Credentials;
use strait_fs_core::error::{Error, Result};
use strait_fs_core::meta::{Format, Ino};
use tonic::transport::Endpoint;

use crate::stamp::{Stamp, NEXT_CLIENT_ID};

#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// What the mount presents: a token (sent as `authorization: Bearer ...`), and TLS with
    /// the CA the daemon's certificate must chain to and a client certificate for daemons
    /// that require one.
    pub creds: Credentials,
    /// Open the session read-only: every mutation answers EROFS at the mount.
    pub read_only: bool,
    /// How long a call keeps trying to reach an unreachable daemon before failing with EIO.
    pub reconnect_timeout: Duration,
    /// Deadline of one call.
    pub rpc_timeout: Duration,
    /// Keep the names and attributes seen, coherent through the daemon's change stream, and
    /// answer lookups and stats from them (`meta_cache.rs`); false: every one asks the daemon.
    pub keep_names: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            creds: Credentials::default(),
            read_only: false,
            reconnect_timeout: Duration::from_secs(60),
            rpc_timeout: Duration::from_secs(30),
            keep_names: true,
        }
    }
}

/// [`MetaClient`] over a site daemon's gRPC service.
///
/// [`MetaClient`]: strait_fs_core::meta::MetaClient
pub struct RemoteMeta {
    /// Key of this client's connections in each thread's `CONNECTIONS`.
    pub(crate) id: u64,
    pub(crate) target: String,
    pub(crate) endpoint: Endpoint,
    pub(crate) stamp: Stamp,
    pub(crate) opts: ConnectOptions,
    pub(crate) session: Arc<AtomicU64>,
    pub(crate) info: Mutex<String>,
    pub(crate) format: OnceLock<Format>,
    pub(crate) read_only: AtomicU64,
    pub(crate) session_timeout_ms: AtomicU64,
    /// Handles this mount holds open per inode, as the daemon counts them (closes still
    /// queued for the releaser included): sent back when the session is resumed.
    pub(crate) open: Mutex<HashMap<Ino, u32>>,
    /// The locks this mount holds, as the daemon granted them: sent back when the session is
    /// resumed.
    pub(crate) locks: Mutex<crate::held_locks::HeldLocks>,
    /// The releaser's queue and thread, from the session's opening to its close.
    pub(crate) releaser: Mutex<Option<(SyncSender<Ino>, std::thread::JoinHandle<()>)>>,
    pub(crate) me: Weak<RemoteMeta>,
    /// Slice ids taken from the daemon and not used yet: `[next, end)`.
    pub(crate) slice_ids: Mutex<(u64, u64)>,
    /// The daemon is a mirror that serves FetchBlock, as its last OpenSession answer said
    /// (the session is resumed when the daemon is replaced, by one in another role too).
    pub(crate) block_fallback: Arc<std::sync::atomic::AtomicBool>,
    /// This client's request ids are `{nonce}-{n}`: random per client, so no two mounts
    /// (or two runs of one) share an id.
    pub(crate) nonce: u64,
    /// The next request id's sequence number.
    pub(crate) requests: AtomicU64,
    /// The names and attributes this mount has seen, kept coherent by the daemon's change
    /// stream (`meta_cache.rs`), and the thread that follows it (`watcher.rs`).
    pub(crate) cache: Arc<crate::meta_cache::MetaCache>,
    pub(crate) watching: std::sync::atomic::AtomicBool,
    pub(crate) watch_stop: Arc<std::sync::atomic::AtomicBool>,
}

impl RemoteMeta {
    /// Prepare a connection to the daemon at `url` (`strait://host:port`). Nothing is sent
    /// until [`MetaClient::open_session`].
    ///
    /// [`MetaClient::open_session`]: strait_fs_core::meta::MetaClient::open_session
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
        let invalid = |e: strait_auth::Error| Error::Invalid(format!("{url}: {e}"));
        let ep = opts
            .creds
            .endpoint(hostport)
            .map_err(invalid)?
            .connect_timeout(Duration::from_secs(5))
            .timeout(opts.rpc_timeout)
            .tcp_nodelay(true)
            .tcp_keepalive(Some(Duration::from_secs(30)))
            .max_frame_size(strait_proto::HTTP2_FRAME_BYTES);
        let auth = match opts.creds.token_str() {
            Some(t) => Some(format!("Bearer {t}").parse().map_err(|_| {
                Error::Invalid("the token holds characters not allowed in a header".into())
            })?),
            None => None,
        };
        let session = Arc::new(AtomicU64::new(0));
        let stamp = Stamp {
            auth,
            session: session.clone(),
            request_id: None,
            retry: None,
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
            locks: Mutex::new(Default::default()),
            slice_ids: Mutex::new((0, 0)),
            block_fallback: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            nonce: rand::random(),
            requests: AtomicU64::new(1),
            cache: Default::default(),
            watching: Default::default(),
            watch_stop: Default::default(),
        }))
    }

    /// Whether lookups and stats are answered from the names and attributes kept now: the
    /// daemon's change stream is open and heard from (see `meta_cache.rs`).
    pub fn keeps_names(&self) -> bool {
        self.cache.ticket().is_some()
    }

    /// The session timeout the daemon announced (zero before the session opens).
    pub fn session_timeout(&self) -> Duration {
        Duration::from_millis(self.session_timeout_ms.load(Ordering::Relaxed))
    }
}
