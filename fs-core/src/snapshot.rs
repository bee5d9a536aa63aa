//! Consistent metadata snapshots: what a mirror bootstraps from (docs/changelog.md, "Following the log at a mirror"), and what
//! `strait dump` writes and `strait load` reads.
//!
//! A snapshot is every replicated key of the file system at one version `S`: the settings,
//! the counters, the dead-slice and unlinked-file tables, and every inode reachable from the
//! root (or kept by an open handle) with its attributes, entries, chunks, symlink target and
//! xattrs. Sessions and locks are region-local runtime state and are left out; so is the
//! change-log outbox. The request records go with it ([`walk_snapshot`]), though no digest
//! counts them. A replica that loads the snapshot and then applies the log from `S + 1`
//! holds exactly the primary's metadata at every later version.
//!
//! # To ensure correctness
//! - The walk runs in one read transaction. On RocksDB that is a snapshot, so the pairs and
//!   the version belong together; on backends whose reads are not isolated (Redis),
//!   [`collect`] compares the version before and after and tries again.
//! - [`Loader`] refuses an engine that already holds a file system, and writes the version
//!   last, in the final transaction: a load cut short leaves no version behind, so nothing
//!   will ever apply the log on top of half a snapshot.

use std::collections::{BTreeSet, HashSet};
use std::io::{Read, Write};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::changelog::record::{decode, encode};
use crate::changelog::state::decode_dentry;
use crate::error::{Error, Result};
use crate::kv::{self, decode_counter, KvEngine, KvPairs, KvTxn, LAST_VERSION_KEY};
use crate::meta::keys;
use crate::meta::types::{Attr, FileKind};
use crate::meta::ROOT_INO;
use crate::Version;

/// Pairs per batch of a streamed or written snapshot, and per transaction of a load.
pub const BATCH_PAIRS_MAX: usize = 1024;
/// How many times [`collect`] reads again when the engine changed during the walk.
const WALK_RETRIES_MAX: usize = 5;
/// First bytes of a dump file.
pub const DUMP_MAGIC: &[u8; 12] = b"STRAITDUMP1\n";
/// Largest frame of a dump file (a batch of pairs).
const FRAME_BYTES_MAX: usize = 256 << 20;

/// Groups owned by no inode (owner 0) that a snapshot copies whole.
const GLOBAL_GROUPS: [u8; 8] = [
    keys::SETTING,
    keys::COUNTER,
    keys::DELFILE,
    keys::DEADSLICE,
    keys::QUOTA,
    keys::TRASH,
    keys::SLICEREF,
    keys::CLONE,
];

/// Global groups whose keys name an inode the walk starts from besides the root: the
/// unlinked-but-open, the trash's, the roots of clones being made.
fn names_a_root(tag: u8) -> bool {
    matches!(tag, keys::DELFILE | keys::TRASH | keys::CLONE)
}

/// Global groups the digest hashes after the tree, in this order (with none of their keys,
/// the digest is what it was before they existed).
const HASHED_AFTER: [(u8, &[u8]); 4] = [
    (keys::QUOTA, b"U"),
    (keys::TRASH, b"T"),
    (keys::SLICEREF, b"M"),
    (keys::CLONE, b"I"),
];

/// Call `visit` with every replicated pair reachable in `t`, settings and counters first.
pub fn walk(
    t: &mut dyn KvTxn,
    visit: &mut dyn FnMut(Vec<u8>, Vec<u8>) -> Result<()>,
) -> Result<()> {
    walk_tree(t, Some(visit), None)
}

/// What a walk gives each pair to.
pub(crate) type Visitor<'a> = &'a mut dyn FnMut(Vec<u8>, Vec<u8>) -> Result<()>;

