//! `strait certs`: a CA of one's own, certificates that name their holder's roles, and tokens,
//! so that mutual TLS and role tokens take a few commands to set up.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use strait_auth::certs::{self, Pem};
use strait_auth::Role;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(clap::Subcommand)]
pub enum Action {
    /// Create a CA: DIR/ca.pem (give it to every daemon and client) and DIR/ca.key (keep it
    /// on the machine that issues certificates, readable by its owner only).
    Ca {
        /// Directory to write into (created if missing); it must not hold a CA already.
        #[arg(long)]
        dir: PathBuf,
        /// The CA's name.
        #[arg(long, default_value = "strait CA")]
        name: String,
        /// Days the CA is valid.
        #[arg(long, default_value_t = certs::CA_DAYS_DEFAULT)]
        days: u32,
    },
    /// Issue a certificate signed by the CA in DIR: DIR/NAME.pem and DIR/NAME.key. It names
    /// the holder's roles (OU) and its name (CN; a mirror's must be its id), and serves for
    /// both ends of a link, so one per daemon is enough.
    Issue {
        /// The CA's directory (ca.pem, ca.key); the certificate is written there too unless
        /// --out says otherwise.
        #[arg(long)]
        dir: PathBuf,
        /// The holder's name: a mirror's id, a host name, an operator's name.
        #[arg(long)]
        name: String,
        /// Its roles: mount, mirror, primary, admin, peer (comma-separated).
        #[arg(long, value_delimiter = ',', required = true)]
        role: Vec<String>,
        /// Addresses it serves on: IP addresses or DNS names (comma-separated); none for a
        /// certificate used only as a client's.
        #[arg(long, value_delimiter = ',')]
        host: Vec<String>,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = certs::CERT_DAYS_DEFAULT)]
        days: u32,
        /// Directory to write the certificate and key into (default: --dir).
        #[arg(long)]
        out: Option<PathBuf>,
        /// What the holder may do inside its roles, carried in the certificate and enforced
        /// by every daemon that admits it (docs/security.md, "Rules per credential").
        #[command(flatten)]
        rules: RuleArgs,
    },
    /// Print a new random token (32 hex digits) for a role's `[tokens]` entry or token file.
    Token,
}

/// A credential's rules, as flags (`strait certs issue`).
#[derive(clap::Args, Default)]
pub struct RuleArgs {
    /// Confine the holder to this directory (/team-a): its mounts see it as their root.
    #[arg(long)]
    pub subtree: Option<String>,
    /// Calls as uid 0 (and gid 0) act as --anon-uid (and --anon-gid), 65534 by default.
    #[arg(long)]
    pub root_squash: bool,
    /// Every call acts as --anon-uid and --anon-gid.
    #[arg(long)]
    pub all_squash: bool,
    #[arg(long)]
    pub anon_uid: Option<u32>,
    #[arg(long)]
    pub anon_gid: Option<u32>,
    /// Every call acts as this uid, whatever the mount says.
    #[arg(long)]
    pub uid: Option<u32>,
    /// Every call acts as this gid, whatever the mount says.
    #[arg(long)]
    pub gid: Option<u32>,
}

impl RuleArgs {
    pub fn rules(&self) -> strait_auth::Rules {
        strait_auth::Rules {
            root_squash: self.root_squash,
            all_squash: self.all_squash,
            anon_uid: self.anon_uid,
            anon_gid: self.anon_gid,
            uid: self.uid,
            gid: self.gid,
            subtree: self.subtree.clone(),
        }
    }
}

pub fn run(a: Args) -> Result<()> {
    match a.action {
        Action::Ca { dir, name, days } => {
            if dir.join("ca.pem").exists() || dir.join("ca.key").exists() {
                bail!(
                    "{} already holds a CA: remove it first, or issue from it",
                    dir.display()
                );
            }
            // the CA's key lives here: its owner's alone
            strait_ids::private::private_dir(&dir, "PKI directory").map_err(anyhow::Error::msg)?;
            let (cert, key) = certs::new_ca(&name, days)?.write(&dir, "ca")?;
            println!(
                "created the CA {name:?}, valid {days} days: {} (for every daemon and client) \
                 and {} (keep it private)",
                cert.display(),
                key.display()
            );
        }
        Action::Issue {
            dir,
            name,
            role,
            host,
            days,
            out,
            rules,
        } => {
            let rules = rules.rules();
            rules
                .validate()
                .map_err(|e| anyhow::anyhow!("the certificate's rules: {e}"))?;
            let roles = role
                .iter()
                .map(|r| r.parse::<Role>().map_err(anyhow::Error::msg))
                .collect::<Result<Vec<_>>>()?;
            let ca = Pem {
                cert: read(&dir.join("ca.pem"))?,
                key: String::from_utf8(strait_auth::read_key_file(&dir.join("ca.key"))?)
                    .context("the CA key is not text (PEM)")?,
            };
            let out = out.unwrap_or(dir);
            strait_ids::private::private_dir(&out, "PKI directory").map_err(anyhow::Error::msg)?;
            let (cert_path, key_path) =
                certs::issue_with_rules(&ca, &name, &roles, &host, days, &rules)?
                    .write(&out, &name)?;
            let roles: Vec<&str> = roles.iter().map(|r| r.name()).collect();
            println!(
                "issued {} for {name:?} (roles {}; {rules}; hosts {}), valid {days} days; key in {}",
                cert_path.display(),
                roles.join(", "),
                if host.is_empty() {
                    "none: a client's only".to_string()
                } else {
                    host.join(", ")
                },
                key_path.display()
            );
        }
        Action::Token => println!("{}", strait_auth::new_token()),
    }
    Ok(())
}

fn read(p: &Path) -> Result<String> {
    std::fs::read_to_string(p).with_context(|| format!("read {}", p.display()))
}
