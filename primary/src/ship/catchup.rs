//! Catching up a primary whose metadata went back (a power loss that dropped unsynced
//! commits, an engine restored from an older copy) from the replicator, which still holds the
//! versions it lost (docs/changelog.md, "Epochs").
//!
//! # To ensure correctness
//! - The replicator's log must continue this primary's: every record the outbox still holds
//!   (those not trimmed yet, at or below the local version) is compared byte for byte with the
//!   replicator's record of the same version. One that differs is a true divergence: nothing
//!   is applied, and the caller fences the primary.
//! - The missing versions are applied in order, each batch in one transaction that also moves
//!   the version (the replica's apply path, [`changelog::apply_replica`]), so a crash half-way
//!   leaves the engine at a version it really holds, and the next start goes on from there.
//! - The id counters are raised past every inode number and slice id the applied records
//!   name: a counter that went back with the rest would hand them out again.
//! - The caller takes no change while this runs (the write fence says "catching up").
//! - The request records of the applied changes were lost with them (records are not in the
//!   log): the time is noted ([`requests::note_lost`]), so for 5 minutes a change sent again
//!   that finds no record is answered EIO instead of being applied a second time.

use std::time::Duration;

use strait_fs_core::changelog::{self, read_log_raw, ChangeRecord};
use strait_fs_core::clock::now_ns;
use strait_fs_core::kv::DynKv;
use strait_fs_core::meta::{keys, requests};
use strait_fs_core::{SliceId, Version};
use strait_proto::limits::REPLICATOR_MESSAGE_BYTES_MAX;
use strait_proto::replicator as pb;
use strait_proto::replicator::replicator_client::ReplicatorClient;
use strait_replicator_client::Credentials;

/// Longest wait for the next message of the replicator's stream.
const IDLE: Duration = Duration::from_secs(10);
/// Subscriptions started again when the compared part of the log was purged meanwhile.
const RESUBSCRIBE_MAX: usize = 3;

/// What a catch-up did.
#[derive(Debug)]
pub struct CaughtUp {
    /// The local version before, and after.
    pub from: Version,
    pub to: Version,
    /// Records of the outbox found equal to the replicator's.
    pub compared: u64,
}

#[derive(Debug)]
pub enum CatchUpError {
    /// The replicator's log does not continue this primary's, or no longer holds what it
    /// lacks: it must not take changes (an operator decides).
    Diverged(String),
    /// The replicator could not be read, or the engine failed: try again.
    Failed(String),
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, CatchUpError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CatchUpError::Failed(format!("a task failed: {e}")))?
        .map_err(CatchUpError::Failed)
}

