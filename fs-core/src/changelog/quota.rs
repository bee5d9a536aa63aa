//! Directory quotas in the state machine: what each applied record changes in the usage of
//! the quotas above it, and, at the primary, whether a quota refuses it.
//!
//! An inode counts towards every quota from its directory (`Attr::parent`) up to the root:
//! its space ([`Attr::space`]) and one inode, while it has a name (nlink > 0). Every change of
//! an inode's attributes goes through [`QuotaDeltas::note`] with the attributes before and
//! after, so a create, a write that grows a file, a truncate, an unlink (nlink 0) and a move
//! to another directory each move the inode's share where it belongs. The deltas are summed
//! per quota over the whole record and added at its end ([`QuotaDeltas::finish`]), where the
//! primary refuses a record that raises a quota's usage past its limit (EDQUOT): a rename that
//! replaces a file is judged on its net effect.
//!
//! # To ensure correctness
//! - The same code runs at the primary and at every replica, from the replica's own state:
//!   usage is never shipped except when the primary counted a subtree
//!   ([`crate::changelog::Change::SetQuota`]), so every region's numbers are the primary's.
//! - A directory moved between directories under different sets of quotas would carry its
//!   whole subtree's usage, which no record counts: the primary refuses that rename with
//!   EXDEV (`mv` then copies), as CephFS does across quota realms.
//! - A file's other hard links count nowhere: it is counted once, under its directory.
//! - Usage only ever shrinks past a limit: a change that lowers usage is never refused.

use std::collections::BTreeMap;

use super::state::get_attr;
use crate::error::{Error, Result};
use crate::kv::{decode_counter, KvTxn};
use crate::meta::keys;
use crate::meta::types::{Attr, FileKind, Ino};
use crate::meta::ROOT_INO;

pub use super::record::QuotaLimits;

/// The deepest directory chain walked up to the root (a guard against a cycle).
const DEPTH_MAX: usize = 4096;
/// Entries read per scan when counting a subtree.
const SCAN_PAGE: usize = 1000;

/// A quota as read: its limits and usage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quota {
    pub limits: QuotaLimits,
    pub used_space: i64,
    pub used_inodes: i64,
}

/// What an inode counts towards the quotas above it: (space, inodes).
fn share(attr: &Attr) -> (i64, i64) {
    if attr.nlink == 0 {
        (0, 0)
    } else {
        (attr.space(), 1)
    }
}

/// Directory `ino`'s quota, if it has one.
pub fn get(t: &mut dyn KvTxn, ino: Ino) -> Result<Option<Quota>> {
    let Some(raw) = t.get(&keys::quota_limits(ino))? else {
        return Ok(None);
    };
    Ok(Some(Quota {
        limits: super::decode(&raw)?,
        used_space: decode_counter(t.get(&keys::quota_space(ino))?)?,
        used_inodes: decode_counter(t.get(&keys::quota_inodes(ino))?)?,
    }))
}

/// Every quota, by directory.
pub fn all(t: &mut dyn KvTxn) -> Result<Vec<(Ino, Quota)>> {
    let mut out = vec![];
    for (k, _) in t.scan(&keys::group(keys::QUOTA, 0), None, usize::MAX)? {
        if k.last() != Some(&b'L') {
            continue;
        }
        let ino = keys::u64_at(&k, 9).ok_or_else(|| Error::corrupt("quota key"))?;
        if let Some(q) = get(t, ino)? {
            out.push((ino, q));
        }
    }
    Ok(out)
}

/// Whether any directory has a quota.
fn any(t: &mut dyn KvTxn) -> Result<bool> {
    Ok(decode_counter(t.get(&keys::counter(keys::QUOTAS))?)? > 0)
}

/// The directories with a quota from `dir` up to the root, nearest first.
pub fn above(t: &mut dyn KvTxn, dir: Ino) -> Result<Vec<Ino>> {
    let mut out = vec![];
    let mut d = dir;
    for _ in 0..DEPTH_MAX {
        if d == 0 {
            break;
        }
        if t.get(&keys::quota_limits(d))?.is_some() {
            out.push(d);
        }
        if d == ROOT_INO {
            break;
        }
        d = get_attr(t, d)?.map(|a| a.parent).unwrap_or(0);
    }
    Ok(out)
}

/// What is under directory `dir` as its quota counts it: (space, inodes) of every inode whose
/// directory is `dir` or below it, found through the entries.
pub fn count_subtree(t: &mut dyn KvTxn, dir: Ino) -> Result<(i64, i64)> {
    let (mut space, mut inodes) = (0i64, 0i64);
    let mut stack = vec![dir];
    let mut walked = 0usize;
    while let Some(d) = stack.pop() {
        walked += 1;
        if walked > 100_000_000 {
            return Err(Error::corrupt(
                "a directory tree of more than 100 million directories",
            ));
        }
        let prefix = keys::group(keys::DENTRY, d);
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = t.scan(&prefix, after.as_deref(), SCAN_PAGE)?;
            let n = page.len();
            for (k, v) in page {
                let (ino, kind) = super::state::decode_dentry(&v)?;
                after = Some(k);
                let Some(a) = get_attr(t, ino)? else { continue };
                if a.parent == d {
                    let (s, i) = share(&a);
                    space += s;
                    inodes += i;
                }
                if kind == FileKind::Dir {
                    stack.push(ino);
                }
            }
            if n < SCAN_PAGE {
                break;
            }
        }
    }
    Ok((space, inodes))
}

