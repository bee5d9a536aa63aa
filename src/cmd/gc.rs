//! `strait gc`: delete the blocks of dead slices whose delay has passed.

use anyhow::Result;
use strait_fs_core::meta::{Meta, MetaOptions};

#[derive(clap::Args)]
pub struct Args {
    /// Metadata engine: rocksdb:///path, redis://host:port/db
    pub meta_url: String,
}

pub fn run(a: Args) -> Result<()> {
    let kv = strait_fs_core::kv::open(&a.meta_url)?;
    let format = Meta::load_format(kv.as_ref())?;
    let meta = Meta::open(kv, MetaOptions::default())?;
    let rt = super::runtime()?;
    let store = rt.block_on(strait_fs_core::object::open(&format.data_url))?;
    let mut total = 0;
    loop {
        let n = strait_fs_core::vfs::gc::gc_once(&meta, &store, rt.handle())?;
        total += n;
        if n == 0 {
            break;
        }
        eprintln!("deleted the blocks of {total} dead slices so far");
    }
    println!("deleted the blocks of {total} dead slices");
    Ok(())
}
