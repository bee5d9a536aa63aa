//! `strait fsck`: check metadata and print its digest, or compare a primary and a mirror at
//! the same version (`--compare PRIMARY MIRROR`).

use anyhow::{bail, Context, Result};
use strait_fs_core::meta::Meta;
use strait_proto::site as s;

#[derive(clap::Args)]
pub struct Args {
    /// Metadata engine: rocksdb:///path, redis://host:port/db
    #[arg(required_unless_present = "compare")]
    pub meta_url: Option<String>,
    /// Print only `DIGEST VERSION` (for scripts and comparisons).
    #[arg(long)]
    pub digest: bool,
    /// Compare the metadata of a primary and a mirror (their addresses, host:port) at the
    /// same version: the mirror is paused, the primary's digest taken at its version, and the
    /// mirror's when it reaches that version. Exits 1 when they differ.
    #[arg(long, num_args = 2, value_names = ["PRIMARY", "MIRROR"], conflicts_with = "meta_url")]
    pub compare: Option<Vec<String>>,
    /// Credentials for --compare: a token both daemons accept for the role admin (or a
    /// client certificate naming it), and TLS.
    #[command(flatten)]
    pub client: super::creds::ClientArgs,
    /// How long the mirror may take to reach the primary's version (for --compare).
    #[arg(long, default_value_t = 30_000)]
    pub timeout_ms: u64,
}

pub fn run(a: Args) -> Result<()> {
    if let Some(pair) = &a.compare {
        let creds = a.client.credentials()?;
        return compare(&pair[0], &pair[1], &creds, a.timeout_ms, a.digest);
    }
    let Some(url) = &a.meta_url else {
        bail!("give a metadata engine URL or --compare PRIMARY MIRROR");
    };
    let kv = strait_fs_core::kv::open_read_only(url)?;
    Meta::load_format(kv.as_ref())?;
    let before = kv.last_version()?;
    let digest = Meta::digest(&kv)?;
    let after = kv.last_version()?;
    if before != after {
        bail!("the file system changed while it was read (version {before} -> {after}); run fsck again or unmount first");
    }
    if a.digest {
        println!("{digest} {after}");
    } else {
        println!("metadata tree is consistent: every entry reaches an existing inode");
        println!("digest:  {digest}");
        println!("version: {after}");
    }
    Ok(())
}

/// What one comparison found.
pub struct Compared {
    pub version: u64,
    pub primary: String,
    pub mirror: String,
}

/// Compare the primary's and the mirror's digests at one version (see `--compare`).
pub async fn compare_once(
    primary: &str,
    mirror: &str,
    creds: &strait_auth::Credentials,
    timeout_ms: u64,
) -> Result<Compared> {
    let p = strait_mirror::follower::Primary::new(primary, creds)?;
    let m = strait_mirror::follower::Primary::new(mirror, creds)?;
    // 1. the mirror stops where it is (A), so it cannot pass the primary's version
    let paused = m
        .site()
        .pause(s::PauseRequest {
            hold_ms: timeout_ms + 5_000,
        })
        .await
        .with_context(|| format!("pause the mirror at {mirror}"))?
        .into_inner();
    // 2. the primary's digest at its version P >= A
    let pd = p
        .site()
        .digest(s::DigestRequest::default())
        .await
        .with_context(|| format!("ask the primary at {primary} for its digest"))?
        .into_inner();
    if pd.version < paused.applied_version {
        bail!(
            "the mirror is at version {} but the primary at {}: they are not the same file system's sites",
            paused.applied_version,
            pd.version
        );
    }
    // 3. the mirror's at P
    let md = m
        .site()
        .digest(s::DigestRequest {
            at_version: pd.version,
            timeout_ms,
        })
        .await
        .with_context(|| {
            format!(
                "ask the mirror at {mirror} for its digest at version {}",
                pd.version
            )
        })?
        .into_inner();
    Ok(Compared {
        version: pd.version,
        primary: pd.digest,
        mirror: md.digest,
    })
}

fn compare(
    primary: &str,
    mirror: &str,
    creds: &strait_auth::Credentials,
    timeout_ms: u64,
    terse: bool,
) -> Result<()> {
    let rt = super::runtime()?;
    let c = rt.block_on(compare_once(primary, mirror, creds, timeout_ms))?;
    let same = c.primary == c.mirror;
    if terse {
        println!(
            "{} {} {}",
            if same { "match" } else { "DIFFER" },
            c.version,
            c.primary
        );
    } else {
        println!("version: {}", c.version);
        println!("primary: {}", c.primary);
        println!("mirror:  {}", c.mirror);
        println!(
            "{}",
            if same {
                "the mirror's metadata equals the primary's at this version"
            } else {
                "the digests DIFFER: the mirror does not hold the primary's metadata at this version"
            }
        );
    }
    if !same {
        std::process::exit(1);
    }
    Ok(())
}
