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
    /// Processes whose CPU time to count per operation, as NAME=PID[,PID...] (a mount, a
    /// daemon; several pids are summed); repeat for several. This program's own is always
    /// counted, as `bench`.
    #[arg(long = "cpu-of", value_name = "NAME=PIDS")]
    pub cpu_of: Vec<String>,
}

/// The processes whose CPU time each row counts: (name, pids); this program's first.
#[derive(Clone)]
pub(crate) struct CpuOf(Vec<(String, Vec<u32>)>);

impl CpuOf {
    pub(crate) fn parse(specs: &[String]) -> Result<Self> {
        let mut v = vec![("bench".to_string(), vec![std::process::id()])];
        for spec in specs {
            let (name, pids) = spec
                .split_once('=')
                .with_context(|| format!("--cpu-of {spec:?}: expected NAME=PID[,PID...]"))?;
            let mut list = vec![];
            for pid in pids.split(',') {
                let pid: u32 = pid
                    .parse()
                    .with_context(|| format!("--cpu-of {spec:?}: {pid:?} is not a process id"))?;
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    bail!("--cpu-of {spec:?}: no process {pid}");
                }
                list.push(pid);
            }
            v.push((name.to_string(), list));
        }
        Ok(CpuOf(v))
    }

    fn now(&self) -> Vec<f64> {
        self.0
            .iter()
            .map(|(_, pids)| {
                pids.iter()
                    .map(|p| strait_devkit::usage::process_cpu_s(*p))
                    .sum()
            })
            .collect()
    }

    /// Run `f`, which does `ops` operations of `per` (op, MiB, ...); returns its result and
    /// each process's CPU time per operation, as a DETAIL column's text.
    fn measure<T>(&self, per: &str, f: impl FnOnce() -> Result<(T, f64)>) -> Result<(T, String)> {
        let before = self.now();
        let (out, ops) = f()?;
        Ok((out, self.since(&before, per, ops)))
    }

    /// [`CpuOf::measure`] of a future's work.
    pub(crate) async fn measure_async<T>(
        &self,
        per: &str,
        f: impl std::future::Future<Output = Result<(T, f64)>>,
    ) -> Result<(T, String)> {
        let before = self.now();
        let (out, ops) = f.await?;
        Ok((out, self.since(&before, per, ops)))
    }

    /// Each process's CPU time since `before`, per operation, as a DETAIL column's text.
    fn since(&self, before: &[f64], per: &str, ops: f64) -> String {
        let after = self.now();
        let parts: Vec<String> = self
            .0
            .iter()
            .zip(before.iter().zip(&after))
            .map(|((name, _), (b, a))| {
                format!("{name} {:.1}", (a - b).max(0.0) * 1e6 / ops.max(1.0))
            })
            .collect();
        format!("CPU us/{per}: {}", parts.join(", "))
    }
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
    let cpu = CpuOf::parse(&a.cpu_of)?;
    let work = dir.join(format!("__strait_bench_{}", std::process::id()));
    fs::create_dir(&work).with_context(|| format!("create {}", work.display()))?;
    let mut rows = vec![];
    let res = (|| -> Result<()> {
        if a.only == "all" || a.only == "data" {
            bench_data(&work, big, bs, a.small_file_count, small, &cpu, &mut rows)?;
        }
        if a.only == "all" || a.only == "meta" {
            bench_meta(&work, a.meta_files, a.threads, &cpu, &mut rows)?;
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

/// Write `len` bytes of `buf` repeated to `path`, `buf.len()` at a time, and fsync.
fn write_file(path: &Path, len: u64, buf: &[u8]) -> Result<()> {
    let mut f = File::create(path).with_context(|| format!("create {}", path.display()))?;
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])
            .with_context(|| format!("write {}", path.display()))?;
        left -= n as u64;
    }
    f.sync_all()
        .with_context(|| format!("fsync {}", path.display()))
}

