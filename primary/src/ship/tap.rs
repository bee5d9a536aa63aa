//! The tap on the primary's metadata engine: every committed version is told to the shipper
//! at once ([`CommitSignal`]), so it ships without waiting for its next poll, with the trace
//! context of the call that committed it, when it has one (traces exported).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use opentelemetry::trace::TraceContextExt;
use parking_lot::Mutex;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use strait_fs_core::kv::{DynKv, KvEngine, KvTxn};
use strait_fs_core::Version;
use tokio::sync::Notify;

/// Trace contexts kept for commits not shipped yet; the oldest go first past it.
const TRACED_MAX: usize = 1024;

/// Tells the shipper about commits as they happen.
#[derive(Default)]
pub struct CommitSignal {
    pub(crate) latest: AtomicU64,
    pub(crate) notify: Notify,
    /// (version, the trace context of the call that committed it), oldest first.
    traced: Mutex<VecDeque<(u64, opentelemetry::Context)>>,
}

impl CommitSignal {
    pub fn latest(&self) -> Version {
        Version(self.latest.load(Ordering::Acquire))
    }

    /// Keep the current span's trace context for `version`, if it has one.
    fn note_trace(&self, version: Version) {
        let cx = tracing::Span::current().context();
        if !cx.span().span_context().is_valid() {
            return;
        }
        let mut t = self.traced.lock();
        if t.len() >= TRACED_MAX {
            t.pop_front();
        }
        t.push_back((version.0, cx));
    }

    /// The trace contexts of the commits up to `last`, taken: (version, context).
    pub(crate) fn take_traced(&self, last: Version) -> Vec<(u64, opentelemetry::Context)> {
        let mut t = self.traced.lock();
        let n = t.iter().take_while(|(v, _)| *v <= last.0).count();
        t.drain(..n).collect()
    }
}

/// A metadata engine that tells the shipper about each committed version, so it ships at once
/// instead of at its next poll.
pub struct TappedKv {
    inner: DynKv,
    signal: Arc<CommitSignal>,
}

impl TappedKv {
    pub fn wrap(inner: DynKv) -> (DynKv, Arc<CommitSignal>) {
        let signal = Arc::new(CommitSignal::default());
        if let Ok(v) = inner.last_version() {
            signal.latest.store(v.0, Ordering::Release);
        }
        let kv = Arc::new(TappedKv {
            inner,
            signal: signal.clone(),
        });
        (kv, signal)
    }
}

impl KvEngine for TappedKv {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn txn(
        &self,
        f: &mut dyn FnMut(&mut dyn KvTxn) -> strait_fs_core::Result<()>,
    ) -> strait_fs_core::Result<Option<Version>> {
        let v = self.inner.txn(f)?;
        if let Some(v) = v {
            self.signal.latest.fetch_max(v.0, Ordering::AcqRel);
            self.signal.note_trace(v);
            self.signal.notify.notify_one();
        }
        Ok(v)
    }
    fn read(
        &self,
        f: &mut dyn FnMut(&mut dyn KvTxn) -> strait_fs_core::Result<()>,
    ) -> strait_fs_core::Result<()> {
        self.inner.read(f)
    }
    fn incr(&self, key: &[u8], delta: i64) -> strait_fs_core::Result<i64> {
        self.inner.incr(key, delta)
    }
    fn sync(&self) -> strait_fs_core::Result<()> {
        self.inner.sync()
    }
    fn last_version(&self) -> strait_fs_core::Result<Version> {
        self.inner.last_version()
    }
    fn wipe(&self) -> strait_fs_core::Result<()> {
        self.inner.wipe()
    }
    fn memory(&self) -> Vec<(&'static str, u64)> {
        self.inner.memory()
    }
}
