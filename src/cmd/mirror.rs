//! `strait mirror`: run the mirror site daemon, or show mirrors' replication state
//! (`strait mirror status`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use strait_auth::Credentials;
use strait_mirror::MirrorConfig;
use strait_proto::site as s;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    pub action: Option<Action>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file (see --example-config).
    #[arg(long, env = "STRAIT_MIRROR_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print a configuration file documenting every field with its default, and exit.
    #[arg(long)]
    pub example_config: bool,
    /// Check the configuration the daemon would run with (file, flags, environment, the
    /// token and certificate files it names), print a summary and exit; nothing is opened
    /// or started.
    #[arg(long)]
    pub check_config: bool,
    /// This mirror's name (its cursor at the replicator).
    #[arg(long, env = "STRAIT_MIRROR_ID")]
    pub id: Option<String>,
    /// Address of the metadata service for this region's mounts.
    #[arg(long, env = "STRAIT_LISTEN")]
    pub listen: Option<String>,
    /// The mirror's metadata engine (rocksdb:///path).
    #[arg(long, env = "STRAIT_META_URL")]
    pub meta_url: Option<String>,
    // --token, --token-file, --role-token, --session-timeout-ms, --tls-*
    #[command(flatten)]
    pub site: super::site::SiteArgs,
    /// The primary's address (host:port).
    #[arg(long, env = "STRAIT_PRIMARY")]
    pub primary: Option<String>,
    /// Token to present to the primary: one it accepts for the role mirror (default: --token).
    #[arg(long, env = "STRAIT_PRIMARY_TOKEN", hide_env_values = true)]
    pub primary_token: Option<String>,
    /// File whose first line is the primary token.
    #[arg(long, env = "STRAIT_PRIMARY_TOKEN_FILE")]
    pub primary_token_file: Option<PathBuf>,
    /// Replicator nodes (host:port, comma-separated, this region's first).
    #[arg(long, env = "STRAIT_REPLICATOR", value_delimiter = ',')]
    pub replicator: Option<Vec<String>>,
    /// Address of /metrics and /health ("" disables).
    #[arg(long, env = "STRAIT_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Staleness window in ms.
    #[arg(long, env = "STRAIT_WINDOW_MS")]
    pub window_ms: Option<u64>,
    /// What a read does outside the window: forward, wait or serve.
    #[arg(long, env = "STRAIT_POLICY")]
    pub policy: Option<String>,
    /// This region's object store ("" for none: mounts read the primary's).
    #[arg(long, env = "STRAIT_DATA_URL")]
    pub data_url: Option<String>,
    /// The primary's object store as this region reaches it (default: the primary's own URL).
    #[arg(long, env = "STRAIT_PRIMARY_DATA_URL")]
    pub primary_data_url: Option<String>,
    /// Background block copy: eager or lazy.
    #[arg(long, env = "STRAIT_SYNC")]
    pub sync: Option<String>,
    /// A per-path policy, PREFIX=eager|lazy (repeatable; replaces the file's rules).
    #[arg(long = "sync-rule")]
    pub sync_rules: Vec<String>,
    /// Blocks copied at once.
    #[arg(long)]
    pub sync_concurrency: Option<usize>,
    /// Background copy bandwidth in MB/s (0: unlimited).
    #[arg(long)]
    pub sync_bandwidth_mb_s: Option<f64>,
    /// Mutations at this region's mounts: forward (to the primary) or refuse (EROFS).
    #[arg(long, env = "STRAIT_WRITES")]
    pub writes: Option<String>,
    /// A forwarded mutation not done within this many ms fails with ETIMEDOUT.
    #[arg(long)]
    pub write_timeout_ms: Option<u64>,
    /// Once promoted: a file holding a token the replicator accepts for the role primary.
    #[arg(long)]
    pub promotion_token_file: Option<std::path::PathBuf>,
    /// Once promoted: `local` or `replicated` durability.
    #[arg(long)]
    pub promotion_durability: Option<String>,
    /// Once promoted: a GC pass over dead slices' blocks every this many seconds (0: only
    /// `strait gc`).
    #[arg(long)]
    pub promotion_gc_interval_s: Option<u64>,
    /// Once promoted: how long after every mirror applied a slice's death its blocks are
    /// kept still, ms.
    #[arg(long)]
    pub promotion_gc_mirror_grace_ms: Option<u64>,
    /// `manual` or `auto`: promote itself once the replicator has taken nothing from the
    /// primary for --failover-after-ms.
    #[arg(long)]
    pub failover: Option<String>,
    #[arg(long)]
    pub failover_after_ms: Option<u64>,
    /// Once promoted: the address (host:port) the other regions reach this mirror at, named
    /// in the epoch so that the other mirrors forward their writes here (default: --listen).
    #[arg(long)]
    pub advertise: Option<String>,
    /// Once promoted: this region's object store as the other regions reach it (default:
    /// --data-url).
    #[arg(long)]
    pub advertise_data_url: Option<String>,
}

