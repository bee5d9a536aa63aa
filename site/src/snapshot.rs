//! The site service of the primary: metadata snapshots for mirrors to bootstrap from, the
//! metadata digest, and the primary's status. [`snapshot_stream`] serves a mirror's
//! snapshots too.

use std::pin::Pin;
use std::sync::Arc;

use strait_fs_core::kv::DynKv;
use strait_fs_core::meta::Meta;
use strait_fs_core::snapshot;
use strait_proto::site as s;
use strait_proto::site::site_service_server::SiteService;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// Batches of pairs queued ahead of a slow reader of a snapshot.
pub const SNAPSHOT_QUEUE_BATCHES: usize = 8;

pub type SnapshotStream = Pin<Box<dyn Stream<Item = Result<s::SnapshotChunk, Status>> + Send>>;

fn engine_status(e: strait_fs_core::Error) -> Status {
    Status::internal(e.to_string())
}

/// Stream a consistent snapshot of `kv`: header, pair batches, end. The walk runs on the
/// blocking pool and waits for the reader (bounded queue).
pub fn snapshot_stream(kv: DynKv) -> SnapshotStream {
    let (tx, rx) = tokio::sync::mpsc::channel(SNAPSHOT_QUEUE_BATCHES);
    tokio::task::spawn_blocking(move || {
        let gone = || strait_fs_core::Error::Meta("the snapshot's reader went away".into());
        let r = (|| {
            let format = Meta::load_format(kv.as_ref())?;
            let mut started = false;
            let c = snapshot::collect(
                kv.as_ref(),
                &mut |version| {
                    if started {
                        // the engine has no snapshots and changed under the walk: the reader
                        // has pairs of another version already, so it must start again
                        return Err(strait_fs_core::Error::Meta(
                            "the metadata changed during the snapshot; try again".into(),
                        ));
                    }
                    started = true;
                    let header = s::SnapshotHeader {
                        name: format.name.clone(),
                        uuid: format.uuid.clone(),
                        version,
                    };
                    tx.blocking_send(Ok(s::SnapshotChunk {
                        kind: Some(s::snapshot_chunk::Kind::Header(header)),
                    }))
                    .map_err(|_| gone())
                },
                &mut |batch| {
                    let pairs = batch
                        .into_iter()
                        .map(|(key, value)| s::KeyValue { key, value })
                        .collect();
                    tx.blocking_send(Ok(s::SnapshotChunk {
                        kind: Some(s::snapshot_chunk::Kind::Pairs(s::SnapshotPairs { pairs })),
                    }))
                    .map_err(|_| gone())
                },
            )?;
            tx.blocking_send(Ok(s::SnapshotChunk {
                kind: Some(s::snapshot_chunk::Kind::End(s::SnapshotEnd {
                    pairs: c.pairs,
                    digest: c.digest,
                })),
            }))
            .map_err(|_| gone())?;
            tracing::info!(
                "served a metadata snapshot at version {} ({} pairs)",
                c.version,
                c.pairs
            );
            Ok::<_, strait_fs_core::Error>(())
        })();
        if let Err(e) = r {
            let _ = tx.blocking_send(Err(engine_status(e)));
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// The digest of `kv` and its version, read together, computed on the blocking pool.
pub async fn digest_now(kv: DynKv) -> Result<(String, u64), Status> {
    tokio::task::spawn_blocking(move || Meta::digest_at(kv.as_ref()))
        .await
        .map_err(|e| Status::internal(format!("digest task: {e}")))?
        .map_err(engine_status)
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The primary's site service.
pub struct PrimarySite {
    pub engine: Arc<Meta>,
    pub replicator: Vec<String>,
    /// Deleting dead blocks (None: read-only, or the object store could not be opened).
    pub gc: Option<Gc>,
}

/// What an on-demand GC pass needs.
pub struct Gc {
    pub horizon: Arc<tokio::sync::Mutex<crate::gc::MirrorHorizon>>,
    pub store: strait_fs_core::object::DynStore,
    pub metrics: Arc<crate::metrics::Metrics>,
}

#[tonic::async_trait]
impl SiteService for PrimarySite {
    type SnapshotStream = SnapshotStream;

    async fn snapshot(&self, _req: Request<s::Empty>) -> Result<Response<SnapshotStream>, Status> {
        Ok(Response::new(snapshot_stream(self.engine.kv().clone())))
    }

    async fn digest(
        &self,
        req: Request<s::DigestRequest>,
    ) -> Result<Response<s::DigestReply>, Status> {
        let at = req.into_inner().at_version;
        let (digest, version) = digest_now(self.engine.kv().clone()).await?;
        if at != 0 && at != version {
            return Err(Status::failed_precondition(format!(
                "the primary is at version {version}, not {at}: it answers at its current version only"
            )));
        }
        Ok(Response::new(s::DigestReply { digest, version }))
    }

    async fn pause(
        &self,
        _req: Request<s::PauseRequest>,
    ) -> Result<Response<s::PauseReply>, Status> {
        Err(Status::unimplemented(
            "the primary never pauses: Pause is a mirror's call",
        ))
    }

    async fn gc(&self, _req: Request<s::Empty>) -> Result<Response<s::GcReply>, Status> {
        let Some(gc) = &self.gc else {
            return Err(Status::failed_precondition(
                "this primary deletes no blocks: it is read-only, or its object store could not be opened (see its log)",
            ));
        };
        let p = gc
            .horizon
            .lock()
            .await
            .pass(&self.engine, &gc.store)
            .await
            .map_err(engine_status)?;
        gc.metrics.slices_collected.inc_by(p.purged as u64);
        gc.metrics.gc_held.set(p.held as i64);
        tracing::info!(
            "GC on demand: deleted the blocks of {} dead slices, kept {} for mirrors",
            p.purged,
            p.held
        );
        Ok(Response::new(s::GcReply {
            purged: p.purged as u64,
            held: p.held as u64,
            horizon: p.horizon.unwrap_or(0),
            has_mirrors: p.horizon.is_some(),
        }))
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
            version,
            clock_ms: now_ms(),
            replicator: self.replicator.clone(),
            mirror: None,
        }))
    }
}
