//! Blocks fetched from a mirror's FetchBlock, for the reads its region's store cannot serve.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use strait_proto::limits::BLOCK_MESSAGE_BYTES_MAX;
use strait_proto::meta as w;
use strait_proto::meta::meta_service_client::MetaServiceClient;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use crate::call::{classify, describe, Failure};
use crate::remote_meta::RemoteMeta;

/// Attempts of one FetchBlock that fails for want of a connection.
const FETCH_ATTEMPTS_MAX: u32 = 4;
/// Waits between those attempts: 100 ms, doubling.
const FETCH_BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(100))
    .with_factor(2.0)
    .without_max_delay()
    .with_max_times(FETCH_ATTEMPTS_MAX as usize - 1);

/// [`strait_fs_core::vfs::BlockFallback`] over a mirror's FetchBlock.
struct BlockFetcher {
    /// The session's flag: the daemon serves FetchBlock.
    offered: Arc<AtomicBool>,
    endpoint: Endpoint,
    auth: Option<AsciiMetadataValue>,
    channel: tokio::sync::OnceCell<Channel>,
}

impl BlockFetcher {
    async fn once(
        &self,
        req: &w::FetchBlockRequest,
    ) -> std::result::Result<strait_fs_core::object::Bytes, Status> {
        let ch = self
            .channel
            .get_or_init(|| async { self.endpoint.connect_lazy() })
            .await
            .clone();
        let mut c = MetaServiceClient::new(ch)
            .max_decoding_message_size(BLOCK_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(BLOCK_MESSAGE_BYTES_MAX);
        let mut r = Request::new(req.clone());
        if let Some(a) = &self.auth {
            r.metadata_mut().insert("authorization", a.clone());
        }
        Ok(c.fetch_block(r).await?.into_inner().data)
    }
}

impl strait_fs_core::vfs::BlockFallback for BlockFetcher {
    fn offered(&self) -> bool {
        self.offered.load(Ordering::Relaxed)
    }

    fn fetch<'a>(
        &'a self,
        key: &'a str,
        len: u32,
        crc: u32,
        reason: &'a str,
    ) -> strait_fs_core::object::BoxFut<'a, strait_fs_core::object::Bytes> {
        use strait_fs_core::object::ObjectError;
        Box::pin(async move {
            let req = w::FetchBlockRequest {
                key: key.to_string(),
                len,
                crc,
                reason: reason.to_string(),
            };
            let again = |s: &Status| classify(s) == Failure::Transport;
            let mut attempt = 0;
            let r = (|| self.once(&req))
                .retry(FETCH_BACKOFF)
                .when(again)
                .notify(|s, _| {
                    attempt += 1;
                    tracing::warn!(
                        "fetch block {key} from the mirror: {} (attempt {attempt} of {FETCH_ATTEMPTS_MAX})",
                        describe(s)
                    );
                })
                .await;
            match r {
                Ok(data) => Ok(data),
                Err(s) if s.code() == Code::NotFound => {
                    Err(ObjectError::NotFound(format!("{key}: {}", s.message())))
                }
                Err(s) => {
                    let msg = format!("fetch block {key} from the mirror: {}", describe(&s));
                    Err(if again(&s) {
                        ObjectError::Transient(msg)
                    } else {
                        ObjectError::Fatal(msg)
                    })
                }
            }
        })
    }
}

impl RemoteMeta {
    /// Where the VFS gets blocks its region's store lacks, offered while the daemon is a
    /// mirror (its OpenSession answer says so, at the open and at each resume: a primary
    /// replaced by a mirror at a switchover offers it from then on). It has its own
    /// connection, made on the caller's runtime, so block transfers neither wait for nor
    /// hold up metadata calls.
    pub fn block_fallback(&self) -> Arc<dyn strait_fs_core::vfs::BlockFallback> {
        Arc::new(BlockFetcher {
            offered: self.block_fallback.clone(),
            endpoint: self.endpoint.clone(),
            auth: self.stamp.auth.clone(),
            channel: tokio::sync::OnceCell::new(),
        })
    }
}
