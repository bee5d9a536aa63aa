//! The write path of one inode: writes are buffered into slices, full blocks are uploaded in
//! the background as soon as they fill up, and slices are committed to the metadata engine
//! (in the order they were started) on flush, fsync and close.

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::task::JoinHandle;

use super::Shared;
use crate::clock::now_ns;
use crate::error::{Error, Result};
use crate::layout::{block_count, block_key, block_len, CHUNK_SIZE};
use crate::meta::{Ino, SliceRef};
use crate::SliceId;

/// Smallest buffer allocated for a slice's unfinished block.
const TAIL_CAPACITY_MIN: usize = 128 << 10;
/// Memory the unfinished blocks of one file's buffered slices may hold before its writes are
/// committed: random writes (each its own slice, its tail unfinished until a flush) would
/// otherwise buffer everything a writer that never flushes writes, until its close.
pub(super) const WRITE_TAILS_BYTES_MAX: usize = 32 << 20;
/// Times one slice is written again under a new id after the metadata service refused its
/// id as not given to this session (see [`rekey`]).
const REKEY_ATTEMPTS_MAX: u32 = 3;

struct OpenSlice {
    chunk: u32,
    /// Position in the chunk.
    pos: u32,
    /// Bytes written so far.
    len: u32,
    /// Bytes not yet cut into a block (they start at block boundary `uploaded_blocks * bs`).
    tail: Vec<u8>,
    id: SliceId,
    uploads: Vec<JoinHandle<Result<u32>>>,
}

#[derive(Default)]
struct State {
    slices: Vec<OpenSlice>,
    /// The end of the furthest write not yet committed.
    end: u64,
    /// When the last buffered write happened: the file's mtime once committed.
    mtime_ns: i64,
    /// How many flushes failed, and the errno of the last: buffered writes that failed to
    /// commit are gone, and every handle open then must hear of it once (see
    /// [`FileWriter::errors`]), whichever handle's flush (a close, an fsync, a read at the
    /// same mount) met the failure.
    failures: u64,
    last_errno: i32,
}

pub struct FileWriter {
    ino: Ino,
    state: Mutex<State>,
    /// Held while committing, so slices of one file commit in the order they were written.
    commit: Mutex<()>,
}

impl FileWriter {
    pub fn new(ino: Ino) -> Self {
        FileWriter {
            ino,
            state: Mutex::new(State::default()),
            commit: Mutex::new(()),
        }
    }

    /// The end offset of buffered data (0 if none) and the time of the last buffered write.
    pub fn buffered(&self) -> (u64, i64) {
        let st = self.state.lock();
        (st.end, st.mtime_ns)
    }

    pub fn is_dirty(&self) -> bool {
        !self.state.lock().slices.is_empty()
    }

    /// Whether the buffered slices' unfinished blocks hold [`WRITE_TAILS_BYTES_MAX`] or more:
    /// time to commit them.
    pub fn tails_full(&self) -> bool {
        let st = self.state.lock();
        st.slices.iter().map(|s| s.tail.capacity()).sum::<usize>() >= WRITE_TAILS_BYTES_MAX
    }

    /// How many flushes of this file failed so far, and the errno of the last failure. A
    /// handle remembers the count it last reported (as Linux's `errseq_t` does for a file
    /// description): a close or an fsync reports a failure it has not reported yet, even
    /// when another handle's flush met it and the writes it lost were this handle's.
    pub fn errors(&self) -> (u64, i32) {
        let st = self.state.lock();
        (st.failures, st.last_errno)
    }

    pub fn write(&self, shared: &Arc<Shared>, mut off: u64, mut data: &[u8]) -> Result<()> {
        let bs = shared.block_size as usize;
        let mut st = self.state.lock();
        while !data.is_empty() {
            let chunk = (off / CHUNK_SIZE) as u32;
            let pos = (off % CHUNK_SIZE) as u32;
            let n = data.len().min((CHUNK_SIZE - pos as u64) as usize);
            let (mut now, rest) = data.split_at(n);
            let append = st
                .slices
                .last()
                .is_some_and(|s| s.chunk == chunk && s.pos + s.len == pos);
            if !append {
                let id = shared.meta.next_slice_id()?;
                st.slices.push(OpenSlice {
                    chunk,
                    pos,
                    len: 0,
                    tail: Vec::with_capacity(bs.min(n.max(TAIL_CAPACITY_MIN))),
                    id,
                    uploads: vec![],
                });
            }
            let Some(s) = st.slices.last_mut() else {
                return Err(Error::Meta("write buffer lost its slice".into()));
            };
            s.len += n as u32;
            // fill the tail up to one block at a time; every full block starts uploading
            while !now.is_empty() {
                let room = bs - s.tail.len();
                let take = room.min(now.len());
                if s.tail.capacity() < s.tail.len() + take {
                    s.tail.reserve_exact(bs - s.tail.len());
                }
                s.tail.extend_from_slice(&now[..take]);
                now = &now[take..];
                if s.tail.len() == bs {
                    let block = std::mem::replace(
                        &mut s.tail,
                        Vec::with_capacity(bs.min(now.len().max(TAIL_CAPACITY_MIN))),
                    );
                    // bound the memory of blocks in flight: wait here for a free slot
                    let permit = shared
                        .rt
                        .block_on(shared.buffer_slots.clone().acquire_owned())
                        .map_err(|_| Error::Meta("upload buffer closed".into()))?;
                    let index = s.uploads.len() as u32;
                    s.uploads.push(spawn_upload(
                        shared,
                        s.id,
                        index,
                        Bytes::from(block),
                        Some(permit),
                    ));
                }
            }
            st.end = st.end.max(off + n as u64);
            st.mtime_ns = now_ns();
            off += n as u64;
            data = rest;
        }
        Ok(())
    }

