//! Change records: the outbox that replicates a file system.
//!
//! Every metadata transaction at the primary computes one [`Change`] from the current state,
//! applies it with [`apply`] and appends it to the log, all in one KV transaction. A replica
//! replays the same records with the same [`apply`], so the primary and every replica run one
//! piece of code for every state change.
//!
//! # To ensure correctness
//! - A record is self-contained: it carries every value a replica cannot recompute (inode
//!   numbers, slice ids, timestamps, resulting attributes). [`apply`] reads nothing but the
//!   record and the replica's own state; it never reads a clock or allocates an id.
//! - [`apply`] validates what it touches (a dentry's parent must exist and be a directory, a
//!   slice's inode must be a file, ...). An invalid record is an error that aborts the
//!   transaction; it never half-applies.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::kv::{KvTxn, LOG_GROUP};
use crate::meta::keys;
use crate::meta::types::{Attr, FileKind, Format, Ino, SliceRef};
use crate::{SliceId, Version};

/// A file name, symlink target or xattr name in a record: bytes on the wire, shown as text
/// (lossily) by `strait changelog`.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq)]
#[serde(transparent)]
pub struct Name(pub Vec<u8>);

impl std::fmt::Debug for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

impl std::ops::Deref for Name {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl From<&[u8]> for Name {
    fn from(b: &[u8]) -> Self {
        Name(b.to_vec())
    }
}

/// One change as the log holds it. Encoded as postcard encodes the pair `(ts_ns, change)`,
/// followed, for a change made under a request id, by the id as postcard encodes a byte
/// string: a record without one is byte for byte what it was before ids were carried, and a
/// reader that knows nothing of ids (postcard ignores what follows a value) reads the change.
#[derive(Clone, Debug, PartialEq)]
pub struct ChangeRecord {
    /// The primary's clock when the change committed, in ns since the epoch.
    pub ts_ns: i64,
    pub change: Change,
    /// The request id the change was made under (a mount's call that carried one): every
    /// engine that applies the record keeps the request's record too, so a call sent again
    /// after a switchover is answered at the new primary from it, not run a second time
    /// ([`crate::meta::requests`]).
    pub request: Option<Vec<u8>>,
}

/// Whether an inode that lost its last link is deleted now or kept for its open handles.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unlinked {
    /// The inode still has links.
    Linked,
    /// Delete the inode and free its slices.
    Delete,
    /// Keep the inode (nlink 0) until the last handle of session `sid` is released.
    Sustain { sid: u64 },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum Change {
    Format {
        format: Format,
        root: Attr,
    },
    /// Attributes changed (chmod, chown, utimes) without a size change.
    SetAttr {
        ino: Ino,
        attr: Attr,
    },
    /// Size changed: chunks from `first_dropped_chunk` on are deleted; `hole` hides the
    /// old bytes past the new end inside the last chunk.
    Truncate {
        ino: Ino,
        attr: Attr,
        first_dropped_chunk: u32,
        hole: Option<(u32, SliceRef)>,
    },
    /// A new inode linked at `parent/name` (create, mknod, mkdir, symlink).
    Create {
        parent: Ino,
        name: Name,
        ino: Ino,
        attr: Attr,
        parent_attr: Attr,
        target: Option<Name>,
    },
    Link {
        parent: Ino,
        name: Name,
        ino: Ino,
        attr: Attr,
        parent_attr: Attr,
    },
    Unlink {
        parent: Ino,
        name: Name,
        ino: Ino,
        parent_attr: Attr,
        attr: Attr,
        unlinked: Unlinked,
    },
    Rmdir {
        parent: Ino,
        name: Name,
        ino: Ino,
        parent_attr: Attr,
    },
    Rename {
        src_parent: Ino,
        src_name: Name,
        dst_parent: Ino,
        dst_name: Name,
        ino: Ino,
        attr: Attr,
        src_parent_attr: Attr,
        dst_parent_attr: Attr,
        /// The inode that was at the destination: replaced, or swapped for RENAME_EXCHANGE.
        replaced: Option<Replaced>,
    },
    SetXattr {
        ino: Ino,
        name: Name,
        value: Vec<u8>,
        attr: Attr,
    },
    RemoveXattr {
        ino: Ino,
        name: Name,
        attr: Attr,
    },
    /// A written slice appended to a chunk.
    WriteSlice {
        ino: Ino,
        chunk: u32,
        slice: SliceRef,
        attr: Attr,
    },
    /// The first `replaced` slices of a chunk are replaced by `slices` (compaction).
    Compact {
        ino: Ino,
        chunk: u32,
        replaced: u32,
        slices: Vec<SliceRef>,
    },
    /// An unlinked inode whose last handle closed is deleted.
    DeleteInode {
        ino: Ino,
    },
    /// The blocks of these dead slices are deleted from the object store.
    PurgeSlices {
        ids: Vec<SliceId>,
    },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Replaced {
    pub ino: Ino,
    pub attr: Attr,
    pub exchange: bool,
    pub unlinked: Unlinked,
}

/// A dead slice waiting for its blocks to be deleted.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct DeadSlice {
    pub size: u32,
    pub freed_ns: i64,
}

impl ChangeRecord {
    /// The highest inode number and the highest slice id this record names (0 for none): a
    /// primary that applies records it lost raises its id counters past them, so it never
    /// hands out an id the log already used.
    pub fn highest_ids(&self) -> (Ino, SliceId) {
        let slices = |s: &[SliceRef]| s.iter().map(|s| s.id).max().unwrap_or(SliceId::HOLE);
        match &self.change {
            Change::Format { .. } => (crate::meta::ROOT_INO, SliceId::HOLE),
            Change::SetAttr { ino, .. }
            | Change::Create { ino, .. }
            | Change::Link { ino, .. }
            | Change::Unlink { ino, .. }
            | Change::Rmdir { ino, .. }
            | Change::SetXattr { ino, .. }
            | Change::RemoveXattr { ino, .. }
            | Change::DeleteInode { ino } => (*ino, SliceId::HOLE),
            Change::Truncate { ino, hole, .. } => (
                *ino,
                hole.as_ref().map(|(_, s)| s.id).unwrap_or(SliceId::HOLE),
            ),
            Change::Rename { ino, replaced, .. } => (
                (*ino).max(replaced.as_ref().map(|r| r.ino).unwrap_or(0)),
                SliceId::HOLE,
            ),
            Change::WriteSlice { ino, slice, .. } => (*ino, slice.id),
            Change::Compact { ino, slices: s, .. } => (*ino, slices(s)),
            Change::PurgeSlices { ids } => (0, ids.iter().copied().max().unwrap_or(SliceId::HOLE)),
        }
    }

