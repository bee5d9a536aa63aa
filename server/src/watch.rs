//! Telling mounts what changed: every committed change to a name or an attribute, in commit
//! order, so a mount answers lookups and stats from what it keeps and stays coherent with
//! every other mount (`MetaService.Watch`; CephFS's capabilities serve the same end).
//!
//! [`WatchedKv`] wraps the daemon's engine: each transaction's writes to attribute and
//! name keys are taken as it commits and handed, with the version it committed as, to the
//! [`WatchHub`], under one lock with the commit itself, so the hub sees changes in version
//! order. Each mount's stream (`MetaServer::watch`) takes the hub's changes as they come,
//! batched, and sends a batch at least every [`HEARTBEAT`] while idle.
//!
//! The promise a batch makes (`WatchBatch.version`): every change committed up to its version
//! was sent. A mount may then keep a reply it asked for after hearing version `v` as the state
//! at `v` at least, and replace it by any later change. A subscriber that falls behind the
//! hub's queue is told to forget everything (a reset) and goes on from the current version.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use strait_fs_core::kv::{DynKv, KvEngine, KvTxn, LAST_VERSION_KEY};
use strait_fs_core::meta::keys::{self, ATTR, DENTRY};
use strait_fs_core::meta::{Attr, Ino};
use strait_fs_core::Version;
use strait_proto::meta as w;
use tokio::sync::broadcast;

/// A batch is sent at least this often, so a mount that heard nothing for longer knows the
/// stream is behind or gone.
pub const HEARTBEAT: Duration = Duration::from_millis(250);
/// Commits the hub holds for subscribers that have not taken them; one further behind is
/// reset.
const QUEUE_MAX: usize = 4096;
/// Most commits one batch carries.
const BATCH_COMMITS_MAX: usize = 256;

/// One commit's changes, or a reset.
#[derive(Debug)]
pub enum Change {
    Commit {
        version: u64,
        /// (inode, its attributes now; None: deleted)
        attrs: Vec<(Ino, Option<Attr>)>,
        /// (directory, name, the inode it names now; 0: removed)
        entries: Vec<(Ino, Vec<u8>, Ino)>,
    },
    /// Something changed that cannot be told as names and attributes (the engine was wiped
    /// or replaced): forget everything.
    Reset { version: u64 },
}

/// Where committed changes meet the mounts' streams.
pub struct WatchHub {
    tx: broadcast::Sender<Arc<Change>>,
    /// The version of the last change handed out.
    latest: AtomicU64,
    /// Held over a commit and its publication, and over a subscription: changes reach the
    /// hub in version order, and a subscriber's starting version matches its queue.
    order: Mutex<()>,
}

impl WatchHub {
    fn new(latest: Version) -> Self {
        let (tx, _) = broadcast::channel(QUEUE_MAX);
        WatchHub {
            tx,
            latest: AtomicU64::new(latest.0),
            order: Mutex::new(()),
        }
    }

    /// A queue of every change after the version returned with it.
    pub fn subscribe(&self) -> (broadcast::Receiver<Arc<Change>>, u64) {
        let _order = self.order.lock();
        (self.tx.subscribe(), self.latest.load(Ordering::Acquire))
    }

    /// Hand out `change`; called with `order` held.
    fn publish(&self, change: Change) {
        let version = match &change {
            Change::Commit { version, .. } | Change::Reset { version } => *version,
        };
        self.latest.fetch_max(version, Ordering::AcqRel);
        // no subscriber: nothing to tell
        let _ = self.tx.send(Arc::new(change));
    }
}

/// The daemon's engine, telling the [`WatchHub`] of each commit's changes to names and
/// attributes.
pub struct WatchedKv {
    inner: DynKv,
    hub: Arc<WatchHub>,
}

impl WatchedKv {
    /// Wrap `inner`; None for an engine whose commits this cannot put in version order
    /// cheaply (one across the network, such as Redis, would hold a lock over each
    /// round trip): its daemon answers Watch with UNIMPLEMENTED.
    pub fn wrap(inner: DynKv) -> strait_fs_core::Result<(DynKv, Option<Arc<WatchHub>>)> {
        if !strait_fs_core::kv::in_process(inner.as_ref()) {
            return Ok((inner, None));
        }
        let hub = Arc::new(WatchHub::new(inner.last_version()?));
        let kv = Arc::new(WatchedKv {
            inner,
            hub: hub.clone(),
        });
        Ok((kv, Some(hub)))
    }
}

