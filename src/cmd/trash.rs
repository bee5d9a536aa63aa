//! `strait trash`: what was deleted, kept for the file system's `trash_days` (docs/operations.md,
//! "The trash"). PATH is any path under a strait mount on this machine, at the primary or at a
//! mirror: the command reads the mount's `/.trash` and changes it through the virtual
//! `strait.trash.*` xattrs with the caller's identity (a change at a mirror is forwarded to the
//! primary, as every change is).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strait_fs_core::meta::{trash_xattr as x, TRASH_NAME};

use super::xattrs::{getxattr, setxattr};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Sub,
}

#[derive(clap::Subcommand)]
pub enum Sub {
    /// List what the trash holds (yours; everything for root), oldest first.
    List {
        /// Any path under a strait mount.
        #[arg(value_name = "PATH")]
        path: PathBuf,
    },
    /// Put entries back where they were (a directory with what was under it), or under --to.
    Restore {
        /// Any path under a strait mount.
        #[arg(value_name = "PATH")]
        path: PathBuf,
        /// Entries, as `strait trash list` names them (PARENT-INO-NAME).
        #[arg(value_name = "ENTRY")]
        entries: Vec<String>,
        /// Every entry you may see.
        #[arg(long)]
        all: bool,
        /// Put the entries named into this directory (what was under them follows them).
        #[arg(long, value_name = "DIR")]
        to: Option<PathBuf>,
    },
    /// Delete entries for good before their retention passes (root only).
    Purge {
        /// Any path under a strait mount.
        #[arg(value_name = "PATH")]
        path: PathBuf,
        /// Entries, as `strait trash list` names them.
        #[arg(value_name = "ENTRY")]
        entries: Vec<String>,
        /// Every entry.
        #[arg(long)]
        all: bool,
    },
    /// Show the retention in days, or set it (root only; 0 turns the trash off).
    Days {
        /// Any path under a strait mount.
        #[arg(value_name = "PATH")]
        path: PathBuf,
        days: Option<u32>,
    },
}

/// One entry as the listing shows it.
#[derive(Clone, Debug)]
struct Item {
    name: String,
    parent: u64,
    ino: u64,
    is_dir: bool,
    size: u64,
    uid: u32,
    deleted_ns: i64,
    path: CString,
}

/// The root of the strait mount `path` is under: the highest directory above it on the same
/// device.
fn mount_root(path: &Path) -> Result<PathBuf> {
    let path = std::fs::canonicalize(path).with_context(|| path.display().to_string())?;
    let dev = std::fs::metadata(&path)
        .with_context(|| path.display().to_string())?
        .dev();
    let mut root = path.clone();
    while let Some(up) = root.parent() {
        match std::fs::metadata(up) {
            Ok(m) if m.dev() == dev => root = up.to_path_buf(),
            _ => break,
        }
    }
    Ok(root)
}

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).context("a path with a NUL byte")
}

/// One readable line for a failed call on `what`.
fn failed(what: &str, errno: i32) -> anyhow::Error {
    let why = std::io::Error::from_raw_os_error(errno);
    let hint = match errno {
        libc::EPERM => " (only root changes the retention or purges; a squashed credential cannot)",
        libc::EACCES => " (only its owner and root may restore an entry)",
        libc::EEXIST => " (the name is taken there: restore it --to another directory)",
        libc::ENOENT => " (its directory is gone: restore it --to another directory)",
        libc::ENOTSUP => " (is it under a strait mount?)",
        libc::EROFS => " (the file system is served read-only)",
        _ => "",
    };
    anyhow::anyhow!("{what}: {why}{hint}")
}

/// The mount's trash directory, with a clear error where there is none.
fn trash_dir(path: &Path) -> Result<PathBuf> {
    let root = mount_root(path)?;
    let dir = root.join(std::ffi::OsStr::from_bytes(TRASH_NAME));
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => Ok(dir),
        _ => bail!(
            "{} has no {}: is it a strait mount of the whole file system (a mount confined to a \
             subtree has no trash)?",
            root.display(),
            String::from_utf8_lossy(TRASH_NAME)
        ),
    }
}

