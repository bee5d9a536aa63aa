//! `strait mirror status`: what each mirror (or every mirror a replicator or primary knows)
//! reports, gathered into one report, printed as a table or JSON (`mirror_watch.rs` draws it
//! live).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use strait_auth::Credentials;
use strait_proto::site as s;

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
    /// Its background workers (empty for a row known only from its cursor).
    pub workers: Vec<Worker>,
}

/// One background worker of a mirror, in `mirror status`.
#[derive(serde::Serialize, Clone, Debug, Default)]
pub struct Worker {
    pub name: String,
    /// running, retrying, stopped, done, exited or panicked
    pub state: String,
    /// How long it has been in that state.
    pub for_ms: u64,
    pub errors: u64,
    pub last_error: String,
}

/// The workers of `m` as one line of the table: how many run, then each that does not or
/// that failed.
fn workers_line(m: &Row) -> Option<String> {
    if m.workers.is_empty() {
        return None;
    }
    let running = m.workers.iter().filter(|w| w.state == "running").count();
    let mut out = format!(
        "{}: {} of {} workers running",
        m.mirror,
        running,
        m.workers.len()
    );
    for w in m
        .workers
        .iter()
        .filter(|w| w.state != "running" || w.errors > 0)
    {
        out.push_str(&format!("; {} {}", w.name, w.state));
        if w.errors > 0 {
            out.push_str(&format!(" ({} errors, last: {})", w.errors, w.last_error));
        }
    }
    Some(out)
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
        workers: m
            .workers
            .into_iter()
            .map(|w| Worker {
                name: w.name,
                state: w.state,
                for_ms: w.for_ms,
                errors: w.errors,
                last_error: w.last_error,
            })
            .collect(),
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

/// Gather the report from `addr` (a mirror, a primary or a replicator node).
pub async fn gather(a: &StatusArgs) -> Result<Report> {
    let mut report = Report::default();
    let mut replicators: Vec<String> = vec![];
    let mut is_primary = false;
    let site_creds = a.client.credentials()?;
    match strait_mirror::follower::site_status(&a.addr, &site_creds).await {
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
        match strait_mirror::follower::site_status(addr, &site_creds).await {
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

pub fn print_table(r: &Report) {
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
    for line in r.mirrors.iter().filter_map(workers_line) {
        println!("{line}");
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
