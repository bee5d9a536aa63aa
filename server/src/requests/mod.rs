//! Mutations sent again: a mount names each mutation with a request id
//! ([`REQUEST_ID_HEADER`]) and sends the same id when it sends the call again after the
//! connection broke with the call in flight. The daemon runs a request id once and answers
//! every later call with that id with the first call's result, so a retried `RENAME_EXCHANGE`
//! does not swap the files back and a retried `unlink` does not answer ENOENT.
//!
//! Two tables answer a retry: this one, in memory, and the request records on disk
//! (`strait_fs_core::meta::requests`), which a change made under a request id commits in its
//! own KV transaction. A retry is looked for here first, then in the records; the records
//! survive a restart of the daemon, this table does not. [`sweep`] expires the records.
//!
//! # To ensure correctness
//! - The first call's work runs in a task of its own ([`Slot`] is filled by it), not in the
//!   call's future: when a connection breaks, the server drops that future, and a commit then
//!   still under way would be invisible to the retry, which would run it again.
//! - A retry that arrives while the first call is still running waits for its result.
//! - Results are kept [`KEEP`] (a mount gives up retrying after its reconnect timeout, 60 s by
//!   default) and at most [`SLOTS_MAX`] of them; past that the oldest are forgotten first.
//! - A call with an id that this table does not hold (the first attempt, or a retry after the
//!   daemon restarted or the slot was forgotten) looks its record up before it runs, in the
//!   same engine call: a record means the change committed, and its first result is the
//!   answer; no record means it did not (the record commits with the change), and it runs,
//!   unless the client marks the call as sent before ([`RETRY_HEADER`]) while records may be
//!   missing (removed early, or lost with metadata the primary took back from the
//!   replicator): then it is answered EIO, "may or may not have been applied".
//!   While an id's slot is held here, its later calls wait for the first one's result, so no
//!   two calls with one id can both miss the record and both commit.
//! - Calls that commit no record (closing handles and sessions, reads) are run again after
//!   a restart: closing a handle again is what the mount means, since it reported the handle
//!   open when it resumed its session.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strait_fs_core::Version;
use tonic::metadata::MetadataMap;
use tonic::Status;

pub use strait_proto::{REQUEST_ID_HEADER, RETRY_HEADER};

pub mod sweep;

/// The longest request id accepted (the change record carries it).
pub const REQUEST_ID_LEN_MAX: usize = strait_fs_core::meta::requests::ID_LEN_MAX;
/// How long a result is kept for a retry: as long as its record.
pub const KEEP: Duration = strait_fs_core::meta::requests::KEEP;
/// Results kept at most.
pub const SLOTS_MAX: usize = 65_536;

/// A call's result as kept for its retries: the reply (of the call's own type) and the
/// version it committed.
pub type Outcome = Result<(Arc<dyn Any + Send + Sync>, Option<Version>), Status>;

/// Where one request id's result arrives.
pub struct Slot {
    done: tokio::sync::watch::Sender<Option<Outcome>>,
}

impl Slot {
    fn new() -> Arc<Slot> {
        Arc::new(Slot {
            done: tokio::sync::watch::channel(None).0,
        })
    }

    /// The first call's result (the first to arrive wins).
    pub fn finish(&self, outcome: Outcome) {
        self.done.send_if_modified(|cur| {
            if cur.is_some() {
                return false;
            }
            *cur = Some(outcome);
            true
        });
    }

    /// Wait for the result.
    pub async fn outcome(&self) -> Outcome {
        let mut rx = self.done.subscribe();
        let out = match rx.wait_for(|o| o.is_some()).await {
            Ok(o) => o
                .clone()
                .unwrap_or_else(|| Err(Status::internal("no result"))),
            // the sender lives in `self`, so it cannot be gone
            Err(_) => Err(Status::internal(
                "the first call of this request id vanished",
            )),
        };
        out
    }
}

/// Fills its slot with an error if the task running the first call ends without a result
/// (it panicked): its retries get an answer instead of waiting for ever.
pub struct Finisher(pub Arc<Slot>);

impl Drop for Finisher {
    fn drop(&mut self) {
        self.0.finish(Err(Status::internal(
            "the call stopped before it gave a result",
        )));
    }
}

/// Whether a call is the first with its id.
pub enum Claim {
    /// Run it, and put its result in the slot.
    First(Arc<Slot>),
    /// Another call with this id ran or is running: wait for its result.
    Again(Arc<Slot>),
}

