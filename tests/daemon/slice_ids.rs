//! Slice ids belong to the session that took them (docs/consistency.md, "Slice ids belong to
//! the session that took them"), with real daemons and real mounts:
//! - a primary refuses a written slice (or a compaction's new slice) whose id it did not
//!   give the calling session, EPERM, and changes nothing;
//! - a mirror uploads a forwarded write's blocks to the primary's store only for ids the
//!   primary gave it for that mount, and never over an object already there.
//!
//! A mount whose daemon restarted and forgot its ranges is in `slice_ids_restart.rs`.

use std::time::Duration;

use crate::support::daemon::Primary;
use crate::support::mount::TestFs;
use crate::support::replicator::RegionA;
use crate::support::site::{block_files, mirror_row, primary_version, wait_applied, Site};
use strait_fs_core::layout::block_key;
use strait_fs_core::object::local::LocalStore;
use strait_fs_core::object::ObjectStore;
use strait_fs_core::SliceId;
use strait_proto::meta as w;
use tonic::Status;

fn errno(s: &Status) -> Option<i32> {
    strait_proto::status_errno(s)
}

/// A slice of one block of `data`, at the start of the chunk.
fn slice_of(id: u64, data: &[u8]) -> w::SliceRef {
    w::SliceRef {
        id,
        size: data.len() as u32,
        off: 0,
        len: data.len() as u32,
        pos: 0,
        crcs: vec![crc32fast::hash(data)],
    }
}

async fn write_slice(s: &mut Site, ino: u64, slice: w::SliceRef) -> Result<(), Status> {
    let r = s.req(w::WriteSliceRequest {
        ino,
        index: 0,
        slice: Some(slice),
        mtime_ns: 1,
    });
    s.c.write_slice(r).await.map(|_| ())
}

async fn alloc(s: &mut Site) -> u64 {
    let r = s.req(w::AllocRequest { count: 1000 });
    s.c.alloc_slice_ids(r).await.unwrap().into_inner().first
}

async fn length(s: &mut Site, ino: u64) -> u64 {
    let r = s.req(w::InodeRequest {
        ctx: Some(w::Ctx::default()),
        ino,
    });
    s.c.get_attr(r)
        .await
        .unwrap()
        .into_inner()
        .attr
        .unwrap()
        .length
}

/// A refusal of a slice id the session was not given: EPERM, named as such.
fn assert_not_allocated(r: Result<(), Status>, what: &str) {
    let s = r.expect_err(what);
    assert_eq!(errno(&s), Some(libc::EPERM), "{what}: {s:?}");
    assert!(strait_proto::is_slice_not_allocated(&s), "{what}: {s:?}");
}

#[test]
fn a_slice_id_not_given_to_the_session_is_refused_and_changes_nothing() {
    let rt = crate::support::runtime();
    let fs = TestFs::rocks_local(&[]);
    let primary = Primary::start(&fs.meta_url, &fs.env, &["--gc-interval-s", "0"]);
    rt.block_on(async {
        let mut one = Site::connect(&primary.addr, &primary.token).await;
        let mut two = Site::connect(&primary.addr, &primary.token).await;
        let f = one.mknod(1, "f").await.unwrap();
        let data = b"sixteen bytes!!!";

        // an id nobody was given
        assert_not_allocated(
            write_slice(&mut one, f, slice_of(5000, data)).await,
            "an id never handed out",
        );
        // an id another session was given
        let theirs = alloc(&mut two).await;
        assert_not_allocated(
            write_slice(&mut one, f, slice_of(theirs, data)).await,
            "another session's id",
        );
        let compact = one.req(w::CompactChunkRequest {
            ino: f,
            index: 0,
            old: vec![],
            new: vec![slice_of(theirs + 1, data)],
        });
        assert_not_allocated(
            one.c.compact_chunk(compact).await.map(|_| ()),
            "a compaction's slice under another session's id",
        );
        assert_eq!(
            length(&mut one, f).await,
            0,
            "a refused write changed the file"
        );

        // the session that was given it commits it
        write_slice(&mut two, f, slice_of(theirs, data))
            .await
            .expect("the owner's write");
        assert_eq!(length(&mut one, f).await, data.len() as u64);
    });
}

