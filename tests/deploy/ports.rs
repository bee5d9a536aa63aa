//! Every port `strait dev up` listens on, probed from outside as an attacker and as each role
//! would: over plain text, with no credentials, with credentials of a role the call does not
//! admit, and with the right ones. Under `--tls` every gRPC port must refuse the first three
//! and serve the last; in the plain set-up (no TLS) a call without credentials or with the
//! wrong role is refused all the same. The test prints the table it checked.

use std::time::Duration;

use crate::support::dev_up::DevUp;
use strait_auth::{ClientTls, Conn, Credentials};
use strait_proto::meta as w;
use strait_proto::meta::meta_service_client::MetaServiceClient;
use strait_proto::replicator as pb;
use strait_proto::replicator::replicator_client::ReplicatorClient;
use strait_proto::site as s;
use strait_proto::site::site_service_client::SiteServiceClient;
use tonic::Code;

/// What a probe got.
#[derive(Debug, PartialEq)]
enum Got {
    /// No gRPC answer at all: the connection or the TLS handshake was refused.
    Refused(String),
    Unauthenticated,
    PermissionDenied,
    /// The call reached the service (its answer, or the service's own error).
    Served,
}

impl Got {
    fn of<T>(r: Result<T, tonic::Status>) -> Got {
        match r {
            Ok(_) => Got::Served,
            Err(s) => match s.code() {
                Code::Unauthenticated => Got::Unauthenticated,
                Code::PermissionDenied => Got::PermissionDenied,
                // the services' own answers to the probes (no session, no such cursor, a
                // follower naming its leader)
                Code::FailedPrecondition | Code::InvalidArgument | Code::NotFound => Got::Served,
                Code::Unavailable if s.message().contains("not the leader") => Got::Served,
                // no gRPC answer: the connection or the TLS handshake failed, which tonic
                // reports as UNAVAILABLE, UNKNOWN or INTERNAL with the transport's error
                _ => Got::Refused(format!("{:?}: {}", s.code(), s.message())),
            },
        }
    }

    fn short(&self) -> &str {
        match self {
            Got::Refused(_) => "refused (transport)",
            Got::Unauthenticated => "UNAUTHENTICATED",
            Got::PermissionDenied => "PERMISSION_DENIED",
            Got::Served => "served",
        }
    }
}

/// One gRPC call to probe a port with.
#[derive(Clone, Copy, Debug)]
enum Call {
    /// SiteService.Snapshot: mirror, admin.
    Snapshot,
    /// SiteService.Pause (hold 0: lifts nothing at a mirror that is not paused): admin.
    Pause,
    /// MetaService.StatFs without a session: mount, mirror, admin.
    StatFs,
    /// Replicator.ForgetMirror of a name with no cursor (refused by the log, nothing
    /// changes): admin.
    ForgetMirror,
}

fn channel(addr: &str, creds: &Credentials) -> Conn {
    let ep = creds
        .endpoint(addr)
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(10));
    creds.connect_lazy(ep)
}

async fn probe(addr: &str, creds: &Credentials, call: Call) -> Got {
    let ch = channel(addr, creds);
    match call {
        Call::Snapshot => Got::of(SiteServiceClient::new(ch).snapshot(s::Empty {}).await),
        Call::Pause => Got::of(
            SiteServiceClient::new(ch)
                .pause(s::PauseRequest { hold_ms: 0 })
                .await,
        ),
        Call::StatFs => Got::of(MetaServiceClient::new(ch).stat_fs(w::Empty {}).await),
        Call::ForgetMirror => Got::of(
            ReplicatorClient::new(ch)
                .forget_mirror(pb::ForgetMirrorRequest {
                    mirror: "no-such-mirror".into(),
                })
                .await,
        ),
    }
}

/// A port to probe: what listens, the call, who may not make it, who may.
struct Port {
    what: String,
    addr: String,
    call: Call,
    /// A role the call does not admit; `wrong_known`: whether the daemon accepts that role's
    /// token at all (when not, a token of it is UNAUTHENTICATED; its certificate, under TLS,
    /// is still a known role, refused with PERMISSION_DENIED).
    wrong: &'static str,
    wrong_known: bool,
    right: &'static str,
}

