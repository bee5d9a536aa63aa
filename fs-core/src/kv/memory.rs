//! In-memory backend, for unit tests. A transaction holds the store's lock from start to
//! commit, so transactions are trivially serializable.

use std::collections::BTreeMap;

use parking_lot::RwLock;

use super::{
    decode_counter, log_key, versioned_value, KvEngine, KvPairs, KvTxn, WriteSet, LAST_VERSION_KEY,
};
use crate::error::Result;
use crate::Version;

#[derive(Default)]
pub struct MemoryKv {
    map: RwLock<BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl MemoryKv {
    pub fn new() -> Self {
        Self::default()
    }
}

struct MemTxn<'a> {
    map: &'a BTreeMap<Vec<u8>, Vec<u8>>,
    ws: WriteSet,
}

impl KvTxn for MemTxn<'_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if let Some(v) = self.ws.lookup(key) {
            return Ok(v);
        }
        Ok(self.map.get(key).cloned())
    }
    fn scan(&mut self, prefix: &[u8], start_after: Option<&[u8]>, limit: usize) -> Result<KvPairs> {
        let base = scan_map(
            self.map,
            prefix,
            start_after,
            limit.saturating_add(self.ws.writes.len()),
        );
        Ok(self.ws.overlay_scan(base, prefix, start_after, limit))
    }
    fn put(&mut self, key: &[u8], value: &[u8]) {
        self.ws.put(key, value)
    }
    fn delete(&mut self, key: &[u8]) {
        self.ws.delete(key)
    }
    fn add(&mut self, key: &[u8], delta: i64) {
        self.ws.add(key, delta)
    }
    fn append_log(&mut self, record: Vec<u8>) {
        self.ws.append_log(record)
    }
    fn put_versioned(&mut self, key: &[u8], value: &[u8]) {
        self.ws.put_versioned(key, value)
    }
}

fn scan_map(
    map: &BTreeMap<Vec<u8>, Vec<u8>>,
    prefix: &[u8],
    start_after: Option<&[u8]>,
    limit: usize,
) -> KvPairs {
    use std::ops::Bound;
    let lower = match start_after {
        Some(a) if a >= prefix => Bound::Excluded(a.to_vec()),
        _ => Bound::Included(prefix.to_vec()),
    };
    map.range((lower, Bound::Unbounded))
        .take_while(|(k, _)| k.starts_with(prefix))
        .take(limit)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

impl KvEngine for MemoryKv {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn txn(&self, f: &mut dyn FnMut(&mut dyn KvTxn) -> Result<()>) -> Result<Option<Version>> {
        let mut map = self.map.write();
        let mut t = MemTxn {
            map: &map,
            ws: WriteSet::default(),
        };
        f(&mut t)?;
        let ws = t.ws;
        ws.check_versioned()?;
        // compute every counter before the first write, so a corrupt counter aborts cleanly
        let mut counters: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
        for (k, d) in &ws.adds {
            let cur = match counters.get(k) {
                Some(c) => *c,
                None => match ws.writes.get(k) {
                    Some(v) => decode_counter(v.clone())?,
                    None => decode_counter(map.get(k).cloned())?,
                },
            };
            counters.insert(k.clone(), cur.wrapping_add(*d));
        }
        let version = match ws.log {
            Some(_) => Some(Version(
                decode_counter(map.get(LAST_VERSION_KEY).cloned())? as u64 + 1,
            )),
            None => None,
        };
        for (k, v) in ws.writes {
            match v {
                Some(v) => map.insert(k, v),
                None => map.remove(&k),
            };
        }
        for (k, v) in counters {
            map.insert(k, v.to_le_bytes().to_vec());
        }
        let (Some(record), Some(version)) = (ws.log, version) else {
            return Ok(None);
        };
        map.insert(
            LAST_VERSION_KEY.to_vec(),
            (version.0 as i64).to_le_bytes().to_vec(),
        );
        map.insert(log_key(version), record);
        for (k, value) in ws.versioned {
            map.insert(k, versioned_value(&value, version));
        }
        Ok(Some(version))
    }

    fn read(&self, f: &mut dyn FnMut(&mut dyn KvTxn) -> Result<()>) -> Result<()> {
        let map = self.map.read();
        let mut t = MemTxn {
            map: &map,
            ws: WriteSet::default(),
        };
        f(&mut t)
    }

    fn incr(&self, key: &[u8], delta: i64) -> Result<i64> {
        let mut map = self.map.write();
        let v = decode_counter(map.get(key).cloned())?.wrapping_add(delta);
        map.insert(key.to_vec(), v.to_le_bytes().to_vec());
        Ok(v)
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn last_version(&self) -> Result<Version> {
        Ok(Version(
            decode_counter(self.map.read().get(LAST_VERSION_KEY).cloned())? as u64,
        ))
    }

    fn wipe(&self) -> Result<()> {
        self.map.write().clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::MemoryKv;
    use crate::kv::{conformance, KvEngine};

    fn make() -> Arc<dyn KvEngine> {
        Arc::new(MemoryKv::new())
    }

    #[test]
    fn passes_the_conformance_suite() {
        conformance::run_all(&make);
    }
}
