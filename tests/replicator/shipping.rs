//! The primary ships its change log to a three-node replicator cluster. During a write storm
//! the primary daemon and the replicator's leader are SIGKILLed at the same moment:
//! - in `replicated` mode, every operation that returned success is in the replicator's log
//!   once the cluster has recovered, before the primary even comes back;
//! - in `local` mode, the operations not yet shipped were at risk: the test counts them, then
//!   restarts the primary, whose shipper sends them.
//!
//! In both modes the log is checked whole afterwards: versions 1.. without a gap or a repeat,
//! and replaying it into an empty engine gives the primary's tree.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::daemon::Primary;
use crate::support::replicator::RegionA;
use crate::support::site::{meta_client as connect, request as req};
use crate::support::{later, wait_until};
use parking_lot::Mutex;
use strait_fs_core::changelog::{Change, ChangeRecord};
use strait_proto::meta as w;
use strait_proto::meta::meta_service_client::MetaServiceClient;
use tonic::transport::Channel;

const WRITERS: usize = 4;

async fn session(c: &mut MetaServiceClient<Channel>, token: &str) -> u64 {
    c.open_session(req(
        w::OpenSessionRequest {
            info: "shipping test".into(),
            ..Default::default()
        },
        token,
        0,
    ))
    .await
    .expect("open a session")
    .into_inner()
    .session
}

async fn mkdir(
    c: &mut MetaServiceClient<Channel>,
    token: &str,
    sid: u64,
    name: &str,
) -> Result<(), tonic::Status> {
    c.mk_dir(req(
        w::MkNodRequest {
            ctx: Some(w::Ctx::default()),
            parent: 1,
            name: name.as_bytes().to_vec(),
            mode: 0o755,
            umask: 0,
            rdev: 0,
        },
        token,
        sid,
    ))
    .await
    .map(|_| ())
}

/// mkdir each of `names` at the root, through a session of its own at `p`.
async fn mkdirs(p: &Primary, names: &[&str]) {
    let mut c = connect(&p.addr).await;
    let sid = session(&mut c, &p.token).await;
    for n in names {
        mkdir(&mut c, &p.token, sid, n).await.expect("mkdir");
    }
}

async fn root_names(addr: &str, token: &str) -> BTreeSet<String> {
    try_root_names(addr, token).await.expect("list the root")
}

/// The names in the root directory, in a session of its own, or the daemon's refusal.
async fn try_root_names(addr: &str, token: &str) -> Result<BTreeSet<String>, tonic::Status> {
    let mut c = connect(addr).await;
    let sid = session(&mut c, token).await;
    let r = c
        .read_dir(req(
            w::InodeRequest {
                ctx: Some(w::Ctx::default()),
                ino: 1,
            },
            token,
            sid,
        ))
        .await?
        .into_inner();
    Ok(r.entries
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .filter(|n| n != "." && n != "..")
        .collect())
}

/// Move the region's formatted metadata under a power-loss layer, mounted where it was.
fn under_power_loss_layer(region: &RegionA) -> strait_lab::lazyfs::LazyFs {
    let meta_dir = region.fs.dir.path().join("meta");
    let backing = region.fs.dir.path().join("meta-backing");
    std::fs::rename(&meta_dir, &backing).unwrap();
    strait_lab::lazyfs::LazyFs::mount(&backing, &meta_dir).unwrap()
}

fn created_names(log: &[(u64, Vec<u8>)]) -> BTreeSet<String> {
    log.iter()
        .filter_map(|(v, b)| {
            let rec = ChangeRecord::decode(b)
                .unwrap_or_else(|e| panic!("version {v} is not a change record: {e}"));
            match rec.change {
                Change::Create {
                    parent: 1, name, ..
                } => Some(String::from_utf8_lossy(&name).into_owned()),
                _ => None,
            }
        })
        .collect()
}

/// Replay `log` into an empty engine: the names at its root.
fn replayed_root(log: &[(u64, Vec<u8>)]) -> BTreeSet<String> {
    let kv = strait_fs_core::kv::open("memory://").unwrap();
    let recs: Vec<(strait_fs_core::Version, ChangeRecord)> = log
        .iter()
        .map(|(v, b)| {
            (
                strait_fs_core::Version(*v),
                ChangeRecord::decode(b).unwrap(),
            )
        })
        .collect();
    strait_fs_core::changelog::replay(kv.as_ref(), &recs).expect("the log replays");
    let meta = strait_fs_core::meta::Meta::open(kv, Default::default()).unwrap();
    let ctx = strait_fs_core::meta::Ctx::root();
    meta.readdir(&ctx, 1)
        .expect("readdir")
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .filter(|n| n != "." && n != "..")
        .collect()
}

/// A metric's value from the primary's /metrics.
fn metric(p: &Primary, name: &str) -> Option<u64> {
    let (code, text) = p.http_get("/metrics");
    if code != 200 {
        return None;
    }
    crate::support::metric_value(&text, name).map(|v| v as u64)
}

struct Outcome {
    acknowledged: BTreeSet<String>,
    /// Acknowledged operations missing from the log after the cluster recovered.
    missing_after_crash: usize,
    versions_in_log_after_crash: u64,
}

