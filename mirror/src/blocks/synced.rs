//! Which blocks this region's store holds: a mark per block, set when a block lands in the
//! store and cleared when it is found missing or corrupt.

use std::collections::HashSet;

use strait_fs_core::kv::{self, DynKv, KvEngine};
use strait_fs_core::layout;
use strait_fs_core::meta::SliceRef;
use strait_fs_core::SliceId;

use super::keys::{group, synced_key, u32_at, OLD_MARK_LEN, OLD_SYNCED, SYNCED};
use super::{kv_call, Blocks};

/// What [`Blocks::missing`] counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Missing {
    pub files: u64,
    pub blocks: u64,
    pub bytes: u64,
}

/// Old marks moved, or marks cleared, per transaction (see [`move_old_marks`]).
const MOVE_BATCH: usize = 1000;

/// Move the marks kept under the change log's tag (`L id index`, before they had a tag of
/// their own) to [`SYNCED`], so that an engine written by an older mirror keeps knowing which
/// blocks its region's store holds; without them every such block would be read across
/// regions once more. Keys under that tag of any other length (change records, which a
/// mirror's engine does not hold anyway) are left alone. Each batch moves its marks in one
/// transaction, so a crash in the middle leaves the rest for the next start. Returns how many
/// were moved.
pub(super) fn move_old_marks(kv: &dyn KvEngine) -> strait_fs_core::Result<u64> {
    let mut moved = 0u64;
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = kv::read(kv, |t| t.scan(&[OLD_SYNCED], after.as_deref(), MOVE_BATCH))?;
        let full = page.len() == MOVE_BATCH;
        after = page.last().map(|p| p.0.clone());
        let old: Vec<(Vec<u8>, Vec<u8>)> = page
            .into_iter()
            .filter(|(k, _)| k.len() == OLD_MARK_LEN)
            .collect();
        if !old.is_empty() {
            kv::txn(kv, |t| {
                for (k, v) in &old {
                    let mut new = k.clone();
                    new[0] = SYNCED;
                    t.put(&new, v);
                    t.delete(k);
                }
                Ok(())
            })?;
            moved += old.len() as u64;
        }
        if !full {
            return Ok(moved);
        }
    }
}

/// Which of a slice's `blocks` blocks are not among `synced` (their indexes): a bitmap, empty
/// when none.
fn unsynced_bitmap(blocks: usize, synced: &HashSet<u32>) -> Vec<u8> {
    let mut map = vec![0u8; blocks.div_ceil(8)];
    let mut any = false;
    for i in 0..blocks {
        if !synced.contains(&(i as u32)) {
            map[i / 8] |= 1 << (i % 8);
            any = true;
        }
    }
    if any {
        map
    } else {
        vec![]
    }
}

/// Record that `blocks` (slice id, block index) are in this region's store, in one
/// transaction.
pub(super) async fn mark_present(kv: &DynKv, blocks: Vec<(SliceId, u32)>) -> Result<(), String> {
    let n = blocks.len();
    let r = kv_call(kv, move |kv| {
        kv::txn(kv, |t| {
            for &(id, index) in &blocks {
                t.put(&synced_key(id, index), &[]);
            }
            Ok(())
        })
    })
    .await;
    match r {
        Some(Ok(_)) => Ok(()),
        Some(Err(e)) => Err(format!("mark {n} blocks written here: {e}")),
        None => Err(format!("mark {n} blocks written here: the call panicked")),
    }
}

/// Record that block `index` of slice `id` is in this region's store (`synced`) or not.
pub(super) async fn mark(kv: &DynKv, id: SliceId, index: u32, synced: bool) -> Result<(), String> {
    let r = kv_call(kv, move |kv| {
        kv::txn(kv, |t| {
            let k = synced_key(id, index);
            if synced {
                t.put(&k, &[]);
            } else {
                t.delete(&k);
            }
            Ok(())
        })
    })
    .await;
    match r {
        Some(Ok(_)) => Ok(()),
        Some(Err(e)) => Err(format!("mark block {index} of slice {id}: {e}")),
        None => Err(format!(
            "mark block {index} of slice {id}: the call panicked"
        )),
    }
}

