//! One conformance suite for every [`ObjectStore`] backend.
//!
//! Each backend's tests call [`run_all`] on a fresh store: the memory and local-directory
//! stores in their unit tests, S3 (on a real Garage server) in the integration tests. The
//! suite panics with the store's description and the failed expectation.
//!
//! All keys live under a namespace unique to the run (`conformance-<random>/`), so a store
//! that already holds objects can be checked, and the suite deletes what it wrote.

use std::collections::BTreeMap;
use std::task::Poll;

use bytes::Bytes;

use super::{BoxFut, ObjResult, ObjectError, ObjectInfo, ObjectStore, PutIfAbsent, LIST_LIMIT_MAX};

/// Size of a full data block, the largest object strait writes.
const BLOCK_SIZE_MAX_BYTES: usize = 4 << 20;
/// Puts of different keys issued at once in the concurrency check.
const CONCURRENT_PUTS: usize = 16;
/// Puts of the same key issued at once in the atomicity check.
const RACING_PUTS: usize = 8;

/// Run every check against `store`. Panics on the first failure.
pub async fn run_all(store: &dyn ObjectStore) {
    let ns = format!("conformance-{:016x}/", rand::random::<u64>());
    assert!(
        !store.describe().is_empty(),
        "describe() must name the store"
    );

    roundtrip(store, &ns).await;
    overwrite_replaces(store, &ns).await;
    put_if_absent_never_replaces(store, &ns).await;
    missing_objects(store, &ns).await;
    delete_is_idempotent(store, &ns).await;
    list_orders_filters_and_pages(store, &ns).await;
    concurrent_puts(store, &ns).await;
    cleanup(store, &ns).await;
}

/// Objects come back byte for byte: small, empty and block-sized.
async fn roundtrip(store: &dyn ObjectStore, ns: &str) {
    for (name, data) in [
        ("small", Bytes::from_static(b"hello, strait")),
        ("empty", Bytes::new()),
        ("block", pattern(BLOCK_SIZE_MAX_BYTES, 1)),
    ] {
        let key = format!("{ns}roundtrip/{name}");
        ok(
            store,
            store.put(&key, data.clone()).await,
            &format!("put {key}"),
        );
        let got = ok(store, store.get(&key).await, &format!("get {key}"));
        assert_same(store, &key, &got, &data);
        let size = ok(store, store.head(&key).await, &format!("head {key}"));
        assert_eq!(
            size,
            Some(data.len() as u64),
            "{}: head {key}",
            store.describe()
        );
    }
}

/// A second put of a key replaces the whole object, also with a shorter one.
async fn overwrite_replaces(store: &dyn ObjectStore, ns: &str) {
    let key = format!("{ns}overwrite");
    ok(
        store,
        store.put(&key, pattern(100_000, 2)).await,
        "put first version",
    );
    let second = Bytes::from_static(b"second version");
    ok(
        store,
        store.put(&key, second.clone()).await,
        "put second version",
    );
    let got = ok(store, store.get(&key).await, &format!("get {key}"));
    assert_same(store, &key, &got, &second);
    let size = ok(store, store.head(&key).await, &format!("head {key}"));
    assert_eq!(
        size,
        Some(second.len() as u64),
        "{}: head {key} after overwrite",
        store.describe()
    );
}

/// `put_if_absent` writes a new key, and leaves an existing object as it was (checked one
/// after the other: a race with a plain put is outside what every backend promises).
async fn put_if_absent_never_replaces(store: &dyn ObjectStore, ns: &str) {
    let key = format!("{ns}if-absent/chunks/0/0/7_0_14");
    let first = Bytes::from_static(b"first version");
    let put = ok(
        store,
        store.put_if_absent(&key, first.clone()).await,
        &format!("put_if_absent new {key}"),
    );
    assert_eq!(put, PutIfAbsent::Created, "{}: {key}", store.describe());
    let got = ok(store, store.get(&key).await, &format!("get {key}"));
    assert_same(store, &key, &got, &first);
    let again = ok(
        store,
        store
            .put_if_absent(&key, Bytes::from_static(b"other bytes!!"))
            .await,
        &format!("put_if_absent existing {key}"),
    );
    assert_eq!(again, PutIfAbsent::Exists, "{}: {key}", store.describe());
    let got = ok(store, store.get(&key).await, &format!("get {key} again"));
    assert_same(store, &key, &got, &first);
}

