//! `strait gc`: delete the blocks of dead slices whose delay has passed, then the orphan
//! objects (blocks no slice references, older than a grace), in an engine this process
//! opens, or by asking a site daemon (a primary keeps what its mirrors still need; a mirror
//! sweeps its region's store against its own metadata).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use strait_fs_core::meta::{Meta, MetaOptions};
use strait_fs_core::vfs::orphans::{self, References, SweepOptions, SweepStats};

/// Progress lines at most this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

#[derive(clap::Args)]
pub struct Args {
    /// Metadata engine (rocksdb:///path, redis://host:port/db), or a site daemon
    /// (strait://host:port), which runs the pass itself
    pub meta_url: String,
    /// For strait://: a token of the role admin (or a client certificate naming it), and TLS.
    #[command(flatten)]
    pub client: super::creds::ClientArgs,
    /// How old an object no slice references must be before it is deleted (e.g. 1h, 30m,
    /// 0). A block is uploaded before its slice commits, so the grace must exceed the
    /// longest time a mount holds written blocks uncommitted (until flush, fsync or close);
    /// 0 only when nothing writes to the file system.
    #[arg(long, default_value = "1h")]
    pub orphan_grace: String,
    /// Count the orphan objects and their bytes, delete nothing (dead slices are left for
    /// the next pass too).
    #[arg(long)]
    pub dry_run: bool,
    /// Leave orphan objects alone: only delete the blocks of dead slices.
    #[arg(long)]
    pub skip_orphans: bool,
    /// Print the orphan sweep's result as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// What the orphan sweep found, as printed.
#[derive(Debug, Default, Serialize)]
struct Report {
    store: String,
    version: u64,
    referenced_slices: u64,
    listed: u64,
    listed_bytes: u64,
    referenced: u64,
    young: u64,
    young_bytes: u64,
    foreign: u64,
    orphans: u64,
    orphan_bytes: u64,
    deleted: u64,
    deleted_bytes: u64,
    failed: u64,
    dry_run: bool,
    grace_ms: u64,
}

impl Report {
    fn from_stats(st: &SweepStats, store: String, refs: &References, a: &Options) -> Self {
        let p = strait_server::orphans::progress(st, &store, refs, a.dry_run, false);
        Self::from_wire(&p, a)
    }

    fn from_wire(p: &strait_proto::site::SweepProgress, a: &Options) -> Self {
        Report {
            store: p.store.clone(),
            version: p.version,
            referenced_slices: p.referenced_slices,
            listed: p.listed,
            listed_bytes: p.listed_bytes,
            referenced: p.referenced,
            young: p.young,
            young_bytes: p.young_bytes,
            foreign: p.foreign,
            orphans: p.orphans,
            orphan_bytes: p.orphan_bytes,
            deleted: p.deleted,
            deleted_bytes: p.deleted_bytes,
            failed: p.failed,
            dry_run: p.dry_run,
            grace_ms: a.grace_ms,
        }
    }

    fn progress_line(&self) -> String {
        format!(
            "listed {} objects ({}): {} referenced, {} younger than the grace, {} orphans ({}){}",
            self.listed,
            super::human_bytes(self.listed_bytes),
            self.referenced,
            self.young,
            self.orphans,
            super::human_bytes(self.orphan_bytes),
            if self.dry_run {
                String::new()
            } else {
                format!(", {} deleted", self.deleted)
            }
        )
    }

