//! The slice lists of chunks, cached in memory for the readers, the prefetcher and
//! compaction; a write or a compaction drops a chunk's entry.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::Result;
use crate::meta::{Ino, SliceRef};
use crate::SliceId;

use super::Shared;

/// Chunks whose slice lists are kept in memory.
const CHUNK_CACHE_ENTRIES_MAX: usize = 4096;

/// A chunk's slice list, shared by the readers of the chunk cache.
pub(super) type SliceList = Arc<ChunkView>;

/// A chunk's slices and, at a mirror, which of their blocks the region's store does not hold
/// yet (by slice id: bit `i % 8` of byte `i / 8` stands for block `i`).
#[derive(Default)]
pub(super) struct ChunkView {
    pub(super) slices: Vec<SliceRef>,
    pub(super) unsynced: HashMap<SliceId, Vec<u8>>,
}

impl ChunkView {
    pub(super) fn unsynced(&self, id: SliceId, index: u32) -> bool {
        self.unsynced
            .get(&id)
            .and_then(|m| m.get(index as usize / 8))
            .is_some_and(|b| b & (1 << (index % 8)) != 0)
    }
}

impl Shared {
    pub(super) fn chunk_changed(self: &Arc<Self>, ino: Ino, idx: u32) {
        self.chunks.lock().remove(&(ino, idx));
        self.maybe_compact(ino, idx);
    }

    pub(super) fn forget_inode(&self, ino: Ino) {
        self.chunks.lock().retain(|k, _| k.0 != ino);
    }

    pub(super) fn slices(&self, ino: Ino, idx: u32) -> Result<SliceList> {
        if let Some(s) = self.chunks.lock().get(&(ino, idx)) {
            return Ok(s.clone());
        }
        let (slices, unsynced) = self.meta.read_chunk_unsynced(ino, idx)?;
        Ok(self.keep_chunk(ino, idx, slices, unsynced))
    }

    /// Cache the slice list of a chunk as the metadata service gave it (with, at a mirror,
    /// the bitmaps of the blocks the region's store does not hold yet).
    pub(super) fn keep_chunk(
        &self,
        ino: Ino,
        idx: u32,
        slices: Vec<SliceRef>,
        unsynced: Vec<Vec<u8>>,
    ) -> SliceList {
        let unsynced = if unsynced.len() == slices.len() {
            slices
                .iter()
                .zip(unsynced)
                .filter(|(_, m)| !m.is_empty())
                .map(|(s, m)| (s.id, m))
                .collect()
        } else {
            HashMap::new()
        };
        let s = Arc::new(ChunkView { slices, unsynced });
        let mut c = self.chunks.lock();
        if c.len() >= CHUNK_CACHE_ENTRIES_MAX {
            c.clear();
        }
        c.insert((ino, idx), s.clone());
        s
    }
}
