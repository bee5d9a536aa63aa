//! A strait mount on Redis metadata and a Garage S3 object store, both real servers started
//! on 127.0.0.1 by the test: data round-trips, survives a remount and a SIGKILL after fsync,
//! and the outbox replays into an empty engine with the same digest.

use std::io::Write;
use std::sync::Arc;

use crate::support::garage::Garage;
use crate::support::mount::TestFs;
use crate::support::redis_server::RedisServer;
use sha2::{Digest, Sha256};
use strait_fs_core::kv::DynKv;

#[test]
fn redis_and_garage_mount_round_trip_and_replay() {
    if !crate::support::require_fuse() {
        return;
    }
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let Some(garage) = Garage::start() else {
        return;
    };
    let fs = TestFs::new(
        redis.url(1),
        garage.data_url(),
        garage.env(),
        &["--block-size", "1M"],
    );
    let data: Vec<u8> = (0..(5 << 20) + 123).map(|i: u32| (i % 253) as u8).collect();
    {
        let m = fs.mount(&[]);
        std::fs::create_dir_all(m.path("x/y")).unwrap();
        let mut f = std::fs::File::create(m.path("x/y/big")).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        drop(f);
        std::fs::write(m.path("x/small"), b"hello s3").unwrap();
        std::fs::rename(m.path("x/small"), m.path("x/y/small")).unwrap();
        m.kill();
    }
    let m = fs.mount(&[]);
    let got = std::fs::read(m.path("x/y/big")).unwrap();
    assert_eq!(
        hex::encode(Sha256::digest(&got)),
        hex::encode(Sha256::digest(&data))
    );
    assert_eq!(std::fs::read(m.path("x/y/small")).unwrap(), b"hello s3");
    m.unmount();

    // the outbox replays into an empty Redis database with an identical digest
    let primary: DynKv = Arc::new(strait_fs_core::kv::redis::RedisKv::open(&redis.url(1)).unwrap());
    let replica: DynKv = Arc::new(strait_fs_core::kv::redis::RedisKv::open(&redis.url(2)).unwrap());
    replica.wipe().unwrap();
    let records = strait_fs_core::changelog::read_log(
        primary.as_ref(),
        strait_fs_core::Version::ZERO,
        usize::MAX,
    )
    .unwrap();
    strait_fs_core::changelog::replay(replica.as_ref(), &records).unwrap();
    assert_eq!(
        strait_fs_core::meta::Meta::digest(&primary).unwrap(),
        strait_fs_core::meta::Meta::digest(&replica).unwrap()
    );
}
