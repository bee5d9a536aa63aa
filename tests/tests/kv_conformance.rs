//! The KV conformance suite against every backend: Redis on a real server, RocksDB in a
//! temporary directory, and memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use strait_fs_core::kv::memory::MemoryKv;
use strait_fs_core::kv::redis::RedisKv;
use strait_fs_core::kv::rocks::RocksKv;
use strait_fs_core::kv::{conformance, KvEngine};
use strait_tests::redis_server::RedisServer;

#[test]
fn redis_passes_the_kv_suite() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // Database 1, to show the URL's database is honoured; every case wipes it first.
    let url = server.url(1);
    let make = || -> Arc<dyn KvEngine> { Arc::new(RedisKv::open(&url).expect("open redis")) };
    conformance::run_all(&make);
}

#[test]
fn redis_databases_are_separate() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let one = RedisKv::open(&server.url(1)).expect("open redis db 1");
    let two = RedisKv::open(&server.url(2)).expect("open redis db 2");

    // A wipe of one database leaves the other alone.
    assert_eq!(one.incr(b"C\0\0\0\0\0\0\0\0", 7).expect("incr"), 7);
    two.wipe().expect("wipe db 2");
    assert_eq!(one.incr(b"C\0\0\0\0\0\0\0\0", 0).expect("incr"), 7);
    assert_eq!(two.incr(b"C\0\0\0\0\0\0\0\0", 0).expect("incr"), 0);
}

#[test]
fn redis_open_fails_with_the_server_named() {
    let port = strait_tests::free_port();
    let url = format!("redis://:secret@127.0.0.1:{port}/0");
    let Err(e) = RedisKv::open(&url) else {
        panic!("nothing listens on port {port}")
    };
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("connect to redis server 127.0.0.1:{port}/0")),
        "{msg}"
    );
    assert!(!msg.contains("secret"), "{msg}");
}

#[test]
fn rocksdb_passes_the_kv_suite() {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let n = AtomicUsize::new(0);
    // A fresh database per case: one process may open a RocksDB directory only once.
    let make = || -> Arc<dyn KvEngine> {
        let path = dir
            .path()
            .join(n.fetch_add(1, Ordering::Relaxed).to_string());
        Arc::new(RocksKv::open(&path).expect("open rocksdb"))
    };
    conformance::run_all(&make);
}

#[test]
fn memory_passes_the_kv_suite() {
    let make = || -> Arc<dyn KvEngine> { Arc::new(MemoryKv::new()) };
    // Known memory.rs bugs, reported to the lead; see the ignored tests in kv/memory.rs.
    conformance::run_except(
        &make,
        &["scan_unbounded_limit", "corrupt_counter_aborts_commit"],
    );
}
