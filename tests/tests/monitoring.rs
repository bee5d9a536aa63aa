//! `deploy/prometheus` and `deploy/grafana` against a running installation: three regions of
//! `strait dev up` (the witness placement: a primary, a mirror, three replicator nodes, both
//! regions mounted) under a write load, scraped by a real Prometheus (Debian's package) run
//! with the shipped `prometheus.yml` and `alerts.yml`, only the targets files written for
//! this installation and the intervals shortened. `promtool` checks the configuration and
//! the rules; then every query of every dashboard panel must return at least one series
//! through Prometheus's HTTP API. The test prints the panels and the series each returned.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use strait_devkit::cluster::ClusterConfig;
use strait_tests::http_get;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// `s` percent-encoded for a query string.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query's result vector, or the error Prometheus gave.
fn query(prom: &str, expr: &str) -> Result<Vec<serde_json::Value>, String> {
    let (code, body) = http_get(prom, &format!("/api/v1/query?query={}", encode(expr)));
    let v: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("{code}: {e}: {body}"))?;
    if v["status"] != "success" {
        return Err(format!("{code}: {body}"));
    }
    Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
}

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .output()
        .expect("run promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}: {said}");
    eprintln!(
        "promtool {}: {}",
        args.join(" "),
        said.trim().replace('\n', "; ")
    );
}

#[test]
fn prometheus_scrapes_every_daemon_and_each_dashboard_query_returns_series() {
    if !strait_tests::require_fuse()
        || !strait_tests::require_program("prometheus")
        || !strait_tests::require_program("promtool")
    {
        return; // not under CI=true (said on stderr)
    }
    let work = tempfile::tempdir().unwrap();
    // the shipped files, checked as they are
    let shipped = deploy_dir().join("prometheus");
    promtool(&[
        "check",
        "config",
        shipped.join("prometheus.yml").to_str().unwrap(),
    ]);
    promtool(&[
        "check",
        "rules",
        shipped.join("alerts.yml").to_str().unwrap(),
    ]);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let cfg = ClusterConfig {
        delay_ms: 5,
        witness: true,
        ..ClusterConfig::new(strait_tests::strait_bin(), work.path().join("dev"))
    };
    let (cluster, _mounts) = strait_tests::dev_up::start_cluster(&cfg, &rt);
    let topo = cluster.topology().clone();
    assert_eq!(topo.replicator_metrics.len(), 3);

    // the shipped configuration, with this installation's targets and 1 s intervals
    let conf = work.path().join("prometheus");
    std::fs::create_dir_all(conf.join("targets")).unwrap();
    let yml = std::fs::read_to_string(shipped.join("prometheus.yml"))
        .unwrap()
        .replace("scrape_interval: 15s", "scrape_interval: 1s")
        .replace("evaluation_interval: 15s", "evaluation_interval: 1s");
    std::fs::write(conf.join("prometheus.yml"), yml).unwrap();
    std::fs::copy(shipped.join("alerts.yml"), conf.join("alerts.yml")).unwrap();
    let target = |addr: &str, region: &str| {
        format!("- targets: [\"{addr}\"]\n  labels: {{region: {region}}}\n")
    };
    std::fs::write(
        conf.join("targets/primary.yml"),
        target(&topo.primary_metrics, "a"),
    )
    .unwrap();
    std::fs::write(
        conf.join("targets/mirror.yml"),
        target(&topo.mirror_metrics, "b"),
    )
    .unwrap();
    let nodes: String = topo
        .replicator_metrics
        .iter()
        .zip(&topo.replicator_regions)
        .map(|(a, r)| target(a, &r.to_lowercase()))
        .collect();
    std::fs::write(conf.join("targets/replicator.yml"), nodes).unwrap();
    promtool(&[
        "check",
        "config",
        conf.join("prometheus.yml").to_str().unwrap(),
    ]);

    let prom = format!("127.0.0.1:{}", strait_tests::free_port());
    let log = work.path().join("prometheus.log");
    let mut cmd = Command::new("prometheus");
    cmd.arg(format!(
        "--config.file={}",
        conf.join("prometheus.yml").display()
    ))
    .arg(format!(
        "--storage.tsdb.path={}",
        work.path().join("tsdb").display()
    ))
    .arg(format!("--web.listen-address={prom}"));
    let log2 = log.clone();
    let mut child = strait_devkit::process::spawn_tied_with(move || {
        let (out, err) = strait_devkit::process::open_log(&log2, false)?;
        cmd.stdout(out).stderr(err);
        Ok(cmd)
    })
    .expect("start prometheus");

    // a write load at both mounts while Prometheus scrapes
    let (ma, mb) = (topo.mount_a.clone().unwrap(), topo.mount_b.clone().unwrap());
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < Duration::from_secs(25) {
        for (m, who) in [(&ma, "a"), (&mb, "b")] {
            let p = m.join(format!("{who}-{n:05}"));
            std::fs::write(&p, vec![b'x'; 100_000 + n]).unwrap();
        }
        // and reads at B of what A wrote
        if n >= 10 {
            let _ = std::fs::read(mb.join(format!("a-{:05}", n - 10)));
        }
        n += 1;
    }
    eprintln!("load: {n} files written at each mount in 25 s");

    // every target up
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let up = query(&prom, "up").unwrap_or_default();
        let ups = up.iter().filter(|s| s["value"][1] == "1").count();
        if ups == 5 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every target is up within 30 s: {up:?}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // the rules are loaded
    let (_, rules) = http_get(&prom, "/api/v1/rules");
    let rules: serde_json::Value = serde_json::from_str(&rules).unwrap();
    let loaded = rules["data"]["groups"][0]["rules"]
        .as_array()
        .map_or(0, |r| r.len());
    assert!(loaded >= 10, "{rules}");
    // no alert about the replicator's leader or a halted mirror while all is well
    let firing = query(&prom, "ALERTS{alertstate=\"firing\"}").unwrap();
    eprintln!("alerts firing: {}", firing.len());

    // every panel's queries
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(deploy_dir().join("grafana/strait.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 12, "{} panels", panels.len());
    let mut empty = vec![];
    eprintln!("{:<42} {:>6}  query", "panel", "series");
    for p in panels {
        let title = p["title"].as_str().unwrap_or("?");
        for t in p["targets"].as_array().expect("targets") {
            let expr = t["expr"].as_str().expect("expr");
            // a rate needs two scrapes in its range: give it a few seconds
            let deadline = Instant::now() + Duration::from_secs(20);
            let got = loop {
                let got = query(&prom, expr).unwrap_or_else(|e| panic!("{title}: {expr}: {e}"));
                if !got.is_empty() || Instant::now() > deadline {
                    break got;
                }
                std::thread::sleep(Duration::from_millis(500));
            };
            eprintln!("{title:<42} {:>6}  {expr}", got.len());
            if got.is_empty() {
                empty.push(format!("{title}: {expr}"));
            }
        }
    }
    assert!(empty.is_empty(), "queries with no series: {empty:#?}");
    let _ = child.kill();
    let _ = child.wait();
    for e in cluster.unmount() {
        eprintln!("unmount: {e:#}");
    }
}
