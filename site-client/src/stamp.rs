//! What every call a client makes carries: the token, the session id, the trace context, a
//! mutation's request id and attempt ([`Stamp`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tonic::metadata::AsciiMetadataValue;
use tonic::{Request, Status};

/// Adds the token, the session id and the trace context to every call, and a mutation's
/// request id ([`strait_proto::REQUEST_ID_HEADER`]).
#[derive(Clone)]
pub(crate) struct Stamp {
    /// `Bearer <token>`; None when the client certificate alone proves the mount's role.
    pub(crate) auth: Option<AsciiMetadataValue>,
    pub(crate) session: Arc<AtomicU64>,
    pub(crate) request_id: Option<AsciiMetadataValue>,
    /// On a change sent again after an attempt failed on the way: the attempt's number
    /// ([`strait_proto::RETRY_HEADER`]).
    pub(crate) retry: Option<AsciiMetadataValue>,
}

impl tonic::service::Interceptor for Stamp {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        let md = req.metadata_mut();
        if let Some(a) = &self.auth {
            md.insert("authorization", a.clone());
        }
        let sid = self.session.load(Ordering::Relaxed);
        if sid != 0 {
            if let Ok(v) = sid.to_string().parse() {
                md.insert(strait_proto::SESSION_HEADER, v);
            }
        }
        if let Some(id) = &self.request_id {
            md.insert(strait_proto::REQUEST_ID_HEADER, id.clone());
        }
        if let Some(n) = &self.retry {
            md.insert(strait_proto::RETRY_HEADER, n.clone());
        }
        strait_auth::trace::inject(md.as_mut());
        Ok(req)
    }
}

/// Each client's number: its connections are kept per thread under it.
pub(crate) static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);