    pub fn encode(&self) -> Result<Vec<u8>> {
        let fail = |e: postcard::Error| Error::corrupt(format!("encode change record: {e}"));
        let mut out = postcard::to_stdvec(&(self.ts_ns, &self.change)).map_err(fail)?;
        if let Some(id) = &self.request {
            out.extend(postcard::to_stdvec(id.as_slice()).map_err(fail)?);
        }
        Ok(out)
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        let fail = |e: postcard::Error| Error::corrupt(format!("decode change record: {e}"));
        let ((ts_ns, change), rest): ((i64, Change), _) =
            postcard::take_from_bytes(b).map_err(fail)?;
        let request = if rest.is_empty() {
            None
        } else {
            let (id, rest): (&[u8], _) = postcard::take_from_bytes(rest).map_err(fail)?;
            if id.is_empty() || id.len() > crate::meta::requests::ID_LEN_MAX || !rest.is_empty() {
                return Err(Error::corrupt(format!(
                    "decode change record: a request id of {} bytes (1 to {} allowed), then {} \
                     bytes more",
                    id.len(),
                    crate::meta::requests::ID_LEN_MAX,
                    rest.len()
                )));
            }
            Some(id.to_vec())
        };
        Ok(ChangeRecord {
            ts_ns,
            change,
            request,
        })
    }
}

pub fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    postcard::to_stdvec(v).map_err(|e| Error::corrupt(format!("encode: {e}")))
}

