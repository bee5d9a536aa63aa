//! Compaction: the fragmented windows of a chunk are rewritten, each as one slice, and slices
//! no byte of which is visible any more leave the chunk's list.
//!
//! A chunk (64 MiB) is looked at in windows of [`COMPACT_WINDOW`] (4 MiB). Every committed
//! write adds a slice to its chunk's list, and a list only grows: reads get slower (one
//! object per slice) and overwritten bytes stay stored. Rewriting the whole chunk once it
//! holds a couple of dozen slices, as this did before, costs 64 MiB per rewrite: random
//! 64 KiB writes into a file then stored about 40 times the bytes written, and an eager
//! mirror copied all of it across its link. So only a window is rewritten, and only once it
//! holds enough slices to be worth the bytes: a rewrite of a window spanning `E` bytes waits
//! for `E / COMPACT_BYTES_PER_SLICE` slices beyond its first (52 for a full window: random
//! 64 KiB writes then store about 1.25 times their bytes again, and a window never holds more
//! than about 53 slices, so a chunk not more than about 850). A window is rewritten from the
//! chunk's visible bytes over the range its slices cover (zeros where none does), as a new
//! slice placed after every slice it replaces, so it wins over the parts of longer slices
//! that reach into it; the slices that lay wholly inside it leave the list.
//!
//! A slice none of whose bytes is visible (wholly overwritten by later ones) leaves the list
//! too: with a rewrite, or on its own once such slices hold [`COMPACT_WINDOW`] bytes. Its
//! blocks then die and the GC deletes them after the file system's delay.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;

use crate::error::Result;
use crate::layout::{block_key, CHUNK_SIZE};
use crate::meta::{Ino, SliceRef};

use super::chunks::ChunkView;
use super::{retry_store, Shared};

/// The part of a chunk that is rewritten on its own.
pub const COMPACT_WINDOW: u32 = 4 << 20;
/// Fewest slices in a window for it to be rewritten.
pub const COMPACT_WINDOW_SLICES_MIN: usize = 8;
/// Bytes a rewrite may write per slice it removes: a window spanning `E` bytes is rewritten
/// once it holds `E / COMPACT_BYTES_PER_SLICE` slices beyond its first.
pub const COMPACT_BYTES_PER_SLICE: u64 = 80 << 10;

/// What a compaction of a chunk does: the ranges `[lo, hi)` it rewrites (each inside one
/// window), and whether slices hidden by later ones leave the list without a rewrite.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CompactPlan {
    pub rewrite: Vec<(u32, u32)>,
    pub drop_hidden: bool,
}

impl CompactPlan {
    pub fn is_empty(&self) -> bool {
        self.rewrite.is_empty() && !self.drop_hidden
    }
}

/// Which of `slices` (later ones win) have no visible byte left: wholly covered by later ones.
pub fn hidden(slices: &[SliceRef]) -> Vec<bool> {
    // the union of the later slices' ranges, as disjoint [start, end) keyed by start
    let mut covered: BTreeMap<u32, u32> = BTreeMap::new();
    let mut out = vec![false; slices.len()];
    for (i, s) in slices.iter().enumerate().rev() {
        let (a, b) = (s.pos, s.pos.saturating_add(s.len));
        if a >= b {
            out[i] = true;
            continue;
        }
        out[i] = covered
            .range(..=a)
            .next_back()
            .is_some_and(|(_, &end)| end >= b);
        if out[i] {
            continue;
        }
        // merge [a, b) with every range it touches
        let (mut lo, mut hi) = (a, b);
        if let Some((&s0, &e0)) = covered.range(..=a).next_back() {
            if e0 >= a {
                lo = s0;
                hi = hi.max(e0);
            }
        }
        let touching: Vec<u32> = covered.range(lo..=hi).map(|(&k, _)| k).collect();
        for k in touching {
            if let Some(e) = covered.remove(&k) {
                hi = hi.max(e);
            }
        }
        covered.insert(lo, hi);
    }
    out
}

