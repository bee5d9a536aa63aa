//! What a cluster is started with ([`ClusterConfig`], [`FaultHooks`]) and what it writes
//! down once it runs ([`Topology`], `DIR/dev.json`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Result};

/// What [`Cluster::start`] starts. The CLI checks the values (`strait dev up`'s flags).
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The `strait` program that runs the daemons and the mounts.
    pub strait_bin: PathBuf,
    /// Working directory (emptied first): region-a/, region-b/, region-c/ (each a host of
    /// the guide: its files, data and logs), tokens/, dev.json.
    pub dir: PathBuf,
    /// One-way delay between the regions, in ms.
    pub delay_ms: u64,
    /// Mount both regions (region-a/mnt, region-b/mnt).
    pub mount: bool,
    /// The mirror's staleness window, ms.
    pub window_ms: u64,
    /// The mirror's policy outside its window: forward, wait or serve.
    pub policy: String,
    /// Which replicator node the mirror subscribes to first: `local` (node 3) or `leader`
    /// (node 1, across the link).
    pub source: String,
    /// The mirror's background block copy: eager or lazy.
    pub sync: String,
    /// A Garage S3 server per region instead of a local directory.
    pub garage: bool,
    /// Bandwidth cap between the regions, MB/s per proxy (0: none).
    pub link_mb_s: f64,
    /// Also put a (fault-free) proxy between the primary and each replicator node, so that
    /// the primary alone can be cut off from the replicator (the chaos harness does).
    pub primary_proxies: bool,
    /// More arguments for `strait primary`, `strait mirror` and each `strait mount`
    /// (`--durability replicated`, `--attr-ttl 0`, ...).
    pub primary_args: Vec<String>,
    pub mirror_args: Vec<String>,
    pub mount_args: Vec<String>,
    /// More arguments for `strait format` (`--gc-delay 60`, ...).
    pub format_args: Vec<String>,
    /// Every link over mutual TLS: a CA and a certificate per daemon, mount and operator in
    /// DIR/pki ([`crate::pki`]), on top of the tokens per role.
    pub tls: bool,
    /// A third region, C (`region-c/`), holding replicator node 2 alone (a witness: no
    /// primary, no mirror, no mount), behind the link like region B. Then no region holds a
    /// majority of the replicator's three voters, and losing all of region A leaves nodes 2 and
    /// 3, a majority holding every committed record. Without it nodes 1 and 2 are in region A.
    pub witness: bool,
    /// One object store for both regions: region A's (its directory, or its Garage's
    /// bucket) is region B's too, as docs/operations.md allows (a store replicated across
    /// regions). The mirror then copies nothing across, and its orphan sweep must refuse.
    pub shared_store: bool,
    /// More environment for every process the cluster starts: its daemons, replicator nodes
    /// and mounts (a test's `STRAIT_OTLP_ENDPOINT`), without changing the caller's own.
    pub env: Vec<(String, String)>,
    /// Where the chaos harness's faults reach in: proxies in front of the object stores,
    /// data directories on file systems of its own, daemons' environments. Default: none.
    pub hooks: FaultHooks,
}

impl ClusterConfig {
    /// `strait dev up`'s defaults (the same as its flags'): 15 ms one way, both regions
    /// mounted, a 5 s window with the policy `forward`, the mirror on its local node, eager
    /// copy, local directories as stores, plain text, two regions.
    pub fn new(strait_bin: PathBuf, dir: PathBuf) -> Self {
        ClusterConfig {
            strait_bin,
            dir,
            delay_ms: 15,
            mount: true,
            window_ms: 5_000,
            policy: "forward".into(),
            source: "local".into(),
            sync: "eager".into(),
            garage: false,
            link_mb_s: 0.0,
            primary_proxies: false,
            primary_args: vec![],
            mirror_args: vec![],
            mount_args: vec![],
            format_args: vec![],
            tls: false,
            witness: false,
            shared_store: false,
            env: vec![],
            hooks: FaultHooks::default(),
        }
    }
}

/// Makes the proxy that goes in front of one region's Garage: called with the region (0: A,
/// 1: B) and Garage's S3 address, it returns the address that every client of that store
/// (`format`'s data URL, the mirror's `--data-url` and `--primary-data-url`, and through them
/// the daemons and the mounts) uses instead.
#[derive(Clone)]
pub struct S3Front(pub Arc<dyn Fn(usize, SocketAddr) -> Result<SocketAddr> + Send + Sync>);

