//! `strait warmup`: the blocks of the files under some paths, copied into this region's store
//! now, ahead of the copy queue (a training job about to read a dataset at a lazy mirror warms
//! it first). The paths are resolved and walked in this mirror's own metadata; each block
//! already here (marked, or present with its checksum) is counted and left, the others are
//! read from the primary's store, checked, written here and marked, [`WARMUP_CONCURRENCY`] at a
//! time. The queue's own copy of a block finds it marked and skips it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use strait_fs_core::changelog::decode;
use strait_fs_core::kv::{self, KvTxn};
use strait_fs_core::layout::{block_count, block_key, block_len};
use strait_fs_core::meta::{keys, Attr, FileKind, Ino, SliceRef, ROOT_INO};
use strait_fs_core::object::ObjectError;
use strait_fs_core::SliceId;
use tokio::task::JoinSet;

use super::{corrupt, Blocks};

/// Blocks copied at once by a warm-up (beside the queue's and the readers').
pub const WARMUP_CONCURRENCY: usize = 8;
/// The most blocks one warm-up takes (64 TiB of 4 MiB blocks): warm a larger tree in parts.
pub const WARMUP_BLOCKS_MAX: usize = 16 << 20;
/// Entries read per page while walking the tree.
const WALK_PAGE: usize = 1000;

/// One block of a file: its slice, index, length and checksum.
#[derive(Clone, Copy, Debug)]
pub struct WarmBlock {
    pub id: SliceId,
    pub index: u32,
    pub len: u32,
    pub crc: u32,
}

/// A warm-up's figures (the wire's `WarmupProgress`).
#[derive(Clone, Debug, Default)]
pub struct Warmup {
    pub paths: Vec<String>,
    pub started_ms: u64,
    pub files: u64,
    pub blocks: u64,
    pub bytes: u64,
    pub present_blocks: u64,
    pub present_bytes: u64,
    pub copied_blocks: u64,
    pub copied_bytes: u64,
    pub failed_blocks: u64,
    pub last_error: String,
    pub elapsed_ms: u64,
    pub done: bool,
}

impl Warmup {
    /// The figures as the wire carries them.
    pub fn wire(&self) -> strait_proto::site::WarmupProgress {
        let w = self;
        strait_proto::site::WarmupProgress {
            files: w.files,
            blocks: w.blocks,
            bytes: w.bytes,
            present_blocks: w.present_blocks,
            present_bytes: w.present_bytes,
            copied_blocks: w.copied_blocks,
            copied_bytes: w.copied_bytes,
            failed_blocks: w.failed_blocks,
            last_error: w.last_error.clone(),
            elapsed_ms: w.elapsed_ms,
            done: w.done,
            started_ms: w.started_ms,
            paths: w.paths.clone(),
        }
    }
}

/// Why a warm-up could not start.
#[derive(Debug)]
pub enum WarmupError {
    /// A path that is not in the file system.
    NotFound(String),
    /// A path that is not absolute, or a tree too large for one warm-up.
    Invalid(String),
    Failed(String),
}

impl From<strait_fs_core::Error> for WarmupError {
    fn from(e: strait_fs_core::Error) -> Self {
        WarmupError::Failed(e.to_string())
    }
}

/// The inode at `path` (absolute, `/` separated; empty components ignored).
fn resolve(t: &mut dyn KvTxn, path: &str) -> Result<Ino, WarmupError> {
    if !path.starts_with('/') {
        return Err(WarmupError::Invalid(format!(
            "{path:?} is not a path from the file system's root (it starts with /)"
        )));
    }
    let mut ino = ROOT_INO;
    for name in path.split('/').filter(|c| !c.is_empty()) {
        let Some(v) = t.get(&keys::dentry(ino, name.as_bytes()))? else {
            return Err(WarmupError::NotFound(format!(
                "{path}: no such file or directory in the file system (at this mirror's version)"
            )));
        };
        ino = keys::u64_at(&v, 0).ok_or_else(|| corrupt(format!("the entry of {path}")))?;
    }
    Ok(ino)
}

