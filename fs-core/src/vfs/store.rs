//! Calls to the object store: transient failures retried, a missing object reported as a
//! corrupt block.

use std::future::Future;

use crate::error::{Error, Result};
use crate::object::ObjectError;

/// Attempts for one object store call that fails transiently.
pub const STORE_ATTEMPTS_MAX: u32 = 5;

/// Call an object store operation, retrying transient failures with exponential backoff
/// ([`crate::object::retry`]); a missing object is a [`Error::CorruptBlock`].
pub async fn retry_store<T, F, Fut>(what: &str, f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ObjectError>>,
{
    crate::object::retry(what, STORE_ATTEMPTS_MAX, f)
        .await
        .map_err(|e| match e {
            ObjectError::NotFound(_) => Error::CorruptBlock {
                key: what.to_string(),
                reason: "missing from the object store".into(),
            },
            other => Error::Object(other),
        })
}
