//! The copier: takes queued blocks in version order and copies them from the primary's store
//! to this region's, within a bandwidth limit.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strait_fs_core::kv;
use strait_fs_core::layout::block_key;
use strait_fs_core::meta::keys;
use strait_fs_core::object::{Bytes, DynStore, ObjectError};
use strait_fs_core::vfs::cache::verify;
use strait_fs_core::SliceId;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::keys::{u32_at, COPY};
use super::{retry, Blocks, RETRY_PAUSE, SCAN_PAGE};

/// A token bucket over bytes (the background copy's bandwidth limit).
pub(super) struct Limiter {
    pub(super) rate: f64,
    pub(super) state: tokio::sync::Mutex<(f64, Instant)>,
}

impl Limiter {
    async fn take(&self, n: u64) {
        if self.rate <= 0.0 {
            return;
        }
        let wait = {
            let mut s = self.state.lock().await;
            let now = Instant::now();
            // at most a tenth of a second's worth saved up
            let burst = self.rate / 10.0;
            s.0 = (s.0 + now.duration_since(s.1).as_secs_f64() * self.rate).min(burst);
            s.1 = now;
            s.0 -= n as f64;
            if s.0 < 0.0 {
                Duration::from_secs_f64(-s.0 / self.rate)
            } else {
                Duration::ZERO
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

impl Blocks {
    /// Copy one queued block.
    async fn copy_one(&self, k: Vec<u8>, v: Vec<u8>) -> Result<(), String> {
        let (Some(id), Some(index), Some(len), Some(crc)) = (
            keys::u64_at(&k, 9).map(SliceId),
            u32_at(&k, 17),
            u32_at(&v, 0),
            u32_at(&v, 4),
        ) else {
            self.error(format!(
                "a malformed entry in the copy queue ({} bytes): dropped",
                k.len()
            ));
            self.done(k, 0).await;
            return Ok(());
        };
        let Some(local) = &self.local else {
            return Ok(());
        };
        let key = block_key(id, index, len);
        // A slice a later record made dead here (a compaction that rewrote its window, a
        // truncate, a deletion) is read by nobody who asks this region's metadata: its copy
        // would only cross the link to be deleted. A reader still holding an older list
        // reads it from the primary's store, which keeps it until this mirror has applied
        // past its death.
        if self.slice_dead(id).await {
            self.counters
                .skipped_dead_blocks
                .fetch_add(1, Ordering::Relaxed);
            self.counters
                .skipped_dead_bytes
                .fetch_add(len as u64, Ordering::Relaxed);
            self.done(k, len).await;
            return Ok(());
        }
        if self.here_already(local, &key, id, index, len, crc).await {
            self.done(k, len).await;
            return Ok(());
        }
        self.limiter.take(len as u64).await;
        // One fetch across the link for the copier and a reader waiting for the same block:
        // whichever asks first fetches, the other takes its bytes.
        let cell = self.inflight.lock().entry(key.clone()).or_default().clone();
        let mut mine: Option<Result<Bytes, ObjectError>> = None;
        let shared = cell
            .get_or_init(|| async {
                let r = self.fetch_primary(&key, len, crc).await;
                let out = match &r {
                    Ok(d) => Ok(d.clone()),
                    Err(ObjectError::NotFound(e)) => Err(Status::not_found(format!(
                        "block {key} is not in the primary's store ({e})"
                    ))),
                    Err(e) => Err(Status::unavailable(format!(
                        "fetch block {key} from the primary's store: {e}"
                    ))),
                };
                mine = Some(r);
                out
            })
            .await
            .clone();
        self.inflight.lock().remove(&key);
        // (the bytes, whether this copy brought them across the link)
        let (data, crossed) = match mine {
            Some(Ok(d)) => (d, true),
            Some(Err(ObjectError::NotFound(_))) => {
                // purged at the primary: a later record frees the slice here too
                if !self.slice_dead(id).await {
                    self.error(format!(
                        "block {key} is missing from the primary's store: not copied"
                    ));
                }
                self.done(k, len).await;
                return Ok(());
            }
            Some(Err(e)) => return Err(format!("copy block {key}: {e}")),
            // a reader's fetch brought it, counted as its (and keeps it here, unless its
            // writes are all busy)
            None => {
                let d = shared.map_err(|s| format!("copy block {key}: {}", s.message()))?;
                if self.is_marked(id, index).await {
                    self.done(k, len).await;
                    return Ok(());
                }
                (d, false)
            }
        };
        self.keep(local, data, id, index, len, crossed).await?;
        self.done(k, len).await;
        Ok(())
    }

    /// Whether slice `id` is dead in this mirror's metadata (false when that cannot be read).
    async fn slice_dead(&self, id: SliceId) -> bool {
        super::kv_call(&self.kv, move |kv| {
            kv::read(kv, |t| Ok(t.get(&keys::deadslice(id))?.is_some()))
        })
        .await
        .and_then(|r| r.ok())
        .unwrap_or(false)
    }

    /// Whether block `key` is in this region's store already: marked (it landed here checked:
    /// an upload of this region's write, a read-through, a copy), or present with its checksum
    /// (a write of this region, an old primary's own store when it rejoined as a mirror; then
    /// it is marked now). A block under the same key with other bytes (an id a lost history
    /// used too) is not.
    pub(super) async fn here_already(
        &self,
        local: &DynStore,
        key: &str,
        id: SliceId,
        index: u32,
        len: u32,
        crc: u32,
    ) -> bool {
        if self.is_marked(id, index).await {
            return true;
        }
        if let Ok(d) = local.get(key).await {
            // (durable first: it may have been written since the last sync)
            if verify(key, &d, len, crc).is_ok() && self.sync_group.sync(local).await.is_ok() {
                self.mark(id, index, true).await;
                return true;
            }
        }
        false
    }

    /// Write a block read from the primary's store to this region's, make it durable, mark it,
    /// and count it as
    /// copied when `crossed` (this copy brought it across the link; not when a reader's fetch
    /// did, which counted it).
    pub(super) async fn keep(
        &self,
        local: &DynStore,
        data: Bytes,
        id: SliceId,
        index: u32,
        len: u32,
        crossed: bool,
    ) -> Result<(), String> {
        let key = &block_key(id, index, len);
        retry(&format!("write block {key} to this region's store"), || {
            local.put(key, data.clone())
        })
        .await
        .map_err(|e| format!("write block {key} to this region's store: {e}"))?;
        // durable before it is marked present (and its queue entry goes): a power loss must
        // not leave a mark, or an empty queue, for a block the store lost. Concurrent copies
        // share one sync.
        self.sync_group
            .sync(local)
            .await
            .map_err(|e| format!("sync this region's store after writing block {key}: {e}"))?;
        if crossed {
            self.counters.copied_blocks.fetch_add(1, Ordering::Relaxed);
            self.counters
                .copied_bytes
                .fetch_add(len as u64, Ordering::Relaxed);
        }
        self.mark(id, index, true).await;
        Ok(())
    }

    /// The copy workers: take queued blocks in version order, `sync_concurrency` at a time.
    pub async fn run_copier(self: Arc<Self>, stop: CancellationToken) {
        if self.local.is_none() {
            return;
        }
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let busy: Arc<Mutex<HashSet<Vec<u8>>>> = Arc::default();
        let mut failed: HashMap<Vec<u8>, Instant> = HashMap::new();
        let failures: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let mut after: Option<Vec<u8>> = None;
        loop {
            if stop.is_cancelled() {
                return;
            }
            for k in failures.lock().drain(..) {
                failed.insert(k, Instant::now() + RETRY_PAUSE);
            }
            let now = Instant::now();
            failed.retain(|_, until| *until > now);
            let kv = self.kv.clone();
            let from = after.clone();
            let page = tokio::task::spawn_blocking(move || {
                kv::read(kv.as_ref(), |t| t.scan(&[COPY], from.as_deref(), SCAN_PAGE))
            })
            .await;
            let page = match page {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => {
                    self.error(format!("read the copy queue: {e}"));
                    Vec::new()
                }
                Err(e) => {
                    self.error(format!("read the copy queue: {e}"));
                    Vec::new()
                }
            };
            if page.is_empty() {
                after = None;
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
            let full = page.len() == SCAN_PAGE;
            after = page.last().map(|p| p.0.clone());
            let mut started = 0;
            for (k, v) in page {
                if failed.contains_key(&k) || busy.lock().contains(&k) {
                    continue;
                }
                let permit = tokio::select! {
                    _ = stop.cancelled() => return,
                    p = slots.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                };
                busy.lock().insert(k.clone());
                started += 1;
                let me = self.clone();
                let busy = busy.clone();
                let failures = failures.clone();
                tokio::spawn(async move {
                    let r = me.copy_one(k.clone(), v).await;
                    if let Err(msg) = r {
                        me.error(format!("{msg}; tried again in {RETRY_PAUSE:?}"));
                        failures.lock().push(k.clone());
                    }
                    busy.lock().remove(&k);
                    drop(permit);
                });
            }
            if full && started == 0 {
                // a page of blocks all busy or waiting to be tried again: do not spin
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if !full {
                // the end of the queue: start over from its head once the workers free up
                after = None;
                if started == 0 {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = self.wake.notified() => {}
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    }
                }
            }
        }
    }
}
