//! The object store: where immutable data blocks live.
//!
//! # To ensure correctness
//! - `put` of a key replaces the whole object atomically: a concurrent or later `get` sees
//!   either nothing or the complete object, never a part of it (local files are written to a
//!   temporary name and renamed).
//! - `delete` of a missing key succeeds (deletion is idempotent).
//! - `get` of a missing key fails with [`ObjectError::NotFound`].
//! - Integrity (CRC32) is checked above this trait, by the block layer, which knows the CRCs.

pub mod conformance;
pub mod local;
pub mod memory;
#[cfg(feature = "s3")]
pub mod s3;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use bytes::Bytes;

/// Whether retrying an object store call can help.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ObjectError {
    #[error("object {0} not found")]
    NotFound(String),
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("cancelled")]
    Cancelled,
    /// A transient failure (connection reset, 5xx, throttling): retrying may help.
    #[error("transient: {0}")]
    Transient(String),
    /// A failure retrying will not fix (access denied, bad configuration, disk full).
    #[error("{0}")]
    Fatal(String),
}

impl ObjectError {
    pub fn is_permanent(&self) -> bool {
        matches!(self, ObjectError::NotFound(_) | ObjectError::Fatal(_))
    }
}

pub type ObjResult<T> = Result<T, ObjectError>;
pub type BoxFut<'a, T> = Pin<Box<dyn Future<Output = ObjResult<T>> + Send + 'a>>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
}

/// Maximum keys one `list` call returns.
pub const LIST_LIMIT_MAX: usize = 1000;

pub trait ObjectStore: Send + Sync + 'static {
    /// A human description for status output, e.g. `file:///data` or `s3://bucket`.
    fn describe(&self) -> String;
    fn put<'a>(&'a self, key: &'a str, data: Bytes) -> BoxFut<'a, ()>;
    fn get<'a>(&'a self, key: &'a str) -> BoxFut<'a, Bytes>;
    /// Size of the object, or None if it does not exist.
    fn head<'a>(&'a self, key: &'a str) -> BoxFut<'a, Option<u64>>;
    fn delete<'a>(&'a self, key: &'a str) -> BoxFut<'a, ()>;
    /// Keys starting with `prefix`, strictly after `start_after`, in byte order,
    /// at most `limit` (≤ [`LIST_LIMIT_MAX`]).
    /// Make every completed `put` durable across a crash of the machine (a no-op for stores
    /// whose puts are durable when they return, such as S3).
    fn sync(&self) -> BoxFut<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    fn list<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
    ) -> BoxFut<'a, Vec<ObjectInfo>>;
}

pub type DynStore = Arc<dyn ObjectStore>;

/// Call an object store operation until it succeeds, fails for good, or fails transiently
/// `attempts` times; the waits double from 50 ms up to 2 s, and each retry is logged.
pub async fn retry<T, F, Fut>(what: &str, attempts: u32, mut f: F) -> ObjResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ObjResult<T>>,
{
    let mut delay = std::time::Duration::from_millis(50);
    let mut attempt = 0;
    loop {
        attempt += 1;
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if !e.is_permanent() && attempt < attempts => {
                tracing::warn!("{what}: {e} (attempt {attempt} of {attempts})");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(2));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Open an object store from its URL (`file:///dir`, `s3://bucket?endpoint=..&region=..`, `memory://`).
pub async fn open(url: &str) -> crate::Result<DynStore> {
    match crate::url::DataUrl::parse(url)? {
        crate::url::DataUrl::File(path) => Ok(Arc::new(local::LocalStore::open(&path)?)),
        crate::url::DataUrl::Memory => Ok(Arc::new(memory::MemoryStore::default())),
        #[cfg(feature = "s3")]
        crate::url::DataUrl::S3 {
            bucket,
            prefix,
            endpoint,
            region,
        } => Ok(Arc::new(
            s3::S3Store::open(&bucket, &prefix, endpoint.as_deref(), region.as_deref()).await?,
        )),
        #[allow(unreachable_patterns)]
        other => Err(crate::Error::Invalid(format!(
            "object store {other:?} is not built into this binary"
        ))),
    }
}