/// Read `path` to its end, `bs` at a time; fails unless it holds `len` bytes.
fn read_file(path: &Path, len: u64, bs: usize) -> Result<()> {
    let mut f = File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut rbuf = vec![0u8; bs];
    let mut total = 0u64;
    loop {
        let n = f
            .read(&mut rbuf)
            .with_context(|| format!("read {}", path.display()))?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    if total != len {
        bail!("read {total} bytes of {}, wrote {len}", path.display());
    }
    Ok(())
}

/// Readers of the parallel read row, one file each.
const PARALLEL_READERS: usize = 8;

fn bench_data(
    work: &Path,
    big: u64,
    bs: usize,
    n_small: usize,
    small: usize,
    cpu: &CpuOf,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let buf: Vec<u8> = (0..bs).map(|i| (i * 131 % 251) as u8).collect();
    let mib = big as f64 / (1 << 20) as f64;
    let path = work.join("big");
    let t = Instant::now();
    let ((), used) = cpu.measure("MiB", || write_file(&path, big, &buf).map(|()| ((), mib)))?;
    let secs = t.elapsed().as_secs_f64();
    rows.push(Row {
        name: "write big file",
        value: mib_s(big, secs),
        unit: "MiB/s",
        detail: format!(
            "{} in {secs:.2} s, {bs} B writes; {used}",
            strait_ids::units::human_bytes(big)
        ),
    });
    // cold: nothing of the file in the page cache (nor in any cache of the file system's
    // that drop_caches reaches); warm: read again at once, the way a data set or a model is
    // read a second time
    for (name, drop) in [("read big file", true), ("read big file (warm)", false)] {
        if drop {
            drop_caches();
        }
        let t = Instant::now();
        let ((), used) = cpu.measure("MiB", || read_file(&path, big, bs).map(|()| ((), mib)))?;
        let secs = t.elapsed().as_secs_f64();
        rows.push(Row {
            name,
            value: mib_s(big, secs),
            unit: "MiB/s",
            detail: format!(
                "{} in {secs:.2} s, {bs} B reads; {used}",
                strait_ids::units::human_bytes(big)
            ),
        });
    }
    fs::remove_file(&path)?;

    // several readers at once, a file each (the same bytes in all: big / readers each)
    let each = (big / PARALLEL_READERS as u64).max(1);
    let paths: Vec<PathBuf> = (0..PARALLEL_READERS)
        .map(|k| work.join(format!("part{k}")))
        .collect();
    for p in &paths {
        write_file(p, each, &buf)?;
    }
    drop_caches();
    let t = Instant::now();
    let ((), used) = cpu.measure("MiB", || {
        let errors: Vec<String> = std::thread::scope(|sc| {
            let hs: Vec<_> = paths
                .iter()
                .map(|p| sc.spawn(move || read_file(p, each, bs)))
                .collect();
            hs.into_iter()
                .filter_map(|h| match h.join() {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(format!("{e:#}")),
                    Err(_) => Some("a reader panicked".to_string()),
                })
                .collect()
        });
        match errors.first() {
            Some(e) => bail!("{e}"),
            None => Ok((
                (),
                (each * PARALLEL_READERS as u64) as f64 / (1 << 20) as f64,
            )),
        }
    })?;
    let secs = t.elapsed().as_secs_f64();
    rows.push(Row {
        name: "read 8 files, 8 threads",
        value: mib_s(each * PARALLEL_READERS as u64, secs),
        unit: "MiB/s",
        detail: format!(
            "{PARALLEL_READERS} x {}, cold, in {secs:.2} s; {used}",
            strait_ids::units::human_bytes(each)
        ),
    });
    for p in &paths {
        fs::remove_file(p)?;
    }

    let dir = work.join("small");
    fs::create_dir(&dir)?;
    let data: Vec<u8> = (0..small).map(|i| (i * 7 % 253) as u8).collect();
    let t = Instant::now();
    let ((), used) = cpu.measure("file", || {
        for i in 0..n_small {
            let mut f = File::create(dir.join(format!("f{i}")))?;
            f.write_all(&data)?;
        }
        Ok(((), n_small as f64))
    })?;
    let secs = t.elapsed().as_secs_f64();
    rows.push(Row {
        name: "write small files",
        value: n_small as f64 / secs,
        unit: "files/s",
        detail: format!(
            "{n_small} x {}, {:.2} ms/file; {used}",
            strait_ids::units::human_bytes(small as u64),
            secs * 1e3 / n_small as f64
        ),
    });
    drop_caches();
    let t = Instant::now();
    let ((), used) = cpu.measure("file", || {
        let mut rbuf = Vec::with_capacity(small);
        for i in 0..n_small {
            rbuf.clear();
            File::open(dir.join(format!("f{i}")))?.read_to_end(&mut rbuf)?;
            if rbuf != data {
                bail!("small file f{i} reads back different bytes");
            }
        }
        Ok(((), n_small as f64))
    })?;
    let secs = t.elapsed().as_secs_f64();
    rows.push(Row {
        name: "read small files",
        value: n_small as f64 / secs,
        unit: "files/s",
        detail: format!("{:.2} ms/file; {used}", secs * 1e3 / n_small as f64),
    });
    let t = Instant::now();
    let ((), used) = cpu.measure("file", || {
        for i in 0..n_small {
            fs::metadata(dir.join(format!("f{i}")))?;
        }
        Ok(((), n_small as f64))
    })?;
    let secs = t.elapsed().as_secs_f64();
    rows.push(Row {
        name: "stat small files",
        value: n_small as f64 / secs,
        unit: "files/s",
        detail: format!("{:.3} ms/file; {used}", secs * 1e3 / n_small as f64),
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

pub(crate) fn bench_meta(
    work: &Path,
    n: usize,
    threads: usize,
    cpu: &CpuOf,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let dirs: Vec<PathBuf> = (0..threads).map(|k| work.join(format!("m{k}"))).collect();
    for d in &dirs {
        fs::create_dir(d)?;
    }
    let name = |i: usize| dirs[i % threads].join(format!("file{i}"));
    let renamed = |i: usize| dirs[i % threads].join(format!("moved{i}"));
    let detail = format!("{n} files, {threads} threads");
    let mut row =
        |label: &'static str, op: &(dyn Fn(usize) -> std::io::Result<()> + Sync)| -> Result<()> {
            let (ops, used) = cpu.measure("op", || Ok((parallel(n, threads, op)?, n as f64)))?;
            rows.push(Row {
                name: label,
                value: ops,
                unit: "ops/s",
                detail: format!("{detail}; {used}"),
            });
            Ok(())
        };
    row("create", &|i| File::create(name(i)).map(|_| ()))?;
    row("stat", &|i| fs::metadata(name(i)).map(|_| ()))?;
    // The stat above may be answered by the kernel's entry cache (entries live for the
    // mount's TTL after the create); this one reaches the file system.
    if drop_caches() {
        row("stat (cold cache)", &|i| fs::metadata(name(i)).map(|_| ()))?;
    }
    row("rename", &|i| fs::rename(name(i), renamed(i)))?;
    row("unlink", &|i| fs::remove_file(renamed(i)))?;
    Ok(())
}
