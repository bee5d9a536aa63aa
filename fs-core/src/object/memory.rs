//! In-memory object store, for unit tests.

use std::collections::BTreeMap;
use std::time::SystemTime;

use bytes::Bytes;
use parking_lot::RwLock;

use super::{BoxFut, ObjectError, ObjectInfo, ObjectStore, PutIfAbsent};

#[derive(Default)]
pub struct MemoryStore {
    /// key -> (data, when it was put)
    objects: RwLock<BTreeMap<String, (Bytes, SystemTime)>>,
}

impl ObjectStore for MemoryStore {
    fn describe(&self) -> String {
        "memory://".into()
    }
    fn put<'a>(&'a self, key: &'a str, data: Bytes) -> BoxFut<'a, ()> {
        Box::pin(async move {
            self.objects
                .write()
                .insert(key.to_string(), (data, crate::clock::now()));
            Ok(())
        })
    }
    fn put_if_absent<'a>(&'a self, key: &'a str, data: Bytes) -> BoxFut<'a, PutIfAbsent> {
        Box::pin(async move {
            match self.objects.write().entry(key.to_string()) {
                std::collections::btree_map::Entry::Occupied(_) => Ok(PutIfAbsent::Exists),
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert((data, crate::clock::now()));
                    Ok(PutIfAbsent::Created)
                }
            }
        })
    }
    fn get<'a>(&'a self, key: &'a str) -> BoxFut<'a, Bytes> {
        Box::pin(async move {
            self.objects
                .read()
                .get(key)
                .map(|(d, _)| d.clone())
                .ok_or_else(|| ObjectError::NotFound(key.to_string()))
        })
    }
    fn head<'a>(&'a self, key: &'a str) -> BoxFut<'a, Option<u64>> {
        Box::pin(async move { Ok(self.objects.read().get(key).map(|(b, _)| b.len() as u64)) })
    }
    fn delete<'a>(&'a self, key: &'a str) -> BoxFut<'a, ()> {
        Box::pin(async move {
            self.objects.write().remove(key);
            Ok(())
        })
    }
    fn list<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
    ) -> BoxFut<'a, Vec<ObjectInfo>> {
        Box::pin(async move {
            let map = self.objects.read();
            Ok(map
                .range(prefix.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .filter(|(k, _)| start_after.is_none_or(|a| k.as_str() > a))
                .take(limit.min(super::LIST_LIMIT_MAX))
                .map(|(k, (v, at))| ObjectInfo {
                    key: k.clone(),
                    size: v.len() as u64,
                    modified: Some(*at),
                })
                .collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn passes_the_conformance_suite() {
        crate::object::conformance::run_all(&MemoryStore::default()).await;
    }
}
