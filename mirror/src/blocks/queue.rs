//! The persistent copy queue: filled in the transaction that applies each record
//! ([`Blocks::hook`]) or, after a snapshot load, from the whole snapshot
//! ([`Blocks::index_all`]); emptied by the copier.

use std::sync::atomic::Ordering;

use strait_fs_core::changelog::{decode, get_chunk, Change, ChangeRecord, DeadSlice, Unlinked};
use strait_fs_core::kv::{self, decode_counter, KvTxn};
use strait_fs_core::layout::{block_count, block_len, written_by_compaction};
use strait_fs_core::meta::{keys, Format, Ino, SliceRef};
use strait_fs_core::Version;

use super::keys::{
    copy_key, delete_key, name_key, stat_key, INDEXED, PENDING_BLOCKS, PENDING_BYTES,
};
use super::{corrupt, Blocks};

/// Pairs written per transaction while indexing a snapshot.
pub(super) const INDEX_BATCH: usize = 1000;

impl Blocks {
    pub(super) fn block_size_in(&self, t: &mut dyn KvTxn) -> strait_fs_core::Result<u32> {
        let bs = self.block_size.load(Ordering::Relaxed);
        if bs != 0 {
            return Ok(bs);
        }
        let Some(v) = t.get(&keys::setting(keys::FORMAT))? else {
            return Err(corrupt("the mirror has no settings yet".into()));
        };
        let f: Format = decode(&v)?;
        self.block_size.store(f.block_size, Ordering::Relaxed);
        Ok(f.block_size)
    }

    fn enqueue(
        &self,
        t: &mut dyn KvTxn,
        version: Version,
        s: &SliceRef,
        bs: u32,
    ) -> strait_fs_core::Result<()> {
        if s.id.is_hole() {
            return Ok(());
        }
        for index in 0..block_count(s.size, bs) {
            let Some(crc) = s.crcs.get(index as usize) else {
                continue; // a slice without its CRCs: the apply itself rejects nothing here
            };
            let len = block_len(s.size, bs, index);
            let k = copy_key(version, s.id, index);
            if t.get(&k)?.is_none() {
                let mut v = len.to_be_bytes().to_vec();
                v.extend_from_slice(&crc.to_be_bytes());
                t.put(&k, &v);
                t.add(&stat_key(PENDING_BLOCKS), 1);
                t.add(&stat_key(PENDING_BYTES), len as i64);
            }
        }
        Ok(())
    }

