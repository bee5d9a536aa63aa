//! The mirror daemon's settings: one serde struct, every field documented and defaulted.
//! Loaded from a TOML file; the CLI overrides fields with flags and `STRAIT_*` variables.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use strait_server::config::{validate_listen, SiteConfig};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MirrorConfig {
    /// This mirror's name: its cursor at the replicator (1 to 128 bytes, unique per mirror).
    pub id: String,
    /// Address of the metadata service (gRPC) for this region's mounts.
    pub listen: String,
    /// The mirror's own metadata engine (`rocksdb:///path`). Created and filled from the
    /// primary's snapshot at the first start.
    pub meta_url: String,
    /// `token`, `token_file`, `[tokens]` per role, `session_timeout_ms`, the replicator token
    /// and the TLS files: the settings every site daemon has. `tls_ca_file` is also the CA
    /// the primary's certificate chains to.
    #[serde(flatten)]
    pub site: SiteConfig,
    /// `[tokens]`, `[token_files]` and the TLS files, as every strait daemon has them.
    #[serde(flatten)]
    pub security: strait_auth::Security,
    /// The primary's metadata service (`host:port`): snapshots to bootstrap from, and reads
    /// under the `forward` policy.
    pub primary: String,
    /// The token presented to the primary: one it accepts for the role `mirror`. Empty: the
    /// shared `token` (or none, when this mirror's certificate names the role `mirror` and the
    /// primary requires client certificates).
    pub primary_token: String,
    /// A file whose first line is `primary_token` (takes precedence over it).
    pub primary_token_file: Option<std::path::PathBuf>,
    /// Replicator nodes (`host:port`), the one in this region first: the mirror subscribes
    /// to the first that answers and sends its acknowledgements to the leader.
    pub replicator: Vec<String>,
    /// Prometheus `/metrics` and `/health`; empty disables.
    pub metrics_listen: String,
    /// The staleness window W in ms: under `forward` and `wait`, no read misses a write
    /// committed at the primary more than W earlier.
    pub window_ms: u64,
    pub policy: Policy,
    /// Under `wait`, how long a read waits for the mirror to come back inside the window
    /// before it fails with EAGAIN.
    pub wait_timeout_ms: u64,
    /// With no heartbeat from the primary, or no message on the subscription, for this long
    /// the mirror counts itself cut off: its state is `disconnected` (and with no clock
    /// reading from the primary, its lag grows with the silence).
    pub silence_ms: u64,
    /// How often the mirror reads the primary's clock and latest version straight from the
    /// primary (the change log's heartbeats arrive behind its records).
    pub clock_poll_ms: u64,
    /// How often the applied version is acknowledged to the replicator.
    pub ack_interval_ms: u64,
    /// This region's object store (`file:///dir`, `s3://bucket?endpoint=..`): blocks are
    /// copied into it, and this region's mounts read it first. Empty: the region has no
    /// store of its own and its mounts read the primary's.
    pub data_url: String,
    /// The primary's object store as this region reaches it; empty: the URL in the file
    /// system's settings (the primary's own).
    pub primary_data_url: String,
    /// Which blocks are copied in the background: `eager` (every block), `lazy` (a block is
    /// copied when first read). `sync_rules` override it per path.
    pub sync: SyncPolicy,
    /// Per-path policies; the longest matching prefix wins (a trailing `*` is ignored).
    pub sync_rules: Vec<SyncRule>,
    /// Blocks copied at once by the background sync.
    pub sync_concurrency: usize,
    /// Bandwidth of the background sync in MB/s (10^6 bytes); 0: unlimited. Reads that
    /// wait for a block are not limited.
    pub sync_bandwidth_mb_s: f64,
    /// Mutations at this region's mounts: `forward` (to the primary; the call returns once
    /// the primary committed it and this mirror applied it) or `refuse` (EROFS).
    pub writes: Writes,
    /// A forwarded mutation that does not complete within this fails with ETIMEDOUT.
    pub write_timeout_ms: u64,
    /// What this mirror does once promoted to primary (`strait mirror promote`).
    pub promotion: PromotionConfig,
}

