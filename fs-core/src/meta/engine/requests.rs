//! Request records ([`crate::meta::requests`]): written with each change made under a request
//! id, looked up for its retries, and expired by a sweep.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::Meta;
use crate::changelog::{self, Change};
use crate::error::{Error, Result};
use crate::kv::{self, decode_counter, KvTxn};
use crate::meta::keys;
use crate::meta::requests::{
    plan_sweep, put_record, raise_lost, Lookup, Outcome, RequestRecord, Swept,
};

impl Meta {
    /// A view of this one for one call made under request id `id`: every change it commits
    /// writes the request's record in the same transaction. It shares everything else with
    /// this view (session, id ranges, open handles). Meant for calls that commit at most one
    /// change: a call that commits several would leave the record of the last.
    pub fn for_request(&self, id: &str) -> Arc<Meta> {
        Arc::new(Meta {
            kv: self.kv.clone(),
            format: self.format.clone(),
            read_only: self.read_only.clone(),
            writes_elsewhere: self.writes_elsewhere,
            sid: AtomicU64::new(self.session_id()),
            inodes: self.inodes.clone(),
            slices: self.slices.clone(),
            open_files: self.open_files.clone(),
            deleting: self.deleting.clone(),
            request: Some(id.as_bytes().to_vec()),
            deletion_gate: self.deletion_gate.clone(),
            trash_swept: self.trash_swept.clone(),
            clones_swept: self.clones_swept.clone(),
        })
    }

    /// Commit `change` at `ts_ns` in `t` ([`changelog::commit`]) and, in a view for a
    /// request, the request's record with it.
    /// The change record names the id, so the engines that apply the log keep the record too.
    pub(super) fn commit(&self, t: &mut dyn KvTxn, change: Change, ts_ns: i64) -> Result<()> {
        let Some(id) = &self.request else {
            return changelog::commit(t, change, ts_ns);
        };
        let outcome = Outcome::of(&change);
        changelog::commit_record(
            t,
            &changelog::ChangeRecord {
                ts_ns,
                change,
                request: Some(id.clone()),
            },
        )?;
        put_record(t, id, ts_ns, &outcome, None)
    }

    /// Whether a change made under request `id` committed (see [`Lookup`]), judged at
    /// `now_ns`. `retry`: the client sent the call before (a first attempt finds no record,
    /// and runs, whatever was lost). One read, two for a retry without a record.
    pub fn request_lookup(&self, id: &str, now_ns: i64, retry: bool) -> Result<Lookup> {
        kv::read(self.kv.as_ref(), |t| {
            let found = match t.get(&keys::request(id.as_bytes()))? {
                Some(b) => Some(RequestRecord::decode(&b)?),
                None => None,
            };
            let lost = match (&found, retry) {
                (None, true) => t
                    .get(&keys::requests_state(keys::REQUESTS_LOST))?
                    .map(|b| decode_counter(Some(b)))
                    .transpose()?,
                _ => None,
            };
            Ok(Lookup::judge(found, lost, now_ns))
        })
    }

