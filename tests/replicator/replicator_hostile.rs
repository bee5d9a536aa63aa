//! Hostile input to a replicator node (`strait replicator`, a real process): malformed,
//! oversize and random messages, stale and future epochs, forged cursors, wrong roles and no
//! credentials, on the client, admin and Raft methods. Each gets a clear status, nothing
//! changes that the call was refused for, and the node never panics. The tests print how
//! many cases each class had and what they got back.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use crate::support::raw_grpc;
use crate::support::replicator::{
    Cluster, ADMIN_TOKEN, MIRROR_TOKEN, MIRROR_TOKEN_2, PEER_TOKEN, PRIMARY_TOKEN,
};
use crate::support::wait_until;
use prost::Message;
use strait_auth::{policy, Credentials, Role};
use strait_proto::replicator as pb;
use tonic::Code;

/// The token of `role` at the test cluster; a mount has none at a replicator, so the harness
/// sends one the node does not know.
fn token_of(role: Role) -> &'static str {
    match role {
        Role::Primary => PRIMARY_TOKEN,
        Role::Mirror => MIRROR_TOKEN,
        Role::Admin => ADMIN_TOKEN,
        Role::Peer => PEER_TOKEN,
        Role::Mount => "a-mount-token-the-node-does-not-know",
    }
}

fn as_role(role: Role) -> Credentials {
    Credentials::token(token_of(role)).expect("token")
}

const SERVICE: &str = "/strait.replicator.v1.Replicator";

/// The node's state as far as any call could change it.
#[derive(Debug, PartialEq)]
struct State {
    epoch: u64,
    last_version: u64,
    earliest_version: u64,
    cursors: Vec<(String, u64)>,
    retention: Option<(u64, u64)>,
    members: Vec<(u64, String, bool)>,
    heartbeat: Option<(u64, u64)>,
}

async fn state(addr: SocketAddr) -> (State, u64) {
    let ch = raw_grpc::channel(&addr.to_string(), &as_role(Role::Admin));
    let st = pb::replicator_client::ReplicatorClient::new(ch)
        .status(pb::Empty {})
        .await
        .expect("status")
        .into_inner();
    (
        State {
            epoch: st.epoch,
            last_version: st.last_version,
            earliest_version: st.earliest_version,
            cursors: st
                .cursors
                .iter()
                .map(|c| (c.mirror.clone(), c.applied_version))
                .collect(),
            retention: st.retention.map(|r| (r.max_bytes, r.max_age_ms)),
            members: st
                .members
                .iter()
                .map(|m| (m.id, m.addr.clone(), m.voter))
                .collect(),
            heartbeat: st.heartbeat.map(|h| (h.primary_clock_ms, h.latest_version)),
        },
        st.last_log_index.unwrap_or(0),
    )
}

