//! `strait bench DIR`: the same shape as `juicefs bench` (big sequential files, small files,
//! stat) plus a metadata benchmark (create, stat, rename, unlink with several threads). It
//! only uses ordinary file calls, so it measures any mounted file system, which is how strait
//! and its peers are compared in one run.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub struct Args {
    /// A directory inside the mounted file system to benchmark (a directory named `cache`
    /// is written `./cache`: `strait bench cache` is the block cache's benchmark).
    #[arg(required = true)]
    pub dir: Option<PathBuf>,
    /// Size of each big file.
    #[arg(long, default_value = "1G")]
    pub big_file_size: String,
    /// I/O size for the big files.
    #[arg(long, default_value = "1M")]
    pub block_size: String,
    /// Number of small files.
    #[arg(long, default_value_t = 100)]
    pub small_file_count: usize,
    /// Size of each small file.
    #[arg(long, default_value = "128K")]
    pub small_file_size: String,
    /// Files in the metadata benchmark.
    #[arg(long, default_value_t = 5000)]
    pub meta_files: usize,
    /// Threads in the metadata benchmark.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Which parts to run: all, data, meta.
    #[arg(long, default_value = "all")]
    pub only: String,
    /// Label printed with the results (e.g. strait-rocksdb, juicefs-redis).
    #[arg(long, default_value = "")]
    pub label: String,
}

pub(crate) struct Row {
    pub(crate) name: &'static str,
    pub(crate) value: f64,
    unit: &'static str,
    detail: String,
}

/// Drop the kernel's page, dentry and inode caches so reads and lookups reach the file
/// system; false when that is not allowed (only root can).
pub(crate) fn drop_caches() -> bool {
    unsafe { libc::sync() };
    fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

fn mib_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / secs.max(1e-9)
}

pub fn run(a: Args) -> Result<()> {
    let Some(dir) = a.dir.clone() else {
        bail!("name the directory to benchmark");
    };
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let big = strait_ids::units::parse_size(&a.big_file_size)?;
    let bs = strait_ids::units::parse_size(&a.block_size)? as usize;
    let small = strait_ids::units::parse_size(&a.small_file_size)? as usize;
    if bs == 0 || a.threads == 0 {
        bail!("--block-size and --threads must be positive");
    }
    let work = dir.join(format!("__strait_bench_{}", std::process::id()));
    fs::create_dir(&work).with_context(|| format!("create {}", work.display()))?;
    let mut rows = vec![];
    let res = (|| -> Result<()> {
        if a.only == "all" || a.only == "data" {
            bench_data(&work, big, bs, a.small_file_count, small, &mut rows)?;
        }
        if a.only == "all" || a.only == "meta" {
            bench_meta(&work, a.meta_files, a.threads, &mut rows)?;
        }
        Ok(())
    })();
    let _ = fs::remove_dir_all(&work);
    res?;
    let label = if a.label.is_empty() {
        dir.display().to_string()
    } else {
        a.label.clone()
    };
    println!("benchmark of {label}");
    println!("{:<26} {:>14} {:<10} DETAIL", "ITEM", "VALUE", "UNIT");
    for r in rows {
        println!(
            "{:<26} {:>14.1} {:<10} {}",
            r.name, r.value, r.unit, r.detail
        );
    }
    Ok(())
}

