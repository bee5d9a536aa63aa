//! The certificates of a cluster on this machine (`strait dev up --tls`, the tests): a CA and,
//! for each daemon, mount and operator, a certificate naming its roles, valid for 127.0.0.1
//! and localhost, in one directory (`ca.pem`, `NAME.pem`, `NAME.key`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use strait_auth::certs;
use strait_auth::{ClientTls, Credentials, Role};

/// The hosts every certificate of a cluster on this machine is valid for.
pub const LOCAL_HOSTS: [&str; 2] = ["127.0.0.1", "localhost"];
/// Days the certificates of a cluster on this machine are valid.
const DAYS: u32 = 30;

/// A CA and the certificates it issued, in one directory.
#[derive(Clone, Debug)]
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    /// Create `dir` with a new CA and a certificate for each `(name, roles)` of `holders`.
    pub fn create(dir: &Path, holders: &[(&str, &[Role])]) -> Result<Pki> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let ca = certs::new_ca("strait dev CA", DAYS)?;
        ca.write(dir, "ca")?;
        let hosts: Vec<String> = LOCAL_HOSTS.iter().map(|h| h.to_string()).collect();
        for (name, roles) in holders {
            certs::issue(&ca, name, roles, &hosts, DAYS)?.write(dir, name)?;
        }
        Ok(Pki {
            dir: dir.to_path_buf(),
        })
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).to_string_lossy().into_owned()
    }

    /// The CA certificate every daemon and client checks the others against.
    pub fn ca(&self) -> String {
        self.path("ca.pem")
    }

    pub fn cert(&self, name: &str) -> String {
        self.path(&format!("{name}.pem"))
    }

    pub fn key(&self, name: &str) -> String {
        self.path(&format!("{name}.key"))
    }

    /// The flags of a daemon that serves with `name`'s certificate, requires client
    /// certificates (mutual TLS) and calls the other daemons over TLS.
    pub fn server_args(&self, name: &str) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.cert(name),
            "--tls-key".into(),
            self.key(name),
            "--tls-client-ca".into(),
            self.ca(),
            "--tls-ca".into(),
            self.ca(),
        ]
    }

    /// The flags of a client (a mount, a CLI command) presenting `name`'s certificate.
    pub fn client_args(&self, name: &str) -> Vec<String> {
        vec![
            "--tls-ca".into(),
            self.ca(),
            "--tls-cert".into(),
            self.cert(name),
            "--tls-key".into(),
            self.key(name),
        ]
    }

    /// `name`'s certificate, and the CA, as a client's TLS settings.
    pub fn client_tls(&self, name: &str) -> Result<ClientTls> {
        let read = |p: String| std::fs::read(&p).with_context(|| format!("read {p}"));
        Ok(ClientTls {
            ca_pem: read(self.ca())?,
            identity: Some((read(self.cert(name))?, read(self.key(name))?)),
            domain: None,
        })
    }
}

/// What a client of a cluster presents: `token`, and `pki`'s certificate `name` when the
/// cluster runs TLS.
pub fn credentials(token: &str, pki: Option<&Pki>, name: &str) -> Result<Credentials> {
    let tls = pki.map(|p| p.client_tls(name)).transpose()?;
    Ok(Credentials::new(Some(token), tls)?)
}