pub fn decode<'a, T: Deserialize<'a>>(b: &'a [u8]) -> Result<T> {
    Ok(postcard::from_bytes(b)?)
}

fn invalid(msg: String) -> Error {
    Error::Corrupt(format!("invalid change record: {msg}"))
}

pub(crate) fn get_attr(t: &mut dyn KvTxn, ino: Ino) -> Result<Option<Attr>> {
    match t.get(&keys::attr(ino))? {
        Some(b) => Ok(Some(decode(&b)?)),
        None => Ok(None),
    }
}

fn put_attr(t: &mut dyn KvTxn, ino: Ino, attr: &Attr) -> Result<()> {
    // Space accounting follows every attribute change, computed from the replica's own state.
    let old = get_attr(t, ino)?.map(|a| a.space()).unwrap_or(0);
    let delta = attr.space() - old;
    if delta != 0 {
        t.add(&keys::counter(keys::USED_SPACE), delta);
    }
    t.put(&keys::attr(ino), &encode(attr)?);
    Ok(())
}

fn need_dir(t: &mut dyn KvTxn, ino: Ino) -> Result<()> {
    match get_attr(t, ino)? {
        Some(a) if a.is_dir() => Ok(()),
        Some(_) => Err(invalid(format!("inode {ino} is not a directory"))),
        None => Err(invalid(format!("directory {ino} does not exist"))),
    }
}

fn need_inode(t: &mut dyn KvTxn, ino: Ino) -> Result<Attr> {
    get_attr(t, ino)?.ok_or_else(|| invalid(format!("inode {ino} does not exist")))
}

fn dentry_value(ino: Ino, kind: FileKind) -> Vec<u8> {
    let mut v = ino.to_be_bytes().to_vec();
    v.push(kind.code());
    v
}

pub(crate) fn decode_dentry(v: &[u8]) -> Result<(Ino, FileKind)> {
    let ino = keys::u64_at(v, 0).ok_or_else(|| Error::corrupt("dentry value too short"))?;
    let kind = v
        .get(8)
        .and_then(|c| FileKind::from_code(*c))
        .ok_or_else(|| Error::corrupt("dentry kind"))?;
    Ok((ino, kind))
}

pub(crate) fn get_dentry(
    t: &mut dyn KvTxn,
    parent: Ino,
    name: &[u8],
) -> Result<Option<(Ino, FileKind)>> {
    match t.get(&keys::dentry(parent, name))? {
        Some(v) => Ok(Some(decode_dentry(&v)?)),
        None => Ok(None),
    }
}

/// The slice list of chunk `idx` of `ino` (empty when it has none).
pub fn get_chunk(t: &mut dyn KvTxn, ino: Ino, idx: u32) -> Result<Vec<SliceRef>> {
    match t.get(&keys::chunk(ino, idx))? {
        Some(b) => decode(&b),
        None => Ok(vec![]),
    }
}

/// Mark every real slice in `slices` dead as of `ts_ns`.
fn free_slices(t: &mut dyn KvTxn, slices: &[SliceRef], ts_ns: i64) -> Result<()> {
    for s in slices.iter().filter(|s| !s.id.is_hole()) {
        let key = keys::deadslice(s.id);
        if t.get(&key)?.is_none() {
            t.put(
                &key,
                &encode(&DeadSlice {
                    size: s.size,
                    freed_ns: ts_ns,
                })?,
            );
        }
    }
    Ok(())
}

