//! Answers rebuilt from request records: a change retried after its first call committed (at
//! an earlier run of the daemon, or one whose slot the in-memory table forgot) is answered
//! from the record the change committed with (`strait_fs_core::meta::requests`).

use strait_fs_core::meta::requests::Outcome;
use strait_fs_core::meta::Meta;
use strait_proto::meta as w;

use super::{attr_reply, entry_reply};

/// Rebuild a call's reply from its record's outcome, on the session view the retry runs on;
/// `earlier_run` says that the first call ran at an earlier run of the daemon (its in-memory
/// state, such as the handles it opened, is gone). None: the record is of a call of another
/// kind.
pub(super) type Replay<T> = fn(&Outcome, &Meta, bool) -> Option<T>;

/// A call that commits its request record, and how to answer its retries from it.
pub(super) struct Recorded<T> {
    /// The session view the call runs on (without the request: see [`Meta::for_request`]).
    pub(super) view: std::sync::Arc<Meta>,
    pub(super) replay: Replay<T>,
}

/// A reply a record's outcome gives.
pub(super) trait FromOutcome: Sized {
    fn from_outcome(o: &Outcome) -> Option<Self>;
}

impl FromOutcome for w::Empty {
    fn from_outcome(o: &Outcome) -> Option<Self> {
        matches!(o, Outcome::Done).then_some(w::Empty {})
    }
}

impl FromOutcome for w::AttrReply {
    fn from_outcome(o: &Outcome) -> Option<Self> {
        match o {
            Outcome::Attr(a) => Some(attr_reply(a)),
            _ => None,
        }
    }
}

impl FromOutcome for w::EntryReply {
    fn from_outcome(o: &Outcome) -> Option<Self> {
        match o {
            Outcome::Entry(ino, a) => Some(entry_reply((*ino, a.clone()))),
            _ => None,
        }
    }
}

impl FromOutcome for w::CompactChunkReply {
    /// A compaction that committed is done (one that lost its race commits nothing).
    fn from_outcome(o: &Outcome) -> Option<Self> {
        matches!(o, Outcome::Done).then_some(w::CompactChunkReply { done: true })
    }
}

/// The reply of a call that changes nothing but the metadata.
pub(super) fn replay<T: FromOutcome>(o: &Outcome, _view: &Meta, _earlier_run: bool) -> Option<T> {
    T::from_outcome(o)
}

/// The reply of a create, which also opened the file: at an earlier run of the daemon, that
/// handle was counted in a table that is gone, and the mount will close it.
pub(super) fn replay_create(o: &Outcome, view: &Meta, earlier_run: bool) -> Option<w::EntryReply> {
    let reply = w::EntryReply::from_outcome(o)?;
    if earlier_run {
        view.count_handle(reply.ino);
    }
    Some(reply)
}
