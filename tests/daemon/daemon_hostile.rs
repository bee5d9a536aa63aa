//! Malformed and hostile calls to a site daemon: each gets a clear error, nothing changes,
//! and the daemon never panics. Also TLS and mutual TLS, with certificates made here.

use std::time::Duration;

use crate::support::daemon::Primary;
use crate::support::mount::TestFs;
use proptest::prelude::*;
use strait_proto::meta as w;
use strait_proto::meta::meta_service_client::MetaServiceClient;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn channel(addr: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("connect to the daemon")
}

/// A request with `token` and `session` in its metadata.
fn req<T>(msg: T, token: Option<&str>, session: u64) -> Request<T> {
    let mut r = Request::new(msg);
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    if session != 0 {
        r.metadata_mut()
            .insert("x-strait-session", session.to_string().parse().unwrap());
    }
    r
}

fn errno(s: &Status) -> Option<i32> {
    strait_proto::status_errno(s)
}

fn root_ctx() -> Option<w::Ctx> {
    Some(w::Ctx::default())
}

async fn open_session(c: &mut MetaServiceClient<Channel>, token: &str) -> u64 {
    c.open_session(req(
        w::OpenSessionRequest {
            info: "hostile test".into(),
            ..Default::default()
        },
        Some(token),
        0,
    ))
    .await
    .expect("open a session")
    .into_inner()
    .session
}

