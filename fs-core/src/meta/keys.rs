//! Key encoding of the metadata in the KV store. Every key is a group (a tag byte and a
//! big-endian u64 owner) followed by an optional suffix; see [`crate::kv`]. The tag bytes are
//! in [`crate::kv::tags`], with every other owner's.

use super::types::Ino;
use crate::SliceId;

// The tags are in the registry of every KV key tag.
pub use crate::kv::tags::{
    ATTR, CHUNK, CLONE, COUNTER, DEADSLICE, DELFILE, DENTRY, FLOCK, LOCKED, PLOCK, QUOTA, REQUEST,
    SESSION, SETTING, SLICEREF, SYMLINK, TRASH, XATTR,
};

pub fn group(tag: u8, owner: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(32);
    k.push(tag);
    k.extend_from_slice(&owner.to_be_bytes());
    k
}

pub fn attr(ino: Ino) -> Vec<u8> {
    group(ATTR, ino)
}
pub fn dentry(parent: Ino, name: &[u8]) -> Vec<u8> {
    let mut k = group(DENTRY, parent);
    k.extend_from_slice(name);
    k
}
pub fn chunk(ino: Ino, idx: u32) -> Vec<u8> {
    let mut k = group(CHUNK, ino);
    k.extend_from_slice(&idx.to_be_bytes());
    k
}
pub fn symlink(ino: Ino) -> Vec<u8> {
    group(SYMLINK, ino)
}
pub fn xattr(ino: Ino, name: &[u8]) -> Vec<u8> {
    let mut k = group(XATTR, ino);
    k.extend_from_slice(name);
    k
}
pub fn delfile(ino: Ino) -> Vec<u8> {
    let mut k = group(DELFILE, 0);
    k.extend_from_slice(&ino.to_be_bytes());
    k
}
pub fn deadslice(id: SliceId) -> Vec<u8> {
    let mut k = group(DEADSLICE, 0);
    k.extend_from_slice(&id.to_be_bytes());
    k
}
pub fn session(sid: u64) -> Vec<u8> {
    let mut k = group(SESSION, 0);
    k.extend_from_slice(&sid.to_be_bytes());
    k
}
pub fn flock(ino: Ino) -> Vec<u8> {
    group(FLOCK, ino)
}
pub fn plock(ino: Ino) -> Vec<u8> {
    group(PLOCK, ino)
}
pub fn locked(sid: u64, ino: Ino) -> Vec<u8> {
    let mut k = group(LOCKED, sid);
    k.extend_from_slice(&ino.to_be_bytes());
    k
}
/// `Y 0 "grace"` -> the time (ns, little-endian) from which the locks of this engine may be
/// missing (its metadata replaced, or its daemon restarted): for [`crate::meta::LOCK_GRACE`]
/// after it, only the mounts that held locks take them again (no session has id 0).
pub fn lock_grace() -> Vec<u8> {
    let mut k = group(LOCKED, 0);
    k.extend_from_slice(b"grace");
    k
}
pub fn setting(name: &str) -> Vec<u8> {
    let mut k = group(SETTING, 0);
    k.extend_from_slice(name.as_bytes());
    k
}
pub fn counter(name: &str) -> Vec<u8> {
    let mut k = group(COUNTER, 0);
    k.extend_from_slice(name.as_bytes());
    k
}

fn quota_key(ino: Ino, what: u8) -> Vec<u8> {
    let mut k = group(QUOTA, 0);
    k.extend_from_slice(&ino.to_be_bytes());
    k.push(what);
    k
}
/// `U 0 ino L` -> directory `ino`'s quota limits.
pub fn quota_limits(ino: Ino) -> Vec<u8> {
    quota_key(ino, b'L')
}
/// `U 0 ino S`: the space used under directory `ino` (a counter).
pub fn quota_space(ino: Ino) -> Vec<u8> {
    quota_key(ino, b'S')
}
/// `U 0 ino I`: the inodes under directory `ino` (a counter).
pub fn quota_inodes(ino: Ino) -> Vec<u8> {
    quota_key(ino, b'I')
}

/// `T 0 ino` -> the [`crate::changelog::TrashEntry`] of an inode in the trash.
pub fn trash(ino: Ino) -> Vec<u8> {
    let mut k = group(TRASH, 0);
    k.extend_from_slice(&ino.to_be_bytes());
    k
}

/// `M 0 id`: the chunk lists naming slice `id` beyond the first (a counter).
pub fn sliceref(id: SliceId) -> Vec<u8> {
    let mut k = group(SLICEREF, 0);
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// `I 0 root` -> the [`crate::changelog::CloneJob`] of a clone being made.
pub fn clone_job(root: Ino) -> Vec<u8> {
    let mut k = group(CLONE, 0);
    k.extend_from_slice(&root.to_be_bytes());
    k
}

/// Owners of the [`REQUEST`] groups: records by request id, the same by age, and the
/// table's own state.
pub const REQUESTS_BY_ID: u64 = 0;
pub const REQUESTS_BY_AGE: u64 = 1;
pub const REQUESTS_STATE: u64 = 2;

/// `R 0 id`: the record of request `id`.
pub fn request(id: &[u8]) -> Vec<u8> {
    let mut k = group(REQUEST, REQUESTS_BY_ID);
    k.extend_from_slice(id);
    k
}
/// `R 1 ts id`: request `id`, committed at `ts_ns`, in the records' age order.
pub fn request_by_age(ts_ns: u64, id: &[u8]) -> Vec<u8> {
    let mut k = group(REQUEST, REQUESTS_BY_AGE);
    k.extend_from_slice(&ts_ns.to_be_bytes());
    k.extend_from_slice(id);
    k
}
/// `R 2 name`: state of the request records ([`REQUEST_COUNT`], [`REQUESTS_LOST`]).
pub fn requests_state(name: &str) -> Vec<u8> {
    let mut k = group(REQUEST, REQUESTS_STATE);
    k.extend_from_slice(name.as_bytes());
    k
}

/// The u64 stored big-endian at `key[at..at + 8]`.
pub fn u64_at(key: &[u8], at: usize) -> Option<u64> {
    key.get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
}

pub const NEXT_INODE: &str = "next_inode";
pub const NEXT_SLICE: &str = "next_slice";
pub const NEXT_SESSION: &str = "next_session";
pub const USED_SPACE: &str = "used_space";
pub const TOTAL_INODES: &str = "total_inodes";
/// How many directories have a quota (a counter): none, and no change walks its ancestors.
pub const QUOTAS: &str = "quotas";
pub const FORMAT: &str = "format";
/// The setting of how many days the trash keeps what is deleted (a u32, big-endian; unset:
/// [`crate::meta::TRASH_DAYS_DEFAULT`]).
pub const TRASH_DAYS: &str = "trash_days";
/// How many request records there are (a counter).
pub const REQUEST_COUNT: &str = "count";
/// The commit time (an i64, ns) of the newest change whose request record may be gone
/// while the change is not (see `meta::requests`).
pub const REQUESTS_LOST: &str = "lost";
/// How many changes were committed under a request id that another change of this history
/// had committed under already (a counter): a change applied twice (see `meta::requests`).
pub const REQUESTS_TWICE: &str = "applied_twice";
