//! Promoting this mirror to primary (`strait mirror promote`, docs/operations.md, "Promoting
//! a mirror"), in place: the daemon keeps its listener and its mounts' sessions, and the calls
//! it forwarded to the old primary are committed here from then on.
//!
//! # To ensure correctness
//! - The replicator's epoch is raised first. From then on it refuses the old primary's appends
//!   and heartbeats, so the log's end at that moment is final for the old epoch: nothing the
//!   old primary commits later can be acknowledged in `replicated` durability (it is fenced),
//!   and nothing it committed before is lost to this mirror.
//! - No change is committed here before every version up to that end is applied and the
//!   follower has stopped: the new primary's first version is the one after it.
//! - The id counters are past every id the log used (the replica's apply raises them, see
//!   `changelog::apply_replica_with`) and past every slice id the old primary gave this
//!   region's mounts through the mirror, whose blocks may be in this region's store.
//! - A change a mount sends again (its answer from the old primary was lost) is answered from
//!   its request record when the change is in the log: the change record names its request
//!   id, and applying it here wrote the record. One that finds no record runs: it is in no
//!   version of the history that goes on from here. The old primary either never made it, or
//!   made it without the log getting it (`local` durability, or a change in flight at a
//!   failover), and then the change is set aside when the old primary rejoins
//!   (`strait primary rejoin`), so it is made once in the history that survives, here.
//! - The promotion is written in the metadata before the first change is taken, so a restart
//!   comes back as the primary, shipping at the new epoch; it never follows again.
//! - A promotion that fails before the epoch was raised changes nothing. One that fails after
//!   it (the rest of the log was not applied in time) leaves the mirror following, fenced
//!   primary or not: calling promote again raises the epoch once more and goes on.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strait_fs_core::kv::DynKv;
use strait_fs_core::meta::{keys, Meta};
use strait_fs_core::{Epoch, Version};
use strait_primary::ship::tap::CommitSignal;
use strait_primary::ship::Shipping;
use strait_proto::site as s;
use strait_replicator_client::LogClient;
use strait_server::{MetaServer, ReplicationWait, WriteFence};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::forward::ForwardSession;
use crate::state::{Mirror, Phase};

/// Slice ids a promotion skips past every id the log used and every range the old primary
/// gave this region's mounts ([`Promoter::take_slice_ranges`]): more than the old primary can
/// have handed out beyond those (2^32 ids, four million ranges of 1,000, where each mount
/// holds one at a time). The counter (an i64) allows two billion promotions.
const PROMOTION_SLICE_GAP: i64 = 1 << 32;

/// How long a promotion waits for the rest of the log when the call names no limit.
pub const DRAIN_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
/// How long a promotion waits for the replicator to elect a leader, and how often it looks.
const ELECTION_WAIT_MAX: Duration = Duration::from_secs(30);
const ELECTION_POLL: Duration = Duration::from_millis(100);
/// How long the follower may take to stop once the log is applied.
const FOLLOWER_STOP: Duration = Duration::from_secs(10);

use strait_primary::promotion::record;

/// The shipper's fence and replication wait, given to the metadata service when the daemon
/// starts and filled in at the promotion. Until then the engine is read-only (mutations are
/// forwarded, or answer EROFS), and neither is asked anything that matters.
/// Once promoted, a planned switchover away from this mirror refuses every call for a while
/// (`Handover`), as a primary's does.
#[derive(Default)]
pub struct LateShipping {
    shipping: OnceLock<Shipping>,
    handover: strait_primary::handover::Handover,
}

impl WriteFence for LateShipping {
    fn refused(&self) -> Pin<Box<dyn Future<Output = Option<String>> + Send + '_>> {
        match self.shipping.get() {
            Some(s) => s.fence.refused(),
            None => Box::pin(async { None }),
        }
    }

    fn unsettled(&self) -> Pin<Box<dyn Future<Output = Option<String>> + Send + '_>> {
        if self.handover.active() {
            return Box::pin(async {
                Some(
                    "this promoted mirror is handing over to another being promoted (a \
                     planned switchover)"
                        .to_string(),
                )
            });
        }
        match self.shipping.get() {
            Some(s) => s.fence.unsettled(),
            None => Box::pin(async { None }),
        }
    }

    fn in_flight(&self) -> Option<Arc<strait_server::InFlight>> {
        Some(self.handover.in_flight.clone())
    }

    fn reads_refused(&self) -> Option<String> {
        self.shipping
            .get()
            .and_then(|s| s.fence.reads_refused_now())
    }
}

