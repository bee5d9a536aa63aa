//! Prometheus metrics of a mirror: the site daemon's (RPC latencies, sessions) plus the
//! replication ones, served with `/health` on the metrics address.

use std::sync::Arc;

use prometheus::{Gauge, Histogram, HistogramOpts, IntCounter, IntGauge, IntGaugeVec, Opts};

pub struct Metrics {
    /// The site daemon's metrics; its `strait_primary_version` gauge holds the newest version
    /// the mirror knows the primary has.
    pub base: Arc<strait_primary::metrics::Metrics>,
    pub applied_version: IntGauge,
    pub primary_version: IntGauge,
    pub lag_seconds: Gauge,
    pub lag_versions: IntGauge,
    pub applied_records: IntCounter,
    pub record_lag: Histogram,
    pub state: IntGaugeVec,
    pub halted: IntGauge,
    pub bootstraps: IntCounter,
    pub forwarded_reads: IntCounter,
    pub waited_reads: IntCounter,
    pub stale_reads: IntCounter,
}

fn gauge(name: &str, help: &str) -> IntGauge {
    IntGauge::with_opts(Opts::new(name, help)).expect("valid gauge")
}
fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::with_opts(Opts::new(name, help)).expect("valid counter")
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let base = strait_primary::metrics::Metrics::new();
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
            base,
        };
        for c in [
            Box::new(m.applied_version.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(m.lag_seconds.clone()),
            Box::new(m.lag_versions.clone()),
            Box::new(m.applied_records.clone()),
            Box::new(m.record_lag.clone()),
            Box::new(m.state.clone()),
            Box::new(m.halted.clone()),
            Box::new(m.bootstraps.clone()),
            Box::new(m.forwarded_reads.clone()),
            Box::new(m.waited_reads.clone()),
            Box::new(m.stale_reads.clone()),
        ] {
            m.base
                .registry
                .register(c)
                .expect("metric names are unique");
        }
        Arc::new(m)
    }
}

/// Serve `/metrics` and `/health` (200 while following inside the window) until `stop`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    mirror: Arc<crate::state::Mirror>,
    stop: tokio_util::sync::CancellationToken,
) {
    use axum::http::StatusCode;
    use axum::routing::get;
    let m = mirror.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = m.clone();
                async move {
                    m.tick_gauges();
                    (
                        [("content-type", "text/plain; version=0.0.4")],
                        m.metrics.base.render(),
                    )
                }
            }),
        )
        .route(
            "/health",
            get(move || {
                let m = mirror.clone();
                async move {
                    let st = m.status();
                    let code = if st.state == "following" {
                        StatusCode::OK
                    } else {
                        StatusCode::SERVICE_UNAVAILABLE
                    };
                    (
                        code,
                        format!(
                            "{} applied {} lag {} ms {}\n",
                            st.state, st.applied_version, st.lag_ms, st.error
                        ),
                    )
                }
            }),
        );
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
    {
        tracing::error!("metrics endpoint: {e}");
    }
}
