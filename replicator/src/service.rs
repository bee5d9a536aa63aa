//! The replicator's gRPC service: Raft traffic between nodes, the change log's API for the
//! primary and the mirrors, and cluster administration.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers};
use strait_auth::{Caller, Role, Slots};
use strait_ids::{Epoch, Version};
use strait_proto::replicator::PRIMARY_CURSOR;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::early::Early;
use crate::log::{AppendError, Command, Outcome, Retention, CURSORS_MAX, MIRROR_NAME_MAX};
use crate::metrics::Metrics;
use crate::network::{KIND_APPEND, KIND_SNAPSHOT, KIND_VOTE};
use crate::pb;
use crate::store::ChangeLog;
use crate::{NodeId, Raft, APPEND_HEADER, LEADER_HEADER};

/// Records per streamed batch, and bytes (a batch holds at least one record).
/// How far a heartbeat's clock may be from this node's: the log's age cap counts by the
/// primary's clock, so a clock stepped years ahead would purge the whole log at once.
pub const HEARTBEAT_CLOCK_SKEW_MAX_MS: u64 = 24 * 3600 * 1000;

/// Whether a heartbeat's clock reading `primary_ms` is possible next to this node's `own_ms`.
pub fn check_heartbeat_clock(primary_ms: u64, own_ms: u64) -> Result<(), String> {
    let apart = primary_ms.abs_diff(own_ms);
    if apart > HEARTBEAT_CLOCK_SKEW_MAX_MS {
        return Err(format!(
            "the heartbeat's clock ({primary_ms} ms since 1970) is {} s from this node's \
             ({own_ms} ms): more than a day apart, so it is refused (the log's age cap counts \
             by the primary's clock); check both machines' clocks",
            apart / 1000
        ));
    }
    Ok(())
}

const SUBSCRIBE_BATCH_RECORDS: usize = 4096;
const SUBSCRIBE_BATCH_BYTES: usize = 4 << 20;
/// Batches queued per subscriber before the reader waits for the subscriber (flow control).
const SUBSCRIBE_QUEUE: usize = 8;
/// How often an idle subscription repeats the primary's last heartbeat.
const SUBSCRIBE_HEARTBEAT: Duration = Duration::from_millis(200);

/// Most subscriptions a node serves at once: its mirrors, the primary reading back, its peers
/// relaying, and operators' tools.
pub const SUBSCRIPTIONS_MAX: usize = 256;
/// Most subscriptions from one peer address at once.
pub const SUBSCRIPTIONS_PER_PEER_MAX: usize = 16;

pub struct ReplicatorService {
    raft: Raft,
    log: ChangeLog,
    early: Early,
    subscriptions: Slots,
    metrics: Arc<Metrics>,
}

/// The bound on subscriptions a node serves ([`SUBSCRIPTIONS_MAX`] in all,
/// [`SUBSCRIPTIONS_PER_PEER_MAX`] per peer address).
pub fn subscription_slots() -> Slots {
    Slots::new(
        "subscriptions",
        SUBSCRIPTIONS_MAX,
        SUBSCRIPTIONS_PER_PEER_MAX,
    )
}

impl ReplicatorService {
    /// `subscriptions`: [`subscription_slots`], shared with the metrics that count them.
    pub fn new(
        raft: Raft,
        log: ChangeLog,
        early: Early,
        subscriptions: Slots,
        metrics: Arc<Metrics>,
    ) -> Self {
        ReplicatorService {
            raft,
            log,
            early,
            subscriptions,
            metrics,
        }
    }

    /// Propose `cmd`; a refusal becomes FAILED_PRECONDITION with `x-strait-append`.
    async fn write(&self, cmd: Command) -> Result<Outcome, Status> {
        match self.raft.client_write(cmd).await {
            Ok(r) => match r.data {
                Outcome::Refused(e @ AppendError::NotOwner { .. }) => {
                    Err(refused(&e, Status::permission_denied(e.to_string())))
                }
                Outcome::Refused(e) => Err(refused(&e, Status::failed_precondition(e.to_string()))),
                o => Ok(o),
            },
            Err(e) => Err(self.write_error(e)),
        }
    }

