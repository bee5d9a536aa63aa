//! A planned switchover at the primary that hands over (`Handover`, asked by `strait mirror
//! promote --planned`): every call is refused UNAVAILABLE for a while, which mounts send
//! again, so nothing commits here while a mirror takes over; it answers once every call that
//! passed the fence before the refusal has returned (counted: [`strait_server::InFlight`]) and
//! the replicator holds every version committed here. The same for `strait primary` and for
//! a promoted mirror (the way back after a switchover).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strait_fs_core::kv::DynKv;
use strait_fs_core::Version;
use strait_proto::site as s;
use strait_server::InFlight;
use tokio::sync::watch;
use tonic::Status;

use crate::ship::fence::EpochFence;
use crate::ship::shipper::Shipped;

/// How long `Handover` refuses calls and waits for the replicator, unless asked otherwise.
pub const DEFAULT_MS: u64 = 30_000;
/// The longest hold a `Handover` takes.
pub const HOLD_MS_MAX: u64 = 600_000;

/// A planned switchover at the old primary (`Handover`): until its deadline every call is
/// answered UNAVAILABLE, which mounts send again, so nothing commits here while a mirror
/// takes over; the mirror's mounts' calls then land at the new primary.
#[derive(Default)]
pub struct Handover {
    until: parking_lot::Mutex<Option<Instant>>,
    /// The calls past the fence (the metadata service counts them through
    /// [`strait_server::WriteFence::in_flight`]).
    pub in_flight: Arc<InFlight>,
}

impl Handover {
    /// Refuse calls for `hold`.
    pub fn start(&self, hold: Duration) {
        *self.until.lock() = Some(Instant::now() + hold);
        // stored before the calls in flight are counted (see `strait_server::in_flight`)
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether calls are refused now.
    pub fn active(&self) -> bool {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.until.lock().is_some_and(|u| Instant::now() < u)
    }
}

/// [`EpochFence`] with a [`Handover`] in front of it.
pub struct HandoverFence {
    pub inner: Arc<EpochFence>,
    pub handover: Arc<Handover>,
}

impl strait_server::WriteFence for HandoverFence {
    fn unsettled(&self) -> Pin<Box<dyn Future<Output = Option<String>> + Send + '_>> {
        if self.handover.active() {
            return Box::pin(async {
                Some(
                    "this primary is handing over to a mirror being promoted (a planned \
                     switchover)"
                        .to_string(),
                )
            });
        }
        self.inner.unsettled()
    }

    fn refused(&self) -> Pin<Box<dyn Future<Output = Option<String>> + Send + '_>> {
        self.inner.refused()
    }

    fn in_flight(&self) -> Option<Arc<InFlight>> {
        Some(self.handover.in_flight.clone())
    }

    fn reads_refused(&self) -> Option<String> {
        self.inner.reads_refused_now()
    }
}

