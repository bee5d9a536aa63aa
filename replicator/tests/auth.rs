//! Who may call a replicator node: every call without credentials, with a token the node does
//! not accept, or with a role its method does not admit is refused before it reaches Raft,
//! and changes nothing; over mutual TLS the client certificate names the role.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use strait_auth::certs::{issue, new_ca, Pem};
use strait_auth::{ClientTls, Conn, Credentials, Role, Tokens};
use strait_replicator::node::{Node, NodeAuth, NodeConfig};
use strait_replicator::pb;
use strait_replicator::pb::replicator_client::ReplicatorClient;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic::Code;

const PRIMARY: &str = "auth-test-primary-token";
const MIRROR: &str = "auth-test-mirror-token-0";
const ADMIN: &str = "auth-test-admin-token-00";
const PEER: &str = "auth-test-peer-token-000";

/// A port below the ephemeral range: a node stopped and started again binds it once more,
/// and an outgoing connection of another test can never have taken it meanwhile.
fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], strait_devkit::free_port().unwrap()))
}

fn client(addr: SocketAddr, creds: &Credentials) -> ReplicatorClient<Conn> {
    ReplicatorClient::new(strait_replicator::network::channel(&addr.to_string(), creds).unwrap())
}

fn as_token(t: &str) -> Credentials {
    Credentials::token(t).unwrap()
}

fn append(first: u64, recs: &[&str]) -> pb::AppendRequest {
    pb::AppendRequest {
        epoch: 0,
        first_version: first,
        records: recs.iter().map(|r| r.as_bytes().to_vec()).collect(),
    }
}

