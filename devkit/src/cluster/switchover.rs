//! Moving the primary to region B and back, as an operator does it: `strait mirror promote
//! --planned`, then `strait primary rejoin` of the old primary's engine and `strait mirror` on
//! it in the old primary's place (docs/operations.md, "A planned switchover", "The old primary
//! rejoins", "Switching back"). The switchover tests and the chaos harness's `switchover`
//! fault run these.
//!
//! Region A's daemon keeps its name (`primary`) and its address whatever it runs: after the
//! first switch it is a mirror of B, after the way back a promoted mirror, the primary again
//! (and so on, for the next switch). Region B's (`mirror`) is the promoted mirror in between,
//! and the mirror it was after.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::children::{run_strait, s};
use super::{Cluster, MIRROR_ID};

/// How long a daemon may take to stop (it ships what is left first), and to serve again.
const STOP_WITHIN: Duration = Duration::from_secs(30);
const SERVE_WITHIN: Duration = Duration::from_secs(60);

/// The value of flag `flag` in `args`.
fn arg_of(args: &[String], flag: &str) -> Result<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .with_context(|| format!("no {flag} among {}", args.join(" ")))
}

/// The setting `flag` of a daemon that runs with `args`: the flag's value, else its
/// configuration file's (`--meta-url` is `meta_url`, `--promotion-durability` is `durability`
/// of `[promotion]`); a list is joined with commas.
fn setting(args: &[String], flag: &str) -> Result<String> {
    if let Ok(v) = arg_of(args, flag) {
        return Ok(v);
    }
    let config = arg_of(args, "--config")
        .with_context(|| format!("no {flag} and no --config among {}", args.join(" ")))?;
    let text = std::fs::read_to_string(&config).with_context(|| format!("read {config}"))?;
    let file: toml::Table = toml::from_str(&text).with_context(|| format!("parse {config}"))?;
    let key = flag.trim_start_matches("--").replace('-', "_");
    let (table, key) = match key.strip_prefix("promotion_") {
        Some(k) => (
            file.get("promotion").and_then(|v| v.as_table()),
            k.to_string(),
        ),
        None => (Some(&file), key.clone()),
    };
    let v = table.and_then(|t| t.get(&key)).with_context(|| {
        format!(
            "no {flag} among {} and no {key} in {config}",
            args.join(" ")
        )
    })?;
    Ok(match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Array(a) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_string())
            })
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    })
}

impl Cluster {
    /// The operators' copy of token `name` (the guide's names: `mount`, `mirror`, `admin`,
    /// `replicator-primary`, `replicator-mirror`, `replicator-peer`).
    fn token_file(&self, name: &str) -> String {
        self.dir
            .join("tokens")
            .join(format!("{name}.token"))
            .to_string_lossy()
            .into_owned()
    }

    fn run(&self, args: &[&str]) -> Result<String> {
        let env = self
            .install
            .garages()
            .first()
            .map(|g| g.env())
            .unwrap_or_default();
        run_strait(&self.strait_bin, &env, args)
    }

