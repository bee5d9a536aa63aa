//! What a client's files may hold, given what its operations returned.
//!
//! Each client works in a directory of its own, so only its own operations change its files:
//! replaying its history in order tells, for every name, the set of states the name may be in.
//! An operation that succeeded happened; one that failed with a clean error (ENOENT, EEXIST,
//! ...) changed nothing after the step that failed; one whose outcome is unknown (EIO, a
//! timeout, a broken mount) may have stopped after any of its steps. Every read of the
//! client's own files must then return one of the possible states: a lost acknowledged write,
//! a write applied twice, a stale read at the writer's own mount and bytes nobody wrote all
//! show up as a read outside the set.
//!
//! Names are tracked one by one (a rename's effect on the pair is over-approximated), which
//! keeps the sets small; a name whose set grows past [`MAX_STATES`] becomes indeterminate,
//! and is not checked until an operation that succeeded fixes its state again.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A name with more possible states than this is no longer checked (until fixed again).
pub const MAX_STATES: usize = 64;

/// A file's contents as runs of records: (sequence number of the writing operation, 0 for a
/// hole; number of records). Normalised: no empty run, no two adjacent runs with one number.
pub type Runs = Vec<(u64, u64)>;

/// What a name is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Node {
    Absent,
    File(Runs),
    Dir,
}

/// How a rename treats its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RenameFlags {
    Plain,
    NoReplace,
    Exchange,
}

/// One atomic step of an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Effect {
    /// open with O_CREAT|O_TRUNC (`create`) or truncate(2) to `records` records.
    Truncate {
        name: String,
        records: u64,
        create: bool,
    },
    /// open with O_CREAT and no O_TRUNC: an absent name becomes an empty file.
    Create {
        name: String,
    },
    /// Write `n` records of operation `seq` at record `at`, or at the end (`at: None`).
    Write {
        name: String,
        at: Option<u64>,
        n: u64,
        seq: u64,
    },
    Rename {
        from: String,
        to: String,
        flags: RenameFlags,
    },
    Unlink {
        name: String,
    },
    Mkdir {
        name: String,
    },
    Rmdir {
        name: String,
    },
    /// `strait clone FROM TO`: TO, absent, becomes what FROM is (FROM stays as it is).
    Clone {
        from: String,
        to: String,
    },
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Ok,
    /// A clean error: the step that failed changed nothing, the later ones did not run.
    Failed,
    /// Anything else: the operation may have stopped after any step.
    Unknown,
    /// It never reached the file system: its mount's process was already dead (ENOTCONN
    /// from the kernel), so it changed nothing.
    NotRun,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Slot {
    states: Vec<Node>,
    indeterminate: bool,
}

impl Slot {
    fn absent() -> Self {
        Slot {
            states: vec![Node::Absent],
            indeterminate: false,
        }
    }
    fn normalise(&mut self) {
        self.states.sort();
        self.states.dedup();
        if self.states.len() > MAX_STATES {
            self.states.clear();
            self.indeterminate = true;
        }
    }
}

/// The possible states of one client's names.
#[derive(Debug, Clone, Default)]
pub struct Model {
    slots: BTreeMap<String, Slot>,
}

/// A read that no possible state explains, or an operation whose outcome no state explains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub name: String,
    pub expected: Vec<Node>,
    pub observed: String,
}

fn total(r: &Runs) -> u64 {
    r.iter().map(|&(_, n)| n).sum()
}

fn normalise(r: Runs) -> Runs {
    let mut out: Runs = Vec::with_capacity(r.len());
    for (s, n) in r {
        if n == 0 {
            continue;
        }
        match out.last_mut() {
            Some((ls, ln)) if *ls == s => *ln += n,
            _ => out.push((s, n)),
        }
    }
    out
}