#[test]
fn malformed_and_hostile_calls_get_clear_errors_and_change_nothing() {
    let fs = TestFs::rocks_local(&[]);
    let daemon = Primary::start(&fs.meta_url, &[], &[]);
    let token = daemon.token.clone();
    rt().block_on(async {
        let mut c = MetaServiceClient::new(channel(&daemon.addr).await);

        // no token, a wrong token: UNAUTHENTICATED, logged once per peer
        let s = c.stat_fs(req(w::Empty {}, None, 0)).await.unwrap_err();
        assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
        for _ in 0..3 {
            let s = c
                .stat_fs(req(w::Empty {}, Some("not-the-token"), 0))
                .await
                .unwrap_err();
            assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
            assert!(s.message().contains("token"), "{s:?}");
        }

        // a call without a session, and with a session the daemon never gave out
        let s = c
            .stat_fs(req(w::Empty {}, Some(&token), 0))
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::FailedPrecondition);
        let s = c
            .stat_fs(req(w::Empty {}, Some(&token), 987_654))
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert!(s.metadata().get("x-strait-resume").is_some());

        let sid = open_session(&mut c, &token).await;
        let before = c
            .stat_fs(req(w::Empty {}, Some(&token), sid))
            .await
            .unwrap()
            .into_inner();

        // invalid inode numbers
        for ino in [0u64, 2, u64::MAX] {
            let s = c
                .get_attr(req(w::InodeRequest { ctx: None, ino }, Some(&token), sid))
                .await
                .unwrap_err();
            assert_eq!(errno(&s), Some(libc::ENOENT), "inode {ino}: {s:?}");
        }
        // a huge name, a name with a slash, an empty name, no credentials
        let mk = |name: Vec<u8>, ctx| w::MkNodRequest {
            ctx,
            parent: 1,
            name,
            mode: 0o644,
            umask: 0,
            rdev: 0,
        };
        let s = c
            .create(req(mk(vec![b'a'; 100_000], root_ctx()), Some(&token), sid))
            .await
            .unwrap_err();
        assert_eq!(errno(&s), Some(libc::ENAMETOOLONG), "{s:?}");
        for bad in [b"a/b".to_vec(), vec![], b"a\0b".to_vec()] {
            let s = c
                .create(req(mk(bad, root_ctx()), Some(&token), sid))
                .await
                .unwrap_err();
            assert_eq!(errno(&s), Some(libc::EINVAL), "{s:?}");
        }
        let s = c
            .create(req(mk(b"f".to_vec(), None), Some(&token), sid))
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert!(s.message().contains("credentials"), "{s:?}");

        // out-of-range offsets and sizes
        let f = c
            .create(req(mk(b"f".to_vec(), root_ctx()), Some(&token), sid))
            .await
            .unwrap()
            .into_inner()
            .ino;
        // an id of this session's own: a slice under any other is refused before its fields
        // are looked at (tests/daemon/slice_ids.rs)
        let id = c
            .alloc_slice_ids(req(w::AllocRequest { count: 10 }, Some(&token), sid))
            .await
            .unwrap()
            .into_inner()
            .first;
        let slice = |pos: u32, len: u32, size: u32, crcs: Vec<u32>| w::WriteSliceRequest {
            ino: f,
            index: 0,
            slice: Some(w::SliceRef {
                id,
                size,
                off: 0,
                len,
                pos,
                crcs,
            }),
            mtime_ns: 0,
        };
        for bad in [
            slice(u32::MAX, 10, 10, vec![0]),
            slice(0, 10, 5, vec![0]),
            slice(0, 10, 10, vec![]),
            slice(0, 10, u32::MAX, vec![0]),
        ] {
            let s = c
                .write_slice(req(bad.clone(), Some(&token), sid))
                .await
                .unwrap_err();
            assert_eq!(errno(&s), Some(libc::EINVAL), "{bad:?}: {s:?}");
        }
        let s = c
            .write_slice(req(
                w::WriteSliceRequest {
                    index: u32::MAX,
                    ..slice(0, 10, 10, vec![0])
                },
                Some(&token),
                sid,
            ))
            .await
            .unwrap_err();
        assert_eq!(errno(&s), Some(libc::EFBIG), "{s:?}");
        let s = c
            .set_attr(req(
                w::SetAttrRequest {
                    ctx: root_ctx(),
                    ino: f,
                    size: Some(u64::MAX),
                    ..Default::default()
                },
                Some(&token),
                sid,
            ))
            .await
            .unwrap_err();
        assert_eq!(errno(&s), Some(libc::EFBIG), "{s:?}");
        let s = c
            .set_lk(req(
                w::LockRequest {
                    ino: f,
                    owner: 1,
                    pid: 1,
                    typ: 1,
                    start: 10,
                    end: 5,
                },
                Some(&token),
                sid,
            ))
            .await
            .unwrap_err();
        assert_eq!(errno(&s), Some(libc::EINVAL), "{s:?}");
        let s = c
            .set_lk(req(
                w::LockRequest {
                    ino: f,
                    owner: 1,
                    pid: 1,
                    typ: 42,
                    start: 0,
                    end: 5,
                },
                Some(&token),
                sid,
            ))
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        let s = c
            .alloc_slice_ids(req(w::AllocRequest { count: u32::MAX }, Some(&token), sid))
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        let s = c
            .rename(req(
                w::RenameRequest {
                    ctx: root_ctx(),
                    parent: 1,
                    name: b"f".to_vec(),
                    new_parent: 1,
                    new_name: b"g".to_vec(),
                    flags: 0x80,
                },
                Some(&token),
                sid,
            ))
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        // an unprivileged caller cannot touch root's file
        let s = c
            .set_attr(req(
                w::SetAttrRequest {
                    ctx: Some(w::Ctx {
                        uid: 1000,
                        gid: 1000,
                        ..Default::default()
                    }),
                    ino: f,
                    mode: Some(0o777),
                    ..Default::default()
                },
                Some(&token),
                sid,
            ))
            .await
            .unwrap_err();
        assert_eq!(errno(&s), Some(libc::EPERM), "{s:?}");

        // closes of handles the session never opened are ignored; an oversized batch is refused
        c.release(req(
            w::ReleaseRequest {
                inos: vec![f, 0, u64::MAX, f],
            },
            Some(&token),
            sid,
        ))
        .await
        .unwrap();
        let s = c
            .release(req(
                w::ReleaseRequest {
                    inos: vec![f; strait_proto::RELEASE_BATCH_MAX + 1],
                },
                Some(&token),
                sid,
            ))
            .await
            .unwrap_err();
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");

        // nothing above changed the file system (beyond the one create)
        let after = c
            .stat_fs(req(w::Empty {}, Some(&token), sid))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(after.inodes, before.inodes + 1);
        let a = c
            .get_attr(req(
                w::InodeRequest { ctx: None, ino: f },
                Some(&token),
                sid,
            ))
            .await
            .unwrap()
            .into_inner()
            .attr
            .unwrap();
        assert_eq!((a.length, a.perm), (0, 0o644));
    });
    // refused tokens are logged once per address, with the address
    let log = daemon.log_text();
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("refused a call to") && l.contains("from 127.0.0.1"))
            .count(),
        1,
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
}

