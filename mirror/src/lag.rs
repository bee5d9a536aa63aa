//! Lag arithmetic (docs/consistency.md, "Lag"), as plain functions over what the mirror has seen.
//!
//! Lag is measured on the primary's clock, never by comparing two machines' clocks, and it is
//! an upper bound: the window's promise rests on it.
//!
//! - "Now at the primary" is bounded from above by the freshest *poll* of the primary's
//!   clock: its reading plus the time elapsed locally since the poll was *requested* (the
//!   primary read its clock after that). A reading pushed through the change log (a log
//!   heartbeat) cannot bound it (it may have waited anywhere on the way), and a reading
//!   stamped on arrival would be low by its own trip.
//! - What the mirror already has is bounded from below: with a record received and not
//!   applied, everything committed before that record's commit time (a primary clock
//!   reading it carries) is applied; otherwise, everything up to the clock of the newest
//!   reading (poll or log heartbeat) whose latest version the mirror has applied.
//! - The lag is the first minus the second. With no poll yet, or no reading it has caught up
//!   with, the lag is unknown, and an unknown lag is outside every window: a mirror restarted
//!   while cut off never counts as fresh.
//!
//! Skew between the regions' clocks cancels out. A mirror that stops hearing from the
//! primary sees its lag grow with the time since its last poll was sent.

use std::collections::VecDeque;

/// Heartbeats remembered for the "announced but not received" case.
pub const HEARTBEATS_KEPT_MAX: usize = 64;
/// Seconds of lag history kept (one sample per second), for p50/p99 and the dashboard chart.
pub const HISTORY_SECONDS: usize = 60;

/// A heartbeat as the mirror received it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Beat {
    /// The primary's clock reading, ms since the Unix epoch.
    pub primary_clock_ms: u64,
    /// The primary's latest committed version when it sent the heartbeat.
    pub latest_version: u64,
    /// The mirror's monotonic clock when the heartbeat arrived, in ms.
    pub arrived_ms: u64,
}

/// The freshest bound on the primary's clock: a poll's reading and when it was requested.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Poll {
    pub primary_clock_ms: u64,
    /// The mirror's monotonic clock when the poll was sent, ms.
    pub requested_ms: u64,
}

/// What the mirror knows, as inputs to the lag computation.
#[derive(Clone, Debug, Default)]
pub struct LagState {
    /// Heartbeats, oldest first (at most [`HEARTBEATS_KEPT_MAX`]).
    pub beats: VecDeque<Beat>,
    /// The mirror's applied version.
    pub applied: u64,
    /// The commit time (primary clock, ms) of the oldest received record not yet applied, and
    /// its version.
    pub oldest_pending: Option<(u64, u64)>,
    /// The newest version received in a record.
    pub received: u64,
    /// The poll giving the tightest bound on the primary's clock.
    pub poll: Option<Poll>,
    /// The newest primary clock reading up to which the mirror has applied everything.
    pub caught_up_clock: Option<u64>,
}

/// Lag figures at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lag {
    pub ms: u64,
    pub versions: u64,
    /// The newest version the mirror knows the primary has.
    pub latest: u64,
    /// Milliseconds since the newest heartbeat arrived (None: no heartbeat yet).
    pub silence_ms: Option<u64>,
    /// Whether `ms` is a bound at all (false: no poll of the primary's clock yet, or no
    /// reading the mirror has caught up with); an unknown lag is outside every window.
    pub known: bool,
}

impl LagState {
    pub fn on_heartbeat(&mut self, b: Beat) {
        self.caught_up(b.primary_clock_ms, b.latest_version);
        if self.beats.len() >= HEARTBEATS_KEPT_MAX {
            self.beats.pop_front();
        }
        self.beats.push_back(b);
    }

    /// A poll of the primary: at its clock `primary_clock_ms` (read after local time
    /// `requested_ms`) its latest version was `latest_version`. Bounds the primary's clock and
    /// is kept as a heartbeat.
    pub fn on_poll(&mut self, primary_clock_ms: u64, latest_version: u64, requested_ms: u64) {
        self.bound_by_poll(primary_clock_ms, latest_version, requested_ms);
        self.on_heartbeat(Beat {
            primary_clock_ms,
            latest_version,
            arrived_ms: requested_ms,
        });
    }

    /// The bound a poll gives on the primary's clock (and what it says the mirror has caught
    /// up with), without keeping it as a heartbeat.
    pub fn bound_by_poll(&mut self, primary_clock_ms: u64, latest_version: u64, requested_ms: u64) {
        self.caught_up(primary_clock_ms, latest_version);
        let p = Poll {
            primary_clock_ms,
            requested_ms,
        };
        // the bound at any instant is clock + (now - requested): the smaller difference wins
        let tighter = |a: &Poll, b: &Poll| {
            (a.primary_clock_ms as i128 - a.requested_ms as i128)
                < (b.primary_clock_ms as i128 - b.requested_ms as i128)
        };
        if self.poll.is_none_or(|old| tighter(&p, &old)) {
            self.poll = Some(p);
        }
    }

    fn caught_up(&mut self, clock: u64, latest: u64) {
        if latest <= self.applied {
            self.caught_up_clock = Some(self.caught_up_clock.map_or(clock, |c| c.max(clock)));
        }
    }

