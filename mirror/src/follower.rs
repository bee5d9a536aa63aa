//! The follower: bootstraps the mirror's metadata from the primary's snapshot, then
//! subscribes to the replicator and applies the change log in order, exactly once.
//!
//! # To ensure correctness
//! - Each batch of records is applied in one transaction that also moves the mirror's version
//!   ([`changelog::apply_replica`]), which checks that the batch starts right after it. A crash
//!   leaves the mirror at a version it really holds, and the subscription restarts from there.
//! - Records are decoded and validated before anything is written; an invalid one halts the
//!   applier (state `halted`, the reason in the status and the log) with the mirror at the
//!   version before it. Nothing is ever half-applied.
//! - A bootstrap loads into an empty engine and writes the version last, so a mirror killed
//!   during one starts at version 0 and bootstraps again; at version 0 the engine is wiped.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use strait_fs_core::changelog::{self, ChangeRecord, ReplicaError};
use strait_fs_core::kv::DynKv;
use strait_fs_core::snapshot::Loader;
use strait_fs_core::Version;
use strait_proto::limits::{META_MESSAGE_BYTES_MAX, REPLICATOR_MESSAGE_BYTES_MAX};
use strait_proto::meta::meta_service_client::MetaServiceClient;
use strait_proto::replicator as pb;
use strait_proto::replicator::replicator_client::ReplicatorClient;
use strait_proto::site as s;
use strait_proto::site::site_service_client::SiteServiceClient;
use strait_replicator_client::{Conn, Credentials};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::state::{Mirror, Phase};

mod delivery;
pub mod traced;

pub use delivery::APPLY_BATCH_MAX_RECORDS;
use delivery::{decode_new, delivered, next_chunk, Decoded, Delivered};
/// Backoff between attempts to subscribe or bootstrap.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// Those pauses: from `RETRY_MIN`, doubling up to `RETRY_MAX`, for as long as the attempts
/// fail (the follower runs until it is stopped).
const RETRY_BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(RETRY_MIN)
    .with_max_delay(RETRY_MAX)
    .with_factor(2.0)
    .without_max_times();
/// How long one reading of the primary's clock may take.
const CLOCK_POLL_TIMEOUT: Duration = Duration::from_secs(2);
/// Polls of the primary's clock waiting for their answers at once (see [`poll_clock`]).
const CLOCK_POLLS_IN_FLIGHT_MAX: usize = 16;
/// A subscription silent for this many `silence_ms` moves to the next replicator node.
const SILENCE_SWITCH_FACTOR: u64 = 3;

/// Why following stopped.
enum Stop {
    /// Try again (reconnect, resubscribe) after a pause.
    Retry(String),
    /// The log no longer holds what the mirror needs: bootstrap again.
    Truncated(Version),
    /// An invalid record: stay halted.
    Halt(String),
    Cancelled,
}

/// An authorised channel to the primary (or to any site daemon, for the CLI). Its clones
/// share one address: [`Primary::switch`] (the epoch named another primary) moves them all.
#[derive(Clone)]
pub struct Primary {
    link: Arc<parking_lot::RwLock<Link>>,
    /// What the mirror (or a command acting for an operator) presents to the daemon.
    pub creds: Credentials,
    /// `authorization: Bearer ...` of `creds`, for calls forwarded as raw HTTP/2 requests
    /// (None when the certificate alone proves the role).
    pub authorization: Option<http::HeaderValue>,
}

/// Where [`Primary`] calls go.
struct Link {
    addr: String,
    channel: Channel,
}

/// A lazily connected channel to `addr` presenting `creds`.
fn channel(addr: &str, creds: &Credentials) -> anyhow::Result<Channel> {
    Ok(creds
        .endpoint(addr)?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .max_frame_size(strait_proto::HTTP2_FRAME_BYTES)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(10))
        .connect_lazy())
}

/// Ask a site daemon (a primary or a mirror) at `addr` for its status, within 3 s.
pub async fn site_status(addr: &str, creds: &Credentials) -> anyhow::Result<s::SiteStatus> {
    use anyhow::Context;
    let primary = Primary::new(addr, creds)?;
    let mut c = primary.site();
    let r = tokio::time::timeout(Duration::from_secs(3), c.status(s::Empty {}))
        .await
        .with_context(|| format!("{addr} did not answer within 3 s"))?
        .with_context(|| format!("ask {addr} for its status"))?;
    Ok(r.into_inner())
}

impl Primary {
    /// A lazily connected channel to the site daemon at `addr` (`host:port`) presenting
    /// `creds` (a token, and TLS when they name a CA).
    pub fn new(addr: &str, creds: &Credentials) -> anyhow::Result<Self> {
        let channel = channel(addr, creds)?;
        let authorization = match creds.token_str() {
            Some(t) => Some(
                http::HeaderValue::from_str(&format!("Bearer {t}"))
                    .map_err(|_| anyhow::anyhow!("the token is not valid in a header"))?,
            ),
            None => None,
        };
        Ok(Primary {
            link: Arc::new(parking_lot::RwLock::new(Link {
                addr: addr.to_string(),
                channel,
            })),
            creds: creds.clone(),
            authorization,
        })
    }

