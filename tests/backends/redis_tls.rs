//! Redis metadata over TLS (`rediss://`): a real `redis-server` listening for TLS with a
//! certificate from strait's own CA, the file system formatted, served by a primary and
//! mounted on it; without the CA, or without the client certificate a server requires, the
//! connection is refused with a clear message.

use crate::support::daemon::Primary;
use crate::support::mount::TestFs;
use crate::support::redis_server::RedisServer;
use strait_auth::certs::{issue, new_ca};
use strait_auth::Role;
use strait_devkit::redis::RedisTls;

/// A CA, the server's certificate and a client certificate, in `dir`.
fn pki(dir: &std::path::Path) -> RedisTls {
    let ca = new_ca("redis test CA", 2).unwrap();
    ca.write(dir, "ca").unwrap();
    let hosts = ["127.0.0.1".to_string(), "localhost".to_string()];
    issue(&ca, "redis", &[Role::Admin], &hosts, 1)
        .unwrap()
        .write(dir, "redis")
        .unwrap();
    issue(&ca, "client", &[Role::Admin], &[], 1)
        .unwrap()
        .write(dir, "client")
        .unwrap();
    RedisTls {
        cert: dir.join("redis.pem"),
        key: dir.join("redis.key"),
        ca: dir.join("ca.pem"),
        client_certificates: false,
    }
}

#[test]
fn a_file_system_on_rediss_is_formatted_served_and_mounted() {
    if !crate::support::require_fuse() {
        return;
    }
    let certs = tempfile::tempdir().unwrap();
    let tls = pki(certs.path());
    let Some(redis) = RedisServer::start_tls(&tls) else {
        return;
    };
    let ca = format!("ca={}", tls.ca.display());
    let url = redis.tls_url(1, &ca).unwrap();

    // without the CA the server's certificate is not trusted: a clear error, nothing written
    let data = tempfile::tempdir().unwrap();
    let data_url = format!("file://{}", data.path().display());
    let (code, err) =
        crate::support::strait_fails(&["format", &redis.tls_url(2, "").unwrap(), &data_url]);
    assert_ne!(code, 0);
    assert!(
        err.to_lowercase().contains("certificate") || err.contains("tls"),
        "{err}"
    );

    // with it: format, a primary on it, a mount through the primary
    let fs = TestFs::new(url.clone(), data_url, vec![], &[]);
    // (issue 40, finding 8) a server that acknowledges writes before they are on disk is
    // refused, in one line that says what to change, and nothing is served
    let (code, err) = crate::support::strait_fails(&[
        "primary",
        "--meta-url",
        &fs.meta_url,
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "",
        "--token",
        "a-token-of-sixteen-characters",
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("appendonly no, appendfsync everysec")
            && err.contains("appendfsync always")
            && err.contains("--accept-redis-loss"),
        "{err}"
    );
    // made durable, it is served
    for set in [["appendonly", "yes"], ["appendfsync", "always"]] {
        let ok = redis.command(&["CONFIG", "SET", set[0], set[1]]).unwrap();
        assert_eq!(ok, "+OK", "CONFIG SET {set:?}");
    }
    let primary = Primary::start(&fs.meta_url, &[], &[]);
    let m = primary.mount(&[]);
    std::fs::write(m.path("over-tls"), b"metadata in redis over TLS").unwrap();
    assert_eq!(
        std::fs::read(m.path("over-tls")).unwrap(),
        b"metadata in redis over TLS"
    );
    m.unmount();
    assert!(
        primary.log_text().contains("serving"),
        "{}",
        primary.log_text()
    );
}

#[test]
fn a_server_requiring_client_certificates_takes_only_clients_with_one() {
    let certs = tempfile::tempdir().unwrap();
    let mut tls = pki(certs.path());
    tls.client_certificates = true;
    let Some(redis) = RedisServer::start_tls(&tls) else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let data_url = format!("file://{}", data.path().display());
    let ca = format!("ca={}", tls.ca.display());
    // the CA alone: the server refuses the handshake
    let (code, err) =
        crate::support::strait_fails(&["format", &redis.tls_url(1, &ca).unwrap(), &data_url]);
    assert_ne!(code, 0, "{err}");
    // with the client certificate: formatted
    let with_cert = format!(
        "{ca}&cert={}&key={}",
        certs.path().join("client.pem").display(),
        certs.path().join("client.key").display()
    );
    let out =
        crate::support::strait_ok(&["format", &redis.tls_url(1, &with_cert).unwrap(), &data_url]);
    assert!(out.contains("formatted"), "{out}");
}
