//! The settings both site daemons share, flattened into the primary's and the mirror's
//! configuration: the same TOML keys, defaults and checks in both.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// Shortest session timeout accepted: heartbeats must fit several times into it.
pub const SESSION_TIMEOUT_MS_MIN: u64 = 500;

/// How the mounts of a site daemon's region authenticate, and when their sessions die.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SiteConfig {
    /// The token every mount must send (`authorization: Bearer <token>`). Required, unless
    /// `token_file` is set.
    pub token: String,
    /// A file whose first line is the token (read at start; takes precedence over `token`).
    pub token_file: Option<PathBuf>,
    /// A mount whose last heartbeat is older than this is considered dead: its session is
    /// closed, its locks are released and the unlinked files it kept open are deleted.
    pub session_timeout_ms: u64,
    /// The token this daemon presents to the replicator: one the replicator accepts for the
    /// role `primary` (at the primary) or `mirror` (at a mirror).
    pub replicator_token: String,
    /// A file whose first line is `replicator_token` (takes precedence over it).
    pub replicator_token_file: Option<PathBuf>,
}

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
    /// The token mounts must present, from `token_file` or `token`.
    pub fn resolved_token(&self) -> Result<String> {
        resolve_token(&self.token, self.token_file.as_deref())
    }

    /// What this daemon presents to the replicator (its token; TLS none yet).
    pub fn replicator_credentials(&self) -> Result<strait_auth::Credentials> {
        let token = match &self.replicator_token_file {
            Some(f) => strait_auth::read_token_file(f)?,
            None => self.replicator_token.clone(),
        };
        if token.is_empty() {
            bail!(
                "no replicator token: set `replicator_token` or `replicator_token_file` (a token \
                 the replicator accepts for this daemon's role)"
            );
        }
        strait_auth::Credentials::token(&token).context("the replicator token")
    }

    /// Check the session timeout (the token is checked by [`SiteConfig::resolved_token`]).
    pub fn validate_sessions(&self) -> Result<()> {
        if self.session_timeout_ms < SESSION_TIMEOUT_MS_MIN {
            bail!(
                "session_timeout_ms is {}; it must be at least {SESSION_TIMEOUT_MS_MIN}",
                self.session_timeout_ms
            );
        }
        Ok(())
    }
}

/// A site daemon's token: the first line of `token_file` when given, else `token`; it must be
/// non-empty printable ASCII without spaces.
pub fn resolve_token(token: &str, token_file: Option<&Path>) -> Result<String> {
    let token = match token_file {
        Some(f) => std::fs::read_to_string(f)
            .with_context(|| format!("read the token file {}", f.display()))?
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_string(),
        None => token.to_string(),
    };
    if token.is_empty() {
        bail!("no token configured: set `token` or `token_file` (every RPC must carry one)");
    }
    strait_auth::check_token(&token)?;
    Ok(token)
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

    #[test]
    fn tokens_are_resolved_and_checked() {
        assert_eq!(
            resolve_token("abcdefghijklmnop", None).unwrap(),
            "abcdefghijklmnop"
        );
        assert!(resolve_token("", None).is_err(), "no token");
        assert!(resolve_token("abc", None).is_err(), "too short");
        assert!(
            resolve_token("a b c d e f g h i j", None).is_err(),
            "a space"
        );
        let dir = std::env::temp_dir().join(format!("strait-site-token-{}", std::process::id()));
        std::fs::write(&dir, "from-file-0123456789\nsecond line\n").unwrap();
        assert_eq!(
            resolve_token("ignored", Some(&dir)).unwrap(),
            "from-file-0123456789"
        );
        std::fs::remove_file(&dir).unwrap();
        assert!(resolve_token("t", Some(&dir)).is_err(), "a missing file");
    }

    #[test]
    fn a_short_session_timeout_is_refused() {
        let c = SiteConfig {
            session_timeout_ms: SESSION_TIMEOUT_MS_MIN - 1,
            ..Default::default()
        };
        assert!(c.validate_sessions().is_err());
        assert!(SiteConfig::default().validate_sessions().is_ok());
    }

    #[test]
    fn listen_addresses_are_checked() {
        assert!(validate_listen("127.0.0.1:7420", "").is_ok());
        assert!(validate_listen("127.0.0.1:7420", "127.0.0.1:7421").is_ok());
        assert!(validate_listen("nowhere", "").is_err());
        assert!(validate_listen("127.0.0.1:7420", "nowhere").is_err());
    }
}