/// The settings a mirror ships its change log with once it is promoted to primary: those of
/// `strait primary` of the same names (docs/operations.md, "Promoting a mirror").
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PromotionConfig {
    /// A token the replicator accepts for the role `primary` (raising the epoch, appending,
    /// heartbeats). Empty: a promotion is refused, saying so.
    pub replicator_token: String,
    /// A file whose first line is `replicator_token` (takes precedence over it).
    pub replicator_token_file: Option<std::path::PathBuf>,
    pub durability: strait_primary::ship::Durability,
    pub heartbeat_ms: u64,
    pub replicated_timeout_ms: u64,
    /// 0: no lease.
    pub lease_ms: u64,
    /// `manual` (`strait mirror promote`) or `auto`: this mirror promotes itself once the
    /// replicator has taken nothing from the primary (no heartbeat, no append) for
    /// `failover_after_ms`. Set it on one mirror, and only with a primary that runs with a
    /// lease shorter than that (`lease_ms`), so that the old primary has stopped
    /// acknowledging before this one starts.
    pub failover: Failover,
    pub failover_after_ms: u64,
    /// Once promoted, dead slices' blocks are deleted from this region's store as the
    /// primary does: a pass every `gc_interval_s` (0: only on demand, `strait gc`), once every
    /// mirror has applied past a slice's death and `gc_mirror_grace_ms` has passed.
    pub gc_interval_s: u64,
    pub gc_mirror_grace_ms: u64,
    /// Once promoted, metadata backups in this region's store as the primary takes them
    /// (`backup_interval_s`, 0: none; the newest `backup_keep` kept).
    pub backup_interval_s: u64,
    pub backup_keep: usize,
    /// The address (`host:port`) the other regions reach this mirror's service at, named in
    /// the epoch it raises: the other mirrors forward their writes there. Empty: `listen`,
    /// unless that is a wildcard address (0.0.0.0, [::]); then the promotion names no
    /// address and the other mirrors keep their `primary` setting.
    pub advertise: String,
    /// This region's object store as the other regions reach it, named in the epoch too: the
    /// other mirrors read and upload the new primary's blocks there. Empty: `data_url`.
    pub advertise_data_url: String,
}

/// The shortest `failover_after_ms`: several replicator heartbeats, so that an election alone
/// never looks like a dead primary.
pub const FAILOVER_AFTER_MS_MIN: u64 = 1000;

/// Who promotes a mirror.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Failover {
    #[default]
    Manual,
    Auto,
}

impl std::str::FromStr for Failover {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "manual" => Ok(Failover::Manual),
            "auto" => Ok(Failover::Auto),
            o => bail!("failover {o:?}: expected `manual` or `auto`"),
        }
    }
}

impl Default for PromotionConfig {
    fn default() -> Self {
        PromotionConfig {
            replicator_token: String::new(),
            replicator_token_file: None,
            durability: strait_primary::ship::Durability::Local,
            heartbeat_ms: 200,
            replicated_timeout_ms: 30_000,
            lease_ms: 0,
            failover: Failover::Manual,
            failover_after_ms: 0,
            gc_interval_s: 30,
            gc_mirror_grace_ms: 60_000,
            backup_interval_s: 3600,
            backup_keep: 24,
            advertise: String::new(),
            advertise_data_url: String::new(),
        }
    }
}

