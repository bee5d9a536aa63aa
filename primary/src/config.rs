//! The primary daemon's settings: one serde struct, every field documented and defaulted.
//! Loaded from a TOML file; the CLI overrides fields with flags and `STRAIT_*` variables.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use strait_fs_core::Epoch;
use strait_server::config::{validate_listen, SiteConfig};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PrimaryConfig {
    /// Address the metadata service (gRPC) listens on.
    pub listen: String,
    /// The metadata engine this daemon owns: `rocksdb:///path` or `redis://host:port/db`.
    /// It must hold a formatted file system (`strait format`).
    pub meta_url: String,
    /// `token`, `token_file`, `[tokens]` per role, `session_timeout_ms`, the replicator token
    /// and the TLS files (`tls_cert_file`, `tls_key_file`, `tls_client_ca_file`,
    /// `tls_ca_file`): the settings every site daemon has.
    #[serde(flatten)]
    pub site: SiteConfig,
    /// `[tokens]`, `[token_files]` and the TLS files, as every strait daemon has them.
    #[serde(flatten)]
    pub security: strait_auth::Security,
    /// Address of the HTTP endpoint serving `/metrics` (Prometheus) and `/health`; empty
    /// disables it.
    pub metrics_listen: String,
    /// Seconds between passes that delete dead slices' blocks from the object store
    /// (0 disables; then run `strait gc`).
    pub gc_interval_s: u64,
    /// With mirrors: after every mirror has applied past a slice's death, wait this long
    /// before deleting its blocks (for reads its mounts started just before).
    pub gc_mirror_grace_ms: u64,
    /// Seconds between metadata backups in the object store (0 disables): a consistent
    /// dump is taken when the newest backup is this old and the metadata changed since
    /// (docs/operations.md, "Metadata backups").
    pub backup_interval_s: u64,
    /// Metadata backups kept in the object store (the newest; at least 1).
    pub backup_keep: usize,
    /// Serve the file system read-only: every mutation answers EROFS.
    pub read_only: bool,
    /// OTLP/gRPC endpoint to export traces to (for example `http://127.0.0.1:4317`); empty
    /// exports nothing.
    pub otlp_endpoint: String,
    /// Threads serving calls; 0 picks half the machine's cores (at least one). A RocksDB
    /// engine answers in microseconds on the serving thread, so one thread serves tens of
    /// thousands of calls a second, and fewer threads mean fewer cross-thread wake-ups per
    /// call; the other cores are left to RocksDB's background work and the kernel's network
    /// stack. Redis engine calls run on a separate blocking pool whatever this says.
    pub serve_threads: usize,
    /// Replicator nodes the shipper appends the change log to (`host:port`); empty: none.
    pub replicator: Vec<String>,
    pub durability: Durability,
    /// This primary's epoch: the replicator refuses appends of any other epoch.
    pub epoch: Epoch,
    /// How often the primary's clock and latest version are appended.
    pub heartbeat_ms: u64,
    /// In `replicated` mode, how long an operation waits for the replicator before it fails.
    pub replicated_timeout_ms: u64,
    /// After this long without an accepted heartbeat or append, the primary refuses every
    /// change (EROFS) until the replicator answers again: how long a primary cut off from the
    /// replicator may go on taking changes after another primary was promoted. 0: no lease
    /// (a cut-off primary in `local` durability goes on until it hears of the new epoch).
    pub lease_ms: u64,
    /// Start on a Redis engine that may lose acknowledged writes (one not running with
    /// `appendonly yes` and `appendfsync always`, or that does not let its settings be
    /// read): without it such an engine is refused, since a Redis restart that lost its last
    /// second takes back acknowledged changes and hands slice ids out twice.
    pub accept_redis_loss: bool,
    /// Once fenced (another primary was promoted, or its history diverged), how long it
    /// still answers reads of its metadata, as a mirror does within its window; then every
    /// read answers EIO: what it holds is a history that no longer goes on.
    pub fenced_window_ms: u64,
}

