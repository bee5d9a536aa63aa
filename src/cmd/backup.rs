//! `strait backup`: the metadata backups kept in a file system's object store
//! (docs/operations.md, "Metadata backups"). A primary takes them every `backup_interval_s`;
//! `strait load --store` restores one.

use anyhow::{Context, Result};
use strait_fs_core::backup::{self, Manifest};
use strait_fs_core::clock::now_ms;
use strait_fs_core::meta::Meta;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Sub,
}

#[derive(clap::Subcommand)]
pub enum Sub {
    /// List the complete metadata backups in an object store, oldest first.
    List {
        /// The object store: the file system's data URL (file:///dir, s3://bucket?...).
        store: String,
    },
    /// Take a metadata backup now (of an engine a primary may be serving).
    Take {
        /// Metadata engine: rocksdb:///path, redis://host:port/db
        meta_url: String,
        /// The object store to keep it in (default: the file system's data URL).
        #[arg(long)]
        store: Option<String>,
    },
}

/// Open the object store `url` to read backups from, refusing a local directory that does not
/// exist (opening a `file://` store makes its directory: a typo must not).
pub async fn open_existing(url: &str) -> Result<strait_fs_core::object::DynStore> {
    if let strait_fs_core::url::DataUrl::File(path) = strait_fs_core::url::DataUrl::parse(url)? {
        if !path.is_dir() {
            anyhow::bail!(
                "no object store at {url}: {} is not a directory",
                path.display()
            );
        }
    }
    Ok(strait_fs_core::object::open(url).await?)
}

pub fn run(a: Args) -> Result<()> {
    let rt = super::runtime()?;
    match a.command {
        Sub::List { store } => rt.block_on(async {
            let s = open_existing(&store).await?;
            let all = backup::list(&s).await?;
            if all.is_empty() {
                println!("no metadata backup in {}", s.describe());
            }
            let now = now_ms();
            for m in &all {
                println!("{}", line(m, now));
            }
            Ok(())
        }),
        Sub::Take { meta_url, store } => {
            let kv = strait_fs_core::kv::open_read_only(&meta_url)?;
            let url = match store {
                Some(u) => u,
                None => Meta::load_format(kv.as_ref())?.data_url,
            };
            let m = rt.block_on(async {
                let s = strait_fs_core::object::open(&url).await?;
                backup::take(kv, s, now_ms()).await
            })?;
            println!("took {}", line(&m, now_ms()));
            Ok(())
        }
    }
}

/// One backup, as `strait backup list` and `strait status` show it.
pub fn line(m: &Manifest, now_ms: u64) -> String {
    format!(
        "{}  version {}  {} ago  {} pairs  {} stored ({} before compression)  took {:.1} s",
        m.name,
        m.version,
        ago(now_ms.saturating_sub(m.started_ms)),
        m.pairs,
        super::human_bytes(m.stored_bytes()),
        super::human_bytes(m.dump_bytes),
        m.took_ms as f64 / 1000.0
    )
}

/// A duration as people read it: `42 s`, `17 min`, `5 h 3 min`, `3 d 4 h`.
fn ago(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h {} min", s / 3600, s / 60 % 60),
        _ => format!("{} d {} h", s / 86_400, s / 3600 % 24),
    }
}

/// What `strait status` says of the backups in `url`.
pub fn status_line(url: &str) -> String {
    let listed = super::runtime().and_then(|rt| {
        rt.block_on(async {
            let s = open_existing(url).await?;
            Ok::<_, anyhow::Error>(backup::list(&s).await?)
        })
        .context("list the backups")
    });
    match listed {
        Ok(all) => match all.last() {
            None => format!("none in {url}"),
            Some(m) => format!("{} in {url}; the newest: {}", all.len(), line(m, now_ms())),
        },
        Err(e) => format!("unknown ({e:#})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_people_say_them() {
        assert_eq!(ago(0), "0 s");
        assert_eq!(ago(119_999), "119 s");
        assert_eq!(ago(120_000), "2 min");
        assert_eq!(ago(7_260_000), "2 h 1 min");
        assert_eq!(ago(3 * 86_400_000 + 4 * 3_600_000), "3 d 4 h");
    }
}
