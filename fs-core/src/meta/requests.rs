//! Request records: what a change made under a request id leaves behind for its retries.
//!
//! A mount names each change it sends to its site daemon with a request id, and sends the
//! same id when it sends the call again after the connection broke. The daemon keeps the
//! first result in memory, and that table is gone when the daemon restarts. So each change
//! made under a request id ([`super::Meta::for_request`]) also writes, in the KV transaction
//! of the change itself, a record keyed by the id: the version the change committed as, when,
//! and its first result ([`Outcome`]). A retry at a daemon of any run then finds the record
//! (the change committed: answer with the record) or does not (the change did not commit,
//! since the record commits with it: run the call).
//!
//! The change record carries the request id ([`crate::changelog::ChangeRecord::request`]),
//! and every engine that applies the log from the replicator (a mirror, a primary catching
//! up) writes the same request record with the change. So a mirror promoted to primary
//! answers a change that the old primary committed, and whose answer was lost on the way
//! (the connection broke as the primary handed over), from its record instead of running it
//! a second time. Snapshots and digests, which walk the file system tree, never see records:
//! an engine loaded from a snapshot has none for the changes before it.
//!
//! # To ensure correctness
//! - The record is written in the transaction that appends the change record
//!   ([`crate::kv::KvTxn::put_versioned`] gives it the change's version), so it exists exactly
//!   when the change committed. A call that commits no change (it failed, or changed nothing)
//!   writes none, and running it again is what its retry should do.
//! - A record is kept at least [`KEEP`], which is longer than a mount keeps retrying (its
//!   reconnect timeout, 60 s by default). Beyond [`RECORDS_MAX`] records the oldest are removed
//!   earlier, and the commit time of the newest one so removed is kept ([`note_lost`] keeps the
//!   same time for records lost with metadata a primary took back from the replicator): a
//!   retry (the client says it sent the call before) that finds no record while that time is
//!   within [`KEEP`] cannot tell "never committed" from "record gone", and is answered
//!   [`Lookup::Unknown`] rather than run perhaps a second time. A first attempt finds no record
//!   and runs.
//! - Ages are measured by the daemon's wall clock, as change records' timestamps are: a clock
//!   stepped forward by more than [`KEEP`] expires records early.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::types::{Attr, Ino};
use crate::changelog::record::{decode, encode, Change};
use crate::error::Result;
use crate::kv::{self, decode_counter, KvEngine, KvTxn};
use crate::meta::keys;
use crate::Version;

/// How long a request record is kept.
pub const KEEP: Duration = Duration::from_secs(300);
/// The longest request id.
pub const ID_LEN_MAX: usize = crate::changelog::record::REQUEST_ID_LEN_MAX;
/// Most request records kept; past that the oldest are removed first.
pub const RECORDS_MAX: u64 = 1 << 20;
/// Most records one sweep transaction reads and removes.
pub const SWEEP_BATCH_MAX: usize = 1024;

/// The first result of a change, read off its change record: what a retry is answered with.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Nothing to answer but success (unlink, rmdir, rename, xattrs, a compaction).
    Done,
    /// The inode's attributes after the change (setattr, truncate, link, a written slice).
    Attr(Attr),
    /// The new entry's inode and attributes (mknod, mkdir, create, symlink).
    Entry(Ino, Attr),
}

impl Outcome {
    /// What a call that committed `change` answered: every call that carries a request id
    /// answers exactly these values (the engine returns the attributes it put in the record).
    pub fn of(change: &Change) -> Outcome {
        match change {
            Change::Create { ino, attr, .. } => Outcome::Entry(*ino, attr.clone()),
            Change::SetAttr { attr, .. }
            | Change::Truncate { attr, .. }
            | Change::Link { attr, .. }
            | Change::WriteSlice { attr, .. } => Outcome::Attr(attr.clone()),
            _ => Outcome::Done,
        }
    }
}

/// A request's record as read back.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestRecord {
    /// The version the change committed as.
    pub version: Version,
    /// The daemon's clock when the change committed (ns since the epoch, as in the change
    /// record).
    pub ts_ns: i64,
    pub outcome: Outcome,
}

impl RequestRecord {
    /// What the transaction writes: the version is appended at commit.
    pub(crate) fn encode_unversioned(ts_ns: i64, outcome: &Outcome) -> Result<Vec<u8>> {
        encode(&(ts_ns, outcome))
    }