    /// The address calls go to.
    pub fn addr(&self) -> String {
        self.link.read().addr.clone()
    }

    /// Send every later call (of this value and its clones) to `addr`; false when they went
    /// there already. Calls under way finish where they were sent.
    pub fn switch(&self, addr: &str) -> anyhow::Result<bool> {
        if self.link.read().addr == addr {
            return Ok(false);
        }
        let channel = channel(addr, &self.creds)?;
        let mut l = self.link.write();
        if l.addr == addr {
            return Ok(false);
        }
        *l = Link {
            addr: addr.to_string(),
            channel,
        };
        Ok(true)
    }

    /// The channel to the current address.
    pub fn channel(&self) -> Channel {
        self.link.read().channel.clone()
    }

    pub fn site(&self) -> SiteServiceClient<Conn> {
        SiteServiceClient::with_interceptor(self.channel(), self.creds.bearer())
            .max_decoding_message_size(META_MESSAGE_BYTES_MAX)
    }

    pub fn meta(&self) -> MetaServiceClient<Conn> {
        MetaServiceClient::with_interceptor(self.channel(), self.creds.bearer())
            .max_decoding_message_size(META_MESSAGE_BYTES_MAX)
    }
}

/// Load the primary's snapshot into the (wiped) engine and verify it. Returns the version
/// loaded. A load that fails, its digest check included, is wiped before this returns: the
/// loader writes the version with the last pairs, so an unverified tree left in place would
/// read as a mirror at that version, and the next turn would follow it instead of
/// bootstrapping again.
///
/// With `register` (the replicator and this mirror's id), the mirror's cursor is set at the
/// snapshot's version as soon as its header arrives, before the pairs load: a mirror with no
/// cursor holds nothing back, and the primary's GC could delete blocks of slices the snapshot
/// still references (or that die after it) while the load runs.
pub async fn bootstrap(
    kv: &DynKv,
    primary: &Primary,
    register: Option<(&strait_replicator_client::LogClient, &str)>,
) -> anyhow::Result<Version> {
    use anyhow::Context;
    match load_snapshot(kv, primary, register).await {
        Ok(v) => Ok(v),
        Err(e) => {
            let k = kv.clone();
            tokio::task::spawn_blocking(move || k.wipe())
                .await
                .context("wipe task")?
                .context("wipe the mirror's metadata after a failed bootstrap")?;
            Err(e)
        }
    }
}

