//! Clones (docs/operations.md, "Clones"): `strait clone SRC DST` copies a file or a tree in
//! the metadata only. The copies' chunks name their sources' slices, and a slice's reference
//! count ([`crate::meta::keys::SLICEREF`]) keeps it alive until the last chunk list that names
//! it lets it go, so GC, the mirrors' horizons and the orphan sweep need nothing new: a
//! mirror receives a clone as change records and copies no byte for it.
//!
//! A tree is copied in steps, each one change record of at most [`STEP_ITEMS_MAX`] inodes,
//! under a root with no name yet ([`crate::changelog::CloneJob`], `I 0 root`, a root of every
//! snapshot walk): DST appears whole when the last step attaches the root at its name, or
//! never. Each inode is copied as its source is at the version of its step (a file's bytes
//! are the bytes its source had then); a tree changed while it is cloned may mix versions
//! across files, as `cp -r` would.
//!
//! The call is `setxattr(SRC, "strait.clone", "parent=INO preserve=0|1 job=TOKEN name=NAME")`:
//! it works through every mount, and a mirror forwards it to the primary as every change. One
//! call does what fits in [`CALL_BUDGET`] and answers EINPROGRESS when more is left; the same
//! call again (the same TOKEN, which the caller picks at random for each clone) goes on with
//! the same clone. A clone whose caller stopped calling for [`IDLE_MAX_NS`], or that failed
//! (EACCES on a source, EDQUOT, EEXIST at its name), is dropped, step by step, by the call
//! that failed and by the GC passes.
//!
//! # To ensure correctness
//! - Only the attach commits with the call's request id: a call sent again after a lost
//!   answer (a switchover) is answered "done" from the record only when the clone is at its
//!   name; otherwise it runs again and goes on with the clone.
//! - A call goes on only with the clone of its own token: one left by an earlier call that
//!   never finished (its mount killed) was copied at an earlier version, and is never
//!   attached in place of a clone asked for later.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{check_name, need_attr, need_live_dir, touch_dir, Meta};
use crate::changelog::{
    decode_dentry, get_clone, get_dentry, quota, Change, CloneFrame, CloneItem, CloneJob,
};
use crate::clock::now_ns;
use crate::error::{sys, Error, Result};
use crate::kv::{self, KvTxn};
use crate::meta::keys;
use crate::meta::perm::{access, MAY_EXEC, MAY_READ, MAY_WRITE};
use crate::meta::types::*;
use crate::meta::Committed;

/// The virtual xattrs of clones:
/// - `strait.clone` (set, on the source): `parent=INO preserve=0|1 job=TOKEN name=NAME`
///   (the name last, whole): clone it as NAME in directory INO. 0 when the clone is at its
///   name; EINPROGRESS when more is left (set it again, with the same TOKEN, to go on).
/// - `strait.clone.jobs` (get, anywhere): the clones being made that the caller may see
///   (root: every one), a line each: `root=INO src=INO parent=INO inodes=N space=N
///   dropping=0|1 job=TOKEN name=NAME`.
pub mod clone_xattr {
    pub const PREFIX: &[u8] = b"strait.clone";
    pub const CLONE: &[u8] = b"strait.clone";
    pub const JOBS: &[u8] = b"strait.clone.jobs";
}

/// Most inodes one step (one change record) copies.
pub const STEP_ITEMS_MAX: usize = 1000;
/// Most bytes of names one step carries.
const STEP_NAME_BYTES_MAX: usize = 128 << 10;
/// How long one call works before it answers EINPROGRESS (well under a mount's call
/// timeout).
pub const CALL_BUDGET: Duration = Duration::from_secs(5);
/// A clone nobody added to for this long is dropped by the GC passes.
pub const IDLE_MAX_NS: i64 = 10 * 60 * 1_000_000_000;
/// Most entries one drop step deletes.
const DROP_ITEMS_MAX: usize = 1000;
/// How often a GC pass looks for clones to drop.
const SWEEP_EVERY_NS: i64 = 60 * 1_000_000_000;

/// Where a clone stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloneProgress {
    pub root: Ino,
    /// Inodes and space copied under the root so far.
    pub inodes: i64,
    pub space: i64,
    /// At its name.
    pub done: bool,
}