/// The regular files under `inos` (each a file or a directory) and their blocks.
fn walk(
    t: &mut dyn KvTxn,
    inos: Vec<Ino>,
    block_size: u32,
) -> Result<(u64, Vec<WarmBlock>), WarmupError> {
    let mut seen: HashSet<Ino> = HashSet::new();
    let mut todo = inos;
    let (mut files, mut blocks) = (0u64, vec![]);
    while let Some(ino) = todo.pop() {
        if !seen.insert(ino) {
            continue; // a hard link, or a path given twice
        }
        let Some(a) = t.get(&keys::attr(ino))? else {
            continue; // removed meanwhile
        };
        let attr: Attr = decode(&a)?;
        match attr.kind {
            FileKind::Dir => {
                let prefix = keys::group(keys::DENTRY, ino);
                let mut after: Option<Vec<u8>> = None;
                loop {
                    let page = t.scan(&prefix, after.as_deref(), WALK_PAGE)?;
                    for (_, v) in &page {
                        let child =
                            keys::u64_at(v, 0).ok_or_else(|| corrupt("a dentry value".into()))?;
                        todo.push(child);
                    }
                    if page.len() < WALK_PAGE {
                        break;
                    }
                    after = page.last().map(|p| p.0.clone());
                }
            }
            FileKind::File => {
                files += 1;
                let prefix = keys::group(keys::CHUNK, ino);
                let mut after: Option<Vec<u8>> = None;
                loop {
                    let page = t.scan(&prefix, after.as_deref(), WALK_PAGE)?;
                    for (_, v) in &page {
                        let list: Vec<SliceRef> = decode(v)?;
                        for s in list.iter().filter(|s| !s.id.is_hole()) {
                            for index in 0..block_count(s.size, block_size) {
                                let Some(crc) = s.crcs.get(index as usize) else {
                                    continue;
                                };
                                blocks.push(WarmBlock {
                                    id: s.id,
                                    index,
                                    len: block_len(s.size, block_size, index),
                                    crc: *crc,
                                });
                            }
                        }
                    }
                    if blocks.len() > WARMUP_BLOCKS_MAX {
                        return Err(WarmupError::Invalid(format!(
                            "the paths hold more than {WARMUP_BLOCKS_MAX} blocks: warm them up in parts"
                        )));
                    }
                    if page.len() < WALK_PAGE {
                        break;
                    }
                    after = page.last().map(|p| p.0.clone());
                }
            }
            _ => {}
        }
    }
    // a block that two slices or files share is copied once
    let mut once = HashSet::new();
    blocks.retain(|b| once.insert((b.id, b.index)));
    Ok((files, blocks))
}

impl Blocks {
    /// The regular files under `paths` in this mirror's metadata, and their blocks. Blocking.
    pub fn warmup_list(&self, paths: &[String]) -> Result<(u64, Vec<WarmBlock>), WarmupError> {
        if self.local.is_none() {
            return Err(WarmupError::Invalid(
                "this mirror has no object store of its own (data_url is empty): its mounts read the primary's".into(),
            ));
        }
        if paths.is_empty() {
            return Err(WarmupError::Invalid("no path to warm up".into()));
        }
        let found = kv::read(self.kv.as_ref(), |t| {
            let bs = self.block_size_in(t)?;
            let mut inos = vec![];
            for p in paths {
                match resolve(t, p) {
                    Ok(i) => inos.push(i),
                    Err(e) => return Ok(Err(e)),
                }
            }
            match walk(t, inos, bs) {
                Ok(r) => Ok(Ok(r)),
                Err(WarmupError::Failed(e)) => Err(corrupt(e)),
                Err(e) => Ok(Err(e)),
            }
        })?;
        found
    }

    /// The last warm-up's figures, running or done.
    pub fn last_warmup(&self) -> Option<Warmup> {
        self.warmup.lock().as_ref().map(|w| w.lock().clone())
    }

