//! The read-through fetch: a block a mount waits for, from this region's store when it is
//! there and sound, else from the primary's ahead of the queue, kept here on the way.

use std::sync::atomic::Ordering;

use strait_fs_core::object::{Bytes, ObjectError};
use strait_fs_core::vfs::cache::verify;
use tonic::Status;

use super::synced::mark;
use super::{retry, Blocks};
use strait_fs_core::layout::parse_block_key;

pub(super) type Cell = tokio::sync::OnceCell<Result<Bytes, Status>>;

impl Blocks {
    /// Fetch a block from the primary's store and check it (twice, in case it was damaged
    /// on the way). After a promotion, a block the new primary's store lacks is looked for in
    /// the stores of the primaries before it, newest first.
    pub(super) async fn fetch_primary(
        &self,
        key: &str,
        len: u32,
        crc: u32,
    ) -> Result<Bytes, ObjectError> {
        let stores = self.primary_stores().await.map_err(ObjectError::Fatal)?;
        let mut failed: Option<ObjectError> = None;
        let mut not_found = None;
        for (url, store) in &stores {
            let mut last = String::new();
            for _ in 0..2 {
                let got = retry(
                    &format!("read block {key} from the primary's store"),
                    || store.get(key),
                )
                .await;
                match got {
                    Ok(data) => match verify(key, &data, len, crc) {
                        Ok(()) => return Ok(data),
                        Err(e) => last = e.to_string(),
                    },
                    Err(ObjectError::NotFound(e)) => {
                        not_found = Some(ObjectError::NotFound(e));
                        last.clear();
                        break;
                    }
                    Err(e) => {
                        last.clear();
                        failed = Some(e);
                        break;
                    }
                }
            }
            if !last.is_empty() {
                failed = Some(ObjectError::Fatal(format!(
                    "{last} (the copy of the block in {url})"
                )));
            }
        }
        // not found anywhere is final (the copier drops the block); a store that could not
        // answer may still hold it
        Err(failed
            .or(not_found)
            .unwrap_or_else(|| ObjectError::NotFound(key.to_string())))
    }

    /// A block a mount is waiting for (FetchBlock): from this region's store when it is
    /// there and sound, else from the primary's, ahead of the queue, kept here on the way.
    pub async fn fetch(
        &self,
        key: &str,
        len: u32,
        crc: u32,
        reason: &str,
    ) -> Result<Bytes, Status> {
        let (id, index) = match parse_block_key(key) {
            Some((id, index, l)) if l == len => (id, index),
            _ => {
                return Err(Status::invalid_argument(format!(
                    "{key:?} (of {len} bytes) is not a block key"
                )))
            }
        };
        // What a mount says (the reason, the CRC) is taken as a hint, never as a fact that
        // changes this region's store: a block "missing" is looked for here first, and a copy
        // that does not match the CRC given is replaced only by one from the primary's store
        // that does (a wrong CRC leaves a sound copy alone).
        let check_local = match reason {
            // the mount's view of the marks may be older than the marks
            "unsynced" => self.is_marked(id, index).await,
            _ => true,
        };
        let mut local_mismatch = false;
        if let (Some(local), true) = (&self.local, check_local) {
            match local.get(key).await {
                Ok(d) => match verify(key, &d, len, crc) {
                    Ok(()) => return Ok(d),
                    Err(e) => {
                        tracing::error!(
                            "{e}: this region's copy does not match; fetched from the primary's store, and replaced once that copy matches"
                        );
                        local_mismatch = true;
                    }
                },
                Err(ObjectError::NotFound(_)) => {
                    if reason == "corrupt" {
                        tracing::warn!(
                            "block {key}: a mount found it corrupt; it is gone here now"
                        );
                    }
                    self.mark(id, index, false).await;
                }
                Err(e) => tracing::warn!("read block {key} from this region's store: {e}"),
            }
        }
        let cell = {
            let mut m = self.inflight.lock();
            m.entry(key.to_string()).or_default().clone()
        };
        let got = cell
            .get_or_init(|| async {
                let permit = self.priority.acquire().await;
                let r = self.fetch_primary(key, len, crc).await;
                drop(permit);
                match r {
                    Ok(d) if local_mismatch => {
                        // the primary's copy matches: this region's was corrupt
                        self.counters.corrupt_local.fetch_add(1, Ordering::Relaxed);
                        self.counters.fallback_reads.fetch_add(1, Ordering::Relaxed);
                        self.counters
                            .fallback_bytes
                            .fetch_add(len as u64, Ordering::Relaxed);
                        if let Some(local) = &self.local {
                            let put = retry(&format!("replace block {key}"), || {
                                local.put(key, d.clone())
                            })
                            .await;
                            match put {
                                Ok(()) => self.mark(id, index, true).await,
                                Err(e) => {
                                    tracing::warn!("replace the corrupt block {key}: {e}");
                                    self.mark(id, index, false).await;
                                }
                            }
                        }
                        Ok(d)
                    }
                    Ok(d) => {
                        self.counters.fallback_reads.fetch_add(1, Ordering::Relaxed);
                        self.counters
                            .fallback_bytes
                            .fetch_add(len as u64, Ordering::Relaxed);
                        // kept in the region's store behind the reader's back, holding a
                        // slot so that these writes stay bounded (without one, the block is
                        // left to the queue or the next read)
                        if let (Some(local), Ok(slot)) = (
                            self.local.clone(),
                            self.priority_puts.clone().try_acquire_owned(),
                        ) {
                            let (k, data, kv) = (key.to_string(), d.clone(), self.kv.clone());
                            tokio::spawn(async move {
                                match retry(&format!("write block {k}"), || {
                                    local.put(&k, data.clone())
                                })
                                .await
                                {
                                    Ok(()) => {
                                        if let Err(e) = mark(&kv, id, index, true).await {
                                            tracing::warn!("{e}");
                                        }
                                    }
                                    Err(e) => {
                                        tracing::warn!("keep block {k} in this region's store: {e}")
                                    }
                                }
                                drop(slot);
                            });
                        }
                        Ok(d)
                    }
                    Err(ObjectError::NotFound(e)) => {
                        // not asked above: this region's copy is the last resort
                        if let (Some(local), false) = (&self.local, check_local) {
                            if let Ok(d) = local.get(key).await {
                                if verify(key, &d, len, crc).is_ok() {
                                    return Ok(d);
                                }
                            }
                        }
                        Err(Status::not_found(format!(
                            "block {key} is in neither this region's store nor the primary's ({e})"
                        )))
                    }
                    Err(e) => Err(Status::unavailable(format!(
                        "fetch block {key} from the primary's store: {e}"
                    ))),
                }
            })
            .await
            .clone();
        self.inflight.lock().remove(key);
        if let Err(st) = &got {
            self.error(st.message().to_string());
        }
        got
    }
}
