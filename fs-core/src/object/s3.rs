//! Object store on an S3 bucket (AWS, Garage, MinIO, ...), optionally under a key prefix.
//!
//! Requests use path-style addressing (`http://endpoint/bucket/key`), which every
//! S3-compatible server accepts. Credentials come from the usual AWS chain (environment
//! variables, `~/.aws` files, instance metadata) unless given in [`S3Config`]. Every request
//! is bounded by connect and operation timeouts and retried a bounded number of times by
//! the SDK; errors tell whether retrying more can help.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use aws_config::environment::EnvironmentVariableRegionProvider;
use aws_config::meta::region::RegionProviderChain;
use aws_config::profile::region::ProfileFileRegionProvider;
use aws_config::BehaviorVersion;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{Credentials, Region};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::Client;
use bytes::Bytes;

use super::{BoxFut, ObjectError, ObjectInfo, ObjectStore, PutIfAbsent, LIST_LIMIT_MAX};

/// Region used when none is given, in the URL nor in the AWS environment or profile.
pub const DEFAULT_REGION: &str = "us-east-1";
/// Time to establish a TCP (and TLS) connection.
const CONNECT_TIMEOUT_MS: u64 = 5_000;
/// One attempt of a request, until the response headers arrive. A 4 MiB block must be
/// sent within it, so it also sets the slowest usable uplink (about 140 KiB/s).
const ATTEMPT_TIMEOUT_MS: u64 = 30_000;
/// All attempts of a request together, backoff included.
const OPERATION_TIMEOUT_MS: u64 = 75_000;
/// Reading the body of a `get` after its headers arrived. The SDK's stalled-stream
/// protection also cuts a body that stops flowing.
const BODY_READ_TIMEOUT_MS: u64 = 30_000;
/// Attempts per request, the first included (the SDK's standard retry mode with backoff).
const ATTEMPTS_MAX: u32 = 3;

/// Where and how to reach a bucket.
#[derive(Clone, Default)]
pub struct S3Config {
    pub bucket: String,
    /// Prepended to every key as `prefix/` when non-empty.
    pub prefix: String,
    /// e.g. `http://127.0.0.1:3900`; None for AWS itself.
    pub endpoint: Option<String>,
    /// None: `AWS_REGION` / `AWS_DEFAULT_REGION`, then the AWS profile, then [`DEFAULT_REGION`].
    pub region: Option<String>,
    /// None: the usual AWS credential chain (`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`,
    /// `~/.aws/credentials`, instance metadata, ...).
    pub credentials: Option<StaticCredentials>,
    /// A CA certificate (PEM) an `https` endpoint's certificate chains to, in place of the
    /// system's roots (a server with a certificate of one's own CA).
    pub ca: Option<std::path::PathBuf>,
}

#[derive(Clone)]
pub struct StaticCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

impl fmt::Debug for S3Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Config")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("credentials", &self.credentials)
            .field("ca", &self.ca)
            .finish()
    }
}

/// An HTTPS client that trusts the CA certificate in `ca` (PEM) alone.
fn https_client_trusting(
    ca: &std::path::Path,
) -> crate::Result<aws_sdk_s3::config::SharedHttpClient> {
    use aws_smithy_http_client::tls;
    let pem = std::fs::read(ca).map_err(|e| {
        crate::Error::Invalid(format!("read the S3 endpoint's CA {}: {e}", ca.display()))
    })?;
    let context = tls::TlsContext::builder()
        .with_trust_store(tls::TrustStore::empty().with_pem_certificate(pem))
        .build()
        .map_err(|e| crate::Error::Invalid(format!("the CA {}: {e}", ca.display())))?;
    Ok(aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::AwsLc,
        ))
        .tls_context(context)
        .build_https())
}

pub struct S3Store {
    client: Client,
    bucket: String,
    /// Empty, or the configured prefix followed by '/'.
    key_prefix: String,
    /// `s3://bucket` or `s3://bucket/prefix`.
    url: String,
}

impl S3Store {
    /// Open a bucket with credentials from the usual AWS environment variables and files.
    pub async fn open(
        bucket: &str,
        prefix: &str,
        endpoint: Option<&str>,
        region: Option<&str>,
    ) -> crate::Result<Self> {
        Self::open_with(S3Config {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            endpoint: endpoint.map(str::to_string),
            region: region.map(str::to_string),
            credentials: None,
            ca: None,
        })
        .await
    }