impl std::fmt::Debug for S3Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("S3Front(..)")
    }
}

/// What the chaos harness changes in the layout of [`Cluster::start`] to put faults in; each
/// field defaults to the plain layout of `strait dev up`.
#[derive(Clone, Debug, Default)]
pub struct FaultHooks {
    /// A proxy in front of each region's Garage (ignored with a directory store).
    pub s3_front: Option<S3Front>,
    /// Region A's (the primary's) and region B's (the mirror's) RocksDB directory instead of
    /// `region-x/meta`: somewhere outside [`ClusterConfig::dir`], as a small file system of
    /// its own that a fault can fill.
    pub meta_dirs: [Option<PathBuf>; 2],
    /// Each region's object store directory instead of `region-x/data` (ignored with
    /// Garage): somewhere outside [`ClusterConfig::dir`], under a layer of its own (the
    /// power-loss layer).
    pub store_dirs: [Option<PathBuf>; 2],
    /// Each region's mount's disk cache directory instead of `region-x/cache`.
    pub cache_dirs: [Option<PathBuf>; 2],
    /// Where each region's Garage keeps its metadata and data instead of `region-x/garage`
    /// (its config and log stay there).
    pub garage_data_dirs: [Option<PathBuf>; 2],
    /// Each replicator node's data directory instead of `region-x/replicatorN`.
    pub replicator_dirs: [Option<PathBuf>; 3],
    /// More environment for one daemon, by name (`primary`, `mirror`, `replicatorN`), at each
    /// of its starts (libfaketime's, for clock jumps).
    pub daemon_env: Vec<(String, Vec<(String, String)>)>,
}

/// The mirror's id (its cursor at the replicator, its certificate's name).
pub const MIRROR_ID: &str = "region-b";

/// What `dev up` writes to DIR/dev.json once everything runs.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
pub struct Topology {
    /// The mounts' token (role mount, at the primary and the mirror).
    pub token: String,
    /// The operators' token (role admin: `strait gc`, `fsck --compare`, `mirror pause`, the
    /// replicator's membership and retention).
    #[serde(default)]
    pub admin_token: String,
    /// With `--tls`: the directory of the CA (`ca.pem`) and of each holder's certificate and
    /// key (`mount`, `admin`, `primary`, `region-b`, `replicatorN`).
    #[serde(default)]
    pub pki: Option<PathBuf>,
    /// The replicator's tokens by role (`primary`, `mirror`, `admin`, `peer`); also in
    /// `DIR/tokens/` by the guide's names (`replicator-primary.token`, ..., `admin.token`).
    #[serde(default)]
    pub replicator_tokens: std::collections::BTreeMap<String, String>,
    pub primary: String,
    pub mirror: String,
    pub primary_metrics: String,
    pub mirror_metrics: String,
    pub replicator: Vec<String>,
    /// Each replicator node's `/metrics` and `/health`, in the order of `replicator`.
    #[serde(default)]
    pub replicator_metrics: Vec<String>,
    pub control: String,
    pub mount_a: Option<PathBuf>,
    pub mount_b: Option<PathBuf>,
    /// The region of each replicator node (`A`, `B`, or `C` with [`ClusterConfig::witness`]).
    #[serde(default)]
    pub replicator_regions: Vec<String>,
    /// Each region's object store (data URL) and how the mirror reaches A's.
    #[serde(default)]
    pub data_a: String,
    #[serde(default)]
    pub data_b: String,
    #[serde(default)]
    pub mirror_data_a: String,
}

impl Topology {
    /// What a client of role `mount` or `admin` presents to these regions: the role's token,
    /// and its certificate when they run TLS.
    pub fn credentials(&self, role: &str) -> Result<strait_auth::Credentials> {
        let token = match role {
            "mount" => &self.token,
            "admin" => &self.admin_token,
            other => bail!("dev.json holds no token for the role {other:?}"),
        };
        let pki = self.pki.clone().map(|dir| crate::pki::Pki { dir });
        crate::pki::credentials(token, pki.as_ref(), role)
    }
}
