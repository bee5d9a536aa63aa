//! `strait fsck`: check metadata; print its digest.

use anyhow::{bail, Result};
use strait_fs_core::meta::Meta;

#[derive(clap::Args)]
pub struct Args {
    /// Metadata engine: rocksdb:///path, redis://host:port/db
    pub meta_url: String,
    /// Print only `DIGEST VERSION` (for scripts and comparisons).
    #[arg(long)]
    pub digest: bool,
}

pub fn run(a: Args) -> Result<()> {
    let kv = strait_fs_core::kv::open_read_only(&a.meta_url)?;
    Meta::load_format(&kv)?;
    let before = kv.last_version()?;
    let digest = Meta::digest(&kv)?;
    let after = kv.last_version()?;
    if before != after {
        bail!("the file system changed while it was read (version {before} -> {after}); run fsck again or unmount first");
    }
    if a.digest {
        println!("{digest} {after}");
    } else {
        println!("metadata tree is consistent: every entry reaches an existing inode");
        println!("digest:  {digest}");
        println!("version: {after}");
    }
    Ok(())
}
