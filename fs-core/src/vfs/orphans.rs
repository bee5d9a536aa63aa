//! Orphan objects: blocks in an object store that no slice of the metadata references
//! (docs/changelog.md, "Orphan objects"). They come from writes that never committed: a
//! mount that died between uploading a block and committing its slice, a write forwarded by
//! a mirror that the primary refused or never got, a slice written again under a new id
//! after a daemon forgot the ids it handed out. Nothing references them, so the dead-slice
//! GC never sees them; `strait gc` sweeps them.
//!
//! A sweep reads the references first (every slice a chunk lists, and every dead slice still
//! waiting for its blocks to be deleted: [`References::read`]), then lists the store's
//! block objects and deletes those no reference names and older than the grace
//! ([`classify`]). Keys that are not block keys are never touched.
//!
//! # To ensure correctness
//! - A block is uploaded before its slice is committed, so an object being written right
//!   now is unreferenced for a while. The grace is what keeps it: an object is an orphan
//!   only when it was last modified more than `grace` before the references were read. The
//!   rule, then: **the grace must exceed the longest time between a block's upload and its
//!   slice's commit** (a mount commits on flush, fsync and close; a mirror forwards at
//!   once). The default is an hour; a grace of 0 is only for a store nobody writes to, since
//!   a block uploaded before the sweep began and committed after it would be deleted.
//! - The age is the store's own modification time of the object (S3's `Last-Modified`, a
//!   file's mtime), against this machine's clock: a store whose clock runs ahead of this
//!   one makes objects look younger (kept longer), one that runs behind makes them look
//!   older, by the skew. The grace must also cover that.
//! - The references are one consistent view: a read transaction (a snapshot on RocksDB),
//!   read again while the version moves during the walk on an engine whose reads are not
//!   isolated (Redis), and the sweep gives up, deleting nothing, when it never holds still.
//! - An object of a referenced slice whose index or size does not fit the slice is not one
//!   of its blocks, and is an orphan too (as JuiceFS's `gc` counts it); a slice listed with
//!   two different sizes keeps every object under its id.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use crate::changelog::{decode, DeadSlice};
use crate::error::{Error, Result};
use crate::kv::{self, KvEngine};
use crate::layout::{block_count, block_len, parse_block_key};
use crate::meta::{keys, SliceRef};
use crate::object::{DynStore, ObjectInfo, LIST_LIMIT_MAX};
use crate::{SliceId, Version};

/// Deletions in flight at once during a sweep.
pub const SWEEP_DELETES_IN_FLIGHT_MAX: usize = 16;
/// Walks of the metadata tried while it keeps changing under a walk (Redis).
const WALK_RETRIES_MAX: usize = 5;
/// The prefix every block key starts with.
const BLOCKS_PREFIX: &str = "chunks/";

/// The size a slice is referenced with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Size {
    One(u32),
    /// Listed with different sizes: every object under the id is kept.
    Several,
}

/// Every slice the metadata references, live or dead and waiting for its blocks to be
/// deleted, with its size.
#[derive(Debug, Default)]
pub struct References {
    slices: HashMap<SliceId, Size>,
    /// The metadata version they were read at.
    pub version: Version,
}

impl References {
    /// Read the references of the file system in `kv`, in one consistent view (see the
    /// module's correctness rules).
    pub fn read(kv: &dyn KvEngine) -> Result<References> {
        for _ in 0..WALK_RETRIES_MAX {
            let mut refs = References::default();
            let mut moved = false;
            kv::read(kv, |t| {
                refs = References::default();
                let before = crate::snapshot::version_in(t)?;
                crate::snapshot::walk(t, &mut |k, v| {
                    match k.first().copied() {
                        Some(keys::CHUNK) => {
                            let slices: Vec<SliceRef> = decode(&v)?;
                            for s in slices {
                                refs.add(s.id, s.size);
                            }
                        }
                        Some(keys::DEADSLICE) => {
                            let id = keys::u64_at(&k, 9)
                                .map(SliceId)
                                .ok_or_else(|| Error::corrupt("dead slice key"))?;
                            let d: DeadSlice = decode(&v)?;
                            refs.add(id, d.size);
                        }
                        _ => {}
                    }
                    Ok(())
                })?;
                let after = crate::snapshot::version_in(t)?;
                moved = after != before;
                refs.version = after;
                Ok(())
            })?;
            if !moved {
                return Ok(refs);
            }
        }
        Err(Error::Meta(format!(
            "the metadata changed during each of {WALK_RETRIES_MAX} walks: no consistent list of \
             the slices it references, so no orphan is deleted; try again when it is quieter"
        )))
    }