impl ReplicationWait for LateShipping {
    fn wait(
        &self,
        version: Version,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        match self.shipping.get().and_then(|s| s.wait.as_ref()) {
            Some(w) => w.wait(version),
            None => Box::pin(async { Ok(()) }),
        }
    }
}

impl Promoter {
    /// Once promoted with a lease: its length, and how much of it is left now.
    pub fn lease_left(&self) -> Option<(Duration, Duration)> {
        self.late.shipping.get()?.fence.lease_left()
    }

    /// A planned switchover away from this promoted mirror (`Handover`, asked by `strait
    /// mirror promote --planned` of another): as `strait primary` hands over.
    pub async fn hand_over(&self, req: s::HandoverRequest) -> Result<s::HandoverReply, Status> {
        let Some(shipping) = self.late.shipping.get() else {
            return Err(Status::failed_precondition(
                "a mirror hands nothing over: Handover is the primary's call",
            ));
        };
        let shipped = shipping.shipper.watch();
        strait_primary::handover::hand_over(&self.late.handover, &self.mirror.kv, &shipped, req)
            .await
    }
}

/// How long a stopping promoted mirror waits for its shipper to send what is left.
const SHIP_DRAIN: Duration = Duration::from_secs(5);

impl Promoter {
    /// At shutdown, once the service stopped: wait (at most [`SHIP_DRAIN`]) until the
    /// replicator holds every version committed here, as `strait primary` does, then stop
    /// the shipper. What is not shipped by then stays in the outbox and goes at the next start.
    pub async fn drain(&self) {
        if let Some(shipping) = self.late.shipping.get() {
            let mut rx = shipping.shipper.watch();
            let kv = self.mirror.kv.clone();
            if let Ok(Ok(latest)) = tokio::task::spawn_blocking(move || kv.last_version()).await {
                match strait_primary::ship::fence::wait_committed(&mut rx, latest, SHIP_DRAIN).await
                {
                    Ok(()) => tracing::info!("the replicator holds every version up to {latest}"),
                    Err(why) => tracing::warn!(
                        "stopping with versions the replicator does not hold yet ({why}); they \
                         are in the outbox and are shipped at the next start"
                    ),
                }
            }
        }
        self.ship_stop.cancel();
    }
}

/// What follows the old primary: stopped at the promotion.
pub struct Following {
    pub stop: CancellationToken,
    pub follower: JoinHandle<()>,
}

/// Everything a promotion touches.
pub struct Promoter {
    pub mirror: Arc<Mirror>,
    pub engine: Arc<Meta>,
    pub server: Arc<MetaServer>,
    pub forward: Arc<ForwardSession>,
    pub late: Arc<LateShipping>,
    pub signal: Arc<CommitSignal>,
    pub following: Mutex<Option<Following>>,
    /// The daemon's stop: GC runs until it.
    pub stop: CancellationToken,
    /// The shipper's stop: after the daemon's, once what is left is shipped ([`Promoter::drain`]).
    pub ship_stop: CancellationToken,
    /// One promotion at a time.
    pub busy: tokio::sync::Mutex<()>,
    /// Once promoted, with a store of its own: GC on demand (`strait gc`).
    pub gc: OnceLock<strait_primary::gc::Gc>,
}

/// The result of an engine call on the blocking pool, as a status.
fn joined<T>(
    what: &str,
    r: Result<strait_fs_core::Result<T>, tokio::task::JoinError>,
) -> Result<T, Status> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Status::internal(format!("{what}: {e}"))),
        Err(e) => Err(Status::internal(format!("{what}: {e}"))),
    }
}