    fn print(&self, json: bool) -> Result<()> {
        if json {
            println!("{}", serde_json::to_string(self)?);
            return Ok(());
        }
        let grace = duration(self.grace_ms);
        if self.dry_run {
            println!(
                "{}: {} orphan objects ({}) unreferenced and older than {grace} would be deleted (dry run)",
                self.store,
                self.orphans,
                super::human_bytes(self.orphan_bytes)
            );
        } else {
            println!(
                "{}: deleted {} orphan objects ({}) unreferenced and older than {grace}{}",
                self.store,
                self.deleted,
                super::human_bytes(self.deleted_bytes),
                if self.failed > 0 {
                    format!("; {} could not be deleted (see the log)", self.failed)
                } else {
                    String::new()
                }
            );
        }
        println!(
            "  {} objects listed ({}): {} blocks of the {} slices referenced at version {}, {} \
             younger than the grace ({}), {} not block keys",
            self.listed,
            super::human_bytes(self.listed_bytes),
            self.referenced,
            self.referenced_slices,
            self.version,
            self.young,
            super::human_bytes(self.young_bytes),
            self.foreign
        );
        Ok(())
    }
}

/// `ms` in the largest unit that divides it: `0`, `250ms`, `90s`, `30m`, `1h`, `2d`.
fn duration(ms: u64) -> String {
    if ms == 0 {
        return "0".into();
    }
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// The flags the sweep needs, parsed.
struct Options {
    grace_ms: u64,
    dry_run: bool,
}

pub fn run(a: Args) -> Result<()> {
    let opts = Options {
        grace_ms: super::parse_duration_ms(&a.orphan_grace).context("--orphan-grace")?,
        dry_run: a.dry_run,
    };
    if let Some(addr) = a.meta_url.strip_prefix("strait://") {
        return on_daemon(addr.trim_end_matches('/'), &a, &opts);
    }
    let kv = strait_fs_core::kv::open(&a.meta_url)?;
    let format = Meta::load_format(kv.as_ref())?;
    let meta = Meta::open(kv.clone(), MetaOptions::default())?;
    let rt = super::runtime()?;
    let store = rt.block_on(strait_fs_core::object::open(&format.data_url))?;
    if !a.dry_run {
        let mut total = 0;
        loop {
            let n = strait_fs_core::vfs::gc::gc_once(&meta, &store, rt.handle())?;
            total += n;
            if n == 0 {
                break;
            }
            eprintln!("deleted the blocks of {total} dead slices so far");
        }
        let line = format!("deleted the blocks of {total} dead slices");
        say(a.json, &line);
    }
    if a.skip_orphans {
        return Ok(());
    }
    // an object's age counts to when the references were read: take the time first
    let read_at = strait_fs_core::clock::now();
    let refs = References::read(kv.as_ref())?;
    eprintln!(
        "{} slices referenced at version {}; listing {}",
        refs.len(),
        refs.version,
        store.describe()
    );
    let mut last = Instant::now();
    let st = rt.block_on(orphans::sweep(
        &store,
        &refs,
        format.block_size,
        read_at,
        SweepOptions {
            grace: Duration::from_millis(opts.grace_ms),
            dry_run: opts.dry_run,
        },
        orphans::SweepCalls {
            progress: &mut |st| {
                if last.elapsed() >= PROGRESS_EVERY {
                    last = Instant::now();
                    let r = Report::from_stats(st, String::new(), &References::default(), &opts);
                    eprintln!("{}", r.progress_line());
                }
            },
            deleted: &mut |_, _| {},
            gate: &|| None,
        },
    ))?;
    Report::from_stats(&st, store.describe(), &refs, &opts).print(a.json)
}

fn on_daemon(addr: &str, a: &Args, opts: &Options) -> Result<()> {
    let creds = a.client.credentials()?;
    let rt = super::runtime()?;
    rt.block_on(async {
        let primary = strait_mirror::follower::Primary::new(addr, &creds)?;
        let mut c = primary.site();
        if !a.dry_run {
            let r = tokio::time::timeout(
                Duration::from_secs(600),
                c.gc(strait_proto::site::Empty {}),
            )
            .await
            .with_context(|| format!("{addr} did not finish the pass within 600 s"))?;
            let line = match r.map(|r| r.into_inner()) {
                Ok(r) if r.has_mirrors => format!(
                    "deleted the blocks of {} dead slices; kept {} that a mirror may still read (the mirrors have applied up to version {})",
                    r.purged, r.held, r.horizon
                ),
                Ok(r) => format!("deleted the blocks of {} dead slices", r.purged),
                // a mirror: dead slices are the primary's to delete
                Err(s) if s.code() == tonic::Code::Unimplemented => {
                    format!("{addr}: {}", s.message())
                }
                Err(s) => bail!("{addr}: {}", s.message()),
            };
            // stdout holds the sweep's result alone under --json
            say(a.json, &line);
        }
        if a.skip_orphans {
            return Ok(());
        }
        let mut stream = c
            .sweep_orphans(strait_proto::site::SweepRequest {
                grace_ms: Some(opts.grace_ms),
                dry_run: opts.dry_run,
            })
            .await
            .map_err(|s| anyhow::anyhow!("{addr}: sweep orphan objects: {}", s.message()))?
            .into_inner();
        let mut last = Instant::now();
        loop {
            let next = stream
                .message()
                .await
                .map_err(|s| anyhow::anyhow!("{addr}: sweep orphan objects: {}", s.message()))?;
            let Some(p) = next else {
                bail!("{addr}: the sweep ended without its result");
            };
            let r = Report::from_wire(&p, opts);
            if p.done {
                return r.print(a.json);
            }
            if last.elapsed() >= PROGRESS_EVERY {
                last = Instant::now();
                eprintln!("{}", r.progress_line());
            }
        }
    })
}

/// A result line: on stdout, unless stdout holds the JSON result alone (then on stderr).
fn say(json: bool, line: &str) {
    if json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}
