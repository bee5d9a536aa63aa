//! `strait primary set-aside`: a primary whose history diverged from the replicator's log
//! takes no change until an operator decides (docs/operations.md, "A primary whose history
//! diverged"). This command is that decision: it lists the changes only the primary holds in
//! a file, loads the file system's metadata from a mirror (which follows the replicator's
//! log) into a new engine, and swaps it in, keeping the old engine's directory beside it.
//! Started again, the primary catches up from the log and takes changes.
//!
//! Nothing is changed before the list is on disk, and nothing is swapped before the new
//! engine is loaded, verified (the snapshot's digest) and known to be continued by the log.

use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use anyhow::{anyhow, bail, Context, Result};
use strait_fs_core::kv::DynKv;
use strait_fs_core::url::MetaUrl;
use strait_fs_core::Version;
use strait_replicator_client::Credentials;

use crate::history::{self as core, Divergence};

/// What the command is for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// A diverged primary that goes on as the primary.
    SetAside,
    /// An old primary that becomes a mirror of the new one (`strait primary rejoin`).
    Rejoin,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::SetAside => "set-aside",
            Mode::Rejoin => "rejoin",
        }
    }
}

/// Loads a mirror's metadata snapshot into the (empty) engine it is given; returns the
/// version loaded. The caller's: the snapshot is read from a site daemon with the mirror's
/// own client (`strait_mirror::follower::bootstrap`), which this crate does not depend on.
pub type Loader =
    Box<dyn FnOnce(DynKv) -> Pin<Box<dyn Future<Output = Result<Version>> + Send>> + Send>;

/// One set-aside or rejoin.
pub struct Request {
    pub mode: Mode,
    /// The primary's engine (`rocksdb:///path`; the primary stopped).
    pub meta_url: String,
    /// The replicator's nodes, and what to present to them.
    pub replicator: Vec<String>,
    pub replicator_creds: Credentials,
    /// The mirror whose snapshot is loaded (its address, for the messages).
    pub from_mirror: String,
    /// Where the list of the changes set aside goes (must not exist).
    pub out: PathBuf,
}

/// What was done.
#[derive(Debug)]
pub enum Outcome {
    /// Rejoin only: the replicator's log continues this engine's history, which stays; its
    /// outbox is emptied (`trimmed` records) and a mirror follows from `local`'s next.
    Continued {
        local: Version,
        trimmed: u64,
        /// The engine was a promoted mirror's, and its promotion is forgotten.
        forgot_promotion: bool,
    },
    /// `set_aside` changes were listed, the mirror's metadata (at `loaded`) replaced the
    /// engine, whose old directory is kept at `kept`; the replicator's log was at
    /// `replicator_last`.
    Swapped {
        set_aside: usize,
        loaded: Version,
        replicator_last: Version,
        kept: PathBuf,
    },
}

/// Check what can be checked before anything is opened: a RocksDB engine, a new `--out`.
/// Returns the engine's directory.
pub fn check(r: &Request) -> Result<PathBuf> {
    let dir = match MetaUrl::parse(&r.meta_url)? {
        MetaUrl::RocksDb(p) => p,
        _ => bail!(
            "{} swaps RocksDB directories: it takes rocksdb:// engines only, not {}",
            r.mode.name(),
            r.meta_url
        ),
    };
    if !dir.join("CURRENT").is_file() {
        bail!("no RocksDB engine at {}", dir.display());
    }
    if r.out.exists() {
        bail!("{} exists: name a new file with --out", r.out.display());
    }
    Ok(dir)
}

/// `DIR.NAME` beside the directory `dir`.
fn beside(dir: &Path, name: &str) -> Result<PathBuf> {
    let base = dir
        .file_name()
        .ok_or_else(|| anyhow!("{} names no directory", dir.display()))?;
    Ok(dir.with_file_name(format!("{}.{name}", base.to_string_lossy())))
}

