//! Orphan objects (docs/changelog.md, "Orphan objects"), on a real Garage server: a sweep
//! deletes block objects no slice references once they are older than the grace, and keeps
//! younger ones, every referenced block (of live and of dead-pending slices) and every key
//! that is not a block's; `strait gc` does it for a file system, with a dry run that only
//! counts.

use std::collections::BTreeSet;
use std::io::Write;
use std::time::{Duration, SystemTime};

use crate::support::garage::Garage;
use crate::support::mount::TestFs;
use strait_fs_core::layout::block_key;
use strait_fs_core::object::DynStore;
use strait_fs_core::vfs::orphans::{self, References, SweepOptions};
use strait_fs_core::SliceId;

async fn open(garage: &Garage) -> DynStore {
    garage.store().await
}

/// Every key in the store, with its modification time.
async fn listing(store: &DynStore) -> Vec<(String, SystemTime)> {
    let mut out = vec![];
    let mut after: Option<String> = None;
    loop {
        let page = store.list("", after.as_deref(), 1000).await.unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.key.clone());
        for o in page {
            let m = o
                .modified
                .expect("Garage gives each object its Last-Modified");
            out.push((o.key, m));
        }
    }
    out
}

async fn keys(store: &DynStore) -> BTreeSet<String> {
    listing(store).await.into_iter().map(|(k, _)| k).collect()
}

#[tokio::test]
async fn a_sweep_deletes_orphans_older_than_the_grace_and_keeps_the_rest() {
    let Some(garage) = Garage::start() else {
        return;
    };
    let store = open(&garage).await;
    const BS: u32 = 64 << 10;
    let put = |key: String, len: usize| {
        let store = store.clone();
        async move {
            store.put(&key, vec![7u8; len].into()).await.unwrap();
            key
        }
    };

    // slice 10, referenced: two blocks; an orphan of slice 20; a key that is no block's
    let referenced = [
        put(block_key(SliceId(10), 0, BS), BS as usize).await,
        put(block_key(SliceId(10), 1, 100), 100).await,
    ];
    let old_orphan = put(block_key(SliceId(20), 0, 100), 100).await;
    let foreign = put("chunks/notes.txt".into(), 5).await;
    // a younger orphan: put again until Garage dates it after everything above
    let young_key = block_key(SliceId(30), 0, 100);
    let newest_before = listing(&store).await.iter().map(|o| o.1).max().unwrap();
    let young_at = loop {
        put(young_key.clone(), 100).await;
        let at = listing(&store)
            .await
            .into_iter()
            .find(|o| o.0 == young_key)
            .unwrap()
            .1;
        if at > newest_before {
            break at;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut refs = References::default();
    refs.add(SliceId(10), BS + 100);

    // references read an hour after the young orphan, less a millisecond, with a grace of an
    // hour: the old orphan is past the grace, the young one is not
    let grace = Duration::from_secs(3600);
    let read_at = young_at + grace - Duration::from_millis(1);
    let sweep = |dry_run| {
        let (store, refs) = (store.clone(), &refs);
        async move {
            orphans::sweep(
                &store,
                refs,
                BS,
                read_at,
                SweepOptions { grace, dry_run },
                orphans::SweepCalls {
                    progress: &mut |_| {},
                    deleted: &mut |_, _| {},
                    gate: &|| None,
                },
            )
            .await
            .unwrap()
        }
    };

    // a dry run counts the old orphan and deletes nothing
    let before = keys(&store).await;
    let st = sweep(true).await;
    assert_eq!(
        (st.listed, st.referenced, st.young, st.foreign, st.orphans),
        (5, 2, 1, 1, 1),
        "{st:?}"
    );
    assert_eq!((st.orphan_bytes, st.deleted), (100, 0), "{st:?}");
    assert_eq!(keys(&store).await, before);

    // the sweep deletes it, and only it
    let st = sweep(false).await;
    assert_eq!((st.orphans, st.deleted, st.failed), (1, 1, 0), "{st:?}");
    let mut want = before.clone();
    want.remove(&old_orphan);
    assert_eq!(keys(&store).await, want);
    for k in referenced.iter().chain([&foreign, &young_key]) {
        assert!(want.contains(k), "{k}");
    }
}

/// `strait gc --json` on `fs`: the JSON result line.
fn gc(fs: &TestFs, args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(crate::support::strait_bin())
        .args(["gc", &fs.meta_url, "--json"])
        .args(args)
        .envs(fs.env.iter().cloned())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "strait gc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("strait gc {args:?} printed no JSON: {text}"));
    serde_json::from_str(line).unwrap()
}

#[test]
fn strait_gc_removes_an_orphan_past_its_grace_and_keeps_every_referenced_block() {
    if !crate::support::require_fuse() {
        return;
    }
    let Some(garage) = Garage::start() else {
        return;
    };
    let rt = crate::support::runtime();
    let store = rt.block_on(open(&garage));
    let fs = TestFs::rocks_on(garage.data_url(), garage.env());

    // a file of two blocks, and a file deleted since (its slice dead, waiting for the
    // file system's 600 s delay: its blocks are still referenced)
    let big = crate::support::random_bytes(1, (5 << 20) + 17);
    {
        let m = fs.mount(&[]);
        std::fs::write(m.path("big"), &big).unwrap();
        let mut f = std::fs::File::create(m.path("gone")).unwrap();
        f.write_all(b"soon unlinked").unwrap();
        drop(f);
        std::fs::remove_file(m.path("gone")).unwrap();
        m.unmount();
    }
    // 3 blocks, or more when a flush committed part of `big` while it was being written (CI
    // of 12f002a: its first MiB as a slice of its own, then the rest): every one referenced
    let written = rt.block_on(keys(&store));
    let blocks = written.iter().filter(|k| k.starts_with("chunks/")).count();
    assert!(blocks >= 3, "{written:?}");

    // an object a write that never committed left behind, and one that is not a block
    let orphan = block_key(SliceId(1 << 40), 0, 4096);
    rt.block_on(store.put(&orphan, vec![1u8; 4096].into()))
        .unwrap();
    rt.block_on(store.put("chunks/README", b"not a block".to_vec().into()))
        .unwrap();
    let all = rt.block_on(keys(&store));

    // a grace of an hour: the orphan is seconds old, so it stays
    let r = gc(&fs, &["--orphan-grace", "1h"]);
    assert_eq!(
        (r["orphans"].as_u64(), r["young"].as_u64()),
        (Some(0), Some(1)),
        "{r}"
    );
    assert_eq!(rt.block_on(keys(&store)), all);

    // a dry run with no grace counts it and its bytes, and deletes nothing
    let r = gc(&fs, &["--orphan-grace", "0", "--dry-run"]);
    assert_eq!(
        (r["orphans"].as_u64(), r["orphan_bytes"].as_u64()),
        (Some(1), Some(4096)),
        "{r}"
    );
    assert_eq!(r["deleted"].as_u64(), Some(0), "{r}");
    assert_eq!(r["referenced"].as_u64(), Some(blocks as u64), "{r}");
    assert_eq!(rt.block_on(keys(&store)), all);

    // with no grace it goes; every referenced block and the foreign key stay
    let r = gc(&fs, &["--orphan-grace", "0"]);
    assert_eq!(
        (r["deleted"].as_u64(), r["failed"].as_u64()),
        (Some(1), Some(0)),
        "{r}"
    );
    let mut want = all.clone();
    want.remove(&orphan);
    assert_eq!(rt.block_on(keys(&store)), want);
    let m = fs.mount(&[]);
    assert!(std::fs::read(m.path("big")).unwrap() == big);
    m.unmount();
}

/// The block objects (`chunks/...`) under the directory store `dir`.
fn block_files(dir: &std::path::Path) -> usize {
    fn walk(d: &std::path::Path, n: &mut usize) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, n);
            } else if !e.file_name().to_string_lossy().starts_with('.') {
                *n += 1;
            }
        }
    }
    let mut n = 0;
    walk(&dir.join("chunks"), &mut n);
    n
}

