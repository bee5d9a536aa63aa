//! [`Slots`]: a bound on how many of something (sessions at a site daemon, subscriptions at a
//! replicator node) are held at once, in all and by one peer address, so that no caller, with
//! or without good credentials, can make a daemon hold more than its share.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tonic::Status;

struct Counts {
    total: usize,
    by_peer: HashMap<Option<IpAddr>, usize>,
}

struct Inner {
    what: &'static str,
    total_max: usize,
    per_peer_max: usize,
    counts: Mutex<Counts>,
}

/// The bound; cheap to clone.
#[derive(Clone)]
pub struct Slots(Arc<Inner>);

/// One slot, given back when dropped.
pub struct Slot {
    slots: Slots,
    peer: Option<IpAddr>,
}

impl Slots {
    /// At most `total_max` of `what` (`sessions`, `subscriptions`) at once, and
    /// `per_peer_max` from one peer address.
    pub fn new(what: &'static str, total_max: usize, per_peer_max: usize) -> Self {
        Slots(Arc::new(Inner {
            what,
            total_max,
            per_peer_max,
            counts: Mutex::new(Counts {
                total: 0,
                by_peer: HashMap::new(),
            }),
        }))
    }

    /// A slot for `peer` (None: the peer's address is unknown, counted as one peer), or
    /// RESOURCE_EXHAUSTED saying which bound was reached.
    pub fn take(&self, peer: Option<IpAddr>) -> Result<Slot, Status> {
        let i = &self.0;
        let mut c = i.counts.lock();
        if c.total >= i.total_max {
            return Err(Status::resource_exhausted(format!(
                "this daemon holds {} {} already, its most",
                c.total, i.what
            )));
        }
        let mine = c.by_peer.entry(peer).or_insert(0);
        if *mine >= i.per_peer_max {
            return Err(Status::resource_exhausted(format!(
                "{} holds {} {} here already, the most one address may",
                peer.map(|p| p.to_string())
                    .unwrap_or_else(|| "an unknown peer".into()),
                *mine,
                i.what
            )));
        }
        *mine += 1;
        c.total += 1;
        Ok(Slot {
            slots: self.clone(),
            peer,
        })
    }

    /// Slots held now, in all.
    pub fn held(&self) -> usize {
        self.0.counts.lock().total
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.slots.0.counts.lock();
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.by_peer.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.by_peer.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounded_in_all_and_per_peer_and_given_back() {
        let s = Slots::new("sessions", 3, 2);
        let a: Option<IpAddr> = Some("10.0.0.1".parse().unwrap());
        let b: Option<IpAddr> = Some("10.0.0.2".parse().unwrap());
        let a1 = s.take(a).unwrap();
        let _a2 = s.take(a).unwrap();
        let e = s.take(a).err().unwrap();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("10.0.0.1"), "{}", e.message());
        let _b1 = s.take(b).unwrap();
        let e = s.take(None).err().unwrap();
        assert!(e.message().contains("its most"), "{}", e.message());
        drop(a1);
        assert_eq!(s.held(), 2);
        assert!(s.take(a).is_ok());
    }
}