    fn write_error(&self, e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> Status {
        if let Some(f) = e.forward_to_leader::<BasicNode>() {
            let mut s = Status::unavailable(match (&f.leader_id, &f.leader_node) {
                (Some(id), Some(n)) => format!("not the leader: node {id} at {} is", n.addr),
                _ => "not the leader, and no leader is known (an election is under way)".into(),
            });
            if let (Some(id), Some(n)) = (&f.leader_id, &f.leader_node) {
                if let Ok(v) = format!("{id}@{}", n.addr).parse() {
                    s.metadata_mut().insert(LEADER_HEADER, v);
                }
            }
            return s;
        }
        match e {
            RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => {
                Status::failed_precondition(c.to_string())
            }
            e => Status::unavailable(e.to_string()),
        }
    }
}

impl ReplicatorService {
    async fn append_once(&self, r: pb::AppendRequest) -> Result<Response<pb::AppendReply>, Status> {
        // refused before it is proposed: a malformed batch never reaches Raft's log
        if let Err(e) = crate::log::check_batch(Version(r.first_version), &r.records) {
            return Err(refused(&e, Status::invalid_argument(e.to_string())));
        }
        let cmd = Command::Append {
            epoch: Epoch(r.epoch),
            first_version: Version(r.first_version),
            records: r.records,
        };
        // proposed, committed by a majority of the nodes, applied to the log
        let raft = tracing::info_span!("raft_commit");
        match tracing::Instrument::instrument(self.write(cmd), raft).await? {
            Outcome::Appended { last_version } => Ok(Response::new(pb::AppendReply {
                last_version: last_version.0,
                duplicate: false,
            })),
            Outcome::Duplicate { last_version } => Ok(Response::new(pb::AppendReply {
                last_version: last_version.0,
                duplicate: true,
            })),
            o => Err(Status::internal(format!("unexpected outcome {o:?}"))),
        }
    }
}

/// `status` for an append refused for `e`, naming the refusal in [`APPEND_HEADER`].
fn refused(e: &crate::log::AppendError, mut status: Status) -> Status {
    if let Ok(v) = e.kind().parse() {
        status.metadata_mut().insert(APPEND_HEADER, v);
    }
    status
}

fn decode<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, Status> {
    postcard::from_bytes(payload)
        .map_err(|e| Status::invalid_argument(format!("decode the Raft message: {e}")))
}

fn encode<T: serde::Serialize>(v: &T) -> Result<Response<pb::RaftReply>, Status> {
    postcard::to_allocvec(v)
        .map(|payload| Response::new(pb::RaftReply { payload }))
        .map_err(|e| Status::internal(format!("encode the Raft reply: {e}")))
}

/// Whether `caller` may move the cursor named `cursor`: the primary's own (`@primary`) only
/// the primary, and a mirror whose certificate names it only its own. A mirror known by a
/// token alone is held to the cursors its token registered by the log's rules
/// ([`crate::log::check_cursor_owner`]).
pub fn check_ack(caller: Option<&Caller>, cursor: &str) -> Result<(), Status> {
    let Some(c) = caller else { return Ok(()) };
    if c.roles.contains(Role::Primary) {
        return Ok(());
    }
    if cursor == PRIMARY_CURSOR {
        return Err(Status::permission_denied(format!(
            "only the primary may move the cursor {PRIMARY_CURSOR}"
        )));
    }
    match &c.name {
        Some(name) if name != cursor => Err(Status::permission_denied(format!(
            "the mirror {name:?} may move only its own cursor, not {cursor:?}"
        ))),
        _ => Ok(()),
    }
}

type SubscribeStream = Pin<Box<dyn Stream<Item = Result<pb::SubscribeReply, Status>> + Send>>;

#[tonic::async_trait]
impl pb::replicator_server::Replicator for ReplicatorService {
    async fn raft(&self, req: Request<pb::RaftRequest>) -> Result<Response<pb::RaftReply>, Status> {
        let r = req.into_inner();
        match r.kind {
            KIND_APPEND => encode(&self.raft.append_entries(decode(&r.payload)?).await),
            KIND_VOTE => encode(&self.raft.vote(decode(&r.payload)?).await),
            KIND_SNAPSHOT => encode(&self.raft.install_snapshot(decode(&r.payload)?).await),
            k => Err(Status::invalid_argument(format!(
                "unknown Raft message kind {k}"
            ))),
        }
    }