    /// Start warming up `blocks` (of `files` files under `paths`) in the background, unless
    /// another warm-up runs (then its figures are the error). Returns the new one's figures,
    /// which it keeps up to date.
    pub fn start_warmup(
        self: &Arc<Self>,
        paths: Vec<String>,
        files: u64,
        blocks: Vec<WarmBlock>,
        started_ms: u64,
    ) -> Result<Arc<Mutex<Warmup>>, Box<Warmup>> {
        let mut last = self.warmup.lock();
        if let Some(w) = last.as_ref() {
            let w = w.lock();
            if !w.done {
                return Err(Box::new(w.clone()));
            }
        }
        let state = Arc::new(Mutex::new(Warmup {
            paths,
            started_ms,
            files,
            blocks: blocks.len() as u64,
            bytes: blocks.iter().map(|b| b.len as u64).sum(),
            ..Warmup::default()
        }));
        *last = Some(state.clone());
        tokio::spawn(self.clone().warm(blocks, state.clone()));
        Ok(state)
    }

    /// Copy one block here unless it is here already: true when it was.
    async fn warm_one(&self, b: WarmBlock) -> Result<bool, String> {
        let local = self.local.as_ref().ok_or("no store of this region")?;
        let key = block_key(b.id, b.index, b.len);
        if self
            .here_already(local, &key, b.id, b.index, b.len, b.crc)
            .await
        {
            return Ok(true);
        }
        let data = match self.fetch_primary(&key, b.len, b.crc).await {
            Ok(d) => d,
            Err(ObjectError::NotFound(e)) => {
                return Err(format!("block {key} is not in the primary's store: {e}"))
            }
            Err(e) => return Err(format!("read block {key} from the primary's store: {e}")),
        };
        self.keep(local, data, b.id, b.index, b.len, true).await?;
        Ok(false)
    }

    /// Copy `blocks` here, [`WARMUP_CONCURRENCY`] at a time, keeping the figures in `state`
    /// (done at the end).
    pub async fn warm(self: Arc<Self>, blocks: Vec<WarmBlock>, state: Arc<Mutex<Warmup>>) {
        let start = Instant::now();
        let mut running = JoinSet::new();
        let mut next = blocks.into_iter();
        loop {
            while running.len() < WARMUP_CONCURRENCY {
                let Some(b) = next.next() else { break };
                let me = self.clone();
                running.spawn(async move { (b, me.warm_one(b).await) });
            }
            let Some(r) = running.join_next().await else {
                break;
            };
            let mut s = state.lock();
            match r {
                Ok((b, Ok(true))) => {
                    s.present_blocks += 1;
                    s.present_bytes += b.len as u64;
                }
                Ok((b, Ok(false))) => {
                    s.copied_blocks += 1;
                    s.copied_bytes += b.len as u64;
                }
                Ok((_, Err(e))) => {
                    s.failed_blocks += 1;
                    s.last_error = e;
                }
                Err(e) => {
                    s.failed_blocks += 1;
                    s.last_error = format!("a warm-up task failed: {e}");
                }
            }
            s.elapsed_ms = start.elapsed().as_millis() as u64;
        }
        let mut s = state.lock();
        s.elapsed_ms = start.elapsed().as_millis() as u64;
        s.done = true;
        if s.failed_blocks > 0 {
            self.error(format!(
                "warm-up of {}: {} blocks not copied; the last error: {}",
                s.paths.join(" "),
                s.failed_blocks,
                s.last_error
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strait_fs_core::kv::{memory::MemoryKv, KvEngine};

    #[test]
    fn a_path_resolves_from_the_root_and_a_missing_one_is_not_found() {
        let kv = MemoryKv::new();
        kv::txn(&kv as &dyn KvEngine, |t| {
            t.put(&keys::dentry(ROOT_INO, b"data"), &7u64.to_be_bytes());
            Ok(())
        })
        .unwrap();
        kv::read(&kv as &dyn KvEngine, |t| {
            assert_eq!(resolve(t, "/data").unwrap(), 7);
            assert_eq!(resolve(t, "//data/").unwrap(), 7);
            assert_eq!(resolve(t, "/").unwrap(), ROOT_INO);
            assert!(matches!(resolve(t, "/nope"), Err(WarmupError::NotFound(_))));
            assert!(matches!(resolve(t, "data"), Err(WarmupError::Invalid(_))));
            Ok(())
        })
        .unwrap();
    }
}
