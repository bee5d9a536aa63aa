//! The read path: a chunk's visible bytes from its slices' blocks, each block from memory,
//! the disk cache or the object store (checked against its CRC; fetches of one block by
//! concurrent readers are shared), and readahead into the cache.

use std::sync::Arc;
use std::time::Duration;

use backon::{ConstantBuilder, Retryable};
use bytes::Bytes;

use crate::error::{Error, Result};
use crate::layout::{block_key, block_len, visible_segments, CHUNK_SIZE};
use crate::meta::{Ino, SliceRef};
use crate::object::ObjectError;

use super::chunks::ChunkView;
use super::{cache, retry_store, Shared};

/// Distinct corrupt blocks remembered for logging once.
const REPORTED_CORRUPT_MAX: usize = 10_000;

/// Reads of a block from the object store whose bytes fail their check: the first, and one
/// more at once in case they were damaged on the way.
const STORE_READS_MAX: usize = 2;
const REREAD: ConstantBuilder = ConstantBuilder::new()
    .with_delay(Duration::ZERO)
    .with_max_times(STORE_READS_MAX - 1);

/// How one read of a block from this region's object store failed.
enum StoreRead {
    /// Not in the store, and a mirror to ask instead.
    Missing,
    /// The bytes arrived but fail their length or CRC check.
    Damaged(Error),
    /// Any other failure (transient ones were already retried by [`retry_store`]).
    Failed(Error),
}

impl StoreRead {
    /// Whether reading the block again may help: only when its bytes arrived damaged.
    fn again(&self) -> bool {
        matches!(self, StoreRead::Damaged(_))
    }
}

/// One block fetch that concurrent readers share.
pub(super) type BlockCell = tokio::sync::OnceCell<Result<Bytes, BlockError>>;

#[derive(Clone, Debug)]
pub(super) enum BlockError {
    Corrupt(String),
    Other(String),
}

impl Shared {
    /// One block, from memory, the disk cache or the object store (checked against its CRC).
    /// `unsynced`: at a mirror, the region's store does not hold it yet (ask the mirror
    /// without asking the store first).
    async fn block(
        self: &Arc<Self>,
        slice: &SliceRef,
        index: u32,
        unsynced: bool,
    ) -> Result<Bytes> {
        let len = block_len(slice.size, self.block_size, index);
        let key = block_key(slice.id, index, len);
        if let Some(b) = self.cache.get_mem(&key) {
            return Ok(b);
        }
        let crc = *slice.crcs.get(index as usize).ok_or_else(|| {
            Error::corrupt(format!("slice {} has no crc for block {index}", slice.id))
        })?;
        let cell = {
            let mut inflight = self.inflight.lock();
            inflight.entry(key.clone()).or_default().clone()
        };
        let me = self.clone();
        let k2 = key.clone();
        let got = cell
            .get_or_init(|| async move {
                me.fetch(&k2, len, crc, unsynced)
                    .await
                    .map_err(|e| match e {
                        Error::CorruptBlock { reason, .. } => BlockError::Corrupt(reason),
                        other => BlockError::Other(other.to_string()),
                    })
            })
            .await
            .clone();
        self.inflight.lock().remove(&key);
        match got {
            Ok(b) => Ok(b),
            Err(BlockError::Corrupt(reason)) => Err(Error::CorruptBlock { key, reason }),
            Err(BlockError::Other(msg)) => Err(Error::Object(ObjectError::Fatal(msg))),
        }
    }

    /// Log a corrupt block once per mount (a reader retrying must not flood the log).
    pub(super) fn report_corrupt(&self, e: &Error) {
        if let Error::CorruptBlock { key, .. } = e {
            let mut seen = self.reported_corrupt.lock();
            if seen.len() < REPORTED_CORRUPT_MAX && seen.insert(key.clone()) {
                tracing::error!("{e}: the read fails with EIO");
            }
        }
    }

    async fn fetch(
        self: &Arc<Self>,
        key: &str,
        len: u32,
        crc: u32,
        unsynced: bool,
    ) -> Result<Bytes> {
        if self.cache.has_disk() {
            let cache = self.cache.clone();
            let k = key.to_string();
            if let Ok(Some(b)) =
                tokio::task::spawn_blocking(move || cache.get_disk(&k, len, crc)).await
            {
                self.cache.put_mem(key, b.clone());
                return Ok(b);
            }
        }
        let data = if unsynced && self.fallback_offered() {
            // the mirror says this region's store does not hold it yet: no store slot, no miss
            self.fetch_fallback(key, len, crc, "unsynced").await?
        } else {
            self.fetch_store(key, len, crc).await?
        };
        self.cache.put_mem(key, data.clone());
        if self.cache.has_disk() {
            let cache = self.cache.clone();
            let k = key.to_string();
            let d = data.clone();
            tokio::task::spawn_blocking(move || cache.put_disk(&k, &d));
        }
        Ok(data)
    }

