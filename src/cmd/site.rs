//! The flags both site daemons (`strait primary`, `strait mirror`) share, laid over the
//! settings they share ([`SiteConfig`]).

use std::path::PathBuf;

use strait_site::SiteConfig;

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
}

impl SiteArgs {
    /// Lay the flags and variables given over `c`.
    pub fn apply(&self, c: &mut SiteConfig) {
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
    }
}
