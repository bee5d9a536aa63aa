//! Raft messages between nodes over gRPC: openraft's requests and replies, postcard-encoded,
//! in the `Raft` call of the replicator service.

use std::collections::BTreeMap;
use std::sync::Arc;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use strait_auth::{Conn, Credentials};
use strait_proto::limits::RAFT_MESSAGE_BYTES_MAX;

use crate::pb;
use crate::pb::replicator_client::ReplicatorClient;
use crate::{NodeId, TypeConfig};

pub const KIND_APPEND: u32 = 1;
pub const KIND_VOTE: u32 = 2;
pub const KIND_SNAPSHOT: u32 = 3;

pub use strait_replicator_client::channel;

/// Addresses by which this node reaches some peers, instead of the addresses in the
/// membership (which every node shares): a region that reaches the others through a gateway,
/// or a test's fault proxy on the link out of a node.
pub type PeerAddrs = Arc<BTreeMap<NodeId, String>>;

/// The address this node uses for `id`, whose membership address is `member_addr`.
pub fn peer_addr<'a>(peers: &'a PeerAddrs, id: NodeId, member_addr: &'a str) -> &'a str {
    peers.get(&id).map(String::as_str).unwrap_or(member_addr)
}

/// Makes a connection per peer.
#[derive(Clone, Default)]
pub struct Network {
    pub peers: PeerAddrs,
    /// What this node presents to its peers.
    pub creds: Credentials,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        let addr = peer_addr(&self.peers, target, &node.addr).to_string();
        Peer {
            target,
            client: channel(&addr, &self.creds).ok().map(|c| {
                ReplicatorClient::new(c)
                    .max_decoding_message_size(RAFT_MESSAGE_BYTES_MAX)
                    .max_encoding_message_size(RAFT_MESSAGE_BYTES_MAX)
            }),
            addr,
        }
    }
}

pub struct Peer {
    target: NodeId,
    addr: String,
    client: Option<ReplicatorClient<Conn>>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

impl Peer {
    /// Send one Raft message; the reply is the remote `Result`, already decoded.
    async fn send<Req, Resp, E>(
        &mut self,
        kind: u32,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let Some(client) = self.client.as_mut() else {
            return Err(RPCError::Unreachable(Unreachable::new(&Msg(format!(
                "node {} has an invalid address {:?}",
                self.target, self.addr
            )))));
        };
        let payload = postcard::to_allocvec(req)
            .map_err(|e| RPCError::Network(NetworkError::new(&Msg(e.to_string()))))?;
        let mut r = tonic::Request::new(pb::RaftRequest { kind, payload });
        r.set_timeout(option.hard_ttl());
        let reply = match client.raft(r).await {
            Ok(r) => r.into_inner(),
            Err(s) => {
                let e = Msg(format!(
                    "node {} at {}: {}",
                    self.target,
                    self.addr,
                    s.message()
                ));
                return Err(match s.code() {
                    tonic::Code::Unavailable => RPCError::Unreachable(Unreachable::new(&e)),
                    _ => RPCError::Network(NetworkError::new(&e)),
                });
            }
        };
        let res: Result<Resp, RaftError<NodeId, E>> = postcard::from_bytes(&reply.payload)
            .map_err(|e| {
                RPCError::Network(NetworkError::from(AnyError::error(format!(
                    "decode the reply of node {}: {e}",
                    self.target
                ))))
            })?;
        res.map_err(|e| RPCError::RemoteError(openraft::error::RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.send(KIND_APPEND, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.send(KIND_SNAPSHOT, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.send(KIND_VOTE, &rpc, &option).await
    }
}
