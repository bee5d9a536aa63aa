//! [`Scope`]: what one call may reach, from its caller's rules ([`strait_auth::Rules`]).
//!
//! - **Squashing**: the ids a call names (`Ctx`) are replaced as the rules say (root squash,
//!   all squash, a fixed uid and gid) before the engine checks permissions with them.
//! - **A subtree**: the credential's directory `R` is its mounts' root. Inode 1 in a call
//!   stands for `R`, and `R` is answered as 1, so the mount sees `R` as the whole file
//!   system (as an NFS export of a directory, or CephFS's `path=` capability with a mount of
//!   that path). Every other inode a call names must lie under `R`, which the engine's
//!   parent links show ([`strait_fs_core::meta::Attr::parent`]); any other answers ENOENT,
//!   as a name that is not there: a mount of `/team-a` cannot reach `/team-b` by any inode
//!   number, nor learn whether it exists.
//!
//! A caller without rules gets a scope that changes nothing and reads nothing.

use std::sync::Arc;

use strait_auth::Rules;
use strait_fs_core::error::Error;
use strait_fs_core::meta::{Attr, Ctx, FileKind, Ino, Meta, ROOT_INO};
use strait_proto::meta as w;

/// A parent chain longer than this is corrupt (the engine's own bound is the same order).
const PARENT_CHAIN_MAX: usize = 4096;

/// What a call may reach.
#[derive(Clone, Debug)]
pub(crate) struct Scope {
    rules: Arc<Rules>,
    /// The subtree's directory: the caller's root (ROOT_INO when it is not confined).
    root: Ino,
}

impl Scope {
    /// The scope of `rules` on the state `m` sees: its subtree's directory looked up, name by
    /// name, from the root. A subtree that does not exist (or is not a directory) is ENOENT.
    pub(crate) fn of(m: &Meta, rules: &Arc<Rules>) -> Result<Scope, Error> {
        if rules.is_open() {
            // the caller's own rules, not a new allocation on every call
            return Ok(Scope {
                rules: rules.clone(),
                root: ROOT_INO,
            });
        }
        let mut root = ROOT_INO;
        let ctx = Ctx::root();
        for name in rules.subtree_names() {
            let (ino, attr) = m.lookup(&ctx, root, name.as_bytes()).map_err(|e| match e {
                Error::Sys(libc::ENOENT) | Error::Sys(libc::ENOTDIR) => missing(rules),
                e => e,
            })?;
            if attr.kind != FileKind::Dir {
                return Err(missing(rules));
            }
            root = ino;
        }
        Ok(Scope {
            rules: rules.clone(),
            root,
        })
    }

    /// Whether calls are confined to a subtree.
    pub(crate) fn confined(&self) -> bool {
        self.root != ROOT_INO
    }

    /// The ids the call acts as: the mount's, squashed as the rules say.
    pub(crate) fn ctx(&self, c: Option<w::Ctx>) -> Result<Ctx, Error> {
        let mut ctx = strait_proto::ctx_from_wire(c).map_err(|e| Error::Invalid(e.0))?;
        if self.rules.restricts_ids() {
            let (uid, gid, groups) = self.rules.squash(ctx.uid, ctx.gid, &ctx.groups);
            ctx.uid = uid;
            ctx.gid = gid;
            ctx.groups = groups;
        }
        Ok(ctx)
    }

    /// The inode a call names, as the engine knows it: 1 is the subtree's directory; any
    /// other must lie under it (ENOENT otherwise).
    pub(crate) fn ino(&self, m: &Meta, ino: Ino) -> Result<Ino, Error> {
        if !self.confined() {
            return Ok(ino);
        }
        if ino == ROOT_INO {
            return Ok(self.root);
        }
        if self.inside(m, ino)? {
            Ok(ino)
        } else {
            Err(Error::Sys(libc::ENOENT))
        }
    }

    /// The value of a virtual xattr that names a directory by its inode (the destination of
    /// `strait.clone`, of `strait.trash.restore`), with that inode as the engine knows it:
    /// confined like every inode a call names. Other values as they are.
    pub(crate) fn xattr_value(
        &self,
        m: &Meta,
        name: &[u8],
        value: &[u8],
    ) -> Result<Vec<u8>, Error> {
        use strait_fs_core::meta::{clone_value, clone_xattr, parse_clone_value, trash_xattr};
        if !self.confined() {
            return Ok(value.to_vec());
        }
        if name == clone_xattr::CLONE {
            let mut r = parse_clone_value(value).ok_or(Error::Sys(libc::EINVAL))?;
            r.parent = self.ino(m, r.parent)?;
            return Ok(clone_value(&r));
        }
        if name == trash_xattr::RESTORE {
            let text = std::str::from_utf8(value)
                .map(|v| v.trim_matches(|c: char| c.is_whitespace() || c == '\0'))
                .map_err(|_| Error::Sys(libc::EINVAL))?;
            if text.is_empty() {
                return Ok(value.to_vec());
            }
            let to: Ino = text.parse().map_err(|_| Error::Sys(libc::EINVAL))?;
            return Ok(self.ino(m, to)?.to_string().into_bytes());
        }
        Ok(value.to_vec())
    }

