//! The sweep of request records: a worker that removes the records older than [`KEEP`] and,
//! past [`RECORDS_MAX`], the oldest ones, in batches of at most [`SWEEP_BATCH_MAX`].

use std::sync::Arc;
use std::time::Duration;

use strait_fs_core::clock::now_ns;
use strait_fs_core::meta::requests::{Swept, KEEP, RECORDS_MAX, SWEEP_BATCH_MAX};
use strait_fs_core::meta::Meta;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// How often the sweep runs.
pub const SWEEP_PERIOD: Duration = Duration::from_secs(10);
/// Most batches one pass removes; the rest waits for the next pass, so a backlog does not
/// hold the engine for long.
pub const SWEEP_BATCHES_PER_PASS_MAX: usize = 64;

/// Every [`SWEEP_PERIOD`], sweep the request records of `engine` until `stop` fires.
pub async fn sweep_request_records(
    engine: Arc<Meta>,
    stop: CancellationToken,
    metrics: Arc<Metrics>,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(SWEEP_PERIOD) => {}
        }
        for _ in 0..SWEEP_BATCHES_PER_PASS_MAX {
            if stop.is_cancelled() {
                return;
            }
            let e = engine.clone();
            let before_ns = now_ns().saturating_sub(KEEP.as_nanos() as i64);
            let swept = tokio::task::spawn_blocking(move || {
                e.sweep_requests(before_ns, RECORDS_MAX, SWEEP_BATCH_MAX)
            })
            .await;
            let swept: Swept = match swept {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::warn!("sweep the request records: {e}");
                    break;
                }
                Err(e) => {
                    tracing::warn!("sweep the request records: {e}");
                    break;
                }
            };
            metrics
                .request_records
                .set(i64::try_from(swept.left).unwrap_or(i64::MAX));
            metrics.request_records_expired.inc_by(swept.expired as u64);
            if swept.evicted > 0 {
                metrics.request_records_evicted.inc_by(swept.evicted as u64);
                tracing::warn!(
                    "removed {} request records younger than {KEEP:?}: more than {RECORDS_MAX} \
                     are kept; a retry whose record was among them is answered EIO",
                    swept.evicted
                );
            }
            if swept.removed() < SWEEP_BATCH_MAX {
                break;
            }
        }
    }
}