/// Every entry of the trash the caller may see, oldest first.
fn read_items(dir: &Path) -> Result<Vec<Item>> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))? {
        let e = e.with_context(|| format!("list {}", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let p = e.path();
        let md = match std::fs::symlink_metadata(&p) {
            Ok(m) => m,
            // restored or purged meanwhile
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(err).with_context(|| p.display().to_string()),
        };
        let c = cpath(&p)?;
        let text = match getxattr(&c, x::ENTRY) {
            Ok(t) => String::from_utf8_lossy(&t).into_owned(),
            Err(libc::ENODATA) | Err(libc::ENOENT) => continue,
            Err(e) => return Err(failed(&format!("read {}", p.display()), e)),
        };
        let field = |f: &str| {
            text.split_whitespace()
                .find_map(|w| w.strip_prefix(f)?.strip_prefix('='))
                .and_then(|v| v.parse::<i64>().ok())
        };
        let (Some(parent), Some(deleted_ns)) = (field("parent"), field("deleted_ns")) else {
            bail!("{}: an entry without its place: {text:?}", p.display());
        };
        out.push(Item {
            name,
            parent: parent as u64,
            ino: md.ino(),
            is_dir: md.is_dir(),
            size: md.len(),
            uid: md.uid(),
            deleted_ns,
            path: c,
        });
    }
    out.sort_by_key(|i| (i.deleted_ns, i.ino));
    Ok(out)
}

/// A time as `YYYY-MM-DD HH:MM:SS` UTC.
fn utc(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let s = secs.rem_euclid(86_400);
    // civil from days (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// A progress line at most every second on a long run, and the last one.
struct Progress {
    what: &'static str,
    total: usize,
    done: usize,
    last: Instant,
}

impl Progress {
    fn new(what: &'static str, total: usize) -> Self {
        Progress {
            what,
            total,
            done: 0,
            last: Instant::now(),
        }
    }
    fn step(&mut self) {
        self.done += 1;
        if self.total > 100 && self.last.elapsed() >= Duration::from_secs(1) {
            eprintln!("{} {} of {}", self.what, self.done, self.total);
            self.last = Instant::now();
        }
    }
}

/// The entries named (by their listed names, or paths ending in them).
fn pick<'a>(items: &'a [Item], names: &[String]) -> Result<Vec<&'a Item>> {
    let by_name: HashMap<&str, &Item> = items.iter().map(|i| (i.name.as_str(), i)).collect();
    names
        .iter()
        .map(|n| {
            let base = Path::new(n)
                .file_name()
                .map(|b| b.to_string_lossy().into_owned())
                .unwrap_or_else(|| n.clone());
            by_name.get(base.as_str()).copied().ok_or_else(|| {
                anyhow::anyhow!(
                    "{n}: no such entry in the trash (or not yours): `strait trash list` shows them"
                )
            })
        })
        .collect()
}

/// What restoring `chosen` takes, in order: the directories above each that are in the trash
/// too (each put back first, where it was), then each entry, then what was under it.
fn restore_order<'a>(items: &'a [Item], chosen: &[&'a Item]) -> Vec<(&'a Item, bool)> {
    let by_ino: HashMap<u64, &Item> = items.iter().map(|i| (i.ino, i)).collect();
    let mut children: BTreeMap<u64, Vec<&Item>> = BTreeMap::new();
    for i in items {
        children.entry(i.parent).or_default().push(i);
    }
    let mut seen = BTreeSet::new();
    let mut out = vec![];
    for &top in chosen {
        // the directories it needs, the farthest first
        let mut above = vec![];
        let mut p = top.parent;
        while let Some(d) = by_ino.get(&p) {
            if seen.contains(&d.ino) || above.iter().any(|a: &&Item| a.ino == d.ino) {
                break;
            }
            above.push(*d);
            p = d.parent;
        }
        for d in above.into_iter().rev() {
            if seen.insert(d.ino) {
                out.push((d, false));
            }
        }
        // the entry (moved with --to when named), then its subtree, breadth first
        if seen.insert(top.ino) {
            out.push((top, true));
        }
        let mut queue = std::collections::VecDeque::from([top.ino]);
        while let Some(d) = queue.pop_front() {
            for c in children.get(&d).into_iter().flatten() {
                if seen.insert(c.ino) {
                    out.push((c, false));
                    queue.push_back(c.ino);
                }
            }
        }
    }
    out
}

