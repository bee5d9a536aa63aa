//! Shipping a primary's change log to the replicator (docs/changelog.md, "Shipping"), for
//! whichever daemon is the primary: `strait primary`, or a mirror promoted to primary
//! (docs/operations.md, "Promoting a mirror").
//!
//! - [`tap`]: tells the shipper of each commit as it happens.
//! - [`shipper`]: tails the outbox, appends it to the replicator, trims it, beats.
//! - [`fence`]: what the metadata service asks of the shipper: may this daemon commit at all
//!   (its epoch, its lease), and, in `replicated` durability, when a version is replicated.
//! - [`catchup`]: a primary whose metadata went back applies what it lost from the log.
//! - [`history`]: this primary's history against the log: where they part.

pub mod catchup;
pub mod fence;
pub mod history;
pub mod shipper;
pub mod tap;
