//! Issuing certificates for strait's links (`strait certs`): a CA of one's own, and for each
//! daemon, mount or operator a certificate that names its roles (`OU=<role>[,<role>...]`) and its name
//! (`CN=<name>`), valid for the hosts it serves from. Each certificate is good for both ends
//! of a TLS link (server and client authentication), so one per host is enough.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

use crate::role::Role;
use crate::rules::Rules;
use crate::Error;

/// `text` as a DER UTF8String (the value of strait's rules extension).
fn der_utf8(text: &str) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = vec![0x0c];
    match b.len() {
        n if n < 0x80 => out.push(n as u8),
        n if n <= 0xff => out.extend([0x81, n as u8]),
        n => out.extend([0x82, (n >> 8) as u8, n as u8]),
    }
    out.extend_from_slice(b);
    out
}

/// Default lifetime of a CA, in days.
pub const CA_DAYS_DEFAULT: u32 = 3650;
/// Default lifetime of an issued certificate, in days.
pub const CERT_DAYS_DEFAULT: u32 = 365;
/// Longest lifetime accepted.
pub const DAYS_MAX: u32 = 36_500;

/// A certificate and its private key, as PEM.
#[derive(Clone, Debug)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

impl Pem {
    /// Write the certificate to `DIR/NAME.pem` (mode 0644) and the key to `DIR/NAME.key`
    /// (0600, its owner's only); neither may exist yet. Returns the two paths.
    pub fn write(&self, dir: &Path, name: &str) -> Result<(PathBuf, PathBuf), Error> {
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(Error::Config(format!(
                "{name:?} cannot name a file: give a name without '/' that does not start with '.'"
            )));
        }
        let (cert, key) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        for p in [&cert, &key] {
            if p.exists() {
                return Err(Error::Config(format!(
                    "{} exists: remove it first",
                    p.display()
                )));
            }
        }
        write_new(&cert, &self.cert, 0o644)?;
        write_new(&key, &self.key, 0o600)?;
        Ok((cert, key))
    }
}

/// Write `text` to a new file `p` with `mode`.
fn write_new(p: &Path, text: &str, mode: u32) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(p)
        .map_err(|e| Error::Config(format!("create {}: {e}", p.display())))?;
    f.write_all(text.as_bytes())
        .map_err(|e| Error::Config(format!("write {}: {e}", p.display())))
}

fn validity(p: &mut CertificateParams, days: u32) -> Result<(), Error> {
    if days == 0 || days > DAYS_MAX {
        return Err(Error::Config(format!(
            "a certificate's lifetime is {days} days; it must be 1 to {DAYS_MAX}"
        )));
    }
    let now = OffsetDateTime::now_utc();
    // an hour back, for clocks a little behind the issuer's
    p.not_before = now - Duration::hours(1);
    p.not_after = now + Duration::days(i64::from(days));
    Ok(())
}

fn rcgen_error(what: &str) -> impl Fn(rcgen::Error) -> Error + '_ {
    move |e| Error::Config(format!("{what}: {e}"))
}

/// A new CA named `name`, valid `days` days.
pub fn new_ca(name: &str, days: u32) -> Result<Pem, Error> {
    let key = KeyPair::generate().map_err(rcgen_error("generate the CA's key"))?;
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn.push(DnType::OrganizationName, "strait");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut p, days)?;
    let cert = p
        .self_signed(&key)
        .map_err(rcgen_error("sign the CA's certificate"))?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// A certificate for `name` with `roles`, valid for `hosts` (IP addresses or DNS names), signed
/// by the CA `ca`, valid `days` days.
pub fn issue(
    ca: &Pem,
    name: &str,
    roles: &[Role],
    hosts: &[String],
    days: u32,
) -> Result<Pem, Error> {
    issue_with_rules(ca, name, roles, hosts, days, &Rules::default())
}

