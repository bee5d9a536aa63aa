//! `strait mirror`: run the mirror site daemon, or show mirrors' replication state
//! (`strait mirror status`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use strait_auth::Credentials;
use strait_mirror::MirrorConfig;
use strait_proto::site as s;

use strait_mirror::follower::site_status;

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
    pub site: super::daemon_flags::SiteArgs,
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
    /// Once promoted: seconds between metadata backups in this region's store (0: none).
    #[arg(long)]
    pub promotion_backup_interval_s: Option<u64>,
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
    Status(super::mirror_status::StatusArgs),
    /// A create/rename/setattr storm at the primary, and the mirror's lag during it.
    Bench(strait_bench::mirror::BenchArgs),
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
        if let Some(v) = self.promotion_backup_interval_s {
            c.promotion.backup_interval_s = v;
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
        Some(Action::Bench(b)) => strait_bench::mirror::run(b),
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
                super::daemon_flags::print_links(&cfg.links());
                super::daemon_flags::print_credentials(&cfg.security);
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

fn status(a: super::mirror_status::StatusArgs) -> Result<()> {
    let rt = super::runtime()?;
    if a.watch {
        return rt.block_on(super::mirror_watch::run(&a));
    }
    let report = rt.block_on(super::mirror_status::gather(&a))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        super::mirror_status::print_table(&report);
    }
    Ok(())
}