/// What compacting `slices` would do now (see the module's documentation).
pub fn plan(slices: &[SliceRef]) -> CompactPlan {
    let windows = (CHUNK_SIZE / COMPACT_WINDOW as u64) as usize;
    // per window: slices, lowest start, highest end (clipped to the window)
    let mut stats: Vec<(usize, u32, u32)> = vec![(0, u32::MAX, 0); windows];
    for s in slices {
        let (a, b) = (s.pos, s.pos.saturating_add(s.len).min(CHUNK_SIZE as u32));
        if a >= b {
            continue;
        }
        for w in (a / COMPACT_WINDOW)..=((b - 1) / COMPACT_WINDOW) {
            let (ws, we) = (w * COMPACT_WINDOW, (w + 1).saturating_mul(COMPACT_WINDOW));
            let Some(st) = stats.get_mut(w as usize) else {
                break;
            };
            st.0 += 1;
            st.1 = st.1.min(a.max(ws));
            st.2 = st.2.max(b.min(we));
        }
    }
    let rewrite: Vec<(u32, u32)> = stats
        .into_iter()
        .filter(|&(n, lo, hi)| {
            n >= COMPACT_WINDOW_SLICES_MIN
                && (n as u64 - 1) * COMPACT_BYTES_PER_SLICE >= (hi - lo) as u64
        })
        .map(|(_, lo, hi)| (lo, hi))
        .collect();
    let hidden_bytes: u64 = slices
        .iter()
        .zip(hidden(slices))
        .filter(|(_, h)| *h)
        .map(|(s, _)| s.len as u64)
        .sum();
    CompactPlan {
        rewrite,
        drop_hidden: hidden_bytes >= COMPACT_WINDOW as u64,
    }
}

/// The list that replaces `old` once each range of `rewritten` is the new slice beside it:
/// the old slices that do not lie wholly inside a rewritten range, in their order, then the
/// new slices; then without the slices no byte of which is visible.
pub fn compacted_list(old: &[SliceRef], rewritten: &[((u32, u32), SliceRef)]) -> Vec<SliceRef> {
    let inside = |s: &SliceRef| {
        rewritten
            .iter()
            .any(|((lo, hi), _)| s.pos >= *lo && s.pos.saturating_add(s.len) <= *hi)
    };
    let list: Vec<SliceRef> = old
        .iter()
        .filter(|s| !inside(s))
        .cloned()
        .chain(rewritten.iter().map(|(_, s)| s.clone()))
        .collect();
    let gone = hidden(&list);
    list.into_iter()
        .zip(gone)
        .filter(|(_, h)| !h)
        .map(|(s, _)| s)
        .collect()
}

impl Shared {
    pub(super) fn maybe_compact(self: &Arc<Self>, ino: Ino, idx: u32) {
        let Ok(slices) = self.slices(ino, idx) else {
            return;
        };
        if slices.slices.len() < 2 || plan(&slices.slices).is_empty() {
            return;
        }
        if !self.compacting.lock().insert((ino, idx)) {
            return;
        }
        let me = self.clone();
        std::thread::spawn(move || {
            if let Err(e) = me.compact(ino, idx) {
                tracing::warn!("compact chunk {idx} of inode {ino}: {e}");
            }
            me.compacting.lock().remove(&(ino, idx));
        });
    }

