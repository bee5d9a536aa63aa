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

/// When each certificate in the PEM text `pem` expires (its `notAfter`, seconds since the
/// Unix epoch), in file order; an error names the first that cannot be read.
pub fn expiries(pem: &[u8]) -> Result<Vec<i64>, String> {
    let mut out = vec![];
    for (i, block) in x509_parser::pem::Pem::iter_from_buffer(pem).enumerate() {
        let block = block.map_err(|e| format!("PEM block {}: {e}", i + 1))?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        let cert = block
            .parse_x509()
            .map_err(|e| format!("certificate {}: {e}", i + 1))?;
        out.push(cert.validity().not_after.timestamp());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiries_reads_each_certificate_and_refuses_a_damaged_one() {
        let now = strait_ids::clock::now_s() as i64;
        let a = crate::certs::new_ca("a", 30).unwrap().cert;
        let b = crate::certs::new_ca("b", 400).unwrap().cert;
        let got = expiries(format!("{a}{b}").as_bytes()).unwrap();
        assert_eq!(got.len(), 2);
        let day = 86_400;
        assert!((got[0] - (now + 30 * day)).abs() < 60, "{got:?}");
        assert!((got[1] - (now + 400 * day)).abs() < 60, "{got:?}");
        // no certificate at all, and a damaged one
        assert_eq!(expiries(b"not a certificate").unwrap(), Vec::<i64>::new());
        let damaged = a.replacen("MII", "MIX", 1);
        assert!(expiries(damaged.as_bytes()).is_err());
    }
}
