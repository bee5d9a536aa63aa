//! [`Tokens`]: the bearer tokens a daemon accepts, and the roles each one grants.

use subtle::ConstantTimeEq;

use crate::role::{Role, Roles};
use crate::Error;

/// Shortest token accepted: 16 characters, 96 bits or more from any decent generator
/// (`strait certs token` makes 32 hex digits).
pub const TOKEN_LEN_MIN: usize = 16;
/// Longest token accepted (a header must stay small).
pub const TOKEN_LEN_MAX: usize = 512;

/// Check that `token` may be used: printable ASCII without spaces, 16 to 512 characters.
pub fn check_token(token: &str) -> Result<(), Error> {
    if token.chars().any(|c| !c.is_ascii_graphic()) {
        return Err(Error::Config(
            "a token must be printable ASCII without spaces".into(),
        ));
    }
    if token.len() < TOKEN_LEN_MIN {
        return Err(Error::Config(format!(
            "a token must have at least {TOKEN_LEN_MIN} characters (this one has {}); \
             `strait certs token` makes one",
            token.len()
        )));
    }
    if token.chars().all(|c| token.starts_with(c)) {
        return Err(Error::Config(format!(
            "a token of one character repeated ({} times) is guessed first; `strait certs \
             token` makes a random one",
            token.len()
        )));
    }
    if token.len() > TOKEN_LEN_MAX {
        return Err(Error::Config(format!(
            "a token must have at most {TOKEN_LEN_MAX} characters (this one has {})",
            token.len()
        )));
    }
    Ok(())
}

/// A new random token: 32 hex digits (128 bits from the thread's CSPRNG, seeded by the OS).
pub fn new_token() -> String {
    rand::random::<[u8; 16]>()
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// The tokens a daemon accepts, each with the roles it grants.
#[derive(Clone, Default)]
pub struct Tokens {
    /// `authorization` header values (`Bearer <token>`), each with its roles.
    entries: Vec<(Vec<u8>, Roles)>,
    /// The tokens of named credentials (`[[credentials]]`), each with its roles.
    named: Vec<(Vec<u8>, Roles, Named)>,
}

/// A token of a named credential: its name and rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub name: String,
    pub rules: std::sync::Arc<crate::rules::Rules>,
}

impl Tokens {
    pub fn new() -> Self {
        Tokens::default()
    }

    /// Accept `token` for `role` (a token given for several roles grants them all).
    pub fn add(&mut self, role: Role, token: &str) -> Result<(), Error> {
        check_token(token)?;
        let header = format!("Bearer {token}").into_bytes();
        match self.entries.iter_mut().find(|(h, _)| *h == header) {
            Some((_, r)) => *r = r.with(role),
            None => self.entries.push((header, Roles::NONE.with(role))),
        }
        Ok(())
    }

    /// Accept `token` for `roles` as the credential `name`, under `rules`. A token may
    /// belong to one credential only, and not also to a role without a name.
    pub fn add_named(
        &mut self,
        roles: &[Role],
        token: &str,
        name: &str,
        rules: crate::rules::Rules,
    ) -> Result<(), Error> {
        check_token(token)?;
        let header = format!("Bearer {token}").into_bytes();
        if self.entries.iter().any(|(h, _)| *h == header)
            || self.named.iter().any(|(h, _, _)| *h == header)
        {
            return Err(Error::Config(
                "its token is another credential's too: each credential needs its own".into(),
            ));
        }
        let roles = roles.iter().fold(Roles::NONE, |r, x| r.with(*x));
        self.named.push((
            header,
            roles,
            Named {
                name: name.to_string(),
                rules: std::sync::Arc::new(rules),
            },
        ));
        Ok(())
    }

    /// The named credential whose token the header `given` carries, with its roles.
    pub fn named_of(&self, given: &[u8]) -> Option<(Roles, &Named)> {
        let mut found = None;
        for (h, r, n) in &self.named {
            if bool::from(given.ct_eq(h)) {
                found = Some((*r, n));
            }
        }
        found
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.named.is_empty()
    }

    /// Whether two tokens are equal, compared in constant time (the time says only whether
    /// their lengths differ).
    pub fn equal(given: &str, expected: &str) -> bool {
        bool::from(given.as_bytes().ct_eq(expected.as_bytes()))
    }

    /// The roles that the `authorization` header `given` grants (none for a wrong token).
    /// Compared in constant time against every token, so the time taken says nothing about
    /// where a wrong token differs.
    pub fn roles_of(&self, given: &[u8]) -> Roles {
        let mut roles = Roles::NONE;
        for (h, r) in &self.entries {
            if bool::from(given.ct_eq(h)) {
                roles = roles.union(*r);
            }
        }
        roles
    }

    /// Every role some token grants.
    pub fn roles(&self) -> Roles {
        let named = self
            .named
            .iter()
            .fold(Roles::NONE, |a, (_, r, _)| a.union(*r));
        self.entries.iter().fold(named, |a, (_, r)| a.union(*r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_grant_their_roles_and_nothing_else() {
        let mut t = Tokens::new();
        t.add(Role::Mount, "mount-token-0123456789").unwrap();
        t.add(Role::Admin, "admin-token-0123456789").unwrap();
        t.add(Role::Mirror, "admin-token-0123456789").unwrap();
        assert_eq!(
            t.roles_of(b"Bearer mount-token-0123456789"),
            Roles::of(&[Role::Mount])
        );
        assert_eq!(
            t.roles_of(b"Bearer admin-token-0123456789"),
            Roles::of(&[Role::Admin, Role::Mirror])
        );
        assert!(t.roles_of(b"Bearer admin-token-012345678").is_empty());
        assert!(t.roles_of(b"mount-token-0123456789").is_empty());
        assert!(t.roles_of(b"").is_empty());
    }

    #[test]
    fn short_spaced_or_huge_tokens_are_refused() {
        let mut t = Tokens::new();
        assert!(t.add(Role::Mount, "short").is_err());
        assert!(t
            .add(Role::Mount, "has a space in it, long enough")
            .is_err());
        assert!(t.add(Role::Mount, &"x".repeat(TOKEN_LEN_MAX + 1)).is_err());
        // one character repeated: long enough, and the first guess
        let e = t.add(Role::Mount, &"a".repeat(32)).unwrap_err();
        assert!(e.to_string().contains("repeated"), "{e}");
        assert!(t.add(Role::Mount, &"0".repeat(TOKEN_LEN_MIN)).is_err());
        assert!(t.is_empty());
        let n = new_token();
        assert_eq!(n.len(), 32);
        assert!(check_token(&n).is_ok());
        assert_ne!(n, new_token());
    }
}