/// [`issue`], the certificate carrying `rules` (squashing, a fixed uid and gid, a subtree) in
/// strait's extension ([`crate::rules::EXTENSION_OID`]) when they restrict anything.
pub fn issue_with_rules(
    ca: &Pem,
    name: &str,
    roles: &[Role],
    hosts: &[String],
    days: u32,
    rules: &Rules,
) -> Result<Pem, Error> {
    rules
        .validate()
        .map_err(|e| Error::Config(format!("the certificate's rules: {e}")))?;
    if name.is_empty() || name.chars().any(|c| c.is_control()) {
        return Err(Error::Config(format!(
            "{name:?} cannot name a certificate: give a non-empty name without control characters"
        )));
    }
    if roles.is_empty() {
        return Err(Error::Config(
            "a certificate must name at least one role (mount, mirror, primary, admin, peer)"
                .into(),
        ));
    }
    let ca_key = KeyPair::from_pem(&ca.key).map_err(rcgen_error("read the CA's key"))?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert, ca_key).map_err(rcgen_error("read the CA"))?;
    let key = KeyPair::generate().map_err(rcgen_error("generate a key"))?;
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn.push(DnType::OrganizationName, "strait");
    // one OU listing the roles (a distinguished name keeps one value per attribute type here)
    let names: Vec<&str> = roles.iter().map(|r| r.name()).collect();
    dn.push(DnType::OrganizationalUnitName, names.join(","));
    p.distinguished_name = dn;
    for h in hosts {
        let san = match h.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                h.clone()
                    .try_into()
                    .map_err(|e| Error::Config(format!("host {h:?}: {e}")))?,
            ),
        };
        p.subject_alt_names.push(san);
    }
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    p.use_authority_key_identifier_extension = true;
    if !rules.is_open() {
        p.custom_extensions
            .push(rcgen::CustomExtension::from_oid_content(
                crate::rules::EXTENSION_OID,
                der_utf8(&rules.to_text()),
            ));
    }
    validity(&mut p, days)?;
    let cert = p
        .signed_by(&key, &issuer)
        .map_err(rcgen_error("sign the certificate"))?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::from_certificate;
    use crate::role::Roles;

    fn der(pem: &str) -> Vec<u8> {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        CertificateDer::from_pem_slice(pem.as_bytes())
            .unwrap()
            .to_vec()
    }

    #[test]
    fn an_issued_certificate_names_its_roles_and_holder() {
        let ca = new_ca("test CA", 10).unwrap();
        let c = issue(
            &ca,
            "mirror-b",
            &[Role::Mirror, Role::Peer],
            &["127.0.0.1".into(), "localhost".into()],
            5,
        )
        .unwrap();
        let (roles, name, rules) = from_certificate(&der(&c.cert));
        assert_eq!(roles, Roles::of(&[Role::Mirror, Role::Peer]));
        assert_eq!(name.as_deref(), Some("mirror-b"));
        assert!(rules.is_open());
        // the CA itself names no role
        let (roles, _, _) = from_certificate(&der(&ca.cert));
        assert!(roles.is_empty());
    }

    #[test]
    fn a_certificate_carries_its_holders_rules() {
        let ca = new_ca("test CA", 10).unwrap();
        // a subtree long enough for a two-byte DER length
        let long = format!("/team-a/{}", "x".repeat(300));
        for subtree in ["/team-a".to_string(), long] {
            let rules = Rules {
                subtree: Some(subtree),
                root_squash: true,
                uid: Some(1000),
                ..Default::default()
            };
            let c = issue_with_rules(&ca, "team-a-1", &[Role::Mount], &[], 5, &rules).unwrap();
            let (roles, name, read) = from_certificate(&der(&c.cert));
            assert_eq!(roles, Roles::of(&[Role::Mount]));
            assert_eq!(name.as_deref(), Some("team-a-1"));
            assert_eq!(*read, rules);
        }
        let bad = Rules {
            subtree: Some("team-a".into()),
            ..Default::default()
        };
        assert!(issue_with_rules(&ca, "x", &[Role::Mount], &[], 5, &bad).is_err());
    }

    #[test]
    fn bad_requests_for_certificates_are_refused() {
        let ca = new_ca("test CA", 10).unwrap();
        assert!(issue(&ca, "x", &[], &[], 5).is_err(), "no role");
        assert!(issue(&ca, "", &[Role::Mount], &[], 5).is_err(), "no name");
        assert!(
            issue(&ca, "x", &[Role::Mount], &[], 0).is_err(),
            "no lifetime"
        );
        assert!(new_ca("c", DAYS_MAX + 1).is_err());
        let wrong = Pem {
            cert: ca.cert.clone(),
            key: "not a key".into(),
        };
        assert!(issue(&wrong, "x", &[Role::Mount], &[], 5).is_err());
    }
}
