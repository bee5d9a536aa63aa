//! A small OTLP/gRPC trace collector for tests: it keeps every span it receives, with its
//! service, ids, parent, times and attributes, and prints a trace as a tree.

use std::collections::BTreeMap;
use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use parking_lot::Mutex;

/// One span received.
#[derive(Clone, Debug)]
pub struct Span {
    /// `service.name` of the process that sent it (`strait-mirror`, ...).
    pub service: String,
    pub name: String,
    pub trace_id: Vec<u8>,
    pub span_id: Vec<u8>,
    /// Empty for a root span.
    pub parent_id: Vec<u8>,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Attributes as `key=value` text.
    pub attributes: Vec<String>,
}

impl Span {
    pub fn millis(&self) -> f64 {
        self.end_ns.saturating_sub(self.start_ns) as f64 / 1e6
    }
}

/// The spans received so far.
#[derive(Clone, Default)]
pub struct Collector(pub Arc<Mutex<Vec<Span>>>);

fn text(v: &opentelemetry_proto::tonic::common::v1::AnyValue) -> String {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    match &v.value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = self.0.lock();
        for rs in req.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref())
                .map(text)
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.push(Span {
                        service: service.clone(),
                        name: s.name,
                        trace_id: s.trace_id,
                        span_id: s.span_id,
                        parent_id: s.parent_span_id,
                        start_ns: s.start_time_unix_nano,
                        end_ns: s.end_time_unix_nano,
                        attributes: s
                            .attributes
                            .iter()
                            .filter(|kv| {
                                !kv.key.starts_with("code.") && !kv.key.starts_with("thread.")
                            })
                            .map(|kv| {
                                format!(
                                    "{}={}",
                                    kv.key,
                                    kv.value.as_ref().map(text).unwrap_or_default()
                                )
                            })
                            .collect(),
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Collector {
    /// Serve on a free port of 127.0.0.1 on `rt`; the endpoint (`http://127.0.0.1:PORT`).
    pub fn serve(&self, rt: &tokio::runtime::Runtime) -> String {
        let port = super::free_port();
        let me = self.clone();
        rt.spawn(async move {
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(me))
                .serve(format!("127.0.0.1:{port}").parse().expect("an address"))
                .await
        });
        format!("http://127.0.0.1:{port}")
    }

    pub fn spans(&self) -> Vec<Span> {
        self.0.lock().clone()
    }
}

/// The spans of trace `trace_id` as a tree, one line each: service, name, duration,
/// attributes, indented under its parent; children in their start order.
pub fn tree(spans: &[Span], trace_id: &[u8]) -> String {
    let of: Vec<&Span> = spans.iter().filter(|s| s.trace_id == trace_id).collect();
    let mut children: BTreeMap<Vec<u8>, Vec<&Span>> = BTreeMap::new();
    for s in &of {
        children.entry(s.parent_id.clone()).or_default().push(s);
    }
    for c in children.values_mut() {
        c.sort_by_key(|s| s.start_ns);
    }
    let t0 = of.iter().map(|s| s.start_ns).min().unwrap_or(0);
    let mut out = String::new();
    fn walk(
        out: &mut String,
        children: &BTreeMap<Vec<u8>, Vec<&Span>>,
        id: &[u8],
        depth: usize,
        t0: u64,
    ) {
        for s in children.get(id).map(Vec::as_slice).unwrap_or(&[]) {
            out.push_str(&format!(
                "{:indent$}{} {} {:.2} ms (at +{:.2} ms) {}\n",
                "",
                s.service,
                s.name,
                s.millis(),
                s.start_ns.saturating_sub(t0) as f64 / 1e6,
                s.attributes.join(" "),
                indent = depth * 2
            ));
            walk(out, children, &s.span_id, depth + 1, t0);
        }
    }
    // roots: no parent, or a parent not in the trace
    let ids: std::collections::HashSet<&[u8]> = of.iter().map(|s| s.span_id.as_slice()).collect();
    let mut roots: Vec<Vec<u8>> = of
        .iter()
        .filter(|s| !ids.contains(s.parent_id.as_slice()))
        .map(|s| s.parent_id.clone())
        .collect();
    roots.sort();
    roots.dedup();
    for r in roots {
        walk(&mut out, &children, &r, 0, t0);
    }
    out
}
