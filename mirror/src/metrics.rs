//! Prometheus metrics of a mirror: the site daemon's (RPC latencies, sessions) plus the
//! replication ones, served with `/health` on the metrics address.

use std::sync::Arc;

use prometheus::{Gauge, Histogram, HistogramOpts, IntCounter, IntGauge, IntGaugeVec, Opts};

pub struct Metrics {
    /// The site daemon's metrics; its `strait_primary_version` gauge holds the newest version
    /// the mirror knows the primary has.
    pub base: Arc<strait_server::Metrics>,
    pub applied_version: IntGauge,
    pub primary_version: IntGauge,
    pub lag_seconds: Gauge,
    /// The staleness window W (`window_ms`), for alerts that compare the lag with it.
    pub window_seconds: Gauge,
    pub lag_versions: IntGauge,
    pub applied_records: IntCounter,
    pub record_lag: Histogram,
    pub state: IntGaugeVec,
    pub halted: IntGauge,
    pub bootstraps: IntCounter,
    pub forwarded_reads: IntCounter,
    pub waited_reads: IntCounter,
    pub stale_reads: IntCounter,
    pub forwarded_writes: IntCounter,
    pub write_errors: IntCounter,
    pub blocks_pending: IntGauge,
    pub bytes_pending: IntGauge,
    pub copied_blocks: IntCounter,
    pub copied_bytes: IntCounter,
    pub copy_rate: Gauge,
    pub fallback_reads: IntCounter,
    pub fallback_bytes: IntCounter,
    pub fallback_rate: Gauge,
    pub corrupt_blocks: IntCounter,
    pub deleted_blocks: IntCounter,
    pub skipped_dead_bytes: IntCounter,
    pub uploaded_blocks: IntCounter,
    pub block_errors: IntCounter,
    pub primary_moves: IntCounter,
}

/// Move a counter up to `v` (the value kept elsewhere).
pub fn catch_up(c: &IntCounter, v: u64) {
    let cur = c.get();
    if v > cur {
        c.inc_by(v - cur);
    }
}

