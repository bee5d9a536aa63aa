//! The settings both site daemons share, flattened into the primary's and the mirror's
//! configuration: the same TOML keys, defaults and checks in both.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use strait_auth::{Role, Security, Tokens};

/// Shortest session timeout accepted: heartbeats must fit several times into it.
pub const SESSION_TIMEOUT_MS_MIN: u64 = 500;

/// Who may call a site daemon (the shared token), what it presents to the replicator, and
/// when its mounts' sessions die. Tokens per role and TLS are the [`Security`] every strait
/// daemon has, which each daemon's configuration flattens beside this (the methods here take
/// it): serde cannot refuse unknown keys through a flattened struct that flattens another.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SiteConfig {
    /// The shared token: accepted for every role (mount, mirror, admin) that has no token of
    /// its own in `[tokens]`. With a token per role it is simply the mounts' token. Required,
    /// unless `token_file`, `[tokens]` or mutual TLS (`tls_client_ca_file`) is set.
    pub token: String,
    /// A file whose first line is the shared token (read at start; takes precedence over
    /// `token`).
    pub token_file: Option<PathBuf>,
    /// A mount whose last heartbeat is older than this is considered dead: its session is
    /// closed, its locks are released and the unlinked files it kept open are deleted.
    pub session_timeout_ms: u64,
    /// The token this daemon presents to the replicator: one the replicator accepts for the
    /// role `primary` (at the primary) or `mirror` (at a mirror). May be left empty when this
    /// daemon's certificate names that role and the replicator requires client certificates.
    pub replicator_token: String,
    /// A file whose first line is `replicator_token` (takes precedence over it).
    pub replicator_token_file: Option<PathBuf>,
}

/// The roles a site daemon serves: its region's mounts, mirrors forwarding their region's
/// calls (at the primary), operators' tools.
pub const SITE_ROLES: [Role; 3] = [Role::Mount, Role::Mirror, Role::Admin];

impl Default for SiteConfig {
    fn default() -> Self {
        SiteConfig {
            token: String::new(),
            token_file: None,
            session_timeout_ms: 60_000,
            replicator_token: String::new(),
            replicator_token_file: None,
        }
    }
}

impl SiteConfig {
    /// The shared token, from `token_file` or `token` (None when neither is set).
    pub fn shared_token(&self) -> Result<Option<String>> {
        let token = match &self.token_file {
            Some(f) => strait_auth::read_token_file(f)?,
            None => self.token.clone(),
        };
        if token.is_empty() {
            return Ok(None);
        }
        strait_auth::check_token(&token).context("the token")?;
        Ok(Some(token))
    }

    /// The tokens this daemon accepts, each with its roles; fails when callers would have no
    /// way to authenticate (no token at all and no client CA).
    pub fn accepted_tokens(&self, sec: &Security) -> Result<Tokens> {
        if let Some(r) = sec
            .tokens
            .keys()
            .chain(sec.token_files.keys())
            .find(|r| !SITE_ROLES.contains(r))
        {
            bail!(
                "a site daemon has no calls for the role {r}: give tokens for mount, mirror and \
                 admin"
            );
        }
        let tokens = sec.accepted(self.shared_token()?.as_deref(), &SITE_ROLES)?;
        if tokens.is_empty() && !sec.mutual_tls() {
            bail!(
                "no token configured: set `token` or `token_file` (or a token per role in \
                 [tokens], or a client CA for mutual TLS): every RPC must carry credentials"
            );
        }
        Ok(tokens)
    }

    /// Whether one token serves every role: a mount could then also pause a mirror, stream
    /// a snapshot or run GC. Worth a warning at start.
    pub fn one_token_for_every_role(&self, sec: &Security) -> bool {
        sec.tokens.is_empty()
            && sec.token_files.is_empty()
            && (!self.token.is_empty() || self.token_file.is_some())
    }

    /// What this daemon presents to the replicator: its token and, with `tls_ca_file`, TLS
    /// (its own certificate as the client's).
    pub fn replicator_credentials(&self, sec: &Security) -> Result<strait_auth::Credentials> {
        let token = match &self.replicator_token_file {
            Some(f) => strait_auth::read_token_file(f)?,
            None => self.replicator_token.clone(),
        };
        let certified = sec.tls_ca_file.is_some() && sec.tls_cert_file.is_some();
        if token.is_empty() && !certified {
            bail!(
                "no replicator token: set `replicator_token` or `replicator_token_file` (a token \
                 the replicator accepts for this daemon's role), or give this daemon a \
                 certificate naming its role and `tls_ca_file`"
            );
        }
        sec.credentials(Some(token.as_str()))
            .context("the replicator credentials")
    }

