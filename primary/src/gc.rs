//! Deleting dead slices' blocks at a primary that has mirrors (DESIGN.md §4, guarantee 6).
//!
//! A slice dies at some version `v` (an unlink, a truncate, a compaction). A mirror whose
//! applied version is below `v` still references it, and its mounts may read its blocks from
//! the primary's store at any moment. So the primary deletes a dead slice's blocks only once
//! every registered mirror's cursor at the replicator is at or past `v`, and a grace delay
//! has passed since (for reads a mirror's mounts started just before it applied `v`).
//!
//! Dead slices do not record the version that freed them; the pass bounds it instead: every
//! slice listed dead was freed at a version no later than the primary's version read right
//! after the listing. That bound is remembered per slice from the first pass that saw it,
//! so a busy primary still makes progress. Forgetting it (a restart) only delays deletion.
//!
//! Without a replicator there are no mirrors and nothing to wait for. With one that cannot
//! be asked, or whose answering node is not the leader, the pass deletes nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strait_fs_core::meta::Meta;
use strait_fs_core::object::DynStore;
use strait_replicator_client::LogClient;

/// Dead slices whose bound is remembered; beyond it the memory starts again (safe: a slice
/// seen again gets a newer bound).
const REMEMBERED_MAX: usize = 1_000_000;

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// Dead slices whose blocks were deleted.
    pub purged: usize,
    /// Dead slices kept because some mirror has not applied past their death (or the grace
    /// delay since it did has not passed).
    pub held: usize,
    /// The lowest applied version among the mirrors' cursors (None: no mirror registered).
    pub horizon: Option<u64>,
}

/// The mirrors' horizon, remembered between passes.
pub struct MirrorHorizon {
    client: Option<LogClient>,
    grace: Duration,
    /// slice id -> (a version at or after its death, when every mirror got there)
    seen: HashMap<u64, (u64, Option<Instant>)>,
    /// Said once until it changes, so a cut-off replicator does not flood the log.
    last_problem: Option<String>,
}

impl MirrorHorizon {
    pub fn new(replicator: &[String], grace: Duration) -> anyhow::Result<Self> {
        let client = if replicator.is_empty() {
            None
        } else {
            Some(
                LogClient::new(replicator)
                    .map_err(|s| anyhow::anyhow!("{}", s.message()))?
                    .with_attempts(2),
            )
        };
        Ok(MirrorHorizon {
            client,
            grace,
            seen: HashMap::new(),
            last_problem: None,
        })
    }

    /// The lowest cursor of the mirrors that hold the log back: Ok(None) when there is no
    /// replicator or no mirror. Mirrors marked for re-bootstrap reference nothing the
    /// primary must keep: they load a fresh snapshot.
    async fn lowest_cursor(&self) -> Result<Option<u64>, String> {
        let Some(client) = &self.client else {
            return Ok(None);
        };
        let st = client.status().await.map_err(|s| {
            format!(
                "ask the replicator for the mirrors' cursors: {}",
                s.message()
            )
        })?;
        if st.leader != Some(st.id) {
            return Err(format!(
                "replicator node {} answered but is not the leader: its cursors may be behind",
                st.id
            ));
        }
        Ok(st
            .cursors
            .iter()
            .filter(|c| !c.needs_bootstrap)
            .map(|c| c.applied_version)
            .min())
    }

    /// One pass: delete what no mirror needs any more.
    pub async fn pass(
        &mut self,
        engine: &Arc<Meta>,
        store: &DynStore,
    ) -> strait_fs_core::Result<Pass> {
        let horizon = match self.lowest_cursor().await {
            Ok(h) => {
                if self.last_problem.take().is_some() {
                    tracing::info!(
                        "the mirrors' cursors can be read again: dead blocks are deleted again"
                    );
                }
                h
            }
            Err(why) => {
                if self.last_problem.as_deref() != Some(why.as_str()) {
                    tracing::warn!("no dead block is deleted until this is fixed: {why}");
                    self.last_problem = Some(why);
                }
                return Ok(Pass::default());
            }
        };
        let e = engine.clone();
        let s = store.clone();
        let rt = tokio::runtime::Handle::current();
        let mut seen = std::mem::take(&mut self.seen);
        if seen.len() > REMEMBERED_MAX {
            seen.clear();
        }
        let grace = self.grace;
        let mirrors = self.client.is_some() && horizon.is_some();
        let r = tokio::task::spawn_blocking(move || {
            let now = Instant::now();
            let mut bound: Option<u64> = None;
            let mut held = 0;
            let mut listed = vec![];
            let r = strait_fs_core::vfs::gc::gc_once_with(&e, &s, &rt, &mut |id| {
                listed.push(id);
                let Some(h) = horizon.filter(|_| mirrors) else {
                    return true;
                };
                // read after the listing: every listed slice died at or before it
                let b = match bound {
                    Some(b) => b,
                    None => match e.kv().last_version() {
                        Ok(v) => *bound.insert(v),
                        Err(err) => {
                            tracing::warn!("read the primary's version for GC: {err}");
                            held += 1;
                            return false;
                        }
                    },
                };
                let entry = seen.entry(id).or_insert((b, None));
                if h < entry.0 {
                    held += 1;
                    return false;
                }
                let passed = *entry.1.get_or_insert(now);
                if now.duration_since(passed) < grace {
                    held += 1;
                    return false;
                }
                true
            });
            // forget the slices that are gone (purged here or by another pass)
            let listed: std::collections::HashSet<u64> = listed.into_iter().collect();
            seen.retain(|id, _| listed.contains(id));
            (r, held, seen)
        })
        .await
        .map_err(|e| strait_fs_core::Error::Meta(format!("the GC task failed: {e}")))?;
        let (r, held, seen) = r;
        self.seen = seen;
        let purged = r?;
        Ok(Pass {
            purged,
            held,
            horizon,
        })
    }
}
