//! Metadata backups (docs/operations.md, "Metadata backups"): a primary keeps consistent dumps
//! of its metadata in its object store (a real Garage here), keeps the newest few, takes none
//! while nothing changes, and `strait load --store` restores one into a new engine that a
//! primary then serves with every file's bytes.

use std::process::Command;
use std::time::Duration;

use crate::support::daemon::Primary;
use crate::support::garage::Garage;
use crate::support::mount::TestFs;
use crate::support::site::primary_version;
use crate::support::strait_bin;
use crate::support::wait::wait_until;

/// `strait ARGS` with the store's credentials: whether it succeeded, stdout, stderr.
fn strait_env(env: &[(String, String)], args: &[&str]) -> (bool, String, String) {
    let out = Command::new(strait_bin())
        .args(args)
        .envs(env.iter().cloned())
        .output()
        .expect("run strait");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The backups `strait backup list` shows: (name, version), oldest first.
fn backups(fs: &TestFs) -> Vec<(String, u64)> {
    let (ok, out, err) = strait_env(&fs.env, &["backup", "list", &fs.data_url]);
    assert!(ok, "strait backup list: {err}");
    out.lines()
        .filter(|l| !l.starts_with("no metadata backup"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.get(1), Some(&"version"), "{l}");
            (f[0].to_string(), f[2].parse().expect("a version"))
        })
        .collect()
}

/// The bytes of file `i`.
fn bytes_of(i: usize) -> Vec<u8> {
    (0..(i + 1) * 7_919).map(|b| (b * 31 + i) as u8).collect()
}

#[test]
fn a_primary_backs_its_metadata_up_and_a_backup_restores_it_with_the_bytes() {
    if !crate::support::require_fuse() {
        return;
    }
    let Some(garage) = Garage::start() else {
        return;
    };
    let fs = TestFs::rocks_on(garage.data_url(), garage.env());
    let daemon = Primary::start(
        &fs.meta_url,
        &fs.env,
        &["--backup-interval-s", "1", "--backup-keep", "2"],
    );
    let m = daemon.mount(&[]);

    // files with data, then a backup of a version at least as new appears in the store
    std::fs::create_dir(m.path("team")).unwrap();
    for i in 0..20 {
        std::fs::write(m.path(&format!("team/f{i}")), bytes_of(i)).unwrap();
    }
    let v1 = primary_version(&daemon);
    assert!(v1 > 20, "{v1}");
    let first = wait_until("a backup of the files", Duration::from_secs(60), || {
        backups(&fs).into_iter().find(|b| b.1 >= v1)
    });

    // each later change is backed up too, and only the newest two are kept
    let mut names = vec![first.0.clone()];
    let mut version = first.1;
    for round in 0..2 {
        std::fs::write(m.path(&format!("team/later{round}")), b"after").unwrap();
        let newer = wait_until("a backup of the change", Duration::from_secs(60), || {
            backups(&fs).into_iter().find(|b| b.1 > version)
        });
        version = newer.1;
        names.push(newer.0);
    }
    let kept = wait_until("the oldest backup pruned", Duration::from_secs(30), || {
        let b = backups(&fs);
        (b.len() == 2).then_some(b)
    });
    assert_eq!(
        kept.iter().map(|b| b.0.clone()).collect::<Vec<_>>(),
        names[1..].to_vec()
    );
    let (older, newest) = (kept[0].clone(), kept[1].clone());

    // nothing changes: no backup is taken, though the interval passes three times
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        backups(&fs),
        kept,
        "an idle file system was backed up again"
    );
    let latest = primary_version(&daemon);
    assert_eq!(
        newest.1, latest,
        "the newest backup holds the latest version"
    );

    // `strait status` and the metrics show the newest
    let (ok, out, err) = strait_env(&fs.env, &["status", &fs.meta_url]);
    assert!(ok, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("backups:"))
        .unwrap_or_default();
    assert!(
        line.contains(&format!(
            "2 in {}; the newest: {}  version {}",
            fs.data_url, newest.0, newest.1
        )),
        "{out}"
    );
    let (_, metrics) = daemon.http_get("/metrics");
    assert!(
        metrics.contains(&format!("strait_backup_last_version {}", newest.1)),
        "{metrics}"
    );

    // the newest restored into a new engine: a primary on it serves every file's bytes
    let restored = format!("rocksdb://{}", fs.dir.path().join("restored").display());
    let (ok, out, err) = strait_env(&fs.env, &["load", &restored, "--store", &fs.data_url]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("at version {} into {restored}", newest.1)),
        "{out}{err}"
    );
    let live = strait_env(&fs.env, &["fsck", &fs.meta_url, "--digest"]);
    let back = strait_env(&fs.env, &["fsck", &restored, "--digest"]);
    assert!(live.0 && back.0, "{}{}", live.2, back.2);
    assert_eq!(live.1, back.1, "the restored metadata equals the live one");
    let second = Primary::start(
        &restored,
        &fs.env,
        &["--gc-interval-s", "0", "--backup-interval-s", "0"],
    );
    let m2 = second.mount(&[]);
    for i in 0..20 {
        assert_eq!(
            std::fs::read(m2.path(&format!("team/f{i}"))).unwrap(),
            bytes_of(i),
            "team/f{i} restored"
        );
    }
    assert_eq!(std::fs::read(m2.path("team/later1")).unwrap(), b"after");
    drop(m2);
    drop(second);

    // an older backup, named: the metadata of its version (without the later file)
    let at_older = format!("rocksdb://{}", fs.dir.path().join("older").display());
    let (ok, out, err) = strait_env(
        &fs.env,
        &[
            "load",
            &at_older,
            "--store",
            &fs.data_url,
            "--backup",
            &older.0,
        ],
    );
    assert!(ok, "{err}");
    assert!(out.contains(&format!("at version {}", older.1)), "{out}");

    // bad input changes nothing: a name no backup has, an engine that holds a file system
    let (ok, _, err) = strait_env(
        &fs.env,
        &[
            "load",
            &format!("{at_older}-2"),
            "--store",
            &fs.data_url,
            "--backup",
            "nope",
        ],
    );
    assert!(!ok);
    assert!(
        err.contains("no complete metadata backup named nope"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        !fs.dir.path().join("older-2").exists(),
        "a load that found no backup made an engine"
    );
    let typo = format!("file://{}", fs.dir.path().join("typo").display());
    let (ok, _, err) = strait_env(&fs.env, &["backup", "list", &typo]);
    assert!(!ok && err.contains("is not a directory"), "{err}");
    assert!(!fs.dir.path().join("typo").exists(), "listing made a store");
    let (ok, _, err) = strait_env(&fs.env, &["load", &at_older, "--store", &fs.data_url]);
    assert!(
        !ok,
        "a load into an engine that holds a file system was taken"
    );
    assert!(err.contains("already holds a file system"), "{err}");
    let (ok, _, err) = strait_env(&fs.env, &["load", &at_older]);
    assert!(!ok);
    assert!(err.contains("<FILE>"), "{err}");
    assert_eq!(backups(&fs), kept, "a failed load changed the store");
}
