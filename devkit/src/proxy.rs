//! A TCP fault proxy for tests. Put a [`Proxy`] between two processes (replicator nodes,
//! regions) and change, while connections are open, what the link does to their bytes:
//!
//! - **latency**: every chunk is delivered `latency` after it was read, in each direction
//!   (set both directions for a symmetric one-way delay, as between two regions);
//! - **bandwidth**: a byte rate per direction, shared by all connections through the proxy;
//! - **blackhole**: bytes going one way (or both) are read and dropped, so the connection
//!   stays open and silent, as in a network partition. A connection that lost bytes is reset
//!   (both ways) once its link heals, as TCP would have given up on it: TCP never delivers the
//!   bytes after a gap, and a stream with a hole in it, kept open, is a fault no real network
//!   makes (an HTTP/2 connection that lost flow-control frames stays alive, answers pings, and
//!   carries no data ever again). New connections work at once;
//! - **reset**: every open connection is closed with a TCP reset, once;
//! - **refuse**: new connections are closed with a reset as soon as they are accepted.
//!
//! We looked at `noxious` (a Rust port of Toxiproxy) first: it is built around a server
//! configured over HTTP, depends on old majors (tokio-util 0.6, rand 0.8), and has neither a
//! one-way blackhole nor a reset of open connections, which the partition tests need.
//!
//! Bytes in flight are bounded per connection and direction ([`WINDOW`] bytes, like a TCP
//! receive window), so a slow link pushes back on the sender as TCP would instead of buffering
//! without limit, and one connection can still fill a link with a long delay.
//!
//! The bandwidth is paced with a virtual clock (the instant the link is next free) rather than
//! a sleep per chunk: tokio's timer has a resolution of 1 ms, longer than a 64 KiB chunk takes
//! at 100 MB/s, so sleeping for each chunk's own duration would cap one connection well below
//! the rate. A link idle for a moment may send [`PACER_SLACK`] worth of bytes at once; over any
//! interval `T` the bytes delivered stay below `rate × (T + PACER_SLACK)` plus one chunk.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};

/// Largest chunk read at once.
const CHUNK: usize = 64 << 10;
/// Chunks in flight per connection and direction.
const QUEUE: usize = 1024;
/// Bytes in flight per connection and direction: enough for one connection to fill 100 MB/s
/// across a 15 ms one-way delay (1.5 MB in the air) with room to spare, like a Linux TCP
/// window after autotuning.
pub const WINDOW: usize = 4 << 20;
/// How far the pacer's clock may lag behind now: the burst a link idle for a moment may send.
pub const PACER_SLACK: Duration = Duration::from_millis(2);

/// Which way bytes travel: `Up` is client → upstream, `Down` is upstream → client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Up,
    Down,
}

/// What the link does to the bytes going one way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Link {
    /// Added delay from read to delivery.
    pub latency: Duration,
    /// Bytes per second; `None` is unlimited.
    pub bandwidth: Option<u64>,
    /// Drop every byte (a partition in this direction).
    pub blackhole: bool,
}

/// The faults of both directions, plus whether new connections are refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    pub up: Link,
    pub down: Link,
    /// Reset new connections as soon as they are accepted.
    pub refuse: bool,
}

impl Faults {
    /// The same latency both ways.
    pub fn delay(latency: Duration) -> Self {
        let l = Link {
            latency,
            ..Link::default()
        };
        Faults {
            up: l,
            down: l,
            refuse: false,
        }
    }

    fn link(&self, d: Direction) -> Link {
        match d {
            Direction::Up => self.up,
            Direction::Down => self.down,
        }
    }
}

/// Counters of a proxy.
#[derive(Debug, Default)]
pub struct Stats {
    pub accepted: AtomicU64,
    pub refused: AtomicU64,
    pub bytes_up: AtomicU64,
    pub bytes_down: AtomicU64,
    pub dropped_up: AtomicU64,
    pub dropped_down: AtomicU64,
    pub resets: AtomicU64,
}

/// A byte budget shared by every connection going one way: the next instant at which the
/// link is free.
struct Pacer {
    free_at: Mutex<Instant>,
}

impl Pacer {
    /// When `len` bytes sent now at `rate` bytes/s finish leaving.
    fn reserve(&self, len: usize, rate: u64) -> Instant {
        let cost = Duration::from_secs_f64(len as f64 / rate.max(1) as f64);
        let mut f = self.free_at.lock();
        let now = Instant::now();
        let start = (*f).max(now.checked_sub(PACER_SLACK).unwrap_or(now));
        *f = start + cost;
        *f
    }
}

