//! [`Guard`]: the tower layer in front of every strait gRPC server. It works out the caller's
//! roles from its token and its client certificate, refuses a call whose method does not admit
//! any of them, and hands the rest on with a [`Caller`] in the request's extensions and the
//! request's body held to the method's size ([`crate::limit`]).
//!
//! - No credentials at all, or a token this daemon does not accept: UNAUTHENTICATED.
//! - Known credentials whose roles the method does not admit: PERMISSION_DENIED, naming the
//!   roles it does admit.
//!
//! Either way the call never reaches the service, so it changes nothing.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Status;

use crate::identity;
use crate::limit::LimitedBody;
use crate::policy;
use crate::role::Roles;
use crate::rules::Rules;
use crate::tokens::Tokens;

/// Distinct peer addresses remembered for logging a refusal once each.
const REFUSED_PEERS_MAX: usize = 10_000;

/// Who made a call, as the guard found out: put in the request's extensions for services
/// that check more than the method (a mirror may ack only its own cursor).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub roles: Roles,
    /// The certificate's `CN`, when the caller presented one that names roles.
    pub name: Option<String>,
    /// Who the caller is, for what it owns at the daemon (its sessions, its cursor): the
    /// certificate's name (`cert:<CN>`) when it presented one that names roles, else the token
    /// it presented, as a digest (`token:<16 hex digits of its SHA-256>`) so logs and memory
    /// never hold the token. Two callers with the same certificate name, or the same token,
    /// are one principal. A named credential's token (`[[credentials]]`) is `cred:<name>`,
    /// whichever of its tokens it presents (one may replace another).
    pub principal: String,
    /// What it may do inside its roles (squashing, a subtree); open for a credential without
    /// rules.
    pub rules: Arc<Rules>,
}

impl Caller {
    /// A caller known only by its roles and name (a test, an in-process call).
    pub fn new(roles: Roles, name: Option<String>) -> Self {
        let principal = match &name {
            Some(n) => format!("cert:{n}"),
            None => String::new(),
        };
        Caller {
            roles,
            name,
            principal,
            rules: Arc::new(Rules::default()),
        }
    }
}

/// The principal of a caller known by the `authorization` header `given`.
fn token_principal(given: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(given);
    let hex: String = d.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("token:{hex}")
}

/// Why a call was refused, for a daemon's metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No credentials, or a token this daemon does not accept.
    Unauthenticated,
    /// Credentials whose roles the method does not admit.
    PermissionDenied,
}

type OnRefusal = Arc<dyn Fn(Refusal) + Send + Sync>;

struct Inner {
    /// Names the daemon in messages (`replicator node 3`, `primary`).
    daemon: String,
    tokens: Tokens,
    refused: Mutex<HashSet<Option<IpAddr>>>,
    on_refusal: Option<OnRefusal>,
    /// What each client certificate seen says (its DER -> roles and name), so a certificate
    /// is parsed once, not on every call of its connection.
    identities: Mutex<HashMap<Vec<u8>, Identity>>,
}

/// What a client certificate says: its roles, its holder's name and rules.
type Identity = (Roles, Option<String>, Arc<Rules>);

/// Certificates whose reading is kept; past it the table starts again empty.
const IDENTITIES_MAX: usize = 1024;

/// The layer; cheap to clone.
#[derive(Clone)]
pub struct Guard(Arc<Inner>);

impl Guard {
    /// A guard for the daemon named `daemon` that accepts `tokens` and the roles named by
    /// client certificates (which rustls has already checked against the client CA).
    pub fn new(daemon: impl Into<String>, tokens: Tokens) -> Self {
        Self::build(daemon.into(), tokens, None)
    }

    /// As [`Guard::new`], calling `f` on every refusal (for a counter).
    pub fn counted(
        daemon: impl Into<String>,
        tokens: Tokens,
        f: impl Fn(Refusal) + Send + Sync + 'static,
    ) -> Self {
        Self::build(daemon.into(), tokens, Some(Arc::new(f)))
    }

    fn build(daemon: String, tokens: Tokens, on_refusal: Option<OnRefusal>) -> Self {
        Guard(Arc::new(Inner {
            daemon,
            tokens,
            refused: Mutex::new(HashSet::new()),
            on_refusal,
            identities: Mutex::new(HashMap::new()),
        }))
    }

    /// What a client certificate says, read once per certificate.
    fn identity(&self, der: &[u8]) -> Identity {
        if let Some(known) = self.0.identities.lock().get(der) {
            return known.clone();
        }
        let read = identity::from_certificate(der);
        let mut known = self.0.identities.lock();
        if known.len() >= IDENTITIES_MAX {
            known.clear();
        }
        known.insert(der.to_vec(), read.clone());
        read
    }