/// One clone being made, as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloneListing {
    pub root: Ino,
    pub job: CloneJob,
}

/// What a step did.
enum Step {
    More,
    Attached(CloneProgress),
}

/// Whether `ctx` may copy `a`: read a file's bytes, read and search a directory.
fn may_copy(a: &Attr, ctx: &Ctx) -> Result<()> {
    match a.kind {
        FileKind::Dir => access(a, ctx, MAY_READ | MAY_EXEC),
        FileKind::File => access(a, ctx, MAY_READ),
        _ => Ok(()),
    }
}

/// Every clone being made, by root.
fn all_jobs(t: &mut dyn KvTxn) -> Result<Vec<CloneListing>> {
    let mut out = vec![];
    for (k, v) in t.scan(&keys::group(keys::CLONE, 0), None, usize::MAX)? {
        let root = keys::u64_at(&k, 9).ok_or_else(|| Error::corrupt("clone key"))?;
        out.push(CloneListing {
            root,
            job: crate::changelog::decode(&v)?,
        });
    }
    Ok(out)
}

/// Refuse a clone past the quotas above `parent` once it holds `space` and `inodes` (EDQUOT):
/// the attach would be refused, so the clone stops early.
fn check_quotas(t: &mut dyn KvTxn, parent: Ino, space: i64, inodes: i64) -> Result<()> {
    for q in quota::above(t, parent)? {
        let Some(cur) = quota::get(t, q)? else {
            continue;
        };
        let over = |used: i64, add: i64, max: u64| max > 0 && used.saturating_add(add) > max as i64;
        if over(cur.used_space, space, cur.limits.space_max)
            || over(cur.used_inodes, inodes, cur.limits.inodes_max)
        {
            return sys(libc::EDQUOT);
        }
    }
    Ok(())
}

impl Meta {
    /// Clone `src` as `name` in directory `parent` for `ctx` (with `preserve`, root only: the
    /// copies keep their sources' owners), or go on with the clone of it there that `ctx`
    /// began. Works for up to `budget`; EINPROGRESS when more is left. Errors: EEXIST (the
    /// name is taken), EACCES (a source `ctx` may not read, or the directory not writable),
    /// EDQUOT, ENOENT, EPERM (`preserve` by another than root; the trash).
    pub fn clone_versioned(
        &self,
        ctx: &Ctx,
        src: Ino,
        (parent, name): (Ino, &[u8]),
        (preserve, token): (bool, u64),
        budget: Duration,
    ) -> Result<Committed<CloneProgress>> {
        self.writable()?;
        check_name(name)?;
        if name == b"." || name == b".." || (parent == ROOT_INO && name == TRASH_NAME) {
            return sys(libc::EEXIST);
        }
        if preserve && ctx.uid != 0 {
            return sys(libc::EPERM);
        }
        if src == TRASH_INO || parent == TRASH_INO {
            return sys(libc::EPERM);
        }
        let start = Instant::now();
        let root = match self.find_clone(ctx, src, (parent, name), token)? {
            Some(root) => root,
            None => self.begin_clone(ctx, src, (parent, name), (preserve, token))?,
        };
        loop {
            match self.clone_step(ctx, root) {
                Ok((Step::Attached(p), version)) => return Ok(Committed::new(p, version)),
                Ok((Step::More, _)) if start.elapsed() >= budget => return sys(libc::EINPROGRESS),
                Ok((Step::More, _)) => {}
                Err(e) => {
                    if matches!(e, Error::Sys(libc::EACCES | libc::EDQUOT | libc::EEXIST)) {
                        // given up: what was copied goes now, or at the next GC passes
                        let left = budget.saturating_sub(start.elapsed());
                        if let Err(d) = self.drop_clone(root, left.max(Duration::from_secs(1))) {
                            tracing::warn!("dropping clone {root}: {d}");
                        }
                    }
                    return Err(e);
                }
            }
        }
    }

    /// The caller's clone `token` of `src` to `parent/name` being made, if there is one.
    fn find_clone(
        &self,
        ctx: &Ctx,
        src: Ino,
        (parent, name): (Ino, &[u8]),
        token: u64,
    ) -> Result<Option<Ino>> {
        let jobs = kv::read(self.kv.as_ref(), all_jobs)?;
        Ok(jobs
            .into_iter()
            .find(|l| {
                let j = &l.job;
                j.token == token
                    && j.src == src
                    && j.parent == parent
                    && j.name == name
                    && j.uid == ctx.uid
                    && !j.dropping
            })
            .map(|l| l.root))
    }