async fn load_snapshot(
    kv: &DynKv,
    primary: &Primary,
    register: Option<(&strait_replicator_client::LogClient, &str)>,
) -> anyhow::Result<Version> {
    use anyhow::Context;
    use tokio_stream::StreamExt;
    let kv = kv.clone();
    let k = kv.clone();
    tokio::task::spawn_blocking(move || k.wipe())
        .await
        .context("wipe task")?
        .context("wipe the mirror's metadata before loading a snapshot")?;
    let mut stream = primary
        .site()
        .snapshot(s::Empty {})
        .await
        .context("ask the primary for a metadata snapshot")?
        .into_inner();
    let first = stream
        .next()
        .await
        .context("the snapshot stream ended before its header")?
        .context("read the snapshot header")?;
    let Some(s::snapshot_chunk::Kind::Header(header)) = first.kind else {
        anyhow::bail!("the snapshot stream did not start with a header");
    };
    tracing::info!(
        "bootstrapping from the primary's snapshot of {} at version {}",
        header.name,
        header.version
    );
    if let Some((client, id)) = register {
        let ack = pb::AckRequest {
            mirror: id.to_string(),
            applied_version: header.version,
        };
        // not fatal: the acknowledgements that follow the load set the cursor too
        match tokio::time::timeout(Duration::from_secs(10), client.ack(ack)).await {
            Ok(Ok(())) => tracing::info!(
                "registered this mirror's cursor at version {} before loading",
                header.version
            ),
            Ok(Err(e)) => tracing::warn!(
                "register this mirror's cursor at version {}: {}",
                header.version,
                e.message()
            ),
            Err(_) => tracing::warn!(
                "register this mirror's cursor at version {}: no answer within 10 s",
                header.version
            ),
        }
    }
    enum Msg {
        Pairs(Vec<(Vec<u8>, Vec<u8>)>),
        End(u64),
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Msg>(4);
    let version = Version(header.version);
    let loader = tokio::task::spawn_blocking(move || -> strait_fs_core::Result<Option<String>> {
        let mut l = Loader::new(kv.as_ref())?;
        while let Some(m) = rx.blocking_recv() {
            match m {
                Msg::Pairs(batch) => l.batch(&batch)?,
                Msg::End(pairs) => return l.finish(version, pairs).map(Some),
            }
        }
        Ok(None)
    });
    let mut end = None;
    // progress of a long load, in the log
    let started = std::time::Instant::now();
    let mut received = 0u64;
    let mut told = started;
    while let Some(chunk) = stream.next().await {
        match chunk.context("read the snapshot stream")?.kind {
            Some(s::snapshot_chunk::Kind::Pairs(p)) => {
                received += p.pairs.len() as u64;
                let pairs = p.pairs.into_iter().map(|kv| (kv.key, kv.value)).collect();
                if tx.send(Msg::Pairs(pairs)).await.is_err() {
                    break;
                }
                if told.elapsed() >= BOOTSTRAP_PROGRESS_EVERY {
                    told = std::time::Instant::now();
                    tracing::info!(
                        "bootstrapping: {received} pairs received in {:.0} s",
                        started.elapsed().as_secs_f64()
                    );
                }
            }
            Some(s::snapshot_chunk::Kind::End(e)) => {
                let _ = tx.send(Msg::End(e.pairs)).await;
                tracing::info!(
                    "bootstrapping: all {} pairs received in {:.1} s; checking the loaded tree \
                     (its pairs and digest)",
                    e.pairs,
                    started.elapsed().as_secs_f64()
                );
                end = Some(e);
                break;
            }
            _ => anyhow::bail!("unexpected message in the snapshot stream"),
        }
    }
    drop(tx);
    let loaded = loader
        .await
        .context("load task")?
        .context("load the snapshot")?;
    let end = end.context("the snapshot stream ended without its end marker")?;
    let digest = loaded.context("the snapshot load stopped before its end")?;
    if digest != end.digest {
        anyhow::bail!(
            "the loaded snapshot's digest {digest} differs from the primary's {}",
            end.digest
        );
    }
    tracing::info!(
        "bootstrapped at version {version}: {} pairs in {:.1} s, digest {digest} (equal to the \
         primary's)",
        end.pairs,
        started.elapsed().as_secs_f64()
    );
    Ok(version)
}

/// How often a bootstrap says in the log how far its load has come.
const BOOTSTRAP_PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Follow the log until `stop`: bootstrap when needed, subscribe, apply.
pub async fn run(mirror: Arc<Mirror>, primary: Primary, stop: CancellationToken) {
    let mut pauses = RETRY_BACKOFF.build();
    // sets the mirror's cursor at a snapshot's version before it loads (see `bootstrap`)
    let registrar =
        strait_replicator_client::LogClient::new(&mirror.cfg.replicator, &mirror.replicator_creds)
            .ok()
            .map(|c| c.with_attempts(2));
    let mut source = 0usize;
    // the region's sessions and locks, kept across a new bootstrap, which empties the engine
    // (a snapshot carries neither): the mounts go on with their sessions and their locks
    let mut region_state: Option<Vec<(Vec<u8>, Vec<u8>)>> = None;
    // The follower's worker loop, run until `stop`: its two retries (a bootstrap, a
    // subscription) are steps of it, pausing as `pauses` says, begun again after a success.
    // Not backon's `retry`: its pause cannot end at `stop` without either cutting short a
    // bootstrap under way or starting one more.
    loop {
        if stop.is_cancelled() {
            return;
        }
        let kv = mirror.kv.clone();
        let applied = match tokio::task::spawn_blocking(move || kv.last_version()).await {
            Ok(Ok(v)) => v,
            other => {
                tracing::error!("read the mirror's version: {other:?}");
                mirror.set_error(&format!("read the mirror's version: {other:?}"));
                tokio::time::sleep(RETRY_MAX).await;
                continue;
            }
        };
        if applied == Version::ZERO {
            mirror.set_phase(Phase::Bootstrapping, "");
            mirror.metrics.bootstraps.inc();
            let requested = mirror.mono_ms();
            let register = registrar.as_ref().map(|c| (c, mirror.cfg.id.as_str()));
            match bootstrap(&mirror.kv, &primary, register).await {
                Ok(v) => {
                    if let Some(pairs) = region_state.take() {
                        let kv = mirror.kv.clone();
                        let n = pairs.len();
                        let put = tokio::task::spawn_blocking(move || {
                            use strait_fs_core::meta::keys;
                            strait_fs_core::kv::txn(kv.as_ref(), |t| {
                                for (k, v) in &pairs {
                                    t.put(k, v);
                                }
                                Ok(())
                            })?;
                            // the snapshot brought the primary's session counter: no new
                            // session here may take the id of one kept
                            let top = pairs
                                .iter()
                                .filter(|(k, _)| k.first() == Some(&keys::SESSION))
                                .filter_map(|(k, _)| keys::u64_at(k, 9))
                                .max()
                                .unwrap_or(0) as i64;
                            let counter = keys::counter(keys::NEXT_SESSION);
                            let cur = kv.incr(&counter, 0)?;
                            if top > cur {
                                kv.incr(&counter, top - cur)?;
                            }
                            Ok::<_, strait_fs_core::Error>(())
                        })
                        .await;
                        match put {
                            Ok(Ok(())) => tracing::info!(
                                "kept the region's sessions and locks across the new bootstrap \
                                 ({n} keys)"
                            ),
                            other => {
                                // the mounts resume with new sessions, and take their locks
                                // back in a grace period
                                tracing::warn!(
                                    "put back the region's sessions and locks: {other:?}"
                                );
                                let kv = mirror.kv.clone();
                                let _ = tokio::task::spawn_blocking(move || {
                                    strait_fs_core::meta::lock_grace_from_now(kv.as_ref())
                                })
                                .await;
                            }
                        }
                    }
                    mirror.on_applied(v, &[], None);
                    // the snapshot was taken after it was asked for: it holds everything
                    // committed before `requested`, which bounds the lag as a poll would
                    mirror.on_snapshot(requested, v);
                    pauses = RETRY_BACKOFF.build();
                }
                Err(e) => {
                    let pause = next_pause(&mut pauses);
                    tracing::warn!("bootstrap failed, trying again in {pause:?}: {e:#}");
                    mirror.set_error(&format!("bootstrap: {e:#}"));
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
            continue;
        }
        // after a snapshot load (or a crash in the middle of indexing one): queue its blocks
        let blocks = mirror.blocks.clone();
        match tokio::task::spawn_blocking(move || {
            if blocks.indexed()? {
                return Ok(None);
            }
            blocks.index_all(applied).map(Some)
        })
        .await
        {
            Ok(Ok(None)) => {}
            Ok(Ok(Some((slices, blocks)))) => tracing::info!(
                "queued {blocks} blocks of {slices} slices of the snapshot for copying ({})",
                mirror.blocks.stats().policy
            ),
            other => {
                tracing::error!("queue the snapshot's blocks: {other:?}");
                mirror.set_error(&format!("queue the snapshot's blocks: {other:?}"));
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(RETRY_MAX) => {}
                }
                continue;
            }
        }
        let addr = mirror.cfg.replicator[source % mirror.cfg.replicator.len()].clone();
        let outcome = follow(&mirror, &addr, applied, &stop).await;
        match outcome {
            Stop::Cancelled => return,
            Stop::Halt(why) => {
                tracing::error!(
                    "the applier halted: {why}; the mirror stays at version {}",
                    mirror.applied()
                );
                mirror.halt(&why);
                stop.cancelled().await;
                return;
            }
            Stop::Truncated(earliest) => {
                tracing::warn!(
                    "the replicator no longer holds version {} (its log starts at {earliest}): \
                     bootstrapping again from the primary's snapshot",
                    applied.next()
                );
                mirror.set_error(&format!(
                    "re-bootstrapped: the log was purged up to {earliest} past version {applied}"
                ));
                let kv = mirror.kv.clone();
                // version 0 means "bootstrap": the next turn loads the snapshot
                match tokio::task::spawn_blocking(move || {
                    let kept = region_local_state(kv.as_ref())?;
                    kv.wipe().map(|()| kept)
                })
                .await
                {
                    Ok(Ok(kept)) => {
                        region_state = Some(kept);
                        mirror.on_wiped()
                    }
                    other => {
                        tracing::error!("empty the mirror's engine for a new bootstrap: {other:?}");
                        mirror.set_error(&format!(
                            "empty the mirror's engine for a new bootstrap: {other:?}"
                        ));
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(RETRY_MAX) => {}
                        }
                    }
                }
            }
            Stop::Retry(why) => {
                if mirror.phase() != Phase::Disconnected {
                    tracing::warn!("lost the subscription at {addr}: {why}; retrying");
                }
                mirror.set_error(&why);
                mirror.set_phase(Phase::Disconnected, "");
                source += 1;
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(next_pause(&mut pauses)) => {}
                }
                continue;
            }
        }
        pauses = RETRY_BACKOFF.build();
    }
}

