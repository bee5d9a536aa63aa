//! `strait replicator`: run a replicator node, and manage the cluster (init, add-node,
//! remove-node, status).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use strait_auth::{Conn, Role, Security};
use strait_proto::replicator as pb;
use strait_proto::replicator::replicator_client::ReplicatorClient;
use strait_replicator::node::{Node, NodeAuth, NodeConfig};

use super::creds::ClientArgs;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    pub action: Option<Action>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file: id, listen, data_dir, heartbeat_ms, snapshot_every, peers.
    #[arg(long, env = "STRAIT_REPLICATOR_CONFIG")]
    pub config: Option<PathBuf>,
    /// Check the node's configuration (file, flags, the token and certificate files it
    /// names), print a summary and exit; nothing is opened or started.
    #[arg(long)]
    pub check_config: bool,
    /// This node's id (unique in the cluster, not 0).
    #[arg(long)]
    pub id: Option<u64>,
    /// Address to serve on.
    #[arg(long)]
    pub listen: Option<String>,
    /// Directory of the node's RocksDB.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Address of the HTTP endpoint serving `/metrics` (Prometheus) and `/health`; empty
    /// (the default) serves none.
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Reach peer ID at HOST:PORT instead of its membership address (ID=HOST:PORT; repeat).
    #[arg(long = "peer")]
    pub peers: Vec<String>,
    /// Accept TOKEN for ROLE (ROLE=TOKEN; repeat): primary, mirror, admin, peer. The peer
    /// token is also what this node presents to the others. Prefer `token_files` in the
    /// configuration file: a command line is visible to others.
    #[arg(long = "token", value_name = "ROLE=TOKEN")]
    pub tokens: Vec<String>,
    /// Accept the token in FILE's first line for ROLE (ROLE=FILE; repeat).
    #[arg(long = "token-file", value_name = "ROLE=FILE")]
    pub token_files: Vec<String>,
    /// This node's certificate chain (PEM): it serves TLS, and presents it to its peers.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// Mutual TLS: the CA client certificates must chain to (their OU names the role).
    #[arg(long)]
    pub tls_client_ca: Option<PathBuf>,
    /// The CA the other nodes' certificates chain to (to reach them over TLS).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// Allow plain-text gRPC on addresses other than loopback (tokens cross the network
    /// readable): for a network you trust only.
    #[arg(long)]
    pub insecure_plaintext: bool,
}

#[derive(clap::Subcommand)]
pub enum Action {
    /// Form a new cluster from its first members (run once, against any of them).
    Init {
        #[command(flatten)]
        client: ClientArgs,
        /// A node of the cluster to send the call to.
        #[arg(long)]
        addr: String,
        /// A member, as ID=HOST:PORT; repeat for each.
        #[arg(long = "member", required = true)]
        members: Vec<String>,
    },
    /// Add a node: first as a learner that catches up, then as a voter.
    AddNode {
        #[command(flatten)]
        client: ClientArgs,
        #[arg(long)]
        addr: String,
        #[arg(long)]
        id: u64,
        /// The new node's address.
        #[arg(long)]
        node_addr: String,
        /// Keep it a learner (replicates, does not vote).
        #[arg(long)]
        learner: bool,
    },
    /// Remove a node from the cluster.
    RemoveNode {
        #[command(flatten)]
        client: ClientArgs,
        #[arg(long)]
        addr: String,
        #[arg(long)]
        id: u64,
    },
    /// Leader, term, members with their match index, log positions and mirror cursors.
    Status {
        #[command(flatten)]
        client: ClientArgs,
        #[arg(long)]
        addr: String,
    },
    /// Set the retention caps: the log keeps at most this much for mirrors that fall behind
    /// (a mirror past a cap must bootstrap again).
    Retention {
        #[command(flatten)]
        client: ClientArgs,
        #[arg(long)]
        addr: String,
        /// Most bytes of records kept, e.g. 64G, 500M, 1000000 (K, M, G, T are powers of 1024).
        #[arg(long)]
        max_bytes: String,
        /// Oldest records kept, by the primary's clock, e.g. 7d, 12h, 30m, 90s.
        #[arg(long)]
        max_age: String,
    },
    /// Drop the cursor of a mirror taken out of service, so it no longer holds back the log's
    /// purge or the primary's GC (a mirror that comes back later bootstraps again if the log
    /// it needs was purged).
    ForgetMirror {
        #[command(flatten)]
        client: ClientArgs,
        #[arg(long)]
        addr: String,
        /// The mirror's id, as `replicator status` lists its cursor.
        id: String,
    },
    /// Benchmark a three-node cluster started here (loopback, RocksDB in a temporary
    /// directory): committed records/s with batching, then commit latency at half that rate;
    /// with --delay-ms, every link between nodes gets that one-way delay (fault proxy).
    Bench(strait_bench::replicator::BenchArgs),
    /// The disk's floor for the benchmark's commit latency: three threads append and
    /// fdatasync a file each, an append commits on two of them (or, with --leader-first, on
    /// the leader's and then a follower's, openraft 0.9's order); no Raft, RPC or database.
    Floor(strait_bench::floor::FloorArgs),
}

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct FileConfig {
    id: Option<u64>,
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    metrics_listen: Option<String>,
    heartbeat_ms: Option<u64>,
    snapshot_every: Option<u64>,
    /// `{ "1" = "host:port" }`: addresses this node uses for peers instead of their
    /// membership addresses.
    peers: BTreeMap<String, String>,
    /// `[tokens]`, `[token_files]`, `tls_cert_file`, `tls_key_file`, `tls_client_ca_file`,
    /// `tls_ca_file`: as in every daemon.
    #[serde(flatten)]
    security: Security,
}