    /// Commit a change of a clone that does not finish it: never with the call's request id
    /// (see the module's correctness rules).
    fn commit_part(&self, t: &mut dyn KvTxn, change: Change, ts_ns: i64) -> Result<()> {
        crate::changelog::commit(t, change, ts_ns)
    }

    fn begin_clone(
        &self,
        ctx: &Ctx,
        src: Ino,
        (parent, name): (Ino, &[u8]),
        (preserve, token): (bool, u64),
    ) -> Result<Ino> {
        let root = self.next_inode()?;
        kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let sa = need_attr(t, src)?;
            if sa.nlink == 0 {
                // unlinked, or in the trash
                return sys(libc::ENOENT);
            }
            may_copy(&sa, ctx)?;
            let pa = need_live_dir(t, parent)?;
            access(&pa, ctx, MAY_WRITE | MAY_EXEC)?;
            if get_dentry(t, parent, name)?.is_some() {
                return sys(libc::EEXIST);
            }
            check_quotas(t, parent, sa.space(), 1)?;
            self.commit_part(
                t,
                Change::CloneBegin {
                    root,
                    src,
                    parent,
                    name: name.into(),
                    uid: ctx.uid,
                    gid: ctx.gid,
                    preserve,
                    token,
                },
                now,
            )
        })?;
        Ok(root)
    }

    /// One step of the clone under `root`: the next inodes of its source, or, when the walk
    /// is done, the attach.
    fn clone_step(&self, ctx: &Ctx, root: Ino) -> Result<(Step, Option<crate::Version>)> {
        // inode numbers for the step, taken outside the transaction (a retry reuses them);
        // none for the attach
        let walking = kv::read(self.kv.as_ref(), |t| get_clone(t, root))?
            .is_some_and(|j| !j.stack.is_empty());
        let mut inos = Vec::with_capacity(STEP_ITEMS_MAX);
        for _ in 0..if walking { STEP_ITEMS_MAX } else { 0 } {
            inos.push(self.next_inode()?);
        }
        let done = kv::txn(self.kv.as_ref(), |t| {
            let now = now_ns();
            let job = get_clone(t, root)?.ok_or(Error::Sys(libc::ENOENT))?;
            if job.dropping {
                return sys(libc::ENOENT);
            }
            let root_attr = need_attr(t, root)?;
            if job.stack.is_empty() {
                let mut pa = need_live_dir(t, job.parent)?;
                access(&pa, ctx, MAY_WRITE | MAY_EXEC)?;
                if get_dentry(t, job.parent, &job.name)?.is_some() {
                    return sys(libc::EEXIST);
                }
                if root_attr.is_dir() {
                    pa.nlink += 1;
                }
                touch_dir(&mut pa, now);
                // the quotas above refuse it here (EDQUOT) when it does not fit
                self.commit(
                    t,
                    Change::CloneAttach {
                        root,
                        parent_attr: pa,
                    },
                    now,
                )?;
                return Ok(Step::Attached(CloneProgress {
                    root,
                    inodes: job.inodes + 1,
                    space: job.space + root_attr.space(),
                    done: true,
                }));
            }
            if inos.is_empty() {
                // it was at its attach when the numbers were taken: take them again
                return Ok(Step::More);
            }
            let (items, stack) = self.walk_source(t, ctx, job.stack.clone(), &inos)?;
            let (mut space, mut inodes) = (0i64, 0i64);
            for i in &items {
                space += need_attr(t, i.src)?.space();
                inodes += 1;
            }
            check_quotas(
                t,
                job.parent,
                root_attr.space() + job.space + space,
                1 + job.inodes + inodes,
            )?;
            self.commit_part(t, Change::CloneStep { root, items, stack }, now)?;
            Ok(Step::More)
        });
        let committed = Committed::from(done?);
        Ok((committed.value, committed.version))
    }

    /// The next inodes of a clone's source from where `stack` stands, depth first (a
    /// directory's subtree before its next names): at most one per number in `inos`.
    fn walk_source(
        &self,
        t: &mut dyn KvTxn,
        ctx: &Ctx,
        mut stack: Vec<CloneFrame>,
        inos: &[Ino],
    ) -> Result<(Vec<CloneItem>, Vec<CloneFrame>)> {
        let mut items: Vec<CloneItem> = vec![];
        let mut name_bytes = 0usize;
        while items.len() < inos.len() && name_bytes < STEP_NAME_BYTES_MAX {
            let Some(top) = stack.last().cloned() else {
                break;
            };
            let prefix = keys::group(keys::DENTRY, top.src);
            let after = top.after.as_ref().map(|n| keys::dentry(top.src, n));
            let page = t.scan(&prefix, after.as_deref(), inos.len() - items.len())?;
            if page.is_empty() {
                stack.pop();
                continue;
            }
            let mut last = top.after.clone();
            let mut descend = None;
            for (k, v) in page {
                let name = k[prefix.len()..].to_vec();
                let (child, kind) = decode_dentry(&v)?;
                may_copy(&need_attr(t, child)?, ctx)?;
                let ino = inos[items.len()];
                name_bytes += name.len();
                items.push(CloneItem {
                    src: child,
                    ino,
                    parent: top.dst,
                    name: name.as_slice().into(),
                });
                last = Some(name);
                if kind == FileKind::Dir {
                    descend = Some(CloneFrame {
                        src: child,
                        dst: ino,
                        after: None,
                    });
                    break;
                }
                if name_bytes >= STEP_NAME_BYTES_MAX {
                    break;
                }
            }
            if let Some(top) = stack.last_mut() {
                top.after = last;
            }
            stack.extend(descend);
        }
        Ok((items, stack))
    }

    /// Drop the clone under `root`: delete what it copied, a step at a time, for up to
    /// `budget` (the GC passes finish what is left).
    pub fn drop_clone(&self, root: Ino, budget: Duration) -> Result<bool> {
        let start = Instant::now();
        loop {
            let (done, _) = kv::txn(self.kv.as_ref(), |t| {
                let Some(_) = get_clone(t, root)? else {
                    return Ok(true);
                };
                let (entries, root_too) = drop_batch(t, root)?;
                self.commit_part(
                    t,
                    Change::CloneDrop {
                        root,
                        entries: entries
                            .into_iter()
                            .map(|(p, n)| (p, n.as_slice().into()))
                            .collect(),
                        root_too,
                    },
                    now_ns(),
                )?;
                Ok(root_too)
            })?;
            if done {
                return Ok(true);
            }
            if start.elapsed() >= budget {
                return Ok(false);
            }
        }
    }

    /// Every clone being made that `ctx` may see (root: all; others: their own).
    pub fn clones(&self, ctx: &Ctx) -> Result<Vec<CloneListing>> {
        let jobs = kv::read(self.kv.as_ref(), all_jobs)?;
        Ok(jobs
            .into_iter()
            .filter(|l| ctx.uid == 0 || l.job.uid == ctx.uid)
            .collect())
    }

    /// Drop the clones given up or left idle past [`IDLE_MAX_NS`] as of `now`, for up to
    /// `budget`; returns how many are gone. Nothing while deletions are refused.
    pub fn drop_idle_clones(&self, now: i64, budget: Duration) -> Result<usize> {
        if self.is_read_only() || self.deletions_refused().is_some() {
            return Ok(0);
        }
        let start = Instant::now();
        let mut n = 0;
        for l in kv::read(self.kv.as_ref(), all_jobs)? {
            if !l.job.dropping && now.saturating_sub(l.job.touched_ns) < IDLE_MAX_NS {
                continue;
            }
            let left = budget.saturating_sub(start.elapsed());
            if left.is_zero() {
                break;
            }
            if self.drop_clone(l.root, left)? {
                n += 1;
            }
        }
        Ok(n)
    }

    /// [`Self::drop_idle_clones`] from a GC pass: looks at most once a minute.
    pub fn drop_idle_clones_due(&self, now: i64) -> Result<usize> {
        let last = self.clones_swept.load(Ordering::Acquire);
        if last != i64::MIN && now.saturating_sub(last) < SWEEP_EVERY_NS && now >= last {
            return Ok(0);
        }
        let n = self.drop_idle_clones(now, Duration::from_secs(30))?;
        self.clones_swept.store(now, Ordering::Release);
        Ok(n)
    }

    /// A virtual `strait.clone.*` xattr's value ([`clone_xattr`]).
    pub(super) fn clone_getxattr(&self, ctx: &Ctx, name: &[u8]) -> Result<Vec<u8>> {
        if name != clone_xattr::JOBS {
            return sys(libc::ENODATA);
        }
        let mut out = vec![];
        for l in self.clones(ctx)? {
            let j = &l.job;
            out.extend(
                format!(
                    "root={} src={} parent={} inodes={} space={} dropping={} job={} name=",
                    l.root,
                    j.src,
                    j.parent,
                    j.inodes + 1,
                    j.space,
                    u8::from(j.dropping),
                    j.token
                )
                .into_bytes(),
            );
            out.extend_from_slice(&j.name);
            out.push(b'\n');
        }
        Ok(out)
    }

    /// Setting `strait.clone` ([`clone_xattr`]) on `src`.
    pub(super) fn clone_setxattr(
        &self,
        ctx: &Ctx,
        src: Ino,
        name: &[u8],
        value: &[u8],
    ) -> Result<Committed<()>> {
        if name != clone_xattr::CLONE {
            return sys(libc::ENOTSUP);
        }
        let v = parse_clone_value(value).ok_or(Error::Sys(libc::EINVAL))?;
        let done = self.clone_versioned(
            ctx,
            src,
            (v.parent, v.name),
            (v.preserve, v.token),
            CALL_BUDGET,
        )?;
        Ok(Committed::new((), done.version))
    }
}