/// One pass over the tree: with `visit`, every replicated pair reachable in `t` (the global
/// groups first, then the unlinked-but-open inodes, then the tree from the root, depth
/// first); with `digest`, what [`crate::meta::Meta::digest_in`] hashes, in its order.
///
/// A snapshot and its digest are taken in one pass (a mirror's bootstrap walked the tree
/// twice at the primary and twice more after loading it: at 2.6 million files the bootstrap
/// ran at 33,000 pairs/s, nearly all of it point reads of the walks). Each inode costs one
/// read of its attributes and a scan of its xattrs and of its entries or chunks.
///
/// Only the inodes that can be reached twice are remembered: directories (a cycle would
/// otherwise never end), files with more than one link, and the unlinked-but-open inodes
/// (the walk's roots). The memory of a walk follows the directories, not the files.
pub(crate) fn walk_tree(
    t: &mut dyn KvTxn,
    mut visit: Option<Visitor<'_>>,
    mut digest: Option<&mut Sha256>,
) -> Result<()> {
    let mut roots = BTreeSet::new();
    // the directory quotas (limits and usage), the trash's entries, the shared slices and the
    // clones being made are hashed after the tree
    let mut after: Vec<(&[u8], Vec<u8>, Vec<u8>)> = vec![];
    for tag in GLOBAL_GROUPS {
        let hashed = HASHED_AFTER
            .iter()
            .find(|(t, _)| *t == tag)
            .map(|(_, h)| *h);
        if visit.is_none() && !names_a_root(tag) && hashed.is_none() {
            continue;
        }
        for (k, v) in t.scan(&keys::group(tag, 0), None, usize::MAX)? {
            if names_a_root(tag) {
                roots.insert(keys::u64_at(&k, 9).ok_or_else(|| Error::corrupt("root key"))?);
            }
            if let (Some(h), true) = (hashed, digest.is_some()) {
                after.push((h, k.clone(), v.clone()));
            }
            if let Some(visit) = visit.as_deref_mut() {
                visit(k, v)?;
            }
        }
    }
    // the unlinked-but-open inodes first, lowest first, then the tree (the digest's order)
    let mut stack: Vec<u64> = vec![ROOT_INO];
    stack.extend(roots.iter().rev());
    let mut seen = HashSet::new();
    while let Some(ino) = stack.pop() {
        if seen.contains(&ino) {
            continue;
        }
        let Some(raw) = t.get(&keys::attr(ino))? else {
            return Err(Error::corrupt(format!(
                "inode {ino} is referenced but missing"
            )));
        };
        let attr: Attr = decode(&raw)?;
        if attr.kind == FileKind::Dir || attr.nlink != 1 || roots.contains(&ino) {
            seen.insert(ino);
        }
        if let Some(h) = digest.as_deref_mut() {
            h.update(b"I");
            h.update(ino.to_be_bytes());
            h.update(encode(&attr)?);
        }
        if let Some(visit) = visit.as_deref_mut() {
            visit(keys::attr(ino), raw)?;
        }
        let mut take = |tag: &[u8], k: Vec<u8>, v: Vec<u8>| -> Result<()> {
            if let Some(h) = digest.as_deref_mut() {
                h.update(tag);
                h.update(&k);
                h.update(&v);
            }
            match visit.as_deref_mut() {
                Some(visit) => visit(k, v),
                None => Ok(()),
            }
        };
        for (k, v) in t.scan(&keys::group(keys::XATTR, ino), None, usize::MAX)? {
            take(b"X", k, v)?;
        }
        match attr.kind {
            FileKind::Dir => {
                let mut children = vec![];
                for (k, v) in t.scan(&keys::group(keys::DENTRY, ino), None, usize::MAX)? {
                    children.push(decode_dentry(&v)?.0);
                    take(b"D", k, v)?;
                }
                stack.extend(children.into_iter().rev());
            }
            FileKind::File => {
                for (k, v) in t.scan(&keys::group(keys::CHUNK, ino), None, usize::MAX)? {
                    take(b"C", k, v)?;
                }
            }
            FileKind::Symlink => {
                let target = t.get(&keys::symlink(ino))?;
                if let Some(h) = digest.as_deref_mut() {
                    h.update(b"S");
                    h.update(target.as_deref().unwrap_or_default());
                }
                if let (Some(visit), Some(v)) = (visit.as_deref_mut(), target) {
                    visit(keys::symlink(ino), v)?;
                }
            }
            _ => {}
        }
    }
    if let Some(h) = digest {
        for (tag, k, v) in after {
            h.update(tag);
            h.update(&k);
            h.update(&v);
        }
    }
    Ok(())
}

/// The key a snapshot ends with to say that it carries the request records (one of an
/// older primary does not: its loader notes them as lost). Never stored as a record.
fn carried_key() -> Vec<u8> {
    keys::requests_state("carried")
}