fn ports(topo: &serde_json::Value) -> Vec<Port> {
    let str_of = |k: &str| topo[k].as_str().expect(k).to_string();
    let mut v = vec![
        Port {
            what: "primary: metadata service".into(),
            addr: str_of("primary"),
            call: Call::StatFs,
            wrong: "peer",
            wrong_known: false,
            right: "mount",
        },
        Port {
            what: "primary: site service".into(),
            addr: str_of("primary"),
            call: Call::Snapshot,
            wrong: "mount",
            wrong_known: true,
            right: "mirror",
        },
        Port {
            what: "mirror: metadata service".into(),
            addr: str_of("mirror"),
            call: Call::StatFs,
            wrong: "primary",
            wrong_known: false,
            right: "mount",
        },
        Port {
            what: "mirror: site service".into(),
            addr: str_of("mirror"),
            call: Call::Pause,
            wrong: "mount",
            wrong_known: true,
            right: "admin",
        },
    ];
    for (i, r) in topo["replicator"]
        .as_array()
        .expect("replicator")
        .iter()
        .enumerate()
    {
        v.push(Port {
            what: format!("replicator node {}", i + 1),
            addr: r.as_str().expect("addr").to_string(),
            call: Call::ForgetMirror,
            // not the mirror: under --tls its certificate names the role primary too (its
            // credential once promoted), which ForgetMirror admits
            wrong: "mount",
            wrong_known: false,
            right: "admin",
        });
    }
    v
}

/// The credentials of `role` in a dev up: its token, and its certificate under `--tls`.
fn creds_of(dev: &DevUp, tls: bool, role: &str, token: bool) -> Credentials {
    let pki = dev.dir.join("pki");
    let cert_name = match role {
        "mirror" => "region-b",
        "peer" => "replicator1",
        r => r,
    };
    let tls = tls.then(|| ClientTls {
        ca_pem: std::fs::read(pki.join("ca.pem")).expect("ca"),
        identity: Some((
            std::fs::read(pki.join(format!("{cert_name}.pem"))).expect("cert"),
            std::fs::read(pki.join(format!("{cert_name}.key"))).expect("key"),
        )),
        domain: None,
    });
    // the tokens have deploy/README.md's names: the replicator's roles are prefixed
    let file = match role {
        "peer" | "primary" => format!("replicator-{role}"),
        r => r.to_string(),
    };
    let t = token.then(|| {
        std::fs::read_to_string(dev.dir.join("tokens").join(format!("{file}.token")))
            .expect("token")
            .trim()
            .to_string()
    });
    Credentials::new(t.as_deref(), tls).expect("credentials")
}

