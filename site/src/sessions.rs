//! Closing the sessions of mounts that went silent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::service::MetaServer;

/// Every quarter of `timeout` (at least every 100 ms), close the sessions whose last heartbeat
/// is older than `timeout`: their locks are released and the unlinked files they kept open
/// are deleted. Runs until `stop` fires.
pub async fn expire_sessions(
    server: Arc<MetaServer>,
    timeout: Duration,
    stop: CancellationToken,
    metrics: Arc<Metrics>,
) {
    let started = Instant::now();
    let period = (timeout / 4).max(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        // after a restart, give every mount a whole timeout to come back before judging it
        if started.elapsed() < timeout {
            continue;
        }
        let engine = server.engine().clone();
        let t_ns = timeout.as_nanos() as i64;
        match tokio::task::spawn_blocking(move || engine.clean_stale_sessions(t_ns)).await {
            Ok(Ok(closed)) if !closed.is_empty() => {
                tracing::info!(
                    "closed sessions {closed:?}: no heartbeat for {timeout:?}; their locks are released"
                );
                metrics.sessions_expired.inc_by(closed.len() as u64);
                server.drop_sessions(&closed);
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!("expire sessions: {e}"),
            Err(e) => tracing::warn!("expire sessions: {e}"),
        }
    }
}