    /// How many request records there are.
    pub fn request_count(&self) -> Result<u64> {
        kv::read(self.kv.as_ref(), |t| {
            let n = decode_counter(t.get(&keys::requests_state(keys::REQUEST_COUNT))?)?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    /// One batch of the records' expiry: of the `limit` oldest records, remove those committed
    /// before `before_ns`, then the oldest others while more than `max` are left; keep the
    /// commit time of the newest record removed before its time (see [`Lookup::Unknown`]).
    /// Fewer than `limit` removed means the sweep is done for now.
    pub fn sweep_requests(&self, before_ns: i64, max: u64, limit: usize) -> Result<Swept> {
        // read outside the transaction that deletes: on Redis, reading the age index in it
        // would conflict with every change that adds a record; only the sweep deletes records
        let (page, count) = kv::read(self.kv.as_ref(), |t| {
            let page = t.scan(
                &keys::group(keys::REQUEST, keys::REQUESTS_BY_AGE),
                None,
                limit,
            )?;
            let count = decode_counter(t.get(&keys::requests_state(keys::REQUEST_COUNT))?)?;
            Ok((page, u64::try_from(count).unwrap_or(0)))
        })?;
        let mut ages = Vec::with_capacity(page.len());
        for (k, _) in &page {
            let ts = keys::u64_at(k, kv::GROUP_LEN)
                .ok_or_else(|| Error::corrupt("request record age key"))?;
            ages.push(i64::try_from(ts).unwrap_or(i64::MAX));
        }
        let (expired, evicted) = plan_sweep(&ages, before_ns, count, max);
        let removed = expired + evicted;
        if removed == 0 {
            return Ok(Swept {
                left: count,
                ..Swept::default()
            });
        }
        let newest_evicted = (evicted > 0).then(|| ages[removed - 1]);
        kv::txn(self.kv.as_ref(), |t| {
            for (k, _) in &page[..removed] {
                let id = k.get(kv::GROUP_LEN + 8..).unwrap_or_default();
                t.delete(&keys::request(id));
                t.delete(k);
            }
            t.add(
                &keys::requests_state(keys::REQUEST_COUNT),
                -(removed as i64),
            );
            if let Some(ts) = newest_evicted {
                raise_lost(t, ts)?;
            }
            Ok(())
        })?;
        Ok(Swept {
            expired,
            evicted,
            left: count.saturating_sub(removed as u64),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::now_ns;
    use crate::kv::memory::MemoryKv;
    use crate::kv::{DynKv, KvEngine};
    use crate::meta::conformance::test_format;
    use crate::meta::types::*;
    use crate::meta::MetaOptions;

    /// A memory engine whose every transaction fails at commit, after its closure ran
    /// whole: as a store that loses the connection at the last moment.
    struct FailingCommits(MemoryKv, std::sync::atomic::AtomicBool);

    impl KvEngine for FailingCommits {
        fn name(&self) -> &'static str {
            "memory"
        }
        fn txn(
            &self,
            f: &mut dyn FnMut(&mut dyn KvTxn) -> Result<()>,
        ) -> Result<Option<crate::Version>> {
            let fail = self.1.load(std::sync::atomic::Ordering::Relaxed);
            self.0.txn(&mut |t| {
                f(t)?;
                if fail {
                    return Err(Error::Meta("the commit failed".into()));
                }
                Ok(())
            })
        }
        fn read(&self, f: &mut dyn FnMut(&mut dyn KvTxn) -> Result<()>) -> Result<()> {
            self.0.read(f)
        }
        fn incr(&self, key: &[u8], delta: i64) -> Result<i64> {
            self.0.incr(key, delta)
        }
        fn sync(&self) -> Result<()> {
            Ok(())
        }
        fn last_version(&self) -> Result<crate::Version> {
            self.0.last_version()
        }
        fn wipe(&self) -> Result<()> {
            self.0.wipe()
        }
    }

    /// Request `id`'s record as stored.
    fn record_of(kv: &crate::kv::DynKv, id: &str) -> Option<RequestRecord> {
        kv::read(kv.as_ref(), |t| {
            t.get(&keys::request(id.as_bytes()))?
                .map(|b| RequestRecord::decode(&b))
                .transpose()
        })
        .expect("read a request record")
    }

    fn engine(kv: DynKv) -> Arc<Meta> {
        Meta::format(&kv, test_format()).expect("format");
        let m = Meta::open(kv, MetaOptions::default()).expect("open");
        m.new_session("requests").expect("session");
        m
    }

    #[test]
    fn a_request_record_commits_in_the_transaction_of_its_change() {
        let failing = Arc::new(FailingCommits(
            MemoryKv::new(),
            std::sync::atomic::AtomicBool::new(false),
        ));
        let kv: DynKv = failing.clone();
        let m = engine(kv.clone());
        let root = Ctx::root();

        // a change under a request id commits its record with it: the version and the result
        let made = m
            .for_request("mount-1")
            .create_versioned(&root, ROOT_INO, b"a", 0o644, 0)
            .expect("create");
        let record = record_of(&kv, "mount-1").expect("a record");
        assert_eq!(Some(record.version), made.version);
        assert_eq!(
            record.outcome,
            Outcome::Entry(made.value.0, made.value.1.clone())
        );
        assert_eq!(m.request_count().expect("count"), 1);
        assert_eq!(
            m.request_lookup("mount-1", now_ns(), false)
                .expect("lookup"),
            Lookup::Committed(record)
        );

        // a transaction that fails at commit, after the change and the record were both
        // written in it, leaves neither
        failing.1.store(true, std::sync::atomic::Ordering::Relaxed);
        let v = kv.last_version().expect("version");
        let r = m
            .for_request("mount-2")
            .rename_versioned(&root, ROOT_INO, b"a", ROOT_INO, b"b", 0);
        assert!(r.is_err(), "{r:?}");
        failing.1.store(false, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(kv.last_version().expect("version"), v);
        assert!(m.lookup(&root, ROOT_INO, b"a").is_ok(), "a was not renamed");
        assert_eq!(record_of(&kv, "mount-2"), None);
        assert_eq!(
            m.request_lookup("mount-2", now_ns(), true).expect("lookup"),
            Lookup::NotCommitted
        );
        assert_eq!(m.request_count().expect("count"), 1);

        // a call that fails its checks commits nothing, and no record
        let e = m
            .for_request("mount-3")
            .create_versioned(&root, ROOT_INO, b"a", 0o644, 0);
        assert!(matches!(e, Err(Error::Sys(libc::EEXIST))), "{e:?}");
        assert_eq!(record_of(&kv, "mount-3"), None);

        // the same call under the id again now commits, once
        let renamed = m
            .for_request("mount-2")
            .rename_versioned(&root, ROOT_INO, b"a", ROOT_INO, b"b", 0)
            .expect("rename");
        let record = record_of(&kv, "mount-2").expect("a record");
        assert_eq!(Some(record.version), renamed.version);
        assert_eq!(record.outcome, Outcome::Done);
        // a view without a request writes none
        let before = m.request_count().expect("count");
        m.setattr_versioned(&root, made.value.0, &SetAttr::default())
            .expect("setattr");
        assert_eq!(m.request_count().expect("count"), before);
    }

    #[test]
    fn a_replica_applying_the_log_keeps_the_records_of_its_changes() {
        let kv: DynKv = Arc::new(MemoryKv::new());
        let m = engine(kv.clone());
        let root = Ctx::root();
        let replica: DynKv = Arc::new(MemoryKv::new());
        let mut buf = vec![];
        crate::snapshot::dump(kv.as_ref(), &mut buf).expect("dump");
        crate::snapshot::load(replica.as_ref(), &mut buf.as_slice()).expect("load");
        let at = replica.last_version().expect("version");

        let (a, _) = m
            .for_request("mount-1")
            .create_versioned(&root, ROOT_INO, b"a", 0o644, 0)
            .expect("create")
            .value;
        m.for_request("mount-2")
            .rename_versioned(&root, ROOT_INO, b"a", ROOT_INO, b"b", 0)
            .expect("rename");
        // a change without an id names none, and leaves no record anywhere
        m.setattr_versioned(&root, a, &SetAttr::default())
            .expect("setattr");
        let log = crate::changelog::read_log(kv.as_ref(), at, 10).expect("read the log");
        let ids: Vec<_> = log.iter().map(|(_, r)| r.request.clone()).collect();
        assert_eq!(
            ids,
            [Some(b"mount-1".to_vec()), Some(b"mount-2".to_vec()), None]
        );

        // the replica, as a mirror applies the log: the same records, versions and results
        let records: Vec<_> = log.into_iter().map(|(_, r)| r).collect();
        crate::changelog::apply_replica(replica.as_ref(), at.next(), &records).expect("apply");
        for id in ["mount-1", "mount-2"] {
            let theirs = record_of(&kv, id).expect("the primary's record");
            assert_eq!(record_of(&replica, id), Some(theirs), "{id}");
        }
        // promoted, it answers a retry from them, and counts them for its sweep
        let promoted = Meta::open(replica.clone(), MetaOptions::default()).expect("open");
        assert!(matches!(
            promoted.request_lookup("mount-2", now_ns(), true),
            Ok(Lookup::Committed(r)) if r.outcome == Outcome::Done
        ));
        assert_eq!(promoted.request_count().expect("count"), 2);
        let swept = promoted
            .sweep_requests(i64::MAX, u64::MAX, 100)
            .expect("sweep");
        assert_eq!((swept.expired, swept.left), (2, 0));
        assert_eq!(
            Meta::digest(&replica).expect("digest"),
            Meta::digest(&kv).expect("digest")
        );
    }

    #[test]
    fn records_are_not_file_system_content() {
        let kv: DynKv = Arc::new(MemoryKv::new());
        let m = engine(kv.clone());
        let root = Ctx::root();
        m.for_request("r-1")
            .mkdir_versioned(&root, ROOT_INO, b"d", 0o755, 0)
            .expect("mkdir");
        // the snapshot's walk carries no request key, and the digest does not move when the
        // records go
        let mut tags = std::collections::BTreeSet::new();
        kv::read(kv.as_ref(), |t| {
            crate::snapshot::walk(t, &mut |k, _| {
                tags.insert(k[0]);
                Ok(())
            })
        })
        .expect("walk");
        assert!(!tags.contains(&keys::REQUEST), "{tags:?}");
        let digest = Meta::digest(&kv).expect("digest");
        let swept = m
            .sweep_requests(i64::MAX, u64::MAX, 100)
            .expect("sweep everything");
        assert_eq!(swept.expired, 1);
        assert_eq!(Meta::digest(&kv).expect("digest"), digest);
    }

    #[test]
    fn the_sweep_expires_old_records_and_evicts_the_oldest_over_the_bound() {
        let kv: DynKv = Arc::new(MemoryKv::new());
        let m = engine(kv.clone());
        let root = Ctx::root();
        for i in 0..5 {
            m.for_request(&format!("r-{i}"))
                .mkdir_versioned(&root, ROOT_INO, format!("d{i}").as_bytes(), 0o755, 0)
                .expect("mkdir");
        }
        let ts: Vec<i64> = (0..5)
            .map(|i| record_of(&kv, &format!("r-{i}")).expect("record").ts_ns)
            .collect();
        // nothing is old enough, nothing over the bound: nothing removed
        let swept = m.sweep_requests(ts[0], 10, 100).expect("sweep");
        assert_eq!((swept.removed(), swept.left), (0, 5));
        // the two oldest expire, in batches of at most one
        let swept = m.sweep_requests(ts[2], 10, 1).expect("sweep");
        assert_eq!((swept.expired, swept.left), (1, 4));
        let swept = m.sweep_requests(ts[2], 10, 1).expect("sweep");
        assert_eq!((swept.expired, swept.left), (1, 3));
        assert_eq!(record_of(&kv, "r-1"), None);
        // an expired record missing is "not committed", for a retry too
        assert_eq!(
            m.request_lookup("r-1", now_ns(), true).expect("lookup"),
            Lookup::NotCommitted
        );
        // at most 2 records: the oldest left goes before its time, and a retry that misses
        // its record is unknown (a first attempt is not)
        let swept = m.sweep_requests(ts[0], 2, 100).expect("sweep");
        assert_eq!((swept.evicted, swept.left), (1, 2));
        assert_eq!(record_of(&kv, "r-2"), None);
        assert!(record_of(&kv, "r-3").is_some());
        assert_eq!(
            m.request_lookup("r-2", now_ns(), true).expect("lookup"),
            Lookup::Unknown
        );
        assert_eq!(
            m.request_lookup("r-new", now_ns(), false).expect("lookup"),
            Lookup::NotCommitted
        );
        assert_eq!(m.request_count().expect("count"), 2);
    }

    #[test]
    fn records_lost_with_metadata_taken_back_make_a_missing_retry_unknown() {
        let kv: DynKv = Arc::new(MemoryKv::new());
        let m = engine(kv.clone());
        assert_eq!(
            m.request_lookup("gone", now_ns(), true).expect("lookup"),
            Lookup::NotCommitted
        );
        // a primary that applied versions from the replicator again lost their records
        crate::meta::requests::note_lost(kv.as_ref(), now_ns()).expect("note");
        assert_eq!(
            m.request_lookup("gone", now_ns(), true).expect("lookup"),
            Lookup::Unknown
        );
        // a first attempt runs; KEEP later a retry does too
        assert_eq!(
            m.request_lookup("gone", now_ns(), false).expect("lookup"),
            Lookup::NotCommitted
        );
        let later = now_ns() + crate::meta::requests::KEEP.as_nanos() as i64 + 1_000_000_000;
        assert_eq!(
            m.request_lookup("gone", later, true).expect("lookup"),
            Lookup::NotCommitted
        );
        // an earlier time does not move it back
        crate::meta::requests::note_lost(kv.as_ref(), 1).expect("note");
        assert_eq!(
            m.request_lookup("gone", now_ns(), true).expect("lookup"),
            Lookup::Unknown
        );
    }

    /// Load a snapshot of `from` into a new memory engine.
    fn loaded_from(from: &DynKv) -> DynKv {
        let replica: DynKv = Arc::new(MemoryKv::new());
        let mut loader = crate::snapshot::Loader::new(replica.as_ref()).expect("loader");
        let c = crate::snapshot::collect(from.as_ref(), &mut |_| Ok(()), &mut |b| loader.batch(&b))
            .expect("snapshot");
        loader.finish(c.version, c.pairs).expect("load");
        replica
    }

    /// Issue 40, finding 5: an engine loaded from a snapshot (a mirror's bootstrap, an old
    /// primary's rejoin) had no request record of the changes before it, and nothing said so:
    /// promoted, it ran a change sent again a second time. Snapshots carry the records now,
    /// with the same digest as before.
    #[test]
    fn an_engine_loaded_from_a_snapshot_answers_a_retry_from_its_record() {
        let kv: DynKv = Arc::new(MemoryKv::new());
        let m = engine(kv.clone());
        let root = Ctx::root();
        m.for_request("r-1")
            .mkdir_versioned(&root, ROOT_INO, b"d", 0o755, 0)
            .expect("mkdir");
        let replica = loaded_from(&kv);
        assert_eq!(
            Meta::digest(&replica).expect("digest"),
            Meta::digest(&kv).expect("digest")
        );
        let r = Meta::open(replica.clone(), MetaOptions::default()).expect("open");
        match r.request_lookup("r-1", now_ns(), true).expect("lookup") {
            Lookup::Committed(rec) => assert_eq!(rec.version, kv.last_version().unwrap()),
            other => panic!("the loaded engine answered a retry of r-1 with {other:?}"),
        }
        // a first attempt of another id runs
        assert_eq!(
            r.request_lookup("r-2", now_ns(), false).expect("lookup"),
            Lookup::NotCommitted
        );
        // the records are kept and expire there as at the source
        let swept = r
            .sweep_requests(i64::MAX, u64::MAX, 100)
            .expect("sweep everything");
        assert_eq!(swept.expired, 1);
    }

    /// A snapshot without the records (an older primary's) notes them lost: a retry that
    /// finds none is "not known" for a while, not run a second time.
    #[test]
    fn an_engine_loaded_from_a_snapshot_without_records_notes_them_lost() {
        let kv: DynKv = Arc::new(MemoryKv::new());
        let m = engine(kv.clone());
        m.for_request("r-1")
            .mkdir_versioned(&Ctx::root(), ROOT_INO, b"d", 0o755, 0)
            .expect("mkdir");
        // the tree alone, as an older primary streamed it
        let mut pairs = vec![];
        let version = kv::read(kv.as_ref(), |t| {
            crate::snapshot::walk(t, &mut |k, v| {
                pairs.push((k, v));
                Ok(())
            })?;
            crate::snapshot::version_in(t)
        })
        .expect("walk");
        let replica: DynKv = Arc::new(MemoryKv::new());
        let mut loader = crate::snapshot::Loader::new(replica.as_ref()).expect("loader");
        loader.batch(&pairs).expect("batch");
        loader.finish(version, pairs.len() as u64).expect("load");
        let r = Meta::open(replica, MetaOptions::default()).expect("open");
        assert_eq!(
            r.request_lookup("r-1", now_ns(), true).expect("lookup"),
            Lookup::Unknown
        );
    }

    /// A second change committed under one request id (which the daemon never makes: a
    /// retry is answered from the first's record) is counted: the chaos harness's checker 10
    /// reads the count.
    #[test]
    fn a_second_change_under_one_request_id_is_counted() {
        let kv: DynKv = Arc::new(MemoryKv::new());
        let m = engine(kv.clone());
        let root = Ctx::root();
        let twice = || crate::meta::requests::applied_twice(kv.as_ref()).expect("count");
        m.for_request("r-1")
            .mkdir_versioned(&root, ROOT_INO, b"d", 0o755, 0)
            .expect("mkdir");
        assert_eq!(twice(), 0);
        m.for_request("r-1")
            .mkdir_versioned(&root, ROOT_INO, b"e", 0o755, 0)
            .expect("mkdir again");
        assert_eq!(twice(), 1);
        // a replica applying the log counts the same, and carries the count in snapshots
        let replica = loaded_from(&kv);
        assert_eq!(
            crate::meta::requests::applied_twice(replica.as_ref()).expect("count"),
            1
        );
    }
}