    /// `id` of `size` bytes is referenced (a hole, id 0, has no blocks).
    pub fn add(&mut self, id: SliceId, size: u32) {
        if id.is_hole() {
            return;
        }
        self.slices
            .entry(id)
            .and_modify(|s| {
                if *s != Size::One(size) {
                    *s = Size::Several;
                }
            })
            .or_insert(Size::One(size));
    }

    /// Slices referenced.
    pub fn len(&self) -> usize {
        self.slices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slices.is_empty()
    }

    /// Whether block `index` of `len` bytes of slice `id` is one the references name.
    fn names(&self, id: SliceId, index: u32, len: u32, block_size: u32) -> bool {
        match self.slices.get(&id) {
            None => false,
            Some(Size::Several) => true,
            Some(&Size::One(size)) => {
                index < block_count(size, block_size) && block_len(size, block_size, index) == len
            }
        }
    }
}

/// What a sweep makes of one listed object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not a block key: never touched.
    Foreign,
    /// A block of a referenced slice.
    Referenced,
    /// Unreferenced but modified after `cutoff` (or of unknown age): perhaps a block being
    /// written now, kept.
    Young,
    /// Unreferenced and older than the grace: block `index` of slice `id`.
    Orphan { id: SliceId, index: u32 },
}

/// The verdict on `obj` against `refs`, with `cutoff` the time the references were read
/// minus the grace: an unreferenced block modified at or before it is an orphan.
pub fn classify(
    obj: &ObjectInfo,
    refs: &References,
    block_size: u32,
    cutoff: SystemTime,
) -> Verdict {
    let Some((id, index, len)) = parse_block_key(&obj.key) else {
        return Verdict::Foreign;
    };
    if refs.names(id, index, len, block_size) {
        return Verdict::Referenced;
    }
    match obj.modified {
        Some(m) if m <= cutoff => Verdict::Orphan { id, index },
        _ => Verdict::Young,
    }
}

/// How a sweep runs.
#[derive(Clone, Copy, Debug)]
pub struct SweepOptions {
    /// How old an unreferenced object must be to go.
    pub grace: Duration,
    /// Count what would go, delete nothing.
    pub dry_run: bool,
}

/// What a sweep found (so far, in progress reports).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepStats {
    pub listed: u64,
    pub listed_bytes: u64,
    pub referenced: u64,
    /// Unreferenced, but younger than the grace.
    pub young: u64,
    pub young_bytes: u64,
    /// Objects whose key is not a block's.
    pub foreign: u64,
    /// Unreferenced and older than the grace.
    pub orphans: u64,
    pub orphan_bytes: u64,
    pub deleted: u64,
    pub deleted_bytes: u64,
    /// Orphans whose deletion failed (logged; they stay for the next sweep).
    pub failed: u64,
}

/// What a sweep tells its caller, and asks it.
pub struct SweepCalls<'a> {
    /// After each listed page.
    pub progress: &'a mut (dyn FnMut(&SweepStats) + Send),
    /// With each orphan deleted.
    pub deleted: &'a mut (dyn FnMut(SliceId, u32) + Send),
    /// Before each page's deletions: Some(why) stops the sweep (the site may no longer
    /// delete: a primary fenced, a mirror that stopped following).
    pub gate: &'a (dyn Fn() -> Option<String> + Send + Sync),
}

