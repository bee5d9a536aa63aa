//! [`Security`]: the keys every daemon's configuration has for who may call it and how its
//! links are encrypted (flattened into each daemon's TOML, with the same names everywhere).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::client::{ClientTls, Credentials};
use crate::role::Role;
use crate::rules::Rules;
use crate::tokens::{check_token, Tokens};
use crate::Error;

/// Who may call a daemon, and its TLS. Without TLS a daemon serves plain-text gRPC, for
/// loopback and trusted networks only.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Security {
    /// The tokens of each role this daemon accepts: `[tokens]` with `mount = "..."`,
    /// `admin = ["...", "..."]` (a list while a token is being replaced), ... (see
    /// `strait certs token`).
    pub tokens: BTreeMap<Role, TokenList>,
    /// Files whose first line is a role's token; they take precedence over `tokens`.
    pub token_files: BTreeMap<Role, PathBuf>,
    /// This daemon's certificate chain and key (PEM): served to its clients, and presented as
    /// its client certificate when it calls another daemon that requires one.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// Mutual TLS: the CA that client certificates must chain to. When set, a client without a
    /// valid certificate cannot connect, and a certificate's `OU=<role>` grants that role.
    pub tls_client_ca_file: Option<PathBuf>,
    /// The CA that the certificates of the daemons this one calls must chain to; set it to
    /// call them over TLS.
    pub tls_ca_file: Option<PathBuf>,
    /// Credentials with a name and rules of their own (`[[credentials]]`): a token, its
    /// roles, and what it may do inside them (squashing, a subtree): see [`NamedCredential`].
    pub credentials: Vec<NamedCredential>,
    /// Serve, or call other daemons, in plain text on addresses other than loopback: the
    /// tokens then cross the network readable and replayable. Refused unless set, for a
    /// network the operator trusts (`--insecure-plaintext`).
    pub insecure_plaintext: bool,
}

/// A credential with a name and rules (`[[credentials]]` in a daemon's TOML):
///
/// ```toml
/// [[credentials]]
/// name = "team-a"                 # its principal: `cred:team-a` (sessions, cursors, logs)
/// roles = ["mount"]               # the default
/// token_file = "/etc/strait/tokens/team-a.token"   # or token = "..." (or a list, while
///                                 # one replaces another: the same principal either way)
/// subtree = "/team-a"             # its mounts see /team-a as their root, and nothing else
/// root_squash = true              # uid 0 and gid 0 act as anon_uid and anon_gid (65534)
/// ```
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct NamedCredential {
    pub name: String,
    pub roles: Vec<Role>,
    pub token: Option<TokenList>,
    pub token_file: Option<PathBuf>,
    pub root_squash: bool,
    pub all_squash: bool,
    pub anon_uid: Option<u32>,
    pub anon_gid: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub subtree: Option<String>,
}

impl NamedCredential {
    /// Its rules.
    pub fn rules(&self) -> Rules {
        Rules {
            root_squash: self.root_squash,
            all_squash: self.all_squash,
            anon_uid: self.anon_uid,
            anon_gid: self.anon_gid,
            uid: self.uid,
            gid: self.gid,
            subtree: self.subtree.clone(),
        }
    }

    /// Its roles: `mount` unless it names others.
    pub fn roles(&self) -> Vec<Role> {
        if self.roles.is_empty() {
            vec![Role::Mount]
        } else {
            self.roles.clone()
        }
    }

    fn validate(&self) -> Result<(), Error> {
        let what = format!("credential {:?}", self.name);
        if self.name.is_empty()
            || self.name.len() > 64
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(Error::Config(format!(
                "{what}: a name of 1 to 64 letters, digits, '-', '_' or '.'"
            )));
        }
        match (&self.token, &self.token_file) {
            (None, None) => return Err(Error::Config(format!("{what}: give token or token_file"))),
            (Some(_), Some(_)) => {
                return Err(Error::Config(format!(
                    "{what}: token and token_file exclude each other"
                )))
            }
            (Some(list), None) => {
                if list.0.is_empty() {
                    return Err(Error::Config(format!("{what}: token is an empty list")));
                }
                for t in &list.0 {
                    check_token(t).map_err(|e| Error::Config(format!("{what}: {e}")))?;
                }
            }
            (None, Some(_)) => {}
        }
        self.rules()
            .validate()
            .map_err(|e| Error::Config(format!("{what}: {e}")))
    }

    fn tokens(&self) -> Result<Vec<String>, Error> {
        match (&self.token, &self.token_file) {
            (Some(t), _) => Ok(t.0.clone()),
            (None, Some(f)) => Ok(vec![read_token_file(f)?]),
            (None, None) => Err(Error::Config(format!(
                "credential {:?}: give token or token_file",
                self.name
            ))),
        }
    }
}

