//! The registry of key tags: every byte a key in a KV engine starts with (the first byte of
//! its group, see [`super`]), the crate that owns it and what it keys. Every user takes its
//! tag from here, and the test below checks that no two owners share one: a shared tag lets
//! one owner's keys fall into another's groups (and scans).
//!
//! Tags are on disk: a tag's byte never changes once written, and a retired byte is not
//! given to another owner while engines that hold it may exist.
//!
//! Retired: `L` also keyed the mirror's marks of the blocks its region's store holds
//! (`L id index`), beside the change log's group `L 0`, until they got [`MIRROR_SYNCED`]; a
//! mirror moves such marks to their new tag when it starts (strait-mirror `blocks/synced.rs`).

/// One registered tag.
#[derive(Clone, Copy, Debug)]
pub struct Tag {
    pub byte: u8,
    /// The constant's name.
    pub name: &'static str,
    /// The crate and part that writes the keys.
    pub owner: &'static str,
    /// The keys' layout and what they hold.
    pub keys: &'static str,
}

macro_rules! registry {
    ($($(#[doc = $doc:literal])+ $name:ident = $byte:literal, $owner:literal;)*) => {
        $($(#[doc = $doc])+ pub const $name: u8 = $byte;)*
        /// Every registered tag.
        pub const ALL: &[Tag] = &[$(Tag {
            byte: $name,
            name: stringify!($name),
            owner: $owner,
            keys: concat!($($doc),+),
        }),*];
    };
}

registry! {
    /// `A ino` -> the inode's attributes.
    ATTR = b'A', "strait-fs-core meta";
    /// `D parent name` -> a directory entry (the child's inode and type).
    DENTRY = b'D', "strait-fs-core meta";
    /// `C ino index` -> the slice list of one chunk of a file.
    CHUNK = b'C', "strait-fs-core meta";
    /// `S ino` -> a symbolic link's target.
    SYMLINK = b'S', "strait-fs-core meta";
    /// `X ino name` -> an extended attribute's value.
    XATTR = b'X', "strait-fs-core meta";
    /// `F 0 ino`: unlinked inodes kept alive by an open handle.
    DELFILE = b'F', "strait-fs-core meta";
    /// `K 0 id`: dead slices waiting for their blocks to be deleted.
    DEADSLICE = b'K', "strait-fs-core meta";
    /// `E 0 sid`: sessions of mounts.
    SESSION = b'E', "strait-fs-core meta";
    /// `Q ino`: the flock table of an inode.
    FLOCK = b'Q', "strait-fs-core meta";
    /// `W ino`: the POSIX lock table of an inode.
    PLOCK = b'W', "strait-fs-core meta";
    /// `Y sid ino`: inodes on which a session holds locks.
    LOCKED = b'Y', "strait-fs-core meta";
    /// `Z 0 name`: settings.
    SETTING = b'Z', "strait-fs-core meta";
    /// `N 0 name`: counters.
    COUNTER = b'N', "strait-fs-core meta";
    /// `U 0 ino L` -> a directory quota's limits; `U 0 ino S` and `U 0 ino I`: the space and
    /// inodes used under it (counters).
    QUOTA = b'U', "strait-fs-core meta";
    /// `T 0 ino` -> an inode in the trash: the directory and name it had, when it went.
    TRASH = b'T', "strait-fs-core meta";
    /// `M 0 id` -> how many chunk lists beyond the first name slice `id` (a counter): a
    /// clone's chunks share its source's slices, and a slice is dead only when the last
    /// list that names it lets it go. No key: one list.
    SLICEREF = b'M', "strait-fs-core meta";
    /// `I 0 root` -> a clone being made (`strait clone`): the tree under `root`, which has
    /// no name until the clone is attached at its destination.
    CLONE = b'I', "strait-fs-core meta";
    /// `R 0 id` -> the record of a change made under request id `id` (its version and its
    /// first result); `R 1 ts id`: the records by age; `R 2 name`: their count and eviction
    /// horizon. Region-local, as sessions are: never in the change log, snapshots or digests.
    REQUEST = b'R', "strait-fs-core meta";
    /// `L 0 version` -> a change record ([`super::LOG_GROUP`]).
    LOG = b'L', "strait-fs-core kv (the change log)";
    /// `V 0 "last"` -> the version of the last change record ([`super::LAST_VERSION_KEY`]).
    LAST_VERSION = b'V', "strait-fs-core kv (the change log)";
    /// `J version id index` -> `len crc`: a block to copy to the mirror's region.
    MIRROR_COPY = b'J', "strait-mirror blocks (the copy queue)";
    /// `G version id` -> `size`: the local blocks of a purged slice to delete.
    MIRROR_DELETE = b'G', "strait-mirror blocks (the deleter)";
    /// `H ino` -> `parent name`: one name of each inode, for the per-path sync policies.
    MIRROR_NAME = b'H', "strait-mirror blocks (the sync policy)";
    /// `P 0 name`: the copy queue's counters and the indexed snapshot's version.
    MIRROR_STATS = b'P', "strait-mirror blocks (the copy queue)";
    /// `B id index` (no value): block `index` of slice `id` is in the mirror's region's store.
    MIRROR_SYNCED = b'B', "strait-mirror blocks (the marks)";
    /// `O 0 "promotion"` -> the promotion of this mirror to primary (epoch, the version it
    /// took over from, when), once there was one: a restart comes back as the primary.
    MIRROR_ROLE = b'O', "strait-mirror promote";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tag_is_distinct() {
        for (i, a) in ALL.iter().enumerate() {
            for b in &ALL[i + 1..] {
                assert_ne!(
                    a.byte, b.byte,
                    "{} ({}) and {} ({}) share the tag {:?}",
                    a.name, a.owner, b.name, b.owner, a.byte as char
                );
            }
        }
    }

    #[test]
    fn every_tag_is_a_capital_letter_with_an_owner_and_keys() {
        for t in ALL {
            assert!(t.byte.is_ascii_uppercase(), "{}: {:?}", t.name, t.byte);
            assert!(
                !t.owner.is_empty() && !t.keys.trim().is_empty(),
                "{}",
                t.name
            );
        }
        assert!(
            ALL.iter()
                .filter(|t| t.owner == "strait-fs-core meta")
                .count()
                >= 13
        );
    }

    #[test]
    fn the_change_log_keys_keep_their_bytes() {
        // written in every engine: the registry must not change them
        assert_eq!(super::super::LOG_GROUP, *b"L\0\0\0\0\0\0\0\0");
        assert_eq!(super::super::LAST_VERSION_KEY, b"V\0\0\0\0\0\0\0\0last");
    }
}