#[derive(clap::Subcommand)]
pub enum Action {
    /// Show each mirror's state, versions, lag and apply rate.
    Status(StatusArgs),
    /// A create/rename/setattr storm at the primary, and the mirror's lag during it.
    Bench(super::bench::mirror::BenchArgs),
    /// Stop a mirror's applier where it is (it keeps serving, staler and staler), for a while.
    Pause(PauseArgs),
    /// Let a paused mirror's applier go on at once.
    Resume(ResumeArgs),
    /// Make a mirror the primary, in place (the old primary is fenced; docs/operations.md,
    /// "Promoting a mirror").
    Promote(PromoteArgs),
}

#[derive(clap::Args)]
pub struct PromoteArgs {
    /// The mirror's address (its metadata service).
    #[arg(long)]
    pub addr: String,
    /// A token of the role admin (or a client certificate naming it), and TLS.
    #[command(flatten)]
    pub client: super::creds::ClientArgs,
    /// How long the mirror may take to apply what the log committed before the promotion,
    /// in seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout_s: u64,
    /// A switchover with the old primary alive: it stops taking calls and ships its tail
    /// first, so nothing it acknowledged is lost, in `local` durability too.
    #[arg(long)]
    pub planned: bool,
    /// With --planned: the old primary's address (default: the one the mirror forwards to).
    #[arg(long, requires = "planned")]
    pub primary: Option<String>,
}

#[derive(clap::Args)]
pub struct PauseArgs {
    /// The mirror's address (its metadata service).
    #[arg(long)]
    pub addr: String,
    /// A token of the role admin (or a client certificate naming it), and TLS.
    #[command(flatten)]
    pub client: super::creds::ClientArgs,
    /// How long the pause lasts unless resumed earlier, in seconds (at most 3600).
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
}

#[derive(clap::Args)]
pub struct ResumeArgs {
    /// The mirror's address (its metadata service).
    #[arg(long)]
    pub addr: String,
    /// A token of the role admin (or a client certificate naming it), and TLS.
    #[command(flatten)]
    pub client: super::creds::ClientArgs,
}

#[derive(clap::Args)]
pub struct StatusArgs {
    /// A mirror's address (its metadata service), or a replicator node's, or the primary's:
    /// a replicator or a primary lists every mirror with a cursor.
    #[arg(long)]
    pub addr: String,
    /// Credentials for the site daemons (a token of any role, or a client certificate), and
    /// TLS.
    #[command(flatten)]
    pub client: super::creds::ClientArgs,
    /// Token for the replicator's nodes (any role's; default: --token).
    #[arg(
        long,
        env = "STRAIT_REPLICATOR_TOKEN",
        hide_env_values = true,
        default_value = ""
    )]
    pub replicator_token: String,
    /// Mirrors' addresses to query for details when --addr is a replicator or primary
    /// (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub mirror: Vec<String>,
    /// Print JSON (stable field names, for scripts).
    #[arg(long)]
    pub json: bool,
    /// A live dashboard, refreshed every second (q or Ctrl-C quits).
    #[arg(long)]
    pub watch: bool,
}

