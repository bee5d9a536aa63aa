//! Deleting dead slices' blocks at a primary that has mirrors (docs/changelog.md, "Garbage collection across regions"; docs/guarantees.md §7).
//!
//! A slice dies at some version `v` (an unlink, a truncate, a compaction). A mirror whose
//! applied version is below `v` still references it, and its mounts may read its blocks from
//! the primary's store at any moment. So the primary deletes a dead slice's blocks only once
//! every registered mirror's cursor at the replicator is at or past `v`, and a grace delay
//! has passed since (for reads a mirror's mounts started just before it applied `v`).
//!
//! Dead slices do not record the version that freed them; the pass bounds it instead: every
//! slice listed dead was freed at a version no later than the primary's version read right
//! after the listing. That bound is remembered per slice from the first pass that saw it,
//! so a busy primary still makes progress. Forgetting it (a restart) only delays deletion.
//!
//! Without a replicator there are no mirrors and nothing to wait for. With one that cannot
//! be asked, or whose answering node is not the leader, the pass deletes nothing.
//!
//! The file system's gc delay is measured on a wall clock that cannot run ahead of the
//! monotonic clock between passes ([`SteadyWall`]), so a system clock stepped forward does
//! not delete blocks early.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strait_fs_core::meta::{DeletionGate, Meta};
use strait_fs_core::object::DynStore;
use strait_fs_core::{Epoch, SliceId, Version};
use strait_proto::replicator as pb;
use strait_replicator_client::{Credentials, LogClient};
use strait_server::metrics::Metrics;
use tokio_util::sync::CancellationToken;

/// Dead slices whose bound is remembered; beyond it the memory starts again (safe: a slice
/// seen again gets a newer bound).
const REMEMBERED_MAX: usize = 1_000_000;

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// Dead slices whose blocks were deleted.
    pub purged: usize,
    /// Dead slices kept because some mirror has not applied past their death (or the grace
    /// delay since it did has not passed).
    pub held: usize,
    /// The lowest applied version among the mirrors' cursors (None: no mirror registered).
    pub horizon: Option<Version>,
    /// Why the pass deleted nothing at all: this primary may not delete now, or the mirrors'
    /// cursors could not be read.
    pub refused: Option<String>,
}

/// What the passes remember of the dead slices they listed: the decision of the GC horizon,
/// without I/O (the pass brings the versions and the time).
#[derive(Debug, Default)]
struct DeadSlices {
    /// slice id -> (a version at or after its death, when every mirror got there)
    seen: HashMap<SliceId, (Version, Option<Instant>)>,
}

impl DeadSlices {
    /// Whether dead slice `id` may be deleted at `now`, with `horizon` the lowest applied
    /// version among the mirrors and `died_by` a version read after the slice was listed dead
    /// (the first one given for a slice is kept: later ones are only looser bounds). It may
    /// go once every mirror has applied `died_by` and `grace` has passed since that was first
    /// seen.
    fn may_delete(
        &mut self,
        id: SliceId,
        died_by: Version,
        horizon: Version,
        now: Instant,
        grace: Duration,
    ) -> bool {
        let entry = self.seen.entry(id).or_insert((died_by, None));
        if horizon < entry.0 {
            return false;
        }
        let passed = *entry.1.get_or_insert(now);
        now.duration_since(passed) >= grace
    }

    /// Keep only the slices still listed dead (the others are purged, here or elsewhere).
    fn retain_listed(&mut self, listed: &[SliceId]) {
        let listed: std::collections::HashSet<SliceId> = listed.iter().copied().collect();
        self.seen.retain(|id, _| listed.contains(id));
    }

    /// Forget everything when the memory has grown past [`REMEMBERED_MAX`] (safe: a slice
    /// seen again gets a newer bound, which only delays its deletion).
    fn bound_memory(&mut self) {
        if self.seen.len() > REMEMBERED_MAX {
            self.seen.clear();
        }
    }
}

/// A wall clock (ns) that follows the system's but never runs ahead of the monotonic clock
/// since the last reading: a step forward of the system clock is absorbed (a step back is
/// followed, which only delays deletions). The gc delay is measured on it, so a clock stepped
/// forward does not delete blocks early.
#[derive(Debug, Default)]
struct SteadyWall {
    last: Option<(i64, Instant)>,
}

impl SteadyWall {
    fn now(&mut self, wall: i64, mono: Instant) -> i64 {
        let t = match self.last {
            Some((prev, at)) => {
                let elapsed = i64::try_from(mono.duration_since(at).as_nanos()).unwrap_or(i64::MAX);
                wall.min(prev.saturating_add(elapsed))
            }
            None => wall,
        };
        self.last = Some((t, mono));
        t
    }
}

