//! Metadata backups kept in the object store: a consistent dump of the file system's metadata
//! ([`crate::snapshot::dump`]), compressed and stored beside the blocks, as JuiceFS's
//! `--backup-meta` does. A primary takes one every `backup_interval_s` and keeps the last
//! `backup_keep` (`strait_primary::backup`); `strait backup list` lists them, `strait load
//! --store` restores one, and `strait status` shows the last.
//!
//! A backup `NAME` (the UTC time it started, `20261207T130501.123Z`, so names sort by time)
//! is the dump stream compressed with zstd and cut into parts:
//! ```text
//! meta-backups/NAME/part-00000 ... part-NNNNN
//! meta-backups/NAME/manifest      JSON: version, time, pairs, each part's size and SHA-256
//! ```
//!
//! # To ensure correctness
//! - The dump runs in one read transaction ([`crate::snapshot`]): a backup is the metadata at
//!   one version, whatever the daemon commits meanwhile.
//! - The manifest is written after every part is stored: a backup without one (its writer
//!   died or failed) is never listed nor loaded. Pruning deletes a backup's manifest first,
//!   so a backup deleted halfway is an incomplete one, never a damaged complete one.
//! - Loading checks each part's size and SHA-256 before its bytes are decoded, and
//!   [`crate::snapshot::load`] checks the dump's own digest at its end (and writes the
//!   version last): a damaged backup is refused and leaves no version behind.
//! - Memory is bounded: the dump is cut into parts of [`PART_BYTES`] as it is written, with at
//!   most [`PARTS_IN_FLIGHT`] parts waiting between the dump and the uploads.
//! - Only keys under [`PREFIX`] are written or deleted here; the blocks (`chunks/`) are not
//!   touched, and the orphan sweep lists only those.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::error::{Error, Result};
use crate::kv::KvEngine;
use crate::object::{self, DynStore, LIST_LIMIT_MAX};
use crate::snapshot::{self, DumpHeader};

/// Where backups are kept in the object store.
pub const PREFIX: &str = "meta-backups/";
/// The most compressed bytes in one part.
pub const PART_BYTES: usize = 32 << 20;
/// Parts the dump may get ahead of the uploads.
const PARTS_IN_FLIGHT: usize = 2;
/// zstd's level: fast, and metadata compresses well at it.
const ZSTD_LEVEL: i32 = 3;
/// Attempts of each object store call (transient failures only).
const ATTEMPTS: u32 = 5;
/// The leaf name of a backup's manifest.
const MANIFEST: &str = "manifest";
/// The largest manifest read.
const MANIFEST_BYTES_MAX: usize = 16 << 20;

/// One stored part of a backup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    pub bytes: u64,
    pub sha256: String,
}

/// What a complete backup holds: written last, as its `manifest`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The backup's name (its directory under [`PREFIX`]).
    pub name: String,
    /// The file system's name.
    pub fs_name: String,
    /// The metadata version the dump holds.
    pub version: u64,
    /// When the dump started (ms since the Unix epoch).
    pub started_ms: u64,
    /// How long the dump and its upload took.
    pub took_ms: u64,
    /// Key-value pairs in the dump.
    pub pairs: u64,
    /// The dump's size before compression.
    pub dump_bytes: u64,
    pub parts: Vec<Part>,
}

impl Manifest {
    /// Bytes stored in the object store.
    pub fn stored_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.bytes).sum()
    }
}