/// What one transaction wrote that a mount keeps.
#[derive(Default)]
struct Written {
    /// Whether to note the keys at all: not while no mount listens (a mirror loading a
    /// snapshot of millions of entries copies none of them for nobody).
    keep: bool,
    attrs: Vec<(Ino, Option<Vec<u8>>)>,
    entries: Vec<(Ino, Vec<u8>, Option<Vec<u8>>)>,
    /// It moved the version counter itself (a mirror applying records).
    moved_version: bool,
}

impl Written {
    fn note(&mut self, key: &[u8], value: Option<&[u8]>) {
        if !self.keep {
            return;
        }
        match key.first() {
            Some(&ATTR) if key.len() == 9 => {
                if let Some(ino) = keys::u64_at(key, 1) {
                    self.attrs.push((ino, value.map(<[u8]>::to_vec)));
                }
            }
            Some(&DENTRY) if key.len() > 9 => {
                if let Some(parent) = keys::u64_at(key, 1) {
                    self.entries
                        .push((parent, key[9..].to_vec(), value.map(<[u8]>::to_vec)));
                }
            }
            _ => {}
        }
    }

    fn is_empty(&self) -> bool {
        self.attrs.is_empty() && self.entries.is_empty()
    }

    /// The changes as a mount is told them; None when a value does not decode (the mount is
    /// then told to forget everything rather than be told something wrong).
    fn decode(self, version: u64) -> Option<Change> {
        let mut attrs = Vec::with_capacity(self.attrs.len());
        for (ino, v) in self.attrs {
            let a = match v {
                Some(b) => Some(strait_fs_core::changelog::record::decode::<Attr>(&b).ok()?),
                None => None,
            };
            attrs.push((ino, a));
        }
        let mut entries = Vec::with_capacity(self.entries.len());
        for (parent, name, v) in self.entries {
            let ino = match v {
                Some(b) => keys::u64_at(&b, 0).filter(|&i| i != 0)?,
                None => 0,
            };
            entries.push((parent, name, ino));
        }
        Some(Change::Commit {
            version,
            attrs,
            entries,
        })
    }
}

/// A transaction whose writes are noted as they are made.
struct Noting<'a> {
    inner: &'a mut dyn KvTxn,
    written: &'a mut Written,
}

impl KvTxn for Noting<'_> {
    fn get(&mut self, key: &[u8]) -> strait_fs_core::Result<Option<Vec<u8>>> {
        self.inner.get(key)
    }
    fn scan(
        &mut self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> strait_fs_core::Result<strait_fs_core::kv::KvPairs> {
        self.inner.scan(prefix, start_after, limit)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) {
        self.written.note(key, Some(value));
        self.inner.put(key, value)
    }
    fn delete(&mut self, key: &[u8]) {
        self.written.note(key, None);
        self.inner.delete(key)
    }
    fn add(&mut self, key: &[u8], delta: i64) {
        if key == LAST_VERSION_KEY {
            self.written.moved_version = true;
        }
        self.inner.add(key, delta)
    }
    fn append_log(&mut self, record: Vec<u8>) {
        self.inner.append_log(record)
    }
    fn put_versioned(&mut self, key: &[u8], value: &[u8]) {
        self.written.note(key, Some(value));
        self.inner.put_versioned(key, value)
    }
}