/// When a client's operation returns (shared with a promoted mirror).
pub use crate::ship::Durability;

impl Default for PrimaryConfig {
    fn default() -> Self {
        PrimaryConfig {
            listen: "127.0.0.1:7420".into(),
            meta_url: "rocksdb:///var/lib/strait/meta".into(),
            site: SiteConfig::default(),
            security: Default::default(),
            metrics_listen: "127.0.0.1:7421".into(),
            gc_interval_s: 30,
            gc_mirror_grace_ms: 60_000,
            backup_interval_s: 3600,
            backup_keep: 24,
            read_only: false,
            otlp_endpoint: String::new(),
            serve_threads: 0,
            replicator: vec![],
            durability: Durability::Local,
            epoch: Epoch::ZERO,
            heartbeat_ms: 200,
            replicated_timeout_ms: 30_000,
            lease_ms: 0,
            accept_redis_loss: false,
            fenced_window_ms: 5_000,
        }
    }
}

/// Most serving threads accepted.
pub const SERVE_THREADS_MAX: usize = 1024;

/// Bounds of `heartbeat_ms`.
pub const HEARTBEAT_MS_MIN: u64 = 10;
pub const HEARTBEAT_MS_MAX: u64 = 10_000;

impl PrimaryConfig {
    /// The settings in TOML file `path` (fields it omits keep their defaults).
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("read the configuration file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parse {}", path.display()))
    }

    /// Check the settings that can be checked without opening anything.
    pub fn validate(&self) -> Result<()> {
        validate_listen(&self.listen, &self.metrics_listen)?;
        if self.serve_threads > SERVE_THREADS_MAX {
            bail!(
                "serve_threads is {}; at most {SERVE_THREADS_MAX} are allowed",
                self.serve_threads
            );
        }
        self.site.validate(&self.security)?;
        if self.backup_keep == 0 {
            bail!("backup_keep is 0; at least 1 metadata backup is kept (backup_interval_s = 0 takes none)");
        }
        for a in &self.replicator {
            a.parse::<std::net::SocketAddr>()
                .map(|_| ())
                .or_else(|_| match a.rsplit_once(':') {
                    Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
                    _ => Err(()),
                })
                .map_err(|_| anyhow::anyhow!("replicator address {a:?}: expected host:port"))?;
        }
        if self.durability == Durability::Replicated && self.replicator.is_empty() {
            bail!("durability = \"replicated\" needs the replicator's addresses (`replicator`)");
        }
        if !(HEARTBEAT_MS_MIN..=HEARTBEAT_MS_MAX).contains(&self.heartbeat_ms) {
            bail!(
                "heartbeat_ms is {}; it must be between {HEARTBEAT_MS_MIN} and {HEARTBEAT_MS_MAX}",
                self.heartbeat_ms
            );
        }
        if self.replicated_timeout_ms == 0 {
            bail!("replicated_timeout_ms must be positive");
        }
        if self.lease_ms > 0 && self.replicator.is_empty() {
            bail!("lease_ms needs the replicator's addresses (`replicator`)");
        }
        if self.lease_ms > 0 && self.lease_ms < 5 * self.heartbeat_ms {
            bail!(
                "lease_ms is {}; it must be at least 5 heartbeats ({} ms) or 0",
                self.lease_ms,
                5 * self.heartbeat_ms
            );
        }
        if !self.replicator.is_empty() {
            self.site.replicator_credentials(&self.security)?;
        }
        if self.read_only && !self.replicator.is_empty() {
            bail!("a read-only primary writes no change records: leave `replicator` empty");
        }
        self.security.refuse_exposed("the primary", &self.links())?;
        Ok(())
    }

    /// Its network links: the listener, and one to each replicator node.
    pub fn links(&self) -> Vec<strait_auth::Link> {
        let calls: Vec<(&str, &str)> = self
            .replicator
            .iter()
            .map(|a| ("to the replicator", a.as_str()))
            .collect();
        self.security.links(&self.listen, &calls)
    }

    /// The number of serving threads `serve_threads` stands for on this machine.
    pub fn resolved_serve_threads(&self) -> usize {
        match self.serve_threads {
            0 => std::thread::available_parallelism()
                .map(|n| n.get() / 2)
                .unwrap_or(1)
                .max(1),
            n => n,
        }
    }

    /// The configuration file that documents every field with its default.
    pub fn example_toml() -> String {
        EXAMPLE.to_string()
    }
}

