//! The primary site daemon (`strait primary`): it owns its region's metadata engine and serves
//! the metadata API of [`strait_site`] to every mount of the region over gRPC, with optional
//! (mutual) TLS; it ships the change log to the replicator, deletes dead slices' blocks and
//! exports OpenTelemetry traces. The shipping itself is [`strait_ship`]'s, which a mirror promoted
//! to primary runs too.

pub mod config;
pub mod daemon;
pub mod site;

/// The site daemon's metrics, which the shipper and GC count into.
pub use strait_site::metrics;

pub use config::PrimaryConfig;
