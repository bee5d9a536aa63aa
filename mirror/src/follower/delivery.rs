//! The follower's delivery rules, without I/O: which records of a batch delivered by the
//! subscription are new to the mirror, and how they are cut into transactions. The follower
//! ([`super::apply_records`]) reads the stream, decodes and applies; these functions decide.
//!
//! # To ensure correctness
//! - A version is applied once: a batch delivered again (after a reconnection, from another
//!   node) is skipped up to the applied version, and a batch that would skip versions is never
//!   applied (the subscription is made again from the applied version).
//! - Records are applied in version order, and none past a hold (a digest being taken at that
//!   version) until the hold is released.
//! - A record that does not decode is never applied, nor any after it; the ones before it are.

use std::fmt::Display;

use strait_fs_core::Version;

/// Records applied per transaction.
pub const APPLY_BATCH_MAX_RECORDS: usize = 512;

/// What a batch of `len` records from version `first` holds for a mirror at version `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivered {
    /// Nothing past `at`: the batch is empty, or it was delivered again.
    Nothing,
    /// The batch starts past `at + 1`: the versions in between were skipped.
    Gap,
    /// Records `skip..` of the batch are the new versions `at + 1 ..= last`.
    New { skip: usize, last: Version },
}

/// Which records of a delivered batch are new to a mirror at version `at`.
pub fn delivered(at: Version, first: Version, len: usize) -> Delivered {
    if len == 0 {
        return Delivered::Nothing;
    }
    let last = first + (len as u64 - 1);
    if last <= at {
        return Delivered::Nothing; // delivered again: already applied
    }
    if first > at.next() {
        return Delivered::Gap;
    }
    Delivered::New {
        skip: (at.next().0 - first.0) as usize,
        last,
    }
}

/// The new records of a batch, decoded in order up to the first that does not decode.
#[derive(Debug, PartialEq, Eq)]
pub struct Decoded<T> {
    /// The records before the first that does not decode (all of them when every one does).
    pub records: Vec<T>,
    /// Why the first record that does not decode is invalid: it halts the applier once the
    /// records before it are applied.
    pub undecodable: Option<String>,
}

/// Decode records `skip..` of a batch that starts at version `first`.
pub fn decode_new<T, E: Display>(
    first: Version,
    raw: &[Vec<u8>],
    skip: usize,
    decode: impl Fn(&[u8]) -> Result<T, E>,
) -> Decoded<T> {
    let mut records = Vec::with_capacity(raw.len().saturating_sub(skip));
    let mut undecodable = None;
    for (i, b) in raw.iter().enumerate().skip(skip) {
        match decode(b) {
            Ok(r) => records.push(r),
            Err(e) => {
                let v = first + i as u64;
                undecodable = Some(format!("record {v} is invalid: it does not decode: {e}"));
                break;
            }
        }
    }
    Decoded {
        records,
        undecodable,
    }
}

