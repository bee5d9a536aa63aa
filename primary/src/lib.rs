//! The primary role, wherever it runs: the `strait primary` daemon ([`daemon`]), and what a
//! mirror promoted to primary runs too (`strait_mirror::promote`).
//!
//! - [`ship`]: shipping the change log to the replicator, the write fence and replication wait
//!   it gives the metadata service, catching up a primary whose metadata went back.
//! - [`backup`]: the metadata backups it keeps in the object store.
//! - [`gc`]: deleting dead slices' blocks once every mirror has applied past their death.
//! - [`handover`]: a planned switchover that hands over to a mirror.
//! - [`history`]: this primary's history against the replicator's log: where they part.
//! - [`set_aside`]: a diverged primary's own changes set aside, or an old primary made a
//!   mirror (`strait primary set-aside`, `strait primary rejoin`).
//! - [`promotion`]: the record that an engine is a promoted mirror's.
//! - [`daemon`], [`config`], [`site`]: the `strait primary` daemon, its settings and its site
//!   service (snapshots, digests, GC on demand, status).
//!
//! What both site daemons serve (the metadata service, sessions, metrics, workers) is
//! [`strait_server`]'s.

pub mod backup;
pub mod config;
pub mod daemon;
pub mod gc;
pub mod handover;
pub mod history;
pub mod promotion;
pub mod set_aside;
pub mod ship;
pub mod site;

/// The site daemon's metrics, which the shipper and GC count into.
pub use strait_server::metrics;

pub use config::PrimaryConfig;