/// A missing key is `NotFound` (permanent: retrying cannot help) and has no size.
async fn missing_objects(store: &dyn ObjectStore, ns: &str) {
    for key in [
        format!("{ns}never-written"),
        format!("{ns}chunks/9/9/9_0_4194304"),
    ] {
        match store.get(&key).await {
            Err(e @ ObjectError::NotFound(_)) => {
                assert!(
                    e.is_permanent(),
                    "{}: NotFound must be permanent",
                    store.describe()
                )
            }
            other => panic!(
                "{}: get missing {key}: want NotFound, got {other:?}",
                store.describe()
            ),
        }
        let size = ok(
            store,
            store.head(&key).await,
            &format!("head missing {key}"),
        );
        assert_eq!(size, None, "{}: head missing {key}", store.describe());
    }
}

/// Deleting removes the object; deleting again, or a key never written, succeeds.
async fn delete_is_idempotent(store: &dyn ObjectStore, ns: &str) {
    let key = format!("{ns}delete/me");
    ok(
        store,
        store.put(&key, Bytes::from_static(b"x")).await,
        &format!("put {key}"),
    );
    ok(store, store.delete(&key).await, &format!("delete {key}"));
    assert!(
        matches!(store.get(&key).await, Err(ObjectError::NotFound(_))),
        "{}: get {key} after delete must be NotFound",
        store.describe()
    );
    let size = ok(
        store,
        store.head(&key).await,
        &format!("head {key} after delete"),
    );
    assert_eq!(size, None, "{}: head {key} after delete", store.describe());
    ok(
        store,
        store.delete(&key).await,
        &format!("delete {key} again"),
    );
    ok(
        store,
        store.delete(&format!("{ns}delete/never-written")).await,
        "delete a key never written",
    );
}

/// `list` returns keys in byte order (not numeric order, not directory-walk order),
/// filtered by prefix, strictly after `start_after`, and pages with `limit`.
async fn list_orders_filters_and_pages(store: &dyn ObjectStore, ns: &str) {
    let root = format!("{ns}list/");
    // Names chosen where byte order differs from a naive walk: '-' < '.' < '/' < '0' < '_',
    // "10_" sorts before "1_", and "chunk" is a prefix of "chunks/...".
    let names = [
        "chunks/0/0/1_0_4194304",
        "chunks/0/0/1_1_4194304",
        "chunks/0/0/2_0_1024",
        "chunks/0/0/10_0_5",
        "chunks/0/1/3_0_10",
        "chunks/0.x",
        "chunks/0-x",
        "chunks/00",
        "chunks/1/0/4_0_10",
        "chunksz",
        "chunk",
    ];
    let mut model = BTreeMap::new();
    for (i, name) in names.iter().enumerate() {
        let key = format!("{root}{name}");
        let data = pattern(i * 7 + 1, i as u64);
        ok(
            store,
            store.put(&key, data.clone()).await,
            &format!("put {key}"),
        );
        model.insert(key, data.len() as u64);
    }
    let all: Vec<(String, u64)> = model.iter().map(|(k, &size)| (k.clone(), size)).collect();
    let expect = |prefix: &str, start_after: Option<&str>, limit: usize| -> Vec<(String, u64)> {
        all.iter()
            .filter(|(key, _)| {
                key.starts_with(prefix) && start_after.is_none_or(|sa| key.as_str() > sa)
            })
            .take(limit)
            .cloned()
            .collect()
    };
    let check = |prefix: String, start_after: Option<String>, limit: usize| {
        let want = expect(&prefix, start_after.as_deref(), limit);
        async move {
            let got = ok(
                store,
                store.list(&prefix, start_after.as_deref(), limit).await,
                &format!("list prefix {prefix:?} after {start_after:?} limit {limit}"),
            );
            assert!(
                got.iter().all(|o| o.modified.is_some()),
                "{}: list gives no modification time: {got:?}",
                store.describe()
            );
            let got = keys_and_sizes(got);
            assert_eq!(
                got,
                want,
                "{}: list prefix {prefix:?} after {start_after:?} limit {limit}",
                store.describe()
            );
        }
    };

    // The whole tree, in byte order, with sizes.
    check(root.clone(), None, LIST_LIMIT_MAX).await;
    assert_eq!(expect(&root, None, LIST_LIMIT_MAX).len(), names.len());

    // Prefixes: a directory, a partial name, a name shared by files and a directory, none.
    for p in [
        "chunks/0/",
        "chunks/0/0/",
        "chunks/0/0/1_",
        "chunks/0",
        "chunks",
        "chunk",
        "nothing",
        "",
    ] {
        check(format!("{root}{p}"), None, LIST_LIMIT_MAX).await;
    }

    // start_after every existing key, and strings that are not keys.
    for key in model.keys() {
        check(root.clone(), Some(key.clone()), LIST_LIMIT_MAX).await;
    }
    for sa in [
        "",
        "chunks/",
        "chunks/0/",
        "chunks/0/0/1_5",
        "chunks/0/0/zzz",
        "chunks/0/0",
        "chunks/1",
        "zzz",
    ] {
        check(root.clone(), Some(format!("{root}{sa}")), LIST_LIMIT_MAX).await;
    }
    // start_after before the prefix, and after everything under it.
    check(
        format!("{root}chunks/1/"),
        Some(format!("{root}chunks/0")),
        LIST_LIMIT_MAX,
    )
    .await;
    check(
        format!("{root}chunks/0/"),
        Some(format!("{root}chunks/1")),
        LIST_LIMIT_MAX,
    )
    .await;

    // Pages of every small size add up to the whole listing.
    for limit in 1..=4 {
        check(root.clone(), None, limit).await;
        let mut pages = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = ok(
                store,
                store.list(&root, after.as_deref(), limit).await,
                &format!("list page after {after:?}"),
            );
            assert!(
                page.len() <= limit,
                "{}: page of {} > limit {limit}",
                store.describe(),
                page.len()
            );
            let Some(last) = page.last() else { break };
            after = Some(last.key.clone());
            pages.extend(keys_and_sizes(page));
            assert!(
                pages.len() <= names.len(),
                "{}: paging never ends",
                store.describe()
            );
        }
        assert_eq!(pages, all, "{}: pages of {limit}", store.describe());
    }
}