/// The mirrors' horizon, remembered between passes.
pub struct MirrorHorizon {
    client: Option<LogClient>,
    /// The epoch this primary ships at: a pass deletes nothing unless the replicator's
    /// leader is at it (None: no check, a primary with no replicator).
    epoch: Option<Epoch>,
    /// Asked before every pass (a primary's shipper: fenced, diverged, not compared yet, its
    /// lease run out); Some(why) deletes nothing.
    gate: Option<DeletionGate>,
    grace: Duration,
    seen: DeadSlices,
    /// Said once until it changes, so a cut-off replicator does not flood the log.
    last_problem: Option<String>,
    clock: SteadyWall,
}

impl MirrorHorizon {
    pub fn new(
        replicator: &[String],
        creds: &Credentials,
        grace: Duration,
    ) -> anyhow::Result<Self> {
        let client = if replicator.is_empty() {
            None
        } else {
            Some(
                LogClient::new(replicator, creds)
                    .map_err(|s| anyhow::anyhow!("{}", s.message()))?
                    .with_attempts(2),
            )
        };
        Ok(MirrorHorizon {
            client,
            epoch: None,
            gate: None,
            grace,
            seen: DeadSlices::default(),
            last_problem: None,
            clock: SteadyWall::default(),
        })
    }

    /// Delete only while this primary is the one the replicator's log goes on with: its
    /// shipper's `gate` allows it, and the leader is at `epoch`.
    pub fn for_primary(mut self, epoch: Epoch, gate: DeletionGate) -> Self {
        self.epoch = Some(epoch);
        self.gate = Some(gate);
        self
    }

    /// Why this primary may delete nothing now (its gate, or a leader at another epoch),
    /// asked of the replicator's leader; None: it may. A sweep of orphan objects asks too.
    pub async fn refused(&self) -> Option<String> {
        if let Some(why) = self.gate.as_ref().and_then(|g| g()) {
            return Some(why);
        }
        let (Some(client), Some(epoch)) = (&self.client, self.epoch) else {
            return None;
        };
        match client.leader_status().await {
            Ok(st) => epoch_refusal(epoch, Epoch(st.epoch)),
            Err(s) => Some(format!(
                "the replicator's leader cannot be asked for its epoch: {}",
                s.message()
            )),
        }
    }

    /// The lowest cursor of the mirrors that hold the log back: Ok(None) when there is no
    /// replicator or no mirror. Mirrors marked for re-bootstrap reference nothing the
    /// primary must keep: they load a fresh snapshot. Err when this primary may delete
    /// nothing (see [`Self::refused`]).
    async fn lowest_cursor(&self) -> Result<Option<Version>, String> {
        if let Some(why) = self.gate.as_ref().and_then(|g| g()) {
            return Err(why);
        }
        let Some(client) = &self.client else {
            return Ok(None);
        };
        // the leader's own cursors: a follower's may be behind
        let st = client.leader_status().await.map_err(|s| {
            format!(
                "ask the replicator's leader for the mirrors' cursors: {}",
                s.message()
            )
        })?;
        // the cursors count versions of the history that goes on: a primary superseded
        // (or not yet at its epoch) compares its own versions with another history's
        if let Some(why) = self.epoch.and_then(|e| epoch_refusal(e, Epoch(st.epoch))) {
            return Err(why);
        }
        Ok(st
            .cursors
            .iter()
            // the primary's own durable mark is no mirror's position
            .filter(|c| !c.needs_bootstrap && c.mirror != pb::PRIMARY_CURSOR)
            .map(|c| Version(c.applied_version))
            .min())
    }

    /// One pass: delete what no mirror needs any more.
    pub async fn pass(
        &mut self,
        engine: &Arc<Meta>,
        store: &DynStore,
    ) -> strait_fs_core::Result<Pass> {
        let horizon = match self.lowest_cursor().await {
            Ok(h) => {
                if self.last_problem.take().is_some() {
                    tracing::info!(
                        "the mirrors' cursors can be read again: dead blocks are deleted again"
                    );
                }
                h
            }
            Err(why) => {
                if self.last_problem.as_deref() != Some(why.as_str()) {
                    tracing::warn!("no dead block is deleted until this is fixed: {why}");
                    self.last_problem = Some(why.clone());
                }
                return Ok(Pass {
                    refused: Some(why),
                    ..Pass::default()
                });
            }
        };
        let e = engine.clone();
        let s = store.clone();
        let rt = tokio::runtime::Handle::current();
        let mut seen = std::mem::take(&mut self.seen);
        seen.bound_memory();
        let grace = self.grace;
        let mirrors = self.client.is_some() && horizon.is_some();
        let wall = self
            .clock
            .now(strait_fs_core::clock::now_ns(), Instant::now());
        let r = tokio::task::spawn_blocking(move || {
            let now = Instant::now();
            let mut bound: Option<Version> = None;
            let mut held = 0;
            let mut listed = vec![];
            let r = strait_fs_core::vfs::gc::gc_once_with(&e, &s, &rt, wall, &mut |id| {
                listed.push(id);
                let Some(h) = horizon.filter(|_| mirrors) else {
                    return true;
                };
                // read after the listing: every listed slice died at or before it
                let b = match bound {
                    Some(b) => b,
                    None => match e.kv().last_version() {
                        Ok(v) => *bound.insert(v),
                        Err(err) => {
                            tracing::warn!("read the primary's version for GC: {err}");
                            held += 1;
                            return false;
                        }
                    },
                };
                if !seen.may_delete(id, b, h, now, grace) {
                    held += 1;
                    return false;
                }
                true
            });
            // forget the slices that are gone (purged here or by another pass)
            seen.retain_listed(&listed);
            (r, held, seen)
        })
        .await
        .map_err(|e| strait_fs_core::Error::Meta(format!("the GC task failed: {e}")))?;
        let (r, held, seen) = r;
        self.seen = seen;
        let purged = r?;
        Ok(Pass {
            purged,
            held,
            horizon,
            refused: None,
        })
    }
}