const EXAMPLE: &str = r#"# strait primary daemon configuration. Every field is optional; the values shown are the
# defaults. Flags and STRAIT_* environment variables override the file.

# Address of the metadata service (gRPC).
listen = "127.0.0.1:7420"
# The metadata engine this daemon owns (formatted with `strait format`).
meta_url = "rocksdb:///var/lib/strait/meta"
# The shared token: accepted for every role (mount, mirror, admin) without a token of its own
# below; with a token per role, the mounts' token. Required, unless token_file, [tokens] or
# tls_client_ca_file is set.
token = ""
# token_file = "/etc/strait/token"
# Token presented to the replicator (one it accepts for the role "primary"); required with
# `replicator`.
replicator_token = ""
# replicator_token_file = "/etc/strait/replicator-primary.token"
# TLS certificate chain and key (PEM), also presented to the replicator as this daemon's
# client certificate; without them the service is plain-text gRPC.
# tls_cert_file = "/etc/strait/pki/primary.pem"
# tls_key_file = "/etc/strait/pki/primary.key"
# Mutual TLS: the CA client certificates must chain to (their OU names the caller's roles).
# tls_client_ca_file = "/etc/strait/pki/ca.pem"
# The CA the replicator's certificates chain to: the calls to it go over TLS.
# tls_ca_file = "/etc/strait/pki/ca.pem"
# Without TLS, a listen or replicator address other than loopback is refused (tokens would
# cross the network readable); true allows it, for a network you trust.
# insecure_plaintext = false
# Credentials with a name and rules (docs/security.md, "Rules per credential"): a token, its
# roles (mount by default), a subtree its mounts are confined to (their root), and squashing
# (root_squash; all_squash with anon_uid and anon_gid; or a fixed uid and gid). Repeat the table
# for each; a mirror needs the same ones as the primary.
# [[credentials]]
# name = "team-a"
# token_file = "/etc/strait/tokens/team-a.token"
# subtree = "/team-a"
# root_squash = true
# Prometheus /metrics and /health; "" disables.
metrics_listen = "127.0.0.1:7421"
# A mount silent for longer than this is dead: its locks and open unlinked files are freed.
session_timeout_ms = 60000
# Seconds between passes deleting dead slices' blocks (0 disables).
gc_interval_s = 30
# With mirrors: ms to wait after every mirror applied past a slice's death before deleting
# its blocks.
gc_mirror_grace_ms = 60000
# Seconds between metadata backups in the object store (0 disables); one is taken when the
# newest is this old and the metadata changed since.
backup_interval_s = 3600
# Metadata backups kept (the newest ones; at least 1).
backup_keep = 24
# Answer EROFS to every mutation.
read_only = false
# OTLP/gRPC endpoint for traces, e.g. "http://127.0.0.1:4317"; "" exports nothing.
otlp_endpoint = ""
# Threads serving calls; 0 = half the cores (at least 1).
serve_threads = 0
# Replicator nodes (host:port) the change log is shipped to; [] keeps it local only.
replicator = []
# "local": an operation returns after the local commit (unshipped versions are at risk if the
# primary's disk is lost). "replicated": it returns after the replicator committed it.
durability = "local"
# This primary's epoch; the replicator refuses appends of any other (a promotion raises it).
epoch = 0
# Milliseconds between heartbeats (the primary's clock and latest version) to the replicator.
heartbeat_ms = 200
# In "replicated" mode, an operation not committed by the replicator within this fails (EIO).
replicated_timeout_ms = 30000
# After this many ms without a word from the replicator, every change is refused (EROFS) until
# it answers again: the bound on how long a cut-off primary goes on after a promotion. 0: none.
lease_ms = 0
# On a Redis engine: start even when it may lose acknowledged writes (not `appendonly yes` with
# `appendfsync always`); otherwise such an engine is refused.
accept_redis_loss = false
# Once fenced (another primary promoted, or a diverged history), ms it still answers reads;
# then reads answer EIO (its metadata no longer is the file system's).
fenced_window_ms = 5000

