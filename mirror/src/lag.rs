//! Lag arithmetic (docs/consistency.md, "Lag"), as plain functions over what the mirror has seen.
//!
//! Lag is measured on the primary's clock, never by comparing two machines' clocks: the
//! mirror estimates "now at the primary" as the newest heartbeat's clock reading plus the
//! time elapsed locally since that heartbeat arrived, and subtracts the commit time (also a
//! primary clock reading, carried by every record) of the oldest record it has not applied.
//! Skew between the regions' clocks therefore cancels out.
//!
//! Two cases need care:
//! - An unapplied record the mirror has not received yet (a heartbeat announced a newer
//!   version than any record that arrived): its commit time is at most the clock reading of
//!   the first heartbeat that announced it, so that reading stands in for it.
//! - Silence: with no heartbeat for longer than `silence_ms`, the mirror cannot know what the
//!   primary committed since, so the lag is counted from the newest heartbeat's clock reading
//!   and grows with the silence. A cut-off mirror is never reported as caught up.

use std::collections::VecDeque;

use strait_fs_core::Version;

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

    /// Records up to `applied` are applied; `next` is the oldest still pending (version, ts).
    pub fn on_applied(&mut self, applied: Version, next: Option<(Version, u64)>) {
        self.applied = applied;
        self.oldest_pending = next;
        // heartbeats that announce nothing beyond the applied version are no longer needed,
        // except the newest, which carries the clock
        while self.beats.len() > 1 && self.beats[0].latest_version <= applied {
            self.beats.pop_front();
        }
    }

    /// The lag at local monotonic time `now_ms`.
    pub fn lag(&self, now_ms: u64, silence_limit_ms: u64) -> Lag {
        let Some(newest) = self.beats.back() else {
            // no clock reading from the primary yet: nothing can be said in ms
            return Lag {
                ms: 0,
                versions: self.received.0.saturating_sub(self.applied.0),
                latest: self.received.max(self.applied),
                silence_ms: None,
            };
        };
        let silence = now_ms.saturating_sub(newest.arrived_ms);
        let primary_now = newest.primary_clock_ms + silence;
        let latest = self.received.max(newest.latest_version).max(self.applied);
        // the commit time of the oldest unapplied record, or an upper bound of it
        let oldest = match self.oldest_pending {
            Some((_, ts)) => Some(ts),
            None => self
                .beats
                .iter()
                .find(|b| b.latest_version > self.applied)
                .map(|b| b.primary_clock_ms),
        };
        let mut ms = oldest.map(|ts| primary_now.saturating_sub(ts)).unwrap_or(0);
        if silence > silence_limit_ms {
            ms = ms.max(silence);
        }
        Lag {
            ms,
            versions: latest.0 - self.applied.0,
            latest,
            silence_ms: Some(silence),
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
    fn skew_between_the_clocks_does_not_change_the_lag() {
        // the primary's clock is a day ahead of the mirror's monotonic clock: no matter
        for skew in [0u64, 86_400_000] {
            let mut s = LagState::default();
            s.on_heartbeat(beat(1_000 + skew, 10, 500));
            s.on_received(Version(1), Version(10), 900 + skew);
            // 50 ms after the heartbeat arrived, record 1 (committed 100 ms before the
            // heartbeat was sent) is still unapplied: 150 ms of lag
            let l = s.lag(550, 1_000);
            assert_eq!((l.ms, l.versions, l.latest), (150, 10, Version(10)));
        }
    }

    #[test]
    fn caught_up_is_zero_and_an_announced_version_counts_from_its_heartbeat() {
        let mut s = LagState::default();
        s.on_heartbeat(beat(1_000, 5, 0));
        s.on_applied(Version(5), None);
        assert_eq!(s.lag(100, 1_000).ms, 0);
        // a heartbeat announces version 7, whose record has not arrived
        s.on_heartbeat(beat(1_200, 7, 200));
        let l = s.lag(260, 1_000);
        assert_eq!((l.ms, l.versions), (60, 2));
        s.on_applied(Version(7), None);
        assert_eq!(s.lag(260, 1_000).ms, 0);
    }

    #[test]
    fn silence_makes_the_lag_grow() {
        let mut s = LagState::default();
        s.on_heartbeat(beat(1_000, 5, 0));
        s.on_applied(Version(5), None);
        assert_eq!(s.lag(900, 1_000).ms, 0);
        let l = s.lag(3_000, 1_000);
        assert_eq!((l.ms, l.silence_ms), (3_000, Some(3_000)));
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