    /// Upload everything buffered and commit the slices. A failure drops what was buffered
    /// and is counted (see [`Self::errors`]).
    pub fn flush(&self, shared: &Arc<Shared>) -> Result<()> {
        let _commit = self.commit.lock();
        let (slices, end, mtime_ns) = {
            let mut st = self.state.lock();
            (std::mem::take(&mut st.slices), st.end, st.mtime_ns)
        };
        if slices.is_empty() {
            return Ok(());
        }
        let res = self.commit_slices(shared, slices, mtime_ns);
        let mut st = self.state.lock();
        if st.slices.is_empty() {
            st.end = 0;
        } else {
            st.end = st.end.max(end);
        }
        if let Err(e) = &res {
            st.failures += 1;
            st.last_errno = e.errno();
            tracing::error!(
                "write inode {}: {e}; the writes buffered since the last flush are lost, and \
                 every handle open on the file reports it at its next close or fsync",
                self.ino
            );
        }
        res
    }

    fn commit_slices(
        &self,
        shared: &Arc<Shared>,
        slices: Vec<OpenSlice>,
        mtime_ns: i64,
    ) -> Result<()> {
        let bs = shared.block_size as usize;
        for mut s in slices {
            if !s.tail.is_empty() {
                let index = s.uploads.len() as u32;
                let mut block = std::mem::take(&mut s.tail);
                debug_assert!(block.len() <= bs);
                // a partial block may sit in the memory cache: do not keep a whole block's capacity
                block.shrink_to_fit();
                s.uploads
                    .push(spawn_upload(shared, s.id, index, Bytes::from(block), None));
            }
            let mut crcs = Vec::with_capacity(s.uploads.len());
            let mut failed = None;
            for h in s.uploads {
                match shared.rt.block_on(h) {
                    Ok(Ok(crc)) => crcs.push(crc),
                    Ok(Err(e)) => failed = Some(e),
                    Err(e) => failed = Some(Error::Meta(format!("upload task: {e}"))),
                }
            }
            if let Some(e) = failed {
                return Err(e);
            }
            let mut slice = SliceRef {
                id: s.id,
                size: s.len,
                off: 0,
                len: s.len,
                pos: s.pos,
                crcs,
            };
            let mut rekeyed = 0;
            loop {
                match shared
                    .meta
                    .write_slice(self.ino, s.chunk, slice.clone(), mtime_ns)
                {
                    Ok(_) => break,
                    Err(Error::SliceNotAllocated(why)) if rekeyed < REKEY_ATTEMPTS_MAX => {
                        rekeyed += 1;
                        tracing::info!(
                            "write inode {}: {why}; writing its {} bytes again under a new slice id",
                            self.ino,
                            slice.size
                        );
                        slice = rekey(shared, slice)?;
                    }
                    Err(e) => return Err(e),
                }
            }
            shared.chunk_changed(self.ino, s.chunk);
        }
        Ok(())
    }
}

