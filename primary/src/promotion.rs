//! The record that an engine is a promoted mirror's (`strait mirror promote`): written in the
//! engine before the promoted mirror takes its first change, so that a restart comes back as
//! the primary of the promotion's epoch; removed when the engine rejoins as a mirror
//! (`strait primary rejoin`, the way back after a switchover). Region-local: never in the
//! change log, snapshots or digests.

use prost::Message;
use strait_fs_core::kv::{self, tags, DynKv};
use strait_proto::site as s;

/// The key of the promotion in the engine.
fn promotion_key() -> Vec<u8> {
    let mut k = vec![tags::MIRROR_ROLE, 0, 0, 0, 0, 0, 0, 0, 0];
    k.extend_from_slice(b"promotion");
    k
}

/// The promotion the engine records, if it was promoted.
pub fn recorded(kv: &DynKv) -> anyhow::Result<Option<s::Promotion>> {
    let mut got = None;
    kv::read(kv.as_ref(), |t| {
        got = t.get(&promotion_key())?;
        Ok(())
    })?;
    match got {
        None => Ok(None),
        Some(b) => s::Promotion::decode(b.as_slice())
            .map(Some)
            .map_err(|e| anyhow::anyhow!("the recorded promotion does not decode: {e}")),
    }
}

/// Remove the record of the engine's promotion: started again, `strait mirror` on it follows
/// the log instead of coming back as the primary. Whether there was one.
pub fn forget(kv: &DynKv) -> anyhow::Result<bool> {
    let had = recorded(kv)?.is_some();
    if had {
        kv::txn(kv.as_ref(), |t| {
            t.delete(&promotion_key());
            Ok(())
        })?;
        kv.sync()?;
    }
    Ok(had)
}

/// Record the promotion `p`, synced.
pub fn record(kv: &DynKv, p: &s::Promotion) -> strait_fs_core::Result<()> {
    let b = p.encode_to_vec();
    kv::txn(kv.as_ref(), |t| {
        t.put(&promotion_key(), &b);
        Ok(())
    })?;
    kv.sync()
}