impl PromotionConfig {
    /// What a promotion of the mirror `id` serving at `listen` with the store `data_url`
    /// names as the new primary; None when no address for it is known (`listen` is a wildcard
    /// and `advertise` is empty).
    pub fn advertised(
        &self,
        id: &str,
        listen: &str,
        data_url: &str,
    ) -> Option<strait_proto::replicator::PrimaryAt> {
        let addr = if !self.advertise.is_empty() {
            self.advertise.clone()
        } else {
            let (host, port) = listen.rsplit_once(':')?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            // a wildcard, or a port the system picks, names nothing others can reach
            if port == "0"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_unspecified())
            {
                return None;
            }
            listen.to_string()
        };
        Some(strait_proto::replicator::PrimaryAt {
            id: id.to_string(),
            addr,
            data_url: if self.advertise_data_url.is_empty() {
                data_url.to_string()
            } else {
                self.advertise_data_url.clone()
            },
            epoch: 0,
        })
    }

    /// What the promoted mirror presents to the replicator (the role `primary`), with the TLS
    /// settings of `sec`: `replicator_token`, or, without one, the mirror's certificate alone
    /// (its subject must name the role `primary` too, `OU=mirror,primary`: the replicator
    /// refuses the promotion otherwise, saying which roles it takes).
    pub fn credentials(&self, sec: &strait_auth::Security) -> Result<strait_auth::Credentials> {
        let token = match &self.replicator_token_file {
            Some(f) => strait_auth::read_token_file(f)?,
            None => self.replicator_token.clone(),
        };
        let certified = sec.tls_ca_file.is_some() && sec.tls_cert_file.is_some();
        if token.is_empty() && !certified {
            bail!(
                "this mirror has no credential of the role primary for the replicator: set \
                 `replicator_token` (or `replicator_token_file`) in its [promotion] settings, \
                 or give it a certificate naming the roles mirror and primary with `tls_ca_file`"
            );
        }
        sec.credentials(Some(token.as_str()).filter(|t| !t.is_empty()))
            .context("the credentials of the promoted mirror")
    }
}

/// Which blocks the background sync copies.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SyncPolicy {
    #[default]
    Eager,
    Lazy,
}

impl std::str::FromStr for SyncPolicy {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "eager" => Ok(SyncPolicy::Eager),
            "lazy" => Ok(SyncPolicy::Lazy),
            o => bail!("sync policy {o:?}: expected `eager` or `lazy`"),
        }
    }
}

impl std::fmt::Display for SyncPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SyncPolicy::Eager => "eager",
            SyncPolicy::Lazy => "lazy",
        })
    }
}

/// A policy for the files under one path prefix.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SyncRule {
    /// An absolute path prefix, e.g. `/datasets/` (or `/datasets/*`).
    pub prefix: String,
    pub policy: SyncPolicy,
}

impl std::str::FromStr for SyncRule {
    type Err = anyhow::Error;
    /// `PREFIX=POLICY`, e.g. `/datasets/*=eager`.
    fn from_str(s: &str) -> Result<Self> {
        let Some((prefix, policy)) = s.rsplit_once('=') else {
            bail!("sync rule {s:?}: expected PREFIX=eager or PREFIX=lazy");
        };
        Ok(SyncRule {
            prefix: prefix.to_string(),
            policy: policy.parse()?,
        })
    }
}

impl SyncRule {
    /// The prefix without a trailing `*`.
    pub fn path(&self) -> &str {
        self.prefix.strip_suffix('*').unwrap_or(&self.prefix)
    }
}

/// What a mutation at a mirror's mount does.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Writes {
    #[default]
    Forward,
    Refuse,
}

impl std::str::FromStr for Writes {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "forward" => Ok(Writes::Forward),
            "refuse" => Ok(Writes::Refuse),
            o => bail!("writes {o:?}: expected `forward` or `refuse`"),
        }
    }
}

/// What a read does when the mirror's lag exceeds the window (docs/consistency.md, "The staleness window and its policies").
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// The read is answered by the primary.
    #[default]
    Forward,
    /// The read waits until the mirror is back inside the window.
    Wait,
    /// The read is answered from the mirror's stale metadata (and counted).
    Serve,
}

impl std::str::FromStr for Policy {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "forward" => Ok(Policy::Forward),
            "wait" => Ok(Policy::Wait),
            "serve" => Ok(Policy::Serve),
            o => bail!("policy {o:?}: expected `forward`, `wait` or `serve`"),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Policy::Forward => "forward",
            Policy::Wait => "wait",
            Policy::Serve => "serve",
        })
    }
}