impl KvEngine for WatchedKv {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn txn(
        &self,
        f: &mut dyn FnMut(&mut dyn KvTxn) -> strait_fs_core::Result<()>,
    ) -> strait_fs_core::Result<Option<Version>> {
        let _order = self.hub.order.lock();
        // no subscriber can come or go while `order` is held
        let keep = self.hub.tx.receiver_count() > 0;
        let mut written = Written::default();
        let version = self.inner.txn(&mut |t| {
            // a transaction tried again starts over
            written = Written {
                keep,
                ..Default::default()
            };
            f(&mut Noting {
                inner: t,
                written: &mut written,
            })
        })?;
        let moved = match version {
            Some(v) => Some(v),
            // records applied at a mirror move the counter themselves
            None if written.moved_version => self.inner.last_version().ok(),
            None => None,
        };
        if !keep {
            // nobody to tell; a subscriber from now on starts at the latest version
            if let Some(v) = moved {
                self.hub.latest.fetch_max(v.0, Ordering::AcqRel);
            }
            return Ok(version);
        }
        if written.is_empty() {
            if let Some(v) = moved {
                // nothing a mount keeps, but the version moved on: a mount waiting for it
                // (a change it made) hears it
                self.hub.publish(Change::Commit {
                    version: v.0,
                    attrs: vec![],
                    entries: vec![],
                });
            }
            return Ok(version);
        }
        let version_told = moved;
        let change = match version_told {
            Some(v) => written
                .decode(v.0)
                .unwrap_or(Change::Reset { version: v.0 }),
            // a change to names or attributes with no version to order it by: forget all
            None => Change::Reset {
                version: self.hub.latest.load(Ordering::Acquire),
            },
        };
        self.hub.publish(change);
        Ok(version)
    }
    fn read(
        &self,
        f: &mut dyn FnMut(&mut dyn KvTxn) -> strait_fs_core::Result<()>,
    ) -> strait_fs_core::Result<()> {
        self.inner.read(f)
    }
    fn incr(&self, key: &[u8], delta: i64) -> strait_fs_core::Result<i64> {
        self.inner.incr(key, delta)
    }
    fn sync(&self) -> strait_fs_core::Result<()> {
        self.inner.sync()
    }
    fn last_version(&self) -> strait_fs_core::Result<Version> {
        self.inner.last_version()
    }
    fn wipe(&self) -> strait_fs_core::Result<()> {
        let _order = self.hub.order.lock();
        let r = self.inner.wipe();
        let version = self.inner.last_version().map(|v| v.0).unwrap_or(0);
        self.hub.publish(Change::Reset { version });
        r
    }
    fn memory(&self) -> Vec<(&'static str, u64)> {
        self.inner.memory()
    }
}