/// Whether `addr` (`host:port`, `[v6]:port`, or an address without a port) names this
/// machine's loopback: `127.0.0.0/8`, `::1` or `localhost`. An unspecified address
/// (`0.0.0.0`) listens on every interface, so it is not.
pub fn is_loopback(addr: &str) -> bool {
    if let Ok(a) = addr.parse::<std::net::SocketAddr>() {
        return a.ip().is_loopback();
    }
    if let Ok(ip) = addr.parse::<std::net::IpAddr>() {
        return ip.is_loopback();
    }
    let host = match addr.rsplit_once(':') {
        Some((h, p)) if p.parse::<u16>().is_ok() => h,
        _ => addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// One network link of a daemon, as `--check-config` reports it and the start checks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// What the link is for: `listen`, `to the replicator`, `to the primary`.
    pub what: String,
    pub addr: String,
    /// Whether it runs TLS.
    pub tls: bool,
}

impl Link {
    /// A plain-text link off this machine: its tokens cross the network in clear.
    pub fn exposed(&self) -> bool {
        !self.tls && !self.addr.is_empty() && !is_loopback(&self.addr)
    }
}

impl std::fmt::Display for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match (self.tls, self.exposed()) {
            (true, _) => "TLS",
            (false, true) => "PLAIN TEXT, tokens readable on the network",
            (false, false) => "plain text, loopback",
        };
        write!(f, "{} {} ({how})", self.what, self.addr)
    }
}

/// The tokens of one role: one (`admin = "..."`) or several (`admin = ["...", "..."]`, while
/// one replaces another).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct TokenList(pub Vec<String>);

impl TokenList {
    /// The first token: what a daemon presents when it calls with this role.
    pub fn first(&self) -> Option<&str> {
        self.0.first().map(String::as_str)
    }
}

impl<'de> Deserialize<'de> for TokenList {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        Ok(match OneOrMany::deserialize(d)? {
            OneOrMany::One(t) => TokenList(vec![t]),
            OneOrMany::Many(v) => TokenList(v),
        })
    }
}

/// The first line of `path`, a token file; refused when users other than its owner may read
/// it (as ssh refuses a private key "too open").
pub fn read_token_file(path: &Path) -> Result<String, Error> {
    strait_ids::private::check_private(path, "token file").map_err(Error::Config)?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("read the token file {}: {e}", path.display())))?;
    Ok(text.lines().next().unwrap_or_default().trim().to_string())
}