    /// Decide on a call to `path` with these headers and extensions.
    pub fn admit(
        &self,
        path: &str,
        headers: &http::HeaderMap,
        ext: &http::Extensions,
    ) -> Result<Caller, Status> {
        let (mut roles, mut name) = (Roles::NONE, None);
        let mut principal = String::new();
        let mut rules = Arc::new(Rules::default());
        let tls = ext.get::<TlsConnectInfo<TcpConnectInfo>>();
        if let Some(certs) = tls.and_then(|t| t.peer_certs()) {
            if let Some(leaf) = certs.first() {
                let (r, n, cert_rules) = self.identity(leaf.as_ref());
                if !r.is_empty() {
                    roles = r;
                    rules = cert_rules;
                    principal = match &n {
                        Some(n) => format!("cert:{n}"),
                        // a certificate without a name is known by its own bytes
                        None => token_principal(leaf.as_ref()).replacen("token:", "cert#", 1),
                    };
                    name = n;
                }
            }
        }
        let peer = tls
            .and_then(|t| t.get_ref().remote_addr())
            .or_else(|| ext.get::<TcpConnectInfo>().and_then(|t| t.remote_addr()));
        if let Some(given) = headers.get(http::header::AUTHORIZATION) {
            let named = self.0.tokens.named_of(given.as_bytes());
            let r = match named {
                Some((r, _)) => r,
                None => self.0.tokens.roles_of(given.as_bytes()),
            };
            if let Some((_, n)) = named {
                // a certificate's rules and a token's that differ: which would hold is unclear
                if !rules.is_open() && !n.rules.is_open() && rules != n.rules {
                    return Err(self.refuse(
                        Refusal::PermissionDenied,
                        peer,
                        path,
                        "a certificate and a token with different rules",
                        Status::permission_denied(
                            "the certificate and the token name different rules (subtree, \
                             squashing): present one of them",
                        ),
                    ));
                }
                if rules.is_open() {
                    rules = n.rules.clone();
                }
                if principal.is_empty() {
                    principal = format!("cred:{}", n.name);
                }
            }
            if r.is_empty() {
                return Err(self.refuse(
                    Refusal::Unauthenticated,
                    peer,
                    path,
                    "a token it does not accept",
                    Status::unauthenticated(format!(
                        "{} does not accept this token",
                        self.0.daemon
                    )),
                ));
            }
            roles = roles.union(r);
            if principal.is_empty() {
                principal = token_principal(given.as_bytes());
            }
        }
        if roles.is_empty() {
            return Err(self.refuse(
                Refusal::Unauthenticated,
                peer,
                path,
                "no credentials",
                Status::unauthenticated(format!(
                    "{} requires credentials: a token (authorization: Bearer) or a client \
                     certificate naming a role",
                    self.0.daemon
                )),
            ));
        }
        let allowed = policy::allowed(path);
        if !allowed.intersects(roles) {
            let method = path.rsplit('/').next().unwrap_or(path);
            let msg = if allowed.is_empty() {
                format!("{} serves no method {path:?}", self.0.daemon)
            } else {
                format!(
                    "{method} is for the roles {allowed}; this caller is {roles}{}",
                    name.as_deref()
                        .map(|n| format!(" ({n})"))
                        .unwrap_or_default()
                )
            };
            return Err(self.refuse(
                Refusal::PermissionDenied,
                peer,
                path,
                "a role that may not call it",
                Status::permission_denied(msg),
            ));
        }
        Ok(Caller {
            roles,
            name,
            principal,
            rules,
        })
    }

    fn refuse(
        &self,
        why: Refusal,
        peer: Option<SocketAddr>,
        path: &str,
        what: &str,
        status: Status,
    ) -> Status {
        if let Some(f) = &self.0.on_refusal {
            f(why);
        }
        let mut refused = self.0.refused.lock();
        if refused.len() < REFUSED_PEERS_MAX && refused.insert(peer.map(|p| p.ip())) {
            tracing::warn!(
                "refused a call to {path} from {} with {what} (logged once per address)",
                peer.map(|p| p.to_string())
                    .unwrap_or_else(|| "an unknown peer".into())
            );
        }
        status
    }
}

impl<S> tower::Layer<S> for Guard {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Guarded<S> {
        Guarded {
            inner,
            guard: self.clone(),
        }
    }
}

