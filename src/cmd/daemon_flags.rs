//! The flags both site daemons (`strait primary`, `strait mirror`) share, laid over the
//! settings they share ([`SiteConfig`]): tokens, per role too, sessions, the replicator's
//! token, TLS.

use std::path::PathBuf;

use anyhow::{Context, Result};
use strait_auth::{Role, Security};
use strait_server::SiteConfig;

#[derive(clap::Args)]
pub struct SiteArgs {
    /// Token every mount of the region must send.
    #[arg(long, env = "STRAIT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File whose first line is the token.
    #[arg(long, env = "STRAIT_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Close a mount's session after this long without a heartbeat.
    #[arg(long, env = "STRAIT_SESSION_TIMEOUT_MS")]
    pub session_timeout_ms: Option<u64>,
    /// Token to present to the replicator (one it accepts for this daemon's role: primary at
    /// the primary, mirror at a mirror).
    #[arg(long, env = "STRAIT_REPLICATOR_TOKEN", hide_env_values = true)]
    pub replicator_token: Option<String>,
    /// File whose first line is the replicator token.
    #[arg(long, env = "STRAIT_REPLICATOR_TOKEN_FILE")]
    pub replicator_token_file: Option<PathBuf>,
    /// Accept TOKEN for ROLE only (ROLE=TOKEN; repeat): mount, mirror, admin. The shared
    /// --token then serves the roles without one. Prefer `[token_files]` in the configuration
    /// file: a command line is visible to others.
    #[arg(long = "role-token", value_name = "ROLE=TOKEN")]
    pub role_tokens: Vec<String>,
    /// Accept the token in FILE's first line for ROLE (ROLE=FILE; repeat).
    #[arg(long = "role-token-file", value_name = "ROLE=FILE")]
    pub role_token_files: Vec<String>,
    /// TLS certificate chain (PEM): served to clients, and presented as this daemon's client
    /// certificate to the daemons it calls.
    #[arg(long, env = "STRAIT_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, env = "STRAIT_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (mutual TLS; their OU names the roles).
    #[arg(long, env = "STRAIT_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// The CA the certificates of the daemons this one calls chain to (calls go over TLS).
    #[arg(long, env = "STRAIT_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Allow plain-text gRPC on addresses other than loopback (tokens cross the network
    /// readable): for a network you trust only.
    #[arg(long)]
    pub insecure_plaintext: bool,
}

/// `ROLE=VALUE`.
pub fn parse_role_pair(s: &str) -> Result<(Role, String)> {
    let (r, v) = s.split_once('=').context("expected ROLE=VALUE")?;
    let role = r.parse::<Role>().map_err(anyhow::Error::msg)?;
    Ok((role, v.to_string()))
}

impl SiteArgs {
    /// Lay the flags and variables given over `c`.
    pub fn apply(&self, c: &mut SiteConfig, sec: &mut Security) -> Result<()> {
        if let Some(v) = &self.token {
            c.token = v.clone();
        }
        if let Some(v) = &self.token_file {
            c.token_file = Some(v.clone());
        }
        if let Some(v) = self.session_timeout_ms {
            c.session_timeout_ms = v;
        }
        if let Some(v) = &self.replicator_token {
            c.replicator_token = v.clone();
        }
        if let Some(v) = &self.replicator_token_file {
            c.replicator_token_file = Some(v.clone());
        }
        lay_over(
            sec,
            ("--role-token", &self.role_tokens),
            ("--role-token-file", &self.role_token_files),
            [
                &self.tls_cert,
                &self.tls_key,
                &self.tls_client_ca,
                &self.tls_ca,
            ],
        )?;
        if self.insecure_plaintext {
            sec.insecure_plaintext = true;
        }
        Ok(())
    }
}

/// `--check-config`'s lines on a daemon's links: each, and whether it runs TLS.
pub fn print_links(links: &[strait_auth::Link]) {
    for l in links {
        println!("  link: {l}");
    }
}

/// `--check-config`'s lines on a daemon's named credentials: each, its roles and its rules.
pub fn print_credentials(sec: &Security) {
    for c in &sec.credentials {
        let roles: Vec<&str> = c.roles().iter().map(|r| r.name()).collect();
        println!(
            "  credential: {} (roles {}; {})",
            c.name,
            roles.join(", "),
            c.rules()
        );
    }
}

/// Lay flags over a daemon's security settings: tokens (`ROLE=TOKEN`) and token files
/// (`ROLE=FILE`) by role, each pair with its flag's name for messages, and the TLS files in the
/// order certificate, key, client CA, CA.
pub fn lay_over(
    sec: &mut Security,
    tokens: (&str, &[String]),
    token_files: (&str, &[String]),
    tls: [&Option<PathBuf>; 4],
) -> Result<()> {
    for t in tokens.1 {
        // the token itself stays out of the message
        let (r, v) =
            parse_role_pair(t).with_context(|| format!("{} expects ROLE=TOKEN", tokens.0))?;
        sec.tokens.entry(r).or_default().0.push(v);
    }
    for t in token_files.1 {
        let (r, v) = parse_role_pair(t).with_context(|| format!("{} {t:?}", token_files.0))?;
        sec.token_files.insert(r, v.into());
    }
    let [cert, key, client_ca, ca] = tls;
    for (flag, field) in [
        (cert, &mut sec.tls_cert_file),
        (key, &mut sec.tls_key_file),
        (client_ca, &mut sec.tls_client_ca_file),
        (ca, &mut sec.tls_ca_file),
    ] {
        if flag.is_some() {
            field.clone_from(flag);
        }
    }
    Ok(())
}
