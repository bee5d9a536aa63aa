//! An HTTP fault proxy in front of an S3 server (a region's Garage): every client of the
//! object store (the daemons, the mounts, the mirror's copier) talks to it, and while a fault
//! is on it spoils a share of the requests the way an object store or the network in front of
//! it does:
//!
//! - [`S3Mode::SlowDown`]: answered at once with `503 SlowDown` and S3's XML error body; the
//!   request never reaches the server;
//! - [`S3Mode::Reset`]: the client's connection is reset (TCP RST), half the time before the
//!   request reaches the server and half the time after (the request took effect, its answer
//!   is lost);
//! - [`S3Mode::Slow`]: the answer is held back for 1–5 s;
//! - [`S3Mode::Truncate`]: the body of a successful `GET` is cut short, half the time
//!   mid-stream (the connection closes before the `Content-Length` the headers announced, as
//!   when a connection breaks), half the time with a `Content-Length` that matches the short
//!   body and no `x-amz-checksum-*` header, so that nothing in HTTP or the SDK can tell: only
//!   the block's own CRC can, and a short block must never reach a reader.
//!
//! HTTP/1.1 only (what strait's S3 client speaks to an `http://` endpoint). Each client
//! connection has one connection to the server, opened again when the server closed it, so
//! with no fault on the proxy changes nothing but the path. Requests are forwarded with their
//! headers untouched: the `Host` a request was signed with is the proxy's, and the server
//! checks the signature against the `Host` it receives.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = BoxBody<Bytes, BoxError>;

/// Shortest and longest hold of a [`S3Mode::Slow`] answer.
const SLOW_MS_MIN: u64 = 1_000;
const SLOW_MS_MAX: u64 = 5_000;
/// Largest body a [`S3Mode::Truncate`] fault reads whole before cutting it (a block is at
/// most 4 MiB); a longer one is passed on untouched.
const TRUNCATE_BODY_MAX_BYTES: u64 = 64 << 20;

/// How a faulty request is spoilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum S3Mode {
    SlowDown,
    Reset,
    Slow,
    Truncate,
}

impl S3Mode {
    pub const ALL: [S3Mode; 4] = [
        S3Mode::SlowDown,
        S3Mode::Reset,
        S3Mode::Slow,
        S3Mode::Truncate,
    ];
}

/// What the proxy does now: `percent` of the requests are spoilt by `mode` (none: every
/// request passes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct S3Faults {
    pub mode: Option<S3Mode>,
    pub percent: u32,
}

/// Counters of a proxy.
#[derive(Debug, Default)]
pub struct S3Stats {
    pub requests: AtomicU64,
    pub slowed_down: AtomicU64,
    pub reset_before: AtomicU64,
    pub reset_after: AtomicU64,
    pub delayed: AtomicU64,
    /// Bodies cut mid-stream (the connection closed early).
    pub cut: AtomicU64,
    /// Bodies cut short with a matching length.
    pub short: AtomicU64,
}

impl std::fmt::Display for S3Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        write!(
            f,
            "{} requests: {} answered 503 SlowDown, {} reset before and {} after reaching the server, {} delayed, {} bodies cut mid-stream, {} cut short with a matching length",
            g(&self.requests),
            g(&self.slowed_down),
            g(&self.reset_before),
            g(&self.reset_after),
            g(&self.delayed),
            g(&self.cut),
            g(&self.short)
        )
    }
}

/// A running proxy; its listener stops when it is dropped.
pub struct S3Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

struct Shared {
    upstream: SocketAddr,
    faults: Mutex<S3Faults>,
    stats: S3Stats,
    /// Which requests a fault spoils and how: drawn from the run's seed, in the order the
    /// requests arrive.
    rng: Mutex<StdRng>,
}

