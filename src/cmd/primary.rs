//! `strait primary`: the primary site daemon. Settings come from a TOML file (`--config`),
//! then `STRAIT_*` variables, then flags, each overriding the one before. `strait primary
//! set-aside` sets a diverged primary's own history aside, and `rejoin` makes an old primary
//! a mirror ([`strait_primary::set_aside`]).

use std::path::PathBuf;

use anyhow::{Context, Result};
use strait_primary::PrimaryConfig;

use strait_primary::set_aside::{self, Mode, Outcome};

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    pub action: Option<Action>,
    /// TOML configuration file (every field optional; see --example-config).
    #[arg(long, env = "STRAIT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print a configuration file documenting every field with its default, and exit.
    #[arg(long)]
    pub example_config: bool,
    /// Check the configuration the daemon would run with (file, flags, environment, the
    /// token and certificate files it names), print a summary and exit; nothing is opened
    /// or started.
    #[arg(long)]
    pub check_config: bool,
    /// Address of the metadata service (gRPC).
    #[arg(long, env = "STRAIT_LISTEN")]
    pub listen: Option<String>,
    /// Metadata engine: rocksdb:///path or redis://host:port/db.
    #[arg(long, env = "STRAIT_META_URL")]
    pub meta_url: Option<String>,
    // --token, --token-file, --role-token, --session-timeout-ms, --tls-*
    #[command(flatten)]
    pub site: super::daemon_flags::SiteArgs,
    /// Address of /metrics and /health ("" disables).
    #[arg(long, env = "STRAIT_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Seconds between deletions of dead slices' blocks (0 disables).
    #[arg(long, env = "STRAIT_GC_INTERVAL_S")]
    pub gc_interval_s: Option<u64>,
    /// With mirrors: ms after every mirror applied past a slice's death before its blocks go.
    #[arg(long, env = "STRAIT_GC_MIRROR_GRACE_MS")]
    pub gc_mirror_grace_ms: Option<u64>,
    /// Seconds between metadata backups in the object store (0 disables).
    #[arg(long, env = "STRAIT_BACKUP_INTERVAL_S")]
    pub backup_interval_s: Option<u64>,
    /// Metadata backups kept in the object store (at least 1).
    #[arg(long, env = "STRAIT_BACKUP_KEEP")]
    pub backup_keep: Option<usize>,
    /// Answer EROFS to every mutation.
    #[arg(long)]
    pub read_only: bool,
    /// Threads serving calls (0: half the cores, at least 1).
    #[arg(long, env = "STRAIT_SERVE_THREADS")]
    pub serve_threads: Option<usize>,
    /// Replicator nodes to ship the change log to (host:port, comma-separated).
    #[arg(long, env = "STRAIT_REPLICATOR", value_delimiter = ',')]
    pub replicator: Option<Vec<String>>,
    /// When an operation returns: `local` (after the local commit) or `replicated` (after the
    /// replicator committed it).
    #[arg(long, env = "STRAIT_DURABILITY")]
    pub durability: Option<String>,
    /// This primary's epoch (the replicator refuses appends of any other).
    #[arg(long, env = "STRAIT_EPOCH")]
    pub epoch: Option<u64>,
    /// Refuse changes (EROFS) after this many ms without a word from the replicator: the
    /// bound on how long a primary cut off from it may go on after another was promoted
    /// (0: no lease).
    #[arg(long, env = "STRAIT_LEASE_MS")]
    pub lease_ms: Option<u64>,
    /// Start on a Redis engine that may lose acknowledged writes (not `appendonly yes` with
    /// `appendfsync always`); without it such an engine is refused.
    #[arg(long)]
    pub accept_redis_loss: bool,
    /// Once fenced, how long reads are still answered, ms (then EIO).
    #[arg(long, env = "STRAIT_FENCED_WINDOW_MS")]
    pub fenced_window_ms: Option<u64>,
}