/// The request ids seen in the last [`KEEP`].
#[derive(Default)]
pub struct Requests {
    inner: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    slots: HashMap<String, Arc<Slot>>,
    /// When each id was first seen, oldest first.
    order: VecDeque<(Instant, String)>,
}

impl Requests {
    pub fn claim(&self, id: &str, now: Instant) -> Claim {
        let mut t = self.inner.lock();
        while let Some((at, _)) = t.order.front() {
            let expired = now.saturating_duration_since(*at) > KEEP;
            if !expired && t.order.len() < SLOTS_MAX {
                break;
            }
            if let Some((_, old)) = t.order.pop_front() {
                t.slots.remove(&old);
            }
        }
        if let Some(slot) = t.slots.get(id) {
            return Claim::Again(slot.clone());
        }
        let slot = Slot::new();
        t.slots.insert(id.to_string(), slot.clone());
        t.order.push_back((now, id.to_string()));
        Claim::First(slot)
    }

    /// Ids kept now.
    pub fn len(&self) -> usize {
        self.inner.lock().slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether the client says it sent this call before ([`RETRY_HEADER`]).
pub fn is_retry(md: &MetadataMap) -> bool {
    md.get(RETRY_HEADER).is_some()
}

/// The call's request id, if it has one; a malformed one is refused.
pub fn request_id(md: &MetadataMap) -> Result<Option<String>, Status> {
    let Some(v) = md.get(REQUEST_ID_HEADER) else {
        return Ok(None);
    };
    let id = v
        .to_str()
        .map_err(|_| Status::invalid_argument(format!("{REQUEST_ID_HEADER} is not ASCII")))?;
    if id.is_empty() || id.len() > REQUEST_ID_LEN_MAX {
        return Err(Status::invalid_argument(format!(
            "{REQUEST_ID_HEADER} must have 1 to {REQUEST_ID_LEN_MAX} characters, not {}",
            id.len()
        )));
    }
    Ok(Some(id.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(n: u64) -> Outcome {
        Ok((Arc::new(n), Some(Version(n))))
    }

    fn value(o: Outcome) -> u64 {
        let (v, _) = o.expect("ok");
        *v.downcast_ref::<u64>().expect("u64")
    }

    #[tokio::test]
    async fn a_retry_gets_the_first_result_even_while_it_runs() {
        let r = Requests::default();
        let now = Instant::now();
        let Claim::First(first) = r.claim("a-1", now) else {
            panic!("the first call is first");
        };
        let Claim::Again(again) = r.claim("a-1", now) else {
            panic!("a retry is not first");
        };
        let waiter = tokio::spawn(async move { value(again.outcome().await) });
        first.finish(reply(7));
        // a second result (it cannot happen, but it must not replace the first)
        first.finish(reply(8));
        assert_eq!(waiter.await.expect("join"), 7);
        assert!(matches!(r.claim("a-2", now), Claim::First(_)));
    }

    #[tokio::test]
    async fn a_first_call_that_ends_without_a_result_fails_its_retries() {
        let r = Requests::default();
        let Claim::First(slot) = r.claim("x", Instant::now()) else {
            panic!("first");
        };
        drop(Finisher(slot.clone()));
        let Claim::Again(again) = r.claim("x", Instant::now()) else {
            panic!("again");
        };
        assert_eq!(
            again.outcome().await.err().map(|s| s.code()),
            Some(tonic::Code::Internal)
        );
    }

    #[test]
    fn results_expire_and_are_bounded() {
        let r = Requests::default();
        let t0 = Instant::now();
        assert!(matches!(r.claim("old", t0), Claim::First(_)));
        assert!(matches!(r.claim("old", t0 + KEEP), Claim::Again(_)));
        // past KEEP the id is forgotten: a call with it runs again
        assert!(matches!(
            r.claim("old", t0 + KEEP + Duration::from_secs(1)),
            Claim::First(_)
        ));
        let r = Requests::default();
        for i in 0..SLOTS_MAX + 5 {
            r.claim(&format!("id-{i}"), t0);
        }
        assert_eq!(r.len(), SLOTS_MAX);
        assert!(matches!(r.claim("id-0", t0), Claim::First(_)));
    }

    #[test]
    fn malformed_ids_are_refused() {
        let mut md = MetadataMap::new();
        assert_eq!(request_id(&md).ok(), Some(None));
        md.insert(REQUEST_ID_HEADER, "x".repeat(65).parse().expect("ascii"));
        assert!(request_id(&md).is_err());
        md.insert(REQUEST_ID_HEADER, "abc-1".parse().expect("ascii"));
        assert_eq!(request_id(&md).ok(), Some(Some("abc-1".to_string())));
    }
}