struct Shared {
    faults: watch::Sender<Faults>,
    /// Bumped by [`Proxy::reset`]; each connection watches it.
    resets: watch::Sender<u64>,
    pacers: [Pacer; 2],
    stats: Stats,
    upstream: Mutex<SocketAddr>,
    /// Transparent: each connection goes where its client sent it before a NAT rule
    /// redirected it here (`SO_ORIGINAL_DST`), from a socket marked with this mark, which the
    /// rule lets pass ([`Proxy::start_transparent_blocking`]).
    transparent_mark: Option<u32>,
}

/// A running proxy: listens on [`Proxy::addr`], forwards to its upstream.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    /// The proxy's own runtime, when it was started outside one ([`Proxy::start_blocking`]).
    _rt: Option<tokio::runtime::Runtime>,
}

impl Proxy {
    /// Listen on `listen` (port 0 picks a free one) and forward to `upstream`, on the current
    /// tokio runtime.
    pub async fn start(listen: SocketAddr, upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(listen).await?;
        Ok(Self::serve(listener, upstream, None))
    }

    /// [`Proxy::start`] on a runtime of its own, for synchronous tests and tools.
    pub fn start_blocking(listen: SocketAddr, upstream: SocketAddr) -> std::io::Result<Proxy> {
        let rt = own_runtime("strait-lab")?;
        let listener = rt.block_on(TcpListener::bind(listen))?;
        let _guard = rt.enter();
        let mut p = Self::serve(listener, upstream, None);
        drop(_guard);
        p._rt = Some(rt);
        Ok(p)
    }

    /// A transparent proxy on a runtime of its own: it listens on `listen`, where a NAT rule
    /// (`redirect`) sends the connections it should carry, and connects each to the address
    /// its client asked for, from a socket marked `mark` (`SO_MARK`, which needs
    /// `CAP_NET_ADMIN`) that the rule must let pass. Its threads, and so its sockets, live in
    /// the network namespace of the calling thread.
    pub fn start_transparent_blocking(listen: SocketAddr, mark: u32) -> std::io::Result<Proxy> {
        let rt = own_runtime("strait-wan")?;
        let listener = rt.block_on(TcpListener::bind(listen))?;
        let _guard = rt.enter();
        // (`upstream` is unused by a transparent proxy: each connection names its own)
        let mut p = Self::serve(listener, listen, Some(mark));
        drop(_guard);
        p._rt = Some(rt);
        Ok(p)
    }

    fn serve(listener: TcpListener, upstream: SocketAddr, transparent_mark: Option<u32>) -> Proxy {
        let addr = listener.local_addr().unwrap_or(upstream);
        let now = Instant::now();
        let shared = Arc::new(Shared {
            faults: watch::channel(Faults::default()).0,
            resets: watch::channel(0).0,
            pacers: [
                Pacer {
                    free_at: Mutex::new(now),
                },
                Pacer {
                    free_at: Mutex::new(now),
                },
            ],
            stats: Stats::default(),
            upstream: Mutex::new(upstream),
            transparent_mark,
        });
        let (stop, stop_rx) = watch::channel(false);
        tokio::spawn(accept_loop(listener, shared.clone(), stop_rx));
        Proxy {
            addr,
            shared,
            stop,
            _rt: None,
        }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replace the faults; open connections follow from their next chunk on.
    pub fn set(&self, f: Faults) {
        self.shared.faults.send_replace(f);
    }

    /// Change the faults in place.
    pub fn update(&self, f: impl FnOnce(&mut Faults)) {
        self.shared.faults.send_modify(f);
    }

    pub fn faults(&self) -> Faults {
        *self.shared.faults.borrow()
    }

    /// No faults.
    pub fn heal(&self) {
        self.set(Faults::default());
    }

    /// Close every open connection with a TCP reset (new connections are not affected).
    pub fn reset(&self) {
        self.shared.resets.send_modify(|g| *g += 1);
    }

    /// Forward new connections to `upstream` from now on (a restarted node on a new port).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *self.shared.upstream.lock() = upstream;
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        self.reset();
        if let Some(rt) = self._rt.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// A one-thread runtime for a proxy started outside one.
fn own_runtime(name: &str) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .enable_all()
        .build()
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        let (client, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("chaos proxy: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        if shared.faults.borrow().refuse {
            shared.stats.refused.fetch_add(1, Ordering::Relaxed);
            let _ = client.set_zero_linger();
            drop(client);
            continue;
        }
        shared.stats.accepted.fetch_add(1, Ordering::Relaxed);
        let shared = shared.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(client, shared, stop).await {
                tracing::debug!("chaos proxy: connection from {peer}: {e}");
            }
        });
    }
}