/// Issue 40, finding 2: a mirror swept its store against its own metadata whatever its
/// state. With one store for both regions (`dev up --shared-store`, as docs/operations.md
/// advises for no data loss), a paused mirror's sweep deleted the blocks of a file the
/// primary had committed since, as orphans, and that file read as EIO. Now a mirror sweeps
/// only while it follows within its window, unpaused, and never a store a primary uses too
/// (it finds its marker object through the primary's store).
#[test]
fn a_mirror_never_sweeps_a_store_it_shares_nor_while_it_is_behind() {
    if !crate::support::require_fuse() {
        return; // not under CI=true (said on stderr)
    }
    let work = tempfile::tempdir().unwrap();
    let dev = crate::support::dev_up::DevUp::start(
        &work.path().join("dev"),
        &["--delay-ms", "5", "--shared-store"],
    );
    let topo = dev.topology();
    let mirror = topo["mirror"].as_str().unwrap().to_string();
    let ma = std::path::PathBuf::from(topo["mount_a"].as_str().unwrap());
    let store = dev.dir.join("region-a/data");
    let admin = dev.dir.join("tokens/admin.token");
    let admin = admin.to_str().unwrap();
    let strait = crate::support::strait;
    let sweep_at_b = || {
        strait(&[
            "gc",
            &format!("strait://{mirror}"),
            "--token-file",
            admin,
            "--orphan-grace",
            "0",
        ])
    };

    // B paused: a file committed at A since is in the shared store, not in B's metadata
    let (ok, out) = strait(&[
        "mirror",
        "pause",
        "--addr",
        &mirror,
        "--token-file",
        admin,
        "--seconds",
        "120",
    ]);
    assert!(ok, "pause: {out}");
    let body = crate::support::random_bytes(40, 1 << 20);
    {
        let mut f = std::fs::File::create(ma.join("new")).unwrap();
        f.write_all(&body).unwrap();
        f.sync_all().unwrap();
    }
    let before = block_files(&store);
    assert!(before > 0, "the file's blocks are in the store");
    let (ok, out) = sweep_at_b();
    assert!(
        !ok && out.contains("paused"),
        "a paused mirror's sweep: {out}"
    );
    assert_eq!(
        block_files(&store),
        before,
        "the paused mirror deleted blocks"
    );

    // following again, it still refuses: the store is the primary's too
    let (ok, out) = strait(&["mirror", "resume", "--addr", &mirror, "--token-file", admin]);
    assert!(ok, "resume: {out}");
    std::thread::sleep(Duration::from_secs(2));
    let (ok, out) = sweep_at_b();
    assert!(
        !ok && out.contains("also the primary's"),
        "a sweep of a shared store at the mirror: {out}"
    );
    assert_eq!(block_files(&store), before);
    assert!(std::fs::read(ma.join("new")).unwrap() == body);
    // the primary sweeps it (nothing of the file goes)
    let (ok, out) = strait(&[
        "gc",
        &format!("strait://{}", topo["primary"].as_str().unwrap()),
        "--token-file",
        admin,
        "--orphan-grace",
        "0",
    ]);
    assert!(ok, "gc at the primary: {out}");
    assert!(std::fs::read(ma.join("new")).unwrap() == body);
}
