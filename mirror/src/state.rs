//! What a mirror knows about itself, shared by the follower, the read guard, the site service
//! and the metrics.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use strait_fs_core::kv::DynKv;
use strait_fs_core::Version;
use strait_proto::site as s;

use crate::config::MirrorConfig;
use crate::lag::{quantile, Beat, History, Lag, LagState};
use crate::metrics::Metrics;

/// Records whose apply lag is kept for the last-minute quantiles.
pub const APPLY_LAG_SAMPLES_MAX: usize = 1 << 20;
/// The window of the apply rate, in seconds.
const RATE_WINDOW_S: u64 = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Loading a snapshot from the primary.
    Bootstrapping,
    /// Subscribed and applying.
    Following,
    /// Not subscribed (the replicator cannot be reached).
    Disconnected,
    /// An invalid record stopped the applier; only a restart (after a fix) goes on.
    Halted,
}

/// The mirror's state as `mirror status` shows it.
pub fn state_name(phase: Phase, lag: &Lag, window_ms: u64, silence_ms: u64) -> &'static str {
    match phase {
        Phase::Bootstrapping => "bootstrapping",
        Phase::Halted => "halted",
        Phase::Disconnected => "disconnected",
        Phase::Following if lag.silence_ms.is_some_and(|s| s > silence_ms) => "disconnected",
        Phase::Following if !lag.known || lag.ms > window_ms => "stale",
        Phase::Following => "following",
    }
}

struct Inner {
    phase: Phase,
    lag: LagState,
    history: History,
    error: String,
    source: String,
    bootstraps: u64,
    /// (local wall clock ms at apply, commit-to-apply lag in µs by the local wall clock).
    apply_lag: VecDeque<(u64, u64)>,
    /// (monotonic ms, applied version) once a second, for the apply rate.
    rate: VecDeque<(u64, Version)>,
    /// Monotonic ms of the subscription's last message (0: none yet). The primary's clock
    /// also comes straight from the primary, so heartbeats alone cannot tell that the
    /// replication stream went silent.
    stream_ms: u64,
}

/// Shared by every part of the mirror daemon.
pub struct Mirror {
    pub cfg: MirrorConfig,
    /// What the mirror presents to the replicator (a token for the role `mirror`).
    pub replicator_creds: strait_replicator_client::Credentials,
    pub kv: DynKv,
    pub metrics: Arc<Metrics>,
    /// The region's data blocks: copy queue, fallback reads, deletions, uploads.
    pub blocks: Arc<crate::blocks::Blocks>,
    /// The background workers (copier, follower, ...): `status` and `/health` list them.
    pub workers: strait_server::workers::Workers,
    started: Instant,
    inner: Mutex<Inner>,
    /// Bumped after every apply, heartbeat and phase change: what `wait` readers and the
    /// digest hold wait on.
    pub changed: tokio::sync::watch::Sender<u64>,
    /// Apply nothing past this version while set (a digest at that version is being taken).
    pub hold: Mutex<Option<Version>>,
    /// Held by the applier while it applies a batch: whoever sets `hold` under it knows no
    /// batch is in flight.
    pub apply_lock: tokio::sync::Mutex<()>,
    /// The newest primary version a forwarded read may have shown to this region's mounts
    /// (the primary names it in each forwarded answer). The mirror answers from its own
    /// metadata only once it has applied it, so no mount sees the region go back in time
    /// (attributes from the primary and then a chunk's slices from older metadata read as
    /// zeros).
    seen: AtomicU64,
    /// Set once this mirror was promoted to primary ([`crate::promote`]): from then on its
    /// region's calls are answered here, mutations included, and nothing is forwarded.
    promoted: std::sync::atomic::AtomicBool,
    promotion: Mutex<Option<s::Promotion>>,
    /// The epoch of the newest records received.
    epoch: AtomicU64,
    /// Where this mirror forwards its region's writes: `primary` in the settings until an
    /// epoch names another ([`crate::new_primary`]).
    primary_addr: Mutex<String>,
    /// The primary's lease and what was left of it, as its last answer to a poll said (ms).
    primary_lease: Mutex<(u64, u64)>,
    /// Once promoted: why it takes no changes for good (another primary was promoted since).
    fenced: Mutex<Option<String>>,
    /// When the follower applied its recent batches (for the traces of forwarded writes).
    pub applies: crate::follower::traced::Applies,
}

