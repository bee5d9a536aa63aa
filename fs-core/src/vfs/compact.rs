//! Compaction: a chunk fragmented into many slices is rewritten as one.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::Result;
use crate::layout::block_key;
use crate::meta::{Ino, SliceRef};

use super::chunks::ChunkView;
use super::{retry_store, Shared};

/// Slices in one chunk above which the chunk is compacted.
pub const COMPACT_SLICES_MIN: usize = 24;

impl Shared {
    pub(super) fn maybe_compact(self: &Arc<Self>, ino: Ino, idx: u32) {
        let Ok(slices) = self.slices(ino, idx) else {
            return;
        };
        if slices.slices.len() < COMPACT_SLICES_MIN || !self.compacting.lock().insert((ino, idx)) {
            return;
        }
        let me = self.clone();
        std::thread::spawn(move || {
            if let Err(e) = me.compact(ino, idx) {
                tracing::warn!("compact chunk {idx} of inode {ino}: {e}");
            }
            me.compacting.lock().remove(&(ino, idx));
        });
    }

    /// Rewrite the visible bytes of a fragmented chunk as one slice.
    pub fn compact(self: &Arc<Self>, ino: Ino, idx: u32) -> Result<()> {
        let old = self.meta.read_chunk(ino, idx)?;
        if old.len() < 2 {
            return Ok(());
        }
        let end = old.iter().map(|s| s.pos + s.len).max().unwrap_or(0);
        let mut data = vec![0u8; end as usize];
        let view = ChunkView {
            slices: old.clone(),
            unsynced: HashMap::new(),
        };
        self.rt.block_on(self.read_chunk(&view, 0, &mut data))?;
        let id = self.meta.next_slice_id()?;
        let bs = self.block_size as usize;
        let mut crcs = vec![];
        for (index, block) in data.chunks(bs).enumerate() {
            let key = block_key(id, index as u32, block.len() as u32);
            let bytes = Bytes::copy_from_slice(block);
            self.rt
                .block_on(retry_store(&format!("upload block {key}"), || {
                    self.store.put(&key, bytes.clone())
                }))?;
            crcs.push(crc32fast::hash(block));
        }
        let new = SliceRef {
            id,
            size: end,
            off: 0,
            len: end,
            pos: 0,
            crcs,
        };
        if self.meta.compact_chunk(ino, idx, &old, vec![new])? {
            tracing::debug!(
                "compacted chunk {idx} of inode {ino}: {} slices into one",
                old.len()
            );
        }
        self.drop_chunk(ino, idx);
        Ok(())
    }
}