/// The name of a backup started at `ms` (since the Unix epoch): its UTC time,
/// `YYYYMMDDTHHMMSS.mmmZ`, so that names sort in time order.
pub fn name_at(ms: u64) -> String {
    let secs = ms / 1000;
    let (y, mo, d) = civil_date((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!(
        "{y:04}{mo:02}{d:02}T{:02}{:02}{:02}.{:03}Z",
        s / 3600,
        s / 60 % 60,
        s % 60,
        ms % 1000
    )
}

/// The proleptic Gregorian date of day `days` since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_date(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn key(name: &str, leaf: &str) -> String {
    format!("{PREFIX}{name}/{leaf}")
}

fn part_key(name: &str, index: usize) -> String {
    key(name, &format!("part-{index:05}"))
}

/// Take a backup of the metadata in `kv` into `store`, started at `started_ms`: the
/// complete backup's manifest, or the first error (and nothing listed: the parts already
/// stored are deleted, as well as can be).
pub async fn take(kv: Arc<dyn KvEngine>, store: DynStore, started_ms: u64) -> Result<Manifest> {
    take_in_parts(kv, store, started_ms, PART_BYTES).await
}

async fn take_in_parts(
    kv: Arc<dyn KvEngine>,
    store: DynStore,
    started_ms: u64,
    part_bytes: usize,
) -> Result<Manifest> {
    let name = name_at(started_ms);
    let t0 = Instant::now();
    let (tx, mut rx) = mpsc::channel::<Bytes>(PARTS_IN_FLIGHT);
    let dumping = tokio::task::spawn_blocking(move || -> Result<(DumpHeader, u64, u64)> {
        let parts = PartWriter {
            buf: Vec::new(),
            part_bytes,
            tx,
        };
        let encoder = zstd::Encoder::new(parts, ZSTD_LEVEL)
            .map_err(|e| Error::io("start compressing the backup", e))?;
        let mut counted = Counted {
            inner: encoder,
            bytes: 0,
        };
        let (header, pairs) = snapshot::dump(kv.as_ref(), &mut counted)?;
        let dump_bytes = counted.bytes;
        let mut parts = counted
            .inner
            .finish()
            .map_err(|e| Error::io("compress the backup", e))?;
        parts
            .send_rest()
            .map_err(|e| Error::io("hand the backup's last part over", e))?;
        Ok((header, pairs, dump_bytes))
    });
    // the uploads, part by part as the dump makes them; `rx` is dropped when they stop, so a
    // dump whose upload failed fails at its next part instead of waiting
    let (s, n) = (store.clone(), name.clone());
    let uploading = async move {
        let mut parts = Vec::new();
        while let Some(b) = rx.recv().await {
            let k = part_key(&n, parts.len());
            let part = Part {
                bytes: b.len() as u64,
                sha256: hex::encode(Sha256::digest(&b)),
            };
            object::retry(&format!("store {k}"), ATTEMPTS, || s.put(&k, b.clone())).await?;
            parts.push(part);
        }
        Ok::<_, Error>(parts)
    };
    let uploaded = uploading.await;
    let dumped = dumping
        .await
        .map_err(|e| Error::Meta(format!("the backup's dump stopped: {e}")))
        .and_then(|r| r);
    let done = match (uploaded, dumped) {
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        (Ok(parts), Ok((header, pairs, dump_bytes))) => {
            let m = Manifest {
                name: name.clone(),
                fs_name: header.name,
                version: header.version.0,
                started_ms,
                took_ms: t0.elapsed().as_millis() as u64,
                pairs,
                dump_bytes,
                parts,
            };
            let text = serde_json::to_vec_pretty(&m)
                .map_err(|e| Error::Invalid(format!("encode the backup's manifest: {e}")))?;
            let k = key(&name, MANIFEST);
            object::retry(&format!("store {k}"), ATTEMPTS, || {
                store.put(&k, Bytes::from(text.clone()))
            })
            .await
            .map(|()| m)
            .map_err(Error::from)
        }
    };
    if done.is_err() {
        if let Err(e) = delete(&store, &name).await {
            tracing::warn!("delete the parts of the failed backup {name}: {e}");
        }
    }
    done
}

/// Hands the compressed dump to the uploads in parts of `part_bytes`.
struct PartWriter {
    buf: Vec<u8>,
    part_bytes: usize,
    tx: mpsc::Sender<Bytes>,
}

impl PartWriter {
    fn send(&mut self) -> std::io::Result<()> {
        let full = std::mem::take(&mut self.buf);
        self.tx
            .blocking_send(Bytes::from(full))
            .map_err(|_| std::io::Error::other("the backup's upload stopped"))
    }

    fn send_rest(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.send()
    }
}

impl Write for PartWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(self.part_bytes);
        }
        let n = data.len().min(self.part_bytes - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == self.part_bytes {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Counts the bytes written through it.
struct Counted<W> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(data)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Every backup directory in `store`: name -> (its keys, whether it has a manifest).
async fn directories(store: &DynStore) -> Result<BTreeMap<String, (Vec<String>, bool)>> {
    let mut dirs: BTreeMap<String, (Vec<String>, bool)> = BTreeMap::new();
    let mut after: Option<String> = None;
    loop {
        let page = object::retry("list the metadata backups", ATTEMPTS, || {
            store.list(PREFIX, after.as_deref(), LIST_LIMIT_MAX)
        })
        .await?;
        let Some(last) = page.last() else { break };
        after = Some(last.key.clone());
        for o in &page {
            let Some((name, leaf)) = o
                .key
                .strip_prefix(PREFIX)
                .and_then(|rest| rest.split_once('/'))
            else {
                continue;
            };
            let e = dirs.entry(name.to_string()).or_default();
            e.0.push(o.key.clone());
            e.1 |= leaf == MANIFEST;
        }
        if page.len() < LIST_LIMIT_MAX {
            break;
        }
    }
    Ok(dirs)
}

/// Read backup `name`'s manifest.
async fn manifest(store: &DynStore, name: &str) -> Result<Manifest> {
    let k = key(name, MANIFEST);
    let b = object::retry(&format!("read {k}"), ATTEMPTS, || store.get(&k)).await?;
    if b.len() > MANIFEST_BYTES_MAX {
        return Err(Error::corrupt(format!("{k}: {} bytes", b.len())));
    }
    let m: Manifest =
        serde_json::from_slice(&b).map_err(|e| Error::corrupt(format!("{k}: {e}")))?;
    if m.name != name {
        return Err(Error::corrupt(format!("{k} names backup {:?}", m.name)));
    }
    Ok(m)
}

/// The complete backups in `store`, oldest first. A manifest that cannot be read is left out
/// (and logged).
pub async fn list(store: &DynStore) -> Result<Vec<Manifest>> {
    let mut out = Vec::new();
    for (name, (_, complete)) in directories(store).await? {
        if !complete {
            continue;
        }
        match manifest(store, &name).await {
            Ok(m) => out.push(m),
            Err(e) => tracing::warn!("metadata backup {name} left out: {e}"),
        }
    }
    Ok(out)
}

/// Backup `name`, or the newest one when `name` is None.
pub async fn find(store: &DynStore, name: Option<&str>) -> Result<Manifest> {
    let all = list(store).await?;
    match name {
        Some(n) => all.into_iter().find(|m| m.name == n).ok_or_else(|| {
            Error::Invalid(format!(
                "no complete metadata backup named {n} in {} (`strait backup list` lists them)",
                store.describe()
            ))
        }),
        None => all
            .into_iter()
            .next_back()
            .ok_or_else(|| Error::Invalid(format!("no metadata backup in {}", store.describe()))),
    }
}

/// Delete every key of backup `name`, its manifest first.
async fn delete(store: &DynStore, name: &str) -> Result<()> {
    let m = key(name, MANIFEST);
    object::retry(&format!("delete {m}"), ATTEMPTS, || store.delete(&m)).await?;
    let dirs = directories(store).await?;
    for k in dirs.get(name).map(|d| d.0.as_slice()).unwrap_or_default() {
        object::retry(&format!("delete {k}"), ATTEMPTS, || store.delete(k)).await?;
    }
    Ok(())
}

/// Keep the newest `keep` complete backups (at least one): delete the older ones, and the
/// incomplete ones older than the newest complete backup (writers that died; a newer
/// incomplete one may be in progress). The names deleted.
pub async fn prune(store: &DynStore, keep: usize) -> Result<Vec<String>> {
    let dirs = directories(store).await?;
    let complete: Vec<&String> = dirs.iter().filter(|d| d.1 .1).map(|d| d.0).collect();
    let Some(newest) = complete.last().copied() else {
        return Ok(vec![]);
    };
    let old = complete.len().saturating_sub(keep.max(1));
    let mut gone: Vec<String> = complete[..old].iter().map(|n| n.to_string()).collect();
    gone.extend(
        dirs.iter()
            .filter(|(n, d)| !d.1 && *n < newest)
            .map(|(n, _)| n.clone()),
    );
    gone.sort();
    for name in &gone {
        delete(store, name).await?;
    }
    Ok(gone)
}

/// Load backup `m` from `store` into `kv`, an empty engine (as [`snapshot::load`]): the
/// dump's header and digest. Each part is read when the decoder reaches it, on `rt`.
pub fn load(
    kv: &dyn KvEngine,
    store: DynStore,
    rt: &tokio::runtime::Handle,
    m: &Manifest,
) -> Result<(DumpHeader, String)> {
    let parts = PartsReader {
        store,
        rt: rt.clone(),
        name: m.name.clone(),
        parts: m.parts.clone(),
        next: 0,
        cur: Bytes::new(),
    };
    let mut decoder =
        zstd::Decoder::new(parts).map_err(|e| Error::io("start decompressing the backup", e))?;
    let (header, digest) = snapshot::load(kv, &mut decoder)?;
    if header.version.0 != m.version {
        return Err(Error::corrupt(format!(
            "backup {} says version {}, its dump holds version {}",
            m.name, m.version, header.version
        )));
    }
    Ok((header, digest))
}

/// The stored parts of a backup, read one after another, each checked against its manifest.
struct PartsReader {
    store: DynStore,
    rt: tokio::runtime::Handle,
    name: String,
    parts: Vec<Part>,
    next: usize,
    cur: Bytes,
}

impl PartsReader {
    fn fetch(&mut self) -> std::io::Result<()> {
        let i = self.next;
        let want = &self.parts[i];
        let k = part_key(&self.name, i);
        let store = self.store.clone();
        let b = self
            .rt
            .block_on(object::retry(&format!("read {k}"), ATTEMPTS, || {
                store.get(&k)
            }))
            .map_err(|e| std::io::Error::other(format!("read {k}: {e}")))?;
        let sha = hex::encode(Sha256::digest(&b));
        if b.len() as u64 != want.bytes || sha != want.sha256 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "part {i} of metadata backup {} is damaged: {} bytes with SHA-256 {sha}, \
                     the manifest says {} bytes with {}",
                    self.name,
                    b.len(),
                    want.bytes,
                    want.sha256
                ),
            ));
        }
        self.cur = b;
        self.next += 1;
        Ok(())
    }
}