impl Mirror {
    pub fn new(
        cfg: MirrorConfig,
        replicator_creds: strait_replicator_client::Credentials,
        kv: DynKv,
        metrics: Arc<Metrics>,
        blocks: Arc<crate::blocks::Blocks>,
        applied: Version,
    ) -> Arc<Self> {
        let lag = LagState {
            applied,
            received: applied,
            ..Default::default()
        };
        let cfg_primary = cfg.primary.clone();
        let workers = strait_server::workers::Workers::new(&metrics.base.registry);
        Arc::new(Mirror {
            cfg,
            replicator_creds,
            kv,
            metrics,
            blocks,
            workers,
            started: Instant::now(),
            inner: Mutex::new(Inner {
                phase: Phase::Disconnected,
                lag,
                history: History::default(),
                error: String::new(),
                source: String::new(),
                bootstraps: 0,
                apply_lag: VecDeque::new(),
                rate: VecDeque::new(),
                stream_ms: 0,
            }),
            changed: tokio::sync::watch::channel(0).0,
            hold: Mutex::new(None),
            apply_lock: tokio::sync::Mutex::new(()),
            seen: AtomicU64::new(0),
            promoted: std::sync::atomic::AtomicBool::new(false),
            promotion: Mutex::new(None),
            epoch: AtomicU64::new(0),
            primary_addr: Mutex::new(cfg_primary),
            primary_lease: Mutex::new((0, 0)),
            fenced: Mutex::new(None),
            applies: Default::default(),
        })
    }

    /// Milliseconds on the mirror's monotonic clock.
    pub fn mono_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub fn phase(&self) -> Phase {
        self.inner.lock().phase
    }

    pub fn set_phase(&self, phase: Phase, source: &str) {
        {
            let mut i = self.inner.lock();
            i.phase = phase;
            if !source.is_empty() {
                i.source = source.to_string();
            }
            if phase == Phase::Bootstrapping {
                i.bootstraps += 1;
            }
        }
        self.bump();
    }

    pub fn set_error(&self, e: &str) {
        self.inner.lock().error = e.to_string();
    }

    pub fn halt(&self, why: &str) {
        {
            let mut i = self.inner.lock();
            i.phase = Phase::Halted;
            i.error = why.to_string();
        }
        self.metrics.halted.set(1);
        self.bump();
    }

    /// A heartbeat pushed through the change log: the primary's clock and latest version, for
    /// display and the silence (it bounds nothing: it may have waited anywhere on the way).
    pub fn on_heartbeat(&self, primary_clock_ms: u64, latest_version: Version) {
        self.reading(primary_clock_ms, latest_version, None);
    }

    /// A poll of the primary sent at local time `requested_ms` (see `lag.rs`): what the lag
    /// bound is counted from.
    pub fn on_poll(&self, requested_ms: u64, primary_clock_ms: u64, latest_version: Version) {
        self.reading(primary_clock_ms, latest_version, Some(requested_ms));
    }

    fn reading(&self, primary_clock_ms: u64, latest_version: Version, polled: Option<u64>) {
        let arrived_ms = self.mono_ms();
        {
            let mut i = self.inner.lock();
            if let Some(requested_ms) = polled {
                i.lag.on_poll(requested_ms, latest_version);
            }
            // a repeated reading is no news: it must not reset the silence
            if i.lag
                .beats
                .back()
                .is_some_and(|b| b.primary_clock_ms >= primary_clock_ms)
            {
                drop(i);
                self.bump();
                return;
            }
            i.lag.on_heartbeat(Beat {
                primary_clock_ms,
                latest_version,
                arrived_ms,
            });
        }
        self.metrics.primary_version.set(latest_version.0 as i64);
        self.bump();
    }