/// Sweep `store` against `refs`, read at `read_at`: list every block object, delete the
/// orphans (unless a dry run), telling `calls` as it goes. The references must have been
/// read before the listing starts.
pub async fn sweep(
    store: &DynStore,
    refs: &References,
    block_size: u32,
    read_at: SystemTime,
    opts: SweepOptions,
    calls: SweepCalls<'_>,
) -> Result<SweepStats> {
    let SweepCalls {
        progress,
        deleted,
        gate,
    } = calls;
    let cutoff = read_at
        .checked_sub(opts.grace)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut st = SweepStats::default();
    let mut after: Option<String> = None;
    loop {
        let page = super::retry_store(&format!("list the blocks of {}", store.describe()), || {
            store.list(BLOCKS_PREFIX, after.as_deref(), LIST_LIMIT_MAX)
        })
        .await?;
        let Some(last) = page.last() else {
            break;
        };
        after = Some(last.key.clone());
        let mut doomed = vec![];
        for obj in &page {
            st.listed += 1;
            st.listed_bytes += obj.size;
            match classify(obj, refs, block_size, cutoff) {
                Verdict::Foreign => st.foreign += 1,
                Verdict::Referenced => st.referenced += 1,
                Verdict::Young => {
                    st.young += 1;
                    st.young_bytes += obj.size;
                }
                Verdict::Orphan { id, index } => {
                    st.orphans += 1;
                    st.orphan_bytes += obj.size;
                    doomed.push((obj.key.clone(), obj.size, id, index));
                }
            }
        }
        if !opts.dry_run && !doomed.is_empty() {
            // asked before every page's deletions: the site may stop being allowed to delete
            // during a long sweep (a primary fenced, a mirror halted)
            if let Some(why) = gate() {
                return Err(crate::error::Error::Meta(format!(
                    "the sweep stopped after deleting {} objects: {why}",
                    st.deleted
                )));
            }
            delete_all(store, doomed, &mut st, deleted).await;
        }
        progress(&st);
    }
    Ok(st)
}

/// Delete `doomed` with at most [`SWEEP_DELETES_IN_FLIGHT_MAX`] deletions at once.
async fn delete_all(
    store: &DynStore,
    doomed: Vec<(String, u64, SliceId, u32)>,
    st: &mut SweepStats,
    deleted: &mut (dyn FnMut(SliceId, u32) + Send),
) {
    let mut tasks = tokio::task::JoinSet::new();
    let mut finish = |r: Option<Result<(u64, SliceId, u32), String>>, st: &mut SweepStats| match r {
        Some(Ok((size, id, index))) => {
            st.deleted += 1;
            st.deleted_bytes += size;
            deleted(id, index);
        }
        Some(Err(why)) => {
            tracing::warn!("{why}");
            st.failed += 1;
        }
        None => {}
    };
    for (key, size, id, index) in doomed {
        while tasks.len() >= SWEEP_DELETES_IN_FLIGHT_MAX {
            let r = tasks.join_next().await.map(flatten);
            finish(r, st);
        }
        let store = store.clone();
        tasks.spawn(async move {
            super::retry_store(&format!("delete orphan {key}"), || store.delete(&key))
                .await
                .map(|()| (size, id, index))
                .map_err(|e| format!("delete orphan object {key}: {e}"))
        });
    }
    while let Some(r) = tasks.join_next().await {
        finish(Some(flatten(r)), st);
    }
}

