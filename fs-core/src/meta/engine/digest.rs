//! The digest of a whole tree, to compare engines whatever their backend.

use sha2::{Digest, Sha256};

use super::Meta;
use crate::error::Result;
use crate::kv::{self, DynKv, KvTxn};
use crate::Version;

impl Meta {
    /// A digest of the whole file system tree (attributes, entries, chunks, symlinks, xattrs
    /// and unlinked-but-open inodes) and of the directory quotas. Two engines with the same content have the same digest,
    /// whatever their backend.
    pub fn digest(kv: &DynKv) -> Result<String> {
        kv::read(kv.as_ref(), |t| Self::digest_in(t))
    }

    /// The digest and the version it was taken at, read together (on RocksDB, from one
    /// snapshot; on Redis, compare [`kv::KvEngine::last_version`] before and after).
    pub fn digest_at(kv: &dyn kv::KvEngine) -> Result<(String, Version)> {
        kv::read(kv, |t| {
            let version = crate::snapshot::version_in(t)?;
            Ok((Self::digest_in(t)?, version))
        })
    }

    /// [`Meta::digest`] inside a transaction: the SHA-256 of every reachable inode's
    /// attributes, xattrs, entries, chunks and symlink target, in the order of a depth-first
    /// walk from the unlinked-but-open inodes, then from the root
    /// ([`crate::snapshot::walk_tree`], which a snapshot shares).
    pub fn digest_in(t: &mut dyn KvTxn) -> Result<String> {
        let mut h = Sha256::new();
        crate::snapshot::walk_tree(t, None, Some(&mut h))?;
        Ok(hex::encode(h.finalize()))
    }
}
