//! The site service of the primary: metadata snapshots for mirrors to bootstrap from, the
//! metadata digest (both streamed by [`strait_server::snapshot`]), GC on demand, and the
//! primary's status.

use std::sync::Arc;

use strait_fs_core::clock::now_ms;
use strait_fs_core::meta::Meta;
use strait_fs_core::Version;
use strait_proto::site as s;
use strait_proto::site::site_service_server::SiteService;
use strait_server::snapshot::{digest_now, engine_status, snapshot_stream, SnapshotStream};
use tonic::{Request, Response, Status};

/// The primary's site service.
pub struct PrimarySite {
    pub engine: Arc<Meta>,
    pub replicator: Vec<String>,
    /// Deleting dead blocks (None: read-only, or the object store could not be opened).
    pub gc: Option<crate::gc::Gc>,
    /// What the replicator holds (None: this primary ships nothing).
    pub shipped: Option<tokio::sync::watch::Receiver<crate::ship::shipper::Shipped>>,
    pub handover: Arc<crate::handover::Handover>,
    /// The shipper's fence: the lease, in the status (None: this primary ships nothing).
    pub fence: Option<Arc<crate::ship::fence::EpochFence>>,
    /// The epoch it ships at.
    pub epoch: strait_fs_core::Epoch,
}

#[tonic::async_trait]
impl SiteService for PrimarySite {
    type SnapshotStream = SnapshotStream;
    type SweepOrphansStream = strait_server::orphans::SweepStream;
    type WarmupStream = strait_server::WarmupStream;

    async fn warmup(
        &self,
        _req: Request<s::WarmupRequest>,
    ) -> Result<Response<Self::WarmupStream>, Status> {
        Err(Status::unimplemented(
            "this is the primary: its object store holds every block; warm up at a mirror",
        ))
    }

    async fn sweep_orphans(
        &self,
        req: Request<s::SweepRequest>,
    ) -> Result<Response<Self::SweepOrphansStream>, Status> {
        let Some(gc) = &self.gc else {
            return Err(Status::failed_precondition(
                "this primary deletes no blocks: it is read-only, or its object store could not be opened (see its log)",
            ));
        };
        // a primary superseded, diverged or not yet compared with the log sweeps nothing:
        // blocks its metadata does not name may be live in the history that went on
        if let Some(why) = gc.horizon.lock().await.refused().await {
            return Err(Status::failed_precondition(format!(
                "this primary deletes no object now: {why}"
            )));
        }
        let engine = self.engine.clone();
        let stream = strait_server::orphans::sweep_stream(
            self.engine.kv().clone(),
            gc.store.clone(),
            req.into_inner(),
            None,
            None,
            Arc::new(move || engine.deletions_refused()),
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
        let Some(shipped) = &self.shipped else {
            return Err(Status::failed_precondition(
                "this primary ships no change log (no replicator): no mirror can take over",
            ));
        };
        crate::handover::hand_over(&self.handover, self.engine.kv(), shipped, req.into_inner())
            .await
            .map(Response::new)
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
        let lease = self
            .fence
            .as_ref()
            .and_then(|f| f.lease_left())
            .unwrap_or_default();
        Ok(Response::new(s::SiteStatus {
            role: "primary".into(),
            name: self.engine.settings().name.clone(),
            version: version.0,
            clock_ms: now_ms(),
            replicator: self.replicator.clone(),
            mirror: None,
            lease_ms: lease.0.as_millis() as u64,
            lease_left_ms: lease.1.as_millis() as u64,
            epoch: self.epoch.0,
            fenced: self
                .shipped
                .as_ref()
                .and_then(|s| s.borrow().fenced.clone())
                .unwrap_or_default(),
        }))
    }
}
