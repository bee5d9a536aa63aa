//! Which slice ids each session was given (docs/consistency.md, "Slice ids belong to the
//! session that took them").
//!
//! A mount takes slice ids in ranges (`AllocSliceIds`) and names its blocks after them
//! before it commits the slice. A daemon remembers, per session, the ranges it handed out,
//! and refuses a `WriteSlice` or `CompactChunk` naming an id outside them: a mount can then
//! neither commit a slice under an id another writer owns (and whose blocks it may have
//! overwritten) nor make one up. A mirror keeps the same table for the ranges it forwarded
//! for each of its mounts, and checks it before it uploads a forwarded write's blocks to the
//! primary's store.
//!
//! The table is region-local runtime state, in memory: a restarted daemon knows no range,
//! refuses every id handed out before, and the mount takes a new range and writes the slice
//! again under an id from it (`Error::SliceNotAllocated`). Pure bookkeeping, no I/O.
//!
//! # Bounds
//! Each session keeps its newest [`RANGES_PER_SESSION_MAX`] ranges (a mount uses one range
//! at a time; a mirror's session at the primary holds the ranges of all its region's
//! mounts), and the table its [`SESSIONS_MAX`] most recently served sessions. A range
//! forgotten to the bound is refused like one a restart forgot: the writer takes a new one.

use std::collections::{HashMap, VecDeque};

use strait_fs_core::SliceId;

/// Ranges remembered per session (at 1,000 ids each: four million ids in flight).
pub const RANGES_PER_SESSION_MAX: usize = 4096;
/// Sessions remembered; the one that took a range longest ago is forgotten first.
pub const SESSIONS_MAX: usize = 65_536;

#[derive(Debug, Default)]
struct Granted {
    /// `[first, end)`, oldest first.
    ranges: VecDeque<(u64, u64)>,
    /// When the session last took a range (the table's own counter).
    last: u64,
}

/// The ranges of slice ids handed to each session.
#[derive(Debug)]
pub struct SliceRanges {
    sessions: HashMap<u64, Granted>,
    /// Counts grants, to find the session served longest ago.
    tick: u64,
    ranges_max: usize,
    sessions_max: usize,
}

impl Default for SliceRanges {
    fn default() -> Self {
        SliceRanges::with_bounds(RANGES_PER_SESSION_MAX, SESSIONS_MAX)
    }
}

impl SliceRanges {
    pub fn with_bounds(ranges_max: usize, sessions_max: usize) -> Self {
        SliceRanges {
            sessions: HashMap::new(),
            tick: 0,
            ranges_max: ranges_max.max(1),
            sessions_max: sessions_max.max(1),
        }
    }

    /// Session `sid` was given `count` ids from `first`.
    pub fn grant(&mut self, sid: u64, first: SliceId, count: u32) {
        if count == 0 {
            return;
        }
        self.tick += 1;
        if !self.sessions.contains_key(&sid) && self.sessions.len() >= self.sessions_max {
            if let Some(oldest) = self
                .sessions
                .iter()
                .min_by_key(|(_, g)| g.last)
                .map(|(s, _)| *s)
            {
                self.sessions.remove(&oldest);
            }
        }
        let g = self.sessions.entry(sid).or_default();
        g.last = self.tick;
        g.ranges
            .push_back((first.0, first.0.saturating_add(count as u64)));
        while g.ranges.len() > self.ranges_max {
            g.ranges.pop_front();
        }
    }

    /// Whether session `sid` was given `id` (a hole, id 0, has no blocks: always).
    pub fn owns(&self, sid: u64, id: SliceId) -> bool {
        if id.is_hole() {
            return true;
        }
        self.sessions.get(&sid).is_some_and(|g| {
            // the newest range is the one in use
            g.ranges
                .iter()
                .rev()
                .any(|&(first, end)| first <= id.0 && id.0 < end)
        })
    }

    /// The first of `ids` session `sid` was not given, if any.
    pub fn first_foreign(
        &self,
        sid: u64,
        ids: impl IntoIterator<Item = SliceId>,
    ) -> Option<SliceId> {
        ids.into_iter().find(|&id| !self.owns(sid, id))
    }

    /// Forget a closed or expired session.
    pub fn forget(&mut self, sid: u64) {
        self.sessions.remove(&sid);
    }

    /// Forget every session.
    pub fn clear(&mut self) {
        self.sessions.clear();
    }

    /// Every range remembered: (session, first id, end), the end excluded.
    pub fn ranges(&self) -> Vec<(u64, SliceId, u64)> {
        self.sessions
            .iter()
            .flat_map(|(&sid, g)| g.ranges.iter().map(move |&(f, e)| (sid, SliceId(f), e)))
            .collect()
    }

    /// Sessions remembered.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_owns_exactly_the_ranges_it_was_given() {
        let mut t = SliceRanges::default();
        t.grant(7, SliceId(1000), 1000);
        assert!(t.owns(7, SliceId(1000)));
        assert!(t.owns(7, SliceId(1999)));
        assert!(!t.owns(7, SliceId(999)));
        assert!(!t.owns(7, SliceId(2000)));
        // another session was given nothing
        assert!(!t.owns(8, SliceId(1500)));
        // a hole has no blocks: nobody needs to own it
        assert!(t.owns(8, SliceId::HOLE));
        assert_eq!(
            t.first_foreign(7, [SliceId(1001), SliceId(5), SliceId(1002)]),
            Some(SliceId(5))
        );
        assert_eq!(t.first_foreign(7, [SliceId(1001)]), None);
    }

    #[test]
    fn a_forgotten_or_cleared_session_owns_nothing() {
        let mut t = SliceRanges::default();
        t.grant(7, SliceId(1000), 10);
        t.grant(8, SliceId(2000), 10);
        t.forget(7);
        assert!(!t.owns(7, SliceId(1000)));
        assert!(t.owns(8, SliceId(2000)));
        // a restarted daemon: nothing is known
        t.clear();
        assert!(!t.owns(8, SliceId(2000)));
    }

    #[test]
    fn only_the_newest_ranges_of_a_session_are_kept() {
        let mut t = SliceRanges::with_bounds(2, 10);
        t.grant(7, SliceId(100), 10);
        t.grant(7, SliceId(200), 10);
        t.grant(7, SliceId(300), 10);
        assert!(!t.owns(7, SliceId(105)), "the oldest range is forgotten");
        assert!(t.owns(7, SliceId(205)));
        assert!(t.owns(7, SliceId(305)));
    }

    #[test]
    fn the_session_served_longest_ago_is_forgotten_first() {
        let mut t = SliceRanges::with_bounds(4, 2);
        t.grant(1, SliceId(100), 10);
        t.grant(2, SliceId(200), 10);
        // session 1 takes another range: session 2 is now the one served longest ago
        t.grant(1, SliceId(300), 10);
        t.grant(3, SliceId(400), 10);
        assert_eq!(t.sessions(), 2);
        assert!(t.owns(1, SliceId(105)));
        assert!(!t.owns(2, SliceId(205)));
        assert!(t.owns(3, SliceId(405)));
    }

    #[test]
    fn a_range_at_the_end_of_the_id_space_does_not_wrap() {
        let mut t = SliceRanges::default();
        t.grant(1, SliceId(u64::MAX - 5), 1000);
        assert!(t.owns(1, SliceId(u64::MAX - 1)));
        assert!(!t.owns(1, SliceId(5)));
    }
}