impl Default for MirrorConfig {
    fn default() -> Self {
        MirrorConfig {
            id: String::new(),
            listen: "127.0.0.1:7440".into(),
            meta_url: "rocksdb:///var/lib/strait/mirror".into(),
            site: SiteConfig::default(),
            security: Default::default(),
            primary: String::new(),
            primary_token: String::new(),
            primary_token_file: None,
            replicator: vec![],
            metrics_listen: "127.0.0.1:7441".into(),
            window_ms: 5_000,
            policy: Policy::Forward,
            wait_timeout_ms: 30_000,
            silence_ms: 1_000,
            clock_poll_ms: 10,
            ack_interval_ms: 500,
            data_url: "file:///var/lib/strait/mirror-data".into(),
            primary_data_url: String::new(),
            sync: SyncPolicy::Eager,
            sync_rules: vec![],
            sync_concurrency: 32,
            sync_bandwidth_mb_s: 0.0,
            writes: Writes::Forward,
            write_timeout_ms: 30_000,
            promotion: PromotionConfig::default(),
        }
    }
}

/// Longest mirror name (the replicator's limit).
pub const ID_LEN_MAX: usize = 128;

fn host_port(what: &str, a: &str) -> Result<()> {
    match a.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => bail!("{what} address {a:?}: expected host:port"),
    }
}