impl ServeArgs {
    fn resolve(&self) -> Result<MirrorConfig> {
        let mut c = match &self.config {
            Some(p) => MirrorConfig::load(p)?,
            None => MirrorConfig::default(),
        };
        if let Some(v) = &self.id {
            c.id = v.clone();
        }
        if let Some(v) = &self.listen {
            c.listen = v.clone();
        }
        if let Some(v) = &self.meta_url {
            c.meta_url = v.clone();
        }
        self.site.apply(&mut c.site, &mut c.security)?;
        if let Some(v) = &self.primary {
            c.primary = v.clone();
        }
        if let Some(v) = &self.primary_token {
            c.primary_token = v.clone();
        }
        if let Some(v) = &self.primary_token_file {
            c.primary_token_file = Some(v.clone());
        }
        if let Some(v) = &self.replicator {
            c.replicator = v.iter().filter(|a| !a.is_empty()).cloned().collect();
        }
        if let Some(v) = &self.metrics_listen {
            c.metrics_listen = v.clone();
        }
        if let Some(v) = self.window_ms {
            c.window_ms = v;
        }
        if let Some(v) = &self.policy {
            c.policy = v.parse()?;
        }
        if let Some(v) = &self.data_url {
            c.data_url = v.clone();
        }
        if let Some(v) = &self.promotion_token_file {
            c.promotion.replicator_token_file = Some(v.clone());
        }
        if let Some(v) = &self.promotion_durability {
            c.promotion.durability = v.parse()?;
        }
        if let Some(v) = self.promotion_gc_interval_s {
            c.promotion.gc_interval_s = v;
        }
        if let Some(v) = self.promotion_gc_mirror_grace_ms {
            c.promotion.gc_mirror_grace_ms = v;
        }
        if let Some(v) = &self.failover {
            c.promotion.failover = v.parse()?;
        }
        if let Some(v) = self.failover_after_ms {
            c.promotion.failover_after_ms = v;
        }
        if let Some(v) = &self.advertise {
            c.promotion.advertise = v.clone();
        }
        if let Some(v) = &self.advertise_data_url {
            c.promotion.advertise_data_url = v.clone();
        }
        if let Some(v) = &self.primary_data_url {
            c.primary_data_url = v.clone();
        }
        if let Some(v) = &self.sync {
            c.sync = v.parse()?;
        }
        if !self.sync_rules.is_empty() {
            c.sync_rules = self
                .sync_rules
                .iter()
                .map(|r| r.parse())
                .collect::<Result<_>>()?;
        }
        if let Some(v) = self.sync_concurrency {
            c.sync_concurrency = v;
        }
        if let Some(v) = self.sync_bandwidth_mb_s {
            c.sync_bandwidth_mb_s = v;
        }
        if let Some(v) = &self.writes {
            c.writes = v.parse()?;
        }
        if let Some(v) = self.write_timeout_ms {
            c.write_timeout_ms = v;
        }
        c.validate()?;
        Ok(c)
    }
}

pub fn run(a: Args) -> Result<()> {
    match a.action {
        Some(Action::Status(s)) => status(s),
        Some(Action::Bench(b)) => super::bench::mirror::run(b),
        Some(Action::Pause(p)) => {
            let ms = pause_ms(p.seconds)?;
            let v = super::runtime()?.block_on(pause(&p.addr, &p.client.credentials()?, ms))?;
            println!(
                "mirror {} paused at version {v} for {} s (strait mirror resume lifts it)",
                p.addr, p.seconds
            );
            Ok(())
        }
        Some(Action::Promote(p)) => {
            let started = std::time::Instant::now();
            let rt = super::runtime()?;
            let got = rt.block_on(promote(&p))?;
            println!(
                "mirror {} is the primary at epoch {}, from version {} on ({:.2} s: a replicator \
                 leader after {} ms, epoch raised in {} ms, the rest of the log applied in {} ms, \
                 switched in {} ms)",
                p.addr,
                got.epoch,
                got.from_version + 1,
                started.elapsed().as_secs_f64(),
                got.elect_ms,
                got.bump_ms,
                got.drain_ms,
                got.switch_ms,
            );
            // the copy queue says nothing of a lazy mirror's blocks: the promoted daemon
            // counts what its region's store lacks, in the background
            println!("{}", rt.block_on(missing_after_promotion(&p))?);
            Ok(())
        }
        Some(Action::Resume(r)) => {
            let v = super::runtime()?.block_on(pause(&r.addr, &r.client.credentials()?, 0))?;
            println!("mirror {} resumed from version {v}", r.addr);
            Ok(())
        }
        None => {
            if a.serve.example_config {
                print!("{}", MirrorConfig::example_toml());
                return Ok(());
            }
            let check = a.serve.check_config;
            let cfg = a.serve.resolve()?;
            if check {
                println!(
                    "strait mirror: the configuration is valid: id {}, listen {}, engine {}, \
                     metrics {}, primary {}, replicator [{}], store {}, sync {}, promotion \
                     durability {}, failover {}",
                    cfg.id,
                    cfg.listen,
                    cfg.meta_url,
                    if cfg.metrics_listen.is_empty() {
                        "off"
                    } else {
                        &cfg.metrics_listen
                    },
                    cfg.primary,
                    cfg.replicator.join(", "),
                    if cfg.data_url.is_empty() {
                        "none"
                    } else {
                        &cfg.data_url
                    },
                    format!("{:?}", cfg.sync).to_lowercase(),
                    cfg.promotion.durability,
                    format!("{:?}", cfg.promotion.failover).to_lowercase(),
                );
                if cfg.promotion.failover == strait_mirror::config::Failover::Auto {
                    println!(
                        "failover auto: this mirror promotes itself once the replicator has \
                         taken nothing from the primary for {} ms and the primary's lease (named \
                         in its status) has run out; a primary running without a lease \
                         (lease_ms = 0) is never failed over automatically: give it a lease \
                         shorter than {} ms",
                        cfg.promotion.failover_after_ms, cfg.promotion.failover_after_ms
                    );
                }
                return Ok(());
            }
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("strait-mirror")
                .enable_all()
                .build()?;
            rt.block_on(strait_mirror::daemon::run(cfg))
        }
    }
}

