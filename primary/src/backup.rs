//! The primary's automatic metadata backups (docs/operations.md, "Metadata backups"): every
//! `backup_interval_s`, a consistent dump of the metadata into the file system's object store
//! ([`strait_fs_core::backup`]), keeping the newest `backup_keep`.
//!
//! A backup is taken when the last one in the store is at least an interval old and the
//! metadata changed since (an idle file system adds no copies of itself). The store is
//! checked every interval, at most every [`CHECK_EVERY_MAX`], the first time one check after
//! the start: a daemon restarted often still backs up once the last backup is old enough, and
//! a short-lived one (a test's) writes nothing to its store.
//!
//! A primary that may not delete (fenced, or handing over) takes no backup: what it holds is
//! not, or soon not, the file system's history.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{IntCounter, IntGauge, Opts, Registry};
use strait_fs_core::backup;
use strait_fs_core::clock::now_ms;
use strait_fs_core::meta::{DeletionGate, Meta};
use strait_fs_core::object::DynStore;
use tokio_util::sync::CancellationToken;

/// The longest wait between two looks at the store.
pub const CHECK_EVERY_MAX: Duration = Duration::from_secs(600);
/// The first wait after a failed backup; it doubles up to the check interval.
const RETRY_AFTER_MIN: Duration = Duration::from_secs(5);

/// When and how many.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The age of the last backup at which a new one is taken.
    pub interval: Duration,
    /// Complete backups kept (the newest; at least one).
    pub keep: usize,
}

/// The backups' metrics.
#[derive(Clone)]
pub struct BackupMetrics {
    /// The metadata version of the newest backup this daemon took or found.
    pub last_version: IntGauge,
    /// When that backup started (seconds since the Unix epoch).
    pub last_time: IntGauge,
    /// Backups that failed.
    pub failures: IntCounter,
}

impl BackupMetrics {
    pub fn new(registry: &Registry) -> Self {
        let last_version = IntGauge::with_opts(Opts::new(
            "strait_backup_last_version",
            "Metadata version of the newest backup in the object store",
        ))
        .expect("valid gauge");
        let last_time = IntGauge::with_opts(Opts::new(
            "strait_backup_last_timestamp_seconds",
            "When the newest metadata backup in the object store started",
        ))
        .expect("valid gauge");
        let failures = IntCounter::with_opts(Opts::new(
            "strait_backup_failures_total",
            "Metadata backups that failed",
        ))
        .expect("valid counter");
        for c in [
            Box::new(last_version.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(last_time.clone()),
            Box::new(failures.clone()),
        ] {
            if let Err(e) = registry.register(c) {
                tracing::warn!("register the backup metrics: {e}");
            }
        }
        BackupMetrics {
            last_version,
            last_time,
            failures,
        }
    }

    fn note(&self, m: &backup::Manifest) {
        self.last_version.set(m.version as i64);
        self.last_time.set((m.started_ms / 1000) as i64);
    }
}

/// What the loop knows of the newest backup: when it started and its version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Last {
    started_ms: u64,
    version: u64,
}

/// Whether a backup is due at `now_ms` of metadata at `version`, after `last` (None: the
/// store has none).
fn due(last: Option<Last>, now_ms: u64, version: u64, interval: Duration) -> bool {
    match last {
        None => true,
        Some(l) => {
            l.version != version
                && now_ms.saturating_sub(l.started_ms) >= interval.as_millis() as u64
        }
    }
}

/// Take backups until `stop` is cancelled.
pub async fn run(
    engine: Arc<Meta>,
    store: DynStore,
    s: Settings,
    gate: Option<DeletionGate>,
    metrics: BackupMetrics,
    stop: CancellationToken,
) {
    let check = s
        .interval
        .min(CHECK_EVERY_MAX)
        .max(Duration::from_millis(10));
    let mut pause = check;
    let mut last: Option<Option<Last>> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = check;
        if let Some(why) = gate.as_ref().and_then(|g| g()) {
            tracing::debug!("no metadata backup: {why}");
            continue;
        }
        match once(&engine, &store, &s, &mut last, &metrics).await {
            Ok(()) => {}
            Err(e) => {
                metrics.failures.inc();
                let failures = metrics.failures.get().min(16) as u32;
                pause = RETRY_AFTER_MIN
                    .saturating_mul(1 << failures.min(10))
                    .min(check);
                tracing::warn!("metadata backup: {e}; trying again in {pause:?}");
            }
        }
    }
}

/// One look: learn the newest backup (the first time), take one if it is due, prune.
async fn once(
    engine: &Arc<Meta>,
    store: &DynStore,
    s: &Settings,
    last: &mut Option<Option<Last>>,
    metrics: &BackupMetrics,
) -> anyhow::Result<()> {
    let known = match *last {
        Some(l) => l,
        None => {
            let newest = backup::list(store).await?.pop();
            if let Some(m) = &newest {
                metrics.note(m);
            }
            let l = newest.map(|m| Last {
                started_ms: m.started_ms,
                version: m.version,
            });
            *last = Some(l);
            l
        }
    };
    let kv = engine.kv().clone();
    let version = tokio::task::spawn_blocking(move || kv.last_version()).await??;
    let now = now_ms();
    if !due(known, now, version.0, s.interval) {
        return Ok(());
    }
    let m = backup::take(engine.kv().clone(), store.clone(), now).await?;
    tracing::info!(
        "metadata backup {} of {} at version {}: {} pairs, {} bytes stored in {} parts ({} before compression), {} ms",
        m.name,
        store.describe(),
        m.version,
        m.pairs,
        m.stored_bytes(),
        m.parts.len(),
        m.dump_bytes,
        m.took_ms
    );
    metrics.note(&m);
    *last = Some(Some(Last {
        started_ms: m.started_ms,
        version: m.version,
    }));
    let gone = backup::prune(store, s.keep).await?;
    if !gone.is_empty() {
        tracing::info!(
            "deleted {} older metadata backups (keeping {}): {}",
            gone.len(),
            s.keep,
            gone.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_is_due_when_the_last_is_old_and_the_metadata_changed() {
        let hour = Duration::from_secs(3600);
        let last = Some(Last {
            started_ms: 10_000_000,
            version: 7,
        });
        // none yet: due
        assert!(due(None, 0, 0, hour));
        // younger than the interval: not due, changed or not
        assert!(!due(last, 10_000_000 + 3_599_999, 8, hour));
        // old enough and changed: due
        assert!(due(last, 10_000_000 + 3_600_000, 8, hour));
        // old enough but unchanged: not due
        assert!(!due(last, 10_000_000 + 99_000_000, 7, hour));
        // a clock stepped back: not due
        assert!(!due(last, 5, 8, hour));
    }
}