/// Records `from..to` of `r` (clamped to its length).
fn slice(r: &Runs, from: u64, to: u64) -> Runs {
    let mut out = vec![];
    let mut pos = 0;
    for &(s, n) in r {
        let (a, b) = (pos.max(from), (pos + n).min(to));
        if a < b {
            out.push((s, b - a));
        }
        pos += n;
    }
    out
}

/// `r` with `n` records of `seq` at record `at` (holes fill any gap after the end).
pub fn write_runs(r: &Runs, at: u64, n: u64, seq: u64) -> Runs {
    let len = total(r);
    let mut out = slice(r, 0, at);
    if at > len {
        out.push((0, at - len));
    }
    out.push((seq, n));
    out.extend(slice(r, at + n, len));
    normalise(out)
}

/// `r` cut or extended (with holes) to `records`.
pub fn truncate_runs(r: &Runs, records: u64) -> Runs {
    let len = total(r);
    let mut out = slice(r, 0, records);
    if records > len {
        out.push((0, records - len));
    }
    normalise(out)
}

/// Runs of a decoded file (None when a record was written by another client).
pub fn runs_of(records: &[crate::payload::Record], owner: u32) -> Option<Runs> {
    let mut out = vec![];
    for r in records {
        match *r {
            crate::payload::Record::Hole => out.push((0, 1)),
            crate::payload::Record::Written { client, seq } if client == owner => {
                out.push((seq, 1))
            }
            crate::payload::Record::Written { .. } => return None,
        }
    }
    Some(normalise(out))
}

/// The result of one step on one state: the new state, or None when the step fails cleanly.
fn step_one(node: &Node, e: &Effect) -> Option<Node> {
    use Node::*;
    match (e, node) {
        (
            Effect::Truncate {
                create: true,
                records,
                ..
            },
            Absent,
        ) => Some(File(truncate_runs(&vec![], *records))),
        (Effect::Truncate { records, .. }, File(r)) => Some(File(truncate_runs(r, *records))),
        (Effect::Truncate { .. }, _) => None,
        (Effect::Create { .. }, Absent) => Some(File(vec![])),
        (Effect::Create { .. }, File(r)) => Some(File(r.clone())),
        (Effect::Create { .. }, Dir) => None,
        (Effect::Write { at, n, seq, .. }, File(r)) => Some(File(write_runs(
            r,
            at.unwrap_or_else(|| total(r)),
            *n,
            *seq,
        ))),
        (Effect::Write { .. }, _) => None,
        (Effect::Unlink { .. }, File(_)) => Some(Absent),
        (Effect::Unlink { .. }, _) => None,
        (Effect::Mkdir { .. }, Absent) => Some(Dir),
        (Effect::Mkdir { .. }, _) => None,
        (Effect::Rmdir { .. }, Dir) => Some(Absent),
        (Effect::Rmdir { .. }, _) => None,
        (Effect::Rename { .. } | Effect::Clone { .. }, _) => {
            unreachable!("renames and clones touch two names")
        }
    }
}

fn target(e: &Effect) -> &str {
    match e {
        Effect::Truncate { name, .. }
        | Effect::Create { name }
        | Effect::Write { name, .. }
        | Effect::Unlink { name }
        | Effect::Mkdir { name }
        | Effect::Rmdir { name } => name,
        Effect::Rename { from, .. } | Effect::Clone { from, .. } => from,
    }
}

/// Whether a rename from `s` onto `d` succeeds (the directories here are always empty).
fn rename_ok(s: &Node, d: &Node, flags: RenameFlags) -> bool {
    use Node::*;
    match flags {
        RenameFlags::Exchange => *s != Absent && *d != Absent,
        RenameFlags::NoReplace => *s != Absent && *d == Absent,
        RenameFlags::Plain => matches!((s, d), (File(_), Absent | File(_)) | (Dir, Absent | Dir)),
    }
}

