//! A mutation sent again with its request id runs once (site's `requests.rs`): a mount whose
//! connection broke with a `RENAME_EXCHANGE` in flight sends it again, and the files must
//! not be swapped back (docs/chaos.md, finding 5), also when the daemon was killed and
//! restarted in between (the request record committed with the change answers it).

use std::time::Duration;

use crate::support::daemon::Primary;
use crate::support::mount::TestFs;
use strait_devkit::cluster::{Cluster, ClusterConfig};
use strait_proto::meta as w;
use strait_proto::meta::meta_service_client::MetaServiceClient;
use strait_proto::REQUEST_ID_HEADER;
use tonic::transport::Channel;
use tonic::{Code, Request};

const RENAME_EXCHANGE: u32 = 2;

struct Caller {
    c: MetaServiceClient<Channel>,
    token: String,
    sid: u64,
}

impl Caller {
    /// Connect to `daemon` and open a session (or resume session `resume`).
    async fn connect(daemon: &Primary, resume: u64) -> Caller {
        Caller::at(&daemon.addr, &daemon.token, resume).await
    }

    /// Connect to the site daemon at `addr` with the mount's `token`, and open a session (or
    /// resume session `resume`).
    async fn at(addr: &str, token: &str, resume: u64) -> Caller {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("connect to the daemon");
        let mut c = MetaServiceClient::new(ch);
        let mut open = Request::new(w::OpenSessionRequest {
            info: "request id test".into(),
            resume_session: resume,
            ..Default::default()
        });
        open.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ascii"),
        );
        let sid = c
            .open_session(open)
            .await
            .expect("session")
            .into_inner()
            .session;
        Caller {
            c,
            token: token.to_string(),
            sid,
        }
    }

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
        self.create_as(name, None).await.expect("create").ino
    }

    /// Create `name` in the root under request id `id`.
    async fn create_as(
        &mut self,
        name: &str,
        id: Option<&str>,
    ) -> Result<w::EntryReply, tonic::Status> {
        let r = self.req(
            w::MkNodRequest {
                ctx: Some(w::Ctx::default()),
                parent: 1,
                name: name.as_bytes().to_vec(),
                mode: 0o644,
                umask: 0,
                rdev: 0,
            },
            id,
        );
        self.c.create(r).await.map(|r| r.into_inner())
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

    /// The exchange under `id`, `again`: marked as sent before (as a mount sends a call
    /// again after its connection broke with the call in flight). It must succeed, and leave
    /// a and b with the inodes `want`.
    async fn exchange_checked(&mut self, id: &str, again: bool, want: (u64, u64), what: &str) {
        let mut r = self.exchange_req(Some(id));
        if again {
            r.metadata_mut()
                .insert(strait_proto::RETRY_HEADER, "2".parse().expect("ascii"));
        }
        if let Err(s) = self.c.rename(r).await {
            panic!("{what}: {s:?}");
        }
        let got = (self.lookup("a").await, self.lookup("b").await);
        assert_eq!(got, want, "{what}: a and b");
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
        let mut k = Caller::connect(&daemon, 0).await;
        let a = k.create("a").await;
        let b = k.create("b").await;

        // the same exchange twice under one id (a retry): swapped once; without the ids the
        // second would swap the files back
        for _ in 0..2 {
            k.exchange(Some("test-nonce-1")).await.expect("exchange");
        }
        assert_eq!((k.lookup("a").await, k.lookup("b").await), (b, a));

        // a new id is a new call: swapped back
        k.exchange_checked("test-nonce-2", false, (a, b), "exchange")
            .await;

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

        // a malformed id: refused before anything runs
        let long = "x".repeat(65);
        let s = k.exchange(Some(&long)).await.expect_err("too long");
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert_eq!((k.lookup("a").await, k.lookup("b").await), (a, b));
    });
}

