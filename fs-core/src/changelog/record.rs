//! The change record's schema and its encoding: what the log carries, read by every other
//! part of the change log and by the metadata engine. It imports nothing of theirs.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::meta::types::{Attr, Format, Ino, SliceRef};
use crate::SliceId;

/// The longest request id a record carries.
pub const REQUEST_ID_LEN_MAX: usize = 64;

/// A file name, symlink target or xattr name in a record: bytes on the wire, shown as text
/// (lossily) by `strait changelog`.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq)]
#[serde(transparent)]
pub struct Name(pub Vec<u8>);

impl std::fmt::Debug for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

impl std::ops::Deref for Name {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl From<&[u8]> for Name {
    fn from(b: &[u8]) -> Self {
        Name(b.to_vec())
    }
}

/// One change as the log holds it. Encoded as postcard encodes the pair `(ts_ns, change)`,
/// followed, for a change made under a request id, by the id as postcard encodes a byte
/// string: a record without one is byte for byte what it was before ids were carried, and a
/// reader that knows nothing of ids (postcard ignores what follows a value) reads the change.
#[derive(Clone, Debug, PartialEq)]
pub struct ChangeRecord {
    /// The primary's clock when the change committed, in ns since the epoch.
    pub ts_ns: i64,
    pub change: Change,
    /// The request id the change was made under (a mount's call that carried one): every
    /// engine that applies the record keeps the request's record too, so a call sent again
    /// after a switchover is answered at the new primary from it, not run a second time
    /// ([`crate::meta::requests`]).
    pub request: Option<Vec<u8>>,
}

/// One record as `strait changelog` prints it (and `strait primary set-aside` lists it):
/// version, commit time (s.ns), the change.
pub fn line(v: crate::Version, rec: &ChangeRecord) -> String {
    let secs = rec.ts_ns.div_euclid(1_000_000_000);
    let nanos = rec.ts_ns.rem_euclid(1_000_000_000);
    format!("{v}\t{secs}.{nanos:09}\t{:?}", rec.change)
}

/// Whether an inode that lost its last link is deleted now or kept for its open handles.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unlinked {
    /// The inode still has links.
    Linked,
    /// Delete the inode and free its slices.
    Delete,
    /// Keep the inode (nlink 0) until the last handle of session `sid` is released.
    Sustain { sid: u64 },
    /// Keep the inode (nlink 0) in the trash, under the name it lost, until it is restored,
    /// purged or its retention passes ([`TrashEntry`]).
    Trash,
}

