//! Lag arithmetic (docs/consistency.md, "Lag"), as plain functions over what the mirror has seen.
//!
//! The lag is an **upper bound** on how old the mirror's state is: the window's promise rests
//! on it. It is counted on the mirror's own monotonic clock, from polls of the primary:
//!
//! - A poll sent at local time `r` is answered with the primary's latest committed version
//!   `L`, read *after* the poll arrived there. Every change committed (so every change
//!   acknowledged to anyone) before `r` is at most `L`.
//! - So once the mirror has applied `L`, it holds everything committed before `r`: its state
//!   is at most `now - r` old. The lag is `now - r` for the newest such poll.
//! - With no poll the mirror has caught up with (a mirror just started, or restarted while cut
//!   off, or one whose polls fail), the lag is **unknown**, and an unknown lag is outside every
//!   window.
//!
//! Neither clock reading of the primary is needed for this (they are kept for display), so a
//! skew or a step of either machine's wall clock cannot make the bound low. Readings stamped
//! on arrival, or heartbeats pushed through the change log (which may have waited anywhere on
//! the way), would be biased low; they bound nothing here. A poll every `clock_poll_ms`
//! makes a mirror that keeps up show a lag of about that period plus one round trip.
//!
//! Polls are in flight together and may be answered out of order. Each answer is a claim of
//! its own ("everything committed before `r` is at most `L`"), so the order they arrive in
//! never makes the bound low: [`LagState::on_poll`] only keeps claims or weakens them.

use std::collections::VecDeque;

use strait_fs_core::Version;

/// Heartbeats remembered (for the newest version announced and the silence).
pub const HEARTBEATS_KEPT_MAX: usize = 64;
/// Polls remembered whose version the mirror has not applied yet (one per version, the
/// newest request for it). At 10 ms per poll, about 40 s of a mirror falling behind; past
/// that the oldest are forgotten, which can only make the lag read higher.
pub const POLLS_KEPT_MAX: usize = 4096;
/// Seconds of lag history kept (one sample per second), for p50/p99 and the dashboard chart.
pub const HISTORY_SECONDS: usize = 60;

/// A heartbeat as the mirror received it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Beat {
    /// The primary's clock reading, ms since the Unix epoch.
    pub primary_clock_ms: u64,
    /// The primary's latest committed version when it sent the heartbeat.
    pub latest_version: Version,
    /// The mirror's monotonic clock when the heartbeat arrived, in ms.
    pub arrived_ms: u64,
}

/// What the mirror knows, as inputs to the lag computation.
#[derive(Clone, Debug, Default)]
pub struct LagState {
    /// Heartbeats, oldest first (at most [`HEARTBEATS_KEPT_MAX`]).
    pub beats: VecDeque<Beat>,
    /// The mirror's applied version.
    pub applied: Version,
    /// The oldest received record not yet applied: its version and its commit time (primary
    /// clock, ms).
    pub oldest_pending: Option<(Version, u64)>,
    /// The newest version received in a record.
    pub received: Version,
    /// Polls not caught up with yet: (local ms the poll was sent, the primary's latest
    /// version in its answer), oldest first, versions strictly increasing.
    pub polls: VecDeque<(u64, Version)>,
    /// Local ms at which the newest poll the mirror has caught up with was sent: the mirror
    /// holds everything committed before it.
    pub caught_up_ms: Option<u64>,
}

/// Lag figures at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lag {
    pub ms: u64,
    /// How many versions the mirror is behind `latest`.
    pub versions: u64,
    /// The newest version the mirror knows the primary has.
    pub latest: Version,
    /// Milliseconds since the newest heartbeat arrived (None: no heartbeat yet).
    pub silence_ms: Option<u64>,
    /// Whether `ms` is a bound at all (false: no poll of the primary caught up with yet); an
    /// unknown lag is outside every window, and `ms` is then the time since anything was
    /// heard, for display.
    pub known: bool,
}

impl LagState {
    pub fn on_heartbeat(&mut self, b: Beat) {
        if self.beats.len() >= HEARTBEATS_KEPT_MAX {
            self.beats.pop_front();
        }
        self.beats.push_back(b);
    }

    /// Records `first..=last` arrived; the first of them committed at `first_ts_ms`.
    pub fn on_received(&mut self, first: Version, last: Version, first_ts_ms: u64) {
        if first == self.applied.next() && self.oldest_pending.is_none() {
            self.oldest_pending = Some((first, first_ts_ms));
        }
        self.received = self.received.max(last);
    }