impl MirrorConfig {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("read the configuration file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parse {}", path.display()))
    }

    /// What this mirror presents to the primary: `primary_token` (or the shared token) and,
    /// with `tls_ca_file`, TLS with its own certificate as the client's.
    pub fn primary_credentials(&self) -> Result<strait_auth::Credentials> {
        let token = match &self.primary_token_file {
            Some(f) => Some(strait_auth::read_token_file(f)?),
            None if !self.primary_token.is_empty() => Some(self.primary_token.clone()),
            None => self.site.shared_token()?,
        };
        let certified =
            self.security.tls_ca_file.is_some() && self.security.tls_cert_file.is_some();
        if token.is_none() && !certified {
            bail!(
                "nothing to present to the primary: set `primary_token` (a token it accepts for \
                 the role mirror) or give this mirror a certificate and `tls_ca_file`"
            );
        }
        self.security
            .credentials(token.as_deref())
            .context("the credentials for the primary")
    }

    /// Its network links: the listener, to the primary, and to each replicator node.
    pub fn links(&self) -> Vec<strait_auth::Link> {
        let mut calls = vec![("to the primary", self.primary.as_str())];
        calls.extend(
            self.replicator
                .iter()
                .map(|a| ("to the replicator", a.as_str())),
        );
        self.security.links(&self.listen, &calls)
    }

    pub fn validate(&self) -> Result<()> {
        if self.id.is_empty() || self.id.len() > ID_LEN_MAX {
            bail!("id (the mirror's name) must have 1 to {ID_LEN_MAX} bytes");
        }
        if self.id.starts_with('@') {
            bail!("id (the mirror's name) cannot start with '@': the replicator keeps such names for itself");
        }
        validate_listen(&self.listen, &self.metrics_listen)?;
        if self.primary.is_empty() {
            bail!("primary (the primary's address, host:port) is required");
        }
        host_port("primary", &self.primary)?;
        if self.replicator.is_empty() {
            bail!("replicator (the replicator nodes' addresses) is required");
        }
        self.site.replicator_credentials(&self.security)?;
        for a in &self.replicator {
            host_port("replicator", a)?;
        }
        if !self.meta_url.starts_with("rocksdb://") && !self.meta_url.starts_with("memory://") {
            bail!(
                "meta_url {:?}: a mirror keeps its metadata in RocksDB (rocksdb:///path)",
                self.meta_url
            );
        }
        for (name, v) in [
            ("window_ms", self.window_ms),
            ("wait_timeout_ms", self.wait_timeout_ms),
            ("silence_ms", self.silence_ms),
            ("clock_poll_ms", self.clock_poll_ms),
            ("ack_interval_ms", self.ack_interval_ms),
        ] {
            if v == 0 {
                bail!("{name} must be positive");
            }
        }
        self.site.validate(&self.security)?;
        self.primary_credentials()?;
        self.security.refuse_exposed("the mirror", &self.links())?;
        for (name, url) in [
            ("data_url", &self.data_url),
            ("primary_data_url", &self.primary_data_url),
        ] {
            if !url.is_empty() {
                strait_fs_core::url::DataUrl::parse(url)
                    .map_err(|e| anyhow::anyhow!("{name} {url:?}: {e}"))?;
            }
        }
        for r in &self.sync_rules {
            if !r.path().starts_with('/') {
                bail!(
                    "sync rule prefix {:?}: expected an absolute path such as /datasets/",
                    r.prefix
                );
            }
        }
        if self.sync_concurrency == 0 || self.sync_concurrency > 1024 {
            bail!("sync_concurrency must be 1 to 1024");
        }
        if !(self.sync_bandwidth_mb_s >= 0.0 && self.sync_bandwidth_mb_s.is_finite()) {
            bail!("sync_bandwidth_mb_s must be 0 (unlimited) or a positive number");
        }
        if self.write_timeout_ms == 0 {
            bail!("write_timeout_ms must be positive");
        }
        let p = &self.promotion;
        if !(10..=10_000).contains(&p.heartbeat_ms) {
            bail!("promotion.heartbeat_ms must be 10 to 10000");
        }
        if p.replicated_timeout_ms == 0 {
            bail!("promotion.replicated_timeout_ms must be positive");
        }
        if p.failover == Failover::Auto && p.failover_after_ms < FAILOVER_AFTER_MS_MIN {
            bail!(
                "promotion.failover = \"auto\" needs failover_after_ms of at least \
                 {FAILOVER_AFTER_MS_MIN} (longer than the primary's lease_ms)"
            );
        }
        if !p.advertise.is_empty() {
            host_port("promotion.advertise", &p.advertise)?;
        }
        if !p.advertise_data_url.is_empty() {
            strait_fs_core::url::DataUrl::parse(&p.advertise_data_url).map_err(|e| {
                anyhow::anyhow!(
                    "promotion.advertise_data_url {:?}: {e}",
                    p.advertise_data_url
                )
            })?;
        }
        if p.lease_ms > 0 && p.lease_ms < 5 * p.heartbeat_ms {
            bail!(
                "promotion.lease_ms is {}; it must be at least 5 heartbeats ({} ms) or 0",
                p.lease_ms,
                5 * p.heartbeat_ms
            );
        }
        Ok(())
    }

    pub fn example_toml() -> String {
        EXAMPLE.to_string()
    }
}

const EXAMPLE: &str = r#"# strait mirror daemon configuration. The values shown are the defaults; id, primary,
# replicator and token are required. Flags and STRAIT_* environment variables override the file.

