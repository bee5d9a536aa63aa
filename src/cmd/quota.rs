//! `strait quota`: directory quotas (docs/operations.md, "Directory quotas"). PATH is a
//! directory under a strait mount on this machine, at the primary or at a mirror (the command
//! goes through the mount with the caller's identity, as the `strait.quota*` xattrs, like
//! CephFS's `ceph.quota.*`; a change at a mirror is forwarded to the primary), or a metadata
//! engine's URL with `--path` (a directory from the file system's root), for an engine no
//! daemon serves.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;

use anyhow::{bail, Context, Result};

use super::xattrs::{getxattr, removexattr, setxattr};
use strait_fs_core::meta::{quota_xattr as x, Ctx, Meta, MetaClient, MetaOptions, ROOT_INO};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Sub,
}

#[derive(clap::Args, Clone)]
pub struct Target {
    /// A directory under a strait mount, or a metadata engine's URL (with --path).
    #[arg(value_name = "PATH")]
    pub dir: String,
    /// With a metadata URL: the directory, from the file system's root (/team-a).
    #[arg(long)]
    pub path: Option<String>,
}

#[derive(clap::Subcommand)]
pub enum Sub {
    /// Give a directory a quota, or change its limits (root only).
    Set {
        #[command(flatten)]
        target: Target,
        /// Space under the directory (4M, 10G, ...; 0: no limit).
        #[arg(long)]
        capacity: Option<String>,
        /// Inodes under the directory (0: no limit).
        #[arg(long)]
        inodes: Option<u64>,
    },
    /// Show a directory's quota and usage.
    Get {
        #[command(flatten)]
        target: Target,
    },
    /// List the quotas at or under a directory.
    List {
        #[command(flatten)]
        target: Target,
    },
    /// Remove a directory's quota (root only).
    Delete {
        #[command(flatten)]
        target: Target,
    },
    /// Count a quota's directory again and compare; --repair sets the usage to the count.
    Check {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        repair: bool,
    },
}

/// Where the quota calls go: a mount's xattrs, or an engine opened here.
enum Via {
    Mount(CString),
    Engine(std::sync::Arc<Meta>, u64),
}

impl Via {
    fn open(t: &Target, write: bool) -> Result<(Via, String)> {
        if t.dir.contains("://") {
            let Some(p) = &t.path else {
                bail!("with a metadata URL, name the directory with --path /DIR");
            };
            let kv = if write {
                strait_fs_core::kv::open(&t.dir)?
            } else {
                strait_fs_core::kv::open_read_only(&t.dir)?
            };
            let meta = Meta::open(
                kv,
                MetaOptions {
                    read_only: !write,
                    ..Default::default()
                },
            )?;
            let mut ino = ROOT_INO;
            for part in p.split('/').filter(|s| !s.is_empty()) {
                ino = meta
                    .lookup(&Ctx::root(), ino, part.as_bytes())
                    .with_context(|| format!("{p}: no {part}"))?
                    .0;
            }
            return Ok((Via::Engine(meta, ino), p.clone()));
        }
        if t.path.is_some() {
            bail!(
                "--path goes with a metadata URL; {} is a path already",
                t.dir
            );
        }
        let md = std::fs::metadata(&t.dir).with_context(|| t.dir.clone())?;
        if !md.is_dir() {
            bail!("{}: not a directory", t.dir);
        }
        let c = CString::new(std::path::Path::new(&t.dir).as_os_str().as_bytes())
            .context("a path with a NUL byte")?;
        Ok((Via::Mount(c), t.dir.clone()))
    }

    fn get(&self, name: &[u8]) -> std::result::Result<Vec<u8>, i32> {
        match self {
            Via::Mount(path) => getxattr(path, name),
            Via::Engine(m, ino) => m.getxattr(&Ctx::root(), *ino, name).map_err(|e| e.errno()),
        }
    }

    fn set(&self, name: &[u8], value: &[u8]) -> std::result::Result<(), i32> {
        match self {
            Via::Mount(path) => setxattr(path, name, value),
            Via::Engine(m, ino) => {
                MetaClient::setxattr(m.as_ref(), &Ctx::root(), *ino, name, value, 0)
                    .map_err(|e| e.errno())
            }
        }
    }

    fn remove(&self, name: &[u8]) -> std::result::Result<(), i32> {
        match self {
            Via::Mount(path) => removexattr(path, name),
            Via::Engine(m, ino) => {
                MetaClient::removexattr(m.as_ref(), &Ctx::root(), *ino, name).map_err(|e| e.errno())
            }
        }
    }
}

