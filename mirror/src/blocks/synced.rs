//! Which blocks this region's store holds: a mark per block, set when a block lands in the
//! store and cleared when it is found missing or corrupt.

use std::collections::HashSet;

use strait_fs_core::kv::{self, DynKv};
use strait_fs_core::meta::SliceRef;

use super::keys::{group, synced_key, u32_at, SYNCED};
use super::{kv_call, Blocks};

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

/// Record that block `index` of slice `id` is in this region's store (`synced`) or not.
pub(super) async fn mark(kv: &DynKv, id: u64, index: u32, synced: bool) -> Result<(), String> {
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
                if s.id == 0 || s.crcs.is_empty() {
                    out.push(vec![]);
                    continue;
                }
                let synced: HashSet<u32> = t
                    .scan(&group(SYNCED, s.id), None, s.crcs.len())?
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

    pub(super) async fn is_marked(&self, id: u64, index: u32) -> bool {
        kv_call(&self.kv, move |kv| {
            kv::read(kv, |t| Ok(t.get(&synced_key(id, index))?.is_some()))
        })
        .await
        .and_then(|r| r.ok())
        .unwrap_or(false)
    }

    pub(super) async fn mark(&self, id: u64, index: u32, synced: bool) {
        if let Err(e) = mark(&self.kv, id, index, synced).await {
            self.error(e);
        }
    }
}
