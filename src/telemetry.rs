//! Logging and tracing for every strait process: log lines on stderr, and, when an OTLP
//! endpoint is given, spans exported over OTLP/gRPC. The W3C trace-context propagator is
//! always installed, so a mount's RPC spans and the daemon's spans join one trace.

use anyhow::{Context, Result};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Keeps the exporter alive; dropping it flushes the spans not yet exported.
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
    _rt: Option<tokio::runtime::Runtime>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            if let Err(e) = p.shutdown() {
                eprintln!("strait: flush traces: {e}");
            }
        }
    }
}

/// Install the subscriber. `service` names the process in traces (`strait-mount`, ...).
pub fn init(filter: &str, otlp_endpoint: Option<&str>, service: &str) -> Result<Telemetry> {
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .with_context(|| format!("log filter {filter:?}"))?;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false);
    let Some(endpoint) = otlp_endpoint.filter(|e| !e.is_empty()) else {
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(fmt)
            .try_init();
        return Ok(Telemetry {
            provider: None,
            _rt: None,
        });
    };
    use opentelemetry::trace::TracerProvider;
    use opentelemetry_otlp::WithExportConfig;
    // the tonic exporter needs a tokio runtime of its own, alive as long as the exporter
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("strait-otlp")
        .enable_all()
        .build()
        .context("start the trace export runtime")?;
    let provider = rt.block_on(async {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .with_context(|| format!("OTLP exporter for {endpoint}"))?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(service.to_string())
            .build();
        anyhow::Ok(
            opentelemetry_sdk::trace::SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource)
                .build(),
        )
    })?;
    let tracer = provider.tracer("strait");
    opentelemetry::global::set_tracer_provider(provider.clone());
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(tracing_opentelemetry::layer().with_tracer(tracer))
        .try_init();
    tracing::info!("exporting traces to {endpoint}");
    Ok(Telemetry {
        provider: Some(provider),
        _rt: Some(rt),
    })
}
