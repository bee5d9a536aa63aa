//! Prometheus metrics of a replicator node, served with `/health` on its metrics address
//! (`metrics_listen`; docs/metrics.md lists them all).
//!
//! Most are read at each scrape from what the node already keeps (openraft's metrics, the
//! change log's state, the snapshot directory), so they cost nothing between scrapes; the
//! appends' latency and the refused calls are counted as they happen.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use openraft::ServerState;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use crate::store::ChangeLog;
use crate::{NodeId, Raft};

/// The states a node reports in `strait_replicator_state{state}`, one of them 1.
const STATES: [(&str, ServerState); 4] = [
    ("leader", ServerState::Leader),
    ("follower", ServerState::Follower),
    ("candidate", ServerState::Candidate),
    ("learner", ServerState::Learner),
];

pub struct Metrics {
    registry: Registry,
    /// Latency of Append as the caller sees it (proposal, commit by a quorum, apply), by outcome.
    pub append_seconds: HistogramVec,
    /// Calls refused by the node's guard, by reason.
    pub refused: IntCounterVec,
    /// Subscriptions (mirrors, the primary reading back, relaying peers) served now.
    pub subscriptions: IntGauge,
    /// When the node's certificates expire, by file (`cert`, `client_ca`, `ca`): set by its
    /// starter, which holds the security settings.
    pub tls_expiry: IntGaugeVec,
    state: IntGaugeVec,
    is_leader: IntGauge,
    leader: IntGauge,
    term: IntGauge,
    last_log_index: IntGauge,
    commit_index: IntGauge,
    applied_index: IntGauge,
    snapshot_index: IntGauge,
    purged_index: IntGauge,
    voters: IntGauge,
    matched_index: IntGaugeVec,
    quorum_ack_age: prometheus::Gauge,
    epoch: IntGauge,
    last_version: IntGauge,
    earliest_version: IntGauge,
    records: IntGauge,
    log_bytes: IntGauge,
    appended_bytes: IntGauge,
    retention_bytes: IntGauge,
    retention_age: prometheus::Gauge,
    heartbeat_version: IntGauge,
    cursor_version: IntGaugeVec,
    cursor_behind: IntGaugeVec,
    cursor_age: prometheus::GaugeVec,
    cursor_bootstrap: IntGaugeVec,
    snapshots: IntGauge,
    snapshot_bytes: IntGauge,
}

