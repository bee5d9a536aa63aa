//! When this daemon last heard from each session, on its monotonic clock (see
//! [`crate::sessions`] for why not the wall clock).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// When this daemon last heard from each session (its open, resume or heartbeat).
#[derive(Default)]
pub struct Heard {
    at: Mutex<HashMap<u64, Instant>>,
}

impl Heard {
    /// Session `sid` was heard from at `now`.
    pub fn note(&self, sid: u64, now: Instant) {
        self.at.lock().insert(sid, now);
    }

    /// Of the sessions the engine lists, those silent for more than `timeout` at `now`. A
    /// listed session this daemon has not heard from yet (one from before a restart) counts
    /// as heard now, so it has a whole timeout to come back; sessions no longer listed are
    /// forgotten.
    pub fn silent(&self, listed: &[u64], now: Instant, timeout: Duration) -> Vec<u64> {
        let mut at = self.at.lock();
        at.retain(|sid, _| listed.contains(sid));
        let mut out = vec![];
        for &sid in listed {
            let last = *at.entry(sid).or_insert(now);
            if now.saturating_duration_since(last) > timeout {
                out.push(sid);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_judged_by_the_monotonic_clock_since_it_was_last_heard() {
        let heard = Heard::default();
        let t0 = Instant::now();
        let timeout = Duration::from_secs(60);
        heard.note(1, t0);
        // 2 is listed but not heard yet (from before a restart): it gets a whole timeout
        assert!(heard
            .silent(&[1, 2], t0 + Duration::from_secs(59), timeout)
            .is_empty());
        heard.note(1, t0 + Duration::from_secs(100));
        assert_eq!(
            heard.silent(&[1, 2], t0 + Duration::from_secs(120), timeout),
            vec![2]
        );
        assert!(heard
            .silent(&[1], t0 + Duration::from_secs(160), timeout)
            .is_empty());
        assert_eq!(
            heard.silent(&[1], t0 + Duration::from_secs(161), timeout),
            vec![1]
        );
        // a session no longer listed is forgotten
        assert!(heard.silent(&[], t0, timeout).is_empty());
        assert!(heard.at.lock().is_empty());
    }
}