fn storm(durability: &str) -> Outcome {
    let rt = crate::support::runtime();
    let mut region = RegionA::start(&rt);
    let mut primary = region.primary(&["--durability", durability]);
    let cluster = &mut region.cluster;
    let token = primary.token.clone();
    let paddr = primary.addr.clone();

    // the storm: WRITERS clients making directories until their first failure
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = vec![];
    for t in 0..WRITERS {
        let acked = acked.clone();
        let stop = stop.clone();
        let token = token.clone();
        let paddr = paddr.clone();
        writers.push(rt.spawn(async move {
            let mut c = connect(&paddr).await;
            let sid = session(&mut c, &token).await;
            let mut i = 0u64;
            let mut errors = 0;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("w{t}-{i}");
                i += 1;
                match mkdir(&mut c, &token, sid, &name).await {
                    Ok(_) => {
                        acked.lock().insert(name);
                    }
                    Err(_) => {
                        errors += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            errors
        }));
    }
    std::thread::sleep(Duration::from_secs(3));
    let before = acked.lock().len();
    let (_, m) = primary.http_get("/metrics");
    let sum = |k: &str| {
        m.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let appends = sum("strait_ship_append_seconds_count");
    eprintln!(
        "{durability}: {before} operations in 3 s; {appends} appends to the replicator, {:.2} ms each",
        sum("strait_ship_append_seconds_sum") * 1000.0 / appends.max(1.0)
    );

    // the primary and the replicator's leader die together
    let leader = rt.block_on(cluster.wait_leader(Duration::from_secs(30)));
    primary.kill();
    cluster.nodes.get_mut(&leader).unwrap().kill();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        rt.block_on(w).unwrap();
    }
    let acknowledged = acked.lock().clone();
    eprintln!(
        "{durability}: {} operations acknowledged; killed the primary and replicator node {leader}",
        acknowledged.len()
    );

    // the cluster recovers without the primary
    cluster.nodes.get_mut(&leader).unwrap().spawn();
    let log = rt.block_on(cluster.read_log(0, Duration::from_secs(60)));
    let versions_in_log_after_crash = log.last().map(|(v, _)| *v).unwrap_or(0);
    let in_log = created_names(&log);
    let missing_after_crash = acknowledged.difference(&in_log).count();

    // the primary comes back; its shipper sends the rest
    primary.restart();
    let local = wait_until(
        "the restarted primary did not ship its log",
        Duration::from_secs(60),
        || {
            let (shipped, local) = (
                metric(&primary, "strait_shipped_version"),
                metric(&primary, "strait_primary_version"),
            );
            if let (Some(s), Some(l)) = (shipped, local) {
                if s == l && l > 0 {
                    return Ok(l);
                }
            }
            Err(later(|| primary.log_text()))
        },
    );
    let log = rt.block_on(cluster.read_log(0, Duration::from_secs(60)));
    assert_eq!(
        log.last().map(|(v, _)| *v),
        Some(local),
        "the replicator's log ends where the primary's does"
    );
    let in_log = created_names(&log);
    let lost: Vec<_> = acknowledged.difference(&in_log).collect();
    assert!(
        lost.is_empty(),
        "acknowledged but never shipped: {} (e.g. {:?})",
        lost.len(),
        lost.first()
    );
    // the log is the primary's history: replayed, it gives the same tree
    let tree = rt.block_on(root_names(&paddr, &token));
    assert_eq!(replayed_root(&log), tree);
    assert!(tree.is_superset(&acknowledged));
    // a clean stop ships what is left before the daemon exits
    let last_burst: Vec<String> = (0..300).map(|i| format!("last-{i}")).collect();
    rt.block_on(async {
        let mut c = connect(&paddr).await;
        let sid = session(&mut c, &token).await;
        for n in &last_burst {
            mkdir(&mut c, &token, sid, n).await.expect("mkdir");
        }
    });
    assert!(primary.terminate(), "SIGTERM: {}", primary.log_text());
    let log = rt.block_on(cluster.read_log(0, Duration::from_secs(60)));
    let in_log = created_names(&log);
    assert!(
        last_burst.iter().all(|n| in_log.contains(n)),
        "a clean stop left versions unshipped: {}",
        primary.log_text()
    );
    assert!(
        !primary.log_text().contains("panicked"),
        "{}",
        primary.log_text()
    );
    Outcome {
        acknowledged,
        missing_after_crash,
        versions_in_log_after_crash,
    }
}

#[test]
fn replicated_mode_loses_no_acknowledged_operation_when_primary_and_leader_die_together() {
    let o = storm("replicated");
    eprintln!(
        "replicated: {} acknowledged, {} missing from the log after the crash ({} versions in it)",
        o.acknowledged.len(),
        o.missing_after_crash,
        o.versions_in_log_after_crash
    );
    assert_eq!(
        o.missing_after_crash, 0,
        "replicated mode acknowledged operations the replicator had not committed"
    );
}

#[test]
fn local_mode_ships_everything_after_a_restart_and_reports_what_was_at_risk() {
    let o = storm("local");
    eprintln!(
        "local: {} acknowledged, {} of them not in the replicator's log after the crash (at risk \
         had the primary's disk been lost); {} versions in the log",
        o.acknowledged.len(),
        o.missing_after_crash,
        o.versions_in_log_after_crash
    );
}

/// A session at `primary` that made one change ("before"); then another primary is promoted:
/// the replicator's epoch moves past this one's (0).
async fn write_then_fence(
    region: &RegionA,
    primary: &Primary,
) -> (MetaServiceClient<Channel>, u64) {
    let mut c = connect(&primary.addr).await;
    let sid = session(&mut c, &primary.token).await;
    mkdir(&mut c, &primary.token, sid, "before")
        .await
        .expect("a write before the fence");
    let lc = crate::support::replicator::log_client(&region.addrs);
    lc.bump_epoch(strait_fs_core::Epoch(5))
        .await
        .expect("bump the epoch");
    (c, sid)
}

#[test]
fn a_fenced_primary_stops_shipping_and_fails_replicated_writes_at_once() {
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let primary = region.primary(&["--durability", "replicated"]);
    let cluster = &region.cluster;
    let token = primary.token.clone();
    rt.block_on(async {
        let (mut c, sid) = write_then_fence(&region, &primary).await;
        let start = Instant::now();
        let err = mkdir(&mut c, &token, sid, "after")
            .await
            .expect_err("a fenced primary must not acknowledge a replicated write");
        // EIO when it committed locally before it learned (its replication then failed),
        // EROFS when its heartbeat had already told it
        let errno = strait_proto::status_errno(&err);
        assert!(
            errno == Some(libc::EIO) || errno == Some(libc::EROFS),
            "{err:?}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the write waited {:?} instead of failing at once",
            start.elapsed()
        );
        assert!(err.message().contains("fenced"), "{err:?}");
        // from then on it commits nothing: EROFS before anything is written
        let err = mkdir(&mut c, &token, sid, "later")
            .await
            .expect_err("a fenced primary takes no changes");
        assert_eq!(
            strait_proto::status_errno(&err),
            Some(libc::EROFS),
            "{err:?}"
        );
    });
    // said once in the log, and nothing of the fenced primary reached the replicator
    std::thread::sleep(Duration::from_secs(3));
    let text = primary.log_text();
    assert_eq!(
        text.matches("shipping the change log stopped: fenced")
            .count(),
        1,
        "{text}"
    );
    let log = rt.block_on(cluster.read_log(0, Duration::from_secs(30)));
    let names = created_names(&log);
    assert!(names.contains("before"));
    assert!(!names.contains("after"));
}

/// In `local` durability nothing waits for the replicator, so only the fence stops a primary
/// whose epoch was superseded: its heartbeat learns it within a heartbeat period, and every
/// mutation then answers EROFS (reads go on).
#[test]
fn a_fenced_primary_in_local_durability_refuses_changes_within_a_heartbeat() {
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let primary = region.primary(&["--durability", "local"]);
    let token = primary.token.clone();
    rt.block_on(async {
        let (mut c, sid) = write_then_fence(&region, &primary).await;
        let start = Instant::now();
        let mut n = 0;
        let err = loop {
            n += 1;
            match mkdir(&mut c, &token, sid, &format!("after-{n}")).await {
                Ok(()) if start.elapsed() < Duration::from_secs(10) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(()) => panic!("still taking changes 10 s after the epoch moved on"),
                Err(e) => break e,
            }
        };
        assert_eq!(
            strait_proto::status_errno(&err),
            Some(libc::EROFS),
            "{err:?}"
        );
        assert!(err.message().contains("fenced"), "{err:?}");
        println!(
            "refused changes {:?} after the epoch moved on ({} accepted before)",
            start.elapsed(),
            n - 1
        );
        // and keeps refusing, while reads still work
        let err = mkdir(&mut c, &token, sid, "later")
            .await
            .expect_err("a fenced primary takes no changes");
        assert_eq!(
            strait_proto::status_errno(&err),
            Some(libc::EROFS),
            "{err:?}"
        );
        c.stat_fs(req(w::Empty {}, &token, sid))
            .await
            .expect("reads go on");
    });
}

/// Copy a directory tree (a stopped daemon's RocksDB directory).
fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// The primary's shipped version, from its metrics.
fn shipped(p: &Primary) -> u64 {
    metric(p, "strait_shipped_version").unwrap_or(0)
}

/// A primary whose metadata went back (a power loss that dropped unsynced commits, a restore
/// from an older copy) while the replicator kept the newer versions must never splice: its new
/// records would take version numbers the replicator and the mirrors already hold with other
/// contents. It applies what it lacks from the replicator first (its outbox compared with the
/// replicator's log), takes changes only then, and the log goes on after the old history.
#[test]
fn a_primary_whose_metadata_went_back_catches_up_from_the_replicator_and_never_splices() {
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let meta_dir = region.fs.dir.path().join("meta");
    let saved = tempfile::tempdir().unwrap();
    let mut primary = region.primary(&["--durability", "replicated"]);
    let write = |p: &Primary, names: &[&str]| rt.block_on(mkdirs(p, names));
    write(&primary, &["kept-1", "kept-2"]);
    assert!(primary.terminate(), "the primary stops cleanly");
    // the older copy
    copy_tree(&meta_dir, saved.path());
    primary.restart();
    write(&primary, &["lost-1", "lost-2", "lost-3"]);
    let shipped_before = shipped(&primary);
    assert!(primary.terminate());
    // the primary's metadata goes back to the older copy; it starts again in `local`
    // durability, where nothing waits for the replicator (before the fix, these changes
    // were acknowledged, and once its versions passed the replicator's it shipped them on
    // top of the old history; then it refused every change, EROFS)
    std::fs::remove_dir_all(&meta_dir).unwrap();
    copy_tree(saved.path(), &meta_dir);
    drop(primary);
    let primary = region.primary(&["--durability", "local"]);
    let token = primary.token.clone();
    write(&primary, &["new-1", "new-2"]);
    let text = primary.log_text();
    assert!(text.contains("caught up from version"), "{text}");
    // the request records of the changes it took back were lost with them (they are not in
    // the log): a change sent again (marked as a retry) that finds no record is answered EIO
    // rather than run perhaps a second time (the daemon cannot tell which ids were lost);
    // the same call as a first attempt runs (here: EEXIST)
    rt.block_on(async {
        let mut c = connect(&primary.addr).await;
        let sid = session(&mut c, &token).await;
        let mkdir_as = |id: &str, retry: bool| {
            let mut r = req(
                w::MkNodRequest {
                    ctx: Some(w::Ctx::default()),
                    parent: 1,
                    name: b"lost-1".to_vec(),
                    mode: 0o755,
                    umask: 0,
                    rdev: 0,
                },
                &token,
                sid,
            );
            let md = r.metadata_mut();
            md.insert(strait_proto::REQUEST_ID_HEADER, id.parse().unwrap());
            if retry {
                md.insert(strait_proto::RETRY_HEADER, "2".parse().unwrap());
            }
            r
        };
        let s = c
            .mk_dir(mkdir_as("lost-1-id", true))
            .await
            .expect_err("a retry whose record was lost");
        assert_eq!(strait_proto::status_errno(&s), Some(libc::EIO), "{s:?}");
        assert!(s.message().contains("records may be missing"), "{s:?}");
        let s = c
            .mk_dir(mkdir_as("lost-1-new", false))
            .await
            .expect_err("a first attempt");
        assert_eq!(strait_proto::status_errno(&s), Some(libc::EEXIST), "{s:?}");
    });
    // the primary holds the versions it had lost, and its new changes after them
    let names = rt.block_on(root_names(&primary.addr, &token));
    for n in [
        "kept-1", "kept-2", "lost-1", "lost-2", "lost-3", "new-1", "new-2",
    ] {
        assert!(names.contains(n), "{n} is not at the primary: {names:?}");
    }
    // the replicator's log: the old history, unchanged, then the new changes, each once;
    // replayed, it gives the primary's tree
    let log = loop {
        let log = rt.block_on(region.cluster.read_log(0, Duration::from_secs(30)));
        if created_names(&log).contains("new-2") {
            break log;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let versions: Vec<u64> = log.iter().map(|(v, _)| *v).collect();
    assert!(
        versions.windows(2).all(|w| w[1] == w[0] + 1),
        "the log has gaps or repeats: {versions:?}"
    );
    let created: Vec<(u64, String)> = log
        .iter()
        .filter_map(|(v, b)| match ChangeRecord::decode(b).ok()?.change {
            Change::Create {
                parent: 1, name, ..
            } => Some((*v, String::from_utf8_lossy(&name).into_owned())),
            _ => None,
        })
        .collect();
    let order: Vec<&str> = created.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(
        order,
        ["kept-1", "kept-2", "lost-1", "lost-2", "lost-3", "new-1", "new-2"],
        "{created:?}"
    );
    assert!(created[4].0 <= shipped_before);
    assert_eq!(replayed_root(&log), names);
    // no inode number was handed out twice (the counter went back with the rest)
    rt.block_on(async {
        let mut c = connect(&primary.addr).await;
        let sid = session(&mut c, &token).await;
        let mut inos = BTreeSet::new();
        for n in &names {
            let e = c
                .lookup(req(
                    w::LookupRequest {
                        ctx: Some(w::Ctx::default()),
                        parent: 1,
                        name: n.as_bytes().to_vec(),
                    },
                    &token,
                    sid,
                ))
                .await
                .expect("lookup")
                .into_inner();
            assert!(inos.insert(e.ino), "{n}: inode {} twice", e.ino);
        }
    });
    assert!(metric(&primary, "strait_caught_up_versions_total").unwrap_or(0) >= 3);
}

/// A change at `primary` is refused: EROFS, `diverged`.
fn refuses_as_diverged(rt: &tokio::runtime::Runtime, primary: &Primary) {
    let err = rt
        .block_on(async {
            let mut c = connect(&primary.addr).await;
            let sid = session(&mut c, &primary.token).await;
            mkdir(&mut c, &primary.token, sid, "new-1").await
        })
        .expect_err("a primary whose history diverged must take no changes");
    assert_eq!(
        strait_proto::status_errno(&err),
        Some(libc::EROFS),
        "{err:?}"
    );
    assert!(err.message().contains("diverged"), "{err:?}");
}

/// The replicator leader's status once `done` holds for it (at most 30 s).
fn wait_status(
    rt: &tokio::runtime::Runtime,
    region: &RegionA,
    done: impl Fn(&strait_proto::replicator::StatusReply) -> bool,
) -> strait_proto::replicator::StatusReply {
    let lc = {
        let _in = rt.enter();
        crate::support::replicator::log_client(&region.addrs)
    };
    wait_until(
        "the replicator leader's status did not get there",
        Duration::from_secs(30),
        || {
            let st = rt.block_on(lc.status()).unwrap();
            if st.leader == Some(st.id) && done(&st) {
                return Ok(st);
            }
            Err(format!("{st:?}"))
        },
    )
}

/// Make the region's primary diverge from the replicator's log: a primary in `replicated`
/// durability writes `kept-1`, a copy of its metadata is saved, it writes `shipped`, then the
/// copy is put back and takes the changes `own` with no replicator to ship them to. Returns
/// the primary (stopped; `restart` starts it on the diverged copy, shipping again) and what
/// `beside` made once it first ran (a mirror, ...).
fn diverge<T>(
    rt: &tokio::runtime::Runtime,
    region: &RegionA,
    shipped: &[&str],
    own: &[&str],
    beside: impl FnOnce(&Primary) -> T,
) -> (Primary, T) {
    let meta_dir = region.fs.dir.path().join("meta");
    let saved = tempfile::tempdir().unwrap();
    let mut primary = region.primary(&["--durability", "replicated"]);
    let made = beside(&primary);
    rt.block_on(mkdirs(&primary, &["kept-1"]));
    assert!(primary.terminate());
    copy_tree(&meta_dir, saved.path());
    primary.restart();
    rt.block_on(mkdirs(&primary, shipped));
    // its durable mark at the log's end: only mirrors' cursors hold the log back
    wait_status(rt, region, |st| {
        st.cursors
            .iter()
            .any(|c| c.mirror == "@primary" && c.applied_version >= st.last_version)
    });
    assert!(primary.terminate());
    std::fs::remove_dir_all(&meta_dir).unwrap();
    copy_tree(saved.path(), &meta_dir);
    let mut alone = Primary::start(
        &region.fs.meta_url,
        &region.fs.env,
        &["--gc-interval-s", "0"],
    );
    rt.block_on(mkdirs(&alone, own));
    assert!(alone.terminate());
    (primary, made)
}

/// A primary whose log does not continue the replicator's (it took changes the replicator
/// never had, under versions the replicator holds with other contents) never splices and never
/// applies the replicator's records on top of its own: it says why and answers EROFS.
#[test]
fn a_primary_whose_history_diverged_takes_no_changes_and_never_splices() {
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let (primary, ()) = diverge(
        &rt,
        &region,
        &["lost-1", "lost-2", "lost-3"],
        &["other-1"],
        |_| (),
    );
    drop(primary);
    let primary = region.primary(&["--durability", "local"]);
    rt.block_on(async {
        let mut c = connect(&primary.addr).await;
        let sid = session(&mut c, &primary.token).await;
        for i in 0..3 {
            let err = mkdir(&mut c, &primary.token, sid, &format!("new-{i}"))
                .await
                .expect_err("a primary whose history diverged must take no changes");
            assert_eq!(
                strait_proto::status_errno(&err),
                Some(libc::EROFS),
                "{err:?}"
            );
            assert!(err.message().contains("diverged"), "{err:?}");
        }
    });
    let text = primary.log_text();
    assert!(text.contains("differs from the replicator's"), "{text}");
    assert!(!text.contains("caught up from version"), "{text}");
    // the replicator's log still holds the history the mirrors applied, unchanged
    let log = rt.block_on(region.cluster.read_log(0, Duration::from_secs(30)));
    let names = created_names(&log);
    for n in ["kept-1", "lost-1", "lost-2", "lost-3"] {
        assert!(names.contains(n), "{n} must stay in the log: {names:?}");
    }
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("new-") || n == "other-1"),
        "{names:?}"
    );
    // and the primary applied none of it over its own
    let at_primary = rt.block_on(root_names(&primary.addr, &primary.token));
    assert!(!at_primary.contains("lost-1"), "{at_primary:?}");
}

/// The same divergence with the older copy's own changes reaching (and passing) the
/// replicator's end: the replicator is not ahead, so there is nothing to catch up, but the
/// versions both hold differ. Resuming would take them for shipped and append after them (a
/// splice); the primary compares them first, and refuses every change.
#[test]
fn a_diverged_primary_at_or_past_the_replicators_end_takes_no_changes_and_never_splices() {
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    // one version past the replicator's end
    let (primary, ()) = diverge(
        &rt,
        &region,
        &["lost-1", "lost-2"],
        &["other-1", "other-2", "other-3"],
        |_| (),
    );
    drop(primary);
    let primary = region.primary(&["--durability", "local"]);
    refuses_as_diverged(&rt, &primary);
    // give a splicing shipper the time to append
    std::thread::sleep(Duration::from_secs(2));
    let log = rt.block_on(region.cluster.read_log(0, Duration::from_secs(30)));
    let names = created_names(&log);
    for n in ["kept-1", "lost-1", "lost-2"] {
        assert!(names.contains(n), "{n} must stay in the log: {names:?}");
    }
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("other-") || n.starts_with("new-")),
        "{names:?}"
    );
    let text = primary.log_text();
    assert!(text.contains("differs from the replicator's"), "{text}");
}

