//! Differential test: the same random sequence of file operations applied to a strait mount
//! and to a local directory leaves identical trees, attributes, contents and xattrs, and
//! every operation succeeds or fails the same way on both. The seed is printed; replay a
//! failure with STRAIT_SEED=<seed>.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::support::mount::TestFs;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};

const NAMES: [&str; 6] = ["a", "b", "c", "dir1", "dir2", "long-name-with-some-length"];
const CHUNK: u64 = 64 << 20;

#[derive(Debug, Clone, PartialEq)]
struct Node {
    kind: &'static str,
    perm: u32,
    uid: u32,
    gid: u32,
    nlink: u64,
    size: Option<u64>,
    content: Option<String>,
    target: Option<PathBuf>,
    xattrs: BTreeMap<String, Vec<u8>>,
}

fn xattrs(p: &Path) -> BTreeMap<String, Vec<u8>> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut out = BTreeMap::new();
    let mut buf = vec![0u8; 4096];
    let n =
        unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if n <= 0 {
        return out;
    }
    for name in buf[..n as usize]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
    {
        let s = String::from_utf8_lossy(name).to_string();
        if !s.starts_with("user.") {
            continue;
        }
        let cn = CString::new(name).unwrap();
        let mut v = vec![0u8; 65536];
        let m = unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                cn.as_ptr(),
                v.as_mut_ptr() as *mut libc::c_void,
                v.len(),
            )
        };
        if m >= 0 {
            v.truncate(m as usize);
            out.insert(s, v);
        }
    }
    out
}

fn snapshot(root: &Path) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let p = root.join(&rel);
        let md = std::fs::symlink_metadata(&p).unwrap();
        let ft = md.file_type();
        let kind = if ft.is_dir() {
            "dir"
        } else if ft.is_symlink() {
            "symlink"
        } else {
            "file"
        };
        let content = ft.is_file().then(|| {
            let mut h = Sha256::new();
            let mut f = std::fs::File::open(&p).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = f.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            hex::encode(h.finalize())
        });
        if !rel.as_os_str().is_empty() {
            out.insert(
                rel.clone(),
                Node {
                    kind,
                    perm: md.permissions().mode() & 0o7777,
                    uid: md.uid(),
                    gid: md.gid(),
                    nlink: md.nlink(),
                    size: ft.is_file().then_some(md.len()),
                    content,
                    target: ft.is_symlink().then(|| std::fs::read_link(&p).unwrap()),
                    xattrs: if ft.is_symlink() {
                        BTreeMap::new()
                    } else {
                        xattrs(&p)
                    },
                },
            );
        }
        if ft.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(rel.join(e.unwrap().file_name()));
            }
        }
    }
    out
}

/// Outcome of an operation: Ok or the errno.
type Outcome = Result<(), i32>;

fn io(r: std::io::Result<()>) -> Outcome {
    r.map_err(|e| e.raw_os_error().unwrap_or(-1))
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn libc_rc(rc: i32) -> Outcome {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(-1))
    }
}

#[derive(Debug, Clone)]
enum Op {
    Create(PathBuf),
    Write(PathBuf, u64, Vec<u8>),
    Truncate(PathBuf, u64),
    Rename(PathBuf, PathBuf, u32),
    Link(PathBuf, PathBuf),
    Symlink(PathBuf, String),
    Unlink(PathBuf),
    Mkdir(PathBuf),
    Rmdir(PathBuf),
    Chmod(PathBuf, u32),
    Chown(PathBuf, u32, u32),
    Utimes(PathBuf, i64),
    SetXattr(PathBuf, String, Vec<u8>, i32),
    RemoveXattr(PathBuf, String),
}

