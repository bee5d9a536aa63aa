//! Blocks written at this region, uploaded to the primary's store before their write commits.
//!
//! # To ensure correctness
//! - The router uploads only blocks of slices whose ids the primary gave this mirror for
//!   the writing mount (`router.rs`); that alone keeps an upload off another writer's keys.
//! - An upload never replaces an object: each block goes with
//!   [`ObjectStore::put_if_absent`](strait_fs_core::object::ObjectStore::put_if_absent). A
//!   block already there with the same bytes is a write sent again (a retry), and is taken
//!   as uploaded; one with other bytes is an error, logged, and the write fails with
//!   nothing changed. On Garage, which ignores `If-None-Match` on a put, the guard is a
//!   `head` before the put: best effort against a writer racing with the upload.

use std::sync::atomic::Ordering;

use strait_fs_core::layout::{block_count, block_key, block_len};
use strait_fs_core::meta::SliceRef;
use strait_fs_core::object::PutIfAbsent;
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
        let primary = &primary;
        for s in slices.iter().filter(|s| !s.id.is_hole()) {
            for index in 0..block_count(s.size, bs) {
                let len = block_len(s.size, bs, index);
                let key = block_key(s.id, index, len);
                let data = retry(&format!("read block {key}"), || local.get(&key))
                    .await
                    .map_err(|e| format!("read block {key} written in this region: {e}"))?;
                if let Some(crc) = s.crcs.get(index as usize) {
                    verify(&key, &data, len, *crc).map_err(|e| e.to_string())?;
                }
                let put = retry(&format!("upload block {key}"), || {
                    primary.put_if_absent(&key, data.clone())
                })
                .await
                .map_err(|e| format!("upload block {key} to the primary's store: {e}"))?;
                if put == PutIfAbsent::Exists {
                    let there = retry(&format!("read block {key} back"), || primary.get(&key))
                        .await
                        .map_err(|e| {
                            format!("read block {key}, already in the primary's store: {e}")
                        })?;
                    if there != data {
                        let why = format!(
                            "block {key} is already in the primary's store with other content \
                             ({} bytes there, crc32 {:08x}; {} bytes here, crc32 {:08x}): it was \
                             not overwritten",
                            there.len(),
                            crc32fast::hash(&there),
                            data.len(),
                            crc32fast::hash(&data)
                        );
                        // logged by the router, which fails the write
                        self.counters.errors.fetch_add(1, Ordering::Relaxed);
                        *self.last_error.lock() = why.clone();
                        return Err(why);
                    }
                    // the same bytes: this write was sent before (a retry)
                }
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

impl Blocks {
    /// At a mirror promoted to primary, before a write made here commits: the mount wrote
    /// every block of `slices` to this region's store, so none is to be fetched elsewhere.
    pub async fn mark_written(&self, slices: &[SliceRef], bs: u32) {
        if self.local.is_none() {
            return;
        }
        let blocks: Vec<_> = slices
            .iter()
            .filter(|s| !s.id.is_hole())
            .flat_map(|s| (0..block_count(s.size, bs)).map(move |i| (s.id, i)))
            .collect();
        // one transaction for the write's blocks: this is the new primary's write path
        if let Err(e) = super::synced::mark_present(&self.kv, blocks).await {
            self.error(e);
        }
    }
}
