//! `strait status`: settings, usage, sessions and change-log position of a file system.

use anyhow::Result;
use strait_fs_core::clock::now_ns;
use strait_fs_core::meta::{Meta, MetaOptions};

#[derive(clap::Args)]
pub struct Args {
    /// Metadata engine: rocksdb:///path, redis://host:port/db
    pub meta_url: String,
}

pub fn run(a: Args) -> Result<()> {
    let kv = strait_fs_core::kv::open_read_only(&a.meta_url)?;
    let meta = Meta::open(
        kv.clone(),
        MetaOptions {
            read_only: true,
            ..Default::default()
        },
    )?;
    let f = meta.settings();
    let s = meta.statfs()?;
    println!("name:          {}", f.name);
    println!("uuid:          {}", f.uuid);
    println!("metadata:      {} ({})", a.meta_url, kv.name());
    println!("data:          {}", f.data_url);
    println!("block size:    {}", super::human_bytes(f.block_size as u64));
    println!("gc delay:      {} s", f.trash_delay_s);
    println!(
        "used:          {} of {}",
        super::human_bytes(s.used_bytes),
        if f.capacity_bytes == 0 {
            "unlimited".to_string()
        } else {
            super::human_bytes(f.capacity_bytes)
        }
    );
    println!("inodes:        {}", s.inodes);
    println!("log version:   {}", kv.last_version()?);
    println!("backups:       {}", super::backup::status_line(&f.data_url));
    let dead = meta.dead_slices(i64::MAX, 100_000)?;
    println!("dead slices:   {} awaiting block deletion", dead.len());
    let sessions = meta.sessions()?;
    println!("sessions:      {}", sessions.len());
    let now = now_ns();
    for (sid, hb, info) in sessions {
        println!(
            "  {sid:>4}  {info}  (heartbeat {:.0} s ago)",
            (now - hb) as f64 / 1e9
        );
    }
    Ok(())
}
