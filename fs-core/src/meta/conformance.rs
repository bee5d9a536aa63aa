//! The metadata conformance suite: one body of tests for the semantic layer, run against
//! every KV backend (memory and RocksDB in unit tests, Redis in the integration tests).
//! Each case takes a fresh, formatted engine from `make`.

use crate::clock::now_ns;
use std::sync::Arc;

use super::types::*;
use super::{Meta, MetaClient, MetaOptions};
use crate::changelog::{read_log, replay};
use crate::error::Error;
use crate::kv::DynKv;
use crate::{SliceId, Version};

/// A fresh formatted engine and the metadata API over it.
pub fn fresh(make: &dyn Fn() -> DynKv) -> (DynKv, Arc<Meta>) {
    let kv = make();
    Meta::format(&kv, test_format()).expect("format");
    let meta = Meta::open(kv.clone(), MetaOptions::default()).expect("open");
    meta.new_session("conformance").expect("session");
    (kv, meta)
}

pub fn test_format() -> Format {
    Format {
        name: "test".into(),
        uuid: "00000000000000000000000000000001".into(),
        data_url: "memory://".into(),
        block_size: 4 << 20,
        capacity_bytes: 0,
        trash_delay_s: 0,
        created_ns: 0,
    }
}

fn errno<T: std::fmt::Debug>(r: crate::Result<T>) -> i32 {
    match r {
        Err(Error::Sys(e)) => e,
        other => panic!("expected a POSIX error, got {other:?}"),
    }
}

/// Run every case.
pub fn run_all(make: &dyn Fn() -> DynKv) {
    format_twice_is_refused(make);
    create_lookup_and_names(make);
    directories_and_link_counts(make);
    rename_rules(make);
    hard_links_and_symlinks(make);
    every_kind_knows_its_directory(make);
    permissions(make);
    setattr_rules(make);
    xattrs(make);
    deferred_deletion_and_space(make);
    locks(make);
    outbox_replays_to_the_same_digest(make);
    request_records_commit_with_their_change(make);
    directory_quotas(make);
    trash_keeps_what_is_deleted(make);
    clones_share_their_slices(make);
}

pub fn format_twice_is_refused(make: &dyn Fn() -> DynKv) {
    let (kv, _) = fresh(make);
    let e = Meta::format(&kv, test_format()).unwrap_err();
    assert!(e.to_string().contains("already holds"), "{e}");
}

pub fn create_lookup_and_names(make: &dyn Fn() -> DynKv) {
    let (_, m) = fresh(make);
    let root = Ctx::root();
    let (ino, a) = m.create(&root, ROOT_INO, b"a", 0o644, 0o022).unwrap();
    assert_eq!(a.kind, FileKind::File);
    assert_eq!(a.perm, 0o644);
    assert_eq!(m.lookup(&root, ROOT_INO, b"a").unwrap().0, ino);
    assert_eq!(errno(m.lookup(&root, ROOT_INO, b"b")), libc::ENOENT);
    assert_eq!(
        errno(m.create(&root, ROOT_INO, b"a", 0o644, 0)),
        libc::EEXIST
    );
    // bad names are refused and change nothing
    let v = m.kv().last_version().unwrap();
    assert_eq!(
        errno(m.create(&root, ROOT_INO, b"x/y", 0o644, 0)),
        libc::EINVAL
    );
    assert_eq!(
        errno(m.create(&root, ROOT_INO, b"x\0y", 0o644, 0)),
        libc::EINVAL
    );
    assert_eq!(
        errno(m.create(&root, ROOT_INO, &[b'n'; 256], 0o644, 0)),
        libc::ENAMETOOLONG
    );
    assert!(m.create(&root, ROOT_INO, &[b'n'; 255], 0o644, 0).is_ok());
    assert_eq!(m.kv().last_version().unwrap(), v + 1);
    // paths through non-directories
    assert_eq!(
        errno(m.create(&root, ino, b"child", 0o644, 0)),
        libc::ENOTDIR
    );
    assert_eq!(errno(m.lookup(&root, ino, b"child")), libc::ENOTDIR);
    // mknod of every special kind
    for (name, mode) in [
        (&b"fifo"[..], libc::S_IFIFO | 0o600),
        (b"sock", libc::S_IFSOCK | 0o600),
        (b"chr", libc::S_IFCHR | 0o600),
        (b"blk", libc::S_IFBLK | 0o600),
    ] {
        let (_, a) = m.mknod(&root, ROOT_INO, name, mode, 0, 0x0102).unwrap();
        assert_eq!(a.mode(), mode);
        assert_eq!(a.rdev, 0x0102);
    }
    assert_eq!(
        errno(m.mknod(
            &Ctx::new(1, 1),
            ROOT_INO,
            b"chr2",
            libc::S_IFCHR | 0o600,
            0,
            1
        )),
        libc::EPERM
    );
}

pub fn directories_and_link_counts(make: &dyn Fn() -> DynKv) {
    let (_, m) = fresh(make);
    let root = Ctx::root();
    let (d, a) = m.mkdir(&root, ROOT_INO, b"d", 0o755, 0).unwrap();
    assert_eq!(a.nlink, 2);
    assert_eq!(m.getattr(ROOT_INO).unwrap().nlink, 3);
    let (sub, _) = m.mkdir(&root, d, b"sub", 0o755, 0).unwrap();
    assert_eq!(m.getattr(d).unwrap().nlink, 3);
    assert_eq!(m.lookup(&root, sub, b"..").unwrap().0, d);
    assert_eq!(m.lookup(&root, sub, b".").unwrap().0, sub);
    m.create(&root, d, b"f", 0o644, 0).unwrap();
    let names: Vec<Vec<u8>> = m
        .readdir(&root, d)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec![b"f".to_vec(), b"sub".to_vec()]);
    assert_eq!(errno(m.rmdir(&root, ROOT_INO, b"d")), libc::ENOTEMPTY);
    assert_eq!(errno(m.unlink(&root, ROOT_INO, b"d")), libc::EISDIR);
    assert_eq!(errno(m.rmdir(&root, d, b"f")), libc::ENOTDIR);
    m.unlink(&root, d, b"f").unwrap();
    m.rmdir(&root, d, b"sub").unwrap();
    assert_eq!(m.getattr(d).unwrap().nlink, 2);
    m.rmdir(&root, ROOT_INO, b"d").unwrap();
    assert_eq!(m.getattr(ROOT_INO).unwrap().nlink, 2);
    // in the trash: nameless, as a removed directory is
    assert_eq!(m.getattr(d).unwrap().nlink, 0);
    m.set_trash_days_versioned(&root, 0).unwrap();
    let (e, _) = m.mkdir(&root, ROOT_INO, b"e", 0o755, 0).unwrap();
    m.rmdir(&root, ROOT_INO, b"e").unwrap();
    assert_eq!(errno(m.getattr(e)), libc::ENOENT);
}

