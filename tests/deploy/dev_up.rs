//! `strait dev up`: deploy/README.md's installation with its files, on loopback; and with
//! `--store garage`, two regions each on its own Garage S3 server, with the mirror reaching
//! region A's Garage only through the link's fault proxy.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::dev_up::DevUp;
use crate::support::site::mirror_row;
use crate::support::{later, wait_until};

/// Block files a Garage holds (its data directory holds one file per stored block part).
fn garage_data_files(dir: &Path) -> usize {
    fn walk(p: &Path, n: &mut usize) {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                let path = e.path();
                if path.is_dir() {
                    walk(&path, n);
                } else {
                    *n += 1;
                }
            }
        }
    }
    let mut n = 0;
    walk(dir, &mut n);
    n
}

#[test]
fn dev_up_on_garage_gives_each_region_its_own_store_and_b_reads_its_copies_while_partitioned() {
    if !crate::support::require_program("garage") || !crate::support::require_fuse() {
        return; // not under CI=true (said on stderr)
    }
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("dev");
    // lazy: B copies a block when it is first read; `serve`: B answers from its own copy
    // however far behind it is (the partition below)
    let dev = DevUp::start(
        &dir,
        &[
            "--store",
            "garage",
            "--sync",
            "lazy",
            "--policy",
            "serve",
            "--link-mb-s",
            "200",
            "--delay-ms",
            "5",
        ],
    );
    let topo = dev.topology();
    let (data_a, data_b) = (
        topo["data_a"].as_str().unwrap().to_string(),
        topo["data_b"].as_str().unwrap().to_string(),
    );
    assert!(data_a.starts_with("s3://") && data_b.starts_with("s3://"));
    assert_ne!(data_a, data_b, "one store per region");
    assert_ne!(
        topo["mirror_data_a"].as_str().unwrap(),
        data_a,
        "the mirror reaches A's store through the link"
    );
    let ma = PathBuf::from(topo["mount_a"].as_str().unwrap());
    let mb = PathBuf::from(topo["mount_b"].as_str().unwrap());
    let (mirror, token) = (
        topo["mirror"].as_str().unwrap().to_string(),
        topo["token"].as_str().unwrap().to_string(),
    );

    // written at A, read at B: every block comes across the link on first read
    let data = crate::support::random_bytes(1, 9 << 20);
    std::fs::write(ma.join("f"), &data).unwrap();
    let d = &dev;
    let got = wait_until("f at B", Duration::from_secs(30), || {
        match std::fs::read(mb.join("f")) {
            Ok(b) if b.len() == data.len() => Ok(b),
            other => {
                let seen = match other {
                    Ok(b) => format!("{} bytes", b.len()),
                    Err(e) => e.to_string(),
                };
                Err(later(move || format!("{seen}\n{}", d.log_text())))
            }
        }
    });
    assert!(got == data, "B read A's bytes");
    let row = mirror_row(&mirror, &token);
    assert_eq!(row["blocks"]["fallback_reads"].as_u64(), Some(3), "{row}");
    assert_eq!(
        row["blocks"]["cross_region_read_bytes"].as_u64(),
        Some(9 << 20),
        "{row}"
    );
    // each block was kept in B's own Garage behind the reader's back
    let b_garage = dir.join("region-b/garage/data");
    wait_until(
        "B's Garage did not get the 3 blocks",
        Duration::from_secs(30),
        || {
            let n = garage_data_files(&b_garage);
            if n >= 3 {
                return Ok(());
            }
            Err(format!("B's Garage holds {n} files"))
        },
    );

    // written at B: forwarded to the primary, its blocks uploaded to A's Garage
    std::fs::write(mb.join("from-b"), b"written at B").unwrap();
    assert_eq!(std::fs::read(ma.join("from-b")).unwrap(), b"written at B");

    // the link cut: a fresh mount at B, without caches, reads B's own metadata and B's own
    // copies
    assert!(dev.fault("partition").contains("partitioned"));
    let fresh = work.path().join("fresh");
    std::fs::create_dir(&fresh).unwrap();
    let out = Command::new(crate::support::strait_bin())
        .arg("mount")
        .arg(format!("strait://{mirror}"))
        .arg(&fresh)
        .args(["--token", &token, "--background", "--cache-size", "0"])
        .args(["--mem-cache-size", "0", "--log-file"])
        .arg(work.path().join("fresh.log"))
        .envs([
            ("AWS_ACCESS_KEY_ID", strait_devkit::ACCESS_KEY),
            ("AWS_SECRET_ACCESS_KEY", strait_devkit::SECRET_KEY),
            ("AWS_REGION", strait_devkit::REGION),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mount at B: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = std::fs::read(fresh.join("f"));
    let un = Command::new(crate::support::strait_bin())
        .arg("umount")
        .arg(&fresh)
        .output()
        .unwrap();
    assert!(got.unwrap() == data, "B reads its copies with the link cut");
    assert!(
        un.status.success(),
        "{}",
        String::from_utf8_lossy(&un.stderr)
    );
    let row = mirror_row(&mirror, &token);
    assert_eq!(
        row["blocks"]["fallback_reads"].as_u64(),
        Some(3),
        "nothing more came across: {row}"
    );
    assert_eq!(dev.fault("bandwidth=0"), "no bandwidth cap now");
    assert!(dev.fault("heal").contains("healed"));
}

/// deploy/README.md's words: line continuations joined, quotes dropped, one space apart.
fn guide_words() -> String {
    let guide = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/README.md");
    std::fs::read_to_string(guide)
        .unwrap()
        .replace("\\\n", " ")
        .replace(['"', '\''], "")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every key of a TOML table, `table.key` inside tables, with its value.
fn flat(t: &toml::Table, prefix: &str, out: &mut Vec<(String, toml::Value)>) {
    for (k, v) in t {
        let key = format!("{prefix}{k}");
        match v {
            toml::Value::Table(inner) if k != "peers" => flat(inner, &format!("{key}."), out),
            v => out.push((key, v.clone())),
        }
    }
}

/// A value that the placement only moves: an address or a path of the guide's hosts.
fn moved(v: &toml::Value) -> bool {
    let s = v.to_string();
    ["10.0.", "/etc/strait", "/var/lib/strait"]
        .iter()
        .any(|m| s.contains(m))
}

/// `dev up` runs deploy/README.md's steps (the code of `strait-lab netns`, on loopback): each command
/// it runs is the guide's, in the guide's order, and each host's configuration file is the
/// guide's example with its addresses and paths moved and only dev up's own settings (the
/// list in docs/commands.md) changed.
#[test]
fn dev_up_follows_the_deploy_guide_with_its_files() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("dev");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut cfg =
        strait_devkit::cluster::ClusterConfig::new(crate::support::strait_bin(), dir.clone());
    cfg.mount = false;
    cfg.delay_ms = 1;
    let start = Instant::now();
    let cluster =
        strait_devkit::cluster::Cluster::start(&cfg, &rt, &mut |_| {}).expect("start dev up");
    eprintln!(
        "dev up (no mounts): up in {:.2} s",
        start.elapsed().as_secs_f64()
    );

    // the guide's commands, in its order
    let guide = guide_words();
    let commands = cluster.commands().to_vec();
    for c in &commands {
        eprintln!("  {c}");
        assert!(guide.contains(c.as_str()), "not in deploy/README.md: {c}");
    }
    let step = |prefix: &str| {
        commands
            .iter()
            .position(|c| c.starts_with(prefix))
            .unwrap_or_else(|| panic!("no step {prefix:?} among {commands:#?}"))
    };
    let order = [
        "strait certs token",
        "strait replicator --config",
        "strait primary --config",
        "strait mirror --config",
        "systemctl enable --now strait-replicator",
        "strait replicator init",
        "strait replicator status",
        "strait format",
        "systemctl enable --now strait-primary",
        "systemctl enable --now strait-mirror",
    ];
    let at: Vec<usize> = order.iter().map(|p| step(p)).collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "not in the guide's order: {order:?} at {at:?}"
    );

    // each file is the guide's: moved addresses and paths, and dev up's settings alone
    let settings = [
        "durability",
        "lease_ms",
        "window_ms",
        "policy",
        "sync",
        "data_url",
        "primary_data_url",
        "promotion.durability",
        "promotion.lease_ms",
    ];
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/config");
    for (region, file) in [
        ("a", "primary.toml"),
        ("a", "replicator.toml"),
        ("b", "mirror.toml"),
        ("b", "replicator.toml"),
        ("c", "replicator.toml"),
    ] {
        let read = |p: PathBuf| -> toml::Table {
            toml::from_str(&std::fs::read_to_string(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        };
        let (mut ours, mut theirs) = (vec![], vec![]);
        flat(
            &read(dir.join(format!("region-{region}/etc/{file}"))),
            "",
            &mut ours,
        );
        flat(
            &read(deploy.join(format!("region-{region}/{file}"))),
            "",
            &mut theirs,
        );
        let mut changed = vec![];
        for (k, v) in &theirs {
            match ours.iter().find(|(o, _)| o == k) {
                Some((_, mine)) if mine == v => {}
                Some(_) if moved(v) => {}
                Some(_) => changed.push(k.clone()),
                // a promoted mirror names its own listener and store here
                None if k.starts_with("promotion.advertise") => {}
                // every link is on loopback: the guide's TLS is left out (`--tls` has its own)
                None if k.starts_with("tls_") => {}
                None => panic!("{file} of region {region}: {k} is gone"),
            }
        }
        for (k, _) in &ours {
            if !theirs.iter().any(|(t, _)| t == k) && k != "peers" {
                panic!("{file} of region {region}: {k} is added");
            }
        }
        eprintln!("region-{region}/{file}: dev up's settings {changed:?}");
        for k in &changed {
            assert!(
                settings.contains(&k.as_str()),
                "{file} of region {region}: {k} differs from the guide's"
            );
        }
    }
    drop(cluster);
}