/// Puts of different keys at once all land; racing puts of one key leave one whole version.
async fn concurrent_puts(store: &dyn ObjectStore, ns: &str) {
    let keys: Vec<String> = (0..CONCURRENT_PUTS)
        .map(|i| format!("{ns}concurrent/{i:02}"))
        .collect();
    let datas: Vec<Bytes> = (0..CONCURRENT_PUTS)
        .map(|i| pattern(64 << 10, 100 + i as u64))
        .collect();
    let puts = keys
        .iter()
        .zip(&datas)
        .map(|(k, d)| store.put(k, d.clone()))
        .collect();
    for (key, r) in keys.iter().zip(join_all(puts).await) {
        ok(store, r, &format!("concurrent put {key}"));
    }
    for (key, data) in keys.iter().zip(&datas) {
        let got = ok(store, store.get(key).await, &format!("get {key}"));
        assert_same(store, key, &got, data);
    }
    let listed = ok(
        store,
        store
            .list(&format!("{ns}concurrent/"), None, LIST_LIMIT_MAX)
            .await,
        "list",
    );
    let listed: Vec<String> = listed.into_iter().map(|o| o.key).collect();
    assert_eq!(
        listed,
        keys,
        "{}: list after concurrent puts",
        store.describe()
    );

    let key = format!("{ns}race");
    let versions: Vec<Bytes> = (0..RACING_PUTS)
        .map(|i| pattern(256 << 10, 200 + i as u64))
        .collect();
    let puts = versions
        .iter()
        .map(|d| store.put(&key, d.clone()))
        .collect();
    for r in join_all(puts).await {
        ok(store, r, &format!("racing put {key}"));
    }
    let got = ok(store, store.get(&key).await, &format!("get {key}"));
    assert!(
        versions.contains(&got),
        "{}: {key} after racing puts is none of the versions written ({} bytes)",
        store.describe(),
        got.len()
    );
}