    /// A block from this region's object store (through the mirror when it is missing there
    /// or corrupt), checked.
    async fn fetch_store(&self, key: &str, len: u32, crc: u32) -> Result<Bytes> {
        let permit = self
            .download_slots
            .acquire()
            .await
            .map_err(|_| Error::Meta("download slots closed".into()))?;
        let read = || async {
            let got = retry_store(&format!("read block {key}"), || self.store.get(key)).await;
            let data = match got {
                Ok(d) => d,
                // not in this region's store yet: the mirror gets it from the primary's
                Err(Error::CorruptBlock { .. }) if self.fallback_offered() => {
                    return Err(StoreRead::Missing)
                }
                Err(e) => return Err(StoreRead::Failed(e)),
            };
            cache::verify(key, &data, len, crc)
                .map(|()| data)
                .map_err(StoreRead::Damaged)
        };
        let got = read
            .retry(REREAD)
            // no timer for a pause of zero: the second read follows the first at once
            .sleep(|_| std::future::ready(()))
            .when(StoreRead::again)
            .await;
        match got {
            Ok(data) => Ok(data),
            Err(StoreRead::Missing) => {
                // the wait across regions holds a fallback slot, not a download slot
                drop(permit);
                self.fetch_fallback(key, len, crc, "missing").await
            }
            Err(StoreRead::Damaged(e)) if self.fallback_offered() => {
                tracing::warn!(
                    "{e}: in this region's object store; the mirror fetches it again from the primary's"
                );
                drop(permit);
                self.fetch_fallback(key, len, crc, "corrupt").await
            }
            Err(StoreRead::Damaged(e)) => {
                self.report_corrupt(&e);
                Err(e)
            }
            Err(StoreRead::Failed(e)) => Err(e),
        }
    }

    /// `[from, to)` of a chunk as a view of one cached block, when the range is one slice's
    /// bytes within one block (a sequential reader's requests nearly always are): no buffer
    /// to fill, and the reply is written straight from the block. None otherwise.
    pub(super) async fn read_in_one_block(
        self: &Arc<Self>,
        view: &ChunkView,
        from: u32,
        to: u32,
    ) -> Result<Option<Bytes>> {
        let segs = visible_segments(&view.slices, from, to);
        let [seg] = segs.as_slice() else {
            return Ok(None);
        };
        let Some(slice) = seg.slice else {
            return Ok(None);
        };
        let bs = self.block_size;
        let (index, in_block) = (seg.off / bs, seg.off % bs);
        if in_block + seg.len > bs {
            return Ok(None);
        }
        let block = self
            .block(slice, index, view.unsynced(slice.id, index))
            .await?;
        let end = (in_block + seg.len) as usize;
        if end > block.len() {
            return Err(Error::corrupt(format!(
                "slice {} is shorter than its references",
                slice.id
            )));
        }
        Ok(Some(block.slice(in_block as usize..end)))
    }

    /// Read `[off, off + buf.len())` of chunk `idx` into `buf` (the range lies in the chunk).
    pub(super) async fn read_chunk(
        self: &Arc<Self>,
        view: &ChunkView,
        from: u32,
        buf: &mut [u8],
    ) -> Result<()> {
        let to = from + buf.len() as u32;
        let bs = self.block_size;
        for seg in visible_segments(&view.slices, from, to) {
            let out = &mut buf[(seg.pos - from) as usize..(seg.pos - from + seg.len) as usize];
            let Some(slice) = seg.slice else {
                out.fill(0);
                continue;
            };
            let mut done = 0u32;
            while done < seg.len {
                let at = seg.off + done;
                let index = at / bs;
                let in_block = at % bs;
                let block = self
                    .block(slice, index, view.unsynced(slice.id, index))
                    .await?;
                let n = (seg.len - done).min(block.len() as u32 - in_block);
                if n == 0 {
                    return Err(Error::corrupt(format!(
                        "slice {} is shorter than its references",
                        slice.id
                    )));
                }
                out[done as usize..(done + n) as usize]
                    .copy_from_slice(&block[in_block as usize..(in_block + n) as usize]);
                done += n;
            }
        }
        Ok(())
    }

    /// Start fetching the blocks of `[off, off + len)` of `ino` into the cache.
    pub(super) fn prefetch(self: &Arc<Self>, ino: Ino, off: u64, len: u64, file_len: u64) {
        let end = (off + len).min(file_len);
        let mut pos = off;
        while pos < end {
            let idx = (pos / CHUNK_SIZE) as u32;
            let from = (pos % CHUNK_SIZE) as u32;
            let to = ((end - idx as u64 * CHUNK_SIZE).min(CHUNK_SIZE)) as u32;
            let Ok(slices) = self.slices(ino, idx) else {
                return;
            };
            for seg in visible_segments(&slices.slices, from, to) {
                let Some(slice) = seg.slice else { continue };
                let first = seg.off / self.block_size;
                let last = (seg.off + seg.len - 1) / self.block_size;
                for index in first..=last {
                    let key = block_key(
                        slice.id,
                        index,
                        block_len(slice.size, self.block_size, index),
                    );
                    if self.cache.get_mem(&key).is_some() || self.inflight.lock().contains_key(&key)
                    {
                        continue;
                    }
                    let me = self.clone();
                    let s = slice.clone();
                    let unsynced = slices.unsynced(slice.id, index);
                    self.rt.spawn(async move {
                        let _ = me.block(&s, index, unsynced).await;
                    });
                }
            }
            pos = idx as u64 * CHUNK_SIZE + to as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_block_that_arrived_damaged_is_read_again() {
        let damaged = cache::verify("k", b"abc", 3, 0).unwrap_err();
        assert!(StoreRead::Damaged(damaged).again());
        assert!(!StoreRead::Missing.again());
        let denied = Error::Object(ObjectError::Fatal("access denied".into()));
        assert!(!StoreRead::Failed(denied).again());
    }
}
