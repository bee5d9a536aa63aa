//! The numbers that cross crates and processes, each as a type of its own, so the compiler
//! keeps them apart: a [`Version`] of the change log, the [`SliceId`] of a data slice and the
//! primary's [`Epoch`]. All three are a `u64` inside.
//!
//! This crate is the bottom of the stack: fs-core re-exports these types, and the replicator
//! and its client, which build no fs-core, use them from here. It also holds the one reading
//! of the wall clock, [`clock`].
//!
//! # To ensure correctness
//! - Each type is `#[serde(transparent)]`: it encodes exactly as the bare `u64` it wraps
//!   (postcard, JSON), so records, keys and snapshots written before these types existed
//!   read back unchanged. Keys that hold one big-endian use [`Version::to_be_bytes`] and
//!   friends, which are the `u64`'s own.
//! - The wire types (protobuf) stay `u64`; conversions happen where a message is built or
//!   read, with `.0` and the constructor.
//! - Arithmetic is the `u64`'s: an overflow panics in debug builds and wraps in release, as
//!   before. Versions and slice ids are kept far from the limit by their counters.

pub mod clock;
pub mod private;
pub mod units;

use serde::{Deserialize, Serialize};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize,
            Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub u64);

        impl $name {
            pub const ZERO: $name = $name(0);

            /// The `u64` big-endian, as keys hold it (so keys sort in this type's order).
            pub const fn to_be_bytes(self) -> [u8; 8] {
                self.0.to_be_bytes()
            }

            pub const fn from_be_bytes(b: [u8; 8]) -> Self {
                $name(u64::from_be_bytes(b))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

id_type!(
    /// The version of a change record: the primary's metadata transactions number the records
    /// they commit 1, 2, 3, ... without gaps (docs/changelog.md). [`Version::ZERO`] is "no
    /// record yet"; a replica at version `v` holds the effect of every record up to `v`.
    Version
);

id_type!(
    /// The id of a data slice, whose blocks are stored under
    /// `chunks/{id / 1_000_000}/{id / 1_000}/{id}_{index}_{size}`. Ids come from one shared
    /// counter and are never reused; [`SliceId::HOLE`] (0) stands for zeros and has no blocks.
    SliceId
);

id_type!(
    /// The fencing epoch of the primary at the replicator: an append or heartbeat of an
    /// epoch older than the replicator's is refused, so a primary that was replaced cannot
    /// write ([`Epoch::ZERO`] until a primary first raises it).
    Epoch
);

impl Version {
    /// The version after this one.
    pub const fn next(self) -> Version {
        Version(self.0 + 1)
    }

    /// The version before this one (there is none before [`Version::ZERO`]).
    pub const fn prev(self) -> Version {
        Version(self.0 - 1)
    }
}

/// `version + n`: `n` versions later.
impl std::ops::Add<u64> for Version {
    type Output = Version;
    fn add(self, n: u64) -> Version {
        Version(self.0 + n)
    }
}

impl std::ops::AddAssign<u64> for Version {
    fn add_assign(&mut self, n: u64) {
        self.0 += n;
    }
}

impl SliceId {
    /// A hole: zeros, with no object behind it.
    pub const HOLE: SliceId = SliceId(0);

    pub const fn is_hole(self) -> bool {
        self.0 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_type_encodes_as_its_u64() {
        // postcard (records, KV values, raft entries) and JSON (status output)
        for n in [0u64, 1, 127, 128, 300, u32::MAX as u64 + 1, u64::MAX] {
            let plain = postcard::to_stdvec(&n).unwrap();
            assert_eq!(postcard::to_stdvec(&Version(n)).unwrap(), plain);
            assert_eq!(postcard::to_stdvec(&SliceId(n)).unwrap(), plain);
            assert_eq!(postcard::to_stdvec(&Epoch(n)).unwrap(), plain);
            assert_eq!(postcard::from_bytes::<Version>(&plain).unwrap(), Version(n));
            assert_eq!(
                serde_json::to_string(&Epoch(n)).unwrap(),
                serde_json::to_string(&n).unwrap()
            );
            assert_eq!(Version(n).to_be_bytes(), n.to_be_bytes());
            assert_eq!(SliceId::from_be_bytes(n.to_be_bytes()), SliceId(n));
        }
    }

    #[test]
    fn versions_count_on() {
        assert_eq!(Version::ZERO.next(), Version(1));
        assert_eq!(Version(1).prev(), Version::ZERO);
        assert_eq!(Version(5) + 3, Version(8));
        let mut v = Version(5);
        v += 2;
        assert_eq!(v, Version(7));
        assert!(Version(2) < Version(10));
        assert_eq!(format!("{} {}", Version(17), Epoch(3)), "17 3");
        assert!(SliceId::HOLE.is_hole() && !SliceId(1).is_hole());
    }
}
