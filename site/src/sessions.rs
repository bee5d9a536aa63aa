//! Closing the sessions of mounts that went silent.
//!
//! A session is judged by when this daemon last heard from it, on its monotonic clock
//! ([`Heard`]), not by the wall-clock heartbeat stamp the engine keeps: a step of the wall
//! clock (an NTP correction, a VM resumed, an operator's `date -s`) must not close every live
//! session, releasing its locks and deleting the unlinked files it holds open. The stamp is
//! still written, for mounts that share one Redis with no daemon (their clocks are the only
//! common one) and for `strait status`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::service::MetaServer;

/// When this daemon last heard from each session (its open, resume or heartbeat).
#[derive(Default)]
pub struct Heard {
    at: Mutex<HashMap<u64, Instant>>,
}

impl Heard {
    /// Session `sid` was heard from at `now`.
    pub fn note(&self, sid: u64, now: Instant) {
        self.at.lock().insert(sid, now);
    }

    /// Of the sessions the engine lists, those silent for more than `timeout` at `now`. A
    /// listed session this daemon has not heard from yet (one from before a restart) counts
    /// as heard now, so it has a whole timeout to come back; sessions no longer listed are
    /// forgotten.
    pub fn silent(&self, listed: &[u64], now: Instant, timeout: Duration) -> Vec<u64> {
        let mut at = self.at.lock();
        at.retain(|sid, _| listed.contains(sid));
        let mut out = vec![];
        for &sid in listed {
            let last = *at.entry(sid).or_insert(now);
            if now.saturating_duration_since(last) > timeout {
                out.push(sid);
            }
        }
        out
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_judged_by_the_monotonic_clock_since_it_was_last_heard() {
        let heard = Heard::default();
        let t0 = Instant::now();
        let timeout = Duration::from_secs(60);
        heard.note(1, t0);
        // 2 is listed but not heard yet (from before a restart): it gets a whole timeout
        assert!(heard
            .silent(&[1, 2], t0 + Duration::from_secs(59), timeout)
            .is_empty());
        heard.note(1, t0 + Duration::from_secs(100));
        assert_eq!(
            heard.silent(&[1, 2], t0 + Duration::from_secs(120), timeout),
            vec![2]
        );
        assert!(heard
            .silent(&[1], t0 + Duration::from_secs(160), timeout)
            .is_empty());
        assert_eq!(
            heard.silent(&[1], t0 + Duration::from_secs(161), timeout),
            vec![1]
        );
        // a session no longer listed is forgotten
        assert!(heard.silent(&[], t0, timeout).is_empty());
        assert!(heard.at.lock().is_empty());
    }
}
