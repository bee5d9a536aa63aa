//! Parsing of the metadata and data URLs users type.

use std::path::PathBuf;

use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq)]
pub enum MetaUrl {
    /// `rocksdb:///var/lib/strait/meta`
    RocksDb(PathBuf),
    /// `redis://[user:pass@]host:port/db`
    Redis(String),
    /// `memory://` (tests only; nothing survives the process)
    Memory,
}

impl MetaUrl {
    pub fn parse(s: &str) -> Result<Self> {
        if s == "memory://" || s == "memory" {
            return Ok(MetaUrl::Memory);
        }
        let u =
            url::Url::parse(s).map_err(|e| Error::Invalid(format!("metadata URL {s:?}: {e}")))?;
        match u.scheme() {
            "rocksdb" => {
                let path = u.path();
                if path.is_empty() || path == "/" {
                    return Err(Error::Invalid(format!(
                        "metadata URL {s:?}: give a directory, as in rocksdb:///var/lib/strait/meta"
                    )));
                }
                Ok(MetaUrl::RocksDb(PathBuf::from(path)))
            }
            "redis" | "rediss" => Ok(MetaUrl::Redis(s.to_string())),
            other => Err(Error::Invalid(format!(
                "metadata URL {s:?}: unknown scheme {other:?} (use rocksdb://, redis:// or memory://)"
            ))),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum DataUrl {
    /// `file:///var/lib/strait/data`
    File(PathBuf),
    /// `s3://bucket[/prefix]?endpoint=http://127.0.0.1:3900&region=garage`; `ca=/path.pem`
    /// for an `https` endpoint whose certificate chains to a CA of one's own.
    S3 {
        bucket: String,
        prefix: String,
        endpoint: Option<String>,
        region: Option<String>,
        ca: Option<PathBuf>,
    },
    /// `memory://` (tests only)
    Memory,
}

impl DataUrl {
    pub fn parse(s: &str) -> Result<Self> {
        if s == "memory://" || s == "memory" {
            return Ok(DataUrl::Memory);
        }
        let u = url::Url::parse(s).map_err(|e| Error::Invalid(format!("data URL {s:?}: {e}")))?;
        match u.scheme() {
            "file" => {
                let path = u.path();
                if path.is_empty() || path == "/" {
                    return Err(Error::Invalid(format!(
                        "data URL {s:?}: give a directory, as in file:///var/lib/strait/data"
                    )));
                }
                Ok(DataUrl::File(PathBuf::from(path)))
            }
            "s3" => {
                let bucket = u
                    .host_str()
                    .filter(|b| !b.is_empty())
                    .ok_or_else(|| Error::Invalid(format!("data URL {s:?}: no bucket name")))?
                    .to_string();
                let prefix = u.path().trim_matches('/').to_string();
                let mut endpoint = None;
                let mut region = None;
                let mut ca = None;
                for (k, v) in u.query_pairs() {
                    match k.as_ref() {
                        "endpoint" => endpoint = Some(v.to_string()),
                        "region" => region = Some(v.to_string()),
                        "ca" => ca = Some(PathBuf::from(v.as_ref())),
                        other => {
                            return Err(Error::Invalid(format!(
                            "data URL {s:?}: unknown parameter {other:?} (known: endpoint, region, ca)"
                        )))
                        }
                    }
                }
                if ca.is_some()
                    && !endpoint
                        .as_deref()
                        .is_some_and(|e| e.starts_with("https://"))
                {
                    return Err(Error::Invalid(format!(
                        "data URL {s:?}: ca is for an https endpoint (endpoint=https://...)"
                    )));
                }
                Ok(DataUrl::S3 {
                    bucket,
                    prefix,
                    endpoint,
                    region,
                    ca,
                })
            }
            other => Err(Error::Invalid(format!(
                "data URL {s:?}: unknown scheme {other:?} (use file:// or s3://)"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_urls() {
        assert_eq!(
            MetaUrl::parse("rocksdb:///var/lib/strait/meta").unwrap(),
            MetaUrl::RocksDb("/var/lib/strait/meta".into())
        );
        assert!(matches!(
            MetaUrl::parse("redis://127.0.0.1:6379/1").unwrap(),
            MetaUrl::Redis(_)
        ));
        assert!(MetaUrl::parse("mysql://x").is_err());
        assert!(MetaUrl::parse("rocksdb://").is_err());
        assert_eq!(
            DataUrl::parse("s3://bucket?endpoint=http://127.0.0.1:3900&region=garage").unwrap(),
            DataUrl::S3 {
                bucket: "bucket".into(),
                prefix: "".into(),
                endpoint: Some("http://127.0.0.1:3900".into()),
                region: Some("garage".into()),
                ca: None,
            }
        );
        assert_eq!(
            DataUrl::parse("s3://b/p?endpoint=https://s3.example:443&ca=/etc/strait/ca.pem")
                .unwrap(),
            DataUrl::S3 {
                bucket: "b".into(),
                prefix: "p".into(),
                endpoint: Some("https://s3.example:443".into()),
                region: None,
                ca: Some("/etc/strait/ca.pem".into()),
            }
        );
        assert!(DataUrl::parse("s3://b?endpoint=http://h:1&ca=/ca.pem").is_err());
        assert_eq!(
            DataUrl::parse("file:///var/lib/strait/data").unwrap(),
            DataUrl::File("/var/lib/strait/data".into())
        );
        assert!(DataUrl::parse("s3://b?colour=red").is_err());
    }
}
