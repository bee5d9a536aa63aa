//! gRPC calls with arbitrary bytes for a message, to any method: what a hostile client sends
//! that no generated client would (random bytes, truncated or oversize messages, methods that
//! do not exist).

use std::time::Duration;

use bytes::{Buf, BufMut};
use strait_auth::{Conn, Credentials};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Request, Status};

/// Sends and receives messages as raw bytes.
#[derive(Clone, Copy, Default)]
pub struct RawCodec;

pub struct RawEncoder;
pub struct RawDecoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

/// A channel to `addr` presenting `creds`, whose calls give up after 20 s.
pub fn channel(addr: &str, creds: &Credentials) -> Conn {
    let ep = creds
        .endpoint(addr)
        .expect("an address")
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(20));
    creds.connect_lazy(ep)
}

/// Call `path` (`/package.Service/Method`) with `body` as its message; a streaming method's
/// first message is the answer (Ok(None) when the stream ends without one).
pub async fn call(
    ch: Conn,
    path: &str,
    body: Vec<u8>,
    streaming: bool,
) -> Result<Option<Vec<u8>>, Status> {
    let mut g = tonic::client::Grpc::new(ch)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    g.ready()
        .await
        .map_err(|e| Status::unavailable(format!("not ready: {e}")))?;
    let p: http::uri::PathAndQuery = path
        .parse()
        .map_err(|e| Status::invalid_argument(format!("path {path:?}: {e}")))?;
    if streaming {
        let mut s = g
            .server_streaming(Request::new(body), p, RawCodec)
            .await?
            .into_inner();
        // the first message, or the stream's end or error, within 2 s
        match tokio::time::timeout(Duration::from_secs(2), s.message()).await {
            Ok(r) => r,
            Err(_) => Ok(None),
        }
    } else {
        g.unary(Request::new(body), p, RawCodec)
            .await
            .map(|r| Some(r.into_inner()))
    }
}

/// [`call`] with more metadata entries (a session, ...).
pub async fn call_with(
    ch: Conn,
    path: &str,
    body: Vec<u8>,
    streaming: bool,
    headers: &[(&str, String)],
) -> Result<Option<Vec<u8>>, Status> {
    let mut g = tonic::client::Grpc::new(ch)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    g.ready()
        .await
        .map_err(|e| Status::unavailable(format!("not ready: {e}")))?;
    let p: http::uri::PathAndQuery = path
        .parse()
        .map_err(|e| Status::invalid_argument(format!("path {path:?}: {e}")))?;
    let mut req = Request::new(body);
    for (k, v) in headers {
        let key = tonic::metadata::MetadataKey::from_bytes(k.as_bytes())
            .map_err(|e| Status::invalid_argument(format!("header {k}: {e}")))?;
        let value = v
            .parse()
            .map_err(|e| Status::invalid_argument(format!("header {k}: {e}")))?;
        req.metadata_mut().insert(key, value);
    }
    if streaming {
        let mut s = g.server_streaming(req, p, RawCodec).await?.into_inner();
        match tokio::time::timeout(Duration::from_secs(2), s.message()).await {
            Ok(r) => r,
            Err(_) => Ok(None),
        }
    } else {
        g.unary(req, p, RawCodec)
            .await
            .map(|r| Some(r.into_inner()))
    }
}

/// A unary call whose request body is exactly `body`: gRPC frames as a hostile client writes
/// them (a compression flag it never negotiated, a length the bytes do not have). The answer's
/// status comes from its headers or trailers.
pub async fn call_framed(
    mut ch: Conn,
    path: &str,
    body: Vec<u8>,
    headers: &[(&str, String)],
) -> Result<Option<Vec<u8>>, Status> {
    use http_body_util::BodyExt;
    use tower::{Service, ServiceExt};
    let mut req = http::Request::builder()
        .method("POST")
        .uri(format!("http://strait{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let req = req
        .body(tonic::body::Body::new(http_body_util::Full::new(
            bytes::Bytes::from(body),
        )))
        .map_err(|e| Status::invalid_argument(format!("request: {e}")))?;
    let svc = ch
        .ready()
        .await
        .map_err(|e| Status::unavailable(format!("not ready: {e}")))?;
    let resp = svc
        .call(req)
        .await
        .map_err(|e| Status::unavailable(format!("transport: {e}")))?;
    if let Some(s) = Status::from_header_map(resp.headers()) {
        if s.code() != tonic::Code::Ok {
            return Err(s);
        }
    }
    let got = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| Status::unavailable(format!("read the answer: {e}")))?;
    let trailers = got.trailers().cloned();
    let data = got.to_bytes();
    match trailers.and_then(|t| Status::from_header_map(&t)) {
        Some(s) if s.code() != tonic::Code::Ok => Err(s),
        _ => Ok(Some(data.to_vec())),
    }
}