impl Read for PartsReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            if self.next == self.parts.len() {
                return Ok(0);
            }
            self.fetch()?;
        }
        let n = out.len().min(self.cur.len());
        out[..n].copy_from_slice(&self.cur[..n]);
        self.cur = self.cur.slice(n..);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::memory::MemoryKv;
    use crate::kv::DynKv;
    use crate::meta::conformance::fresh;
    use crate::meta::{Ctx, Meta, MetaClient, MetaOptions, ROOT_INO};
    use crate::object::memory::MemoryStore;
    use crate::object::{ObjectError, ObjectStore};

    #[test]
    fn names_are_utc_times_that_sort_in_time_order() {
        assert_eq!(name_at(0), "19700101T000000.000Z");
        assert_eq!(name_at(1_796_648_701_123), "20261207T130501.123Z");
        // a leap day, and the day after it
        assert_eq!(name_at(11_016 * 86_400_000), "20000229T000000.000Z");
        assert_eq!(name_at(11_017 * 86_400_000 + 999), "20000301T000000.999Z");
        assert_eq!(name_at(47_541 * 86_400_000), "21000301T000000.000Z");
        let mut names: Vec<String> = [5_000, 86_400_000 * 400, 999, 86_400_000 * 31]
            .iter()
            .map(|ms| name_at(*ms))
            .collect();
        let by_name = {
            let mut n = names.clone();
            n.sort();
            n
        };
        names = [999, 5_000, 86_400_000 * 31, 86_400_000 * 400]
            .iter()
            .map(|ms| name_at(*ms))
            .collect();
        assert_eq!(by_name, names);
    }

    fn memory() -> DynKv {
        Arc::new(MemoryKv::new())
    }

    fn store() -> DynStore {
        Arc::new(MemoryStore::default())
    }

    /// A file system of `files` files in one directory, with an xattr and a symlink.
    fn filled(files: usize) -> (DynKv, Arc<Meta>) {
        let (kv, m) = fresh(&memory);
        let root = Ctx::root();
        let (d, _) = m.mkdir(&root, ROOT_INO, b"dir", 0o755, 0).unwrap();
        for i in 0..files {
            let name = format!("file-{i:06}-named-at-some-length");
            let (f, _) = m.create(&root, d, name.as_bytes(), 0o640, 0).unwrap();
            m.setxattr(&root, f, b"user.i", name.as_bytes(), 0).unwrap();
        }
        m.symlink(&root, d, b"sym", b"file-000000").unwrap();
        (kv, m)
    }

    /// Load backup `m` into a new engine: its header and digest, or the error.
    fn restore(store: &DynStore, m: &Manifest) -> Result<(DynKv, DumpHeader, String)> {
        let rt = tokio::runtime::Handle::current();
        let (s, m) = (store.clone(), m.clone());
        std::thread::spawn(move || {
            let kv = memory();
            load(kv.as_ref(), s, &rt, &m).map(|(h, d)| (kv, h, d))
        })
        .join()
        .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_backup_in_parts_loads_back_to_the_same_metadata() {
        // a file system big enough for several parts of 4 KiB
        let (kv, m) = filled(2_000);
        let s = store();
        let b = take_in_parts(kv.clone(), s.clone(), 1_796_648_701_123, 4096)
            .await
            .unwrap();
        assert_eq!(b.name, "20261207T130501.123Z");
        assert_eq!(b.fs_name, "test");
        assert_eq!(b.version, kv.last_version().unwrap().0);
        assert!(b.parts.len() > 3, "{} parts", b.parts.len());
        assert!(b.parts[..b.parts.len() - 1].iter().all(|p| p.bytes == 4096));
        assert!(b.stored_bytes() * 3 < b.dump_bytes, "compressed: {b:?}");
        assert_eq!(list(&s).await.unwrap(), vec![b.clone()]);

        // the primary goes on; the backup is the metadata at its version
        let root = Ctx::root();
        m.mkdir(&root, ROOT_INO, b"later", 0o755, 0).unwrap();
        let (replica, header, digest) = restore(&s, &b).unwrap();
        assert_eq!(header.version.0, b.version);
        assert_eq!(replica.last_version().unwrap().0, b.version);
        assert_ne!(digest, Meta::digest(&kv).unwrap());
        let back = Meta::open(replica.clone(), MetaOptions::default()).unwrap();
        let (d, _) = back.lookup(&root, ROOT_INO, b"dir").unwrap();
        back.lookup(&root, d, b"file-001999-named-at-some-length")
            .unwrap();
        assert!(back.lookup(&root, ROOT_INO, b"later").is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_damaged_or_unfinished_backup_is_never_loaded() {
        let (kv, _m) = filled(500);
        let s = store();
        let b = take_in_parts(kv.clone(), s.clone(), 1_000, 2048)
            .await
            .unwrap();

        // one part changed: refused, naming the part, and the engine holds no version
        let k = part_key(&b.name, 1);
        let mut bytes = s.get(&k).await.unwrap().to_vec();
        bytes[100] ^= 1;
        s.put(&k, Bytes::from(bytes)).await.unwrap();
        let e = restore(&s, &b).err().expect("a damaged part is refused");
        assert!(e.to_string().contains("part 1 of metadata backup"), "{e}");

        // a backup without its manifest (its writer died) is not listed, and the next
        // prune removes it once a newer backup is complete
        s.put(
            &part_key("19700101T000000.500Z", 0),
            Bytes::from_static(b"x"),
        )
        .await
        .unwrap();
        assert_eq!(list(&s).await.unwrap().len(), 1);
        let e = find(&s, Some("19700101T000000.500Z")).await.unwrap_err();
        assert!(
            e.to_string().contains("no complete metadata backup named"),
            "{e}"
        );
        assert_eq!(prune(&s, 5).await.unwrap(), vec!["19700101T000000.500Z"]);
        let left = s.list(PREFIX, None, LIST_LIMIT_MAX).await.unwrap();
        assert!(left.iter().all(|o| o.key.contains(&b.name)), "{left:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn prune_keeps_the_newest_and_never_the_last() {
        let (kv, _m) = filled(10);
        let s = store();
        let mut names = vec![];
        for ms in [1_000, 2_000, 3_000, 4_000] {
            names.push(take(kv.clone(), s.clone(), ms).await.unwrap().name);
        }
        assert_eq!(prune(&s, 2).await.unwrap(), names[..2].to_vec());
        let left: Vec<String> = list(&s)
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.name)
            .collect();
        assert_eq!(left, names[2..].to_vec());
        assert_eq!(find(&s, None).await.unwrap().name, names[3]);
        // keep 0 still keeps the newest
        assert_eq!(prune(&s, 0).await.unwrap(), vec![names[2].clone()]);
        assert_eq!(list(&s).await.unwrap().len(), 1);
        // nothing in the store but backups was touched
        let e = find(&store(), None).await.unwrap_err();
        assert!(e.to_string().contains("no metadata backup in"), "{e}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_upload_leaves_no_backup_behind() {
        // a store that refuses every put after the second
        let (kv, _m) = filled(500);
        let s: DynStore = Arc::new(FailingPuts {
            inner: MemoryStore::default(),
            puts_left: std::sync::atomic::AtomicUsize::new(2),
        });
        let e = take_in_parts(kv, s.clone(), 1_000, 2048).await.unwrap_err();
        assert!(e.to_string().contains("refused"), "{e}");
        assert!(list(&s).await.unwrap().is_empty());
        let left = s.list(PREFIX, None, LIST_LIMIT_MAX).await.unwrap();
        assert!(left.is_empty(), "{left:?}");
    }

    /// A memory store whose puts fail for good after `puts_left`.
    struct FailingPuts {
        inner: MemoryStore,
        puts_left: std::sync::atomic::AtomicUsize,
    }

    impl ObjectStore for FailingPuts {
        fn describe(&self) -> String {
            "failing://".into()
        }
        fn put<'a>(&'a self, key: &'a str, data: Bytes) -> object::BoxFut<'a, ()> {
            use std::sync::atomic::Ordering;
            let left = self.puts_left.fetch_sub(1, Ordering::Relaxed);
            if left == 0 || left > usize::MAX / 2 {
                return Box::pin(async { Err(ObjectError::Fatal("put refused".into())) });
            }
            self.inner.put(key, data)
        }
        fn get<'a>(&'a self, key: &'a str) -> object::BoxFut<'a, Bytes> {
            self.inner.get(key)
        }
        fn head<'a>(&'a self, key: &'a str) -> object::BoxFut<'a, Option<u64>> {
            self.inner.head(key)
        }
        fn delete<'a>(&'a self, key: &'a str) -> object::BoxFut<'a, ()> {
            self.inner.delete(key)
        }
        fn list<'a>(
            &'a self,
            prefix: &'a str,
            start_after: Option<&'a str>,
            limit: usize,
        ) -> object::BoxFut<'a, Vec<object::ObjectInfo>> {
            self.inner.list(prefix, start_after, limit)
        }
    }
}