/// An inode in the trash (`T 0 ino`): where it was and when it went. Written by the state
/// machine from the record that put it there, so every region holds the same.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TrashEntry {
    /// The directory it was in and its name there.
    pub parent: Ino,
    pub name: Vec<u8>,
    /// The commit time of the change that trashed it (ns since the epoch).
    pub deleted_ns: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum Change {
    Format {
        format: Format,
        root: Attr,
    },
    /// Attributes changed (chmod, chown, utimes) without a size change.
    SetAttr {
        ino: Ino,
        attr: Attr,
    },
    /// Size changed: chunks from `first_dropped_chunk` on are deleted; `hole` hides the
    /// old bytes past the new end inside the last chunk.
    Truncate {
        ino: Ino,
        attr: Attr,
        first_dropped_chunk: u32,
        hole: Option<(u32, SliceRef)>,
    },
    /// A new inode linked at `parent/name` (create, mknod, mkdir, symlink).
    Create {
        parent: Ino,
        name: Name,
        ino: Ino,
        attr: Attr,
        parent_attr: Attr,
        target: Option<Name>,
    },
    Link {
        parent: Ino,
        name: Name,
        ino: Ino,
        attr: Attr,
        parent_attr: Attr,
    },
    Unlink {
        parent: Ino,
        name: Name,
        ino: Ino,
        parent_attr: Attr,
        attr: Attr,
        unlinked: Unlinked,
    },
    Rmdir {
        parent: Ino,
        name: Name,
        ino: Ino,
        parent_attr: Attr,
    },
    Rename {
        src_parent: Ino,
        src_name: Name,
        dst_parent: Ino,
        dst_name: Name,
        ino: Ino,
        attr: Attr,
        src_parent_attr: Attr,
        dst_parent_attr: Attr,
        /// The inode that was at the destination: replaced, or swapped for RENAME_EXCHANGE.
        replaced: Option<Replaced>,
    },
    SetXattr {
        ino: Ino,
        name: Name,
        value: Vec<u8>,
        attr: Attr,
    },
    RemoveXattr {
        ino: Ino,
        name: Name,
        attr: Attr,
    },
    /// A written slice appended to a chunk.
    WriteSlice {
        ino: Ino,
        chunk: u32,
        slice: SliceRef,
        attr: Attr,
    },
    /// The first `replaced` slices of a chunk are replaced by `slices` (compaction).
    Compact {
        ino: Ino,
        chunk: u32,
        replaced: u32,
        slices: Vec<SliceRef>,
    },
    /// An unlinked inode whose last handle closed is deleted.
    DeleteInode {
        ino: Ino,
    },
    /// The blocks of these dead slices are deleted from the object store.
    PurgeSlices {
        ids: Vec<SliceId>,
    },
    /// Directory `ino` gets a quota, or its limits change. `usage` (space, inodes) is its
    /// subtree counted by the primary, for a new quota and a repair; None keeps the usage.
    SetQuota {
        ino: Ino,
        limits: QuotaLimits,
        usage: Option<(i64, i64)>,
    },
    /// Directory `ino`'s quota is removed.
    DeleteQuota {
        ino: Ino,
    },
    /// An inode in the trash gets a name again (`strait trash restore`): `attr` and
    /// `parent_attr` as after the link.
    Restore {
        ino: Ino,
        parent: Ino,
        name: Name,
        attr: Attr,
        parent_attr: Attr,
    },
    /// An inode leaves the trash for good (its retention passed, or `strait trash purge`):
    /// deleted, or kept for the handles open on it ([`Unlinked::Sustain`]).
    PurgeTrash {
        ino: Ino,
        unlinked: Unlinked,
    },
    /// How many days the trash keeps what is deleted (0: no trash; unset: 1).
    SetTrashDays {
        days: u32,
    },
    /// A clone begins (`strait clone`): `root`, nameless, becomes a copy of `src` as it is
    /// now ([`CloneJob`] holds the rest: where it goes, whose it is).
    CloneBegin {
        root: Ino,
        src: Ino,
        parent: Ino,
        name: Name,
        uid: u32,
        gid: u32,
        preserve: bool,
        /// The caller's name for this clone: only a call that gives it goes on with it.
        token: u64,
    },
    /// More of a clone's tree: each item a copy of its source as it is now, named in a
    /// directory of the clone; `stack` is where the walk of the source goes on.
    CloneStep {
        root: Ino,
        items: Vec<CloneItem>,
        stack: Vec<CloneFrame>,
    },
    /// A clone's tree is whole: `root` gets its name (`parent_attr` as after the link), and
    /// what the tree holds counts towards the quotas above from now on.
    CloneAttach {
        root: Ino,
        parent_attr: Attr,
    },
    /// A clone given up: these entries of its tree (directory, name) are deleted, a
    /// directory once it is empty; with `root_too`, the root (empty by then) and the job.
    CloneDrop {
        root: Ino,
        entries: Vec<(Ino, Name)>,
        root_too: bool,
    },
}

/// A clone being made (`I 0 root`): written by the state machine from the records that make
/// it, so every region holds the same, and a new primary can drop what an old one left.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CloneJob {
    /// What is cloned, and where the clone goes.
    pub src: Ino,
    pub parent: Ino,
    pub name: Vec<u8>,
    /// Whose the copies are (unless `preserve`: their sources' owners).
    pub uid: u32,
    pub gid: u32,
    pub preserve: bool,
    /// The caller's name for it: a call goes on with the clone only under the same token
    /// (one `strait clone` run), never with one an earlier run left.
    pub token: u64,
    /// When it began and when a record last added to it (ns since the epoch).
    pub started_ns: i64,
    pub touched_ns: i64,
    /// What the tree holds below its root (space as [`Attr::space`] counts it, inodes): what
    /// the quotas above the destination count once it is attached.
    pub space: i64,
    pub inodes: i64,
    /// The walk of the source: the directories not copied whole yet, deepest last.
    pub stack: Vec<CloneFrame>,
    /// Being dropped (given up, or left by a cloner that went away).
    pub dropping: bool,
}