/// A random call with random fields; inode numbers mostly near the root so some hit.
fn any_call() -> impl Strategy<Value = (u8, u64, Vec<u8>, u32, u64, u64)> {
    (
        0u8..20,
        prop_oneof![0u64..8, any::<u64>()],
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..8),
            proptest::collection::vec(any::<u8>(), 250..300)
        ],
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
    )
}

#[test]
fn random_calls_never_crash_the_daemon() {
    let fs = TestFs::rocks_local(&[]);
    let mut daemon = Primary::start(&fs.meta_url, &[], &[]);
    let token = daemon.token.clone();
    let seed = crate::support::seed("random_calls");
    let rt = rt();
    let mut client = rt.block_on(async { MetaServiceClient::new(channel(&daemon.addr).await) });
    let sid = rt.block_on(open_session(&mut client, &token));
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(
        proptest::test_runner::Config {
            cases: 3000,
            ..Default::default()
        },
        proptest::test_runner::TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &{
            let mut s = [0u8; 32];
            s[..8].copy_from_slice(&seed.to_le_bytes());
            s
        }),
    );
    let answered = std::cell::Cell::new(0u64);
    runner
        .run(&proptest::collection::vec(any_call(), 1..20), |calls| {
            let mut c = client.clone();
            for (op, ino, name, n, a, b) in calls {
                let ctx = Some(w::Ctx {
                    uid: n % 3,
                    gid: n % 5,
                    groups: vec![n],
                    pid: 1,
                });
                let res: Result<(), Status> = rt.block_on(async {
                    let t = Some(token.as_str());
                    match op {
                        0 => c
                            .lookup(req(
                                w::LookupRequest {
                                    ctx,
                                    parent: ino,
                                    name,
                                },
                                t,
                                sid,
                            ))
                            .await
                            .map(|_| ()),
                        1 => c
                            .get_attr(req(w::InodeRequest { ctx, ino }, t, sid))
                            .await
                            .map(|_| ()),
                        2 => c
                            .create(req(
                                w::MkNodRequest {
                                    ctx,
                                    parent: ino,
                                    name,
                                    mode: n,
                                    umask: a as u32,
                                    rdev: 0,
                                },
                                t,
                                sid,
                            ))
                            .await
                            .map(|_| ()),
                        3 => c
                            .mk_dir(req(
                                w::MkNodRequest {
                                    ctx,
                                    parent: ino,
                                    name,
                                    mode: n,
                                    umask: 0,
                                    rdev: 0,
                                },
                                t,
                                sid,
                            ))
                            .await
                            .map(|_| ()),
                        4 => c
                            .mk_nod(req(
                                w::MkNodRequest {
                                    ctx,
                                    parent: ino,
                                    name,
                                    mode: n,
                                    umask: 0,
                                    rdev: a as u32,
                                },
                                t,
                                sid,
                            ))
                            .await
                            .map(|_| ()),
                        5 => c
                            .unlink(req(
                                w::NameRequest {
                                    ctx,
                                    parent: ino,
                                    name,
                                },
                                t,
                                sid,
                            ))
                            .await
                            .map(|_| ()),
                        6 => c
                            .rm_dir(req(
                                w::NameRequest {
                                    ctx,
                                    parent: ino,
                                    name,
                                },
                                t,
                                sid,
                            ))
                            .await
                            .map(|_| ()),
                        7 => c
                            .rename(req(
                                w::RenameRequest {
                                    ctx,
                                    parent: ino,
                                    name: name.clone(),
                                    new_parent: a % 8,
                                    new_name: name,
                                    flags: n % 4,
                                },
                                t,
                                sid,
                            ))
                            .await
                            .map(|_| ()),
                        8 => c
                            .set_attr(req(
                                w::SetAttrRequest {
                                    ctx,
                                    ino,
                                    mode: Some(n),
                                    size: Some(a % (1 << 52)),
                                    uid: Some(b as u32),
                                    ..Default::default()
                                },
                                t,
                                sid,
                            ))
                            .await
                            .map(|_| ()),
                        9 => c
                            .symlink(req(
                                w::SymlinkRequest {
                                    ctx,
                                    parent: ino,
                                    name: name.clone(),
                                    target: name,
                                },
                                t,
                                sid,
                            ))
                            .await
                            .map(|_| ()),
                        10 => c
                            .link(req(
                                w::LinkRequest {
                                    ctx,
                                    ino,
                                    new_parent: a % 8,
                                    new_name: name,
                                },
                                t,
                                sid,
                            ))
                            .await
                            .map(|_| ()),
                        11 => c
                            .read_dir(req(w::InodeRequest { ctx, ino }, t, sid))
                            .await
                            .map(|_| ()),
                        12 => c
                            .write_slice(req(
                                w::WriteSliceRequest {
                                    ino,
                                    index: n % 4,
                                    slice: Some(w::SliceRef {
                                        id: a,
                                        size: (b % (1 << 27)) as u32,
                                        off: n % 100,
                                        len: n % 1000,
                                        pos: (b >> 32) as u32,
                                        crcs: vec![n; (b % 70) as usize],
                                    }),
                                    mtime_ns: a as i64,
                                },
                                t,
                                sid,
                            ))
                            .await
                            .map(|_| ()),
                        13 => c
                            .read_chunk(req(w::ChunkRequest { ino, index: n }, t, sid))
                            .await
                            .map(|_| ()),
                        14 => c
                            .set_xattr(req(
                                w::SetXattrRequest {
                                    ctx,
                                    ino,
                                    name: [b"user.".as_slice(), &name].concat(),
                                    value: name,
                                    flags: n as i32 % 4,
                                },
                                t,
                                sid,
                            ))
                            .await
                            .map(|_| ()),
                        15 => c
                            .get_xattr(req(w::XattrRequest { ctx, ino, name }, t, sid))
                            .await
                            .map(|_| ()),
                        16 => c
                            .set_lk(req(
                                w::LockRequest {
                                    ino,
                                    owner: a,
                                    pid: n,
                                    typ: (b % 4) as i32,
                                    start: a.min(b),
                                    end: a.max(b),
                                },
                                t,
                                sid,
                            ))
                            .await
                            .map(|_| ()),
                        17 => c
                            .open(req(
                                w::OpenRequest {
                                    ctx,
                                    ino,
                                    flags: n as i32,
                                    chunk0: n % 2 == 0,
                                },
                                t,
                                sid,
                            ))
                            .await
                            .map(|_| ()),
                        18 => c
                            .compact_chunk(req(
                                w::CompactChunkRequest {
                                    ino,
                                    index: n % 2,
                                    old: vec![],
                                    new: vec![w::SliceRef {
                                        id: a,
                                        size: 10,
                                        off: 0,
                                        len: 10,
                                        pos: 0,
                                        crcs: vec![1],
                                    }],
                                },
                                t,
                                sid,
                            ))
                            .await
                            .map(|_| ()),
                        _ => c
                            .flock(req(
                                w::FlockRequest {
                                    ino,
                                    owner: a,
                                    typ: (b % 4) as i32,
                                },
                                t,
                                sid,
                            ))
                            .await
                            .map(|_| ()),
                    }
                });
                if let Err(s) = res {
                    // every refusal is a file system error (with its errno) or a malformed request
                    prop_assert!(
                        errno(&s).is_some() || s.code() == Code::InvalidArgument,
                        "op {op}: unexpected status {s:?}"
                    );
                }
                answered.set(answered.get() + 1);
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    assert!(
        daemon.alive(),
        "the daemon died after {} random calls",
        answered.get()
    );
    let (code, _) = daemon.http_get("/health");
    assert_eq!(code, 200);
    assert!(
        !daemon.log_text().contains("panicked"),
        "{}",
        daemon.log_text()
    );
    // the tree the random calls left is consistent
    assert!(daemon.terminate());
    let out = crate::support::strait_ok(&["fsck", &fs.meta_url]);
    assert!(out.contains("consistent"), "{out}");
}

/// A CA, a certificate for the daemon at 127.0.0.1 and a client certificate, as PEM files.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(vec![]).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.clone().self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf = |names: Vec<String>| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(names)
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(vec!["127.0.0.1".into(), "localhost".into()]);
        let (client_cert, client_key) = leaf(vec!["mount".into()]);
        for (name, text) in [
            ("ca.pem", ca.pem()),
            ("server.pem", server_cert),
            ("server.key", server_key),
            ("client.pem", client_cert),
            ("client.key", client_key),
        ] {
            // keys are their owner's alone: a daemon refuses one others may read
            strait_ids::private::write_private(&dir.path().join(name), text.as_bytes()).unwrap();
        }
        Pki { dir }
    }
    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

#[test]
fn tls_with_client_certificates_admits_only_certified_mounts() {
    if !crate::support::require_fuse() {
        return;
    }
    let pki = Pki::new();
    let fs = TestFs::rocks_local(&[]);
    // issue 43, item 6: a key other users may read is refused at start, with the reason and
    // the fix (it was used)
    let open_key = pki.dir.path().join("open.key");
    std::fs::copy(pki.path("server.key"), &open_key).unwrap();
    std::fs::set_permissions(
        &open_key,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let (ok, out) = crate::support::strait(&[
        "primary",
        "--meta-url",
        &fs.meta_url,
        "--listen",
        "127.0.0.1:1",
        "--token",
        "tls-open-key-token-0123",
        "--tls-cert",
        &pki.path("server.pem"),
        "--tls-key",
        open_key.to_str().unwrap(),
    ]);
    assert!(!ok, "a primary started with a key others may read: {out}");
    assert!(
        out.contains("can be read or written by other users") && out.contains("chmod 600"),
        "{out}"
    );
    let daemon = Primary::start(
        &fs.meta_url,
        &[],
        &[
            "--tls-cert",
            &pki.path("server.pem"),
            "--tls-key",
            &pki.path("server.key"),
            "--tls-client-ca",
            &pki.path("ca.pem"),
        ],
    );
    // a mount with the CA and a client certificate works
    let m = daemon.mount(&[
        "--tls-ca",
        &pki.path("ca.pem"),
        "--tls-cert",
        &pki.path("client.pem"),
        "--tls-key",
        &pki.path("client.key"),
        "--reconnect-timeout-s",
        "3",
    ]);
    std::fs::write(m.path("secure"), b"over TLS").unwrap();
    assert_eq!(std::fs::read(m.path("secure")).unwrap(), b"over TLS");
    m.unmount();

    // without a client certificate, or without TLS at all, the mount fails with a message
    let dir = tempfile::tempdir().unwrap();
    let url = daemon.url();
    for extra in [vec!["--tls-ca", &pki.path("ca.pem")], vec![]] {
        let mut args = vec![
            "mount",
            &url,
            dir.path().to_str().unwrap(),
            "--token",
            &daemon.token,
            "--reconnect-timeout-s",
            "2",
        ];
        args.extend(extra.iter().copied());
        let (code, err) = crate::support::strait_fails(&args);
        assert_eq!(code, 1, "{err}");
        let last = err.trim_end().lines().last().unwrap_or("");
        assert!(last.starts_with("strait: "), "{err}");
    }

    // plain-text gRPC to the TLS port: an error for the client, nothing for the daemon
    rt().block_on(async {
        let ep = tonic::transport::Endpoint::from_shared(format!("http://{}", daemon.addr))
            .unwrap()
            .timeout(Duration::from_secs(5))
            .connect_timeout(Duration::from_secs(5));
        match ep.connect().await {
            Err(_) => {}
            Ok(ch) => {
                let mut c = MetaServiceClient::new(ch);
                let s = c
                    .stat_fs(req(w::Empty {}, Some(&daemon.token), 0))
                    .await
                    .unwrap_err();
                assert_ne!(s.code(), Code::Ok);
            }
        }
    });
    let (code, _) = daemon.http_get("/health");
    assert_eq!(code, 200);
    assert!(!daemon.log_text().contains("panicked"));
}