/// What a `strait.clone` value asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CloneRequest<'a> {
    pub parent: Ino,
    pub preserve: bool,
    pub token: u64,
    pub name: &'a [u8],
}

/// `parent=INO preserve=0|1 job=TOKEN name=NAME` (NAME last, whole).
pub fn parse_clone_value(v: &[u8]) -> Option<CloneRequest<'_>> {
    let at = v.windows(6).position(|w| w == b" name=")?;
    let (head, name) = (std::str::from_utf8(&v[..at]).ok()?, &v[at + 6..]);
    let field = |f: &str| {
        head.split_whitespace()
            .find_map(|x| x.strip_prefix(f)?.strip_prefix('='))
    };
    let preserve = match field("preserve")? {
        "0" => false,
        "1" => true,
        _ => return None,
    };
    Some(CloneRequest {
        parent: field("parent")?.parse().ok()?,
        preserve,
        token: field("job")?.parse().ok()?,
        name,
    })
}

/// The value of `strait.clone` that asks for `r`.
pub fn clone_value(r: &CloneRequest<'_>) -> Vec<u8> {
    let mut v = format!(
        "parent={} preserve={} job={} name=",
        r.parent,
        u8::from(r.preserve),
        r.token
    )
    .into_bytes();
    v.extend_from_slice(r.name);
    v
}

