//! The object store: where immutable data blocks live.
//!
//! # To ensure correctness
//! - `put` of a key replaces the whole object atomically: a concurrent or later `get` sees
//!   either nothing or the complete object, never a part of it (local files are written to a
//!   temporary name and renamed).
//! - `delete` of a missing key succeeds (deletion is idempotent).
//! - `get` of a missing key fails with [`ObjectError::NotFound`].
//! - `put_if_absent` never replaces an object that exists when it starts; where the store
//!   cannot make that one atomic step (see each backend) a put racing with it may still land
//!   first and be replaced, so callers use it as a guard, not as a lock.
//! - `list` gives each object's last modification time when the store keeps one (every
//!   backend here does); [`crate::vfs::orphans`] counts an object's age from it.
//! - Integrity (CRC32) is checked above this trait, by the block layer, which knows the CRCs.

pub mod conformance;
pub mod error;
pub mod local;
pub mod memory;
#[cfg(feature = "s3")]
pub mod s3;
mod sync_group;

pub use error::ObjectError;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use backon::{ExponentialBuilder, Retryable};
pub use bytes::Bytes;
pub use sync_group::SyncGroup;

pub type ObjResult<T> = Result<T, ObjectError>;
pub type BoxFut<'a, T> = Pin<Box<dyn Future<Output = ObjResult<T>> + Send + 'a>>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    /// When the object was last written, by the store's clock (None: the store did not say).
    pub modified: Option<SystemTime>,
}

/// What [`ObjectStore::put_if_absent`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutIfAbsent {
    /// The object did not exist and was written.
    Created,
    /// An object with this key already existed; nothing was written.
    Exists,
}

/// Maximum keys one `list` call returns.
pub const LIST_LIMIT_MAX: usize = 1000;

pub trait ObjectStore: Send + Sync + 'static {
    /// A human description for status output, e.g. `file:///data` or `s3://bucket`.
    fn describe(&self) -> String;
    fn put<'a>(&'a self, key: &'a str, data: Bytes) -> BoxFut<'a, ()>;
    /// Write `data` under `key` only if no object has that key: [`PutIfAbsent::Exists`] (and
    /// nothing written) otherwise. The default asks `head` first and then puts: best effort,
    /// since a put by someone else between the two is replaced. Backends that can do it in
    /// one step (a conditional request, a link that fails on an existing name) override it.
    fn put_if_absent<'a>(&'a self, key: &'a str, data: Bytes) -> BoxFut<'a, PutIfAbsent> {
        Box::pin(async move {
            if self.head(key).await?.is_some() {
                return Ok(PutIfAbsent::Exists);
            }
            self.put(key, data).await?;
            Ok(PutIfAbsent::Created)
        })
    }
    fn get<'a>(&'a self, key: &'a str) -> BoxFut<'a, Bytes>;
    /// Size of the object, or None if it does not exist.
    fn head<'a>(&'a self, key: &'a str) -> BoxFut<'a, Option<u64>>;
    fn delete<'a>(&'a self, key: &'a str) -> BoxFut<'a, ()>;
    /// Make every completed `put` durable across a crash of the machine (a no-op for stores
    /// whose puts are durable when they return, such as S3).
    fn sync(&self) -> BoxFut<'_, ()> {
        Box::pin(async { Ok(()) })
    }
    /// Keys starting with `prefix`, strictly after `start_after`, in byte order,
    /// at most `limit` (≤ [`LIST_LIMIT_MAX`]).
    fn list<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
    ) -> BoxFut<'a, Vec<ObjectInfo>>;
}

pub type DynStore = Arc<dyn ObjectStore>;

/// Waits between attempts of an object store call: 50 ms first, doubling up to 2 s (the
/// number of attempts is the caller's).
const RETRY_BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(50))
    .with_max_delay(Duration::from_secs(2))
    .with_factor(2.0);

/// Call an object store operation until it succeeds, fails for good, or fails transiently
/// `attempts` times; the waits double from 50 ms up to 2 s, and each retry is logged.
pub async fn retry<T, F, Fut>(what: &str, attempts: u32, f: F) -> ObjResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ObjResult<T>>,
{
    let mut attempt = 0;
    f.retry(RETRY_BACKOFF.with_max_times(attempts.saturating_sub(1) as usize))
        .when(|e: &ObjectError| !e.is_permanent())
        .notify(|e, _| {
            attempt += 1;
            tracing::warn!("{what}: {e} (attempt {attempt} of {attempts})");
        })
        .await
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
            ca,
        } => Ok(Arc::new(
            s3::S3Store::open_with(s3::S3Config {
                bucket,
                prefix,
                endpoint,
                region,
                ca,
                credentials: None,
            })
            .await?,
        )),
        #[allow(unreachable_patterns)]
        other => Err(crate::Error::Invalid(format!(
            "object store {other:?} is not built into this binary"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn only_a_missing_object_and_a_fatal_error_are_permanent() {
        // what `retry` gives up on at once
        assert!(ObjectError::NotFound("k".into()).is_permanent());
        assert!(ObjectError::Fatal("access denied".into()).is_permanent());
        // what it tries again
        assert!(!ObjectError::Timeout("get k".into()).is_permanent());
        assert!(!ObjectError::Cancelled.is_permanent());
        assert!(!ObjectError::Transient("connection reset".into()).is_permanent());
    }

    /// `retry` over a call whose i-th answer is `answers[i]` (the last one from there on):
    /// what `retry` returned, and how many calls it made.
    async fn retried(attempts: u32, answers: &[ObjResult<u32>]) -> (ObjResult<u32>, usize) {
        let calls = AtomicUsize::new(0);
        let r = retry("get k", attempts, || async {
            let i = calls.fetch_add(1, Ordering::Relaxed);
            answers[i.min(answers.len() - 1)].clone()
        })
        .await;
        (r, calls.into_inner())
    }

    #[tokio::test]
    async fn a_transient_failure_is_tried_again_up_to_the_attempts_given() {
        // always failing transiently: exactly `attempts` calls, then the last error
        let reset = ObjectError::Transient("connection reset".into());
        let (r, calls) = retried(3, &[Err(reset)]).await;
        assert!(matches!(r, Err(ObjectError::Transient(_))), "{r:?}");
        assert_eq!(calls, 3);

        // failing once, then answering: the answer
        let timeout = ObjectError::Timeout("get k".into());
        let (r, calls) = retried(3, &[Err(timeout), Ok(7)]).await;
        assert_eq!(r.unwrap(), 7);
        assert_eq!(calls, 2);
    }

    #[tokio::test]
    async fn a_permanent_failure_is_returned_at_once() {
        let (r, calls) = retried(5, &[Err(ObjectError::NotFound("k".into()))]).await;
        assert!(matches!(r, Err(ObjectError::NotFound(_))), "{r:?}");
        assert_eq!(calls, 1);
    }
}