impl Blocks {
    /// For each of `slices`, the blocks this region's store does not hold yet: a bitmap per
    /// slice, empty when it holds them all (`ReadChunkReply.unsynced`). On a metadata error,
    /// no bitmaps: the mounts then ask their store first.
    pub fn unsynced(&self, slices: &[SliceRef]) -> Vec<Vec<u8>> {
        let r = kv::read(self.kv.as_ref(), |t| {
            let mut out = Vec::with_capacity(slices.len());
            for s in slices {
                if s.id.is_hole() || s.crcs.is_empty() {
                    out.push(vec![]);
                    continue;
                }
                let synced: HashSet<u32> = t
                    .scan(&group(SYNCED, s.id.0), None, s.crcs.len())?
                    .iter()
                    .filter_map(|(k, _)| u32_at(k, 9))
                    .collect();
                out.push(unsynced_bitmap(s.crcs.len(), &synced));
            }
            Ok(out)
        });
        r.unwrap_or_else(|e| {
            self.error(format!("read which blocks are in this region's store: {e}"));
            vec![]
        })
    }

    /// The blocks the metadata references that this region's store does not hold (by its
    /// marks), the bytes they hold and the files they belong to: what this region cannot
    /// read without the primary's store. One pass over every chunk, a page per read.
    /// Blocking. A mirror with no store of its own holds none: everything is missing, and
    /// nothing is counted (None).
    pub fn missing(&self) -> strait_fs_core::Result<Option<Missing>> {
        if self.local.is_none() {
            return Ok(None);
        }
        let mut out = Missing::default();
        let mut after: Option<Vec<u8>> = None;
        let mut last_ino = None;
        loop {
            let n = kv::read(self.kv.as_ref(), |t| {
                let page = t.scan(
                    &[strait_fs_core::meta::keys::CHUNK],
                    after.as_deref(),
                    super::queue::INDEX_BATCH,
                )?;
                let bs = self.block_size_in(t)?;
                for (k, v) in &page {
                    let ino = strait_fs_core::meta::keys::u64_at(k, 1)
                        .ok_or_else(|| super::corrupt("chunk key".into()))?;
                    let list: Vec<SliceRef> = strait_fs_core::changelog::decode(v)?;
                    for s in list.iter().filter(|s| !s.id.is_hole()) {
                        let count = layout::block_count(s.size, bs);
                        let synced: HashSet<u32> = t
                            .scan(&group(SYNCED, s.id.0), None, count as usize)?
                            .iter()
                            .filter_map(|(k, _)| u32_at(k, 9))
                            .collect();
                        for index in (0..count).filter(|i| !synced.contains(i)) {
                            out.blocks += 1;
                            out.bytes += layout::block_len(s.size, bs, index) as u64;
                            if last_ino != Some(ino) {
                                last_ino = Some(ino);
                                out.files += 1;
                            }
                        }
                    }
                }
                after = page.last().map(|p| p.0.clone());
                Ok(page.len())
            })?;
            if n < super::queue::INDEX_BATCH {
                return Ok(Some(out));
            }
        }
    }

    pub(super) async fn is_marked(&self, id: SliceId, index: u32) -> bool {
        kv_call(&self.kv, move |kv| {
            kv::read(kv, |t| Ok(t.get(&synced_key(id, index))?.is_some()))
        })
        .await
        .and_then(|r| r.ok())
        .unwrap_or(false)
    }

    /// Clear the marks of blocks deleted from this region's store (orphans a sweep removed),
    /// in transactions of [`MOVE_BATCH`]. Blocking.
    pub fn unmark_all(&self, blocks: &[(SliceId, u32)]) {
        for batch in blocks.chunks(MOVE_BATCH) {
            let r = kv::txn(self.kv.as_ref(), |t| {
                for &(id, index) in batch {
                    t.delete(&synced_key(id, index));
                }
                Ok(())
            });
            if let Err(e) = r {
                self.error(format!(
                    "clear the marks of {} deleted orphan blocks: {e}",
                    batch.len()
                ));
            }
        }
    }

