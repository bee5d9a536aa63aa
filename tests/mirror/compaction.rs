//! Compaction by window (docs/architecture.md, "Data layout"), with real processes: a
//! three-node replicator, the primary daemon, an eager mirror with its own object store, FUSE
//! mounts in both regions.
//!
//! Random 64 KiB writes, each committed (fsync), into a file written whole first, at each
//! region's mount: every file reads what was written at both mounts; each fragmented window
//! was rewritten, at A and at B (whose compactions keep the untouched slices, unchanged, and
//! go to the primary through the mirror, which uploads only the slices they wrote); the stores
//! hold less than twice the bytes written (rewriting the whole chunk after every 24 slices
//! stored about four times as much here); and the mirror's store holds every block its
//! metadata references (reading both files at B after the copy reads nothing across).

use std::io::{Seek, SeekFrom, Write};
use std::time::{Duration, Instant};

use crate::support::daemon::Primary;
use crate::support::replicator::RegionA;
use crate::support::site::{
    block_files, mirror_row, primary_version, status_text, wait_applied, wait_synced,
};

const SIZE: usize = 8 << 20;
const W: usize = 64 << 10;
const WRITES: u32 = 200;

#[test]
fn random_writes_at_both_regions_are_compacted_by_window_and_read_the_same_everywhere() {
    if !crate::support::require_fuse() {
        return;
    }
    let rt = crate::support::runtime();
    let region = RegionA::start(&rt);
    let primary = region.primary(&[]);
    let mirror = Primary::mirror(&primary, "region-b", &region.addrs, &[]);
    let a = primary.mount(&[]);
    let b = mirror.mount(&[]);

    let mut models = vec![];
    for (m, name, seed) in [(&a, "at-a", 1u64), (&b, "at-b", 2u64)] {
        let path = m.path(name);
        let mut model = crate::support::random_bytes(seed, SIZE);
        std::fs::write(&path, &model).unwrap();
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let mut x = seed;
        for n in 0..WRITES {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = ((x >> 33) as usize % (SIZE / W)) * W;
            let data = vec![(n % 251) as u8 + 1; W];
            f.seek(SeekFrom::Start(off as u64)).unwrap();
            f.write_all(&data).unwrap();
            // one committed slice per write
            f.sync_data().unwrap();
            model[off..off + W].copy_from_slice(&data);
        }
        drop(f);
        models.push((name, model));
    }

    // compactions run after the commits, in the mounts' background: wait until the
    // primary's version stands still, then until the mirror applied it and copied its queue
    let mut v = primary_version(&primary);
    let mut still = Instant::now();
    while still.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(200));
        let now = primary_version(&primary);
        if now != v {
            (v, still) = (now, Instant::now());
        }
    }
    wait_applied(&mirror, v, Duration::from_secs(60));
    wait_synced(&mirror, Duration::from_secs(120));
    let fallbacks = |row: &serde_json::Value| row["blocks"]["fallback_reads"].as_u64().unwrap();
    let before = fallbacks(&mirror_row(&mirror.addr, &mirror.token));

    for (name, model) in &models {
        for (m, at) in [(&a, "A"), (&b, "B")] {
            let got = std::fs::read(m.path(name)).unwrap();
            assert!(
                got == *model,
                "{name} read at {at} differs from what was written"
            );
        }
    }
    let row = mirror_row(&mirror.addr, &mirror.token);
    assert_eq!(
        fallbacks(&row),
        before,
        "B read blocks across after its copy: its store lacks blocks its metadata references: {row:#}"
    );

    let (ab, bb) = (
        block_files(&region.fs.data_dir()),
        block_files(&mirror.data_dir()),
    );
    // each file's first write stored 2 blocks of 4 MiB; each window rewrite stored one more
    let whole = |blocks: &std::collections::BTreeMap<String, Vec<u8>>| {
        blocks.values().filter(|d| d.len() == 4 << 20).count()
    };
    assert!(
        whole(&ab) >= 8,
        "{} blocks of 4 MiB in A's store: the windows of both files were not all rewritten",
        whole(&ab)
    );
    // nothing is deleted in this run (gc delay 600 s): A's store holds every byte written to it
    let app = 2 * (SIZE + WRITES as usize * W);
    let stored: usize = ab.values().map(|d| d.len()).sum();
    assert!(
        stored * 10 <= app * 20,
        "A's store holds {stored} bytes for {app} written: {:.2} times",
        stored as f64 / app as f64
    );
    // B holds only blocks A holds, byte for byte (the queue skipped the ones already dead)
    for (k, d) in &bb {
        assert!(ab.get(k) == Some(d), "block {k} at B is not A's");
    }
    // the skipped blocks are counted, and shown in the table a person reads
    assert!(
        row["blocks"]["skipped_dead_bytes"].is_u64(),
        "no skipped_dead_bytes in {row:#}"
    );
    let text = status_text(&mirror.addr, &mirror.token);
    let header = text
        .lines()
        .find(|l| l.starts_with("BLOCKS"))
        .unwrap_or_else(|| panic!("no blocks table in:\n{text}"));
    assert!(header.contains("SKIPPED B"), "{header}");
}