impl Promoter {
    /// Promote this mirror (the site service's `Promote`; planned or not, the same steps).
    pub async fn promote(&self, drain_timeout: Duration) -> Result<s::Promotion, Status> {
        let Ok(_one) = self.busy.try_lock() else {
            return Err(Status::failed_precondition(
                "a promotion of this mirror is under way",
            ));
        };
        if let Some(p) = self.mirror.promotion() {
            return Err(Status::failed_precondition(format!(
                "this mirror is the primary already (promoted at epoch {}, from version {})",
                p.epoch, p.from_version
            )));
        }
        match self.mirror.phase() {
            Phase::Bootstrapping => {
                return Err(Status::failed_precondition(
                    "the mirror is loading a snapshot: it holds no complete state to promote",
                ))
            }
            Phase::Halted => {
                return Err(Status::failed_precondition(
                    "the mirror's applier halted on an invalid record: it cannot apply the rest \
                     of the log, so it cannot be promoted",
                ))
            }
            _ => {}
        }
        let cfg = &self.mirror.cfg;
        let creds = cfg
            .promotion
            .credentials(&cfg.security)
            .map_err(|e| Status::failed_precondition(format!("{e:#}")))?;
        let client = LogClient::new(&cfg.replicator, &creds)?;

        // 1. fence the old primary: raise the epoch
        // the old primary's region may have held the leader: wait for the election
        let t0 = Instant::now();
        let elect_by = t0 + drain_timeout.min(ELECTION_WAIT_MAX);
        let st = loop {
            match client.leader_status().await {
                Ok(st) => break st,
                Err(s) if Instant::now() >= elect_by => {
                    return Err(Status::unavailable(format!(
                        "the replicator has had no leader for {:?} ({}); nothing was changed",
                        t0.elapsed(),
                        s.message()
                    )))
                }
                Err(_) => tokio::time::sleep(ELECTION_POLL).await,
            }
        };
        let elect_ms = t0.elapsed().as_millis() as u64;
        let t0 = Instant::now();
        let epoch = Epoch(st.epoch + 1);
        // named in the epoch: the other mirrors forward their writes here
        let named = cfg
            .promotion
            .advertised(&cfg.id, &cfg.listen, &cfg.data_url);
        if named.is_none() {
            tracing::warn!(
                "promotion: this mirror listens on {} and [promotion] advertise is not set, so                  the new epoch names no address for it: the other mirrors keep forwarding to                  the primary in their settings",
                cfg.listen
            );
        }
        let bumped = client.bump_epoch_naming(epoch, named).await.map_err(|s| {
            // refused (another promotion raised it first): nothing changed; no answer: it may
            // have been raised, which fences the old primary, and promoting again goes on
            Status::unavailable(format!(
                "raise the replicator's epoch to {epoch}: {}; this mirror is not promoted (if \
                 the epoch was raised all the same, the old primary is fenced: promote again)",
                s.message()
            ))
        })?;
        let from = Version(bumped.last_version);
        tracing::warn!(
            "promotion: raised the replicator's epoch to {} (the old primary is fenced); the \
             log ends at version {from}",
            bumped.epoch
        );
        let bump_ms = t0.elapsed().as_millis() as u64;

        // 2. apply the rest of the log, then stop following
        let t1 = Instant::now();
        let mut changed = self.mirror.changed.subscribe();
        let drained = tokio::time::timeout(drain_timeout, async {
            while self.mirror.applied() < from {
                let _ = tokio::time::timeout(Duration::from_millis(50), changed.changed()).await;
            }
        })
        .await;
        if drained.is_err() {
            return Err(Status::deadline_exceeded(format!(
                "raised the epoch to {epoch} (the old primary is fenced), but this mirror applied \
                 only up to version {} of {from} within {drain_timeout:?}: it goes on following; \
                 promote it again once it has caught up",
                self.mirror.applied()
            )));
        }
        let following = self.following.lock().take();
        if let Some(f) = following {
            f.stop.cancel();
            if tokio::time::timeout(FOLLOWER_STOP, f.follower)
                .await
                .is_err()
            {
                return Err(Status::internal(format!(
                    "the follower did not stop within {FOLLOWER_STOP:?}; nothing was committed \
                     here (the epoch is {epoch})"
                )));
            }
        }
        let kv = self.mirror.kv.clone();
        let at = joined(
            "read the version",
            tokio::task::spawn_blocking(move || kv.last_version()).await,
        )?;
        if at != from {
            return Err(Status::internal(format!(
                "the mirror is at version {at} after following stopped, not at the log's end \
                 {from}: not promoted (restart it to follow again)"
            )));
        }
        let drain_ms = t1.elapsed().as_millis() as u64;

        // 3. take over: ids, the promotion on disk, then the shipper and the writes
        let t2 = Instant::now();
        self.take_slice_ranges().await?;
        let blocks = self.mirror.blocks.stats();
        let mut p = s::Promotion {
            epoch: epoch.0,
            from_version: from.0,
            at_ms: strait_fs_core::clock::now_ms(),
            elect_ms,
            bump_ms,
            drain_ms,
            switch_ms: 0,
            pending_blocks: blocks.pending_blocks,
            pending_bytes: blocks.pending_bytes,
            // counted after the switch (`count_missing`)
            ..Default::default()
        };
        let kv = self.mirror.kv.clone();
        let rec = p;
        joined(
            "record the promotion",
            tokio::task::spawn_blocking(move || record(&kv, &rec)).await,
        )?;
        p.switch_ms = t2.elapsed().as_millis() as u64;
        self.switch(&p)
            .map_err(|e| Status::internal(format!("start as the primary: {e:#}")))?;
        tokio::spawn(count_missing(self.mirror.clone()));
        // this mirror's cursor no longer holds the log back
        if let Err(s) = client.forget_mirror(&cfg.id).await {
            tracing::warn!(
                "promotion: drop this mirror's cursor at the replicator: {}",
                s.message()
            );
        }
        tracing::warn!(
            "promoted to primary at epoch {epoch} from version {from}: a replicator leader after \
             {elect_ms} ms, epoch raised in {bump_ms} ms, the log applied in {drain_ms} ms, \
             switched in {} ms; {} blocks ({} bytes) were still to copy from the old primary's \
             store",
            p.switch_ms,
            p.pending_blocks,
            p.pending_bytes
        );
        Ok(p)
    }