    /// Queue the real slices of `slices` when `ino` is under an eager policy.
    fn enqueue_eager<'a>(
        &self,
        t: &mut dyn KvTxn,
        version: Version,
        ino: Ino,
        slices: impl IntoIterator<Item = &'a SliceRef>,
    ) -> strait_fs_core::Result<()> {
        let real: Vec<&SliceRef> = slices.into_iter().filter(|s| !s.id.is_hole()).collect();
        if real.is_empty() || !self.eager(t, ino)? {
            return Ok(());
        }
        let bs = self.block_size_in(t)?;
        for s in real {
            self.enqueue(t, version, s, bs)?;
        }
        Ok(())
    }

    /// Called for each record in the transaction that applies it, before it is applied.
    pub fn hook(
        &self,
        t: &mut dyn KvTxn,
        version: Version,
        rec: &ChangeRecord,
    ) -> strait_fs_core::Result<()> {
        if self.local.is_none() {
            return Ok(());
        }
        let names = self.rules.uniform().is_none();
        let name_entry = |parent: Ino, name: &[u8]| {
            let mut v = parent.to_be_bytes().to_vec();
            v.extend_from_slice(name);
            v
        };
        match &rec.change {
            Change::Create {
                parent, name, ino, ..
            } if names => t.put(&name_key(*ino), &name_entry(*parent, &name.0)),
            Change::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
                ino,
                replaced,
                ..
            } if names => {
                t.put(&name_key(*ino), &name_entry(*dst_parent, &dst_name.0));
                if let Some(r) = replaced.as_ref().filter(|r| r.exchange) {
                    t.put(&name_key(r.ino), &name_entry(*src_parent, &src_name.0));
                }
            }
            Change::Unlink {
                ino,
                unlinked: Unlinked::Delete,
                ..
            }
            | Change::Rmdir { ino, .. }
            | Change::DeleteInode { ino }
                if names =>
            {
                t.delete(&name_key(*ino))
            }
            Change::WriteSlice { ino, slice, .. } => {
                self.enqueue_eager(t, version, *ino, [slice])?
            }
            Change::Compact {
                ino,
                chunk,
                replaced,
                slices,
            } => {
                // before the record applies: the list it replaces the head of is the chunk's
                let list = get_chunk(t, *ino, *chunk)?;
                let old = list.get(..*replaced as usize).unwrap_or(&list);
                self.enqueue_eager(t, version, *ino, written_by_compaction(old, slices))?
            }
            Change::Truncate {
                ino,
                hole: Some((_, s)),
                ..
            } => self.enqueue_eager(t, version, *ino, [s])?,
            Change::PurgeSlices { ids } => {
                for id in ids {
                    if let Some(v) = t.get(&keys::deadslice(*id))? {
                        let d: DeadSlice = decode(&v)?;
                        t.put(&delete_key(version, *id), &d.size.to_be_bytes());
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether the blocks of the snapshot the engine holds are queued (see [`Self::index_all`]).
    pub fn indexed(&self) -> strait_fs_core::Result<bool> {
        if self.local.is_none() {
            return Ok(true);
        }
        kv::read(self.kv.as_ref(), |t| {
            Ok(t.get(&stat_key(INDEXED))?.is_some())
        })
    }

    /// After a snapshot load: index every name and queue every block the metadata
    /// references (under an eager policy), in batches. Idempotent, so a crash in the middle
    /// is finished by the next start.
    pub fn index_all(&self, version: Version) -> strait_fs_core::Result<(u64, u64)> {
        if self.local.is_none() {
            return Ok((0, 0));
        }
        let kvr = self.kv.as_ref();
        if self.rules.uniform().is_none() {
            let mut after: Option<Vec<u8>> = None;
            loop {
                let page = kv::read(kvr, |t| {
                    t.scan(&[keys::DENTRY], after.as_deref(), INDEX_BATCH)
                })?;
                let n = page.len();
                kv::txn(kvr, |t| {
                    for (k, v) in &page {
                        let parent =
                            keys::u64_at(k, 1).ok_or_else(|| corrupt("dentry key".into()))?;
                        let child =
                            keys::u64_at(v, 0).ok_or_else(|| corrupt("dentry value".into()))?;
                        let mut e = parent.to_be_bytes().to_vec();
                        e.extend_from_slice(&k[9..]);
                        t.put(&name_key(child), &e);
                    }
                    Ok(())
                })?;
                after = page.last().map(|p| p.0.clone());
                if n < INDEX_BATCH {
                    break;
                }
            }
        }
        let mut after: Option<Vec<u8>> = None;
        let (mut slices, mut blocks) = (0u64, 0u64);
        loop {
            let page = kv::read(kvr, |t| {
                t.scan(&[keys::CHUNK], after.as_deref(), INDEX_BATCH)
            })?;
            let n = page.len();
            kv::txn(kvr, |t| {
                let bs = self.block_size_in(t)?;
                for (k, v) in &page {
                    let ino = keys::u64_at(k, 1).ok_or_else(|| corrupt("chunk key".into()))?;
                    if !self.eager(t, ino)? {
                        continue;
                    }
                    let list: Vec<SliceRef> = decode(v)?;
                    for s in list.iter().filter(|s| !s.id.is_hole()) {
                        slices += 1;
                        blocks += block_count(s.size, bs) as u64;
                        self.enqueue(t, version, s, bs)?;
                    }
                }
                Ok(())
            })?;
            after = page.last().map(|p| p.0.clone());
            if n < INDEX_BATCH {
                break;
            }
        }
        kv::txn(kvr, |t| {
            t.put(&stat_key(INDEXED), &version.to_be_bytes());
            Ok(())
        })?;
        self.wake.notify_one();
        Ok((slices, blocks))
    }

    /// Something was queued: wake the workers.
    pub fn queued(&self) {
        self.wake.notify_waiters();
        self.wake.notify_one();
    }

    pub(super) fn read_pending(&self) -> strait_fs_core::Result<(u64, u64)> {
        kv::read(self.kv.as_ref(), |t| {
            let b = decode_counter(t.get(&stat_key(PENDING_BLOCKS))?)?;
            let n = decode_counter(t.get(&stat_key(PENDING_BYTES))?)?;
            Ok((b.max(0) as u64, n.max(0) as u64))
        })
    }

    /// Take a queue entry off, with its share of the counters.
    pub(super) async fn done(&self, k: Vec<u8>, len: u32) {
        let kv = self.kv.clone();
        let r = tokio::task::spawn_blocking(move || {
            kv::txn(kv.as_ref(), |t| {
                if t.get(&k)?.is_some() {
                    t.delete(&k);
                    t.add(&stat_key(PENDING_BLOCKS), -1);
                    t.add(&stat_key(PENDING_BYTES), -(len as i64));
                }
                Ok(())
            })
        })
        .await;
        match r {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => self.error(format!("take a copied block off the queue: {e}")),
            Err(e) => self.error(format!("take a copied block off the queue: {e}")),
        }
    }
}