/// Call `visit` with every pair a snapshot carries: the tree ([`walk`]), then the request
/// records with their age index and state (region-local, not file system content: no digest
/// counts them), then [`carried_key`]. A replica loaded from it answers a change sent again
/// from its record, as the engine it was taken from would: without them a change committed
/// before the snapshot and sent again (its answer lost) ran a second time at a mirror
/// promoted soon after its bootstrap, or at an old primary rejoined from a snapshot.
pub fn walk_snapshot(
    t: &mut dyn KvTxn,
    visit: &mut dyn FnMut(Vec<u8>, Vec<u8>) -> Result<()>,
) -> Result<()> {
    walk_snapshot_digest(t, visit, None)
}

/// [`walk_snapshot`], hashing the tree's digest on the way when `digest` is given.
fn walk_snapshot_digest(
    t: &mut dyn KvTxn,
    visit: &mut dyn FnMut(Vec<u8>, Vec<u8>) -> Result<()>,
    digest: Option<&mut Sha256>,
) -> Result<()> {
    walk_tree(t, Some(&mut *visit), digest)?;
    let carried = carried_key();
    for owner in [
        keys::REQUESTS_BY_ID,
        keys::REQUESTS_BY_AGE,
        keys::REQUESTS_STATE,
    ] {
        for (k, v) in t.scan(&keys::group(keys::REQUEST, owner), None, usize::MAX)? {
            if k != carried {
                visit(k, v)?;
            }
        }
    }
    visit(carried, vec![])
}

/// The version of the last change record, read inside `t`.
pub fn version_in(t: &mut dyn KvTxn) -> Result<Version> {
    Ok(Version(decode_counter(t.get(LAST_VERSION_KEY)?)? as u64))
}

/// What [`collect`] walked: the version, the number of pairs and the digest, all of one view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collected {
    pub version: Version,
    pub pairs: u64,
    pub digest: String,
}

/// Walk the whole snapshot in batches of at most [`BATCH_PAIRS_MAX`] pairs, giving each to
/// `batch` (which may block, to stream with back-pressure). On a backend whose reads are not
/// isolated (Redis) the walk is repeated while the version moves during it, and the caller
/// sees each attempt from its start: `start` is called with the version before every attempt.
pub fn collect(
    kv: &dyn KvEngine,
    start: &mut dyn FnMut(Version) -> Result<()>,
    batch: &mut dyn FnMut(KvPairs) -> Result<()>,
) -> Result<Collected> {
    // Not backon: a re-walk at once while the version moves, like a transaction conflict.
    for _ in 0..WALK_RETRIES_MAX {
        let got = kv::read(kv, |t| {
            let version = version_in(t)?;
            start(version)?;
            let mut buf: KvPairs = Vec::with_capacity(BATCH_PAIRS_MAX);
            let mut pairs = 0u64;
            let mut h = Sha256::new();
            walk_snapshot_digest(
                t,
                &mut |k, v| {
                    buf.push((k, v));
                    pairs += 1;
                    if buf.len() >= BATCH_PAIRS_MAX {
                        batch(std::mem::take(&mut buf))?;
                    }
                    Ok(())
                },
                Some(&mut h),
            )?;
            if !buf.is_empty() {
                batch(buf)?;
            }
            let digest = hex::encode(h.finalize());
            if version_in(t)? != version {
                return Ok(None);
            }
            Ok(Some(Collected {
                version,
                pairs,
                digest,
            }))
        })?;
        if let Some(c) = got {
            return Ok(c);
        }
    }
    Err(Error::Meta(format!(
        "the {} engine kept changing during {WALK_RETRIES_MAX} snapshot walks; stop writers \
         or use RocksDB, whose reads are snapshots",
        kv.name()
    )))
}

/// Writes a snapshot into an empty engine, batch by batch; the version goes in last.
pub struct Loader<'a> {
    kv: &'a dyn KvEngine,
    pairs: u64,
    /// The snapshot said it carries the request records ([`walk_snapshot`]).
    carried: bool,
}

impl<'a> Loader<'a> {
    /// Start loading into `kv`, which must hold no file system and no change record.
    pub fn new(kv: &'a dyn KvEngine) -> Result<Self> {
        let occupied = kv::read(kv, |t| {
            Ok(t.get(&keys::setting(keys::FORMAT))?.is_some() || version_in(t)? != Version::ZERO)
        })?;
        if occupied || kv.last_version()? != Version::ZERO {
            return Err(Error::Invalid(format!(
                "the {} engine already holds a file system: load needs an empty one",
                kv.name()
            )));
        }
        Ok(Loader {
            kv,
            pairs: 0,
            carried: false,
        })
    }