/// All chunks of `ino` with index ≥ `from`, as (index, slices).
fn chunks_from(t: &mut dyn KvTxn, ino: Ino, from: u32) -> Result<Vec<(u32, Vec<SliceRef>)>> {
    let prefix = keys::group(keys::CHUNK, ino);
    let start = keys::chunk(ino, from);
    let mut out = vec![];
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = t.scan(&prefix, after.as_deref(), 1000)?;
        let n = page.len();
        for (k, v) in page {
            if k.as_slice() >= start.as_slice() {
                let idx = k
                    .get(9..13)
                    .and_then(|b| b.try_into().ok())
                    .map(u32::from_be_bytes)
                    .ok_or_else(|| Error::corrupt("chunk key"))?;
                out.push((idx, decode(&v)?));
            }
            after = Some(k);
        }
        if n < 1000 {
            return Ok(out);
        }
    }
}

/// Delete an inode and everything hanging off it; its slices become dead.
fn delete_inode(t: &mut dyn KvTxn, ino: Ino, ts_ns: i64) -> Result<()> {
    let Some(attr) = get_attr(t, ino)? else {
        return Ok(());
    };
    for (idx, slices) in chunks_from(t, ino, 0)? {
        free_slices(t, &slices, ts_ns)?;
        t.delete(&keys::chunk(ino, idx));
    }
    let xprefix = keys::group(keys::XATTR, ino);
    for (k, _) in t.scan(&xprefix, None, usize::MAX)? {
        t.delete(&k);
    }
    if attr.kind == FileKind::Symlink {
        t.delete(&keys::symlink(ino));
    }
    t.delete(&keys::delfile(ino));
    t.delete(&keys::flock(ino));
    t.delete(&keys::plock(ino));
    t.add(&keys::counter(keys::USED_SPACE), -attr.space());
    t.add(&keys::counter(keys::TOTAL_INODES), -1);
    t.delete(&keys::attr(ino));
    Ok(())
}

fn settle_unlinked(
    t: &mut dyn KvTxn,
    ino: Ino,
    attr: &Attr,
    how: Unlinked,
    ts_ns: i64,
) -> Result<()> {
    match how {
        Unlinked::Linked => put_attr(t, ino, attr),
        Unlinked::Delete => delete_inode(t, ino, ts_ns),
        Unlinked::Sustain { sid } => {
            put_attr(t, ino, attr)?;
            t.put(&keys::delfile(ino), &sid.to_be_bytes());
            Ok(())
        }
    }
}