/// What one record changes in the quotas' usage, gathered while it is applied.
#[derive(Default)]
pub(crate) struct QuotaDeltas {
    /// Whether any quota exists (read once, when an inode's share first changes).
    any: Option<bool>,
    /// quota directory -> (space, inodes) added by the record so far
    by_dir: BTreeMap<Ino, (i64, i64)>,
}

impl QuotaDeltas {
    fn active(&mut self, t: &mut dyn KvTxn) -> Result<bool> {
        if let Some(a) = self.any {
            return Ok(a);
        }
        let a = any(t)?;
        self.any = Some(a);
        Ok(a)
    }

    fn add(&mut self, t: &mut dyn KvTxn, dir: Ino, (space, inodes): (i64, i64)) -> Result<()> {
        if space == 0 && inodes == 0 {
            return Ok(());
        }
        for q in above(t, dir)? {
            let e = self.by_dir.entry(q).or_default();
            e.0 += space;
            e.1 += inodes;
        }
        Ok(())
    }

    /// A whole subtree holding (space, inodes) comes under directory `dir` (a clone
    /// attached there): every quota above counts it.
    pub(crate) fn add_under(
        &mut self,
        t: &mut dyn KvTxn,
        dir: Ino,
        delta: (i64, i64),
    ) -> Result<()> {
        if !self.active(t)? {
            return Ok(());
        }
        self.add(t, dir, delta)
    }

    /// An inode's attributes go from `old` to `new` (None: it did not exist, or is deleted).
    pub(crate) fn note(
        &mut self,
        t: &mut dyn KvTxn,
        old: Option<&Attr>,
        new: Option<&Attr>,
    ) -> Result<()> {
        let (o, n) = (
            old.map(share).unwrap_or_default(),
            new.map(share).unwrap_or_default(),
        );
        let (op, np) = (old.map(|a| a.parent), new.map(|a| a.parent));
        let (op, np) = (op.or(np).unwrap_or(0), np.or(op).unwrap_or(0));
        if o == n && op == np {
            return Ok(());
        }
        if !self.active(t)? {
            return Ok(());
        }
        if op == np {
            self.add(t, np, (n.0 - o.0, n.1 - o.1))
        } else {
            self.add(t, op, (-o.0, -o.1))?;
            self.add(t, np, n)
        }
    }

    /// Whether the quotas above `a` and above `b` are the same ones (a directory may move
    /// between them).
    pub(crate) fn same_quotas(&mut self, t: &mut dyn KvTxn, a: Ino, b: Ino) -> Result<bool> {
        if a == b || !self.active(t)? {
            return Ok(true);
        }
        Ok(above(t, a)? == above(t, b)?)
    }

    /// Add the record's deltas to the quotas' usage. With `enforce` (the primary), refuse
    /// (EDQUOT) a record that raises a quota's space or inodes past its limit.
    pub(crate) fn finish(self, t: &mut dyn KvTxn, enforce: bool) -> Result<()> {
        for (q, (space, inodes)) in self.by_dir {
            if space == 0 && inodes == 0 {
                continue;
            }
            if enforce && (space > 0 || inodes > 0) {
                if let Some(cur) = get(t, q)? {
                    let over = |used: i64, delta: i64, max: u64| {
                        max > 0 && delta > 0 && used.saturating_add(delta) > max as i64
                    };
                    if over(cur.used_space, space, cur.limits.space_max)
                        || over(cur.used_inodes, inodes, cur.limits.inodes_max)
                    {
                        return Err(Error::Sys(libc::EDQUOT));
                    }
                }
            }
            t.add(&keys::quota_space(q), space);
            t.add(&keys::quota_inodes(q), inodes);
        }
        Ok(())
    }
}

/// Apply a quota's limits (and, when counted, its usage) to directory `ino`.
pub(crate) fn set(
    t: &mut dyn KvTxn,
    ino: Ino,
    limits: &QuotaLimits,
    usage: Option<(i64, i64)>,
) -> Result<()> {
    if t.get(&keys::quota_limits(ino))?.is_none() {
        t.add(&keys::counter(keys::QUOTAS), 1);
    }
    t.put(&keys::quota_limits(ino), &super::encode(limits)?);
    if let Some((space, inodes)) = usage {
        t.put(&keys::quota_space(ino), &space.to_le_bytes());
        t.put(&keys::quota_inodes(ino), &inodes.to_le_bytes());
    }
    Ok(())
}

/// Remove directory `ino`'s quota, if it has one.
pub(crate) fn delete(t: &mut dyn KvTxn, ino: Ino) -> Result<()> {
    if t.get(&keys::quota_limits(ino))?.is_none() {
        return Ok(());
    }
    t.add(&keys::counter(keys::QUOTAS), -1);
    t.delete(&keys::quota_limits(ino));
    t.delete(&keys::quota_space(ino));
    t.delete(&keys::quota_inodes(ino));
    Ok(())
}
