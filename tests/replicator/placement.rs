//! Where the replicator's three voters live decides what losing a region costs. Region A
//! acknowledges creates in `replicated` durability while region B's replicator node and its
//! mirror are down, then every daemon of region A is killed, then B's node and mirror start
//! again:
//! - with a witness region C holding node 2 (`strait dev up --witness`), nodes 2 and 3 are a
//!   majority: they elect a leader, and B's mirror applies every acknowledged create;
//! - with nodes 1 and 2 both in region A (the two-region layout), node 3 is alone: it elects
//!   no leader, and the creates never reach B. That is the loss the placement rule prevents.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::wait_until;
use strait_devkit::cluster::{Cluster, ClusterConfig};

const FILES: usize = 20;

async fn has_leader(node: SocketAddr, admin: &strait_auth::Credentials) -> bool {
    strait_replicator_client::has_leader(&node.to_string(), admin).await
}

fn content(i: usize) -> String {
    format!("acknowledged create {i} at region A\n")
}

/// What region B holds once region A is gone.
struct AfterLoss {
    /// The files of `d/` at B's mount, with their contents.
    files: Vec<(String, String)>,
    /// Whether replicator node 3 (region B) knows a leader.
    node3_has_leader: bool,
    /// From B's restart to the last file seen at B's mount (or the end of the wait).
    took: Duration,
}

/// Every create of the test, as B's mount should show it.
fn wanted() -> Vec<(String, String)> {
    let mut want: Vec<(String, String)> =
        (0..FILES).map(|i| (format!("f{i}"), content(i))).collect();
    want.sort();
    want
}