    pub(crate) fn decode(stored: &[u8]) -> Result<RequestRecord> {
        let (value, version) = crate::kv::split_versioned(stored)?;
        let (ts_ns, outcome): (i64, Outcome) = decode(value)?;
        Ok(RequestRecord {
            version,
            ts_ns,
            outcome,
        })
    }
}

/// What a lookup of a request id found.
#[derive(Clone, Debug, PartialEq)]
pub enum Lookup {
    /// A change under this id committed: its record.
    Committed(RequestRecord),
    /// No change under this id committed (or, for a first attempt, the call is new).
    NotCommitted,
    /// A retry with no record, while records young enough to be its own may be gone (see
    /// [`note_lost`]): whether its change committed is not known.
    Unknown,
}

impl Lookup {
    /// Judge a lookup: the record found, if any, and for a retry without one, the commit
    /// time of the newest change whose record may be gone (see [`note_lost`]).
    pub fn judge(found: Option<RequestRecord>, lost_ns: Option<i64>, now_ns: i64) -> Lookup {
        if let Some(r) = found {
            return Lookup::Committed(r);
        }
        let horizon = now_ns.saturating_sub(KEEP.as_nanos() as i64);
        match lost_ns {
            Some(e) if e >= horizon => Lookup::Unknown,
            _ => Lookup::NotCommitted,
        }
    }
}

/// How many changes of the history in `kv` were committed under a request id another change
/// had committed under already ([`keys::REQUESTS_TWICE`]): 0 unless a change was applied twice.
pub fn applied_twice(kv: &dyn KvEngine) -> Result<i64> {
    kv::read(kv, |t| {
        decode_counter(t.get(&keys::requests_state(keys::REQUESTS_TWICE))?)
    })
}

/// Note that the request records of changes committed up to `at_ns` may be gone while the
/// changes are not: a primary whose metadata went back applied versions from the replicator
/// again (records are not in the log). For [`KEEP`] after `at_ns`, a retry that finds no
/// record is [`Lookup::Unknown`] rather than run perhaps a second time.
pub fn note_lost(kv: &dyn KvEngine, at_ns: i64) -> Result<()> {
    kv::txn(kv, |t| raise_lost(t, at_ns)).map(|_| ())
}

/// Write, in `t`, the record of a change committed under request `id` at `ts_ns` with
/// `outcome`: at the primary (`version` None) the version is the one `t`'s change record
/// gets at commit; a replica applying the log (each version once) names it.
pub(crate) fn put_record(
    t: &mut dyn KvTxn,
    id: &[u8],
    ts_ns: i64,
    outcome: &Outcome,
    version: Option<Version>,
) -> Result<()> {
    let key = keys::request(id);
    // a record of this id already: the history holds a second change under it, which a
    // retry answered from its record never makes (counted: the chaos harness's checker 10)
    if let Some(old) = t.get(&key)? {
        let first = RequestRecord::decode(&old).map(|r| r.version).ok();
        if version.is_none() || first != version {
            t.add(&keys::requests_state(keys::REQUESTS_TWICE), 1);
            tracing::error!(
                "a change under request {} committed again (first as version {}): applied twice",
                String::from_utf8_lossy(id),
                first.map(|v| v.to_string()).unwrap_or_else(|| "?".into())
            );
        }
    }
    let mut value = RequestRecord::encode_unversioned(ts_ns, outcome)?;
    match version {
        None => t.put_versioned(&key, &value),
        Some(v) => {
            value.extend_from_slice(&v.0.to_be_bytes());
            t.put(&key, &value);
        }
    }
    t.put(&keys::request_by_age(age_key(ts_ns), id), &[]);
    t.add(&keys::requests_state(keys::REQUEST_COUNT), 1);
    Ok(())
}

/// The age key's time: a clock before 1970 counts as 0.
pub(crate) fn age_key(ts_ns: i64) -> u64 {
    u64::try_from(ts_ns).unwrap_or(0)
}

/// Move the time [`note_lost`] keeps to `at_ns`, if that is later.
pub(crate) fn raise_lost(t: &mut dyn KvTxn, at_ns: i64) -> Result<()> {
    let key = keys::requests_state(keys::REQUESTS_LOST);
    let before = match t.get(&key)? {
        Some(b) => decode_counter(Some(b))?,
        None => i64::MIN,
    };
    if at_ns > before {
        t.put(&key, &at_ns.to_le_bytes());
    }
    Ok(())
}