    /// Write one batch of pairs (replicated keys only; anything else is refused).
    pub fn batch(&mut self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let carried = carried_key();
        for (k, _) in pairs {
            check_key(k)?;
            self.carried |= *k == carried;
        }
        self.kv.txn(&mut |t| {
            for (k, v) in pairs {
                t.put(k, v);
            }
            Ok(())
        })?;
        self.pairs += pairs.len() as u64;
        Ok(())
    }

    /// Set the version the snapshot was taken at and check the result: the loaded tree must
    /// walk without a dangling reference and hold `pairs` pairs. Returns the digest.
    pub fn finish(self, version: Version, pairs: u64) -> Result<String> {
        if pairs != self.pairs {
            return Err(Error::corrupt(format!(
                "the snapshot announced {pairs} pairs but carried {}",
                self.pairs
            )));
        }
        let carried = self.carried;
        self.kv.txn(&mut |t| {
            t.add(LAST_VERSION_KEY, version.0 as i64);
            if !carried {
                // a snapshot without the request records (an older primary's): a change sent
                // again that finds no record may have committed before it; for a while such a
                // retry is answered "not known" rather than run a second time
                crate::meta::requests::raise_lost(t, crate::clock::now_ns())?;
            }
            Ok(())
        })?;
        let (got, digest) = kv::read(self.kv, |t| {
            let mut n = 0u64;
            let mut count = |_, _| {
                n += 1;
                Ok(())
            };
            let mut h = Sha256::new();
            // an older snapshot carried the tree alone
            if carried {
                walk_snapshot_digest(t, &mut count, Some(&mut h))?;
            } else {
                walk_tree(t, Some(&mut count), Some(&mut h))?;
            }
            Ok((n, hex::encode(h.finalize())))
        })?;
        if got != pairs {
            return Err(Error::corrupt(format!(
                "the loaded tree holds {got} reachable pairs, the snapshot {pairs}"
            )));
        }
        Ok(digest)
    }
}

/// A snapshot may only carry replicated keys, and the request records.
fn check_key(k: &[u8]) -> Result<()> {
    let ok = k.len() >= kv::GROUP_LEN
        && matches!(
            k[0],
            keys::ATTR
                | keys::DENTRY
                | keys::CHUNK
                | keys::SYMLINK
                | keys::XATTR
                | keys::DELFILE
                | keys::DEADSLICE
                | keys::SETTING
                | keys::COUNTER
                | keys::QUOTA
                | keys::TRASH
                | keys::SLICEREF
                | keys::CLONE
                | keys::REQUEST
        );
    if ok {
        Ok(())
    } else {
        Err(Error::corrupt(format!(
            "a snapshot carried key {:?}, which is not file system metadata",
            String::from_utf8_lossy(k)
        )))
    }
}

/// The header of a dump file.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct DumpHeader {
    pub name: String,
    pub version: Version,
}

#[derive(Serialize, Deserialize)]
enum Frame {
    Pairs(Vec<(serde_bytes::ByteBuf, serde_bytes::ByteBuf)>),
    End { pairs: u64, digest: String },
}

fn write_frame(w: &mut dyn Write, f: &Frame) -> Result<()> {
    let b =
        postcard::to_stdvec(f).map_err(|e| Error::corrupt(format!("encode dump frame: {e}")))?;
    w.write_all(&(b.len() as u32).to_be_bytes())
        .and_then(|_| w.write_all(&b))
        .map_err(|e| Error::io("write the dump", e))
}

fn read_frame(r: &mut dyn Read) -> Result<Frame> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)
        .map_err(|e| Error::io("read a dump frame (the file is cut short?)", e))?;
    let len = u32::from_be_bytes(len) as usize;
    if len > FRAME_BYTES_MAX {
        return Err(Error::corrupt(format!("dump frame of {len} bytes")));
    }
    let mut b = vec![0u8; len];
    r.read_exact(&mut b)
        .map_err(|e| Error::io("read a dump frame (the file is cut short?)", e))?;
    postcard::from_bytes(&b).map_err(|e| Error::corrupt(format!("decode dump frame: {e}")))
}

