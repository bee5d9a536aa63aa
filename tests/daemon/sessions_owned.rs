//! A session belongs to the credentials that opened it (issue 43, item 1). Before, session
//! ids were a count (1, 2, 3, ...) and any mount could name any of them: a plain client holding
//! only a mount token closed another mount's session, dropping its locks and deleting the
//! unlinked files it held open. Now ids are random, and a call naming a session that other
//! credentials opened is refused, PERMISSION_DENIED, and changes nothing, also after a restart.

use crate::support::daemon::Primary;
use crate::support::mount::TestFs;
use crate::support::site::{meta_client as client, request as req};
use strait_proto::meta as w;
use strait_proto::meta::meta_service_client::MetaServiceClient;
use tonic::transport::Channel;
use tonic::{Code, Request};

const TEAM_A: &str = "sessions-owned-team-a-token";
const TEAM_B: &str = "sessions-owned-team-b-token";

/// A primary that takes two mount tokens, one per team, and a runtime to call it from.
fn two_teams() -> (TestFs, Primary, tokio::runtime::Runtime) {
    let fs = TestFs::rocks_local(&[]);
    let daemon = Primary::start(
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
    (fs, daemon, rt)
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
    let (_fs, mut daemon, rt) = two_teams();
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

/// The hostile side of the same (issue 43's acceptance): calls naming random session ids, and
/// the session of another team, from a team's own credentials. Every one is refused (the ids
/// no one holds with FAILED_PRECONDITION, the other team's with PERMISSION_DENIED), the other
/// team's session is still held afterwards, and the tree is unchanged. Printed: the tally.
#[test]
fn calls_naming_guessed_or_foreign_sessions_are_all_refused_and_change_nothing() {
    let (_fs, daemon, rt) = two_teams();
    rt.block_on(async {
        let mut c = client(&daemon.addr).await;
        let sa = open(&mut c, TEAM_A, 0).await.unwrap();
        let sb = open(&mut c, TEAM_B, 0).await.unwrap();
        c.create(create("kept", TEAM_A, sa)).await.unwrap();
        let listing = |c: &mut MetaServiceClient<Channel>| {
            let mut c = c.clone();
            async move {
                let mut names: Vec<Vec<u8>> = c
                    .read_dir(req(
                        w::InodeRequest {
                            ctx: Some(w::Ctx::default()),
                            ino: 1,
                        },
                        TEAM_A,
                        sa,
                    ))
                    .await
                    .expect("readdir")
                    .into_inner()
                    .entries
                    .into_iter()
                    .map(|e| e.name)
                    .collect();
                names.sort();
                names
            }
        };
        let before = listing(&mut c).await;
        let seed: u64 = rand::random();
        println!("seed {seed}");
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
        let mut tally: std::collections::BTreeMap<String, usize> = Default::default();
        for i in 0..600u32 {
            // a random id (small ones too: the old ids were 1, 2, 3, ...), or team A's
            let sid = match i % 3 {
                0 => sa,
                1 => rand::Rng::random_range(&mut rng, 1..1_000u64),
                _ => rand::Rng::random::<u64>(&mut rng) >> 1,
            };
            if sid == sb {
                continue;
            }
            let name = format!("planted-{i}");
            let got = match i % 5 {
                0 => c
                    .close_session(req(w::Empty {}, TEAM_B, sid))
                    .await
                    .map(|_| ()),
                1 => open(&mut c, TEAM_B, sid).await.map(|_| ()),
                2 => c.create(create(&name, TEAM_B, sid)).await.map(|_| ()),
                3 => c
                    .heartbeat(req(w::HeartbeatRequest::default(), TEAM_B, sid))
                    .await
                    .map(|_| ()),
                _ => c
                    .unlink(req(
                        w::NameRequest {
                            ctx: Some(w::Ctx::default()),
                            parent: 1,
                            name: b"kept".to_vec(),
                        },
                        TEAM_B,
                        sid,
                    ))
                    .await
                    .map(|_| ()),
            };
            let code = match &got {
                Ok(()) if i % 5 == 1 => {
                    // OpenSession resuming an id no one holds opens a new session of B's own
                    "OK (a new session of its own)".to_string()
                }
                Ok(()) => panic!("call {i} under session {sid} was answered OK"),
                Err(s) => format!("{:?}", s.code()),
            };
            if sid == sa {
                assert_eq!(
                    got.as_ref().err().map(|s| s.code()),
                    Some(Code::PermissionDenied),
                    "call {i} under team A's session: {got:?}"
                );
            }
            *tally.entry(code).or_default() += 1;
        }
        println!("| answered | calls |\n|---|---|");
        for (code, n) in &tally {
            println!("| {code} | {n} |");
        }
        // nothing changed: A's session is held, the tree is as it was
        c.heartbeat(req(w::HeartbeatRequest::default(), TEAM_A, sa))
            .await
            .expect("team A's session is still held");
        assert_eq!(listing(&mut c).await, before);
    });
}