impl Drop for S3Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl S3Proxy {
    /// Listen on `listen` (port 0: any) and forward to the S3 server at `upstream`; `seed`
    /// decides which requests a fault spoils and how.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr, seed: u64) -> Result<S3Proxy> {
        let l = TcpListener::bind(listen)
            .await
            .with_context(|| format!("listen on {listen} for the S3 fault proxy"))?;
        let addr = l.local_addr().context("the S3 fault proxy's address")?;
        let shared = Arc::new(Shared {
            upstream,
            faults: Mutex::new(S3Faults::default()),
            stats: S3Stats::default(),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        });
        let s = shared.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = l.accept().await else {
                    // out of file descriptors, say: let the clients retry
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                tokio::spawn(serve(conn, s.clone()));
            }
        });
        Ok(S3Proxy {
            addr,
            shared,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set(&self, f: S3Faults) {
        *self.shared.faults.lock() = f;
    }

    pub fn faults(&self) -> S3Faults {
        *self.shared.faults.lock()
    }

    pub fn stats(&self) -> &S3Stats {
        &self.shared.stats
    }
}

type Upstream = hyper::client::conn::http1::SendRequest<Incoming>;

/// Serve one client connection until it closes.
async fn serve(conn: TcpStream, shared: Arc<Shared>) {
    let _ = conn.set_nodelay(true);
    // kept to reset the connection from inside the service, which does not own the socket;
    // the descriptor stays valid as long as the connection is served
    let fd = conn.as_raw_fd();
    let upstream: Arc<tokio::sync::Mutex<Option<Upstream>>> = Default::default();
    let service = hyper::service::service_fn(move |req| {
        let (shared, upstream) = (shared.clone(), upstream.clone());
        handle(req, fd, shared, upstream)
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(conn), service)
        .await;
}

/// Why a connection was closed on purpose (hyper closes a connection whose service fails).
#[derive(Debug)]
struct Closed(&'static str);

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Closed {}

/// Make the coming close of the connection a TCP reset.
fn reset_on_close(fd: i32) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: fd is the served connection's socket (open while its service runs); the
    // option value is a valid linger of the given size
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &l as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

async fn handle(
    req: Request<Incoming>,
    fd: i32,
    shared: Arc<Shared>,
    upstream: Arc<tokio::sync::Mutex<Option<Upstream>>>,
) -> Result<Response<Body>, BoxError> {
    let stats = &shared.stats;
    stats.requests.fetch_add(1, Ordering::Relaxed);
    let faults = *shared.faults.lock();
    let (mode, early, slow_ms, cut) = {
        let mut rng = shared.rng.lock();
        let hit = faults.mode.is_some() && rng.random_range(0..100) < faults.percent;
        (
            faults.mode.filter(|_| hit),
            rng.random_bool(0.5),
            rng.random_range(SLOW_MS_MIN..=SLOW_MS_MAX),
            rng.random::<f64>(),
        )
    };
    match mode {
        Some(S3Mode::SlowDown) => {
            stats.slowed_down.fetch_add(1, Ordering::Relaxed);
            return Ok(slow_down(req.uri().path()));
        }
        Some(S3Mode::Reset) if early => {
            stats.reset_before.fetch_add(1, Ordering::Relaxed);
            reset_on_close(fd);
            return Err(Box::new(Closed("reset before forwarding")));
        }
        _ => {}
    }
    let is_get = req.method() == hyper::Method::GET;
    let resp = forward(req, shared.upstream, &upstream).await?;
    match mode {
        Some(S3Mode::Reset) => {
            stats.reset_after.fetch_add(1, Ordering::Relaxed);
            reset_on_close(fd);
            Err(Box::new(Closed("reset after forwarding")))
        }
        Some(S3Mode::Slow) => {
            stats.delayed.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(slow_ms)).await;
            Ok(resp.map(|b| b.map_err(|e| Box::new(e) as BoxError).boxed()))
        }
        Some(S3Mode::Truncate) if is_get && resp.status() == StatusCode::OK => {
            truncate(resp, early, cut, stats).await
        }
        _ => Ok(resp.map(|b| b.map_err(|e| Box::new(e) as BoxError).boxed())),
    }
}

/// Send `req` on this client connection's server connection, opening one if there is none or
/// the server closed it.
async fn forward(
    req: Request<Incoming>,
    to: SocketAddr,
    upstream: &tokio::sync::Mutex<Option<Upstream>>,
) -> Result<Response<Incoming>, BoxError> {
    let mut slot = upstream.lock().await;
    let usable = match slot.as_mut() {
        Some(s) if !s.is_closed() => s.ready().await.is_ok(),
        _ => false,
    };
    if !usable {
        let conn = TcpStream::connect(to).await?;
        let _ = conn.set_nodelay(true);
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(conn)).await?;
        tokio::spawn(connection);
        *slot = Some(sender);
    }
    let Some(sender) = slot.as_mut() else {
        return Err(Box::new(Closed("no server connection")));
    };
    Ok(sender.send_request(req).await?)
}

fn slow_down(resource: &str) -> Response<Body> {
    let id = format!("chaos-{:016x}", rand::random::<u64>());
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message><Resource>{resource}</Resource><RequestId>{id}</RequestId></Error>"
    );
    let mut r = Response::new(Full::new(Bytes::from(xml)).map_err(|e| match e {}).boxed());
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/xml"),
    );
    if let Ok(v) = hyper::header::HeaderValue::from_str(&id) {
        h.insert("x-amz-request-id", v);
    }
    r
}

