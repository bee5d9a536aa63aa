//! What a client certificate says about its holder: its roles (the subject's
//! `OU` attributes, each a comma-separated list of roles: `OU=mirror,peer`) and its name (the subject's `CN`, e.g. the
//! mirror's id). Only certificates that chain to the daemon's client CA reach this: rustls
//! checks the chain during the handshake.

use x509_parser::prelude::{FromDer, X509Certificate};

use std::sync::Arc;

use crate::role::{Role, Roles};
use crate::rules::Rules;

/// The roles, name and rules a certificate (DER) carries; no roles when it names none, or
/// cannot be read (which rustls would have refused already), or carries rules that cannot be
/// read: a holder whose restrictions are not understood gets nothing.
pub fn from_certificate(der: &[u8]) -> (Roles, Option<String>, Arc<Rules>) {
    let none = || (Roles::NONE, None, Arc::new(Rules::default()));
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return none();
    };
    let rules = match rules_of(&cert) {
        Ok(r) => Arc::new(r),
        Err(e) => {
            tracing::warn!("a client certificate's rules cannot be read ({e}): it gets no role");
            return none();
        }
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
    (roles, name, rules)
}

/// The rules in strait's extension of `cert` ([`crate::rules::EXTENSION_OID`]), none without it.
fn rules_of(cert: &X509Certificate<'_>) -> Result<Rules, String> {
    let oid = x509_parser::der_parser::oid::Oid::from(crate::rules::EXTENSION_OID)
        .map_err(|e| format!("the rules' OID: {e:?}"))?;
    let Some(ext) = cert.extensions().iter().find(|e| e.oid == oid) else {
        return Ok(Rules::default());
    };
    let text = utf8_of_der(ext.value).ok_or("the extension is not a DER UTF8String")?;
    Rules::from_text(text)
}

/// The text of a DER UTF8String (`0x0c`, a length, the bytes), nothing after it.
fn utf8_of_der(b: &[u8]) -> Option<&str> {
    let (&tag, rest) = b.split_first()?;
    if tag != 0x0c {
        return None;
    }
    let (&l0, rest) = rest.split_first()?;
    let (len, rest) = match l0 {
        n if n < 0x80 => (usize::from(n), rest),
        0x81 => (usize::from(*rest.first()?), rest.get(1..)?),
        0x82 => (
            usize::from(*rest.first()?) << 8 | usize::from(*rest.get(1)?),
            rest.get(2..)?,
        ),
        _ => return None,
    };
    if rest.len() != len {
        return None;
    }
    std::str::from_utf8(rest).ok()
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
