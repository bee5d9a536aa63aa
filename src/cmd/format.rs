//! `strait format`: create a file system.

use anyhow::{bail, Context, Result};
use strait_fs_core::clock::now_ns;
use strait_fs_core::layout::{BLOCK_SIZE_MAX, BLOCK_SIZE_MIN};
use strait_fs_core::meta::{Format, Meta};

#[derive(clap::Args)]
pub struct Args {
    /// Metadata engine: rocksdb:///path, redis://host:port/db
    pub meta_url: String,
    /// Object store: file:///path, s3://bucket?endpoint=URL&region=R
    pub data_url: String,
    /// Size of a data block (64K to 16M).
    #[arg(long, default_value = "4M")]
    pub block_size: String,
    /// Name of the file system.
    #[arg(long, default_value = "strait")]
    pub name: String,
    /// Capacity reported by df (0: unlimited).
    #[arg(long, default_value = "0")]
    pub capacity: String,
    /// Seconds a dead slice's blocks are kept before they are deleted.
    #[arg(long, default_value_t = 600)]
    pub gc_delay: u64,
    /// Days the trash keeps what is deleted (0: no trash).
    #[arg(long, default_value_t = strait_fs_core::meta::TRASH_DAYS_DEFAULT)]
    pub trash_days: u32,
}

pub fn run(a: Args) -> Result<()> {
    let block_size = super::parse_size(&a.block_size)?;
    if !(BLOCK_SIZE_MIN as u64..=BLOCK_SIZE_MAX as u64).contains(&block_size) {
        bail!("--block-size {} is outside 64K..16M", a.block_size);
    }
    if a.name.is_empty()
        || a.name.len() > 64
        || a.name.contains(|c: char| c.is_whitespace() || c == '/')
    {
        bail!(
            "--name {:?}: use 1 to 64 characters without spaces or '/'",
            a.name
        );
    }
    let capacity = super::parse_size(&a.capacity)?;
    // check the object store before writing anything into the metadata engine
    let rt = super::runtime()?;
    let store = rt.block_on(strait_fs_core::object::open(&a.data_url))?;
    let probe = format!("strait-format-probe-{}", std::process::id());
    rt.block_on(async {
        store.put(&probe, bytes_of(b"probe")).await?;
        store.delete(&probe).await
    })
    .with_context(|| format!("write a test object to {}", store.describe()))?;
    let kv = strait_fs_core::kv::open(&a.meta_url)?;
    let uuid = format!("{:032x}", rand::random::<u128>());
    let format = Format {
        name: a.name.clone(),
        uuid: uuid.clone(),
        data_url: a.data_url.clone(),
        block_size: block_size as u32,
        capacity_bytes: capacity,
        trash_delay_s: a.gc_delay,
        created_ns: now_ns(),
    };
    Meta::format(&kv, format)?;
    if a.trash_days != strait_fs_core::meta::TRASH_DAYS_DEFAULT {
        let meta = Meta::open(kv.clone(), Default::default())?;
        meta.set_trash_days_versioned(&strait_fs_core::meta::Ctx::root(), a.trash_days)?;
        kv.sync()?;
    }
    println!(
        "formatted {} (uuid {uuid}) with metadata in {} and data in {}, block size {}",
        a.name,
        a.meta_url,
        store.describe(),
        super::human_bytes(block_size)
    );
    Ok(())
}

fn bytes_of(b: &'static [u8]) -> strait_fs_core::object::Bytes {
    strait_fs_core::object::Bytes::from_static(b)
}
