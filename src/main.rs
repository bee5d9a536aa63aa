//! The `strait` command: parses the command line and dispatches. Commands live in `cmd/`.

mod cmd;

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
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a file system: write its settings and root directory into a metadata engine.
    Format(cmd::format::Args),
    /// Mount a file system with FUSE.
    Mount(cmd::mount::Args),
    /// Unmount a strait mount and wait for its process to finish.
    Umount(cmd::mount::UmountArgs),
    /// Show a file system's settings, usage, sessions and change-log position.
    Status(cmd::status::Args),
    /// Print the change records of the outbox.
    Changelog(cmd::changelog::Args),
    /// Check a file system's metadata; print its digest.
    Fsck(cmd::fsck::Args),
    /// Delete the blocks of dead slices now (a mount also does this in the background).
    Gc(cmd::gc::Args),
    /// Benchmark a mounted directory (strait's or any other file system's).
    Bench(cmd::bench::Args),
}

fn main() {
    let cli = Cli::parse();
    cmd::init_logging(&cli.log);
    let result = match cli.command {
        Command::Format(a) => cmd::format::run(a),
        Command::Mount(a) => cmd::mount::run(a),
        Command::Umount(a) => cmd::mount::umount(a),
        Command::Status(a) => cmd::status::run(a),
        Command::Changelog(a) => cmd::changelog::run(a),
        Command::Fsck(a) => cmd::fsck::run(a),
        Command::Gc(a) => cmd::gc::run(a),
        Command::Bench(a) => cmd::bench::run(a),
    };
    if let Err(e) = result {
        eprintln!("strait: {e:#}");
        std::process::exit(1);
    }
}