/// Delete everything the suite wrote, paging through `list` as a garbage collector would.
async fn cleanup(store: &dyn ObjectStore, ns: &str) {
    loop {
        let page = ok(store, store.list(ns, None, 5).await, "list for cleanup");
        if page.is_empty() {
            break;
        }
        for o in page {
            ok(
                store,
                store.delete(&o.key).await,
                &format!("delete {}", o.key),
            );
        }
    }
    let left = ok(
        store,
        store.list(ns, None, LIST_LIMIT_MAX).await,
        "list after cleanup",
    );
    assert!(
        left.is_empty(),
        "{}: left after cleanup: {left:?}",
        store.describe()
    );
}

fn keys_and_sizes(listed: Vec<ObjectInfo>) -> Vec<(String, u64)> {
    listed.into_iter().map(|o| (o.key, o.size)).collect()
}

fn ok<T>(store: &dyn ObjectStore, r: ObjResult<T>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{}: {what}: {e:?}", store.describe()))
}

/// Compare without printing megabytes on failure.
fn assert_same(store: &dyn ObjectStore, key: &str, got: &Bytes, want: &Bytes) {
    assert!(
        got == want,
        "{}: get {key}: got {} bytes (crc32 {:08x}), want {} bytes (crc32 {:08x})",
        store.describe(),
        got.len(),
        crc32fast::hash(got),
        want.len(),
        crc32fast::hash(want)
    );
}

/// Deterministic bytes that differ per seed (xorshift64).
fn pattern(len: usize, seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

/// Drive all futures at once on the current task; results in input order.
async fn join_all<'a, T>(futs: Vec<BoxFut<'a, T>>) -> Vec<ObjResult<T>> {
    let mut futs: Vec<Option<BoxFut<'a, T>>> = futs.into_iter().map(Some).collect();
    let mut results: Vec<Option<ObjResult<T>>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (slot, result) in futs.iter_mut().zip(results.iter_mut()) {
            if let Some(fut) = slot {
                match fut.as_mut().poll(cx) {
                    Poll::Ready(r) => {
                        *result = Some(r);
                        *slot = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    results.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::memory::MemoryStore;

    /// A store that lists in insertion order must fail the suite: the suite can fail.
    struct UnsortedList(MemoryStore, parking_lot::Mutex<Vec<String>>);

    impl ObjectStore for UnsortedList {
        fn describe(&self) -> String {
            "unsorted://".into()
        }
        fn put<'a>(&'a self, key: &'a str, data: Bytes) -> BoxFut<'a, ()> {
            self.1.lock().push(key.to_string());
            self.0.put(key, data)
        }
        fn get<'a>(&'a self, key: &'a str) -> BoxFut<'a, Bytes> {
            self.0.get(key)
        }
        fn head<'a>(&'a self, key: &'a str) -> BoxFut<'a, Option<u64>> {
            self.0.head(key)
        }
        fn delete<'a>(&'a self, key: &'a str) -> BoxFut<'a, ()> {
            self.0.delete(key)
        }
        fn list<'a>(
            &'a self,
            prefix: &'a str,
            _: Option<&'a str>,
            limit: usize,
        ) -> BoxFut<'a, Vec<ObjectInfo>> {
            Box::pin(async move {
                let keys: Vec<String> = self
                    .1
                    .lock()
                    .iter()
                    .filter(|k| k.starts_with(prefix))
                    .cloned()
                    .collect();
                let mut out = Vec::new();
                for key in keys.into_iter().take(limit) {
                    if let Some(size) = self.0.head(&key).await? {
                        out.push(ObjectInfo {
                            key,
                            size,
                            modified: Some(crate::clock::now()),
                        });
                    }
                }
                Ok(out)
            })
        }
    }

    #[tokio::test]
    #[should_panic(expected = "unsorted://: list prefix")]
    async fn a_store_that_lists_out_of_order_fails() {
        let store = UnsortedList(MemoryStore::default(), Default::default());
        run_all(&store).await;
    }

    #[test]
    fn patterns_differ_by_seed_and_have_the_asked_length() {
        assert_eq!(pattern(0, 1).len(), 0);
        assert_eq!(pattern(13, 1).len(), 13);
        assert_ne!(pattern(64, 1), pattern(64, 2));
        assert_eq!(pattern(64, 3), pattern(64, 3));
    }
}
