//! `strait dev up`: two regions on this machine, in one command. Region A runs the primary
//! and replicator nodes 1 and 2; region B runs replicator node 3 and a mirror. Each region has
//! its own RocksDB metadata and its own object store, a local directory (`--store dir`, the
//! default) or a Garage S3 server (`--store garage`): the mirror copies blocks from A's store
//! into B's, and B's mounts read B's first. Traffic between the regions goes through fault
//! proxies with a configurable one-way delay and bandwidth cap; `strait dev fault` changes
//! them at run time (delay, bandwidth, partition, heal).
//!
//! Known simplifications:
//! - a proxy sits in front of each cross-region *listener*, so a connection delays both ways
//!   whichever region opened it;
//! - the bandwidth cap holds per proxy (per cross-region listener), not for all of them
//!   together;
//! - with `--store dir` the mirror reads region A's store as a directory, so block copies do
//!   not cross the proxies; with `--store garage` they do (the mirror reaches A's Garage
//!   through a proxy).

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strait_chaos::{Faults, Proxy};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(clap::Subcommand)]
pub enum Action {
    /// Start both regions (and mount both unless --no-mount); Ctrl-C or SIGTERM stops all.
    Up(UpArgs),
    /// Change the link between the regions of a running `dev up`.
    Fault(FaultArgs),
}

#[derive(clap::Args)]
pub struct UpArgs {
    /// Working directory (emptied first): region-a/, region-b/, logs, dev.json.
    #[arg(long, default_value = "/tmp/strait-dev")]
    pub dir: PathBuf,
    /// One-way delay between the regions, in ms.
    #[arg(long, default_value_t = 15)]
    pub delay_ms: u64,
    /// Do not mount the regions.
    #[arg(long)]
    pub no_mount: bool,
    /// The mirror's staleness window, ms.
    #[arg(long, default_value_t = 5_000)]
    pub window_ms: u64,
    /// The mirror's policy outside its window: forward, wait or serve.
    #[arg(long, default_value = "forward")]
    pub policy: String,
    /// Which replicator node the mirror subscribes to first: `local` (node 3, in its region)
    /// or `leader` (node 1, across the link).
    #[arg(long, default_value = "local")]
    pub source: String,
    /// The mirror's background block copy: eager or lazy.
    #[arg(long, default_value = "eager")]
    pub sync: String,
    /// Each region's object store: `dir` (a local directory) or `garage` (a Garage S3 server
    /// per region, which needs the `garage` program).
    #[arg(long, default_value = "dir")]
    pub store: String,
    /// Bandwidth cap between the regions, MB/s per proxy (0: none).
    #[arg(long, default_value_t = 0.0)]
    pub link_mb_s: f64,
    /// Stop by itself after this many seconds (0: run until a signal).
    #[arg(long, default_value_t = 0)]
    pub seconds: u64,
}

#[derive(clap::Args)]
pub struct FaultArgs {
    /// The working directory of the running `dev up`.
    #[arg(long, default_value = "/tmp/strait-dev")]
    pub dir: PathBuf,
    /// `partition`, `heal`, `delay=MS` or `bandwidth=MB_PER_S` (0: no cap).
    pub what: String,
}

/// What `dev up` writes to DIR/dev.json once everything runs.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
pub struct Topology {
    pub token: String,
    pub primary: String,
    pub mirror: String,
    pub primary_metrics: String,
    pub mirror_metrics: String,
    pub replicator: Vec<String>,
    pub control: String,
    pub mount_a: Option<PathBuf>,
    pub mount_b: Option<PathBuf>,
    /// Each region's object store (data URL) and how the mirror reaches A's.
    #[serde(default)]
    pub data_a: String,
    #[serde(default)]
    pub data_b: String,
    #[serde(default)]
    pub mirror_data_a: String,
}

pub fn run(a: Args) -> Result<()> {
    match a.action {
        Action::Up(u) => up(u),
        Action::Fault(f) => fault(f),
    }
}

fn free_addr() -> Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("find a free port")?;
    l.local_addr().context("find a free port")
}

struct Children {
    list: Vec<(String, Child)>,
    /// Environment of every child (the S3 credentials of `--store garage`).
    env: Vec<(String, String)>,
}