    /// The slice ids the old primary gave this region's mounts through the mirror are theirs
    /// here too, and the counter passes them: their blocks may be in this region's store.
    /// Then the counter skips [`PROMOTION_SLICE_GAP`] ids more: the old primary also gave
    /// ranges to mounts elsewhere (its own region's, other mirrors'), which are in no record
    /// of the log unless used, and a mount may have uploaded blocks under such an id before
    /// its commit was refused. Handed out again here, the id would name two blocks: the one
    /// its new writer commits, and the old one in a store or a mount's cache.
    async fn take_slice_ranges(&self) -> Result<(), Status> {
        let ranges = self.forward.granted_ranges();
        let mut top = 0u64;
        for &(mount, first, end) in &ranges {
            let count = u32::try_from(end.saturating_sub(first.0)).unwrap_or(u32::MAX);
            self.server.grant_slices(mount, first, count);
            top = top.max(end.saturating_sub(1));
        }
        let kv = self.mirror.kv.clone();
        let next = joined(
            "raise the slice counter",
            tokio::task::spawn_blocking(move || {
                let cur = raise_counter(&kv, keys::NEXT_SLICE, top)?;
                kv.incr(&keys::counter(keys::NEXT_SLICE), PROMOTION_SLICE_GAP)
                    .map(|next| (cur, next))
            })
            .await,
        )?;
        tracing::info!(
            "slice ids are handed out from {} on: {PROMOTION_SLICE_GAP} past the highest the log \
             and this region's ranges used ({})",
            next.1,
            next.0
        );
        Ok(())
    }