/// Apply one change to the state in `t`. The same code runs at the primary (right after it
/// computed the change) and at every replica (when it replays the log).
pub fn apply(t: &mut dyn KvTxn, rec: &ChangeRecord) -> Result<()> {
    let ts = rec.ts_ns;
    match &rec.change {
        Change::Format { format, root } => {
            t.put(&keys::setting(keys::FORMAT), &encode(format)?);
            if get_attr(t, crate::meta::ROOT_INO)?.is_none() {
                t.add(&keys::counter(keys::TOTAL_INODES), 1);
            }
            put_attr(t, crate::meta::ROOT_INO, root)?;
        }
        Change::SetAttr { ino, attr } => {
            need_inode(t, *ino)?;
            put_attr(t, *ino, attr)?;
        }
        Change::Truncate {
            ino,
            attr,
            first_dropped_chunk,
            hole,
        } => {
            let old = need_inode(t, *ino)?;
            if old.kind != FileKind::File {
                return Err(invalid(format!("truncate of non-file inode {ino}")));
            }
            for (idx, slices) in chunks_from(t, *ino, *first_dropped_chunk)? {
                free_slices(t, &slices, ts)?;
                t.delete(&keys::chunk(*ino, idx));
            }
            if let Some((idx, s)) = hole {
                let mut list = get_chunk(t, *ino, *idx)?;
                list.push(s.clone());
                t.put(&keys::chunk(*ino, *idx), &encode(&list)?);
            }
            put_attr(t, *ino, attr)?;
        }
        Change::Create {
            parent,
            name,
            ino,
            attr,
            parent_attr,
            target,
        } => {
            need_dir(t, *parent)?;
            if get_dentry(t, *parent, name)?.is_some() {
                return Err(invalid(format!("create over existing entry in {parent}")));
            }
            if get_attr(t, *ino)?.is_some() {
                return Err(invalid(format!("create of existing inode {ino}")));
            }
            t.put(&keys::dentry(*parent, name), &dentry_value(*ino, attr.kind));
            t.add(&keys::counter(keys::TOTAL_INODES), 1);
            put_attr(t, *ino, attr)?;
            put_attr(t, *parent, parent_attr)?;
            if let Some(target) = target {
                t.put(&keys::symlink(*ino), target);
            }
        }
        Change::Link {
            parent,
            name,
            ino,
            attr,
            parent_attr,
        } => {
            need_dir(t, *parent)?;
            need_inode(t, *ino)?;
            if get_dentry(t, *parent, name)?.is_some() {
                return Err(invalid(format!("link over existing entry in {parent}")));
            }
            t.put(&keys::dentry(*parent, name), &dentry_value(*ino, attr.kind));
            put_attr(t, *ino, attr)?;
            put_attr(t, *parent, parent_attr)?;
        }
        Change::Unlink {
            parent,
            name,
            ino,
            parent_attr,
            attr,
            unlinked,
        } => {
            match get_dentry(t, *parent, name)? {
                Some((i, _)) if i == *ino => {}
                _ => return Err(invalid(format!("unlink of missing entry in {parent}"))),
            }
            t.delete(&keys::dentry(*parent, name));
            put_attr(t, *parent, parent_attr)?;
            settle_unlinked(t, *ino, attr, *unlinked, ts)?;
        }
        Change::Rmdir {
            parent,
            name,
            ino,
            parent_attr,
        } => {
            match get_dentry(t, *parent, name)? {
                Some((i, FileKind::Dir)) if i == *ino => {}
                _ => return Err(invalid(format!("rmdir of missing directory in {parent}"))),
            }
            t.delete(&keys::dentry(*parent, name));
            put_attr(t, *parent, parent_attr)?;
            delete_inode(t, *ino, ts)?;
        }
        Change::Rename {
            src_parent,
            src_name,
            dst_parent,
            dst_name,
            ino,
            attr,
            src_parent_attr,
            dst_parent_attr,
            replaced,
        } => {
            match get_dentry(t, *src_parent, src_name)? {
                Some((i, _)) if i == *ino => {}
                _ => return Err(invalid(format!("rename of missing entry in {src_parent}"))),
            }
            need_dir(t, *dst_parent)?;
            t.delete(&keys::dentry(*src_parent, src_name));
            t.put(
                &keys::dentry(*dst_parent, dst_name),
                &dentry_value(*ino, attr.kind),
            );
            put_attr(t, *ino, attr)?;
            if let Some(r) = replaced {
                if r.exchange {
                    t.put(
                        &keys::dentry(*src_parent, src_name),
                        &dentry_value(r.ino, r.attr.kind),
                    );
                    put_attr(t, r.ino, &r.attr)?;
                } else if r.attr.is_dir() {
                    delete_inode(t, r.ino, ts)?;
                } else {
                    settle_unlinked(t, r.ino, &r.attr, r.unlinked, ts)?;
                }
            }
            put_attr(t, *src_parent, src_parent_attr)?;
            if dst_parent != src_parent {
                put_attr(t, *dst_parent, dst_parent_attr)?;
            }
        }
        Change::SetXattr {
            ino,
            name,
            value,
            attr,
        } => {
            need_inode(t, *ino)?;
            t.put(&keys::xattr(*ino, name), value);
            put_attr(t, *ino, attr)?;
        }
        Change::RemoveXattr { ino, name, attr } => {
            need_inode(t, *ino)?;
            t.delete(&keys::xattr(*ino, name));
            put_attr(t, *ino, attr)?;
        }
        Change::WriteSlice {
            ino,
            chunk,
            slice,
            attr,
        } => {
            let old = need_inode(t, *ino)?;
            if old.kind != FileKind::File {
                return Err(invalid(format!("write to non-file inode {ino}")));
            }
            let mut list = get_chunk(t, *ino, *chunk)?;
            list.push(slice.clone());
            t.put(&keys::chunk(*ino, *chunk), &encode(&list)?);
            put_attr(t, *ino, attr)?;
        }
        Change::Compact {
            ino,
            chunk,
            replaced,
            slices,
        } => {
            need_inode(t, *ino)?;
            let list = get_chunk(t, *ino, *chunk)?;
            let n = *replaced as usize;
            if n > list.len() {
                return Err(invalid(format!(
                    "compaction of {n} slices in a chunk of {}",
                    list.len()
                )));
            }
            let keep_ids: std::collections::HashSet<SliceId> = list[n..]
                .iter()
                .chain(slices.iter())
                .map(|s| s.id)
                .collect();
            let dead: Vec<SliceRef> = list[..n]
                .iter()
                .filter(|s| !keep_ids.contains(&s.id))
                .cloned()
                .collect();
            free_slices(t, &dead, ts)?;
            let mut new_list = slices.clone();
            new_list.extend_from_slice(&list[n..]);
            t.put(&keys::chunk(*ino, *chunk), &encode(&new_list)?);
        }
        Change::DeleteInode { ino } => {
            delete_inode(t, *ino, ts)?;
        }
        Change::PurgeSlices { ids } => {
            for id in ids {
                t.delete(&keys::deadslice(*id));
            }
        }
    }
    Ok(())
}