impl Children {
    fn spawn(&mut self, name: &str, log: &Path, args: &[String]) -> Result<()> {
        let f = std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        let mut cmd = Command::new(std::env::current_exe().context("this program's path")?);
        cmd.args(args)
            .envs(self.env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(f.try_clone().context("log file")?)
            .stderr(f)
            // a Ctrl-C at the terminal reaches `dev up` alone, which unmounts before it stops
            // the daemons; if `dev up` dies, the daemons get SIGTERM
            .process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no memory of this process
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("start {name}"))?;
        self.list.push((name.to_string(), child));
        Ok(())
    }

    /// Wait until `log` holds `line`; fail when the child exits first.
    fn wait_for(&mut self, name: &str, log: &Path, line: &str, within: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if std::fs::read_to_string(log)
                .unwrap_or_default()
                .contains(line)
            {
                return Ok(());
            }
            if let Some((_, c)) = self.list.iter_mut().find(|(n, _)| n == name) {
                if let Ok(Some(st)) = c.try_wait() {
                    bail!(
                        "{name} exited ({st}); its log {}:\n{}",
                        log.display(),
                        tail(log)
                    );
                }
            }
            if start.elapsed() > within {
                bail!(
                    "{name} did not start within {within:?}; its log {}:\n{}",
                    log.display(),
                    tail(log)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop_all(&mut self) {
        for (_, c) in self.list.iter_mut().rev() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
        let start = Instant::now();
        for (name, c) in self.list.iter_mut().rev() {
            loop {
                match c.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if start.elapsed() > Duration::from_secs(10) => {
                        eprintln!("strait dev: {name} did not stop within 10 s: killing it");
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
    }
}

fn tail(log: &Path) -> String {
    let t = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn strait(env: &[(String, String)], args: &[&str]) -> Result<String> {
    let out = Command::new(std::env::current_exe().context("this program's path")?)
        .args(args)
        .envs(env.iter().cloned())
        .output()
        .with_context(|| format!("run strait {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "strait {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn s(v: impl ToString) -> String {
    v.to_string()
}

fn up(a: UpArgs) -> Result<()> {
    let _: strait_mirror::Policy = a.policy.parse()?;
    let _: strait_mirror::config::SyncPolicy = a.sync.parse()?;
    if a.source != "local" && a.source != "leader" {
        bail!("--source {:?}: expected `local` or `leader`", a.source);
    }
    if a.store != "dir" && a.store != "garage" {
        bail!("--store {:?}: expected `dir` or `garage`", a.store);
    }
    if !(a.link_mb_s >= 0.0 && a.link_mb_s.is_finite()) {
        bail!(
            "--link-mb-s {}: expected a number of MB/s, 0 for none",
            a.link_mb_s
        );
    }
    let rt = super::runtime()?;
    if a.dir.exists() {
        std::fs::remove_dir_all(&a.dir)
            .with_context(|| format!("empty the working directory {}", a.dir.display()))?;
    }
    let ra = a.dir.join("region-a");
    let rb = a.dir.join("region-b");
    for d in [&ra, &rb] {
        std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
    }
    let token = format!("dev-{:016x}", rand::random::<u64>());
    let mut delay = Faults::delay(Duration::from_millis(a.delay_ms));
    let cap = (a.link_mb_s > 0.0).then_some((a.link_mb_s * 1e6) as u64);
    delay.up.bandwidth = cap;
    delay.down.bandwidth = cap;
    let mut kids = Children {
        list: vec![],
        env: vec![],
    };
    // a Garage per region (killed when `dev up` ends), or none
    let mut garages: Vec<strait_garage::Garage> = vec![];
    let result = (|| -> Result<()> {
        if a.store == "garage" {
            for (region, name) in [(&ra, "A"), (&rb, "B")] {
                println!("strait dev: starting region {name}'s Garage S3 server");
                let g = strait_garage::Garage::start_in(&region.join("garage"))
                    .with_context(|| format!("start region {name}'s Garage"))?;
                garages.push(g);
            }
            // both servers take the same fixed key
            kids.env = garages[0].env();
        }
        let env = kids.env.clone();
        // region A's file system
        let meta_a = format!("rocksdb://{}", ra.join("meta").display());
        let (data_a, data_b) = match garages.as_slice() {
            [ga, gb] => (ga.data_url(), gb.data_url()),
            _ => (
                format!("file://{}", ra.join("data").display()),
                format!("file://{}", rb.join("data").display()),
            ),
        };
        strait(&env, &["format", &meta_a, &data_a, "--name", "dev"])?;

        // replicator nodes 1, 2 (A) and 3 (B); node 3 is reached through the link
        let nodes: Vec<SocketAddr> = (0..3).map(|_| free_addr()).collect::<Result<_>>()?;
        let mut proxies: Vec<Arc<Proxy>> = vec![];
        let link = |target: SocketAddr| -> Result<Arc<Proxy>> {
            let p = rt
                .block_on(Proxy::start("127.0.0.1:0".parse().expect("addr"), target))
                .context("start a fault proxy")?;
            p.set(delay);
            Ok(Arc::new(p))
        };
        let p3 = link(nodes[2])?;
        // region B reaches nodes 1 and 2 through the link too (node 3, and the mirror)
        let to_n1 = link(nodes[0])?;
        let to_n2 = link(nodes[1])?;
        proxies.extend([p3.clone(), to_n1.clone(), to_n2.clone()]);
        for (i, addr) in nodes.iter().enumerate() {
            let region = if i < 2 { &ra } else { &rb };
            let name = format!("replicator{}", i + 1);
            let mut args = vec![
                s("replicator"),
                s("--id"),
                s(i + 1),
                s("--listen"),
                s(addr),
                s("--data-dir"),
                region.join(&name).to_string_lossy().into_owned(),
            ];
            if i == 2 {
                args.extend([
                    s("--peer"),
                    format!("1={}", to_n1.addr()),
                    s("--peer"),
                    format!("2={}", to_n2.addr()),
                ]);
            }
            kids.spawn(&name, &region.join(format!("{name}.log")), &args)?;
        }
        let members = [
            format!("1={}", nodes[0]),
            format!("2={}", nodes[1]),
            format!("3={}", p3.addr()),
        ];
        let start = Instant::now();
        loop {
            let r = strait(
                &env,
                &[
                    "replicator",
                    "init",
                    "--addr",
                    &nodes[0].to_string(),
                    "--member",
                    &members[0],
                    "--member",
                    &members[1],
                    "--member",
                    &members[2],
                ],
            );
            match r {
                Ok(_) => break,
                Err(e) if start.elapsed() > Duration::from_secs(20) => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
        let start = Instant::now();
        while !rt.block_on(has_leader(nodes[0])) {
            if start.elapsed() > Duration::from_secs(30) {
                bail!("the replicator elected no leader within 30 s");
            }
            std::thread::sleep(Duration::from_millis(200));
        }

        // the primary (A) ships to the three nodes
        let primary = free_addr()?;
        let primary_metrics = free_addr()?;
        let plog = ra.join("primary.log");
        kids.spawn(
            "primary",
            &plog,
            &[
                s("primary"),
                s("--meta-url"),
                meta_a.clone(),
                s("--listen"),
                s(primary),
                s("--metrics-listen"),
                s(primary_metrics),
                s("--token"),
                token.clone(),
                s("--replicator"),
                format!("{},{},{}", nodes[0], nodes[1], p3.addr()),
            ],
        )?;
        kids.wait_for(
            "primary",
            &plog,
            "strait primary: serving",
            Duration::from_secs(30),
        )?;

        // the mirror (B) reaches region A through the link, its object store too
        let to_primary = link(primary)?;
        proxies.push(to_primary.clone());
        let mirror_data_a = match garages.first() {
            Some(ga) => {
                let to_s3 = link(ga.s3_addr())?;
                proxies.push(to_s3.clone());
                ga.data_url_at("", &to_s3.addr().to_string())
            }
            // read as a directory, so not through the link
            None => data_a.clone(),
        };
        let mut sources = [s(nodes[2]), s(to_n1.addr()), s(to_n2.addr())];
        if a.source == "leader" {
            sources.rotate_left(1);
        }
        let mirror = free_addr()?;
        let mirror_metrics = free_addr()?;
        let mlog = rb.join("mirror.log");
        kids.spawn(
            "mirror",
            &mlog,
            &[
                s("mirror"),
                s("--id"),
                s("region-b"),
                s("--meta-url"),
                format!("rocksdb://{}", rb.join("meta").display()),
                s("--listen"),
                s(mirror),
                s("--metrics-listen"),
                s(mirror_metrics),
                s("--token"),
                token.clone(),
                s("--primary"),
                s(to_primary.addr()),
                s("--replicator"),
                sources.join(","),
                s("--window-ms"),
                s(a.window_ms),
                s("--policy"),
                a.policy.clone(),
                s("--data-url"),
                data_b.clone(),
                s("--primary-data-url"),
                mirror_data_a.clone(),
                s("--sync"),
                a.sync.clone(),
            ],
        )?;
        kids.wait_for(
            "mirror",
            &mlog,
            "strait mirror: serving",
            Duration::from_secs(60),
        )?;

        // the control socket of `strait dev fault`
        let control = std::net::TcpListener::bind("127.0.0.1:0").context("control socket")?;
        let control_addr = control.local_addr().context("control socket")?;
        {
            let proxies = proxies.clone();
            std::thread::spawn(move || serve_control(control, proxies));
        }

        let mut topo = Topology {
            token: token.clone(),
            primary: s(primary),
            mirror: s(mirror),
            primary_metrics: s(primary_metrics),
            mirror_metrics: s(mirror_metrics),
            replicator: nodes.iter().map(|n| n.to_string()).collect(),
            control: s(control_addr),
            mount_a: None,
            mount_b: None,
            data_a: data_a.clone(),
            data_b: data_b.clone(),
            mirror_data_a: mirror_data_a.clone(),
        };
        if !a.no_mount {
            for (region, addr, which) in [(&ra, primary, "a"), (&rb, mirror, "b")] {
                let mnt = region.join("mnt");
                std::fs::create_dir_all(&mnt).context("mount point")?;
                strait(
                    &env,
                    &[
                        "mount",
                        &format!("strait://{addr}"),
                        &mnt.to_string_lossy(),
                        "--token",
                        &token,
                        "--background",
                        "--cache-dir",
                        &region.join("cache").to_string_lossy(),
                        "--log-file",
                        &region.join("mount.log").to_string_lossy(),
                    ],
                )
                .with_context(|| format!("mount region {which}"))?;
                if which == "a" {
                    topo.mount_a = Some(mnt);
                } else {
                    topo.mount_b = Some(mnt);
                }
            }
        }
        let json = serde_json::to_string_pretty(&topo)?;
        std::fs::write(a.dir.join("dev.json"), &json).context("write dev.json")?;
        let cap = match cap {
            Some(_) => format!(", {} MB/s", a.link_mb_s),
            None => String::new(),
        };
        println!(
            "strait dev: two regions up ({} ms one way between them{cap})",
            a.delay_ms
        );
        println!(
            "  region A: primary {primary}, replicator nodes 1 {} and 2 {}",
            nodes[0], nodes[1]
        );
        println!(
            "  region B: mirror {mirror}, replicator node 3 {}",
            nodes[2]
        );
        println!("  object stores: A {data_a}, B {data_b}");
        if !garages.is_empty() {
            println!(
                "    (credentials: AWS_ACCESS_KEY_ID={} AWS_SECRET_ACCESS_KEY={} AWS_REGION={})",
                strait_garage::ACCESS_KEY,
                strait_garage::SECRET_KEY,
                strait_garage::REGION
            );
        }
        if let (Some(ma), Some(mb)) = (&topo.mount_a, &topo.mount_b) {
            println!("  mounts: A at {}, B at {}", ma.display(), mb.display());
        }
        println!(
            "  token: {token}   (also in {})",
            a.dir.join("dev.json").display()
        );
        println!("  try: strait mirror status --addr {mirror} --token {token} --watch");
        println!(
            "       strait dev fault --dir {} partition | heal | delay=MS | bandwidth=MB_PER_S",
            a.dir.display()
        );
        println!("strait dev: ready");
        std::io::stdout().flush().ok();

        let stop = tokio_util::sync::CancellationToken::new();
        rt.spawn(strait_site::wait_for_signal(stop.clone()));
        let limit = (a.seconds > 0).then(|| Duration::from_secs(a.seconds));
        rt.block_on(async {
            match limit {
                Some(d) => {
                    tokio::select! { _ = stop.cancelled() => {}, _ = tokio::time::sleep(d) => {} }
                }
                None => stop.cancelled().await,
            }
        });
        println!("strait dev: stopping");
        for m in [&topo.mount_b, &topo.mount_a].into_iter().flatten() {
            if let Err(e) = strait(&[], &["umount", &m.to_string_lossy()]) {
                eprintln!("strait dev: {e:#}");
            }
        }
        Ok(())
    })();
    kids.stop_all();
    result
}

async fn has_leader(node: SocketAddr) -> bool {
    let Ok(ch) = strait_replicator::network::channel(&node.to_string()) else {
        return false;
    };
    let mut c = strait_replicator::pb::replicator_client::ReplicatorClient::new(ch);
    matches!(
        tokio::time::timeout(Duration::from_secs(2), c.status(strait_replicator::pb::Empty {})).await,
        Ok(Ok(r)) if r.get_ref().leader.is_some()
    )
}

fn serve_control(l: std::net::TcpListener, proxies: Vec<Arc<Proxy>>) {
    for conn in l.incoming().flatten() {
        let mut r = BufReader::new(match conn.try_clone() {
            Ok(c) => c,
            Err(_) => continue,
        });
        let mut w = conn;
        let mut line = String::new();
        if r.read_line(&mut line).is_err() {
            continue;
        }
        let cmd = line.trim();
        let reply = match cmd {
            "partition" => {
                for p in &proxies {
                    p.update(|f| {
                        f.up.blackhole = true;
                        f.down.blackhole = true;
                    });
                }
                "partitioned: nothing crosses between the regions".to_string()
            }
            "heal" => {
                for p in &proxies {
                    p.update(|f| {
                        f.up.blackhole = false;
                        f.down.blackhole = false;
                    });
                }
                "healed".to_string()
            }
            c if c.starts_with("delay=") => match c[6..].parse::<u64>() {
                Ok(ms) => {
                    for p in &proxies {
                        p.update(|f| {
                            f.up.latency = Duration::from_millis(ms);
                            f.down.latency = Duration::from_millis(ms);
                        });
                    }
                    format!("one-way delay now {ms} ms")
                }
                Err(_) => format!("error: {c:?}: delay=MS with MS a number"),
            },
            c if c.starts_with("bandwidth=") => match c["bandwidth=".len()..].parse::<f64>() {
                Ok(mb) if mb >= 0.0 && mb.is_finite() => {
                    let cap = (mb > 0.0).then_some((mb * 1e6) as u64);
                    for p in &proxies {
                        p.update(|f| {
                            f.up.bandwidth = cap;
                            f.down.bandwidth = cap;
                        });
                    }
                    match cap {
                        Some(_) => format!("bandwidth now {mb} MB/s per proxy"),
                        None => "no bandwidth cap now".to_string(),
                    }
                }
                _ => format!("error: {c:?}: bandwidth=MB_PER_S with a number, 0 for none"),
            },
            other => format!(
                "error: unknown fault {other:?} (partition, heal, delay=MS, bandwidth=MB_PER_S)"
            ),
        };
        let _ = writeln!(w, "{reply}");
    }
}

fn fault(a: FaultArgs) -> Result<()> {
    let path = a.dir.join("dev.json");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "read {} (is `strait dev up` running there?)",
            path.display()
        )
    })?;
    let topo: Topology =
        serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
    let mut c = std::net::TcpStream::connect(&topo.control).with_context(|| {
        format!(
            "reach `strait dev up` at {} (has it stopped?)",
            topo.control
        )
    })?;
    writeln!(c, "{}", a.what).context("send the fault")?;
    let mut reply = String::new();
    BufReader::new(c)
        .read_line(&mut reply)
        .context("read the reply")?;
    let reply = reply.trim();
    if let Some(e) = reply.strip_prefix("error: ") {
        bail!("{e}");
    }
    println!("{reply}");
    Ok(())
}