fn bench_data(
    work: &Path,
    big: u64,
    bs: usize,
    n_small: usize,
    small: usize,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let buf: Vec<u8> = (0..bs).map(|i| (i * 131 % 251) as u8).collect();
    let path = work.join("big");
    let t = Instant::now();
    {
        let mut f = File::create(&path).context("create big file")?;
        let mut left = big;
        while left > 0 {
            let n = left.min(bs as u64) as usize;
            f.write_all(&buf[..n]).context("write big file")?;
            left -= n as u64;
        }
        f.sync_all().context("fsync big file")?;
    }
    let secs = t.elapsed().as_secs_f64();
    rows.push(Row {
        name: "write big file",
        value: mib_s(big, secs),
        unit: "MiB/s",
        detail: format!(
            "{} in {secs:.2} s, {bs} B writes",
            strait_ids::units::human_bytes(big)
        ),
    });
    drop_caches();
    let t = Instant::now();
    {
        let mut f = File::open(&path).context("open big file")?;
        let mut rbuf = vec![0u8; bs];
        let mut total = 0u64;
        loop {
            let n = f.read(&mut rbuf).context("read big file")?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        if total != big {
            bail!("read {total} bytes of the big file, wrote {big}");
        }
    }
    let secs = t.elapsed().as_secs_f64();
    rows.push(Row {
        name: "read big file",
        value: mib_s(big, secs),
        unit: "MiB/s",
        detail: format!("{} in {secs:.2} s", strait_ids::units::human_bytes(big)),
    });
    fs::remove_file(&path)?;

    let dir = work.join("small");
    fs::create_dir(&dir)?;
    let data: Vec<u8> = (0..small).map(|i| (i * 7 % 253) as u8).collect();
    let t = Instant::now();
    for i in 0..n_small {
        let mut f = File::create(dir.join(format!("f{i}")))?;
        f.write_all(&data)?;
    }
    let secs = t.elapsed().as_secs_f64();
    rows.push(Row {
        name: "write small files",
        value: n_small as f64 / secs,
        unit: "files/s",
        detail: format!(
            "{n_small} x {}, {:.2} ms/file",
            strait_ids::units::human_bytes(small as u64),
            secs * 1e3 / n_small as f64
        ),
    });
    drop_caches();
    let t = Instant::now();
    let mut rbuf = Vec::with_capacity(small);
    for i in 0..n_small {
        rbuf.clear();
        File::open(dir.join(format!("f{i}")))?.read_to_end(&mut rbuf)?;
        if rbuf != data {
            bail!("small file f{i} reads back different bytes");
        }
    }
    let secs = t.elapsed().as_secs_f64();
    rows.push(Row {
        name: "read small files",
        value: n_small as f64 / secs,
        unit: "files/s",
        detail: format!("{:.2} ms/file", secs * 1e3 / n_small as f64),
    });
    let t = Instant::now();
    for i in 0..n_small {
        fs::metadata(dir.join(format!("f{i}")))?;
    }
    let secs = t.elapsed().as_secs_f64();
    rows.push(Row {
        name: "stat small files",
        value: n_small as f64 / secs,
        unit: "files/s",
        detail: format!("{:.3} ms/file", secs * 1e3 / n_small as f64),
    });
    fs::remove_dir_all(&dir)?;
    Ok(())
}

/// Run `op(i)` for i in 0..n over `threads` threads; returns ops/s.
fn parallel(
    n: usize,
    threads: usize,
    op: impl Fn(usize) -> std::io::Result<()> + Sync,
) -> Result<f64> {
    let t = Instant::now();
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|k| {
                let op = &op;
                s.spawn(move || {
                    let mut errs = vec![];
                    let mut i = k;
                    while i < n {
                        if let Err(e) = op(i) {
                            errs.push(format!("item {i}: {e}"));
                            if errs.len() > 3 {
                                break;
                            }
                        }
                        i += threads;
                    }
                    errs
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    if let Some(e) = errors.first() {
        bail!("{} operations failed, first: {e}", errors.len());
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

pub(crate) fn bench_meta(work: &Path, n: usize, threads: usize, rows: &mut Vec<Row>) -> Result<()> {
    let dirs: Vec<PathBuf> = (0..threads).map(|k| work.join(format!("m{k}"))).collect();
    for d in &dirs {
        fs::create_dir(d)?;
    }
    let name = |i: usize| dirs[i % threads].join(format!("file{i}"));
    let renamed = |i: usize| dirs[i % threads].join(format!("moved{i}"));
    let detail = format!("{n} files, {threads} threads");
    let ops = parallel(n, threads, |i| File::create(name(i)).map(|_| ()))?;
    rows.push(Row {
        name: "create",
        value: ops,
        unit: "ops/s",
        detail: detail.clone(),
    });
    let ops = parallel(n, threads, |i| fs::metadata(name(i)).map(|_| ()))?;
    rows.push(Row {
        name: "stat",
        value: ops,
        unit: "ops/s",
        detail: detail.clone(),
    });
    // The stat above may be answered by the kernel's entry cache (entries live for the
    // mount's TTL after the create); this one reaches the file system.
    if drop_caches() {
        let ops = parallel(n, threads, |i| fs::metadata(name(i)).map(|_| ()))?;
        rows.push(Row {
            name: "stat (cold cache)",
            value: ops,
            unit: "ops/s",
            detail: detail.clone(),
        });
    }
    let ops = parallel(n, threads, |i| fs::rename(name(i), renamed(i)))?;
    rows.push(Row {
        name: "rename",
        value: ops,
        unit: "ops/s",
        detail: detail.clone(),
    });
    let ops = parallel(n, threads, |i| fs::remove_file(renamed(i)))?;
    rows.push(Row {
        name: "unlink",
        value: ops,
        unit: "ops/s",
        detail,
    });
    Ok(())
}