fn lose_region_a(dir: &Path, witness: bool, wait: Duration) -> AfterLoss {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cfg = ClusterConfig {
        delay_ms: 5,
        // B's mount answers from the mirror's own state, however far behind (A is gone)
        policy: "serve".into(),
        primary_args: vec!["--durability".into(), "replicated".into()],
        witness,
        ..ClusterConfig::new(crate::support::strait_bin(), dir.to_path_buf())
    };
    let mut cluster = Cluster::start(&cfg, &rt, &mut |_| {}).expect("start the regions");
    let topo = cluster.topology().clone();
    let regions = topo.replicator_regions.clone();
    let expected = if witness {
        ["A", "C", "B"]
    } else {
        ["A", "A", "B"]
    };
    assert_eq!(regions, expected, "where the replicator nodes run");
    let (ma, mb): (PathBuf, PathBuf) =
        (topo.mount_a.clone().unwrap(), topo.mount_b.clone().unwrap());
    let node3: SocketAddr = topo.replicator[2].parse().unwrap();
    let admin = topo.credentials("admin").unwrap();

    // region B's node and mirror are down while A acknowledges the creates: nothing of them
    // can reach B on the way (not even in a socket's buffer)
    cluster.signal("replicator3", libc::SIGKILL).unwrap();
    cluster.signal("mirror", libc::SIGKILL).unwrap();
    std::fs::create_dir(ma.join("d")).unwrap();
    for i in 0..FILES {
        // acknowledged once a majority of the replicator holds it (`replicated`)
        std::fs::write(ma.join(format!("d/f{i}")), content(i)).unwrap();
    }

    // all of region A dies
    cluster.signal("primary", libc::SIGKILL).unwrap();
    for (i, region) in regions.iter().enumerate() {
        if region == "A" {
            cluster
                .signal(&format!("replicator{}", i + 1), libc::SIGKILL)
                .unwrap();
        }
    }

    // region B comes back
    let start = Instant::now();
    cluster.restart("replicator3", None).unwrap();
    cluster
        .restart("mirror", Some(Duration::from_secs(60)))
        .unwrap();
    let mut files = vec![];
    while start.elapsed() < wait {
        // names first, contents after: the mirror applies the records in order
        files = read_dir(&mb.join("d"));
        if files == wanted() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let took = start.elapsed();
    // a leader, within an election's time: one may be under way at any given instant (a node
    // that restarted, a heartbeat late on a loaded machine)
    let asked = Instant::now();
    let node3_has_leader = loop {
        if rt.block_on(has_leader(node3, &admin)) {
            break true;
        }
        if asked.elapsed() > Duration::from_secs(10) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for e in cluster.unmount() {
        eprintln!("unmount: {e:#}");
    }
    AfterLoss {
        files,
        node3_has_leader,
        took,
    }
}

fn read_dir(d: &Path) -> Vec<(String, String)> {
    let Ok(rd) = std::fs::read_dir(d) else {
        return vec![];
    };
    let mut out: Vec<(String, String)> = rd
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            (name, text)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn with_a_witness_region_losing_region_a_loses_no_acknowledged_change() {
    if !crate::support::require_fuse() {
        return; // not under CI=true (said on stderr)
    }
    let work = tempfile::tempdir().unwrap();
    let got = lose_region_a(&work.path().join("dev"), true, Duration::from_secs(60));
    eprintln!(
        "witness: {} of {FILES} creates at B, {:.1} s after B's node and mirror restarted",
        got.files.len(),
        got.took.as_secs_f64()
    );
    let mut want: Vec<(String, String)> =
        (0..FILES).map(|i| (format!("f{i}"), content(i))).collect();
    want.sort();
    assert_eq!(got.files, want, "every acknowledged create, whole, at B");
    assert!(got.node3_has_leader, "nodes 2 and 3 elected a leader");
}

#[test]
fn with_two_voters_in_region_a_losing_it_loses_what_only_a_held() {
    if !crate::support::require_fuse() {
        return; // not under CI=true (said on stderr)
    }
    let work = tempfile::tempdir().unwrap();
    let got = lose_region_a(&work.path().join("dev"), false, Duration::from_secs(15));
    eprintln!(
        "two regions: {} of {FILES} creates at B after {:.1} s; node 3 has a leader: {}",
        got.files.len(),
        got.took.as_secs_f64(),
        got.node3_has_leader
    );
    assert!(
        got.files.is_empty(),
        "node 3 never held the creates, and alone it cannot learn them: {:?}",
        got.files
    );
    assert!(!got.node3_has_leader, "one node of three elects no leader");
}

/// `strait dev up --witness --durability replicated`, then `dev fault isolate=a`: nodes 2 and
/// 3 (regions C and B) still reach each other and elect a leader, and region A's primary, cut
/// off with node 1 alone, acknowledges no change until the link heals; then it does again.
#[test]
fn an_isolated_region_a_acknowledges_nothing_while_b_and_c_elect_a_leader() {
    if !crate::support::require_fuse() {
        return; // not under CI=true (said on stderr)
    }
    let work = tempfile::tempdir().unwrap();
    let dev = crate::support::dev_up::DevUp::start(
        &work.path().join("dev"),
        &[
            "--witness",
            "--durability",
            "replicated",
            "--policy",
            "serve",
            "--delay-ms",
            "5",
        ],
    );
    let topo: strait_devkit::cluster::Topology = serde_json::from_value(dev.topology()).unwrap();
    let ma = topo.mount_a.clone().unwrap();
    let admin = topo.credentials("admin").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    std::fs::write(ma.join("before"), "acknowledged before the isolation").unwrap();

    let reply = dev.fault("isolate=a");
    assert!(reply.contains("isolated region A"), "{reply}");
    // nodes 2 and 3 elect a leader of their own (node 1 may have been it)
    let start = Instant::now();
    let node3 = &topo.replicator[2];
    let node2 = &topo.replicator[1];
    let l3 = wait_until(
        "nodes 2 and 3 elected no leader of their own",
        Duration::from_secs(30),
        || {
            let (l2, l3) = rt.block_on(async {
                (
                    strait_replicator_client::leader_of(node2, &admin).await,
                    strait_replicator_client::leader_of(node3, &admin).await,
                )
            });
            if l2.is_some() && l2 == l3 && l3 != Some(1) {
                return Ok(l3);
            }
            Err(format!("node 2 sees {l2:?}, node 3 {l3:?}"))
        },
    );
    eprintln!(
        "isolated A: nodes 2 and 3 follow leader {:?} after {:.1} s",
        l3,
        start.elapsed().as_secs_f64()
    );

    // a change at A cannot reach a majority: it is not acknowledged while A is cut off
    let (tx, rx) = std::sync::mpsc::channel();
    let path = ma.join("during");
    std::thread::spawn(move || {
        let r = std::fs::write(&path, "written while region A was cut off");
        let _ = tx.send((Instant::now(), r.map_err(|e| e.to_string())));
    });
    let isolated_for = Duration::from_secs(10);
    let heal_at = Instant::now() + isolated_for;
    let during = rx.recv_timeout(isolated_for);
    if let Ok((_, Ok(()))) = &during {
        panic!("a change at the isolated region A was acknowledged");
    }
    eprintln!(
        "isolated A: the change at A {}",
        match &during {
            Ok((_, Err(e))) => format!("failed: {e}"),
            _ => format!("was still waiting after {isolated_for:?}"),
        }
    );
    assert_eq!(dev.fault("heal"), "healed");
    let healed = Instant::now();
    if during.is_err() {
        // the pending change ends one way or the other once the link is back
        let (when, r) = rx.recv_timeout(Duration::from_secs(90)).unwrap();
        assert!(when >= heal_at, "acknowledged before the heal");
        eprintln!(
            "isolated A: the pending change ended {:.1} s after the heal: {r:?}",
            when.duration_since(healed).as_secs_f64()
        );
    }
    // and A takes changes again
    wait_until(
        "A takes no change after the heal",
        Duration::from_secs(60),
        || std::fs::write(ma.join("after"), "after the heal"),
    );
    eprintln!(
        "isolated A: a change at A acknowledged {:.1} s after the heal",
        healed.elapsed().as_secs_f64()
    );
}
