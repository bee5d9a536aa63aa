//! [`Credentials`]: how a client (a daemon calling another, the CLI, a mount) proves its role
//! and checks the server: a token sent with every call, and TLS with the CA that the server's
//! certificate must chain to and, for mutual TLS, the client's own certificate.

use std::fmt;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::tokens::check_token;
use crate::Error;

/// A channel whose calls carry the client's token.
pub type Conn = InterceptedService<Channel, Bearer>;

/// TLS settings of a client, as PEM bytes.
#[derive(Clone, Default)]
pub struct ClientTls {
    /// CA certificate(s) the server's certificate must chain to.
    pub ca_pem: Vec<u8>,
    /// The client's certificate and key, for servers that require mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Name to check the server's certificate against (default: the host of its address).
    pub domain: Option<String>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca_pem", &format!("{} bytes", self.ca_pem.len()))
            .field(
                "identity",
                &self.identity.as_ref().map(|_| "(certificate, key)"),
            )
            .field("domain", &self.domain)
            .finish()
    }
}

/// Adds `authorization: Bearer <token>` to every call (nothing without a token), and the
/// current span's trace context ([`crate::trace`]).
#[derive(Clone, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        crate::trace::inject(req.metadata_mut().as_mut());
        Ok(req)
    }
}

/// What a client presents: a token, TLS, both, or (for plain loopback set-ups without auth,
/// which strait's daemons refuse) neither.
#[derive(Clone, Default)]
pub struct Credentials {
    token: Option<String>,
    bearer: Bearer,
    tls: Option<ClientTls>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .field("tls", &self.tls)
            .finish()
    }
}

impl Credentials {
    /// Credentials with `token` (checked: see [`check_token`]) and `tls`.
    pub fn new(token: Option<&str>, tls: Option<ClientTls>) -> Result<Self, Error> {
        let bearer = match token {
            Some(t) => {
                check_token(t)?;
                Bearer(Some(format!("Bearer {t}").parse().map_err(|_| {
                    Error::Config("the token holds characters not allowed in a header".into())
                })?))
            }
            None => Bearer(None),
        };
        Ok(Credentials {
            token: token.map(str::to_string),
            bearer,
            tls,
        })
    }

    /// A token alone, over plain text.
    pub fn token(token: &str) -> Result<Self, Error> {
        Self::new(Some(token), None)
    }

    pub fn tls(&self) -> Option<&ClientTls> {
        self.tls.as_ref()
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// The token, for a client that sends it its own way (the mount's connection stamps it
    /// with its session).
    pub fn token_str(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The interceptor that adds the token.
    pub fn bearer(&self) -> Bearer {
        self.bearer.clone()
    }

    /// An endpoint for `addr` (`host:port`): `https` with these TLS settings when there are
    /// some, else `http`. The caller adds its own timeouts and tuning.
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint, Error> {
        let host = host_of(addr)
            .ok_or_else(|| Error::Config(format!("{addr:?} is not a host:port address")))?;
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut ep = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| Error::Config(format!("address {addr:?}: {e}")))?;
        if let Some(tls) = &self.tls {
            crate::use_ring_for_tls();
            let mut cfg = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&tls.ca_pem))
                .domain_name(tls.domain.clone().unwrap_or_else(|| host.to_string()));
            if let Some((cert, key)) = &tls.identity {
                cfg = cfg.identity(Identity::from_pem(cert, key));
            }
            ep = ep
                .tls_config(cfg)
                .map_err(|e| Error::Config(format!("TLS settings for {addr}: {e}")))?;
        }
        Ok(ep)
    }

    /// A lazily connected channel through `ep` whose calls carry the token.
    pub fn connect_lazy(&self, ep: Endpoint) -> Conn {
        InterceptedService::new(ep.connect_lazy(), self.bearer())
    }
}

/// The host of `host:port` (`[v6]:port` too), without brackets.
pub fn host_of(addr: &str) -> Option<&str> {
    let (host, port) = addr.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_tokens_are_checked() {
        assert_eq!(host_of("127.0.0.1:7430"), Some("127.0.0.1"));
        assert_eq!(host_of("[::1]:7430"), Some("::1"));
        assert_eq!(host_of("localhost"), None);
        assert_eq!(host_of(":80"), None);
        assert_eq!(host_of("h:port"), None);
        assert!(Credentials::token("short").is_err());
        let c = Credentials::token("a-long-enough-token-1234").unwrap();
        assert!(c.endpoint("nohost").is_err());
        assert_eq!(
            c.endpoint("127.0.0.1:1").unwrap().uri().scheme_str(),
            Some("http")
        );
        assert!(!format!("{c:?}").contains("a-long-enough"), "{c:?}");
    }
}