/// Bring the engine `kv`, at version `local`, to the replicator's version `target` by
/// applying the records in between, read from the replicator node at `addr` (reached with
/// `creds`).
pub async fn catch_up(
    kv: DynKv,
    addr: &str,
    creds: &Credentials,
    local: Version,
    target: Version,
) -> Result<CaughtUp, CatchUpError> {
    let k = kv.clone();
    let outbox_first = blocking(move || {
        read_log_raw(k.as_ref(), Version::ZERO, 1)
            .map(|b| b.first().map(|(v, _)| *v))
            .map_err(|e| format!("read the outbox: {e}"))
    })
    .await?;
    // compare from the outbox's first record at or below `local`
    let mut after = match outbox_first {
        Some(f) if f <= local => Version(f.0.saturating_sub(1)),
        _ => local,
    };
    let channel = strait_replicator_client::channel(addr, creds)
        .map_err(|e| CatchUpError::Failed(format!("replicator address {addr}: {e}")))?;
    let mut client =
        ReplicatorClient::new(channel).max_decoding_message_size(REPLICATOR_MESSAGE_BYTES_MAX);
    let mut at = local;
    let mut compared = 0u64;
    let (mut top_ino, mut top_slice) = (0u64, SliceId::HOLE);
    let mut resubscribed = 0;
    'subscribe: loop {
        let mut stream = client
            .subscribe(pb::SubscribeRequest {
                after_version: after.0,
            })
            .await
            .map_err(|s| CatchUpError::Failed(format!("subscribe at {addr}: {}", s.message())))?
            .into_inner();
        while at < target {
            let msg = match tokio::time::timeout(IDLE, stream.message()).await {
                Err(_) => {
                    return Err(CatchUpError::Failed(format!(
                        "nothing from {addr} for {IDLE:?} at version {at} of {target}"
                    )))
                }
                Ok(Err(s)) => {
                    return Err(CatchUpError::Failed(format!(
                        "the subscription at {addr}: {}",
                        s.message()
                    )))
                }
                Ok(Ok(None)) => {
                    return Err(CatchUpError::Failed(format!(
                        "{addr} ended the subscription at version {at} of {target}"
                    )))
                }
                Ok(Ok(Some(m))) => m,
            };
            match msg.kind {
                Some(pb::subscribe_reply::Kind::Records(r)) => {
                    let first = Version(r.first_version);
                    // the part this primary holds: compared with its outbox
                    let theirs: Vec<(Version, Vec<u8>)> = r
                        .records
                        .iter()
                        .enumerate()
                        .map(|(i, raw)| (Version(first.0 + i as u64), raw))
                        .filter(|(v, _)| *v > after && *v <= local)
                        .map(|(v, raw)| (v, raw.clone()))
                        .collect();
                    if let Some(&(lo, _)) = theirs.first() {
                        let k = kv.clone();
                        let n = theirs.len();
                        let mine = blocking(move || {
                            read_log_raw(k.as_ref(), Version(lo.0 - 1), n)
                                .map_err(|e| format!("read the outbox: {e}"))
                        })
                        .await?;
                        for (v, raw) in &theirs {
                            // a record the outbox no longer holds was trimmed: the replicator
                            // committed it from this primary
                            if let Some((_, m)) = mine.iter().find(|(mv, _)| mv == v) {
                                if m != raw {
                                    return Err(CatchUpError::Diverged(format!(
                                        "version {v} in this primary's outbox differs from the \
                                         replicator's: the two histories diverged"
                                    )));
                                }
                                compared += 1;
                            }
                            after = *v;
                        }
                    }
                    // the part it lacks: applied
                    let mut records = vec![];
                    let mut apply_first = None;
                    for (i, raw) in r.records.iter().enumerate() {
                        let v = Version(first.0 + i as u64);
                        if v <= at {
                            continue;
                        }
                        if v != at.next() {
                            return Err(CatchUpError::Failed(format!(
                                "the subscription skipped from version {at} to {v}"
                            )));
                        }
                        let rec = ChangeRecord::decode(raw).map_err(|e| {
                            CatchUpError::Diverged(format!(
                                "version {v} from the replicator does not decode: {e}"
                            ))
                        })?;
                        let (ino, slice) = rec.highest_ids();
                        top_ino = top_ino.max(ino);
                        top_slice = top_slice.max(slice);
                        apply_first.get_or_insert(v);
                        records.push(rec);
                        at = v;
                        if at == target {
                            break;
                        }
                    }
                    if let Some(first) = apply_first {
                        let k = kv.clone();
                        blocking(move || {
                            changelog::apply_replica(k.as_ref(), first, &records)
                                .map_err(|e| format!("apply the versions it lacks: {e}"))
                        })
                        .await?;
                    }
                }
                Some(pb::subscribe_reply::Kind::TruncatedEarliest(e)) => {
                    let earliest = Version(e);
                    if earliest > local.next() {
                        return Err(CatchUpError::Diverged(format!(
                            "the replicator no longer holds versions {} to {} (its log starts \
                             at {earliest}): this primary cannot catch up by itself",
                            local.next(),
                            Version(earliest.0 - 1)
                        )));
                    }
                    // only the part to compare was purged (it was committed, so trimmed here
                    // too, or about to be): go on from there
                    resubscribed += 1;
                    if resubscribed > RESUBSCRIBE_MAX {
                        return Err(CatchUpError::Failed(
                            "the replicator kept purging the part of the log to compare".into(),
                        ));
                    }
                    after = Version(e - 1).max(after);
                    continue 'subscribe;
                }
                Some(pb::subscribe_reply::Kind::Heartbeat(_)) => {}
                None => {
                    return Err(CatchUpError::Failed(
                        "an empty message from the replicator".into(),
                    ))
                }
            }
        }
        break;
    }
    raise_counters(&kv, top_ino, top_slice).await?;
    if at > local {
        let k = kv.clone();
        blocking(move || {
            requests::note_lost(k.as_ref(), now_ns())
                .map_err(|e| format!("note the request records lost: {e}"))
        })
        .await?;
    }
    Ok(CaughtUp {
        from: local,
        to: at,
        compared,
    })
}

/// Raise the inode and slice counters to at least `ino` and `slice`.
async fn raise_counters(kv: &DynKv, ino: u64, slice: SliceId) -> Result<(), CatchUpError> {
    let kv = kv.clone();
    blocking(move || {
        for (name, top) in [(keys::NEXT_INODE, ino), (keys::NEXT_SLICE, slice.0)] {
            let key = keys::counter(name);
            let cur = kv.incr(&key, 0).map_err(|e| format!("read {name}: {e}"))?;
            let top = i64::try_from(top).map_err(|_| format!("{name}: {top} is out of range"))?;
            if top > cur {
                kv.incr(&key, top - cur)
                    .map_err(|e| format!("raise {name}: {e}"))?;
            }
        }
        Ok(())
    })
    .await
}