# This mirror's name (its cursor at the replicator).
id = ""
# Metadata service (gRPC) for this region's mounts.
listen = "127.0.0.1:7440"
# The mirror's own metadata engine; filled from the primary's snapshot at the first start.
meta_url = "rocksdb:///var/lib/strait/mirror"
# The shared token: accepted for every role (mount, admin, ...) without a token of its own in
# [tokens]; with a token per role, the mounts' token. Required, unless token_file, [tokens] or
# tls_client_ca_file is set.
token = ""
# token_file = "/etc/strait/token"
# The primary's metadata service: snapshots, and reads under the "forward" policy.
primary = ""
# The token presented to the primary (one it accepts for the role "mirror"); "" = token.
primary_token = ""
# primary_token_file = "/etc/strait/primary-mirror.token"
# TLS: this mirror's certificate and key (served to its mounts, presented to the primary and
# the replicator), the CA client certificates must chain to (mutual TLS), and the CA the
# primary's and the replicator's certificates chain to (its calls to them go over TLS).
# tls_cert_file = "/etc/strait/pki/mirror-b.pem"
# tls_key_file = "/etc/strait/pki/mirror-b.key"
# tls_client_ca_file = "/etc/strait/pki/ca.pem"
# tls_ca_file = "/etc/strait/pki/ca.pem"
# Without TLS, a listen, primary or replicator address other than loopback is refused (tokens
# would cross the network readable); true allows it, for a network you trust.
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
# Replicator nodes, this region's first.
replicator = []
# Token presented to the replicator (one it accepts for the role "mirror"); required.
replicator_token = ""
# replicator_token_file = "/etc/strait/replicator-mirror.token"
# Prometheus /metrics and /health; "" disables.
metrics_listen = "127.0.0.1:7441"
# Staleness window W (ms) and what a read does when the lag exceeds it:
# "forward" (answered by the primary), "wait" (blocks until back inside W), "serve" (stale).
window_ms = 5000
policy = "forward"
# Under "wait", a read still outside the window after this long fails with EAGAIN.
wait_timeout_ms = 30000
# No heartbeat from the primary, or nothing on the subscription, for this long: the mirror
# counts itself cut off.
silence_ms = 1000
# How often the primary's clock and latest version are read straight from the primary: a
# mirror that keeps up shows a lag of about this plus one round trip.
clock_poll_ms = 10
# How often the applied version is acknowledged to the replicator.
ack_interval_ms = 500
# A mount silent for longer than this is dead.
session_timeout_ms = 60000
# This region's object store: blocks are copied into it and this region's mounts read it
# first ("" = none: the mounts read the primary's store).
data_url = "file:///var/lib/strait/mirror-data"
# The primary's object store as this region reaches it ("" = the URL in the file system's
# settings).
primary_data_url = ""
# Background copy of blocks: "eager" (all) or "lazy" (a block is copied when first read),
# and per-path rules (longest prefix wins), e.g.
#   sync_rules = [{ prefix = "/datasets/*", policy = "eager" }]
sync = "eager"
sync_rules = []
# Blocks copied at once, and the bandwidth of the background copy in MB/s (0 = unlimited;
# reads waiting for a block are not limited).
sync_concurrency = 32
sync_bandwidth_mb_s = 0.0
# Mutations at this region's mounts: "forward" (to the primary; each returns once this
# mirror has applied it) or "refuse" (EROFS), and how long a forwarded one may take.
writes = "forward"
write_timeout_ms = 30000

# Once promoted to primary (`strait mirror promote`): the token of the role primary it
# presents to the replicator (a promotion is refused without one), and how it ships, as
# `strait primary`'s settings of the same names.
[promotion]
replicator_token = ""
# replicator_token_file = "/etc/strait/replicator-primary.token"
durability = "local"
heartbeat_ms = 200
replicated_timeout_ms = 30000
lease_ms = 0
# "auto": promote itself once the replicator has taken nothing from the primary for
# failover_after_ms (on one mirror only, and longer than the primary's lease_ms).
failover = "manual"
failover_after_ms = 0
# Once promoted: dead slices' blocks deleted from this region's store, as the primary does.
gc_interval_s = 30
gc_mirror_grace_ms = 60000
# Once promoted: metadata backups in this region's store, as the primary takes them.
backup_interval_s = 3600
backup_keep = 24
# Named in the epoch a promotion raises, so that the other mirrors forward their writes to
# this one and read its blocks: its address and its store as the other regions reach them
# ("" = listen, unless a wildcard such as 0.0.0.0; and data_url).
advertise = ""
advertise_data_url = ""

