//! Chunk, slice and block arithmetic: pure functions, no I/O.
//!
//! A file is split into chunks of [`CHUNK_SIZE`] bytes. Each write creates a slice; a slice
//! is stored as blocks of at most `block_size` bytes under
//! `chunks/{id / 1_000_000}/{id / 1_000}/{id}_{index}_{size}`.

use crate::meta::SliceRef;
use crate::SliceId;

pub const CHUNK_SIZE: u64 = 64 << 20;
pub const BLOCK_SIZE_DEFAULT: u32 = 4 << 20;
pub const BLOCK_SIZE_MIN: u32 = 64 << 10;
pub const BLOCK_SIZE_MAX: u32 = 16 << 20;

/// Object key of block `index` (of `size` bytes) of slice `id`.
pub fn block_key(id: SliceId, index: u32, size: u32) -> String {
    let id = id.0;
    format!(
        "chunks/{}/{}/{}_{}_{}",
        id / 1_000_000,
        id / 1_000,
        id,
        index,
        size
    )
}

/// The slice id, index and size a block key names: the inverse of [`block_key`], None for
/// any other key (only a key [`block_key`] would write is taken).
pub fn parse_block_key(key: &str) -> Option<(SliceId, u32, u32)> {
    let name = key.strip_prefix("chunks/")?.rsplit('/').next()?;
    let mut parts = name.split('_');
    let id: u64 = parts.next()?.parse().ok()?;
    let index: u32 = parts.next()?.parse().ok()?;
    let size: u32 = parts.next()?.parse().ok()?;
    if parts.next().is_some() || block_key(SliceId(id), index, size) != key {
        return None;
    }
    Some((SliceId(id), index, size))
}

/// Number of blocks of a slice object of `size` bytes.
pub fn block_count(size: u32, block_size: u32) -> u32 {
    size.div_ceil(block_size)
}

/// Size of block `index` of a slice object of `size` bytes.
pub fn block_len(size: u32, block_size: u32, index: u32) -> u32 {
    let start = index as u64 * block_size as u64;
    (size as u64 - start).min(block_size as u64) as u32
}

/// The slices of a compaction's new list (`new`) that it wrote: those that are not, exactly
/// as they are, in the list it replaces (`old`). A compaction rewrites some windows of a
/// chunk and keeps the other slices unchanged; only the slices it wrote have blocks to upload,
/// to copy or to check the ownership of.
pub fn written_by_compaction<'a>(old: &[SliceRef], new: &'a [SliceRef]) -> Vec<&'a SliceRef> {
    let kept: std::collections::HashSet<&SliceRef> = old.iter().collect();
    new.iter().filter(|s| !kept.contains(s)).collect()
}

/// A visible piece of a chunk: `len` bytes at chunk position `pos` come from offset `off` of
/// the slice object `slice` (or are zeros when `slice` is None).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment<'a> {
    pub pos: u32,
    pub len: u32,
    pub slice: Option<&'a SliceRef>,
    pub off: u32,
}

/// Resolve overlapping slices (later ones win) into the visible segments that cover
/// `[from, to)` of the chunk, in order and without gaps (gaps are zero segments).
pub fn visible_segments(slices: &[SliceRef], from: u32, to: u32) -> Vec<Segment<'_>> {
    // Intervals [start, end) -> index of the slice that owns them; built by painting the
    // slices in order, so later slices overwrite earlier ones.
    let mut painted: Vec<(u32, u32, Option<usize>)> = vec![(from, to, None)];
    for (i, s) in slices.iter().enumerate() {
        let (s0, s1) = (s.pos.max(from), s.pos.saturating_add(s.len).min(to));
        if s0 >= s1 {
            continue;
        }
        let mut next = Vec::with_capacity(painted.len() + 2);
        for &(a, b, owner) in &painted {
            if b <= s0 || a >= s1 {
                next.push((a, b, owner));
                continue;
            }
            if a < s0 {
                next.push((a, s0, owner));
            }
            if b > s1 {
                next.push((s1, b, owner));
            }
        }
        next.push((s0, s1, Some(i)));
        next.sort_by_key(|p| p.0);
        painted = next;
    }
    painted
        .into_iter()
        .map(|(a, b, owner)| match owner {
            Some(i) if !slices[i].id.is_hole() => Segment {
                pos: a,
                len: b - a,
                slice: Some(&slices[i]),
                off: slices[i].off + (a - slices[i].pos),
            },
            _ => Segment {
                pos: a,
                len: b - a,
                slice: None,
                off: 0,
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_keys_parse_back_and_nothing_else_does() {
        for (id, index, size) in [(1, 0, 4 << 20), (1_234_567, 3, 17), (999, 0, 1)] {
            let key = block_key(SliceId(id), index, size);
            assert_eq!(parse_block_key(&key), Some((SliceId(id), index, size)));
        }
        for key in [
            "",
            "chunks/",
            "chunks/0/0/1_0",
            "chunks/0/0/1_0_5_6",
            "chunks/0/0/x_0_5",
            "chunks/9/9/1_0_5",
            "chunks/0/1_0_5",
            "other/0/0/1_0_5",
            "chunks/0/0/01_0_5",
            "chunks/0/0/-1_0_5",
        ] {
            assert_eq!(parse_block_key(key), None, "{key}");
        }
    }

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

    #[test]
    fn block_keys_follow_the_design() {
        assert_eq!(
            block_key(SliceId(1_234_567), 2, 4 << 20),
            "chunks/1/1234/1234567_2_4194304"
        );
        assert_eq!(block_count(0, 4 << 20), 0);
        assert_eq!(block_count(1, 4 << 20), 1);
        assert_eq!(block_count(8 << 20, 4 << 20), 2);
        assert_eq!(block_len((8 << 20) + 5, 4 << 20, 2), 5);
    }

    #[test]
    fn later_slices_win_and_gaps_are_zero() {
        let slices = vec![s(1, 0, 100), s(2, 50, 100), s(0, 120, 10)];
        let segs = visible_segments(&slices, 0, 200);
        let got: Vec<(u32, u32, Option<u64>, u32)> = segs
            .iter()
            .map(|g| (g.pos, g.len, g.slice.map(|x| x.id.0), g.off))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 50, Some(1), 0),
                (50, 70, Some(2), 0),
                (120, 10, None, 0),
                (130, 20, Some(2), 80),
                (150, 50, None, 0)
            ]
        );
        // a window inside one slice keeps the slice offset right
        let segs = visible_segments(&slices, 10, 20);
        assert_eq!(segs.len(), 1);
        assert_eq!((segs[0].off, segs[0].len), (10, 10));
    }
}
