//! [`MetaCache`]: the names and attributes a mount has seen, kept coherent by the daemon's
//! Watch stream (`server/src/watch.rs`), so lookups and stats are answered here.
//!
//! Every value kept carries a tag: the version of the daemon's state it is known to be, or be
//! newer than. The stream's batches come in version order, each saying the version up to which
//! every change was sent (`version` here), so:
//! - a read sent after hearing version `v` is answered from a state at `v` at least: its
//!   answer is kept with tag `v`;
//! - a change this mount made, committed as version `v`, is kept with tag `v`, once the
//!   stream has reached `v` (the caller waits for that: [`MetaCache::settle`]), so its other
//!   effects (a parent's times, a replaced file's link count) are here too;
//! - a value from the stream is the state at its batch's version;
//! - a value with a newer tag is never replaced by one with an older tag, and a key dropped
//!   to bound the memory raises the floor below which no answer is kept (something newer
//!   about it may have been dropped with it).
//!
//! What is kept is used only while the stream is heard from ([`LIVE_FOR`]: a heartbeat comes
//! every 250 ms), so at worst it is as old as the kernel's own one-second caches allow; a
//! stream that breaks or falls behind clears everything (a reset: answers asked before it are
//! not kept). An open still asks the daemon (close-to-open).

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use strait_fs_core::meta::{Attr, Ino, TRASH_INO};

/// What is kept is used only while the stream was heard from within this long.
pub const LIVE_FOR: Duration = Duration::from_secs(1);
/// How long a change this mount made waits for the stream to reach its version before
/// everything is forgotten instead.
pub const SETTLE_MAX: Duration = Duration::from_secs(1);
/// Most names and attributes kept; the oldest kept go first past it.
pub const KEPT_MAX: usize = 200_000;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Attr(Ino),
    Entry(Ino, Box<[u8]>),
}

/// (directory, name)
type EntryKey = (Ino, Box<[u8]>);

#[derive(Default)]
struct State {
    /// The stream is open and its first batch came.
    open: bool,
    /// When the last batch came that reached the daemon's latest version as the batch
    /// before it left (`WatchBatch.latest`): the stream keeps up.
    heard: Option<Instant>,
    /// The daemon's latest version as the last batch left.
    latest: u64,
    /// Every change up to this version was heard.
    version: u64,
    /// Bumped at every reset: an answer asked before one is not kept.
    epoch: u64,
    /// No answer tagged below this is kept for a key not kept now.
    floor: u64,
    attrs: HashMap<Ino, (Attr, u64)>,
    /// (directory, name) -> the inode it names, 0 when known absent.
    entries: HashMap<EntryKey, (Ino, u64)>,
    /// Directories whose every name is kept: a name not kept is absent.
    complete: HashSet<Ino>,
    /// The keys kept, oldest first.
    order: VecDeque<Key>,
}

/// What a mount knows when it sends a read: its answer may be kept under this.
#[derive(Clone, Copy, Debug)]
pub struct Ticket {
    epoch: u64,
    version: u64,
}

/// What a lookup found here.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// The name, its inode and that inode's attributes.
    Entry(Ino, Attr),
    /// The name is known absent.
    Absent,
}

#[derive(Default)]
pub struct MetaCache {
    state: Mutex<State>,
    reached: Condvar,
}

impl State {
    fn live(&self, now: Instant) -> bool {
        self.open && self.heard.is_some_and(|h| now.duration_since(h) < LIVE_FOR)
    }

    fn clear(&mut self) {
        self.attrs.clear();
        self.entries.clear();
        self.complete.clear();
        self.order.clear();
        self.epoch += 1;
    }

    /// Room for one more key: drop the oldest past [`KEPT_MAX`].
    fn make_room(&mut self) {
        while self.order.len() >= KEPT_MAX {
            let Some(k) = self.order.pop_front() else {
                return;
            };
            let tag = match k {
                Key::Attr(ino) => self.attrs.remove(&ino).map(|(_, t)| t),
                Key::Entry(parent, name) => {
                    self.complete.remove(&parent);
                    self.entries.remove(&(parent, name)).map(|(_, t)| t)
                }
            };
            if let Some(t) = tag {
                self.floor = self.floor.max(t);
            }
        }
    }

