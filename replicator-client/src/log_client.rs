//! A client of the replicator cluster that finds the leader by itself: the primary's shipper
//! and the mirrors use it for the calls only the leader takes (append, heartbeat, ack).
//!
//! A call goes to the node believed to lead. A node that does not lead answers UNAVAILABLE,
//! naming the leader when it knows it (`x-strait-leader`); the client follows that name, or
//! else tries the next configured address. Transient failures are retried with exponential
//! backoff (backon), a bounded number of times; refusals (`FAILED_PRECONDITION`,
//! `INVALID_ARGUMENT`) are returned at once.

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use parking_lot::Mutex;
use tonic::{Code, Status};

use strait_auth::{Conn, Credentials};
use strait_ids::Epoch;
use strait_proto::limits::REPLICATOR_MESSAGE_BYTES_MAX;
use strait_proto::replicator as pb;
use strait_proto::replicator::replicator_client::ReplicatorClient;
use strait_proto::replicator::{APPEND_HEADER, LEADER_HEADER};

/// How long one attempt of a call may take.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts of one call before its last error is returned.
pub const ATTEMPTS_MAX: usize = 8;

struct Target {
    addr: String,
    client: ReplicatorClient<Conn>,
}

/// The cluster, as a list of node addresses and the one believed to lead.
pub struct LogClient {
    creds: Credentials,
    targets: Mutex<Vec<Target>>,
    current: Mutex<usize>,
    attempts: usize,
}

fn connect(addr: &str, creds: &Credentials) -> Result<Target, Status> {
    let ch = crate::channel(addr, creds)
        .map_err(|e| Status::invalid_argument(format!("replicator address {addr:?}: {e}")))?;
    Ok(Target {
        addr: addr.to_string(),
        client: ReplicatorClient::new(ch)
            .max_decoding_message_size(REPLICATOR_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(REPLICATOR_MESSAGE_BYTES_MAX),
    })
}

/// Whether a failed call may succeed when tried again (elsewhere, or later).
pub fn transient(s: &Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Unknown
            | Code::Cancelled
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Internal
    )
}

/// Why an append was refused (`gap`, `overlap`, `stale-epoch`, `future-epoch`, `malformed`).
pub fn refusal(s: &Status) -> Option<&str> {
    s.metadata()
        .get(APPEND_HEADER)
        .and_then(|v| v.to_str().ok())
}

impl LogClient {
    /// A client of the nodes at `addrs` (`host:port`) presenting `creds`. Connections are
    /// made on first use.
    pub fn new(addrs: &[String], creds: &Credentials) -> Result<Self, Status> {
        if addrs.is_empty() {
            return Err(Status::invalid_argument("no replicator address given"));
        }
        let targets = addrs
            .iter()
            .map(|a| connect(a, creds))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(LogClient {
            creds: creds.clone(),
            targets: Mutex::new(targets),
            current: Mutex::new(0),
            attempts: ATTEMPTS_MAX,
        })
    }

    /// Give up on a call after `n` attempts (at least 1).
    pub fn with_attempts(mut self, n: usize) -> Self {
        self.attempts = n.max(1);
        self
    }

    /// What this client presents to the nodes.
    pub fn credentials(&self) -> &Credentials {
        &self.creds
    }

    /// The address of the node calls go to now.
    pub fn current_addr(&self) -> String {
        let i = *self.current.lock();
        self.targets.lock()[i].addr.clone()
    }

    fn pick(&self) -> (usize, ReplicatorClient<Conn>) {
        let i = *self.current.lock();
        (i, self.targets.lock()[i].client.clone())
    }

    /// After `s` from target `i`: move to the named leader, or to the next address.
    fn redirect(&self, i: usize, s: &Status) {
        let hint = s
            .metadata()
            .get(LEADER_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once('@'))
            .map(|(_, addr)| addr.to_string());
        let mut cur = self.current.lock();
        if *cur != i {
            return; // another call already moved on
        }
        let mut targets = self.targets.lock();
        if let Some(addr) = hint {
            if let Some(j) = targets.iter().position(|t| t.addr == addr) {
                *cur = j;
                return;
            }
            // a leader this client was not told about: it joined the cluster later
            if let Ok(t) = connect(&addr, &self.creds) {
                targets.push(t);
                *cur = targets.len() - 1;
                return;
            }
        }
        *cur = (i + 1) % targets.len();
    }

