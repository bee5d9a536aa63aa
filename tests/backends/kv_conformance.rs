//! The KV conformance suite against every backend: Redis on a real server, RocksDB in a
//! temporary directory, and memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::support::redis_server::RedisServer;
use strait_fs_core::kv::memory::MemoryKv;
use strait_fs_core::kv::redis::RedisKv;
use strait_fs_core::kv::rocks::RocksKv;
use strait_fs_core::kv::{conformance, decode_counter, KvEngine};
use strait_fs_core::{Error, Version};

const A: &[u8] = b"T\0\0\0\0\0\0\0\x01a";
const COUNTER: &[u8] = b"C\0\0\0\0\0\0\0\0";

/// Commit a transaction that reads `A` and appends a record; returns the record's version.
fn read_and_log(kv: &dyn KvEngine) -> Option<Version> {
    kv.txn(&mut |t| {
        t.get(A)?;
        t.append_log(b"record".to_vec());
        Ok(())
    })
    .expect("commit a record")
}

fn put_counter(kv: &dyn KvEngine, value: i64) {
    kv.txn(&mut |t| {
        t.put(A, &value.to_le_bytes());
        Ok(())
    })
    .expect("commit a put");
}

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
    let port = crate::support::free_port();
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
fn redis_recovers_from_a_script_flush() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let kv = RedisKv::open(&server.url(0)).expect("open redis");
    assert_eq!(read_and_log(&kv), Some(Version(1)));

    // The scripts cached on the server are gone: the engine loads them again and reruns.
    assert_eq!(
        server.command(&["SCRIPT", "FLUSH"]).expect("flush scripts"),
        "+OK"
    );
    assert_eq!(read_and_log(&kv), Some(Version(2)));
    assert_eq!(
        server.command(&["SCRIPT", "FLUSH"]).expect("flush scripts"),
        "+OK"
    );
    assert_eq!(kv.incr(COUNTER, 3).expect("incr"), 3);
}

#[test]
fn redis_reconnects_after_a_server_restart() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let kv = RedisKv::open(&server.url(0)).expect("open redis");
    assert_eq!(read_and_log(&kv), Some(Version(1)));

    // The pooled connection died with the server; the transaction notices at its first read,
    // before sending anything to commit, and runs again on a new connection. Nothing was
    // persisted, so the log starts again.
    server.restart();
    assert_eq!(read_and_log(&kv), Some(Version(1)));
    assert_eq!(kv.last_version().expect("read last version"), Version(1));
}

#[test]
fn redis_reruns_a_closure_whose_reads_went_stale() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let kv = RedisKv::open(&server.url(0)).expect("open redis");
    let other = RedisKv::open(&server.url(0)).expect("open a second client");
    put_counter(&kv, 1);

    // An error decided on a value another client has since overwritten is not returned: the
    // closure runs again and decides on the new value.
    let mut runs = 0;
    let r = kv.txn(&mut |t| {
        runs += 1;
        let seen = decode_counter(t.get(A)?)?;
        if runs == 1 {
            put_counter(&other, 2);
        }
        Err(Error::Sys(if seen == 1 {
            libc::EEXIST
        } else {
            libc::ENOENT
        }))
    });
    assert_eq!(runs, 2);
    assert!(matches!(r, Err(Error::Sys(libc::ENOENT))), "got {r:?}");

    // The same for a transaction that only reads.
    let mut runs = 0;
    let (seen, version) = strait_fs_core::kv::txn(&kv, |t| {
        runs += 1;
        let seen = decode_counter(t.get(A)?)?;
        if runs == 1 {
            put_counter(&other, 3);
        }
        Ok(seen)
    })
    .expect("run a read-only transaction");
    assert_eq!((runs, seen, version), (2, 3, None));

    // An error decided before reading anything needs no check.
    let mut runs = 0;
    let r = kv.txn(&mut |_| {
        runs += 1;
        Err(Error::Sys(libc::EPERM))
    });
    assert_eq!(runs, 1);
    assert!(matches!(r, Err(Error::Sys(libc::EPERM))), "got {r:?}");
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
    conformance::run_all(&make);
}
