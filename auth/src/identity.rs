//! What a client certificate says about its holder: its roles (the subject's
//! `OU` attributes, each a comma-separated list of roles: `OU=mirror,peer`) and its name (the subject's `CN`, e.g. the
//! mirror's id). Only certificates that chain to the daemon's client CA reach this: rustls
//! checks the chain during the handshake.

use x509_parser::prelude::{FromDer, X509Certificate};

use crate::role::{Role, Roles};

/// The roles and name a certificate (DER) carries; no roles when it names none (or cannot be
/// read, which rustls would have refused already).
pub fn from_certificate(der: &[u8]) -> (Roles, Option<String>) {
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return (Roles::NONE, None);
    };
    let subject = cert.subject();
    let roles = subject
        .iter_organizational_unit()
        .filter_map(|a| a.as_str().ok())
        .flat_map(|s| s.split(','))
        .filter_map(|s| s.trim().parse::<Role>().ok())
        .fold(Roles::NONE, Roles::with);
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .map(str::to_string);
    (roles, name)
}
