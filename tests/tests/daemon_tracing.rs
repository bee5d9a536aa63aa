//! Traces: with an OTLP endpoint configured, the mount and the daemon export their spans, and
//! a daemon span is a child of the mount span of the same call (the trace context travels in
//! the `traceparent` metadata entry).

use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use parking_lot::Mutex;
use strait_tests::daemon::Primary;
use strait_tests::mount::{Mount, TestFs};

/// One exported span: (service, span name, trace id, span id, parent span id).
type Span = (String, String, Vec<u8>, Vec<u8>, Vec<u8>);

/// An OTLP trace collector that keeps what it receives.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Span>>>);

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
                .map(|v| format!("{:?}", v.value))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.push((
                        service.clone(),
                        s.name,
                        s.trace_id,
                        s.span_id,
                        s.parent_span_id,
                    ));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[test]
fn a_call_from_a_mount_and_its_handling_at_the_daemon_share_one_trace() {
    if !strait_tests::require_fuse() {
        return;
    }
    let collector = Collector::default();
    let port = strait_tests::free_port();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c2 = collector.clone();
    rt.spawn(async move {
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(c2))
            .serve(format!("127.0.0.1:{port}").parse().unwrap())
            .await
    });
    let endpoint = format!("http://127.0.0.1:{port}");

    let fs = TestFs::rocks_local(&[]);
    let mut daemon = Primary::start(&fs.meta_url, &[], &["--otlp-endpoint", &endpoint]);
    let env = vec![("STRAIT_OTLP_ENDPOINT".to_string(), endpoint.clone())];
    let m = Mount::start_at(&daemon.url(), &env, &["--token", &daemon.token]);
    std::fs::write(m.path("traced"), b"t").unwrap();
    // unmounting and stopping flush the exporters
    m.unmount();
    assert!(daemon.terminate());

    let start = Instant::now();
    loop {
        let spans = collector.0.lock().clone();
        let mount_spans: Vec<&Span> = spans
            .iter()
            .filter(|s| s.0.contains("strait-mount") && s.1 == "meta_rpc")
            .collect();
        let joined = spans.iter().any(|d| {
            d.0.contains("strait-primary")
                && d.1 == "rpc"
                && mount_spans.iter().any(|m| m.2 == d.2 && m.3 == d.4)
        });
        if joined {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no daemon span is a child of a mount span; collected {} spans ({} from the mount): {:?}",
            spans.len(),
            mount_spans.len(),
            spans.iter().take(10).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