    /// Rewrite the fragmented windows of a chunk and drop its hidden slices, as [`plan`]
    /// says. Nothing happens when the plan is empty.
    pub fn compact(self: &Arc<Self>, ino: Ino, idx: u32) -> Result<()> {
        let old = self.meta.read_chunk(ino, idx)?;
        let todo = plan(&old);
        if old.len() < 2 || todo.is_empty() {
            return Ok(());
        }
        let view = ChunkView {
            slices: old.clone(),
            unsynced: HashMap::new(),
        };
        let bs = self.block_size as usize;
        let mut rewritten = Vec::with_capacity(todo.rewrite.len());
        let mut written = 0u64;
        for &(lo, hi) in &todo.rewrite {
            let mut data = vec![0u8; (hi - lo) as usize];
            self.rt.block_on(self.read_chunk(&view, lo, &mut data))?;
            let id = self.meta.next_slice_id()?;
            let mut crcs = vec![];
            for (index, block) in data.chunks(bs).enumerate() {
                let key = block_key(id, index as u32, block.len() as u32);
                let bytes = Bytes::copy_from_slice(block);
                self.rt
                    .block_on(retry_store(&format!("upload block {key}"), || {
                        self.store.put(&key, bytes.clone())
                    }))?;
                crcs.push(crc32fast::hash(block));
            }
            written += data.len() as u64;
            let new = SliceRef {
                id,
                size: hi - lo,
                off: 0,
                len: hi - lo,
                pos: lo,
                crcs,
            };
            rewritten.push(((lo, hi), new));
        }
        let list = compacted_list(&old, &rewritten);
        if list == old {
            return Ok(());
        }
        if self.meta.compact_chunk(ino, idx, &old, list.clone())? {
            tracing::debug!(
                "compacted chunk {idx} of inode {ino}: {} slices into {}, {} windows rewritten \
                 ({written} bytes)",
                old.len(),
                list.len(),
                rewritten.len()
            );
        }
        self.drop_chunk(ino, idx);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::visible_segments;
    use crate::SliceId;

    fn s(id: u64, pos: u32, len: u32) -> SliceRef {
        SliceRef {
            id: SliceId(id),
            size: len,
            off: 0,
            len,
            pos,
            crcs: vec![],
        }
    }

    /// What each byte position in `[0, to)` reads: (slice id, offset in the slice), or None.
    fn bytes(slices: &[SliceRef], to: u32) -> Vec<Option<(u64, u32)>> {
        let mut out = vec![];
        for g in visible_segments(slices, 0, to) {
            for i in 0..g.len {
                out.push(g.slice.map(|x| (x.id.0, g.off + i)));
            }
        }
        out
    }

    #[test]
    fn a_slice_is_hidden_only_when_later_ones_cover_all_of_it() {
        let list = [
            s(1, 0, 100),
            s(2, 10, 10),
            s(3, 50, 30),
            s(4, 0, 60),
            s(5, 60, 40),
            s(6, 200, 0),
        ];
        // 1 is covered by 4 and 5 together; 2 by 4; 3 by 4 and 5; 4 and 5 are the last
        assert_eq!(hidden(&list), vec![true, true, true, false, false, true]);
        // a gap of one byte keeps a slice visible
        let list = [s(1, 0, 100), s(2, 0, 49), s(3, 50, 50)];
        assert_eq!(hidden(&list), vec![false, false, false]);
        // ranges that only touch merge
        let list = [s(1, 0, 100), s(2, 0, 50), s(3, 50, 50), s(4, 100, 5)];
        assert_eq!(hidden(&list), vec![true, false, false, false]);
    }

    #[test]
    fn a_window_is_rewritten_once_its_slices_are_worth_its_bytes() {
        let w = COMPACT_WINDOW;
        // one slice over the whole chunk, then random 64 KiB writes into window 3
        let mut list = vec![s(1, 0, CHUNK_SIZE as u32)];
        let mut id = 2;
        // the window spans 4 MiB: it waits for 4 MiB / COMPACT_BYTES_PER_SLICE slices beyond
        // the big one
        let need = (w as u64).div_ceil(COMPACT_BYTES_PER_SLICE) as usize;
        for i in 0..need - 1 {
            list.push(s(id, 3 * w + (i as u32 * 37 % 64) * (64 << 10), 64 << 10));
            id += 1;
        }
        // window 3 holds the big slice and need - 1 others: not yet
        assert_eq!(plan(&list), CompactPlan::default());
        list.push(s(id, 3 * w, 64 << 10));
        assert_eq!(plan(&list).rewrite, vec![(3 * w, 4 * w)]);
        // eight small writes close together: a small range, rewritten at once
        let small: Vec<SliceRef> = (0..8)
            .map(|i| s(100 + i, 1000 + i as u32 * 10, 100))
            .collect();
        assert_eq!(plan(&small[..7]).rewrite, vec![]);
        assert_eq!(plan(&small).rewrite, vec![(1000, 1170)]);
    }

    #[test]
    fn hidden_slices_leave_without_a_rewrite_once_they_hold_a_window() {
        // a whole chunk written over and over: every window holds few slices
        let full = CHUNK_SIZE as u32;
        assert!(plan(&[s(1, 0, full), s(2, 0, full)]).drop_hidden);
        assert!(plan(&[s(1, 0, full), s(2, 0, full)]).rewrite.is_empty());
        // a little hidden is left alone
        assert!(plan(&[s(1, 0, 1 << 20), s(2, 0, 1 << 20)]).is_empty());
        assert_eq!(
            compacted_list(&[s(1, 0, full), s(2, 0, full)], &[]),
            vec![s(2, 0, full)]
        );
    }

    #[test]
    fn a_compacted_list_reads_the_new_slices_over_their_ranges_and_the_old_elsewhere() {
        // a big slice, writes across window boundaries, overwrites; windows 0 and 1 rewritten
        let w = COMPACT_WINDOW;
        let old = vec![
            s(1, 0, 3 * w),
            s(2, w - 100, 300),
            s(3, 50, 20),
            s(4, w + 10, 40),
            s(5, 30, 100),
        ];
        let (r0, r1) = ((0, w), (w, w + 200));
        let (new0, new1) = (s(10, r0.0, r0.1 - r0.0), s(11, r1.0, r1.1 - r1.0));
        let before = bytes(&old, 3 * w);
        let list = compacted_list(&old, &[(r0, new0.clone()), (r1, new1.clone())]);
        // 3, 4 and 5 lay inside a rewritten range; 2 reaches out of both but the new slices
        // hide all of it; 1 stays, first
        assert_eq!(list, vec![s(1, 0, 3 * w), new0, new1]);
        let after = bytes(&list, 3 * w);
        for (i, (b, a)) in before.iter().zip(&after).enumerate() {
            let i = i as u32;
            let expect = if i < r0.1 {
                Some((10, i))
            } else if i < r1.1 {
                Some((11, i - r1.0))
            } else {
                *b
            };
            assert_eq!(*a, expect, "byte {i}");
        }
    }

    /// Random 64 KiB writes, each committed, into a 16 MiB file written whole first (fio's
    /// random writes over a laid-out file): what the file reads stays what was written while
    /// the windows are rewritten, the lists stay short, and the store holds at most about
    /// twice the bytes written (a whole-chunk rewrite after every 24 slices stores several
    /// times more: docs/benchmarks/mirror.md).
    #[test]
    fn random_writes_are_compacted_by_window_and_read_back_unchanged() {
        use crate::meta::{Ctx, ROOT_INO};
        use crate::object::ObjectStore;

        let (_, meta, store, vfs) = crate::vfs::memory_vfs();
        let root = Ctx::root();
        let (fh, ino, _) = vfs.create(&root, ROOT_INO, b"f", 0o644, 0).unwrap();
        const SIZE: usize = 16 << 20;
        const W: usize = 64 << 10;
        let mut model: Vec<u8> = (0..SIZE).map(|i| (i * 7 % 251) as u8).collect();
        vfs.write(ino, 0, &model).unwrap();
        vfs.flush_handle(fh, ino).unwrap();
        let mut app = SIZE;
        let mut x: u64 = 12345;
        for n in 0..1000u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = ((x >> 33) as usize % (SIZE / W)) * W;
            let data = vec![(n % 255) as u8 + 1; W];
            vfs.write(ino, off as u64, &data).unwrap();
            vfs.flush_handle(fh, ino).unwrap();
            model[off..off + W].copy_from_slice(&data);
            app += W;
            if n % 97 == 0 {
                let got = vfs.read(fh, ino, 0, SIZE as u32).unwrap();
                assert!(
                    got == model,
                    "after write {n}, the file differs from what was written"
                );
            }
        }
        // the compactions run in threads of their own: wait for the last, then run one more
        // the way the mount does, to the end of what the plan asks for
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !vfs.shared.compacting.lock().is_empty() {
            assert!(
                std::time::Instant::now() < until,
                "a compaction never finished"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        vfs.shared.compact(ino, 0).unwrap();
        let got = vfs.read(fh, ino, 0, SIZE as u32).unwrap();
        assert!(
            got == model,
            "after compaction, the file differs from what was written"
        );
        let list = meta.read_chunk(ino, 0).unwrap();
        let windows = SIZE / COMPACT_WINDOW as usize;
        assert!(
            list.len() <= windows * 53,
            "{} slices in a chunk of {windows} windows",
            list.len()
        );
        assert!(
            plan(&list).is_empty(),
            "the plan still asks for {:?}",
            plan(&list)
        );
        let rt = tokio::runtime::Runtime::new().unwrap();
        let (mut stored, mut after) = (0u64, None::<String>);
        loop {
            let page = rt.block_on(store.list("", after.as_deref(), 1000)).unwrap();
            stored += page.iter().map(|o| o.size).sum::<u64>();
            match page.last() {
                Some(o) => after = Some(o.key.clone()),
                None => break,
            }
        }
        let ratio = stored as f64 / app as f64;
        println!("stored {stored} bytes for {app} written: {ratio:.2} times");
        assert!(
            ratio <= 2.5,
            "the store holds {stored} bytes for {app} written: {ratio:.2} times"
        );
    }
}