fn apply(root: &Path, op: &Op) -> Outcome {
    let j = |p: &PathBuf| root.join(p);
    match op {
        Op::Create(p) => io(std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(j(p))
            .map(|_| ())),
        Op::Write(p, off, data) => io(std::fs::OpenOptions::new()
            .write(true)
            .open(j(p))
            .and_then(|f| f.write_all_at(data, *off))),
        Op::Truncate(p, len) => io(std::fs::OpenOptions::new()
            .write(true)
            .open(j(p))
            .and_then(|f| f.set_len(*len))),
        Op::Rename(a, b, flags) => {
            let (ca, cb) = (cpath(&j(a)), cpath(&j(b)));
            libc_rc(unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    ca.as_ptr(),
                    libc::AT_FDCWD,
                    cb.as_ptr(),
                    *flags,
                )
            })
        }
        Op::Link(a, b) => io(std::fs::hard_link(j(a), j(b))),
        Op::Symlink(p, target) => io(std::os::unix::fs::symlink(target, j(p))),
        Op::Unlink(p) => io(std::fs::remove_file(j(p))),
        Op::Mkdir(p) => io(std::fs::create_dir(j(p))),
        Op::Rmdir(p) => io(std::fs::remove_dir(j(p))),
        Op::Chmod(p, mode) => {
            let c = cpath(&j(p));
            libc_rc(unsafe { libc::chmod(c.as_ptr(), *mode) })
        }
        Op::Chown(p, uid, gid) => {
            let c = cpath(&j(p));
            libc_rc(unsafe { libc::lchown(c.as_ptr(), *uid, *gid) })
        }
        Op::Utimes(p, secs) => {
            let c = cpath(&j(p));
            let ts = [
                libc::timespec {
                    tv_sec: *secs,
                    tv_nsec: 0,
                },
                libc::timespec {
                    tv_sec: *secs + 1,
                    tv_nsec: 500,
                },
            ];
            libc_rc(unsafe {
                libc::utimensat(
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    ts.as_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            })
        }
        Op::SetXattr(p, name, value, flags) => {
            let (c, n) = (cpath(&j(p)), CString::new(name.as_str()).unwrap());
            libc_rc(unsafe {
                libc::lsetxattr(
                    c.as_ptr(),
                    n.as_ptr(),
                    value.as_ptr() as *const libc::c_void,
                    value.len(),
                    *flags,
                )
            })
        }
        Op::RemoveXattr(p, name) => {
            let (c, n) = (cpath(&j(p)), CString::new(name.as_str()).unwrap());
            libc_rc(unsafe { libc::lremovexattr(c.as_ptr(), n.as_ptr()) })
        }
    }
}

fn pick<'a>(rng: &mut StdRng, v: &'a [PathBuf]) -> &'a PathBuf {
    &v[rng.random_range(0..v.len())]
}

