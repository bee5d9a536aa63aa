//! Object store in a local directory: one file per object, keys' `/` become subdirectories.
//!
//! A `put` writes a temporary file beside the final one, syncs it and renames it over the
//! final name, so readers see the old object or the new one, never a part. A
//! `put_if_absent` links the temporary file to the final name instead, which fails on an
//! existing name: one atomic step. Temporary files
//! carry [`TEMP_PREFIX`], which keys may not use, so `list` can skip them. Empty directories
//! are left in place on `delete`: removing them would race with a concurrent `put` creating
//! a file in the same directory.

use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::{BoxFut, ObjResult, ObjectError, ObjectInfo, ObjectStore, PutIfAbsent, LIST_LIMIT_MAX};

/// Names starting with this are in-progress writes, never objects.
const TEMP_PREFIX: &str = ".strait-tmp-";

pub struct LocalStore {
    root: PathBuf,
    url: String,
}

impl LocalStore {
    /// Open (and create if needed) the directory that holds the objects.
    pub fn open(path: &Path) -> crate::Result<Self> {
        // the store holds the file system's bytes: its owner's alone (0700), and refused
        // where other users could plant objects in it
        strait_ids::private::private_dir(path, "object directory")
            .map_err(crate::Error::Invalid)?;
        let meta = std::fs::metadata(path).map_err(|e| {
            crate::Error::io(format!("stat object directory {}", path.display()), e)
        })?;
        if !meta.is_dir() {
            return Err(crate::Error::Invalid(format!(
                "object directory {} is not a directory",
                path.display()
            )));
        }
        Ok(LocalStore {
            root: path.to_path_buf(),
            url: format!("file://{}", path.display()),
        })
    }

    /// The file of a key, after checking the key cannot escape the root or collide with
    /// temporary files.
    fn path_of(&self, key: &str) -> ObjResult<PathBuf> {
        validate_key(key)?;
        Ok(self.root.join(key))
    }
}

fn validate_key(key: &str) -> ObjResult<()> {
    let bad = key.is_empty()
        || key.contains('\0')
        || key
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == ".." || c.starts_with(TEMP_PREFIX));
    if bad {
        return Err(ObjectError::Fatal(format!(
            "use object key {key:?}: keys are non-empty '/'-separated names without '.', '..', \
             empty parts or the prefix {TEMP_PREFIX:?}"
        )));
    }
    Ok(())
}

/// Whether retrying can help after an I/O error from the local file system.
fn map_io(context: String, e: io::Error) -> ObjectError {
    use io::ErrorKind as K;
    let msg = format!("{context}: {e}");
    match e.kind() {
        K::TimedOut => ObjectError::Timeout(msg),
        K::Interrupted | K::WouldBlock | K::ResourceBusy => ObjectError::Transient(msg),
        // EIO can be a network file system's passing trouble; EMFILE/ENFILE/ENOMEM pass
        // when other work finishes. Retries above this layer are bounded.
        _ if matches!(
            e.raw_os_error(),
            Some(libc::EIO | libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EAGAIN)
        ) =>
        {
            ObjectError::Transient(msg)
        }
        // Disk full, permission denied, read-only file system, ... need an operator.
        _ => ObjectError::Fatal(msg),
    }
}

/// The key is absent when its path, or a parent of it, is missing, a directory, or a file.
fn is_absent(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory | io::ErrorKind::IsADirectory
    )
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> ObjResult<T> + Send + 'static,
) -> ObjResult<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) if e.is_cancelled() => Err(ObjectError::Cancelled),
        Err(e) => Err(ObjectError::Fatal(format!(
            "run blocking file system task: {e}"
        ))),
    }
}

/// How [`put_blocking`] moves the written temporary file to its key.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Rename over whatever is there.
    Replace,
    /// Link to the name, which fails if it exists (the temporary file is removed either way).
    IfAbsent,
}

