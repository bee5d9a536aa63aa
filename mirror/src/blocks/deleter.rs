//! The deleter: removes this region's copies of the blocks of slices the primary purged.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use strait_fs_core::changelog::decode;
use strait_fs_core::kv;
use strait_fs_core::layout::{block_count, block_key, block_len};
use strait_fs_core::meta::{keys, Format};
use strait_fs_core::vfs::orphans::References;
use strait_fs_core::SliceId;
use tokio_util::sync::CancellationToken;

use super::keys::{synced_key, u32_at, DELETE};
use super::{corrupt, retry, Blocks, RETRY_PAUSE, SCAN_PAGE};

/// Add to `refs` the slices whose local copies wait in the deletion queue: the primary
/// purged them and this mirror applied the purge, so its metadata no longer names them, but
/// their blocks are the deleter's to remove, not orphans. Read after the metadata's
/// references: a slice purged since the walk is here, and one the deleter finished with
/// before this read has no block left to list.
pub fn add_queued_deletions(
    kv: &dyn kv::KvEngine,
    refs: &mut References,
) -> strait_fs_core::Result<()> {
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = kv::read(kv, |t| t.scan(&[DELETE], after.as_deref(), SCAN_PAGE))?;
        let Some((last, _)) = page.last() else {
            return Ok(());
        };
        after = Some(last.clone());
        for (k, v) in &page {
            if let (Some(id), Some(size)) = (keys::u64_at(k, 9).map(SliceId), u32_at(v, 0)) {
                refs.add(id, size);
            }
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use strait_fs_core::changelog::{Change, ChangeRecord};
    use strait_fs_core::kv::memory::MemoryKv;
    use strait_fs_core::kv::DynKv;
    use strait_fs_core::meta::{Ctx, MetaClient, SliceRef, ROOT_INO};
    use strait_fs_core::vfs::orphans::{self, SweepOptions, SweepStats};
    use strait_fs_core::Version;

    /// Chaos seed 68 (CI of 8a79b0a): the primary purged 60 dead slices while the checker
    /// swept region B's store; the mirror had applied the purge, its deleter had removed the
    /// copies of all but a few, and the sweep counted those few as orphans. The slices in
    /// the deletion queue are the deleter's: a sweep counts them referenced.
    #[tokio::test]
    async fn a_purged_slice_waiting_for_the_deleter_is_no_orphan() {
        let memory = || -> DynKv { std::sync::Arc::new(MemoryKv::new()) };
        let (kv, m) = strait_fs_core::meta::conformance::fresh(&memory);
        let bs = m.settings().block_size;
        let root = Ctx::root();
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::config::MirrorConfig {
            data_url: format!("file://{}", dir.path().display()),
            ..Default::default()
        };
        let blocks = Blocks::open(&cfg, kv.clone()).await.unwrap();
        let local = blocks.local_store().unwrap();
        // f stays; g is unlinked, and its slice purged at the primary
        let mut written = vec![];
        for name in [&b"f"[..], b"g"] {
            let (ino, _) = m.create(&root, ROOT_INO, name, 0o644, 0).unwrap();
            let s = SliceRef {
                id: m.next_slice_id().unwrap(),
                size: 100,
                off: 0,
                len: 100,
                pos: 0,
                crcs: vec![1],
            };
            m.write_slice(ino, 0, s.clone(), 1).unwrap();
            m.release(ino).unwrap();
            local
                .put(&block_key(s.id, 0, 100), vec![7u8; 100].into())
                .await
                .unwrap();
            written.push(s);
        }
        let g = written[1].id;
        // deleted at once, not kept in the trash
        m.set_trash_days_versioned(&root, 0).unwrap();
        m.unlink(&root, ROOT_INO, b"g").unwrap();
        // the mirror applies the purge: the hook queues the deletion, in the apply's
        // transaction; the deleter has not run yet
        let purge = ChangeRecord {
            ts_ns: 0,
            change: Change::PurgeSlices { ids: vec![g] },
            request: None,
        };
        kv::txn(kv.as_ref(), |t| blocks.hook(t, Version(1_000), &purge)).unwrap();
        m.purge_slices(vec![g]).unwrap();

        let sweep = |also: bool| {
            let (kv, local) = (kv.clone(), local.clone());
            async move {
                let mut refs = References::read(kv.as_ref()).unwrap();
                if also {
                    add_queued_deletions(kv.as_ref(), &mut refs).unwrap();
                }
                orphans::sweep(
                    &local,
                    &refs,
                    bs,
                    strait_fs_core::clock::now(),
                    SweepOptions {
                        grace: Duration::ZERO,
                        dry_run: true,
                    },
                    orphans::SweepCalls {
                        progress: &mut |_| {},
                        deleted: &mut |_, _| {},
                        gate: &|| None,
                    },
                )
                .await
                .unwrap()
            }
        };
        let counts = |st: SweepStats| (st.listed, st.referenced, st.orphans);
        // the metadata alone no longer names g's block (what a mirror's sweep read before)
        assert_eq!(counts(sweep(false).await), (2, 1, 1));
        // with the deletion queue, it is the deleter's, not an orphan
        assert_eq!(counts(sweep(true).await), (2, 2, 0));

        // the deleter removes it and leaves its queue empty; nothing is an orphan then either
        let stop = CancellationToken::new();
        let deleter = tokio::spawn(blocks.clone().run_deleter(stop.clone()));
        let key = block_key(g, 0, 100);
        let mut left = 100;
        while local.get(&key).await.is_ok() {
            left -= 1;
            assert!(left > 0, "the deleter did not delete {key} in 10 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.cancel();
        deleter.await.unwrap();
        assert_eq!(counts(sweep(true).await), (1, 1, 0));
        let queued = kv::read(kv.as_ref(), |t| t.scan(&[DELETE], None, 10)).unwrap();
        assert!(queued.is_empty(), "{queued:?}");
    }
}
