//! A session belongs to the credentials that opened it (issue 43, item 1). Before, session
//! ids were a count (1, 2, 3, ...) and any mount could name any of them: a plain client holding
//! only a mount token closed another mount's session, dropping its locks and deleting the
//! unlinked files it held open. Now ids are random, and a call naming a session that other
//! credentials opened is refused, PERMISSION_DENIED, and changes nothing, also after a restart.

use std::time::Duration;

use crate::support::daemon::Primary;
use crate::support::mount::TestFs;
use strait_proto::meta as w;
use strait_proto::meta::meta_service_client::MetaServiceClient;
use tonic::transport::Channel;
use tonic::{Code, Request};

const TEAM_A: &str = "sessions-owned-team-a-token";
const TEAM_B: &str = "sessions-owned-team-b-token";

fn req<T>(msg: T, token: &str, session: u64) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    if session != 0 {
        r.metadata_mut()
            .insert("x-strait-session", session.to_string().parse().unwrap());
    }
    r
}

async fn client(addr: &str) -> MetaServiceClient<Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("connect to the daemon");
    MetaServiceClient::new(ch)
}

async fn open(
    c: &mut MetaServiceClient<Channel>,
    token: &str,
    resume: u64,
) -> Result<u64, tonic::Status> {
    c.open_session(req(
        w::OpenSessionRequest {
            info: "sessions_owned".into(),
            resume_session: resume,
            ..Default::default()
        },
        token,
        0,
    ))
    .await
    .map(|r| r.into_inner().session)
}

fn create(name: &str, token: &str, sid: u64) -> Request<w::MkNodRequest> {
    req(
        w::MkNodRequest {
            ctx: Some(w::Ctx::default()),
            parent: 1,
            name: name.as_bytes().to_vec(),
            mode: 0o644,
            ..Default::default()
        },
        token,
        sid,
    )
}

async fn exists(c: &mut MetaServiceClient<Channel>, name: &str, token: &str, sid: u64) -> bool {
    let got = c
        .lookup(req(
            w::LookupRequest {
                ctx: Some(w::Ctx::default()),
                parent: 1,
                name: name.as_bytes().to_vec(),
            },
            token,
            sid,
        ))
        .await;
    match got {
        Ok(_) => true,
        Err(s) if strait_proto::status_errno(&s) == Some(libc::ENOENT) => false,
        Err(s) => panic!("lookup {name}: {s:?}"),
    }
}

#[test]
fn a_session_answers_only_the_credentials_that_opened_it() {
    let fs = TestFs::rocks_local(&[]);
    let mut daemon = Primary::start(
        &fs.meta_url,
        &[],
        &[
            "--role-token",
            &format!("mount={TEAM_A}"),
            "--role-token",
            &format!("mount={TEAM_B}"),
        ],
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sa = rt.block_on(async {
        let mut c = client(&daemon.addr).await;
        let sa = open(&mut c, TEAM_A, 0)
            .await
            .expect("team A opens a session");
        let sb = open(&mut c, TEAM_B, 0)
            .await
            .expect("team B opens a session");

        // ids are not a count: none is within a million of another
        let mut ids = vec![sa, sb];
        for _ in 0..8 {
            ids.push(open(&mut c, TEAM_A, 0).await.unwrap());
        }
        println!("session ids: {ids:?}");
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                assert!(a.abs_diff(*b) > 1_000_000, "ids {a} and {b} are guessable");
            }
        }

        // team B names team A's session: close, resume, create, heartbeat are refused
        let s = c
            .close_session(req(w::Empty {}, TEAM_B, sa))
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
        assert!(s.message().contains("other credentials"), "{s:?}");
        let s = open(&mut c, TEAM_B, sa).await.unwrap_err();
        assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
        let s = c.create(create("stolen", TEAM_B, sa)).await.unwrap_err();
        assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
        let s = c
            .heartbeat(req(w::HeartbeatRequest::default(), TEAM_B, sa))
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
        // ... and changed nothing: A's session is still held, no file was made
        c.heartbeat(req(w::HeartbeatRequest::default(), TEAM_A, sa))
            .await
            .expect("team A's session is still held");
        assert!(!exists(&mut c, "stolen", TEAM_A, sa).await);

        // a session id guessed: not held (and nothing to learn from the answer)
        let s = c
            .stat_fs(req(w::Empty {}, TEAM_B, sa ^ 1))
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");

        // each team's own session works
        c.create(create("a-file", TEAM_A, sa))
            .await
            .expect("A creates");
        c.create(create("b-file", TEAM_B, sb))
            .await
            .expect("B creates");
        sa
    });

    // after a restart the daemon holds no session in memory: the engine's record of who
    // opened each one still refuses team B, and lets team A take its session up again
    daemon.kill();
    daemon.restart();
    rt.block_on(async {
        let mut c = client(&daemon.addr).await;
        let s = open(&mut c, TEAM_B, sa).await.unwrap_err();
        assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
        let again = open(&mut c, TEAM_A, sa).await.expect("team A resumes");
        assert_eq!(again, sa, "team A's session taken up again");
        let s = c
            .close_session(req(w::Empty {}, TEAM_B, sa))
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
        assert!(exists(&mut c, "a-file", TEAM_A, sa).await);
        c.close_session(req(w::Empty {}, TEAM_A, sa))
            .await
            .expect("team A closes its own session");
    });
}