fn gauge(name: &str, help: &str) -> IntGauge {
    IntGauge::with_opts(Opts::new(name, help)).expect("valid gauge")
}
fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::with_opts(Opts::new(name, help)).expect("valid counter")
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let base = strait_server::Metrics::new();
        let m = Metrics {
            primary_version: base.version.clone(),
            applied_version: gauge(
                "strait_mirror_applied_version",
                "Newest version of the change log this mirror has applied",
            ),
            lag_seconds: Gauge::with_opts(Opts::new(
                "strait_mirror_lag_seconds",
                "Age of the oldest change not applied yet, on the primary's clock",
            ))
            .expect("valid gauge"),
            window_seconds: Gauge::with_opts(Opts::new(
                "strait_mirror_window_seconds",
                "The staleness window: reads at a lag beyond it are forwarded, wait or are served \
                 stale, as the policy says",
            ))
            .expect("valid gauge"),
            lag_versions: gauge(
                "strait_mirror_lag_versions",
                "Versions the primary has committed that this mirror has not applied",
            ),
            applied_records: counter(
                "strait_mirror_applied_records_total",
                "Change records applied",
            ),
            record_lag: Histogram::with_opts(
                HistogramOpts::new(
                    "strait_mirror_apply_lag_seconds",
                    "Commit-to-apply time of each record: local wall clock at apply minus the \
                     primary's clock at commit (exact only where the clocks agree)",
                )
                .buckets(vec![
                    0.001, 0.002_5, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0,
                ]),
            )
            .expect("valid histogram"),
            state: IntGaugeVec::new(
                Opts::new("strait_mirror_state", "1 for the mirror's current state"),
                &["state"],
            )
            .expect("valid gauge"),
            halted: gauge(
                "strait_mirror_halted",
                "1 when an invalid record stopped the applier",
            ),
            bootstraps: counter(
                "strait_mirror_bootstraps_total",
                "Snapshots loaded from the primary",
            ),
            forwarded_reads: counter(
                "strait_mirror_forwarded_reads_total",
                "Reads answered by the primary because the mirror was outside its window",
            ),
            waited_reads: counter(
                "strait_mirror_waited_reads_total",
                "Reads that waited for the mirror to come back inside its window",
            ),
            stale_reads: counter(
                "strait_mirror_stale_reads_total",
                "Reads answered from metadata older than the window (policy serve)",
            ),
            forwarded_writes: counter(
                "strait_mirror_forwarded_writes_total",
                "Mutations made at this region's mounts, committed at the primary",
            ),
            write_errors: counter(
                "strait_mirror_write_errors_total",
                "Mutations at this region's mounts that failed (primary unreachable, timeout)",
            ),
            blocks_pending: gauge(
                "strait_mirror_blocks_pending",
                "Blocks queued for the background copy",
            ),
            bytes_pending: gauge(
                "strait_mirror_block_bytes_pending",
                "Bytes of the blocks queued for the background copy",
            ),
            copied_blocks: counter(
                "strait_mirror_copied_blocks_total",
                "Blocks copied from the primary's store by the background copy",
            ),
            copied_bytes: counter(
                "strait_mirror_copied_bytes_total",
                "Bytes copied from the primary's store by the background copy",
            ),
            copy_rate: Gauge::with_opts(Opts::new(
                "strait_mirror_copy_bytes_per_second",
                "Background copy rate over the last 10 s",
            ))
            .expect("valid gauge"),
            fallback_reads: counter(
                "strait_mirror_fallback_reads_total",
                "Blocks readers waited for, read from the primary's store across regions",
            ),
            fallback_bytes: counter(
                "strait_mirror_cross_region_read_bytes_total",
                "Bytes of the blocks read from the primary's store for waiting readers",
            ),
            fallback_rate: Gauge::with_opts(Opts::new(
                "strait_mirror_fallback_reads_per_second",
                "Cross-region reads for waiting readers over the last 10 s",
            ))
            .expect("valid gauge"),
            corrupt_blocks: counter(
                "strait_mirror_corrupt_blocks_total",
                "Blocks in this region's store that failed their CRC check (fetched again)",
            ),
            deleted_blocks: counter(
                "strait_mirror_deleted_blocks_total",
                "Blocks deleted from this region's store after the primary purged their slices",
            ),
            skipped_dead_bytes: counter(
                "strait_mirror_copy_skipped_dead_bytes_total",
                "Bytes of queued blocks not copied: their slice was dead here by their turn",
            ),
            uploaded_blocks: counter(
                "strait_mirror_uploaded_blocks_total",
                "Blocks written at this region uploaded to the primary's store",
            ),
            block_errors: counter(
                "strait_mirror_block_errors_total",
                "Failed block copies, fetches, uploads and deletions",
            ),
            primary_moves: counter(
                "strait_mirror_primary_moves_total",
                "Times the replicator's epoch named a new primary (a promotion elsewhere) and this \
                 mirror moved its forwarded writes and block reads there",
            ),
            base,
        };
        for c in [
            Box::new(m.applied_version.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(m.lag_seconds.clone()),
            Box::new(m.window_seconds.clone()),
            Box::new(m.lag_versions.clone()),
            Box::new(m.applied_records.clone()),
            Box::new(m.record_lag.clone()),
            Box::new(m.state.clone()),
            Box::new(m.halted.clone()),
            Box::new(m.bootstraps.clone()),
            Box::new(m.forwarded_reads.clone()),
            Box::new(m.waited_reads.clone()),
            Box::new(m.stale_reads.clone()),
            Box::new(m.forwarded_writes.clone()),
            Box::new(m.write_errors.clone()),
            Box::new(m.blocks_pending.clone()),
            Box::new(m.bytes_pending.clone()),
            Box::new(m.copied_blocks.clone()),
            Box::new(m.copied_bytes.clone()),
            Box::new(m.copy_rate.clone()),
            Box::new(m.fallback_reads.clone()),
            Box::new(m.fallback_bytes.clone()),
            Box::new(m.fallback_rate.clone()),
            Box::new(m.corrupt_blocks.clone()),
            Box::new(m.deleted_blocks.clone()),
            Box::new(m.skipped_dead_bytes.clone()),
            Box::new(m.uploaded_blocks.clone()),
            Box::new(m.block_errors.clone()),
            Box::new(m.primary_moves.clone()),
        ] {
            m.base
                .registry
                .register(c)
                .expect("metric names are unique");
        }
        Arc::new(m)
    }
}
