//! The metadata conformance suite (fs-core/src/meta/conformance.rs) against a real
//! redis-server. (Memory and RocksDB run it in fs-core's unit tests.)

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::support::redis_server::RedisServer;
use strait_fs_core::kv::DynKv;
use strait_fs_core::meta::conformance;

#[test]
fn redis_backend_passes_the_metadata_suite() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    // each case gets its own database, so replicas and primaries never share keys
    let next_db = AtomicU32::new(0);
    conformance::run_all(&|| {
        let db = next_db.fetch_add(1, Ordering::Relaxed) % 16;
        let kv = strait_fs_core::kv::redis::RedisKv::open(&server.url(db)).expect("open redis");
        let kv: DynKv = Arc::new(kv);
        kv.wipe().expect("flush db");
        kv
    });
}