/// One row of `mirror status`.
#[derive(serde::Serialize, Clone, Debug, Default)]
pub struct Row {
    pub mirror: String,
    pub addr: String,
    pub state: String,
    pub applied_version: u64,
    pub latest_version: u64,
    pub lag_versions: u64,
    pub lag_ms: u64,
    pub lag_p50_ms: u64,
    pub lag_p99_ms: u64,
    pub lag_max_ms: u64,
    pub apply_rate: f64,
    pub policy: String,
    pub window_ms: u64,
    pub source: String,
    pub bootstraps: u64,
    pub error: String,
    pub needs_bootstrap: bool,
    pub apply_lag_p50_us: u64,
    pub apply_lag_p99_us: u64,
    pub apply_lag_max_us: u64,
    /// Data blocks (absent for a row known only from its cursor).
    pub blocks: Option<Blocks>,
    /// Why this mirror's cursor at the replicator deserves attention (empty: it does not).
    pub cursor_warning: String,
    /// Set once this mirror was promoted to primary.
    pub promotion: Option<Promotion>,
    /// The epoch of the newest records it received, or its own once promoted.
    pub epoch: u64,
    /// The primary it forwards to (empty once it is the primary).
    pub primary: String,
    /// `manual`, or `auto after N ms`.
    pub failover: String,
    /// The primary's lease in ms (0: none) and what was left of it at its last answer to the
    /// mirror's poll; a promoted mirror's own, now.
    pub lease_ms: u64,
    pub lease_left_ms: u64,
    /// The last warm-up (`strait warmup`), running or done.
    pub warmup: Option<Warmup>,
}

/// A mirror's last warm-up, in `mirror status`.
#[derive(serde::Serialize, Clone, Debug, Default)]
pub struct Warmup {
    pub paths: Vec<String>,
    pub started_ms: u64,
    pub done: bool,
    pub files: u64,
    pub blocks: u64,
    pub bytes: u64,
    pub present_blocks: u64,
    pub present_bytes: u64,
    pub copied_blocks: u64,
    pub copied_bytes: u64,
    pub failed_blocks: u64,
    pub last_error: String,
    pub elapsed_ms: u64,
    /// As `strait warmup` prints it.
    pub summary: String,
}

/// A mirror's promotion to primary, in `mirror status`.
#[derive(serde::Serialize, Clone, Debug, Default)]
pub struct Promotion {
    pub epoch: u64,
    pub from_version: u64,
    pub at_ms: u64,
    pub took_ms: u64,
    pub pending_blocks: u64,
    pub pending_bytes: u64,
    /// Blocks live files reference that the region's store lacked (None: not counted yet).
    pub missing_blocks: Option<u64>,
    pub missing_bytes: Option<u64>,
    pub missing_files: Option<u64>,
}

/// A mirror's data blocks, in `mirror status`.
#[derive(serde::Serialize, Clone, Debug, Default)]
pub struct Blocks {
    pub store: String,
    pub sync_policy: String,
    pub pending_blocks: u64,
    pub pending_bytes: u64,
    pub copied_blocks: u64,
    pub copied_bytes: u64,
    pub copy_bytes_per_s: f64,
    pub fallback_reads: u64,
    pub cross_region_read_bytes: u64,
    pub fallback_reads_per_s: f64,
    pub corrupt_blocks: u64,
    pub deleted_blocks: u64,
    /// Queued blocks not copied: their slice was dead here by their turn (and their bytes).
    pub skipped_dead_blocks: u64,
    pub skipped_dead_bytes: u64,
    pub uploaded_blocks: u64,
    pub errors: u64,
    pub last_error: String,
}

#[derive(serde::Serialize, Clone, Debug, Default)]
pub struct Report {
    /// The primary's latest version, as the replicator last heard it (0: unknown).
    pub primary_version: u64,
    /// Asked of a primary: why it is fenced (empty: it is not), as it says itself.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub primary_fenced: String,
    pub mirrors: Vec<Row>,
}

