//! [`Rules`]: what one credential of the role `mount` may do, beyond its role: whose ids its
//! calls act as (NFS's `root_squash`, `all_squash` with `anon_uid`/`anon_gid`, or one fixed
//! uid and gid) and the subtree it is confined to (CephFS's `path=` capability). A credential
//! without rules is trusted as before: its mounts act as the uid and gid they name, on the
//! whole tree.
//!
//! Rules come from the daemon's configuration (`[[credentials]]`, see [`crate::config`]) for
//! a token, or from a client certificate's extension ([`EXTENSION_OID`]) made by `strait
//! certs issue`. A mirror sends the rules of the mount it forwards for to the primary in
//! [`RULES_HEADER`]; the primary takes that header only from a caller of the role mirror.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The uid and gid squashed callers act as unless the rules name others (NFS's `nobody`).
pub const ANON_ID: u32 = 65_534;

/// The certificate extension that carries a holder's rules, as [`Rules::to_text`] writes
/// them (an OID under the private-use arc of strait's own choosing; not critical, so other
/// software ignores it).
pub const EXTENSION_OID: &[u64] = &[1, 3, 6, 1, 4, 1, 59_999, 43, 1];

/// A forwarded call's mount rules, from a mirror to the primary.
pub const RULES_HEADER: &str = "x-strait-rules";

/// Longest subtree path a credential may name.
const SUBTREE_LEN_MAX: usize = 1024;

/// What a credential may do inside its role.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Rules {
    /// Calls as uid 0 act as `anon_uid`, and as gid 0 as `anon_gid` (NFS's default).
    pub root_squash: bool,
    /// Every call acts as `anon_uid` and `anon_gid`, with no supplementary groups.
    pub all_squash: bool,
    /// The uid squashed calls act as (default 65534).
    pub anon_uid: Option<u32>,
    /// The gid squashed calls act as (default 65534).
    pub anon_gid: Option<u32>,
    /// Every call acts as this uid, whatever the mount says (no supplementary groups).
    pub uid: Option<u32>,
    /// Every call acts as this gid, whatever the mount says (no supplementary groups).
    pub gid: Option<u32>,
    /// The directory the credential is confined to (`/team-a`): its mounts see it as their
    /// root, and no inode outside it can be named.
    pub subtree: Option<String>,
}

impl Rules {
    /// Whether the rules change nothing (a credential trusted as before).
    pub fn is_open(&self) -> bool {
        !self.restricts_ids() && self.subtree().is_none()
    }

    /// Whether the caller's ids are replaced (squashed or fixed): its word on who it is is
    /// not taken, so calls that carry no ids (a slice written to a file) are checked against
    /// what it opened.
    pub fn restricts_ids(&self) -> bool {
        self.root_squash || self.all_squash || self.uid.is_some() || self.gid.is_some()
    }

    /// The subtree, normalised (None for none, or for `/`).
    pub fn subtree(&self) -> Option<&str> {
        self.subtree.as_deref().filter(|s| *s != "/")
    }

    /// The subtree's names from the root (`/team-a/x` -> `["team-a", "x"]`).
    pub fn subtree_names(&self) -> Vec<&str> {
        self.subtree()
            .map(|s| s.split('/').filter(|c| !c.is_empty()).collect())
            .unwrap_or_default()
    }

