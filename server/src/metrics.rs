//! Prometheus metrics of a site daemon, and the HTTP endpoint serving them with `/health`.
//!
//! [`Metrics`] holds every metric of the primary's process (the mirror's metrics wrap it and
//! register theirs in its registry); the shipper's and GC's stay zero at a mirror.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use axum::http::StatusCode;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntGauge, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    pub registry: Registry,
    /// Latency of each RPC by operation and outcome (`ok` or the errno's name).
    pub rpc_seconds: HistogramVec,
    /// Sessions (mounts) this daemon holds.
    pub sessions: IntGauge,
    /// The newest version in the change log.
    pub version: IntGauge,
    /// Calls refused for missing or unknown credentials.
    pub unauthenticated: IntCounter,
    /// Calls refused because the caller's roles may not make them.
    pub permission_denied: IntCounter,
    /// Sessions closed because their heartbeat stopped.
    pub sessions_expired: IntCounter,
    /// Dead slices whose blocks were deleted.
    pub slices_collected: IntCounter,
    /// Dead slices kept in the last GC pass because a mirror still references them.
    pub gc_held: IntGauge,
    /// The newest version the replicator has committed (shipped).
    pub shipped_version: IntGauge,
    /// Latency of the shipper's appends to the replicator.
    pub ship_seconds: prometheus::Histogram,
    /// Appends and heartbeats that failed (after their retries).
    pub ship_errors: IntCounter,
    /// Operations that failed in `replicated` mode because the replicator did not commit them in time.
    pub replication_timeouts: IntCounter,
    /// Mutations sent again with a request id already seen, answered with the first result.
    pub requests_retried: IntCounter,
    /// Versions a primary whose metadata went back applied from the replicator.
    pub caught_up_versions: IntCounter,
    /// Of those, the ones answered from the request record on disk (the daemon restarted, or
    /// forgot the id).
    pub requests_replayed: IntCounter,
    /// Request records kept, as the last sweep counted them.
    pub request_records: IntGauge,
    /// Changes committed under a request id another change had committed under already.
    pub requests_applied_twice: IntGauge,
    /// Request records removed for their age.
    pub request_records_expired: IntCounter,
    /// Request records removed before their time, past the bound.
    pub request_records_evicted: IntCounter,
    /// When the certificates the daemon presents or trusts expire, by file.
    pub tls_expiry: prometheus::IntGaugeVec,
    /// What the metadata engine holds in memory, by part (see [`Metrics::note_memory`]).
    pub engine_memory: prometheus::IntGaugeVec,
    /// The daemon's resident memory.
    pub resident_memory: IntGauge,
}

/// The gauge of when a daemon's certificates expire (one series per file: `cert`,
/// `client_ca`, `ca`), for the primary, a mirror and a replicator node alike.
fn tls_expiry_gauge() -> prometheus::IntGaugeVec {
    prometheus::IntGaugeVec::new(
        Opts::new(
            "strait_tls_certificate_expiry_timestamp_seconds",
            "When the certificates in each TLS file the daemon uses expire (the earliest in \
             the file; seconds since 1970): cert (its own), client_ca, ca",
        ),
        &["file"],
    )
    .expect("valid gauge")
}

