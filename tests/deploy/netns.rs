//! deploy/README.md followed on three hosts made of network namespaces
//! (`strait_devkit::netns`: a1 10.0.1.10, b1 10.0.2.10, c1 10.0.3.10, and an operator's
//! host 10.0.0.1; 15 ms one way between hosts, 100 MB/s per host link), from deploy/'s own
//! units and configuration files, then:
//!
//! - the guide's section 5, as written: `mirror status`, a file written at a1 read at b1
//!   within the window, `fsck --compare`, each node's `/health`;
//! - writes and reads both ways (a file written at A read at B, one written at B, forwarded
//!   to the primary, read at A), and `fsck --compare` again;
//! - `deploy/prometheus` (the shipped configuration and targets, intervals shortened) run on
//!   the operator's host against the hosts under a write load: `promtool` checks it, every
//!   target is up, and every query of every panel of `deploy/grafana/strait.json` returns
//!   series through Prometheus's HTTP API (printed: panel, series, query);
//! - every operator command run appears in the guide, in its words;
//! - torn down, nothing is left: no namespace, no mount, no process.
//!
//! Needs root, iproute2, nftables, garage, prometheus and FUSE.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::wait_until;
use strait_lab::netns::{in_ns, ns_of, Deployment, NetnsConfig, OPS};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
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

/// `GET path` of `addr`, from the operator's host.
fn ops_get(addr: &str, path: &str) -> (u16, String) {
    let (addr, path) = (addr.to_string(), path.to_string());
    in_ns(&ns_of(OPS.name), move || {
        crate::support::http_get(&addr, &path)
    })
    .expect("enter the operator's namespace")
}

/// An instant query's result vector, or the error Prometheus gave.
fn query(prom: &str, expr: &str) -> Result<Vec<serde_json::Value>, String> {
    let (code, body) = ops_get(prom, &format!("/api/v1/query?query={}", encode(expr)));
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

/// The guide's text with its shell line continuations joined, quotes dropped and spaces
/// collapsed, to find a command in.
fn guide_words() -> String {
    let text = std::fs::read_to_string(deploy_dir().join("README.md")).unwrap();
    text.replace("\\\n", " ")
        .replace(['"', '\''], "")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `path` (or anything under it) is mounted.
fn mounted_under(path: &Path) -> Vec<String> {
    let p = path.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|m| m.starts_with(&p))
        })
        .map(str::to_string)
        .collect()
}

/// Processes whose command line names `path`.
fn processes_naming(path: &Path) -> Vec<String> {
    let p = path.to_string_lossy().to_string();
    let mut found = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(&p) {
            found.push(format!("{}: {cmd}", e.file_name().to_string_lossy()));
        }
    }
    found
}

/// Read `path` until it holds `want`, for up to `within`; how long it took.
fn read_until(path: &Path, want: &[u8], within: Duration) -> Duration {
    let start = Instant::now();
    wait_until(
        &format!("{} did not read as written", path.display()),
        within,
        || std::fs::read(path).ok().as_deref() == Some(want),
    );
    start.elapsed()
}

