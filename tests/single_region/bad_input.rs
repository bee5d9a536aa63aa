//! Bad input gets the right errno at the mount (or one readable line at the CLI) and
//! changes nothing.

use std::io::Read;
use std::os::unix::fs::FileExt;

use crate::support::mount::TestFs;
use crate::support::{strait_fails, strait_ok};

fn digest(fs: &TestFs) -> String {
    strait_ok(&["fsck", &fs.meta_url, "--digest"])
        .trim()
        .to_string()
}

#[test]
fn bad_names_paths_and_sizes_get_the_right_errno_and_change_nothing() {
    if !crate::support::require_fuse() {
        return;
    }
    let fs = TestFs::rocks_local(&[]);
    let m = fs.mount(&[]);
    std::fs::write(m.path("file"), b"content").unwrap();
    std::fs::create_dir(m.path("dir")).unwrap();
    m.unmount();
    let before = digest(&fs);
    let m = fs.mount(&[]);

    // a name over 255 bytes
    let long = "n".repeat(256);
    let e = std::fs::write(m.path(&long), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENAMETOOLONG), "{e}");
    let e = std::fs::create_dir(m.path(&format!("dir/{long}"))).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENAMETOOLONG), "{e}");
    // a path through a non-directory
    let e = std::fs::write(m.path("file/child"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR), "{e}");
    let e = std::fs::create_dir(m.path("file/sub")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR), "{e}");
    // a write past the largest file size
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(m.path("file"))
        .unwrap();
    let e = f.write_at(b"x", 1 << 50).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{e}");
    let e = f.set_len((1 << 50) + 1).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EFBIG), "{e}");
    drop(f);
    // '/' and NUL cannot even be passed through the kernel; the metadata layer refuses
    // them too (covered by the metadata conformance suite)
    assert_eq!(std::fs::read(m.path("file")).unwrap(), b"content");
    m.unmount();
    assert_eq!(
        digest(&fs),
        before,
        "a refused request changed the metadata"
    );
    // the limit is exact: 255 bytes is a valid name
    let m = fs.mount(&[]);
    std::fs::write(m.path(&"n".repeat(255)), b"x").unwrap();
    assert_eq!(std::fs::read(m.path(&"n".repeat(255))).unwrap(), b"x");
    m.unmount();
}

#[test]
fn a_corrupt_block_reads_as_eio_with_one_log_line_naming_it() {
    if !crate::support::require_fuse() {
        return;
    }
    let fs = TestFs::rocks_local(&["--block-size", "64K"]);
    let m = fs.mount(&["--cache-size", "0", "--mem-cache-size", "0"]);
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    // The file must be one slice, its blocks cut at 64 KiB from offset 0. A FLUSH sent when
    // another test's fork+exec closes its copy of the open descriptor commits a write
    // early and cuts it in two: then write it again under another name.
    let names = |dir: &std::path::Path| -> Vec<String> {
        walk(dir)
            .iter()
            .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
            .filter(|n| n.split('_').count() == 3)
            .collect()
    };
    let mut victim_id = None;
    for attempt in 0..5 {
        let seen = names(&fs.data_dir());
        let name = format!("victim-{attempt}");
        std::fs::write(m.path(&name), &data).unwrap();
        let new: Vec<String> = names(&fs.data_dir())
            .into_iter()
            .filter(|n| !seen.contains(n))
            .collect();
        let ids: std::collections::BTreeSet<&str> =
            new.iter().filter_map(|n| n.split('_').next()).collect();
        if new.len() == 4 && ids.len() == 1 {
            std::fs::rename(m.path(&name), m.path("victim")).unwrap();
            victim_id = ids.first().map(|id| id.to_string());
            break;
        }
    }
    let victim_id = victim_id.expect("5 writes of the file were each cut into more than one slice");
    std::fs::write(m.path("bystander"), b"fine").unwrap();
    m.unmount();
    let before = digest(&fs);

    // flip one byte of the second block of the file
    let mut blocks = vec![];
    for entry in walk(&fs.data_dir()) {
        if entry
            .file_name()
            .map(|n| n.to_string_lossy() == format!("{victim_id}_1_65536"))
            .unwrap_or(false)
        {
            blocks.push(entry);
        }
    }
    assert_eq!(blocks.len(), 1, "expected one second block: {blocks:?}");
    let block = &blocks[0];
    let mut bytes = std::fs::read(block).unwrap();
    bytes[100] ^= 0x01;
    std::fs::write(block, &bytes).unwrap();
    let key = block
        .strip_prefix(fs.data_dir())
        .unwrap()
        .display()
        .to_string();

    let m = fs.mount(&["--cache-size", "0", "--mem-cache-size", "0"]);
    let mut f = std::fs::File::open(m.path("victim")).unwrap();
    let mut head = vec![0u8; 65536];
    f.read_exact(&mut head).unwrap();
    assert_eq!(
        head[..],
        data[..65536],
        "the intact first block still reads"
    );
    let mut rest = vec![];
    let e = f.read_to_end(&mut rest).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    drop(f);
    assert_eq!(std::fs::read(m.path("bystander")).unwrap(), b"fine");
    let log = m.log_text();
    m.unmount();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(&key)).collect();
    assert!(!lines.is_empty(), "no log line names {key}:\n{log}");
    assert!(
        lines.iter().any(|l| l.contains("ERROR")),
        "the block is not reported as an error:\n{log}"
    );
    assert_eq!(digest(&fs), before, "a failed read changed the metadata");
}

#[test]
fn the_cli_refuses_bad_arguments_with_one_line() {
    let (code, err) = strait_fails(&["format", "mysql://x", "file:///tmp/x"]);
    assert_eq!(code, 1);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("unknown scheme"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let meta = format!("rocksdb://{}/m", dir.path().display());
    let (_, err) = strait_fails(&["format", &meta, "file:///tmp/x", "--block-size", "3G"]);
    assert!(err.contains("--block-size"), "{err}");
    let (_, err) = strait_fails(&["status", &meta]);
    assert!(err.contains("strait format"), "{err}");
    let (_, err) = strait_fails(&["mount", &meta, "/nonexistent/strait/mnt"]);
    assert!(err.contains("not a directory"), "{err}");
    // formatting twice is refused and keeps the first file system
    let data = format!("file://{}/d", dir.path().display());
    strait_ok(&["format", &meta, &data, "--name", "first"]);
    let (_, err) = strait_fails(&["format", &meta, &data, "--name", "second"]);
    assert!(err.contains("already holds"), "{err}");
    assert!(strait_ok(&["status", &meta]).contains("first"));
    // bad arguments of the two-region commands, checked before anything is reached
    let (_, err) = strait_fails(&["mirror", "pause", "--addr", "127.0.0.1:1", "--seconds", "0"]);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--seconds 0"), "{err}");
    let (_, err) = strait_fails(&["dev", "up", "--store", "nfs"]);
    assert!(err.contains("--store \"nfs\""), "{err}");
    let (_, err) = strait_fails(&["dev", "up", "--link-mb-s=-5"]);
    assert!(err.contains("--link-mb-s"), "{err}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}