/// The node's security settings from its file and flags (flags win).
fn merged_security(mut sec: Security, a: &ServeArgs) -> Result<Security> {
    super::daemon_flags::lay_over(
        &mut sec,
        ("--token", &a.tokens),
        ("--token-file", &a.token_files),
        [&a.tls_cert, &a.tls_key, &a.tls_client_ca, &a.tls_ca],
    )?;
    if a.insecure_plaintext {
        sec.insecure_plaintext = true;
    }
    sec.validate()?;
    Ok(sec)
}

/// What the node accepts and presents.
fn node_auth(id: u64, sec: &Security) -> Result<NodeAuth> {
    if sec.tokens.contains_key(&Role::Mount) || sec.token_files.contains_key(&Role::Mount) {
        bail!("a replicator node has no calls for the role mount: give tokens for primary, mirror, admin and peer");
    }
    let tokens = sec.accepted(None, &[])?;
    let peer_token = match (
        sec.token_files.get(&Role::Peer),
        sec.tokens.get(&Role::Peer),
    ) {
        (Some(f), _) => Some(strait_auth::read_token_file(f)?),
        (None, t) => t.and_then(|l| l.first()).map(str::to_string),
    };
    if tokens.is_empty() && !sec.mutual_tls() {
        bail!(
            "node {id} has no way to authenticate its callers: give a token per role \
             (--token ROLE=TOKEN or [tokens] for primary, mirror, admin, peer) or a client CA \
             (--tls-client-ca, mutual TLS); anyone who reaches an open node can rewrite the log"
        );
    }
    let tls = sec.server_tls()?;
    if tls.is_some() && sec.tls_ca_file.is_none() {
        bail!("node {id} serves TLS: give tls_ca_file (--tls-ca), the CA its peers' certificates chain to, so it can reach them");
    }
    if peer_token.is_none() && !sec.mutual_tls() {
        bail!("node {id} has no peer token (--token peer=...) and no client certificate to reach the other nodes with");
    }
    Ok(NodeAuth {
        tokens,
        tls,
        mutual_tls: sec.mutual_tls(),
        peer_credentials: sec.credentials(peer_token.as_deref())?,
    })
}

pub fn run(a: Args) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .thread_name("strait-replicator")
        .enable_all()
        .build()?;
    match a.action {
        None => rt.block_on(serve(a.serve)),
        Some(action) => rt.block_on(admin(action)),
    }
}