    /// Become the primary of `p`'s epoch: ship from the engine's version on, take mutations,
    /// answer every call here. Also what a restart of a promoted mirror does.
    pub fn switch(&self, p: &s::Promotion) -> anyhow::Result<()> {
        let cfg = &self.mirror.cfg;
        let pc = &cfg.promotion;
        let settings = strait_primary::ship::Settings {
            replicator: cfg.replicator.clone(),
            creds: pc.credentials(&cfg.security)?,
            epoch: Epoch(p.epoch),
            heartbeat: Duration::from_millis(pc.heartbeat_ms),
            durability: pc.durability,
            replicated_timeout: Duration::from_millis(pc.replicated_timeout_ms),
            lease: (pc.lease_ms > 0).then(|| Duration::from_millis(pc.lease_ms)),
            // this region's mounts write their blocks here
            blocks: self.mirror.blocks.local_store(),
            // fenced later (another promoted), it answers reads as long as a mirror would
            fenced_reads: Duration::from_millis(cfg.window_ms),
        };
        let shipping = strait_primary::ship::start(
            self.mirror.kv.clone(),
            self.signal.clone(),
            &settings,
            self.mirror.metrics.base.clone(),
            &self.mirror.workers,
            self.ship_stop.clone(),
        )?;
        // fenced (another promoted since): the status and /health say so
        let mut shipped = shipping.shipper.watch();
        let (mirror, stop) = (self.mirror.clone(), self.ship_stop.clone());
        self.mirror
            .workers
            .spawn_once("fence-watch", &self.ship_stop, async move {
                tokio::select! {
                    r = shipped.wait_for(|s| s.fenced.is_some()) => {
                        if let Ok(s) = r {
                            mirror.set_fenced(s.fenced.as_deref().unwrap_or_default());
                        }
                    }
                    _ = stop.cancelled() => {}
                }
            });
        // deleting nothing on its own once superseded, as `strait primary` does
        let fence = shipping.fence.clone();
        let gate: strait_fs_core::meta::DeletionGate = Arc::new(move || fence.deletions_refused());
        self.engine.gate_deletions(gate.clone());
        if self.late.shipping.set(shipping).is_err() {
            anyhow::bail!("the shipper was started already");
        }
        // dead slices' blocks, from this region's store, as a primary deletes them
        if let Some(store) = self.mirror.blocks.local_store() {
            let gc = strait_primary::gc::Gc::start(
                self.engine.clone(),
                store,
                &cfg.replicator,
                &settings.creds,
                Duration::from_millis(pc.gc_mirror_grace_ms),
                Some((Epoch(p.epoch), gate.clone())),
                (pc.gc_interval_s > 0).then(|| Duration::from_secs(pc.gc_interval_s)),
                &self.mirror.workers,
                &self.stop,
                self.mirror.metrics.base.clone(),
            )?;
            let _ = self.gc.set(gc);
        }
        // metadata backups into this region's store, as `strait primary` takes them
        if let (Some(store), true) = (self.mirror.blocks.local_store(), pc.backup_interval_s > 0) {
            self.mirror.workers.spawn(
                "metadata-backup",
                &self.stop,
                strait_primary::backup::run(
                    self.engine.clone(),
                    store,
                    strait_primary::backup::Settings {
                        interval: Duration::from_secs(pc.backup_interval_s),
                        keep: pc.backup_keep.max(1),
                    },
                    Some(gate),
                    strait_primary::backup::BackupMetrics::new(&self.mirror.metrics.base.registry),
                    self.stop.clone(),
                ),
            );
        }
        self.engine.allow_writes();
        self.mirror.set_promoted(*p);
        tracing::info!(
            "serving as the primary at epoch {} (durability {}), shipping to {}",
            p.epoch,
            pc.durability,
            cfg.replicator.join(", ")
        );
        Ok(())
    }
}

/// Raise counter `name` of `kv` to at least `top`.
fn raise_counter(kv: &DynKv, name: &str, top: u64) -> strait_fs_core::Result<i64> {
    let key = keys::counter(name);
    let cur = kv.incr(&key, 0)?;
    let top = i64::try_from(top).unwrap_or(i64::MAX);
    if top > cur {
        return kv.incr(&key, top - cur);
    }
    Ok(cur)
}

