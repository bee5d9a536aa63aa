//! Traces: with an OTLP endpoint configured, the mount and the daemon export their spans, and
//! a daemon span is a child of the mount span of the same call (the trace context travels in
//! the `traceparent` metadata entry).

use std::time::Duration;

use crate::support::daemon::Primary;
use crate::support::mount::{Mount, TestFs};
use crate::support::otlp::{Collector, Span};
use crate::support::wait_until;

#[test]
fn a_call_from_a_mount_and_its_handling_at_the_daemon_share_one_trace() {
    if !crate::support::require_fuse() {
        return;
    }
    let collector = Collector::default();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let endpoint = collector.serve(&rt);

    let fs = TestFs::rocks_local(&[]);
    let mut daemon = Primary::start(&fs.meta_url, &[], &["--otlp-endpoint", &endpoint]);
    let env = vec![("STRAIT_OTLP_ENDPOINT".to_string(), endpoint.clone())];
    let m = Mount::start_at(&daemon.url(), &env, &["--token", &daemon.token]);
    std::fs::write(m.path("traced"), b"t").unwrap();
    // unmounting and stopping flush the exporters
    m.unmount();
    assert!(daemon.terminate());

    wait_until(
        "no daemon span is a child of a mount span",
        Duration::from_secs(20),
        || {
            let spans = collector.spans();
            let mount_spans: Vec<&Span> = spans
                .iter()
                .filter(|s| s.service.contains("strait-mount") && s.name == "meta_rpc")
                .collect();
            let joined = spans.iter().any(|d| {
                d.service.contains("strait-primary")
                    && d.name == "rpc"
                    && mount_spans
                        .iter()
                        .any(|m| m.trace_id == d.trace_id && m.span_id == d.parent_id)
            });
            if joined {
                return Ok(());
            }
            Err(format!(
                "collected {} spans ({} from the mount): {:?}",
                spans.len(),
                mount_spans.len(),
                spans.iter().take(10).collect::<Vec<_>>()
            ))
        },
    );
}