pub fn rename_rules(make: &dyn Fn() -> DynKv) {
    let (_, m) = fresh(make);
    let root = Ctx::root();
    let (a, _) = m.mkdir(&root, ROOT_INO, b"a", 0o755, 0).unwrap();
    let (b, _) = m.mkdir(&root, a, b"b", 0o755, 0).unwrap();
    let (f, _) = m.create(&root, ROOT_INO, b"f", 0o644, 0).unwrap();
    let (g, _) = m.create(&root, ROOT_INO, b"g", 0o644, 0).unwrap();
    m.release(f).unwrap();
    m.release(g).unwrap();
    // a directory may not move under itself
    assert_eq!(
        errno(m.rename(&root, ROOT_INO, b"a", b, b"a2", 0)),
        libc::EINVAL
    );
    // replacing a file
    m.rename(&root, ROOT_INO, b"f", ROOT_INO, b"g", 0).unwrap();
    assert_eq!(m.lookup(&root, ROOT_INO, b"g").unwrap().0, f);
    // the file replaced is in the trash, nameless
    assert_eq!(m.getattr(g).unwrap().nlink, 0);
    assert!(m.trash_entry(g).unwrap().is_some());
    // file over directory and directory over file
    assert_eq!(
        errno(m.rename(&root, ROOT_INO, b"g", ROOT_INO, b"a", 0)),
        libc::EISDIR
    );
    assert_eq!(
        errno(m.rename(&root, a, b"b", ROOT_INO, b"g", 0)),
        libc::ENOTDIR
    );
    // directory move across parents fixes link counts and ".."
    m.rename(&root, a, b"b", ROOT_INO, b"b", 0).unwrap();
    assert_eq!(m.getattr(a).unwrap().nlink, 2);
    assert_eq!(m.getattr(ROOT_INO).unwrap().nlink, 4);
    assert_eq!(m.lookup(&root, b, b"..").unwrap().0, ROOT_INO);
    // over a non-empty directory
    m.create(&root, a, b"x", 0o644, 0).unwrap();
    assert_eq!(
        errno(m.rename(&root, ROOT_INO, b"b", ROOT_INO, b"a", 0)),
        libc::ENOTEMPTY
    );
    // NOREPLACE and EXCHANGE
    assert_eq!(
        errno(m.rename(&root, ROOT_INO, b"g", a, b"x", libc::RENAME_NOREPLACE)),
        libc::EEXIST
    );
    let x = m.lookup(&root, a, b"x").unwrap().0;
    m.rename(&root, ROOT_INO, b"g", a, b"x", libc::RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(m.lookup(&root, a, b"x").unwrap().0, f);
    assert_eq!(m.lookup(&root, ROOT_INO, b"g").unwrap().0, x);
    assert_eq!(
        errno(m.rename(&root, ROOT_INO, b"g", a, b"nope", libc::RENAME_EXCHANGE)),
        libc::ENOENT
    );
    // exchanging a directory and a file across parents moves the link count with the directory
    m.rename(&root, ROOT_INO, b"b", a, b"x", libc::RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(m.getattr(a).unwrap().nlink, 3);
    assert_eq!(m.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_eq!(m.getattr(b).unwrap().parent, a);
    // renaming a name onto another link of the same inode does nothing
    m.link(&root, f, ROOT_INO, b"f2").unwrap();
    m.rename(&root, ROOT_INO, b"f2", ROOT_INO, b"b", 0).unwrap();
    assert_eq!(m.getattr(f).unwrap().nlink, 2);
    assert_eq!(m.lookup(&root, ROOT_INO, b"f2").unwrap().0, f);
}

pub fn hard_links_and_symlinks(make: &dyn Fn() -> DynKv) {
    let (_, m) = fresh(make);
    let root = Ctx::root();
    let (f, _) = m.create(&root, ROOT_INO, b"f", 0o644, 0).unwrap();
    let a = m.link(&root, f, ROOT_INO, b"l").unwrap();
    assert_eq!(a.nlink, 2);
    let (d, _) = m.mkdir(&root, ROOT_INO, b"d", 0o755, 0).unwrap();
    assert_eq!(errno(m.link(&root, d, ROOT_INO, b"dl")), libc::EPERM);
    m.unlink(&root, ROOT_INO, b"f").unwrap();
    assert_eq!(m.getattr(f).unwrap().nlink, 1);
    let (s, a) = m.symlink(&root, ROOT_INO, b"s", b"/some/where").unwrap();
    assert_eq!(a.kind, FileKind::Symlink);
    assert_eq!(a.length, 11);
    assert_eq!(m.readlink(s).unwrap(), b"/some/where");
    assert_eq!(errno(m.readlink(f)), libc::EINVAL);
    assert_eq!(
        errno(m.symlink(&root, ROOT_INO, b"s2", &[b'x'; 4097])),
        libc::ENAMETOOLONG
    );
}

/// Every kind of inode records the directory of its entry, and a rename moves it (a
/// subtree's confinement checks an inode number by its parents).
pub fn every_kind_knows_its_directory(make: &dyn Fn() -> DynKv) {
    let (_, m) = fresh(make);
    let root = Ctx::root();
    let (a, _) = m.mkdir(&root, ROOT_INO, b"a", 0o755, 0).unwrap();
    let (b, _) = m.mkdir(&root, ROOT_INO, b"b", 0o755, 0).unwrap();
    let (f, fa) = m.create(&root, a, b"f", 0o644, 0).unwrap();
    assert_eq!(fa.parent, a);
    let (s, sa) = m.symlink(&root, a, b"s", b"t").unwrap();
    assert_eq!(sa.parent, a);
    let (n, na) = m
        .mknod(&root, a, b"n", libc::S_IFIFO | 0o644, 0, 0)
        .unwrap();
    assert_eq!(na.parent, a);
    // a rename moves it; within one directory it stays
    m.rename(&root, a, b"f", b, b"f", 0).unwrap();
    assert_eq!(m.getattr(f).unwrap().parent, b);
    m.rename(&root, b, b"f", b, b"g", 0).unwrap();
    assert_eq!(m.getattr(f).unwrap().parent, b);
    // an exchange moves both
    m.rename(&root, a, b"s", b, b"g", libc::RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(m.getattr(s).unwrap().parent, b);
    assert_eq!(m.getattr(f).unwrap().parent, a);
    // a second link leaves it at the first; moving the second link does not move it
    m.link(&root, n, b, b"n2").unwrap();
    assert_eq!(m.getattr(n).unwrap().parent, a);
    m.rename(&root, b, b"n2", ROOT_INO, b"n3", 0).unwrap();
    assert_eq!(m.getattr(n).unwrap().parent, a);
    m.rename(&root, a, b"n", ROOT_INO, b"n4", 0).unwrap();
    assert_eq!(m.getattr(n).unwrap().parent, ROOT_INO);
}

pub fn permissions(make: &dyn Fn() -> DynKv) {
    let (_, m) = fresh(make);
    let root = Ctx::root();
    let alice = Ctx::new(1000, 1000);
    let bob = Ctx::new(1001, 1001);
    let (d, _) = m.mkdir(&root, ROOT_INO, b"d", 0o755, 0).unwrap();
    assert_eq!(errno(m.create(&alice, d, b"x", 0o644, 0)), libc::EACCES);
    m.setattr(
        &root,
        d,
        &SetAttr {
            mode: Some(0o1777),
            ..Default::default()
        },
    )
    .unwrap();
    let (af, _) = m.create(&alice, d, b"alice", 0o600, 0).unwrap();
    assert_eq!(m.getattr(af).unwrap().uid, 1000);
    // sticky directory: bob may not remove or rename alice's file
    assert_eq!(errno(m.unlink(&bob, d, b"alice")), libc::EPERM);
    assert_eq!(
        errno(m.rename(&bob, d, b"alice", d, b"mine", 0)),
        libc::EPERM
    );
    // open checks the mode bits
    assert_eq!(errno(m.open_inode(&bob, af, libc::O_RDONLY)), libc::EACCES);
    assert!(m.open_inode(&alice, af, libc::O_RDWR).is_ok());
    m.release(af).unwrap();
    // search permission on a directory is needed for lookups
    let (private, _) = m.mkdir(&alice, d, b"private", 0o700, 0).unwrap();
    m.create(&alice, private, b"f", 0o644, 0).unwrap();
    assert_eq!(errno(m.lookup(&bob, private, b"f")), libc::EACCES);
    // supplementary groups count
    let (g, _) = m.mkdir(&root, ROOT_INO, b"g", 0o770, 0).unwrap();
    m.setattr(
        &root,
        g,
        &SetAttr {
            gid: Some(500),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(errno(m.create(&bob, g, b"x", 0o644, 0)), libc::EACCES);
    let bob_in_500 = Ctx {
        groups: vec![500],
        ..bob.clone()
    };
    assert!(m.create(&bob_in_500, g, b"x", 0o644, 0).is_ok());
    // setgid directories pass their group on, and the bit to subdirectories
    m.setattr(
        &root,
        g,
        &SetAttr {
            mode: Some(0o2777),
            ..Default::default()
        },
    )
    .unwrap();
    let (sub, a) = m.mkdir(&alice, g, b"sub", 0o755, 0).unwrap();
    assert_eq!(a.gid, 500);
    assert_ne!(a.perm as u32 & libc::S_ISGID, 0);
    let (_, a) = m.create(&alice, sub, b"file", 0o2755, 0).unwrap();
    assert_eq!(a.gid, 500);
    // alice is not in group 500: a non-directory loses the setgid bit she asked for
    assert_eq!(a.perm as u32 & libc::S_ISGID, 0);
}

pub fn setattr_rules(make: &dyn Fn() -> DynKv) {
    let (_, m) = fresh(make);
    let root = Ctx::root();
    let alice = Ctx::new(1000, 1000);
    let bob = Ctx::new(1001, 1001);
    m.setattr(
        &root,
        ROOT_INO,
        &SetAttr {
            mode: Some(0o777),
            ..Default::default()
        },
    )
    .unwrap();
    let (f, _) = m.create(&alice, ROOT_INO, b"f", 0o644, 0).unwrap();
    assert_eq!(
        errno(m.setattr(
            &bob,
            f,
            &SetAttr {
                mode: Some(0o777),
                ..Default::default()
            }
        )),
        libc::EPERM
    );
    assert_eq!(
        errno(m.setattr(
            &alice,
            f,
            &SetAttr {
                uid: Some(1001),
                ..Default::default()
            }
        )),
        libc::EPERM
    );
    assert_eq!(
        errno(m.setattr(
            &alice,
            f,
            &SetAttr {
                gid: Some(7),
                ..Default::default()
            }
        )),
        libc::EPERM
    );
    let alice7 = Ctx {
        groups: vec![7],
        ..alice.clone()
    };
    m.setattr(
        &alice7,
        f,
        &SetAttr {
            gid: Some(7),
            ..Default::default()
        },
    )
    .unwrap();
    // chown clears setuid
    m.setattr(
        &alice,
        f,
        &SetAttr {
            mode: Some(0o4755),
            ..Default::default()
        },
    )
    .unwrap();
    let a = m
        .setattr(
            &root,
            f,
            &SetAttr {
                uid: Some(1001),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.perm, 0o755);
    // explicit times need ownership; "now" needs write access
    assert_eq!(
        errno(m.setattr(
            &alice,
            f,
            &SetAttr {
                mtime: Some(TimeSet::At(5)),
                ..Default::default()
            }
        )),
        libc::EPERM
    );
    assert_eq!(
        errno(m.setattr(
            &alice,
            f,
            &SetAttr {
                mtime: Some(TimeSet::Now),
                ..Default::default()
            }
        )),
        libc::EACCES
    );
    let a = m
        .setattr(
            &bob,
            f,
            &SetAttr {
                atime: Some(TimeSet::At(5)),
                mtime: Some(TimeSet::At(7)),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((a.atime_ns, a.mtime_ns), (5, 7));
    // truncation needs write permission unless done through a handle
    assert_eq!(
        errno(m.setattr(
            &alice,
            f,
            &SetAttr {
                size: Some(10),
                ..Default::default()
            }
        )),
        libc::EACCES
    );
    let a = m
        .setattr(
            &bob,
            f,
            &SetAttr {
                size: Some(10),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.length, 10);
    assert_eq!(
        errno(m.setattr(
            &root,
            f,
            &SetAttr {
                size: Some(FILE_SIZE_MAX + 1),
                ..Default::default()
            }
        )),
        libc::EFBIG
    );
    assert_eq!(
        errno(m.setattr(
            &root,
            ROOT_INO,
            &SetAttr {
                size: Some(0),
                ..Default::default()
            }
        )),
        libc::EISDIR
    );
}

pub fn xattrs(make: &dyn Fn() -> DynKv) {
    let (_, m) = fresh(make);
    let root = Ctx::root();
    let (f, _) = m.create(&root, ROOT_INO, b"f", 0o644, 0).unwrap();
    m.setxattr(&root, f, b"user.a", b"1", 0).unwrap();
    assert_eq!(
        errno(m.setxattr(&root, f, b"user.a", b"2", libc::XATTR_CREATE)),
        libc::EEXIST
    );
    assert_eq!(
        errno(m.setxattr(&root, f, b"user.b", b"2", libc::XATTR_REPLACE)),
        libc::ENODATA
    );
    m.setxattr(&root, f, b"user.a", b"3", libc::XATTR_REPLACE)
        .unwrap();
    m.setxattr(&root, f, b"user.b", b"", libc::XATTR_CREATE)
        .unwrap();
    assert_eq!(m.getxattr(&root, f, b"user.a").unwrap(), b"3");
    assert_eq!(m.getxattr(&root, f, b"user.b").unwrap(), b"");
    assert_eq!(
        m.listxattr(&root, f).unwrap(),
        vec![b"user.a".to_vec(), b"user.b".to_vec()]
    );
    m.removexattr(&root, f, b"user.a").unwrap();
    assert_eq!(errno(m.getxattr(&root, f, b"user.a")), libc::ENODATA);
    assert_eq!(errno(m.removexattr(&root, f, b"user.a")), libc::ENODATA);
    assert_eq!(
        errno(m.setxattr(&Ctx::new(5, 5), f, b"user.c", b"x", 0)),
        libc::EACCES
    );
    assert_eq!(
        errno(m.setxattr(&Ctx::new(5, 5), f, b"trusted.c", b"x", 0)),
        libc::EPERM
    );
    assert_eq!(
        errno(m.setxattr(&root, f, b"user.big", &vec![0u8; 65537], 0)),
        libc::E2BIG
    );
}

pub fn deferred_deletion_and_space(make: &dyn Fn() -> DynKv) {
    let (_, m) = fresh(make);
    let root = Ctx::root();
    // what is deleted goes at once (the trash keeps it otherwise: trash_keeps_what_is_deleted)
    m.set_trash_days_versioned(&root, 0).unwrap();
    let before = m.statfs().unwrap();
    let (f, _) = m.create(&root, ROOT_INO, b"f", 0o644, 0).unwrap();
    let slice = SliceRef {
        id: m.next_slice_id().unwrap(),
        size: 10000,
        off: 0,
        len: 10000,
        pos: 0,
        crcs: vec![7],
    };
    // a slice reference that does not fit its chunk or its blocks is refused
    for bad in [
        SliceRef {
            crcs: vec![7, 8],
            ..slice.clone()
        },
        SliceRef {
            off: 1,
            ..slice.clone()
        },
        SliceRef {
            pos: 64 << 20,
            ..slice.clone()
        },
    ] {
        let e = m.write_slice(f, 0, bad, now_ns()).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{e:?}");
        assert_eq!(e.errno(), libc::EINVAL);
    }
    assert_eq!(m.getattr(f).unwrap().length, 0);
    m.write_slice(f, 0, slice, now_ns()).unwrap();
    assert_eq!(m.getattr(f).unwrap().length, 10000);
    let s = m.statfs().unwrap();
    assert_eq!(s.inodes, before.inodes + 1);
    assert_eq!(s.used_bytes, before.used_bytes + 12288);
    // an open with chunk 0 reads both in one snapshot
    let (a, c0) = m
        .open_inode_with_chunk0(&root, f, libc::O_RDONLY, true)
        .unwrap();
    assert_eq!((a.length, c0.map(|c| c.len())), (10000, Some(1)));
    m.release(f).unwrap();
    // unlinked while open: the inode lives on until the last close
    m.unlink(&root, ROOT_INO, b"f").unwrap();
    let a = m.getattr(f).unwrap();
    assert_eq!(a.nlink, 0);
    assert!(m.dead_slices(i64::MAX, 10).unwrap().is_empty());
    assert_eq!(m.read_chunk(f, 0).unwrap().len(), 1);
    m.release(f).unwrap();
    assert_eq!(errno(m.getattr(f)), libc::ENOENT);
    // a gone file's chunks are not empty ones: those read as zeros up to a length the
    // reader learned before (at a mirror, the deletion can arrive between an open and a read)
    assert_eq!(errno(m.read_chunk(f, 0)), libc::ENOENT);
    assert_eq!(errno(m.read_chunk(f, 1)), libc::ENOENT);
    assert_eq!(
        errno(m.open_inode_with_chunk0(&root, f, libc::O_RDONLY, true)),
        libc::ENOENT
    );
    assert_eq!(m.dead_slices(i64::MAX, 10).unwrap().len(), 1);
    let s = m.statfs().unwrap();
    assert_eq!((s.inodes, s.used_bytes), (before.inodes, before.used_bytes));
    // truncation frees whole chunks and hides the tail of the last one
    let (g, _) = m.create(&root, ROOT_INO, b"g", 0o644, 0).unwrap();
    let chunk = crate::layout::CHUNK_SIZE;
    for idx in 0..2 {
        let s = SliceRef {
            id: m.next_slice_id().unwrap(),
            size: 100,
            off: 0,
            len: 100,
            pos: 0,
            crcs: vec![1],
        };
        m.write_slice(g, idx, s, now_ns()).unwrap();
    }
    assert_eq!(m.getattr(g).unwrap().length, chunk + 100);
    m.setattr(
        &root,
        g,
        &SetAttr {
            size: Some(50),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(m.read_chunk(g, 1).unwrap().is_empty());
    let c0 = m.read_chunk(g, 0).unwrap();
    assert_eq!(
        c0.last().map(|s| (s.id, s.pos, s.len)),
        Some((SliceId::HOLE, 50, chunk as u32 - 50))
    );
    assert_eq!(m.dead_slices(i64::MAX, 10).unwrap().len(), 2);
    let ids: Vec<SliceId> = m
        .dead_slices(i64::MAX, 10)
        .unwrap()
        .into_iter()
        .map(|d| d.0)
        .collect();
    m.purge_slices(ids).unwrap();
    assert!(m.dead_slices(i64::MAX, 10).unwrap().is_empty());
    m.release(g).unwrap();
}

pub fn locks(make: &dyn Fn() -> DynKv) {
    let (_, m) = fresh(make);
    let root = Ctx::root();
    let (f, _) = m.create(&root, ROOT_INO, b"f", 0o644, 0).unwrap();
    m.setlk(f, 1, 100, LockType::Write, 0, 99).unwrap();
    assert_eq!(
        errno(m.setlk(f, 2, 200, LockType::Read, 50, 50)),
        libc::EAGAIN
    );
    let c = m.getlk(f, 2, LockType::Read, 0, 10).unwrap().unwrap();
    assert_eq!((c.pid, c.start, c.end), (100, 0, 99));
    m.setlk(f, 2, 200, LockType::Read, 100, 200).unwrap();
    m.release_posix_locks(f, 1).unwrap();
    m.setlk(f, 2, 200, LockType::Write, 0, 10).unwrap();
    m.flock(f, 10, LockType::Write).unwrap();
    assert_eq!(errno(m.flock(f, 11, LockType::Read)), libc::EAGAIN);
    m.flock(f, 10, LockType::Unlock).unwrap();
    m.flock(f, 11, LockType::Read).unwrap();
    // a closed session's locks go away
    m.close_session_versioned(m.session_id()).unwrap();
    assert!(m
        .getlk(f, 99, LockType::Write, 0, u64::MAX)
        .unwrap()
        .is_none());
}

/// Replaying the whole outbox into an empty engine yields the same digest.
pub fn outbox_replays_to_the_same_digest(make: &dyn Fn() -> DynKv) {
    let (kv, m) = fresh(make);
    let root = Ctx::root();
    let (d, _) = m.mkdir(&root, ROOT_INO, b"dir", 0o755, 0).unwrap();
    let (f, _) = m.create(&root, d, b"file", 0o640, 0).unwrap();
    let s = SliceRef {
        id: m.next_slice_id().unwrap(),
        size: 5,
        off: 0,
        len: 5,
        pos: 3,
        crcs: vec![9],
    };
    m.write_slice(f, 0, s, now_ns()).unwrap();
    m.link(&root, f, ROOT_INO, b"hard").unwrap();
    m.symlink(&root, d, b"sym", b"../hard").unwrap();
    m.setxattr(&root, f, b"user.k", b"v", 0).unwrap();
    m.rename(&root, d, b"file", ROOT_INO, b"moved", 0).unwrap();
    m.setattr(
        &root,
        f,
        &SetAttr {
            mode: Some(0o600),
            size: Some(2),
            ..Default::default()
        },
    )
    .unwrap();
    m.mknod(&root, d, b"fifo", libc::S_IFIFO | 0o644, 0, 0)
        .unwrap();
    m.unlink(&root, ROOT_INO, b"hard").unwrap();
    m.mkdir(&root, d, b"empty", 0o700, 0).unwrap();
    m.rename(&root, d, b"empty", ROOT_INO, b"e2", 0).unwrap();
    m.rmdir(&root, ROOT_INO, b"e2").unwrap();
    m.release(f).unwrap();

    let records = read_log(kv.as_ref(), Version::ZERO, usize::MAX).unwrap();
    assert_eq!(Version(records.len() as u64), kv.last_version().unwrap());
    let versions: Vec<Version> = records.iter().map(|r| r.0).collect();
    assert_eq!(
        versions,
        (1..=records.len() as u64).map(Version).collect::<Vec<_>>(),
        "versions are gapless"
    );
    let replica = make();
    replay(replica.as_ref(), &records).unwrap();
    assert_eq!(Meta::digest(&kv).unwrap(), Meta::digest(&replica).unwrap());
    assert_eq!(replica.last_version().unwrap(), kv.last_version().unwrap());
    // and a record out of order is refused by the replica without changing it
    let before = Meta::digest(&replica).unwrap();
    let mut bad = records[1].1.clone();
    bad.ts_ns += 1;
    let r = replica.txn(&mut |t| crate::changelog::apply(t, &bad));
    assert!(r.is_err(), "re-applying a create must be refused");
    assert_eq!(Meta::digest(&replica).unwrap(), before);
}

/// A change made under a request id commits its record (with the change's version and its
/// result); a call that fails writes none; the sweep removes them, outside the tree's digest.
pub fn request_records_commit_with_their_change(make: &dyn Fn() -> DynKv) {
    use super::requests::{Lookup, Outcome};
    let (kv, m) = fresh(make);
    let root = Ctx::root();
    let (a, _) = m.create(&root, ROOT_INO, b"a", 0o644, 0).unwrap();
    let (b, _) = m.create(&root, ROOT_INO, b"b", 0o644, 0).unwrap();
    let done = m
        .for_request("x-1")
        .rename_versioned(&root, ROOT_INO, b"a", ROOT_INO, b"b", libc::RENAME_EXCHANGE)
        .unwrap();
    let made = m
        .for_request("x-2")
        .mkdir_versioned(&root, ROOT_INO, b"d", 0o755, 0)
        .unwrap();
    let now = now_ns();
    let Lookup::Committed(r) = m.request_lookup("x-1", now, true).unwrap() else {
        panic!("no record for x-1");
    };
    assert_eq!((Some(r.version), r.outcome), (done.version, Outcome::Done));
    let Lookup::Committed(r) = m.request_lookup("x-2", now, false).unwrap() else {
        panic!("no record for x-2");
    };
    assert_eq!(Some(r.version), made.version);
    assert_eq!(r.outcome, Outcome::Entry(made.value.0, made.value.1));
    assert_eq!(m.lookup(&root, ROOT_INO, b"a").unwrap().0, b);
    assert_eq!(m.lookup(&root, ROOT_INO, b"b").unwrap().0, a);
    // a call that fails commits no record
    assert_eq!(
        errno(
            m.for_request("x-3")
                .mkdir_versioned(&root, ROOT_INO, b"d", 0o755, 0)
        ),
        libc::EEXIST
    );
    assert_eq!(
        m.request_lookup("x-3", now, true).unwrap(),
        Lookup::NotCommitted
    );
    assert_eq!(m.request_count().unwrap(), 2);
    // the sweep removes them all; the tree's digest does not see them
    let digest = Meta::digest(&kv).unwrap();
    let swept = m.sweep_requests(i64::MAX, u64::MAX, 1).unwrap();
    assert_eq!((swept.expired, swept.left), (1, 1));
    let swept = m.sweep_requests(i64::MAX, u64::MAX, 10).unwrap();
    assert_eq!((swept.expired, swept.left), (1, 0));
    assert_eq!(
        m.request_lookup("x-1", now, true).unwrap(),
        Lookup::NotCommitted
    );
    assert_eq!(Meta::digest(&kv).unwrap(), digest);
}

/// Write `len` bytes at `pos` of chunk 0 of `f` (one new slice).
fn write_at(m: &Meta, f: Ino, pos: u32, len: u32) -> crate::Result<Attr> {
    let s = SliceRef {
        id: m.next_slice_id()?,
        size: len,
        off: 0,
        len,
        pos,
        crcs: vec![1],
    };
    m.write_slice(f, 0, s, now_ns())
}

/// Directory quotas: a quota set on a tree that exists counts it; every change under it
/// keeps the count, in every quota above it (nested ones too); a change that would pass a
/// limit is refused with EDQUOT and changes nothing; a directory moved between different
/// quotas is refused with EXDEV; a recount finds and repairs a wrong usage; a replica that
/// applies the log holds the same quotas.
pub fn directory_quotas(make: &dyn Fn() -> DynKv) {
    use crate::changelog::QuotaLimits;
    let (kv, m) = fresh(make);
    let root = Ctx::root();
    let (team, _) = m.mkdir(&root, ROOT_INO, b"team", 0o777, 0).unwrap();
    let (sub, _) = m.mkdir(&root, team, b"sub", 0o777, 0).unwrap();
    let (f0, _) = m.create(&root, sub, b"f0", 0o644, 0).unwrap();
    write_at(&m, f0, 0, 10_000).unwrap();
    m.release(f0).unwrap();

    // only root sets a quota, and only on a directory
    let limits = QuotaLimits {
        space_max: 64 << 10,
        inodes_max: 5,
    };
    assert_eq!(
        errno(m.set_quota(&Ctx::new(1000, 1000), team, limits)),
        libc::EPERM
    );
    assert_eq!(errno(m.set_quota(&root, f0, limits)), libc::ENOTDIR);
    assert_eq!(m.quota(team).unwrap(), None);

    // a quota on a tree that exists counts it: sub (4 KiB, 1) and f0 (12 KiB, 1)
    let q = m.set_quota(&root, team, limits).unwrap();
    assert_eq!((q.used_space, q.used_inodes), (16_384, 2));
    let q = m
        .set_quota(
            &root,
            sub,
            QuotaLimits {
                space_max: 0,
                inodes_max: 3,
            },
        )
        .unwrap();
    assert_eq!((q.used_space, q.used_inodes), (12_288, 1));
    assert_eq!(m.quotas().unwrap().len(), 2);

    // creates count in both; the fourth inode under sub is refused by sub's own quota
    let (f1, _) = m.create(&root, sub, b"f1", 0o644, 0).unwrap();
    let (f2, _) = m.create(&root, sub, b"f2", 0o644, 0).unwrap();
    assert_eq!(errno(m.create(&root, sub, b"f3", 0o644, 0)), libc::EDQUOT);
    assert_eq!(errno(m.lookup(&root, sub, b"f3")), libc::ENOENT);
    // team holds 4 inodes of 5: one more directory, then nothing
    let (d2, _) = m.mkdir(&root, team, b"d2", 0o777, 0).unwrap();
    assert_eq!(errno(m.create(&root, team, b"x", 0o644, 0)), libc::EDQUOT);
    assert_eq!(errno(m.symlink(&root, d2, b"s", b"x")), libc::EDQUOT);
    let q = m.quota(team).unwrap().unwrap();
    assert_eq!((q.used_space, q.used_inodes), (16_384 + 4096, 5));

    // space: a write within the limit is taken, one past it refused, and nothing changes
    write_at(&m, f1, 0, 40_000).unwrap(); // 40 KiB: team at 60 KiB of 64
    assert_eq!(errno(write_at(&m, f1, 40_000, 10_000)), libc::EDQUOT);
    assert_eq!(m.getattr(f1).unwrap().length, 40_000);
    let grow = SetAttr {
        size: Some(1 << 20),
        ..Default::default()
    };
    assert_eq!(errno(m.setattr(&root, f2, &grow)), libc::EDQUOT);
    assert_eq!(m.getattr(f2).unwrap().length, 0);
    // rewriting bytes it has grows nothing: taken at the limit
    write_at(&m, f1, 0, 4096).unwrap();

    // an unlink frees its share
    m.unlink(&root, sub, b"f0").unwrap();
    let q = m.quota(team).unwrap().unwrap();
    assert_eq!((q.used_space, q.used_inodes), (4096 + 40_960 + 4096, 4));
    let q = m.quota(sub).unwrap().unwrap();
    assert_eq!((q.used_space, q.used_inodes), (40_960, 2));

    // a file moved out of sub into team leaves sub's count and stays in team's
    m.rename(&root, sub, b"f2", team, b"f2", 0).unwrap();
    assert_eq!(m.quota(sub).unwrap().unwrap().used_inodes, 1);
    assert_eq!(m.quota(team).unwrap().unwrap().used_inodes, 4);
    // out of every quota, and back into a full one: refused
    m.rename(&root, sub, b"f1", ROOT_INO, b"f1", 0).unwrap();
    let q = m.quota(team).unwrap().unwrap();
    assert_eq!((q.used_space, q.used_inodes), (8192, 3));
    let (big, _) = m.create(&root, ROOT_INO, b"big", 0o644, 0).unwrap();
    write_at(&m, big, 0, 60_000).unwrap();
    assert_eq!(
        errno(m.rename(&root, ROOT_INO, b"big", team, b"big", 0)),
        libc::EDQUOT
    );
    assert_eq!(m.lookup(&root, ROOT_INO, b"big").unwrap().0, big);
    // a rename that replaces a file is judged on its net effect: f1 (40 KiB) over the
    // empty team/f2 adds 40 KiB and no inode: 48 KiB of 64
    m.rename(&root, ROOT_INO, b"f1", team, b"f2", 0).unwrap();
    let q = m.quota(team).unwrap().unwrap();
    assert_eq!((q.used_space, q.used_inodes), (8192 + 40_960, 3));

    // a directory moves freely under the same quotas, and never between different ones
    // (into sub's quota, out of team's): its subtree's usage would go uncounted
    let (d3, _) = m.mkdir(&root, team, b"d3", 0o777, 0).unwrap();
    m.rename(&root, team, b"d2", d3, b"d2", 0).unwrap();
    m.rename(&root, d3, b"d2", team, b"d2", 0).unwrap();
    m.rmdir(&root, team, b"d3").unwrap();
    assert_eq!(
        errno(m.rename(&root, team, b"d2", sub, b"d2", 0)),
        libc::EXDEV
    );
    assert_eq!(
        errno(m.rename(&root, team, b"d2", ROOT_INO, b"d2", 0)),
        libc::EXDEV
    );
    // nor by an exchange that moves it the other way
    let (outside, _) = m.create(&root, ROOT_INO, b"outside", 0o644, 0).unwrap();
    assert_eq!(
        errno(m.rename(
            &root,
            ROOT_INO,
            b"outside",
            team,
            b"d2",
            libc::RENAME_EXCHANGE
        )),
        libc::EXDEV
    );
    // a hard link from under other quotas would leave a file there uncounted: EXDEV, as
    // XFS refuses links across project quotas
    assert_eq!(errno(m.link(&root, outside, team, b"l")), libc::EXDEV);
    m.unlink(&root, ROOT_INO, b"outside").unwrap();

    // a recount agrees; a wrong usage is found, and repaired by root only
    let c = m.check_quota(&root, team, false).unwrap();
    assert!(c.consistent(), "{c:?}");
    kv.txn(&mut |t| {
        t.add(&super::keys::quota_inodes(team), 7);
        Ok(())
    })
    .unwrap();
    let c = m.check_quota(&root, team, false).unwrap();
    assert!(!c.consistent() && !c.repaired, "{c:?}");
    assert_eq!(c.counted, (8192 + 40_960, 3));
    assert_eq!(
        errno(m.check_quota(&Ctx::new(1000, 1000), team, true)),
        libc::EPERM
    );
    assert!(m.check_quota(&root, team, true).unwrap().repaired);
    assert!(m.check_quota(&root, team, false).unwrap().consistent());

    // new limits keep the usage; below it, only what shrinks usage is taken
    let q = m
        .set_quota(
            &root,
            team,
            QuotaLimits {
                space_max: 4096,
                inodes_max: 0,
            },
        )
        .unwrap();
    assert_eq!((q.used_space, q.used_inodes), (8192 + 40_960, 3));
    assert_eq!(errno(m.mkdir(&root, team, b"y", 0o777, 0)), libc::EDQUOT);
    // (an empty file takes no space: it is taken)
    m.create(&root, team, b"z", 0o644, 0).unwrap();
    m.unlink(&root, team, b"z").unwrap();
    m.unlink(&root, team, b"f2").unwrap();

    // a replica that applies the log holds the same quotas, and the same digest
    let records = read_log(kv.as_ref(), Version::ZERO, usize::MAX).unwrap();
    let replica = make();
    replay(replica.as_ref(), &records).unwrap();
    let r = Meta::open(replica.clone(), MetaOptions::default()).unwrap();
    assert_eq!(r.quotas().unwrap(), m.quotas().unwrap());
    assert_eq!(Meta::digest(&kv).unwrap(), Meta::digest(&replica).unwrap());
    // and so does one loaded from a snapshot (a mirror's bootstrap, a dump, a backup); the
    // digest counts the quotas
    let mut dump = vec![];
    crate::snapshot::dump(kv.as_ref(), &mut dump).unwrap();
    let loaded = make();
    crate::snapshot::load(loaded.as_ref(), &mut dump.as_slice()).unwrap();
    let l = Meta::open(loaded.clone(), MetaOptions::default()).unwrap();
    assert_eq!(l.quotas().unwrap(), m.quotas().unwrap());
    let with = Meta::digest(&kv).unwrap();
    kv.txn(&mut |t| {
        t.add(&super::keys::quota_space(team), 1);
        Ok(())
    })
    .unwrap();
    assert_ne!(
        Meta::digest(&kv).unwrap(),
        with,
        "the digest left the quotas out"
    );
    kv.txn(&mut |t| {
        t.add(&super::keys::quota_space(team), -1);
        Ok(())
    })
    .unwrap();

    // removing a quota, or its directory, removes it everywhere
    assert_eq!(errno(m.delete_quota(&root, d2)), libc::ENODATA);
    m.delete_quota(&root, team).unwrap();
    m.unlink(&root, ROOT_INO, b"big").unwrap();
    m.rename(&root, team, b"d2", ROOT_INO, b"d2", 0).unwrap();
    m.rmdir(&root, team, b"sub").unwrap();
    assert!(m.quotas().unwrap().is_empty());
    let records = read_log(kv.as_ref(), Version::ZERO, usize::MAX).unwrap();
    let replica = make();
    replay(replica.as_ref(), &records).unwrap();
    let r = Meta::open(replica.clone(), MetaOptions::default()).unwrap();
    assert!(r.quotas().unwrap().is_empty());
    assert_eq!(Meta::digest(&kv).unwrap(), Meta::digest(&replica).unwrap());
}

/// The trash: an unlink, an rmdir and a rename over a file keep what they take away
/// (nameless, nlink 0, its chunks kept) in `/.trash`, seen only by root and its owner; the
/// trash itself is read-only; a restore gives the name back (EEXIST when taken, ENOENT while
/// its directory is in the trash, EDQUOT past a quota); a purge (root only) and the retention
/// delete it, a file still open at its last close; retention 0 deletes at once; a replica and
/// a snapshot hold the same trash.
pub fn trash_keeps_what_is_deleted(make: &dyn Fn() -> DynKv) {
    use super::trash_name;
    let (kv, m) = fresh(make);
    let root = Ctx::root();
    let alice = Ctx::new(1000, 1000);
    let bob = Ctx::new(2000, 2000);
    assert_eq!(m.trash_days().unwrap(), TRASH_DAYS_DEFAULT);
    let (d, _) = m.mkdir(&root, ROOT_INO, b"d", 0o777, 0).unwrap();
    let (f, _) = m.create(&alice, d, b"f", 0o644, 0).unwrap();
    write_at(&m, f, 0, 10_000).unwrap();
    let before = m.statfs().unwrap();

    // unlinked while open: nlink 0, in the trash, kept after its last close with its chunk
    m.unlink(&alice, d, b"f").unwrap();
    assert_eq!(m.getattr(f).unwrap().nlink, 0);
    m.release(f).unwrap();
    assert_eq!(m.getattr(f).unwrap().nlink, 0);
    assert_eq!(m.read_chunk(f, 0).unwrap().len(), 1);
    assert!(m.dead_slices(i64::MAX, 10).unwrap().is_empty());
    assert_eq!(m.statfs().unwrap(), before, "the trash's files count in df");
    assert_eq!(errno(m.lookup(&root, d, b"f")), libc::ENOENT);

    // /.trash: looked up at the root, not listed there; its entries by PARENT-INO-NAME
    let (t, ta) = m.lookup(&root, ROOT_INO, TRASH_NAME).unwrap();
    assert_eq!((t, ta.kind, ta.perm), (TRASH_INO, FileKind::Dir, 0o555));
    assert!(m
        .readdir(&root, ROOT_INO)
        .unwrap()
        .iter()
        .all(|e| e.name != TRASH_NAME));
    let fname = trash_name(d, f, b"f");
    assert_eq!(fname, format!("{d}-{f}-f").into_bytes());
    let names = |c: &Ctx| -> Vec<Vec<u8>> {
        m.readdir(c, TRASH_INO)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect()
    };
    assert_eq!(names(&root), vec![fname.clone()]);
    assert_eq!(names(&alice), vec![fname.clone()]);
    // another user sees nothing of it, and may not open it
    assert!(names(&bob).is_empty());
    assert_eq!(errno(m.lookup(&bob, TRASH_INO, &fname)), libc::EACCES);
    assert_eq!(errno(m.open_inode(&bob, f, libc::O_RDONLY)), libc::EACCES);
    let (got, ga) = m.lookup(&alice, TRASH_INO, &fname).unwrap();
    assert_eq!((got, ga.nlink, ga.length), (f, 0, 10_000));
    m.open_inode(&alice, f, libc::O_RDONLY).unwrap();
    m.release(f).unwrap();
    assert_eq!(
        errno(m.lookup(&root, TRASH_INO, format!("{d}-{f}-g").as_bytes())),
        libc::ENOENT
    );
    assert_eq!(errno(m.lookup(&root, TRASH_INO, b"junk")), libc::ENOENT);
    // a long name is cut to fit in the listing, and still found
    let long = vec![b'x'; NAME_LEN_MAX];
    let (lf, _) = m.create(&root, d, &long, 0o644, 0).unwrap();
    m.release(lf).unwrap();
    m.unlink(&root, d, &long).unwrap();
    let lname = trash_name(d, lf, &long);
    assert_eq!(lname.len(), NAME_LEN_MAX);
    assert_eq!(m.lookup(&root, TRASH_INO, &lname).unwrap().0, lf);

    // the trash is read-only, and its name at the root is taken
    assert_eq!(
        errno(m.create(&root, TRASH_INO, b"n", 0o644, 0)),
        libc::EPERM
    );
    assert_eq!(errno(m.unlink(&root, TRASH_INO, &fname)), libc::EPERM);
    assert_eq!(
        errno(m.rename(&root, TRASH_INO, &fname, d, b"back", 0)),
        libc::EPERM
    );
    assert_eq!(
        errno(m.mkdir(&root, ROOT_INO, TRASH_NAME, 0o755, 0)),
        libc::EEXIST
    );
    assert_eq!(
        errno(m.rename(&root, ROOT_INO, b"d", ROOT_INO, TRASH_NAME, 0)),
        libc::EPERM
    );
    assert_eq!(errno(m.link(&root, f, d, b"relink")), libc::ENOENT);

    // a file replaced by a rename goes there too, under the name it had
    let (g, _) = m.create(&alice, d, b"target", 0o644, 0).unwrap();
    m.release(g).unwrap();
    let (h, _) = m.create(&alice, d, b"new", 0o644, 0).unwrap();
    m.release(h).unwrap();
    m.rename(&alice, d, b"new", d, b"target", 0).unwrap();
    assert_eq!(
        m.trash_entry(g).unwrap().map(|e| (e.parent, e.name)),
        Some((d, b"target".to_vec()))
    );

    // rm -rf of a tree: the file, then its directory, each kept
    let (sub, _) = m.mkdir(&alice, d, b"sub", 0o755, 0).unwrap();
    let (x, _) = m.create(&alice, sub, b"x", 0o644, 0).unwrap();
    write_at(&m, x, 0, 100).unwrap();
    m.release(x).unwrap();
    m.unlink(&alice, sub, b"x").unwrap();
    let d_links = m.getattr(d).unwrap().nlink;
    m.rmdir(&alice, d, b"sub").unwrap();
    assert_eq!(m.getattr(d).unwrap().nlink, d_links - 1);
    assert_eq!(m.getattr(sub).unwrap().nlink, 0);
    // nothing is made in a directory in the trash (a mount holding its number)
    assert_eq!(
        errno(m.create(&alice, sub, b"late", 0o644, 0)),
        libc::ENOENT
    );

    // restore: its owner or root; the name back where it was, the bytes with it
    assert_eq!(errno(m.restore_versioned(&bob, f, None)), libc::EACCES);
    let a = m.restore_versioned(&alice, f, None).unwrap().value;
    assert_eq!((a.nlink, a.parent, a.length), (1, d, 10_000));
    assert_eq!(m.lookup(&root, d, b"f").unwrap().0, f);
    assert_eq!(m.read_chunk(f, 0).unwrap().len(), 1);
    assert_eq!(m.trash_entry(f).unwrap(), None);
    assert_eq!(errno(m.restore_versioned(&alice, f, None)), libc::ENOENT);
    // a file whose directory is in the trash waits for it; a directory comes back empty
    assert_eq!(errno(m.restore_versioned(&alice, x, None)), libc::ENOENT);
    let sa = m.restore_versioned(&alice, sub, None).unwrap().value;
    assert_eq!(sa.nlink, 2);
    assert_eq!(m.getattr(d).unwrap().nlink, d_links);
    m.restore_versioned(&alice, x, None).unwrap();
    assert_eq!(m.lookup(&root, sub, b"x").unwrap().1.length, 100);
    // a name taken (by the file that replaced it): EEXIST; into another directory instead
    assert_eq!(errno(m.restore_versioned(&alice, g, None)), libc::EEXIST);
    m.restore_versioned(&alice, g, Some(sub)).unwrap();
    assert_eq!(m.lookup(&root, sub, b"target").unwrap().0, g);
    // a quota holds for what comes back
    m.unlink(&alice, sub, b"target").unwrap();
    let used = m
        .set_quota(
            &root,
            sub,
            crate::changelog::QuotaLimits {
                space_max: 0,
                inodes_max: 1,
            },
        )
        .unwrap()
        .used_inodes;
    assert_eq!(used, 1);
    assert_eq!(errno(m.restore_versioned(&alice, g, None)), libc::EDQUOT);
    assert_eq!(
        errno(m.restore_versioned(&alice, g, Some(sub))),
        libc::EDQUOT
    );
    m.delete_quota(&root, sub).unwrap();

    // purge: root only; the inode goes, its slices die
    assert_eq!(errno(m.purge_trash_versioned(&alice, g)), libc::EPERM);
    let dead = m.dead_slices(i64::MAX, 100).unwrap().len();
    m.purge_trash_versioned(&root, lf).unwrap();
    assert_eq!(errno(m.getattr(lf)), libc::ENOENT);
    assert_eq!(errno(m.purge_trash_versioned(&root, lf)), libc::ENOENT);
    // the retention: nothing younger goes; older, it goes (one still open at its last close)
    let (k, _) = m.create(&alice, d, b"kept-open", 0o644, 0).unwrap();
    write_at(&m, k, 0, 10).unwrap();
    m.unlink(&alice, d, b"kept-open").unwrap();
    assert_eq!(m.expire_trash(now_ns(), 100).unwrap(), 0);
    let day = 86_400_000_000_000i64;
    let in_trash = m.trash_items(&root).unwrap().len();
    assert_eq!(in_trash, 2, "g and kept-open");
    assert_eq!(m.expire_trash(now_ns() + 2 * day, 1).unwrap(), 1);
    assert_eq!(
        m.expire_trash(now_ns() + 2 * day, 100).unwrap(),
        in_trash - 1
    );
    assert!(m.trash_items(&root).unwrap().is_empty());
    assert_eq!(errno(m.getattr(g)), libc::ENOENT);
    assert_eq!(m.getattr(k).unwrap().nlink, 0, "kept for its open handle");
    m.release(k).unwrap();
    assert_eq!(errno(m.getattr(k)), libc::ENOENT);
    assert!(m.dead_slices(i64::MAX, 100).unwrap().len() > dead);

    // retention 0: no trash; only root sets it
    assert_eq!(errno(m.set_trash_days_versioned(&alice, 0)), libc::EPERM);
    let (z, _) = m.create(&root, d, b"z", 0o644, 0).unwrap();
    m.release(z).unwrap();
    let (y, _) = m.create(&root, d, b"y", 0o644, 0).unwrap();
    m.release(y).unwrap();
    m.unlink(&root, d, b"y").unwrap();
    m.set_trash_days_versioned(&root, 0).unwrap();
    assert_eq!(m.trash_days().unwrap(), 0);
    m.unlink(&root, d, b"z").unwrap();
    assert_eq!(errno(m.getattr(z)), libc::ENOENT);
    // what it held goes at the next pass
    assert_eq!(m.trash_items(&root).unwrap().len(), 1);
    m.set_trash_days_versioned(&root, 3).unwrap();
    m.unlink(&root, d, b"f").unwrap();

    // a replica that applies the log, and one loaded from a snapshot, hold the same trash
    let records = read_log(kv.as_ref(), Version::ZERO, usize::MAX).unwrap();
    let replica = make();
    replay(replica.as_ref(), &records).unwrap();
    let r = Meta::open(replica.clone(), MetaOptions::default()).unwrap();
    assert_eq!(r.trash_items(&root).unwrap(), m.trash_items(&root).unwrap());
    assert_eq!(r.trash_days().unwrap(), 3);
    assert_eq!(Meta::digest(&kv).unwrap(), Meta::digest(&replica).unwrap());
    let mut dump = vec![];
    crate::snapshot::dump(kv.as_ref(), &mut dump).unwrap();
    let loaded = make();
    crate::snapshot::load(loaded.as_ref(), &mut dump.as_slice()).unwrap();
    let l = Meta::open(loaded.clone(), MetaOptions::default()).unwrap();
    assert_eq!(l.trash_items(&root).unwrap(), m.trash_items(&root).unwrap());
    assert_eq!(l.read_chunk(f, 0).unwrap().len(), 1);
    assert_eq!(Meta::digest(&kv).unwrap(), Meta::digest(&loaded).unwrap());
    // the digest counts the trash
    let with = Meta::digest(&kv).unwrap();
    kv.txn(&mut |t| {
        t.delete(&super::keys::trash(y));
        Ok(())
    })
    .unwrap();
    assert_ne!(
        Meta::digest(&kv).unwrap(),
        with,
        "the digest left the trash out"
    );
}

/// Clones: a file or a tree copied in the metadata, its chunks naming the source's slices
/// (a slice dies with the last chunk list naming it); the copies are the caller's; DST is
/// seen only once whole; a clone past a quota, of a source the caller may not read, or onto
/// a taken name is refused and leaves nothing; one left idle is dropped by a GC pass; a
/// replica and a snapshot hold the same shared slices and clones being made.
pub fn clones_share_their_slices(make: &dyn Fn() -> DynKv) {
    use super::CALL_BUDGET;
    use crate::changelog::slice_extra_refs;
    use std::time::Duration;
    let (kv, m) = fresh(make);
    let root = Ctx::root();
    let alice = Ctx::new(1000, 1000);
    let bob = Ctx::new(2000, 2000);
    m.set_trash_days_versioned(&root, 0).unwrap();
    let refs = |id: SliceId| crate::kv::read(kv.as_ref(), |t| slice_extra_refs(t, id)).unwrap();
    let (home, _) = m.mkdir(&root, ROOT_INO, b"home", 0o777, 0).unwrap();
    let (src, _) = m.mkdir(&alice, home, b"src", 0o755, 0).unwrap();
    let (a, _) = m.create(&alice, src, b"a", 0o4755, 0).unwrap();
    let aa = write_at(&m, a, 0, 10_000).unwrap();
    m.release(a).unwrap();
    m.setxattr(&alice, a, b"user.k", b"v", 0).unwrap();
    let (sub, _) = m.mkdir(&alice, src, b"sub", 0o755, 0).unwrap();
    let (b, _) = m.create(&alice, sub, b"b", 0o644, 0).unwrap();
    write_at(&m, b, 0, 5).unwrap();
    m.release(b).unwrap();
    m.symlink(&alice, src, b"l", b"a").unwrap();
    m.mkdir(&alice, src, b"e", 0o755, 0).unwrap();
    let a_slice = m.read_chunk(a, 0).unwrap()[0].id;
    let before = m.statfs().unwrap();

    // bob clones alice's tree into his directory: the copies are his, the slices shared
    let (bobs, _) = m.mkdir(&root, home, b"bob", 0o755, 0).unwrap();
    m.setattr(
        &root,
        bobs,
        &SetAttr {
            uid: Some(2000),
            gid: Some(2000),
            ..Default::default()
        },
    )
    .unwrap();
    let home_links = m.getattr(bobs).unwrap().nlink;
    let done = m
        .clone_versioned(&bob, src, (bobs, b"copy"), (false, 7), CALL_BUDGET)
        .unwrap();
    assert!(done.version.is_some());
    assert_eq!((done.value.inodes, done.value.done), (6, true));
    let (copy, ca) = m.lookup(&bob, bobs, b"copy").unwrap();
    assert_eq!((ca.uid, ca.gid, ca.nlink, ca.perm), (2000, 2000, 4, 0o755));
    assert_eq!(m.getattr(bobs).unwrap().nlink, home_links + 1);
    let names = |d: Ino| -> Vec<Vec<u8>> {
        let mut v: Vec<_> = m
            .readdir(&root, d)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        v.retain(|n| n != b"." && n != b"..");
        v.sort();
        v
    };
    assert_eq!(names(copy), names(src));
    let (ca_ino, caa) = m.lookup(&bob, copy, b"a").unwrap();
    assert_ne!(ca_ino, a);
    assert_eq!(caa.length, aa.length);
    assert_eq!(caa.perm, 0o755, "no set-user-ID program of another owner");
    assert_eq!(
        m.read_chunk(ca_ino, 0).unwrap(),
        m.read_chunk(a, 0).unwrap()
    );
    assert_eq!(m.getxattr(&bob, ca_ino, b"user.k").unwrap(), b"v");
    let (cl, _) = m.lookup(&bob, copy, b"l").unwrap();
    assert_eq!(m.readlink(cl).unwrap(), b"a");
    let (csub, _) = m.lookup(&bob, copy, b"sub").unwrap();
    assert_eq!(m.lookup(&bob, csub, b"b").unwrap().1.length, 5);
    assert_eq!(refs(a_slice), 1);
    assert_eq!(m.statfs().unwrap().inodes, before.inodes + 7);

    // each side changes alone; the slice dies with the last list naming it
    write_at(&m, ca_ino, 0, 3).unwrap();
    assert_eq!(m.read_chunk(a, 0).unwrap().len(), 1);
    assert_eq!(m.read_chunk(ca_ino, 0).unwrap().len(), 2);
    m.unlink(&alice, src, b"a").unwrap();
    assert!(m.dead_slices(i64::MAX, 100).unwrap().is_empty());
    assert_eq!(refs(a_slice), 0);
    m.unlink(&bob, copy, b"a").unwrap();
    let dead: Vec<SliceId> = m
        .dead_slices(i64::MAX, 100)
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert!(dead.contains(&a_slice), "{dead:?}");

    // refused, leaving nothing: a taken name, a source bob may not read, preserve by a user,
    // the trash, a quota
    let inodes = m.statfs().unwrap().inodes;
    assert_eq!(
        errno(m.clone_versioned(&bob, src, (bobs, b"copy"), (false, 7), CALL_BUDGET)),
        libc::EEXIST
    );
    let (secret, _) = m.create(&alice, sub, b"secret", 0o600, 0).unwrap();
    m.release(secret).unwrap();
    assert_eq!(
        errno(m.clone_versioned(&bob, src, (bobs, b"c2"), (false, 7), CALL_BUDGET)),
        libc::EACCES
    );
    assert_eq!(
        errno(m.clone_versioned(&alice, src, (home, b"c3"), (true, 7), CALL_BUDGET)),
        libc::EPERM
    );
    assert_eq!(
        errno(m.clone_versioned(&root, TRASH_INO, (home, b"c4"), (false, 7), CALL_BUDGET)),
        libc::EPERM
    );
    assert_eq!(
        errno(m.clone_versioned(&root, src, (ROOT_INO, TRASH_NAME), (false, 7), CALL_BUDGET)),
        libc::EEXIST
    );
    assert_eq!(
        m.statfs().unwrap().inodes,
        inodes + 1,
        "only the secret file"
    );
    let (q, _) = m.mkdir(&root, home, b"q", 0o777, 0).unwrap();
    m.set_quota(
        &root,
        q,
        crate::changelog::QuotaLimits {
            space_max: 0,
            inodes_max: 4,
        },
    )
    .unwrap();
    assert_eq!(
        errno(m.clone_versioned(&root, src, (q, b"c5"), (false, 7), CALL_BUDGET)),
        libc::EDQUOT
    );
    assert!(m.clones(&root).unwrap().is_empty());
    assert_eq!(m.statfs().unwrap().inodes, inodes + 2, "the secret file, q");
    // within the quota: it counts the clone whole
    m.clone_versioned(&root, sub, (q, b"c6"), (false, 7), CALL_BUDGET)
        .unwrap();
    assert_eq!(m.quota(q).unwrap().unwrap().used_inodes, 3);

    // a tree of several steps: DST is seen only once whole
    let (big, _) = m.mkdir(&root, home, b"big", 0o755, 0).unwrap();
    let (deep, _) = m.mkdir(&root, big, b"deep", 0o755, 0).unwrap();
    for i in 0..1_500 {
        let d = if i % 2 == 0 { big } else { deep };
        let (f, _) = m
            .create(&root, d, format!("f{i}").as_bytes(), 0o644, 0)
            .unwrap();
        m.release(f).unwrap();
    }
    let e = m.clone_versioned(&root, big, (home, b"big2"), (false, 9), Duration::ZERO);
    assert_eq!(errno(e), libc::EINPROGRESS);
    assert_eq!(m.clones(&root).unwrap().len(), 1);
    assert!(m.clones(&alice).unwrap().is_empty(), "root's clone");
    assert_eq!(errno(m.lookup(&root, home, b"big2")), libc::ENOENT);
    let mut calls = 1;
    loop {
        match m.clone_versioned(&root, big, (home, b"big2"), (false, 9), Duration::ZERO) {
            Ok(p) => {
                assert_eq!(p.value.inodes, 1_502);
                break;
            }
            Err(Error::Sys(libc::EINPROGRESS)) => calls += 1,
            Err(e) => panic!("{e}"),
        }
        assert!(calls < 100);
    }
    assert!(calls >= 2, "{calls} calls");
    let (big2, _) = m.lookup(&root, home, b"big2").unwrap();
    let (deep2, _) = m.lookup(&root, big2, b"deep").unwrap();
    assert_eq!(names(big2), names(big));
    assert_eq!(names(deep2), names(deep));

    // one left idle while a snapshot is taken: a replica and the snapshot hold it, then a GC
    // pass drops it
    let inodes = m.statfs().unwrap().inodes;
    let e = m.clone_versioned(&root, big, (home, b"big3"), (false, 11), Duration::ZERO);
    assert_eq!(errno(e), libc::EINPROGRESS);
    assert_eq!(m.drop_idle_clones(now_ns(), CALL_BUDGET).unwrap(), 0);
    let records = read_log(kv.as_ref(), Version::ZERO, usize::MAX).unwrap();
    let replica = make();
    replay(replica.as_ref(), &records).unwrap();
    assert_eq!(Meta::digest(&kv).unwrap(), Meta::digest(&replica).unwrap());
    let mut dump = vec![];
    crate::snapshot::dump(kv.as_ref(), &mut dump).unwrap();
    let loaded = make();
    crate::snapshot::load(loaded.as_ref(), &mut dump.as_slice()).unwrap();
    assert_eq!(Meta::digest(&kv).unwrap(), Meta::digest(&loaded).unwrap());
    let l = Meta::open(loaded.clone(), MetaOptions::default()).unwrap();
    assert_eq!(l.clones(&root).unwrap(), m.clones(&root).unwrap());
    // a later call under another token makes a clone of its own (copied now), never the
    // one left unfinished (copied at an earlier version)
    m.clone_versioned(&root, big, (home, b"big3"), (false, 12), CALL_BUDGET)
        .unwrap();
    assert_eq!(m.clones(&root).unwrap().len(), 1, "the one left");
    let later = now_ns() + super::CLONE_IDLE_MAX_NS + 1;
    assert_eq!(m.drop_idle_clones(later, CALL_BUDGET).unwrap(), 1);
    assert!(m.clones(&root).unwrap().is_empty());
    assert_eq!(m.statfs().unwrap().inodes, inodes + 1_502);

    // the digest counts the shared slices
    let with = Meta::digest(&kv).unwrap();
    let shared = m.read_chunk(caa_src(&m, &bob, csub), 0).unwrap()[0].id;
    assert_eq!(refs(shared), 2, "src/sub/b, its clone, and q/c6/b");
    kv.txn(&mut |t| {
        t.delete(&super::keys::sliceref(shared));
        Ok(())
    })
    .unwrap();
    assert_ne!(
        Meta::digest(&kv).unwrap(),
        with,
        "the digest left slice references out"
    );
}

/// `b` in the clone's `sub`.
fn caa_src(m: &Meta, ctx: &Ctx, dir: Ino) -> Ino {
    m.lookup(ctx, dir, b"b").unwrap().0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_backend_passes_the_metadata_suite() {
        run_all(&|| Arc::new(crate::kv::memory::MemoryKv::new()) as DynKv);
    }

    #[cfg(feature = "rocksdb")]
    #[test]
    fn rocksdb_backend_passes_the_metadata_suite() {
        let dirs = parking_lot::Mutex::new(vec![]);
        run_all(&|| {
            let d = tempfile::tempdir().unwrap();
            let kv = crate::kv::rocks::RocksKv::open(d.path()).unwrap();
            dirs.lock().push(d);
            Arc::new(kv) as DynKv
        });
    }
}
