//! The token check of every call to a site daemon.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use subtle::ConstantTimeEq;
use tonic::{Request, Status};

use super::REFUSED_PEERS_MAX;
use crate::metrics::Metrics;

/// Checks the token of every call; refusals are logged once per peer address.
#[derive(Clone)]
pub struct Auth {
    expected: Arc<Vec<u8>>,
    refused: Arc<Mutex<HashSet<Option<IpAddr>>>>,
    metrics: Arc<Metrics>,
}

impl Auth {
    pub fn new(token: &str, metrics: Arc<Metrics>) -> Self {
        Auth {
            expected: Arc::new(format!("Bearer {token}").into_bytes()),
            refused: Arc::new(Mutex::new(HashSet::new())),
            metrics,
        }
    }
}

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let given = req.metadata().get("authorization").map(|v| v.as_bytes());
        // equal without leaking where the two first differ (only whether the lengths do)
        let ok = given.is_some_and(|g| bool::from(g.ct_eq(&self.expected)));
        if ok {
            return Ok(req);
        }
        self.metrics.unauthenticated.inc();
        let peer = req.remote_addr();
        let why = if given.is_none() {
            "no token"
        } else {
            "a wrong token"
        };
        let mut refused = self.refused.lock();
        if refused.len() < REFUSED_PEERS_MAX && refused.insert(peer.map(|p| p.ip())) {
            tracing::warn!(
                "refused a call from {} with {why} (logged once per address)",
                peer.map(|p| p.to_string())
                    .unwrap_or_else(|| "an unknown peer".into())
            );
        }
        Err(Status::unauthenticated(format!(
            "this site daemon requires a valid token; the call carried {why}"
        )))
    }
}