fn row_of(addr: &str, m: s::MirrorState) -> Row {
    Row {
        warmup: m.warmup.map(|w| Warmup {
            summary: super::warmup::line(&w),
            paths: w.paths,
            started_ms: w.started_ms,
            done: w.done,
            files: w.files,
            blocks: w.blocks,
            bytes: w.bytes,
            present_blocks: w.present_blocks,
            present_bytes: w.present_bytes,
            copied_blocks: w.copied_blocks,
            copied_bytes: w.copied_bytes,
            failed_blocks: w.failed_blocks,
            last_error: w.last_error,
            elapsed_ms: w.elapsed_ms,
        }),
        cursor_warning: String::new(),
        epoch: m.epoch,
        primary: m.primary,
        failover: m.failover,
        lease_ms: m.lease_ms,
        lease_left_ms: m.lease_left_ms,
        promotion: m.promotion.map(|p| Promotion {
            epoch: p.epoch,
            from_version: p.from_version,
            at_ms: p.at_ms,
            took_ms: p.elect_ms + p.bump_ms + p.drain_ms + p.switch_ms,
            pending_blocks: p.pending_blocks,
            pending_bytes: p.pending_bytes,
            missing_blocks: p.missing_counted.then_some(p.missing_blocks),
            missing_bytes: p.missing_counted.then_some(p.missing_bytes),
            missing_files: p.missing_counted.then_some(p.missing_files),
        }),
        mirror: m.id,
        addr: addr.to_string(),
        state: m.state,
        applied_version: m.applied_version,
        latest_version: m.latest_version,
        lag_versions: m.lag_versions,
        lag_ms: m.lag_ms,
        lag_p50_ms: m.lag_p50_ms,
        lag_p99_ms: m.lag_p99_ms,
        lag_max_ms: m.lag_max_ms,
        apply_rate: m.apply_rate,
        policy: m.policy,
        window_ms: m.window_ms,
        source: m.source,
        bootstraps: m.bootstraps,
        error: m.error,
        needs_bootstrap: false,
        apply_lag_p50_us: m.apply_lag_p50_us,
        apply_lag_p99_us: m.apply_lag_p99_us,
        apply_lag_max_us: m.apply_lag_max_us,
        blocks: m.blocks.map(|b| Blocks {
            store: b.store,
            sync_policy: b.policy,
            pending_blocks: b.pending_blocks,
            pending_bytes: b.pending_bytes,
            copied_blocks: b.copied_blocks,
            copied_bytes: b.copied_bytes,
            copy_bytes_per_s: b.copy_bytes_per_s,
            fallback_reads: b.fallback_reads,
            cross_region_read_bytes: b.fallback_bytes,
            fallback_reads_per_s: b.fallback_reads_per_s,
            corrupt_blocks: b.corrupt_blocks,
            deleted_blocks: b.deleted_blocks,
            skipped_dead_blocks: b.skipped_dead_blocks,
            skipped_dead_bytes: b.skipped_dead_bytes,
            uploaded_blocks: b.uploaded_blocks,
            errors: b.errors,
            last_error: b.last_error,
        }),
    }
}

/// Ask a site daemon for its status.
pub async fn site_status(addr: &str, creds: &Credentials) -> Result<s::SiteStatus> {
    let primary = strait_mirror::follower::Primary::new(addr, creds)?;
    let mut c = primary.site();
    let r = tokio::time::timeout(Duration::from_secs(3), c.status(s::Empty {}))
        .await
        .with_context(|| format!("{addr} did not answer within 3 s"))?
        .with_context(|| format!("ask {addr} for its status"))?;
    Ok(r.into_inner())
}

/// The hold of `mirror pause --seconds`, checked.
fn pause_ms(seconds: u64) -> Result<u64> {
    if seconds == 0 || seconds.saturating_mul(1000) > strait_mirror::site::PAUSE_MS_MAX {
        anyhow::bail!(
            "--seconds {seconds}: expected 1 to {}",
            strait_mirror::site::PAUSE_MS_MAX / 1000
        );
    }
    Ok(seconds * 1000)
}

/// Hold the mirror at `addr` where it is for `hold_ms` (0: lift a hold); its applied version.
async fn pause(addr: &str, creds: &Credentials, hold_ms: u64) -> Result<u64> {
    let primary = strait_mirror::follower::Primary::new(addr, creds)?;
    let mut c = primary.site();
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        c.pause(s::PauseRequest { hold_ms }),
    )
    .await
    .with_context(|| format!("{addr} did not answer within 10 s"))?
    .map_err(|st| match st.code() {
        tonic::Code::Unimplemented => {
            anyhow::anyhow!("{addr} is not a mirror ({})", st.message())
        }
        _ => anyhow::anyhow!("pause the mirror at {addr}: {}", st.message()),
    })?;
    Ok(r.into_inner().applied_version)
}

