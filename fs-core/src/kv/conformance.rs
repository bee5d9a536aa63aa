//! The one test body every [`KvEngine`] backend passes (as openraft's `Suite::test_all` and
//! TiKV's `engine_traits_tests`): memory and RocksDB in their unit tests, Redis against a
//! real server in `tests/backends/kv_conformance.rs`.
//!
//! Each case gets an engine from `make` and wipes it first, so `make` may hand out the same
//! store every time. A failing case panics with the case's name printed just before.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{
    decode_counter, log_key, read, split_versioned, txn, versioned_value, KvEngine, KvPairs,
    LAST_VERSION_KEY, LOG_GROUP,
};
use crate::error::{Error, Result};
use crate::Version;

/// One case of the suite.
pub type Case = fn(&dyn KvEngine);

/// Every case, by name.
pub const CASES: &[(&str, Case)] = &[
    ("get_put_delete", get_put_delete),
    ("read_your_writes", read_your_writes),
    ("read_discards_writes", read_discards_writes),
    ("scan_in_byte_order", scan_in_byte_order),
    ("scan_pages", scan_pages),
    ("scan_merges_own_writes", scan_merges_own_writes),
    ("scan_unbounded_limit", scan_unbounded_limit),
    ("error_aborts_everything", error_aborts_everything),
    ("add_applies_at_commit", add_applies_at_commit),
    ("incr_shares_counter_encoding", incr_shares_counter_encoding),
    (
        "corrupt_counter_aborts_commit",
        corrupt_counter_aborts_commit,
    ),
    ("append_log_is_gapless", append_log_is_gapless),
    (
        "put_versioned_takes_the_commit_version",
        put_versioned_takes_the_commit_version,
    ),
    ("wipe_empties_everything", wipe_empties_everything),
    ("concurrent_read_modify_write", concurrent_read_modify_write),
];

/// Threads and transactions per thread of [`concurrent_read_modify_write`].
pub const CONCURRENT_THREADS: usize = 8;
pub const CONCURRENT_TXNS_PER_THREAD: usize = 200;

/// Run every case.
pub fn run_all(make: &dyn Fn() -> Arc<dyn KvEngine>) {
    run_except(make, &[])
}

/// Run every case but those named in `skip` (a backend's known, reported bugs; each skip
/// is printed so that it cannot go unnoticed).
pub fn run_except(make: &dyn Fn() -> Arc<dyn KvEngine>, skip: &[&str]) {
    for name in skip {
        assert!(
            CASES.iter().any(|(n, _)| n == name),
            "no conformance case named {name}"
        );
    }
    for (name, case) in CASES {
        let kv = make();
        if skip.contains(name) {
            eprintln!(
                "kv conformance [{}]: {name} SKIPPED (known backend bug)",
                kv.name()
            );
            continue;
        }
        eprintln!("kv conformance [{}]: {name}", kv.name());
        ok(kv.wipe(), "wipe the store before the case");
        case(kv.as_ref());
    }
}

/// Run the case called `name`.
pub fn run_one(make: &dyn Fn() -> Arc<dyn KvEngine>, name: &str) {
    let Some((_, case)) = CASES.iter().find(|(n, _)| *n == name) else {
        panic!("no conformance case named {name}")
    };
    let kv = make();
    eprintln!("kv conformance [{}]: {name}", kv.name());
    ok(kv.wipe(), "wipe the store before the case");
    case(kv.as_ref());
}