/// A one-node cluster at `addr` with `auth`, formed by `admin`.
async fn one_node(dir: &std::path::Path, auth: NodeAuth, admin: &Credentials) -> Node {
    let addr = free_addr();
    let mut cfg = NodeConfig::new(1, addr, dir.join("node1"));
    cfg.auth = auth;
    let node = Node::start(cfg).await.unwrap();
    let members = [(1u64, addr.to_string())].into_iter().collect();
    client(addr, admin)
        .init(pb::InitRequest { members })
        .await
        .unwrap();
    let start = Instant::now();
    while node.raft.metrics().borrow().current_leader != Some(1) {
        assert!(start.elapsed() < Duration::from_secs(20), "no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    node
}

async fn last_version(addr: SocketAddr) -> u64 {
    client(addr, &as_token(ADMIN))
        .status(pb::Empty {})
        .await
        .unwrap()
        .into_inner()
        .last_version
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_needs_a_token_of_a_role_its_method_admits() {
    let dir = tempfile::tempdir().unwrap();
    let auth = NodeAuth::tokens(&[
        (Role::Primary, PRIMARY),
        (Role::Mirror, MIRROR),
        (Role::Admin, ADMIN),
        (Role::Peer, PEER),
    ])
    .unwrap();
    let node = one_node(dir.path(), auth, &as_token(ADMIN)).await;
    let addr = node.addr;

    // no credentials, or a token the node does not accept: UNAUTHENTICATED, whatever the call
    let none = Credentials::default();
    let wrong = as_token("auth-test-wrong-token-00");
    for creds in [&none, &wrong] {
        let mut c = client(addr, creds);
        let s = c.append(append(1, &["x"])).await.unwrap_err();
        assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
        let s = c.status(pb::Empty {}).await.unwrap_err();
        assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
        let s = c
            .subscribe(pb::SubscribeRequest { after_version: 0 })
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    }

    // known tokens of roles a method does not admit: PERMISSION_DENIED, naming who may
    let mut mirror = client(addr, &as_token(MIRROR));
    let s = mirror.append(append(1, &["x"])).await.unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    assert!(s.message().contains("primary"), "{}", s.message());
    let s = mirror
        .bump_epoch(pb::BumpEpochRequest {
            epoch: 9,
            primary: None,
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    let s = mirror
        .set_retention(pb::RetentionRequest {
            max_bytes: 1,
            max_age_ms: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    let s = mirror
        .ack(pb::AckRequest {
            mirror: "@primary".into(),
            applied_version: 1_000,
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    let mut primary = client(addr, &as_token(PRIMARY));
    let s = primary
        .add_node(pb::AddNodeRequest {
            id: 9,
            addr: "127.0.0.1:1".into(),
            learner_only: true,
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    let s = primary
        .raft(pb::RaftRequest {
            kind: 2,
            payload: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    let mut admin = client(addr, &as_token(ADMIN));
    let s = admin.append(append(1, &["x"])).await.unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    let mut peer = client(addr, &as_token(PEER));
    let s = peer.append(append(1, &["x"])).await.unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");

    // none of that changed anything
    let st = admin.status(pb::Empty {}).await.unwrap().into_inner();
    assert_eq!((st.last_version, st.epoch), (0, 0));
    assert!(st.cursors.is_empty(), "{:?}", st.cursors);
    assert!(st.retention.is_none_or(|r| r.max_bytes != 1));
    assert_eq!(st.members.len(), 1);

    // the right roles are served
    let r = primary
        .append(append(1, &["a", "b"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.last_version, 2);
    mirror
        .ack(pb::AckRequest {
            mirror: "b".into(),
            applied_version: 1,
        })
        .await
        .unwrap();
    mirror
        .subscribe(pb::SubscribeRequest { after_version: 0 })
        .await
        .unwrap();
    admin
        .set_retention(pb::RetentionRequest {
            max_bytes: 1 << 30,
            max_age_ms: 86_400_000,
        })
        .await
        .unwrap();
    assert_eq!(last_version(addr).await, 2);
    node.shutdown().await;
}

fn pki() -> (Pem, [Pem; 4]) {
    let ca = new_ca("auth test CA", 2).unwrap();
    let hosts = ["127.0.0.1".to_string(), "localhost".to_string()];
    let c = |name: &str, roles: &[Role]| issue(&ca, name, roles, &hosts, 1).unwrap();
    let node = c("node-1", &[Role::Peer]);
    let primary = c("primary-a", &[Role::Primary]);
    let mirror = c("b", &[Role::Mirror]);
    let admin = c("operator", &[Role::Admin]);
    (ca, [node, primary, mirror, admin])
}

fn cert_creds(ca: &Pem, who: Option<&Pem>) -> Credentials {
    Credentials::new(
        None,
        Some(ClientTls {
            ca_pem: ca.cert.clone().into_bytes(),
            identity: who.map(|p| (p.cert.clone().into_bytes(), p.key.clone().into_bytes())),
            domain: None,
        }),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mutual_tls_the_client_certificate_names_the_role() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, [node_pem, primary_pem, mirror_pem, admin_pem]) = pki();
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&node_pem.cert, &node_pem.key))
        .client_ca_root(Certificate::from_pem(&ca.cert));
    let auth = NodeAuth {
        tokens: Tokens::new(),
        tls: Some(tls),
        mutual_tls: true,
        peer_credentials: cert_creds(&ca, Some(&node_pem)),
    };
    let admin = cert_creds(&ca, Some(&admin_pem));
    let node = one_node(dir.path(), auth, &admin).await;
    let addr = node.addr;

    // plain text, and TLS without a client certificate, do not get a call through
    let s = client(addr, &as_token(ADMIN))
        .status(pb::Empty {})
        .await
        .unwrap_err();
    assert_ne!(s.code(), Code::Ok, "{s:?}");
    let s = client(addr, &cert_creds(&ca, None))
        .status(pb::Empty {})
        .await
        .unwrap_err();
    assert_ne!(s.code(), Code::Ok, "{s:?}");
    // a certificate from another CA neither
    let (other_ca, [_, other_primary, ..]) = pki();
    let s = client(addr, &cert_creds(&other_ca, Some(&other_primary)))
        .append(append(1, &["x"]))
        .await
        .unwrap_err();
    assert_ne!(s.code(), Code::Ok, "{s:?}");

    // the mirror's certificate: no appends, and only its own cursor (its CN, "b")
    let mut mirror = client(addr, &cert_creds(&ca, Some(&mirror_pem)));
    let s = mirror.append(append(1, &["x"])).await.unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    let s = mirror
        .ack(pb::AckRequest {
            mirror: "c".into(),
            applied_version: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    mirror
        .ack(pb::AckRequest {
            mirror: "b".into(),
            applied_version: 0,
        })
        .await
        .unwrap();

    // the primary's certificate appends
    let r = client(addr, &cert_creds(&ca, Some(&primary_pem)))
        .append(append(1, &["a"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.last_version, 1);
    let st = client(addr, &admin)
        .status(pb::Empty {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.last_version, 1);
    assert_eq!(
        st.cursors
            .iter()
            .map(|c| c.mirror.as_str())
            .collect::<Vec<_>>(),
        ["b"]
    );
    node.shutdown().await;
}

#[tokio::test]
async fn a_node_without_any_way_to_authenticate_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = NodeConfig::new(1, free_addr(), dir.path().join("n"));
    let e = Node::start(cfg).await.err().expect("refused");
    assert!(e.to_string().contains("authenticate"), "{e:#}");
}