    /// Check the session timeout and the security settings.
    pub fn validate(&self, sec: &Security) -> Result<()> {
        if self.session_timeout_ms < SESSION_TIMEOUT_MS_MIN {
            bail!(
                "session_timeout_ms is {}; it must be at least {SESSION_TIMEOUT_MS_MIN}",
                self.session_timeout_ms
            );
        }
        sec.validate()?;
        self.accepted_tokens(sec)?;
        Ok(())
    }
}

/// Check a daemon's service address and its metrics address (empty: no metrics listener).
pub fn validate_listen(listen: &str, metrics_listen: &str) -> Result<()> {
    listen
        .parse::<std::net::SocketAddr>()
        .with_context(|| format!("listen address {listen:?}"))?;
    if !metrics_listen.is_empty() {
        metrics_listen
            .parse::<std::net::SocketAddr>()
            .with_context(|| format!("metrics listen address {metrics_listen:?}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use strait_auth::Roles;

    fn with_token(token: &str) -> SiteConfig {
        SiteConfig {
            token: token.into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_shared_token_is_resolved_and_checked() {
        let c = with_token("abcdefghijklmnop");
        assert_eq!(
            c.shared_token().unwrap().as_deref(),
            Some("abcdefghijklmnop")
        );
        assert!(c.one_token_for_every_role(&Security::default()));
        let t = c.accepted_tokens(&Security::default()).unwrap();
        assert_eq!(
            t.roles_of(b"Bearer abcdefghijklmnop"),
            Roles::of(&SITE_ROLES)
        );
        assert!(
            SiteConfig::default()
                .validate(&Security::default())
                .is_err(),
            "no token"
        );
        assert!(
            with_token("abc").validate(&Security::default()).is_err(),
            "too short"
        );
        assert!(
            with_token("a b c d e f g h i j")
                .validate(&Security::default())
                .is_err(),
            "a space"
        );
        let f = std::env::temp_dir().join(format!("strait-server-token-{}", std::process::id()));
        strait_ids::private::write_private(&f, b"from-file-0123456789\nsecond line\n").unwrap();
        let c = SiteConfig {
            token: "ignored".into(),
            token_file: Some(f.clone()),
            ..Default::default()
        };
        assert_eq!(
            c.shared_token().unwrap().as_deref(),
            Some("from-file-0123456789")
        );
        std::fs::remove_file(&f).unwrap();
        assert!(c.validate(&Security::default()).is_err(), "a missing file");
    }

    #[test]
    fn role_tokens_narrow_the_shared_token_to_the_roles_left() {
        let c = with_token("mount-token-0123456789");
        let sec: Security =
            toml::from_str("[tokens]\nadmin = \"admin-token-0123456789\"\n").unwrap();
        c.validate(&sec).unwrap();
        assert!(!c.one_token_for_every_role(&sec));
        let t = c.accepted_tokens(&sec).unwrap();
        assert_eq!(
            t.roles_of(b"Bearer mount-token-0123456789"),
            Roles::of(&[Role::Mount, Role::Mirror])
        );
        assert_eq!(
            t.roles_of(b"Bearer admin-token-0123456789"),
            Roles::of(&[Role::Admin])
        );
        // a role a site daemon has no calls for is refused
        let peer: Security =
            toml::from_str("[tokens]\npeer = \"peer-token-0123456789\"\n").unwrap();
        assert!(SiteConfig::default().validate(&peer).is_err());
        // mutual TLS alone is a way to authenticate
        let mtls = Security {
            tls_cert_file: Some("c.pem".into()),
            tls_key_file: Some("c.key".into()),
            tls_client_ca_file: Some("ca.pem".into()),
            ..Default::default()
        };
        assert!(SiteConfig::default().validate(&mtls).is_ok());
    }

    #[test]
    fn a_short_session_timeout_is_refused() {
        let c = SiteConfig {
            session_timeout_ms: SESSION_TIMEOUT_MS_MIN - 1,
            ..with_token("abcdefghijklmnop")
        };
        assert!(c.validate(&Security::default()).is_err());
        assert!(with_token("abcdefghijklmnop")
            .validate(&Security::default())
            .is_ok());
    }

    #[test]
    fn listen_addresses_are_checked() {
        assert!(validate_listen("127.0.0.1:7420", "").is_ok());
        assert!(validate_listen("127.0.0.1:7420", "127.0.0.1:7421").is_ok());
        assert!(validate_listen("nowhere", "").is_err());
        assert!(validate_listen("127.0.0.1:7420", "nowhere").is_err());
    }
}