    /// A poll sent at local time `requested_ms` was answered: the primary's latest version
    /// was `latest` (the reading itself goes through [`LagState::on_heartbeat`]).
    ///
    /// Each answer claims "everything committed before `requested_ms` is at most `latest`".
    /// Answers may arrive in any order; the claims kept are those no other claim beats (one
    /// sent later for no greater version), ordered by version and so by sending time.
    pub fn on_poll(&mut self, requested_ms: u64, latest: Version) {
        if latest <= self.applied {
            self.caught_up_ms = Some(
                self.caught_up_ms
                    .map_or(requested_ms, |c| c.max(requested_ms)),
            );
            return;
        }
        if self
            .polls
            .iter()
            .any(|&(r, l)| r >= requested_ms && l <= latest)
        {
            return;
        }
        self.polls
            .retain(|&(r, l)| !(r <= requested_ms && l >= latest));
        if self.polls.len() >= POLLS_KEPT_MAX {
            self.polls.pop_front();
        }
        let at = self.polls.partition_point(|&(_, l)| l < latest);
        self.polls.insert(at, (requested_ms, latest));
    }

    /// Records up to `applied` are applied; `next` is the oldest still pending (version, ts).
    pub fn on_applied(&mut self, applied: Version, next: Option<(Version, u64)>) {
        self.applied = applied;
        self.oldest_pending = next;
        while let Some(&(requested, latest)) = self.polls.front() {
            if latest > applied {
                break;
            }
            self.caught_up_ms = Some(self.caught_up_ms.map_or(requested, |c| c.max(requested)));
            self.polls.pop_front();
        }
        // heartbeats that announce nothing beyond the applied version are no longer needed,
        // except the newest, which carries the clock
        while self.beats.len() > 1 && self.beats[0].latest_version <= applied {
            self.beats.pop_front();
        }
    }

    /// The mirror's metadata was emptied (to bootstrap again): it holds nothing, so nothing
    /// it knew bounds its lag any more.
    pub fn on_wiped(&mut self) {
        self.applied = Version::ZERO;
        self.received = Version::ZERO;
        self.oldest_pending = None;
        self.polls.clear();
        self.caught_up_ms = None;
    }

    /// The lag at local monotonic time `now_ms` (see the module's documentation).
    pub fn lag(&self, now_ms: u64) -> Lag {
        let silence = self
            .beats
            .back()
            .map(|b| now_ms.saturating_sub(b.arrived_ms));
        let newest = self
            .beats
            .back()
            .map_or(Version::ZERO, |b| b.latest_version);
        let polled = self.polls.back().map_or(Version::ZERO, |p| p.1);
        let latest = self.received.max(newest).max(polled).max(self.applied);
        let bound = self.caught_up_ms.map(|c| now_ms.saturating_sub(c));
        Lag {
            ms: bound.unwrap_or_else(|| silence.unwrap_or(0)),
            versions: latest.0 - self.applied.0,
            latest,
            silence_ms: silence,
            known: bound.is_some(),
        }
    }
}

/// One sample per second over the last minute.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// (local wall clock ms, lag ms, lag versions), oldest first.
    pub points: VecDeque<(u64, u64, u64)>,
}

impl History {
    pub fn push(&mut self, at_ms: u64, lag: Lag) {
        if self.points.len() >= HISTORY_SECONDS {
            self.points.pop_front();
        }
        self.points.push_back((at_ms, lag.ms, lag.versions));
    }

    /// The `q` quantile (0..=1) of the lag in ms over the history (nearest rank).
    pub fn quantile_ms(&self, q: f64) -> u64 {
        let mut v: Vec<u64> = self.points.iter().map(|p| p.1).collect();
        quantile(&mut v, q)
    }
}