/// A private key (PEM) from `path`; refused when users other than its owner may read it.
pub fn read_key_file(path: &Path) -> Result<Vec<u8>, Error> {
    strait_ids::private::check_private(path, "TLS key").map_err(Error::Config)?;
    read(path, "TLS key")
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, Error> {
    std::fs::read(path)
        .map_err(|e| Error::Config(format!("read the {what} {}: {e}", path.display())))
}

impl Security {
    /// Check the settings go together.
    pub fn validate(&self) -> Result<(), Error> {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(_), None) | (None, Some(_)) => {
                return Err(Error::Config(
                    "tls_cert_file and tls_key_file must be set together".into(),
                ))
            }
            (None, None) if self.tls_client_ca_file.is_some() => {
                return Err(Error::Config(
                    "tls_client_ca_file (mutual TLS) needs tls_cert_file and tls_key_file".into(),
                ))
            }
            _ => {}
        }
        for t in self.tokens.values().flat_map(|l| l.0.iter()) {
            check_token(t)?;
        }
        let mut names = std::collections::BTreeSet::new();
        for c in &self.credentials {
            c.validate()?;
            if !names.insert(c.name.as_str()) {
                return Err(Error::Config(format!(
                    "two credentials are named {:?}: a name is one principal",
                    c.name
                )));
            }
        }
        Ok(())
    }

    /// The tokens this daemon accepts: each role's own, and `shared` (the single `token` of
    /// older configurations) for every role in `shared_roles` that has none of its own.
    pub fn accepted(&self, shared: Option<&str>, shared_roles: &[Role]) -> Result<Tokens, Error> {
        let mut own: BTreeMap<Role, Vec<String>> =
            self.tokens.iter().map(|(r, l)| (*r, l.0.clone())).collect();
        for (r, f) in &self.token_files {
            own.entry(*r).or_default().push(read_token_file(f)?);
        }
        let mut tokens = Tokens::new();
        for (r, list) in &own {
            for t in list {
                tokens
                    .add(*r, t)
                    .map_err(|e| Error::Config(format!("the {r} token: {e}")))?;
            }
        }
        for c in &self.credentials {
            for t in c.tokens()? {
                tokens
                    .add_named(&c.roles(), &t, &c.name, c.rules())
                    .map_err(|e| Error::Config(format!("credential {:?}: {e}", c.name)))?;
            }
        }
        if let Some(s) = shared.filter(|s| !s.is_empty()) {
            for r in shared_roles.iter().filter(|r| !own.contains_key(r)) {
                tokens
                    .add(*r, s)
                    .map_err(|e| Error::Config(format!("the token: {e}")))?;
            }
        }
        Ok(tokens)
    }

    /// When the certificates this daemon presents or trusts expire: for each of
    /// `tls_cert_file` (`cert`), `tls_client_ca_file` (`client_ca`) and `tls_ca_file` (`ca`)
    /// that is set, the earliest `notAfter` of the certificates in it (seconds since the Unix
    /// epoch). For `strait_tls_certificate_expiry_timestamp_seconds`.
    pub fn certificate_expiries(&self) -> Result<Vec<(&'static str, i64)>, Error> {
        let mut out = vec![];
        for (which, path) in [
            ("cert", &self.tls_cert_file),
            ("client_ca", &self.tls_client_ca_file),
            ("ca", &self.tls_ca_file),
        ] {
            let Some(path) = path else { continue };
            let pem = read(path, "certificate file")?;
            let earliest = crate::identity::expiries(&pem)
                .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?
                .into_iter()
                .min()
                .ok_or_else(|| {
                    Error::Config(format!("{}: no certificate in it", path.display()))
                })?;
            out.push((which, earliest));
        }
        Ok(out)
    }

    /// The links of a daemon that listens on `listen` and calls each `(what, addr)` of
    /// `calls`: its listener runs TLS with `tls_cert_file`, its calls with `tls_ca_file`.
    pub fn links(&self, listen: &str, calls: &[(&str, &str)]) -> Vec<Link> {
        let mut out = vec![Link {
            what: "listen".into(),
            addr: listen.to_string(),
            tls: self.tls_cert_file.is_some(),
        }];
        for (what, addr) in calls {
            out.push(Link {
                what: what.to_string(),
                addr: addr.to_string(),
                tls: self.tls_ca_file.is_some(),
            });
        }
        out
    }

    /// Refuse `links` that would carry tokens in plain text across the network, unless
    /// `insecure_plaintext` says the network is trusted. `daemon` names the daemon.
    pub fn refuse_exposed(&self, daemon: &str, links: &[Link]) -> Result<(), Error> {
        if self.insecure_plaintext {
            return Ok(());
        }
        let exposed: Vec<String> = links
            .iter()
            .filter(|l| l.exposed())
            .map(|l| format!("{} {}", l.what, l.addr))
            .collect();
        if exposed.is_empty() {
            return Ok(());
        }
        let fix = if links.iter().any(|l| l.what == "listen" && l.exposed()) {
            "serve TLS (tls_cert_file and tls_key_file, from `strait certs issue`)"
        } else {
            "call over TLS (tls_ca_file, the CA of the daemons it calls)"
        };
        Err(Error::Config(format!(
            "{daemon} would carry tokens in plain text across the network ({}): anyone on the \
             path could read and replay them. Use TLS: {fix}, as deploy/README.md does; or, on a \
             network you trust, set insecure_plaintext = true (--insecure-plaintext)",
            exposed.join(", ")
        )))
    }

    /// Whether callers must present a client certificate.
    pub fn mutual_tls(&self) -> bool {
        self.tls_client_ca_file.is_some()
    }

    /// The server's TLS settings, or None for plain text.
    pub fn server_tls(&self) -> Result<Option<ServerTlsConfig>, Error> {
        let (Some(cert), Some(key)) = (&self.tls_cert_file, &self.tls_key_file) else {
            return Ok(None);
        };
        crate::use_ring_for_tls();
        let mut t = ServerTlsConfig::new().identity(Identity::from_pem(
            read(cert, "TLS certificate")?,
            read_key_file(key)?,
        ));
        if let Some(ca) = &self.tls_client_ca_file {
            t = t.client_ca_root(Certificate::from_pem(read(ca, "client CA")?));
        }
        Ok(Some(t))
    }

    /// How the server's link reads in a log line.
    pub fn describe(&self) -> &'static str {
        match (self.tls_cert_file.is_some(), self.mutual_tls()) {
            (true, true) => "TLS, client certificates required",
            (true, false) => "TLS",
            _ => "plain text",
        }
    }

    /// The TLS settings for calls this daemon makes: the CA in `tls_ca_file`, and its own
    /// certificate as the client's (when it has one). None without `tls_ca_file`.
    pub fn client_tls(&self) -> Result<Option<ClientTls>, Error> {
        let Some(ca) = &self.tls_ca_file else {
            return Ok(None);
        };
        let identity = match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(c), Some(k)) => Some((read(c, "TLS certificate")?, read_key_file(k)?)),
            _ => None,
        };
        Ok(Some(ClientTls {
            ca_pem: read(ca, "CA")?,
            identity,
            domain: None,
        }))
    }

    /// Credentials for calls this daemon makes with `token` (may be None where its
    /// certificate names its role).
    pub fn credentials(&self, token: Option<&str>) -> Result<Credentials, Error> {
        Credentials::new(token.filter(|t| !t.is_empty()), self.client_tls()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::role::Roles;

    #[test]
    fn role_tokens_come_from_the_table_files_and_the_shared_token() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("admin.token");
        std::fs::write(&f, "admin-from-file-0123456789\nignored\n").unwrap();
        // a token file others may read is refused, as ssh refuses such a key
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_token_file(&f).unwrap_err().to_string();
        assert!(e.contains("other users") && e.contains("chmod 600"), "{e}");
        // (0644 is refused whoever owns it: every user may read it)
        strait_ids::private::write_private(&f, b"admin-from-file-0123456789\nignored\n").unwrap();
        let s: Security = toml::from_str(
            r#"
            [tokens]
            mount = "mount-token-0123456789"
            peer = ["peer-old-token-0123456", "peer-new-token-0123456"]
            [token_files]
            admin = "ADMIN"
            "#
            .replace("ADMIN", &f.display().to_string())
            .as_str(),
        )
        .unwrap();
        s.validate().unwrap();
        let t = s
            .accepted(Some("shared-token-0123456789"), &Role::ALL)
            .unwrap();
        assert_eq!(
            t.roles_of(b"Bearer mount-token-0123456789"),
            Roles::of(&[Role::Mount])
        );
        assert_eq!(
            t.roles_of(b"Bearer admin-from-file-0123456789"),
            Roles::of(&[Role::Admin])
        );
        // a list: each token is accepted (one replacing another)
        for p in [
            &b"Bearer peer-old-token-0123456"[..],
            b"Bearer peer-new-token-0123456",
        ] {
            assert_eq!(t.roles_of(p), Roles::of(&[Role::Peer]));
        }
        assert_eq!(
            t.roles_of(b"Bearer shared-token-0123456789"),
            Roles::of(&[Role::Mirror, Role::Primary])
        );
        // a role that is not a role, and a short token, are refused
        assert!(toml::from_str::<Security>("[tokens]\nroot = \"x\"").is_err());
        let short: Security = toml::from_str("[tokens]\nmount = \"x\"").unwrap();
        assert!(short.validate().is_err());
        assert!(short.accepted(None, &[]).is_err());
    }

    #[test]
    fn plain_links_off_loopback_are_refused_unless_told() {
        for a in [
            "127.0.0.1:7420",
            "127.3.4.5:1",
            "[::1]:7420",
            "localhost:7430",
            "::1",
        ] {
            assert!(is_loopback(a), "{a}");
        }
        for a in [
            "10.0.1.10:7420",
            "0.0.0.0:7420",
            "[::]:1",
            "replicator-a.example:7430",
            "",
        ] {
            assert!(!is_loopback(a), "{a}");
        }
        let plain = Security::default();
        let on_loopback = plain.links("127.0.0.1:7420", &[("to the replicator", "127.0.0.1:7430")]);
        plain.refuse_exposed("the primary", &on_loopback).unwrap();
        // a listener off loopback, then a call off loopback
        let e = plain
            .refuse_exposed("the primary", &plain.links("10.0.1.10:7420", &[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("listen 10.0.1.10:7420") && e.contains("insecure_plaintext"),
            "{e}"
        );
        let links = plain.links("127.0.0.1:7420", &[("to the replicator", "10.0.3.10:7430")]);
        let e = plain
            .refuse_exposed("the primary", &links)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("to the replicator 10.0.3.10:7430") && e.contains("tls_ca_file"),
            "{e}"
        );
        assert!(links[1].to_string().contains("PLAIN TEXT"), "{}", links[1]);
        // told the network is trusted
        let trusted = Security {
            insecure_plaintext: true,
            ..Default::default()
        };
        trusted
            .refuse_exposed("the primary", &trusted.links("0.0.0.0:7420", &[]))
            .unwrap();
        // TLS both ways
        let tls = Security {
            tls_cert_file: Some("c".into()),
            tls_key_file: Some("k".into()),
            tls_ca_file: Some("ca".into()),
            ..Default::default()
        };
        let links = tls.links("10.0.1.10:7420", &[("to the replicator", "10.0.3.10:7430")]);
        tls.refuse_exposed("the primary", &links).unwrap();
        assert_eq!(links[0].to_string(), "listen 10.0.1.10:7420 (TLS)");
    }

    #[test]
    fn named_credentials_come_from_the_table_with_their_rules() {
        let s: Security = toml::from_str(
            r#"
            [tokens]
            mount = "mount-token-0123456789"
            [[credentials]]
            name = "team-a"
            token = ["team-a-old-token-0123456", "team-a-new-token-0123456"]
            subtree = "/team-a"
            root_squash = true
            [[credentials]]
            name = "ops"
            roles = ["mount", "admin"]
            token = "ops-token-0123456789abc"
            all_squash = true
            anon_uid = 7
            "#,
        )
        .unwrap();
        s.validate().unwrap();
        let t = s.accepted(None, &[]).unwrap();
        for given in [
            &b"Bearer team-a-old-token-0123456"[..],
            b"Bearer team-a-new-token-0123456",
        ] {
            let (roles, n) = t.named_of(given).unwrap();
            assert_eq!(roles, Roles::of(&[Role::Mount]));
            assert_eq!(n.name, "team-a");
            assert_eq!(n.rules.subtree(), Some("/team-a"));
            assert!(n.rules.root_squash);
        }
        let (roles, n) = t.named_of(b"Bearer ops-token-0123456789abc").unwrap();
        assert_eq!(roles, Roles::of(&[Role::Mount, Role::Admin]));
        assert_eq!(n.rules.anon_uid, Some(7));
        assert!(t.named_of(b"Bearer mount-token-0123456789").is_none());
        // each is refused with a line that says why
        for (bad, why) in [
            ("[[credentials]]\nname = \"x\"", "token"),
            (
                "[[credentials]]\nname = \"a b\"\ntoken = \"abcdefabcdef0123456\"",
                "name",
            ),
            (
                "[[credentials]]\nname = \"x\"\ntoken = \"abcdefabcdef0123456\"\nsubtree = \"rel\"",
                "absolute",
            ),
            (
                "[[credentials]]\nname = \"x\"\ntoken = \"abcdefabcdef0123456\"\n\
                 [[credentials]]\nname = \"x\"\ntoken = \"abcdefabcdef0123457\"",
                "two credentials",
            ),
        ] {
            let s: Security = toml::from_str(bad).unwrap();
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        // one token for two credentials is refused when the tokens are read
        let s: Security = toml::from_str(
            "[[credentials]]\nname = \"x\"\ntoken = \"abcdefabcdef0123456\"\n\
             [[credentials]]\nname = \"y\"\ntoken = \"abcdefabcdef0123456\"",
        )
        .unwrap();
        s.validate().unwrap();
        assert!(s.accepted(None, &[]).is_err());
    }

    #[test]
    fn tls_settings_must_go_together() {
        let s = Security {
            tls_cert_file: Some("c".into()),
            ..Default::default()
        };
        assert!(s.validate().is_err());
        let s = Security {
            tls_client_ca_file: Some("c".into()),
            ..Default::default()
        };
        assert!(s.validate().is_err());
        assert_eq!(Security::default().describe(), "plain text");
        assert!(Security::default().server_tls().unwrap().is_none());
        assert!(Security::default().client_tls().unwrap().is_none());
    }
}