    async fn append(
        &self,
        req: Request<pb::AppendRequest>,
    ) -> Result<Response<pb::AppendReply>, Status> {
        let start = Instant::now();
        // a child of the shipper's span when it sent its trace context
        let span = strait_auth::trace::child_of(
            tracing::info_span!(
                "append",
                first = req.get_ref().first_version,
                records = req.get_ref().records.len()
            ),
            req.metadata().as_ref(),
        );
        let r = tracing::Instrument::instrument(self.append_once(req.into_inner()), span).await;
        let outcome = match &r {
            Ok(a) if a.get_ref().duplicate => "duplicate",
            Ok(_) => "appended",
            Err(s) if s.metadata().get(APPEND_HEADER).is_some() => "refused",
            Err(s) if s.code() == tonic::Code::Unavailable => "unavailable",
            Err(_) => "error",
        };
        self.metrics
            .append_seconds
            .with_label_values(&[outcome])
            .observe(start.elapsed().as_secs_f64());
        r
    }

    async fn bump_epoch(
        &self,
        req: Request<pb::BumpEpochRequest>,
    ) -> Result<Response<pb::BumpEpochReply>, Status> {
        let req = req.into_inner();
        let epoch = Epoch(req.epoch);
        let cmd = match req.primary {
            None => Command::BumpEpoch { epoch },
            Some(p) => {
                let primary = crate::log::PrimaryAt {
                    id: p.id,
                    addr: p.addr,
                    data_url: p.data_url,
                };
                primary.check().map_err(Status::invalid_argument)?;
                Command::Promote { epoch, primary }
            }
        };
        match self.write(cmd).await? {
            Outcome::Epoch {
                epoch,
                last_version,
            } => Ok(Response::new(pb::BumpEpochReply {
                epoch: epoch.0,
                last_version: last_version.0,
            })),
            o => Err(Status::internal(format!("unexpected outcome {o:?}"))),
        }
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let r = req.into_inner();
        let own = strait_ids::clock::now_ms();
        check_heartbeat_clock(r.primary_clock_ms, own).map_err(Status::invalid_argument)?;
        self.write(Command::Heartbeat {
            epoch: Epoch(r.epoch),
            primary_clock_ms: r.primary_clock_ms,
            latest_version: Version(r.latest_version),
        })
        .await?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn ack(&self, req: Request<pb::AckRequest>) -> Result<Response<pb::Empty>, Status> {
        let caller = strait_auth::caller(&req).cloned();
        check_ack(caller.as_ref(), &req.get_ref().mirror)?;
        // a mirror's ack names its credentials: the cursor is theirs from its first ack on.
        // The primary's (its durable mark, or any it makes) are owned by no one.
        let owner = caller
            .filter(|c| !c.roles.contains(Role::Primary) && !c.principal.is_empty())
            .map(|c| c.principal);
        {
            let state = self.log.state();
            let name = &req.get_ref().mirror;
            if !state.cursors.contains_key(name) && state.cursors.len() >= CURSORS_MAX {
                return Err(Status::resource_exhausted(format!(
                    "the log keeps {} cursors, its most: forget a mirror that is gone \
                     (strait replicator forget-mirror) before another registers",
                    state.cursors.len()
                )));
            }
            // refused here with its own status; the log's rules refuse it again when two
            // first acks race
            if let Some(owner) = &owner {
                if let Err(e) = crate::log::check_cursor_owner(&state, name, owner) {
                    return Err(match e {
                        AppendError::NotOwner { .. } => Status::permission_denied(e.to_string()),
                        e => Status::resource_exhausted(e.to_string()),
                    });
                }
            }
        }
        let r = req.into_inner();
        if r.mirror.is_empty() || r.mirror.len() > MIRROR_NAME_MAX {
            return Err(Status::invalid_argument(format!(
                "a mirror name has 1 to {MIRROR_NAME_MAX} bytes"
            )));
        }
        let cmd = match owner {
            Some(owner) => Command::AckAs {
                mirror: r.mirror,
                applied_version: Version(r.applied_version),
                owner,
            },
            None => Command::Ack {
                mirror: r.mirror,
                applied_version: Version(r.applied_version),
            },
        };
        self.write(cmd).await?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn set_retention(
        &self,
        req: Request<pb::RetentionRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let r = req.into_inner();
        if r.max_bytes == 0 || r.max_age_ms == 0 {
            return Err(Status::invalid_argument(
                "retention caps must be positive (bytes and milliseconds)",
            ));
        }
        self.write(Command::SetRetention(Retention {
            max_bytes: r.max_bytes,
            max_age_ms: r.max_age_ms,
        }))
        .await?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn forget_mirror(
        &self,
        req: Request<pb::ForgetMirrorRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let r = req.into_inner();
        if r.mirror.is_empty() || r.mirror.len() > MIRROR_NAME_MAX {
            return Err(Status::invalid_argument(format!(
                "a mirror name has 1 to {MIRROR_NAME_MAX} bytes"
            )));
        }
        self.write(Command::ForgetMirror { mirror: r.mirror })
            .await?;
        Ok(Response::new(pb::Empty {}))
    }

    type SubscribeStream = SubscribeStream;

    async fn subscribe(
        &self,
        req: Request<pb::SubscribeRequest>,
    ) -> Result<Response<SubscribeStream>, Status> {
        // held by the feeding task: given back when the subscriber goes away
        let slot = self.subscriptions.take(req.remote_addr().map(|a| a.ip()))?;
        let after = Version(req.into_inner().after_version);
        let log = self.log.clone();
        let early = self.early.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(SUBSCRIBE_QUEUE);
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = feed(log, early, after, tx.clone()).await {
                let _ = tx.send(Err(e)).await;
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn status(&self, _req: Request<pb::Empty>) -> Result<Response<pb::StatusReply>, Status> {
        let m = self.raft.metrics().borrow().clone();
        let log = self.log.state();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, n)| pb::Member {
                id: *id,
                addr: n.addr.clone(),
                voter: voters.contains(id),
                matched: m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(id).copied().flatten())
                    .map(|l| l.index),
            })
            .collect();
        Ok(Response::new(pb::StatusReply {
            id: m.id,
            leader: m.current_leader,
            term: m.current_term,
            state: format!("{:?}", m.state),
            last_log_index: m.last_log_index,
            applied_index: m.last_applied.map(|l| l.index),
            members,
            epoch: log.epoch.0,
            earliest_version: log.earliest_version.0,
            last_version: log.last_version.0,
            cursors: log
                .cursors
                .iter()
                .map(|(k, c)| pb::Cursor {
                    mirror: k.clone(),
                    applied_version: c.applied_version.0,
                    needs_bootstrap: c.needs_bootstrap,
                    position_age_ms: if c.needs_bootstrap {
                        None
                    } else {
                        log.position_age_ms(c.applied_version)
                    },
                })
                .collect(),
            heartbeat: log.heartbeat.map(|(c, v)| pb::PrimaryHeartbeat {
                primary_clock_ms: c,
                latest_version: v.0,
            }),
            retention: Some(pb::RetentionRequest {
                max_bytes: log.retention.max_bytes,
                max_age_ms: log.retention.max_age_ms,
            }),
            held_bytes: log.held_bytes(),
            served_version: self.early.served().max(log.last_version).0,
            purged_last_version: log.purged_last.as_ref().map_or(0, |(v, _)| v.0),
            purged_last_digest: log
                .purged_last
                .as_ref()
                .map(|(_, d)| d.clone())
                .unwrap_or_default(),
            primary: log.primary.as_ref().map(|(e, p)| pb::PrimaryAt {
                id: p.id.clone(),
                addr: p.addr.clone(),
                data_url: p.data_url.clone(),
                epoch: e.0,
            }),
        }))
    }

    async fn init(&self, req: Request<pb::InitRequest>) -> Result<Response<pb::Empty>, Status> {
        let members: BTreeMap<NodeId, BasicNode> = req
            .into_inner()
            .members
            .into_iter()
            .map(|(id, addr)| (id, BasicNode::new(addr)))
            .collect();
        let members = if members.is_empty() {
            let m = self.raft.metrics().borrow().clone();
            return Err(Status::invalid_argument(format!(
                "name the first members, this node ({}) among them",
                m.id
            )));
        } else {
            members
        };
        self.raft
            .initialize(members)
            .await
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        Ok(Response::new(pb::Empty {}))
    }

    async fn add_node(
        &self,
        req: Request<pb::AddNodeRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let r = req.into_inner();
        if strait_auth::host_of(&r.addr).is_none() {
            return Err(Status::invalid_argument(format!(
                "{:?} is not a host:port address",
                r.addr
            )));
        }
        if r.id == 0 {
            return Err(Status::invalid_argument(
                "node ids start at 1 (0 names no node)",
            ));
        }
        // a learner first, so it catches up before it counts in the quorum
        self.raft
            .add_learner(r.id, BasicNode::new(r.addr), true)
            .await
            .map_err(|e| self.write_error(e))?;
        if !r.learner_only {
            self.raft
                .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([r.id])), false)
                .await
                .map_err(|e| self.write_error(e))?;
        }
        Ok(Response::new(pb::Empty {}))
    }

