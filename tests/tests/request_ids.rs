//! A mutation sent again with its request id runs once (site's `requests.rs`): a mount whose
//! connection broke with a `RENAME_EXCHANGE` in flight sends it again, and the files must
//! not be swapped back (docs/chaos.md, finding 5).

use std::time::Duration;

use strait_proto::meta as w;
use strait_proto::meta::meta_service_client::MetaServiceClient;
use strait_proto::REQUEST_ID_HEADER;
use strait_tests::daemon::Primary;
use strait_tests::mount::TestFs;
use tonic::transport::Channel;
use tonic::{Code, Request};

const RENAME_EXCHANGE: u32 = 2;

struct Caller {
    c: MetaServiceClient<Channel>,
    token: String,
    sid: u64,
}

impl Caller {
    fn req<T>(&self, msg: T, id: Option<&str>) -> Request<T> {
        let mut r = Request::new(msg);
        let md = r.metadata_mut();
        md.insert(
            "authorization",
            format!("Bearer {}", self.token).parse().expect("ascii"),
        );
        md.insert(
            "x-strait-session",
            self.sid.to_string().parse().expect("ascii"),
        );
        if let Some(id) = id {
            md.insert(REQUEST_ID_HEADER, id.parse().expect("ascii"));
        }
        r
    }

    async fn create(&mut self, name: &str) -> u64 {
        let r = self.req(
            w::MkNodRequest {
                ctx: Some(w::Ctx::default()),
                parent: 1,
                name: name.as_bytes().to_vec(),
                mode: 0o644,
                umask: 0,
                rdev: 0,
            },
            None,
        );
        self.c.create(r).await.expect("create").into_inner().ino
    }

    async fn lookup(&mut self, name: &str) -> u64 {
        let r = self.req(
            w::LookupRequest {
                ctx: Some(w::Ctx::default()),
                parent: 1,
                name: name.as_bytes().to_vec(),
            },
            None,
        );
        self.c.lookup(r).await.expect("lookup").into_inner().ino
    }

    /// `RENAME_EXCHANGE` of a and b in the root, under request id `id`.
    fn exchange_req(&self, id: Option<&str>) -> Request<w::RenameRequest> {
        self.req(
            w::RenameRequest {
                ctx: Some(w::Ctx::default()),
                parent: 1,
                name: b"a".to_vec(),
                new_parent: 1,
                new_name: b"b".to_vec(),
                flags: RENAME_EXCHANGE,
            },
            id,
        )
    }

    async fn exchange(&mut self, id: Option<&str>) -> Result<(), tonic::Status> {
        let r = self.exchange_req(id);
        self.c.rename(r).await.map(|_| ())
    }
}

#[test]
fn a_mutation_sent_again_with_its_request_id_runs_once() {
    let fs = TestFs::rocks_local(&[]);
    let daemon = Primary::start(&fs.meta_url, &[], &[]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", daemon.addr))
            .expect("endpoint")
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("connect to the daemon");
        let mut c = MetaServiceClient::new(ch);
        let mut open = Request::new(w::OpenSessionRequest {
            info: "request id test".into(),
            ..Default::default()
        });
        open.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", daemon.token).parse().expect("ascii"),
        );
        let sid = c
            .open_session(open)
            .await
            .expect("session")
            .into_inner()
            .session;
        let mut k = Caller {
            c,
            token: daemon.token.clone(),
            sid,
        };
        let a = k.create("a").await;
        let b = k.create("b").await;

        // the same exchange twice under one id (a retry): swapped once; without the ids the
        // second would swap the files back
        for _ in 0..2 {
            k.exchange(Some("test-nonce-1")).await.expect("exchange");
        }
        assert_eq!((k.lookup("a").await, k.lookup("b").await), (b, a));

        // a new id is a new call: swapped back
        k.exchange(Some("test-nonce-2")).await.expect("exchange");
        assert_eq!((k.lookup("a").await, k.lookup("b").await), (a, b));

        // without an id, each call runs (the old behaviour, which applied a retry twice)
        k.exchange(None).await.expect("exchange");
        k.exchange(None).await.expect("exchange");
        assert_eq!((k.lookup("a").await, k.lookup("b").await), (a, b));

        // an id first used by a call of another kind: refused, nothing changes
        let r = k.req(
            w::MkNodRequest {
                ctx: Some(w::Ctx::default()),
                parent: 1,
                name: b"c".to_vec(),
                mode: 0o644,
                umask: 0,
                rdev: 0,
            },
            Some("test-nonce-2"),
        );
        let s = k.c.create(r).await.expect_err("an id of another call");
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        let r = k.req(
            w::LookupRequest {
                ctx: Some(w::Ctx::default()),
                parent: 1,
                name: b"c".to_vec(),
            },
            None,
        );
        assert!(k.c.lookup(r).await.is_err(), "c must not exist");

        // a retry of a call first sent to another run of the daemon (its boot differs) that
        // left no result here: EIO, and nothing is applied (it may have been, before the
        // restart); a retry naming this run's boot runs
        let r = k.exchange_req(Some("test-nonce-3"));
        let boot: u64 =
            k.c.rename(r)
                .await
                .expect("exchange")
                .metadata()
                .get(strait_proto::BOOT_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .expect("the daemon names its boot");
        assert_eq!((k.lookup("a").await, k.lookup("b").await), (b, a));
        let retry = |k: &Caller, id: &str, of: u64| {
            let mut r = k.exchange_req(Some(id));
            r.metadata_mut().insert(
                strait_proto::RETRY_OF_BOOT_HEADER,
                of.to_string().parse().expect("ascii"),
            );
            r
        };
        let s =
            k.c.rename(retry(&k, "test-nonce-4", boot.wrapping_add(1)))
                .await
                .expect_err("a retry from another run of the daemon");
        assert_eq!(strait_proto::status_errno(&s), Some(libc::EIO), "{s:?}");
        assert_eq!((k.lookup("a").await, k.lookup("b").await), (b, a));
        k.c.rename(retry(&k, "test-nonce-5", boot))
            .await
            .expect("a retry of a call this run never received");
        assert_eq!((k.lookup("a").await, k.lookup("b").await), (a, b));

        // a malformed id: refused before anything runs
        let long = "x".repeat(65);
        let s = k.exchange(Some(&long)).await.expect_err("too long");
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert_eq!((k.lookup("a").await, k.lookup("b").await), (a, b));
    });
}
