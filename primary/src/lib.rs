//! The primary site daemon (`strait primary`): it owns its region's metadata engine and serves
//! the metadata API to every mount of the region over gRPC, with token auth, optional (mutual)
//! TLS, sessions with heartbeats, garbage collection of dead blocks, Prometheus metrics and
//! OpenTelemetry traces.

pub mod config;
pub mod daemon;
pub mod gc;
pub mod metrics;
pub mod service;
pub mod shipper;
pub mod site;

pub use config::PrimaryConfig;
