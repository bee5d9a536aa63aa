//! A planned switchover at the primary that hands over (`Handover`, asked by `strait mirror
//! promote --planned`): every call is refused UNAVAILABLE for a while, which mounts send
//! again, so nothing commits here while a mirror takes over; it answers once the replicator
//! holds every version committed here and the version has stopped moving. The same for
//! `strait primary` and for a promoted mirror (the way back after a switchover).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strait_fs_core::kv::DynKv;
use strait_fs_core::Version;
use strait_proto::site as s;
use tokio::sync::watch;
use tonic::Status;

use crate::fence::EpochFence;
use crate::shipper::Shipped;

/// How long `Handover` refuses calls and waits for the replicator, unless asked otherwise.
pub const DEFAULT_MS: u64 = 30_000;
/// The longest hold a `Handover` takes.
pub const HOLD_MS_MAX: u64 = 600_000;
/// The version must stay the same this long before a handover answers: calls that passed
/// the fence before the handover began commit first.
const QUIET: Duration = Duration::from_millis(100);

/// A planned switchover at the old primary (`Handover`): until its deadline every call is
/// answered UNAVAILABLE, which mounts send again, so nothing commits here while a mirror
/// takes over; the mirror's mounts' calls then land at the new primary.
#[derive(Default)]
pub struct Handover {
    until: parking_lot::Mutex<Option<Instant>>,
}

impl Handover {
    /// Refuse calls for `hold`.
    pub fn start(&self, hold: Duration) {
        *self.until.lock() = Some(Instant::now() + hold);
    }

    /// Whether calls are refused now.
    pub fn active(&self) -> bool {
        self.until.lock().is_some_and(|u| Instant::now() < u)
    }
}

/// [`EpochFence`] with a [`Handover`] in front of it.
pub struct HandoverFence {
    pub inner: Arc<EpochFence>,
    pub handover: Arc<Handover>,
}

impl strait_site::WriteFence for HandoverFence {
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
}

/// Hand over (the site service's `Handover`): refuse every call for the hold asked, wait
/// until the replicator holds every version of `kv` and the version has stayed put for a
/// moment, and answer that version.
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
                .map_err(strait_site::snapshot::engine_status)
        }
    };
    // until the version stops moving, and the replicator holds it
    let mut at: Version = last().await?;
    loop {
        let mut rx = shipped.clone();
        let left = timeout.saturating_sub(started.elapsed());
        crate::fence::wait_committed(&mut rx, at, left)
            .await
            .map_err(|why| {
                Status::unavailable(format!(
                    "the replicator does not hold every version of this primary: {why}"
                ))
            })?;
        tokio::time::sleep(QUIET).await;
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