/// Commit `change` at the primary: apply it and append it to the log in the caller's transaction.
pub fn commit(t: &mut dyn KvTxn, change: Change, ts_ns: i64) -> Result<()> {
    commit_record(
        t,
        &ChangeRecord {
            ts_ns,
            change,
            request: None,
        },
    )
}

/// [`commit`] of a whole record (one that names its request id, too).
pub fn commit_record(t: &mut dyn KvTxn, rec: &ChangeRecord) -> Result<()> {
    apply(t, rec)?;
    t.append_log(rec.encode()?);
    Ok(())
}

/// The version in a change record's key ([`crate::kv::log_key`]).
fn log_version(key: &[u8]) -> Result<Version> {
    keys::u64_at(key, 9)
        .map(Version)
        .ok_or_else(|| Error::corrupt("log key"))
}

/// Read change records with versions in `(after, after + limit]`.
pub fn read_log(
    kv: &dyn crate::kv::KvEngine,
    after: Version,
    limit: usize,
) -> Result<Vec<(Version, ChangeRecord)>> {
    read_log_raw(kv, after, limit)?
        .into_iter()
        .map(|(v, b)| Ok((v, ChangeRecord::decode(&b)?)))
        .collect()
}

/// Read the encoded change records with versions in `(after, after + limit]`, as the shipper
/// sends them.
pub fn read_log_raw(
    kv: &dyn crate::kv::KvEngine,
    after: Version,
    limit: usize,
) -> Result<Vec<(Version, Vec<u8>)>> {
    crate::kv::read(kv, |t| {
        let start = crate::kv::log_key(after);
        let page = t.scan(
            &LOG_GROUP,
            if after == Version::ZERO {
                None
            } else {
                Some(&start)
            },
            limit,
        )?;
        page.into_iter()
            .map(|(k, v)| {
                let version = log_version(&k)?;
                Ok((version, v))
            })
            .collect()
    })
}

/// Delete at most `limit` of the change records with versions in `(after, upto]` (records the
/// replicator has committed), oldest first. `after` is where the last trim stopped, so the
/// scan does not walk over its deletions. Returns how many were deleted; fewer than `limit`
/// means none is left in the range.
pub fn trim_log(
    kv: &dyn crate::kv::KvEngine,
    after: Version,
    upto: Version,
    limit: usize,
) -> Result<usize> {
    let start = crate::kv::log_key(after);
    let (n, _) = crate::kv::txn(kv, |t| {
        let page = t.scan(
            &LOG_GROUP,
            if after == Version::ZERO {
                None
            } else {
                Some(&start)
            },
            limit,
        )?;
        let mut n = 0;
        for (k, _) in page {
            let version = log_version(&k)?;
            if version > upto {
                break;
            }
            t.delete(&k);
            n += 1;
        }
        Ok(n)
    })?;
    Ok(n)
}