/// The region's own state in the mirror's engine that a snapshot does not carry and a new
/// bootstrap must not lose: its mounts' sessions and their locks.
fn region_local_state(
    kv: &dyn strait_fs_core::kv::KvEngine,
) -> strait_fs_core::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    use strait_fs_core::meta::keys;
    strait_fs_core::kv::read(kv, |t| {
        let mut out = vec![];
        for tag in [keys::SESSION, keys::FLOCK, keys::PLOCK, keys::LOCKED] {
            out.extend(t.scan(&[tag], None, usize::MAX)?);
        }
        Ok(out)
    })
}

/// The next pause from `pauses` ([`RETRY_BACKOFF`]), to the millisecond: backon doubles in
/// `f32`, which would make 200 ms 200.000003 ms in the log.
fn next_pause(pauses: &mut impl Iterator<Item = Duration>) -> Duration {
    let pause = pauses.next().unwrap_or(RETRY_MAX);
    Duration::from_millis(((pause.as_nanos() + 500_000) / 1_000_000) as u64)
}

/// Subscribe at `addr` from `applied + 1` and apply until the stream ends.
async fn follow(
    mirror: &Arc<Mirror>,
    addr: &str,
    applied: Version,
    stop: &CancellationToken,
) -> Stop {
    let channel = match strait_replicator_client::channel(addr, &mirror.replicator_creds) {
        Ok(c) => c,
        Err(e) => return Stop::Retry(format!("replicator address {addr}: {e}")),
    };
    let mut client =
        ReplicatorClient::new(channel).max_decoding_message_size(REPLICATOR_MESSAGE_BYTES_MAX);
    let stream = tokio::select! {
        _ = stop.cancelled() => return Stop::Cancelled,
        r = client.subscribe(pb::SubscribeRequest { after_version: applied.0 }) => r,
    };
    let mut stream = match stream {
        Ok(s) => s.into_inner(),
        Err(e) => return Stop::Retry(format!("subscribe at {addr}: {}", e.message())),
    };
    mirror.set_phase(Phase::Following, addr);
    tracing::info!(
        "following the change log at {addr} from version {}",
        applied.next()
    );
    let mut at = applied;
    // a node cut off from the leader keeps the stream open and sends nothing: after this long
    // without a message, try the next node (when there is one)
    let silent_limit = Duration::from_millis(mirror.cfg.silence_ms * SILENCE_SWITCH_FACTOR);
    let switch = mirror.cfg.replicator.len() > 1;
    loop {
        let msg = tokio::select! {
            _ = stop.cancelled() => return Stop::Cancelled,
            m = stream.message() => m,
            _ = tokio::time::sleep(silent_limit), if switch => {
                return Stop::Retry(format!(
                    "nothing from {addr} for {silent_limit:?}: trying another replicator node"
                ))
            }
        };
        let msg = match msg {
            Ok(Some(m)) => m,
            Ok(None) => return Stop::Retry(format!("{addr} ended the subscription")),
            Err(e) => return Stop::Retry(format!("subscription at {addr}: {}", e.message())),
        };
        mirror.on_stream();
        match msg.kind {
            Some(pb::subscribe_reply::Kind::Heartbeat(h)) => {
                mirror.on_heartbeat(h.primary_clock_ms, Version(h.latest_version))
            }
            Some(pb::subscribe_reply::Kind::TruncatedEarliest(e)) => {
                return Stop::Truncated(Version(e))
            }
            Some(pb::subscribe_reply::Kind::Records(r)) => {
                mirror.on_epoch(r.epoch);
                match apply_records(mirror, at, Version(r.first_version), r.records, stop).await {
                    Ok(v) => at = v,
                    Err(stop) => return stop,
                }
            }
            None => return Stop::Retry("an empty message from the replicator".into()),
        }
    }
}