fn flatten<T>(
    r: std::result::Result<std::result::Result<T, String>, tokio::task::JoinError>,
) -> std::result::Result<T, String> {
    r.map_err(|e| format!("a deletion task failed: {e}"))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::block_key;

    const BS: u32 = 4 << 20;

    fn obj(key: String, modified: Option<SystemTime>) -> ObjectInfo {
        ObjectInfo {
            key,
            size: 1,
            modified,
        }
    }

    #[test]
    fn an_object_is_an_orphan_only_unreferenced_and_older_than_the_grace() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let cutoff = t0 - Duration::from_secs(3600);
        let mut refs = References::default();
        // slice 7: two blocks, 4 MiB and 1 byte
        refs.add(SliceId(7), BS + 1);
        let old = Some(cutoff - Duration::from_secs(1));
        let young = Some(cutoff + Duration::from_secs(1));

        // the slice's own blocks, however old
        for (index, len) in [(0, BS), (1, 1)] {
            let o = obj(block_key(SliceId(7), index, len), old);
            assert_eq!(classify(&o, &refs, BS, cutoff), Verdict::Referenced);
        }
        // an unreferenced slice: gone when old, kept when young or of unknown age
        let key = block_key(SliceId(8), 0, 10);
        assert_eq!(
            classify(&obj(key.clone(), old), &refs, BS, cutoff),
            Verdict::Orphan {
                id: SliceId(8),
                index: 0
            }
        );
        assert_eq!(
            classify(&obj(key.clone(), young), &refs, BS, cutoff),
            Verdict::Young
        );
        assert_eq!(
            classify(&obj(key.clone(), None), &refs, BS, cutoff),
            Verdict::Young
        );
        // exactly at the cutoff: old enough
        assert!(matches!(
            classify(&obj(key, Some(cutoff)), &refs, BS, cutoff),
            Verdict::Orphan { .. }
        ));
        // not a block key: never touched, whatever its age
        assert_eq!(
            classify(&obj("chunks/readme".into(), old), &refs, BS, cutoff),
            Verdict::Foreign
        );
        assert_eq!(
            classify(&obj("other/0/0/8_0_10".into(), old), &refs, BS, cutoff),
            Verdict::Foreign
        );
    }

    #[test]
    fn a_block_that_does_not_fit_its_referenced_slice_is_an_orphan() {
        let cutoff = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let old = Some(cutoff - Duration::from_secs(1));
        let mut refs = References::default();
        refs.add(SliceId(7), 100);
        // a second block, and a first block of another size, are not slice 7's
        for (index, len) in [(1, 100), (0, 99)] {
            let o = obj(block_key(SliceId(7), index, len), old);
            assert!(
                matches!(classify(&o, &refs, BS, cutoff), Verdict::Orphan { .. }),
                "{}",
                o.key
            );
        }
        // listed with two sizes (should not happen): every object under the id is kept
        refs.add(SliceId(7), 50);
        let o = obj(block_key(SliceId(7), 0, 99), old);
        assert_eq!(classify(&o, &refs, BS, cutoff), Verdict::Referenced);
    }

    #[test]
    fn the_references_are_every_live_and_every_dead_pending_slice() {
        use crate::meta::{Ctx, MetaClient};
        let memory =
            || -> crate::kv::DynKv { std::sync::Arc::new(crate::kv::memory::MemoryKv::new()) };
        let (kv, meta) = crate::meta::conformance::fresh(&memory);
        let root = Ctx::root();
        let slice = |id: SliceId, size: u32| SliceRef {
            id,
            size,
            off: 0,
            len: size,
            pos: 0,
            crcs: vec![0; block_count(size, BS) as usize],
        };
        // a file that stays, one whose slice dies when it is unlinked
        let (kept, _) = MetaClient::create(meta.as_ref(), &root, 1, b"kept", 0o644, 0).unwrap();
        let (gone, _) = MetaClient::create(meta.as_ref(), &root, 1, b"gone", 0o644, 0).unwrap();
        let (a, b) = (meta.next_slice_id().unwrap(), meta.next_slice_id().unwrap());
        MetaClient::write_slice(meta.as_ref(), kept, 0, slice(a, BS + 5), 1).unwrap();
        MetaClient::write_slice(meta.as_ref(), gone, 0, slice(b, 7), 1).unwrap();
        MetaClient::release(meta.as_ref(), kept).unwrap();
        MetaClient::release(meta.as_ref(), gone).unwrap();
        MetaClient::unlink(meta.as_ref(), &root, 1, b"gone").unwrap();
        // a truncation's hole names no blocks
        let set = crate::meta::SetAttr {
            size: Some(1),
            ..Default::default()
        };
        MetaClient::setattr(meta.as_ref(), &root, kept, &set).unwrap();

        let refs = References::read(kv.as_ref()).unwrap();
        assert_eq!(refs.len(), 2, "{refs:?}");
        assert!(refs.names(a, 1, 5, BS), "the live slice's second block");
        assert!(
            refs.names(b, 0, 7, BS),
            "the dead slice, waiting for its blocks to go"
        );
        assert_eq!(refs.version, kv.last_version().unwrap());
    }

    #[test]
    fn holes_reference_nothing() {
        let mut refs = References::default();
        refs.add(SliceId::HOLE, 100);
        assert!(refs.is_empty());
    }
}