    async fn remove_node(
        &self,
        req: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let id = req.into_inner().id;
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        if membership.get_node(&id).is_none() {
            return Err(Status::not_found(format!("node {id} is not a member")));
        }
        if membership.voter_ids().any(|v| v == id) {
            self.raft
                .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
                .await
                .map_err(|e| self.write_error(e))?;
        }
        self.raft
            .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
            .await
            .map_err(|e| self.write_error(e))?;
        Ok(Response::new(pb::Empty {}))
    }
}

/// Stream the applied records after `after`, then follow the log as it grows (on a follower,
/// with the records its leader has applied as soon as this node holds them: [`Early`]). A
/// subscriber behind the purge point gets `truncated_earliest` and the stream ends.
async fn feed(
    log: ChangeLog,
    early: Early,
    after: Version,
    tx: tokio::sync::mpsc::Sender<Result<pb::SubscribeReply, Status>>,
) -> Result<(), Status> {
    let _reader = early.reader();
    let mut watch = log.watch();
    let mut early_watch = early.watch();
    let mut next = after
        .0
        .checked_add(1)
        .map(Version)
        .ok_or_else(|| Status::invalid_argument("after_version is the largest version"))?;
    let mut last_heartbeat = None;
    loop {
        let state = watch.borrow_and_update().clone();
        early_watch.borrow_and_update();
        if next < state.earliest_version {
            let _ = tx
                .send(Ok(pb::SubscribeReply {
                    kind: Some(pb::subscribe_reply::Kind::TruncatedEarliest(
                        state.earliest_version.0,
                    )),
                }))
                .await;
            return Ok(());
        }
        while next <= state.last_version {
            let log2 = log.clone();
            let from = next;
            let records = tokio::task::spawn_blocking(move || {
                log2.read(from, SUBSCRIBE_BATCH_RECORDS, SUBSCRIBE_BATCH_BYTES)
            })
            .await
            .map_err(|e| Status::internal(format!("read the log: {e}")))?
            .map_err(|e| Status::internal(format!("read the log: {e}")))?;
            if records.is_empty() {
                // purged between the state read and this read: report it on the next turn
                break;
            }
            let n = records.len() as u64;
            if !send_records(&tx, state.epoch, next, records).await {
                return Ok(());
            }
            next += n;
        }
        // records committed at the leader that the state machine has not applied yet
        if next > state.last_version {
            loop {
                let (epoch, records) =
                    early.read(next, SUBSCRIBE_BATCH_RECORDS, SUBSCRIBE_BATCH_BYTES);
                if records.is_empty() {
                    break;
                }
                let n = records.len() as u64;
                if !send_records(&tx, epoch, next, records).await {
                    return Ok(());
                }
                next += n;
            }
        }
        let heartbeat = match early.heartbeat() {
            Some(h) if state.heartbeat.is_none_or(|s| h.0 >= s.0) => Some(h),
            _ => state.heartbeat,
        };
        if heartbeat != last_heartbeat {
            if let Some((clock, latest)) = heartbeat {
                let hb = pb::SubscribeReply {
                    kind: Some(pb::subscribe_reply::Kind::Heartbeat(pb::PrimaryHeartbeat {
                        primary_clock_ms: clock,
                        latest_version: latest.0,
                    })),
                };
                if tx.send(Ok(hb)).await.is_err() {
                    return Ok(());
                }
            }
            last_heartbeat = heartbeat;
        }
        if next <= watch.borrow().last_version || early.has(next) {
            continue;
        }
        tokio::select! {
            r = watch.changed() => {
                if r.is_err() {
                    return Err(Status::unavailable("the node is shutting down"));
                }
            }
            r = early_watch.changed() => {
                if r.is_err() {
                    return Err(Status::unavailable("the node is shutting down"));
                }
            }
            _ = tokio::time::sleep(SUBSCRIBE_HEARTBEAT) => {}
            _ = tx.closed() => return Ok(()),
        }
    }
}

/// Send one batch; false when the subscriber is gone. Waits while the subscriber is behind:
/// flow control.
async fn send_records(
    tx: &tokio::sync::mpsc::Sender<Result<pb::SubscribeReply, Status>>,
    epoch: Epoch,
    first_version: Version,
    records: Vec<Vec<u8>>,
) -> bool {
    let batch = pb::SubscribeReply {
        kind: Some(pb::subscribe_reply::Kind::Records(pb::Records {
            epoch: epoch.0,
            first_version: first_version.0,
            records,
        })),
    };
    tx.send(Ok(batch)).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_heartbeat_clocks_are_refused() {
        let now = 1_764_000_000_000;
        assert!(check_heartbeat_clock(now, now).is_ok());
        assert!(check_heartbeat_clock(now + 3_600_000, now).is_ok());
        assert!(check_heartbeat_clock(now - HEARTBEAT_CLOCK_SKEW_MAX_MS, now).is_ok());
        // ten years ahead, zero, the largest reading: refused, no overflow
        assert!(check_heartbeat_clock(now + 10 * 365 * 86_400_000, now).is_err());
        assert!(check_heartbeat_clock(0, now).is_err());
        assert!(check_heartbeat_clock(u64::MAX, now).is_err());
    }

    #[test]
    fn a_caller_moves_only_the_cursors_it_owns() {
        use strait_auth::Roles;
        let primary = Caller::new(Roles::of(&[Role::Primary]), None);
        let named = Caller::new(Roles::of(&[Role::Mirror]), Some("b".into()));
        let token_only = Caller::new(Roles::of(&[Role::Mirror]), None);
        assert!(check_ack(Some(&primary), PRIMARY_CURSOR).is_ok());
        assert!(check_ack(Some(&named), "b").is_ok());
        assert!(check_ack(Some(&named), "c").is_err());
        assert!(check_ack(Some(&named), PRIMARY_CURSOR).is_err());
        assert!(check_ack(Some(&token_only), "c").is_ok());
        assert!(check_ack(Some(&token_only), PRIMARY_CURSOR).is_err());
    }
}