fn ok<T>(r: Result<T>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// A key in group (`tag`, `owner`) followed by `rest`.
fn key(tag: u8, owner: u64, rest: &[u8]) -> Vec<u8> {
    let mut k = vec![tag];
    k.extend_from_slice(&owner.to_be_bytes());
    k.extend_from_slice(rest);
    k
}

fn group(tag: u8, owner: u64) -> Vec<u8> {
    key(tag, owner, b"")
}

fn get(kv: &dyn KvEngine, k: &[u8]) -> Option<Vec<u8>> {
    ok(read(kv, |t| t.get(k)), "read a key")
}

fn counter(kv: &dyn KvEngine, k: &[u8]) -> i64 {
    ok(decode_counter(get(kv, k)), "decode a counter")
}

fn put_all(kv: &dyn KvEngine, pairs: &[(Vec<u8>, Vec<u8>)]) {
    ok(
        kv.txn(&mut |t| {
            for (k, v) in pairs {
                t.put(k, v);
            }
            Ok(())
        }),
        "commit puts",
    );
}

fn scan(kv: &dyn KvEngine, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> KvPairs {
    ok(read(kv, |t| t.scan(prefix, after, limit)), "scan in a read")
}

fn keys_of(pairs: &KvPairs) -> Vec<Vec<u8>> {
    pairs.iter().map(|(k, _)| k.clone()).collect()
}

/// Every change record, by paging through the log group.
fn whole_log(kv: &dyn KvEngine) -> KvPairs {
    let mut out: KvPairs = Vec::new();
    loop {
        let after = out.last().map(|(k, _)| k.clone());
        let page = scan(kv, &LOG_GROUP, after.as_deref(), 1000);
        let n = page.len();
        out.extend(page);
        if n < 1000 {
            return out;
        }
    }
}

fn aborted() -> Error {
    Error::Sys(libc::ECANCELED)
}

fn get_put_delete(kv: &dyn KvEngine) {
    let a = key(b'T', 1, b"a");
    let b = key(b'T', 1, b"b");
    let binary = key(b'T', 1, &[0, 0xff, b'\n', 0]);
    let empty = key(b'T', 1, b"empty");

    // Nothing is there in a wiped store.
    assert_eq!(get(kv, &a), None);

    // Puts become visible together; values are binary safe and may be empty.
    let version = ok(
        kv.txn(&mut |t| {
            t.put(&a, b"1");
            t.put(&b, b"2");
            t.put(&binary, &[0, 1, 0xff, 0]);
            t.put(&empty, b"");
            Ok(())
        }),
        "commit puts",
    );
    assert_eq!(version, None, "no change record, no version");
    assert_eq!(get(kv, &a).as_deref(), Some(&b"1"[..]));
    assert_eq!(get(kv, &b).as_deref(), Some(&b"2"[..]));
    assert_eq!(get(kv, &binary).as_deref(), Some(&[0, 1, 0xff, 0][..]));
    assert_eq!(
        get(kv, &empty).as_deref(),
        Some(&b""[..]),
        "an empty value is not an absent key"
    );

    // Overwrite, delete, and delete of a key that never existed.
    ok(
        kv.txn(&mut |t| {
            t.put(&a, b"1b");
            t.delete(&b);
            t.delete(&key(b'T', 1, b"never"));
            Ok(())
        }),
        "commit overwrite and deletes",
    );
    assert_eq!(get(kv, &a).as_deref(), Some(&b"1b"[..]));
    assert_eq!(get(kv, &b), None);
    assert_eq!(get(kv, &key(b'T', 1, b"never")), None);

    // A read-write transaction reads the committed state too.
    let (seen, _) = ok(txn(kv, |t| t.get(&a)), "read in a transaction");
    assert_eq!(seen.as_deref(), Some(&b"1b"[..]));
}

fn read_your_writes(kv: &dyn KvEngine) {
    let a = key(b'T', 2, b"a");
    let b = key(b'T', 2, b"b");
    let c = key(b'T', 2, b"c");
    put_all(
        kv,
        &[(a.clone(), b"old".to_vec()), (b.clone(), b"old".to_vec())],
    );

    // Later reads of a transaction see its earlier puts and deletes.
    ok(
        kv.txn(&mut |t| {
            assert_eq!(t.get(&a)?.as_deref(), Some(&b"old"[..]));
            t.put(&a, b"new");
            assert_eq!(t.get(&a)?.as_deref(), Some(&b"new"[..]));
            t.delete(&b);
            assert_eq!(t.get(&b)?, None);
            t.put(&c, b"c");
            assert_eq!(t.get(&c)?.as_deref(), Some(&b"c"[..]));
            t.delete(&c);
            assert_eq!(t.get(&c)?, None);
            t.put(&b, b"again");
            assert_eq!(t.get(&b)?.as_deref(), Some(&b"again"[..]));
            Ok(())
        }),
        "commit a transaction reading its writes",
    );

    // The last write to each key is what commits.
    assert_eq!(get(kv, &a).as_deref(), Some(&b"new"[..]));
    assert_eq!(get(kv, &b).as_deref(), Some(&b"again"[..]));
    assert_eq!(get(kv, &c), None);
}

fn read_discards_writes(kv: &dyn KvEngine) {
    let x = key(b'T', 3, b"x");
    let ctr = key(b'C', 3, b"");

    // Writes, additions and records made in a read-only closure go nowhere.
    ok(
        kv.read(&mut |t| {
            t.put(&x, b"1");
            t.add(&ctr, 5);
            t.append_log(b"record".to_vec());
            Ok(())
        }),
        "run a read-only closure that writes",
    );
    assert_eq!(get(kv, &x), None);
    assert_eq!(get(kv, &ctr), None);
    assert_eq!(ok(kv.last_version(), "read last version"), Version(0));
    assert!(whole_log(kv).is_empty());
}

fn scan_in_byte_order(kv: &dyn KvEngine) {
    let g = group(b'D', 7);
    let suffixes: [&[u8]; 11] = [
        b"",
        &[0],
        &[0, 0],
        &[1],
        &[0x7f],
        &[0x80],
        &[0xff],
        &[0xff, 0xff],
        b"a",
        b"ab",
        b"b",
    ];
    let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = suffixes
        .iter()
        .map(|s| (key(b'D', 7, s), [&b"v:"[..], s].concat()))
        .collect();
    // Neighbours in other groups, just below and above, must never show up.
    let neighbours = [
        key(b'D', 6, &[0xff, 0xff]),
        key(b'D', 8, b""),
        key(b'C', 7, b"a"),
        key(b'E', 7, b"a"),
    ];
    pairs.extend(
        neighbours
            .iter()
            .map(|k| (k.clone(), b"neighbour".to_vec())),
    );
    // The very last group of the key space, whose prefix has no upper bound.
    let last = key(0xff, u64::MAX, &[0xff]);
    pairs.push((last.clone(), b"last".to_vec()));
    put_all(kv, &pairs);

    // One group, in byte order, with its values, in a read and in a transaction.
    let want: BTreeSet<Vec<u8>> = suffixes.iter().map(|s| key(b'D', 7, s)).collect();
    let want: Vec<Vec<u8>> = want.into_iter().collect();
    let got = scan(kv, &g, None, 1000);
    assert_eq!(keys_of(&got), want);
    for (k, v) in &got {
        assert_eq!(v.as_slice(), [&b"v:"[..], &k[9..]].concat().as_slice());
    }
    let (in_txn, _) = ok(txn(kv, |t| t.scan(&g, None, 1000)), "scan in a transaction");
    assert_eq!(in_txn, got);

    // A prefix longer than the group narrows the scan.
    let sub = scan(kv, &key(b'D', 7, b"a"), None, 100);
    assert_eq!(keys_of(&sub), vec![key(b'D', 7, b"a"), key(b'D', 7, b"ab")]);

    // The all-0xff group.
    assert_eq!(
        keys_of(&scan(kv, &group(0xff, u64::MAX), None, 10)),
        vec![last]
    );

    // A zero limit gives nothing.
    assert!(scan(kv, &g, None, 0).is_empty());
}

fn scan_pages(kv: &dyn KvEngine) {
    let g = group(b'D', 9);
    let all: Vec<Vec<u8>> = (0..20u8).map(|i| key(b'D', 9, &[i * 3])).collect();
    put_all(
        kv,
        &all.iter()
            .map(|k| (k.clone(), k.clone()))
            .collect::<Vec<_>>(),
    );

    // Paging with start_after = the last key of the previous page visits every key once.
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = scan(kv, &g, seen.last().map(|k: &Vec<u8>| k.as_slice()), 3);
        assert!(page.len() <= 3);
        pages += 1;
        let n = page.len();
        seen.extend(keys_of(&page));
        if n < 3 {
            break;
        }
    }
    assert_eq!(seen, all);
    assert_eq!(pages, 7);

    // start_after need not exist: the scan resumes at the next key.
    let page = scan(kv, &g, Some(&key(b'D', 9, &[4])), 2);
    assert_eq!(keys_of(&page), vec![key(b'D', 9, &[6]), key(b'D', 9, &[9])]);

    // start_after before the prefix starts at the beginning; after the group, nothing.
    let page = scan(kv, &g, Some(&key(b'D', 8, &[0xff])), 1);
    assert_eq!(keys_of(&page), vec![all[0].clone()]);
    assert!(scan(kv, &g, Some(&key(b'D', 9, &[0xff, 0xff])), 10).is_empty());
    assert!(scan(kv, &g, Some(&key(b'D', 10, b"")), 10).is_empty());
}

fn scan_merges_own_writes(kv: &dyn KvEngine) {
    let g = group(b'D', 11);
    let k = |i: u8| key(b'D', 11, &[i]);
    put_all(kv, &[1, 3, 5, 7, 9].map(|i| (k(i), vec![i])));

    // A transaction's scans see its own puts, overwrites and deletes, in order, paged.
    ok(
        kv.txn(&mut |t| {
            t.put(&k(2), &[2]);
            t.delete(&k(3));
            t.put(&k(5), b"new");
            t.put(&k(10), &[10]);
            t.delete(&k(1));
            let all = t.scan(&g, None, 100)?;
            assert_eq!(
                all,
                vec![
                    (k(2), vec![2]),
                    (k(5), b"new".to_vec()),
                    (k(7), vec![7]),
                    (k(9), vec![9]),
                    (k(10), vec![10])
                ]
            );
            assert_eq!(keys_of(&t.scan(&g, None, 2)?), vec![k(2), k(5)]);
            assert_eq!(keys_of(&t.scan(&g, Some(&k(5)), 2)?), vec![k(7), k(9)]);
            assert_eq!(keys_of(&t.scan(&g, Some(&k(9)), 10)?), vec![k(10)]);
            Ok(())
        }),
        "commit writes under a scanned group",
    );
    assert_eq!(
        keys_of(&scan(kv, &g, None, 100)),
        vec![k(2), k(5), k(7), k(9), k(10)]
    );

    // Deleting the first stored keys must not shorten a limited scan.
    let r = kv.txn(&mut |t| {
        t.delete(&k(2));
        t.delete(&k(5));
        t.delete(&k(7));
        assert_eq!(keys_of(&t.scan(&g, None, 2)?), vec![k(9), k(10)]);
        Err(aborted())
    });
    assert!(matches!(r, Err(Error::Sys(libc::ECANCELED))));
    assert_eq!(
        keys_of(&scan(kv, &g, None, 100)),
        vec![k(2), k(5), k(7), k(9), k(10)]
    );
}

fn scan_unbounded_limit(kv: &dyn KvEngine) {
    let g = group(b'X', 12);
    let k = |i: u8| key(b'X', 12, &[i]);
    put_all(
        kv,
        &[
            (k(1), vec![1]),
            (k(3), vec![3]),
            (key(b'Y', 12, b""), vec![0]),
        ],
    );

    // usize::MAX means "everything" (delete_inode scans xattrs so), also with pending writes.
    let (got, _) = ok(
        txn(kv, |t| {
            t.put(&key(b'Y', 12, b""), &[1]);
            t.put(&k(2), &[2]);
            t.scan(&g, None, usize::MAX)
        }),
        "scan with no limit in a transaction that wrote",
    );
    assert_eq!(keys_of(&got), vec![k(1), k(2), k(3)]);
    assert_eq!(
        keys_of(&scan(kv, &g, None, usize::MAX)),
        vec![k(1), k(2), k(3)]
    );
}

fn error_aborts_everything(kv: &dyn KvEngine) {
    let x = key(b'T', 13, b"x");
    let y = key(b'T', 13, b"y");
    let z = key(b'T', 13, b"z");
    let ctr = key(b'C', 13, b"");
    let first = ok(
        kv.txn(&mut |t| {
            t.put(&x, b"old");
            t.put(&z, b"z");
            t.add(&ctr, 5);
            t.append_log(b"first".to_vec());
            Ok(())
        }),
        "commit the initial state",
    );
    assert_eq!(first, Some(Version(1)));

    // The closure's error comes back unchanged, and nothing of the transaction happened.
    let r = kv.txn(&mut |t| {
        t.put(&x, b"new");
        t.put(&y, b"y");
        t.delete(&z);
        t.add(&ctr, 10);
        t.append_log(b"aborted".to_vec());
        Err(Error::Sys(libc::EEXIST))
    });
    assert!(matches!(r, Err(Error::Sys(libc::EEXIST))), "got {r:?}");
    assert_eq!(get(kv, &x).as_deref(), Some(&b"old"[..]));
    assert_eq!(get(kv, &y), None);
    assert_eq!(get(kv, &z).as_deref(), Some(&b"z"[..]));
    assert_eq!(counter(kv, &ctr), 5);
    assert_eq!(ok(kv.last_version(), "read last version"), Version(1));
    assert_eq!(keys_of(&whole_log(kv)), vec![log_key(Version(1))]);

    // The aborted record left no gap.
    let next = ok(
        kv.txn(&mut |t| {
            t.append_log(b"second".to_vec());
            Ok(())
        }),
        "commit after an abort",
    );
    assert_eq!(next, Some(Version(2)));
}

fn add_applies_at_commit(kv: &dyn KvEngine) {
    let c = |i: u64| key(b'C', 14, &i.to_be_bytes());
    let add = |k: Vec<u8>, deltas: &[i64]| {
        ok(
            kv.txn(&mut |t| {
                for d in deltas {
                    t.add(&k, *d);
                }
                Ok(())
            }),
            "commit additions",
        )
    };

    // Additions to an absent counter start from 0 and accumulate.
    add(c(1), &[5, -2]);
    assert_eq!(counter(kv, &c(1)), 3);
    add(c(1), &[-10]);
    assert_eq!(counter(kv, &c(1)), -7);

    // An addition applies after the transaction's own put or delete of the key, in any order.
    ok(
        kv.txn(&mut |t| {
            t.put(&c(2), &10i64.to_le_bytes());
            t.add(&c(2), 1);
            t.add(&c(3), 7);
            t.put(&c(3), &100i64.to_le_bytes());
            t.delete(&c(1));
            t.add(&c(1), 4);
            Ok(())
        }),
        "commit puts and additions to the same keys",
    );
    assert_eq!(counter(kv, &c(2)), 11);
    assert_eq!(counter(kv, &c(3)), 107);
    assert_eq!(counter(kv, &c(1)), 4);

    // 64-bit exact: no rounding through floating point, carries across all bytes.
    put_all(kv, &[(c(4), ((1i64 << 60) + 1).to_le_bytes().to_vec())]);
    add(c(4), &[1]);
    assert_eq!(counter(kv, &c(4)), (1 << 60) + 2);
    add(c(5), &[i64::MAX - 1]);
    add(c(5), &[1]);
    assert_eq!(counter(kv, &c(5)), i64::MAX);
    add(c(6), &[-1]);
    add(c(6), &[1]);
    assert_eq!(counter(kv, &c(6)), 0);
    add(c(7), &[-(1 << 62) - 3]);
    assert_eq!(counter(kv, &c(7)), -(1 << 62) - 3);
}

fn incr_shares_counter_encoding(kv: &dyn KvEngine) {
    let k = key(b'C', 15, b"a");

    // incr returns the new value and uses the 8-byte little-endian encoding of add.
    assert_eq!(ok(kv.incr(&k, 5), "incr"), 5);
    assert_eq!(ok(kv.incr(&k, -7), "incr"), -2);
    assert_eq!(get(kv, &k), Some((-2i64).to_le_bytes().to_vec()));
    ok(
        kv.txn(&mut |t| {
            t.add(&k, 10);
            Ok(())
        }),
        "commit an addition",
    );
    assert_eq!(ok(kv.incr(&k, 0), "incr"), 8);

    // incr reads what a transaction put.
    let k2 = key(b'C', 15, b"b");
    put_all(kv, &[(k2.clone(), 41i64.to_le_bytes().to_vec())]);
    assert_eq!(ok(kv.incr(&k2, 1), "incr"), 42);

    // Large values stay exact.
    let k3 = key(b'C', 15, b"c");
    assert_eq!(ok(kv.incr(&k3, 1 << 60), "incr"), 1 << 60);
    assert_eq!(ok(kv.incr(&k3, 1), "incr"), (1 << 60) + 1);

    // last_version is the counter at LAST_VERSION_KEY.
    ok(
        kv.txn(&mut |t| {
            t.append_log(b"r".to_vec());
            Ok(())
        }),
        "commit a record",
    );
    assert_eq!(ok(kv.last_version(), "read last version"), Version(1));
    assert_eq!(counter(kv, LAST_VERSION_KEY), 1);

    // A counter is a key like any other: scans of its group return it.
    assert_eq!(
        keys_of(&scan(kv, &group(b'C', 15), None, 10)),
        vec![k, k2, k3]
    );
}

fn corrupt_counter_aborts_commit(kv: &dyn KvEngine) {
    let ctr = key(b'C', 16, b"");
    let x = key(b'T', 16, b"x");
    put_all(kv, &[(ctr.clone(), b"abc".to_vec())]);

    // A counter that is not 8 bytes fails the commit, and the other writes with it.
    let r = kv.txn(&mut |t| {
        t.put(&x, b"1");
        t.add(&ctr, 1);
        t.append_log(b"r".to_vec());
        Ok(())
    });
    assert!(matches!(r, Err(Error::Corrupt(_))), "got {r:?}");
    assert_eq!(get(kv, &x), None);
    assert_eq!(get(kv, &ctr).as_deref(), Some(&b"abc"[..]));
    assert_eq!(ok(kv.last_version(), "read last version"), Version(0));
    assert!(matches!(kv.incr(&ctr, 1), Err(Error::Corrupt(_))));
}

fn append_log_is_gapless(kv: &dyn KvEngine) {
    let k = key(b'T', 17, b"k");
    assert_eq!(ok(kv.last_version(), "read last version"), Version(0));

    // Versions are assigned 1, 2, 3… at commit.
    for i in 1..=5u64 {
        let v = ok(
            kv.txn(&mut |t| {
                t.put(&k, &i.to_le_bytes());
                t.append_log(format!("record {i}").into_bytes());
                Ok(())
            }),
            "commit a record",
        );
        assert_eq!(v, Some(Version(i)));
    }
    let none = ok(
        kv.txn(&mut |t| {
            t.put(&k, b"no record");
            Ok(())
        }),
        "commit without a record",
    );
    assert_eq!(none, None);
    assert_eq!(ok(kv.last_version(), "read last version"), Version(5));

    // The log group holds exactly those records, under log_key(version).
    let log = whole_log(kv);
    let want: KvPairs = (1..=5u64)
        .map(|i| (log_key(Version(i)), format!("record {i}").into_bytes()))
        .collect();
    assert_eq!(log, want);
    let page = scan(kv, &LOG_GROUP, Some(&log_key(Version(2))), 2);
    assert_eq!(
        keys_of(&page),
        vec![log_key(Version(3)), log_key(Version(4))]
    );
}

/// A versioned write ends with the version its transaction's change record got; without a
/// change record the transaction is refused, and a failed closure writes nothing either.
fn put_versioned_takes_the_commit_version(kv: &dyn KvEngine) {
    let a = key(b'T', 14, b"a");
    let b = key(b'T', 14, b"b");
    let first = ok(
        kv.txn(&mut |t| {
            t.put(&b, b"plain");
            t.put_versioned(&a, b"first");
            t.append_log(b"one".to_vec());
            Ok(())
        }),
        "commit a versioned write",
    );
    assert_eq!(first, Some(Version(1)));
    let stored = get(kv, &a).unwrap_or_default();
    assert_eq!(stored, versioned_value(b"first", Version(1)));
    assert_eq!(
        ok(split_versioned(&stored), "split a versioned value"),
        (&b"first"[..], Version(1))
    );
    // the key is in its group like any other (Redis indexes it)
    assert_eq!(
        keys_of(&scan(kv, &group(b'T', 14), None, 10)),
        vec![a.clone(), b.clone()]
    );

    // over a plain put of the same key in the same transaction, the versioned write wins
    let second = ok(
        kv.txn(&mut |t| {
            t.put(&a, b"plain over");
            t.put_versioned(&a, b"second");
            t.append_log(b"two".to_vec());
            Ok(())
        }),
        "commit a second versioned write",
    );
    assert_eq!(second, Some(Version(2)));
    assert_eq!(get(kv, &a), Some(versioned_value(b"second", Version(2))));

    // no change record to take the version of: refused, and nothing is applied
    let r = kv.txn(&mut |t| {
        t.put(&b, b"changed");
        t.put_versioned(&a, b"third");
        Ok(())
    });
    assert!(
        r.is_err(),
        "a versioned write without a record committed: {r:?}"
    );
    // a closure that fails: nothing is applied
    let r = kv.txn(&mut |t| {
        t.put(&b, b"changed");
        t.put_versioned(&a, b"fourth");
        t.append_log(b"aborted".to_vec());
        Err(aborted())
    });
    assert!(r.is_err(), "{r:?}");
    assert_eq!(get(kv, &a), Some(versioned_value(b"second", Version(2))));
    assert_eq!(get(kv, &b).as_deref(), Some(&b"plain"[..]));
    assert_eq!(ok(kv.last_version(), "read last version"), Version(2));
}

fn wipe_empties_everything(kv: &dyn KvEngine) {
    let a = key(b'T', 18, b"a");
    let c = key(b'C', 18, b"");
    put_all(kv, &[(a.clone(), b"a".to_vec())]);
    ok(kv.incr(&c, 3), "incr");
    ok(
        kv.txn(&mut |t| {
            t.append_log(b"r".to_vec());
            Ok(())
        }),
        "commit a record",
    );

    // After a wipe nothing is left, and the log starts again at 1.
    ok(kv.wipe(), "wipe");
    assert_eq!(get(kv, &a), None);
    assert_eq!(get(kv, &c), None);
    assert_eq!(ok(kv.last_version(), "read last version"), Version(0));
    assert!(scan(kv, &group(b'T', 18), None, 10).is_empty());
    assert!(whole_log(kv).is_empty());
    let v = ok(
        kv.txn(&mut |t| {
            t.append_log(b"r".to_vec());
            Ok(())
        }),
        "commit a record",
    );
    assert_eq!(v, Some(Version(1)));
}

fn concurrent_read_modify_write(kv: &dyn KvEngine) {
    let shared = key(b'T', 19, b"shared");
    let total = CONCURRENT_THREADS * CONCURRENT_TXNS_PER_THREAD;

    // Each transaction reads the shared counter, writes it back plus one, and logs the value
    // it wrote. Serializable transactions with gapless versions mean the record at version v
    // says v.
    let versions: Vec<Version> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..CONCURRENT_THREADS)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::with_capacity(CONCURRENT_TXNS_PER_THREAD);
                    for _ in 0..CONCURRENT_TXNS_PER_THREAD {
                        let v = ok(
                            kv.txn(&mut |t| {
                                let n = decode_counter(t.get(&shared)?)? + 1;
                                t.put(&shared, &n.to_le_bytes());
                                t.append_log(n.to_le_bytes().to_vec());
                                Ok(())
                            }),
                            "commit a contended read-modify-write",
                        );
                        mine.push(v.unwrap_or_else(|| {
                            panic!("a record was appended but no version returned")
                        }));
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|_| panic!("a worker panicked")))
            .collect()
    });

    assert_eq!(counter(kv, &shared), total as i64, "lost updates");
    assert_eq!(
        ok(kv.last_version(), "read last version"),
        Version(total as u64)
    );
    let distinct: BTreeSet<Version> = versions.iter().copied().collect();
    assert_eq!(distinct.len(), total, "a version was returned twice");
    assert_eq!(
        distinct,
        (1..=total as u64).map(Version).collect(),
        "versions are not exactly 1..={total}"
    );
    let log = whole_log(kv);
    assert_eq!(log.len(), total);
    for (i, (k, record)) in log.iter().enumerate() {
        let v = i as u64 + 1;
        assert_eq!(k, &log_key(Version(v)), "log keys are not gapless at {v}");
        assert_eq!(
            ok(decode_counter(Some(record.clone())), "decode a record"),
            v as i64,
            "the transaction with version {v} did not see the {} before it",
            v - 1
        );
    }
}
