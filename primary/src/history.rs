//! This primary's history against the replicator's log: where they part (used by the
//! shipper before it resumes, and by `strait primary set-aside`), and what setting a diverged
//! history aside needs (docs/operations.md, "A primary whose history diverged").
//!
//! A primary diverged when it committed changes the replicator never had under versions the
//! replicator holds with other contents (an older copy of its metadata that took changes), or
//! when it lacks versions the replicator no longer holds. It then takes no change (EROFS)
//! until an operator decides. `strait primary set-aside` writes the local records from where
//! the histories part to a readable file, loads the metadata from a mirror (whose history is
//! the replicator's) into a new engine and swaps it in, keeping the old one; the primary
//! started again catches up from the log.
//!
//! # To ensure correctness
//! - Every version both hold is compared byte for byte (the outbox's records that are not
//!   trimmed yet; a trimmed record was shipped from here, so it is the replicator's).
//! - The comparison is made with the replicator's leader (a follower's log may lag).
//! - Nothing is set aside unless the histories really diverged.
//! - The id counters of the new engine are raised past the old engine's and past every id the
//!   records set aside name: their inode numbers and slice ids (whose blocks may be in the
//!   store) are never handed out again.

use std::time::Duration;

use strait_fs_core::changelog::{read_log_raw, ChangeRecord};
use strait_fs_core::kv::DynKv;
use strait_fs_core::meta::keys;
use strait_fs_core::{SliceId, Version};
use strait_proto::limits::REPLICATOR_MESSAGE_BYTES_MAX;
use strait_proto::replicator as pb;
use strait_proto::replicator::replicator_client::ReplicatorClient;
use strait_replicator_client::Credentials;

/// Longest wait for an answer or the next message of the replicator's stream.
const IDLE: Duration = Duration::from_secs(10);
/// Outbox records read at once.
const PAGE: usize = 1000;

/// The replicator's leader as the comparison saw it.
#[derive(Debug, Clone)]
pub struct Leader {
    pub addr: String,
    /// The first version its log still holds, and the last.
    pub earliest: Version,
    pub last: Version,
    /// The last version it purged and the digest of its record
    /// ([`strait_replicator_client::record_digest`]).
    pub purged_last: Option<(Version, Vec<u8>)>,
}

impl Leader {
    /// From the leader's status, answered at `addr`.
    pub fn from_status(addr: String, s: &pb::StatusReply) -> Leader {
        Leader {
            addr,
            earliest: Version(s.earliest_version),
            last: Version(s.last_version),
            purged_last: (s.purged_last_version > 0)
                .then(|| (Version(s.purged_last_version), s.purged_last_digest.clone())),
        }
    }
}

/// Where this primary's history and the replicator's part.
#[derive(Debug, PartialEq, Eq)]
pub enum Divergence {
    /// They agree wherever both hold a version (`compared` records of the outbox were found
    /// equal): nothing to set aside.
    None { compared: u64 },
    /// This primary's record of version `seen` differs from the replicator's: it and every
    /// later local record are on another history, and so may be those from `first` on (the
    /// outbox's records the replicator no longer holds to compare, when no record before
    /// `seen` was found equal; else `first == seen`).
    Differs { first: Version, seen: Version },
    /// The replicator no longer holds the versions this primary lacks (its log starts at
    /// `earliest`, after the local version + 1): it cannot catch up by itself.
    Purged { earliest: Version },
}

/// The leader among the nodes at `addrs`, as its own status describes it.
pub async fn leader(addrs: &[String], creds: &Credentials) -> Result<Leader, String> {
    let client = strait_replicator_client::LogClient::new(addrs, creds)
        .map_err(|s| s.message().to_string())?
        .with_attempts(2);
    let st = client
        .leader_status()
        .await
        .map_err(|s| s.message().to_string())?;
    Ok(Leader::from_status(client.current_addr(), &st))
}

fn outbox(kv: &DynKv, after: Version, n: usize) -> Result<Vec<(Version, Vec<u8>)>, String> {
    read_log_raw(kv.as_ref(), after, n).map_err(|e| format!("read the outbox: {e}"))
}

