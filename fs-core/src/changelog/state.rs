//! The metadata state machine: [`apply`] one record to the state in a transaction, with the
//! key-value helpers it shares with the engine and the snapshot walk.

use super::quota::{self, QuotaDeltas};
use super::record::{
    decode, encode, Change, ChangeRecord, CloneJob, DeadSlice, TrashEntry, Unlinked,
};
use crate::error::{Error, Result};
use crate::kv::{decode_counter, KvTxn};
use crate::meta::keys;
use crate::meta::types::{Attr, FileKind, Ino, SliceRef};
use crate::SliceId;

fn invalid(msg: String) -> Error {
    Error::Corrupt(format!("invalid change record: {msg}"))
}

pub(crate) fn get_attr(t: &mut dyn KvTxn, ino: Ino) -> Result<Option<Attr>> {
    match t.get(&keys::attr(ino))? {
        Some(b) => Ok(Some(decode(&b)?)),
        None => Ok(None),
    }
}

fn put_attr(t: &mut dyn KvTxn, q: &mut QuotaDeltas, ino: Ino, attr: &Attr) -> Result<()> {
    // Space accounting follows every attribute change, computed from the replica's own state,
    // and so do the quotas above the inode.
    let old = get_attr(t, ino)?;
    let delta = attr.space() - old.as_ref().map(|a| a.space()).unwrap_or(0);
    if delta != 0 {
        t.add(&keys::counter(keys::USED_SPACE), delta);
    }
    q.note(t, old.as_ref(), Some(attr))?;
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

/// The distinct real slices of a chunk list (a list may name one slice more than once).
fn distinct(slices: &[SliceRef]) -> Vec<&SliceRef> {
    let mut seen = std::collections::HashSet::new();
    slices
        .iter()
        .filter(|s| !s.id.is_hole() && seen.insert(s.id))
        .collect()
}

/// How many chunk lists beyond the first name slice `id` ([`keys::SLICEREF`]).
pub(crate) fn slice_extra_refs(t: &mut dyn KvTxn, id: SliceId) -> Result<i64> {
    decode_counter(t.get(&keys::sliceref(id))?)
}

/// One more chunk list names every slice of `slices` (a clone's copy of a chunk).
fn share_slices(t: &mut dyn KvTxn, slices: &[SliceRef]) -> Result<()> {
    for s in distinct(slices) {
        let n = slice_extra_refs(t, s.id)? + 1;
        t.put(&keys::sliceref(s.id), &n.to_le_bytes());
    }
    Ok(())
}

/// A chunk list lets go of the slices in `slices`: each one no other list names is dead as
/// of `ts_ns`; the others lose a reference.
fn free_slices(t: &mut dyn KvTxn, slices: &[SliceRef], ts_ns: i64) -> Result<()> {
    for s in distinct(slices) {
        let extra = slice_extra_refs(t, s.id)?;
        if extra > 0 {
            let k = keys::sliceref(s.id);
            if extra == 1 {
                t.delete(&k);
            } else {
                t.put(&k, &(extra - 1).to_le_bytes());
            }
            continue;
        }
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

/// Delete an inode and everything hanging off it (a directory's quota too); its slices
/// become dead.
fn delete_inode(t: &mut dyn KvTxn, q: &mut QuotaDeltas, ino: Ino, ts_ns: i64) -> Result<()> {
    let Some(attr) = get_attr(t, ino)? else {
        return Ok(());
    };
    q.note(t, Some(&attr), None)?;
    if attr.kind == FileKind::Dir {
        quota::delete(t, ino)?;
    }
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
    t.delete(&keys::trash(ino));
    t.delete(&keys::flock(ino));
    t.delete(&keys::plock(ino));
    t.add(&keys::counter(keys::USED_SPACE), -attr.space());
    t.add(&keys::counter(keys::TOTAL_INODES), -1);
    t.delete(&keys::attr(ino));
    Ok(())
}

/// What becomes of `ino` (`attr` as after the change) that lost the name `name` in
/// directory `parent`.
fn settle_unlinked(
    t: &mut dyn KvTxn,
    q: &mut QuotaDeltas,
    (ino, attr): (Ino, &Attr),
    (parent, name): (Ino, &[u8]),
    how: Unlinked,
    ts_ns: i64,
) -> Result<()> {
    match how {
        Unlinked::Linked => put_attr(t, q, ino, attr),
        Unlinked::Delete => delete_inode(t, q, ino, ts_ns),
        Unlinked::Sustain { sid } => {
            put_attr(t, q, ino, attr)?;
            t.put(&keys::delfile(ino), &sid.to_be_bytes());
            Ok(())
        }
        Unlinked::Trash => {
            if attr.nlink != 0 {
                return Err(invalid(format!(
                    "inode {ino} to the trash with {} links",
                    attr.nlink
                )));
            }
            // nlink 0: it counts towards no quota any more
            put_attr(t, q, ino, attr)?;
            if attr.is_dir() {
                // a restored directory comes back without one
                quota::delete(t, ino)?;
            }
            let entry = TrashEntry {
                parent,
                name: name.to_vec(),
                deleted_ns: ts_ns,
            };
            t.put(&keys::trash(ino), &encode(&entry)?);
            Ok(())
        }
    }
}

/// The clone being made under `root`, if there is one.
pub(crate) fn get_clone(t: &mut dyn KvTxn, root: Ino) -> Result<Option<CloneJob>> {
    match t.get(&keys::clone_job(root))? {
        Some(b) => Ok(Some(decode(&b)?)),
        None => Ok(None),
    }
}

fn need_clone(t: &mut dyn KvTxn, root: Ino) -> Result<CloneJob> {
    get_clone(t, root)?.ok_or_else(|| invalid(format!("no clone is being made under {root}")))
}

/// Make `ino` a copy of `src` as it is now, in directory `parent` of a clone (0: the clone's
/// root, nameless), owned as `job` says: its attributes (one link, a directory two; the
/// change time now), chunks (sharing their slices), symlink target and xattrs.
fn copy_inode(
    t: &mut dyn KvTxn,
    q: &mut QuotaDeltas,
    job: &CloneJob,
    (src, ino, parent): (Ino, Ino, Ino),
    ts_ns: i64,
) -> Result<Attr> {
    let a = need_inode(t, src)?;
    if get_attr(t, ino)?.is_some() {
        return Err(invalid(format!("clone onto existing inode {ino}")));
    }
    let mut n = a.clone();
    n.parent = parent;
    n.nlink = if a.is_dir() { 2 } else { 1 };
    n.ctime_ns = ts_ns;
    if !job.preserve {
        if a.uid != job.uid {
            // as cp: a copy made by another user is no set-user-ID (nor set-group-ID) program
            n.perm &= !0o4000;
            if !a.is_dir() {
                n.perm &= !0o2000;
            }
        }
        n.uid = job.uid;
        n.gid = job.gid;
    }
    t.add(&keys::counter(keys::TOTAL_INODES), 1);
    put_attr(t, q, ino, &n)?;
    match a.kind {
        FileKind::File => {
            for (idx, slices) in chunks_from(t, src, 0)? {
                share_slices(t, &slices)?;
                t.put(&keys::chunk(ino, idx), &encode(&slices)?);
            }
        }
        FileKind::Symlink => {
            if let Some(target) = t.get(&keys::symlink(src))? {
                t.put(&keys::symlink(ino), &target);
            }
        }
        _ => {}
    }
    let from = keys::group(keys::XATTR, src);
    for (k, v) in t.scan(&from, None, usize::MAX)? {
        t.put(&keys::xattr(ino, &k[from.len()..]), &v);
    }
    Ok(n)
}

/// The trash entry of `ino`, if it is in the trash.
pub(crate) fn get_trash(t: &mut dyn KvTxn, ino: Ino) -> Result<Option<TrashEntry>> {
    match t.get(&keys::trash(ino))? {
        Some(b) => Ok(Some(decode(&b)?)),
        None => Ok(None),
    }
}

/// The file system's trash retention, in days (0: no trash).
pub(crate) fn trash_days(t: &mut dyn KvTxn) -> Result<u32> {
    match t.get(&keys::setting(keys::TRASH_DAYS))? {
        None => Ok(crate::meta::TRASH_DAYS_DEFAULT),
        Some(b) => b
            .as_slice()
            .try_into()
            .map(u32::from_be_bytes)
            .map_err(|_| Error::corrupt("the trash_days setting is not 4 bytes")),
    }
}

/// Apply one change to the state in `t`. The same code runs at the primary (right after it
/// computed the change) and at every replica (when it replays the log).
pub fn apply(t: &mut dyn KvTxn, rec: &ChangeRecord) -> Result<()> {
    apply_with(t, rec, false)
}

/// [`apply`]; with `enforce` (the primary committing the change), a change the directory
/// quotas do not allow is refused: EDQUOT past a limit, EXDEV for a directory moved between
/// different quotas ([`super::quota`]).
pub fn apply_with(t: &mut dyn KvTxn, rec: &ChangeRecord, enforce: bool) -> Result<()> {
    let mut q = QuotaDeltas::default();
    apply_change(t, rec, &mut q, enforce)?;
    q.finish(t, enforce)
}

fn apply_change(
    t: &mut dyn KvTxn,
    rec: &ChangeRecord,
    q: &mut QuotaDeltas,
    enforce: bool,
) -> Result<()> {
    let ts = rec.ts_ns;
    match &rec.change {
        Change::Format { format, root } => {
            t.put(&keys::setting(keys::FORMAT), &encode(format)?);
            if get_attr(t, crate::meta::ROOT_INO)?.is_none() {
                t.add(&keys::counter(keys::TOTAL_INODES), 1);
            }
            put_attr(t, q, crate::meta::ROOT_INO, root)?;
        }
        Change::SetAttr { ino, attr } => {
            need_inode(t, *ino)?;
            put_attr(t, q, *ino, attr)?;
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
            put_attr(t, q, *ino, attr)?;
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
            put_attr(t, q, *ino, attr)?;
            put_attr(t, q, *parent, parent_attr)?;
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
            let old = need_inode(t, *ino)?;
            if get_dentry(t, *parent, name)?.is_some() {
                return Err(invalid(format!("link over existing entry in {parent}")));
            }
            // a file counts under its own directory's quotas: a name under other quotas
            // would let it stay there uncounted once its first name goes (as XFS refuses
            // links across project quotas)
            if enforce && !q.same_quotas(t, old.parent, *parent)? {
                return Err(Error::Sys(libc::EXDEV));
            }
            t.put(&keys::dentry(*parent, name), &dentry_value(*ino, attr.kind));
            put_attr(t, q, *ino, attr)?;
            put_attr(t, q, *parent, parent_attr)?;
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
            put_attr(t, q, *parent, parent_attr)?;
            settle_unlinked(t, q, (*ino, attr), (*parent, name), *unlinked, ts)?;
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
            put_attr(t, q, *parent, parent_attr)?;
            delete_inode(t, q, *ino, ts)?;
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
            // a directory's subtree (the moved one, or the one an exchange moves back) would
            // leave some quotas and enter others uncounted
            let moves_a_dir = attr.kind == FileKind::Dir
                || replaced
                    .as_ref()
                    .is_some_and(|r| r.exchange && r.attr.kind == FileKind::Dir);
            if enforce && moves_a_dir && !q.same_quotas(t, *src_parent, *dst_parent)? {
                return Err(Error::Sys(libc::EXDEV));
            }
            t.delete(&keys::dentry(*src_parent, src_name));
            t.put(
                &keys::dentry(*dst_parent, dst_name),
                &dentry_value(*ino, attr.kind),
            );
            put_attr(t, q, *ino, attr)?;
            if let Some(r) = replaced {
                if r.exchange {
                    t.put(
                        &keys::dentry(*src_parent, src_name),
                        &dentry_value(r.ino, r.attr.kind),
                    );
                    put_attr(t, q, r.ino, &r.attr)?;
                } else if r.attr.is_dir() {
                    delete_inode(t, q, r.ino, ts)?;
                } else {
                    settle_unlinked(
                        t,
                        q,
                        (r.ino, &r.attr),
                        (*dst_parent, dst_name),
                        r.unlinked,
                        ts,
                    )?;
                }
            }
            put_attr(t, q, *src_parent, src_parent_attr)?;
            if dst_parent != src_parent {
                put_attr(t, q, *dst_parent, dst_parent_attr)?;
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
            put_attr(t, q, *ino, attr)?;
        }
        Change::RemoveXattr { ino, name, attr } => {
            need_inode(t, *ino)?;
            t.delete(&keys::xattr(*ino, name));
            put_attr(t, q, *ino, attr)?;
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
            put_attr(t, q, *ino, attr)?;
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
            delete_inode(t, q, *ino, ts)?;
        }
        Change::PurgeSlices { ids } => {
            for id in ids {
                t.delete(&keys::deadslice(*id));
            }
        }
        Change::SetQuota { ino, limits, usage } => {
            need_dir(t, *ino)?;
            quota::set(t, *ino, limits, *usage)?;
        }
        Change::DeleteQuota { ino } => {
            quota::delete(t, *ino)?;
        }
        Change::Restore {
            ino,
            parent,
            name,
            attr,
            parent_attr,
        } => {
            need_dir(t, *parent)?;
            need_inode(t, *ino)?;
            if get_trash(t, *ino)?.is_none() {
                return Err(invalid(format!("restore of inode {ino}, not in the trash")));
            }
            if get_dentry(t, *parent, name)?.is_some() {
                return Err(invalid(format!("restore over existing entry in {parent}")));
            }
            t.delete(&keys::trash(*ino));
            t.put(&keys::dentry(*parent, name), &dentry_value(*ino, attr.kind));
            // nlink 0 to 1: it counts towards the quotas above its directory again
            put_attr(t, q, *ino, attr)?;
            put_attr(t, q, *parent, parent_attr)?;
        }
        Change::PurgeTrash { ino, unlinked } => {
            if get_trash(t, *ino)?.is_none() {
                return Err(invalid(format!("purge of inode {ino}, not in the trash")));
            }
            t.delete(&keys::trash(*ino));
            match unlinked {
                Unlinked::Delete => delete_inode(t, q, *ino, ts)?,
                Unlinked::Sustain { sid } => t.put(&keys::delfile(*ino), &sid.to_be_bytes()),
                other => {
                    return Err(invalid(format!(
                        "purge of inode {ino} from the trash as {other:?}"
                    )))
                }
            }
        }
        Change::SetTrashDays { days } => {
            t.put(&keys::setting(keys::TRASH_DAYS), &days.to_be_bytes());
        }
        Change::CloneBegin {
            root,
            src,
            parent,
            name,
            uid,
            gid,
            preserve,
            token,
        } => {
            need_dir(t, *parent)?;
            if get_clone(t, *root)?.is_some() {
                return Err(invalid(format!("a clone is already made under {root}")));
            }
            let mut job = CloneJob {
                src: *src,
                parent: *parent,
                name: name.0.clone(),
                uid: *uid,
                gid: *gid,
                preserve: *preserve,
                token: *token,
                started_ns: ts,
                touched_ns: ts,
                space: 0,
                inodes: 0,
                stack: vec![],
                dropping: false,
            };
            // nameless until attached: it counts towards no quota (its directory is none)
            let a = copy_inode(t, q, &job, (*src, *root, 0), ts)?;
            if a.is_dir() {
                job.stack.push(super::record::CloneFrame {
                    src: *src,
                    dst: *root,
                    after: None,
                });
            }
            t.put(&keys::clone_job(*root), &encode(&job)?);
        }
        Change::CloneStep { root, items, stack } => {
            let mut job = need_clone(t, *root)?;
            if job.dropping {
                return Err(invalid(format!("a step of clone {root}, being dropped")));
            }
            for i in items {
                need_dir(t, i.parent)?;
                if get_dentry(t, i.parent, &i.name)?.is_some() {
                    return Err(invalid(format!(
                        "clone over existing entry in {}",
                        i.parent
                    )));
                }
                let a = copy_inode(t, q, &job, (i.src, i.ino, i.parent), ts)?;
                t.put(
                    &keys::dentry(i.parent, &i.name),
                    &dentry_value(i.ino, a.kind),
                );
                if a.is_dir() {
                    let mut pa = need_inode(t, i.parent)?;
                    pa.nlink += 1;
                    put_attr(t, q, i.parent, &pa)?;
                }
                job.space += a.space();
                job.inodes += 1;
            }
            job.stack = stack.clone();
            job.touched_ns = ts;
            t.put(&keys::clone_job(*root), &encode(&job)?);
        }
        Change::CloneAttach { root, parent_attr } => {
            let job = need_clone(t, *root)?;
            if job.dropping || !job.stack.is_empty() {
                return Err(invalid(format!("attach of unfinished clone {root}")));
            }
            need_dir(t, job.parent)?;
            if get_dentry(t, job.parent, &job.name)?.is_some() {
                return Err(invalid(format!(
                    "attach of clone {root} over existing entry in {}",
                    job.parent
                )));
            }
            let mut a = need_inode(t, *root)?;
            a.parent = job.parent;
            t.put(
                &keys::dentry(job.parent, &job.name),
                &dentry_value(*root, a.kind),
            );
            // the root moves its own share under the quotas above; its tree's follows
            put_attr(t, q, *root, &a)?;
            q.add_under(t, job.parent, (job.space, job.inodes))?;
            put_attr(t, q, job.parent, parent_attr)?;
            t.delete(&keys::clone_job(*root));
        }
        Change::CloneDrop {
            root,
            entries,
            root_too,
        } => {
            let mut job = need_clone(t, *root)?;
            job.dropping = true;
            for (parent, name) in entries {
                let Some((ino, kind)) = get_dentry(t, *parent, name)? else {
                    return Err(invalid(format!("drop of missing entry in {parent}")));
                };
                if kind == FileKind::Dir && dir_has_entries(t, ino)? {
                    return Err(invalid(format!("drop of non-empty directory {ino}")));
                }
                t.delete(&keys::dentry(*parent, name));
                if kind == FileKind::Dir {
                    let mut pa = need_inode(t, *parent)?;
                    pa.nlink = pa.nlink.saturating_sub(1);
                    put_attr(t, q, *parent, &pa)?;
                }
                delete_inode(t, q, ino, ts)?;
            }
            if *root_too {
                let a = need_inode(t, *root)?;
                if a.is_dir() && dir_has_entries(t, *root)? {
                    return Err(invalid(format!("drop of non-empty clone root {root}")));
                }
                delete_inode(t, q, *root, ts)?;
                t.delete(&keys::clone_job(*root));
            } else {
                t.put(&keys::clone_job(*root), &encode(&job)?);
            }
        }
    }
    Ok(())
}

fn dir_has_entries(t: &mut dyn KvTxn, ino: Ino) -> Result<bool> {
    Ok(!t.scan(&keys::group(keys::DENTRY, ino), None, 1)?.is_empty())
}
