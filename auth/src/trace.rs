//! The W3C trace context (`traceparent`, `tracestate`) in a call's headers: every client call
//! carries its current span's ([`Bearer`](crate::client::Bearer) puts it in), so that a
//! daemon's span of the call, made with [`parent`], joins the caller's trace. Without an
//! OTLP exporter the current span has no valid context and nothing is added.

use http::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector};
use tracing_opentelemetry::OpenTelemetrySpanExt;

struct Headers<'a>(&'a mut HeaderMap);

impl Injector for Headers<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(k, v);
        }
    }
}

struct ReadHeaders<'a>(&'a HeaderMap);

impl Extractor for ReadHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Put the current span's trace context in `headers` (replacing one already there).
pub fn inject(headers: &mut HeaderMap) {
    let cx = tracing::Span::current().context();
    if !opentelemetry::trace::TraceContextExt::span(&cx)
        .span_context()
        .is_valid()
    {
        return;
    }
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut Headers(headers))
    });
}

/// The trace context the caller sent in `headers` (an empty one if none).
pub fn parent(headers: &HeaderMap) -> opentelemetry::Context {
    opentelemetry::global::get_text_map_propagator(|p| p.extract(&ReadHeaders(headers)))
}

/// `span`, made a child of the caller's span named in `headers`; returned for chaining.
pub fn child_of(span: tracing::Span, headers: &HeaderMap) -> tracing::Span {
    let _ = span.set_parent(parent(headers));
    span
}
