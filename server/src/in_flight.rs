//! [`InFlight`]: the calls that passed a site daemon's fence and may still commit. A planned
//! hand-over refuses new calls first, then waits for this count to reach zero before it
//! reads the version it hands over at: a call that passed the fence just before the refusal
//! began commits before that version is read, never after the answer.
//!
//! # To ensure correctness
//! A call enters before it asks the fence, and leaves once its engine call has returned (its
//! commit made or not); the hand-over sets its refusal before it counts. Both sides store,
//! then fence (`SeqCst`), then load, so either the call sees the refusal or the hand-over
//! sees the call.

use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The calls in flight past a fence.
#[derive(Debug, Default)]
pub struct InFlight {
    n: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// One call in flight: it leaves when dropped.
#[derive(Debug)]
pub struct InFlightGuard(Arc<InFlight>);

impl InFlight {
    /// A call enters, before it asks the fence.
    pub fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.n.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        InFlightGuard(self.clone())
    }

    /// Calls in flight now.
    pub fn count(&self) -> usize {
        fence(Ordering::SeqCst);
        self.n.load(Ordering::SeqCst)
    }

    /// Wait until no call is in flight, at most `timeout`; the count left (0: drained).
    pub async fn drained(&self, timeout: Duration) -> usize {
        let wait = async {
            loop {
                let idle = self.idle.notified();
                tokio::pin!(idle);
                // registered before the count is read: a leave in between wakes it
                idle.as_mut().enable();
                if self.count() == 0 {
                    return;
                }
                idle.await;
            }
        };
        let _ = tokio::time::timeout(timeout, wait).await;
        self.count()
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.n.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_count_drains_when_the_last_call_leaves() {
        let f = Arc::new(InFlight::default());
        assert_eq!(f.drained(Duration::from_millis(1)).await, 0);
        let a = f.enter();
        let b = f.enter();
        assert_eq!(f.drained(Duration::from_millis(20)).await, 2);
        drop(a);
        let f2 = f.clone();
        let waiting = tokio::spawn(async move { f2.drained(Duration::from_secs(10)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "drained while a call is in flight");
        drop(b);
        assert_eq!(waiting.await.unwrap(), 0);
    }
}
