//! `strait changelog`: print the outbox's change records.

use anyhow::Result;
use strait_fs_core::changelog::{line, read_log};
use strait_fs_core::Version;

#[derive(clap::Args)]
pub struct Args {
    /// Metadata engine: rocksdb:///path, redis://host:port/db
    pub meta_url: String,
    /// Print records after this version.
    #[arg(long, default_value_t = 0)]
    pub from: u64,
    /// Print at most this many records (0: all).
    #[arg(long, default_value_t = 0)]
    pub limit: u64,
}

const PAGE: usize = 1000;

pub fn run(a: Args) -> Result<()> {
    let kv = strait_fs_core::kv::open_read_only(&a.meta_url)?;
    let mut after = Version(a.from);
    let mut printed = 0u64;
    loop {
        let page = read_log(kv.as_ref(), after, PAGE)?;
        if page.is_empty() {
            break;
        }
        for (v, rec) in &page {
            if a.limit > 0 && printed >= a.limit {
                return Ok(());
            }
            println!("{}", line(*v, rec));
            printed += 1;
            after = *v;
        }
        if page.len() < PAGE {
            break;
        }
    }
    Ok(())
}
