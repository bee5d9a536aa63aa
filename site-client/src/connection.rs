//! Each calling thread's runtime and connection to the daemon, and the metadata every call
//! carries (token, session, trace context).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use strait_fs_core::error::{Error, Result};
use strait_proto::meta::meta_service_client::MetaServiceClient;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::remote_meta::RemoteMeta;
use crate::stamp::Stamp;

pub(crate) type Client = MetaServiceClient<InterceptedService<Channel, Stamp>>;
/// A thread's runtime and connection for one client.
pub(crate) type Connection = (std::rc::Rc<tokio::runtime::Runtime>, Channel);

thread_local! {
    /// Each calling thread (a FUSE worker) has its own single-threaded runtime and HTTP/2
    /// connection per client: a call then runs start to finish on the caller's thread, with
    /// no hand-off to runtime workers (each hand-off is a thread wake-up, which on a small
    /// machine costs more than the call itself).
    static CONNECTIONS: std::cell::RefCell<HashMap<u64, Connection>> =
        std::cell::RefCell::new(HashMap::new());
}

impl RemoteMeta {
    /// This thread's runtime and connection to the daemon (made on first use).
    pub(crate) fn connection(&self) -> Result<Connection> {
        CONNECTIONS.with(|c| {
            let mut c = c.borrow_mut();
            if let Some((rt, channel)) = c.get(&self.id) {
                return Ok((rt.clone(), channel.clone()));
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::io("start the RPC runtime", e))?;
            // the channel's background tasks run on this runtime, driven by block_on
            let channel = {
                let _guard = rt.enter();
                self.endpoint.connect_lazy()
            };
            let rt = std::rc::Rc::new(rt);
            c.insert(self.id, (rt.clone(), channel.clone()));
            Ok((rt, channel))
        })
    }

    /// A client on `channel` whose calls carry `request_id` (a mutation's, kept across its
    /// retries) or none, and `retry`, the attempt's number when the call is sent again.
    pub(crate) fn client(
        &self,
        channel: Channel,
        request_id: Option<AsciiMetadataValue>,
        retry: Option<u32>,
    ) -> Client {
        let stamp = Stamp {
            request_id,
            retry: retry.and_then(|n| n.to_string().parse().ok()),
            ..self.stamp.clone()
        };
        MetaServiceClient::with_interceptor(channel, stamp)
            .max_decoding_message_size(strait_proto::limits::META_MESSAGE_BYTES_MAX)
    }

    /// A new request id: this client's random prefix and a sequence number.
    pub(crate) fn next_request_id(&self) -> Result<AsciiMetadataValue> {
        let n = self.requests.fetch_add(1, Ordering::Relaxed);
        let id = format!("{:016x}-{n:x}", self.nonce);
        id.parse()
            .map_err(|_| Error::Meta(format!("request id {id} is not a header value")))
    }
}
