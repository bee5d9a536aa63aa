//! [`Committed`]: what a mutation of [`super::Meta`] returns, with the change-log version its
//! transaction committed.

use crate::Version;

/// A mutation's result and the version of the change record it committed.
///
/// `version` is `None` when the call appended no change record: it failed a check that needs
/// no error (a compaction that lost its race), or it changed only region-local state. A call
/// that ran several transactions (closing a session deletes each unlinked file it held)
/// reports the highest version among them.
///
/// A site daemon names this version in its reply and, in `replicated` durability, waits until
/// the replicator holds it. Mounts do not need it: [`super::MetaClient`] drops it, which is
/// why [`super::Meta`]'s methods that the trait also names carry the suffix `_versioned`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed<T> {
    pub value: T,
    pub version: Option<Version>,
}

impl<T> Committed<T> {
    pub fn new(value: T, version: Option<Version>) -> Self {
        Committed { value, version }
    }

    /// A result that committed no change record.
    pub fn unversioned(value: T) -> Self {
        Committed {
            value,
            version: None,
        }
    }

    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Committed<U> {
        Committed {
            value: f(self.value),
            version: self.version,
        }
    }

    pub fn into_value(self) -> T {
        self.value
    }
}

/// What [`crate::kv::txn`] returns: the closure's value and the version it committed.
impl<T> From<(T, Option<Version>)> for Committed<T> {
    fn from((value, version): (T, Option<Version>)) -> Self {
        Committed { value, version }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_keeps_the_version() {
        let c = Committed::from((2, Some(Version(7)))).map(|v| v * 10);
        assert_eq!(c, Committed::new(20, Some(Version(7))));
        assert_eq!(Committed::unversioned(()).version, None);
    }
}
