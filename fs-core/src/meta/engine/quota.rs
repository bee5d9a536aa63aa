//! Directory quotas: set, read, list, remove and recount them (docs/operations.md,
//! "Directory quotas"). The accounting and the enforcement are the state machine's
//! ([`crate::changelog::quota`]): every change is held to them where it commits.

use super::{need_dir_attr, need_live_dir, Meta};
use crate::changelog::quota::{self, Quota};
use crate::changelog::{Change, QuotaLimits};
use crate::clock::now_ns;
use crate::error::{sys, Result};
use crate::kv;
use crate::meta::types::*;
use crate::meta::Committed;

/// What a recount found: the quota as stored, and its subtree as counted now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaCheck {
    pub stored: Quota,
    /// (space, inodes) counted through the entries.
    pub counted: (i64, i64),
    /// Whether the stored usage was set to the count.
    pub repaired: bool,
}

impl QuotaCheck {
    pub fn consistent(&self) -> bool {
        (self.stored.used_space, self.stored.used_inodes) == self.counted
    }
}

impl Meta {
    /// Give directory `ino` a quota, or change its limits (root only). A new quota counts its
    /// subtree in the same transaction, so its usage is exact from the start; limits below
    /// the usage are taken (the quota then refuses every change that grows it).
    pub fn set_quota(&self, ctx: &Ctx, ino: Ino, limits: QuotaLimits) -> Result<Quota> {
        self.set_quota_versioned(ctx, ino, limits)?;
        self.quota(ino)?.ok_or(crate::Error::Sys(libc::ENODATA))
    }

    /// [`Meta::set_quota`], with the version it committed at.
    pub fn set_quota_versioned(
        &self,
        ctx: &Ctx,
        ino: Ino,
        limits: QuotaLimits,
    ) -> Result<Committed<()>> {
        self.writable()?;
        if ctx.uid != 0 {
            return sys(libc::EPERM);
        }
        kv::txn(self.kv.as_ref(), |t| {
            need_live_dir(t, ino)?;
            let usage = match quota::get(t, ino)? {
                Some(_) => None,
                None => Some(quota::count_subtree(t, ino)?),
            };
            self.commit(t, Change::SetQuota { ino, limits, usage }, now_ns())
        })
        .map(Committed::from)
    }

    /// Remove directory `ino`'s quota (root only); ENODATA when it has none.
    pub fn delete_quota(&self, ctx: &Ctx, ino: Ino) -> Result<()> {
        self.delete_quota_versioned(ctx, ino).map(|_| ())
    }

    /// [`Meta::delete_quota`], with the version it committed at.
    pub fn delete_quota_versioned(&self, ctx: &Ctx, ino: Ino) -> Result<Committed<()>> {
        self.writable()?;
        if ctx.uid != 0 {
            return sys(libc::EPERM);
        }
        kv::txn(self.kv.as_ref(), |t| {
            need_dir_attr(t, ino)?;
            if quota::get(t, ino)?.is_none() {
                return sys(libc::ENODATA);
            }
            self.commit(t, Change::DeleteQuota { ino }, now_ns())
        })
        .map(Committed::from)
    }

    /// Directory `ino`'s quota, if it has one.
    pub fn quota(&self, ino: Ino) -> Result<Option<Quota>> {
        kv::read(self.kv.as_ref(), |t| quota::get(t, ino))
    }

    /// Every quota, by directory.
    pub fn quotas(&self) -> Result<Vec<(Ino, Quota)>> {
        kv::read(self.kv.as_ref(), |t| quota::all(t))
    }

    /// The quotas from directory `ino` up to the root, nearest first (`df` under a quota
    /// shows the nearest one's).
    pub fn quotas_above(&self, ino: Ino) -> Result<Vec<(Ino, Quota)>> {
        kv::read(self.kv.as_ref(), |t| {
            let mut out = vec![];
            for d in quota::above(t, ino)? {
                if let Some(q) = quota::get(t, d)? {
                    out.push((d, q));
                }
            }
            Ok(out)
        })
    }

    /// The quotas at or under directory `top`, each with its path from `top` (`.` for `top`
    /// itself), found through the directories' parent links; those not under `top` are left
    /// out.
    pub fn quotas_under(&self, top: Ino) -> Result<Vec<(String, Quota)>> {
        kv::read(self.kv.as_ref(), |t| {
            let mut out = vec![];
            for (ino, q) in quota::all(t)? {
                if let Some(path) = path_from(t, top, ino)? {
                    out.push((path, q));
                }
            }
            out.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(out)
        })
    }

    /// Count directory `ino`'s subtree again and compare it with its quota's usage; with
    /// `repair` (root only), set the usage to the count where they differ.
    pub fn check_quota(&self, ctx: &Ctx, ino: Ino, repair: bool) -> Result<QuotaCheck> {
        if repair {
            self.writable()?;
            if ctx.uid != 0 {
                return sys(libc::EPERM);
            }
        }
        let work = |t: &mut dyn kv::KvTxn| -> Result<QuotaCheck> {
            need_dir_attr(t, ino)?;
            let Some(stored) = quota::get(t, ino)? else {
                return sys(libc::ENODATA);
            };
            let counted = quota::count_subtree(t, ino)?;
            let differs = (stored.used_space, stored.used_inodes) != counted;
            if repair && differs {
                self.commit(
                    t,
                    Change::SetQuota {
                        ino,
                        limits: stored.limits,
                        usage: Some(counted),
                    },
                    now_ns(),
                )?;
            }
            Ok(QuotaCheck {
                stored,
                counted,
                repaired: repair && differs,
            })
        };
        if repair {
            Ok(kv::txn(self.kv.as_ref(), work)?.0)
        } else {
            kv::read(self.kv.as_ref(), work)
        }
    }
}

/// The path of directory `ino` from directory `top` (`.` for `top` itself), through the
/// parent links and the parents' entries; None when `ino` is not under `top`.
fn path_from(t: &mut dyn kv::KvTxn, top: Ino, ino: Ino) -> Result<Option<String>> {
    let mut names: Vec<String> = vec![];
    let mut cur = ino;
    for _ in 0..4096 {
        if cur == top {
            names.reverse();
            return Ok(Some(if names.is_empty() {
                ".".into()
            } else {
                names.join("/")
            }));
        }
        if cur == crate::meta::ROOT_INO {
            return Ok(None);
        }
        let Some(a) = crate::changelog::get_attr(t, cur)? else {
            return Ok(None);
        };
        let parent = a.parent;
        if parent == 0 {
            return Ok(None);
        }
        let mut found = None;
        let prefix = crate::meta::keys::group(crate::meta::keys::DENTRY, parent);
        let mut after: Option<Vec<u8>> = None;
        'scan: loop {
            let page = t.scan(&prefix, after.as_deref(), 1000)?;
            let n = page.len();
            for (k, v) in page {
                if crate::changelog::decode_dentry(&v)?.0 == cur {
                    found = Some(String::from_utf8_lossy(&k[9..]).into_owned());
                    break 'scan;
                }
                after = Some(k);
            }
            if n < 1000 {
                break;
            }
        }
        let Some(name) = found else {
            return Ok(None);
        };
        names.push(name);
        cur = parent;
    }
    Ok(None)
}