    /// Keep `attr` for `ino` with `tag` unless something newer is kept, or may have been.
    fn keep_attr(&mut self, ino: Ino, attr: Option<Attr>, tag: u64, from_stream: bool) {
        match self.attrs.get_mut(&ino) {
            Some(slot) => {
                if slot.1 <= tag {
                    match attr {
                        Some(a) => *slot = (a, tag),
                        None => {
                            // deleted: keep nothing (its key in `order` goes when it comes
                            // first; the inode number is not used again)
                            self.attrs.remove(&ino);
                        }
                    }
                }
            }
            None => {
                let Some(a) = attr else { return };
                if !from_stream && tag < self.floor {
                    return;
                }
                self.make_room();
                self.attrs.insert(ino, (a, tag));
                self.order.push_back(Key::Attr(ino));
            }
        }
    }

    fn keep_entry(&mut self, parent: Ino, name: &[u8], ino: Ino, tag: u64, from_stream: bool) {
        let key = (parent, Box::<[u8]>::from(name));
        match self.entries.get_mut(&key) {
            Some(slot) => {
                if slot.1 <= tag {
                    *slot = (ino, tag);
                }
            }
            None => {
                if !from_stream && tag < self.floor {
                    return;
                }
                self.make_room();
                self.order.push_back(Key::Entry(parent, key.1.clone()));
                self.entries.insert(key, (ino, tag));
            }
        }
    }
}

impl MetaCache {
    /// What a read sent now may be kept under; None while nothing is kept (the stream is
    /// not heard from).
    pub fn ticket(&self) -> Option<Ticket> {
        let s = self.state.lock();
        s.live(Instant::now()).then_some(Ticket {
            epoch: s.epoch,
            version: s.version,
        })
    }

    /// The attributes of `ino`, when kept and the stream is heard from.
    pub fn attr(&self, ino: Ino) -> Option<Attr> {
        let s = self.state.lock();
        if !s.live(Instant::now()) {
            return None;
        }
        s.attrs.get(&ino).map(|(a, _)| a.clone())
    }

    /// What is known of `name` in `parent`: None when the daemon must be asked. The caller
    /// checks the caller's search permission on `parent` (its attributes come with it).
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Option<(Attr, Found)> {
        let s = self.state.lock();
        if !s.live(Instant::now()) {
            return None;
        }
        let pa = s.attrs.get(&parent)?.0.clone();
        let key = (parent, Box::<[u8]>::from(name));
        match s.entries.get(&key) {
            Some(&(0, _)) => Some((pa, Found::Absent)),
            Some(&(ino, _)) => {
                let a = s.attrs.get(&ino)?.0.clone();
                Some((pa, Found::Entry(ino, a)))
            }
            None if s.complete.contains(&parent) => Some((pa, Found::Absent)),
            None => None,
        }
    }

    /// Keep a lookup's answer (`None`: the name is absent).
    pub fn keep_lookup(&self, t: Ticket, parent: Ino, name: &[u8], found: Option<(Ino, &Attr)>) {
        if parent == TRASH_INO {
            // the trash's entries are no directory entries: the stream does not tell them
            return;
        }
        let mut s = self.state.lock();
        if s.epoch != t.epoch {
            return;
        }
        match found {
            Some((ino, a)) => {
                s.keep_attr(ino, Some(a.clone()), t.version, false);
                s.keep_entry(parent, name, ino, t.version, false);
            }
            None => s.keep_entry(parent, name, 0, t.version, false),
        }
    }

    /// Keep the attributes a read answered.
    pub fn keep_attr(&self, t: Ticket, ino: Ino, a: &Attr) {
        let mut s = self.state.lock();
        if s.epoch == t.epoch {
            s.keep_attr(ino, Some(a.clone()), t.version, false);
        }
    }

    /// Keep what a change this mount made answered, committed as `version` (after
    /// [`Self::settle`] returned true for it): a new entry, and whether it is a directory
    /// made empty (every name in it is then known).
    pub fn keep_made(&self, t: Ticket, version: u64, parent: Ino, name: &[u8], ino: Ino, a: &Attr) {
        let mut s = self.state.lock();
        if s.epoch != t.epoch || s.version < version {
            return;
        }
        s.keep_attr(ino, Some(a.clone()), version, false);
        s.keep_entry(parent, name, ino, version, false);
        if a.is_dir() && s.attrs.get(&ino).is_some_and(|(_, tag)| *tag == version) {
            // made at this version and not changed since: empty, and every name added to it
            // from now comes in the stream
            s.complete.insert(ino);
        }
    }