/// Write a consistent dump of `kv` to `w`. Returns the header and the pair count.
///
/// The pairs are gathered in memory first, so that a walk repeated on a backend without
/// snapshots (see [`collect`]) never reaches the file.
pub fn dump(kv: &dyn KvEngine, w: &mut dyn Write) -> Result<(DumpHeader, u64)> {
    let format = crate::meta::Meta::load_format(kv)?;
    let frames: std::cell::RefCell<Vec<Frame>> = Default::default();
    let c = collect(
        kv,
        &mut |_| {
            frames.borrow_mut().clear();
            Ok(())
        },
        &mut |batch| {
            frames.borrow_mut().push(Frame::Pairs(
                batch
                    .into_iter()
                    .map(|(k, v)| (k.into(), v.into()))
                    .collect(),
            ));
            Ok(())
        },
    )?;
    let header = DumpHeader {
        name: format.name,
        version: c.version,
    };
    w.write_all(DUMP_MAGIC)
        .map_err(|e| Error::io("write the dump", e))?;
    let hb = postcard::to_stdvec(&header).map_err(|e| Error::corrupt(format!("encode: {e}")))?;
    w.write_all(&(hb.len() as u32).to_be_bytes())
        .and_then(|_| w.write_all(&hb))
        .map_err(|e| Error::io("write the dump", e))?;
    for f in frames.borrow().iter() {
        write_frame(w, f)?;
    }
    write_frame(
        w,
        &Frame::End {
            pairs: c.pairs,
            digest: c.digest,
        },
    )?;
    w.flush().map_err(|e| Error::io("write the dump", e))?;
    Ok((header, c.pairs))
}