    /// A snapshot asked for at local time `requested_ms` was loaded at `version`.
    pub fn on_snapshot(&self, requested_ms: u64, version: Version) {
        self.inner.lock().lag.on_poll(requested_ms, version);
        self.bump();
    }

    /// The metadata was emptied for a new bootstrap: nothing bounds the lag until it is done.
    pub fn on_wiped(&self) {
        self.inner.lock().lag.on_wiped();
        self.metrics.applied_version.set(0);
        self.bump();
    }

    /// A forwarded answer showed the region the primary's state at `version` (or older).
    pub fn note_seen(&self, version: Version) {
        self.seen.fetch_max(version.0, Ordering::AcqRel);
    }

    pub fn on_received(&self, first: Version, last: Version, first_ts_ms: u64) {
        self.inner.lock().lag.on_received(first, last, first_ts_ms);
    }

    /// Records up to `applied` are applied; `ts_ns` are the commit times of those just applied;
    /// `next` is the oldest record still pending (version, commit ms).
    pub fn on_applied(&self, applied: Version, ts_ns: &[i64], next: Option<(Version, u64)>) {
        let now_us = strait_fs_core::clock::now_us();
        let now_ms = now_us / 1000;
        {
            let mut i = self.inner.lock();
            i.lag.on_applied(applied, next);
            for ts in ts_ns {
                let lag_us = now_us.saturating_sub((*ts / 1000).max(0) as u64);
                if i.apply_lag.len() >= APPLY_LAG_SAMPLES_MAX {
                    i.apply_lag.pop_front();
                }
                i.apply_lag.push_back((now_ms, lag_us));
                self.metrics.record_lag.observe(lag_us as f64 / 1e6);
            }
        }
        self.metrics.applied_version.set(applied.0 as i64);
        self.metrics.applied_records.inc_by(ts_ns.len() as u64);
        self.bump();
    }

    pub fn applied(&self) -> Version {
        self.inner.lock().lag.applied
    }

    /// The lag now.
    pub fn lag(&self) -> Lag {
        let now = self.mono_ms();
        let i = self.inner.lock();
        Self::lag_of(&i, now)
    }

    /// The lag, with `silence_ms` the longer of the primary's clock silence and the
    /// subscription's.
    fn lag_of(i: &Inner, now: u64) -> Lag {
        let mut lag = i.lag.lag(now);
        if i.stream_ms > 0 {
            let quiet = now.saturating_sub(i.stream_ms);
            lag.silence_ms = Some(lag.silence_ms.map_or(quiet, |s| s.max(quiet)));
        }
        lag
    }

    /// A message arrived on the subscription.
    pub fn on_stream(&self) {
        let now = self.mono_ms();
        self.inner.lock().stream_ms = now;
    }

    /// Where this mirror forwards its region's writes.
    pub fn primary_addr(&self) -> String {
        self.primary_addr.lock().clone()
    }

    pub fn set_primary_addr(&self, addr: &str) {
        *self.primary_addr.lock() = addr.to_string();
    }

    /// The primary's lease (ms; 0: none) and what was left of it, as it answered a poll.
    pub fn on_primary_lease(&self, lease_ms: u64, left_ms: u64) {
        *self.primary_lease.lock() = (lease_ms, left_ms);
    }

    /// Promoted, and fenced since: it takes no changes for good.
    pub fn set_fenced(&self, why: &str) {
        *self.fenced.lock() = Some(why.to_string());
        self.bump();
    }

    /// Why this promoted mirror takes no changes for good, if it was fenced.
    pub fn fenced(&self) -> Option<String> {
        self.fenced.lock().clone()
    }