    /// Check the rules hold together; the error says which one does not.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(s) = &self.subtree {
            if !s.starts_with('/') {
                return Err(format!(
                    "subtree {s:?}: expected an absolute path (/team-a)"
                ));
            }
            if s.len() > SUBTREE_LEN_MAX {
                return Err(format!(
                    "subtree: at most {SUBTREE_LEN_MAX} bytes (this one has {})",
                    s.len()
                ));
            }
            if s.chars().any(|c| !c.is_ascii_graphic() || c == ';') {
                return Err(format!(
                    "subtree {s:?}: printable ASCII without spaces or ';' only"
                ));
            }
            let names: Vec<&str> = s.split('/').skip(1).collect();
            if s != "/"
                && names
                    .iter()
                    .enumerate()
                    .any(|(i, n)| *n == "." || *n == ".." || (n.is_empty() && i + 1 < names.len()))
            {
                return Err(format!(
                    "subtree {s:?}: a path without '.', '..' or empty names"
                ));
            }
        }
        if self.all_squash && (self.uid.is_some() || self.gid.is_some()) {
            return Err("all_squash and a fixed uid or gid exclude each other".into());
        }
        if (self.anon_uid.is_some() || self.anon_gid.is_some())
            && !(self.root_squash || self.all_squash)
        {
            return Err("anon_uid and anon_gid need root_squash or all_squash".into());
        }
        Ok(())
    }

    /// The ids a call that says `(uid, gid, groups)` acts as.
    pub fn squash(&self, uid: u32, gid: u32, groups: &[u32]) -> (u32, u32, Vec<u32>) {
        let (anon_uid, anon_gid) = (
            self.anon_uid.unwrap_or(ANON_ID),
            self.anon_gid.unwrap_or(ANON_ID),
        );
        if self.all_squash {
            return (anon_uid, anon_gid, vec![]);
        }
        let (mut uid, mut gid, mut groups) = (uid, gid, groups.to_vec());
        if self.root_squash {
            if uid == 0 {
                uid = anon_uid;
            }
            if gid == 0 {
                gid = anon_gid;
            }
            for g in groups.iter_mut().filter(|g| **g == 0) {
                *g = anon_gid;
            }
        }
        if self.uid.is_some() || self.gid.is_some() {
            uid = self.uid.unwrap_or(uid);
            gid = self.gid.unwrap_or(gid);
            groups.clear();
        }
        (uid, gid, groups)
    }

    /// The rules as one line (`subtree=/team-a;root_squash;uid=1000`): a certificate's
    /// extension, the header a mirror forwards them in.
    pub fn to_text(&self) -> String {
        let mut parts = vec![];
        if let Some(s) = &self.subtree {
            parts.push(format!("subtree={s}"));
        }
        if self.root_squash {
            parts.push("root_squash".into());
        }
        if self.all_squash {
            parts.push("all_squash".into());
        }
        for (k, v) in [
            ("anon_uid", self.anon_uid),
            ("anon_gid", self.anon_gid),
            ("uid", self.uid),
            ("gid", self.gid),
        ] {
            if let Some(v) = v {
                parts.push(format!("{k}={v}"));
            }
        }
        parts.join(";")
    }

    /// Rules from [`Rules::to_text`]'s line; an unknown or malformed part is refused.
    pub fn from_text(text: &str) -> Result<Rules, String> {
        let mut r = Rules::default();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = match part.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (part, None),
            };
            let id = |v: Option<&str>| -> Result<u32, String> {
                v.and_then(|v| v.parse::<u32>().ok())
                    .ok_or_else(|| format!("{k}: expected a number, as {k}=1000"))
            };
            match (k, v) {
                ("subtree", Some(v)) => r.subtree = Some(v.to_string()),
                ("root_squash", None) => r.root_squash = true,
                ("all_squash", None) => r.all_squash = true,
                ("anon_uid", v) => r.anon_uid = Some(id(v)?),
                ("anon_gid", v) => r.anon_gid = Some(id(v)?),
                ("uid", v) => r.uid = Some(id(v)?),
                ("gid", v) => r.gid = Some(id(v)?),
                _ => return Err(format!("unknown rule {part:?}")),
            }
        }
        r.validate()?;
        Ok(r)
    }
}

impl fmt::Display for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_open() {
            return f.write_str("no rules");
        }
        f.write_str(&self.to_text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squashing_replaces_the_ids_a_call_names() {
        let open = Rules::default();
        assert!(open.is_open());
        assert_eq!(open.squash(0, 0, &[0, 5]), (0, 0, vec![0, 5]));
        let root = Rules {
            root_squash: true,
            ..Default::default()
        };
        assert!(!root.is_open() && root.restricts_ids());
        assert_eq!(
            root.squash(0, 0, &[0, 5]),
            (ANON_ID, ANON_ID, vec![ANON_ID, 5])
        );
        assert_eq!(root.squash(1000, 100, &[5]), (1000, 100, vec![5]));
        let all = Rules {
            all_squash: true,
            anon_uid: Some(7),
            anon_gid: Some(8),
            ..Default::default()
        };
        assert_eq!(all.squash(1000, 100, &[5]), (7, 8, vec![]));
        let fixed = Rules {
            uid: Some(1000),
            gid: Some(1000),
            ..Default::default()
        };
        assert_eq!(fixed.squash(0, 0, &[0]), (1000, 1000, vec![]));
    }

    #[test]
    fn rules_read_back_from_their_line_and_bad_ones_are_refused() {
        let r = Rules {
            subtree: Some("/team-a/x".into()),
            root_squash: true,
            anon_uid: Some(99),
            ..Default::default()
        };
        assert_eq!(r.to_text(), "subtree=/team-a/x;root_squash;anon_uid=99");
        assert_eq!(Rules::from_text(&r.to_text()).unwrap(), r);
        assert_eq!(r.subtree_names(), ["team-a", "x"]);
        assert_eq!(Rules::from_text("").unwrap(), Rules::default());
        for bad in [
            "subtree=team-a",
            "subtree=/a/../b",
            "subtree=/a//b",
            "subtree=/a b",
            "uid=x",
            "uid",
            "squash_everything",
            "all_squash;uid=5",
            "anon_uid=5",
        ] {
            assert!(Rules::from_text(bad).is_err(), "{bad}");
        }
        // a trailing slash and the root itself are accepted; the root confines to nothing
        assert!(Rules::from_text("subtree=/a/").is_ok());
        assert!(Rules::from_text("subtree=/").unwrap().is_open());
    }
}
