//! An object store over `https` whose certificate chains to a CA of one's own: Garage behind
//! a TLS front with a certificate from strait's CA. With `ca=` in the data URL the file
//! system is formatted and mounted, and its blocks reach the store; without it the endpoint's
//! certificate is not trusted and the format fails with one clear line.

use crate::support::garage::{Garage, BUCKET, REGION};
use crate::support::mount::{Mount, TestFs};
use strait_auth::certs::{issue, new_ca};
use strait_auth::Role;
use strait_devkit::tls_front::TlsFront;

#[test]
fn a_store_behind_https_with_a_ca_of_ones_own_takes_the_blocks() {
    if !crate::support::require_fuse() {
        return;
    }
    let Some(garage) = Garage::start() else {
        return;
    };
    let certs = tempfile::tempdir().unwrap();
    let ca = new_ca("s3 test CA", 2).unwrap();
    ca.write(certs.path(), "ca").unwrap();
    let hosts = ["127.0.0.1".to_string()];
    let server = issue(&ca, "s3", &[Role::Admin], &hosts, 1).unwrap();
    let rt = crate::support::runtime();
    let front = rt
        .block_on(TlsFront::start(
            garage.s3_addr(),
            server.cert.as_bytes(),
            server.key.as_bytes(),
        ))
        .unwrap();
    let endpoint = format!("https://{}", front.addr());
    let ca_path = certs.path().join("ca.pem");

    // without the CA: not trusted, nothing formatted
    let meta = tempfile::tempdir().unwrap();
    let untrusted = format!("s3://{BUCKET}?endpoint={endpoint}&region={REGION}");
    let args = [
        "format",
        &format!("rocksdb://{}", meta.path().join("meta").display()),
        &untrusted,
    ];
    let out = std::process::Command::new(crate::support::strait_bin())
        .args(args)
        .envs(garage.env())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.to_lowercase().contains("certificate") || err.contains("tls") || err.contains("TLS"),
        "{err}"
    );

    // with it: formatted, mounted, and a file's blocks are in the store
    let trusted = format!("{untrusted}&ca={}", ca_path.display());
    let fs = TestFs::new(
        format!("rocksdb://{}", meta.path().join("meta2").display()),
        trusted,
        garage.env(),
        &[],
    );
    let m = Mount::start(&fs, &[]);
    let data = crate::support::random_bytes(3, 5 << 20);
    std::fs::write(m.path("over-https"), &data).unwrap();
    m.unmount();
    // read back with no cache: every block comes from the store, over https
    let m = Mount::start(&fs, &["--cache-size", "0", "--mem-cache-size", "0"]);
    assert!(std::fs::read(m.path("over-https")).unwrap() == data);
    m.unmount();
}