#[test]
fn the_deploy_guide_on_three_namespace_hosts_serves_both_regions_and_leaves_nothing_behind() {
    if !crate::support::require_fuse()
        || !crate::support::require_program("garage")
        || !crate::support::require_program("prometheus")
        || !crate::support::require_program("promtool")
    {
        return; // not under CI=true (said on stderr)
    }
    if let Some(m) = strait_devkit::netns::network::missing() {
        assert!(!crate::support::strict(), "{m} (CI=true: refusing to skip)");
        eprintln!("SKIPPED: {m}");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("hosts");
    let cfg = NetnsConfig {
        dir: dir.clone(),
        strait_bin: crate::support::strait_bin(),
        deploy: deploy_dir(),
        delay: Duration::from_millis(15),
        link_mb_s: 100,
        mount: true,
        log: "info".into(),
    };
    let start = Instant::now();
    let mut d = Deployment::up(cfg).expect("bring up the hosts as deploy/README.md says");
    eprintln!("up in {:.1} s:", start.elapsed().as_secs_f64());
    for (host, unit, pid) in d.services() {
        eprintln!("  {host}: {unit} (pid {pid})");
    }
    let admin = [
        ("STRAIT_TOKEN_FILE", "/etc/strait/tokens/admin.token"),
        ("STRAIT_TLS_CA", "/etc/strait/pki/ca.pem"),
    ];

    // 5. Check that it works, as the guide says
    let status = d
        .operator(
            "b1",
            &["mirror", "status", "--addr", "10.0.2.10:7440"],
            &admin,
        )
        .unwrap();
    eprintln!("mirror status: {}", status.trim().replace('\n', " | "));
    assert!(status.contains("following"), "{status}");
    let (ma, mb) = (d.mountpoint("a1"), d.mountpoint("b1"));
    std::fs::write(ma.join("hello"), b"hello\n").unwrap();
    let took = read_until(&mb.join("hello"), b"hello\n", Duration::from_secs(5));
    eprintln!(
        "hello written at a1 read at b1 after {:.0} ms",
        took.as_secs_f64() * 1e3
    );
    for (node, addr) in [
        (1, "10.0.1.10:7431"),
        (2, "10.0.3.10:7431"),
        (3, "10.0.2.10:7431"),
    ] {
        let (code, body) = ops_get(addr, "/health");
        eprintln!("node {node} /health: {code} {}", body.trim());
        assert_eq!(code, 200, "node {node}: {body}");
    }

    // both ways: a file from A read at B, and one written at B (forwarded to A) read at A
    let big: Vec<u8> = (0..(16u32 << 20)).map(|i| (i % 251) as u8).collect();
    let t = Instant::now();
    std::fs::write(ma.join("from-a.bin"), &big).unwrap();
    let wrote_a = t.elapsed();
    let took = read_until(&mb.join("from-a.bin"), &big, Duration::from_secs(30));
    eprintln!(
        "16 MiB written at a1 in {:.0} ms, read whole at b1 after {:.0} ms",
        wrote_a.as_secs_f64() * 1e3,
        took.as_secs_f64() * 1e3
    );
    let t = Instant::now();
    for i in 0..20 {
        std::fs::write(mb.join(format!("from-b-{i:02}")), format!("b{i}")).unwrap();
    }
    let per_create = t.elapsed() / 20;
    eprintln!(
        "a small file written at b1 (forwarded to the primary across the WAN): {:.1} ms each \
         (the WAN's round trip is 30 ms)",
        per_create.as_secs_f64() * 1e3
    );
    // a create and its write cross the WAN at least once each way
    assert!(
        per_create >= Duration::from_millis(30),
        "a write at b1 took {per_create:?}: it did not cross the delayed WAN"
    );
    for i in 0..20 {
        let want = format!("b{i}");
        read_until(
            &ma.join(format!("from-b-{i:02}")),
            want.as_bytes(),
            Duration::from_secs(5),
        );
    }
    let compare = d
        .operator(
            "b1",
            &["fsck", "--compare", "10.0.1.10:7420", "10.0.2.10:7440"],
            &admin,
        )
        .unwrap();
    eprintln!("fsck --compare: {}", compare.trim().replace('\n', " | "));

    // deploy/prometheus on the operator's host, with the shipped targets
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
    let conf = work.path().join("prometheus");
    std::fs::create_dir_all(conf.join("targets")).unwrap();
    let yml = std::fs::read_to_string(shipped.join("prometheus.yml"))
        .unwrap()
        .replace("scrape_interval: 15s", "scrape_interval: 1s")
        .replace("evaluation_interval: 15s", "evaluation_interval: 1s");
    std::fs::write(conf.join("prometheus.yml"), yml).unwrap();
    for f in [
        "alerts.yml",
        "targets/primary.yml",
        "targets/mirror.yml",
        "targets/replicator.yml",
    ] {
        std::fs::copy(shipped.join(f), conf.join(f)).unwrap();
    }
    let prom = format!("{}:9090", OPS.ip);
    let log = work.path().join("prometheus.log");
    let (conf2, tsdb, log2, prom2) = (
        conf.join("prometheus.yml"),
        work.path().join("tsdb"),
        log.clone(),
        prom.clone(),
    );
    let mut prometheus = strait_devkit::process::spawn_tied_with(move || {
        let (out, err) = strait_devkit::process::open_log(&log2, false)?;
        let mut c = strait_devkit::netns::nsenter(&ns_of(OPS.name), "prometheus");
        c.arg(format!("--config.file={}", conf2.display()))
            .arg(format!("--storage.tsdb.path={}", tsdb.display()))
            .arg(format!("--web.listen-address={prom2}"))
            .stdout(out)
            .stderr(err);
        Ok(c)
    })
    .expect("start prometheus");

    // a write load at both mounts while Prometheus scrapes
    let t = Instant::now();
    let mut n = 0;
    while t.elapsed() < Duration::from_secs(20) {
        for (m, who) in [(&ma, "a"), (&mb, "b")] {
            std::fs::write(m.join(format!("{who}-{n:05}")), vec![b'x'; 100_000 + n]).unwrap();
        }
        if n >= 10 {
            let _ = std::fs::read(mb.join(format!("a-{:05}", n - 10)));
        }
        n += 1;
    }
    eprintln!("load: {n} files written at each mount in 20 s");
    wait_until("not every target is up", Duration::from_secs(30), || {
        let up = query(&prom, "up").unwrap_or_default();
        if up.iter().filter(|s| s["value"][1] == "1").count() == 5 {
            return Ok(());
        }
        Err(format!(
            "{up:?}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        ))
    });
    let (_, rules) = ops_get(&prom, "/api/v1/rules");
    let rules: serde_json::Value = serde_json::from_str(&rules).unwrap();
    let loaded = rules["data"]["groups"][0]["rules"]
        .as_array()
        .map_or(0, |r| r.len());
    assert!(loaded >= 10, "{rules}");
    let firing = query(&prom, "ALERTS{alertstate=\"firing\"}").unwrap();
    eprintln!("alert rules loaded: {loaded}; firing: {}", firing.len());
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
            // a rate needs two scrapes in its range
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
    let _ = prometheus.kill();
    let _ = prometheus.wait();
    assert!(empty.is_empty(), "queries with no series: {empty:#?}");
    let wan = d.network().map_or(0, |n| n.wan_connections());
    eprintln!("connections carried across the WAN: {wan}");
    assert!(wan > 0);

    // every operator command run is the guide's
    let guide = guide_words();
    let not_in_guide: Vec<&String> = d
        .commands()
        .iter()
        .filter(|c| !guide.contains(c.as_str()))
        .collect();
    eprintln!(
        "{} operator commands run, each in deploy/README.md",
        d.commands().len()
    );
    assert!(
        not_in_guide.is_empty(),
        "run but not in deploy/README.md: {not_in_guide:#?}"
    );

    // torn down, nothing is left
    let errors = d.down();
    assert!(errors.is_empty(), "{errors:#?}");
    drop(d);
    let left = strait_devkit::netns::network::existing().unwrap();
    assert!(left.is_empty(), "namespaces left: {left:?}");
    assert!(mounted_under(&dir).is_empty(), "{:?}", mounted_under(&dir));
    let procs = processes_naming(&dir);
    assert!(procs.is_empty(), "processes left: {procs:#?}");
}
