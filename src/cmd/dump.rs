//! `strait dump` and `strait load`: a consistent snapshot of a file system's metadata to a
//! file, and back into an empty engine (as JuiceFS's dump and load).

use std::io::{BufReader, BufWriter};
use std::path::PathBuf;

use anyhow::{Context, Result};

#[derive(clap::Args)]
pub struct DumpArgs {
    /// Metadata engine: rocksdb:///path, redis://host:port/db
    pub meta_url: String,
    /// The file to write ("-" for standard output).
    pub file: PathBuf,
}

#[derive(clap::Args)]
pub struct LoadArgs {
    /// An empty metadata engine to load into: rocksdb:///path, redis://host:port/db
    pub meta_url: String,
    /// The dump to read ("-" for standard input); none with --store.
    #[arg(required_unless_present = "store", conflicts_with = "store")]
    pub file: Option<PathBuf>,
    /// Restore a metadata backup from this object store (the file system's data URL) instead
    /// of a file: the newest, or the one --backup names.
    #[arg(long)]
    pub store: Option<String>,
    /// With --store: the backup to restore (as `strait backup list` names it).
    #[arg(long, requires = "store")]
    pub backup: Option<String>,
}

pub fn dump(a: DumpArgs) -> Result<()> {
    let kv = strait_fs_core::kv::open_read_only(&a.meta_url)?;
    let (header, pairs) = if a.file.as_os_str() == "-" {
        let mut w = BufWriter::new(std::io::stdout().lock());
        strait_fs_core::snapshot::dump(kv.as_ref(), &mut w)?
    } else {
        let tmp = a.file.with_extension("partial");
        let f = strait_ids::private::create_private(&tmp)
            .with_context(|| format!("create {}", tmp.display()))?;
        let mut w = BufWriter::new(f);
        let r = strait_fs_core::snapshot::dump(kv.as_ref(), &mut w)?;
        let f = w.into_inner().context("flush the dump")?;
        f.sync_all().context("sync the dump")?;
        std::fs::rename(&tmp, &a.file)
            .with_context(|| format!("rename {} to {}", tmp.display(), a.file.display()))?;
        r
    };
    eprintln!(
        "dumped {} at version {}: {pairs} pairs",
        header.name, header.version
    );
    Ok(())
}

pub fn load(a: LoadArgs) -> Result<()> {
    let (header, digest) = match (&a.file, &a.store) {
        (_, Some(url)) => {
            // the backup is found before the engine is opened: a wrong name makes no engine
            let rt = super::runtime()?;
            let (store, m) = rt.block_on(async {
                let s = super::backup::open_existing(url).await?;
                let m = strait_fs_core::backup::find(&s, a.backup.as_deref()).await?;
                Ok::<_, anyhow::Error>((s, m))
            })?;
            let kv = strait_fs_core::kv::open(&a.meta_url)?;
            eprintln!(
                "restoring metadata backup {} (version {}, {} pairs, {}) from {url}",
                m.name,
                m.version,
                m.pairs,
                super::human_bytes(m.stored_bytes())
            );
            // the parts are fetched on the runtime while this thread decodes and loads
            let r = strait_fs_core::backup::load(kv.as_ref(), store, rt.handle(), &m)?;
            kv.sync()?;
            r
        }
        (Some(file), None) => {
            let kv = strait_fs_core::kv::open(&a.meta_url)?;
            let r = if file.as_os_str() == "-" {
                let mut r = BufReader::new(std::io::stdin().lock());
                strait_fs_core::snapshot::load(kv.as_ref(), &mut r)?
            } else {
                let f = std::fs::File::open(file)
                    .with_context(|| format!("open {}", file.display()))?;
                strait_fs_core::snapshot::load(kv.as_ref(), &mut BufReader::new(f))?
            };
            kv.sync()?;
            r
        }
        (None, None) => anyhow::bail!("give the dump to load, or --store to restore a backup"),
    };
    println!(
        "loaded {} at version {} into {}: digest {digest} (equal to the dump's)",
        header.name, header.version, a.meta_url
    );
    Ok(())
}
