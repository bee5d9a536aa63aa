//! `strait warmup`: a mirror copies the blocks of some paths into its region's store now,
//! ahead of its copy queue (`SiteService.Warmup`), with a progress line and a summary.

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
    /// The mirror's metadata service (host:port).
    #[arg(long, env = "STRAIT_MIRROR")]
    pub addr: String,
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

pub fn run(a: Args) -> Result<()> {
    let mounts = strait_mounts();
    let paths: Vec<String> = a.paths.iter().map(|p| in_fs(p, &mounts)).collect();
    for (given, p) in a.paths.iter().zip(&paths) {
        if !p.starts_with('/') {
            bail!("{given:?}: give a path from the file system's root (/datasets/x) or under a strait mount on this machine");
        }
    }
    let creds = a.client.credentials()?;
    let rt = super::runtime()?;
    rt.block_on(async {
        let mirror = strait_mirror::follower::Primary::new(&a.addr, &creds)?;
        let mut c = mirror.site();
        let mut stream = c
            .warmup(s::WarmupRequest {
                paths: paths.clone(),
                background: a.background,
            })
            .await
            .map_err(|st| match st.code() {
                tonic::Code::Unimplemented => {
                    anyhow::anyhow!("{}: {}", a.addr, st.message())
                }
                _ => anyhow::anyhow!("{}: warm up {}: {}", a.addr, paths.join(" "), st.message()),
            })?
            .into_inner();
        let tty = std::io::stderr().is_terminal();
        let mut last: Option<s::WarmupProgress> = None;
        loop {
            let next = tokio::time::timeout(Duration::from_secs(60), stream.message())
                .await
                .with_context(|| format!("{}: no word of the warm-up for 60 s", a.addr))?
                .map_err(|st| anyhow::anyhow!("{}: warm-up: {}", a.addr, st.message()))?;
            let Some(p) = next else { break };
            if a.background {
                println!(
                    "warming up {} at {} in the background: {} files, {} blocks ({}); `strait mirror status --addr {}` shows how it goes",
                    paths.join(" "),
                    a.addr,
                    p.files,
                    p.blocks,
                    human_bytes(p.bytes),
                    a.addr
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
                a.addr
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