/// Promote the mirror at `p.addr`; its promotion.
async fn promote(p: &PromoteArgs) -> Result<s::Promotion> {
    if p.timeout_s == 0 || p.timeout_s > 600 {
        anyhow::bail!("--timeout-s {}: expected 1 to 600", p.timeout_s);
    }
    let creds = p.client.credentials()?;
    let mirror = strait_mirror::follower::Primary::new(&p.addr, &creds)?;
    if p.planned {
        let old = match &p.primary {
            Some(a) => a.clone(),
            None => site_status(&p.addr, &creds)
                .await?
                .mirror
                .map(|m| m.primary)
                .filter(|a| !a.is_empty())
                .with_context(|| format!("{} names no primary: give --primary", p.addr))?,
        };
        let mut c = strait_mirror::follower::Primary::new(&old, &creds)?.site();
        let r = tokio::time::timeout(
            Duration::from_secs(p.timeout_s + 30),
            c.handover(s::HandoverRequest {
                hold_ms: 0,
                timeout_ms: p.timeout_s * 1000,
            }),
        )
        .await
        .with_context(|| format!("{old} did not hand over within {} s", p.timeout_s + 30))?
        .map_err(|st| anyhow::anyhow!("hand over at the primary {old}: {}", st.message()))?
        .into_inner();
        eprintln!(
            "the primary {old} handed over at version {} ({} ms): it refuses calls while the \
             mirror takes over",
            r.last_version, r.drained_ms
        );
    }
    let mut c = mirror.site();
    let r = tokio::time::timeout(
        Duration::from_secs(p.timeout_s + 30),
        c.promote(s::PromoteRequest {
            timeout_ms: p.timeout_s * 1000,
            planned: p.planned,
        }),
    )
    .await
    .with_context(|| format!("{} did not answer within {} s", p.addr, p.timeout_s + 30))?
    .map_err(|st| anyhow::anyhow!("promote the mirror at {}: {}", p.addr, st.message()))?;
    r.into_inner()
        .promotion
        .with_context(|| format!("{} answered without its promotion", p.addr))
}

/// How long `promote` waits for the promoted daemon's count of the blocks its region's
/// store lacks before it says the count is still running.
const MISSING_COUNT_WAIT: Duration = Duration::from_secs(60);