/// One subscriber's stream: batches of the hub's changes, a heartbeat while idle, a reset
/// when it fell behind. Ends when `out` is dropped (the mount went away) or `stop` says so
/// (reads are refused now).
pub(crate) async fn feed(
    hub: Arc<WatchHub>,
    out: tokio::sync::mpsc::Sender<Result<w::WatchBatch, tonic::Status>>,
    stop: impl Fn() -> Option<String> + Send + 'static,
    filter: Option<BatchFilter>,
) {
    let (mut rx, mut version) = hub.subscribe();
    let mut batch = reset_batch(version);
    loop {
        batch.latest = hub.latest.load(Ordering::Acquire);
        if let Some(f) = &filter {
            f(&mut batch);
        }
        if out.send(Ok(batch)).await.is_err() {
            return;
        }
        if let Some(why) = stop() {
            let _ = out.send(Ok(reset_batch(version))).await;
            let _ = out.send(Err(tonic::Status::failed_precondition(why))).await;
            return;
        }
        batch = w::WatchBatch {
            version,
            ..Default::default()
        };
        let first = match tokio::time::timeout(HEARTBEAT, rx.recv()).await {
            Err(_) => continue, // idle: the heartbeat
            Ok(r) => r,
        };
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(r) = next.take() {
            match r {
                Ok(change) => match &*change {
                    Change::Commit {
                        version: v,
                        attrs,
                        entries,
                    } => {
                        version = version.max(*v);
                        batch.version = version;
                        batch
                            .attrs
                            .extend(attrs.iter().map(|(ino, a)| w::AttrChange {
                                ino: *ino,
                                attr: a.as_ref().map(Into::into),
                            }));
                        batch
                            .entries
                            .extend(entries.iter().map(|(parent, name, ino)| w::EntryChange {
                                parent: *parent,
                                name: name.clone(),
                                ino: *ino,
                            }));
                    }
                    Change::Reset { version: v } => {
                        version = version.max(*v);
                        batch = reset_batch(version);
                        break;
                    }
                },
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // changes were missed: start over from now
                    (rx, version) = hub.subscribe();
                    batch = reset_batch(version);
                    break;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
            taken += 1;
            if taken < BATCH_COMMITS_MAX {
                next = match rx.try_recv() {
                    Ok(c) => Some(Ok(c)),
                    Err(broadcast::error::TryRecvError::Lagged(n)) => {
                        Some(Err(broadcast::error::RecvError::Lagged(n)))
                    }
                    Err(_) => None,
                };
            }
        }
    }
}

/// What a stream's batches go through before they leave (a confined caller's: only what lies in
/// its subtree, numbered as it knows it).
pub(crate) type BatchFilter = Box<dyn Fn(&mut w::WatchBatch) + Send + Sync>;

fn reset_batch(version: u64) -> w::WatchBatch {
    w::WatchBatch {
        version,
        reset: true,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strait_fs_core::kv::memory::MemoryKv;

    fn changes(rx: &mut broadcast::Receiver<Arc<Change>>) -> Vec<Arc<Change>> {
        let mut out = vec![];
        while let Ok(c) = rx.try_recv() {
            out.push(c);
        }
        out
    }

    #[test]
    fn each_commit_is_told_with_its_version_and_what_it_wrote() {
        let (kv, hub) = WatchedKv::wrap(Arc::new(MemoryKv::default())).unwrap();
        let hub = hub.expect("an in-process engine is watched");
        let (mut rx, start) = hub.subscribe();
        assert_eq!(start, 0);
        let attr = Attr {
            kind: strait_fs_core::meta::FileKind::File,
            perm: 0o644,
            uid: 1,
            gid: 2,
            nlink: 1,
            length: 3,
            rdev: 0,
            atime_ns: 4,
            mtime_ns: 5,
            ctime_ns: 6,
            parent: 0,
        };
        let encoded = strait_fs_core::changelog::record::encode(&attr).unwrap();
        let mut dentry = 7u64.to_be_bytes().to_vec();
        dentry.push(0);
        kv.txn(&mut |t| {
            t.put(&keys::attr(7), &encoded);
            t.put(&keys::dentry(1, b"f"), &dentry);
            t.put(&keys::chunk(7, 0), b"not told");
            t.append_log(b"record".to_vec());
            Ok(())
        })
        .unwrap();
        kv.txn(&mut |t| {
            t.delete(&keys::dentry(1, b"f"));
            t.delete(&keys::attr(7));
            t.append_log(b"record".to_vec());
            Ok(())
        })
        .unwrap();
        let got = changes(&mut rx);
        assert_eq!(got.len(), 2, "{got:?}");
        match &*got[0] {
            Change::Commit {
                version,
                attrs,
                entries,
            } => {
                assert_eq!(*version, 1);
                assert_eq!(attrs, &vec![(7, Some(attr.clone()))]);
                assert_eq!(entries, &vec![(1, b"f".to_vec(), 7)]);
            }
            c => panic!("{c:?}"),
        }
        match &*got[1] {
            Change::Commit {
                version,
                attrs,
                entries,
            } => {
                assert_eq!(*version, 2);
                assert_eq!(attrs, &vec![(7, None)]);
                assert_eq!(entries, &vec![(1, b"f".to_vec(), 0)]);
            }
            c => panic!("{c:?}"),
        }
        // a subscriber from now starts at version 2 with nothing queued
        let (mut rx2, start) = hub.subscribe();
        assert_eq!(start, 2);
        assert!(changes(&mut rx2).is_empty());
    }

    #[test]
    fn with_no_subscriber_nothing_is_noted_but_the_version_moves() {
        let (kv, hub) = WatchedKv::wrap(Arc::new(MemoryKv::default())).unwrap();
        let hub = hub.unwrap();
        kv.txn(&mut |t| {
            t.put(&keys::attr(3), b"anything");
            t.append_log(b"record".to_vec());
            Ok(())
        })
        .unwrap();
        // a version-less change with no one to reset: nothing happens
        kv.txn(&mut |t| {
            t.put(&keys::attr(4), b"anything");
            Ok(())
        })
        .unwrap();
        let (mut rx, start) = hub.subscribe();
        assert_eq!(start, 1);
        assert!(changes(&mut rx).is_empty());
    }

    #[test]
    fn a_change_without_a_version_or_a_wipe_resets_every_mount() {
        let (kv, hub) = WatchedKv::wrap(Arc::new(MemoryKv::default())).unwrap();
        let hub = hub.unwrap();
        let (mut rx, _) = hub.subscribe();
        kv.txn(&mut |t| {
            t.put(&keys::attr(9), b"anything");
            Ok(())
        })
        .unwrap();
        kv.wipe().unwrap();
        let got = changes(&mut rx);
        assert!(
            got.len() == 2 && got.iter().all(|c| matches!(**c, Change::Reset { .. })),
            "{got:?}"
        );
    }

    #[test]
    fn a_value_that_does_not_decode_resets_rather_than_tells_it() {
        let (kv, hub) = WatchedKv::wrap(Arc::new(MemoryKv::default())).unwrap();
        let hub = hub.unwrap();
        let (mut rx, _) = hub.subscribe();
        kv.txn(&mut |t| {
            t.put(&keys::dentry(1, b"x"), b"short");
            t.append_log(b"record".to_vec());
            Ok(())
        })
        .unwrap();
        let got = changes(&mut rx);
        assert!(matches!(*got[0], Change::Reset { version: 1 }), "{got:?}");
    }
}