fn random_op(rng: &mut StdRng, tree: &BTreeMap<PathBuf, Node>) -> Op {
    let mut dirs = vec![PathBuf::new()];
    let mut files = vec![];
    let mut all = vec![];
    for (p, n) in tree {
        all.push(p.clone());
        match n.kind {
            "dir" => dirs.push(p.clone()),
            "file" => files.push(p.clone()),
            _ => {}
        }
    }
    let new_path = |rng: &mut StdRng| -> PathBuf {
        pick(rng, &dirs).join(NAMES[rng.random_range(0..NAMES.len())])
    };
    let any = |rng: &mut StdRng| -> PathBuf {
        if all.is_empty() || rng.random_bool(0.15) {
            new_path(rng)
        } else {
            pick(rng, &all).clone()
        }
    };
    let file = |rng: &mut StdRng| -> PathBuf {
        if files.is_empty() || rng.random_bool(0.1) {
            new_path(rng)
        } else {
            pick(rng, &files).clone()
        }
    };
    match rng.random_range(0..100) {
        0..=14 => Op::Create(new_path(rng)),
        15..=34 => {
            let off = match rng.random_range(0..10) {
                0 => CHUNK - rng.random_range(1..5000),
                1..=3 => rng.random_range(0..(8 << 20)),
                _ => rng.random_range(0..(256 << 10)),
            };
            let len = if rng.random_bool(0.2) {
                rng.random_range(1..(5 << 20))
            } else {
                rng.random_range(1..20000)
            };
            let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            Op::Write(file(rng), off, data)
        }
        35..=41 => Op::Truncate(
            file(rng),
            if rng.random_bool(0.5) {
                rng.random_range(0..(1 << 20))
            } else {
                rng.random_range(0..(9 << 20))
            },
        ),
        42..=53 => {
            let flags = match rng.random_range(0..10) {
                0 => libc::RENAME_NOREPLACE,
                1 => libc::RENAME_EXCHANGE,
                _ => 0,
            };
            let dst = if rng.random_bool(0.5) {
                new_path(rng)
            } else {
                any(rng)
            };
            Op::Rename(any(rng), dst, flags)
        }
        54..=58 => Op::Link(file(rng), new_path(rng)),
        59..=61 => Op::Symlink(
            new_path(rng),
            format!("target-{}", rng.random_range(0..100)),
        ),
        62..=68 => Op::Unlink(any(rng)),
        69..=77 => Op::Mkdir(new_path(rng)),
        78..=83 => Op::Rmdir(any(rng)),
        84..=88 => {
            let modes = [0o644, 0o600, 0o755, 0o700, 0o4755, 0o2755, 0o1777, 0o000];
            Op::Chmod(any(rng), modes[rng.random_range(0..modes.len())])
        }
        89..=90 => Op::Chown(
            any(rng),
            rng.random_range(0..3) * 1000,
            rng.random_range(0..3) * 1000,
        ),
        91..=93 => Op::Utimes(any(rng), rng.random_range(0..2_000_000_000)),
        94..=97 => {
            let flags = [0, libc::XATTR_CREATE, libc::XATTR_REPLACE][rng.random_range(0..3)];
            let len = rng.random_range(0..64);
            Op::SetXattr(
                any(rng),
                format!("user.k{}", rng.random_range(0..3)),
                (0..len).map(|_| rng.random()).collect(),
                flags,
            )
        }
        _ => Op::RemoveXattr(any(rng), format!("user.k{}", rng.random_range(0..3))),
    }
}

fn describe(op: &Op) -> String {
    match op {
        Op::Write(p, off, d) => format!("Write({p:?}, off {off}, {} bytes)", d.len()),
        other => format!("{other:?}"),
    }
}

fn compare(seed: u64, step: usize, a: &Path, b: &Path) {
    let (sa, sb) = (snapshot(a), snapshot(b));
    let ka: Vec<&PathBuf> = sa.keys().collect();
    let kb: Vec<&PathBuf> = sb.keys().collect();
    assert_eq!(ka, kb, "seed {seed}, after step {step}: the trees differ");
    for (p, na) in &sa {
        let nb = &sb[p];
        let mut na2 = na.clone();
        let mut nb2 = nb.clone();
        if na.kind == "dir" {
            // directory sizes are file-system specific
            na2.size = None;
            nb2.size = None;
        }
        assert_eq!(
            na2, nb2,
            "seed {seed}, after step {step}: {p:?} differs (left strait, right local)"
        );
    }
}

#[test]
fn random_operations_match_a_local_directory() {
    if !crate::support::require_fuse() {
        return;
    }
    let seed = crate::support::seed("differential test");
    let steps: usize = std::env::var("STRAIT_DIFF_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    eprintln!("differential test: {steps} steps");
    let mut rng = StdRng::seed_from_u64(seed);
    let fs = TestFs::rocks_local(&["--block-size", "1M"]);
    let local = tempfile::tempdir().unwrap();
    let reference = local.path().to_path_buf();
    let mut m = fs.mount(&["--attr-ttl", "0"]);
    for step in 0..steps {
        let tree = snapshot(&reference);
        let op = random_op(&mut rng, &tree);
        let got = apply(&m.point, &op);
        let want = apply(&reference, &op);
        assert_eq!(
            got,
            want,
            "seed {seed}, step {step}: {} gave {got:?} on strait, {want:?} locally",
            describe(&op)
        );
        if step % 50 == 49 {
            compare(seed, step, &m.point, &reference);
        }
        if step == steps / 2 {
            // everything must also survive a remount
            m.unmount();
            m = fs.mount(&["--attr-ttl", "0"]);
            compare(seed, step, &m.point, &reference);
        }
    }
    compare(seed, steps, &m.point, &reference);
    m.unmount();
}