#[test]
fn a_forwarded_write_uploads_only_under_ids_given_to_the_mirror_and_never_over_an_object() {
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let primary = region.primary(&[]);
    // a file written at the primary: its block is in region A's store
    let victim_data = crate::support::random_bytes(1, 1000);
    {
        let a = primary.mount(&[]);
        std::fs::write(a.path("victim"), &victim_data).unwrap();
        a.unmount();
    }
    let before = block_files(&region.fs.data_dir());
    let victim_key = before.keys().next().expect("the victim's block").clone();
    let victim_id: u64 = victim_key
        .rsplit('/')
        .next()
        .and_then(|n| n.split('_').next())
        .and_then(|n| n.parse().ok())
        .unwrap();

    let mirror = Primary::mirror(&primary, "region-b", &region.addrs, &[]);
    wait_applied(&mirror, primary_version(&primary), Duration::from_secs(30));
    let store_a = LocalStore::open(&region.fs.data_dir()).unwrap();
    let store_b = LocalStore::open(&mirror.data_dir()).unwrap();
    rt.block_on(async {
        let mut m = Site::connect(&mirror.addr, &mirror.token).await;
        let f = m.mknod(1, "f").await.unwrap();

        // a mount at the mirror names the victim's slice id, its own bytes in region B's
        // store: refused, and region A's block is untouched
        let evil = crate::support::random_bytes(2, 1000);
        let key = block_key(SliceId(victim_id), 0, 1000);
        store_b.put(&key, evil.clone().into()).await.unwrap();
        assert_not_allocated(
            write_slice(&mut m, f, slice_of(victim_id, &evil)).await,
            "the primary's own slice id",
        );
        // an id never handed out: refused, nothing uploaded
        let made_up = victim_id + 1_000_000_000;
        let made_up_key = block_key(SliceId(made_up), 0, 1000);
        store_b
            .put(&made_up_key, evil.clone().into())
            .await
            .unwrap();
        assert_not_allocated(
            write_slice(&mut m, f, slice_of(made_up, &evil)).await,
            "an id never handed out",
        );
        assert_eq!(
            block_files(&region.fs.data_dir()),
            before,
            "region A's store changed"
        );
        assert_eq!(length(&mut m, f).await, 0);

        // an id the primary gave the mirror for this mount: uploaded and committed
        let mine = alloc(&mut m).await;
        let data = crate::support::random_bytes(3, 1000);
        let key = block_key(SliceId(mine), 0, 1000);
        store_b.put(&key, data.clone().into()).await.unwrap();
        write_slice(&mut m, f, slice_of(mine, &data))
            .await
            .expect("a write under an id of its own");
        assert_eq!(store_a.get(&key).await.unwrap(), &data[..]);
        assert_eq!(length(&mut m, f).await, 1000);

        // an object already in the primary's store under the key, with other bytes: the
        // upload does not replace it, and the write fails with nothing changed
        let key = block_key(SliceId(mine + 1), 0, 1000);
        let there = crate::support::random_bytes(4, 1000);
        store_a.put(&key, there.clone().into()).await.unwrap();
        let ours = crate::support::random_bytes(5, 1000);
        store_b.put(&key, ours.clone().into()).await.unwrap();
        let s = write_slice(&mut m, f, slice_of(mine + 1, &ours))
            .await
            .expect_err("an upload over another object");
        assert_eq!(errno(&s), Some(libc::EIO), "{s:?}");
        assert!(s.message().contains("other content"), "{s:?}");
        assert_eq!(store_a.get(&key).await.unwrap(), &there[..]);

        // the same bytes already there (a write sent again): taken as uploaded
        let key = block_key(SliceId(mine + 2), 0, 1000);
        let again = crate::support::random_bytes(6, 1000);
        store_a.put(&key, again.clone().into()).await.unwrap();
        store_b.put(&key, again.clone().into()).await.unwrap();
        write_slice(&mut m, f, slice_of(mine + 2, &again))
            .await
            .expect("a write whose block the primary's store holds already");
    });
    let row = mirror_row(&mirror.addr, &mirror.token);
    assert_eq!(row["blocks"]["uploaded_blocks"], 2, "{row}");
    // the victim reads as it was written
    let a = primary.mount(&[]);
    assert_eq!(std::fs::read(a.path("victim")).unwrap(), victim_data);
}