fn put_blocking(path: &Path, data: &[u8], what: &str, place: Place) -> ObjResult<PutIfAbsent> {
    let dir = path
        .parent()
        .ok_or_else(|| ObjectError::Fatal(format!("write {what}: key has no parent directory")))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(strait_ids::private::DIR_MODE)
        .create(dir)
        .map_err(|e| map_io(format!("create directory for {what}"), e))?;
    let tmp = dir.join(format!("{TEMP_PREFIX}{:016x}", rand::random::<u64>()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(strait_ids::private::FILE_MODE)
            .open(&tmp)?;
        f.write_all(data)?;
        // Start writing the object back now, without waiting for it, so that the next
        // fsync(2) finds little left to flush.
        unsafe {
            libc::sync_file_range(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
                0,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
        // No fsync per object: durability across a machine crash is bought for everything at
        // once by `sync` (syncfs), which the VFS calls on fsync(2) before it syncs metadata.
        // After a process crash the rename still shows a whole object or none.
        match place {
            Place::Replace => std::fs::rename(&tmp, path).map(|()| PutIfAbsent::Created),
            Place::IfAbsent => {
                let linked = match std::fs::hard_link(&tmp, path) {
                    Ok(()) => PutIfAbsent::Created,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => PutIfAbsent::Exists,
                    Err(e) => return Err(e),
                };
                std::fs::remove_file(&tmp)?;
                Ok(linked)
            }
        }
    })();
    match written {
        Ok(done) => Ok(done),
        Err(e) => {
            // Best effort: the original error is the one worth reporting.
            let _ = std::fs::remove_file(&tmp);
            Err(map_io(format!("write {what}"), e))
        }
    }
}

struct ListQuery<'a> {
    prefix: &'a str,
    start_after: Option<&'a str>,
    limit: usize,
}

/// Walk `dir` (holding keys that start with `dir_key`, which is empty or ends in '/') in
/// key byte order, appending matches to `out`. Returns true once `out` is full.
///
/// Visiting the entries of each directory sorted by name, with '/' appended to directory
/// names, yields keys in global byte order: every key below directory `d` starts with `d/`,
/// and no sibling file name can start with `d/` since names hold no '/'.
fn walk(
    dir: &Path,
    dir_key: &str,
    q: &ListQuery<'_>,
    out: &mut Vec<ObjectInfo>,
    what: &str,
) -> ObjResult<bool> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if is_absent(&e) => return Ok(false),
        Err(e) => return Err(map_io(format!("list {what}"), e)),
    };
    let mut items = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| map_io(format!("list {what}"), e))?;
        // Names that are not UTF-8 cannot be keys; someone else put them here.
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if name.starts_with(TEMP_PREFIX) {
            continue;
        }
        let file_type = match entry.file_type() {
            Ok(t) => t,
            Err(e) if is_absent(&e) => continue,
            Err(e) => return Err(map_io(format!("list {what}"), e)),
        };
        if file_type.is_dir() {
            items.push((format!("{dir_key}{name}/"), true, entry.path()));
        } else if file_type.is_file() {
            items.push((format!("{dir_key}{name}"), false, entry.path()));
        }
    }
    items.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    for (key, is_dir, path) in items {
        if is_dir {
            let overlaps_prefix = key.starts_with(q.prefix) || q.prefix.starts_with(key.as_str());
            // Every key below `key` is before `start_after` unless `start_after` is below it.
            let all_before_start = q
                .start_after
                .is_some_and(|sa| key.as_str() < sa && !sa.starts_with(key.as_str()));
            if overlaps_prefix && !all_before_start && walk(&path, &key, q, out, what)? {
                return Ok(true);
            }
            continue;
        }
        if !key.starts_with(q.prefix) || q.start_after.is_some_and(|sa| key.as_str() <= sa) {
            continue;
        }
        let (size, modified) = match std::fs::metadata(&path) {
            Ok(m) => (m.len(), m.modified().ok()),
            // Deleted since read_dir: it is no longer an object.
            Err(e) if is_absent(&e) => continue,
            Err(e) => return Err(map_io(format!("stat object {key} in {what}"), e)),
        };
        out.push(ObjectInfo {
            key,
            size,
            modified,
        });
        if out.len() >= q.limit {
            return Ok(true);
        }
    }
    Ok(false)
}

impl ObjectStore for LocalStore {
    fn describe(&self) -> String {
        self.url.clone()
    }