/// Set `gauge` from `sec`'s certificate files; a file that cannot be read is only logged
/// (the daemon read it already to serve TLS).
pub fn note_certificate_expiries(gauge: &prometheus::IntGaugeVec, sec: &strait_auth::Security) {
    match sec.certificate_expiries() {
        Ok(list) => {
            for (which, at) in list {
                gauge.with_label_values(&[which]).set(at);
            }
        }
        Err(e) => tracing::warn!("read the certificates' expiry: {e}"),
    }
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let registry = Registry::new();
        let rpc_seconds = HistogramVec::new(
            HistogramOpts::new(
                "strait_rpc_duration_seconds",
                "Latency of metadata RPCs served, by operation and outcome",
            )
            .buckets(vec![
                0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05,
                0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
            &["op", "outcome"],
        )
        .expect("valid histogram");
        let sessions = IntGauge::with_opts(Opts::new(
            "strait_sessions",
            "Mount sessions held by this daemon",
        ))
        .expect("valid gauge");
        let version = IntGauge::with_opts(Opts::new(
            "strait_primary_version",
            "Newest version in the primary's change log",
        ))
        .expect("valid gauge");
        let unauthenticated = IntCounter::with_opts(Opts::new(
            "strait_rpc_unauthenticated_total",
            "Calls refused for missing or unknown credentials (no token, a wrong token)",
        ))
        .expect("valid counter");
        let permission_denied = IntCounter::with_opts(Opts::new(
            "strait_rpc_permission_denied_total",
            "Calls refused because the caller's roles may not make them",
        ))
        .expect("valid counter");
        let sessions_expired = IntCounter::with_opts(Opts::new(
            "strait_sessions_expired_total",
            "Sessions closed because their heartbeat stopped",
        ))
        .expect("valid counter");
        let gc_held = IntGauge::with_opts(Opts::new(
            "strait_gc_held_for_mirrors",
            "Dead slices the last GC pass kept because a mirror has not applied past their death",
        ))
        .expect("valid metric");
        let slices_collected = IntCounter::with_opts(Opts::new(
            "strait_gc_slices_total",
            "Dead slices whose blocks were deleted",
        ))
        .expect("valid counter");
        let shipped_version = IntGauge::with_opts(Opts::new(
            "strait_shipped_version",
            "Newest version of the change log the replicator has committed",
        ))
        .expect("valid gauge");
        let ship_seconds = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "strait_ship_append_seconds",
                "Latency of the shipper's appends to the replicator",
            )
            .buckets(vec![
                0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
        )
        .expect("valid histogram");
        let ship_errors = IntCounter::with_opts(Opts::new(
            "strait_ship_errors_total",
            "Appends and heartbeats to the replicator that failed after their retries",
        ))
        .expect("valid counter");
        let replication_timeouts = IntCounter::with_opts(Opts::new(
            "strait_replication_timeouts_total",
            "Operations failed in replicated mode: the replicator did not commit them in time",
        ))
        .expect("valid counter");
        let requests_retried = IntCounter::with_opts(Opts::new(
            "strait_requests_retried_total",
            "Mutations sent again with a request id already seen (a connection broke with the \
             call in flight), answered with the first call's result",
        ))
        .expect("valid counter");
        let requests_replayed = IntCounter::with_opts(Opts::new(
            "strait_requests_replayed_total",
            "Mutations sent again whose first call committed before this daemon started (or \
             whose id it forgot), answered from the request record committed with the change",
        ))
        .expect("valid counter");
        let request_records = IntGauge::with_opts(Opts::new(
            "strait_request_records",
            "Request records kept for retries, as the last sweep counted them",
        ))
        .expect("valid gauge");
        let requests_applied_twice = IntGauge::with_opts(Opts::new(
            "strait_requests_applied_twice",
            "Changes of this engine's history committed under a request id that another change \
             had committed under already: a change applied twice (0 unless something is wrong)",
        ))
        .expect("valid gauge");
        let request_records_expired = IntCounter::with_opts(Opts::new(
            "strait_request_records_expired_total",
            "Request records removed for their age",
        ))
        .expect("valid counter");
        let request_records_evicted = IntCounter::with_opts(Opts::new(
            "strait_request_records_evicted_total",
            "Request records removed before their time because too many were kept",
        ))
        .expect("valid counter");
        let caught_up_versions = IntCounter::with_opts(Opts::new(
            "strait_caught_up_versions_total",
            "Versions a primary whose metadata went back (a power loss, a restore) applied from \
             the replicator before it took changes again",
        ))
        .expect("valid counter");
        let tls_expiry = tls_expiry_gauge();
        let engine_memory = prometheus::IntGaugeVec::new(
            Opts::new(
                "strait_engine_memory_bytes",
                "What the metadata engine holds in this daemon's memory, by part (RocksDB: \
                 block_cache, block_cache_pinned, memtables, table_readers)",
            ),
            &["part"],
        )
        .expect("valid gauge");
        let resident_memory = IntGauge::with_opts(Opts::new(
            "strait_resident_memory_bytes",
            "The daemon's resident memory (RSS), as the kernel counts it",
        ))
        .expect("valid gauge");
        for c in [
            Box::new(rpc_seconds.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(caught_up_versions.clone()),
            Box::new(requests_retried.clone()),
            Box::new(requests_replayed.clone()),
            Box::new(request_records.clone()),
            Box::new(requests_applied_twice.clone()),
            Box::new(request_records_expired.clone()),
            Box::new(request_records_evicted.clone()),
            Box::new(sessions.clone()),
            Box::new(version.clone()),
            Box::new(unauthenticated.clone()),
            Box::new(permission_denied.clone()),
            Box::new(sessions_expired.clone()),
            Box::new(slices_collected.clone()),
            Box::new(gc_held.clone()),
            Box::new(shipped_version.clone()),
            Box::new(ship_seconds.clone()),
            Box::new(ship_errors.clone()),
            Box::new(replication_timeouts.clone()),
            Box::new(tls_expiry.clone()),
            Box::new(engine_memory.clone()),
            Box::new(resident_memory.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        Arc::new(Metrics {
            registry,
            rpc_seconds,
            sessions,
            version,
            unauthenticated,
            permission_denied,
            sessions_expired,
            slices_collected,
            gc_held,
            shipped_version,
            ship_seconds,
            ship_errors,
            replication_timeouts,
            requests_retried,
            caught_up_versions,
            requests_replayed,
            request_records,
            requests_applied_twice,
            request_records_expired,
            request_records_evicted,
            tls_expiry,
            engine_memory,
            resident_memory,
        })
    }

    pub fn observe(&self, op: &str, outcome: &str, took: Duration) {
        self.rpc_seconds
            .with_label_values(&[op, outcome])
            .observe(took.as_secs_f64());
    }

    /// Set the memory gauges: the engine's parts (from [`KvEngine::memory`]) and the
    /// daemon's resident memory.
    ///
    /// [`KvEngine::memory`]: strait_fs_core::kv::KvEngine::memory
    pub fn note_memory(&self, engine: &[(&str, u64)]) {
        for (part, bytes) in engine {
            self.engine_memory
                .with_label_values(&[*part])
                .set(i64::try_from(*bytes).unwrap_or(i64::MAX));
        }
        if let Some(bytes) = resident_bytes() {
            self.resident_memory
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = vec![];
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!("encode metrics: {e}");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// This process's resident memory, from `/proc/self/statm` (its second field, in pages).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a configuration value
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// The one HTTP listener of a site daemon: `/metrics` answers `render()` (the text
/// exposition) and `/health` answers `health()` (a status and a line saying why), on
/// `listener` until `stop` fires.
pub async fn serve<R, RF, H, HF>(
    listener: tokio::net::TcpListener,
    render: R,
    health: H,
    stop: tokio_util::sync::CancellationToken,
) where
    R: Fn() -> RF + Clone + Send + Sync + 'static,
    RF: Future<Output = String> + Send + 'static,
    H: Fn() -> HF + Clone + Send + Sync + 'static,
    HF: Future<Output = (StatusCode, String)> + Send + 'static,
{
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let text = render();
                async move { ([("content-type", "text/plain; version=0.0.4")], text.await) }
            }),
        )
        .route("/health", get(health));
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
    {
        tracing::error!("metrics endpoint: {e}");
    }
}