/// Compare the outbox of the engine `kv`, at version `local`, with the log of the leader
/// (reached with `creds`): every version both hold, byte for byte.
pub async fn compare(
    kv: &DynKv,
    local: Version,
    leader: &Leader,
    creds: &Credentials,
) -> Result<Divergence, String> {
    let outbox_first = {
        let k = kv.clone();
        tokio::task::spawn_blocking(move || outbox(&k, Version::ZERO, 1))
            .await
            .map_err(|e| format!("a task failed: {e}"))??
            .first()
            .map(|(v, _)| *v)
    };
    // the versions both may hold: from the outbox's first (or the log's earliest) to the
    // lower of the two ends
    let lo = outbox_first.unwrap_or(local.next()).max(leader.earliest);
    let hi = local.min(leader.last);
    let mut compared = 0u64;
    // the last version the log purged, by its record's digest, when the outbox holds it: the
    // one comparison left when everything both hold was purged
    if let (Some((pv, digest)), Some(f)) = (&leader.purged_last, outbox_first) {
        let pv = *pv;
        if pv >= f && pv <= local {
            let k = kv.clone();
            let mine = tokio::task::spawn_blocking(move || outbox(&k, Version(pv.0 - 1), 1))
                .await
                .map_err(|e| format!("a task failed: {e}"))??;
            if let Some((_, m)) = mine.first().filter(|(v, _)| *v == pv) {
                if strait_replicator_client::record_digest(m) != *digest {
                    return Ok(Divergence::Differs { first: f, seen: pv });
                }
                compared += 1;
            }
        }
    }
    if lo > hi {
        if leader.last > local && leader.earliest > local.next() {
            return Ok(Divergence::Purged {
                earliest: leader.earliest,
            });
        }
        return Ok(Divergence::None { compared });
    }
    let channel = strait_replicator_client::channel(&leader.addr, creds)
        .map_err(|e| format!("replicator address {}: {e}", leader.addr))?;
    let mut client =
        ReplicatorClient::new(channel).max_decoding_message_size(REPLICATOR_MESSAGE_BYTES_MAX);
    let mut stream = client
        .subscribe(pb::SubscribeRequest {
            after_version: lo.0 - 1,
        })
        .await
        .map_err(|s| format!("subscribe at {}: {}", leader.addr, s.message()))?
        .into_inner();
    let mut at = Version(lo.0 - 1);
    while at < hi {
        let msg = match tokio::time::timeout(IDLE, stream.message()).await {
            Err(_) => return Err(format!("nothing from {} for {IDLE:?}", leader.addr)),
            Ok(Err(s)) => return Err(format!("the subscription: {}", s.message())),
            Ok(Ok(None)) => return Err(format!("the subscription ended at version {at}")),
            Ok(Ok(Some(m))) => m,
        };
        match msg.kind {
            Some(pb::subscribe_reply::Kind::Records(r)) => {
                let first = Version(r.first_version);
                let theirs: Vec<(Version, Vec<u8>)> = r
                    .records
                    .into_iter()
                    .enumerate()
                    .map(|(i, raw)| (Version(first.0 + i as u64), raw))
                    .filter(|(v, _)| *v > at && *v <= hi)
                    .collect();
                let Some(&(from, _)) = theirs.first() else {
                    continue;
                };
                let k = kv.clone();
                let n = theirs.len();
                let mine = tokio::task::spawn_blocking(move || outbox(&k, Version(from.0 - 1), n))
                    .await
                    .map_err(|e| format!("a task failed: {e}"))??;
                for (v, raw) in &theirs {
                    // a version the outbox no longer holds was trimmed: shipped from here
                    if let Some((_, m)) = mine.iter().find(|(mv, _)| mv == v) {
                        if m != raw {
                            // a record found equal shows the histories agree up to it;
                            // without one, the outbox's records below the log's start are
                            // as suspect as this one
                            let first = match (compared, outbox_first) {
                                (0, Some(f)) => f.min(*v),
                                _ => *v,
                            };
                            return Ok(Divergence::Differs { first, seen: *v });
                        }
                        compared += 1;
                    }
                    at = *v;
                }
            }
            Some(pb::subscribe_reply::Kind::TruncatedEarliest(e)) => {
                return Err(format!(
                    "the replicator purged its log up to version {} during the comparison",
                    e.saturating_sub(1)
                ))
            }
            Some(pb::subscribe_reply::Kind::Heartbeat(_)) => {}
            None => return Err("an empty message from the replicator".into()),
        }
    }
    if leader.last > local && leader.earliest > local.next() {
        return Ok(Divergence::Purged {
            earliest: leader.earliest,
        });
    }
    Ok(Divergence::None { compared })
}

/// The outbox's records from `first` on, decoded (a record that does not decode is an
/// error: the file must list every change set aside).
pub fn records_from(kv: &DynKv, first: Version) -> Result<Vec<(Version, ChangeRecord)>, String> {
    let mut out = vec![];
    let mut after = Version(first.0.saturating_sub(1));
    loop {
        let page = outbox(kv, after, PAGE)?;
        for (v, raw) in &page {
            let rec = ChangeRecord::decode(raw)
                .map_err(|e| format!("version {v} of the outbox does not decode: {e}"))?;
            out.push((*v, rec));
            after = *v;
        }
        if page.len() < PAGE {
            return Ok(out);
        }
    }
}

/// The values of the id counters of `kv` (next inode, next slice).
pub fn counters(kv: &DynKv) -> Result<(i64, i64), String> {
    let read = |name: &str| {
        kv.incr(&keys::counter(name), 0)
            .map_err(|e| format!("read {name}: {e}"))
    };
    Ok((read(keys::NEXT_INODE)?, read(keys::NEXT_SLICE)?))
}

/// Raise the id counters of `kv` to at least `floor` and past every id `records` name. (The
/// request records of the history that went on came with the snapshot `kv` was loaded from,
/// so a change sent again is answered from its record there; one set aside has none, and
/// runs, once, in the history that goes on.)
pub fn keep_ids_unused(
    kv: &DynKv,
    floor: (i64, i64),
    records: &[(Version, ChangeRecord)],
) -> Result<(), String> {
    let (mut ino, mut slice) = (0u64, SliceId::HOLE);
    for (_, r) in records {
        let (i, s) = r.highest_ids();
        ino = ino.max(i);
        slice = slice.max(s);
    }
    let top =
        |n: u64, name: &str| i64::try_from(n).map_err(|_| format!("{name}: {n} is out of range"));
    let wanted = [
        (keys::NEXT_INODE, floor.0.max(top(ino, keys::NEXT_INODE)?)),
        (
            keys::NEXT_SLICE,
            floor.1.max(top(slice.0, keys::NEXT_SLICE)?),
        ),
    ];
    for (name, want) in wanted {
        let key = keys::counter(name);
        let cur = kv.incr(&key, 0).map_err(|e| format!("read {name}: {e}"))?;
        if want > cur {
            kv.incr(&key, want - cur)
                .map_err(|e| format!("raise {name}: {e}"))?;
        }
    }
    Ok(())
}