/// Decode and apply one delivered batch; returns the new applied version.
async fn apply_records(
    mirror: &Arc<Mirror>,
    at: Version,
    first: Version,
    raw: Vec<Vec<u8>>,
    stop: &CancellationToken,
) -> Result<Version, Stop> {
    let (skip, last) = match delivered(at, first, raw.len()) {
        Delivered::Nothing => return Ok(at),
        Delivered::Gap => {
            return Err(Stop::Retry(format!(
                "the subscription skipped from version {at} to {first}"
            )))
        }
        Delivered::New { skip, last } => (skip, last),
    };
    // decode first: a record that does not decode halts the applier after the ones before it
    let Decoded {
        records: recs,
        undecodable,
    } = decode_new(first, &raw, skip, ChangeRecord::decode);
    if recs.is_empty() {
        return match undecodable {
            Some(why) => Err(Stop::Halt(why)),
            None => Ok(at),
        };
    }
    let mut next = at.next();
    let ts_ms = |r: &ChangeRecord| (r.ts_ns / 1_000_000).max(0) as u64;
    mirror.on_received(next, last, ts_ms(&recs[0]));
    let mut rest: &[ChangeRecord] = &recs;
    while !rest.is_empty() {
        // a digest being taken at version h: apply nothing past h until it is done
        let (guard, limit) = wait_for_hold(mirror, next, stop).await?;
        let n = next_chunk(rest.len(), next, limit);
        let (batch, tail) = rest.split_at(n);
        let kv = mirror.kv.clone();
        let owned = batch.to_vec();
        let from = next;
        let blocks = mirror.blocks.clone();
        let started = strait_fs_core::clock::now();
        let r = tokio::task::spawn_blocking(move || {
            let hook = |t: &mut dyn strait_fs_core::kv::KvTxn, v: Version, r: &ChangeRecord| {
                blocks.hook(t, v, r)
            };
            let r = changelog::apply_replica_with(kv.as_ref(), from, &owned, &hook);
            match r {
                Err(ReplicaError::Record { .. }) => find_invalid(kv.as_ref(), from, &owned, &hook),
                other => other.map(|v| (v, None)),
            }
            .map(|(v, bad)| (v, bad, owned))
        })
        .await;
        drop(guard);
        mirror.blocks.queued();
        let (v, bad, owned) = match r {
            Ok(Ok(x)) => x,
            Ok(Err(ReplicaError::Gap { at, first })) => {
                return Err(Stop::Retry(format!(
                    "the mirror is at version {at}, not {} (a batch starting at {first})",
                    first.prev()
                )))
            }
            Ok(Err(e)) => return Err(Stop::Retry(format!("apply: {e}"))),
            Err(e) => return Err(Stop::Retry(format!("apply task: {e}"))),
        };
        let applied_ts: Vec<i64> = owned[..(v.0 + 1 - from.0) as usize]
            .iter()
            .map(|r| r.ts_ns)
            .collect();
        let pending = tail.first().map(|r| (v.next(), ts_ms(r)));
        mirror.on_applied(v, &applied_ts, pending);
        mirror
            .applies
            .note(from, v, started, strait_fs_core::clock::now());
        if let Some(why) = bad {
            return Err(Stop::Halt(why));
        }
        next = v.next();
        rest = tail;
    }
    match undecodable {
        Some(why) => Err(Stop::Halt(why)),
        None => Ok(next.prev()),
    }
}

