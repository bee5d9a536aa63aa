//! The replica path: records applied at a mirror (or replayed into another engine), in
//! batches that move the replica's version with them.

use super::record::ChangeRecord;
use super::state::apply;
use crate::error::{Error, Result};
use crate::kv::KvTxn;
use crate::meta::keys;
use crate::{SliceId, Version};

/// Replay records into another engine (used by tests and `strait load --changelog`).
pub fn replay(kv: &dyn crate::kv::KvEngine, records: &[(Version, ChangeRecord)]) -> Result<()> {
    for (version, rec) in records {
        let got = kv.txn(&mut |t| {
            apply(t, rec)?;
            t.append_log(rec.encode()?);
            Ok(())
        })?;
        if got != Some(*version) {
            return Err(Error::corrupt(format!(
                "replayed version {version} landed as {got:?}"
            )));
        }
    }
    Ok(())
}

/// Raise the replica's id counters, in its transaction `t`, to at least every inode number
/// and slice id `records` name: a replica promoted to primary then never hands out an id the
/// log already used (the counters came with its snapshot and do not move with the records).
fn raise_id_counters(t: &mut dyn KvTxn, records: &[ChangeRecord]) -> Result<()> {
    let (mut ino, mut slice) = (0u64, SliceId::HOLE);
    for r in records {
        let (i, s) = r.highest_ids();
        ino = ino.max(i);
        slice = slice.max(s);
    }
    for (name, top) in [(keys::NEXT_INODE, ino), (keys::NEXT_SLICE, slice.0)] {
        if top == 0 {
            continue;
        }
        let top = i64::try_from(top)
            .map_err(|_| Error::corrupt(format!("{name}: {top} is out of range")))?;
        let key = keys::counter(name);
        let cur = crate::kv::decode_counter(t.get(&key)?)?;
        if top > cur {
            t.add(&key, top - cur);
        }
    }
    Ok(())
}

/// Why a replica could not apply a batch of records.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// The batch does not start right after the replica's version: applying it would skip
    /// or repeat records.
    #[error("version gap: the replica is at version {at}, the batch starts at {first}")]
    Gap { at: Version, first: Version },
    /// Record `version` is invalid against the replica's state (or the store failed).
    #[error("record {version}: {source}")]
    Record {
        version: Version,
        #[source]
        source: Error,
    },
}

/// Apply records `first_version, first_version + 1, ...` at a replica, in one transaction
/// that also moves the replica's version (the same counter [`crate::kv::KvEngine::last_version`]
/// reads) to the last of them. A crash leaves the replica at the version before or after the
/// whole batch, never in between; nothing is applied twice because the transaction checks
/// that the replica is at `first_version - 1`.
///
/// On an invalid record the whole batch is rolled back and the error names the batch's first
/// version: apply the records one by one to find the one at fault.
pub fn apply_replica(
    kv: &dyn crate::kv::KvEngine,
    first_version: Version,
    records: &[ChangeRecord],
) -> std::result::Result<Version, ReplicaError> {
    apply_replica_with(kv, first_version, records, &|_, _, _| Ok(()))
}

/// What a replica does beside each record, in the same transaction, before the record is
/// applied (it sees the state before): a mirror queues the blocks the record brings.
pub type ReplicaHook<'a> =
    &'a (dyn Fn(&mut dyn KvTxn, Version, &ChangeRecord) -> Result<()> + Sync);

/// [`apply_replica`] with `hook` called for each record (with its version) inside the
/// transaction: what the hook writes commits or rolls back with the records.
pub fn apply_replica_with(
    kv: &dyn crate::kv::KvEngine,
    first_version: Version,
    records: &[ChangeRecord],
    hook: ReplicaHook<'_>,
) -> std::result::Result<Version, ReplicaError> {
    let n = records.len() as u64;
    if n == 0 {
        return Ok(Version(first_version.0.saturating_sub(1)));
    }
    let mut gap = None;
    let r = kv.txn(&mut |t| {
        gap = None;
        let at = crate::snapshot::version_in(t)?;
        if at.next() != first_version {
            gap = Some(at);
            return Err(Error::Invalid("version gap".into()));
        }
        for (i, rec) in records.iter().enumerate() {
            let version = first_version + i as u64;
            hook(t, version, rec)?;
            apply(t, rec)?;
            if let Some(id) = &rec.request {
                let outcome = crate::meta::requests::Outcome::of(&rec.change);
                crate::meta::requests::put_record(t, id, rec.ts_ns, &outcome, Some(version))?;
            }
        }
        raise_id_counters(t, records)?;
        t.add(crate::kv::LAST_VERSION_KEY, n as i64);
        Ok(())
    });
    match (r, gap) {
        (Ok(_), _) => Ok(first_version + (n - 1)),
        (Err(_), Some(at)) => Err(ReplicaError::Gap {
            at,
            first: first_version,
        }),
        (Err(e), None) => Err(ReplicaError::Record {
            version: first_version,
            source: e,
        }),
    }
}