/// How many of the `remaining` records from version `next` on go into the next transaction:
/// at most [`APPLY_BATCH_MAX_RECORDS`], and none past `hold` (a digest being taken at that
/// version; the follower waits while a hold sits below `next`).
pub fn next_chunk(remaining: usize, next: Version, hold: Option<Version>) -> usize {
    debug_assert!(
        hold.is_none_or(|h| h >= next),
        "a hold below the next version"
    );
    remaining.min(APPLY_BATCH_MAX_RECORDS).min(
        hold.map(|h| (h.0 + 1 - next.0) as usize)
            .unwrap_or(usize::MAX),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: u64) -> Version {
        Version(n)
    }

    fn dec(b: &[u8]) -> Result<u8, String> {
        match b {
            [x] => Ok(*x),
            _ => Err(format!("{} bytes", b.len())),
        }
    }

    /// A batch that starts right after the applied version is new from its first record; one
    /// delivered again is skipped up to the applied version, or wholly when it adds nothing.
    #[test]
    fn a_batch_is_new_from_the_version_after_the_applied_one() {
        assert_eq!(
            delivered(v(10), v(11), 3),
            Delivered::New {
                skip: 0,
                last: v(13)
            }
        );
        assert_eq!(
            delivered(v(10), v(8), 5),
            Delivered::New {
                skip: 3,
                last: v(12)
            }
        );
        assert_eq!(delivered(v(10), v(8), 3), Delivered::Nothing);
        assert_eq!(delivered(v(10), v(1), 10), Delivered::Nothing);
        assert_eq!(delivered(v(10), v(11), 0), Delivered::Nothing);
        // a mirror at version 0 takes a batch from version 1
        assert_eq!(
            delivered(v(0), v(1), 1),
            Delivered::New {
                skip: 0,
                last: v(1)
            }
        );
    }

    /// A batch that would leave a version out is never applied.
    #[test]
    fn a_batch_past_the_next_version_is_a_gap() {
        assert_eq!(delivered(v(10), v(12), 3), Delivered::Gap);
        assert_eq!(delivered(v(0), v(2), 1), Delivered::Gap);
    }

    /// Every version of a stream of overlapping batches is applied once, in order.
    #[test]
    fn overlapping_batches_deliver_every_version_once() {
        let batches = [(1, 4), (3, 4), (5, 2), (2, 3), (7, 10), (17, 1)];
        let mut at = Version::ZERO;
        let mut applied = vec![];
        for (first, len) in batches {
            if let Delivered::New { skip, last } = delivered(at, v(first), len) {
                applied.extend((first..first + len as u64).skip(skip));
                at = last;
            }
        }
        assert_eq!(applied, (1..=17).collect::<Vec<u64>>());
    }

    /// Decoding stops at the first record that does not decode and names its version; the
    /// records already applied are not decoded again.
    #[test]
    fn decoding_stops_at_the_first_invalid_record() {
        let raw = vec![vec![1], vec![2], vec![3], vec![], vec![5]];
        let all = decode_new(v(20), &raw[..3], 0, dec);
        assert_eq!(all.records, vec![1, 2, 3]);
        assert_eq!(all.undecodable, None);
        let cut = decode_new(v(20), &raw, 1, dec);
        assert_eq!(cut.records, vec![2, 3]);
        assert_eq!(
            cut.undecodable.as_deref(),
            Some("record 23 is invalid: it does not decode: 0 bytes")
        );
        let first_bad = decode_new(v(20), &raw, 3, dec);
        assert!(first_bad.records.is_empty());
        assert!(first_bad.undecodable.is_some());
    }

    /// A transaction holds at most the batch bound, and stops at a hold.
    #[test]
    fn a_transaction_is_bounded_and_stops_at_a_hold() {
        assert_eq!(next_chunk(3, v(1), None), 3);
        assert_eq!(next_chunk(10_000, v(1), None), APPLY_BATCH_MAX_RECORDS);
        assert_eq!(next_chunk(100, v(50), Some(v(59))), 10);
        assert_eq!(next_chunk(100, v(50), Some(v(50))), 1);
        assert_eq!(next_chunk(5, v(50), Some(v(1_000))), 5);
        assert_eq!(next_chunk(0, v(50), None), 0);
    }

    /// Records cut into transactions cover the batch exactly, in order, never past a hold.
    #[test]
    fn transactions_cover_the_records_in_order() {
        let (mut next, mut left) = (v(101), 1300usize);
        let hold = Some(v(700));
        let mut cuts = vec![];
        while left > 0 {
            let h = hold.filter(|&h| h >= next);
            let n = next_chunk(left, next, h);
            assert!(n > 0);
            cuts.push((next.0, n));
            next += n as u64;
            left -= n;
        }
        assert_eq!(next, v(1401));
        assert_eq!(cuts[0], (101, 512));
        assert_eq!(cuts[1], (613, 88)); // up to the hold at 700
        assert_eq!(cuts[2], (701, 512));
    }
}
