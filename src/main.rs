//! The `strait` command: parses the command line and dispatches. Commands live in `cmd/`.

mod cmd;
mod telemetry;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "strait",
    version,
    about = "A distributed POSIX file system mounted in several regions at once"
)]
struct Cli {
    /// Log filter (error, warn, info, debug, trace or a tracing directive).
    #[arg(long, global = true, env = "STRAIT_LOG", default_value = "info")]
    log: String,
    /// Export traces to this OTLP/gRPC endpoint (for example http://127.0.0.1:4317).
    #[arg(long, global = true, env = "STRAIT_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    #[command(subcommand)]
    command: Command,
}

// parsed once per run: the size of the largest command's flags costs nothing worth a box
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Create a file system: write its settings and root directory into a metadata engine.
    Format(cmd::format::Args),
    /// Mount a file system with FUSE.
    Mount(cmd::mount::Args),
    /// Run the primary site daemon: serve the metadata of a file system to the region's mounts.
    Primary(cmd::primary::Args),
    /// Run a replicator node (Raft over the change log), or manage the replicator cluster.
    Replicator(cmd::replicator::Args),
    /// Run a mirror site daemon (it follows the primary through the replicator), or show
    /// mirrors' state and lag (`strait mirror status`).
    Mirror(Box<cmd::mirror::Args>),
    /// Write a consistent snapshot of a file system's metadata to a file.
    Dump(cmd::dump::DumpArgs),
    /// Load a dump, or a metadata backup from an object store, into an empty metadata engine.
    Load(cmd::dump::LoadArgs),
    /// List the metadata backups in an object store, or take one now.
    Backup(cmd::backup::Args),
    /// Directory quotas: set, get, list, delete, check (space and inodes under a directory).
    Quota(cmd::quota::Args),
    /// The trash: list, restore or purge what was deleted; show or set its retention.
    Trash(cmd::trash::Args),
    /// Copy a file or a tree in the metadata only: the clone shares its source's blocks.
    Clone(cmd::clone::Args),
    /// Two regions on this machine (primary, replicator, mirror, fault proxies), mounted.
    Dev(cmd::dev::Args),
    /// Unmount a strait mount and wait for its process to finish.
    Umount(cmd::mount::UmountArgs),
    /// Show a file system's settings, usage, sessions and change-log position.
    Status(cmd::status::Args),
    /// Print the change records of the outbox.
    Changelog(cmd::changelog::Args),
    /// Check a file system's metadata; print its digest.
    Fsck(cmd::fsck::Args),
    /// Delete the blocks of dead slices now (a mount also does this in the background), then
    /// the orphan objects no slice references, older than a grace.
    Gc(cmd::gc::Args),
    /// Copy the blocks of some paths into a mirror's region now, ahead of its copy queue
    /// (before a job reads them there).
    Warmup(cmd::warmup::Args),
    /// Benchmark a mounted directory (strait's or any other file system's), or the block
    /// cache against the crates that could replace it (`strait bench cache`).
    Bench(strait_bench::BenchArgs),
    /// Create a CA, issue certificates naming their holders' roles, make tokens.
    Certs(cmd::certs::Args),
}

/// jemalloc, as TiKV and Neon use: it keeps freed memory for reuse, where glibc's malloc gave
/// each 4 MiB block buffer back to the kernel and had it fault in and zeroed again at the next
/// block (a sixth of a mount's CPU time reading blocks across regions; docs/benchmarks/mirror.md).
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let cli = Cli::parse();
    // two TLS crypto back ends are linked (ring for gRPC, aws-lc-rs through the S3 SDK):
    // name the one rustls uses by default
    strait_auth::use_ring_for_tls();
    let service = match &cli.command {
        Command::Primary(_) => "strait-primary",
        Command::Replicator(_) => "strait-replicator",
        Command::Mirror(_) => "strait-mirror",
        Command::Mount(_) => "strait-mount",
        _ => "strait",
    };
    // the primary may name its endpoint in its configuration file instead
    let otlp = match &cli.command {
        Command::Primary(a) => a.otlp_endpoint(cli.otlp_endpoint.as_deref()),
        _ => cli.otlp_endpoint.clone(),
    };
    let _telemetry = match telemetry::init(&cli.log, otlp.as_deref(), service) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("strait: {e:#}");
            std::process::exit(1);
        }
    };
    let result = match cli.command {
        Command::Format(a) => cmd::format::run(a),
        Command::Mount(a) => cmd::mount::run(a),
        Command::Umount(a) => cmd::mount::umount(a),
        Command::Primary(a) => cmd::primary::run(a),
        Command::Replicator(a) => cmd::replicator::run(a),
        Command::Mirror(a) => cmd::mirror::run(*a),
        Command::Dump(a) => cmd::dump::dump(a),
        Command::Load(a) => cmd::dump::load(a),
        Command::Backup(a) => cmd::backup::run(a),
        Command::Quota(a) => cmd::quota::run(a),
        Command::Trash(a) => cmd::trash::run(a),
        Command::Clone(a) => cmd::clone::run(a),
        Command::Dev(a) => cmd::dev::run(a),
        Command::Status(a) => cmd::status::run(a),
        Command::Changelog(a) => cmd::changelog::run(a),
        Command::Fsck(a) => cmd::fsck::run(a),
        Command::Gc(a) => cmd::gc::run(a),
        Command::Warmup(a) => cmd::warmup::run(a),
        Command::Bench(a) => strait_bench::run(a),
        Command::Certs(a) => cmd::certs::run(a),
    };
    if let Err(e) = result {
        eprintln!("strait: {e:#}");
        drop(_telemetry);
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every command's definition passes clap's own checks (a release build skips them).
    #[test]
    fn command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// `strait bench cache` is the cache benchmark; any other word is the directory of
    /// `strait bench DIR`.
    #[test]
    fn bench_takes_a_directory_or_cache() {
        let parse = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Command::Bench(b) => b,
            _ => panic!("not the bench command"),
        };
        let b = parse(&["strait", "bench", "cache", "--seconds", "1"]);
        assert!(matches!(b.what, Some(strait_bench::What::Cache(c)) if c.seconds == 1.0));
        let b = parse(&["strait", "bench", "--threads", "2", "/mnt/x"]);
        assert!(b.what.is_none());
        assert_eq!(b.fs.dir.as_deref(), Some(std::path::Path::new("/mnt/x")));
        assert!(Cli::try_parse_from(["strait", "bench"]).is_err());
    }
}
