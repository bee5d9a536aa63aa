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
        if self.here_already(local, &key, id, index, len, crc).await {
            self.done(k, len).await;
            return Ok(());
        }
        self.limiter.take(len as u64).await;
        let data = match self.fetch_primary(&key, len, crc).await {
            Ok(d) => d,
            Err(ObjectError::NotFound(_)) => {
                // purged at the primary: a later record frees the slice here too
                let kv = self.kv.clone();
                let dead = tokio::task::spawn_blocking(move || {
                    kv::read(kv.as_ref(), |t| Ok(t.get(&keys::deadslice(id))?.is_some()))
                })
                .await
                .ok()
                .and_then(|r| r.ok())
                .unwrap_or(false);
                if !dead {
                    self.error(format!(
                        "block {key} is missing from the primary's store: not copied"
                    ));
                }
                self.done(k, len).await;
                return Ok(());
            }
            Err(e) => return Err(format!("copy block {key}: {e}")),
        };
        self.keep(local, &key, data, id, index, len).await?;
        self.done(k, len).await;
        Ok(())
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
            if verify(key, &d, len, crc).is_ok() {
                self.mark(id, index, true).await;
                return true;
            }
        }
        false
    }

    /// Write a block read from the primary's store to this region's, count it and mark it.
    pub(super) async fn keep(
        &self,
        local: &DynStore,
        key: &str,
        data: Bytes,
        id: SliceId,
        index: u32,
        len: u32,
    ) -> Result<(), String> {
        retry(&format!("write block {key} to this region's store"), || {
            local.put(key, data.clone())
        })
        .await
        .map_err(|e| format!("write block {key} to this region's store: {e}"))?;
        self.counters.copied_blocks.fetch_add(1, Ordering::Relaxed);
        self.counters
            .copied_bytes
            .fetch_add(len as u64, Ordering::Relaxed);
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