/// Probe every gRPC port of a dev up; returns the table's rows.
fn probe_all(dev: &DevUp, tls: bool) -> Vec<String> {
    let topo = dev.topology();
    let rt = crate::support::runtime();
    let mut rows = vec![];
    for p in ports(&topo) {
        let admin_token = creds_of(dev, false, "admin", true);
        // 1. plain text, with a good token
        let plain = rt.block_on(probe(&p.addr, &admin_token, p.call));
        // 2. no credentials: TLS without a client certificate, or plain text without a token
        let none = if tls {
            let ca = std::fs::read(dev.dir.join("pki/ca.pem")).expect("ca");
            let c = Credentials::new(
                None,
                Some(ClientTls {
                    ca_pem: ca,
                    identity: None,
                    domain: None,
                }),
            )
            .expect("creds");
            rt.block_on(probe(&p.addr, &c, p.call))
        } else {
            rt.block_on(probe(&p.addr, &Credentials::default(), p.call))
        };
        // 3. a role the call does not admit: its certificate under TLS, its token without
        let wrong = rt.block_on(probe(&p.addr, &creds_of(dev, tls, p.wrong, !tls), p.call));
        // 4. the right role: by token (and certificate), and under TLS by certificate alone
        let right = rt.block_on(probe(&p.addr, &creds_of(dev, tls, p.right, true), p.call));
        let by_cert =
            tls.then(|| rt.block_on(probe(&p.addr, &creds_of(dev, true, p.right, false), p.call)));
        if tls {
            assert!(
                matches!(plain, Got::Refused(_)),
                "{}: plain text got {plain:?}",
                p.what
            );
            assert!(
                matches!(none, Got::Refused(_)),
                "{}: no certificate got {none:?}",
                p.what
            );
            assert_eq!(
                by_cert,
                Some(Got::Served),
                "{}: {} by certificate",
                p.what,
                p.right
            );
        } else {
            assert_eq!(
                plain,
                Got::Served,
                "{}: plain text with a good token",
                p.what
            );
            assert_eq!(none, Got::Unauthenticated, "{}: no token", p.what);
        }
        let refused_wrong = if tls || p.wrong_known {
            Got::PermissionDenied
        } else {
            Got::Unauthenticated
        };
        assert_eq!(wrong, refused_wrong, "{}: role {}", p.what, p.wrong);
        assert_eq!(right, Got::Served, "{}: role {}", p.what, p.right);
        rows.push(format!(
            "| {} | {} | {:?} | {} | {} | {} as {} | {} as {}{} |",
            p.what,
            p.addr,
            p.call,
            plain.short(),
            none.short(),
            wrong.short(),
            p.wrong,
            right.short(),
            p.right,
            by_cert
                .map(|g| format!(" (certificate alone: {})", g.short()))
                .unwrap_or_default()
        ));
    }
    // the metrics listeners: plain HTTP, read-only (metrics and health), on loopback
    for k in ["primary_metrics", "mirror_metrics"] {
        let addr = topo[k].as_str().expect(k);
        let status = http_get_status(addr, "/health");
        assert_eq!(status, Some(200), "{k} /health");
        rows.push(format!(
            "| {k} (HTTP) | {addr} | GET /health | {} | open (read-only) | - | - |",
            status.map(|s| s.to_string()).unwrap_or_default()
        ));
    }
    rows
}

fn http_get_status(addr: &str, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    c.read_to_string(&mut out).ok()?;
    out.split_whitespace().nth(1)?.parse().ok()
}

fn print(title: &str, rows: &[String]) {
    println!("\n{title}");
    println!("| port | address | call | plain text | no credentials | wrong role | right role |");
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}

#[test]
fn every_port_of_dev_up_tls_refuses_plain_text_no_credentials_and_wrong_roles() {
    let work = tempfile::tempdir().unwrap();
    let dev = DevUp::start(
        &work.path().join("dev"),
        &["--tls", "--no-mount", "--delay-ms", "1"],
    );
    let rows = probe_all(&dev, true);
    print("strait dev up --tls", &rows);
    // the control socket of `strait dev fault` takes the admin token
    assert!(dev.fault("heal").contains("healed"));
}

/// Also: the operator's own `STRAIT_*` settings (a token, a metadata URL, a CA for their own
/// commands) are not the services'; dev up and everything it starts take theirs from their
/// units and files alone. Before, `STRAIT_TOKEN` in the environment stopped dev up at its
/// first step (`replicator init` took it beside its `--token-file`, and clap refused both).
#[test]
fn every_port_of_plain_dev_up_refuses_no_credentials_and_wrong_roles() {
    let work = tempfile::tempdir().unwrap();
    let dev = DevUp::start_with_env(
        &work.path().join("dev"),
        &["--no-mount", "--delay-ms", "1"],
        &[
            ("STRAIT_TOKEN", "an-operators-own-token-0123456789"),
            ("STRAIT_META_URL", "rocksdb:///nonexistent/strait"),
            ("STRAIT_TLS_CA", "/nonexistent/ca.pem"),
        ],
    );
    let rows = probe_all(&dev, false);
    print("strait dev up (no TLS)", &rows);
}
