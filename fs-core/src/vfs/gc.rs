//! Deletion of dead slices' blocks. It runs where the engine is: in the embedded mount, in
//! `strait gc`, and in a site daemon (whose mounts leave it to the daemon).

use super::retry_store;
use crate::clock::now_ns;
use crate::error::Result;
use crate::layout::{block_count, block_key, block_len};
use crate::meta::Meta;
use crate::object::DynStore;
use crate::SliceId;

/// Most dead slices handled in one pass. With mirrors a slice listed for the first time waits
/// out `gc_mirror_grace_ms` (60 s) before its blocks may go, so this bounds the rate too:
/// 10,000 a minute at the least while there is a backlog.
pub const GC_SLICES_PER_PASS_MAX: usize = 10_000;
/// The pause between passes while there is a backlog (see [`next_pass_in`]).
pub const GC_BACKLOG_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

/// How long to wait before the next pass, after one that listed `listed` dead slices (the
/// most it may: a backlog) and deleted the blocks of `purged`. A busy file system kills
/// slices faster than one pass per `period` deletes them (the 1-hour chaos soak: about 75 a
/// second, 50,000 waiting after 20 minutes and the stores growing 3 MiB/s), so a full pass
/// that made progress is followed by the next after [`GC_BACKLOG_PAUSE`]; a pass that was not
/// full, or deleted nothing (every slice listed is still held for the mirrors), waits the
/// regular `period`.
pub fn next_pass_in(
    listed: usize,
    purged: usize,
    period: std::time::Duration,
) -> std::time::Duration {
    if purged > 0 && listed >= GC_SLICES_PER_PASS_MAX {
        GC_BACKLOG_PAUSE.min(period)
    } else {
        period
    }
}

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
    if let Some(why) = meta.deletions_refused() {
        tracing::info!("GC deletes nothing: {why}");
        return Ok(0);
    }
    // what the trash kept past its retention dies first: its slices are listed at a later
    // pass, once their own delay passed
    match meta.expire_trash_due(now) {
        Ok(0) => {}
        Ok(n) => tracing::info!("deleted {n} entries of the trash kept past its retention"),
        Err(e) => tracing::warn!("expire the trash: {e}"),
    }
    // and what clones given up or left idle copied
    match meta.drop_idle_clones_due(now) {
        Ok(0) => {}
        Ok(n) => tracing::info!("dropped {n} clones given up or left idle"),
        Err(e) => tracing::warn!("drop idle clones: {e}"),
    }
    let delay_ns = meta.settings().trash_delay_s as i64 * 1_000_000_000;
    let dead = meta.dead_slices(now.saturating_sub(delay_ns), GC_SLICES_PER_PASS_MAX)?;
    let bs = meta.settings().block_size;
    let mut purged = vec![];
    for (id, d) in dead {
        if !allow(id) {
            continue;
        }
        // asked again before each slice: the gate may close during a pass
        if meta.deletions_refused().is_some() {
            break;
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
        if let Some(why) = meta.deletions_refused() {
            // their blocks are gone; they stay listed, and a later pass purges them
            tracing::info!("the blocks of {n} dead slices were deleted; not purged now: {why}");
            return Ok(0);
        }
        meta.purge_slices(purged)?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_full_pass_that_made_progress_is_followed_at_once() {
        let period = Duration::from_secs(30);
        assert_eq!(
            next_pass_in(GC_SLICES_PER_PASS_MAX, 600, period),
            GC_BACKLOG_PAUSE
        );
        // not full: the backlog is gone
        assert_eq!(next_pass_in(9_999, 9_999, period), period);
        // full but nothing deleted (all held for the mirrors): no point in hurrying
        assert_eq!(next_pass_in(GC_SLICES_PER_PASS_MAX, 0, period), period);
        // a period shorter than the pause stays as it is
        let short = Duration::from_millis(100);
        assert_eq!(next_pass_in(GC_SLICES_PER_PASS_MAX, 1, short), short);
    }
}