/// Replay records into another engine (used by tests and `strait load --changelog`).
pub fn replay(kv: &dyn crate::kv::KvEngine, records: &[(Version, ChangeRecord)]) -> Result<()> {
    for (version, rec) in records {
        let got = kv.txn(&mut |t| {
            apply(t, rec)?;
            t.append_log(rec.encode()?);
            Ok(())
        })?;
        if got != Some(*version) {
            return Err(Error::corrupt(format!(
                "replayed version {version} landed as {got:?}"
            )));
        }
    }
    Ok(())
}

/// Raise the replica's id counters, in its transaction `t`, to at least every inode number
/// and slice id `records` name: a replica promoted to primary then never hands out an id the
/// log already used (the counters came with its snapshot and do not move with the records).
fn raise_id_counters(t: &mut dyn KvTxn, records: &[ChangeRecord]) -> Result<()> {
    let (mut ino, mut slice) = (0u64, SliceId::HOLE);
    for r in records {
        let (i, s) = r.highest_ids();
        ino = ino.max(i);
        slice = slice.max(s);
    }
    for (name, top) in [(keys::NEXT_INODE, ino), (keys::NEXT_SLICE, slice.0)] {
        if top == 0 {
            continue;
        }
        let top = i64::try_from(top)
            .map_err(|_| Error::corrupt(format!("{name}: {top} is out of range")))?;
        let key = keys::counter(name);
        let cur = crate::kv::decode_counter(t.get(&key)?)?;
        if top > cur {
            t.add(&key, top - cur);
        }
    }
    Ok(())
}

/// Why a replica could not apply a batch of records.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// The batch does not start right after the replica's version: applying it would skip
    /// or repeat records.
    #[error("version gap: the replica is at version {at}, the batch starts at {first}")]
    Gap { at: Version, first: Version },
    /// Record `version` is invalid against the replica's state (or the store failed).
    #[error("record {version}: {source}")]
    Record {
        version: Version,
        #[source]
        source: Error,
    },
}

/// Apply records `first_version, first_version + 1, ...` at a replica, in one transaction
/// that also moves the replica's version (the same counter [`crate::kv::KvEngine::last_version`]
/// reads) to the last of them. A crash leaves the replica at the version before or after the
/// whole batch, never in between; nothing is applied twice because the transaction checks
/// that the replica is at `first_version - 1`.
///
/// On an invalid record the whole batch is rolled back and the error names the batch's first
/// version: apply the records one by one to find the one at fault.
pub fn apply_replica(
    kv: &dyn crate::kv::KvEngine,
    first_version: Version,
    records: &[ChangeRecord],
) -> std::result::Result<Version, ReplicaError> {
    apply_replica_with(kv, first_version, records, &|_, _, _| Ok(()))
}

/// What a replica does beside each record, in the same transaction, before the record is
/// applied (it sees the state before): a mirror queues the blocks the record brings.
pub type ReplicaHook<'a> =
    &'a (dyn Fn(&mut dyn KvTxn, Version, &ChangeRecord) -> Result<()> + Sync);