    /// Open a bucket and check it can be reached with the credentials (a `HeadBucket`).
    pub async fn open_with(config: S3Config) -> crate::Result<Self> {
        if config.bucket.is_empty() {
            return Err(crate::Error::Invalid(
                "open S3 store: no bucket name".into(),
            ));
        }
        let region = RegionProviderChain::first_try(config.region.clone().map(Region::new))
            .or_else(EnvironmentVariableRegionProvider::new())
            .or_else(ProfileFileRegionProvider::new())
            .or_else(Region::from_static(DEFAULT_REGION));
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
            .operation_attempt_timeout(Duration::from_millis(ATTEMPT_TIMEOUT_MS))
            .operation_timeout(Duration::from_millis(OPERATION_TIMEOUT_MS))
            .build();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(region)
            .timeout_config(timeouts)
            .retry_config(RetryConfig::standard().with_max_attempts(ATTEMPTS_MAX));
        if let Some(ca) = &config.ca {
            loader = loader.http_client(https_client_trusting(ca)?);
        }
        if let Some(c) = &config.credentials {
            loader = loader.credentials_provider(Credentials::new(
                &c.access_key_id,
                &c.secret_access_key,
                None,
                None,
                "strait-static",
            ));
        }
        let sdk = loader.load().await;
        // Every block carries its own CRC32, checked by every reader: the SDK's own checksums
        // (a CRC32 computed on each upload and checked on each download) would only repeat
        // that work on every block.
        let mut builder = aws_sdk_s3::config::Builder::from(&sdk)
            .force_path_style(true)
            .request_checksum_calculation(
                aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired,
            )
            .response_checksum_validation(
                aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired,
            );
        if let Some(endpoint) = &config.endpoint {
            builder = builder.endpoint_url(endpoint);
        }
        let client = Client::from_conf(builder.build());

        let prefix = config.prefix.trim_matches('/');
        let (key_prefix, url) = if prefix.is_empty() {
            (String::new(), format!("s3://{}", config.bucket))
        } else {
            (
                format!("{prefix}/"),
                format!("s3://{}/{prefix}", config.bucket),
            )
        };
        let store = S3Store {
            client,
            bucket: config.bucket.clone(),
            key_prefix,
            url,
        };

        let region = sdk.region().map(|r| r.to_string()).unwrap_or_default();
        let endpoint = config.endpoint.as_deref().unwrap_or("AWS");
        let context = format!(
            "reach bucket {} at {endpoint} (region {region})",
            config.bucket
        );
        if let Err(e) = store
            .client
            .head_bucket()
            .bucket(&store.bucket)
            .send()
            .await
        {
            let status = e.raw_response().map(|r| r.status().as_u16());
            let hint = match status {
                Some(403) => {
                    ": access denied; check the access key and secret (AWS_ACCESS_KEY_ID, \
                     AWS_SECRET_ACCESS_KEY) and that the key may use the bucket"
                }
                Some(404) => ": the bucket does not exist",
                Some(301 | 400) => ": is the region right? Set it with ?region= in the data URL",
                _ => "",
            };
            let err = map_sdk_error(e, &context, None);
            let err = match err {
                // A missing bucket is a configuration error, not a missing object.
                ObjectError::NotFound(_) => ObjectError::Fatal(format!("{context}{hint}")),
                ObjectError::Fatal(m) => ObjectError::Fatal(format!("{m}{hint}")),
                other => other,
            };
            return Err(crate::Error::Object(err));
        }
        Ok(store)
    }

    fn full_key(&self, key: &str) -> String {
        format!("{}{key}", self.key_prefix)
    }
}

impl ObjectStore for S3Store {
    fn describe(&self) -> String {
        self.url.clone()
    }

    fn put<'a>(&'a self, key: &'a str, data: Bytes) -> BoxFut<'a, ()> {
        Box::pin(async move {
            self.client
                .put_object()
                .bucket(&self.bucket)
                .key(self.full_key(key))
                .body(ByteStream::from(data))
                .customize()
                .disable_payload_signing()
                .send()
                .await
                .map_err(|e| {
                    map_sdk_error(e, &format!("put object {key} to {}", self.url), None)
                })?;
            Ok(())
        })
    }