    /// Records `first..=last` arrived; the first of them committed at `first_ts_ms`.
    pub fn on_received(&mut self, first: u64, last: u64, first_ts_ms: u64) {
        if first == self.applied + 1 && self.oldest_pending.is_none() {
            self.oldest_pending = Some((first, first_ts_ms));
        }
        self.received = self.received.max(last);
    }

    /// Records up to `applied` are applied; `next` is the oldest still pending (version, ts).
    pub fn on_applied(&mut self, applied: u64, next: Option<(u64, u64)>) {
        self.applied = applied;
        self.oldest_pending = next;
        let caught: Vec<(u64, u64)> = self
            .beats
            .iter()
            .map(|b| (b.primary_clock_ms, b.latest_version))
            .collect();
        for (clock, latest) in caught {
            self.caught_up(clock, latest);
        }
        // heartbeats that announce nothing beyond the applied version are no longer needed,
        // except the newest, which carries the clock
        while self.beats.len() > 1 && self.beats[0].latest_version <= applied {
            self.beats.pop_front();
        }
    }

    /// The lag at local monotonic time `now_ms` (see the module's documentation).
    pub fn lag(&self, now_ms: u64) -> Lag {
        let silence = self
            .beats
            .back()
            .map(|b| now_ms.saturating_sub(b.arrived_ms));
        let newest = self.beats.back().map_or(0, |b| b.latest_version);
        let latest = self.received.max(newest).max(self.applied);
        let primary_now = self
            .poll
            .map(|p| p.primary_clock_ms + now_ms.saturating_sub(p.requested_ms));
        let have_until = match self.oldest_pending {
            Some((_, ts)) => Some(ts),
            None => self.caught_up_clock,
        };
        let ms = match (primary_now, have_until) {
            (Some(now), Some(until)) => Some(now.saturating_sub(until)),
            _ => None,
        };
        Lag {
            // unknown: the time since anything was heard, for display
            ms: ms.unwrap_or_else(|| silence.unwrap_or(0)),
            versions: latest - self.applied,
            latest,
            silence_ms: silence,
            known: ms.is_some(),
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
            latest_version: latest,
            arrived_ms: arrived,
        }
    }

    #[test]
    fn skew_between_the_clocks_does_not_change_the_lag() {
        // the primary's clock is a day ahead of the mirror's monotonic clock: no matter
        for skew in [0u64, 86_400_000] {
            let mut s = LagState::default();
            s.on_poll(1_000 + skew, 10, 500);
            s.on_received(1, 10, 900 + skew);
            // 50 ms after the poll was sent, record 1 (committed 100 ms before the primary
            // read its clock) is still unapplied: at most 150 ms of lag
            let l = s.lag(550);
            assert_eq!((l.ms, l.versions, l.latest, l.known), (150, 10, 10, true));
        }
    }

    #[test]
    fn no_poll_or_nothing_caught_up_with_is_unknown() {
        let mut s = LagState::default();
        assert!(!s.lag(0).known);
        // log heartbeats alone bound nothing: they may have waited anywhere on the way
        s.on_heartbeat(beat(1_000, 5, 0));
        s.on_applied(5, None);
        assert!(!s.lag(10).known);
        // a poll that announces what the mirror has not applied: still no lower end
        let mut s = LagState::default();
        s.on_poll(1_000, 5, 0);
        assert!(!s.lag(10).known);
        s.on_applied(5, None);
        assert!(s.lag(10).known);
    }

    #[test]
    fn the_bound_counts_from_when_a_poll_was_requested() {
        // requested at 0, the primary read its clock (1 000) about 200 ms later, the answer
        // arrived at 400: at 400 the primary's clock is at most 1 400, so a mirror caught up
        // with the reading is at most 400 ms behind (a stamp on arrival would say 0)
        let mut s = LagState::default();
        s.on_applied(5, None);
        s.on_poll(1_000, 5, 0);
        assert_eq!(s.lag(400).ms, 400);
        // a later, faster poll (the primary's clock runs ~800 ms ahead: this one was read
        // ~5 ms after it was requested) tightens the bound
        s.on_poll(1_235, 5, 430);
        assert_eq!(s.lag(450).ms, 20);
    }

    #[test]
    fn an_announced_version_counts_from_the_last_reading_caught_up_with() {
        let mut s = LagState::default();
        s.on_poll(1_000, 5, 0);
        s.on_applied(5, None);
        assert_eq!(s.lag(100).ms, 100);
        // a log heartbeat announces version 7, whose record has not arrived
        s.on_heartbeat(beat(1_200, 7, 200));
        let l = s.lag(260);
        assert_eq!((l.ms, l.versions), (260, 2));
        s.on_applied(7, None);
        assert_eq!(s.lag(260).ms, 60);
    }

    #[test]
    fn silence_makes_the_lag_grow() {
        let mut s = LagState::default();
        s.on_poll(1_000, 5, 0);
        s.on_applied(5, None);
        assert_eq!(s.lag(900).ms, 900);
        let l = s.lag(3_000);
        assert_eq!((l.ms, l.known), (3_000, true));
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