/// What the model does with one step.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// The step happened: keep the states in which it succeeds.
    Succeeded,
    /// The step failed cleanly: keep the states in which it fails, unchanged.
    Failed,
    /// The step failed with ENOENT: keep the states in which it fails because a name it
    /// needs is absent (a change made twice, the second time finding its own result, fails
    /// so where every state has the name).
    Missing,
    /// It may or may not have happened.
    Maybe,
    /// The step was refused whatever the state (EDQUOT: a directory quota, which the model
    /// does not track): it changed nothing.
    Refused,
}

impl Model {
    fn slot(&mut self, name: &str) -> &mut Slot {
        self.slots
            .entry(name.to_string())
            .or_insert_with(Slot::absent)
    }

    fn apply(&mut self, e: &Effect, mode: Mode) {
        if mode == Mode::Refused {
            return;
        }
        if let Effect::Rename { from, to, flags } = e {
            return self.rename(from, to, *flags, mode);
        }
        if let Effect::Clone { from, to } = e {
            return self.clone_to(from, to, mode);
        }
        let slot = self.slot(target(e));
        if slot.indeterminate {
            // an operation that succeeded fixes the state of a name whatever it was
            let fixed = match e {
                Effect::Truncate {
                    create: true,
                    records,
                    ..
                } if mode == Mode::Succeeded => Some(Node::File(truncate_runs(&vec![], *records))),
                Effect::Unlink { .. } | Effect::Rmdir { .. } if mode == Mode::Succeeded => {
                    Some(Node::Absent)
                }
                Effect::Mkdir { .. } if mode == Mode::Succeeded => Some(Node::Dir),
                _ => None,
            };
            if let Some(n) = fixed {
                *slot = Slot {
                    states: vec![n],
                    indeterminate: false,
                };
            }
            return;
        }
        let mut next = vec![];
        for n in &slot.states {
            match (step_one(n, e), mode) {
                (Some(m), Mode::Succeeded) => next.push(m),
                (None, Mode::Failed) => next.push(n.clone()),
                // the steps that fail on an absent name are those that need it
                (None, Mode::Missing) if *n == Node::Absent => next.push(n.clone()),
                (Some(m), Mode::Maybe) => {
                    next.push(m);
                    next.push(n.clone())
                }
                (None, Mode::Maybe) => next.push(n.clone()),
                _ => {}
            }
        }
        slot.states = next;
        slot.normalise();
    }

    fn rename(&mut self, from: &str, to: &str, flags: RenameFlags, mode: Mode) {
        let s = self.slot(from).clone();
        let d = self.slot(to).clone();
        if s.indeterminate || d.indeterminate {
            for n in [from, to] {
                *self.slot(n) = Slot {
                    states: vec![],
                    indeterminate: true,
                };
            }
            return;
        }
        // per name: the states the pair may leave it in, over every pair of states
        let (mut ns, mut nd) = (vec![], vec![]);
        let failed = matches!(mode, Mode::Failed | Mode::Missing);
        for a in &s.states {
            for b in &d.states {
                let ok = rename_ok(a, b, flags);
                let moved = match flags {
                    RenameFlags::Exchange => (b.clone(), a.clone()),
                    _ => (Node::Absent, a.clone()),
                };
                if ok && !failed {
                    ns.push(moved.0);
                    nd.push(moved.1);
                }
                // ENOENT: the source is absent (for an exchange, either name)
                let missing =
                    *a == Node::Absent || (flags == RenameFlags::Exchange && *b == Node::Absent);
                let fails_so = mode == Mode::Failed || (mode == Mode::Missing && missing);
                if (!ok && fails_so) || mode == Mode::Maybe {
                    ns.push(a.clone());
                    nd.push(b.clone());
                }
            }
        }
        for (n, st) in [(from, ns), (to, nd)] {
            let slot = self.slot(n);
            slot.states = st;
            slot.normalise();
        }
    }