/// The line that says how many blocks the files reference that the promoted mirror's store
/// lacks, once the daemon has counted them (progress on stderr while it counts).
async fn missing_after_promotion(p: &PromoteArgs) -> Result<String> {
    let creds = p.client.credentials()?;
    let started = std::time::Instant::now();
    let mut said = std::time::Instant::now();
    loop {
        let state = site_status(&p.addr, &creds)
            .await
            .ok()
            .and_then(|st| st.mirror);
        if state
            .as_ref()
            .and_then(|m| m.blocks.as_ref())
            .is_some_and(|b| b.store.is_empty())
        {
            return Ok(
                "it has no object store of its own: every block is read from the old \
                       primary's store, and fails with EIO while that cannot be reached"
                    .to_string(),
            );
        }
        let counted = state
            .and_then(|m| m.promotion)
            .filter(|pr| pr.missing_counted);
        if let Some(pr) = counted {
            return Ok(if pr.missing_blocks == 0 {
                "every block the files reference is in its region's store".to_string()
            } else {
                format!(
                    "{} blocks ({} bytes) of {} files are not in its region's store: they read \
                     from the old primary's store, and fail with EIO while it cannot be reached",
                    pr.missing_blocks, pr.missing_bytes, pr.missing_files
                )
            });
        }
        if started.elapsed() >= MISSING_COUNT_WAIT {
            return Ok(format!(
                "the blocks its region's store lacks are still being counted after {} s: \
                 `strait mirror status --addr {}` shows the count when it is done",
                MISSING_COUNT_WAIT.as_secs(),
                p.addr
            ));
        }
        if said.elapsed() >= Duration::from_secs(5) {
            said = std::time::Instant::now();
            eprintln!(
                "counting the blocks its region's store lacks ({} s so far)",
                started.elapsed().as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Gather the report from `addr` (a mirror, a primary or a replicator node).
pub async fn gather(a: &StatusArgs) -> Result<Report> {
    let mut report = Report::default();
    let mut replicators: Vec<String> = vec![];
    let mut is_primary = false;
    let site_creds = a.client.credentials()?;
    match site_status(&a.addr, &site_creds).await {
        // a mirror, or one promoted to primary
        Ok(st) if st.role == "mirror" || st.mirror.is_some() => {
            if let Some(m) = st.mirror {
                report.primary_version = m.latest_version;
                report.mirrors.push(row_of(&a.addr, m));
            }
            return Ok(report);
        }
        Ok(st) => {
            report.primary_version = st.version;
            report.primary_fenced = st.fenced;
            replicators = st.replicator;
            is_primary = true;
        }
        Err(site_err) => {
            // not a site daemon: a replicator node?
            replicators.push(a.addr.clone());
            tracing::debug!("{}: {site_err:#}", a.addr);
        }
    }
    let mut cursors = vec![];
    let mut retention_age_ms = 0;
    let mut heard = None;
    let creds = if a.replicator_token.is_empty() {
        site_creds.clone()
    } else {
        Credentials::new(Some(&a.replicator_token), site_creds.tls().cloned())
            .context("--replicator-token")?
    };
    let mut refused = None;
    for r in &replicators {
        let Ok(ch) = strait_replicator_client::channel(r, &creds) else {
            continue;
        };
        let mut c = strait_proto::replicator::replicator_client::ReplicatorClient::new(ch);
        let answer = tokio::time::timeout(
            Duration::from_secs(3),
            c.status(strait_proto::replicator::Empty {}),
        )
        .await;
        if let Ok(Err(s)) = &answer {
            if matches!(
                s.code(),
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
            ) {
                refused = Some(format!("{r}: {}", s.message()));
            }
        }
        if let Ok(Ok(st)) = answer {
            let st = st.into_inner();
            // the primary's durable mark is a cursor too, but no mirror's
            cursors = st
                .cursors
                .into_iter()
                .filter(|c| c.mirror != strait_proto::replicator::PRIMARY_CURSOR)
                .collect();
            retention_age_ms = st.retention.map(|r| r.max_age_ms).unwrap_or(0);
            heard = st.heartbeat.map(|h| h.latest_version);
            break;
        }
    }
    if let (Some(why), true) = (&refused, heard.is_none()) {
        // what the primary said stands; the mirrors' cursors are the replicator's to tell
        eprintln!(
            "strait: the replicator refused these credentials ({why}): mirrors' cursors are not \
             listed; give --replicator-token"
        );
    }
    let nothing = cursors.is_empty() && heard.is_none() && a.mirror.is_empty();
    if !is_primary && (replicators.is_empty() || nothing) {
        bail!(
            "{} is neither a mirror nor a primary with a replicator, nor a replicator node that answers",
            a.addr
        );
    }
    if report.primary_version == 0 {
        report.primary_version = heard.unwrap_or(0);
    }
    for cur in cursors {
        let cursor_warning =
            super::replicator::cursor_warning(&cur, retention_age_ms).unwrap_or_default();
        report.mirrors.push(Row {
            cursor_warning,
            mirror: cur.mirror.clone(),
            state: if cur.needs_bootstrap {
                "needs-bootstrap".into()
            } else {
                "unknown".into()
            },
            applied_version: cur.applied_version,
            latest_version: report.primary_version,
            lag_versions: report.primary_version.saturating_sub(cur.applied_version),
            needs_bootstrap: cur.needs_bootstrap,
            ..Default::default()
        });
    }
    // details from the mirrors themselves, where we know their addresses
    for addr in &a.mirror {
        match site_status(addr, &site_creds).await {
            Ok(st) => {
                if let Some(m) = st.mirror {
                    let row = row_of(addr, m);
                    match report.mirrors.iter_mut().find(|r| r.mirror == row.mirror) {
                        Some(r) => {
                            let nb = r.needs_bootstrap;
                            let warning = std::mem::take(&mut r.cursor_warning);
                            *r = row;
                            r.needs_bootstrap = nb;
                            r.cursor_warning = warning;
                        }
                        None => report.mirrors.push(row),
                    }
                }
            }
            Err(e) => report.mirrors.push(Row {
                mirror: "?".into(),
                addr: addr.clone(),
                state: "disconnected".into(),
                error: format!("{e:#}"),
                ..Default::default()
            }),
        }
    }
    Ok(report)
}

fn print_table(r: &Report) {
    println!("primary version {}", r.primary_version);
    if !r.primary_fenced.is_empty() {
        println!(
            "the primary is FENCED: {} (it takes no changes; rejoin it as a mirror)",
            r.primary_fenced
        );
    }
    println!(
        "{:<12} {:<14} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8} {:>9}  NOTE",
        "MIRROR", "STATE", "APPLIED", "LATEST", "LAG", "LAG ms", "p50 ms", "p99 ms", "rec/s",
    );
    for m in &r.mirrors {
        let note = if !m.error.is_empty() {
            m.error.clone()
        } else if m.addr.is_empty() {
            "from its cursor at the replicator; --mirror ADDR adds its own status".to_string()
        } else if !m.source.is_empty() {
            format!("from {} ({} {} ms)", m.source, m.policy, m.window_ms)
        } else {
            String::new()
        };
        println!(
            "{:<12} {:<14} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8} {:>9.0}  {}",
            m.mirror,
            m.state,
            m.applied_version,
            m.latest_version,
            m.lag_versions,
            m.lag_ms,
            m.lag_p50_ms,
            m.lag_p99_ms,
            m.apply_rate,
            note
        );
    }
    for m in r.mirrors.iter().filter(|m| !m.cursor_warning.is_empty()) {
        println!("warning: {}", m.cursor_warning);
    }
    for m in r.mirrors.iter().filter(|m| !m.addr.is_empty()) {
        let lease = match (m.lease_ms, &m.promotion) {
            (0, _) => "no lease".to_string(),
            (l, None) => format!(
                "its lease {l} ms ({} ms left at its last answer)",
                m.lease_left_ms
            ),
            (l, Some(_)) => format!("lease {l} ms ({} ms left)", m.lease_left_ms),
        };
        match &m.promotion {
            None => println!(
                "{}: epoch {}, primary {} ({lease}), failover {}",
                m.mirror, m.epoch, m.primary, m.failover
            ),
            Some(_) => println!(
                "{}: the primary, epoch {}, {lease}, failover {}",
                m.mirror, m.epoch, m.failover
            ),
        }
    }
    for m in &r.mirrors {
        if let Some(p) = &m.promotion {
            let missing = match (p.missing_blocks, p.missing_bytes, p.missing_files) {
                (Some(0), _, _) => "every block its files reference is in its region".into(),
                (Some(b), Some(bytes), Some(f)) => format!(
                    "{b} blocks ({}) of {f} files are not in its region: reading them fails \
                     with EIO while the old primary's store cannot be reached",
                    super::human_bytes(bytes)
                ),
                _ => "the blocks missing from its region are being counted".into(),
            };
            println!(
                "{} was promoted to primary at epoch {}, from version {} on, {:.0} s ago (took \
                 {} ms); {missing}",
                m.mirror,
                p.epoch,
                p.from_version + 1,
                strait_fs_core::clock::now_ms().saturating_sub(p.at_ms) as f64 / 1e3,
                p.took_ms,
            );
        }
    }
    for m in &r.mirrors {
        if let Some(w) = &m.warmup {
            println!(
                "{} warm-up of {} ({}): {}",
                m.mirror,
                w.paths.join(" "),
                if w.done { "done" } else { "running" },
                w.summary
            );
        }
    }
    let with_blocks: Vec<_> = r
        .mirrors
        .iter()
        .filter_map(|m| m.blocks.as_ref().map(|b| (m, b)))
        .filter(|(_, b)| !b.store.is_empty())
        .collect();
    if with_blocks.is_empty() {
        return;
    }
    println!();
    println!(
        "{:<12} {:>9} {:>11} {:>11} {:>10} {:>11} {:>11} {:>11} {:>8} {:>7} {:>6}  STORE (POLICY)",
        "BLOCKS",
        "PENDING",
        "PENDING B",
        "COPIED B",
        "COPY/s",
        "SKIPPED B",
        "FALLBACKS",
        "X-REGION B",
        "FB/s",
        "CORRUPT",
        "ERRORS",
    );
    for (m, b) in with_blocks {
        println!(
            "{:<12} {:>9} {:>11} {:>11} {:>10} {:>11} {:>11} {:>11} {:>8.1} {:>7} {:>6}  {} ({}){}",
            m.mirror,
            b.pending_blocks,
            super::human_bytes(b.pending_bytes),
            super::human_bytes(b.copied_bytes),
            super::human_bytes(b.copy_bytes_per_s as u64),
            // queued blocks left uncopied: a later compaction had made their slices dead
            super::human_bytes(b.skipped_dead_bytes),
            b.fallback_reads,
            super::human_bytes(b.cross_region_read_bytes),
            b.fallback_reads_per_s,
            b.corrupt_blocks,
            b.errors,
            b.store,
            b.sync_policy,
            if b.last_error.is_empty() {
                String::new()
            } else {
                format!("; last error: {}", b.last_error)
            }
        );
    }
}

fn status(a: StatusArgs) -> Result<()> {
    let rt = super::runtime()?;
    if a.watch {
        return rt.block_on(super::mirror_watch::run(&a));
    }
    let report = rt.block_on(gather(&a))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}
