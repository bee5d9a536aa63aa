//! When the follower applied each of its recent batches, so that a write forwarded through
//! this mirror can close its trace with the apply that made it visible here: the router,
//! once its version is applied, adds an `apply` span with the batch's real start and end
//! ([`Applies::trace`]).

use std::collections::VecDeque;
use std::time::SystemTime;

use opentelemetry::trace::{Span as _, TraceContextExt, Tracer};
use opentelemetry::KeyValue;
use parking_lot::Mutex;
use strait_fs_core::Version;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Batches remembered: a forwarded write looks its batch up within moments of the apply.
const BATCHES_MAX: usize = 256;

#[derive(Clone, Copy, Debug)]
struct Batch {
    first: Version,
    last: Version,
    start: SystemTime,
    end: SystemTime,
}

/// The recent batches the follower applied.
#[derive(Default)]
pub struct Applies(Mutex<VecDeque<Batch>>);

impl Applies {
    /// The follower applied `first..=last` from `start` to `end`.
    pub fn note(&self, first: Version, last: Version, start: SystemTime, end: SystemTime) {
        let mut b = self.0.lock();
        if b.len() >= BATCHES_MAX {
            b.pop_front();
        }
        b.push_back(Batch {
            first,
            last,
            start,
            end,
        });
    }

    /// Add, as a child of the current span (when traces are exported), the span of the apply
    /// of the batch that held `version`; nothing if that batch is no longer remembered.
    pub fn trace(&self, version: Version) {
        let parent = tracing::Span::current().context();
        if !parent.span().span_context().is_valid() {
            return;
        }
        let Some(b) = self
            .0
            .lock()
            .iter()
            .rev()
            .find(|b| b.first <= version && version <= b.last)
            .copied()
        else {
            return;
        };
        let tracer = opentelemetry::global::tracer("strait");
        let mut span = tracer
            .span_builder("apply")
            .with_start_time(b.start)
            .with_attributes(vec![
                KeyValue::new("first", b.first.0 as i64),
                KeyValue::new("last", b.last.0 as i64),
                KeyValue::new("version", version.0 as i64),
            ])
            .start_with_context(&tracer, &parent);
        span.end_with_timestamp(b.end);
    }
}
