//! `strait warmup`: with `--addr`, a mirror copies the blocks of some paths into its region's
//! store now, ahead of its copy queue (`SiteService.Warmup`); without it, the files under some
//! paths of a strait mount on this machine are read through it, which fills the mount's block
//! cache (as `juicefs warmup` does). Both with a progress line and a summary.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use strait_proto::site as s;

use super::human_bytes;

#[derive(clap::Args)]
pub struct Args {
    /// What to warm up: paths in the file system from its root (`/datasets/imagenet`), or
    /// paths under a strait mount on this machine (`/mnt/strait/datasets/imagenet`), whose
    /// mount point is taken off. A directory counts with everything under it.
    #[arg(required = true)]
    pub paths: Vec<String>,
    /// The mirror whose region's store takes the blocks (its metadata service, host:port).
    /// Without it, the paths must be under a strait mount on this machine, whose cache takes
    /// them (they are read through the mount).
    #[arg(long, env = "STRAIT_MIRROR")]
    pub addr: Option<String>,
    /// Files read at once when filling a mount's cache (without --addr).
    #[arg(long, default_value_t = 8)]
    pub readers: usize,
    /// A token of the role admin (or a client certificate naming it), and TLS.
    #[command(flatten)]
    pub client: super::creds::ClientArgs,
    /// Start it and return at once; `strait mirror status` shows how it goes.
    #[arg(long)]
    pub background: bool,
}

/// The strait mount points on this machine (`/proc/self/mountinfo`, source `strait:NAME`).
fn strait_mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let point = left.split(' ').nth(4)?;
            let source = right.split(' ').nth(1)?;
            source.starts_with("strait").then(|| point.to_string())
        })
        .collect()
}

/// `path` as the file system names it: under a strait mount, from the mount's root.
fn in_fs(path: &str, mounts: &[String]) -> String {
    let canon = Path::new(path)
        .canonicalize()
        .map(|p| p.to_string_lossy().into_owned());
    let Ok(canon) = canon else {
        return path.to_string();
    };
    let best = mounts
        .iter()
        .filter(|m| canon == **m || canon.starts_with(&format!("{}/", m.trim_end_matches('/'))))
        .max_by_key(|m| m.len());
    match best {
        Some(m) => {
            let rest = canon[m.len()..].trim_start_matches('/');
            format!("/{rest}")
        }
        None => path.to_string(),
    }
}

/// One line of a warm-up's figures (progress, `mirror status`).
pub fn line(p: &s::WarmupProgress) -> String {
    let here = p.present_bytes + p.copied_bytes;
    let pct = if p.bytes == 0 {
        100.0
    } else {
        here as f64 * 100.0 / p.bytes as f64
    };
    let secs = p.elapsed_ms as f64 / 1e3;
    let rate = if secs > 0.0 {
        p.copied_bytes as f64 / secs
    } else {
        0.0
    };
    let left = p.bytes.saturating_sub(here);
    let eta = match (p.done, rate > 0.0) {
        (true, _) => String::new(),
        (false, true) => format!(", {:.0} s left", left as f64 / rate),
        (false, false) => String::new(),
    };
    let failed = if p.failed_blocks > 0 {
        format!(
            ", {} blocks failed (last: {})",
            p.failed_blocks, p.last_error
        )
    } else {
        String::new()
    };
    format!(
        "{} files, {} of {} here ({pct:.0}%): {} were, {} copied in {secs:.1} s ({}/s){eta}{failed}",
        p.files,
        human_bytes(here),
        human_bytes(p.bytes),
        human_bytes(p.present_bytes),
        human_bytes(p.copied_bytes),
        human_bytes(rate as u64),
    )
}

