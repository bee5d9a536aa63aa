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
    /// The dump to read ("-" for standard input).
    pub file: PathBuf,
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
    let kv = strait_fs_core::kv::open(&a.meta_url)?;
    let (header, digest) = if a.file.as_os_str() == "-" {
        let mut r = BufReader::new(std::io::stdin().lock());
        strait_fs_core::snapshot::load(kv.as_ref(), &mut r)?
    } else {
        let f =
            std::fs::File::open(&a.file).with_context(|| format!("open {}", a.file.display()))?;
        strait_fs_core::snapshot::load(kv.as_ref(), &mut BufReader::new(f))?
    };
    kv.sync()?;
    println!(
        "loaded {} at version {} into {}: digest {digest} (equal to the dump's)",
        header.name, header.version, a.meta_url
    );
    Ok(())
}