    /// Keep the attributes a change this mount made answered, committed as `version`.
    pub fn keep_changed(&self, t: Ticket, version: u64, ino: Ino, a: &Attr) {
        let mut s = self.state.lock();
        if s.epoch == t.epoch && s.version >= version {
            s.keep_attr(ino, Some(a.clone()), version, false);
        }
    }

    /// Wait until the stream has reached `version` (a change this mount made), so what is
    /// kept shows it; true when it did. Past [`SETTLE_MAX`], or while the stream is not
    /// heard from, everything kept is forgotten instead.
    pub fn settle(&self, version: u64) -> bool {
        let mut s = self.state.lock();
        if s.version >= version {
            return true;
        }
        if !s.live(Instant::now()) {
            s.clear();
            return false;
        }
        let deadline = Instant::now() + SETTLE_MAX;
        while s.version < version {
            if self.reached.wait_until(&mut s, deadline).timed_out() && s.version < version {
                tracing::warn!(
                    "the daemon's change stream has not reached version {version} within \
                     {SETTLE_MAX:?} (it is at {}): forgetting the names and attributes kept",
                    s.version
                );
                s.clear();
                return false;
            }
        }
        true
    }

    /// A change whose outcome is unknown (it failed on the way): forget everything.
    pub fn forget_all(&self) {
        self.state.lock().clear();
    }

    /// The stream (re)started at `version`, or asked for a reset: forget everything.
    pub fn reset(&self, version: u64) {
        let mut s = self.state.lock();
        s.clear();
        s.open = true;
        s.heard = Some(Instant::now());
        s.latest = version;
        s.version = s.version.max(version);
        s.floor = s.floor.max(version);
        drop(s);
        self.reached.notify_all();
    }

    /// The stream broke: nothing kept is used until it is open again (and reset).
    pub fn closed(&self) {
        let mut s = self.state.lock();
        s.open = false;
        s.clear();
        drop(s);
        self.reached.notify_all();
    }

    /// One batch of the stream: each change as it stands at `version`; `latest`, the
    /// daemon's latest version as the batch left.
    pub fn apply(
        &self,
        version: u64,
        latest: u64,
        attrs: impl IntoIterator<Item = (Ino, Option<Attr>)>,
        entries: impl IntoIterator<Item = (Ino, Vec<u8>, Ino)>,
    ) {
        let mut s = self.state.lock();
        if !s.open {
            return;
        }
        if version >= s.latest {
            // everything committed before the last batch left is here: the stream keeps up
            s.heard = Some(Instant::now());
        }
        s.latest = latest.max(version);
        for (ino, a) in attrs {
            s.keep_attr(ino, a, version, true);
        }
        for (parent, name, ino) in entries {
            s.keep_entry(parent, &name, ino, version, true);
        }
        let moved = version > s.version;
        s.version = s.version.max(version);
        drop(s);
        if moved {
            self.reached.notify_all();
        }
    }

