//! The mirror's site service: its snapshot, its digest at a chosen version (what
//! `fsck --compare` checks prefix consistency with), and its status.

use std::sync::Arc;
use std::time::Duration;

use strait_fs_core::clock::now_ms;
use strait_fs_core::Version;
use strait_proto::site as s;
use strait_proto::site::site_service_server::SiteService;
use strait_server::snapshot::{digest_now, snapshot_stream, SnapshotStream};
use tonic::{Request, Response, Status};

use crate::state::{Mirror, Phase};

/// Longest wait for the mirror to reach a requested digest version.
pub const DIGEST_TIMEOUT_MS_MAX: u64 = 600_000;

/// Longest pause.
/// The longest pause: a forgotten one lifts by itself.
pub const PAUSE_MS_MAX: u64 = 3_600_000;

pub struct MirrorSite {
    pub mirror: Arc<Mirror>,
    /// What `Promote` runs (None until the daemon has opened its engine).
    pub promoter: Option<Arc<crate::promote::Promoter>>,
    /// One digest at a time.
    pub holding: tokio::sync::Mutex<()>,
    /// Bumped by every pause and digest, so that a pause's timer lifts only its own hold.
    pub generation: Arc<std::sync::atomic::AtomicU64>,
}

impl MirrorSite {
    pub fn new(mirror: Arc<Mirror>) -> Self {
        MirrorSite {
            mirror,
            promoter: None,
            holding: tokio::sync::Mutex::new(()),
            generation: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        }
    }
}

/// Progress messages of a warm-up waiting for a slow reader.
const WARMUP_QUEUE_MAX: usize = 4;
/// How often a warm-up's progress is sent.
const WARMUP_PROGRESS_EVERY: Duration = Duration::from_secs(1);

pub use strait_server::WarmupStream;

#[tonic::async_trait]
impl SiteService for MirrorSite {
    type SnapshotStream = SnapshotStream;
    type SweepOrphansStream = strait_server::orphans::SweepStream;
    type WarmupStream = WarmupStream;