    /// A clone of `from` as `to`: it succeeds where `from` exists and `to` does not (EEXIST
    /// otherwise; ENOENT where `from` is absent), and `from` never changes.
    fn clone_to(&mut self, from: &str, to: &str, mode: Mode) {
        let s = self.slot(from).clone();
        let d = self.slot(to).clone();
        if s.indeterminate || d.indeterminate {
            *self.slot(to) = Slot {
                states: vec![],
                indeterminate: true,
            };
            return;
        }
        let mut nd = vec![];
        for a in &s.states {
            for b in &d.states {
                let ok = *a != Node::Absent && *b == Node::Absent;
                match mode {
                    Mode::Succeeded if ok => nd.push(a.clone()),
                    Mode::Failed if !ok => nd.push(b.clone()),
                    Mode::Missing if *a == Node::Absent => nd.push(b.clone()),
                    Mode::Maybe => {
                        if ok {
                            nd.push(a.clone());
                        }
                        nd.push(b.clone());
                    }
                    _ => {}
                }
            }
        }
        // a failure with no state of `to` left says so for `to` (its source kept its states)
        let slot = self.slot(to);
        slot.states = nd;
        slot.normalise();
    }

    fn merge(&mut self, other: Model) {
        for (name, o) in other.slots {
            let s = self.slot(&name);
            if s.indeterminate || o.indeterminate {
                s.states.clear();
                s.indeterminate = true;
                continue;
            }
            s.states.extend(o.states);
            s.normalise();
        }
    }

    /// Replay one operation of the client. Err names the states that contradict its outcome
    /// (an operation that succeeded where no state allows it, or failed where every state
    /// allows it); the names involved then become indeterminate.
    pub fn operation(&mut self, effects: &[Effect], outcome: Outcome) -> Result<(), Mismatch> {
        self.operation_errno(effects, outcome, None)
    }

    /// [`Model::operation`] of an operation that failed with `errno`: ENOENT is explained only
    /// by a state where a name the failing step needs is absent.
    pub fn operation_errno(
        &mut self,
        effects: &[Effect],
        outcome: Outcome,
        errno: Option<i32>,
    ) -> Result<(), Mismatch> {
        let fail = match errno {
            Some(libc::ENOENT) => Mode::Missing,
            Some(libc::EDQUOT) => Mode::Refused,
            _ => Mode::Failed,
        };
        let before = self.clone();
        match outcome {
            Outcome::Ok => {
                for e in effects {
                    self.apply(e, Mode::Succeeded);
                }
            }
            Outcome::Unknown => {
                let mut acc = before.clone();
                let mut cur = before.clone();
                for e in effects {
                    cur.apply(e, Mode::Succeeded);
                    acc.merge(cur.clone());
                }
                // and the operation could have failed anywhere (a failed step changes nothing)
                *self = acc;
            }
            Outcome::Failed => {
                let mut acc: Option<Model> = None;
                let mut cur = before.clone();
                for e in effects {
                    let mut failed_here = cur.clone();
                    failed_here.apply(e, fail);
                    match &mut acc {
                        None => acc = Some(failed_here),
                        Some(a) => a.merge(failed_here),
                    }
                    cur.apply(e, Mode::Succeeded);
                }
                *self = acc.unwrap_or(before.clone());
            }
            Outcome::NotRun => return Ok(()),
        }
        // a name left with no state: the outcome contradicts every state it could have had
        for e in effects {
            let names = match e {
                Effect::Rename { from, to, .. } | Effect::Clone { from, to } => {
                    vec![from.as_str(), to.as_str()]
                }
                other => vec![target(other)],
            };
            for n in names {
                let slot = self.slot(n);
                if !slot.indeterminate && slot.states.is_empty() {
                    slot.indeterminate = true;
                    let expected = before
                        .slots
                        .get(n)
                        .map(|s| s.states.clone())
                        .unwrap_or_else(|| vec![Node::Absent]);
                    return Err(Mismatch {
                        name: n.to_string(),
                        expected,
                        observed: format!("{outcome:?} of {e:?}"),
                    });
                }
            }
        }
        Ok(())
    }