pub fn run(a: Args) -> Result<()> {
    match a.command {
        Sub::List { path } => {
            let dir = trash_dir(&path)?;
            let items = read_items(&dir)?;
            if items.is_empty() {
                println!("the trash is empty (or holds nothing of yours)");
                return Ok(());
            }
            println!(
                "{:<19}  {:>10}  {:>6}  {:<4}  ENTRY",
                "DELETED (UTC)", "SIZE", "OWNER", "KIND"
            );
            for i in &items {
                println!(
                    "{:<19}  {:>10}  {:>6}  {:<4}  {}",
                    utc(i.deleted_ns),
                    if i.is_dir {
                        "-".to_string()
                    } else {
                        super::human_bytes(i.size)
                    },
                    i.uid,
                    if i.is_dir { "dir" } else { "file" },
                    i.name
                );
            }
            let bytes: u64 = items.iter().filter(|i| !i.is_dir).map(|i| i.size).sum();
            println!(
                "{} entries, {} in {}",
                items.len(),
                super::human_bytes(bytes),
                dir.display()
            );
        }
        Sub::Restore {
            path,
            entries,
            all,
            to,
        } => {
            if all != entries.is_empty() {
                bail!("name the entries to restore, or give --all");
            }
            let dir = trash_dir(&path)?;
            let to_ino = match &to {
                None => None,
                Some(d) => {
                    let md = std::fs::metadata(d).with_context(|| d.display().to_string())?;
                    let trash_dev = std::fs::metadata(&dir)?.dev();
                    if !md.is_dir() {
                        bail!("--to {}: not a directory", d.display());
                    }
                    if md.dev() != trash_dev {
                        bail!("--to {}: not on the same strait mount", d.display());
                    }
                    Some(md.ino())
                }
            };
            let items = read_items(&dir)?;
            let chosen: Vec<&Item> = if all {
                // the tops: entries whose directory is not in the trash
                let inos: BTreeSet<u64> = items.iter().map(|i| i.ino).collect();
                items.iter().filter(|i| !inos.contains(&i.parent)).collect()
            } else {
                pick(&items, &entries)?
            };
            let order = restore_order(&items, &chosen);
            let mut progress = Progress::new("restored", order.len());
            let mut failures = 0usize;
            // entries under one that failed stay in the trash: their directory is not back
            let mut stuck = BTreeSet::new();
            for (item, named) in &order {
                if stuck.contains(&item.parent) {
                    stuck.insert(item.ino);
                    failures += 1;
                    continue;
                }
                let value = match (named, to_ino) {
                    (true, Some(ino)) => ino.to_string(),
                    _ => String::new(),
                };
                if let Err(e) = setxattr(&item.path, x::RESTORE, value.as_bytes()) {
                    eprintln!("{}", failed(&format!("restore {}", item.name), e));
                    stuck.insert(item.ino);
                    failures += 1;
                    continue;
                }
                progress.step();
            }
            let restored = order.len() - failures;
            println!("restored {restored} of {} entries", order.len());
            if failures > 0 {
                bail!("{failures} entries stay in the trash (see above)");
            }
        }
        Sub::Purge { path, entries, all } => {
            if all != entries.is_empty() {
                bail!("name the entries to purge, or give --all");
            }
            let dir = trash_dir(&path)?;
            let items = read_items(&dir)?;
            let chosen: Vec<&Item> = if all {
                items.iter().collect()
            } else {
                pick(&items, &entries)?
            };
            let mut progress = Progress::new("purged", chosen.len());
            for item in &chosen {
                match setxattr(&item.path, x::PURGE, b"") {
                    Ok(()) | Err(libc::ENOENT) => progress.step(),
                    Err(e) => return Err(failed(&format!("purge {}", item.name), e)),
                }
            }
            println!("purged {} entries", chosen.len());
        }
        Sub::Days { path, days } => {
            let root = cpath(&mount_root(&path)?)?;
            if let Some(d) = days {
                setxattr(&root, x::DAYS, d.to_string().as_bytes())
                    .map_err(|e| failed("set the trash's retention", e))?;
            }
            let now =
                getxattr(&root, x::DAYS).map_err(|e| failed("read the trash's retention", e))?;
            let now = String::from_utf8_lossy(&now).into_owned();
            if now == "0" {
                println!("the trash is off: what is deleted is gone at once");
            } else {
                println!("the trash keeps what is deleted for {now} days");
            }
        }
    }
    Ok(())
}