/// A `GET`'s body cut: mid-stream (`mid_stream`), or short with a matching length.
/// Cut a GET's body to a fraction `cut` (in [0, 1)) of its length.
async fn truncate(
    resp: Response<Incoming>,
    mid_stream: bool,
    cut: f64,
    stats: &S3Stats,
) -> Result<Response<Body>, BoxError> {
    use http_body::Body as _;
    let (mut parts, body) = resp.into_parts();
    if body
        .size_hint()
        .upper()
        .is_none_or(|n| n > TRUNCATE_BODY_MAX_BYTES)
    {
        return Ok(Response::from_parts(
            parts,
            body.map_err(|e| Box::new(e) as BoxError).boxed(),
        ));
    }
    let whole = body.collect().await?.to_bytes();
    if whole.is_empty() {
        return Ok(Response::from_parts(parts, full(whole)));
    }
    let keep = ((whole.len() as f64 * cut) as usize).min(whole.len() - 1);
    let head = whole.slice(..keep);
    if mid_stream {
        stats.cut.fetch_add(1, Ordering::Relaxed);
        // the headers still announce the whole length
        return Ok(Response::from_parts(
            parts,
            CutBody { head: Some(head) }.boxed(),
        ));
    }
    stats.short.fetch_add(1, Ordering::Relaxed);
    let checksums: Vec<_> = parts
        .headers
        .keys()
        .filter(|k| k.as_str().starts_with("x-amz-checksum-"))
        .cloned()
        .collect();
    for k in checksums {
        parts.headers.remove(k);
    }
    parts.headers.insert(
        hyper::header::CONTENT_LENGTH,
        hyper::header::HeaderValue::from(keep),
    );
    Ok(Response::from_parts(parts, full(head)))
}

fn full(b: Bytes) -> Body {
    Full::new(b).map_err(|e: Infallible| match e {}).boxed()
}

/// A body that yields its head, then fails: hyper closes the connection mid-body.
struct CutBody {
    head: Option<Bytes>,
}