/// After a batch failed on an invalid record: apply its records one by one, so that every
/// valid one before the culprit lands, and name the culprit.
fn find_invalid(
    kv: &dyn strait_fs_core::kv::KvEngine,
    from: Version,
    recs: &[ChangeRecord],
    hook: changelog::ReplicaHook<'_>,
) -> Result<(Version, Option<String>), ReplicaError> {
    let mut at = from.prev();
    for (i, r) in recs.iter().enumerate() {
        let v = from + i as u64;
        match changelog::apply_replica_with(kv, v, std::slice::from_ref(r), hook) {
            Ok(_) => at = v,
            Err(ReplicaError::Record { source, .. }) => {
                return Ok((at, Some(format!("record {v} is invalid: {source}"))))
            }
            Err(e) => return Err(e),
        }
    }
    // every record applied on its own: the batch failed for another reason, now gone
    Ok((at, None))
}

/// Wait while a hold sits below `next`; returns the apply lock and the hold to respect.
async fn wait_for_hold<'a>(
    mirror: &'a Arc<Mirror>,
    next: Version,
    stop: &CancellationToken,
) -> Result<(tokio::sync::MutexGuard<'a, ()>, Option<Version>), Stop> {
    let mut changed = mirror.changed.subscribe();
    loop {
        let guard = tokio::select! {
            _ = stop.cancelled() => return Err(Stop::Cancelled),
            g = mirror.apply_lock.lock() => g,
        };
        let hold = *mirror.hold.lock();
        match hold {
            Some(h) if h < next => {
                drop(guard);
                tokio::select! {
                    _ = stop.cancelled() => return Err(Stop::Cancelled),
                    _ = changed.changed() => {}
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
            other => return Ok((guard, other)),
        }
    }
}

/// Acknowledge the applied version to the replicator every `ack_interval_ms`.
pub async fn ack(mirror: Arc<Mirror>, stop: CancellationToken) {
    let client = match strait_replicator_client::LogClient::new(
        &mirror.cfg.replicator,
        &mirror.replicator_creds,
    ) {
        Ok(c) => c.with_attempts(2),
        Err(e) => {
            tracing::error!("no acknowledgements to the replicator: {}", e.message());
            return;
        }
    };
    let period = Duration::from_millis(mirror.cfg.ack_interval_ms);
    let mut acked = Version::ZERO;
    let mut failing = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        let applied = mirror.applied();
        // a halted mirror acknowledges nothing more: its cursor stays where it stopped, and
        // `replicator forget-mirror` can drop it
        if applied == acked || matches!(mirror.phase(), Phase::Bootstrapping | Phase::Halted) {
            continue;
        }
        // the cursor says what this mirror holds on stable storage: the log purges what is
        // below it, and applying is not synced record by record, so a power loss here would
        // otherwise leave the mirror behind a cursor whose records are gone
        let kv = mirror.kv.clone();
        match tokio::task::spawn_blocking(move || kv.sync()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!("sync the mirror's metadata before acknowledging {applied}: {e}");
                continue;
            }
            Err(e) => {
                tracing::warn!("sync the mirror's metadata: {e}");
                continue;
            }
        }
        let r = client
            .ack(pb::AckRequest {
                mirror: mirror.cfg.id.clone(),
                applied_version: applied.0,
            })
            .await;
        match r {
            Ok(()) => {
                acked = applied;
                if failing {
                    tracing::info!("acknowledging to the replicator again (version {applied})");
                }
                failing = false;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(
                        "acknowledge version {applied} to the replicator: {}",
                        e.message()
                    );
                }
                failing = true;
            }
        }
    }
}