#[derive(clap::Subcommand)]
pub enum Action {
    /// A primary whose history diverged from the replicator's log (it answers EROFS, its log
    /// says `diverged`): write the changes only it holds to a file, load its metadata from a
    /// mirror, and keep the old metadata beside it. Run it with the primary stopped.
    SetAside(SetAsideArgs),
    /// An old primary after a mirror was promoted in its place (it answers EROFS: fenced):
    /// write the changes only it holds to a file (those it acknowledged and never shipped,
    /// possible in `local` durability) and leave metadata a mirror can follow: its own when
    /// the log continues it, else the new primary's (`--from-mirror` names the new primary),
    /// the old kept beside it. Run it with the primary stopped, then start `strait mirror`
    /// on the same engine.
    Rejoin(SetAsideArgs),
}

#[derive(clap::Args)]
pub struct SetAsideArgs {
    /// The primary's metadata engine (rocksdb:///path; the primary must be stopped).
    #[arg(long, env = "STRAIT_META_URL")]
    pub meta_url: String,
    /// Replicator nodes (host:port, comma-separated).
    #[arg(
        long,
        env = "STRAIT_REPLICATOR",
        value_delimiter = ',',
        required = true
    )]
    pub replicator: Vec<String>,
    /// A mirror of the file system (its metadata service, host:port): the metadata is loaded
    /// from its snapshot.
    #[arg(long)]
    pub from_mirror: String,
    /// For the mirror: a token of the role admin (or a client certificate naming it), and
    /// TLS (also used for the replicator).
    #[command(flatten)]
    pub client: super::creds::ClientArgs,
    /// Token to present to the replicator: one it accepts for the role admin.
    #[arg(long, env = "STRAIT_REPLICATOR_TOKEN", hide_env_values = true)]
    pub replicator_token: String,
    /// Where to write the list of the changes set aside (must not exist).
    #[arg(long)]
    pub out: PathBuf,
}

impl Args {
    fn file_config(&self) -> Result<PrimaryConfig> {
        match &self.config {
            Some(path) => PrimaryConfig::load(path),
            None => Ok(PrimaryConfig::default()),
        }
    }

    /// The OTLP endpoint: the global flag or variable, else the configuration file's.
    pub fn otlp_endpoint(&self, global: Option<&str>) -> Option<String> {
        match global {
            Some(e) => Some(e.to_string()),
            None => self
                .file_config()
                .ok()
                .map(|c| c.otlp_endpoint)
                .filter(|e| !e.is_empty()),
        }
    }

    /// The settings: the file's, with every flag or variable given laid over them.
    pub fn resolve(&self) -> Result<PrimaryConfig> {
        let mut c = self.file_config()?;
        if let Some(v) = &self.listen {
            c.listen = v.clone();
        }
        if let Some(v) = &self.meta_url {
            c.meta_url = v.clone();
        }
        self.site.apply(&mut c.site, &mut c.security)?;
        if let Some(v) = &self.metrics_listen {
            c.metrics_listen = v.clone();
        }
        if let Some(v) = self.gc_interval_s {
            c.gc_interval_s = v;
        }
        if let Some(v) = self.gc_mirror_grace_ms {
            c.gc_mirror_grace_ms = v;
        }
        if let Some(v) = self.backup_interval_s {
            c.backup_interval_s = v;
        }
        if let Some(v) = self.backup_keep {
            c.backup_keep = v;
        }
        if self.read_only {
            c.read_only = true;
        }
        if let Some(v) = self.serve_threads {
            c.serve_threads = v;
        }
        if let Some(v) = &self.replicator {
            c.replicator = v.iter().filter(|a| !a.is_empty()).cloned().collect();
        }
        if let Some(v) = &self.durability {
            c.durability = v.parse()?;
        }
        if let Some(v) = self.epoch {
            c.epoch = strait_fs_core::Epoch(v);
        }
        if let Some(v) = self.lease_ms {
            c.lease_ms = v;
        }
        if self.accept_redis_loss {
            c.accept_redis_loss = true;
        }
        if let Some(v) = self.fenced_window_ms {
            c.fenced_window_ms = v;
        }
        c.validate()?;
        Ok(c)
    }
}