/// Set aside (or rejoin) as `r` says, with the primary stopped; `progress` is told each step.
/// Nothing is changed before the list is on disk, and nothing is swapped before the new
/// engine is loaded and known to be continued by the log.
pub async fn run(r: &Request, load: Loader, progress: &mut dyn FnMut(&str)) -> Result<Outcome> {
    let dir = check(r)?;
    let (a, mode, dir) = (r, r.mode, dir.as_path());
    let kv = strait_fs_core::kv::open(&a.meta_url).with_context(|| {
        format!(
            "open {} ({} needs the primary stopped: is it still running?)",
            a.meta_url,
            mode.name()
        )
    })?;
    let local = kv.last_version()?;
    let creds = &a.replicator_creds;
    let leader = core::leader(&a.replicator, creds)
        .await
        .map_err(|e| anyhow!(e))?;
    progress(&format!(
        "comparing this primary's change log (version {local}) with the replicator's \
         (leader {}, versions {} to {})",
        leader.addr, leader.earliest, leader.last
    ));
    let mut divergence = core::compare(&kv, local, &leader, creds)
        .await
        .map_err(|e| anyhow!(e))?;
    if mode == Mode::Rejoin && local > leader.last {
        if let Divergence::None { .. } = divergence {
            // versions past the log's end were never shipped: only here, as the new primary
            // writes its own under the same numbers
            divergence = Divergence::Differs {
                first: leader.last.next(),
                seen: leader.last.next(),
            };
        }
    }
    let (first, why) = match divergence {
        Divergence::None { compared } if mode == Mode::Rejoin => {
            // the log continues this history: the engine stays, as a mirror's
            let why = format!(
                "this primary's history is the start of the replicator's ({compared} records \
                 compared; this primary at version {local}, the replicator at {}): no change is \
                 only here",
                leader.last
            );
            write_list(a, mode, local, &leader, &why, &[])?;
            let k = kv.clone();
            let trimmed = tokio::task::spawn_blocking(move || empty_outbox(&k, local))
                .await
                .context("a task failed")??;
            // a promoted mirror's engine (the way back after a switchover) follows again
            let forgot_promotion = crate::promotion::forget(&kv)?;
            kv.sync()?;
            return Ok(Outcome::Continued {
                local,
                trimmed,
                forgot_promotion,
            });
        }
        Divergence::None { compared } => bail!(
            "this primary's history and the replicator's agree ({compared} records compared; \
             this primary at version {local}, the replicator at {}): nothing to set aside. \
             Start the primary: it catches up or ships by itself",
            leader.last
        ),
        Divergence::Differs { first, seen } if first < seen => (
            first,
            format!(
                "version {seen} of this primary differs from the replicator's, whose log no \
                 longer holds versions {first} to {} to compare: the changes below, from version \
                 {first} on, are only in this primary's history, or were in both",
                Version(seen.0 - 1)
            ),
        ),
        Divergence::Differs { first, .. } => (
            first,
            format!(
                "version {first} of this primary differs from the replicator's: the changes \
                 below, from version {first} on, are only in this primary's history"
            ),
        ),
        Divergence::Purged { earliest } => (
            Version(1),
            format!(
                "the replicator no longer holds versions {} to {}, which this primary lacks: \
                 the changes below are the ones its change log still held, which could not be \
                 compared with the replicator's; those the replicator did not have are lost",
                local.next(),
                Version(earliest.0 - 1)
            ),
        ),
    };
    let k = kv.clone();
    let lost = tokio::task::spawn_blocking(move || core::records_from(&k, first))
        .await
        .context("a task failed")?
        .map_err(|e| anyhow!(e))?;
    let floor = core::counters(&kv).map_err(|e| anyhow!(e))?;
    write_list(a, mode, local, &leader, &why, &lost)?;
    progress(&format!(
        "{} changes set aside in {}",
        lost.len(),
        a.out.display()
    ));

    // the mirror's snapshot, into a new engine beside the old one
    let loading = beside(dir, "loading")?;
    let loaded = match load_beside(a, &loading, floor, &lost, load, progress).await {
        Ok(v) => v,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&loading);
            return Err(e.context(format!(
                "the metadata is unchanged (the list in {} stays; run the command again with \
                 another --out)",
                a.out.display()
            )));
        }
    };
    drop(kv);

    let kept = beside(
        dir,
        &format!("set-aside-{}", strait_fs_core::clock::now_s()),
    )?;
    std::fs::rename(dir, &kept)
        .with_context(|| format!("move {} to {}", dir.display(), kept.display()))?;
    std::fs::rename(&loading, dir)
        .with_context(|| format!("move {} to {}", loading.display(), dir.display()))?;
    if let Some(parent) = dir.parent() {
        std::fs::File::open(parent)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("sync {}", parent.display()))?;
    }
    Ok(Outcome::Swapped {
        set_aside: lost.len(),
        loaded: loaded.0,
        replicator_last: loaded.1,
        kept,
    })
}

