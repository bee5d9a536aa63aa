//! Shipping a primary's change log to the replicator (docs/changelog.md, "Shipping"), for
//! whichever daemon is the primary: `strait primary`, or a mirror promoted to primary
//! (docs/operations.md, "Promoting a mirror").
//!
//! - [`tap`]: tells the shipper of each commit as it happens.
//! - [`shipper`]: tails the outbox, appends it to the replicator, trims it, beats.
//! - [`fence`]: what the metadata service asks of the shipper: may this daemon commit at all
//!   (its epoch, its lease), and, in `replicated` durability, when a version is replicated.
//! - [`catchup`]: a primary whose metadata went back applies what it lost from the log.

pub mod catchup;
pub mod fence;
pub mod shipper;
pub mod tap;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::{Deserialize, Serialize};
use strait_fs_core::kv::DynKv;
use strait_fs_core::Epoch;
use strait_replicator_client::Credentials;
use strait_server::metrics::Metrics;
use tokio_util::sync::CancellationToken;

use crate::ship::fence::{EpochFence, ShippedWait};
use crate::ship::shipper::{Shipper, ShipperConfig};
use crate::ship::tap::CommitSignal;

/// When a client's operation returns (docs/changelog.md, "Durability modes").
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// After the primary's local commit; the window of loss is the unshipped outbox.
    #[default]
    Local,
    /// After the replicator has committed the operation's version.
    Replicated,
}

impl std::str::FromStr for Durability {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "local" => Ok(Durability::Local),
            "replicated" => Ok(Durability::Replicated),
            o => bail!("durability {o:?}: expected `local` or `replicated`"),
        }
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Durability::Local => "local",
            Durability::Replicated => "replicated",
        })
    }
}

/// How a primary ships: where to, as whom, at which epoch, and what its mutations wait for.
pub struct Settings {
    pub replicator: Vec<String>,
    /// A token (or certificate) of the role `primary` at the replicator.
    pub creds: Credentials,
    pub epoch: Epoch,
    pub heartbeat: Duration,
    pub durability: Durability,
    /// In `replicated` durability, how long a mutation waits for the replicator.
    pub replicated_timeout: Duration,
    /// See `lease_ms` in the primary's settings; None: no lease.
    pub lease: Option<Duration>,
    /// The store this primary's mounts write blocks to, synced before shipping (see
    /// [`shipper::ShipperConfig::blocks`]).
    pub blocks: Option<strait_fs_core::object::DynStore>,
    /// How long the primary still answers reads once fenced (see [`EpochFence::fenced_reads`]).
    pub fenced_reads: Duration,
}

/// A running shipper and what the metadata service asks of it.
pub struct Shipping {
    pub shipper: Arc<Shipper>,
    /// Refuses mutations once the epoch is superseded or the lease ran out.
    pub fence: Arc<EpochFence>,
    /// In `replicated` durability: what a mutation waits for before it is answered.
    pub wait: Option<Arc<ShippedWait>>,
}

/// Start shipping `kv`'s change log (told of commits by `signal`) until `stop`.
pub fn start(
    kv: DynKv,
    signal: Arc<CommitSignal>,
    settings: &Settings,
    metrics: Arc<Metrics>,
    workers: &strait_server::workers::Workers,
    stop: CancellationToken,
) -> anyhow::Result<Shipping> {
    if settings.replicator.is_empty() {
        bail!("shipping needs the replicator's addresses");
    }
    let shipper = Shipper::new(
        kv,
        signal,
        ShipperConfig {
            replicator: settings.replicator.clone(),
            creds: settings.creds.clone(),
            epoch: settings.epoch,
            heartbeat: settings.heartbeat,
            blocks: settings.blocks.clone(),
        },
        metrics,
    )?;
    let strict = settings.durability == Durability::Replicated;
    let wait = strict.then(|| {
        Arc::new(ShippedWait {
            shipped: shipper.watch(),
            timeout: settings.replicated_timeout,
        })
    });
    let fence = Arc::new(EpochFence {
        shipped: shipper.watch(),
        started: Instant::now(),
        strict,
        lease: settings.lease.map(|l| (l, shipper.contact())),
        fenced_reads: settings.fenced_reads,
    });
    shipper.spawn(workers, stop);
    Ok(Shipping {
        shipper,
        fence,
        wait,
    })
}
