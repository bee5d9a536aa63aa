//! [`Role`]: what a caller is to strait, and [`Roles`], a set of them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What a caller is. A call is served when one of the caller's roles is among the roles its
/// method admits ([`crate::policy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A mount: the metadata calls of its region's site daemon.
    Mount,
    /// A mirror: subscribes to the log and acks its own cursor, forwards its region's calls to
    /// the primary, takes the primary's snapshot and digest, fetches blocks.
    Mirror,
    /// The primary: appends to the log, heartbeats, raises the epoch.
    Primary,
    /// An operator: membership, retention, pause, snapshot, digest, GC, forgetting a mirror.
    Admin,
    /// Another replicator node: Raft traffic and the relay of committed records.
    Peer,
}

impl Role {
    pub const ALL: [Role; 5] = [
        Role::Mount,
        Role::Mirror,
        Role::Primary,
        Role::Admin,
        Role::Peer,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Role::Mount => "mount",
            Role::Mirror => "mirror",
            Role::Primary => "primary",
            Role::Admin => "admin",
            Role::Peer => "peer",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| format!("{s:?} is not a role (mount, mirror, primary, admin, peer)"))
    }
}

/// A set of roles.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Roles(u8);

impl Roles {
    pub const NONE: Roles = Roles(0);

    pub const fn of(roles: &[Role]) -> Roles {
        let mut bits = 0u8;
        let mut i = 0;
        while i < roles.len() {
            bits |= 1 << (roles[i] as u8);
            i += 1;
        }
        Roles(bits)
    }

    pub fn with(self, r: Role) -> Roles {
        Roles(self.0 | r.bit())
    }

    pub fn union(self, o: Roles) -> Roles {
        Roles(self.0 | o.0)
    }

    pub fn contains(self, r: Role) -> bool {
        self.0 & r.bit() != 0
    }

    pub fn intersects(self, o: Roles) -> bool {
        self.0 & o.0 != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Role> {
        Role::ALL.into_iter().filter(move |r| self.contains(*r))
    }
}

impl fmt::Display for Roles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("no role");
        }
        let names: Vec<&str> = self.iter().map(Role::name).collect();
        f.write_str(&names.join(", "))
    }
}

impl fmt::Debug for Roles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Roles({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_print_and_combine() {
        for r in Role::ALL {
            assert_eq!(r.name().parse::<Role>().unwrap(), r);
        }
        assert!("root".parse::<Role>().is_err());
        let s = Roles::of(&[Role::Mount, Role::Admin]);
        assert!(s.contains(Role::Mount) && s.contains(Role::Admin));
        assert!(!s.contains(Role::Peer));
        assert_eq!(s.to_string(), "mount, admin");
        assert!(s.intersects(Roles::of(&[Role::Admin])));
        assert!(!s.intersects(Roles::of(&[Role::Peer, Role::Primary])));
        assert_eq!(Roles::NONE.with(Role::Peer), Roles::of(&[Role::Peer]));
        assert_eq!(Roles::NONE.to_string(), "no role");
    }
}