/// Why a primary shipping at `own` may delete nothing while the replicator's leader is at
/// `log` (None: the same epoch).
fn epoch_refusal(own: Epoch, log: Epoch) -> Option<String> {
    match log.cmp(&own) {
        std::cmp::Ordering::Equal => None,
        std::cmp::Ordering::Greater => Some(format!(
            "the replicator's log is at epoch {log}, this primary's is {own}: another primary \
             was promoted, and what died only in this primary's history may be live in the one \
             that went on"
        )),
        std::cmp::Ordering::Less => Some(format!(
            "the replicator's log is at epoch {log}, below this primary's {own}: it has not \
             taken this primary's epoch yet"
        )),
    }
}

/// What an on-demand GC pass (`strait gc` against the daemon) needs.
pub struct Gc {
    pub horizon: Arc<tokio::sync::Mutex<MirrorHorizon>>,
    pub store: DynStore,
    pub metrics: Arc<Metrics>,
}

impl Gc {
    /// The primary role's GC, as both `strait primary` and a promoted mirror run it: deletes
    /// dead slices' blocks from `store` once every mirror the replicator at `replicator`
    /// knows is past their death (plus `grace`); fenced (`fence`: the epoch this primary
    /// ships at and its deletion gate), it deletes nothing. A pass every `interval` (None:
    /// only on demand, `strait gc`) as the worker "gc".
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        engine: Arc<Meta>,
        store: DynStore,
        replicator: &[String],
        creds: &Credentials,
        grace: Duration,
        fence: Option<(Epoch, DeletionGate)>,
        interval: Option<Duration>,
        workers: &strait_server::workers::Workers,
        stop: &CancellationToken,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Gc> {
        let mut horizon = MirrorHorizon::new(replicator, creds, grace)?;
        if let Some((epoch, gate)) = fence {
            horizon = horizon.for_primary(epoch, gate);
        }
        let horizon = Arc::new(tokio::sync::Mutex::new(horizon));
        if let Some(period) = interval {
            workers.spawn(
                "gc",
                stop,
                run(
                    engine,
                    store.clone(),
                    horizon.clone(),
                    period,
                    stop.clone(),
                    metrics.clone(),
                ),
            );
        }
        Ok(Gc {
            horizon,
            store,
            metrics,
        })
    }

    /// One pass now (the site service's `Gc`).
    pub async fn on_demand(
        &self,
        engine: &Arc<Meta>,
    ) -> Result<strait_proto::site::GcReply, tonic::Status> {
        let p = self
            .horizon
            .lock()
            .await
            .pass(engine, &self.store)
            .await
            .map_err(strait_server::snapshot::engine_status)?;
        if let Some(why) = p.refused {
            return Err(tonic::Status::failed_precondition(format!(
                "this daemon deletes no dead block now: {why}"
            )));
        }
        self.metrics.slices_collected.inc_by(p.purged as u64);
        self.metrics.gc_held.set(p.held as i64);
        tracing::info!(
            "GC on demand: deleted the blocks of {} dead slices, kept {} for mirrors",
            p.purged,
            p.held
        );
        Ok(strait_proto::site::GcReply {
            purged: p.purged as u64,
            held: p.held as u64,
            horizon: p.horizon.unwrap_or(Version::ZERO).0,
            has_mirrors: p.horizon.is_some(),
        })
    }
}