/// A directory of a clone's source being copied: into `dst`, names after `after` left.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CloneFrame {
    pub src: Ino,
    pub dst: Ino,
    pub after: Option<Vec<u8>>,
}

/// One inode of a clone: `ino`, a copy of `src`, named `name` in the clone's directory
/// `parent`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CloneItem {
    pub src: Ino,
    pub ino: Ino,
    pub parent: Ino,
    pub name: Name,
}

/// The limits of a directory quota (0: no limit in that dimension).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaLimits {
    /// Bytes of the files, directories and symlinks under the directory (each rounded up to
    /// 4 KiB, as [`Attr::space`] counts them).
    pub space_max: u64,
    /// Inodes under the directory.
    pub inodes_max: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Replaced {
    pub ino: Ino,
    pub attr: Attr,
    pub exchange: bool,
    pub unlinked: Unlinked,
}

/// A dead slice waiting for its blocks to be deleted.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct DeadSlice {
    pub size: u32,
    pub freed_ns: i64,
}

impl ChangeRecord {
    /// The highest inode number and the highest slice id this record names (0 for none): a
    /// primary that applies records it lost raises its id counters past them, so it never
    /// hands out an id the log already used.
    pub fn highest_ids(&self) -> (Ino, SliceId) {
        let slices = |s: &[SliceRef]| s.iter().map(|s| s.id).max().unwrap_or(SliceId::HOLE);
        match &self.change {
            Change::Format { .. } => (crate::meta::ROOT_INO, SliceId::HOLE),
            Change::SetAttr { ino, .. }
            | Change::Create { ino, .. }
            | Change::Link { ino, .. }
            | Change::Unlink { ino, .. }
            | Change::Rmdir { ino, .. }
            | Change::SetXattr { ino, .. }
            | Change::RemoveXattr { ino, .. }
            | Change::DeleteInode { ino }
            | Change::Restore { ino, .. }
            | Change::PurgeTrash { ino, .. } => (*ino, SliceId::HOLE),
            Change::CloneBegin { root, .. }
            | Change::CloneAttach { root, .. }
            | Change::CloneDrop { root, .. } => (*root, SliceId::HOLE),
            Change::CloneStep { root, items, .. } => (
                items.iter().map(|i| i.ino).fold(*root, Ino::max),
                SliceId::HOLE,
            ),
            Change::SetQuota { .. } | Change::DeleteQuota { .. } | Change::SetTrashDays { .. } => {
                (0, SliceId::HOLE)
            }
            Change::Truncate { ino, hole, .. } => (
                *ino,
                hole.as_ref().map(|(_, s)| s.id).unwrap_or(SliceId::HOLE),
            ),
            Change::Rename { ino, replaced, .. } => (
                (*ino).max(replaced.as_ref().map(|r| r.ino).unwrap_or(0)),
                SliceId::HOLE,
            ),
            Change::WriteSlice { ino, slice, .. } => (*ino, slice.id),
            Change::Compact { ino, slices: s, .. } => (*ino, slices(s)),
            Change::PurgeSlices { ids } => (0, ids.iter().copied().max().unwrap_or(SliceId::HOLE)),
        }
    }