/// The most files one warm-up of a mount's cache lists.
const MOUNT_FILES_MAX: usize = 1 << 22;
/// How often the progress line is printed.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// The regular files under `path` (itself when it is one), with their sizes; symbolic links
/// are not followed.
fn files_under(path: &Path, out: &mut Vec<(std::path::PathBuf, u64)>) -> Result<()> {
    let mut todo = vec![path.to_path_buf()];
    while let Some(p) = todo.pop() {
        let m = std::fs::symlink_metadata(&p).with_context(|| format!("{}", p.display()))?;
        if m.is_dir() {
            for e in std::fs::read_dir(&p).with_context(|| format!("list {}", p.display()))? {
                todo.push(e.with_context(|| format!("list {}", p.display()))?.path());
            }
        } else if m.is_file() {
            out.push((p, m.len()));
            if out.len() > MOUNT_FILES_MAX {
                bail!("more than {MOUNT_FILES_MAX} files: warm up parts of the tree");
            }
        }
    }
    Ok(())
}

/// Read the files under `paths` (each under a strait mount) through the mount, `readers` at
/// a time: the mount's cache keeps their blocks.
fn warm_mount(paths: &[String], mounts: &[String], readers: usize) -> Result<()> {
    use std::io::Read;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::Arc;
    for p in paths {
        let canon = Path::new(p)
            .canonicalize()
            .with_context(|| format!("{p}: no such file or directory on this machine"))?;
        let under = mounts.iter().any(|m| {
            canon == Path::new(m) || canon.starts_with(format!("{}/", m.trim_end_matches('/')))
        });
        if !under {
            bail!(
                "{p} is not under a strait mount on this machine: give --addr MIRROR to warm a mirror's region up, or a path under a mount to fill its cache"
            );
        }
    }
    let mut files = vec![];
    for p in paths {
        files_under(Path::new(p), &mut files)?;
    }
    let total: u64 = files.iter().map(|f| f.1).sum();
    let files = Arc::new(files);
    let next = Arc::new(AtomicUsize::new(0));
    let (done_files, done_bytes, failed) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let last_error = Arc::new(std::sync::Mutex::new(String::new()));
    let start = std::time::Instant::now();
    let workers: Vec<_> = (0..readers.clamp(1, 64))
        .map(|_| {
            let (files, next, done_files, done_bytes, failed, last_error) = (
                files.clone(),
                next.clone(),
                done_files.clone(),
                done_bytes.clone(),
                failed.clone(),
                last_error.clone(),
            );
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((path, _)) = files.get(i) else {
                        return;
                    };
                    let read = std::fs::File::open(path).and_then(|mut f| loop {
                        let n = f.read(&mut buf)?;
                        if n == 0 {
                            return Ok(());
                        }
                        done_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    });
                    match read {
                        Ok(()) => {
                            done_files.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            *last_error.lock().unwrap_or_else(|p| p.into_inner()) =
                                format!("read {}: {e}", path.display());
                        }
                    }
                }
            })
        })
        .collect();
    let tty = std::io::stderr().is_terminal();
    let progress = |final_line: bool| {
        let secs = start.elapsed().as_secs_f64();
        let bytes = done_bytes.load(Ordering::Relaxed);
        let rate = if secs > 0.0 { bytes as f64 / secs } else { 0.0 };
        let eta = if final_line || rate <= 0.0 {
            String::new()
        } else {
            format!(", {:.0} s left", total.saturating_sub(bytes) as f64 / rate)
        };
        format!(
            "{} of {} files, {} of {} read in {secs:.1} s ({}/s){eta}",
            done_files.load(Ordering::Relaxed),
            files.len(),
            human_bytes(bytes),
            // a file that grew since it was listed
            human_bytes(total.max(bytes)),
            human_bytes(rate as u64)
        )
    };
    let mut shown = std::time::Instant::now();
    while workers.iter().any(|w| !w.is_finished()) {
        std::thread::sleep(Duration::from_millis(100));
        if shown.elapsed() >= PROGRESS_EVERY {
            shown = std::time::Instant::now();
            if tty {
                eprint!("\r\x1b[2Kwarm-up: {}", progress(false));
                std::io::stderr().flush().ok();
            } else {
                eprintln!("warm-up: {}", progress(false));
            }
        }
    }
    for w in workers {
        w.join()
            .map_err(|_| anyhow::anyhow!("a reader thread panicked"))?;
    }
    if tty {
        eprintln!();
    }
    println!(
        "warmed up the mount's cache for {}: {}",
        paths.join(" "),
        progress(true)
    );
    let failed = failed.load(Ordering::Relaxed);
    if failed > 0 {
        bail!(
            "{failed} files could not be read (the last: {})",
            last_error.lock().unwrap_or_else(|p| p.into_inner())
        );
    }
    Ok(())
}

