//! `deploy/`: what an operator copies must work as it stands. The systemd units pass
//! `systemd-analyze verify` (unknown keys, bad values, a missing binary are errors), and every
//! example configuration passes its daemon's `--check-config`, with only the paths of the
//! token files and state directories moved into a scratch directory (the addresses stay).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::strait_bin;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    v.sort();
    v
}

#[test]
fn the_systemd_units_pass_systemd_analyze_verify() {
    if !crate::support::require_program("systemd-analyze") {
        return; // not under CI=true (said on stderr)
    }
    let units = files(&deploy_dir().join("systemd"), "service");
    let names: Vec<String> = units
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "strait-mirror.service",
            "strait-mount@.service",
            "strait-primary.service",
            "strait-replicator.service"
        ]
    );
    // the units name /usr/local/bin/strait: here, the binary under test
    let scratch = tempfile::tempdir().unwrap();
    let bin = strait_bin();
    let mut to_verify = vec![];
    for u in &units {
        let text = std::fs::read_to_string(u).unwrap();
        assert!(text.contains("ExecStart=/usr/local/bin/strait "), "{text}");
        let text = text.replace("/usr/local/bin/strait", &bin.to_string_lossy());
        let name = u.file_name().unwrap().to_string_lossy().into_owned();
        // a template is verified as an instance of it
        let name = name.replace("@.service", "@data.service");
        std::fs::write(scratch.path().join(&name), text).unwrap();
        to_verify.push(scratch.path().join(&name));
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&to_verify)
        .env("SYSTEMD_LOG_LEVEL", "notice")
        .output()
        .expect("run systemd-analyze");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "systemd-analyze verify: {said}");
    // warnings (an unknown key, a value it ignores) do not fail it: they must not be there
    assert!(said.trim().is_empty(), "systemd-analyze verify: {said}");
}

/// The example configurations, their paths moved under `root`: token files (written there),
/// state and cache directories.
fn moved(text: &str, root: &Path) -> String {
    text.replace("/etc/strait/", &format!("{}/etc/strait/", root.display()))
        .replace(
            "/var/lib/strait/",
            &format!("{}/var/lib/strait/", root.display()),
        )
}

#[test]
fn the_example_configurations_pass_check_config() {
    let root = tempfile::tempdir().unwrap();
    let tokens = root.path().join("etc/strait/tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    for t in strait_devkit::install::TOKENS {
        let out = Command::new(strait_bin())
            .args(["certs", "token"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        // a token file others may read is refused: the guide's are theirs alone
        strait_ids::private::write_private(&tokens.join(format!("{t}.token")), &out.stdout)
            .unwrap();
    }
    // the guide's certificates, as section 2 makes them (each host's key is its own)
    let pki = root.path().join("etc/strait/pki");
    let certs = |args: &[&str]| {
        let out = Command::new(strait_bin())
            .arg("certs")
            .args(args)
            .arg("--dir")
            .arg(&pki)
            .output()
            .unwrap();
        assert!(out.status.success(), "strait certs {args:?}: {out:?}");
    };
    certs(&["ca"]);
    for (name, roles) in strait_devkit::install::CERTIFICATES {
        let ip = strait_devkit::install::host(name).unwrap().ip.to_string();
        certs(&["issue", "--name", name, "--role", roles, "--host", &ip]);
    }
    let config = deploy_dir().join("config");
    let mut checked = vec![];
    for region in ["region-a", "region-b", "region-c"] {
        for f in files(&config.join(region), "toml") {
            let role = f.file_stem().unwrap().to_string_lossy().into_owned();
            let text = moved(&std::fs::read_to_string(&f).unwrap(), root.path());
            let path = root.path().join(format!("{region}-{role}.toml"));
            std::fs::write(&path, text).unwrap();
            let out = Command::new(strait_bin())
                .arg(&role)
                .arg("--config")
                .arg(&path)
                .arg("--check-config")
                // nothing from the environment of the test run
                .env_remove("STRAIT_TOKEN")
                .env_remove("STRAIT_TOKEN_FILE")
                .output()
                .unwrap();
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "{region}/{role}.toml: {said}");
            assert!(said.contains("the configuration"), "{said}");
            // every link it has runs TLS, and the check says so
            assert!(said.contains("link: listen 10.0."), "{said}");
            for l in said.lines().filter(|l| l.contains("link: ")) {
                assert!(l.ends_with("(TLS)"), "{region}/{role}.toml: {l}");
            }
            eprintln!("{region}/{role}.toml: {}", said.trim());
            checked.push(format!("{region}/{role}"));
        }
    }
    assert_eq!(
        checked,
        [
            "region-a/primary",
            "region-a/replicator",
            "region-b/mirror",
            "region-b/replicator",
            "region-c/replicator"
        ]
    );
    // the check refuses what the daemon would refuse: a key it does not know
    let bad = root.path().join("bad.toml");
    let text = moved(
        &std::fs::read_to_string(config.join("region-a/primary.toml")).unwrap(),
        root.path(),
    );
    std::fs::write(&bad, format!("{text}\nno_such_setting = 1\n")).unwrap();
    let out = Command::new(strait_bin())
        .args(["primary", "--config"])
        .arg(&bad)
        .arg("--check-config")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no_such_setting"), "{err}");
    // without its TLS lines, the primary's file is refused (its address is not loopback),
    // naming each plain link, unless told the network is trusted
    let plain: String = text
        .lines()
        .filter(|l| !l.starts_with("tls_"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&bad, &plain).unwrap();
    let check = |extra: &[&str]| {
        let out = Command::new(strait_bin())
            .args(["primary", "--config"])
            .arg(&bad)
            .arg("--check-config")
            .args(extra)
            .env_remove("STRAIT_TOKEN")
            .env_remove("STRAIT_TOKEN_FILE")
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), said)
    };
    let (ok, said) = check(&[]);
    assert!(!ok, "{said}");
    assert!(
        said.contains("plain text across the network")
            && said.contains("listen 10.0.1.10:7420")
            && said.contains("to the replicator 10.0.3.10:7430")
            && said.contains("--insecure-plaintext"),
        "{said}"
    );
    eprintln!("without TLS: {}", said.trim());
    let (ok, said) = check(&["--insecure-plaintext"]);
    assert!(ok, "{said}");
    assert!(
        said.contains("link: listen 10.0.1.10:7420 (PLAIN TEXT"),
        "{said}"
    );
    eprintln!("told the network is trusted: {}", said.trim());
}

/// Each region's mount file names a daemon the region's configuration serves.
#[test]
fn the_mount_files_name_their_regions_daemon() {
    let config = deploy_dir().join("config");
    for (region, daemon) in [("region-a", "primary"), ("region-b", "mirror")] {
        let env = std::fs::read_to_string(config.join(region).join("mount-data.env")).unwrap();
        let url = env
            .lines()
            .find_map(|l| l.strip_prefix("STRAIT_URL=strait://"))
            .expect("STRAIT_URL");
        let toml =
            std::fs::read_to_string(config.join(region).join(format!("{daemon}.toml"))).unwrap();
        assert!(
            toml.contains(&format!("listen = \"{url}\"")),
            "{region}: the mount names {url}, the {daemon} listens elsewhere"
        );
        for key in ["STRAIT_MOUNTPOINT=", "STRAIT_TOKEN_FILE="] {
            assert!(env.contains(key), "{region}: no {key}");
        }
    }
}