/// What each class of input got back: cases, and codes with their counts.
#[derive(Default)]
struct Tally(BTreeMap<&'static str, BTreeMap<String, usize>>);

impl Tally {
    fn note(&mut self, class: &'static str, got: &Result<Option<Vec<u8>>, tonic::Status>) {
        let code = match got {
            Ok(_) => "OK".to_string(),
            Err(s) => format!("{:?}", s.code()),
        };
        *self.0.entry(class).or_default().entry(code).or_default() += 1;
    }

    fn print(&self, title: &str) {
        println!("\n{title}");
        println!("| class | cases | answered |");
        println!("|---|---|---|");
        for (class, codes) in &self.0 {
            let n: usize = codes.values().sum();
            let got: Vec<String> = codes.iter().map(|(c, k)| format!("{c} {k}")).collect();
            println!("| {class} | {n} | {} |", got.join(", "));
        }
    }
}

async fn call(
    addr: SocketAddr,
    creds: &Credentials,
    method: &str,
    body: Vec<u8>,
) -> Result<Option<Vec<u8>>, tonic::Status> {
    let ch = raw_grpc::channel(&addr.to_string(), creds);
    raw_grpc::call(
        ch,
        &format!("{SERVICE}/{method}"),
        body,
        method == "Subscribe",
    )
    .await
}

fn append(epoch: u64, first: u64, records: Vec<Vec<u8>>) -> Vec<u8> {
    pb::AppendRequest {
        epoch,
        first_version: first,
        records,
    }
    .encode_to_vec()
}

/// A one-node cluster with a leader, at epoch 2 with 3 records, a cursor and a heartbeat.
fn cluster(work: &std::path::Path, rt: &tokio::runtime::Runtime) -> (Cluster, SocketAddr) {
    let c = Cluster::start(work, 1);
    let addr = c.direct()[0];
    rt.block_on(async {
        c.wait_leader(Duration::from_secs(30)).await;
        let p = as_role(Role::Primary);
        let bump = pb::BumpEpochRequest {
            epoch: 2,
            primary: None,
        }
        .encode_to_vec();
        call(addr, &p, "BumpEpoch", bump).await.expect("bump");
        let recs = vec![b"one".to_vec(), b"two".to_vec(), b"three".to_vec()];
        call(addr, &p, "Append", append(2, 1, recs))
            .await
            .expect("append");
        let hb = pb::HeartbeatRequest {
            epoch: 2,
            primary_clock_ms: strait_fs_core::clock::now_ms(),
            latest_version: 3,
        };
        call(addr, &p, "Heartbeat", hb.encode_to_vec())
            .await
            .expect("heartbeat");
        let ack = pb::AckRequest {
            mirror: "b".into(),
            applied_version: 2,
        };
        call(addr, &as_role(Role::Mirror), "Ack", ack.encode_to_vec())
            .await
            .expect("ack");
    });
    (c, addr)
}

#[test]
fn malformed_and_hostile_calls_get_clear_statuses_and_change_nothing() {
    let work = tempfile::tempdir().unwrap();
    let rt = crate::support::runtime();
    let (cluster, addr) = cluster(work.path(), &rt);
    let mut tally = Tally::default();
    let (before, log_index_before) = rt.block_on(state(addr));
    assert_eq!((before.epoch, before.last_version), (2, 3));

    // each case: class, role, method, message, the code it must get
    let p = Role::Primary;
    let big_record = vec![7u8; strait_proto::limits::APPEND_BYTES_MAX + 1];
    let oversize_record = vec![7u8; strait_proto::limits::APPEND_REQUEST_BYTES_MAX + 1];
    let tiny: Vec<Vec<u8>> = (0..=strait_proto::limits::APPEND_RECORDS_MAX)
        .map(|_| vec![1u8])
        .collect();
    let hb = |epoch, clock, latest| {
        pb::HeartbeatRequest {
            epoch,
            primary_clock_ms: clock,
            latest_version: latest,
        }
        .encode_to_vec()
    };
    let ack = |name: &str, v| {
        pb::AckRequest {
            mirror: name.into(),
            applied_version: v,
        }
        .encode_to_vec()
    };
    // refused before they are proposed to Raft: Raft's log does not grow
    let before_raft: Vec<(&str, Role, &str, Vec<u8>, Code)> = vec![
        (
            "append: malformed batch",
            p,
            "Append",
            append(2, 4, vec![]),
            Code::InvalidArgument,
        ),
        (
            "append: malformed batch",
            p,
            "Append",
            append(2, 4, tiny),
            Code::InvalidArgument,
        ),
        (
            "append: malformed batch",
            p,
            "Append",
            append(2, 4, vec![big_record]),
            Code::InvalidArgument,
        ),
        (
            "append: malformed batch",
            p,
            "Append",
            append(2, 0, vec![b"x".to_vec()]),
            Code::InvalidArgument,
        ),
        (
            "append: malformed batch",
            p,
            "Append",
            append(2, u64::MAX, vec![b"x".to_vec(), b"y".to_vec()]),
            Code::InvalidArgument,
        ),
        (
            "oversize message",
            p,
            "Append",
            append(2, 4, vec![oversize_record]),
            Code::ResourceExhausted,
        ),
        (
            "oversize message",
            Role::Mirror,
            "Ack",
            ack(&"m".repeat(70 << 10), 1),
            Code::ResourceExhausted,
        ),
        (
            "oversize message",
            Role::Admin,
            "ForgetMirror",
            pb::ForgetMirrorRequest {
                mirror: "f".repeat(100 << 10),
            }
            .encode_to_vec(),
            Code::ResourceExhausted,
        ),
        // gRPC's code for a message that does not parse is INTERNAL (tonic, as the spec says)
        (
            "malformed protobuf",
            Role::Peer,
            "Raft",
            vec![0u8; 1 << 20],
            Code::Internal,
        ),
        (
            "heartbeat: impossible clock",
            p,
            "Heartbeat",
            hb(2, 0, 3),
            Code::InvalidArgument,
        ),
        (
            "heartbeat: impossible clock",
            p,
            "Heartbeat",
            hb(2, u64::MAX, 3),
            Code::InvalidArgument,
        ),
        (
            "heartbeat: impossible clock",
            p,
            "Heartbeat",
            hb(2, strait_fs_core::clock::now_ms() + 2 * 86_400_000, 3),
            Code::InvalidArgument,
        ),
        (
            "cursor: forged or malformed",
            Role::Mirror,
            "Ack",
            ack("", 1),
            Code::InvalidArgument,
        ),
        (
            "cursor: forged or malformed",
            Role::Mirror,
            "Ack",
            ack(&"n".repeat(257), 1),
            Code::InvalidArgument,
        ),
        (
            "cursor: forged or malformed",
            Role::Mirror,
            "Ack",
            ack("@primary", 3),
            Code::PermissionDenied,
        ),
        (
            "admin: bad request",
            Role::Admin,
            "SetRetention",
            pb::RetentionRequest {
                max_bytes: 0,
                max_age_ms: 1,
            }
            .encode_to_vec(),
            Code::InvalidArgument,
        ),
        (
            "admin: bad request",
            Role::Admin,
            "SetRetention",
            pb::RetentionRequest {
                max_bytes: 1,
                max_age_ms: 0,
            }
            .encode_to_vec(),
            Code::InvalidArgument,
        ),
        // a promotion that names no usable primary raises nothing, though its epoch is new
        (
            "epoch: bad primary",
            p,
            "BumpEpoch",
            pb::BumpEpochRequest {
                epoch: 3,
                primary: Some(pb::PrimaryAt {
                    id: "c".into(),
                    addr: "no-port".into(),
                    ..Default::default()
                }),
            }
            .encode_to_vec(),
            Code::InvalidArgument,
        ),
        (
            "epoch: bad primary",
            p,
            "BumpEpoch",
            pb::BumpEpochRequest {
                epoch: 3,
                primary: Some(pb::PrimaryAt {
                    id: "c".repeat(5000),
                    addr: "127.0.0.1:7440".into(),
                    ..Default::default()
                }),
            }
            .encode_to_vec(),
            Code::InvalidArgument,
        ),
        (
            "epoch: bad primary",
            p,
            "BumpEpoch",
            pb::BumpEpochRequest {
                epoch: 3,
                primary: Some(pb::PrimaryAt {
                    id: "c".into(),
                    addr: "127.0.0.1:7440".into(),
                    data_url: "s3://x\n?endpoint=evil".into(),
                    epoch: 0,
                }),
            }
            .encode_to_vec(),
            Code::InvalidArgument,
        ),
        (
            "admin: bad request",
            Role::Admin,
            "ForgetMirror",
            pb::ForgetMirrorRequest {
                mirror: String::new(),
            }
            .encode_to_vec(),
            Code::InvalidArgument,
        ),
        (
            "admin: bad request",
            Role::Admin,
            "Init",
            pb::InitRequest::default().encode_to_vec(),
            Code::InvalidArgument,
        ),
        (
            "admin: bad request",
            Role::Admin,
            "AddNode",
            pb::AddNodeRequest {
                id: 5,
                addr: "nowhere".into(),
                learner_only: true,
            }
            .encode_to_vec(),
            Code::InvalidArgument,
        ),
        (
            "admin: bad request",
            Role::Admin,
            "AddNode",
            pb::AddNodeRequest {
                id: 5,
                addr: "10.0.0.1:".into(),
                learner_only: true,
            }
            .encode_to_vec(),
            Code::InvalidArgument,
        ),
        (
            "admin: bad request",
            Role::Admin,
            "AddNode",
            pb::AddNodeRequest {
                id: 0,
                addr: "127.0.0.1:1".into(),
                learner_only: true,
            }
            .encode_to_vec(),
            Code::InvalidArgument,
        ),
        (
            "admin: bad request",
            Role::Admin,
            "RemoveNode",
            pb::RemoveNodeRequest { id: 99 }.encode_to_vec(),
            Code::NotFound,
        ),
        (
            "raft: malformed message",
            Role::Peer,
            "Raft",
            pb::RaftRequest {
                kind: 99,
                payload: vec![1, 2, 3],
            }
            .encode_to_vec(),
            Code::InvalidArgument,
        ),
        (
            "raft: malformed message",
            Role::Peer,
            "Raft",
            pb::RaftRequest {
                kind: 1,
                payload: vec![0xff; 64],
            }
            .encode_to_vec(),
            Code::InvalidArgument,
        ),
        (
            "raft: malformed message",
            Role::Peer,
            "Raft",
            pb::RaftRequest {
                kind: 2,
                payload: vec![],
            }
            .encode_to_vec(),
            Code::InvalidArgument,
        ),
        (
            "raft: malformed message",
            Role::Peer,
            "Raft",
            pb::RaftRequest {
                kind: 3,
                payload: vec![9; 17],
            }
            .encode_to_vec(),
            Code::InvalidArgument,
        ),
        (
            "malformed protobuf",
            p,
            "Append",
            vec![0xff, 0xff, 0xff, 0xff],
            Code::Internal,
        ),
        (
            "malformed protobuf",
            Role::Admin,
            "SetRetention",
            vec![0x0a, 0x80],
            Code::Internal,
        ),
    ];
    for (class, role, method, body, want) in before_raft {
        let got = rt.block_on(call(addr, &as_role(role), method, body));
        tally.note(class, &got);
        let code = got.as_ref().err().map(|s| s.code());
        assert_eq!(code, Some(want), "{class}: {method} as {role}: {got:?}");
        if let Err(s) = &got {
            assert!(!s.message().is_empty(), "{class}: {method}: no message");
        }
    }
    let (after, log_index) = rt.block_on(state(addr));
    assert_eq!(after, before, "refused calls changed the log's state");
    assert_eq!(
        log_index, log_index_before,
        "calls refused before Raft still made log entries"
    );

    // refused by the log itself, as it applies them: the log's state stays as it was
    let by_the_log: Vec<(&str, Role, &str, Vec<u8>)> = vec![
        (
            "append: gap",
            p,
            "Append",
            append(2, 9, vec![b"x".to_vec()]),
        ),
        // version 3 is the log's last, which it keeps (a purged version cannot be compared)
        (
            "append: overlap",
            p,
            "Append",
            append(2, 3, vec![b"not three".to_vec()]),
        ),
        (
            "epoch: stale",
            p,
            "Append",
            append(1, 4, vec![b"x".to_vec()]),
        ),
        (
            "epoch: future",
            p,
            "Append",
            append(3, 4, vec![b"x".to_vec()]),
        ),
        (
            "epoch: stale",
            p,
            "Heartbeat",
            hb(1, strait_fs_core::clock::now_ms(), 3),
        ),
        (
            "epoch: future",
            p,
            "Heartbeat",
            hb(7, strait_fs_core::clock::now_ms(), 3),
        ),
        (
            "epoch: stale",
            p,
            "BumpEpoch",
            pb::BumpEpochRequest {
                epoch: 2,
                primary: None,
            }
            .encode_to_vec(),
        ),
        (
            "epoch: stale",
            p,
            "BumpEpoch",
            pb::BumpEpochRequest {
                epoch: 1,
                primary: None,
            }
            .encode_to_vec(),
        ),
        (
            "epoch: stale",
            Role::Admin,
            "BumpEpoch",
            pb::BumpEpochRequest {
                epoch: 0,
                primary: None,
            }
            .encode_to_vec(),
        ),
        (
            "admin: bad request",
            Role::Admin,
            "ForgetMirror",
            pb::ForgetMirrorRequest {
                mirror: "never-was".into(),
            }
            .encode_to_vec(),
        ),
        (
            "admin: bad request",
            Role::Admin,
            "RemoveNode",
            pb::RemoveNodeRequest { id: 1 }.encode_to_vec(),
        ),
        (
            "admin: bad request",
            Role::Admin,
            "Init",
            pb::InitRequest {
                members: [(1u64, "127.0.0.1:1".to_string())].into_iter().collect(),
            }
            .encode_to_vec(),
        ),
    ];
    for (class, role, method, body) in by_the_log {
        let got = rt.block_on(call(addr, &as_role(role), method, body));
        tally.note(class, &got);
        let s = got
            .as_ref()
            .err()
            .unwrap_or_else(|| panic!("{class}: {method} was served"));
        assert!(
            matches!(s.code(), Code::FailedPrecondition | Code::InvalidArgument),
            "{class}: {method}: {s:?}"
        );
        assert!(!s.message().is_empty());
    }
    let (after, _) = rt.block_on(state(addr));
    assert_eq!(after, before, "calls the log refused changed its state");

    // a cursor moved past the log's end is held at the end, never beyond (nor back)
    let got = rt.block_on(call(
        addr,
        &as_role(Role::Mirror),
        "Ack",
        ack("b", u64::MAX),
    ));
    tally.note("cursor: forged or malformed", &got);
    assert!(got.is_ok(), "{got:?}");
    let got = rt.block_on(call(addr, &as_role(Role::Mirror), "Ack", ack("b", 1)));
    tally.note("cursor: forged or malformed", &got);
    let (after, _) = rt.block_on(state(addr));
    assert_eq!(after.cursors, vec![("b".to_string(), 3)]);

    // a subscription after the last possible version: refused, or an empty stream
    let sub = pb::SubscribeRequest {
        after_version: u64::MAX,
    }
    .encode_to_vec();
    let got = rt.block_on(call(addr, &as_role(Role::Mirror), "Subscribe", sub));
    tally.note("subscribe: past any version", &got);
    assert!(
        matches!(&got, Err(s) if s.code() == Code::InvalidArgument),
        "{got:?}"
    );

    // subscriptions are bounded per peer address
    let subs: Vec<_> = rt.block_on(async {
        let mut held = vec![];
        let mut refused = None;
        for _ in 0..40 {
            let ch = raw_grpc::channel(&addr.to_string(), &as_role(Role::Mirror));
            let mut c = pb::replicator_client::ReplicatorClient::new(ch);
            match c.subscribe(pb::SubscribeRequest { after_version: 3 }).await {
                Ok(s) => held.push(s),
                Err(s) => {
                    refused = Some(s);
                    break;
                }
            }
        }
        let s = refused.expect("a bound on subscriptions per peer");
        assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
        held
    });
    tally.note(
        "subscriptions past the bound",
        &Err(tonic::Status::resource_exhausted("")),
    );
    assert_eq!(subs.len(), 16, "subscriptions held before the refusal");
    drop(subs);

    tally.print("replicator: malformed, oversize, stale, future, forged");
    assert_node_lives(&cluster, addr, &rt);
}

#[test]
fn every_method_refuses_missing_credentials_and_every_role_it_does_not_admit() {
    let work = tempfile::tempdir().unwrap();
    let rt = crate::support::runtime();
    let (cluster, addr) = cluster(work.path(), &rt);
    let (before, _) = rt.block_on(state(addr));
    let mut tally = Tally::default();
    let wrong = Credentials::token("a-token-no-node-accepts").unwrap();
    for (path, allowed) in policy::methods() {
        let Some(method) = path.strip_prefix(&format!("{SERVICE}/")) else {
            continue;
        };
        // no credentials, and a token the node does not know
        for creds in [Credentials::default(), wrong.clone()] {
            let got = rt.block_on(call(addr, &creds, method, vec![]));
            tally.note("no or unknown credentials", &got);
            assert_eq!(
                got.as_ref().err().map(|s| s.code()),
                Some(Code::Unauthenticated),
                "{path}: {got:?}"
            );
        }
        // every role the node knows that the method does not admit
        for role in Role::ALL.into_iter().filter(|r| !allowed.contains(*r)) {
            if role == Role::Mount {
                continue; // a mount's token is unknown here: UNAUTHENTICATED, as above
            }
            let got = rt.block_on(call(addr, &as_role(role), method, vec![]));
            tally.note("a role the method does not admit", &got);
            assert_eq!(
                got.as_ref().err().map(|s| s.code()),
                Some(Code::PermissionDenied),
                "{path} as {role}: {got:?}"
            );
        }
    }
    // a method no service has
    let got = rt.block_on(call(addr, &as_role(Role::Admin), "Nope", vec![]));
    tally.note("a method that does not exist", &got);
    assert!(got.is_err());
    let (after, _) = rt.block_on(state(addr));
    assert_eq!(after, before);
    tally.print("replicator: credentials and roles");
    assert_node_lives(&cluster, addr, &rt);
}

#[test]
fn random_messages_to_every_method_never_crash_the_node() {
    let work = tempfile::tempdir().unwrap();
    let rt = crate::support::runtime();
    let (cluster, addr) = cluster(work.path(), &rt);
    let seed = crate::support::seed("replicator random messages");
    let mut tally = Tally::default();
    // what the log holds now (the cursor let it purge all but its last record)
    let (st, _) = rt.block_on(state(addr));
    let from = st.earliest_version.saturating_sub(1);
    let records_before = rt.block_on(cluster.read_log(from, Duration::from_secs(10)));
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for (path, allowed) in policy::methods() {
        let Some(method) = path.strip_prefix(&format!("{SERVICE}/")) else {
            continue;
        };
        // an operator's random calls could legitimately add members that never answer or
        // purge the log (retention, forgetting the cursor): they are made with a role that
        // may not make them instead
        let role = if matches!(
            method,
            "AddNode" | "RemoveNode" | "Init" | "SetRetention" | "ForgetMirror"
        ) {
            Role::Mount
        } else {
            allowed.iter().find(|r| *r != Role::Mount).expect("a role")
        };
        for _ in 0..60 {
            let len = match next() % 4 {
                0 => 0,
                1 => (next() % 8) as usize,
                2 => (next() % 300) as usize,
                _ => (next() % 5000) as usize,
            };
            let body: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let got = rt.block_on(call(addr, &as_role(role), method, body));
            tally.note("random bytes as a message", &got);
        }
    }
    tally.print(&format!("replicator: random messages (seed {seed})"));
    assert_node_lives(&cluster, addr, &rt);
    // the records that were there are there, unchanged
    let records_after = rt.block_on(cluster.read_log(from, Duration::from_secs(10)));
    assert_eq!(
        records_after[..records_before.len()],
        records_before[..],
        "random calls rewrote committed records"
    );
}

/// The node answers its status, still leads, and its log holds no panic.
fn assert_node_lives(cluster: &Cluster, addr: SocketAddr, rt: &tokio::runtime::Runtime) {
    wait_until(
        "the node does not answer as a leader",
        Duration::from_secs(20),
        || {
            let st = rt.block_on(async {
                let ch = raw_grpc::channel(&addr.to_string(), &as_role(Role::Admin));
                pb::replicator_client::ReplicatorClient::new(ch)
                    .status(pb::Empty {})
                    .await
            });
            match st {
                Ok(s) if s.get_ref().leader.is_some() => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    );
    for n in cluster.nodes.values() {
        let log = n.log_text();
        assert!(!log.contains("panicked"), "node {} panicked:\n{log}", n.id);
    }
}

/// Issue 43, item 5: a mirror's token moved any mirror's cursor (one region could release
/// another's hold on the log and on the primary's GC) and registered cursors up to the log's
/// 1,024. Now a cursor belongs to the credentials that registered it: another mirror's
/// credentials are refused, PERMISSION_DENIED, and change nothing; one mirror's credentials
/// hold at most 64 cursors; forgetting a cursor releases it.
#[test]
fn a_cursor_belongs_to_the_credentials_that_registered_it() {
    let work = tempfile::tempdir().unwrap();
    let rt = crate::support::runtime();
    // the cluster's mirror "b" registered its cursor at 2 with MIRROR_TOKEN
    let (_cluster, addr) = cluster(work.path(), &rt);
    let b = as_role(Role::Mirror);
    let c = Credentials::token(MIRROR_TOKEN_2).expect("token");
    let admin = as_role(Role::Admin);
    let ack = |name: &str, v: u64| {
        pb::AckRequest {
            mirror: name.into(),
            applied_version: v,
        }
        .encode_to_vec()
    };
    rt.block_on(async {
        let (before, _) = state(addr).await;
        assert!(before.cursors.contains(&("b".to_string(), 2)), "{before:?}");
        // another mirror's credentials may not move "b", forward or back
        for v in [3, 1] {
            let s = call(addr, &c, "Ack", ack("b", v)).await.unwrap_err();
            assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
            assert!(s.message().contains("other credentials"), "{s:?}");
        }
        let (after, _) = state(addr).await;
        assert_eq!(after, before, "a refused ack changed the log's state");
        // each moves its own
        call(addr, &c, "Ack", ack("c", 1))
            .await
            .expect("c registers its own");
        let s = call(addr, &b, "Ack", ack("c", 3)).await.unwrap_err();
        assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
        call(addr, &b, "Ack", ack("b", 3))
            .await
            .expect("b moves its own");
        // forgetting "c" releases it
        let forget = pb::ForgetMirrorRequest { mirror: "c".into() }.encode_to_vec();
        call(addr, &admin, "ForgetMirror", forget)
            .await
            .expect("forget c");
        call(addr, &b, "Ack", ack("c", 2))
            .await
            .expect("c, released, registered by b");
        // one mirror's credentials hold at most 64 cursors ("b" and "c" are two of them)
        for i in 2..64 {
            call(addr, &b, "Ack", ack(&format!("x{i}"), 1))
                .await
                .unwrap_or_else(|s| panic!("cursor {i}: {s:?}"));
        }
        let s = call(addr, &b, "Ack", ack("one-too-many", 1))
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
        // ... and the other's still register
        call(addr, &c, "Ack", ack("d", 1)).await.expect("d");
        let (end, _) = state(addr).await;
        println!("cursors at the end: {}", end.cursors.len());
        // "b" was there; b's credentials added 63 more, c's "d"
        assert_eq!(
            end.cursors.len(),
            before.cursors.len() + 64,
            "{:?}",
            end.cursors
        );
    });
}
