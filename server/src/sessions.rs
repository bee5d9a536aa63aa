//! Closing the sessions of mounts that went silent.
//!
//! A session is judged by when this daemon last heard from it, on its monotonic clock
//! ([`crate::heard::Heard`]), not by the wall-clock heartbeat stamp the engine keeps: a step of the wall
//! clock (an NTP correction, a VM resumed, an operator's `date -s`) must not close every live
//! session, releasing its locks and deleting the unlinked files it holds open. The stamp is
//! still written, for mounts that share one Redis with no daemon (their clocks are the only
//! common one) and for `strait status`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::service::MetaServer;

/// At a site daemon's start: the mounts that held locks in `engine` before (a restart, a
/// rejoin that replaced the metadata) take them back before any new lock is granted
/// ([`strait_fs_core::meta::LOCK_GRACE`]).
pub async fn lock_grace_at_start(engine: &Arc<strait_fs_core::meta::Meta>) -> anyhow::Result<()> {
    let e = engine.clone();
    let began = tokio::task::spawn_blocking(move || e.lock_grace_at_start())
        .await
        .map_err(|e| anyhow::anyhow!("start the lock grace period: {e}"))?
        .map_err(|e| anyhow::anyhow!("start the lock grace period: {e}"))?;
    if began {
        tracing::info!(
            "no new lock for {:?}: the mounts that held locks take them back first",
            strait_fs_core::meta::LOCK_GRACE
        );
    }
    Ok(())
}

/// Every quarter of `timeout` (at least every 100 ms), close the sessions this daemon has not
/// heard from for more than `timeout`: their locks are released and the unlinked files they
/// kept open are deleted. Runs until `stop` fires.
pub async fn expire_sessions(
    server: Arc<MetaServer>,
    timeout: Duration,
    stop: CancellationToken,
    metrics: Arc<Metrics>,
) {
    let period = (timeout / 4).max(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        let engine = server.engine().clone();
        let heard = server.heard();
        let closed = tokio::task::spawn_blocking(move || {
            let own = engine.session_id();
            let listed: Vec<u64> = engine
                .sessions()?
                .into_iter()
                .map(|s| s.0)
                .filter(|&sid| sid != own)
                .collect();
            let mut closed = vec![];
            for sid in heard.silent(&listed, Instant::now(), timeout) {
                engine.close_session_versioned(sid)?;
                closed.push(sid);
            }
            Ok::<_, strait_fs_core::Error>(closed)
        })
        .await;
        match closed {
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