/// A copy behind the log whose part to compare was purged (every cursor passed it), while
/// the log still holds the versions it lacks: the catch-up alone would take the purged part
/// for its own and apply the rest on top of a history of its own. The replicator keeps the
/// digest of the last record it purged, and the primary's record of that version differs.
#[test]
fn a_diverged_copy_whose_part_to_compare_was_purged_is_fenced_not_caught_up() {
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let meta_dir = region.fs.dir.path().join("meta");
    let saved = tempfile::tempdir().unwrap();
    let mut primary = region.primary(&["--durability", "replicated"]);
    let mirror = Primary::mirror(&primary, "region-b", &region.addrs, &[]);
    rt.block_on(mkdirs(&primary, &["kept-1"]));
    assert!(primary.terminate());
    copy_tree(&meta_dir, saved.path());
    primary.restart();
    rt.block_on(mkdirs(&primary, &["lost-1"]));
    let at = |st: &strait_proto::replicator::StatusReply, name: &str| {
        st.cursors
            .iter()
            .find(|c| c.mirror == name)
            .map_or(0, |c| c.applied_version)
    };
    // the mirror and the primary's durable mark at lost-1's version, then the mirror held there
    let v = wait_status(&rt, &region, |st| {
        at(st, "region-b") >= st.last_version && at(st, "@primary") >= st.last_version
    })
    .last_version;
    crate::support::strait_ok(&[
        "mirror",
        "pause",
        "--addr",
        &mirror.addr,
        "--token",
        &mirror.token,
        "--seconds",
        "600",
    ]);
    rt.block_on(mkdirs(&primary, &["lost-2", "lost-3"]));
    let st = wait_status(&rt, &region, |st| {
        at(st, "@primary") >= st.last_version && st.earliest_version > v
    });
    assert_eq!(st.earliest_version, v + 1, "{st:?}");
    assert_eq!(st.purged_last_version, v, "{st:?}");
    assert!(primary.terminate());
    // the copy takes a change of its own under lost-1's version
    std::fs::remove_dir_all(&meta_dir).unwrap();
    copy_tree(saved.path(), &meta_dir);
    let mut alone = Primary::start(
        &region.fs.meta_url,
        &region.fs.env,
        &["--gc-interval-s", "0"],
    );
    rt.block_on(mkdirs(&alone, &["other-1"]));
    assert!(alone.terminate());
    let primary = region.primary(&["--durability", "local"]);
    refuses_as_diverged(&rt, &primary);
    let names = rt.block_on(root_names(&primary.addr, &primary.token));
    assert!(
        !names.contains("lost-2"),
        "nothing applied on top: {names:?}"
    );
}