/// [`apply_replica`] with `hook` called for each record (with its version) inside the
/// transaction: what the hook writes commits or rolls back with the records.
pub fn apply_replica_with(
    kv: &dyn crate::kv::KvEngine,
    first_version: Version,
    records: &[ChangeRecord],
    hook: ReplicaHook<'_>,
) -> std::result::Result<Version, ReplicaError> {
    let n = records.len() as u64;
    if n == 0 {
        return Ok(Version(first_version.0.saturating_sub(1)));
    }
    let mut gap = None;
    let r = kv.txn(&mut |t| {
        gap = None;
        let at = crate::snapshot::version_in(t)?;
        if at.next() != first_version {
            gap = Some(at);
            return Err(Error::Invalid("version gap".into()));
        }
        for (i, rec) in records.iter().enumerate() {
            let version = first_version + i as u64;
            hook(t, version, rec)?;
            apply(t, rec)?;
            if let Some(id) = &rec.request {
                let outcome = crate::meta::requests::Outcome::of(&rec.change);
                crate::meta::requests::put_record(t, id, rec.ts_ns, &outcome, Some(version))?;
            }
        }
        raise_id_counters(t, records)?;
        t.add(crate::kv::LAST_VERSION_KEY, n as i64);
        Ok(())
    });
    match (r, gap) {
        (Ok(_), _) => Ok(first_version + (n - 1)),
        (Err(_), Some(at)) => Err(ReplicaError::Gap {
            at,
            first: first_version,
        }),
        (Err(e), None) => Err(ReplicaError::Record {
            version: first_version,
            source: e,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records and chunk lists written before slice ids had a type of their own read back
    /// the same, and new ones are written byte for byte as before.
    #[test]
    fn slice_ids_encode_as_the_bare_u64_they_were() {
        // a purge record, as postcard wrote it with `ids: Vec<u64>`: ts 5 (zigzag 10),
        // variant 13, two ids, 1 and 300 (varint ac 02)
        let before = [0x0a, 0x0d, 0x02, 0x01, 0xac, 0x02];
        let rec = ChangeRecord {
            ts_ns: 5,
            change: Change::PurgeSlices {
                ids: vec![SliceId(1), SliceId(300)],
            },
            request: None,
        };
        assert_eq!(rec.encode().unwrap(), before);
        assert_eq!(ChangeRecord::decode(&before).unwrap(), rec);

        // with a request id: the same bytes, then the id (length 3, "m-1")
        let named = ChangeRecord {
            request: Some(b"m-1".to_vec()),
            ..rec.clone()
        };
        let bytes = named.encode().unwrap();
        assert_eq!(bytes[..before.len()], before);
        assert_eq!(bytes[before.len()..], [0x03, b'm', b'-', b'1']);
        assert_eq!(ChangeRecord::decode(&bytes).unwrap(), named);
        // a reader that knows nothing of ids reads the change
        let (ts, change): (i64, Change) = postcard::from_bytes(&bytes).unwrap();
        assert_eq!((ts, change), (rec.ts_ns, rec.change.clone()));
        // an id out of bounds, or bytes after it: corrupt
        let mut long = before.to_vec();
        long.push(65);
        long.extend([b'x'; 65]);
        let mut after = bytes.clone();
        after.push(0);
        let mut empty = before.to_vec();
        empty.push(0);
        for bad in [long, after, empty, bytes[..bytes.len() - 1].to_vec()] {
            let e = ChangeRecord::decode(&bad).expect_err("corrupt");
            assert!(e.to_string().contains("decode change record"), "{e}");
        }

        // a slice reference beside the struct it was with a u64 id
        #[derive(Serialize)]
        struct SliceRefU64 {
            id: u64,
            size: u32,
            off: u32,
            len: u32,
            pos: u32,
            crcs: Vec<u32>,
        }
        let old = SliceRefU64 {
            id: 1 << 33,
            size: 10,
            off: 1,
            len: 9,
            pos: 4,
            crcs: vec![0xdead_beef],
        };
        let new = SliceRef {
            id: SliceId(1 << 33),
            size: 10,
            off: 1,
            len: 9,
            pos: 4,
            crcs: vec![0xdead_beef],
        };
        let bytes = encode(&vec![old]).unwrap();
        assert_eq!(encode(&vec![new.clone()]).unwrap(), bytes);
        assert_eq!(decode::<Vec<SliceRef>>(&bytes).unwrap(), vec![new]);
    }
}