/// After a promotion: count the blocks live files reference that this region's store lacks,
/// and record them with the promotion (`mirror status` shows them). In the background: a
/// pass over every chunk must not delay the first write.
async fn count_missing(mirror: Arc<Mirror>) {
    let started = Instant::now();
    let m = mirror.clone();
    let counted = tokio::task::spawn_blocking(move || {
        let missing = m.blocks.missing()?;
        let Some(mut p) = m.promotion() else {
            return Ok(None);
        };
        if let Some(x) = missing {
            p.missing_counted = true;
            p.missing_blocks = x.blocks;
            p.missing_bytes = x.bytes;
            p.missing_files = x.files;
            record(&m.kv, &p)?;
        }
        Ok::<_, strait_fs_core::Error>(Some(p))
    })
    .await;
    match counted {
        Ok(Ok(Some(p))) if p.missing_counted => {
            if p.missing_blocks > 0 {
                tracing::warn!(
                    "{} blocks ({} bytes) of {} files are not in this region's store: reads of \
                     them fail with EIO while the old primary's store cannot be reached \
                     (counted in {:?})",
                    p.missing_blocks,
                    p.missing_bytes,
                    p.missing_files,
                    started.elapsed()
                );
            } else {
                tracing::info!(
                    "every block the files reference is in this region's store (counted in {:?})",
                    started.elapsed()
                );
            }
            mirror.set_promoted(p);
        }
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!("count the blocks missing from this region's store: {e}"),
        Err(e) => tracing::warn!("count the blocks missing from this region's store: {e}"),
    }
}

/// How often `failover = "auto"` asks the replicator's leader what it last took from the
/// primary.
const WATCH_POLL: Duration = Duration::from_millis(200);

/// What the replicator's leader last took from the primary: its last heartbeat (the primary's
/// clock and version), the log's end and the epoch. Any change means the primary was heard
/// (or another mirror was promoted).
type Heard = (Option<(u64, u64)>, u64, u64);

/// When a primary counts as gone for `failover = "auto"`.
#[derive(Debug, Default)]
pub struct Silence {
    last: Option<Heard>,
    /// When `last` was first seen, on this mirror's monotonic clock.
    since: Option<Instant>,
}

impl Silence {
    /// The leader answered `heard` at `now`; returns how long it has answered the same. Only
    /// an answer counts: while the leader cannot be asked nothing is concluded, and the time
    /// counts from the first answer that showed what the leader still shows, so it is never
    /// longer than the primary's real silence (the leader's state holds every heartbeat the
    /// replicator accepted).
    pub fn observe(&mut self, heard: Heard, now: Instant) -> Duration {
        if self.last != Some(heard) {
            self.last = Some(heard);
            self.since = Some(now);
        }
        self.since.map_or(Duration::ZERO, |s| now.duration_since(s))
    }
}