    /// As [`Scope::ino`], and also an inode the session holds a handle on wherever it is now
    /// (a file opened in the subtree stays readable and writable through its handle after it
    /// moved out, as a file opened elsewhere does).
    pub(crate) fn held_or_inside(&self, m: &Meta, ino: Ino) -> Result<Ino, Error> {
        if self.confined() && ino != ROOT_INO && m.holds(ino) > 0 {
            return Ok(ino);
        }
        self.ino(m, ino)
    }

    /// Whether `ino` lies under the subtree's directory, by its parent links. A file whose
    /// directory the engine does not know (one made before parents were kept) is not.
    fn inside(&self, m: &Meta, ino: Ino) -> Result<bool, Error> {
        let mut cur = ino;
        for _ in 0..PARENT_CHAIN_MAX {
            if cur == self.root {
                return Ok(true);
            }
            if cur == ROOT_INO || cur == 0 {
                return Ok(false);
            }
            cur = m.getattr(cur)?.parent;
        }
        Err(Error::corrupt(format!(
            "the parents of inode {ino} form a chain longer than {PARENT_CHAIN_MAX}"
        )))
    }

    /// Whether `ino` (as the engine numbers it) is the subtree's directory or lies under it.
    pub(crate) fn contains(&self, m: &Meta, ino: Ino) -> bool {
        !self.confined() || ino == self.root || self.inside(m, ino).unwrap_or(false)
    }

    /// A Watch batch as the caller may see it: the changes of what lies in its subtree,
    /// numbered as it knows them. A deletion names only an inode number, which is passed on
    /// (where the inode was is gone with it).
    pub(crate) fn confine_batch(&self, m: &Meta, b: &mut w::WatchBatch) {
        if !self.confined() {
            return;
        }
        b.attrs.retain_mut(|c| {
            let keep = match &c.attr {
                None => true,
                Some(a) => c.ino == self.root || self.contains(m, a.parent),
            };
            if let Some(a) = c.attr.as_mut() {
                if c.ino == self.root || a.parent == self.root {
                    a.parent = ROOT_INO;
                }
            }
            c.ino = self.out(c.ino);
            keep
        });
        b.entries.retain_mut(|e| {
            let keep = self.contains(m, e.parent);
            e.parent = self.out(e.parent);
            e.ino = self.out(e.ino);
            keep
        });
    }

    /// An inode as the caller knows it: the subtree's directory is 1.
    pub(crate) fn out(&self, ino: Ino) -> Ino {
        if self.confined() && ino == self.root {
            ROOT_INO
        } else {
            ino
        }
    }

    /// The attributes of `ino` as the caller knows them: the subtree's directory is its own
    /// parent, and the parent of its entries is 1.
    pub(crate) fn attr_out(&self, ino: Ino, mut a: Attr) -> Attr {
        if self.confined() && (ino == self.root || a.parent == self.root) {
            a.parent = ROOT_INO;
        }
        a
    }

    /// Whether the caller's `..` of directory `dir` (as the engine knows it) leaves its
    /// subtree: the subtree's directory is its own parent.
    pub(crate) fn is_top(&self, dir: Ino) -> bool {
        self.confined() && dir == self.root
    }

    /// The subtree's directory, as the engine knows it.
    pub(crate) fn root(&self) -> Ino {
        self.root
    }
}

/// A subtree that is not there: ENOENT for the call ([`missing_message`] says why where a
/// call can carry a message: the opening of a session).
fn missing(_rules: &Rules) -> Error {
    Error::Sys(libc::ENOENT)
}