    /// Check a read of `name` that returned `observed`; None when the name is indeterminate.
    pub fn check_read(&mut self, name: &str, observed: &Node) -> Option<Result<(), Mismatch>> {
        let slot = self.slot(name);
        if slot.indeterminate {
            return None;
        }
        if slot.states.contains(observed) {
            return Some(Ok(()));
        }
        Some(Err(Mismatch {
            name: name.to_string(),
            expected: slot.states.clone(),
            observed: format!("{observed:?}"),
        }))
    }

    /// Check that `name` may be present (`present`) or absent, as a listing showed it.
    pub fn check_listed(&mut self, name: &str, present: bool) -> Option<Result<(), Mismatch>> {
        let slot = self.slot(name);
        if slot.indeterminate {
            return None;
        }
        let ok = slot.states.iter().any(|n| (*n != Node::Absent) == present);
        Some(if ok {
            Ok(())
        } else {
            Err(Mismatch {
                name: name.to_string(),
                expected: slot.states.clone(),
                observed: if present { "listed" } else { "not listed" }.to_string(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, n: u64, seq: u64) -> Vec<Effect> {
        vec![
            Effect::Truncate {
                name: name.into(),
                records: 0,
                create: true,
            },
            Effect::Write {
                name: name.into(),
                at: Some(0),
                n,
                seq,
            },
        ]
    }

    /// A clone copies its source to an absent name and never changes the source; EEXIST
    /// where the name is taken, ENOENT where the source is absent; EDQUOT changes nothing
    /// whatever the state.
    #[test]
    fn a_clone_copies_its_source_to_an_absent_name() {
        let mut m = Model::default();
        let w = |name: &str, seq| Effect::Write {
            name: name.into(),
            at: Some(0),
            n: 2,
            seq,
        };
        let create = |name: &str| Effect::Create { name: name.into() };
        let clone = |from: &str, to: &str| Effect::Clone {
            from: from.into(),
            to: to.into(),
        };
        m.operation(&[create("f0"), w("f0", 1)], Outcome::Ok)
            .unwrap();
        m.operation(&[clone("f0", "f1")], Outcome::Ok).unwrap();
        let copy = Node::File(vec![(1, 2)]);
        assert_eq!(m.check_read("f1", &copy), Some(Ok(())));
        assert_eq!(m.check_read("f0", &copy), Some(Ok(())));
        // the clone changes alone
        m.operation(&[w("f1", 2)], Outcome::Ok).unwrap();
        assert_eq!(m.check_read("f0", &copy), Some(Ok(())));
        // onto a taken name: EEXIST is explained, success is not
        m.operation_errno(&[clone("f0", "f1")], Outcome::Failed, Some(libc::EEXIST))
            .unwrap();
        assert!(m
            .clone()
            .operation(&[clone("f0", "f1")], Outcome::Ok)
            .is_err());
        // from an absent name: ENOENT
        m.operation_errno(&[clone("f3", "f2")], Outcome::Failed, Some(libc::ENOENT))
            .unwrap();
        assert!(m
            .clone()
            .operation_errno(&[clone("f0", "f2")], Outcome::Failed, Some(libc::ENOENT))
            .is_err());
        // EDQUOT: nothing changed, whatever would have
        m.operation_errno(&[clone("f0", "f2")], Outcome::Failed, Some(libc::EDQUOT))
            .unwrap();
        m.operation_errno(&[create("f3")], Outcome::Failed, Some(libc::EDQUOT))
            .unwrap();
        assert_eq!(m.check_read("f2", &Node::Absent), Some(Ok(())));
        assert_eq!(m.check_read("f3", &Node::Absent), Some(Ok(())));
        // unknown: either
        m.operation(&[clone("f0", "f2")], Outcome::Unknown).unwrap();
        assert_eq!(m.check_read("f2", &Node::Absent), Some(Ok(())));
        assert_eq!(m.check_read("f2", &copy), Some(Ok(())));
    }

    #[test]
    fn runs_write_and_truncate() {
        let r = write_runs(&vec![], 0, 4, 1);
        assert_eq!(r, vec![(1, 4)]);
        assert_eq!(write_runs(&r, 1, 2, 2), vec![(1, 1), (2, 2), (1, 1)]);
        assert_eq!(write_runs(&r, 6, 1, 3), vec![(1, 4), (0, 2), (3, 1)]);
        assert_eq!(truncate_runs(&r, 2), vec![(1, 2)]);
        assert_eq!(truncate_runs(&r, 6), vec![(1, 4), (0, 2)]);
        assert_eq!(write_runs(&r, 0, 4, 1), vec![(1, 4)]);
    }

    #[test]
    fn an_acknowledged_write_must_be_read_back() {
        let mut m = Model::default();
        m.operation(&write("f", 3, 1), Outcome::Ok).unwrap();
        assert_eq!(m.check_read("f", &Node::File(vec![(1, 3)])), Some(Ok(())));
        // the write lost: the file is absent, or still empty
        assert!(matches!(m.check_read("f", &Node::Absent), Some(Err(_))));
        assert!(matches!(
            m.check_read("f", &Node::File(vec![])),
            Some(Err(_))
        ));
    }

    #[test]
    fn an_unknown_write_may_stop_after_any_step() {
        let mut m = Model::default();
        m.operation(&write("f", 3, 1), Outcome::Ok).unwrap();
        m.operation(&write("f", 2, 2), Outcome::Unknown).unwrap();
        for ok in [vec![(1, 3)], vec![], vec![(2, 2)]] {
            assert_eq!(m.check_read("f", &Node::File(ok)), Some(Ok(())));
        }
        assert!(matches!(m.check_read("f", &Node::Absent), Some(Err(_))));
    }

    #[test]
    fn a_clean_failure_must_be_explained_by_some_state() {
        let mut m = Model::default();
        m.operation(&write("f", 1, 1), Outcome::Ok).unwrap();
        // unlink said ENOENT for a file that exists: the mark of an unlink applied twice
        let e = m.operation(&[Effect::Unlink { name: "f".into() }], Outcome::Failed);
        assert!(e.is_err());
        // and ENOENT for an absent one is fine
        let mut m = Model::default();
        m.operation(&[Effect::Unlink { name: "g".into() }], Outcome::Failed)
            .unwrap();
    }

    #[test]
    fn a_change_that_never_reached_a_dead_mount_changes_nothing() {
        let mut m = Model::default();
        m.operation(&write("f", 1, 1), Outcome::Ok).unwrap();
        // unexplained as a clean failure (the file exists), fine as never run
        m.operation(&[Effect::Unlink { name: "f".into() }], Outcome::NotRun)
            .unwrap();
        assert_eq!(m.check_read("f", &Node::File(vec![(1, 1)])), Some(Ok(())));
        assert!(matches!(m.check_read("f", &Node::Absent), Some(Err(_))));
    }

    #[test]
    fn rename_exchange_applied_twice_is_caught() {
        let mut m = Model::default();
        m.operation(&write("a", 1, 1), Outcome::Ok).unwrap();
        m.operation(&write("b", 1, 2), Outcome::Ok).unwrap();
        let x = [Effect::Rename {
            from: "a".into(),
            to: "b".into(),
            flags: RenameFlags::Exchange,
        }];
        m.operation(&x, Outcome::Ok).unwrap();
        // swapped once: a holds 2's record
        assert_eq!(m.check_read("a", &Node::File(vec![(2, 1)])), Some(Ok(())));
        // a retry that swapped them back shows as the old contents
        assert!(matches!(
            m.check_read("a", &Node::File(vec![(1, 1)])),
            Some(Err(_))
        ));
    }

    #[test]
    fn plain_rename_moves_and_noreplace_refuses() {
        let mut m = Model::default();
        m.operation(&write("a", 1, 1), Outcome::Ok).unwrap();
        let mv = |flags| {
            [Effect::Rename {
                from: "a".into(),
                to: "b".into(),
                flags,
            }]
        };
        m.operation(&mv(RenameFlags::Plain), Outcome::Ok).unwrap();
        assert_eq!(m.check_read("a", &Node::Absent), Some(Ok(())));
        assert_eq!(m.check_read("b", &Node::File(vec![(1, 1)])), Some(Ok(())));
        m.operation(&write("a", 1, 3), Outcome::Ok).unwrap();
        // NOREPLACE onto an existing b fails cleanly, and succeeding would contradict it
        m.operation(&mv(RenameFlags::NoReplace), Outcome::Failed)
            .unwrap();
        assert!(m
            .operation(&mv(RenameFlags::NoReplace), Outcome::Ok)
            .is_err());
    }

    #[test]
    fn enoent_is_explained_only_by_an_absent_name() {
        let mut m = Model::default();
        m.operation(&write("a", 1, 1), Outcome::Ok).unwrap();
        m.operation(&[Effect::Mkdir { name: "d".into() }], Outcome::Ok)
            .unwrap();
        let mv = |from: &str, to: &str| {
            [Effect::Rename {
                from: from.into(),
                to: to.into(),
                flags: RenameFlags::Plain,
            }]
        };
        let enoent = Some(libc::ENOENT);
        // a file onto a directory fails (EISDIR), but never with ENOENT while a exists
        m.clone()
            .operation_errno(&mv("a", "d"), Outcome::Failed, Some(libc::EISDIR))
            .unwrap();
        assert!(m
            .clone()
            .operation_errno(&mv("a", "d"), Outcome::Failed, enoent)
            .is_err());
        // a rename made twice: the second finds its source gone, which the first explains
        m.operation(&mv("a", "b"), Outcome::Ok).unwrap();
        m.operation_errno(&mv("a", "b"), Outcome::Failed, enoent)
            .unwrap();
        // an append (create, then write) never fails with ENOENT in an existing directory
        let append = [
            Effect::Create { name: "b".into() },
            Effect::Write {
                name: "b".into(),
                at: None,
                n: 1,
                seq: 2,
            },
        ];
        assert!(m
            .clone()
            .operation_errno(&append, Outcome::Failed, enoent)
            .is_err());
        // unlink and rmdir: ENOENT only for an absent name
        assert!(m
            .clone()
            .operation_errno(
                &[Effect::Rmdir { name: "d".into() }],
                Outcome::Failed,
                enoent
            )
            .is_err());
        m.operation_errno(
            &[Effect::Unlink { name: "a".into() }],
            Outcome::Failed,
            enoent,
        )
        .unwrap();
    }

    #[test]
    fn growth_past_the_cap_makes_a_name_indeterminate_until_fixed() {
        let mut m = Model::default();
        for seq in 1..=70 {
            m.operation(&write("f", seq, seq), Outcome::Unknown)
                .unwrap();
        }
        assert_eq!(m.check_read("f", &Node::Absent), None);
        m.operation(&write("f", 1, 11), Outcome::Ok).unwrap();
        assert_eq!(m.check_read("f", &Node::File(vec![(11, 1)])), Some(Ok(())));
    }

    #[test]
    fn listings_are_checked_per_name() {
        let mut m = Model::default();
        m.operation(&[Effect::Mkdir { name: "d".into() }], Outcome::Ok)
            .unwrap();
        assert_eq!(m.check_listed("d", true), Some(Ok(())));
        assert!(matches!(m.check_listed("d", false), Some(Err(_))));
        assert_eq!(m.check_listed("x", false), Some(Ok(())));
    }
}