    /// Run `call` against the leader, following redirections and retrying transient
    /// failures with backoff.
    pub async fn leader_call<T, F, Fut>(&self, what: &str, call: F) -> Result<T, Status>
    where
        F: Fn(ReplicatorClient<Conn>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(5))
            .with_max_delay(Duration::from_millis(500))
            .with_max_times(self.attempts.saturating_sub(1))
            .with_jitter();
        let attempt = || async {
            let (i, client) = self.pick();
            let res = match tokio::time::timeout(ATTEMPT_TIMEOUT, call(client)).await {
                Ok(r) => r.map(|r| r.into_inner()),
                Err(_) => Err(Status::deadline_exceeded(format!(
                    "{what}: no answer from {} within {ATTEMPT_TIMEOUT:?}",
                    self.targets.lock()[i].addr
                ))),
            };
            if let Err(s) = &res {
                if transient(s) {
                    self.redirect(i, s);
                }
            }
            res
        };
        attempt
            .retry(backoff)
            .sleep(tokio::time::sleep)
            .when(transient)
            .await
    }

    /// Any node's status (the first that answers, starting with the believed leader).
    pub async fn status(&self) -> Result<pb::StatusReply, Status> {
        self.leader_call(
            "status",
            |mut c| async move { c.status(pb::Empty {}).await },
        )
        .await
    }

    /// The leader's own status. [`Self::status`] takes any node's answer, and a node that
    /// answers is not redirected, so a client that only asks for the status would stay with
    /// a node that lost the leadership; here the nodes are asked in turn, from the current
    /// one, until one answers as the leader, and calls go there from then on. Err when none
    /// does (an election under way, no quorum).
    pub async fn leader_status(&self) -> Result<pb::StatusReply, Status> {
        let n = self.targets.lock().len();
        let start = *self.current.lock();
        let mut last = None;
        for k in 0..n {
            let i = (start + k) % n;
            let (addr, mut client) = {
                let t = &self.targets.lock()[i];
                (t.addr.clone(), t.client.clone())
            };
            match tokio::time::timeout(ATTEMPT_TIMEOUT, client.status(pb::Empty {})).await {
                Ok(Ok(r)) => {
                    let st = r.into_inner();
                    if st.leader == Some(st.id) {
                        *self.current.lock() = i;
                        return Ok(st);
                    }
                    last = Some(format!(
                        "node {} at {addr} is not the leader (leader: {})",
                        st.id,
                        st.leader.map_or("none known".into(), |l| l.to_string())
                    ));
                }
                Ok(Err(s)) => last = Some(format!("{addr}: {}", s.message())),
                Err(_) => last = Some(format!("{addr}: no answer within {ATTEMPT_TIMEOUT:?}")),
            }
        }
        Err(Status::unavailable(format!(
            "no replicator node answered as the leader; last: {}",
            last.unwrap_or_default()
        )))
    }

    pub async fn append(&self, req: pb::AppendRequest) -> Result<pb::AppendReply, Status> {
        self.leader_call("append", |mut c| {
            let req = req.clone();
            async move { c.append(req).await }
        })
        .await
    }

    pub async fn heartbeat(&self, req: pb::HeartbeatRequest) -> Result<(), Status> {
        self.leader_call("heartbeat", |mut c| async move { c.heartbeat(req).await })
            .await
            .map(|_| ())
    }

    pub async fn ack(&self, req: pb::AckRequest) -> Result<(), Status> {
        self.leader_call("ack", |mut c| {
            let req = req.clone();
            async move { c.ack(req).await }
        })
        .await
        .map(|_| ())
    }

    pub async fn bump_epoch(&self, epoch: Epoch) -> Result<pb::BumpEpochReply, Status> {
        self.bump_epoch_naming(epoch, None).await
    }

    /// Raise the epoch to `epoch`, naming its primary (a promoted mirror names itself): the
    /// other mirrors read it from the status and forward their writes there.
    pub async fn bump_epoch_naming(
        &self,
        epoch: Epoch,
        primary: Option<pb::PrimaryAt>,
    ) -> Result<pb::BumpEpochReply, Status> {
        self.leader_call("bump epoch", |mut c| {
            let primary = primary.clone();
            async move {
                c.bump_epoch(pb::BumpEpochRequest {
                    epoch: epoch.0,
                    primary,
                })
                .await
            }
        })
        .await
    }

    pub async fn set_retention(&self, req: pb::RetentionRequest) -> Result<(), Status> {
        self.leader_call("set retention", |mut c| async move {
            c.set_retention(req).await
        })
        .await
        .map(|_| ())
    }

    /// Drop the cursor of the mirror named `mirror` (a mirror taken out of service).
    pub async fn forget_mirror(&self, mirror: &str) -> Result<(), Status> {
        let req = pb::ForgetMirrorRequest {
            mirror: mirror.to_string(),
        };
        self.leader_call("forget mirror", |mut c| {
            let req = req.clone();
            async move { c.forget_mirror(req).await }
        })
        .await
        .map(|_| ())
    }

    pub async fn add_node(&self, req: pb::AddNodeRequest) -> Result<(), Status> {
        self.leader_call("add node", |mut c| {
            let req = req.clone();
            async move { c.add_node(req).await }
        })
        .await
        .map(|_| ())
    }

    pub async fn remove_node(&self, id: u64) -> Result<(), Status> {
        self.leader_call("remove node", |mut c| async move {
            c.remove_node(pb::RemoveNodeRequest { id }).await
        })
        .await
        .map(|_| ())
    }
}