/// Why a confined credential's session cannot open: its subtree is not there.
pub(crate) fn missing_message(rules: &Rules) -> String {
    format!(
        "the subtree {} this credential is confined to does not exist (or is not a \
         directory): an operator makes it first",
        rules.subtree().unwrap_or("/")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use strait_fs_core::meta::conformance::fresh;
    use strait_fs_core::meta::MetaClient;

    fn memory() -> strait_fs_core::kv::DynKv {
        Arc::new(strait_fs_core::kv::memory::MemoryKv::new())
    }

    #[test]
    fn a_subtree_is_the_callers_root_and_nothing_outside_it_can_be_named() {
        let (_, m) = fresh(&memory);
        let root = Ctx::root();
        let (a, _) = m.mkdir(&root, ROOT_INO, b"team-a", 0o755, 0).unwrap();
        let (b, _) = m.mkdir(&root, ROOT_INO, b"team-b", 0o755, 0).unwrap();
        let (ad, _) = m.mkdir(&root, a, b"d", 0o755, 0).unwrap();
        let (af, _) = m.create(&root, ad, b"f", 0o644, 0).unwrap();
        let (bf, _) = m.create(&root, b, b"f", 0o644, 0).unwrap();
        let rules = Arc::new(Rules {
            subtree: Some("/team-a".into()),
            root_squash: true,
            ..Default::default()
        });
        let s = Scope::of(&m, &rules).unwrap();
        assert!(s.confined());
        assert_eq!(s.ino(&m, ROOT_INO).unwrap(), a);
        assert_eq!(s.ino(&m, ad).unwrap(), ad);
        assert_eq!(s.ino(&m, af).unwrap(), af);
        for outside in [b, bf, 999_999] {
            let e = s.ino(&m, outside).unwrap_err();
            assert!(matches!(e, Error::Sys(libc::ENOENT)), "{outside}: {e:?}");
        }
        assert_eq!(s.out(a), ROOT_INO);
        assert_eq!(s.attr_out(a, m.getattr(a).unwrap()).parent, ROOT_INO);
        assert_eq!(s.attr_out(ad, m.getattr(ad).unwrap()).parent, ROOT_INO);
        // squashed: root acts as nobody
        let ctx = s
            .ctx(Some(w::Ctx {
                uid: 0,
                gid: 0,
                groups: vec![],
                pid: 1,
            }))
            .unwrap();
        assert_eq!((ctx.uid, ctx.gid), (65_534, 65_534));
        // a Watch batch keeps what lies in the subtree, numbered as the caller knows it
        let attr = |ino| Some(w::Attr::from(&m.getattr(ino).unwrap()));
        let mut batch = w::WatchBatch {
            version: 9,
            attrs: vec![
                w::AttrChange {
                    ino: a,
                    attr: attr(a),
                },
                w::AttrChange {
                    ino: af,
                    attr: attr(af),
                },
                w::AttrChange {
                    ino: bf,
                    attr: attr(bf),
                },
                w::AttrChange {
                    ino: b,
                    attr: attr(b),
                },
                w::AttrChange {
                    ino: 77,
                    attr: None,
                },
            ],
            entries: vec![
                w::EntryChange {
                    parent: a,
                    name: b"d".to_vec(),
                    ino: ad,
                },
                w::EntryChange {
                    parent: ad,
                    name: b"f".to_vec(),
                    ino: af,
                },
                w::EntryChange {
                    parent: b,
                    name: b"f".to_vec(),
                    ino: bf,
                },
                w::EntryChange {
                    parent: ROOT_INO,
                    name: b"team-b".to_vec(),
                    ino: b,
                },
            ],
            ..Default::default()
        };
        s.confine_batch(&m, &mut batch);
        let inos: Vec<u64> = batch.attrs.iter().map(|c| c.ino).collect();
        assert_eq!(inos, [ROOT_INO, af, 77]);
        assert_eq!(batch.attrs[0].attr.as_ref().unwrap().parent, ROOT_INO);
        let entries: Vec<(u64, u64)> = batch.entries.iter().map(|e| (e.parent, e.ino)).collect();
        assert_eq!(entries, [(ROOT_INO, ad), (ad, af)]);
        // a file moved out is out of reach
        m.rename(&root, ad, b"f", b, b"g", 0).unwrap();
        assert!(s.ino(&m, af).is_err());
        // a subtree that does not exist is said so
        let gone = Arc::new(Rules {
            subtree: Some("/team-c".into()),
            ..Default::default()
        });
        let e = Scope::of(&m, &gone).unwrap_err();
        assert!(matches!(e, Error::Sys(libc::ENOENT)), "{e:?}");
        let why = missing_message(&gone);
        assert!(
            why.contains("/team-c") && why.contains("does not exist"),
            "{why}"
        );
        // no rules: nothing changes
        let open = Scope::of(&m, &Arc::new(Rules::default())).unwrap();
        assert_eq!(open.ino(&m, bf).unwrap(), bf);
    }
}