/// Load a dump written by [`dump`] into the empty engine `kv`. Returns the header and the
/// digest, checked against the one the dump carries.
pub fn load(kv: &dyn KvEngine, r: &mut dyn Read) -> Result<(DumpHeader, String)> {
    let mut magic = [0u8; 12];
    r.read_exact(&mut magic)
        .map_err(|e| Error::io("read the dump header", e))?;
    if &magic != DUMP_MAGIC {
        return Err(Error::Invalid("not a strait dump (bad magic bytes)".into()));
    }
    let mut len = [0u8; 4];
    r.read_exact(&mut len)
        .map_err(|e| Error::io("read the dump header", e))?;
    let len = u32::from_be_bytes(len) as usize;
    if len > 1 << 20 {
        return Err(Error::corrupt(format!("dump header of {len} bytes")));
    }
    let mut hb = vec![0u8; len];
    r.read_exact(&mut hb)
        .map_err(|e| Error::io("read the dump header", e))?;
    let header: DumpHeader = postcard::from_bytes(&hb)
        .map_err(|e| Error::corrupt(format!("decode the dump header: {e}")))?;
    let mut loader = Loader::new(kv)?;
    loop {
        match read_frame(r)? {
            Frame::Pairs(p) => {
                let p: Vec<(Vec<u8>, Vec<u8>)> = p
                    .into_iter()
                    .map(|(k, v)| (k.into_vec(), v.into_vec()))
                    .collect();
                loader.batch(&p)?;
            }
            Frame::End { pairs, digest } => {
                let got = loader.finish(header.version, pairs)?;
                if got != digest {
                    return Err(Error::corrupt(format!(
                        "the loaded metadata's digest {got} differs from the dump's {digest}"
                    )));
                }
                return Ok((header, got));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::changelog::{apply_replica, get_attr, read_log, ReplicaError};
    use crate::kv::memory::MemoryKv;
    use crate::kv::DynKv;
    use crate::meta::conformance::fresh;
    use crate::meta::{Ctx, Meta, MetaClient, SetAttr};

    fn memory() -> DynKv {
        Arc::new(MemoryKv::new())
    }

    #[test]
    fn a_dump_plus_the_later_log_equals_the_primary() {
        // a primary with a small tree, dumped at version S
        let (kv, m) = fresh(&memory);
        let root = Ctx::root();
        let (d, _) = m.mkdir(&root, ROOT_INO, b"dir", 0o755, 0).unwrap();
        let (f, _) = m.create(&root, d, b"file", 0o640, 0).unwrap();
        m.symlink(&root, d, b"sym", b"file").unwrap();
        m.setxattr(&root, f, b"user.k", b"v", 0).unwrap();
        let mut buf = vec![];
        let (header, pairs) = dump(kv.as_ref(), &mut buf).unwrap();
        assert_eq!(header.version, kv.last_version().unwrap());
        assert!(pairs > 5, "{pairs} pairs");

        // loaded into an empty engine: same digest, same version
        let replica = memory();
        let (h2, digest) = load(replica.as_ref(), &mut buf.as_slice()).unwrap();
        assert_eq!(h2, header);
        assert_eq!(digest, Meta::digest(&kv).unwrap());
        assert_eq!(replica.last_version().unwrap(), header.version);

        // the primary goes on; the replica applies the log from S + 1 and converges
        m.rename(&root, d, b"file", ROOT_INO, b"moved", 0).unwrap();
        m.setattr(
            &root,
            f,
            &SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .unwrap();
        m.mkdir(&root, ROOT_INO, b"more", 0o700, 0).unwrap();
        let later = read_log(kv.as_ref(), header.version, usize::MAX).unwrap();
        let recs: Vec<_> = later.iter().map(|(_, r)| r.clone()).collect();
        // a batch that does not start right after the replica's version is refused
        let e = apply_replica(replica.as_ref(), header.version + 2, &recs).unwrap_err();
        assert!(matches!(e, ReplicaError::Gap { .. }), "{e}");
        let last = apply_replica(replica.as_ref(), header.version + 1, &recs).unwrap();
        assert_eq!(last, kv.last_version().unwrap());
        assert_eq!(
            Meta::digest_at(replica.as_ref()).unwrap(),
            Meta::digest_at(kv.as_ref()).unwrap()
        );
        // applying the same batch again is a gap, not a second apply
        let e = apply_replica(replica.as_ref(), header.version + 1, &recs).unwrap_err();
        assert!(matches!(e, ReplicaError::Gap { .. }), "{e}");
    }

    /// The counters come with the snapshot and the records do not move them: applying
    /// records raises them past every id the records name, so a replica promoted to primary
    /// hands out no inode number or slice id the log already used.
    #[test]
    fn a_replica_s_id_counters_pass_every_id_its_records_name() {
        let (kv, m) = fresh(&memory);
        let mut buf = vec![];
        let (header, _) = dump(kv.as_ref(), &mut buf).unwrap();
        let replica = memory();
        load(replica.as_ref(), &mut buf.as_slice()).unwrap();
        // the primary takes ids from its counters after the snapshot (in batches)
        let root = Ctx::root();
        let (f, _) = m.create(&root, ROOT_INO, b"f", 0o644, 0).unwrap();
        let slice = crate::meta::SliceRef {
            id: m.next_slice_id().unwrap(),
            size: 10,
            off: 0,
            len: 10,
            pos: 0,
            crcs: vec![7],
        };
        m.write_slice(f, 0, slice.clone(), crate::clock::now_ns())
            .unwrap();
        let later = read_log(kv.as_ref(), header.version, usize::MAX).unwrap();
        let recs: Vec<_> = later.iter().map(|(_, r)| r.clone()).collect();
        apply_replica(replica.as_ref(), header.version + 1, &recs).unwrap();
        let counter = |name| replica.incr(&crate::meta::keys::counter(name), 0).unwrap();
        assert!(counter(crate::meta::keys::NEXT_INODE) >= f as i64);
        assert!(counter(crate::meta::keys::NEXT_SLICE) >= slice.id.0 as i64);
        // promoted: the next ids are new ones
        let promoted = Meta::open(replica.clone(), Default::default()).unwrap();
        let (g, _) = promoted.create(&root, ROOT_INO, b"g", 0o644, 0).unwrap();
        assert!(g > f, "inode {g} after {f}");
        assert!(promoted.next_slice_id().unwrap() > slice.id);
    }

    #[test]
    fn an_invalid_record_is_refused_and_changes_nothing() {
        let (kv, m) = fresh(&memory);
        m.mkdir(&Ctx::root(), ROOT_INO, b"dir", 0o755, 0).unwrap();
        let replica = memory();
        let mut buf = vec![];
        dump(kv.as_ref(), &mut buf).unwrap();
        load(replica.as_ref(), &mut buf.as_slice()).unwrap();
        let before = Meta::digest_at(replica.as_ref()).unwrap();
        // a create under an inode the replica does not have
        let rec = crate::changelog::ChangeRecord {
            ts_ns: 1,
            change: crate::changelog::Change::SetAttr {
                ino: 999_999,
                attr: kv::read(kv.as_ref(), |t| get_attr(t, ROOT_INO))
                    .unwrap()
                    .unwrap(),
            },
            request: None,
        };
        let v = replica.last_version().unwrap() + 1;
        let e = apply_replica(replica.as_ref(), v, &[rec]).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        assert_eq!(Meta::digest_at(replica.as_ref()).unwrap(), before);
    }

    #[test]
    fn a_dump_header_encodes_as_before_the_version_type() {
        // the header as dump files were written when the version was a bare u64
        #[derive(Serialize)]
        struct HeaderU64 {
            name: String,
            version: u64,
        }
        let new = DumpHeader {
            name: "fs".into(),
            version: Version(1 << 40),
        };
        let old = HeaderU64 {
            name: "fs".into(),
            version: 1 << 40,
        };
        let bytes = postcard::to_stdvec(&old).unwrap();
        assert_eq!(postcard::to_stdvec(&new).unwrap(), bytes);
        assert_eq!(postcard::from_bytes::<DumpHeader>(&bytes).unwrap(), new);
    }

    #[test]
    fn load_refuses_a_formatted_engine_and_a_bad_file() {
        let (kv, _) = fresh(&memory);
        let mut buf = vec![];
        dump(kv.as_ref(), &mut buf).unwrap();
        let e = load(kv.as_ref(), &mut buf.as_slice()).unwrap_err();
        assert!(e.to_string().contains("already holds"), "{e}");
        let e = load(memory().as_ref(), &mut &b"not a dump at all"[..]).unwrap_err();
        assert!(e.to_string().contains("not a strait dump"), "{e}");
        // cut short: no version is left behind
        let replica = memory();
        let e = load(replica.as_ref(), &mut &buf[..buf.len() - 3]).unwrap_err();
        assert!(e.to_string().contains("cut short"), "{e}");
        assert_eq!(replica.last_version().unwrap(), Version::ZERO);
    }

    /// The walk and the digest as they were before they shared one pass: every pair of the
    /// tree, and the digest, each by a walk of its own. [`walk_tree`] must give the same pairs
    /// once each and the same digest (the digests of daemons of two releases are compared).
    fn reference(t: &mut dyn KvTxn) -> (KvPairs, String) {
        let mut pairs = vec![];
        let mut roots = vec![ROOT_INO];
        let mut trash = vec![];
        for tag in GLOBAL_GROUPS {
            for (k, v) in t.scan(&keys::group(tag, 0), None, usize::MAX).unwrap() {
                if names_a_root(tag) {
                    roots.push(keys::u64_at(&k, 9).unwrap());
                }
                if let Some((_, h)) = HASHED_AFTER.iter().find(|(t, _)| *t == tag) {
                    trash.push((*h, k.clone(), v.clone()));
                }
                pairs.push((k, v));
            }
        }
        let mut h = Sha256::new();
        let mut seen = HashSet::new();
        let mut digest_stack = vec![ROOT_INO];
        let mut extra: Vec<u64> = roots[1..].to_vec();
        extra.sort();
        extra.dedup();
        digest_stack.extend(extra.iter().rev());
        // the pairs, walked from the root first
        let mut stack: Vec<u64> = roots.into_iter().rev().collect();
        let mut hashing = false;
        for pass in 0..2 {
            if pass == 1 {
                stack = std::mem::take(&mut digest_stack);
                seen.clear();
                hashing = true;
            }
            while let Some(ino) = stack.pop() {
                if !seen.insert(ino) {
                    continue;
                }
                let a = get_attr(t, ino).unwrap().unwrap();
                let raw = t.get(&keys::attr(ino)).unwrap().unwrap();
                if hashing {
                    h.update(b"I");
                    h.update(ino.to_be_bytes());
                    h.update(encode(&a).unwrap());
                } else {
                    pairs.push((keys::attr(ino), raw));
                }
                let mut take = |tag: &[u8], k: Vec<u8>, v: Vec<u8>| {
                    if hashing {
                        h.update(tag);
                        h.update(&k);
                        h.update(&v);
                    } else {
                        pairs.push((k, v));
                    }
                };
                for (k, v) in t
                    .scan(&keys::group(keys::XATTR, ino), None, usize::MAX)
                    .unwrap()
                {
                    take(b"X", k, v);
                }
                let group = match a.kind {
                    FileKind::Dir => keys::DENTRY,
                    FileKind::File => keys::CHUNK,
                    _ => 0,
                };
                if group != 0 {
                    let mut children = vec![];
                    for (k, v) in t.scan(&keys::group(group, ino), None, usize::MAX).unwrap() {
                        if group == keys::DENTRY {
                            children.push(decode_dentry(&v).unwrap().0);
                        }
                        take(if group == keys::DENTRY { b"D" } else { b"C" }, k, v);
                    }
                    stack.extend(children.into_iter().rev());
                }
                if a.kind == FileKind::Symlink {
                    let target = t.get(&keys::symlink(ino)).unwrap();
                    if hashing {
                        h.update(b"S");
                        h.update(target.clone().unwrap_or_default());
                    } else if let Some(v) = target {
                        pairs.push((keys::symlink(ino), v));
                    }
                }
            }
        }
        // the quotas, the trash's entries, shared slices and clones after the tree
        for (tag, k, v) in trash {
            h.update(tag);
            h.update(&k);
            h.update(&v);
        }
        (pairs, hex::encode(h.finalize()))
    }

    #[test]
    fn one_pass_gives_the_pairs_and_the_digest_of_two() {
        let (kv, m) = fresh(&memory);
        let root = Ctx::root();
        m.open_session("walk").unwrap();
        let (a, _) = m.mkdir(&root, ROOT_INO, b"a", 0o755, 0).unwrap();
        let (b, _) = m.mkdir(&root, a, b"b", 0o755, 0).unwrap();
        m.setxattr(&root, a, b"user.dir", b"x", 0).unwrap();
        let mut files = vec![];
        for (parent, name) in [(a, &b"f1"[..]), (b, b"f2"), (ROOT_INO, b"f3"), (b, b"gone")] {
            let (f, _) = m.create(&root, parent, name, 0o644, 0).unwrap();
            let slice = crate::meta::SliceRef {
                id: m.next_slice_id().unwrap(),
                size: 10,
                off: 0,
                len: 10,
                pos: 0,
                crcs: vec![7],
            };
            m.write_slice(f, 0, slice, crate::clock::now_ns()).unwrap();
            files.push(f);
        }
        m.setxattr(&root, files[1], b"user.file", b"y", 0).unwrap();
        // a file with two links, in two directories: walked once
        m.link(&root, files[0], b, b"f1-again").unwrap();
        m.symlink(&root, b, b"sym", b"../f3").unwrap();
        // unlinked while open: kept, a root of the walk
        m.open_inode(&root, files[3], libc::O_RDONLY).unwrap();
        m.unlink(&root, b, b"gone").unwrap();
        // an empty file, unlinked while open too
        let (e, _) = m.create(&root, ROOT_INO, b"empty", 0o644, 0).unwrap();
        m.open_inode(&root, e, libc::O_RDONLY).unwrap();
        m.unlink(&root, ROOT_INO, b"empty").unwrap();

        let (mut want, want_digest) = kv::read(kv.as_ref(), |t| Ok(reference(t))).unwrap();
        let mut got = vec![];
        kv::read(kv.as_ref(), |t| {
            walk(t, &mut |k, v| {
                got.push((k, v));
                Ok(())
            })
        })
        .unwrap();
        assert_eq!(got.len(), want.len(), "each pair once");
        got.sort();
        want.sort();
        assert_eq!(got, want);
        assert_eq!(Meta::digest(&kv).unwrap(), want_digest);
        // the snapshot's digest is the same one, taken in its walk
        let collected = collect(kv.as_ref(), &mut |_| Ok(()), &mut |_| Ok(())).unwrap();
        assert_eq!(collected.digest, want_digest);
        // and so is the loaded copy's
        let mut buf = vec![];
        dump(kv.as_ref(), &mut buf).unwrap();
        let (_, loaded) = load(memory().as_ref(), &mut buf.as_slice()).unwrap();
        assert_eq!(loaded, want_digest);
    }
}