    pub(super) async fn mark(&self, id: SliceId, index: u32, synced: bool) {
        if let Err(e) = mark(&self.kv, id, index, synced).await {
            self.error(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strait_fs_core::kv::memory::MemoryKv;

    /// Every block the metadata references and no mark says is here, with its bytes and
    /// files; a marked block is not missing.
    #[tokio::test]
    async fn the_missing_blocks_are_those_with_no_mark() {
        use strait_fs_core::meta::{Ctx, MetaClient, ROOT_INO};
        let memory = || -> DynKv { std::sync::Arc::new(MemoryKv::new()) };
        let (kv, m) = strait_fs_core::meta::conformance::fresh(&memory);
        let bs = m.settings().block_size;
        let root = Ctx::root();
        // file f: one slice of two blocks and a bit; file g: one block
        let (f, _) = m.create(&root, ROOT_INO, b"f", 0o644, 0).unwrap();
        let sf = SliceRef {
            id: m.next_slice_id().unwrap(),
            size: 2 * bs + 10,
            off: 0,
            len: 2 * bs + 10,
            pos: 0,
            crcs: vec![1, 2, 3],
        };
        m.write_slice(f, 0, sf.clone(), 1).unwrap();
        let (g, _) = m.create(&root, ROOT_INO, b"g", 0o644, 0).unwrap();
        let sg = SliceRef {
            id: m.next_slice_id().unwrap(),
            size: 100,
            off: 0,
            len: 100,
            pos: 0,
            crcs: vec![4],
        };
        m.write_slice(g, 0, sg.clone(), 1).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::config::MirrorConfig {
            data_url: format!("file://{}", dir.path().display()),
            ..Default::default()
        };
        let blocks = Blocks::open(&cfg, kv).await.unwrap();
        let missing = |b: &std::sync::Arc<Blocks>| {
            let b = b.clone();
            std::thread::spawn(move || b.missing().unwrap().unwrap())
                .join()
                .unwrap()
        };
        assert_eq!(
            missing(&blocks),
            Missing {
                files: 2,
                blocks: 4,
                bytes: 2 * bs as u64 + 10 + 100
            }
        );
        // g's block and f's first one are here
        blocks.mark(sg.id, 0, true).await;
        blocks.mark(sf.id, 0, true).await;
        assert_eq!(
            missing(&blocks),
            Missing {
                files: 1,
                blocks: 2,
                bytes: bs as u64 + 10
            }
        );
    }

    #[test]
    fn old_marks_move_to_their_own_tag_and_change_records_stay() {
        let kv = MemoryKv::new();
        // an engine written by an older mirror: marks under `L`, beside a change record
        let old = |id: SliceId, index: u32| {
            let mut k = synced_key(id, index);
            k[0] = OLD_SYNCED;
            k
        };
        let marks: Vec<(SliceId, u32)> = (1..=1500u64)
            .map(|i| (SliceId(i), (i % 3) as u32))
            .collect();
        kv::txn(&kv, |t| {
            for &(id, index) in &marks {
                t.put(&old(id, index), &[]);
            }
            t.put(&kv::log_key(strait_fs_core::Version(7)), b"a change record");
            Ok(())
        })
        .unwrap();

        // every mark moves, in more than one batch, and the record stays where it was
        assert_eq!(move_old_marks(&kv).unwrap(), marks.len() as u64);
        kv::read(&kv, |t| {
            for &(id, index) in &marks {
                assert!(t.get(&synced_key(id, index))?.is_some(), "{id} {index}");
                assert!(t.get(&old(id, index))?.is_none(), "{id} {index}");
            }
            assert_eq!(
                t.get(&kv::log_key(strait_fs_core::Version(7)))?.as_deref(),
                Some(&b"a change record"[..])
            );
            Ok(())
        })
        .unwrap();

        // a second start finds nothing left to move
        assert_eq!(move_old_marks(&kv).unwrap(), 0);
    }
}