/// Delete every record of the outbox of `kv` (whose log ends at `local`): a mirror keeps no
/// change log of its own. Returns how many were deleted.
fn empty_outbox(kv: &strait_fs_core::kv::DynKv, local: Version) -> Result<u64> {
    const BATCH: usize = 4096;
    let mut n = 0u64;
    loop {
        let d = strait_fs_core::changelog::trim_log(kv.as_ref(), Version::ZERO, local, BATCH)?;
        n += d as u64;
        if d < BATCH {
            return Ok(n);
        }
    }
}

/// Load the mirror's snapshot into a new engine at `loading`, check that the replicator's
/// log continues it, and keep the ids in use unused. Returns the version loaded and the
/// replicator's last.
async fn load_beside(
    a: &Request,
    loading: &Path,
    floor: (i64, i64),
    lost: &[(Version, strait_fs_core::changelog::ChangeRecord)],
    load: Loader,
    progress: &mut dyn FnMut(&str),
) -> Result<(Version, Version)> {
    if loading.exists() {
        std::fs::remove_dir_all(loading)
            .with_context(|| format!("remove {} (an earlier attempt's)", loading.display()))?;
    }
    let new_kv = strait_fs_core::kv::open(&format!("rocksdb://{}", loading.display()))?;
    progress(&format!(
        "loading the metadata from the mirror at {}",
        a.from_mirror
    ));
    let loaded = load(new_kv.clone())
        .await
        .with_context(|| format!("load the snapshot of the mirror at {}", a.from_mirror))?;
    let now = core::leader(&a.replicator, &a.replicator_creds)
        .await
        .map_err(|e| anyhow!(e))?;
    if now.earliest > loaded.next() {
        bail!(
            "the mirror's snapshot is at version {loaded}, but the replicator's log starts at {}: \
             the primary could not catch up from it (is the mirror bootstrapping again?)",
            now.earliest
        );
    }
    core::keep_ids_unused(&new_kv, floor, lost).map_err(|e| anyhow!(e))?;
    // the old engine's locks are not in the snapshot: the daemon started on the new one
    // lets the mounts that held them take them back first
    strait_fs_core::meta::mark_locks_lost(new_kv.as_ref())?;
    new_kv.sync()?;
    Ok((loaded, now.last))
}

/// The list of the changes set aside, written whole and synced before anything changes.
fn write_list(
    a: &Request,
    mode: Mode,
    local: Version,
    leader: &core::Leader,
    why: &str,
    lost: &[(Version, strait_fs_core::changelog::ChangeRecord)],
) -> Result<()> {
    let tmp = a.out.with_extension("partial");
    let mut f = strait_ids::private::create_private(&tmp)
        .with_context(|| format!("create {}", tmp.display()))?;
    let mut text = format!(
        "# strait primary {} of {} at {} s since 1970\n\
         # this primary's change log ended at version {local}; the replicator's leader ({}) held \
         versions {} to {}\n\
         # {why}\n\
         # {} changes; one per line: version, commit time (s since 1970), the change \
         (as `strait changelog` prints it)\n",
        mode.name(),
        a.meta_url,
        strait_fs_core::clock::now_s(),
        leader.addr,
        leader.earliest,
        leader.last,
        lost.len()
    );
    for (v, rec) in lost {
        text.push_str(&strait_fs_core::changelog::line(*v, rec));
        text.push('\n');
    }
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, &a.out)
        .with_context(|| format!("move {} to {}", tmp.display(), a.out.display()))?;
    Ok(())
}