    /// The primary's lease (ms; 0: none, or never asked) and what was left of it, as its
    /// last answer to a poll said.
    pub fn primary_lease(&self) -> (u64, u64) {
        *self.primary_lease.lock()
    }

    /// The epoch of the newest records received.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// Records of `epoch` arrived.
    pub fn on_epoch(&self, epoch: u64) {
        self.epoch.fetch_max(epoch, Ordering::Relaxed);
    }

    /// Whether this mirror is the primary now.
    pub fn promoted(&self) -> bool {
        self.promoted.load(Ordering::Acquire)
    }

    /// The promotion, once there was one.
    pub fn promotion(&self) -> Option<s::Promotion> {
        *self.promotion.lock()
    }

    /// From now on this mirror is the primary: its region's calls are answered here.
    pub fn set_promoted(&self, p: s::Promotion) {
        *self.promotion.lock() = Some(p);
        self.promoted.store(true, Ordering::Release);
        self.bump();
    }

    /// Whether reads may be answered from the mirror's own metadata under the window: the
    /// lag is known and within it, and the mirror has applied every version a forwarded
    /// answer may have shown (see `seen`).
    pub fn fresh(&self) -> bool {
        if self.promoted() {
            return true;
        }
        let (phase, lag, applied) = {
            let i = self.inner.lock();
            (i.phase, Self::lag_of(&i, self.mono_ms()), i.lag.applied)
        };
        // not while disconnected from the replicator: cut off from the log, the mirror cannot
        // learn of a new epoch, so no reading proves it current (the daemon answering at the
        // primary's address may be one superseded without knowing it)
        phase == Phase::Following
            && lag.known
            && lag.ms <= self.cfg.window_ms
            && applied.0 >= self.seen.load(Ordering::Acquire)
    }

    /// Once a second: the lag history and the rate, then the gauges.
    pub fn tick(&self) {
        let lag = self.lag();
        let now_mono = self.mono_ms();
        let now_wall = strait_fs_core::clock::now_ms();
        {
            let mut i = self.inner.lock();
            i.history.push(now_wall, lag);
            let applied = i.lag.applied;
            i.rate.push_back((now_mono, applied));
            while i.rate.len() > RATE_WINDOW_S as usize + 1 {
                i.rate.pop_front();
            }
            let cutoff = now_wall.saturating_sub(60_000);
            while i.apply_lag.front().is_some_and(|(at, _)| *at < cutoff) {
                i.apply_lag.pop_front();
            }
        }
        self.tick_gauges();
    }

    /// Set the lag and state gauges to the values now.
    pub fn tick_gauges(&self) {
        let lag = self.lag();
        let state = state_name(self.phase(), &lag, self.cfg.window_ms, self.cfg.silence_ms);
        self.metrics.lag_seconds.set(lag.ms as f64 / 1e3);
        self.metrics.lag_versions.set(lag.versions as i64);
        self.metrics.primary_version.set(lag.latest.0 as i64);
        for s in [
            "bootstrapping",
            "following",
            "stale",
            "disconnected",
            "halted",
        ] {
            self.metrics
                .state
                .with_label_values(&[s])
                .set((s == state) as i64);
        }
        let b = self.blocks.stats();
        let m = &self.metrics;
        use crate::metrics::catch_up;
        m.blocks_pending.set(b.pending_blocks as i64);
        m.bytes_pending.set(b.pending_bytes as i64);
        catch_up(&m.copied_blocks, b.copied_blocks);
        catch_up(&m.copied_bytes, b.copied_bytes);
        m.copy_rate.set(b.copy_bytes_per_s);
        catch_up(&m.fallback_reads, b.fallback_reads);
        catch_up(&m.fallback_bytes, b.fallback_bytes);
        m.fallback_rate.set(b.fallback_reads_per_s);
        catch_up(&m.corrupt_blocks, b.corrupt_local);
        catch_up(&m.deleted_blocks, b.deleted_blocks);
        catch_up(&m.skipped_dead_bytes, b.skipped_dead_bytes);
        catch_up(&m.uploaded_blocks, b.uploaded_blocks);
        catch_up(&m.block_errors, b.errors);
    }

