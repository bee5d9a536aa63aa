//! The site service of the primary: metadata snapshots for mirrors to bootstrap from, the
//! metadata digest (both streamed by [`strait_site::snapshot`]), GC on demand, and the
//! primary's status.

use std::sync::Arc;

use strait_fs_core::meta::Meta;
use strait_fs_core::Version;
use strait_proto::site as s;
use strait_proto::site::site_service_server::SiteService;
use strait_site::now_ms;
use strait_site::snapshot::{digest_now, engine_status, snapshot_stream, SnapshotStream};
use tonic::{Request, Response, Status};

/// The primary's site service.
pub struct PrimarySite {
    pub engine: Arc<Meta>,
    pub replicator: Vec<String>,
    /// Deleting dead blocks (None: read-only, or the object store could not be opened).
    pub gc: Option<strait_ship::gc::Gc>,
    /// What the replicator holds (None: this primary ships nothing).
    pub shipped: Option<tokio::sync::watch::Receiver<strait_ship::shipper::Shipped>>,
    pub handover: Arc<strait_ship::fence::Handover>,
}

/// How long `Handover` refuses calls and waits for the replicator, unless asked otherwise.
const HANDOVER_DEFAULT_MS: u64 = 30_000;
/// The longest hold a `Handover` takes.
const HANDOVER_HOLD_MS_MAX: u64 = 600_000;
/// The version must stay the same this long before a handover answers: calls that passed
/// the fence before the handover began commit first.
const HANDOVER_QUIET: std::time::Duration = std::time::Duration::from_millis(100);

#[tonic::async_trait]
impl SiteService for PrimarySite {
    type SnapshotStream = SnapshotStream;
    type SweepOrphansStream = strait_site::orphans::SweepStream;

    async fn sweep_orphans(
        &self,
        req: Request<s::SweepRequest>,
    ) -> Result<Response<Self::SweepOrphansStream>, Status> {
        let Some(gc) = &self.gc else {
            return Err(Status::failed_precondition(
                "this primary deletes no blocks: it is read-only, or its object store could not be opened (see its log)",
            ));
        };
        let stream = strait_site::orphans::sweep_stream(
            self.engine.kv().clone(),
            gc.store.clone(),
            req.into_inner(),
            None,
        )?;
        Ok(Response::new(stream))
    }

    async fn snapshot(&self, _req: Request<s::Empty>) -> Result<Response<SnapshotStream>, Status> {
        Ok(Response::new(snapshot_stream(self.engine.kv().clone())))
    }

    async fn digest(
        &self,
        req: Request<s::DigestRequest>,
    ) -> Result<Response<s::DigestReply>, Status> {
        let at = Version(req.into_inner().at_version);
        let (digest, version) = digest_now(self.engine.kv().clone()).await?;
        if at != Version::ZERO && at != version {
            return Err(Status::failed_precondition(format!(
                "the primary is at version {version}, not {at}: it answers at its current version only"
            )));
        }
        Ok(Response::new(s::DigestReply {
            digest,
            version: version.0,
        }))
    }

    async fn pause(
        &self,
        _req: Request<s::PauseRequest>,
    ) -> Result<Response<s::PauseReply>, Status> {
        Err(Status::unimplemented(
            "the primary never pauses: Pause is a mirror's call",
        ))
    }

    async fn handover(
        &self,
        req: Request<s::HandoverRequest>,
    ) -> Result<Response<s::HandoverReply>, Status> {
        let r = req.into_inner();
        let Some(shipped) = &self.shipped else {
            return Err(Status::failed_precondition(
                "this primary ships no change log (no replicator): no mirror can take over",
            ));
        };
        if let Some(why) = &shipped.borrow().fenced {
            return Err(Status::failed_precondition(format!(
                "this primary is fenced already: {why}"
            )));
        }
        let ms =
            |v: u64| std::time::Duration::from_millis(if v == 0 { HANDOVER_DEFAULT_MS } else { v });
        if r.hold_ms > HANDOVER_HOLD_MS_MAX {
            return Err(Status::invalid_argument(format!(
                "hold_ms {}: at most {HANDOVER_HOLD_MS_MAX}",
                r.hold_ms
            )));
        }
        let (hold, timeout) = (ms(r.hold_ms), ms(r.timeout_ms));
        let started = std::time::Instant::now();
        self.handover.start(hold);
        tracing::warn!("handing over: every call is refused (UNAVAILABLE) for {hold:?}");
        let last = |kv: strait_fs_core::kv::DynKv| async move {
            tokio::task::spawn_blocking(move || kv.last_version())
                .await
                .map_err(|e| Status::internal(format!("read the version: {e}")))?
                .map_err(engine_status)
        };
        // until the version stops moving, and the replicator holds it
        let mut at = last(self.engine.kv().clone()).await?;
        loop {
            let mut rx = shipped.clone();
            let left = timeout.saturating_sub(started.elapsed());
            strait_ship::fence::wait_committed(&mut rx, at, left)
                .await
                .map_err(|why| {
                    Status::unavailable(format!(
                        "the replicator does not hold every version of this primary: {why}"
                    ))
                })?;
            tokio::time::sleep(HANDOVER_QUIET).await;
            let now = last(self.engine.kv().clone()).await?;
            if now == at {
                break;
            }
            at = now;
        }
        let drained_ms = started.elapsed().as_millis() as u64;
        tracing::warn!(
            "handed over at version {at} ({drained_ms} ms): a mirror may be promoted now; \
             calls are refused for {hold:?} more, or until this primary is fenced"
        );
        Ok(Response::new(s::HandoverReply {
            last_version: at.0,
            drained_ms,
        }))
    }

    async fn promote(
        &self,
        _req: Request<s::PromoteRequest>,
    ) -> Result<Response<s::PromoteReply>, Status> {
        Err(Status::failed_precondition(
            "this daemon is the primary already: promote a mirror (`strait mirror promote --addr MIRROR`)",
        ))
    }

    async fn gc(&self, _req: Request<s::Empty>) -> Result<Response<s::GcReply>, Status> {
        let Some(gc) = &self.gc else {
            return Err(Status::failed_precondition(
                "this primary deletes no blocks: it is read-only, or its object store could not be opened (see its log)",
            ));
        };
        Ok(Response::new(gc.on_demand(&self.engine).await?))
    }

    async fn status(&self, _req: Request<s::Empty>) -> Result<Response<s::SiteStatus>, Status> {
        let kv = self.engine.kv().clone();
        let version = tokio::task::spawn_blocking(move || kv.last_version())
            .await
            .map_err(|e| Status::internal(format!("status task: {e}")))?
            .map_err(engine_status)?;
        Ok(Response::new(s::SiteStatus {
            role: "primary".into(),
            name: self.engine.settings().name.clone(),
            version: version.0,
            clock_ms: now_ms(),
            replicator: self.replicator.clone(),
            mirror: None,
        }))
    }
}