    /// A `head`, then a put with `If-None-Match: *`: a server that honours it (AWS S3,
    /// MinIO) refuses the put when the object appeared meanwhile (412), which is then
    /// `Exists`. Garage 2.5 ignores the header on PutObject (its `put.rs` reads no
    /// precondition), so there the `head` is the whole guard and a put racing with it can
    /// still be replaced.
    fn put_if_absent<'a>(&'a self, key: &'a str, data: Bytes) -> BoxFut<'a, PutIfAbsent> {
        Box::pin(async move {
            if self.head(key).await?.is_some() {
                return Ok(PutIfAbsent::Exists);
            }
            let context = format!("put new object {key} to {}", self.url);
            match self
                .client
                .put_object()
                .bucket(&self.bucket)
                .key(self.full_key(key))
                .if_none_match("*")
                .body(ByteStream::from(data))
                .customize()
                .disable_payload_signing()
                .send()
                .await
            {
                Ok(_) => Ok(PutIfAbsent::Created),
                Err(e) if e.raw_response().map(|r| r.status().as_u16()) == Some(412) => {
                    Ok(PutIfAbsent::Exists)
                }
                Err(e) => Err(map_sdk_error(e, &context, None)),
            }
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFut<'a, Bytes> {
        Box::pin(async move {
            let context = format!("get object {key} from {}", self.url);
            let out = self
                .client
                .get_object()
                .bucket(&self.bucket)
                .key(self.full_key(key))
                .send()
                .await
                .map_err(|e| map_sdk_error(e, &context, Some(key)))?;
            let body = tokio::time::timeout(
                Duration::from_millis(BODY_READ_TIMEOUT_MS),
                out.body.collect(),
            )
            .await
            .map_err(|_| {
                ObjectError::Timeout(format!(
                    "{context}: body not read within {BODY_READ_TIMEOUT_MS} ms"
                ))
            })?
            .map_err(|e| {
                ObjectError::Transient(format!("{context}: read body: {}", DisplayErrorContext(&e)))
            })?;
            Ok(body.into_bytes())
        })
    }

    fn head<'a>(&'a self, key: &'a str) -> BoxFut<'a, Option<u64>> {
        Box::pin(async move {
            let context = format!("head object {key} in {}", self.url);
            match self
                .client
                .head_object()
                .bucket(&self.bucket)
                .key(self.full_key(key))
                .send()
                .await
            {
                Ok(out) => {
                    let len = out.content_length().unwrap_or(0);
                    let len = u64::try_from(len).map_err(|_| {
                        ObjectError::Fatal(format!("{context}: negative content length {len}"))
                    })?;
                    Ok(Some(len))
                }
                Err(e) => match map_sdk_error(e, &context, Some(key)) {
                    ObjectError::NotFound(_) => Ok(None),
                    other => Err(other),
                },
            }
        })
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let context = format!("delete object {key} from {}", self.url);
            match self
                .client
                .delete_object()
                .bucket(&self.bucket)
                .key(self.full_key(key))
                .send()
                .await
            {
                Ok(_) => Ok(()),
                Err(e) => match map_sdk_error(e, &context, Some(key)) {
                    // S3 answers 204 for a missing key; some servers say 404.
                    ObjectError::NotFound(_) => Ok(()),
                    other => Err(other),
                },
            }
        })
    }

    fn list<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
    ) -> BoxFut<'a, Vec<ObjectInfo>> {
        Box::pin(async move {
            let limit = limit.min(LIST_LIMIT_MAX);
            if limit == 0 {
                return Ok(Vec::new());
            }
            let context = format!("list objects with prefix {prefix:?} in {}", self.url);
            let full_prefix = self.full_key(prefix);
            // Keys under the store's prefix sort in the same order with or without it.
            // A start-after sorting before the prefix is dropped: every key under the
            // prefix is after it anyway, and Garage 2.5 answers such a listing with nothing
            // (it scans from start-after and stops at the first key outside the prefix).
            let start_after = start_after
                .map(|after| self.full_key(after))
                .filter(|after| *after >= full_prefix);
            let req = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(full_prefix)
                .set_start_after(start_after)
                .max_keys(i32::try_from(limit).unwrap_or(i32::MAX));
            let out = req
                .send()
                .await
                .map_err(|e| map_sdk_error(e, &context, None))?;
            let mut objects = Vec::with_capacity(out.contents().len());
            for o in out.contents() {
                let full = o
                    .key()
                    .ok_or_else(|| ObjectError::Fatal(format!("{context}: an entry has no key")))?;
                let key = full.strip_prefix(&self.key_prefix).ok_or_else(|| {
                    ObjectError::Fatal(format!(
                        "{context}: server returned key {full:?} outside the prefix"
                    ))
                })?;
                let size = u64::try_from(o.size().unwrap_or(0)).map_err(|_| {
                    ObjectError::Fatal(format!("{context}: negative size for {full:?}"))
                })?;
                let modified = o
                    .last_modified()
                    .and_then(|t| std::time::SystemTime::try_from(*t).ok());
                objects.push(ObjectInfo {
                    key: key.to_string(),
                    size,
                    modified,
                });
            }
            objects.truncate(limit);
            Ok(objects)
        })
    }
}

/// What retrying can do about an S3 failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    NotFound,
    Timeout,
    Transient,
    Fatal,
}

