//! `strait-lab`: strait's test kit, kept out of the product binary. `strait-lab chaos run`
//! runs the Jepsen-style harness, `strait-lab netns` rehearses deploy/README.md in network
//! namespaces; both run the `strait` program beside this one (or `--strait PATH`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

mod cli;

#[derive(Parser)]
#[command(
    name = "strait-lab",
    version,
    about = "strait's test kit: the chaos harness and the deployment rehearsal"
)]
struct Lab {
    /// The `strait` program the cluster runs (default: `strait` beside this program).
    #[arg(long, global = true, env = "STRAIT_BIN")]
    strait: Option<PathBuf>,
    /// Log filter of this program (as RUST_LOG).
    #[arg(long, global = true, env = "STRAIT_LOG", default_value = "warn")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The Jepsen-style harness: a two-region cluster, a workload, a seeded nemesis, checkers.
    Chaos(cli::chaos::Args),
    /// deploy/README.md's three hosts as network namespaces (a1 10.0.1.10, b1 10.0.2.10, c1
    /// 10.0.3.10), set up as the guide says from deploy/'s files; Ctrl-C or SIGTERM removes
    /// everything. Needs root, iproute2, nftables and garage.
    Netns(cli::netns::Args),
}

fn main() {
    let lab = Lab::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&lab.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let strait = lab.strait.as_deref();
    let result = match lab.command {
        Command::Chaos(a) => cli::chaos::run(a, strait),
        Command::Netns(a) => cli::netns::run(a, strait),
    };
    if let Err(e) = result {
        eprintln!("strait-lab: {e:#}");
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
        Lab::command().debug_assert();
    }
}
