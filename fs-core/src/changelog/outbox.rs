//! The outbox: a primary commits a record (applies it and appends it to the log in one
//! transaction), the shipper reads the log, and what the replicator holds is trimmed.

use super::record::{Change, ChangeRecord};
use super::state::apply_with;
use crate::error::{Error, Result};
use crate::kv::{KvTxn, LOG_GROUP};
use crate::meta::keys;
use crate::Version;

/// Commit `change` at the primary: apply it and append it to the log in the caller's transaction.
pub fn commit(t: &mut dyn KvTxn, change: Change, ts_ns: i64) -> Result<()> {
    commit_record(
        t,
        &ChangeRecord {
            ts_ns,
            change,
            request: None,
        },
    )
}

/// [`commit`] of a whole record (one that names its request id, too). The directory quotas
/// are enforced: the primary decides here what every replica applies.
pub fn commit_record(t: &mut dyn KvTxn, rec: &ChangeRecord) -> Result<()> {
    apply_with(t, rec, true)?;
    t.append_log(rec.encode()?);
    Ok(())
}

/// The version in a change record's key ([`crate::kv::log_key`]).
fn log_version(key: &[u8]) -> Result<Version> {
    keys::u64_at(key, 9)
        .map(Version)
        .ok_or_else(|| Error::corrupt("log key"))
}

/// Read change records with versions in `(after, after + limit]`.
pub fn read_log(
    kv: &dyn crate::kv::KvEngine,
    after: Version,
    limit: usize,
) -> Result<Vec<(Version, ChangeRecord)>> {
    read_log_raw(kv, after, limit)?
        .into_iter()
        .map(|(v, b)| Ok((v, ChangeRecord::decode(&b)?)))
        .collect()
}

/// Read the encoded change records with versions in `(after, after + limit]`, as the shipper
/// sends them.
pub fn read_log_raw(
    kv: &dyn crate::kv::KvEngine,
    after: Version,
    limit: usize,
) -> Result<Vec<(Version, Vec<u8>)>> {
    crate::kv::read(kv, |t| {
        let start = crate::kv::log_key(after);
        let page = t.scan(
            &LOG_GROUP,
            if after == Version::ZERO {
                None
            } else {
                Some(&start)
            },
            limit,
        )?;
        page.into_iter()
            .map(|(k, v)| {
                let version = log_version(&k)?;
                Ok((version, v))
            })
            .collect()
    })
}

/// Delete at most `limit` of the change records with versions in `(after, upto]` (records the
/// replicator has committed), oldest first. `after` is where the last trim stopped, so the
/// scan does not walk over its deletions. Returns how many were deleted; fewer than `limit`
/// means none is left in the range.
pub fn trim_log(
    kv: &dyn crate::kv::KvEngine,
    after: Version,
    upto: Version,
    limit: usize,
) -> Result<usize> {
    let start = crate::kv::log_key(after);
    let (n, _) = crate::kv::txn(kv, |t| {
        let page = t.scan(
            &LOG_GROUP,
            if after == Version::ZERO {
                None
            } else {
                Some(&start)
            },
            limit,
        )?;
        let mut n = 0;
        for (k, _) in page {
            let version = log_version(&k)?;
            if version > upto {
                break;
            }
            t.delete(&k);
            n += 1;
        }
        Ok(n)
    })?;
    Ok(n)
}