async fn serve(a: ServeArgs) -> Result<()> {
    let file: FileConfig = match &a.config {
        Some(p) => toml::from_str(
            &std::fs::read_to_string(p)
                .with_context(|| format!("read the configuration file {}", p.display()))?,
        )
        .with_context(|| format!("parse {}", p.display()))?,
        None => FileConfig::default(),
    };
    let sec = merged_security(file.security.clone(), &a)?;
    let id =
        a.id.or(file.id)
            .context("no node id: give --id or `id` in the configuration file")?;
    if id == 0 {
        bail!("node ids start at 1");
    }
    let listen: SocketAddr = a
        .listen
        .or(file.listen)
        .unwrap_or_else(|| "127.0.0.1:7430".into())
        .parse()
        .context("the listen address")?;
    let data_dir = a
        .data_dir
        .or(file.data_dir)
        .context("no data directory: give --data-dir or `data_dir`")?;
    let mut cfg = NodeConfig::new(id, listen, data_dir);
    cfg.auth = node_auth(id, &sec)?;
    let described = sec.describe();
    if let Some(h) = file.heartbeat_ms {
        if !(10..=10_000).contains(&h) {
            bail!("heartbeat_ms is {h}; it must be between 10 and 10000");
        }
        cfg.heartbeat_ms = h;
    }
    if let Some(s) = file.snapshot_every {
        cfg.snapshot_every = s.max(1);
    }
    let from_file = file.peers.iter().map(|(k, v)| format!("{k}={v}"));
    for p in from_file.chain(a.peers.iter().cloned()) {
        let (id, addr) = parse_member(&p).with_context(|| format!("peer {p:?}"))?;
        cfg.peers.insert(id, addr);
    }
    // its listener, and the peers it was told of (it reaches the others at their membership
    // addresses, which their own nodes' listeners are)
    let peers: Vec<String> = cfg.peers.values().map(|a| a.to_string()).collect();
    let calls: Vec<(&str, &str)> = peers.iter().map(|a| ("to a peer", a.as_str())).collect();
    let links = sec.links(&cfg.listen.to_string(), &calls);
    sec.refuse_exposed(&format!("replicator node {id}"), &links)?;
    let metrics_listen = a.metrics_listen.or(file.metrics_listen).unwrap_or_default();
    if a.check_config {
        println!(
            "strait replicator: the configuration of node {id} is valid: listen {}, data {}, \
             metrics {}, heartbeat {} ms, snapshot every {} entries, peers [{}] ({described})",
            cfg.listen,
            cfg.data_dir.display(),
            if metrics_listen.is_empty() {
                "off"
            } else {
                &metrics_listen
            },
            cfg.heartbeat_ms,
            cfg.snapshot_every,
            cfg.peers
                .iter()
                .map(|(i, a)| format!("{i}={a}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        super::daemon_flags::print_links(&links);
        return Ok(());
    }
    let node = Node::start(cfg).await?;
    strait_server::metrics::note_certificate_expiries(node.observer.tls_expiry(), &sec);
    let stop = tokio_util::sync::CancellationToken::new();
    let mut metrics_addr = None;
    if !metrics_listen.is_empty() {
        let l = tokio::net::TcpListener::bind(&metrics_listen)
            .await
            .with_context(|| format!("listen on {metrics_listen} for metrics"))?;
        metrics_addr = l.local_addr().ok();
        let (o, o2) = (node.observer.clone(), node.observer.clone());
        tokio::spawn(strait_server::metrics::serve(
            l,
            move || {
                let o = o.clone();
                async move { o.render() }
            },
            move || {
                let o = o2.clone();
                async move {
                    match o.health() {
                        (true, why) => (strait_server::metrics::StatusCode::OK, format!("{why}\n")),
                        (false, why) => (
                            strait_server::metrics::StatusCode::SERVICE_UNAVAILABLE,
                            format!("{why}\n"),
                        ),
                    }
                }
            },
            stop.clone(),
        ));
    }
    // one line on stdout, for scripts and tests that wait for the node
    println!(
        "strait replicator: node {id} serving on {} ({described}){}",
        node.addr,
        metrics_addr
            .map(|a| format!(", metrics on http://{a}/metrics"))
            .unwrap_or_default()
    );
    tracing::info!("node {id} serving on {} ({described})", node.addr);
    tokio::spawn(strait_server::wait_for_signal(stop.clone()));
    stop.cancelled().await;
    tracing::info!("shutting down");
    node.shutdown().await;
    Ok(())
}

async fn connect(addr: &str, client: &ClientArgs) -> Result<ReplicatorClient<Conn>> {
    let ch = strait_replicator_client::channel(addr, &client.credentials()?)
        .with_context(|| format!("connect to {addr:?}"))?;
    Ok(ReplicatorClient::new(ch))
}

/// `7d`, `12h`, `30m`, `90s`, `500ms`: a duration in milliseconds.
fn parse_age_ms(s: &str) -> Result<u64> {
    let v = super::parse_duration_ms(s)?;
    if v == 0 {
        bail!("{s:?}: the cap must be positive");
    }
    Ok(v)
}

/// A client for calls only the leader takes: it follows the leader named by `addr`'s node.
fn leader_client(addr: &str, client: &ClientArgs) -> Result<strait_replicator_client::LogClient> {
    strait_replicator_client::LogClient::new(&[addr.to_string()], &client.credentials()?)
        .map(|c| c.with_attempts(4))
        .map_err(|s| anyhow::anyhow!("{}", s.message()))
}

fn status_err(addr: &str, s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{addr}: {}", s.message())
}

/// `ID=HOST:PORT`.
fn parse_member(s: &str) -> Result<(u64, String)> {
    let (id, a) = s.split_once('=').context("expected ID=HOST:PORT")?;
    let id: u64 = id
        .parse()
        .with_context(|| format!("{id:?} is not a node id"))?;
    if id == 0 {
        bail!("node ids start at 1");
    }
    if a.rsplit_once(':')
        .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
    {
        bail!("{a:?} is not HOST:PORT");
    }
    Ok((id, a.to_string()))
}

async fn admin(action: Action) -> Result<()> {
    match action {
        Action::Init {
            addr,
            members,
            client,
        } => {
            let mut m = HashMap::new();
            for s in &members {
                let (id, a) = parse_member(s).with_context(|| format!("member {s:?}"))?;
                if m.insert(id, a).is_some() {
                    bail!("node {id} is named twice");
                }
            }
            connect(&addr, &client)
                .await?
                .init(pb::InitRequest { members: m })
                .await
                .map_err(|s| status_err(&addr, s))?;
            println!("initialised a cluster of {} nodes", members.len());
        }
        Action::AddNode {
            addr,
            id,
            node_addr,
            learner,
            client,
        } => {
            leader_client(&addr, &client)?
                .add_node(pb::AddNodeRequest {
                    id,
                    addr: node_addr.clone(),
                    learner_only: learner,
                })
                .await
                .map_err(|s| status_err(&addr, s))?;
            println!(
                "added node {id} at {node_addr} as a {}",
                if learner { "learner" } else { "voter" }
            );
        }
        Action::RemoveNode { addr, id, client } => {
            leader_client(&addr, &client)?
                .remove_node(id)
                .await
                .map_err(|s| status_err(&addr, s))?;
            println!("removed node {id}");
        }
        Action::Bench(b) => strait_bench::replicator::run(b).await?,
        Action::Floor(f) => tokio::task::spawn_blocking(move || strait_bench::floor::run(f))
            .await
            .context("the floor benchmark stopped")??,
        Action::Retention {
            addr,
            max_bytes,
            max_age,
            client,
        } => {
            let max_bytes = super::parse_size(&max_bytes)?;
            if max_bytes == 0 {
                bail!("--max-bytes must be positive");
            }
            let max_age_ms = parse_age_ms(&max_age)?;
            leader_client(&addr, &client)?
                .set_retention(pb::RetentionRequest {
                    max_bytes,
                    max_age_ms,
                })
                .await
                .map_err(|s| status_err(&addr, s))?;
            println!("retention set: at most {max_bytes} bytes, at most {max_age_ms} ms old");
        }
        Action::ForgetMirror { addr, id, client } => {
            leader_client(&addr, &client)?
                .forget_mirror(&id)
                .await
                .map_err(|s| status_err(&addr, s))?;
            println!("forgot mirror {id}'s cursor");
        }
        Action::Status { addr, client } => {
            let s = connect(&addr, &client)
                .await?
                .status(pb::Empty {})
                .await
                .map_err(|s| status_err(&addr, s))?
                .into_inner();
            let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
            println!("node        {} ({})", s.id, s.state);
            println!("leader      {}", opt(s.leader));
            println!("term        {}", s.term);
            println!(
                "raft log    last index {}, applied {}",
                opt(s.last_log_index),
                opt(s.applied_index)
            );
            println!(
                "change log  epoch {}, versions {}..={}",
                s.epoch, s.earliest_version, s.last_version
            );
            if let Some(p) = &s.primary {
                println!(
                    "promoted    epoch {} names {} at {} the primary{}",
                    p.epoch,
                    p.id,
                    p.addr,
                    if p.data_url.is_empty() {
                        String::new()
                    } else {
                        format!(" (store {})", p.data_url)
                    }
                );
            }
            if s.served_version > s.last_version {
                println!(
                    "early       versions up to {} are known committed at the leader and served \
                     before this node applies them",
                    s.served_version
                );
            }
            if let Some(r) = &s.retention {
                println!(
                    "retention   {} bytes held; caps {} bytes, {} s",
                    s.held_bytes,
                    r.max_bytes,
                    r.max_age_ms / 1000
                );
            }
            if let Some(h) = &s.heartbeat {
                println!(
                    "primary     clock {} ms, latest version {}",
                    h.primary_clock_ms, h.latest_version
                );
            }
            println!("members");
            for m in &s.members {
                println!(
                    "  {:>4}  {:<22} {:<8} matched {}",
                    m.id,
                    m.addr,
                    if m.voter { "voter" } else { "learner" },
                    opt(m.matched)
                );
            }
            let (primary, mirrors): (Vec<_>, Vec<_>) = s
                .cursors
                .iter()
                .partition(|c| c.mirror == strait_proto::replicator::PRIMARY_CURSOR);
            for c in primary {
                println!(
                    "primary's metadata on stable storage up to {} (the log keeps what is above it)",
                    c.applied_version
                );
            }
            if !mirrors.is_empty() {
                println!("mirrors");
                let age = s.retention.as_ref().map(|r| r.max_age_ms).unwrap_or(0);
                for c in &mirrors {
                    println!(
                        "  {:<24} applied {}{}{}",
                        c.mirror,
                        c.applied_version,
                        if c.needs_bootstrap {
                            " (needs bootstrap)"
                        } else {
                            ""
                        },
                        match c.position_age_ms {
                            Some(ms) => format!(", needs records from {} ago", human_ms(ms)),
                            None => String::new(),
                        }
                    );
                }
                for c in &mirrors {
                    if let Some(w) = cursor_warning(c, age) {
                        println!("warning: {w}");
                    }
                }
            }
        }
    }
    Ok(())
}

/// A cursor older than this is worth a warning.
const CURSOR_WARN_MS: u64 = 10 * 60 * 1000;

/// A duration as `3h12m`, `7m`, `42s`.
fn human_ms(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// A warning for a mirror's cursor that has held the log (and the primary's GC) back for long:
/// how long, what happens at the retention age `retention_age_ms`, and what an operator can do.
pub fn cursor_warning(
    c: &strait_proto::replicator::Cursor,
    retention_age_ms: u64,
) -> Option<String> {
    let age = c.position_age_ms?;
    if c.needs_bootstrap || age < CURSOR_WARN_MS {
        return None;
    }
    let left = retention_age_ms.saturating_sub(age);
    let fate = if retention_age_ms == 0 {
        String::new()
    } else if left == 0 {
        " it is past the log's retention age and will be dropped for a new bootstrap at the next purge;".to_string()
    } else {
        format!(
            " in about {} (the log's retention age, {}) the log will be purged past it and it must bootstrap again;",
            human_ms(left),
            human_ms(retention_age_ms)
        )
    };
    Some(format!(
        "mirror {} has not acknowledged past version {} for about {}: it holds the change log and \
         the primary's GC back;{fate} if it is gone for good, run `strait replicator forget-mirror {}`",
        c.mirror,
        c.applied_version,
        human_ms(age),
        c.mirror
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(age: Option<u64>, needs_bootstrap: bool) -> strait_proto::replicator::Cursor {
        strait_proto::replicator::Cursor {
            mirror: "b".into(),
            applied_version: 7,
            needs_bootstrap,
            position_age_ms: age,
        }
    }

    #[test]
    fn an_old_cursor_is_warned_about_with_what_will_happen() {
        let day = 24 * 3600 * 1000;
        assert_eq!(cursor_warning(&cursor(None, false), day), None);
        assert_eq!(cursor_warning(&cursor(Some(60_000), false), day), None);
        assert_eq!(
            cursor_warning(&cursor(Some(2 * 3600 * 1000), true), day),
            None
        );
        let w = cursor_warning(&cursor(Some(2 * 3600 * 1000), false), day).unwrap();
        assert!(w.contains("about 2h00m"), "{w}");
        assert!(w.contains("in about 22h00m"), "{w}");
        assert!(w.contains("forget-mirror b"), "{w}");
        let w = cursor_warning(&cursor(Some(2 * day), false), day).unwrap();
        assert!(w.contains("past the log's retention age"), "{w}");
    }
}