/// Classify by error code first (S3 sends one in the body of most errors), then HTTP status
/// (HEAD responses have no body).
fn classify_response(status: u16, code: Option<&str>) -> Class {
    match code {
        Some("NoSuchKey" | "NotFound") => return Class::NotFound,
        // The bucket itself is missing: a configuration error, not a missing object.
        Some("NoSuchBucket") => return Class::Fatal,
        Some("RequestTimeout") => return Class::Timeout,
        Some(
            "SlowDown"
            | "Throttling"
            | "ThrottlingException"
            | "TooManyRequestsException"
            | "RequestThrottled"
            | "ServiceUnavailable"
            | "InternalError"
            // a conditional put that raced with another write: AWS asks to try again
            | "ConditionalRequestConflict",
        ) => return Class::Transient,
        _ => {}
    }
    match status {
        404 => Class::NotFound,
        408 => Class::Timeout,
        429 | 500..=599 => Class::Transient,
        _ => Class::Fatal,
    }
}

fn classify<E>(err: &SdkError<E, HttpResponse>) -> Class
where
    E: ProvideErrorMetadata,
{
    match err {
        SdkError::TimeoutError(_) => Class::Timeout,
        SdkError::DispatchFailure(d) if d.is_timeout() => Class::Timeout,
        // The request could not be sent as configured (bad endpoint URL, TLS setup, ...).
        SdkError::DispatchFailure(d) if d.is_user() => Class::Fatal,
        SdkError::DispatchFailure(_) => Class::Transient,
        // Includes missing credentials: nothing a retry would fix.
        SdkError::ConstructionFailure(_) => Class::Fatal,
        SdkError::ServiceError(s) => classify_response(s.raw().status().as_u16(), s.err().code()),
        // A response that could not be read or parsed, e.g. cut off.
        _ => Class::Transient,
    }
}

/// Turn an SDK error into an [`ObjectError`] whose message starts with `context`.
/// `key` names the object for `NotFound`; without one a 404 is `Fatal`.
fn map_sdk_error<E>(err: SdkError<E, HttpResponse>, context: &str, key: Option<&str>) -> ObjectError
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
{
    let class = classify(&err);
    let detail = match &err {
        SdkError::ServiceError(s) => {
            let mut d = format!("HTTP {}", s.raw().status().as_u16());
            if let Some(code) = s.err().code() {
                d.push_str(&format!(" {code}"));
            }
            if let Some(message) = s.err().message() {
                d.push_str(&format!(": {message}"));
            }
            d
        }
        _ => DisplayErrorContext(&err).to_string(),
    };
    let msg = format!("{context}: {detail}");
    match class {
        Class::NotFound => match key {
            Some(key) => ObjectError::NotFound(key.to_string()),
            None => ObjectError::Fatal(msg),
        },
        Class::Timeout => ObjectError::Timeout(msg),
        Class::Transient => ObjectError::Transient(msg),
        Class::Fatal => ObjectError::Fatal(msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_classified_by_code_then_status() {
        assert_eq!(classify_response(404, Some("NoSuchKey")), Class::NotFound);
        assert_eq!(classify_response(404, None), Class::NotFound);
        assert_eq!(classify_response(404, Some("NoSuchBucket")), Class::Fatal);
        assert_eq!(classify_response(403, Some("AccessDenied")), Class::Fatal);
        assert_eq!(classify_response(403, None), Class::Fatal);
        assert_eq!(
            classify_response(400, Some("RequestTimeout")),
            Class::Timeout
        );
        assert_eq!(classify_response(503, Some("SlowDown")), Class::Transient);
        assert_eq!(classify_response(429, None), Class::Transient);
        assert_eq!(
            classify_response(409, Some("ConditionalRequestConflict")),
            Class::Transient
        );
        assert_eq!(classify_response(500, None), Class::Transient);
        assert_eq!(
            classify_response(400, Some("InvalidArgument")),
            Class::Fatal
        );
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_fails_open_quickly_and_clearly() {
        // Nothing listens on a port we just released.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let started = std::time::Instant::now();
        let err = S3Store::open_with(S3Config {
            bucket: "b".into(),
            endpoint: Some(format!("http://127.0.0.1:{port}")),
            region: Some("garage".into()),
            credentials: Some(StaticCredentials {
                access_key_id: "GK000000000000000000000000".into(),
                secret_access_key: "0".repeat(64),
            }),
            ..Default::default()
        })
        .await
        .err()
        .expect("open must fail");
        let msg = err.to_string();
        assert!(
            matches!(err, crate::Error::Object(ObjectError::Transient(_))),
            "{err:?}"
        );
        assert!(
            msg.contains(&format!("reach bucket b at http://127.0.0.1:{port}")),
            "{msg}"
        );
        assert!(
            started.elapsed() < Duration::from_millis(OPERATION_TIMEOUT_MS),
            "took {:?}",
            started.elapsed()
        );
    }
}
