//! Deletion of dead slices' blocks. It runs where the engine is: in the embedded mount, in
//! `strait gc`, and in a site daemon (whose mounts leave it to the daemon).

use super::retry_store;
use crate::error::Result;
use crate::layout::{block_count, block_key, block_len};
use crate::meta::{now_ns, Meta};
use crate::object::DynStore;
use crate::SliceId;

/// Most dead slices handled in one pass.
pub const GC_SLICES_PER_PASS_MAX: usize = 1000;

/// Delete the blocks of slices that died more than the file system's delay ago, then forget
/// the slices. A slice whose blocks could not all be deleted stays listed for the next pass.
/// Returns how many slices were purged.
pub fn gc_once(meta: &Meta, store: &DynStore, rt: &tokio::runtime::Handle) -> Result<usize> {
    gc_once_with(meta, store, rt, now_ns(), &mut |_| true)
}

/// [`gc_once`] at the wall-clock time `now` (ns; a daemon passes a clock that cannot step
/// forward), deleting only the dead slices `allow` agrees to (it is called after the dead
/// slices are listed, once per slice). A primary with mirrors uses it to keep the blocks of
/// slices some mirror's applied metadata still references (docs/changelog.md, "Garbage collection across regions").
pub fn gc_once_with(
    meta: &Meta,
    store: &DynStore,
    rt: &tokio::runtime::Handle,
    now: i64,
    allow: &mut dyn FnMut(SliceId) -> bool,
) -> Result<usize> {
    let delay_ns = meta.settings().trash_delay_s as i64 * 1_000_000_000;
    let dead = meta.dead_slices(now.saturating_sub(delay_ns), GC_SLICES_PER_PASS_MAX)?;
    let bs = meta.settings().block_size;
    let mut purged = vec![];
    for (id, d) in dead {
        if !allow(id) {
            continue;
        }
        let mut ok = true;
        for index in 0..block_count(d.size, bs) {
            let key = block_key(id, index, block_len(d.size, bs, index));
            if let Err(e) = rt.block_on(retry_store(&format!("delete block {key}"), || {
                store.delete(&key)
            })) {
                tracing::warn!("{e}");
                ok = false;
                break;
            }
        }
        if ok {
            purged.push(id);
        }
    }
    let n = purged.len();
    if n > 0 {
        meta.purge_slices(purged)?;
    }
    Ok(n)
}
