//! Following a primary that moved: a promotion elsewhere (`strait mirror promote` of another
//! mirror) names the new primary in the epoch it raises, and the replicator's status carries
//! that name. This mirror reads it there once a second and moves its forwarded writes, its
//! session and its block reads to the new primary, without a restart.
//!
//! # To ensure correctness
//! - The change log needs nothing: the new primary appends to the same log at the new epoch,
//!   and the follower applies its records as any others.
//! - Forwarded calls move with [`Primary::switch`]: every clone sends its next call to the
//!   new address (a call under way finishes where it went, and fails there if the old
//!   primary is gone, as it would have without the move). The session at the new primary is
//!   opened anew, taking up the old one when the promoted mirror's engine lists it; slice ids
//!   the old primary gave are refused from then on, so a mount writes such a slice again under
//!   an id from the new primary and no block is uploaded under an id the new primary may give
//!   someone else ([`ForwardSession::primary_moved`]).
//! - Block reads go to the new primary's store first, then to the stores before it: a block
//!   the new primary has not copied yet (a planned switchover) is still read where it is.
//! - Only a name the replicator committed moves anything, and only to a primary other than
//!   this mirror; with no name (an epoch raised without one) the mirror keeps its primary.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use strait_proto::replicator as pb;
use tokio_util::sync::CancellationToken;

use crate::follower::Primary;
use crate::forward::ForwardSession;
use crate::state::Mirror;

/// How often the replicator's status is read for the primary's name.
const POLL: Duration = Duration::from_secs(1);

/// The forwarding session, once the daemon has made it (after the first bootstrap).
pub type LateForward = Arc<OnceLock<Arc<ForwardSession>>>;

/// Read the name of the epoch's primary until `stop`, and move there when it names another.
pub async fn run(
    mirror: Arc<Mirror>,
    primary: Primary,
    forward: LateForward,
    stop: CancellationToken,
) {
    let client = match strait_replicator_client::LogClient::new(
        &mirror.cfg.replicator,
        &mirror.replicator_creds,
    ) {
        Ok(c) => c.with_attempts(1),
        Err(e) => {
            tracing::error!(
                "the replicator's name for a new primary will not be read: {}",
                e.message()
            );
            return;
        }
    };
    let mut warned = false;
    loop {
        match client.leader_status().await {
            Ok(st) => {
                warned = false;
                if let Some(p) = st.primary {
                    if needs_move(&mirror, &primary, &p) {
                        move_to(&mirror, &primary, &forward, &p).await;
                    }
                }
            }
            Err(e) if !warned => {
                tracing::debug!("read the replicator's status: {}", e.message());
                warned = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

/// Whether `p`, the primary the epoch names, is one this mirror does not follow yet.
fn needs_move(mirror: &Mirror, primary: &Primary, p: &pb::PrimaryAt) -> bool {
    if p.id == mirror.cfg.id || p.addr.is_empty() {
        return false;
    }
    primary.addr() != p.addr
        || (!p.data_url.is_empty()
            && mirror.blocks.has_local()
            && mirror.blocks.primary_url().as_deref() != Some(p.data_url.as_str()))
}

async fn move_to(mirror: &Mirror, primary: &Primary, forward: &LateForward, p: &pb::PrimaryAt) {
    let from = primary.addr();
    if from != p.addr {
        match primary.switch(&p.addr) {
            Ok(_) => {}
            Err(e) => {
                tracing::error!(
                    "the replicator's epoch {} names {} at {:?} the primary, but no channel \
                     there can be made: {e:#}; writes still go to {from}",
                    p.epoch,
                    p.id,
                    p.addr
                );
                return;
            }
        }
        mirror.set_primary_addr(&p.addr);
        if let Some(f) = forward.get() {
            f.primary_moved().await;
        }
    }
    let mut store = String::new();
    if !p.data_url.is_empty() && mirror.blocks.has_local() {
        match mirror.blocks.primary_moved(&p.data_url).await {
            Ok(_) => store = format!("; blocks are read from its store {} first", p.data_url),
            Err(e) => tracing::error!(
                "the new primary's store: {e:#}; blocks are still read from the old one"
            ),
        }
    }
    mirror.metrics.primary_moves.inc();
    tracing::warn!(
        "the replicator's epoch {} names {} at {} the primary (it was {from}): this region's \
         writes are forwarded there{store}",
        p.epoch,
        p.id,
        p.addr
    );
    println!(
        "strait mirror: the primary moved to {} at {} (epoch {})",
        p.id, p.addr, p.epoch
    );
}
