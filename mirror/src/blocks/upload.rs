//! Blocks written at this region, uploaded to the primary's store before their write commits.

use std::sync::atomic::Ordering;

use strait_fs_core::layout::{block_count, block_key, block_len};
use strait_fs_core::meta::SliceRef;
use strait_fs_core::vfs::cache::verify;

use super::{retry, Blocks};

impl Blocks {
    /// Before a write made here is committed at the primary: every block of `slices` must be
    /// in the primary's store (the mount wrote them to this region's).
    pub async fn upload(&self, slices: &[SliceRef], bs: u32) -> Result<(), String> {
        // without a store of its own, the region's mounts wrote to the primary's directly
        let Some(local) = &self.local else {
            return Ok(());
        };
        let primary = self.primary().await?;
        for s in slices.iter().filter(|s| !s.id.is_hole()) {
            for index in 0..block_count(s.size, bs) {
                let len = block_len(s.size, bs, index);
                let key = block_key(s.id, index, len);
                // blocks are immutable and new: a put of one the primary has (a retried
                // write) is harmless, so no round trip asks first
                let data = retry(&format!("read block {key}"), || local.get(&key))
                    .await
                    .map_err(|e| format!("read block {key} written in this region: {e}"))?;
                if let Some(crc) = s.crcs.get(index as usize) {
                    verify(&key, &data, len, *crc).map_err(|e| e.to_string())?;
                }
                retry(&format!("upload block {key}"), || {
                    primary.put(&key, data.clone())
                })
                .await
                .map_err(|e| format!("upload block {key} to the primary's store: {e}"))?;
                self.counters
                    .uploaded_blocks
                    .fetch_add(1, Ordering::Relaxed);
                // written here by the mount: in this region's store as well
                self.mark(s.id, index, true).await;
            }
        }
        Ok(())
    }
}