    fn sync(&self) -> BoxFut<'_, ()> {
        let root = self.root.clone();
        Box::pin(async move {
            blocking(move || {
                let dir = std::fs::File::open(&root)
                    .map_err(|e| map_io(format!("open {}", root.display()), e))?;
                // syncfs flushes every object written so far on this file system, by any
                // process (a daemon syncs what its region's mounts wrote)
                let rc = unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) };
                if rc != 0 {
                    return Err(map_io(
                        format!("sync {}", root.display()),
                        std::io::Error::last_os_error(),
                    ));
                }
                // and the root directory itself: cheap after the syncfs, and the one sync a
                // file system in user space sees (FUSE passes no syncfs on, but for
                // virtiofs), which the chaos harness's power-loss layer takes for the syncfs
                dir.sync_all()
                    .map_err(|e| map_io(format!("sync {}", root.display()), e))?;
                Ok(())
            })
            .await
        })
    }

    fn put<'a>(&'a self, key: &'a str, data: Bytes) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let path = self.path_of(key)?;
            let what = format!("object {key} to {}", self.url);
            blocking(move || put_blocking(&path, &data, &what, Place::Replace))
                .await
                .map(|_| ())
        })
    }

    fn put_if_absent<'a>(&'a self, key: &'a str, data: Bytes) -> BoxFut<'a, PutIfAbsent> {
        Box::pin(async move {
            let path = self.path_of(key)?;
            let what = format!("object {key} to {}", self.url);
            blocking(move || put_blocking(&path, &data, &what, Place::IfAbsent)).await
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFut<'a, Bytes> {
        Box::pin(async move {
            let path = self.path_of(key)?;
            match tokio::fs::read(&path).await {
                Ok(data) => Ok(Bytes::from(data)),
                Err(e) if is_absent(&e) => Err(ObjectError::NotFound(key.to_string())),
                Err(e) => Err(map_io(format!("read object {key} from {}", self.url), e)),
            }
        })
    }

    fn head<'a>(&'a self, key: &'a str) -> BoxFut<'a, Option<u64>> {
        Box::pin(async move {
            let path = self.path_of(key)?;
            match tokio::fs::metadata(&path).await {
                Ok(m) if m.is_file() => Ok(Some(m.len())),
                Ok(_) => Ok(None),
                Err(e) if is_absent(&e) => Ok(None),
                Err(e) => Err(map_io(format!("stat object {key} in {}", self.url), e)),
            }
        })
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let path = self.path_of(key)?;
            match tokio::fs::remove_file(&path).await {
                Ok(()) => Ok(()),
                Err(e) if is_absent(&e) => Ok(()),
                Err(e) => Err(map_io(format!("delete object {key} from {}", self.url), e)),
            }
        })
    }

    fn list<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
    ) -> BoxFut<'a, Vec<ObjectInfo>> {
        Box::pin(async move {
            let limit = limit.min(LIST_LIMIT_MAX);
            if limit == 0 {
                return Ok(Vec::new());
            }
            // Start at the deepest directory the prefix names in full.
            let dir_key = match prefix.rfind('/') {
                Some(i) => &prefix[..=i],
                None => "",
            };
            if !dir_key.is_empty() && validate_key(&dir_key[..dir_key.len() - 1]).is_err() {
                // No valid key has this prefix.
                return Ok(Vec::new());
            }
            let dir = self.root.join(dir_key);
            let (dir_key, prefix) = (dir_key.to_string(), prefix.to_string());
            let start_after = start_after.map(str::to_string);
            let what = self.url.clone();
            blocking(move || {
                let q = ListQuery {
                    prefix: &prefix,
                    start_after: start_after.as_deref(),
                    limit,
                };
                let mut out = Vec::new();
                walk(&dir, &dir_key, &q, &mut out, &what)?;
                Ok(out)
            })
            .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn passes_the_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(&dir.path().join("objects")).unwrap();
        crate::object::conformance::run_all(&store).await;
    }

    #[tokio::test]
    async fn keys_cannot_escape_the_root_and_temp_files_are_not_listed() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        for key in ["", "/abs", "a/../b", "a//b", "a/", ".", "x/.strait-tmp-1"] {
            let err = store.put(key, Bytes::from_static(b"x")).await.unwrap_err();
            assert!(matches!(err, ObjectError::Fatal(_)), "put {key:?}: {err:?}");
        }

        // A write that died before its rename leaves a temporary file: it is no object.
        std::fs::create_dir_all(dir.path().join("chunks")).unwrap();
        std::fs::write(dir.path().join("chunks/.strait-tmp-00ff"), b"partial").unwrap();
        store
            .put("chunks/1", Bytes::from_static(b"whole"))
            .await
            .unwrap();
        let keys: Vec<_> = store
            .list("", None, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect();
        assert_eq!(keys, ["chunks/1"]);
    }

    #[tokio::test]
    async fn a_directory_is_not_an_object() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        store.put("a/b", Bytes::from_static(b"x")).await.unwrap();
        assert!(matches!(
            store.get("a").await,
            Err(ObjectError::NotFound(_))
        ));
        assert_eq!(store.head("a").await.unwrap(), None);
        store.delete("a").await.unwrap();
        assert!(matches!(
            store.get("a/b/c").await,
            Err(ObjectError::NotFound(_))
        ));
        assert_eq!(store.get("a/b").await.unwrap(), Bytes::from_static(b"x"));
    }

    #[test]
    fn io_errors_say_whether_retrying_helps() {
        let full = map_io("write x".into(), io::Error::from_raw_os_error(libc::ENOSPC));
        assert!(full.is_permanent(), "{full:?}");
        let denied = map_io("write x".into(), io::Error::from_raw_os_error(libc::EACCES));
        assert!(denied.is_permanent(), "{denied:?}");
        let busy = map_io("write x".into(), io::Error::from_raw_os_error(libc::EMFILE));
        assert!(matches!(busy, ObjectError::Transient(_)), "{busy:?}");
        assert!(busy.to_string().contains("write x: "), "{busy}");
    }

    /// Issue 43, item 3, for `file://` stores: objects were written 0644 under 0755
    /// directories, readable by every user of the host, and a directory others may write was
    /// used. Now the store is 0700, its objects 0600, and a directory others may write is
    /// refused.
    #[tokio::test]
    async fn a_local_store_is_its_owners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("objects");
        let store = LocalStore::open(&root).unwrap();
        assert_eq!(mode(&root), 0o700);
        store
            .put("chunks/0/0/1_0_5", Bytes::from_static(b"hello"))
            .await
            .unwrap();
        assert_eq!(mode(&root.join("chunks/0/0/1_0_5")), 0o600);
        assert_eq!(mode(&root.join("chunks/0")), 0o700);
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = LocalStore::open(&shared).err().unwrap();
        assert!(e.to_string().contains("written by other users"), "{e}");
    }
}