impl http_body::Body for CutBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(Some(match self.head.take() {
            Some(h) if !h.is_empty() => Ok(Frame::data(h)),
            _ => Err(Box::new(Closed("body cut mid-stream"))),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for the S3 server: answers every request with `body` (200), and says how
    /// many requests reached it.
    async fn origin(body: &'static [u8]) -> (SocketAddr, Arc<AtomicU64>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let hits = Arc::new(AtomicU64::new(0));
        let h = hits.clone();
        tokio::spawn(async move {
            while let Ok((c, _)) = l.accept().await {
                let h = h.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let h = h.clone();
                        async move {
                            let _ = req.into_body().collect().await;
                            h.fetch_add(1, Ordering::Relaxed);
                            let mut r = Response::new(Full::new(Bytes::from_static(body)));
                            r.headers_mut().insert(
                                "x-amz-checksum-crc32",
                                hyper::header::HeaderValue::from_static("AAAAAA=="),
                            );
                            Ok::<_, Infallible>(r)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(c), svc)
                        .await;
                });
            }
        });
        (addr, hits)
    }

    /// A real hyper client: one request on a fresh connection; the status, the headers and
    /// the body, or the error.
    async fn get(
        at: SocketAddr,
        method: &str,
    ) -> Result<(StatusCode, hyper::HeaderMap, Bytes), BoxError> {
        let conn = TcpStream::connect(at).await?;
        let (mut s, c) = hyper::client::conn::http1::handshake(TokioIo::new(conn)).await?;
        tokio::spawn(c);
        let req = Request::builder()
            .method(method)
            .uri("/strait-test/chunks/0/0/1_0_64")
            .header("host", at.to_string())
            .body(Full::new(Bytes::new()))?;
        let resp = s.send_request(req).await?;
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await?.to_bytes();
        Ok((parts.status, parts.headers, bytes))
    }

    const BLOCK: &[u8] = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[tokio::test]
    async fn with_no_fault_every_request_passes_untouched() {
        let (up, hits) = origin(BLOCK).await;
        let p = S3Proxy::start("127.0.0.1:0".parse().unwrap(), up, 7)
            .await
            .unwrap();
        for _ in 0..20 {
            let (status, _, body) = get(p.addr(), "GET").await.unwrap();
            assert_eq!((status, &body[..]), (StatusCode::OK, BLOCK));
        }
        assert_eq!(hits.load(Ordering::Relaxed), 20);
        assert_eq!(p.stats().requests.load(Ordering::Relaxed), 20);
    }

    #[tokio::test]
    async fn slow_down_answers_503_with_an_s3_error_and_never_forwards() {
        let (up, hits) = origin(BLOCK).await;
        let p = S3Proxy::start("127.0.0.1:0".parse().unwrap(), up, 7)
            .await
            .unwrap();
        p.set(S3Faults {
            mode: Some(S3Mode::SlowDown),
            percent: 100,
        });
        let (status, headers, body) = get(p.addr(), "PUT").await.unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(headers["content-type"], "application/xml");
        let xml = String::from_utf8_lossy(&body);
        assert!(xml.contains("<Code>SlowDown</Code>"), "{xml}");
        assert_eq!(
            hits.load(Ordering::Relaxed),
            0,
            "a 503 must not reach the server"
        );
        // healed: through again
        p.set(S3Faults::default());
        assert_eq!(get(p.addr(), "GET").await.unwrap().0, StatusCode::OK);
    }

    #[tokio::test]
    async fn reset_breaks_the_connection_before_or_after_the_server_saw_the_request() {
        let (up, hits) = origin(BLOCK).await;
        let p = S3Proxy::start("127.0.0.1:0".parse().unwrap(), up, 7)
            .await
            .unwrap();
        p.set(S3Faults {
            mode: Some(S3Mode::Reset),
            percent: 100,
        });
        for _ in 0..20 {
            assert!(
                get(p.addr(), "PUT").await.is_err(),
                "no answer gets through"
            );
        }
        let s = p.stats();
        let (before, after) = (
            s.reset_before.load(Ordering::Relaxed),
            s.reset_after.load(Ordering::Relaxed),
        );
        assert_eq!(before + after, 20);
        // the ones reset after forwarding reached the server (both kinds show up in 20 tries
        // but with odds of 2 in a million)
        assert_eq!(hits.load(Ordering::Relaxed), after);
        assert!(before > 0 && after > 0, "{before} before, {after} after");
    }

    #[tokio::test]
    async fn truncate_cuts_a_get_mid_stream_or_short_with_a_matching_length() {
        let (up, _) = origin(BLOCK).await;
        let p = S3Proxy::start("127.0.0.1:0".parse().unwrap(), up, 7)
            .await
            .unwrap();
        p.set(S3Faults {
            mode: Some(S3Mode::Truncate),
            percent: 100,
        });
        let (mut errors, mut shorts) = (0, 0);
        for _ in 0..40 {
            match get(p.addr(), "GET").await {
                // cut mid-stream: the client sees the body end before its length
                Err(_) => errors += 1,
                // cut short: a well-formed answer with fewer bytes, no checksum to tell
                Ok((status, headers, body)) => {
                    assert_eq!(status, StatusCode::OK);
                    assert!(body.len() < BLOCK.len());
                    assert_eq!(&BLOCK[..body.len()], &body[..]);
                    assert_eq!(headers["content-length"], body.len().to_string().as_str());
                    assert!(!headers.contains_key("x-amz-checksum-crc32"));
                    shorts += 1;
                }
            }
        }
        let s = p.stats();
        assert_eq!(s.cut.load(Ordering::Relaxed), errors);
        assert_eq!(s.short.load(Ordering::Relaxed), shorts);
        assert!(errors > 0 && shorts > 0, "{errors} cut, {shorts} short");
        // a PUT is not truncated
        let (status, _, _) = get(p.addr(), "PUT").await.unwrap();
        assert_eq!(status, StatusCode::OK);
    }

    #[tokio::test]
    async fn slow_holds_the_answer_back_for_seconds() {
        let (up, _) = origin(BLOCK).await;
        let p = S3Proxy::start("127.0.0.1:0".parse().unwrap(), up, 7)
            .await
            .unwrap();
        p.set(S3Faults {
            mode: Some(S3Mode::Slow),
            percent: 100,
        });
        let t = std::time::Instant::now();
        let (status, _, body) = get(p.addr(), "GET").await.unwrap();
        assert_eq!((status, &body[..]), (StatusCode::OK, BLOCK));
        assert!(t.elapsed() >= Duration::from_millis(SLOW_MS_MIN));
    }
}