/// Poll the primary's latest version (and clock) every `clock_poll_ms`: the lag bound counts
/// from when a poll the mirror has caught up with was *sent* (see `lag.rs`). The heartbeats
/// in the change log reach the mirror behind every record before them, so they cannot bound
/// anything.
///
/// Polls leave on a steady beat and do not wait for each other's answers: with a round trip
/// longer than the period, several are in flight (at most [`CLOCK_POLLS_IN_FLIGHT_MAX`]; a
/// beat is skipped while that many wait). So the bound a mirror that keeps up shows is about
/// one period plus one round trip, never the period plus a round trip per poll.
pub async fn poll_clock(mirror: Arc<Mirror>, primary: Primary, stop: CancellationToken) {
    let every = Duration::from_millis(mirror.cfg.clock_poll_ms.max(1));
    // the first poll at once: until one is answered the lag is unknown
    let mut beat = tokio::time::interval(every);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let slots = Arc::new(tokio::sync::Semaphore::new(CLOCK_POLLS_IN_FLIGHT_MAX));
    let warned = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut polls = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => {
                polls.shutdown().await;
                return;
            }
            _ = beat.tick() => {}
            // reap finished polls, so the set stays as small as the polls in flight
            Some(_) = polls.join_next(), if !polls.is_empty() => continue,
        }
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let requested = mirror.mono_ms();
        // the primary's current address: it may have moved (a promotion elsewhere)
        let mut site = primary.site();
        let (mirror, warned) = (mirror.clone(), warned.clone());
        polls.spawn(async move {
            let _slot = slot;
            let call = site.status(strait_proto::site::Empty {});
            let warn = |what: String| {
                if !warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!("{what}");
                }
            };
            match tokio::time::timeout(CLOCK_POLL_TIMEOUT, call).await {
                Ok(Ok(r)) => {
                    let s = r.into_inner();
                    // only the primary the log goes on with bounds the lag: an old one, fenced
                    // or superseded, would keep this mirror "fresh" while the new one commits
                    match reading_refused(&s, mirror.epoch()) {
                        None => {
                            mirror.on_poll(requested, s.clock_ms, Version(s.version));
                            mirror.on_primary_lease(s.lease_ms, s.lease_left_ms);
                            warned.store(false, std::sync::atomic::Ordering::Relaxed);
                        }
                        Some(why) => warn(format!(
                            "the primary's clock is not taken as a reading: {why}"
                        )),
                    }
                }
                Ok(Err(e)) => warn(format!("read the primary's clock: {}", e.message())),
                Err(_) => warn(format!(
                    "read the primary's clock: no answer within {CLOCK_POLL_TIMEOUT:?}"
                )),
            }
        });
    }
}

