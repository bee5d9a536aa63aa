//! Who may call what in strait, and over which TLS. Every daemon and client uses this crate
//! the same way:
//!
//! - [`Role`]: a mount, a mirror, the primary, an operator (admin), a replicator peer.
//! - [`policy`]: the one table of which roles may call each method of every service.
//! - A caller proves its roles with a **token** ([`Tokens`]; `authorization: Bearer ...`) and/or
//!   a **client certificate** whose subject names them (`OU=<role>[,<role>...]`, `CN=<name>`;
//!   [`identity`]), checked by rustls against the daemon's client CA.
//! - [`Guard`]: the tower layer every gRPC server runs; it answers UNAUTHENTICATED or
//!   PERMISSION_DENIED before a call reaches the service, and holds each request to its
//!   method's size ([`limit`]).
//! - [`Security`]: the configuration keys every daemon shares (tokens per role, TLS files);
//!   [`Credentials`]: what a client presents (token, CA, client certificate).
//! - [`Slots`]: bounds on what one peer, and all of them, may make a daemon hold (sessions,
//!   subscriptions).
//! - [`certs`]: a CA and certificates for a topology (`strait certs`).

pub mod certs;
mod client;
mod config;
mod guard;
pub mod identity;
pub mod limit;
pub mod policy;
mod role;
pub mod rules;
mod slots;
mod tokens;
pub mod trace;

pub use client::{host_of, Bearer, ClientTls, Conn, Credentials};
pub use config::{
    is_loopback, read_key_file, read_token_file, Link, NamedCredential, Security, TokenList,
};
pub use guard::{caller, Caller, Guard, Guarded, Refusal};
pub use role::{Role, Roles};
pub use rules::Rules;
pub use slots::{Slot, Slots};
pub use tokens::{check_token, new_token, Tokens, TOKEN_LEN_MAX, TOKEN_LEN_MIN};

/// Make ring the process's TLS provider, unless one is set already. rustls cannot pick one
/// by itself when more than one is built in (the AWS SDK brings aws-lc-rs, strait's TLS uses
/// ring), and tonic's TLS server asks for the process's; every TLS setting of this crate calls
/// this first, so a library user needs no set-up of its own.
pub fn use_ring_for_tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A setting that cannot be used (a token too short, a file that cannot be read, a bad
/// certificate request).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Config(String),
}
