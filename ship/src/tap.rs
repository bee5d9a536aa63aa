//! The tap on the primary's metadata engine: every committed version is told to the shipper
//! at once ([`CommitSignal`]), so it ships without waiting for its next poll.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use strait_fs_core::kv::{DynKv, KvEngine, KvTxn};
use strait_fs_core::Version;
use tokio::sync::Notify;

/// Tells the shipper about commits as they happen.
#[derive(Default)]
pub struct CommitSignal {
    pub(crate) latest: AtomicU64,
    pub(crate) notify: Notify,
}

impl CommitSignal {
    pub fn latest(&self) -> Version {
        Version(self.latest.load(Ordering::Acquire))
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
}
