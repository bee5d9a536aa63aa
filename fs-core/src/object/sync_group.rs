//! [`SyncGroup`]: many writers of one store share its syncs (a group commit). A writer whose
//! puts have returned asks for a sync that begins after them; the writers that ask while one
//! sync runs are all covered by the next one, so a batch of concurrent writers costs at most
//! two syncs, however many they are.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{DynStore, ObjResult};

/// Shared syncs of one store (see the module).
#[derive(Default)]
pub struct SyncGroup {
    /// Syncs begun so far (each numbered by the count when it began).
    begun: AtomicU64,
    /// The number of the last sync that finished; held while a sync runs.
    done: tokio::sync::Mutex<u64>,
}

impl SyncGroup {
    /// Return once a sync of `store` that began after this call has finished: every put that
    /// returned before the call is then durable.
    pub async fn sync(&self, store: &DynStore) -> ObjResult<()> {
        let need = self.begun.load(Ordering::Acquire) + 1;
        let mut done = self.done.lock().await;
        if *done >= need {
            return Ok(());
        }
        let n = self.begun.fetch_add(1, Ordering::AcqRel) + 1;
        store.sync().await?;
        *done = n;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::object::{BoxFut, Bytes, ObjectInfo, ObjectStore};

    /// A store that counts its syncs, each taking a moment.
    #[derive(Default)]
    struct Counting(AtomicU64);

    impl ObjectStore for Counting {
        fn describe(&self) -> String {
            "counting".into()
        }
        fn put<'a>(&'a self, _: &'a str, _: Bytes) -> BoxFut<'a, ()> {
            Box::pin(async { Ok(()) })
        }
        fn get<'a>(&'a self, k: &'a str) -> BoxFut<'a, Bytes> {
            Box::pin(async move { Err(crate::object::ObjectError::NotFound(k.into())) })
        }
        fn head<'a>(&'a self, _: &'a str) -> BoxFut<'a, Option<u64>> {
            Box::pin(async { Ok(None) })
        }
        fn delete<'a>(&'a self, _: &'a str) -> BoxFut<'a, ()> {
            Box::pin(async { Ok(()) })
        }
        fn sync(&self) -> BoxFut<'_, ()> {
            Box::pin(async {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                self.0.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
        }
        fn list<'a>(
            &'a self,
            _: &'a str,
            _: Option<&'a str>,
            _: usize,
        ) -> BoxFut<'a, Vec<ObjectInfo>> {
            Box::pin(async { Ok(vec![]) })
        }
    }

    #[tokio::test]
    async fn concurrent_writers_share_at_most_two_syncs_and_each_is_covered() {
        let counting = Arc::new(Counting::default());
        let store: DynStore = counting.clone();
        let group = Arc::new(SyncGroup::default());
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..50 {
            let (g, s) = (group.clone(), store.clone());
            tasks.spawn(async move { g.sync(&s).await });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap().unwrap();
        }
        let n = counting.0.load(Ordering::SeqCst);
        assert!((1..=2).contains(&n), "50 writers took {n} syncs");
        // a writer after them needs a sync of its own: none that ran began after its puts
        group.sync(&store).await.unwrap();
        assert_eq!(counting.0.load(Ordering::SeqCst), n + 1);
    }
}