async fn connection(
    client: TcpStream,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let upstream = match shared.transparent_mark {
        None => {
            let upstream_addr = *shared.upstream.lock();
            TcpStream::connect(upstream_addr).await?
        }
        Some(mark) => {
            let to = original_destination(&client)?;
            let socket = tokio::net::TcpSocket::new_v4()?;
            set_mark(&socket, mark)?;
            socket.connect(to.into()).await?
        }
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let mut resets = shared.resets.subscribe();
    resets.mark_unchanged();
    let (cr, cw) = client.into_split();
    let (ur, uw) = upstream.into_split();
    // set once a blackhole dropped bytes of this connection, either way
    let lost = Arc::new(AtomicBool::new(false));
    let up = pipe(
        cr,
        uw,
        Direction::Up,
        shared.clone(),
        lost.clone(),
        resets.clone(),
        stop.clone(),
    );
    let down = pipe(ur, cw, Direction::Down, shared.clone(), lost, resets, stop);
    let (a, b) = tokio::join!(up, down);
    a.and(b)
}

/// Where `client` was going before a NAT `redirect` rule sent it to this proxy.
fn original_destination(client: &TcpStream) -> std::io::Result<std::net::SocketAddrV4> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero sockaddr_in is valid
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `addr`
    let rc = unsafe {
        libc::getsockopt(
            client.as_raw_fd(),
            libc::SOL_IP,
            libc::SO_ORIGINAL_DST,
            (&mut addr as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(std::net::SocketAddrV4::new(
        u32::from_be(addr.sin_addr.s_addr).into(),
        u16::from_be(addr.sin_port),
    ))
}

/// Mark `socket`'s packets with `mark` (`SO_MARK`).
fn set_mark(socket: &tokio::net::TcpSocket, mark: u32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: setsockopt reads `size_of::<u32>()` bytes from `mark`
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MARK,
            (&mark as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Why a pipe ended early.
fn reset_error() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "reset by the chaos proxy",
    )
}

/// Forward one direction: a reader queues chunks stamped with their delivery time, a writer
/// delivers them when due, paced by the direction's bandwidth. A reset closes the socket this
/// direction writes to with a TCP reset (the other direction's pipe resets the other socket).
/// `lost` (shared by both directions) is set when a blackhole drops bytes: the connection is
/// reset when no blackhole is left on it.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    d: Direction,
    shared: Arc<Shared>,
    lost: Arc<AtomicBool>,
    mut resets: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let mut faults = shared.faults.subscribe();
    let healed = |f: &Faults| !f.up.blackhole && !f.down.blackhole;
    let (tx, mut rx) = mpsc::channel::<(Instant, Bytes)>(QUEUE);
    let window = Arc::new(Semaphore::new(WINDOW));
    let reader_window = window.clone();
    let reader_shared = shared.clone();
    let reader_lost = lost.clone();
    let reader = async move {
        // chunks are cut from a shared buffer, not copied out of one
        let mut buf = BytesMut::new();
        loop {
            // read no more than the window has room for; the part read stays taken until the
            // writer delivered it, the rest goes back when `room` drops
            let mut room = match reader_window.acquire_many(CHUNK as u32).await {
                Ok(p) => p,
                Err(_) => return Ok(()),
            };
            buf.reserve(CHUNK);
            let n = from.read_buf(&mut (&mut buf).limit(CHUNK)).await?;
            if n == 0 {
                return Ok::<(), std::io::Error>(());
            }
            let chunk = buf.split().freeze();
            let link = reader_shared.faults.borrow().link(d);
            let s = &reader_shared.stats;
            if link.blackhole {
                match d {
                    Direction::Up => s.dropped_up.fetch_add(n as u64, Ordering::Relaxed),
                    Direction::Down => s.dropped_down.fetch_add(n as u64, Ordering::Relaxed),
                };
                reader_lost.store(true, Ordering::Relaxed);
                continue;
            }
            let due = Instant::now() + link.latency;
            if let Some(taken) = room.split(n) {
                taken.forget();
            }
            if tx.send((due, chunk)).await.is_err() {
                return Ok(());
            }
        }
    };
    let writer_shared = shared.clone();
    let writer = async {
        while let Some((due, chunk)) = rx.recv().await {
            if due > Instant::now() {
                tokio::time::sleep_until(due.into()).await;
            }
            let link = writer_shared.faults.borrow().link(d);
            if link.blackhole {
                // partitioned while the chunk was in flight: it is lost
                window.add_permits(chunk.len());
                lost.store(true, Ordering::Relaxed);
                continue;
            }
            if lost.load(Ordering::Relaxed) && healed(&writer_shared.faults.borrow()) {
                // the partition is over and this stream has a hole: TCP would have given up
                // on the connection (while one way is still cut, the other keeps flowing)
                return Err(reset_error());
            }
            if let Some(rate) = link.bandwidth {
                let done = writer_shared.pacers[d as usize].reserve(chunk.len(), rate);
                if done > Instant::now() {
                    tokio::time::sleep_until(done.into()).await;
                }
            }
            to.write_all(&chunk).await?;
            window.add_permits(chunk.len());
            let s = &writer_shared.stats;
            match d {
                Direction::Up => s.bytes_up.fetch_add(chunk.len() as u64, Ordering::Relaxed),
                Direction::Down => s
                    .bytes_down
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed),
            };
        }
        // the reader saw the end of the stream: pass it on
        to.shutdown().await
    };
    let res = {
        tokio::pin!(reader);
        tokio::pin!(writer);
        let mut reading = true;
        loop {
            tokio::select! {
                r = &mut reader, if reading => {
                    reading = false;
                    // an error reading ends this direction; the end of the stream lets the
                    // writer deliver what is queued, then shut down
                    if let Err(e) = r {
                        break Err(e);
                    }
                }
                w = &mut writer => break w,
                _ = resets.changed() => break Err(reset_error()),
                r = faults.changed() => {
                    if r.is_ok() && lost.load(Ordering::Relaxed) && healed(&faults.borrow_and_update()) {
                        break Err(reset_error());
                    }
                }
                _ = stop.changed() => break Err(reset_error()),
            }
        }
    };
    if matches!(&res, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset) {
        // closing a socket whose linger time is zero sends a reset instead of a FIN; the
        // write half must not send its FIN on drop either
        if let Err(e) = to.as_ref().set_zero_linger() {
            tracing::debug!("chaos proxy: set SO_LINGER: {e}");
        }
        to.forget();
        shared.stats.resets.fetch_add(1, Ordering::Relaxed);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A loopback echo server.
    async fn echo() -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream, msg: &[u8]) {
        s.write_all(msg).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back))
            .await
            .expect("an answer within 5 s")
            .unwrap();
        assert_eq!(back, msg);
    }

    fn partition(p: &Proxy, on: bool) {
        p.update(|f| {
            f.up.blackhole = on;
            f.down.blackhole = on;
        });
    }

    #[tokio::test]
    async fn a_connection_with_a_hole_is_reset_when_the_link_heals_and_others_go_on() {
        let p = Proxy::start("127.0.0.1:0".parse().unwrap(), echo().await)
            .await
            .unwrap();
        let mut intact = TcpStream::connect(p.addr()).await.unwrap();
        let mut holed = TcpStream::connect(p.addr()).await.unwrap();
        roundtrip(&mut intact, b"one").await;
        roundtrip(&mut holed, b"two").await;

        // only `holed` sends during the partition: its bytes are dropped
        partition(&p, true);
        holed.write_all(b"lost").await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        partition(&p, false);

        // the connection that lost nothing goes on; the one with a hole is reset, never
        // carrying bytes from after the hole
        roundtrip(&mut intact, b"three").await;
        let _ = holed.write_all(b"after").await;
        let mut buf = [0u8; 16];
        let r = tokio::time::timeout(Duration::from_secs(5), holed.read(&mut buf))
            .await
            .expect("the holed connection ends within 5 s");
        assert!(matches!(r, Err(_) | Ok(0)), "read {r:?}: {:?}", &buf[..4]);
        // and a new connection works at once
        let mut fresh = TcpStream::connect(p.addr()).await.unwrap();
        roundtrip(&mut fresh, b"four").await;
    }
}