    /// SIGTERM daemon `name` and wait until it is gone (SIGKILL after [`STOP_WITHIN`]).
    fn stop(&mut self, name: &str) -> Result<()> {
        self.signal(name, libc::SIGTERM)?;
        let start = Instant::now();
        while !self.exited(name)? {
            if start.elapsed() > STOP_WITHIN {
                self.signal(name, libc::SIGKILL)?;
                bail!("{name} did not stop within {STOP_WITHIN:?} of SIGTERM: killed");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// `strait primary rejoin` of the stopped daemon's engine `meta`, from the new primary
    /// at `from`, its list of what it alone held in its region's directory.
    fn rejoin(&self, meta: &str, from: &str, region: &str) -> Result<String> {
        let admin = self.token_file("admin");
        let replicator_token =
            std::fs::read_to_string(&admin).with_context(|| format!("read {admin}"))?;
        let list = self
            .dir
            .join(region)
            .join(format!("rejoin-{}.txt", strait_ids::clock::now_ms()));
        let out = self.run(&[
            "primary",
            "rejoin",
            "--meta-url",
            meta,
            "--replicator",
            &self.topology.replicator.join(","),
            "--replicator-token",
            replicator_token.trim(),
            "--from-mirror",
            from,
            "--token-file",
            &admin,
            "--out",
            &list.to_string_lossy(),
        ])?;
        Ok(out.trim().to_string())
    }

    /// `strait mirror promote --planned` of the mirror at `addr` (the old primary, which hands
    /// over, at `old`).
    fn promote_planned(&self, addr: &str, old: &str) -> Result<String> {
        let out = self.run(&[
            "mirror",
            "promote",
            "--addr",
            addr,
            "--planned",
            "--primary",
            old,
            "--token-file",
            &self.token_file("admin"),
        ])?;
        Ok(out.trim().to_string())
    }

    /// Whether the primary is in region B ([`Cluster::switch_to_b`] without the way back).
    pub fn primary_in_b(&mut self) -> Result<bool> {
        Ok(
            self.args_of("primary")?.first().map(String::as_str) == Some("mirror")
                && self.promoted_b()?,
        )
    }

    /// Whether region B's mirror says it is the primary (`mirror status`).
    fn promoted_b(&self) -> Result<bool> {
        let out = self.run(&[
            "mirror",
            "status",
            "--addr",
            &self.topology.mirror,
            "--token-file",
            &self.token_file("admin"),
            "--json",
        ])?;
        let v: serde_json::Value =
            serde_json::from_str(&out).context("mirror status --json is not JSON")?;
        Ok(!v["mirrors"][0]["promotion"].is_null())
    }

    /// Make region B's mirror the primary (a planned switchover: nothing acknowledged is
    /// lost), and region A's old primary a mirror of it, at its own address, so that A's
    /// mount goes on through it. Returns what happened, for a log.
    pub fn switch_to_b(&mut self) -> Result<String> {
        if self.topology.pki.is_some() {
            bail!(
                "a switchover of a --tls cluster is not built here: the primary's certificate \
                 names no role mirror, which it needs once it rejoins"
            );
        }
        let start = Instant::now();
        let (a, b) = (self.topology.primary.clone(), self.topology.mirror.clone());
        if self.promoted_b()? {
            bail!("region B's mirror is the primary already");
        }
        let old = self.args_of("primary")?;
        self.promote_planned(&b, &a)
            .context("promote region B's mirror")?;
        self.stop("primary")?;
        let meta = setting(&old, "--meta-url")?;
        self.rejoin(&meta, &b, "region-a")
            .context("rejoin region A's old primary")?;
        self.serve_a_as_mirror_of_b(&old, meta)?;
        Ok(format!(
            "region B's mirror ({MIRROR_ID}) is the primary, region A's old primary its mirror \
             at {a} ({:.1} s)",
            start.elapsed().as_secs_f64()
        ))
    }

    /// Start region A's engine `meta` (rejoined) as a mirror of B in the place, and at the
    /// address, of A's daemon, which ran with `old`.
    fn serve_a_as_mirror_of_b(&mut self, old: &[String], meta: String) -> Result<()> {
        let b = self.topology.mirror.clone();
        let mirror_args = self.args_of("mirror")?;
        let t = &self.topology;
        let args: Vec<String> = vec![
            s("mirror"),
            s("--id"),
            s("region-a"),
            s("--meta-url"),
            meta,
            s("--listen"),
            setting(old, "--listen")?,
            s("--metrics-listen"),
            setting(old, "--metrics-listen")?,
            s("--role-token-file"),
            format!("mount={}", self.token_file("mount")),
            s("--role-token-file"),
            format!("admin={}", self.token_file("admin")),
            s("--role-token-file"),
            format!("mirror={}", self.token_file("mirror")),
            s("--primary-token-file"),
            self.token_file("mirror"),
            s("--replicator-token-file"),
            self.token_file("replicator-mirror"),
            // the way back promotes it: then it commits as the primary did (a promoted mirror
            // in `local` durability would lose what it had not shipped with its region)
            s("--promotion-token-file"),
            self.token_file("replicator-primary"),
            s("--promotion-durability"),
            setting(old, "--durability")
                .or_else(|_| setting(old, "--promotion-durability"))
                .unwrap_or_else(|_| s("local")),
            s("--primary"),
            b.clone(),
            s("--replicator"),
            setting(old, "--replicator")?,
            s("--data-url"),
            t.data_a.clone(),
            s("--primary-data-url"),
            t.data_b.clone(),
            s("--policy"),
            setting(&mirror_args, "--policy")?,
            s("--window-ms"),
            setting(&mirror_args, "--window-ms")?,
            s("--sync"),
            setting(&mirror_args, "--sync")?,
        ];
        // once promoted again (the way back), it collects garbage as B's mirror would
        let mut args = args;
        for flag in [
            "--promotion-gc-interval-s",
            "--promotion-gc-mirror-grace-ms",
        ] {
            if let Ok(v) = setting(&mirror_args, flag) {
                args.extend([s(flag), v]);
            }
        }
        self.replace("primary", args, Some(SERVE_WITHIN))
            .context("start region A's engine as a mirror of B")
    }

    /// Region A is lost: its primary and replicator node 1 are SIGKILLed (its mount is the
    /// caller's), and region B's mirror is promoted (not planned: the old primary is gone),
    /// once the nodes left (2 in region C, 3 in B) have elected a leader. Needs the witness
    /// placement ([`crate::cluster::ClusterConfig::witness`]).
    pub fn lose_region_a(&mut self) -> Result<String> {
        if self.topology.replicator_regions.get(1).map(String::as_str) != Some("C") {
            bail!("losing region A needs the witness placement: region A holds a quorum");
        }
        if self.promoted_b()? {
            bail!("region B's mirror is the primary already");
        }
        let start = Instant::now();
        self.signal("primary", libc::SIGKILL)?;
        self.signal("replicator1", libc::SIGKILL)?;
        let out = self
            .run(&[
                "mirror",
                "promote",
                "--addr",
                &self.topology.mirror.clone(),
                "--token-file",
                &self.token_file("admin"),
            ])
            .context("promote region B's mirror")?;
        Ok(format!(
            "region A killed (its primary and replicator node 1), region B's mirror promoted \
             ({:.1} s): {}",
            start.elapsed().as_secs_f64(),
            out.lines().last().unwrap_or("").trim()
        ))
    }

    /// After [`Cluster::lose_region_a`]: region A comes back as a mirror of B. Its replicator
    /// node starts again, its primary's engine rejoins (what only it held goes to the list
    /// in its directory) and is served as B's mirror at A's address.
    pub fn region_a_rejoins(&mut self) -> Result<String> {
        let start = Instant::now();
        self.restart("replicator1", None)?;
        let old = self.args_of("primary")?;
        let meta = setting(&old, "--meta-url")?;
        let b = self.topology.mirror.clone();
        let rejoined = self
            .rejoin(&meta, &b, "region-a")
            .context("rejoin region A's old primary")?;
        self.serve_a_as_mirror_of_b(&old, meta)?;
        Ok(format!(
            "region A's old primary is B's mirror ({:.1} s): {}",
            start.elapsed().as_secs_f64(),
            rejoined.lines().last().unwrap_or("")
        ))
    }

    /// The way back after [`Cluster::switch_to_b`]: region A's mirror is promoted (B hands
    /// over), and region B's promoted mirror, stopped, rejoins and starts again as the mirror
    /// it was.
    pub fn switch_back_to_a(&mut self) -> Result<String> {
        let start = Instant::now();
        let (a, b) = (self.topology.primary.clone(), self.topology.mirror.clone());
        if !self.primary_in_b()? {
            bail!("the primary is not in region B (never switched there?)");
        }
        self.promote_planned(&a, &b)
            .context("promote region A's mirror")?;
        self.stop("mirror")?;
        let meta = setting(&self.args_of("mirror")?, "--meta-url")?;
        self.rejoin(&meta, &a, "region-b")
            .context("rejoin region B's promoted mirror")?;
        self.restart("mirror", Some(SERVE_WITHIN))
            .context("start region B's mirror again")?;
        Ok(format!(
            "region A's mirror is the primary again, region B's its mirror ({:.1} s)",
            start.elapsed().as_secs_f64()
        ))
    }
}
