//! What the metadata service asks of the shipper, without knowing it: whether this primary may
//! commit at all ([`EpochFence`], the service's `WriteFence`) and, in `replicated` durability,
//! when a version is replicated ([`ShippedWait`], its `ReplicationWait`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strait_fs_core::Version;
use strait_server::ReplicationWait;
use tokio::sync::watch;

use crate::ship::shipper::{Contact, Shipped};

/// How long a change waits, after the daemon started, for the shipper's first comparison of
/// the replicator's log with this primary's (an unreachable replicator does not hold changes
/// longer in `local` durability).
pub const FIRST_CHECK_WAIT: Duration = Duration::from_secs(5);

/// The primary's mutations are refused once the shipper saw a newer epoch or a replicator
/// log this primary's does not continue, or its lease ran out; every call waits for its state
/// to settle first (its first comparison with the replicator's log, a catch-up).
pub struct EpochFence {
    pub shipped: watch::Receiver<Shipped>,
    pub started: Instant,
    /// `replicated` durability: no call is answered from this primary's state before it was
    /// compared with the replicator's log (however long that takes), since a power loss may
    /// have taken acknowledged changes from it. In `local` durability calls wait at most
    /// [`FIRST_CHECK_WAIT`] after the start.
    pub strict: bool,
    /// With a lease: how long the primary may go without a word from the replicator, and
    /// when it last had one.
    pub lease: Option<(Duration, Arc<Contact>)>,
    /// How long a fenced primary still answers reads of its metadata (then EIO: it holds a
    /// history that no longer goes on), as a mirror answers within its window.
    pub fenced_reads: Duration,
}

impl EpochFence {
    /// With a lease: its length, and how much of it is left now (zero once it ran out).
    pub fn lease_left(&self) -> Option<(Duration, Duration)> {
        let (lease, contact) = self.lease.as_ref()?;
        Some((*lease, lease.saturating_sub(contact.silence())))
    }
}

impl strait_server::WriteFence for EpochFence {
    fn unsettled(&self) -> Pin<Box<dyn Future<Output = Option<String>> + Send + '_>> {
        Box::pin(async move {
            let mut rx = self.shipped.clone();
            if !rx.borrow().checked {
                let left = if self.strict {
                    SETTLE_WAIT
                } else {
                    FIRST_CHECK_WAIT.saturating_sub(self.started.elapsed())
                };
                if !left.is_zero() {
                    let _ = tokio::time::timeout(left, rx.wait_for(|s| s.checked)).await;
                }
            }
            if rx.borrow().catching_up.is_some() {
                let _ = tokio::time::timeout(SETTLE_WAIT, rx.wait_for(|s| s.catching_up.is_none()))
                    .await;
            }
            let s = rx.borrow();
            if let Some(c) = &s.catching_up {
                return Some(c.clone());
            }
            (self.strict && !s.checked).then(|| {
                "this primary has not yet compared its metadata with the replicator's log since \
                 it started (in `replicated` durability a power loss may have taken acknowledged \
                 changes from it, which it then takes back from the replicator)"
                    .to_string()
            })
        })
    }

    fn refused(&self) -> Pin<Box<dyn Future<Output = Option<String>> + Send + '_>> {
        // the waits for the first comparison and for a catch-up are `unsettled`'s, which the
        // service asks first; a catch-up that began since is refused here
        Box::pin(async move { self.refused_now() })
    }

    fn reads_refused(&self) -> Option<String> {
        self.reads_refused_now()
    }
}

impl EpochFence {
    /// Why reads are refused now: fenced for longer than [`Self::fenced_reads`].
    pub fn reads_refused_now(&self) -> Option<String> {
        let s = self.shipped.borrow();
        let (why, at) = (s.fenced.as_ref()?, s.fenced_at?);
        (at.elapsed() > self.fenced_reads).then(|| {
            format!(
                "this primary was fenced {} s ago ({why}): its metadata is a history that no \
                 longer goes on; read at the new primary, or rejoin this one as its mirror",
                at.elapsed().as_secs()
            )
        })
    }

    /// Why mutations are refused now (fenced, catching up, the lease ran out), without
    /// waiting for anything.
    pub fn refused_now(&self) -> Option<String> {
        let s = self.shipped.borrow();
        s.fenced
            .clone()
            .or_else(|| s.catching_up.clone())
            .or_else(|| {
                let (lease, contact) = self.lease.as_ref()?;
                let silence = contact.silence();
                (silence > *lease).then(|| {
                    format!(
                        "lease expired: no word from the replicator for {} ms (lease_ms {}), so \
                         another primary may have been promoted",
                        silence.as_millis(),
                        lease.as_millis()
                    )
                })
            })
    }

    /// Why this primary may not delete anything on its own now (see
    /// [`strait_fs_core::meta::DeletionGate`]): what [`Self::refused_now`] refuses, and also
    /// before its first comparison with the replicator's log since it started (its history
    /// may have diverged: what died only in it may be live in the history that went on).
    pub fn deletions_refused(&self) -> Option<String> {
        if let Some(why) = self.refused_now() {
            return Some(format!("this primary takes no changes ({why})"));
        }
        (!self.shipped.borrow().checked).then(|| {
            "this primary has not yet compared its history with the replicator's since it \
             started"
                .to_string()
        })
    }
}

/// How long a call waits for this primary's state to settle (its first comparison with the
/// replicator's log, a catch-up) before it is answered UNAVAILABLE, which the client retries.
pub const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// `replicated` durability over the shipper: waits for [`Shipper::watch`] to reach a version,
/// at most `timeout`.
pub struct ShippedWait {
    pub shipped: watch::Receiver<Shipped>,
    pub timeout: Duration,
}

impl ReplicationWait for ShippedWait {
    fn wait(
        &self,
        version: Version,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        let mut rx = self.shipped.clone();
        Box::pin(async move { wait_committed(&mut rx, version, self.timeout).await })
    }
}

/// Wait until the replicator has committed `version`, at most `timeout`.
pub async fn wait_committed(
    rx: &mut watch::Receiver<Shipped>,
    version: Version,
    timeout: Duration,
) -> Result<(), String> {
    let res = tokio::time::timeout(
        timeout,
        rx.wait_for(|s| s.version >= version || s.stalled.is_some()),
    )
    .await;
    match res {
        Ok(Ok(s)) if s.version >= version => Ok(()),
        Ok(Ok(s)) => Err(format!(
            "committed locally as version {version}, but the replicator has not committed it: {}",
            s.stalled.as_deref().unwrap_or("shipping stopped")
        )),
        Ok(Err(_)) => Err(format!(
            "committed locally as version {version}; the shipper stopped before the replicator committed it"
        )),
        Err(_) => Err(format!(
            "committed locally as version {version}, but the replicator did not commit it within {timeout:?}"
        )),
    }
}
