//! One way for a test to wait for something: [`wait_until`].

use std::convert::Infallible;
use std::fmt::Display;
use std::time::{Duration, Instant};

/// What a check of [`wait_until`] answers: ready with a value, or not yet (and, when it can
/// say, what it saw instead: formatted only for the message if the wait runs out).
pub trait Check {
    type Value;
    type Seen: Display;
    fn ready(self) -> Result<Self::Value, Option<Self::Seen>>;
}

impl Check for bool {
    type Value = ();
    type Seen = Infallible;
    fn ready(self) -> Result<(), Option<Infallible>> {
        if self {
            Ok(())
        } else {
            Err(None)
        }
    }
}

impl<T> Check for Option<T> {
    type Value = T;
    type Seen = Infallible;
    fn ready(self) -> Result<T, Option<Infallible>> {
        self.ok_or(None)
    }
}

impl<T, E: Display> Check for Result<T, E> {
    type Value = T;
    type Seen = E;
    fn ready(self) -> Result<T, Option<E>> {
        self.map_err(Some)
    }
}

/// What a check saw, built only if it is shown: a daemon's log, say, read once when the wait
/// runs out rather than at every poll.
pub struct Later<F>(F);

/// [`Later`] of `f`.
pub fn later<F: Fn() -> String>(f: F) -> Later<F> {
    Later(f)
}

impl<F: Fn() -> String> Display for Later<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&(self.0)())
    }
}

/// Calls `check` until it is ready (`true`, `Some(v)` or `Ok(v)`) and returns its value;
/// first at once, then at pauses that grow from 10 ms to 250 ms. Panics once `within` has
/// passed, naming `what` and, for a `Result`, the last error `check` gave.
pub fn wait_until<C: Check>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> C,
) -> C::Value {
    let start = Instant::now();
    let mut pause = Duration::from_millis(10);
    loop {
        let last = match check().ready() {
            Ok(v) => return v,
            Err(last) => last,
        };
        if start.elapsed() >= within {
            match last {
                Some(last) => panic!("{what}: not within {within:?} (last: {last})"),
                None => panic!("{what}: not within {within:?}"),
            }
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(250));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_returns_the_value_once_ready() {
        let mut n = 0;
        let v = wait_until("the third call", Duration::from_secs(5), || {
            n += 1;
            (n == 3).then_some(n)
        });
        assert_eq!(v, 3);
    }

    #[test]
    #[should_panic(expected = "never: not within 50ms (last: still 7)")]
    fn a_wait_that_runs_out_says_what_it_last_saw() {
        wait_until(
            "never",
            Duration::from_millis(50),
            || -> Result<(), String> { Err("still 7".into()) },
        );
    }
}