#[test]
fn a_change_committed_before_a_kill_is_answered_from_its_record_after_the_restart() {
    let fs = TestFs::rocks_local(&[]);
    let mut daemon = Primary::start(&fs.meta_url, &[], &[]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");

    // an exchange and a create, each under a request id, committed and answered
    let (sid, a, b, c) = rt.block_on(async {
        let mut k = Caller::connect(&daemon, 0).await;
        let a = k.create("a").await;
        let b = k.create("b").await;
        k.exchange(Some("killed-1")).await.expect("exchange");
        let c = k.create_as("c", Some("killed-2")).await.expect("create c");
        assert_eq!((k.lookup("a").await, k.lookup("b").await), (b, a));
        (k.sid, a, b, c)
    });

    // SIGKILL: the daemon's in-memory table of results is gone with it
    daemon.kill();
    daemon.restart();

    rt.block_on(async {
        let mut k = Caller::connect(&daemon, sid).await;
        assert_eq!(k.sid, sid, "the session is resumed");
        // the same calls under the same ids, as a mount sends them after the connection
        // broke (marked as retries, or not): answered with the first results, and not run
        // again (the exchange would swap the files back, the create would answer EEXIST)
        let mut r = k.exchange_req(Some("killed-1"));
        r.metadata_mut()
            .insert(strait_proto::RETRY_HEADER, "2".parse().expect("ascii"));
        k.c.rename(r).await.expect("the exchange sent again");
        assert_eq!((k.lookup("a").await, k.lookup("b").await), (b, a));
        let again = k
            .create_as("c", Some("killed-2"))
            .await
            .expect("the create sent again");
        assert_eq!(again, c, "the first create's inode and attributes");
        assert_eq!(k.lookup("c").await, c.ino);

        // a change under an id it never committed (its first attempt failed) runs, once
        let s = k
            .create_as("a", Some("killed-3"))
            .await
            .expect_err("a exists");
        assert_eq!(strait_proto::status_errno(&s), Some(libc::EEXIST), "{s:?}");
        k.exchange(Some("killed-4")).await.expect("a new exchange");
        k.exchange_checked("killed-4", false, (a, b), "sent again")
            .await;
    });

    // two retries were answered from the records, none from memory after the restart
    let (_, metrics) = daemon.http_get("/metrics");
    assert!(
        metrics.contains("strait_requests_replayed_total 2"),
        "{metrics}"
    );
    assert!(
        daemon.log_text().contains("before this daemon started"),
        "{}",
        daemon.log_text()
    );
}

/// A change committed at the old primary whose answer its mount never got (the connection
/// broke as the primary handed over), sent again after a planned switchover: the new primary
/// answers it from its record and does not run it a second time, in both directions, and
/// through the old primary's region (now a mirror that forwards) too. The request records
/// travel with the change records, so every engine that applies the log holds them. The
/// same after an unplanned failover, where a change sent again that no primary made runs.
#[test]
fn a_change_sent_again_after_a_switchover_or_failover_is_answered_from_its_record() {
    let work = tempfile::tempdir().expect("temp dir");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let cfg = ClusterConfig {
        delay_ms: 5,
        mount: false,
        witness: true,
        primary_args: vec!["--durability".into(), "replicated".into()],
        mirror_args: vec!["--promotion-durability".into(), "replicated".into()],
        ..ClusterConfig::new(crate::support::strait_bin(), work.path().join("dev"))
    };
    let mut cluster = Cluster::start(&cfg, &rt, &mut |_| {}).expect("start the regions");
    let topo = cluster.topology().clone();
    let (a_addr, b_addr, token) = (
        topo.primary.clone(),
        topo.mirror.clone(),
        topo.token.clone(),
    );

    // at A, the primary: a and b, swapped under an id
    let (a, b) = rt.block_on(async {
        let mut k = Caller::at(&a_addr, &token, 0).await;
        let a = k.create("a").await;
        let b = k.create("b").await;
        k.exchange_checked("planned-1", false, (b, a), "exchange at A")
            .await;
        (a, b)
    });
    eprintln!("{}", cluster.switch_to_b().expect("switch to B"));

    rt.block_on(async {
        // sent again at B, the new primary, and at A, now B's mirror: the first result each
        // time; run again, the exchange would swap the files back
        let mut at_b = Caller::at(&b_addr, &token, 0).await;
        at_b.exchange_checked("planned-1", true, (b, a), "sent again at B")
            .await;
        let mut at_a = Caller::at(&a_addr, &token, 0).await;
        at_a.exchange_checked("planned-1", true, (b, a), "sent again at A's mirror")
            .await;

        // the other way: swapped back at B under an id
        at_b.exchange_checked("planned-2", false, (a, b), "exchange at B")
            .await;
    });
    eprintln!("{}", cluster.switch_back_to_a().expect("switch back to A"));

    rt.block_on(async {
        let mut at_a = Caller::at(&a_addr, &token, 0).await;
        at_a.exchange_checked("planned-2", true, (a, b), "sent again at A")
            .await;
        // a new id is a new change
        at_a.exchange_checked("planned-3", false, (b, a), "a new exchange")
            .await;
    });

    // an unplanned failover: region A killed, B promoted. The change in the log is answered
    // from its record; one never made, sent again, runs (it is in no history but B's), once
    eprintln!("{}", cluster.lose_region_a().expect("lose region A"));
    rt.block_on(async {
        let mut at_b = Caller::at(&b_addr, &token, 0).await;
        at_b.exchange_checked(
            "planned-3",
            true,
            (b, a),
            "sent again at B after the failover",
        )
        .await;
        at_b.exchange_checked(
            "never-made",
            true,
            (a, b),
            "a change sent again that no primary made runs",
        )
        .await;
        at_b.exchange_checked(
            "never-made",
            true,
            (a, b),
            "and once made, is answered from its record",
        )
        .await;
    });
}
