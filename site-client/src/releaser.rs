//! Closes sent in the background, in batches (see the crate docs).

use std::sync::mpsc::Receiver;
use std::sync::Weak;
use std::time::{Duration, Instant};

use strait_fs_core::error::{Error, Result};
use strait_fs_core::meta::Ino;
use strait_proto::meta as w;

use crate::remote_meta::RemoteMeta;

/// Closed handles waiting for the releaser; when the queue is full, closes are sent inline.
const RELEASE_QUEUE: usize = 4096;
/// How long the releaser gathers closes into one call: a few closes per call instead of one
/// call per close, for a delay far below what anyone waiting on a deletion would notice.
const RELEASE_GATHER: Duration = Duration::from_millis(2);

impl RemoteMeta {
    pub(crate) fn counted_open(&self, ino: Ino) {
        *self.open.lock().entry(ino).or_insert(0) += 1;
    }

    /// Send closed handles to the daemon, then stop counting them.
    pub(crate) fn send_releases(&self, inos: Vec<Ino>) -> Result<()> {
        let req = w::ReleaseRequest { inos };
        let res = self.call("release", false, |mut c| {
            let req = req.clone();
            async move { c.release(req).await }
        });
        // Counted off even when the call failed: a close that broke in flight may have been
        // applied, and the daemon drops whatever is left with the session.
        let mut open = self.open.lock();
        for ino in &req.inos {
            if let Some(n) = open.get_mut(ino) {
                *n -= 1;
                if *n == 0 {
                    open.remove(ino);
                }
            }
        }
        res.map(|_| ())
    }

    pub(crate) fn start_releaser(&self) -> Result<()> {
        let mut r = self.releaser.lock();
        if r.is_some() {
            return Ok(());
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(RELEASE_QUEUE);
        let me = self.me.clone();
        let handle = std::thread::Builder::new()
            .name("strait-releaser".into())
            .spawn(move || releaser(me, rx))
            .map_err(|e| Error::io("start the releaser thread", e))?;
        *r = Some((tx, handle));
        Ok(())
    }

    /// Send every queued close and stop the releaser.
    pub(crate) fn stop_releaser(&self) {
        let r = self.releaser.lock().take();
        if let Some((tx, handle)) = r {
            drop(tx);
            if handle.join().is_err() {
                tracing::error!("the releaser thread panicked");
            }
        }
    }
}

/// The releaser thread: sends queued closes in batches until the queue's sender is dropped.
/// A batch gathers the closes of [`RELEASE_GATHER`] after its first one.
fn releaser(me: Weak<RemoteMeta>, rx: Receiver<Ino>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        let deadline = Instant::now() + RELEASE_GATHER;
        while batch.len() < strait_proto::RELEASE_BATCH_MAX {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(ino) => batch.push(ino),
                Err(_) => break,
            }
        }
        let Some(me) = me.upgrade() else { return };
        if let Err(e) = me.send_releases(batch) {
            tracing::warn!("closing handles at the site daemon: {e}");
        }
    }
}
