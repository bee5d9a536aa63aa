//! The deleter: removes this region's copies of the blocks of slices the primary purged.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use strait_fs_core::changelog::decode;
use strait_fs_core::kv;
use strait_fs_core::layout::{block_count, block_key, block_len};
use strait_fs_core::meta::{keys, Format};
use strait_fs_core::SliceId;
use tokio_util::sync::CancellationToken;

use super::keys::{synced_key, u32_at, DELETE};
use super::{corrupt, retry, Blocks, RETRY_PAUSE, SCAN_PAGE};

impl Blocks {
    /// Delete the local copies of purged slices, as their records are applied.
    pub async fn run_deleter(self: Arc<Self>, stop: CancellationToken) {
        let Some(local) = self.local.clone() else {
            return;
        };
        loop {
            let kv = self.kv.clone();
            let page = tokio::task::spawn_blocking(move || {
                kv::read(kv.as_ref(), |t| {
                    let bs = decode::<Format>(
                        &t.get(&keys::setting(keys::FORMAT))?
                            .ok_or_else(|| corrupt("no settings".into()))?,
                    )?
                    .block_size;
                    Ok((bs, t.scan(&[DELETE], None, SCAN_PAGE)?))
                })
            })
            .await;
            let (bs, page) = match page {
                Ok(Ok(p)) => p,
                _ => (0, vec![]),
            };
            if page.is_empty() {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
            for (k, v) in page {
                if stop.is_cancelled() {
                    return;
                }
                let (Some(id), Some(size)) = (keys::u64_at(&k, 9).map(SliceId), u32_at(&v, 0))
                else {
                    self.error("a malformed entry in the deletion queue: dropped".into());
                    continue;
                };
                let mut ok = true;
                for index in 0..block_count(size, bs) {
                    let key = block_key(id, index, block_len(size, bs, index));
                    match retry(&format!("delete block {key}"), || local.delete(&key)).await {
                        Ok(()) => {
                            self.counters.deleted_blocks.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            self.error(format!("delete this region's copy of block {key}: {e}"));
                            ok = false;
                            break;
                        }
                    }
                }
                if ok {
                    let kv = self.kv.clone();
                    let n = block_count(size, bs);
                    let _ = tokio::task::spawn_blocking(move || {
                        kv::txn(kv.as_ref(), |t| {
                            t.delete(&k);
                            for index in 0..n {
                                t.delete(&synced_key(id, index));
                            }
                            Ok(())
                        })
                    })
                    .await;
                } else {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(RETRY_PAUSE) => {}
                    }
                }
            }
        }
    }
}