/// What one sweep batch removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Records older than the horizon.
    pub expired: usize,
    /// Records removed before their time, the table being over its bound.
    pub evicted: usize,
    /// Records left, as counted.
    pub left: u64,
}

impl Swept {
    pub fn removed(&self) -> usize {
        self.expired + self.evicted
    }
}

/// Of a page of records in age order (their commit times), how many to remove: first those
/// committed before `before_ns` (expired), then the oldest others while the table still holds
/// more than `max` of `count` records (evicted).
pub fn plan_sweep(ages_ns: &[i64], before_ns: i64, count: u64, max: u64) -> (usize, usize) {
    let expired = ages_ns.iter().take_while(|&&t| t < before_ns).count();
    let over = count.saturating_sub(expired as u64).saturating_sub(max);
    let evicted = (ages_ns.len() - expired).min(usize::try_from(over).unwrap_or(usize::MAX));
    (expired, evicted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::types::FileKind;

    fn attr() -> Attr {
        Attr {
            kind: FileKind::File,
            perm: 0o644,
            uid: 1,
            gid: 2,
            nlink: 1,
            length: 10,
            rdev: 0,
            atime_ns: 3,
            mtime_ns: 4,
            ctime_ns: 5,
            parent: 0,
        }
    }

    #[test]
    fn a_record_reads_back_with_the_version_appended_at_commit() {
        let outcome = Outcome::Entry(42, attr());
        let mut stored = RequestRecord::encode_unversioned(7, &outcome).expect("encode");
        stored.extend_from_slice(&Version(9).to_be_bytes());
        assert_eq!(
            RequestRecord::decode(&stored).expect("decode"),
            RequestRecord {
                version: Version(9),
                ts_ns: 7,
                outcome
            }
        );
        assert!(RequestRecord::decode(&[1, 2]).is_err(), "too short");
    }

    #[test]
    fn the_outcome_is_read_off_the_change() {
        let a = attr();
        let create = Change::Create {
            parent: 1,
            name: b"x"[..].into(),
            ino: 5,
            attr: a.clone(),
            parent_attr: a.clone(),
            target: None,
        };
        assert_eq!(Outcome::of(&create), Outcome::Entry(5, a.clone()));
        let set = Change::SetAttr {
            ino: 5,
            attr: a.clone(),
        };
        assert_eq!(Outcome::of(&set), Outcome::Attr(a));
        assert_eq!(Outcome::of(&Change::DeleteInode { ino: 5 }), Outcome::Done);
    }

    #[test]
    fn a_missing_record_is_unknown_only_while_an_early_removal_is_recent() {
        let keep = KEEP.as_nanos() as i64;
        let now = 10 * keep;
        let r = RequestRecord {
            version: Version(3),
            ts_ns: 1,
            outcome: Outcome::Done,
        };
        assert_eq!(
            Lookup::judge(Some(r.clone()), Some(now), now),
            Lookup::Committed(r)
        );
        assert_eq!(Lookup::judge(None, None, now), Lookup::NotCommitted);
        assert_eq!(Lookup::judge(None, Some(now - 1), now), Lookup::Unknown);
        assert_eq!(Lookup::judge(None, Some(now - keep), now), Lookup::Unknown);
        assert_eq!(
            Lookup::judge(None, Some(now - keep - 1), now),
            Lookup::NotCommitted
        );
    }

    #[test]
    fn a_sweep_removes_the_expired_then_the_oldest_over_the_bound() {
        let ages = [1, 2, 3, 10, 11, 12];
        // nothing over the bound: only what is older than 5
        assert_eq!(plan_sweep(&ages, 5, 100, 1000), (3, 0));
        // 1,003 records, at most 998: the 3 expired and the 2 oldest of the rest
        assert_eq!(plan_sweep(&ages, 5, 1003, 998), (3, 2));
        // far over the bound: the whole page
        assert_eq!(plan_sweep(&ages, 5, 10_000, 10), (3, 3));
        // nothing expired, not over: nothing
        assert_eq!(plan_sweep(&ages, 0, 6, 6), (0, 0));
        assert_eq!(plan_sweep(&[], 5, 10, 1), (0, 0));
    }
}
