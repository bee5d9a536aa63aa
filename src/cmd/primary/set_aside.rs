//! `strait primary set-aside`: a primary whose history diverged from the replicator's log
//! takes no change until an operator decides (docs/operations.md, "A primary whose history
//! diverged"). This command is that decision: it lists the changes only the primary holds in
//! a file, loads the file system's metadata from a mirror (which follows the replicator's
//! log) into a new engine, and swaps it in, keeping the old engine's directory beside it.
//! Started again, the primary catches up from the log and takes changes.
//!
//! Nothing is changed before the list is on disk, and nothing is swapped before the new
//! engine is loaded, verified (the snapshot's digest) and known to be continued by the log.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use strait_fs_core::url::MetaUrl;
use strait_fs_core::Version;
use strait_ship::history::{self as core, Divergence};

use super::SetAsideArgs;

/// What the command is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A diverged primary that goes on as the primary.
    SetAside,
    /// An old primary that becomes a mirror of the new one (`strait primary rejoin`).
    Rejoin,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::SetAside => "set-aside",
            Mode::Rejoin => "rejoin",
        }
    }
}

pub fn run(a: SetAsideArgs, mode: Mode) -> Result<()> {
    let dir = match MetaUrl::parse(&a.meta_url)? {
        MetaUrl::RocksDb(p) => p,
        _ => bail!(
            "{} swaps RocksDB directories: it takes rocksdb:// engines only, not {}",
            mode.name(),
            a.meta_url
        ),
    };
    if !dir.join("CURRENT").is_file() {
        bail!("no RocksDB engine at {}", dir.display());
    }
    if a.out.exists() {
        bail!("{} exists: name a new file with --out", a.out.display());
    }
    super::super::runtime()?.block_on(set_aside(&a, &dir, mode))
}

/// `DIR.NAME` beside the directory `dir`.
fn beside(dir: &Path, name: &str) -> Result<PathBuf> {
    let base = dir
        .file_name()
        .ok_or_else(|| anyhow!("{} names no directory", dir.display()))?;
    Ok(dir.with_file_name(format!("{}.{name}", base.to_string_lossy())))
}

/// What set-aside presents to the replicator: `--replicator-token`, over TLS when `--tls-ca`
/// is given.
fn replicator_credentials(a: &SetAsideArgs) -> Result<strait_replicator_client::Credentials> {
    let tls = a.client.credentials()?.tls().cloned();
    strait_replicator_client::Credentials::new(Some(&a.replicator_token), tls)
        .context("--replicator-token")
}

async fn set_aside(a: &SetAsideArgs, dir: &Path, mode: Mode) -> Result<()> {
    let kv = strait_fs_core::kv::open(&a.meta_url).with_context(|| {
        format!(
            "open {} ({} needs the primary stopped: is it still running?)",
            a.meta_url,
            mode.name()
        )
    })?;
    let local = kv.last_version()?;
    let creds = replicator_credentials(a)?;
    let leader = core::leader(&a.replicator, &creds)
        .await
        .map_err(|e| anyhow!(e))?;
    eprintln!(
        "comparing this primary's change log (version {local}) with the replicator's \
         (leader {}, versions {} to {})",
        leader.addr, leader.earliest, leader.last
    );
    let mut divergence = core::compare(&kv, local, &leader, &creds)
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
            if strait_mirror::promote::forget(&kv)? {
                eprintln!(
                    "this engine was a promoted mirror's: its promotion is forgotten, so \
                     `strait mirror` on it follows the log"
                );
            }
            kv.sync()?;
            println!(
                "nothing set aside (the list in {} is empty): the replicator's log continues \
                 this engine's history at version {}; its outbox ({trimmed} records) is \
                 emptied. Start `strait mirror --meta-url {} --primary NEW_PRIMARY ...` on it: \
                 it follows from version {}",
                a.out.display(),
                local.next(),
                a.meta_url,
                local.next()
            );
            return Ok(());
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
    eprintln!("{} changes set aside in {}", lost.len(), a.out.display());

    // the mirror's snapshot, into a new engine beside the old one
    let loading = beside(dir, "loading")?;
    let loaded = match load_beside(a, &loading, floor, &lost).await {
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
    let next = match mode {
        Mode::SetAside => "start the primary: it catches up from the replicator".to_string(),
        Mode::Rejoin => format!(
            "start `strait mirror --meta-url {} --primary NEW_PRIMARY ...` on it: it follows \
             the replicator",
            a.meta_url
        ),
    };
    println!(
        "set aside {} changes in {}; the metadata is now that of {} at version {} (the \
         old engine is kept in {}); {next} (version {})",
        lost.len(),
        a.out.display(),
        a.from_mirror,
        loaded.0,
        kept.display(),
        loaded.1
    );
    Ok(())
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
    a: &SetAsideArgs,
    loading: &Path,
    floor: (i64, i64),
    lost: &[(Version, strait_fs_core::changelog::ChangeRecord)],
) -> Result<(Version, Version)> {
    if loading.exists() {
        std::fs::remove_dir_all(loading)
            .with_context(|| format!("remove {} (an earlier attempt's)", loading.display()))?;
    }
    let new_kv = strait_fs_core::kv::open(&format!("rocksdb://{}", loading.display()))?;
    eprintln!("loading the metadata from the mirror at {}", a.from_mirror);
    let source = strait_mirror::follower::Primary::new(&a.from_mirror, &a.client.credentials()?)?;
    let loaded = strait_mirror::follower::bootstrap(&new_kv, &source, None)
        .await
        .with_context(|| format!("load the snapshot of the mirror at {}", a.from_mirror))?;
    let creds = replicator_credentials(a)?;
    let now = core::leader(&a.replicator, &creds)
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
    a: &SetAsideArgs,
    mode: Mode,
    local: Version,
    leader: &core::Leader,
    why: &str,
    lost: &[(Version, strait_fs_core::changelog::ChangeRecord)],
) -> Result<()> {
    let tmp = a.out.with_extension("partial");
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
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
        text.push_str(&crate::cmd::changelog::line(*v, rec));
        text.push('\n');
    }
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, &a.out)
        .with_context(|| format!("move {} to {}", tmp.display(), a.out.display()))?;
    Ok(())
}