/// `strait primary set-aside` on a diverged primary: the changes only it holds are listed in
/// a file, its metadata becomes a mirror's (the replicator's history) with the old engine kept
/// beside it, and started again it catches up from the log and takes changes, which the mirror
/// applies after the history it had. Refused while the primary runs, when nothing diverged,
/// and over an existing file, changing nothing.
#[test]
fn a_diverged_primary_sets_its_own_changes_aside_and_follows_the_log_again() {
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let saved = tempfile::tempdir().unwrap();
    let (mut primary, mirror) = diverge(
        &rt,
        &region,
        &["shipped-1", "shipped-2"],
        &["only-here-1", "only-here-2"],
        |p| Primary::mirror(p, "region-b", &region.addrs, &[]),
    );
    let write = |p: &Primary, names: &[&str]| rt.block_on(mkdirs(p, names));
    // the mirror has the replicator's history
    wait_until(
        "the mirror never applied shipped-2",
        Duration::from_secs(30),
        || {
            let names = rt.block_on(try_root_names(&mirror.addr, &mirror.token));
            if names.as_ref().is_ok_and(|n| n.contains("shipped-2")) {
                return Ok(());
            }
            Err(format!("{names:?}"))
        },
    );
    let out = saved.path().join("set-aside.txt");
    let out_s = out.to_str().unwrap().to_string();
    let replicator = region.addrs.join(",");
    let args = |out: &str| -> Vec<String> {
        [
            "primary",
            "set-aside",
            "--meta-url",
            &region.fs.meta_url,
            "--replicator",
            &replicator,
            "--from-mirror",
            &mirror.addr,
            "--token",
            &mirror.token,
            "--replicator-token",
            crate::support::replicator::ADMIN_TOKEN,
            "--out",
            out,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let run =
        |a: &[String]| crate::support::strait_ok(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let fails = |a: &[String]| {
        crate::support::strait_fails(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    // the mirror applied every record and the primary's durable mark passed them: the log is
    // purged up to its last record
    let st = wait_status(&rt, &region, |st| st.earliest_version >= st.last_version);
    assert_eq!(
        st.earliest_version, st.last_version,
        "the last record stays"
    );
    // refused while the primary runs; the primary itself takes no change: its record of the
    // log's last version differs from the replicator's
    primary.restart();
    refuses_as_diverged(&rt, &primary);
    let (_, err) = fails(&args(&out_s));
    assert!(err.contains("still running"), "{err}");
    assert!(!out.exists());
    assert!(primary.terminate());
    // refused over an existing file
    let taken = saved.path().join("taken.txt");
    std::fs::write(&taken, "mine").unwrap();
    let (_, err) = fails(&args(taken.to_str().unwrap()));
    assert!(err.contains("exists"), "{err}");
    assert_eq!(std::fs::read_to_string(&taken).unwrap(), "mine");

    // a mirror that cannot be reached: the list is written, the metadata unchanged
    let early = saved.path().join("early.txt");
    let mut unreachable = args(early.to_str().unwrap());
    let at = unreachable
        .iter()
        .position(|a| a == "--from-mirror")
        .unwrap()
        + 1;
    unreachable[at] = format!("127.0.0.1:{}", crate::support::free_port());
    let (_, err) = fails(&unreachable);
    assert!(err.contains("the metadata is unchanged"), "{err}");
    assert!(std::fs::read_to_string(&early)
        .unwrap()
        .contains("only-here-2"));
    assert!(!region.fs.dir.path().join("meta.loading").exists());

    let said = run(&args(&out_s));
    let list = std::fs::read_to_string(&out).unwrap();
    let changes: Vec<&str> = list.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(
        said.contains(&format!("set aside {} changes", changes.len())),
        "{said}"
    );
    // the two changes only this primary made, last; before them, when the log no longer
    // holds the versions to compare, the outbox's records that cannot be shown equal (the
    // header says they may be in both histories)
    let n = changes.len();
    assert!(n >= 2, "{list}");
    assert!(changes[n - 2].contains("\"only-here-1\""), "{list}");
    assert!(changes[n - 1].contains("\"only-here-2\""), "{list}");
    assert!(!list.contains("\"shipped-"), "{list}");
    assert!(list.contains("differs from the replicator's"), "{list}");
    if n > 2 {
        assert!(list.contains("or were in both"), "{list}");
    }
    // the old engine is kept beside the new one
    let kept: Vec<_> = std::fs::read_dir(region.fs.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("meta.set-aside-")
        })
        .collect();
    assert_eq!(kept.len(), 1);

    // started again: it catches up and takes changes; the mirror, which follows the log,
    // shows the same tree (no change set aside reached the log)
    primary.restart();
    write(&primary, &["after-1"]);
    let at_primary = rt.block_on(root_names(&primary.addr, &primary.token));
    let want: BTreeSet<String> = ["kept-1", "shipped-1", "shipped-2", "after-1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(at_primary, want);
    wait_until("the mirror", Duration::from_secs(30), || {
        let names = rt.block_on(try_root_names(&mirror.addr, &mirror.token));
        if names.as_ref().is_ok_and(|n| *n == want) {
            return Ok(());
        }
        Err(format!("{names:?}"))
    });
    // nothing diverges any more: a second set-aside is refused
    assert!(primary.terminate());
    let again = saved.path().join("again.txt");
    let (_, err) = fails(&args(again.to_str().unwrap()));
    assert!(err.contains("nothing to set aside"), "{err}");
    assert!(!again.exists());
}

/// With a lease, a primary cut off from every replicator node refuses changes once the lease
/// has run out since the replicator last accepted something from it (another primary may have
/// been promoted meanwhile), and takes them again once the replicator answers.
#[test]
fn a_primary_cut_off_from_the_replicator_refuses_changes_when_its_lease_runs_out() {
    let rt = crate::support::runtime();
    let mut region = RegionA::start(&rt);
    let primary = region.primary(&["--durability", "local", "--lease-ms", "1500"]);
    let token = primary.token.clone();
    rt.block_on(async {
        let mut c = connect(&primary.addr).await;
        let sid = session(&mut c, &token).await;
        mkdir(&mut c, &token, sid, "before").await.expect("mkdir");
        for n in region.cluster.nodes.values_mut() {
            n.kill();
        }
        // within the lease: still taken (local durability)
        let t0 = std::time::Instant::now();
        let mut refused = None;
        for i in 0..200 {
            match mkdir(&mut c, &token, sid, &format!("cut-{i}")).await {
                Ok(()) => {}
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let e = refused.expect("a primary cut off past its lease must refuse changes");
        assert_eq!(strait_proto::status_errno(&e), Some(libc::EROFS), "{e:?}");
        assert!(e.message().contains("lease expired"), "{e:?}");
        eprintln!("refused {:?} after the replicator went away", t0.elapsed());
        for n in region.cluster.nodes.values_mut() {
            n.spawn();
        }
        // the replicator answers again: changes are taken again
        let start = std::time::Instant::now();
        loop {
            match mkdir(&mut c, &token, sid, "after").await {
                Ok(()) => break,
                Err(e) => assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "still refused after the replicator came back: {e:?}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

/// A power loss takes the primary back to its metadata's last sync (its commits are not synced
/// one by one), while a mirror's cursor can be past the versions it lost. The primary's durable
/// mark (the cursor `@primary`, synced and acknowledged every second) keeps those versions in
/// the log, so the primary catches up from them and takes changes again. Before, the log
/// purged everything below the mirror's cursor, and the primary, finding the versions it
/// lacked gone, declared itself diverged and refused every change. The metadata lives under
/// the chaos harness's power-loss layer (`strait_lab::lazyfs`).
#[test]
fn a_primary_that_lost_its_unsynced_tail_catches_up_from_the_log() {
    if !crate::support::require_fuse() {
        return;
    }
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let layer = under_power_loss_layer(&region);
    let mut primary = region.primary(&["--durability", "replicated"]);
    let token = primary.token.clone();
    rt.block_on(mkdirs(&primary, &["kept-1", "kept-2"]));
    // past a durable mark, then changes its metadata has not synced yet, which a mirror
    // applied and acknowledged at once (a fake mirror's cursor here)
    std::thread::sleep(Duration::from_millis(1500));
    let names: Vec<String> = (0..20).map(|i| format!("after-{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    rt.block_on(mkdirs(&primary, &refs));
    let lc = {
        let _in = rt.enter();
        crate::support::replicator::log_client(&region.addrs)
    };
    let last = rt.block_on(async {
        let st = lc.status().await.expect("the replicator's status");
        lc.ack(strait_proto::replicator::AckRequest {
            mirror: "a-mirror".into(),
            applied_version: st.last_version,
        })
        .await
        .expect("the mirror's cursor");
        st.last_version
    });
    // the power fails
    primary.kill();
    let lost = layer.power_loss().unwrap();
    assert!(lost.files > 0, "the power loss took nothing back: {lost:?}");
    primary.restart();
    // it takes changes again, and holds every change it acknowledged before the power loss
    rt.block_on(mkdirs(&primary, &["new-1"]));
    let have = rt.block_on(root_names(&primary.addr, &token));
    for n in ["kept-1", "kept-2", "new-1"]
        .into_iter()
        .chain(refs.iter().copied())
    {
        assert!(have.contains(n), "{n} is missing at the primary: {have:?}");
    }
    let text = primary.log_text();
    assert!(!text.contains("diverged"), "{text}");
    // the log still holds what the primary may lose to its next power loss
    let st = rt.block_on(lc.status()).unwrap();
    assert!(
        st.cursors
            .iter()
            .any(|c| c.mirror == strait_proto::replicator::PRIMARY_CURSOR),
        "no durable mark among {:?}",
        st.cursors
    );
    assert!(
        st.last_version > last,
        "the new change was not shipped: {st:?}"
    );
    drop(primary);
    drop(layer);
}

/// Found by the chaos harness (`power-loss` of region A, seed 22): a primary restarted after a
/// power loss answered reads from the state the power loss left, before it had compared it with
/// the replicator's log, so a mount saw an acknowledged change undone. In `replicated`
/// durability no call is answered from that state until the primary caught up: with the
/// replicator out of reach, a read is refused UNAVAILABLE (the client sends it again), and
/// once the replicator is back it sees every change acknowledged before the power loss.
#[test]
fn a_primary_whose_metadata_went_back_answers_no_read_before_it_caught_up() {
    if !crate::support::require_fuse() {
        return;
    }
    let rt = crate::support::runtime();
    let mut region = RegionA::start(&rt);
    let layer = under_power_loss_layer(&region);
    let mut primary = region.primary(&["--durability", "replicated"]);
    let token = primary.token.clone();
    rt.block_on(mkdirs(&primary, &["kept"]));
    std::thread::sleep(Duration::from_millis(1500));
    let names: Vec<String> = (0..20).map(|i| format!("acked-{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    rt.block_on(mkdirs(&primary, &refs));
    // the power fails, and the replicator is out of reach when the primary starts again
    primary.kill();
    let lost = layer.power_loss().unwrap();
    assert!(lost.files > 0, "the power loss took nothing back: {lost:?}");
    for n in region.cluster.nodes.values_mut() {
        n.kill();
    }
    primary.restart();
    match rt.block_on(try_root_names(&primary.addr, &token)) {
        Err(s) => assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}"),
        Ok(seen) => panic!("a read was answered before the primary caught up: {seen:?}"),
    }
    for n in region.cluster.nodes.values_mut() {
        n.spawn();
    }
    let p = &primary;
    let have = wait_until(
        "the primary did not catch up",
        Duration::from_secs(60),
        || match rt.block_on(try_root_names(&primary.addr, &token)) {
            Ok(names) => Ok(names),
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
                Err(later(move || format!("{s:?}\n{}", p.log_text())))
            }
        },
    );
    for n in std::iter::once("kept").chain(refs.iter().copied()) {
        assert!(have.contains(n), "{n} is missing at the primary: {have:?}");
    }
    drop(primary);
    drop(layer);
}
