//! Network namespaces: a namespace per host of deploy/README.md's rehearsal (the installer
//! itself is the test kit's, `strait_lab::netns`), and a Garage on such a host.

pub mod network;

pub use network::{in_ns, ns_of, nsenter, Network, OPS};

/// A host of a network namespace to run a Garage on, at the usual ports (S3 3900, RPC 3901,
/// admin 3903), with its own bucket name.
#[derive(Debug, Clone)]
pub struct OnHost {
    /// The host's network namespace.
    pub netns: String,
    pub ip: std::net::Ipv4Addr,
    pub bucket: String,
}