    pub fn encode(&self) -> Result<Vec<u8>> {
        let fail = |e: postcard::Error| Error::corrupt(format!("encode change record: {e}"));
        let mut out = postcard::to_stdvec(&(self.ts_ns, &self.change)).map_err(fail)?;
        if let Some(id) = &self.request {
            out.extend(postcard::to_stdvec(id.as_slice()).map_err(fail)?);
        }
        Ok(out)
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        let fail = |e: postcard::Error| Error::corrupt(format!("decode change record: {e}"));
        let ((ts_ns, change), rest): ((i64, Change), _) =
            postcard::take_from_bytes(b).map_err(fail)?;
        let request = if rest.is_empty() {
            None
        } else {
            let (id, rest): (&[u8], _) = postcard::take_from_bytes(rest).map_err(fail)?;
            if id.is_empty() || id.len() > REQUEST_ID_LEN_MAX || !rest.is_empty() {
                return Err(Error::corrupt(format!(
                    "decode change record: a request id of {} bytes (1 to {} allowed), then {} \
                     bytes more",
                    id.len(),
                    REQUEST_ID_LEN_MAX,
                    rest.len()
                )));
            }
            Some(id.to_vec())
        };
        Ok(ChangeRecord {
            ts_ns,
            change,
            request,
        })
    }
}

pub fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    postcard::to_stdvec(v).map_err(|e| Error::corrupt(format!("encode: {e}")))
}

pub fn decode<'a, T: Deserialize<'a>>(b: &'a [u8]) -> Result<T> {
    Ok(postcard::from_bytes(b)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records and chunk lists written before slice ids had a type of their own read back
    /// the same, and new ones are written byte for byte as before.
    #[test]
    fn slice_ids_encode_as_the_bare_u64_they_were() {
        // a purge record, as postcard wrote it with `ids: Vec<u64>`: ts 5 (zigzag 10),
        // variant 13, two ids, 1 and 300 (varint ac 02)
        let before = [0x0a, 0x0d, 0x02, 0x01, 0xac, 0x02];
        let rec = ChangeRecord {
            ts_ns: 5,
            change: Change::PurgeSlices {
                ids: vec![SliceId(1), SliceId(300)],
            },
            request: None,
        };
        assert_eq!(rec.encode().unwrap(), before);
        assert_eq!(ChangeRecord::decode(&before).unwrap(), rec);

        // with a request id: the same bytes, then the id (length 3, "m-1")
        let named = ChangeRecord {
            request: Some(b"m-1".to_vec()),
            ..rec.clone()
        };
        let bytes = named.encode().unwrap();
        assert_eq!(bytes[..before.len()], before);
        assert_eq!(bytes[before.len()..], [0x03, b'm', b'-', b'1']);
        assert_eq!(ChangeRecord::decode(&bytes).unwrap(), named);
        // a reader that knows nothing of ids reads the change
        let (ts, change): (i64, Change) = postcard::from_bytes(&bytes).unwrap();
        assert_eq!((ts, change), (rec.ts_ns, rec.change.clone()));
        // an id out of bounds, or bytes after it: corrupt
        let mut long = before.to_vec();
        long.push(65);
        long.extend([b'x'; 65]);
        let mut after = bytes.clone();
        after.push(0);
        let mut empty = before.to_vec();
        empty.push(0);
        for bad in [long, after, empty, bytes[..bytes.len() - 1].to_vec()] {
            let e = ChangeRecord::decode(&bad).expect_err("corrupt");
            assert!(e.to_string().contains("decode change record"), "{e}");
        }

        // a slice reference beside the struct it was with a u64 id
        #[derive(Serialize)]
        struct SliceRefU64 {
            id: u64,
            size: u32,
            off: u32,
            len: u32,
            pos: u32,
            crcs: Vec<u32>,
        }
        let old = SliceRefU64 {
            id: 1 << 33,
            size: 10,
            off: 1,
            len: 9,
            pos: 4,
            crcs: vec![0xdead_beef],
        };
        let new = SliceRef {
            id: SliceId(1 << 33),
            size: 10,
            off: 1,
            len: 9,
            pos: 4,
            crcs: vec![0xdead_beef],
        };
        let bytes = encode(&vec![old]).unwrap();
        assert_eq!(encode(&vec![new.clone()]).unwrap(), bytes);
        assert_eq!(decode::<Vec<SliceRef>>(&bytes).unwrap(), vec![new]);
    }
}
