//! The digest of a whole tree, to compare engines whatever their backend.

use std::collections::{BTreeMap, HashSet};

use sha2::{Digest, Sha256};

use super::Meta;
use crate::changelog::{self, encode, get_attr};
use crate::error::{Error, Result};
use crate::kv::{self, DynKv, KvTxn};
use crate::meta::keys;
use crate::meta::types::*;
use crate::Version;

impl Meta {
    /// A digest of the whole file system tree (attributes, entries, chunks, symlinks, xattrs
    /// and unlinked-but-open inodes). Two engines with the same content have the same digest,
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

    /// [`Meta::digest`] inside a transaction.
    pub fn digest_in(t: &mut dyn KvTxn) -> Result<String> {
        {
            let mut h = Sha256::new();
            let mut seen = HashSet::new();
            let mut stack = vec![ROOT_INO];
            let mut extra: BTreeMap<Ino, ()> = BTreeMap::new();
            for (k, _) in t.scan(&keys::group(keys::DELFILE, 0), None, usize::MAX)? {
                if let Some(ino) = keys::u64_at(&k, 9) {
                    extra.insert(ino, ());
                }
            }
            stack.extend(extra.keys().rev().copied());
            while let Some(ino) = stack.pop() {
                if !seen.insert(ino) {
                    continue;
                }
                let a = get_attr(t, ino)?.ok_or_else(|| {
                    Error::corrupt(format!("inode {ino} is referenced but missing"))
                })?;
                h.update(b"I");
                h.update(ino.to_be_bytes());
                h.update(encode(&a)?);
                for (k, v) in t.scan(&keys::group(keys::XATTR, ino), None, usize::MAX)? {
                    h.update(b"X");
                    h.update(&k);
                    h.update(&v);
                }
                match a.kind {
                    FileKind::Dir => {
                        let entries = t.scan(&keys::group(keys::DENTRY, ino), None, usize::MAX)?;
                        let mut children = vec![];
                        for (k, v) in entries {
                            h.update(b"D");
                            h.update(&k);
                            h.update(&v);
                            children.push(changelog::decode_dentry(&v)?.0);
                        }
                        stack.extend(children.into_iter().rev());
                    }
                    FileKind::File => {
                        for (k, v) in t.scan(&keys::group(keys::CHUNK, ino), None, usize::MAX)? {
                            h.update(b"C");
                            h.update(&k);
                            h.update(&v);
                        }
                    }
                    FileKind::Symlink => {
                        h.update(b"S");
                        h.update(t.get(&keys::symlink(ino))?.unwrap_or_default());
                    }
                    _ => {}
                }
            }
            Ok(hex::encode(h.finalize()))
        }
    }
}
