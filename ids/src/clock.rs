//! The wall clock, read in one place. Everything else that needs the time of day (stamps in
//! records and heartbeats, session ages shown to operators, names of set-aside files) asks
//! here; the clippy configuration (`clippy.toml`) refuses `SystemTime::now` anywhere else.
//! Durations and timeouts use the monotonic clock (`Instant`), never this one: a step of the
//! machine's clock must not expire a session or a lease (docs/chaos.md, `clock-jump`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The wall clock now.
#[allow(clippy::disallowed_methods)] // the one reading
pub fn now() -> SystemTime {
    SystemTime::now()
}

/// Time since the Unix epoch of `t` (zero for a time before 1970).
pub fn since_epoch(t: SystemTime) -> Duration {
    t.duration_since(UNIX_EPOCH).unwrap_or_default()
}

/// Nanoseconds since the Unix epoch (0 if the clock is set before 1970).
pub fn now_ns() -> i64 {
    i64::try_from(since_epoch(now()).as_nanos()).unwrap_or(i64::MAX)
}

/// Microseconds since the Unix epoch (0 if the clock is set before 1970).
pub fn now_us() -> u64 {
    u64::try_from(since_epoch(now()).as_micros()).unwrap_or(u64::MAX)
}

/// Milliseconds since the Unix epoch (0 if the clock is set before 1970).
pub fn now_ms() -> u64 {
    u64::try_from(since_epoch(now()).as_millis()).unwrap_or(u64::MAX)
}

/// Seconds since the Unix epoch (0 if the clock is set before 1970).
pub fn now_s() -> u64 {
    since_epoch(now()).as_secs()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_units_agree_and_a_time_before_1970_is_zero() {
        let (s, ms, us, ns) = (now_s(), now_ms(), now_us(), now_ns());
        assert!(s > 1_700_000_000, "{s}");
        assert!(ms / 1000 >= s && ms / 1000 - s < 5, "{ms} {s}");
        assert!(us / 1000 >= ms && us / 1000 - ms < 5_000, "{us} {ms}");
        assert!(
            ns as u64 / 1000 >= us && ns as u64 / 1000 - us < 5_000_000,
            "{ns} {us}"
        );
        let before = UNIX_EPOCH - Duration::from_secs(10);
        assert_eq!(since_epoch(before), Duration::ZERO);
    }
}
