//! At a mirror, the way to blocks that the region's object store does not hold yet (or holds
//! corrupt): the mirror daemon fetches them from the primary's store.

use std::sync::Arc;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::object::ObjectError;

use super::{cache, Shared};

/// Where a mount at a mirror gets a block that its region's object store does not hold yet,
/// or holds corrupt: the mirror daemon, which fetches it from the primary's store ahead of
/// its copy queue, keeps a copy and answers with the bytes (checked again by the caller).
pub trait BlockFallback: Send + Sync {
    /// `reason`: "missing" or "corrupt".
    fn fetch<'a>(
        &'a self,
        key: &'a str,
        len: u32,
        crc: u32,
        reason: &'a str,
    ) -> crate::object::BoxFut<'a, Bytes>;

    /// Whether the daemon behind it offers the fallback now. A mount's daemon can change
    /// role under it (a primary replaced by a mirror at a switchover, and promoted back):
    /// the mount asks at each read, not once at mount time.
    fn offered(&self) -> bool {
        true
    }
}

/// A [`BlockFallback`] in [`VfsOptions`].
#[derive(Clone)]
pub struct Fallback(pub Arc<dyn BlockFallback>);

impl std::fmt::Debug for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fallback")
    }
}

impl Shared {
    /// Whether blocks missing from (or corrupt in) this region's store can be asked of the
    /// mount's daemon now.
    pub(super) fn fallback_offered(&self) -> bool {
        self.fallback.as_ref().is_some_and(|f| f.0.offered())
    }

    /// A block from the mirror (see [`BlockFallback`]), checked again here.
    pub(super) async fn fetch_fallback(
        &self,
        key: &str,
        len: u32,
        crc: u32,
        reason: &str,
    ) -> Result<Bytes> {
        let Some(fb) = self.fallback.as_ref().filter(|f| f.0.offered()) else {
            return Err(Error::Meta("no block fallback".into()));
        };
        let _slot = self
            .fallback_slots
            .acquire()
            .await
            .map_err(|_| Error::Meta("fallback slots closed".into()))?;
        let data =
            fb.0.fetch(key, len, crc, reason)
                .await
                .map_err(|e| match e {
                    ObjectError::NotFound(_) => Error::CorruptBlock {
                        key: key.to_string(),
                        reason: "missing from this region's store and from the primary's".into(),
                    },
                    other => Error::Object(other),
                })?;
        if let Err(e) = cache::verify(key, &data, len, crc) {
            self.report_corrupt(&e);
            return Err(e);
        }
        Ok(data)
    }
}
