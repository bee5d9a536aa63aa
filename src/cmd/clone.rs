//! `strait clone SRC DST`: a copy of a file or a tree made in the metadata only, sharing its
//! source's blocks (docs/operations.md, "Clones"). SRC and DST are paths under one strait
//! mount on this machine, at the primary or at a mirror (which forwards the clone to the
//! primary, as every change). The command sets the virtual xattr `strait.clone` on SRC with
//! the caller's identity, again while the primary answers EINPROGRESS (a big tree), and shows
//! the progress of the clone from `strait.clone.jobs` once a second.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strait_fs_core::meta::{clone_value, clone_xattr as x, CloneRequest};

use super::xattrs::{getxattr, setxattr_nofollow};

#[derive(clap::Args)]
pub struct Args {
    /// The file, directory or symlink to clone (under a strait mount).
    #[arg(value_name = "SRC")]
    pub src: PathBuf,
    /// Where the clone goes: a name that does not exist yet, in a directory of the same mount.
    #[arg(value_name = "DST")]
    pub dst: PathBuf,
    /// Keep the owners of the sources (root only); the copies are yours otherwise.
    #[arg(long, short = 'p')]
    pub preserve: bool,
}

/// Calls that answer "done" while DST is not there yet (a call answered from the record of
/// one sent before) before the command gives up.
const UNSEEN_MAX: u32 = 3;

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).context("a path with a NUL byte")
}

/// One readable line for a refused clone.
fn failed(src: &Path, dst: &Path, errno: i32) -> anyhow::Error {
    let why = std::io::Error::from_raw_os_error(errno);
    let hint = match errno {
        libc::EEXIST => " (DST exists)",
        libc::EACCES => {
            " (every file must be readable and every directory readable and searchable by you, \
             and DST's directory writable)"
        }
        libc::EDQUOT => " (a directory quota above DST cannot hold the clone)",
        libc::EPERM => " (--preserve is for root; the trash cannot be cloned)",
        libc::ENOTSUP => " (is SRC under a strait mount?)",
        libc::EROFS => " (the file system is served read-only)",
        _ => "",
    };
    anyhow::anyhow!("clone {} to {}: {why}{hint}", src.display(), dst.display())
}

/// The progress of the caller's clone of `src_ino` named `name`, from the jobs listing.
fn progress(dir: &CString, src_ino: u64, name: &[u8]) -> Option<(u64, u64)> {
    let text = getxattr(dir, x::JOBS).ok()?;
    for line in text.split(|&b| b == b'\n') {
        let at = line.windows(6).position(|w| w == b" name=")?;
        if &line[at + 6..] != name {
            continue;
        }
        let head = std::str::from_utf8(&line[..at]).ok()?;
        let field = |f: &str| {
            head.split_whitespace()
                .find_map(|w| w.strip_prefix(f)?.strip_prefix('='))
                .and_then(|v| v.parse::<u64>().ok())
        };
        if field("src") == Some(src_ino) {
            return Some((field("inodes")?, field("space")?));
        }
    }
    None
}

/// Whether `dst` shows at this mount within a few seconds (a mount's caches may show its
/// directory as it was for up to a second).
fn appears(dst: &Path) -> bool {
    let until = Instant::now() + Duration::from_secs(3);
    loop {
        if std::fs::symlink_metadata(dst).is_ok() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn run(a: Args) -> Result<()> {
    let src_md = std::fs::symlink_metadata(&a.src).with_context(|| a.src.display().to_string())?;
    let name = a
        .dst
        .file_name()
        .with_context(|| format!("{}: DST needs a name", a.dst.display()))?
        .as_bytes()
        .to_vec();
    let parent = match a.dst.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let parent_md = std::fs::metadata(&parent).with_context(|| parent.display().to_string())?;
    if !parent_md.is_dir() {
        bail!("{}: not a directory", parent.display());
    }
    if parent_md.dev() != src_md.dev() {
        bail!(
            "{} and {} are not on the same strait mount (a clone shares blocks within one file \
             system; copy it instead)",
            a.src.display(),
            parent.display()
        );
    }
    if std::fs::symlink_metadata(&a.dst).is_ok() {
        return Err(failed(&a.src, &a.dst, libc::EEXIST));
    }
    let src = cpath(&a.src)?;
    let dir = cpath(&parent)?;
    // this run's clone: another run never goes on with it
    let value = clone_value(&CloneRequest {
        parent: parent_md.ino(),
        preserve: a.preserve,
        token: rand::random(),
        name: &name,
    });
    let start = Instant::now();
    let mut shown = Instant::now();
    let mut unseen = 0;
    loop {
        match setxattr_nofollow(&src, x::CLONE, &value) {
            Ok(()) => {
                if appears(&a.dst) {
                    break;
                }
                // answered from the record of a call sent before: go on with the clone
                unseen += 1;
                if unseen > UNSEEN_MAX {
                    bail!(
                        "clone {} to {}: the primary answered done, but {} is not there",
                        a.src.display(),
                        a.dst.display(),
                        a.dst.display()
                    );
                }
            }
            // the clone was attached by the call answered before: DST is it
            Err(libc::EEXIST) if unseen > 0 => break,
            Err(libc::EINPROGRESS) => {}
            Err(e) => return Err(failed(&a.src, &a.dst, e)),
        }
        if shown.elapsed() >= Duration::from_secs(1) {
            shown = Instant::now();
            if let Some((inodes, space)) = progress(&dir, src_md.ino(), &name) {
                eprintln!(
                    "cloning {}: {inodes} inodes, {} so far ({:.0} s)",
                    a.src.display(),
                    super::human_bytes(space),
                    start.elapsed().as_secs_f64()
                );
            }
        }
    }
    println!(
        "cloned {} to {} in {:.2} s",
        a.src.display(),
        a.dst.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
