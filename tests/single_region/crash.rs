//! Crash safety: files written and fsynced survive a SIGKILL of the mount process. The
//! manifest of what was fsynced is kept outside the mount (as JuiceFS's crash test does).

use std::io::Write;

use crate::support::mount::TestFs;
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};

#[test]
fn fsynced_files_survive_sigkill_of_the_mount() {
    if !crate::support::require_fuse() {
        return;
    }
    let seed = crate::support::seed("crash test");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let fs = TestFs::rocks_local(&["--block-size", "256K"]);
    let mut manifest: Vec<(String, String, usize)> = vec![];
    for round in 0..3 {
        let m = fs.mount(&[]);
        // everything fsynced in earlier rounds is intact
        for (name, hash, len) in &manifest {
            let got = std::fs::read(m.path(name))
                .unwrap_or_else(|e| panic!("seed {seed}: read {name}: {e}"));
            assert_eq!(
                got.len(),
                *len,
                "seed {seed}: {name} has the wrong length after a crash"
            );
            assert_eq!(
                &hex::encode(Sha256::digest(&got)),
                hash,
                "seed {seed}: {name} differs after a crash"
            );
        }
        for i in 0..20 {
            let name = format!("r{round}-f{i}");
            let len = rng.random_range(0..(2 << 20));
            let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            let mut f = std::fs::File::create(m.path(&name)).unwrap();
            f.write_all(&data).unwrap();
            f.sync_all().unwrap();
            manifest.push((name, hex::encode(Sha256::digest(&data)), len));
        }
        // data in flight, never fsynced: may be lost, must not break anything
        let mut f = std::fs::File::create(m.path(&format!("r{round}-unsynced"))).unwrap();
        f.write_all(&vec![7u8; 3 << 20]).unwrap();
        m.kill();
    }
    let m = fs.mount(&[]);
    for (name, hash, len) in &manifest {
        let got = std::fs::read(m.path(name)).unwrap();
        assert_eq!(got.len(), *len, "seed {seed}: {name}");
        assert_eq!(
            &hex::encode(Sha256::digest(&got)),
            hash,
            "seed {seed}: {name}"
        );
    }
    m.unmount();
}
