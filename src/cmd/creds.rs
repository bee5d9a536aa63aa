//! [`ClientArgs`]: the flags with which a CLI command proves its role to a daemon (a token,
//! and TLS with the CA, the client certificate and key), shared by the commands that call one.

use std::path::PathBuf;

use anyhow::{Context, Result};
use strait_auth::{ClientTls, Credentials};

#[derive(clap::Args, Clone, Debug, Default)]
pub struct ClientArgs {
    /// Token to present; its role must be allowed to make the call (admin for changes to the
    /// cluster). Prefer --token-file or STRAIT_TOKEN: a command line is visible to others.
    #[arg(long, env = "STRAIT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File whose first line is the token.
    #[arg(long, env = "STRAIT_TOKEN_FILE", conflicts_with = "token")]
    pub token_file: Option<PathBuf>,
    /// CA certificate (PEM) the daemon's certificate must chain to: the call goes over TLS.
    #[arg(long, env = "STRAIT_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM), for daemons that require mutual TLS; its OU names the role.
    #[arg(long, env = "STRAIT_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Client key (PEM), with --tls-cert.
    #[arg(long, env = "STRAIT_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Name to check the daemon's certificate against (default: the host of its address).
    #[arg(long)]
    pub tls_domain: Option<String>,
}

fn read(p: &PathBuf, what: &str) -> Result<Vec<u8>> {
    std::fs::read(p).with_context(|| format!("read the {what} {}", p.display()))
}

impl ClientArgs {
    pub fn credentials(&self) -> Result<Credentials> {
        let token = match (&self.token, &self.token_file) {
            (_, Some(f)) => Some(strait_auth::read_token_file(f)?),
            (Some(t), None) => Some(t.clone()),
            (None, None) => None,
        };
        let tls = match &self.tls_ca {
            Some(ca) => Some(ClientTls {
                ca_pem: read(ca, "CA certificate")?,
                identity: match (&self.tls_cert, &self.tls_key) {
                    (Some(c), Some(k)) => Some((
                        read(c, "client certificate")?,
                        strait_auth::read_key_file(k)?,
                    )),
                    _ => None,
                },
                domain: self.tls_domain.clone(),
            }),
            None if self.tls_cert.is_some() => {
                anyhow::bail!(
                    "--tls-cert needs --tls-ca (the CA the daemon's certificate chains to)"
                )
            }
            None => None,
        };
        if token.is_none() && tls.as_ref().is_none_or(|t| t.identity.is_none()) {
            anyhow::bail!(
                "no credentials: give --token (or --token-file, STRAIT_TOKEN) or a client \
                 certificate (--tls-ca, --tls-cert, --tls-key)"
            );
        }
        Ok(Credentials::new(token.as_deref(), tls)?)
    }
}