pub fn run(a: Args) -> Result<()> {
    let mounts = strait_mounts();
    let Some(addr) = a.addr.clone() else {
        return warm_mount(&a.paths, &mounts, a.readers);
    };
    let paths: Vec<String> = a.paths.iter().map(|p| in_fs(p, &mounts)).collect();
    for (given, p) in a.paths.iter().zip(&paths) {
        if !p.starts_with('/') {
            bail!("{given:?}: give a path from the file system's root (/datasets/x) or under a strait mount on this machine");
        }
    }
    let creds = a.client.credentials()?;
    let rt = super::runtime()?;
    rt.block_on(async {
        let mirror = strait_mirror::follower::Primary::new(&addr, &creds)?;
        let mut c = mirror.site();
        let mut stream = c
            .warmup(s::WarmupRequest {
                paths: paths.clone(),
                background: a.background,
            })
            .await
            .map_err(|st| match st.code() {
                tonic::Code::Unimplemented => {
                    anyhow::anyhow!("{}: {}", addr, st.message())
                }
                _ => anyhow::anyhow!("{}: warm up {}: {}", addr, paths.join(" "), st.message()),
            })?
            .into_inner();
        let tty = std::io::stderr().is_terminal();
        let mut last: Option<s::WarmupProgress> = None;
        loop {
            let next = tokio::time::timeout(Duration::from_secs(60), stream.message())
                .await
                .with_context(|| format!("{}: no word of the warm-up for 60 s", addr))?
                .map_err(|st| anyhow::anyhow!("{}: warm-up: {}", addr, st.message()))?;
            let Some(p) = next else { break };
            if a.background {
                println!(
                    "warming up {} at {} in the background: {} files, {} blocks ({}); `strait mirror status --addr {}` shows how it goes",
                    paths.join(" "),
                    addr,
                    p.files,
                    p.blocks,
                    human_bytes(p.bytes),
                    addr
                );
                return Ok(());
            }
            if !p.done {
                if tty {
                    eprint!("\r\x1b[2Kwarm-up: {}", line(&p));
                    std::io::stderr().flush().ok();
                } else {
                    eprintln!("warm-up: {}", line(&p));
                }
            }
            let done = p.done;
            last = Some(p);
            if done {
                break;
            }
        }
        if tty {
            eprintln!();
        }
        let Some(p) = last.filter(|p| p.done) else {
            bail!(
                "{}: the warm-up's stream ended before it was done; `strait mirror status` shows how it goes",
                addr
            );
        };
        println!("warmed up {}: {}", paths.join(" "), line(&p));
        if p.failed_blocks > 0 {
            bail!(
                "{} blocks were not copied (the last error: {}); run it again to retry them",
                p.failed_blocks,
                p.last_error
            );
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_under_a_mount_is_named_from_the_file_systems_root() {
        let dir = std::env::temp_dir().join(format!("strait-warmup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let m = dir.canonicalize().unwrap();
        std::fs::create_dir_all(m.join("data/x")).unwrap();
        let mounts = vec![m.to_string_lossy().into_owned()];
        let under = m.join("data/x").to_string_lossy().into_owned();
        assert_eq!(in_fs(&under, &mounts), "/data/x");
        assert_eq!(in_fs(&m.to_string_lossy(), &mounts), "/");
        // not under a mount, or not on this machine: as given
        assert_eq!(in_fs("/datasets/imagenet", &mounts), "/datasets/imagenet");
        assert_eq!(in_fs(&under, &[]), under);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_line_says_what_is_here_and_what_is_left() {
        let p = s::WarmupProgress {
            files: 3,
            blocks: 4,
            bytes: 16 << 20,
            present_bytes: 4 << 20,
            copied_bytes: 4 << 20,
            elapsed_ms: 1000,
            ..Default::default()
        };
        let l = line(&p);
        assert!(
            l.starts_with("3 files, 8.0 MiB of 16.0 MiB here (50%)"),
            "{l}"
        );
        assert!(l.contains("2 s left"), "{l}");
    }
}