    /// The blocks of the files under the paths, copied into this region's store now
    /// (crate::blocks::warmup).
    async fn warmup(
        &self,
        req: Request<s::WarmupRequest>,
    ) -> Result<Response<Self::WarmupStream>, Status> {
        use crate::blocks::WarmupError;
        let r = req.into_inner();
        if self.mirror.phase() == Phase::Bootstrapping {
            return Err(Status::unavailable(
                "the mirror is loading a snapshot: its metadata does not list the files yet",
            ));
        }
        let blocks = self.mirror.blocks.clone();
        let paths = r.paths.clone();
        let listed = tokio::task::spawn_blocking(move || blocks.warmup_list(&paths))
            .await
            .map_err(|e| Status::internal(format!("list the blocks to warm up: {e}")))?;
        let (files, list) = listed.map_err(|e| match e {
            WarmupError::NotFound(m) => Status::not_found(m),
            WarmupError::Invalid(m) => Status::invalid_argument(m),
            WarmupError::Failed(m) => Status::internal(format!("list the blocks to warm up: {m}")),
        })?;
        let state = self
            .mirror
            .blocks
            .start_warmup(r.paths.clone(), files, list, now_ms())
            .map_err(|running| {
                Status::failed_precondition(format!(
                    "a warm-up of {} runs ({} of {} blocks done): one at a time; `strait mirror status` shows it",
                    running.paths.join(" "),
                    running.present_blocks + running.copied_blocks + running.failed_blocks,
                    running.blocks
                ))
            })?;
        tracing::info!(
            "warm-up of {}: {} files, {} blocks",
            r.paths.join(" "),
            files,
            state.lock().blocks
        );
        let (tx, rx) = tokio::sync::mpsc::channel(WARMUP_QUEUE_MAX);
        let background = r.background;
        tokio::spawn(async move {
            let mut last_sent: Option<std::time::Instant> = None;
            loop {
                let now = state.lock().clone();
                let due = last_sent.is_none_or(|t| t.elapsed() >= WARMUP_PROGRESS_EVERY);
                if due || now.done || background {
                    if tx.send(Ok(now.wire())).await.is_err() {
                        return; // the caller left; the warm-up goes on
                    }
                    last_sent = Some(std::time::Instant::now());
                }
                if now.done || background {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    /// This region's store against this mirror's own metadata: its copies of slices it
    /// references stay, and so do blocks its mounts are writing (younger than the grace).
    async fn sweep_orphans(
        &self,
        req: Request<s::SweepRequest>,
    ) -> Result<Response<Self::SweepOrphansStream>, Status> {
        let Some(store) = self.mirror.blocks.local_store() else {
            return Err(Status::failed_precondition(
                "this mirror has no object store of its own (data_url is empty): its mounts use the primary's; sweep the primary",
            ));
        };
        if self.mirror.phase() == Phase::Bootstrapping {
            return Err(Status::unavailable(
                "the mirror is loading a snapshot: its metadata does not yet say which blocks it references",
            ));
        }
        let gate: strait_server::orphans::Gate = if self.mirror.promoted() {
            // the primary now: it sweeps only while it is the primary the log goes on with
            let Some(gc) = self.promoter.as_ref().and_then(|p| p.gc.get()) else {
                return Err(Status::failed_precondition(
                    "this promoted mirror deletes no blocks (it has no store of its own)",
                ));
            };
            if let Some(why) = gc.horizon.lock().await.refused().await {
                return Err(Status::failed_precondition(format!(
                    "this primary deletes no object now: {why}"
                )));
            }
            let Some(p) = self.promoter.clone() else {
                return Err(Status::unavailable("the mirror is still starting"));
            };
            Arc::new(move || p.engine.deletions_refused())
        } else {
            // a mirror's metadata names what it has applied: a sweep against metadata behind
            // the primary's deletes blocks the primary committed since (written here by a
            // forwarded write, or copied)
            if let Some(why) = sweep_refused(&self.mirror) {
                return Err(Status::failed_precondition(why));
            }
            match self
                .mirror
                .blocks
                .shared_with_a_primary(&self.mirror.cfg.id)
                .await
            {
                Ok(None) => {}
                Ok(Some(url)) => {
                    return Err(Status::failed_precondition(format!(
                        "this region's store is also the primary's ({url}: the marker this mirror \
                         wrote to its store is there): a mirror's metadata is behind the \
                         primary's, so its sweep would delete blocks the primary committed since; \
                         sweep through the primary"
                    )))
                }
                Err(why) => {
                    return Err(Status::unavailable(format!(
                        "cannot tell whether this region's store is also the primary's, so \
                         nothing is swept: {why}"
                    )))
                }
            }
            let mirror = self.mirror.clone();
            Arc::new(move || sweep_refused(&mirror))
        };
        let blocks = self.mirror.blocks.clone();
        let stream = strait_server::orphans::sweep_stream(
            self.mirror.kv.clone(),
            store,
            req.into_inner(),
            Some(Arc::new(crate::blocks::add_queued_deletions)),
            Some(Arc::new(move |gone: Vec<_>| blocks.unmark_all(&gone))),
            gate,
        )?;
        Ok(Response::new(stream))
    }

    async fn snapshot(&self, _req: Request<s::Empty>) -> Result<Response<SnapshotStream>, Status> {
        Ok(Response::new(snapshot_stream(self.mirror.kv.clone())))
    }

    async fn digest(
        &self,
        req: Request<s::DigestRequest>,
    ) -> Result<Response<s::DigestReply>, Status> {
        let r = req.into_inner();
        let kv = self.mirror.kv.clone();
        let at = Version(r.at_version);
        if self.mirror.promoted() {
            // the primary now: it answers at its current version only, as a primary does
            let (digest, version) = digest_now(kv).await?;
            if at != Version::ZERO && at != version {
                return Err(Status::failed_precondition(format!(
                    "this mirror was promoted to primary and is at version {version}, not {at}: \
                     it answers at its current version only"
                )));
            }
            return Ok(Response::new(s::DigestReply {
                digest,
                version: version.0,
            }));
        }
        if at == Version::ZERO {
            let (digest, version) = digest_now(kv).await?;
            return Ok(Response::new(s::DigestReply {
                digest,
                version: version.0,
            }));
        }
        let timeout = Duration::from_millis(match r.timeout_ms {
            0 => 30_000,
            t => t.min(DIGEST_TIMEOUT_MS_MAX),
        });
        let _one = self.holding.lock().await;
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // stop the applier at `at` (it may already be past it: then the version is gone)
        {
            let _g = self.mirror.apply_lock.lock().await;
            *self.mirror.hold.lock() = Some(at);
        }
        let release = Release(&self.mirror);
        let mut changed = self.mirror.changed.subscribe();
        let reached = tokio::time::timeout(timeout, async {
            loop {
                let applied = self.mirror.applied();
                if applied >= at {
                    return applied;
                }
                let _ = tokio::time::timeout(Duration::from_millis(50), changed.changed()).await;
            }
        })
        .await;
        let applied = match reached {
            Ok(a) => a,
            Err(_) => {
                return Err(Status::deadline_exceeded(format!(
                    "the mirror did not reach version {at} within {timeout:?} (it is at {})",
                    self.mirror.applied()
                )))
            }
        };
        if applied > at {
            return Err(Status::failed_precondition(format!(
                "the mirror is already at version {applied}, past {at}"
            )));
        }
        let (digest, version) = digest_now(kv).await?;
        drop(release);
        if version != at {
            return Err(Status::internal(format!(
                "the digest was taken at version {version}, not {at}"
            )));
        }
        Ok(Response::new(s::DigestReply {
            digest,
            version: version.0,
        }))
    }

    async fn gc(&self, _req: Request<s::Empty>) -> Result<Response<s::GcReply>, Status> {
        // promoted, with a store of its own: as the primary does
        if let Some(p) = &self.promoter {
            if let Some(gc) = p.gc.get() {
                return Ok(Response::new(gc.on_demand(&p.engine).await?));
            }
        }
        Err(Status::unimplemented(
            "a mirror deletes its copies of a slice's blocks when it applies the primary's purge; run gc against the primary",
        ))
    }

    async fn pause(
        &self,
        req: Request<s::PauseRequest>,
    ) -> Result<Response<s::PauseReply>, Status> {
        let hold_ms = req.into_inner().hold_ms;
        if hold_ms == 0 {
            // resume: lift any hold now
            let _g = self.mirror.apply_lock.lock().await;
            self.generation
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let applied = self.mirror.applied();
            drop(Release(&self.mirror));
            return Ok(Response::new(s::PauseReply {
                applied_version: applied.0,
            }));
        }
        if hold_ms > PAUSE_MS_MAX {
            return Err(Status::invalid_argument(format!(
                "a pause of {hold_ms} ms: at most {PAUSE_MS_MAX} ms"
            )));
        }
        // under the apply lock no batch is in flight: the mirror stops exactly here
        let (gen, applied) = {
            let _g = self.mirror.apply_lock.lock().await;
            let applied = self.mirror.applied();
            *self.mirror.hold.lock() = Some(applied);
            let gen = self
                .generation
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                + 1;
            (gen, applied)
        };
        let mirror = self.mirror.clone();
        let generation = self.generation.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(hold_ms)).await;
            if generation.load(std::sync::atomic::Ordering::SeqCst) == gen {
                drop(Release(&mirror));
            }
        });
        Ok(Response::new(s::PauseReply {
            applied_version: applied.0,
        }))
    }

    async fn promote(
        &self,
        req: Request<s::PromoteRequest>,
    ) -> Result<Response<s::PromoteReply>, Status> {
        let Some(p) = &self.promoter else {
            return Err(Status::unavailable(
                "the mirror is still starting: try again in a moment",
            ));
        };
        let r = req.into_inner();
        let timeout = match r.timeout_ms {
            0 => crate::promote::DRAIN_TIMEOUT_DEFAULT,
            t => Duration::from_millis(t.min(DIGEST_TIMEOUT_MS_MAX)),
        };
        // a planned promotion differs only before this call (`Handover` at the old primary)
        let promotion = p.promote(timeout).await?;
        Ok(Response::new(s::PromoteReply {
            promotion: Some(promotion),
        }))
    }

    async fn handover(
        &self,
        req: Request<s::HandoverRequest>,
    ) -> Result<Response<s::HandoverReply>, Status> {
        match &self.promoter {
            Some(p) if self.mirror.promoted() => {
                p.hand_over(req.into_inner()).await.map(Response::new)
            }
            _ => Err(Status::failed_precondition(
                "a mirror hands nothing over: Handover is the primary's call",
            )),
        }
    }

    async fn status(&self, _req: Request<s::Empty>) -> Result<Response<s::SiteStatus>, Status> {
        let mut m = self.mirror.status();
        let promoted = self.mirror.promoted();
        // a promoted mirror's own lease, now
        let lease = match &self.promoter {
            Some(p) if promoted => p.lease_left().unwrap_or_default(),
            _ => Default::default(),
        };
        if promoted {
            m.lease_ms = lease.0.as_millis() as u64;
            m.lease_left_ms = lease.1.as_millis() as u64;
        }
        let version = if promoted {
            let kv = self.mirror.kv.clone();
            tokio::task::spawn_blocking(move || kv.last_version())
                .await
                .ok()
                .and_then(|r| r.ok())
                .unwrap_or(Version(m.applied_version))
        } else {
            Version(m.applied_version)
        };
        let name = tokio::task::spawn_blocking({
            let kv = self.mirror.kv.clone();
            move || strait_fs_core::meta::Meta::load_format(kv.as_ref()).map(|f| f.name)
        })
        .await
        .ok()
        .and_then(|r| r.ok())
        .unwrap_or_default();
        let epoch = m.epoch;
        Ok(Response::new(s::SiteStatus {
            role: if promoted { "primary" } else { "mirror" }.into(),
            name,
            version: version.0,
            clock_ms: now_ms(),
            replicator: self.mirror.cfg.replicator.clone(),
            mirror: Some(m),
            lease_ms: lease.0.as_millis() as u64,
            lease_left_ms: lease.1.as_millis() as u64,
            epoch,
            fenced: self.mirror.fenced().unwrap_or_default(),
        }))
    }
}

/// Why a mirror (not promoted) may not sweep its store now: unless it follows within its
/// window, unpaused, its metadata may lack slices whose blocks are in its store already.
fn sweep_refused(mirror: &Mirror) -> Option<String> {
    if mirror.promoted() {
        return None;
    }
    // what reads ask of it too: following the log, its lag known and within the window (its
    // state may say `disconnected` for a quiet subscription all the same)
    if !mirror.fresh() {
        let lag = mirror.lag();
        let cfg = &mirror.cfg;
        let state = crate::state::state_name(mirror.phase(), &lag, cfg.window_ms, cfg.silence_ms);
        return Some(format!(
            "the mirror is {state} (lag {} ms, window {} ms): its metadata may be behind the \
             blocks in its store, so it sweeps only while it follows within its window",
            lag.ms, cfg.window_ms
        ));
    }
    if let Some(at) = *mirror.hold.lock() {
        return Some(format!(
            "the mirror is paused at version {at}: its metadata is behind the blocks in its \
             store, so it sweeps only while it follows (strait mirror resume)"
        ));
    }
    None
}

/// Lifts the digest hold when dropped (also when the call is cancelled).
struct Release<'a>(&'a Mirror);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        *self.0.hold.lock() = None;
        self.0.changed.send_modify(|v| *v = v.wrapping_add(1));
    }
}