/// A service behind a [`Guard`].
#[derive(Clone)]
pub struct Guarded<S> {
    inner: S,
    guard: Guard,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for Guarded<S>
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<R>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Default + Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match self
            .guard
            .admit(req.uri().path(), req.headers(), req.extensions())
        {
            Ok(caller) => {
                // the method's size limit, counted as the request arrives
                let path = req.uri().path().to_string();
                let limit = strait_proto::limits::request_bytes_max(&path);
                let mut req = req.map(|b| {
                    tonic::body::Body::new(LimitedBody::new(
                        tonic::body::Body::new(b),
                        limit,
                        &path,
                    ))
                });
                req.extensions_mut().insert(caller);
                // the clone that was made ready serves this call (tower's usual dance)
                let clone = self.inner.clone();
                let mut ready = std::mem::replace(&mut self.inner, clone);
                Box::pin(ready.call(req))
            }
            Err(status) => Box::pin(std::future::ready(Ok(status.into_http()))),
        }
    }
}

/// The caller of a request that passed a [`Guard`] (None behind no guard).
pub fn caller<T>(req: &tonic::Request<T>) -> Option<&Caller> {
    req.extensions().get::<Caller>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::role::Role;

    fn guard() -> Guard {
        let mut t = Tokens::new();
        t.add(Role::Mount, "mount-token-0123456789").unwrap();
        t.add(Role::Admin, "admin-token-0123456789").unwrap();
        Guard::new("the test daemon", t)
    }

    fn headers(token: Option<&str>) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        if let Some(t) = token {
            h.insert(
                http::header::AUTHORIZATION,
                format!("Bearer {t}").parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn calls_are_refused_without_credentials_with_wrong_ones_and_with_the_wrong_role() {
        let g = guard();
        let ext = http::Extensions::new();
        let create = "/strait.meta.v1.MetaService/Create";
        let pause = "/strait.site.v1.SiteService/Pause";
        let e = g.admit(create, &headers(None), &ext).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let e = g
            .admit(create, &headers(Some("mount-token-012345678X")), &ext)
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let e = g
            .admit(pause, &headers(Some("mount-token-0123456789")), &ext)
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("admin"), "{}", e.message());
        let c = g
            .admit(create, &headers(Some("mount-token-0123456789")), &ext)
            .unwrap();
        assert_eq!(c.roles, Roles::of(&[Role::Mount]));
        assert!(g
            .admit(pause, &headers(Some("admin-token-0123456789")), &ext)
            .is_ok());
        let e = g
            .admit(
                "/strait.x/Y",
                &headers(Some("admin-token-0123456789")),
                &ext,
            )
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
    }

    #[test]
    fn a_named_credentials_token_brings_its_name_and_rules() {
        let mut t = Tokens::new();
        t.add(Role::Mount, "mount-token-0123456789").unwrap();
        let rules = Rules {
            subtree: Some("/team-a".into()),
            root_squash: true,
            ..Default::default()
        };
        t.add_named(
            &[Role::Mount],
            "team-a-token-0123456789",
            "team-a",
            rules.clone(),
        )
        .unwrap();
        t.add_named(
            &[Role::Mount],
            "team-a-token-new-0123456",
            "team-a",
            rules.clone(),
        )
        .unwrap();
        // a token is one credential's only
        assert!(t
            .add_named(
                &[Role::Mount],
                "mount-token-0123456789",
                "b",
                Rules::default()
            )
            .is_err());
        let g = Guard::new("d", t);
        let ext = http::Extensions::new();
        let create = "/strait.meta.v1.MetaService/Create";
        let c = g
            .admit(create, &headers(Some("team-a-token-0123456789")), &ext)
            .unwrap();
        assert_eq!(c.roles, Roles::of(&[Role::Mount]));
        assert_eq!(c.principal, "cred:team-a");
        assert_eq!(*c.rules, rules);
        // its other token is the same principal (a token replaced keeps its sessions)
        let c2 = g
            .admit(create, &headers(Some("team-a-token-new-0123456")), &ext)
            .unwrap();
        assert_eq!(c2.principal, c.principal);
        let plain = g
            .admit(create, &headers(Some("mount-token-0123456789")), &ext)
            .unwrap();
        assert!(plain.rules.is_open());
        assert!(plain.principal.starts_with("token:"));
        // a named mount credential has no other role
        let pause = "/strait.site.v1.SiteService/Pause";
        let e = g
            .admit(pause, &headers(Some("team-a-token-0123456789")), &ext)
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
    }

    #[test]
    fn refusals_are_counted() {
        let n = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let n2 = n.clone();
        let mut t = Tokens::new();
        t.add(Role::Mount, "mount-token-0123456789").unwrap();
        let g = Guard::counted("d", t, move |_| {
            n2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        let ext = http::Extensions::new();
        let _ = g.admit("/a/b", &headers(None), &ext);
        let _ = g.admit("/a/b", &headers(Some("mount-token-0123456789")), &ext);
        assert_eq!(n.load(std::sync::atomic::Ordering::Relaxed), 2);
    }
}