/// Hand over (the site service's `Handover`): refuse every call for the hold asked, wait
/// until no call that passed the fence before is in flight and the replicator holds every
/// version of `kv`, and answer that version.
pub async fn hand_over(
    handover: &Handover,
    kv: &DynKv,
    shipped: &watch::Receiver<Shipped>,
    req: s::HandoverRequest,
) -> Result<s::HandoverReply, Status> {
    if let Some(why) = &shipped.borrow().fenced {
        return Err(Status::failed_precondition(format!(
            "this primary is fenced already: {why}"
        )));
    }
    if req.hold_ms > HOLD_MS_MAX {
        return Err(Status::invalid_argument(format!(
            "hold_ms {}: at most {HOLD_MS_MAX}",
            req.hold_ms
        )));
    }
    let ms = |v: u64| Duration::from_millis(if v == 0 { DEFAULT_MS } else { v });
    let (hold, timeout) = (ms(req.hold_ms), ms(req.timeout_ms));
    let started = Instant::now();
    handover.start(hold);
    tracing::warn!("handing over: every call is refused (UNAVAILABLE) for {hold:?}");
    let last = || {
        let kv = kv.clone();
        async move {
            tokio::task::spawn_blocking(move || kv.last_version())
                .await
                .map_err(|e| Status::internal(format!("read the version: {e}")))?
                .map_err(strait_server::snapshot::engine_status)
        }
    };
    // every call that passed the fence before the refusal has committed, or never will
    let left = handover
        .in_flight
        .drained(timeout.saturating_sub(started.elapsed()))
        .await;
    if left > 0 {
        return Err(Status::unavailable(format!(
            "{left} calls that began before the hand-over are still running after {:?}; \
             calls are refused for the hold asked all the same",
            started.elapsed()
        )));
    }
    // the replicator holds the version read then (and any a background task committed since:
    // the last close of an unlinked file, a GC pass)
    let mut at: Version = last().await?;
    loop {
        let mut rx = shipped.clone();
        let left = timeout.saturating_sub(started.elapsed());
        crate::ship::fence::wait_committed(&mut rx, at, left)
            .await
            .map_err(|why| {
                Status::unavailable(format!(
                    "the replicator does not hold every version of this primary: {why}"
                ))
            })?;
        let now = last().await?;
        if now == at {
            break;
        }
        at = now;
    }
    let drained_ms = started.elapsed().as_millis() as u64;
    tracing::warn!(
        "handed over at version {at} ({drained_ms} ms): a mirror may be promoted now; calls \
         are refused for {hold:?} more, or until this primary is fenced"
    );
    Ok(s::HandoverReply {
        last_version: at.0,
        drained_ms,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use strait_fs_core::kv::{DynKv, KvEngine, KvTxn};
    use strait_fs_core::meta::Meta;
    use strait_proto::meta as w;
    use strait_proto::meta::meta_service_server::MetaService;
    use strait_server::MetaServer;

    use super::*;

    /// A memory engine whose next transaction, once armed, waits a while before it runs: a
    /// change that passed the fence and commits late.
    struct SlowKv {
        inner: DynKv,
        armed: AtomicBool,
    }

    const LATE: Duration = Duration::from_millis(400);

    impl KvEngine for SlowKv {
        fn name(&self) -> &'static str {
            "slow"
        }
        fn txn(
            &self,
            f: &mut dyn FnMut(&mut dyn KvTxn) -> strait_fs_core::Result<()>,
        ) -> strait_fs_core::Result<Option<Version>> {
            if self.armed.swap(false, Ordering::SeqCst) {
                std::thread::sleep(LATE);
            }
            self.inner.txn(f)
        }
        fn read(
            &self,
            f: &mut dyn FnMut(&mut dyn KvTxn) -> strait_fs_core::Result<()>,
        ) -> strait_fs_core::Result<()> {
            self.inner.read(f)
        }
        fn incr(&self, key: &[u8], delta: i64) -> strait_fs_core::Result<i64> {
            self.inner.incr(key, delta)
        }
        fn sync(&self) -> strait_fs_core::Result<()> {
            self.inner.sync()
        }
        fn last_version(&self) -> strait_fs_core::Result<Version> {
            self.inner.last_version()
        }
        fn wipe(&self) -> strait_fs_core::Result<()> {
            self.inner.wipe()
        }
    }

    fn with_session<T>(msg: T, sid: u64) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.metadata_mut().insert(
            strait_proto::SESSION_HEADER,
            sid.to_string().parse().unwrap(),
        );
        r
    }

    /// Issue 40, finding 6: a change that passed the fence just before a hand-over began, and
    /// commits after a moment longer than the old 100 ms quiet period, is in the version the
    /// hand-over answers (before the fix the answer came first, and the change, acknowledged,
    /// was lost with the old primary's history once the mirror took over).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hand_over_answers_after_every_change_that_passed_the_fence() {
        let (mem, _) = strait_fs_core::meta::conformance::fresh(&|| {
            Arc::new(strait_fs_core::kv::memory::MemoryKv::new()) as DynKv
        });
        let slow = Arc::new(SlowKv {
            inner: mem,
            armed: AtomicBool::new(false),
        });
        let kv: DynKv = slow.clone();
        let engine = Meta::open(kv.clone(), Default::default()).unwrap();
        // a replicator that holds every version at once
        let (_tx, shipped) = watch::channel(Shipped {
            version: Version(u64::MAX),
            checked: true,
            ..Default::default()
        });
        let handover = Arc::new(Handover::default());
        let fence = Arc::new(EpochFence {
            shipped: shipped.clone(),
            started: Instant::now(),
            strict: false,
            lease: None,
            fenced_reads: Duration::from_secs(5),
        });
        let server = Arc::new(
            MetaServer::new(engine, 60_000, strait_server::Metrics::new()).fenced_by(Arc::new(
                HandoverFence {
                    inner: fence,
                    handover: handover.clone(),
                },
            )),
        );
        let sid = server
            .open_session(tonic::Request::new(w::OpenSessionRequest::default()))
            .await
            .unwrap()
            .into_inner()
            .session;

        // a mkdir passes the fence, then its commit takes a while
        slow.armed.store(true, Ordering::SeqCst);
        let s2 = server.clone();
        let late = tokio::spawn(async move {
            let r = s2
                .mk_dir(with_session(
                    w::MkNodRequest {
                        ctx: Some(w::Ctx::default()),
                        parent: 1,
                        name: b"late".to_vec(),
                        mode: 0o755,
                        umask: 0,
                        rdev: 0,
                    },
                    sid,
                ))
                .await
                .unwrap();
            r.metadata()
                .get(strait_proto::VERSION_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap()
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let answered = hand_over(
            &handover,
            &kv,
            &shipped,
            s::HandoverRequest {
                hold_ms: 5_000,
                timeout_ms: 5_000,
            },
        )
        .await
        .unwrap();
        let committed = late.await.unwrap();
        assert!(
            answered.last_version >= committed,
            "the hand-over answered version {} before the mkdir that passed the fence \
             committed as version {committed}",
            answered.last_version
        );
        // and a call after the hand-over began is refused (UNAVAILABLE), not run
        let refused = server
            .mk_dir(with_session(
                w::MkNodRequest {
                    ctx: Some(w::Ctx::default()),
                    parent: 1,
                    name: b"after".to_vec(),
                    mode: 0o755,
                    umask: 0,
                    rdev: 0,
                },
                sid,
            ))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    }
}
