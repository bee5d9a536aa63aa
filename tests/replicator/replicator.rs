//! Three `strait replicator` processes on 127.0.0.1, each reached by the others through a
//! fault proxy. A writer appends without pause while the leader is SIGKILLed and restarted
//! every few seconds and a follower is partitioned and healed; a subscriber, itself restarted
//! from its last ack now and then, must see every version exactly once and in order.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::replicator::{client, leader, Cluster, ADMIN_TOKEN};
use crate::support::strait_bin;
use crate::support::wait_until;
use strait_devkit::{Faults, Link};
use strait_proto::replicator as pb;

#[test]
fn every_version_once_in_order_through_leader_kills_partitions_and_subscriber_restarts() {
    let work = tempfile::tempdir().unwrap();
    let rt = crate::support::runtime();
    let mut cluster = Cluster::start(work.path(), 3);
    let direct = cluster.direct();
    let Cluster {
        nodes,
        proxies,
        egress,
    } = &mut cluster;

    const BATCH: u64 = 25;
    // the last version written; set once the writer stops
    let written = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));

    // the writer: appends batches through whichever node takes them
    let w_direct = direct.clone();
    let w_written = written.clone();
    let w_stop = stop.clone();
    let writer = rt.spawn(async move {
        let mut next = 1u64;
        let mut start = Instant::now();
        while !w_stop.load(Ordering::Relaxed) {
            let req = pb::AppendRequest {
                epoch: 0,
                first_version: next,
                records: (next..next + BATCH)
                    .map(|v| v.to_string().into_bytes())
                    .collect(),
            };
            let mut taken = false;
            for a in &w_direct {
                match client(*a).await.append(req.clone()).await {
                    Ok(r) => {
                        assert!(r.into_inner().last_version >= next + BATCH - 1);
                        taken = true;
                        break;
                    }
                    Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                        panic!("append of {next}.. refused: {s:?}")
                    }
                    Err(_) => {}
                }
            }
            if taken {
                next += BATCH;
                start = Instant::now();
                // a steady stream, not a flood: the chaos has time to happen
                tokio::time::sleep(Duration::from_millis(2)).await;
            } else {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "the cluster took no append for 30 s, at {next}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        w_written.store(next - 1, Ordering::Relaxed);
        next - 1
    });

    // the subscriber: applies records, acks every 500, and now and then "restarts": forgets
    // what it applied after its last ack and subscribes again from there
    let s_direct = direct.clone();
    let s_written = written.clone();
    let subscriber = rt.spawn(async move {
        let mut applied: Vec<u64> = vec![];
        let mut acked = 0u64;
        let mut restarts = 0u32;
        let mut last_restart = Instant::now();
        let mut turn = 0usize;
        let start = Instant::now();
        let total = || match s_written.load(Ordering::Relaxed) {
            0 => u64::MAX,
            n => n,
        };
        while (applied.len() as u64) < total() {
            assert!(
                start.elapsed() < Duration::from_secs(180),
                "the subscriber is stuck at {}",
                applied.len()
            );
            let a = s_direct[turn % s_direct.len()];
            turn += 1;
            let Ok(r) = client(a)
                .await
                .subscribe(pb::SubscribeRequest {
                    after_version: applied.len() as u64,
                })
                .await
            else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let mut s = r.into_inner();
            loop {
                // a node cut off by a partition sends nothing: move on
                let m = match tokio::time::timeout(Duration::from_secs(2), s.message()).await {
                    Ok(Ok(Some(m))) => m,
                    _ => break,
                };
                match m.kind {
                    Some(pb::subscribe_reply::Kind::Records(r)) => {
                        assert_eq!(
                            r.first_version,
                            applied.len() as u64 + 1,
                            "a gap or a repeat"
                        );
                        for rec in r.records {
                            let v: u64 = String::from_utf8(rec).unwrap().parse().unwrap();
                            assert_eq!(v, applied.len() as u64 + 1);
                            applied.push(v);
                        }
                    }
                    Some(pb::subscribe_reply::Kind::TruncatedEarliest(e)) => {
                        panic!(
                            "truncated at {e} while the subscriber was at {}",
                            applied.len()
                        )
                    }
                    _ => {}
                }
                let at = applied.len() as u64;
                if at >= acked + 500 {
                    for a in &s_direct {
                        let ack = pb::AckRequest {
                            mirror: "test-mirror".into(),
                            applied_version: at,
                        };
                        if client(*a).await.ack(ack).await.is_ok() {
                            acked = at;
                            break;
                        }
                    }
                }
                if at >= total() {
                    break;
                }
                if last_restart.elapsed() > Duration::from_secs(2) {
                    // restart: back to the last ack
                    applied.truncate(acked as usize);
                    restarts += 1;
                    last_restart = Instant::now();
                    break;
                }
            }
        }
        (applied, restarts)
    });

    // the chaos: kill the leader every 3 s, partition a follower in between; 3 kills and
    // 2 partitions, then the writer stops
    let mut kills = 0;
    let mut partitions = 0;
    let chaos_start = Instant::now();
    while kills < 3 || partitions < 2 {
        assert!(!writer.is_finished(), "the writer stopped early");
        std::thread::sleep(Duration::from_millis(1500));
        let Some(l) = rt.block_on(leader(&direct)) else {
            continue;
        };
        if kills <= partitions {
            let n = nodes.get_mut(&l).unwrap();
            n.kill();
            std::thread::sleep(Duration::from_millis(500));
            n.spawn();
            kills += 1;
        } else {
            let f = *nodes.keys().find(|&&id| id != l).unwrap();
            let cut = Link {
                blackhole: true,
                ..Link::default()
            };
            // both ways: the calls to it, and its own calls out (votes, its relay)
            let links: Vec<&strait_devkit::Proxy> = egress
                .iter()
                .filter(|((from, to), _)| *from == f || *to == f)
                .map(|(_, p)| p)
                .chain([&proxies[&f]])
                .collect();
            for p in &links {
                p.set(Faults {
                    up: cut,
                    down: cut,
                    refuse: false,
                });
            }
            std::thread::sleep(Duration::from_millis(1500));
            for p in &links {
                p.heal();
            }
            partitions += 1;
        }
        assert!(chaos_start.elapsed() < Duration::from_secs(150));
    }
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::Relaxed);
    let total = rt.block_on(writer).unwrap();
    let (applied, restarts) = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(120), subscriber).await })
        .expect("the subscriber finished")
        .unwrap();
    assert_eq!(applied, (1..=total).collect::<Vec<_>>());
    assert!(restarts >= 1, "the subscriber never restarted");
    eprintln!(
        "{total} versions; {kills} leader kills, {partitions} partitions, {restarts} subscriber restarts"
    );

    // status through the CLI names the leader, the members and the log
    let out = Command::new(strait_bin())
        .args(["replicator", "status", "--token", ADMIN_TOKEN])
        .args(["--addr", &direct[0].to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("leader"), "{text}");
    assert!(text.contains(&format!("..={total}")), "{text}");
    assert_eq!(text.matches("voter").count(), 3, "{text}");
    assert!(text.contains("test-mirror"), "{text}");

    // retention through the CLI: a cap of 1 KiB purges all but the newest batch, and a reader
    // from the start is told where the log now begins
    let out = Command::new(strait_bin())
        .args(["replicator", "retention", "--token", ADMIN_TOKEN])
        .args(["--addr", &direct[1].to_string()])
        .args(["--max-bytes", "1KiB", "--max-age", "7d"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bad = Command::new(strait_bin())
        .args(["replicator", "retention", "--token", ADMIN_TOKEN])
        .args(["--addr", &direct[1].to_string()])
        .args(["--max-bytes", "0", "--max-age", "7d"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    // the log is tracked at points set under the old caps: the new cap is met fully once
    // appends made under it follow
    rt.block_on(async {
        let lc = crate::support::replicator::log_client(&[direct[0].to_string()]);
        for b in 0..4u64 {
            let first = total + 1 + b * 25;
            lc.append(pb::AppendRequest {
                epoch: 0,
                first_version: first,
                records: (first..first + 25)
                    .map(|v| v.to_string().into_bytes())
                    .collect(),
            })
            .await
            .unwrap();
        }
    });
    let total = total + 100;
    let earliest = rt.block_on(async {
        // an append returns once the leader committed it; node 1 may be a follower that
        // applies it a moment later
        let mut tries = 0;
        let s = loop {
            let s = client(direct[0])
                .await
                .status(pb::Empty {})
                .await
                .unwrap()
                .into_inner();
            tries += 1;
            if s.last_version >= total || tries == 300 {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(
            s.last_version, total,
            "node 1 did not apply the appends within 30 s: {s:?}"
        );
        assert!(s.held_bytes <= 1024, "{} bytes held: {s:?}", s.held_bytes);
        assert!(s
            .cursors
            .iter()
            .all(|c| c.needs_bootstrap || c.applied_version + 1 >= s.earliest_version));
        s.earliest_version
    });
    assert!(earliest > total - 200, "the log still starts at {earliest}");
    rt.block_on(async {
        let mut st = client(direct[2])
            .await
            .subscribe(pb::SubscribeRequest { after_version: 0 })
            .await
            .unwrap()
            .into_inner();
        let first = tokio::time::timeout(Duration::from_secs(10), st.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match first.kind {
            Some(pb::subscribe_reply::Kind::TruncatedEarliest(e)) => assert!(e > 1),
            k => panic!("a reader from the start got {k:?}"),
        }
    });
    let text = String::from_utf8_lossy(
        &Command::new(strait_bin())
            .args(["replicator", "status", "--token", ADMIN_TOKEN])
            .args(["--addr", &direct[0].to_string()])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert!(text.contains("caps 1024 bytes"), "{text}");
}

/// `strait replicator floor` (the disk's floor for the benchmark's commit latency) writes
/// each node's file and the background files where it is told, reports figures in order, in
/// both orders of the syncs (every append in all three files), and refuses bad arguments with
/// one line.
#[test]
fn the_disk_floor_writes_its_files_reports_ordered_figures_and_refuses_bad_arguments() {
    use crate::support::strait_fails;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("floor");
    let out = short_run("floor", &d, &["--background-mbps", "8"]);
    // three node files, each holding at least the records' bytes twice (--copies 2)
    for i in 1..=3 {
        let len = std::fs::metadata(d.join(format!("node{i}.log")))
            .unwrap_or_else(|e| panic!("node{i}.log: {e}\n{out}"))
            .len();
        assert!(len >= 128 * 2, "node{i}.log holds {len} bytes\n{out}");
    }
    let background: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("background-"))
        .collect();
    assert!(!background.is_empty(), "no background file\n{out}");
    assert_ordered(&out, "records/s committed");
    assert!(
        out.contains("background") && !out.contains("background 0.0 MB/s"),
        "{out}"
    );
    // the leader first (openraft 0.9's order): every append still reaches all three files
    let lf = dir.path().join("leader-first");
    let out = short_run("floor", &lf, &["--leader-first"]);
    assert!(
        out.contains("the leader has synced and then one of two followers"),
        "{out}"
    );
    assert_ordered(&out, "records/s committed");
    let lens: Vec<u64> = (1..=3)
        .map(|i| {
            std::fs::metadata(lf.join(format!("node{i}-leader-first.log")))
                .unwrap_or_else(|e| panic!("node{i}-leader-first.log: {e}\n{out}"))
                .len()
        })
        .collect();
    assert!(
        lens[0] >= 128 * 2 && lens.iter().all(|l| *l == lens[0]),
        "{lens:?}\n{out}"
    );
    // bad arguments: one line, nothing written
    for (args, what) in [
        (vec!["--rate", "0"], "--rate"),
        (vec!["--copies", "0"], "--copies"),
        (vec!["--background-mbps=-1"], "--background-mbps"),
        (vec!["--seconds", "0"], "--seconds"),
    ] {
        let bad = dir.path().join("bad");
        let d = bad.to_str().unwrap();
        let mut full = vec!["replicator", "floor", "--dir", d];
        full.extend(args.iter().copied());
        let (code, err) = strait_fails(&full);
        assert_eq!(code, 1, "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(what), "{args:?}: {err}");
        assert!(!bad.exists(), "{args:?} created {}", bad.display());
    }
}

/// `strait replicator CMD --seconds 1 --rate 2000 --dir DIR EXTRA...`, which must succeed.
fn short_run(cmd: &str, dir: &std::path::Path, extra: &[&str]) -> String {
    let d = dir.to_str().unwrap();
    let mut args = vec![
        "replicator",
        cmd,
        "--seconds",
        "1",
        "--rate",
        "2000",
        "--dir",
        d,
    ];
    args.extend_from_slice(extra);
    crate::support::strait_ok(&args)
}

/// The first line of `out` containing `marker` reads "... p50 A ms  p99 B ms  max C ms" with
/// 0 < A <= B <= C.
fn assert_ordered(out: &str, marker: &str) {
    let line = out
        .lines()
        .find(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no line with {marker:?}\n{out}"));
    let num = |key: &str| -> f64 {
        let at = line.find(key).unwrap_or_else(|| panic!("{key} in {line}"));
        let rest = &line[at + key.len()..];
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    let (p50, p99, max) = (num(" p50 "), num(" p99 "), num(" max "));
    assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{line}");
}

/// `strait replicator bench` forms a three-node cluster, runs both phases and prints the
/// disk floors after them (syncs at once, then the leader first), each with its figures in
/// order.
#[test]
fn the_replicator_bench_runs_both_phases_and_prints_the_disk_floor() {
    use crate::support::strait_fails;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("bench");
    let out = short_run("bench", &d, &[]);
    let max_rate = out
        .lines()
        .find(|l| l.starts_with("max rate"))
        .unwrap_or_else(|| panic!("no phase 1\n{out}"));
    // "max rate (always a full batch)   N records/s committed ..."
    let words: Vec<&str> = max_rate.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "records/s").unwrap();
    let rate: f64 = words[at - 1].parse().unwrap();
    assert!(rate > 0.0, "{max_rate}");
    for marker in [
        "given rate (2000 records/s offered)",
        "disk floor",
        "append call",
    ] {
        assert!(out.contains(marker), "no {marker:?}\n{out}");
    }
    assert_ordered(&out, "given rate");
    // two floors, syncs at once then the leader first, each commit line the first after
    // its header
    let floor = &out[out.find("disk floor").unwrap()..];
    assert_ordered(floor, "records/s committed");
    let at = out
        .find("openraft 0.9's order")
        .unwrap_or_else(|| panic!("no leader-first floor\n{out}"));
    assert_ordered(&out[at..], "records/s committed");
    for i in 1..=3 {
        assert!(d.join(format!("node{i}")).is_dir(), "node{i}\n{out}");
        for name in [format!("node{i}.log"), format!("node{i}-leader-first.log")] {
            assert!(d.join("floor").join(&name).is_file(), "{name}\n{out}");
        }
    }
    // --no-floor leaves it out; a bad batch size is refused with one line
    let out = short_run("bench", &dir.path().join("no-floor"), &["--no-floor"]);
    assert!(
        out.contains("given rate") && !out.contains("disk floor"),
        "{out}"
    );
    let (code, err) = strait_fails(&["replicator", "bench", "--batch", "0"]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--batch"), "{err}");
}

/// `strait replicator forget-mirror` drops a mirror's cursor through Raft (every node loses
/// it), so the cursor no longer holds back the log's purge or the primary's GC; a name with
/// no cursor gets a non-zero exit and one readable line.
#[test]
fn forget_mirror_drops_a_cursor_everywhere_and_refuses_an_unknown_name() {
    let rt = crate::support::runtime();
    let region = crate::support::replicator::RegionA::start(&rt);
    let addrs = region.addrs.clone();
    rt.block_on(async {
        let lc = crate::support::replicator::log_client(&addrs);
        for m in ["retired", "live"] {
            lc.ack(pb::AckRequest {
                mirror: m.into(),
                applied_version: 0,
            })
            .await
            .expect("ack");
        }
    });
    let cursors = |addr: &str| -> Vec<String> {
        rt.block_on(async {
            let s = client(addr.parse().unwrap())
                .await
                .status(pb::Empty {})
                .await
                .unwrap()
                .into_inner();
            s.cursors.into_iter().map(|c| c.mirror).collect()
        })
    };
    let forget = |name: &str| {
        Command::new(strait_bin())
            .args(["replicator", "forget-mirror", "--token", ADMIN_TOKEN])
            .args(["--addr", &addrs[0], name])
            .output()
            .expect("run strait")
    };
    let out = forget("retired");
    assert!(out.status.success(), "{out:?}");
    // applied by every node
    let deadline = Instant::now() + Duration::from_secs(10);
    for a in &addrs {
        // one deadline for all the nodes: each waits for what is left of it
        let left = deadline.saturating_duration_since(Instant::now());
        wait_until(&format!("node {a} still lists"), left, || {
            let c = cursors(a);
            if c == vec!["live".to_string()] {
                return Ok(());
            }
            Err(format!("{c:?}"))
        });
    }
    let out = forget("never-was");
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("never-was"), "{err}");
    assert_eq!(cursors(&addrs[0]), vec!["live".to_string()]);
}

/// A heartbeat whose clock is more than a day from the node's is refused with a clear
/// status and changes nothing: the log's age cap counts by the primary's clock, and a clock
/// stepped years ahead would purge the whole log at once.
#[test]
fn an_impossible_heartbeat_clock_is_refused() {
    let rt = crate::support::runtime();
    let region = crate::support::replicator::RegionA::start(&rt);
    rt.block_on(async {
        let lc = crate::support::replicator::log_client(&region.addrs);
        let now = strait_fs_core::clock::now_ms();
        lc.heartbeat(pb::HeartbeatRequest {
            epoch: 0,
            primary_clock_ms: now,
            latest_version: 0,
        })
        .await
        .expect("a heartbeat with this machine's clock");
        let ten_years = 10 * 365 * 86_400_000;
        for clock in [now + ten_years, 0, u64::MAX] {
            let s = lc
                .heartbeat(pb::HeartbeatRequest {
                    epoch: 0,
                    primary_clock_ms: clock,
                    latest_version: 0,
                })
                .await
                .expect_err("an impossible clock");
            assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
            assert!(s.message().contains("more than a day"), "{s:?}");
        }
        let st = client(region.addrs[0].parse().unwrap())
            .await
            .status(pb::Empty {})
            .await
            .unwrap()
            .into_inner();
        let clock = st.heartbeat.map(|h| h.primary_clock_ms).unwrap_or(0);
        assert!(
            clock <= now + 60_000,
            "the refused clocks changed the node's: {st:?}"
        );
    });
}

/// A client that only asks for the status is never redirected: `leader_status` asks the nodes
/// in turn until the leader answers, from a follower first (the primary's GC read a
/// follower's cursors, refused them and deleted nothing for minutes after each election).
#[test]
fn leader_status_finds_the_leader_from_a_follower() {
    let rt = crate::support::runtime();
    let region = crate::support::replicator::RegionA::start(&rt);
    let leader = region.leader;
    let mut ordered: Vec<String> = region
        .cluster
        .nodes
        .values()
        .filter(|n| n.id != leader)
        .map(|n| n.addr.to_string())
        .collect();
    ordered.push(region.cluster.nodes[&leader].addr.to_string());
    rt.block_on(async {
        let lc = crate::support::replicator::log_client(&ordered);
        let any = lc.status().await.unwrap();
        assert_ne!(
            any.leader,
            Some(any.id),
            "the first node asked is a follower"
        );
        let st = lc.leader_status().await.unwrap();
        assert_eq!(st.id, leader);
        assert_eq!(st.leader, Some(leader));
        // and calls go to the leader from then on
        assert_eq!(lc.current_addr(), ordered[2]);
        let st = lc.status().await.unwrap();
        assert_eq!(st.id, leader);
    });
}

/// Every node serves `/metrics` and `/health` (`--metrics-listen`): the figures follow the
/// cluster (one leader, known to all; the log's versions, records and bytes; a mirror's
/// cursor and how far behind it is; the appends' latency at the leader), and a node cut off
/// from a quorum says it is unhealthy, with the reason.
#[test]
fn each_node_serves_metrics_and_health_that_follow_the_cluster() {
    use crate::support::{http_get, metric_value};
    let work = tempfile::tempdir().unwrap();
    let rt = crate::support::runtime();
    let cluster = Cluster::start(work.path(), 3);
    let leader_id = rt.block_on(cluster.wait_leader(Duration::from_secs(30)));
    let direct: Vec<String> = cluster.direct().iter().map(|a| a.to_string()).collect();
    rt.block_on(async {
        let lc = crate::support::replicator::log_client(&direct);
        for b in 0..4u64 {
            let first = 1 + b * 25;
            lc.append(pb::AppendRequest {
                epoch: 0,
                first_version: first,
                records: (first..first + 25)
                    .map(|v| vec![b'x'; v as usize])
                    .collect(),
            })
            .await
            .expect("append");
        }
        lc.ack(pb::AckRequest {
            mirror: "region-b".into(),
            applied_version: 60,
        })
        .await
        .expect("ack");
    });
    let bytes: u64 = (1..=100u64).sum();
    let scrape = |id: u64| {
        let (code, text) = http_get(&cluster.nodes[&id].metrics.to_string(), "/metrics");
        assert_eq!(code, 200, "node {id}'s /metrics: {text}");
        text
    };
    for &id in cluster.nodes.keys() {
        // a follower applies what the leader committed a moment later
        let text = wait_until(
            &format!("node {id} did not apply the ack"),
            Duration::from_secs(20),
            || {
                let t = scrape(id);
                if metric_value(&t, "strait_replicator_cursor_version{mirror=\"region-b\"}")
                    == Some(60.0)
                {
                    return Ok(t);
                }
                Err(format!("\n{t}"))
            },
        );
        let v = |series: &str| {
            metric_value(&text, series).unwrap_or_else(|| panic!("node {id}: no {series}:\n{text}"))
        };
        assert_eq!(
            v("strait_replicator_is_leader"),
            (id == leader_id) as u8 as f64
        );
        assert_eq!(v("strait_replicator_leader"), leader_id as f64, "node {id}");
        let state = if id == leader_id {
            "leader"
        } else {
            "follower"
        };
        assert_eq!(
            v(&format!("strait_replicator_state{{state=\"{state}\"}}")),
            1.0
        );
        assert_eq!(v("strait_replicator_voters"), 3.0);
        assert_eq!(v("strait_replicator_log_last_version"), 100.0);
        // the only cursor is at 60: the log keeps what it still needs
        assert_eq!(v("strait_replicator_log_earliest_version"), 61.0);
        assert_eq!(v("strait_replicator_log_records"), 40.0);
        assert_eq!(v("strait_replicator_log_appended_bytes"), bytes as f64);
        // counted from the mark at or before the log's start
        let held = v("strait_replicator_log_bytes");
        assert!(
            held >= (61..=100u64).sum::<u64>() as f64 && held <= bytes as f64,
            "node {id}: log bytes {held}"
        );
        assert_eq!(
            v("strait_replicator_cursor_versions_behind{mirror=\"region-b\"}"),
            40.0
        );
        assert_eq!(
            v("strait_replicator_cursor_needs_bootstrap{mirror=\"region-b\"}"),
            0.0
        );
        let applied = v("strait_replicator_raft_applied_index");
        assert!(
            applied >= 5.0 && v("strait_replicator_raft_commit_index") >= applied,
            "node {id}: applied {applied}"
        );
        assert!(v("strait_replicator_term") >= 1.0);
        let appends = metric_value(
            &text,
            "strait_replicator_append_duration_seconds_count{outcome=\"appended\"}",
        );
        if id == leader_id {
            assert_eq!(appends, Some(4.0), "the leader took the 4 appends");
            for n in 1..=3 {
                let series = format!("strait_replicator_raft_matched_index{{node=\"{n}\"}}");
                assert!(
                    metric_value(&text, &series).is_some_and(|m| m >= 1.0),
                    "the leader lists each node's match index:\n{text}"
                );
            }
        }
        let (code, health) = http_get(&cluster.nodes[&id].metrics.to_string(), "/health");
        assert_eq!(code, 200, "node {id}: {health}");
        assert!(health.contains(&format!("node {id}")), "{health}");
    }
    // every metric a node exports is in the table of docs/metrics.md
    let text = scrape(leader_id);
    assert!(text.matches("# TYPE ").count() > 20, "{text}");
    let missing = crate::support::undocumented_metrics(&text);
    assert!(missing.is_empty(), "not in docs/metrics.md: {missing:?}");
    // a call with a wrong token is counted
    let out = Command::new(strait_bin())
        .args([
            "replicator",
            "status",
            "--token",
            "not-a-token-of-this-cluster",
        ])
        .args(["--addr", &direct[0]])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let refused = metric_value(
        &scrape(1),
        "strait_replicator_rpc_refused_total{reason=\"unauthenticated\"}",
    );
    assert_eq!(refused, Some(1.0));
    // a node alone: no leader within a few elections, and /health says so
    let alone = *cluster.nodes.keys().find(|&&i| i != leader_id).unwrap();
    cluster.isolate(alone, true);
    let health = wait_until(
        &format!("node {alone}, cut off, still answers"),
        Duration::from_secs(30),
        || {
            let (code, text) = http_get(&cluster.nodes[&alone].metrics.to_string(), "/health");
            if code == 503 {
                return Ok(text);
            }
            Err(format!("{code}: {text}"))
        },
    );
    eprintln!("node {alone} alone: /health 503: {}", health.trim());
    assert!(health.contains("no leader"), "{health}");
    assert_eq!(
        metric_value(&scrape(alone), "strait_replicator_leader"),
        Some(0.0)
    );
}
