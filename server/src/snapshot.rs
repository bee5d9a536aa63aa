//! Metadata snapshots for mirrors to bootstrap from, and the metadata digest: what the site
//! service of the primary and of a mirror stream.

use std::pin::Pin;

use strait_fs_core::kv::DynKv;
use strait_fs_core::meta::Meta;
use strait_fs_core::snapshot;
use strait_fs_core::Version;
use strait_proto::site as s;
use tokio_stream::Stream;
use tonic::Status;

/// Batches of pairs queued ahead of a slow reader of a snapshot.
pub const SNAPSHOT_QUEUE_BATCHES: usize = 8;

pub type SnapshotStream = Pin<Box<dyn Stream<Item = Result<s::SnapshotChunk, Status>> + Send>>;

pub fn engine_status(e: strait_fs_core::Error) -> Status {
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
                        version: version.0,
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
pub async fn digest_now(kv: DynKv) -> Result<(String, Version), Status> {
    tokio::task::spawn_blocking(move || Meta::digest_at(kv.as_ref()))
        .await
        .map_err(|e| Status::internal(format!("digest task: {e}")))?
        .map_err(engine_status)
}
