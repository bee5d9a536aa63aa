//! `strait gc`: delete the blocks of dead slices whose delay has passed, in an engine this
//! process opens, or by asking a primary daemon (which keeps what its mirrors still need).

use anyhow::{bail, Context, Result};
use strait_fs_core::meta::{Meta, MetaOptions};

#[derive(clap::Args)]
pub struct Args {
    /// Metadata engine (rocksdb:///path, redis://host:port/db), or a primary daemon
    /// (strait://host:port), which runs the pass itself
    pub meta_url: String,
    /// The daemon's token (for strait://).
    #[arg(long, env = "STRAIT_TOKEN", hide_env_values = true, default_value = "")]
    pub token: String,
}

pub fn run(a: Args) -> Result<()> {
    if let Some(addr) = a.meta_url.strip_prefix("strait://") {
        return on_daemon(addr.trim_end_matches('/'), &a.token);
    }
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

fn on_daemon(addr: &str, token: &str) -> Result<()> {
    if token.is_empty() {
        bail!("a site daemon needs a token: pass --token or STRAIT_TOKEN");
    }
    let rt = super::runtime()?;
    let r = rt.block_on(async {
        let primary = strait_mirror::follower::Primary::new(addr, token)?;
        let mut c = primary.site();
        let r = tokio::time::timeout(
            std::time::Duration::from_secs(600),
            c.gc(strait_proto::site::Empty {}),
        )
        .await
        .with_context(|| format!("{addr} did not finish the pass within 600 s"))?
        .map_err(|s| anyhow::anyhow!("{addr}: {}", s.message()))?;
        anyhow::Ok(r.into_inner())
    })?;
    if r.has_mirrors {
        println!(
            "deleted the blocks of {} dead slices; kept {} that a mirror may still read (the mirrors have applied up to version {})",
            r.purged, r.held, r.horizon
        );
    } else {
        println!("deleted the blocks of {} dead slices", r.purged);
    }
    Ok(())
}