/// An entry of a directory: (directory, name).
type Entry = (Ino, Vec<u8>);

/// The next entries of a dropped clone's tree to delete (files, and directories already
/// empty), depth first from `root`, and whether the root goes too (nothing left under it).
fn drop_batch(t: &mut dyn KvTxn, root: Ino) -> Result<(Vec<Entry>, bool)> {
    let ra = need_attr(t, root)?;
    if !ra.is_dir() {
        return Ok((vec![], true));
    }
    let mut out = vec![];
    let mut stack = vec![root];
    let mut root_empty = true;
    while let Some(dir) = stack.pop() {
        let prefix = keys::group(keys::DENTRY, dir);
        let page = t.scan(&prefix, None, DROP_ITEMS_MAX)?;
        if dir == root && !page.is_empty() {
            root_empty = false;
        }
        for (k, v) in page {
            if out.len() >= DROP_ITEMS_MAX {
                break;
            }
            let (child, kind) = decode_dentry(&v)?;
            let empty_dir = kind == FileKind::Dir
                && t.scan(&keys::group(keys::DENTRY, child), None, 1)?
                    .is_empty();
            if kind != FileKind::Dir || empty_dir {
                out.push((dir, k[prefix.len()..].to_vec()));
            } else {
                stack.push(child);
            }
        }
        if out.len() >= DROP_ITEMS_MAX {
            break;
        }
    }
    Ok((out, root_empty))
}