/// The `q` quantile of `v` by nearest rank (0 for no values); sorts `v`.
pub fn quantile(v: &mut [u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(clock: u64, latest: u64, arrived: u64) -> Beat {
        Beat {
            primary_clock_ms: clock,
            latest_version: Version(latest),
            arrived_ms: arrived,
        }
    }

    #[test]
    fn nothing_caught_up_with_is_unknown() {
        let mut s = LagState::default();
        assert!(!s.lag(0).known);
        // log heartbeats alone bound nothing: they may have waited anywhere on the way
        s.on_heartbeat(beat(1_000, 5, 0));
        s.on_applied(Version(5), None);
        assert!(!s.lag(10).known);
        // a poll that announces what the mirror has not applied: still nothing
        let mut s = LagState::default();
        s.on_poll(0, Version(5));
        assert!(!s.lag(10).known);
        assert_eq!(s.lag(10).versions, 5);
        s.on_applied(Version(5), None);
        let l = s.lag(10);
        assert!(l.known);
        assert_eq!((l.ms, l.versions), (10, 0));
    }

    #[test]
    fn the_lag_counts_from_when_the_poll_caught_up_with_was_sent() {
        let mut s = LagState::default();
        // polls sent at 0, 100 and 200 found versions 3, 6 and 9
        s.on_poll(0, Version(3));
        s.on_poll(100, Version(6));
        s.on_poll(200, Version(9));
        // at 250 the mirror has applied 7: it holds everything committed before 100 (not
        // yet what was committed between 100 and 200)
        s.on_applied(Version(7), None);
        assert_eq!(s.lag(250).ms, 150);
        // the lag grows with time alone until the mirror reaches the next poll's version
        assert_eq!(s.lag(900).ms, 800);
        s.on_applied(Version(9), None);
        assert_eq!(s.lag(900).ms, 700);
        assert!(s.polls.is_empty());
    }

    #[test]
    fn a_later_poll_of_a_version_already_applied_moves_the_bound_at_once() {
        let mut s = LagState::default();
        s.on_applied(Version(5), None);
        s.on_poll(1_000, Version(5));
        assert_eq!(s.lag(1_040).ms, 40);
        // an answer that arrives late (a poll sent earlier) does not move it back
        s.on_poll(600, Version(5));
        assert_eq!(s.lag(1_040).ms, 40);
    }

    #[test]
    fn polls_answered_out_of_order_never_make_the_bound_low() {
        // polls sent at 0, 10 and 20, all in flight at once; the primary served the one sent
        // at 20 first (version 4), then those sent at 10 (6) and 0 (8): the answers arrive
        // newest first
        let mut s = LagState::default();
        s.on_poll(20, Version(4));
        s.on_poll(10, Version(6));
        s.on_poll(0, Version(8));
        // at 50 the mirror has applied 4: it holds what was committed before 20, no more
        s.on_applied(Version(4), None);
        assert_eq!(s.lag(50).ms, 30);
        // having applied 6 tells nothing newer than 20 (the poll sent at 10 is older)
        s.on_applied(Version(6), None);
        assert_eq!(s.lag(50).ms, 30);
        // and versions between two claims give none of the newer one's
        let mut s = LagState::default();
        s.on_poll(0, Version(3));
        s.on_poll(20, Version(9));
        s.on_poll(10, Version(6));
        s.on_applied(Version(7), None);
        assert_eq!(
            s.lag(50).ms,
            40,
            "only the poll sent at 10 (version 6) is caught up with"
        );
        s.on_applied(Version(9), None);
        assert_eq!(s.lag(50).ms, 30);
    }

    #[test]
    fn clocks_do_not_enter_the_bound() {
        // the primary's clock a day ahead, or stepped back: the lag is the same
        for clock in [1_000u64, 86_401_000, 3] {
            let mut s = LagState::default();
            s.on_heartbeat(beat(clock, 10, 500));
            s.on_poll(480, Version(10));
            s.on_received(Version(1), Version(10), clock.saturating_sub(100));
            assert!(!s.lag(550).known);
            s.on_applied(Version(10), None);
            let l = s.lag(550);
            assert_eq!(
                (l.ms, l.versions, l.latest, l.known),
                (70, 0, Version(10), true)
            );
        }
    }

    #[test]
    fn silence_makes_the_lag_grow_and_a_wipe_forgets_the_bound() {
        let mut s = LagState::default();
        s.on_poll(0, Version::ZERO);
        assert_eq!(s.lag(3_000).ms, 3_000);
        s.on_wiped();
        assert!(!s.lag(3_000).known);
    }

    #[test]
    fn polls_kept_are_bounded_and_forgetting_only_raises_the_lag() {
        let mut s = LagState::default();
        for i in 0..(POLLS_KEPT_MAX as u64 + 10) {
            s.on_poll(i * 100, Version(i + 1));
        }
        assert_eq!(s.polls.len(), POLLS_KEPT_MAX);
        // the version of a forgotten poll: no bound from it
        s.on_applied(Version(5), None);
        assert!(!s.lag(100_000).known);
        s.on_applied(Version(20), None);
        assert_eq!(s.lag(100_000).ms, 100_000 - 1_900);
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let mut v: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&mut v, 0.5), 50);
        assert_eq!(quantile(&mut v, 0.99), 99);
        assert_eq!(quantile(&mut v, 1.0), 100);
        assert_eq!(quantile(&mut [], 0.5), 0);
    }
}
