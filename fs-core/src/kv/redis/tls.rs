//! strait's TLS parameters of a `rediss://` URL, read out of the URL before the rest goes to
//! the Redis client.

use crate::error::{Error, Result};

/// strait's own parameters of a `rediss://` URL (read here, not passed to the Redis client):
/// `ca`, the CA certificate (PEM) the server's certificate must chain to (default: the
/// system's roots); `cert` and `key`, a client certificate and its key (PEM) for a server that
/// requires one (`tls-auth-clients yes`).
#[derive(Debug, Default, PartialEq)]
pub struct TlsFiles {
    pub ca: Option<std::path::PathBuf>,
    pub cert: Option<std::path::PathBuf>,
    pub key: Option<std::path::PathBuf>,
}

impl TlsFiles {
    /// The URL without strait's parameters, and those parameters.
    pub fn split(url: &str) -> Result<(String, TlsFiles)> {
        let mut parsed =
            url::Url::parse(url).map_err(|e| Error::Invalid(format!("parse redis URL: {e}")))?;
        let mut files = TlsFiles::default();
        let mut kept = vec![];
        for (k, v) in parsed.query_pairs() {
            let path = Some(std::path::PathBuf::from(v.as_ref()));
            match k.as_ref() {
                "ca" => files.ca = path,
                "cert" => files.cert = path,
                "key" => files.key = path,
                _ => kept.push((k.into_owned(), v.into_owned())),
            }
        }
        if files != TlsFiles::default() && parsed.scheme() != "rediss" {
            return Err(Error::Invalid(
                "ca, cert and key are for TLS: use a rediss:// URL".into(),
            ));
        }
        if files.cert.is_some() != files.key.is_some() {
            return Err(Error::Invalid(
                "a redis client certificate needs both cert and key".into(),
            ));
        }
        if kept.is_empty() {
            parsed.set_query(None);
        } else {
            parsed.query_pairs_mut().clear().extend_pairs(kept);
        }
        Ok((parsed.to_string(), files))
    }

    /// The certificates to hand the Redis client, None when the URL names none.
    pub(super) fn certificates(&self) -> Result<Option<redis::TlsCertificates>> {
        if *self == TlsFiles::default() {
            return Ok(None);
        }
        let read = |p: &std::path::Path, what: &str| {
            std::fs::read(p)
                .map_err(|e| Error::Invalid(format!("read the redis {what} {}: {e}", p.display())))
        };
        let client_tls = match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Some(redis::ClientTlsConfig {
                client_cert: read(c, "client certificate")?,
                client_key: read(k, "client key")?,
            }),
            _ => None,
        };
        let root_cert = self.ca.as_deref().map(|p| read(p, "CA")).transpose()?;
        Ok(Some(redis::TlsCertificates {
            client_tls,
            root_cert,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_read_and_taken_out_of_the_url() {
        let (url, f) =
            TlsFiles::split("rediss://:pw@h:6380/2?ca=/etc/ca.pem&cert=/c.pem&key=/c.key").unwrap();
        assert_eq!(url, "rediss://:pw@h:6380/2");
        assert_eq!(f.ca.as_deref(), Some(std::path::Path::new("/etc/ca.pem")));
        assert!(f.cert.is_some() && f.key.is_some());
        let (url, f) = TlsFiles::split("rediss://h:6380/2?ca=/ca.pem&protocol=resp3").unwrap();
        assert_eq!(url, "rediss://h:6380/2?protocol=resp3");
        assert!(f.cert.is_none());
        assert_eq!(
            TlsFiles::split("redis://h:1/0").unwrap().1,
            TlsFiles::default()
        );
        // TLS files on a plain URL, or half a client certificate: refused
        assert!(TlsFiles::split("redis://h:1/0?ca=/ca.pem").is_err());
        assert!(TlsFiles::split("rediss://h:1/0?cert=/c.pem").is_err());
        // a CA that cannot be read: a clear error naming it
        let e = super::super::RedisKv::open("rediss://127.0.0.1:1/0?ca=/nonexistent/ca.pem")
            .err()
            .expect("refused");
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    }
}