impl Promoter {
    /// `failover = "auto"`: promote this mirror once the replicator's leader has taken
    /// nothing from the primary for `after`, until promoted or `stop`.
    pub async fn watch_primary(self: Arc<Self>, after: Duration, stop: CancellationToken) {
        let cfg = &self.mirror.cfg;
        let client = match LogClient::new(&cfg.replicator, &self.mirror.replicator_creds) {
            Ok(c) => c.with_attempts(1),
            Err(s) => {
                tracing::error!("automatic failover is off: {}", s.message());
                return;
            }
        };
        tracing::info!(
            "automatic failover: this mirror promotes itself once the replicator has taken \
             nothing from the primary for {after:?}"
        );
        let mut silence = Silence::default();
        // said once until it changes: why a silent primary is not failed over
        let mut refusal: Option<String> = None;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(WATCH_POLL) => {}
            }
            if self.mirror.promoted() {
                return;
            }
            if matches!(self.mirror.phase(), Phase::Bootstrapping | Phase::Halted) {
                silence = Silence::default();
                continue;
            }
            let Ok(st) = client.leader_status().await else {
                continue;
            };
            let heard = (
                st.heartbeat
                    .as_ref()
                    .map(|h| (h.primary_clock_ms, h.latest_version)),
                st.last_version,
                st.epoch,
            );
            let quiet = silence.observe(heard, Instant::now());
            if quiet < after {
                refusal = None;
                continue;
            }
            // the old primary may still acknowledge changes until its lease runs out: only a
            // lease known and run out makes its silence a failure (with none it goes on in
            // `local` durability however long it is cut off: two primaries)
            let (lease_ms, _) = self.mirror.primary_lease();
            if let Some(why) = lease_refusal(lease_ms, quiet) {
                if refusal.as_deref() != Some(why.as_str()) {
                    tracing::warn!("automatic failover waits: {why}");
                    self.mirror
                        .set_error(&format!("automatic failover waits: {why}"));
                    refusal = Some(why);
                }
                continue;
            }
            tracing::warn!(
                "the replicator has taken nothing from the primary for {quiet:?} (failover \
                 after {after:?}): promoting this mirror"
            );
            match self.promote(DRAIN_TIMEOUT_DEFAULT).await {
                Ok(_) => return,
                Err(s) => {
                    tracing::error!("automatic promotion failed: {}", s.message());
                    silence = Silence::default();
                }
            }
        }
    }
}

/// What a primary's lease is known to cover beyond the replicator's silence: the time
/// between its call and the replicator taking it (its lease counts from the send), and a
/// poll of the leader here.
const LEASE_MARGIN: Duration = Duration::from_millis(500);

/// Why `failover = "auto"` may not promote after the replicator has taken nothing from the
/// primary for `quiet`, when the primary's last answer named a lease of `lease_ms` (0: none,
/// or it never answered): None once the lease is known and has run out.
fn lease_refusal(lease_ms: u64, quiet: Duration) -> Option<String> {
    if lease_ms == 0 {
        return Some(format!(
            "the replicator has taken nothing from the primary for {quiet:?}, but the primary's \
             lease is not known (it runs without one, lease_ms = 0, or it never answered this \
             mirror): it may still acknowledge changes, so this mirror does not promote itself; \
             promote it by hand (`strait mirror promote`) once the old primary is known to be \
             down, or give the primary a lease"
        ));
    }
    let lease = Duration::from_millis(lease_ms) + LEASE_MARGIN;
    (quiet < lease).then(|| {
        format!("the primary's lease of {lease_ms} ms has not run out yet ({quiet:?} of silence)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn automatic_failover_needs_a_lease_known_and_run_out() {
        let s = Duration::from_secs;
        // no lease: never, however long the silence
        assert!(lease_refusal(0, s(3600)).unwrap().contains("not known"));
        // a 2 s lease: not within it (and its margin), then yes
        assert!(lease_refusal(2000, s(2)).is_some());
        assert!(lease_refusal(2000, Duration::from_millis(2400)).is_some());
        assert_eq!(lease_refusal(2000, s(3)), None);
    }

    #[test]
    fn silence_counts_from_the_first_answer_that_shows_the_same() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut s = Silence::default();
        let beat = |c, v| (Some((c, v)), v, 0);
        assert_eq!(s.observe(beat(1, 5), at(0)), Duration::ZERO);
        assert_eq!(s.observe(beat(1, 5), at(300)), Duration::from_millis(300));
        // a heartbeat: the primary was heard, counting starts again
        assert_eq!(s.observe(beat(2, 5), at(400)), Duration::ZERO);
        // an append without a heartbeat in between also counts as heard
        assert_eq!(s.observe((Some((2, 5)), 6, 0), at(500)), Duration::ZERO);
        // no answer for a while (not observed), then the same state: silent since 500
        assert_eq!(
            s.observe((Some((2, 5)), 6, 0), at(3500)),
            Duration::from_millis(3000)
        );
        // another epoch (someone promoted): heard
        assert_eq!(s.observe((Some((2, 5)), 6, 1), at(3600)), Duration::ZERO);
    }
}