fn gauge(r: &Registry, name: &str, help: &str) -> anyhow::Result<IntGauge> {
    let g = IntGauge::new(name, help)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

fn fgauge(r: &Registry, name: &str, help: &str) -> anyhow::Result<prometheus::Gauge> {
    let g = prometheus::Gauge::new(name, help)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

fn gauges(r: &Registry, name: &str, help: &str, labels: &[&str]) -> anyhow::Result<IntGaugeVec> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

impl Metrics {
    pub fn new() -> anyhow::Result<Arc<Metrics>> {
        let r = Registry::new();
        let append_seconds = HistogramVec::new(
            HistogramOpts::new(
                "strait_replicator_append_duration_seconds",
                "Appends from the primary, from the call's arrival to its answer (commit by a quorum and apply included), by outcome",
            )
            .buckets(vec![
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
            ]),
            &["outcome"],
        )?;
        r.register(Box::new(append_seconds.clone()))?;
        let refused = IntCounterVec::new(
            Opts::new(
                "strait_replicator_rpc_refused_total",
                "Calls refused: unauthenticated (no or unknown credentials) or permission_denied (a role the method does not admit)",
            ),
            &["reason"],
        )?;
        r.register(Box::new(refused.clone()))?;
        let cursor_age = prometheus::GaugeVec::new(
            Opts::new(
                "strait_replicator_cursor_age_seconds",
                "How long ago (by the primary's clock) the log passed each mirror's position; 0 when it is at the end",
            ),
            &["mirror"],
        )?;
        r.register(Box::new(cursor_age.clone()))?;
        Ok(Arc::new(Metrics {
            append_seconds,
            refused,
            subscriptions: gauge(&r, "strait_replicator_subscriptions", "Subscriptions served now")?,
            tls_expiry: gauges(
                &r,
                "strait_tls_certificate_expiry_timestamp_seconds",
                "When the certificates in each TLS file the node uses expire (the earliest in the file; seconds since 1970): cert (its own), client_ca, ca",
                &["file"],
            )?,
            state: gauges(&r, "strait_replicator_state", "The node's Raft state (1 for the one it is in)", &["state"])?,
            is_leader: gauge(&r, "strait_replicator_is_leader", "1 while this node is the leader")?,
            leader: gauge(&r, "strait_replicator_leader", "The leader this node knows of (its id; 0 when none is known)")?,
            term: gauge(&r, "strait_replicator_term", "The node's Raft term")?,
            last_log_index: gauge(&r, "strait_replicator_raft_last_log_index", "The last index in the node's Raft log")?,
            commit_index: gauge(&r, "strait_replicator_raft_commit_index", "At the leader, the highest index a quorum of voters holds; at a follower, the highest it applied")?,
            applied_index: gauge(&r, "strait_replicator_raft_applied_index", "The last Raft index applied to the change log")?,
            snapshot_index: gauge(&r, "strait_replicator_raft_snapshot_index", "The index of the node's last snapshot (0: none)")?,
            purged_index: gauge(&r, "strait_replicator_raft_purged_index", "The last Raft index purged from the node's log (0: none)")?,
            voters: gauge(&r, "strait_replicator_voters", "Voters in the membership")?,
            matched_index: gauges(&r, "strait_replicator_raft_matched_index", "At the leader: the last index each node is known to hold", &["node"])?,
            quorum_ack_age: fgauge(&r, "strait_replicator_quorum_ack_age_seconds", "At the leader: time since a quorum last acknowledged it (-1 elsewhere)")?,
            epoch: gauge(&r, "strait_replicator_log_epoch", "The change log's epoch (raised by each promotion)")?,
            last_version: gauge(&r, "strait_replicator_log_last_version", "The last version in the change log")?,
            earliest_version: gauge(&r, "strait_replicator_log_earliest_version", "The first version the log still holds")?,
            records: gauge(&r, "strait_replicator_log_records", "Records the log holds (retained)")?,
            log_bytes: gauge(&r, "strait_replicator_log_bytes", "Bytes of records the log holds (retained)")?,
            appended_bytes: gauge(&r, "strait_replicator_log_appended_bytes", "Bytes of records ever appended to the log")?,
            retention_bytes: gauge(&r, "strait_replicator_log_retention_max_bytes", "The retention's size cap (0: none)")?,
            retention_age: fgauge(&r, "strait_replicator_log_retention_max_age_seconds", "The retention's age cap (0: none)")?,
            heartbeat_version: gauge(&r, "strait_replicator_primary_heartbeat_version", "The latest version the primary's last heartbeat named")?,
            cursor_version: gauges(&r, "strait_replicator_cursor_version", "The version each mirror acknowledged applying", &["mirror"])?,
            cursor_behind: gauges(&r, "strait_replicator_cursor_versions_behind", "Versions between each mirror's cursor and the log's end", &["mirror"])?,
            cursor_age,
            cursor_bootstrap: gauges(&r, "strait_replicator_cursor_needs_bootstrap", "1 when the log was purged past the mirror's position (it must bootstrap again)", &["mirror"])?,
            snapshots: gauge(&r, "strait_replicator_snapshots", "Snapshot files the node holds")?,
            snapshot_bytes: gauge(&r, "strait_replicator_snapshot_bytes", "Bytes of the snapshot files the node holds")?,
            registry: r,
        }))
    }

    /// Read the node's state into the gauges, and the text exposition of every metric.
    pub fn render(&self, raft: &Raft, log: &ChangeLog, snapshot_dir: &std::path::Path) -> String {
        self.refresh(raft, log, snapshot_dir);
        let mut buf = vec![];
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!("encode metrics: {e}");
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    fn refresh(&self, raft: &Raft, log: &ChangeLog, snapshot_dir: &std::path::Path) {
        let m = raft.metrics().borrow().clone();
        for (name, s) in STATES {
            self.state
                .with_label_values(&[name])
                .set((m.state == s) as i64);
        }
        let leading = m.state == ServerState::Leader;
        self.is_leader.set(leading as i64);
        self.leader.set(to_i64(m.current_leader.unwrap_or(0)));
        self.term.set(to_i64(m.current_term));
        self.last_log_index
            .set(to_i64(m.last_log_index.unwrap_or(0)));
        let applied = m.last_applied.map_or(0, |l| l.index);
        self.applied_index.set(to_i64(applied));
        self.snapshot_index
            .set(to_i64(m.snapshot.map_or(0, |l| l.index)));
        self.purged_index
            .set(to_i64(m.purged.map_or(0, |l| l.index)));
        let voters: BTreeSet<NodeId> = m.membership_config.membership().voter_ids().collect();
        self.voters.set(voters.len() as i64);
        self.matched_index.reset();
        let mut commit = applied;
        if let (true, Some(rep)) = (leading, m.replication.as_ref()) {
            let mut held: Vec<u64> = vec![];
            for (id, matched) in rep.iter() {
                let at = matched.map_or(0, |l| l.index);
                self.matched_index
                    .with_label_values(&[&id.to_string()])
                    .set(to_i64(at));
                if voters.contains(id) {
                    held.push(at);
                }
            }
            // the highest index a majority holds
            held.sort_unstable_by(|a, b| b.cmp(a));
            if let Some(q) = held.get(voters.len() / 2) {
                commit = commit.max(*q);
            }
        }
        self.commit_index.set(to_i64(commit));
        self.quorum_ack_age
            .set(match (leading, m.millis_since_quorum_ack) {
                (true, Some(ms)) => ms as f64 / 1000.0,
                _ => -1.0,
            });

        let log = log.state();
        self.epoch.set(to_i64(log.epoch.0));
        self.last_version.set(to_i64(log.last_version.0));
        self.earliest_version.set(to_i64(log.earliest_version.0));
        let held = if log.last_version.0 >= log.earliest_version.0 {
            log.last_version.0 - log.earliest_version.0 + 1
        } else {
            0
        };
        self.records.set(to_i64(held));
        self.log_bytes.set(to_i64(log.held_bytes()));
        self.appended_bytes.set(to_i64(log.appended_bytes));
        self.retention_bytes.set(to_i64(log.retention.max_bytes));
        self.retention_age
            .set(log.retention.max_age_ms as f64 / 1000.0);
        self.heartbeat_version
            .set(to_i64(log.heartbeat.map_or(0, |(_, v)| v.0)));
        // a forgotten mirror's series go with it
        self.cursor_version.reset();
        self.cursor_behind.reset();
        self.cursor_age.reset();
        self.cursor_bootstrap.reset();
        for (name, c) in &log.cursors {
            let l = [name.as_str()];
            self.cursor_version
                .with_label_values(&l)
                .set(to_i64(c.applied_version.0));
            self.cursor_behind.with_label_values(&l).set(to_i64(
                log.last_version.0.saturating_sub(c.applied_version.0),
            ));
            let age = if c.needs_bootstrap {
                None
            } else {
                log.position_age_ms(c.applied_version)
            };
            self.cursor_age
                .with_label_values(&l)
                .set(age.unwrap_or(0) as f64 / 1000.0);
            self.cursor_bootstrap
                .with_label_values(&l)
                .set(c.needs_bootstrap as i64);
        }

        let (files, bytes) = snapshot_files(snapshot_dir);
        self.snapshots.set(files);
        self.snapshot_bytes.set(bytes);
    }
}

/// The complete snapshot files (`snap-*`) in `dir`, and their bytes.
fn snapshot_files(dir: &std::path::Path) -> (i64, i64) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    rd.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("snap-"))
        .fold((0, 0), |(n, b), e| {
            let len = e.metadata().map_or(0, |m| m.len());
            (n + 1, b + to_i64(len))
        })
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// `/health`: healthy while the node knows a leader (itself or another), with a line saying
/// which, or why not.
pub fn health(raft: &Raft) -> (bool, String) {
    let m = raft.metrics().borrow().clone();
    if let Err(e) = &m.running_state {
        return (false, format!("node {}: Raft stopped: {e}", m.id));
    }
    match m.current_leader {
        Some(l) if l == m.id => (
            true,
            format!("node {}: the leader, term {}", m.id, m.current_term),
        ),
        Some(l) => (
            true,
            format!("node {}: follows leader {l}, term {}", m.id, m.current_term),
        ),
        None => (
            false,
            format!(
                "node {}: no leader known (term {}, {:?}): an election is under way or a quorum is not reachable",
                m.id, m.current_term, m.state
            ),
        ),
    }
}

/// What the metrics endpoint reads a node through: cheap to clone into its handlers.
#[derive(Clone)]
pub struct Observer {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) raft: Raft,
    pub(crate) log: ChangeLog,
    pub(crate) snapshot_dir: PathBuf,
    pub(crate) subscriptions: strait_auth::Slots,
}

impl Observer {
    /// The text exposition of every metric, read now.
    pub fn render(&self) -> String {
        self.metrics
            .subscriptions
            .set(self.subscriptions.held() as i64);
        self.metrics
            .render(&self.raft, &self.log, &self.snapshot_dir)
    }

    /// The gauge of when the node's certificates expire.
    pub fn tls_expiry(&self) -> &IntGaugeVec {
        &self.metrics.tls_expiry
    }

    /// `/health`: see [`health`].
    pub fn health(&self) -> (bool, String) {
        health(&self.raft)
    }
}