    /// The status as the site service reports it.
    pub fn status(&self) -> s::MirrorState {
        let lag = self.lag();
        let i = self.inner.lock();
        let rate = match (i.rate.front(), i.rate.back()) {
            (Some(a), Some(b)) if b.0 > a.0 => {
                (b.1 .0 - a.1 .0) as f64 * 1000.0 / (b.0 - a.0) as f64
            }
            _ => 0.0,
        };
        let mut recent: Vec<u64> = i.apply_lag.iter().map(|(_, l)| *l).collect();
        let p50 = quantile(&mut recent, 0.5);
        let p99 = quantile(&mut recent, 0.99);
        let max = recent.last().copied().unwrap_or(0);
        let promotion = *self.promotion.lock();
        let state = match &promotion {
            Some(_) => "promoted",
            None => state_name(i.phase, &lag, self.cfg.window_ms, self.cfg.silence_ms),
        };
        let (epoch, primary) = match &promotion {
            Some(p) => (p.epoch, String::new()),
            None => (self.epoch.load(Ordering::Relaxed), self.primary_addr()),
        };
        let pc = &self.cfg.promotion;
        let failover = match pc.failover {
            crate::config::Failover::Manual => "manual".to_string(),
            crate::config::Failover::Auto => format!("auto after {} ms", pc.failover_after_ms),
        };
        let lease = *self.primary_lease.lock();
        s::MirrorState {
            warmup: self.blocks.last_warmup().map(|w| w.wire()),
            workers: strait_server::workers::wire(&self.workers.statuses()),
            id: self.cfg.id.clone(),
            state: state.into(),
            promotion,
            epoch,
            primary,
            failover,
            lease_ms: lease.0,
            lease_left_ms: lease.1,
            applied_version: i.lag.applied.0,
            latest_version: lag.latest.0,
            lag_versions: lag.versions,
            lag_ms: lag.ms,
            lag_p50_ms: i.history.quantile_ms(0.5),
            lag_p99_ms: i.history.quantile_ms(0.99),
            lag_max_ms: i.history.quantile_ms(1.0),
            apply_rate: rate,
            policy: self.cfg.policy.to_string(),
            window_ms: self.cfg.window_ms,
            error: i.error.clone(),
            source: i.source.clone(),
            bootstraps: i.bootstraps,
            silence_ms: lag.silence_ms.unwrap_or(0),
            history: i
                .history
                .points
                .iter()
                .map(|&(at_ms, lag_ms, lag_versions)| s::LagPoint {
                    at_ms,
                    lag_ms,
                    lag_versions,
                })
                .collect(),
            apply_lag_p50_us: p50,
            apply_lag_p99_us: p99,
            apply_lag_max_us: max,
            apply_lag_samples: recent.len() as u64,
            blocks: Some(block_state(&self.blocks.stats())),
        }
    }
}

fn block_state(b: &crate::blocks::BlockStats) -> s::BlockState {
    s::BlockState {
        store: b.store.clone(),
        policy: b.policy.clone(),
        pending_blocks: b.pending_blocks,
        pending_bytes: b.pending_bytes,
        copied_blocks: b.copied_blocks,
        copied_bytes: b.copied_bytes,
        copy_bytes_per_s: b.copy_bytes_per_s,
        fallback_reads: b.fallback_reads,
        fallback_bytes: b.fallback_bytes,
        fallback_reads_per_s: b.fallback_reads_per_s,
        corrupt_blocks: b.corrupt_local,
        deleted_blocks: b.deleted_blocks,
        skipped_dead_blocks: b.skipped_dead_blocks,
        skipped_dead_bytes: b.skipped_dead_bytes,
        uploaded_blocks: b.uploaded_blocks,
        errors: b.errors,
        last_error: b.last_error.clone(),
    }
}