# A token per role (docs/security.md): mount (this region's mounts), mirror (mirrors forwarding
# their region's calls, taking snapshots), admin (strait gc, fsck --compare, pause).
[tokens]
# mount = "..."
# mirror = "..."
# admin = "..."
# Or files whose first line is the token (they take precedence).
[token_files]
# admin = "/etc/strait/admin.token"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_is_the_defaults() {
        let parsed: PrimaryConfig = toml::from_str(EXAMPLE).expect("example parses");
        assert_eq!(parsed, PrimaryConfig::default());
    }

    #[test]
    fn bad_settings_are_refused() {
        let c = PrimaryConfig {
            site: SiteConfig {
                token: "site-token-0123456789".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(c.validate().is_ok());
        assert!(PrimaryConfig::default().validate().is_err(), "no token");
        let c2 = PrimaryConfig {
            listen: "nowhere".into(),
            ..c.clone()
        };
        assert!(c2.validate().is_err());
        let mut c3 = c.clone();
        c3.security.tls_cert_file = Some("x".into());
        assert!(c3.validate().is_err());
        assert!(toml::from_str::<PrimaryConfig>("no_such_field = 1").is_err());
        let c4 = PrimaryConfig {
            durability: Durability::Replicated,
            ..c.clone()
        };
        assert!(c4.validate().is_err(), "replicated without a replicator");
        let c5 = PrimaryConfig {
            replicator: vec!["127.0.0.1:7430".into(), "node-b.example:7430".into()],
            ..c4.clone()
        };
        assert!(c5.validate().is_err(), "no replicator token");
        let mut c5 = c5;
        c5.site.replicator_token = "primary-token-0123456789".into();
        // a replicator off this machine is not called in plain text unless told
        let e = c5.validate().unwrap_err().to_string();
        assert!(e.contains("to the replicator node-b.example:7430"), "{e}");
        c5.security.insecure_plaintext = true;
        assert!(c5.validate().is_ok());
        let c6 = PrimaryConfig {
            replicator: vec!["nowhere".into()],
            ..c.clone()
        };
        assert!(c6.validate().is_err());
        assert!(toml::from_str::<PrimaryConfig>("durability = \"eventual\"").is_err());
    }

    #[test]
    fn the_shared_settings_keep_their_keys() {
        // token, token_file and session_timeout_ms live in the site crate's SiteConfig,
        // flattened: the file names them as before, and unknown keys are still refused
        let c: PrimaryConfig = toml::from_str(
            "token = \"t\"\ntoken_file = \"/etc/strait/token\"\nsession_timeout_ms = 900\nlisten = \"127.0.0.1:1\"",
        )
        .expect("parses");
        assert_eq!(c.site.token, "t");
        assert_eq!(
            c.site.token_file.as_deref(),
            Some(Path::new("/etc/strait/token"))
        );
        assert_eq!(c.site.session_timeout_ms, 900);
        assert_eq!(c.listen, "127.0.0.1:1");
        assert!(toml::from_str::<PrimaryConfig>("token = \"t\"\nno_such_field = 1").is_err());
        // the TLS files keep their top-level keys; tokens per role are a table
        let c: PrimaryConfig = toml::from_str(
            "tls_cert_file = \"/c.pem\"\ntls_key_file = \"/c.key\"\n[tokens]\nadmin = \"a\"",
        )
        .expect("parses");
        assert_eq!(
            c.security.tls_cert_file.as_deref(),
            Some(Path::new("/c.pem"))
        );
        assert_eq!(
            c.security
                .tokens
                .get(&strait_auth::Role::Admin)
                .and_then(|l| l.first()),
            Some("a")
        );
    }
}