/// Delete dead slices' blocks from `store`: a pass every `period` (sooner while a pass finds
/// more), until `stop`.
pub async fn run(
    engine: Arc<Meta>,
    store: DynStore,
    gc: Arc<tokio::sync::Mutex<MirrorHorizon>>,
    period: Duration,
    stop: CancellationToken,
    metrics: Arc<Metrics>,
) {
    let mut pause = period;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        let r = gc.lock().await.pass(&engine, &store).await;
        pause = period;
        match r {
            Ok(p) => {
                metrics.slices_collected.inc_by(p.purged as u64);
                metrics.gc_held.set(p.held as i64);
                if p.purged > 0 {
                    tracing::info!("deleted the blocks of {} dead slices", p.purged);
                }
                pause = strait_fs_core::vfs::gc::next_pass_in(p.purged + p.held, p.purged, period);
            }
            Err(e) => tracing::warn!("delete dead slices: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(30);

    #[test]
    fn a_mirror_behind_the_death_holds_the_slice() {
        // the slice died by version 10; the slowest mirror has applied 9
        let mut d = DeadSlices::default();
        let t0 = Instant::now();
        assert!(!d.may_delete(SliceId(7), Version(10), Version(9), t0, GRACE));
        // still held much later while the mirror does not move
        assert!(!d.may_delete(SliceId(7), Version(10), Version(9), t0 + 10 * GRACE, GRACE));
    }

    #[test]
    fn the_grace_delay_counts_from_when_every_mirror_got_there() {
        let mut d = DeadSlices::default();
        let t0 = Instant::now();
        // behind for a long time: the waiting does not count towards the grace delay
        assert!(!d.may_delete(SliceId(7), Version(10), Version(5), t0, GRACE));
        let t1 = t0 + 5 * GRACE;
        // every mirror at the death's version: held for the grace delay from now
        assert!(!d.may_delete(SliceId(7), Version(10), Version(10), t1, GRACE));
        assert!(!d.may_delete(
            SliceId(7),
            Version(10),
            Version(12),
            t1 + GRACE - Duration::from_millis(1),
            GRACE
        ));
        assert!(d.may_delete(SliceId(7), Version(10), Version(12), t1 + GRACE, GRACE));
    }

    #[test]
    fn without_grace_a_slice_goes_as_soon_as_every_mirror_is_past() {
        let mut d = DeadSlices::default();
        let t0 = Instant::now();
        assert!(d.may_delete(SliceId(7), Version(10), Version(10), t0, Duration::ZERO));
        assert!(d.may_delete(SliceId(8), Version(10), Version(11), t0, Duration::ZERO));
    }

    #[test]
    fn the_first_bound_is_kept() {
        // the first pass bounded the death by version 10; a later pass reads 50 (the primary
        // moved on): the slice still goes once the mirrors pass 10, not 50
        let mut d = DeadSlices::default();
        let t0 = Instant::now();
        assert!(!d.may_delete(SliceId(7), Version(10), Version(8), t0, Duration::ZERO));
        assert!(d.may_delete(SliceId(7), Version(50), Version(10), t0, Duration::ZERO));
    }

    #[test]
    fn a_mirror_going_back_holds_the_slice_again() {
        // a mirror's cursor below the bound again (a new mirror registered at an older
        // version): held, although the grace delay had started
        let mut d = DeadSlices::default();
        let t0 = Instant::now();
        assert!(!d.may_delete(SliceId(7), Version(10), Version(10), t0, GRACE));
        assert!(!d.may_delete(SliceId(7), Version(10), Version(3), t0 + 2 * GRACE, GRACE));
    }

    #[test]
    fn the_gc_clock_absorbs_a_step_forward_and_follows_a_step_back() {
        let mut c = SteadyWall::default();
        let t0 = Instant::now();
        let s = 1_000_000_000i64;
        assert_eq!(c.now(1000 * s, t0), 1000 * s);
        // 10 s later the system clock says an hour later: the gc clock says 10 s later
        assert_eq!(c.now(4600 * s, t0 + Duration::from_secs(10)), 1010 * s);
        // and runs on from there, by the monotonic clock
        assert_eq!(c.now(4610 * s, t0 + Duration::from_secs(20)), 1020 * s);
        // a step back is followed
        assert_eq!(c.now(900 * s, t0 + Duration::from_secs(30)), 900 * s);
    }

    #[test]
    fn slices_no_longer_listed_are_forgotten() {
        let mut d = DeadSlices::default();
        let t0 = Instant::now();
        d.may_delete(SliceId(7), Version(10), Version(10), t0, GRACE);
        d.may_delete(SliceId(8), Version(10), Version(10), t0, GRACE);
        d.retain_listed(&[SliceId(8)]);
        assert_eq!(d.seen.keys().copied().collect::<Vec<_>>(), vec![SliceId(8)]);
        // slice 7, listed again, starts over with a new bound and a new grace delay
        assert!(!d.may_delete(SliceId(7), Version(20), Version(15), t0 + 2 * GRACE, GRACE));
    }
}