/// Why the answer `st` to a poll of the primary may not bound this mirror's lag, when the
/// newest records it received are of epoch `known_epoch` (None: it may): only a daemon that
/// answers as the primary, is not fenced, is at that epoch or later and, with a lease, still
/// holds it.
pub fn reading_refused(st: &s::SiteStatus, known_epoch: u64) -> Option<String> {
    if st.role != "primary" {
        return Some(format!(
            "the daemon at the primary's address answers as a {}",
            st.role
        ));
    }
    if !st.fenced.is_empty() {
        return Some(format!("the primary is fenced: {}", st.fenced));
    }
    if st.epoch < known_epoch {
        return Some(format!(
            "the primary answers at epoch {}, and the log is at epoch {known_epoch}: another \
             primary was promoted",
            st.epoch
        ));
    }
    if st.lease_ms > 0 && st.lease_left_ms == 0 {
        return Some(format!(
            "the primary's lease of {} ms has run out: another may have been promoted",
            st.lease_ms
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_primary_the_log_goes_on_with_bounds_the_lag() {
        let ok = s::SiteStatus {
            role: "primary".into(),
            epoch: 2,
            ..Default::default()
        };
        assert_eq!(reading_refused(&ok, 2), None);
        assert_eq!(reading_refused(&ok, 1), None);
        // an older epoch: another primary was promoted since
        assert!(reading_refused(&ok, 3).unwrap().contains("epoch 2"));
        let fenced = s::SiteStatus {
            fenced: "stale-epoch".into(),
            ..ok.clone()
        };
        assert!(reading_refused(&fenced, 2).unwrap().contains("fenced"));
        let mirror = s::SiteStatus {
            role: "mirror".into(),
            ..ok.clone()
        };
        assert!(reading_refused(&mirror, 2).is_some());
        let lapsed = s::SiteStatus {
            lease_ms: 2000,
            lease_left_ms: 0,
            ..ok.clone()
        };
        assert!(reading_refused(&lapsed, 2).unwrap().contains("lease"));
        let leased = s::SiteStatus {
            lease_ms: 2000,
            lease_left_ms: 1500,
            ..ok
        };
        assert_eq!(reading_refused(&leased, 2), None);
    }

    /// A site service whose snapshot is a real one with the end's digest changed.
    struct TamperedSite {
        kv: DynKv,
    }

    #[tonic::async_trait]
    impl strait_proto::site::site_service_server::SiteService for TamperedSite {
        type SnapshotStream = strait_server::snapshot::SnapshotStream;

        async fn snapshot(
            &self,
            _req: tonic::Request<s::Empty>,
        ) -> Result<tonic::Response<Self::SnapshotStream>, tonic::Status> {
            use tokio_stream::StreamExt;
            let real = strait_server::snapshot::snapshot_stream(self.kv.clone());
            let tampered = real.map(|c| {
                c.map(|mut c| {
                    if let Some(s::snapshot_chunk::Kind::End(e)) = &mut c.kind {
                        e.digest = "0".repeat(64);
                    }
                    c
                })
            });
            Ok(tonic::Response::new(Box::pin(tampered)))
        }
        async fn digest(
            &self,
            _req: tonic::Request<s::DigestRequest>,
        ) -> Result<tonic::Response<s::DigestReply>, tonic::Status> {
            Err(tonic::Status::unimplemented("not in this test"))
        }
        async fn status(
            &self,
            _req: tonic::Request<s::Empty>,
        ) -> Result<tonic::Response<s::SiteStatus>, tonic::Status> {
            Err(tonic::Status::unimplemented("not in this test"))
        }
        async fn pause(
            &self,
            _req: tonic::Request<s::PauseRequest>,
        ) -> Result<tonic::Response<s::PauseReply>, tonic::Status> {
            Err(tonic::Status::unimplemented("not in this test"))
        }
        async fn gc(
            &self,
            _req: tonic::Request<s::Empty>,
        ) -> Result<tonic::Response<s::GcReply>, tonic::Status> {
            Err(tonic::Status::unimplemented("not in this test"))
        }
        async fn promote(
            &self,
            _req: tonic::Request<s::PromoteRequest>,
        ) -> Result<tonic::Response<s::PromoteReply>, tonic::Status> {
            Err(tonic::Status::unimplemented("not in this test"))
        }
        async fn handover(
            &self,
            _req: tonic::Request<s::HandoverRequest>,
        ) -> Result<tonic::Response<s::HandoverReply>, tonic::Status> {
            Err(tonic::Status::unimplemented("not in this test"))
        }
        type WarmupStream = strait_server::WarmupStream;
        async fn warmup(
            &self,
            _req: tonic::Request<s::WarmupRequest>,
        ) -> Result<tonic::Response<Self::WarmupStream>, tonic::Status> {
            Err(tonic::Status::unimplemented("not in this test"))
        }
        type SweepOrphansStream = strait_server::orphans::SweepStream;
        async fn sweep_orphans(
            &self,
            _req: tonic::Request<s::SweepRequest>,
        ) -> Result<tonic::Response<Self::SweepOrphansStream>, tonic::Status> {
            Err(tonic::Status::unimplemented("not in this test"))
        }
    }

    #[tokio::test]
    async fn a_bootstrap_whose_digest_differs_leaves_nothing_to_follow() {
        let memory = || -> DynKv { Arc::new(strait_fs_core::kv::memory::MemoryKv::new()) };
        // a primary with a small tree
        let (primary_kv, meta) = strait_fs_core::meta::conformance::fresh(&memory);
        let root = strait_fs_core::meta::Ctx::root();
        strait_fs_core::meta::MetaClient::mkdir(meta.as_ref(), &root, 1, b"d", 0o755, 0)
            .expect("mkdir");
        assert!(primary_kv.last_version().expect("version") > Version::ZERO);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let svc = strait_proto::site::site_service_server::SiteServiceServer::new(TamperedSite {
            kv: primary_kv,
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let primary = Primary::new(
            &addr.to_string(),
            &Credentials::token("test-token-0123456789").expect("token"),
        )
        .expect("primary");
        let mirror_kv = memory();
        let e = bootstrap(&mirror_kv, &primary, None)
            .await
            .expect_err("a snapshot whose digest differs must not load");
        assert!(format!("{e:#}").contains("digest"), "{e:#}");
        // nothing is left that the next turn could take for a bootstrapped mirror
        assert_eq!(mirror_kv.last_version().expect("version"), Version::ZERO);
    }

    #[test]
    fn the_pauses_double_from_100_ms_up_to_2_s_and_go_on() {
        let mut pauses = RETRY_BACKOFF.build();
        let got: Vec<u64> = (0..8)
            .map(|_| next_pause(&mut pauses).as_millis() as u64)
            .collect();
        assert_eq!(got, [100, 200, 400, 800, 1600, 2000, 2000, 2000]);
    }
}
