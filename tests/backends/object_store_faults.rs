//! A mount whose object store (a real Garage) sits behind the chaos harness's HTTP fault
//! proxy (`strait_lab::s3proxy`). Invariant: a block the store answers short or cut never
//! reaches a reader — a read returns the bytes written or fails (EIO), never other bytes —
//! and once the store behaves again every read returns the bytes written.

use std::io::Write;
use std::os::unix::fs::FileExt;

use crate::support::garage::Garage;
use crate::support::mount::TestFs;
use strait_lab::s3proxy::{S3Faults, S3Mode, S3Proxy};

/// 1 MiB blocks, so a 3 MiB file has three.
const FILE_BYTES: usize = (3 << 20) + 4_321;

#[test]
fn a_truncated_block_never_reaches_a_reader() {
    if !crate::support::require_fuse() {
        return;
    }
    let Some(garage) = Garage::start() else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let proxy = rt
        .block_on(S3Proxy::start(
            "127.0.0.1:0".parse().unwrap(),
            garage.s3_addr(),
            crate::support::seed("object_store_faults"),
        ))
        .unwrap();
    let meta = tempfile::tempdir().unwrap();
    let fs = TestFs::new(
        format!("rocksdb://{}", meta.path().join("meta").display()),
        garage.data_url_at("", &proxy.addr().to_string()),
        garage.env(),
        &["--block-size", "1M"],
    );
    let data: Vec<u8> = (0..FILE_BYTES as u32).map(|i| (i % 251) as u8).collect();

    // written through the proxy with no fault on
    {
        let m = fs.mount(&["--cache-size", "0"]);
        let mut f = std::fs::File::create(m.path("f")).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        drop(f);
        m.unmount();
    }

    // every GET's body cut (mid-stream or short with a matching length): a fresh mount with
    // no disk cache must fetch each block, and each read returns the bytes or fails
    proxy.set(S3Faults {
        mode: Some(S3Mode::Truncate),
        percent: 100,
    });
    let m = fs.mount(&["--cache-size", "0"]);
    let f = std::fs::File::open(m.path("f")).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    for off in [0usize, 1 << 20, (2 << 20) + 100, 3 << 20] {
        let n = buf.len().min(FILE_BYTES - off);
        match f.read_at(&mut buf[..n], off as u64) {
            Ok(got) => assert_eq!(&buf[..got], &data[off..off + got], "wrong bytes at {off}"),
            // EIO, or a timeout: an error in any case
            Err(e) => eprintln!("read at {off} failed: {e}"),
        }
    }
    let cut = proxy.stats().cut.load(std::sync::atomic::Ordering::Relaxed);
    let short = proxy
        .stats()
        .short
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(cut + short > 0, "no body was cut: {}", proxy.stats());
    eprintln!("under the fault: {}", proxy.stats());

    // healed: the same mount reads every byte right
    proxy.set(S3Faults::default());
    drop(f);
    assert_eq!(std::fs::read(m.path("f")).unwrap(), data);

    // half the GETs cut: whatever a read returns is what was written
    proxy.set(S3Faults {
        mode: Some(S3Mode::Truncate),
        percent: 50,
    });
    drop(m);
    let m = fs.mount(&["--cache-size", "0"]);
    let (mut ok, mut failed) = (0, 0);
    for _ in 0..3 {
        match std::fs::read(m.path("f")) {
            Ok(got) => {
                assert!(got == data, "a read returned other bytes than written");
                ok += 1;
            }
            Err(e) => {
                eprintln!("read failed: {e}");
                failed += 1;
            }
        }
    }
    eprintln!(
        "50 % cut: {ok} whole reads, {failed} failed; {}",
        proxy.stats()
    );
    proxy.set(S3Faults::default());
    m.unmount();
}
