//! Key encoding: the mirror's keys in its engine (see the module docs of [`super`]). Block
//! keys are fs-core's (`strait_fs_core::layout::{block_key, parse_block_key}`).

use strait_fs_core::meta::{keys, Ino};
use strait_fs_core::{SliceId, Version};

// The tags are in fs-core's registry of every KV key tag.
pub(super) use strait_fs_core::kv::tags::{
    MIRROR_COPY as COPY, MIRROR_DELETE as DELETE, MIRROR_NAME as NAME, MIRROR_STATS as STATS,
    MIRROR_SYNCED as SYNCED,
};
/// The tag the marks had before they got their own ([`SYNCED`]): the change log's. A mark
/// was `L id index`, [`OLD_MARK_LEN`] bytes long (a change record's key is longer).
pub(super) const OLD_SYNCED: u8 = strait_fs_core::kv::tags::LOG;
pub(super) const OLD_MARK_LEN: usize = strait_fs_core::kv::GROUP_LEN + 4;
pub(super) const PENDING_BLOCKS: &str = "pending_blocks";
pub(super) const PENDING_BYTES: &str = "pending_bytes";
pub(super) const INDEXED: &str = "indexed";

pub(super) fn group(tag: u8, owner: u64) -> Vec<u8> {
    keys::group(tag, owner)
}

pub(super) fn copy_key(version: Version, id: SliceId, index: u32) -> Vec<u8> {
    let mut k = group(COPY, version.0);
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(&index.to_be_bytes());
    k
}

pub(super) fn delete_key(version: Version, id: SliceId) -> Vec<u8> {
    let mut k = group(DELETE, version.0);
    k.extend_from_slice(&id.to_be_bytes());
    k
}

pub(super) fn synced_key(id: SliceId, index: u32) -> Vec<u8> {
    let mut k = group(SYNCED, id.0);
    k.extend_from_slice(&index.to_be_bytes());
    k
}

pub(super) fn name_key(ino: Ino) -> Vec<u8> {
    group(NAME, ino)
}

pub(super) fn stat_key(name: &str) -> Vec<u8> {
    let mut k = group(STATS, 0);
    k.extend_from_slice(name.as_bytes());
    k
}

pub(super) fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)
        .and_then(|x| x.try_into().ok())
        .map(u32::from_be_bytes)
}
