//! `strait dev up --store garage`: two regions, each on its own Garage S3 server, with the
//! mirror reaching region A's Garage only through the link's fault proxy.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use strait_tests::dev_up::DevUp;
use strait_tests::site::mirror_row;

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
    if !strait_tests::require_program("garage") || !strait_tests::require_fuse() {
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
    let data = strait_tests::random_bytes(1, 9 << 20);
    std::fs::write(ma.join("f"), &data).unwrap();
    let start = Instant::now();
    let got = loop {
        match std::fs::read(mb.join("f")) {
            Ok(b) if b.len() == data.len() => break b,
            _ if start.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(100))
            }
            other => panic!("f at B: {other:?}\n{}", dev.log_text()),
        }
    };
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
    let start = Instant::now();
    while garage_data_files(&b_garage) < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "B's Garage holds {} files",
            garage_data_files(&b_garage)
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // written at B: forwarded to the primary, its blocks uploaded to A's Garage
    std::fs::write(mb.join("from-b"), b"written at B").unwrap();
    assert_eq!(std::fs::read(ma.join("from-b")).unwrap(), b"written at B");

    // the link cut: a fresh mount at B, without caches, reads B's own metadata and B's own
    // copies
    assert!(dev.fault("partition").contains("partitioned"));
    let fresh = work.path().join("fresh");
    std::fs::create_dir(&fresh).unwrap();
    let out = Command::new(strait_tests::strait_bin())
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
    let un = Command::new(strait_tests::strait_bin())
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
