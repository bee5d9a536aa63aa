//! `SiteService.SweepOrphans`, as both daemons serve it: read the references of the site's
//! own metadata, sweep the site's own object store, stream the progress
//! (`strait_fs_core::vfs::orphans` holds the rules).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use strait_fs_core::kv::{DynKv, KvEngine};
use strait_fs_core::meta::Meta;
use strait_fs_core::object::DynStore;
use strait_fs_core::vfs::orphans::{self, References, SweepOptions, SweepStats};
use strait_fs_core::SliceId;
use strait_proto::site as s;
use tokio_stream::Stream;
use tonic::Status;

/// Progress messages waiting for a slow reader (the sweep waits for it).
const PROGRESS_QUEUE_MAX: usize = 4;

pub type SweepStream = Pin<Box<dyn Stream<Item = Result<s::SweepProgress, Status>> + Send>>;

/// Called once a sweep is done with the blocks it deleted (slice id, block index): a mirror
/// clears its marks of them.
pub type Deleted = Arc<dyn Fn(Vec<(SliceId, u32)>) + Send + Sync>;

/// A sweep's figures as the wire (and `strait gc`'s report) carries them.
pub fn progress(
    st: &SweepStats,
    store: &str,
    refs: &References,
    dry_run: bool,
    done: bool,
) -> s::SweepProgress {
    s::SweepProgress {
        store: store.to_string(),
        version: refs.version.0,
        referenced_slices: refs.len() as u64,
        listed: st.listed,
        listed_bytes: st.listed_bytes,
        referenced: st.referenced,
        young: st.young,
        young_bytes: st.young_bytes,
        foreign: st.foreign,
        orphans: st.orphans,
        orphan_bytes: st.orphan_bytes,
        deleted: st.deleted,
        deleted_bytes: st.deleted_bytes,
        failed: st.failed,
        dry_run,
        done,
    }
}

/// Adds to the references read from the metadata the slices whose blocks the site keeps for
/// another reason, read after them: a mirror's slices the primary purged, whose copies its
/// deleter is removing (a sweep that took them for orphans would count, or delete, what is
/// already on its way out).
pub type AlsoReferenced =
    Arc<dyn Fn(&dyn KvEngine, &mut References) -> strait_fs_core::Result<()> + Send + Sync>;

/// Asked before each page of deletions; Some(why) stops the sweep (the site may no longer
/// delete: a primary fenced, a mirror that stopped following).
pub type Gate = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// Sweep `store` against the metadata in `kv` as `req` asks, streaming the progress.
pub fn sweep_stream(
    kv: DynKv,
    store: DynStore,
    req: s::SweepRequest,
    also: Option<AlsoReferenced>,
    on_deleted: Option<Deleted>,
    gate: Gate,
) -> Result<SweepStream, Status> {
    let Some(grace_ms) = req.grace_ms else {
        return Err(Status::invalid_argument(
            "SweepOrphans needs grace_ms: an unreferenced object younger than it may be a block being written now",
        ));
    };
    let opts = SweepOptions {
        grace: Duration::from_millis(grace_ms),
        dry_run: req.dry_run,
    };
    let (tx, rx) = tokio::sync::mpsc::channel(PROGRESS_QUEUE_MAX);
    tokio::spawn(async move {
        let out = run(kv, store, opts, &tx, also, on_deleted, gate).await;
        if let Err(s) = out {
            tracing::error!("sweep orphan objects: {}", s.message());
            let _ = tx.send(Err(s)).await;
        }
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

async fn run(
    kv: DynKv,
    store: DynStore,
    opts: SweepOptions,
    tx: &tokio::sync::mpsc::Sender<Result<s::SweepProgress, Status>>,
    also: Option<AlsoReferenced>,
    on_deleted: Option<Deleted>,
    gate: Gate,
) -> Result<(), Status> {
    let internal = |e: strait_fs_core::Error| Status::internal(e.to_string());
    // the age of an object counts to when the references were read, so take the time first
    let read_at = strait_fs_core::clock::now();
    let (refs, block_size) = tokio::task::spawn_blocking(move || {
        let bs = Meta::load_format(kv.as_ref())?.block_size;
        let mut refs = References::read(kv.as_ref())?;
        // after the walk: a slice the metadata dropped since is in what this adds
        if let Some(also) = &also {
            also(kv.as_ref(), &mut refs)?;
        }
        Ok::<_, strait_fs_core::Error>((refs, bs))
    })
    .await
    .map_err(|e| Status::internal(format!("the reference walk failed: {e}")))?
    .map_err(internal)?;
    let name = store.describe();
    tracing::info!(
        "sweeping orphan objects in {name}: {} slices referenced at version {}, grace {:?}{}",
        refs.len(),
        refs.version,
        opts.grace,
        if opts.dry_run { " (dry run)" } else { "" }
    );
    let mut gone = vec![];
    let mut reader_gone = false;
    let st = orphans::sweep(
        &store,
        &refs,
        block_size,
        read_at,
        opts,
        orphans::SweepCalls {
            progress: &mut |st| {
                // a reader that went away stops only the reports, not the sweep
                if !reader_gone {
                    reader_gone = tx
                        .try_send(Ok(progress(st, &name, &refs, opts.dry_run, false)))
                        .is_err_and(|e| {
                            matches!(e, tokio::sync::mpsc::error::TrySendError::Closed(_))
                        });
                }
            },
            deleted: &mut |id, index| gone.push((id, index)),
            gate: gate.as_ref(),
        },
    )
    .await;
    // what was deleted before a failure or a stop is unmarked all the same
    let st = match st {
        Ok(st) => st,
        Err(e) => {
            if let Some(f) = on_deleted {
                if !gone.is_empty() {
                    let _ = tokio::task::spawn_blocking(move || f(gone)).await;
                }
            }
            return Err(internal(e));
        }
    };
    tracing::info!(
        "swept {name}: {} objects listed, {} referenced, {} young, {} foreign; {} orphans \
         ({} bytes), {} deleted, {} failed{}",
        st.listed,
        st.referenced,
        st.young,
        st.foreign,
        st.orphans,
        st.orphan_bytes,
        st.deleted,
        st.failed,
        if opts.dry_run { " (dry run)" } else { "" }
    );
    if let Some(f) = on_deleted {
        if !gone.is_empty() {
            tokio::task::spawn_blocking(move || f(gone))
                .await
                .map_err(|e| Status::internal(format!("after the sweep: {e}")))?;
        }
    }
    let _ = tx
        .send(Ok(progress(&st, &name, &refs, opts.dry_run, true)))
        .await;
    Ok(())
}
