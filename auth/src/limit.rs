//! [`LimitedBody`]: a request body that fails with RESOURCE_EXHAUSTED as soon as its gRPC
//! message header declares a message longer than the method accepts, or more bytes arrive than
//! that: the guard wraps every request in one, with the method's limit
//! (`strait_proto::limits::request_bytes_max`), so an oversize request is refused while it
//! arrives, before anything is decoded or buffered whole.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tonic::Status;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Bytes of a gRPC message's header: a compression flag and a 4-byte big-endian length.
const HEADER_BYTES: usize = 5;

/// A body of at most `limit` bytes of message (plus its header).
pub struct LimitedBody<B> {
    inner: B,
    limit: usize,
    /// Bytes seen so far.
    seen: usize,
    /// The first message's header, as far as it has arrived.
    header: [u8; HEADER_BYTES],
    method: String,
}

impl<B> LimitedBody<B> {
    pub fn new(inner: B, limit: usize, method: &str) -> Self {
        LimitedBody {
            inner,
            limit,
            seen: 0,
            header: [0; HEADER_BYTES],
            method: method.to_string(),
        }
    }

    fn too_big(&self, size: usize) -> BoxError {
        Box::new(Status::resource_exhausted(format!(
            "{}: a request of {size} bytes or more; this method accepts at most {}",
            self.method, self.limit
        )))
    }

    /// Count `data`; an error once the request is known to be too big.
    fn check(&mut self, data: &[u8]) -> Result<(), BoxError> {
        let before = self.seen;
        self.seen = self.seen.saturating_add(data.len());
        if before < HEADER_BYTES {
            let n = (HEADER_BYTES - before).min(data.len());
            self.header[before..before + n].copy_from_slice(&data[..n]);
            if self.seen >= HEADER_BYTES {
                let [_, a, b, c, d] = self.header;
                let declared = u32::from_be_bytes([a, b, c, d]) as usize;
                if declared > self.limit {
                    return Err(self.too_big(declared));
                }
            }
        }
        if self.seen > self.limit.saturating_add(HEADER_BYTES) {
            return Err(self.too_big(self.seen));
        }
        Ok(())
    }
}

impl<B> Body for LimitedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if let Err(e) = this.check(data) {
                        return Poll::Ready(Some(Err(e)));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    fn framed(len: usize, declared: u32) -> Bytes {
        let mut v = vec![0u8];
        v.extend_from_slice(&declared.to_be_bytes());
        v.extend(std::iter::repeat_n(7u8, len));
        v.into()
    }

    async fn read(b: Bytes, limit: usize) -> Result<Bytes, Status> {
        LimitedBody::new(Full::new(b), limit, "/t.S/M")
            .collect()
            .await
            .map(|c| c.to_bytes())
            .map_err(|e| match e.downcast::<Status>() {
                Ok(s) => *s,
                Err(e) => Status::unknown(e.to_string()),
            })
    }

    #[tokio::test]
    async fn a_request_within_its_limit_passes_and_one_past_it_is_refused() {
        assert_eq!(read(framed(100, 100), 100).await.unwrap().len(), 105);
        let e = read(framed(101, 101), 100).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("at most 100"), "{}", e.message());
        // a header that lies about the length: the bytes themselves are counted
        let e = read(framed(200, 10), 100).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        // a header that declares more than the limit is refused before the message arrives
        let e = read(framed(0, u32::MAX), 100).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        // a body shorter than a header passes (the decoder says what is wrong with it)
        assert_eq!(
            read(Bytes::from_static(&[0, 0]), 100).await.unwrap().len(),
            2
        );
    }
}
