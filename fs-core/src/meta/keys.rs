//! Key encoding of the metadata in the KV store. Every key is a group (a tag byte and a
//! big-endian u64 owner) followed by an optional suffix; see [`crate::kv`].

use super::types::Ino;

pub const ATTR: u8 = b'A';
pub const DENTRY: u8 = b'D';
pub const CHUNK: u8 = b'C';
pub const SYMLINK: u8 = b'S';
pub const XATTR: u8 = b'X';
/// Unlinked inodes kept alive by an open handle: `F 0 ino`.
pub const DELFILE: u8 = b'F';
/// Dead slices waiting for their blocks to be deleted: `K 0 id`.
pub const DEADSLICE: u8 = b'K';
/// Sessions of mounts: `E 0 sid`.
pub const SESSION: u8 = b'E';
/// flock table of an inode: `Q ino`.
pub const FLOCK: u8 = b'Q';
/// POSIX lock table of an inode: `W ino`.
pub const PLOCK: u8 = b'W';
/// Inodes on which a session holds locks: `Y sid ino`.
pub const LOCKED: u8 = b'Y';
/// Settings: `Z 0 name`.
pub const SETTING: u8 = b'Z';
/// Counters: `N 0 name`.
pub const COUNTER: u8 = b'N';

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
pub fn deadslice(id: u64) -> Vec<u8> {
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
pub const FORMAT: &str = "format";
