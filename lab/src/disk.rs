//! A small file system of its own for a daemon's data directory (or a mount's cache), so
//! that a fault can fill it: an ext4 image file loop-mounted (`truncate`, `mkfs.ext4`,
//! `mount -o loop`; root only). Filling it writes a filler file until the file system says
//! ENOSPC; the heal deletes the filler.
//!
//! The file system has no blocks reserved for root (`-m 0`): the daemons run as root here,
//! and with the default 5 % the filler (root too) and a daemon would see different limits.
//!
//! Dropping a [`LoopDisk`] detaches it lazily (`umount -l`: the kernel lets go once the
//! last daemon using it exits, and the loop device goes with it) and deletes its image;
//! [`crate::interrupt`] does the same on Ctrl-C.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// What the filler writes at once once `fallocate` has taken what it can.
const FILL_CHUNK_BYTES: usize = 64 << 10;

pub struct LoopDisk {
    image: PathBuf,
    point: PathBuf,
}

/// Whether this process may loop-mount file systems, and `mkfs.ext4` is installed; the reason
/// when not.
pub fn available() -> Result<()> {
    // SAFETY: geteuid has no preconditions
    if unsafe { libc::geteuid() } != 0 {
        bail!("a loop-mounted file system needs root");
    }
    let mkfs = Command::new("mkfs.ext4")
        .arg("-V")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !mkfs {
        bail!("mkfs.ext4 is not installed (Debian package e2fsprogs)");
    }
    Ok(())
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl LoopDisk {
    /// Make an ext4 of `size_mib` in the sparse file `image` and mount it at `point`
    /// (created).
    pub fn create(image: &Path, point: &Path, size_mib: u64) -> Result<LoopDisk> {
        available()?;
        std::fs::create_dir_all(point).with_context(|| format!("create {}", point.display()))?;
        let f = std::fs::File::create(image)
            .with_context(|| format!("create the image {}", image.display()))?;
        f.set_len(size_mib << 20)
            .with_context(|| format!("size the image {}", image.display()))?;
        drop(f);
        run(Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-m",
                "0",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
            ])
            .arg(image))?;
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(image)
            .arg(point))?;
        crate::interrupt::detach_on_signal(point);
        Ok(LoopDisk {
            image: image.to_path_buf(),
            point: point.to_path_buf(),
        })
    }

    /// Where it is mounted.
    pub fn point(&self) -> &Path {
        &self.point
    }

    fn filler(&self) -> PathBuf {
        self.point.join("chaos-filler")
    }

    /// Bytes free for root, by statvfs (which counts ext4's reserve for its own metadata,
    /// min(2 %, 4096 blocks), that no file can take: a full disk still shows it).
    pub fn free_bytes(&self) -> Result<u64> {
        let s = nix::sys::statvfs::statvfs(&self.point)
            .with_context(|| format!("statvfs {}", self.point.display()))?;
        Ok(s.blocks_free() as u64 * s.fragment_size() as u64)
    }

    /// Fill the file system to the last block: a filler file as large as `fallocate` allows,
    /// then written on until ENOSPC. Returns the filler's size.
    pub fn fill(&self) -> Result<u64> {
        let p = self.filler();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p)
            .with_context(|| format!("create the filler {}", p.display()))?;
        let mut len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let mut want = self.free_bytes()?;
        // the file's own extent tree needs blocks too: ask for less until it fits
        while want >= FILL_CHUNK_BYTES as u64 {
            match nix::fcntl::fallocate(
                &f,
                nix::fcntl::FallocateFlags::empty(),
                len as i64,
                want as i64,
            ) {
                Ok(()) => {
                    len += want;
                    want = self.free_bytes()?;
                }
                Err(nix::errno::Errno::ENOSPC) => want /= 2,
                Err(e) => {
                    return Err(e).with_context(|| format!("fallocate {}", p.display()));
                }
            }
        }
        let chunk = vec![0x5a_u8; FILL_CHUNK_BYTES];
        let mut n = FILL_CHUNK_BYTES;
        loop {
            match f.write_all_at(&chunk[..n], len) {
                Ok(()) => len += n as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && n > 1 => n /= 2,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => return Err(e).with_context(|| format!("write {}", p.display())),
            }
        }
        // data already on the disk is the disk's; what the page cache still holds may be
        // written back later and fail then, which is what a full disk does too
        let _ = f.flush();
        let _ = f.sync_data();
        Ok(len)
    }

    /// Delete the filler (nothing to do when there is none).
    pub fn unfill(&self) -> Result<()> {
        match std::fs::remove_file(self.filler()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("delete {}", self.filler().display())),
        }
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        let _ = self.unfill();
        let _ = strait_devkit::cluster::detach(&self.point);
        crate::interrupt::forget(&self.point);
        let _ = std::fs::remove_file(&self.image);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As root: a filled disk says ENOSPC to the next writer, and is usable again once the
    /// filler is gone. Skipped (with a line saying so) when not root or without mkfs.ext4,
    /// unless CI is set.
    #[test]
    fn a_filled_disk_refuses_writes_until_the_filler_is_gone() {
        if let Err(why) = available() {
            assert!(std::env::var("CI").is_err(), "CI needs loop disks: {why:#}");
            eprintln!("skipped: {why:#}");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let d = LoopDisk::create(&t.path().join("disk.img"), &t.path().join("mnt"), 16).unwrap();
        let probe = d.point().join("probe");
        std::fs::write(&probe, b"before").unwrap();

        let filled = d.fill().unwrap();
        assert!(filled > 8 << 20, "filled only {filled} bytes of 16 MiB");
        let e = std::fs::write(d.point().join("more"), vec![1u8; 1 << 20]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");

        d.unfill().unwrap();
        std::fs::write(d.point().join("more"), vec![1u8; 1 << 20]).unwrap();
        assert_eq!(std::fs::read(&probe).unwrap(), b"before");
        let point = d.point().to_path_buf();
        drop(d);
        assert!(!point.join("probe").exists(), "detached on drop");
    }
}