/// One readable line for a failed call on `what`.
fn failed(what: &str, errno: i32) -> anyhow::Error {
    let why = std::io::Error::from_raw_os_error(errno);
    let hint = match errno {
        libc::EPERM => " (only root changes quotas; a squashed credential cannot)",
        libc::ENOTSUP => " (is it under a strait mount?)",
        libc::EROFS => " (the file system is served read-only)",
        _ => "",
    };
    anyhow::anyhow!("{what}: {why}{hint}")
}

fn show(path: &str, text: &[u8]) -> String {
    match x::parse(text) {
        Some((max_bytes, max_files, used_bytes, used_files)) => {
            let used_b = used_bytes.max(0) as u64;
            let cap = if max_bytes == 0 {
                "no limit".to_string()
            } else {
                format!(
                    "{} ({:.0} %)",
                    super::human_bytes(max_bytes),
                    used_b as f64 * 100.0 / max_bytes as f64
                )
            };
            let inodes = if max_files == 0 {
                "no limit".to_string()
            } else {
                format!(
                    "{max_files} ({:.0} %)",
                    used_files.max(0) as f64 * 100.0 / max_files as f64
                )
            };
            format!(
                "{path}: used {} of {cap}; {used_files} inodes of {inodes}",
                super::human_bytes(used_b)
            )
        }
        None => format!("{path}: {}", String::from_utf8_lossy(text)),
    }
}

pub fn run(a: Args) -> Result<()> {
    match a.command {
        Sub::Set {
            target,
            capacity,
            inodes,
        } => {
            if capacity.is_none() && inodes.is_none() {
                bail!("give --capacity SIZE, --inodes N or both");
            }
            let capacity = capacity.as_deref().map(super::parse_size).transpose()?;
            let (via, path) = Via::open(&target, true)?;
            if let Some(c) = capacity {
                via.set(x::MAX_BYTES, c.to_string().as_bytes())
                    .map_err(|e| failed(&format!("set the capacity of {path}"), e))?;
            }
            if let Some(n) = inodes {
                via.set(x::MAX_FILES, n.to_string().as_bytes())
                    .map_err(|e| failed(&format!("set the inodes of {path}"), e))?;
            }
            let q = via
                .get(x::QUOTA)
                .map_err(|e| failed(&format!("read the quota of {path}"), e))?;
            println!("{}", show(&path, &q));
        }
        Sub::Get { target } => {
            let (via, path) = Via::open(&target, false)?;
            match via.get(x::QUOTA) {
                Ok(q) => println!("{}", show(&path, &q)),
                Err(libc::ENODATA) => bail!("{path} has no quota"),
                Err(e) => return Err(failed(&format!("read the quota of {path}"), e)),
            }
        }
        Sub::List { target } => {
            let (via, path) = Via::open(&target, false)?;
            let text = via
                .get(x::LIST)
                .map_err(|e| failed(&format!("list the quotas under {path}"), e))?;
            let text = String::from_utf8_lossy(&text);
            if text.trim().is_empty() {
                println!("no quota under {path}");
            }
            for line in text.lines() {
                let (p, q) = line.split_once(' ').unwrap_or((line, ""));
                let shown = if p == "." {
                    path.clone()
                } else {
                    format!("{}/{p}", path.trim_end_matches('/'))
                };
                println!("{}", show(&shown, q.as_bytes()));
            }
        }
        Sub::Delete { target } => {
            let (via, path) = Via::open(&target, true)?;
            match via.remove(x::QUOTA) {
                Ok(()) => println!("{path}: quota removed"),
                Err(libc::ENODATA) => bail!("{path} has no quota"),
                Err(e) => return Err(failed(&format!("remove the quota of {path}"), e)),
            }
        }
        Sub::Check { target, repair } => {
            let (via, path) = Via::open(&target, repair)?;
            let text = match via.get(x::CHECK) {
                Ok(t) => t,
                Err(libc::ENODATA) => bail!("{path} has no quota"),
                Err(e) => return Err(failed(&format!("check the quota of {path}"), e)),
            };
            let text = String::from_utf8_lossy(&text).into_owned();
            println!("{path}: {text}");
            if text.starts_with("inconsistent") {
                if !repair {
                    bail!("the usage kept differs from a recount: run again with --repair");
                }
                via.set(x::REPAIR, b"1")
                    .map_err(|e| failed(&format!("repair the quota of {path}"), e))?;
                let after = via
                    .get(x::CHECK)
                    .map_err(|e| failed(&format!("check the quota of {path}"), e))?;
                println!("{path}: repaired: {}", String::from_utf8_lossy(&after));
            }
        }
    }
    Ok(())
}
