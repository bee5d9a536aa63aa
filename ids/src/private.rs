//! Files and directories only their owner may use: secrets (tokens, keys, `dev.json`), the
//! copies of a file system's data a mount keeps on its host (the disk cache, a `file://`
//! store), dumps. On a host shared by several users, a file any of them can read gives away
//! what the file system's permissions guard, and a directory any of them can write lets them
//! plant data the mount then serves (a CRC does not stop a forger).
//!
//! - [`write_private`], [`create_private`]: a file written mode 0600, also when it existed
//!   before with a looser mode.
//! - [`private_dir`]: a directory made mode 0700; one that exists is refused when others may
//!   write in it, and narrowed to 0700 when others may only read it.
//! - [`check_private`]: refuse to read a secret that others may read, as ssh does
//!   ("permissions are too open").

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The mode of a private file.
pub const FILE_MODE: u32 = 0o600;
/// The mode of a private directory.
pub const DIR_MODE: u32 = 0o700;

/// Write `bytes` to `path`, readable and writable by its owner alone (mode 0600, set before
/// the first byte is written, also on a file that existed with a looser mode).
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    create_private(path)?.write_all(bytes)
}

/// Create (or truncate) `path` for writing, readable and writable by its owner alone (mode
/// 0600, also on a file that existed with a looser mode): a dump, a list of changes set aside.
pub fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(FILE_MODE)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
    Ok(f)
}

/// Make `dir` (and its missing parents) mode 0700, or check the one that exists: refused when
/// users other than its owner may write in it (mode `g+w` or `o+w`), narrowed to 0700 when
/// they may only read or enter it (a directory an earlier release made 0755). `what` names it
/// in the error ("cache directory").
pub fn private_dir(dir: &Path, what: &str) -> Result<(), String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(|e| format!("create the {what} {}: {e}", dir.display()))?;
    let meta =
        std::fs::metadata(dir).map_err(|e| format!("read the {what} {}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("the {what} {} is not a directory", dir.display()));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "the {what} {} can be written by other users (mode {mode:04o}): they could plant \
             data in it; use a directory of your own (chmod 700 {})",
            dir.display(),
            dir.display()
        ));
    }
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE)).map_err(|e| {
            format!(
                "the {what} {} can be read by other users (mode {mode:04o}) and cannot be made \
                 private ({e}): chmod 700 it",
                dir.display()
            )
        })?;
    }
    Ok(())
}

/// Refuse the secret at `path` (a token or key file) that users other than its owner may
/// read or write, as ssh refuses a private key "too open". As PostgreSQL allows for its key,
/// a file root owns may also be read by its group (mode 0640: root keeps the secret, the
/// daemon's service group reads it, as deploy/README.md installs them). `what` names it in
/// the error.
pub fn check_private(path: &Path, what: &str) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta =
        std::fs::metadata(path).map_err(|e| format!("read the {what} {}: {e}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    let open = if meta.uid() == 0 {
        mode & 0o037
    } else {
        mode & 0o077
    };
    if open != 0 {
        return Err(format!(
            "the {what} {} can be read or written by other users (mode {mode:04o}): a secret \
             must be its owner's alone (chmod 600 {}; 640 when root owns it and the daemon's \
             group reads it)",
            path.display(),
            path.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn private_files_are_written_0600_even_over_a_looser_one() {
        let d = tempdir();
        let f = d.join("secret");
        std::fs::write(&f, "old").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(check_private(&f, "token file")
            .unwrap_err()
            .contains("mode 0644"));
        // group-readable: allowed when root owns the file (the service group reads it)
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        let root_owned = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&f).unwrap()) == 0;
        assert_eq!(check_private(&f, "token file").is_ok(), root_owned);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o660)).unwrap();
        assert!(check_private(&f, "token file").is_err());
        write_private(&f, b"new").unwrap();
        assert_eq!(mode(&f), 0o600);
        assert_eq!(std::fs::read(&f).unwrap(), b"new");
        check_private(&f, "token file").unwrap();
        assert!(check_private(&d.join("absent"), "token file").is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn private_dirs_are_made_0700_narrowed_or_refused() {
        let d = tempdir();
        // made: 0700, parents too
        let made = d.join("a/b/cache");
        private_dir(&made, "cache directory").unwrap();
        assert_eq!(mode(&made), 0o700);
        // readable by others (an earlier release's 0755): narrowed
        let open = d.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&open, "cache directory").unwrap();
        assert_eq!(mode(&open), 0o700);
        // writable by others (a shared /tmp-like directory): refused, left as it was
        for m in [0o777, 0o1777, 0o770] {
            let w = d.join(format!("w{m:o}"));
            std::fs::create_dir(&w).unwrap();
            std::fs::set_permissions(&w, std::fs::Permissions::from_mode(m)).unwrap();
            let e = private_dir(&w, "cache directory").unwrap_err();
            assert!(e.contains("written by other users"), "{e}");
            assert_eq!(mode(&w), m);
        }
        // a file where the directory should be
        std::fs::write(d.join("file"), "x").unwrap();
        assert!(private_dir(&d.join("file"), "cache directory").is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn tempdir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("strait-private-{:016x}", nonce()));
        std::fs::create_dir(&d).unwrap();
        d
    }

    fn nonce() -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    }
}