/// The blocks of `slice` copied under a fresh slice id, for a slice whose id the metadata
/// service refused (a site daemon that restarted forgot the ranges it gave this session).
/// Each block is read back (from the memory cache when it is there), checked against its
/// CRC32 and written under the new id; the old objects are left to `strait gc`, which
/// removes unreferenced objects past its grace, and dropped from this mount's caches: the
/// daemon that refused the id may hand it to another writer, whose block this mount must
/// then read, not ours. Returns the slice under its new id.
fn rekey(shared: &Arc<Shared>, slice: SliceRef) -> Result<SliceRef> {
    let bs = shared.block_size;
    let id = shared.meta.next_slice_id()?;
    for index in 0..block_count(slice.size, bs) {
        let len = block_len(slice.size, bs, index);
        let old = block_key(slice.id, index, len);
        let data = match shared.cache.get_mem(&old) {
            Some(d) => d,
            None => shared
                .rt
                .block_on(super::retry_store(&format!("read block {old}"), || {
                    shared.store.get(&old)
                }))?,
        };
        let crc = slice.crcs.get(index as usize).copied().ok_or_else(|| {
            Error::Meta(format!(
                "slice {} has {} CRCs for block {index}",
                slice.id,
                slice.crcs.len()
            ))
        })?;
        super::cache::verify(&old, &data, len, crc)?;
        let new = block_key(id, index, len);
        shared
            .rt
            .block_on(super::retry_store(&format!("upload block {new}"), || {
                shared.store.put(&new, data.clone())
            }))?;
        shared.cache.put_mem(&new, data);
        shared.cache.remove(&old);
    }
    Ok(SliceRef { id, ..slice })
}

/// Upload one block in the background with bounded retries; resolves to its CRC32.
fn spawn_upload(
    shared: &Arc<Shared>,
    id: SliceId,
    index: u32,
    data: Bytes,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
) -> JoinHandle<Result<u32>> {
    let shared2 = shared.clone();
    shared.rt.spawn(async move {
        let _buffered = permit;
        let _permit = shared2
            .upload_slots
            .acquire()
            .await
            .map_err(|_| Error::Meta("upload slots closed".into()))?;
        let crc = crc32fast::hash(&data);
        let key = block_key(id, index, data.len() as u32);
        super::retry_store(&format!("upload block {key}"), || {
            shared2.store.put(&key, data.clone())
        })
        .await?;
        shared2.cache.put_mem(&key, data.clone());
        if shared2.cache.has_disk() {
            let cache = shared2.cache.clone();
            let key2 = key.clone();
            let _ = tokio::task::spawn_blocking(move || cache.put_disk(&key2, &data)).await;
        }
        Ok(crc)
    })
}

#[cfg(test)]
mod tests {
    use crate::meta::{Ctx, Meta, MetaClient, MetaOptions, ROOT_INO};
    use crate::vfs::memory_vfs;

    /// A write buffered through one handle, lost when a flush through another handle (a
    /// reader's close) fails to commit it, is reported at the writer's own close, once.
    #[test]
    fn a_failed_flush_is_reported_to_every_handle_open_then() {
        let (kv, _, _, vfs) = memory_vfs();
        let root = Ctx::root();
        let (writer, ino, _) = vfs.create(&root, ROOT_INO, b"f", 0o644, 0).unwrap();
        let reader = vfs.open(&root, ino, libc::O_RDONLY).unwrap().fh;
        vfs.write(ino, 0, b"lost").unwrap();
        // another daemon's engine over the same metadata, with no handle on the file:
        // its unlink deletes the file, so the commit of the buffered write fails
        let other = Meta::open(kv, MetaOptions::default()).unwrap();
        other.new_session("other").unwrap();
        other.set_trash_days_versioned(&root, 0).unwrap();
        other.unlink(&root, ROOT_INO, b"f").unwrap();
        assert!(vfs.flush_handle(reader, ino).is_err());
        let e = vfs.flush_handle(writer, ino).unwrap_err();
        assert_eq!(e.errno(), libc::EIO);
        // reported once per handle; a handle opened after the failure does not hear of it
        vfs.flush_handle(writer, ino).unwrap();
        vfs.flush_handle(reader, ino).unwrap();
    }

    /// Random writes that are never flushed do not pile up in memory: once the unfinished
    /// blocks of a file's buffered slices hold WRITE_TAILS_BYTES_MAX, they are committed.
    #[test]
    fn random_writes_never_flushed_are_committed_once_their_buffers_fill() {
        let (_, meta, _, vfs) = memory_vfs();
        let root = Ctx::root();
        let (fh, ino, _) = vfs.create(&root, ROOT_INO, b"f", 0o644, 0).unwrap();
        // 64 KiB writes two blocks apart: each its own slice, its block never finished
        let w = 64 << 10;
        let per_fill = super::WRITE_TAILS_BYTES_MAX / (128 << 10);
        for i in 0..per_fill + 10 {
            vfs.write(ino, i as u64 * (8 << 20), &vec![1u8; w]).unwrap();
        }
        let committed: usize = (0..=(per_fill + 10) / 8)
            .map(|c| meta.read_chunk(ino, c as u32).map(|s| s.len()).unwrap_or(0))
            .sum();
        assert!(
            committed >= per_fill,
            "{committed} slices committed after {} writes never flushed",
            per_fill + 10
        );
        let w_state = vfs.existing_writer(ino).unwrap();
        assert!(!w_state.tails_full());
        vfs.flush_handle(fh, ino).unwrap();
    }
}