pub fn run(a: Args) -> Result<()> {
    match a.action {
        Some(Action::SetAside(s)) => return set_aside_cmd(s, Mode::SetAside),
        Some(Action::Rejoin(s)) => return set_aside_cmd(s, Mode::Rejoin),
        None => {}
    }
    if a.example_config {
        print!("{}", PrimaryConfig::example_toml());
        return Ok(());
    }
    let check = a.check_config;
    let cfg = a.resolve()?;
    if check {
        println!(
            "strait primary: the configuration is valid: listen {}, engine {}, metrics {}, \
             replicator [{}], durability {}, lease {} ms",
            cfg.listen,
            cfg.meta_url,
            if cfg.metrics_listen.is_empty() {
                "off"
            } else {
                &cfg.metrics_listen
            },
            cfg.replicator.join(", "),
            cfg.durability,
            cfg.lease_ms
        );
        super::daemon_flags::print_links(&cfg.links());
        super::daemon_flags::print_credentials(&cfg.security);
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.resolved_serve_threads())
        .thread_name("strait-primary")
        .enable_all()
        .build()?;
    rt.block_on(strait_primary::daemon::run(cfg))
}

/// `strait primary set-aside` and `rejoin`: the mirror's snapshot is loaded with the mirror's
/// own client.
fn set_aside_cmd(a: SetAsideArgs, mode: Mode) -> Result<()> {
    let client = a.client.credentials()?;
    // what set-aside presents to the replicator: --replicator-token, over TLS with --tls-ca
    let replicator_creds = strait_replicator_client::Credentials::new(
        Some(&a.replicator_token),
        client.tls().cloned(),
    )
    .context("--replicator-token")?;
    let req = set_aside::Request {
        mode,
        meta_url: a.meta_url.clone(),
        replicator: a.replicator.clone(),
        replicator_creds,
        from_mirror: a.from_mirror.clone(),
        out: a.out.clone(),
    };
    let from = a.from_mirror.clone();
    // the client is made inside the runtime (its channel needs a reactor)
    let load: set_aside::Loader = Box::new(move |kv| {
        Box::pin(async move {
            let source = strait_mirror::follower::Primary::new(&from, &client)?;
            strait_mirror::follower::bootstrap(&kv, &source, None).await
        })
    });
    let outcome =
        super::runtime()?.block_on(set_aside::run(&req, load, &mut |s| eprintln!("{s}")))?;
    match outcome {
        Outcome::Continued {
            local,
            trimmed,
            forgot_promotion,
        } => {
            if forgot_promotion {
                eprintln!(
                    "this engine was a promoted mirror's: its promotion is forgotten, so \
                     `strait mirror` on it follows the log"
                );
            }
            println!(
                "nothing set aside (the list in {} is empty): the replicator's log continues \
                 this engine's history at version {}; its outbox ({trimmed} records) is \
                 emptied. Start `strait mirror --meta-url {} --primary NEW_PRIMARY ...` on it: \
                 it follows from version {}",
                a.out.display(),
                local.next(),
                a.meta_url,
                local.next()
            );
        }
        Outcome::Swapped {
            set_aside,
            loaded,
            replicator_last,
            kept,
        } => {
            let next = match mode {
                Mode::SetAside => {
                    "start the primary: it catches up from the replicator".to_string()
                }
                Mode::Rejoin => format!(
                    "start `strait mirror --meta-url {} --primary NEW_PRIMARY ...` on it: it \
                     follows the replicator",
                    a.meta_url
                ),
            };
            println!(
                "set aside {set_aside} changes in {}; the metadata is now that of {} at version \
                 {loaded} (the old engine is kept in {}); {next} (version {replicator_last})",
                a.out.display(),
                a.from_mirror,
                kept.display(),
            );
        }
    }
    Ok(())
}