    /// How many names and attributes are kept (for tests and metrics).
    pub fn kept(&self) -> usize {
        let s = self.state.lock();
        s.attrs.len() + s.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strait_fs_core::meta::FileKind;

    fn attr(kind: FileKind, mtime_ns: i64) -> Attr {
        Attr {
            kind,
            perm: 0o755,
            uid: 0,
            gid: 0,
            nlink: 1,
            length: 0,
            rdev: 0,
            atime_ns: 0,
            mtime_ns,
            ctime_ns: mtime_ns,
            parent: 0,
        }
    }

    fn open_at(v: u64) -> MetaCache {
        let c = MetaCache::default();
        c.reset(v);
        c
    }

    #[test]
    fn an_answer_asked_before_a_change_never_replaces_it() {
        let c = open_at(10);
        c.apply(10, 10, [(1, Some(attr(FileKind::Dir, 1)))], []);
        let t = c.ticket().unwrap();
        // another mount changes inode 5 (version 12) while our getattr is on its way
        c.apply(12, 12, [(5, Some(attr(FileKind::File, 12)))], []);
        c.keep_attr(t, 5, &attr(FileKind::File, 3));
        assert_eq!(
            c.attr(5).unwrap().mtime_ns,
            12,
            "the older answer replaced the change"
        );
        // a name removed while a lookup that found it was on its way
        let t = c.ticket().unwrap();
        c.apply(13, 13, [], [(1, b"gone".to_vec(), 0)]);
        c.keep_lookup(t, 1, b"gone", Some((9, &attr(FileKind::File, 1))));
        assert_eq!(c.lookup(1, b"gone").unwrap().1, Found::Absent);
    }

    #[test]
    fn a_reset_or_a_dropped_key_keeps_no_answer_asked_before_it() {
        let c = open_at(1);
        let t = c.ticket().unwrap();
        c.reset(5);
        c.keep_attr(t, 7, &attr(FileKind::File, 1));
        assert_eq!(c.attr(7), None);
        // the floor: an answer older than what was dropped to make room is not kept
        let c = open_at(1);
        let t = c.ticket().unwrap();
        for i in 0..KEPT_MAX as u64 + 1 {
            c.apply(
                2 + i,
                2 + i,
                [(1000 + i, Some(attr(FileKind::File, 0)))],
                [],
            );
        }
        c.keep_attr(t, 7, &attr(FileKind::File, 1));
        assert_eq!(c.attr(7), None);
        assert!(c.kept() <= KEPT_MAX);
    }

    #[test]
    fn a_directory_made_here_answers_absent_names_until_its_entries_are_dropped() {
        let c = open_at(1);
        c.apply(1, 1, [(1, Some(attr(FileKind::Dir, 1)))], []);
        let t = c.ticket().unwrap();
        // mkdir committed as version 2; the stream tells it
        c.apply(
            2,
            2,
            [
                (1, Some(attr(FileKind::Dir, 2))),
                (2, Some(attr(FileKind::Dir, 2))),
            ],
            [(1, b"d".to_vec(), 2)],
        );
        assert!(c.settle(2));
        c.keep_made(t, 2, 1, b"d", 2, &attr(FileKind::Dir, 2));
        assert_eq!(c.lookup(2, b"x").unwrap().1, Found::Absent);
        // another mount makes d/x: the stream says so, and the name is found
        c.apply(
            3,
            3,
            [
                (2, Some(attr(FileKind::Dir, 3))),
                (3, Some(attr(FileKind::File, 3))),
            ],
            [(2, b"x".to_vec(), 3)],
        );
        assert!(matches!(c.lookup(2, b"x").unwrap().1, Found::Entry(3, _)));
        // a directory changed before this mount kept its making is not taken as complete
        let t = c.ticket().unwrap();
        c.apply(
            5,
            5,
            [(4, Some(attr(FileKind::Dir, 5)))],
            [(1, b"e".to_vec(), 4), (4, b"y".to_vec(), 6)],
        );
        c.keep_made(t, 4, 1, b"e", 4, &attr(FileKind::Dir, 4));
        assert_eq!(c.lookup(4, b"z"), None);
    }

    #[test]
    fn nothing_is_used_once_the_stream_is_silent_or_closed() {
        let c = open_at(1);
        c.apply(1, 1, [(1, Some(attr(FileKind::Dir, 1)))], []);
        assert!(c.attr(1).is_some());
        c.state.lock().heard = Some(Instant::now() - LIVE_FOR);
        assert_eq!(c.attr(1), None);
        assert!(c.ticket().is_none());
        c.reset(1);
        c.apply(1, 1, [(1, Some(attr(FileKind::Dir, 1)))], []);
        c.closed();
        assert_eq!(c.attr(1), None);
        // a change waits for nothing then, and keeps nothing
        assert!(!c.settle(9));
    }

    #[test]
    fn a_stream_that_falls_further_behind_is_not_trusted() {
        let c = open_at(1);
        c.apply(1, 1, [(1, Some(attr(FileKind::Dir, 1)))], []);
        // each batch lags the daemon's latest version as the batch before it left
        for v in 2..6 {
            c.apply(v, v * 100, [], []);
        }
        c.state.lock().heard = Some(Instant::now() - LIVE_FOR);
        c.apply(6, 700, [], []);
        assert_eq!(c.attr(1), None, "a stream 600 versions behind was trusted");
        // it catches up: trusted again
        c.apply(700, 700, [], []);
        assert!(c.attr(1).is_some());
    }

    #[test]
    fn a_change_made_here_waits_for_the_stream_to_reach_it() {
        let c = std::sync::Arc::new(open_at(1));
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.settle(3));
        std::thread::sleep(Duration::from_millis(20));
        c.apply(3, 3, [], []);
        assert!(t.join().unwrap());
    }
}