# A token per role (docs/security.md): mount (this region's mounts), admin (mirror pause,
# fsck --compare, snapshots). Files whose first line is the token take precedence.
[tokens]
# mount = "..."
# admin = "..."
[token_files]
# admin = "/etc/strait/admin.token"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_is_the_defaults() {
        let parsed: MirrorConfig = toml::from_str(EXAMPLE).expect("example parses");
        assert_eq!(parsed, MirrorConfig::default());
    }

    #[test]
    fn bad_settings_are_refused() {
        let ok = MirrorConfig {
            id: "b".into(),
            site: SiteConfig {
                token: "site-token-0123456789".into(),
                replicator_token: "mirror-token-0123456789".into(),
                ..Default::default()
            },
            primary: "127.0.0.1:7420".into(),
            replicator: vec!["127.0.0.1:7430".into()],
            ..Default::default()
        };
        assert!(ok.validate().is_ok());
        for bad in [
            MirrorConfig {
                id: String::new(),
                ..ok.clone()
            },
            // the replicator keeps names starting with '@' (the primary's durable mark)
            MirrorConfig {
                id: "@primary".into(),
                ..ok.clone()
            },
            MirrorConfig {
                primary: "nowhere".into(),
                ..ok.clone()
            },
            MirrorConfig {
                replicator: vec![],
                ..ok.clone()
            },
            MirrorConfig {
                meta_url: "redis://127.0.0.1:6379/1".into(),
                ..ok.clone()
            },
            MirrorConfig {
                window_ms: 0,
                ..ok.clone()
            },
            MirrorConfig {
                promotion: PromotionConfig {
                    advertise: "no-port".into(),
                    ..Default::default()
                },
                ..ok.clone()
            },
            MirrorConfig {
                promotion: PromotionConfig {
                    advertise_data_url: "ftp://nowhere".into(),
                    ..Default::default()
                },
                ..ok.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        assert!(toml::from_str::<MirrorConfig>("policy = \"sometimes\"").is_err());
    }

    #[test]
    fn a_promotion_names_the_advertised_address_or_a_listen_address_that_is_not_a_wildcard() {
        let p = PromotionConfig::default();
        let named = p
            .advertised("b", "10.0.2.1:7440", "s3://b?endpoint=http://10.0.2.1:3900")
            .expect("a named address");
        assert_eq!(
            (
                named.id.as_str(),
                named.addr.as_str(),
                named.data_url.as_str()
            ),
            ("b", "10.0.2.1:7440", "s3://b?endpoint=http://10.0.2.1:3900")
        );
        assert_eq!(p.advertised("b", "0.0.0.0:7440", ""), None);
        assert_eq!(p.advertised("b", "[::]:7440", ""), None);
        assert_eq!(p.advertised("b", "127.0.0.1:0", ""), None);
        let p = PromotionConfig {
            advertise: "mirror-b.example.net:7440".into(),
            advertise_data_url: "s3://b".into(),
            ..Default::default()
        };
        let named = p.advertised("b", "0.0.0.0:7440", "file:///srv/b").unwrap();
        assert_eq!(named.addr, "mirror-b.example.net:7440");
        assert_eq!(named.data_url, "s3://b");
    }

    #[test]
    fn the_shared_settings_keep_their_keys() {
        // token, token_file and session_timeout_ms live in the site crate's SiteConfig,
        // flattened: the file names them as before, and unknown keys are still refused
        let c: MirrorConfig = toml::from_str(
            "token = \"t\"\ntoken_file = \"/etc/strait/token\"\nsession_timeout_ms = 900\nid = \"b\"",
        )
        .expect("parses");
        assert_eq!(c.site.token, "t");
        assert_eq!(
            c.site.token_file.as_deref(),
            Some(Path::new("/etc/strait/token"))
        );
        assert_eq!(c.site.session_timeout_ms, 900);
        assert_eq!(c.id, "b");
        assert_eq!(c.listen, "127.0.0.1:7440", "the mirror's own defaults stay");
        assert!(toml::from_str::<MirrorConfig>("token = \"t\"\nno_such_field = 1").is_err());
    }
}
