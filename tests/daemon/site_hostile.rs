//! Hostile input to the site daemons' other surfaces (the metadata service of a primary has
//! its own suite, `daemon_hostile`): the site service (snapshot, digest, status, pause, GC, the
//! orphan sweep) at a primary and at a mirror, FetchBlock at a mirror, and the mirror's
//! router (every metadata call, read or forwarded). Malformed, oversize and random messages,
//! methods that do not exist, wrong roles: each gets a clear status, what the call was refused
//! for changes nothing, and neither daemon panics. Printed: each class's cases and what they
//! got back.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::daemon::Primary;
use crate::support::raw_grpc;
use crate::support::replicator::RegionA;
use crate::support::site::{block_files, primary_version, wait_applied};
use prost::Message;
use strait_auth::{policy, Credentials, Role};
use strait_proto::meta as w;
use strait_proto::site as s;
use tonic::Code;

const MIRROR_T: &str = "site-hostile-mirror-token";
const ADMIN_T: &str = "site-hostile-admin-token0";
const META: &str = "/strait.meta.v1.MetaService";
const SITE: &str = "/strait.site.v1.SiteService";

#[derive(Default)]
struct Tally(BTreeMap<String, BTreeMap<String, usize>>);

impl Tally {
    fn note(&mut self, class: &str, got: &Result<Option<Vec<u8>>, tonic::Status>) {
        let code = match got {
            Ok(_) => "OK".to_string(),
            Err(s) => format!("{:?}", s.code()),
        };
        *self
            .0
            .entry(class.to_string())
            .or_default()
            .entry(code)
            .or_default() += 1;
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

/// A primary and a mirror with a token per role (the shared token is the mounts'), a file
/// written at the primary and applied at the mirror.
struct Sites {
    _region: RegionA,
    primary: Primary,
    mirror: Primary,
    _mount: crate::support::mount::Mount,
    /// A block of the file, in the primary's store: (key, bytes).
    block: (String, Vec<u8>),
}

fn sites(rt: &tokio::runtime::Runtime) -> Sites {
    let region = RegionA::start(rt);
    let roles = [
        "--role-token",
        &format!("mirror={MIRROR_T}"),
        "--role-token",
        &format!("admin={ADMIN_T}"),
    ]
    .map(String::from);
    let roles: Vec<&str> = roles.iter().map(String::as_str).collect();
    let primary = region.primary(&roles);
    let mount = primary.mount(&[]);
    std::fs::write(mount.path("f"), crate::support::random_bytes(7, 300_000)).unwrap();
    // the mirror takes the same role tokens: its shared token is then the mounts' alone
    let mut extra = vec!["--primary-token", MIRROR_T];
    extra.extend(&roles);
    let mirror = Primary::mirror(&primary, "region-b", &region.addrs, &extra);
    wait_applied(&mirror, primary_version(&primary), Duration::from_secs(60));
    let blocks = block_files(&region.fs.data_dir());
    let block = blocks
        .into_iter()
        .next()
        .expect("a block in the primary's store");
    Sites {
        _region: region,
        primary,
        mirror,
        _mount: mount,
        block,
    }
}

fn creds(token: &str) -> Credentials {
    Credentials::token(token).expect("token")
}

async fn call(
    addr: &str,
    creds: &Credentials,
    path: &str,
    body: Vec<u8>,
    session: Option<u64>,
) -> Result<Option<Vec<u8>>, tonic::Status> {
    let streaming =
        path.ends_with("/Snapshot") || path.ends_with("/SweepOrphans") || path.ends_with("/Watch");
    match session {
        None => raw_grpc::call(raw_grpc::channel(addr, creds), path, body, streaming).await,
        Some(sid) => {
            let ch = raw_grpc::channel(addr, creds);
            raw_grpc::call_with(
                ch,
                path,
                body,
                streaming,
                &[("x-strait-session", sid.to_string())],
            )
            .await
        }
    }
}

async fn open_session(addr: &str, token: &str) -> u64 {
    let got = call(
        addr,
        &creds(token),
        &format!("{META}/OpenSession"),
        w::OpenSessionRequest {
            info: "hostile".into(),
            ..Default::default()
        }
        .encode_to_vec(),
        None,
    )
    .await
    .expect("open a session")
    .expect("an answer");
    w::OpenSessionReply::decode(got.as_slice())
        .expect("a reply")
        .session
}

/// The primary's digest and version (the admin's digest call).
async fn digest(addr: &str) -> (String, u64) {
    let got = call(
        addr,
        &creds(ADMIN_T),
        &format!("{SITE}/Digest"),
        s::DigestRequest::default().encode_to_vec(),
        None,
    )
    .await
    .expect("digest")
    .expect("an answer");
    let d = s::DigestReply::decode(got.as_slice()).expect("a reply");
    (d.digest, d.version)
}

fn expect(tally: &mut Tally, class: &str, got: Result<Option<Vec<u8>>, tonic::Status>, want: Code) {
    tally.note(class, &got);
    let code = match &got {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    };
    assert_eq!(code, want, "{class}: {got:?}");
    if let Err(s) = &got {
        assert!(
            !s.message().is_empty(),
            "{class}: a status without a message"
        );
    }
}

#[test]
fn the_site_service_fetch_block_and_the_mirrors_router_refuse_hostile_calls_and_change_nothing() {
    if !crate::support::require_fuse() {
        return;
    }
    let rt = crate::support::runtime();
    let s = sites(&rt);
    let (p, m) = (s.primary.addr.clone(), s.mirror.addr.clone());
    let mount_t = s.primary.token.clone();
    let mut tally = Tally::default();
    let before = rt.block_on(digest(&p));
    let msid = rt.block_on(open_session(&m, &mount_t));

    rt.block_on(async {
        let site = |method: &str| format!("{SITE}/{method}");
        let meta = |method: &str| format!("{META}/{method}");
        let empty = s::Empty {}.encode_to_vec();
        // the site service: roles, and requests it cannot take
        for addr in [&p, &m] {
            expect(
                &mut tally,
                "site: a role the method does not admit",
                call(
                    addr,
                    &creds(&mount_t),
                    &site("Snapshot"),
                    empty.clone(),
                    None,
                )
                .await,
                Code::PermissionDenied,
            );
            expect(
                &mut tally,
                "site: a role the method does not admit",
                call(addr, &creds(&mount_t), &site("Gc"), empty.clone(), None).await,
                Code::PermissionDenied,
            );
            expect(
                &mut tally,
                "site: a role the method does not admit",
                call(
                    addr,
                    &creds(&mount_t),
                    &site("Pause"),
                    s::PauseRequest { hold_ms: 1 }.encode_to_vec(),
                    None,
                )
                .await,
                Code::PermissionDenied,
            );
            expect(
                &mut tally,
                "site: a role the method does not admit",
                call(
                    addr,
                    &creds(&mount_t),
                    &site("SweepOrphans"),
                    s::SweepRequest {
                        grace_ms: Some(0),
                        dry_run: false,
                    }
                    .encode_to_vec(),
                    None,
                )
                .await,
                Code::PermissionDenied,
            );
            expect(
                &mut tally,
                "site: no credentials",
                call(
                    addr,
                    &Credentials::default(),
                    &site("Status"),
                    empty.clone(),
                    None,
                )
                .await,
                Code::Unauthenticated,
            );
            expect(
                &mut tally,
                "site: malformed protobuf",
                call(
                    addr,
                    &creds(ADMIN_T),
                    &site("Digest"),
                    vec![0x08, 0xff],
                    None,
                )
                .await,
                Code::Internal,
            );
            expect(
                &mut tally,
                "oversize message",
                call(
                    addr,
                    &creds(ADMIN_T),
                    &site("Digest"),
                    vec![0u8; 70 << 10],
                    None,
                )
                .await,
                Code::ResourceExhausted,
            );
            expect(
                &mut tally,
                "a method that does not exist",
                call(addr, &creds(ADMIN_T), &site("Nope"), empty.clone(), None).await,
                Code::PermissionDenied,
            );
        }
        expect(
            &mut tally,
            "site: bad request",
            call(
                &m,
                &creds(ADMIN_T),
                &site("Pause"),
                s::PauseRequest { hold_ms: u64::MAX }.encode_to_vec(),
                None,
            )
            .await,
            Code::InvalidArgument,
        );
        expect(
            &mut tally,
            "site: not this daemon's",
            call(
                &p,
                &creds(ADMIN_T),
                &site("Pause"),
                s::PauseRequest { hold_ms: 10 }.encode_to_vec(),
                None,
            )
            .await,
            Code::Unimplemented,
        );
        expect(
            &mut tally,
            "site: not this daemon's",
            call(&m, &creds(ADMIN_T), &site("Gc"), empty.clone(), None).await,
            Code::Unimplemented,
        );
        expect(
            &mut tally,
            "site: bad request",
            call(
                &m,
                &creds(ADMIN_T),
                &site("Digest"),
                s::DigestRequest {
                    at_version: u64::MAX,
                    timeout_ms: 200,
                }
                .encode_to_vec(),
                None,
            )
            .await,
            Code::DeadlineExceeded,
        );
        expect(
            &mut tally,
            "site: bad request",
            call(
                &p,
                &creds(ADMIN_T),
                &site("SweepOrphans"),
                s::SweepRequest {
                    grace_ms: None,
                    dry_run: true,
                }
                .encode_to_vec(),
                None,
            )
            .await,
            Code::InvalidArgument,
        );

        // FetchBlock at the mirror (a mount's): keys that are no block, lengths and CRCs that
        // do not match; the right one is served
        let (key, bytes) = s.block.clone();
        let fetch = |key: &str, len: u32, crc: u32, reason: &str| {
            w::FetchBlockRequest {
                key: key.into(),
                len,
                crc,
                reason: reason.into(),
            }
            .encode_to_vec()
        };
        let crc = crc32fast::hash(&bytes);
        let len = bytes.len() as u32;
        for (k, l) in [
            ("../../etc/passwd".to_string(), 0),
            ("chunks/0/0/1_0_10/../../x".to_string(), 10),
            (format!("{key}\0"), len),
            (key.replace("chunks/", "chunks//"), len),
            (String::new(), 0),
            (key.clone(), len + 1),
            (key.clone(), u32::MAX),
            (
                "chunks/0/0/18446744073709551615_4294967295_4294967295".to_string(),
                u32::MAX,
            ),
        ] {
            expect(
                &mut tally,
                "fetch: not a block key, or the wrong length",
                call(
                    &m,
                    &creds(&mount_t),
                    &meta("FetchBlock"),
                    fetch(&k, l, crc, "missing"),
                    Some(msid),
                )
                .await,
                Code::InvalidArgument,
            );
        }
        let got = call(
            &m,
            &creds(&mount_t),
            &meta("FetchBlock"),
            fetch(&key, len, crc ^ 1, "corrupt"),
            Some(msid),
        )
        .await;
        tally.note("fetch: the wrong CRC", &got);
        assert!(got.is_err(), "a block whose CRC does not match was served");
        let got = call(
            &m,
            &creds(&mount_t),
            &meta("FetchBlock"),
            fetch(&key, len, crc, "\u{1}\u{7f}?"),
            Some(msid),
        )
        .await;
        tally.note("fetch: the right block", &got);
        let reply =
            w::FetchBlockReply::decode(got.expect("served").expect("a reply").as_slice()).unwrap();
        assert_eq!(reply.data, bytes);
        expect(
            &mut tally,
            "fetch: not this daemon's",
            call(
                &p,
                &creds(&mount_t),
                &meta("FetchBlock"),
                fetch(&key, len, crc, "missing"),
                None,
            )
            .await,
            Code::Unimplemented,
        );

        // the router: methods that do not exist, compressed, truncated and oversize frames,
        // calls without a session
        expect(
            &mut tally,
            "a method that does not exist",
            call(&m, &creds(&mount_t), &meta("Nope"), vec![], Some(msid)).await,
            Code::PermissionDenied,
        );
        let getattr = w::InodeRequest {
            ctx: Some(w::Ctx::default()),
            ino: 1,
        }
        .encode_to_vec();
        expect(
            &mut tally,
            "router: no session",
            call(
                &m,
                &creds(&mount_t),
                &meta("GetAttr"),
                getattr.clone(),
                None,
            )
            .await,
            Code::FailedPrecondition,
        );
        let mkdir = w::MkNodRequest {
            ctx: Some(w::Ctx::default()),
            parent: 1,
            name: b"x".to_vec(),
            mode: 0o755,
            umask: 0,
            rdev: 0,
        }
        .encode_to_vec();
        let got = call(&m, &creds(&mount_t), &meta("MkDir"), mkdir.clone(), None).await;
        tally.note("router: no session", &got);
        assert!(
            got.is_err(),
            "a forwarded change without a session was made"
        );
        expect(
            &mut tally,
            "oversize message",
            call(
                &m,
                &creds(&mount_t),
                &meta("MkDir"),
                vec![1u8; 2 << 20],
                Some(msid),
            )
            .await,
            Code::ResourceExhausted,
        );
        expect(
            &mut tally,
            "oversize message",
            call(
                &m,
                &creds(&mount_t),
                &meta("GetAttr"),
                vec![1u8; 2 << 20],
                Some(msid),
            )
            .await,
            Code::ResourceExhausted,
        );
        for (what, frame) in [
            ("compressed", [&[1u8, 0, 0, 0, 3][..], &[8, 1, 0]].concat()),
            ("truncated", vec![0u8, 0, 0, 0, 9, 8, 1]),
            ("length past the limit", vec![0u8, 0xff, 0xff, 0xff, 0xff]),
        ] {
            for method in ["GetAttr", "MkDir", "WriteSlice", "Open"] {
                let got = raw_grpc::call_framed(
                    raw_grpc::channel(&m, &creds(&mount_t)),
                    &meta(method),
                    frame.clone(),
                    &[("x-strait-session", msid.to_string())],
                )
                .await;
                tally.note(&format!("router: a {what} frame"), &got);
                assert!(got.is_err(), "{what} {method}: {got:?}");
            }
        }
        // a forwarded write naming a slice the primary never gave this mount: nothing is
        // uploaded, nothing changes
        let write = w::WriteSliceRequest {
            ino: 1,
            index: 0,
            slice: Some(w::SliceRef {
                id: 987_654_321,
                size: 10,
                off: 0,
                len: 10,
                pos: 0,
                crcs: vec![],
            }),
            mtime_ns: 0,
        }
        .encode_to_vec();
        let got = call(&m, &creds(&mount_t), &meta("WriteSlice"), write, Some(msid)).await;
        tally.note("router: a slice not given to this mount", &got);
        assert!(got.is_err());
    });
    let after = rt.block_on(digest(&p));
    assert_eq!(
        after, before,
        "a refused call changed the primary's metadata"
    );

    // random bytes to every metadata and site method, at both daemons, with the roles that may
    // call them (operators' sweeps and pauses excepted: they act on purpose)
    let seed = crate::support::seed("site random messages");
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let psid = rt.block_on(open_session(&p, &mount_t));
    for (path, allowed) in policy::methods() {
        if !(path.starts_with(META) || path.starts_with(SITE)) {
            continue;
        }
        if path.ends_with("/SweepOrphans") || path.ends_with("/Pause") || path.ends_with("/Gc") {
            continue;
        }
        let token = if allowed.contains(Role::Mount) {
            mount_t.clone()
        } else if allowed.contains(Role::Mirror) {
            MIRROR_T.to_string()
        } else {
            ADMIN_T.to_string()
        };
        for (addr, sid) in [(&p, psid), (&m, msid)] {
            for _ in 0..25 {
                let len = match next() % 3 {
                    0 => (next() % 8) as usize,
                    1 => (next() % 200) as usize,
                    _ => (next() % 3000) as usize,
                };
                let body: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                let got = rt.block_on(call(addr, &creds(&token), &path, body, Some(sid)));
                tally.note("random bytes as a message", &got);
            }
        }
    }
    tally.print(&format!("site daemons: hostile calls (random seed {seed})"));

    // both daemons live, never panicked, and the mirror still holds the primary's metadata
    for d in [&s.primary, &s.mirror] {
        let log = d.log_text();
        assert!(!log.contains("panicked"), "a daemon panicked:\n{log}");
    }
    let (_, v) = rt.block_on(digest(&p));
    wait_applied(&s.mirror, v, Duration::from_secs(60));
    let out =
        crate::support::strait_ok(&["fsck", "--compare", &p, &m, "--token", ADMIN_T, "--digest"]);
    assert!(out.starts_with("match"), "fsck --compare: {out}");
}
