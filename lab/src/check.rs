//! The checkers: pure functions over the recorded history (and the final reads).

use std::collections::{BTreeMap, VecDeque};

use crate::model::{Model, Node, Outcome};
use crate::workload::{Event, Observed, Op, Region, NAMES};

/// The checkers, by number (index 0 unused).
pub const CHECKERS: [&str; 13] = [
    "",
    "acknowledged writes are not lost",
    "a mount's reads never go back",
    "read-your-writes at each mount",
    "reads at a mirror within the window",
    "every byte read was written",
    "the mirror converges after the heal",
    "no orphan object after GC",
    "no block a history references is deleted",
    "fcntl locks exclude each other",
    "no change applied twice",
    "a directory quota is never exceeded",
    "nothing in the trash is lost",
];

/// The most inodes each client's directory may hold: its directory quota (checker 11), below
/// the names a client uses, so creates and clones are refused (EDQUOT) now and then.
pub const QUOTA_FILES: u64 = 7;

#[derive(Debug, Clone)]
pub struct Violation {
    pub checker: usize,
    pub what: String,
    /// The operations that show it.
    pub excerpt: Vec<String>,
}

/// What the checkers looked at and found.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub checked: [u64; 13],
    pub violations: Vec<Violation>,
}

impl Tally {
    pub fn violated(&mut self, checker: usize, what: String, excerpt: Vec<String>) {
        self.violations.push(Violation {
            checker,
            what,
            excerpt,
        });
    }
    pub fn count(&self, checker: usize) -> usize {
        self.violations
            .iter()
            .filter(|v| v.checker == checker)
            .count()
    }
}

/// How stale a register read may be, in ms, by reader's and writer's region.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// Reads at the mirror are bounded at all (policy `forward` or `wait`).
    pub mirror_bounded: bool,
    /// The window plus one link round trip plus the kernel's attribute cache and a margin.
    pub mirror_ms: u64,
    /// The kernel's attribute and entry cache at a mount other than the writer's.
    pub other_mount_ms: u64,
    /// When the primary was in region B (a `switchover`, from its start to the end of the way
    /// back), ms since the run began: region A was a mirror then, so a read at A of a write
    /// made at B is bounded as a mirror's read is (`mirror_ms`), until `mirror_ms` after.
    pub swapped: Vec<(u64, u64)>,
}

impl Bounds {
    /// Whether a read that began at `t` ms may have been served by region A as a mirror.
    fn a_was_mirror(&self, t: u64) -> bool {
        self.swapped
            .iter()
            .any(|&(from, to)| from <= t && t <= to + self.mirror_ms)
    }
}

/// One line of an excerpt.
pub fn describe(e: &Event) -> String {
    let done = match e.complete_ms {
        Some(t) => format!("{t:>7}"),
        None => "  never".to_string(),
    };
    let what = match &e.op {
        Op::Mutate { seq, what, effects } => format!("#{seq} {what} {effects:?}"),
        Op::Read { name } => format!("read {name}"),
        Op::List => "list".to_string(),
        Op::RegGet { owner, name } => format!("read c{owner}'s {name}"),
    };
    let mut s = format!(
        "{:>7}..{done} ms  c{} at {:?}: {what} -> {:?}",
        e.invoke_ms, e.client, e.region, e.outcome
    );
    if let Some(err) = &e.error {
        s.push_str(&format!(" ({err})"));
    }
    if let Some(o) = &e.observed {
        let o = format!("{o:?}");
        s.push_str(&format!(" saw {}", o.chars().take(160).collect::<String>()));
    }
    s
}

/// How long after a fault's heal a read may still fail with EIO for it (a daemon starting
/// again, a mount remounted, a store catching up), in ms.
pub const SETTLE_MS: u64 = 15_000;

/// Checker 8: no read that began outside every fault (from its start to [`SETTLE_MS`] after
/// its heal) failed with EIO. A block some history still references, deleted (a fenced
/// primary's GC, a mirror's sweep of a store it shares) or lost (a copy marked present before
/// it was durable, a record shipped before its blocks), reads as EIO, never as wrong bytes
/// (checker 5 sees those).
pub fn no_block_lost(events: &[Event], faults: &[(u64, u64)], tally: &mut Tally) {
    let quiet = |t: u64| {
        !faults
            .iter()
            .any(|&(from, to)| from <= t && t <= to + SETTLE_MS)
    };
    for e in events {
        let read = matches!(e.op, Op::Read { .. } | Op::RegGet { .. });
        if !read || !quiet(e.invoke_ms) {
            continue;
        }
        tally.checked[8] += 1;
        if errno_in(e) == Some(libc::EIO) {
            tally.violated(
                8,
                format!(
                    "a read at {:?} failed with EIO {} ms into the run, outside every fault",
                    e.region, e.invoke_ms
                ),
                vec![describe(e)],
            );
        }
    }
}

/// Checker 9: the fcntl locks of each region excluded each other. `holds` are each region's
/// holders' holds ([`crate::locks`]); a hold whose read back found another's token, or two
/// holds by different holders of one region that overlap in time (each measured inside the
/// real hold), are violations. Holds whose I/O failed prove nothing.
pub fn locks_exclude(holds: &[(Region, crate::locks::Hold)], tally: &mut Tally) {
    let line = |r: &Region, h: &crate::locks::Hold| {
        format!(
            "holder {} at {r:?}: {}..{} ms{}",
            h.client,
            h.acquired_ms,
            h.released_ms,
            if h.note.is_empty() {
                String::new()
            } else {
                format!(" ({})", h.note)
            }
        )
    };
    for (r, h) in holds.iter().filter(|(_, h)| h.changed) {
        tally.violated(
            9,
            format!(
                "the lock file of {r:?} was written by another while holder {} held it",
                h.client
            ),
            vec![line(r, h)],
        );
    }
    for region in [Region::A, Region::B] {
        let mut ok: Vec<&crate::locks::Hold> = holds
            .iter()
            .filter(|(r, h)| *r == region && h.ok && !h.changed)
            .map(|(_, h)| h)
            .collect();
        tally.checked[9] += ok.len() as u64;
        ok.sort_by_key(|h| h.acquired_ms);
        // each hold against the later ones that begin before it ends: strictly before (the
        // times are whole ms, each measured inside its hold, so one hold may end and the next
        // begin within the same ms: seed 502 of `all`)
        for (i, a) in ok.iter().enumerate() {
            for b in ok[i + 1..]
                .iter()
                .take_while(|b| b.acquired_ms < a.released_ms)
            {
                if b.client != a.client {
                    tally.violated(
                        9,
                        format!(
                            "holders {} and {} held the lock of {region:?} at once",
                            a.client, b.client
                        ),
                        vec![line(&region, a), line(&region, b)],
                    );
                }
            }
        }
    }
}

/// Checker 11, for client `client`'s directory at `region` after the heal: its quota as
/// `strait.quota` reads it (`max_bytes=.. max_files=.. used_bytes=.. used_files=..`, or why it
/// could not be read), and how many names a listing of it found. The quota must be there,
/// its usage within it and equal to what the listing counts. Returns the inodes used.
pub fn quota_holds(
    (region, client): (Region, u32),
    quota: Result<String, String>,
    names: usize,
    tally: &mut Tally,
) -> Option<u64> {
    tally.checked[11] += 1;
    let text = match quota {
        Ok(t) => t,
        Err(e) => {
            tally.violated(
                11,
                format!("c{client}'s quota at {region:?} could not be read: {e}"),
                vec![],
            );
            return None;
        }
    };
    let field = |f: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(f)?.strip_prefix('='))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let (Some(max), Some(used)) = (field("max_files"), field("used_files")) else {
        tally.violated(
            11,
            format!("c{client}'s quota at {region:?} reads {text:?}"),
            vec![],
        );
        return None;
    };
    if max != QUOTA_FILES || used > max || used != names as u64 {
        tally.violated(
            11,
            format!(
                "c{client}'s quota at {region:?}: {used} inodes used of {max} (set: \
                 {QUOTA_FILES}), {names} names listed"
            ),
            vec![],
        );
    }
    Some(used)
}

/// Checker 12: the trash (listed at `region` after the heal and the GC) holds an entry for
/// every unlink and rmdir of each client that succeeded (each put one there; the retention,
/// a day, is far off), and every file in it reads as bytes its client wrote. `entries`: per
/// client, (the name the entry had, what reading it gave).
pub fn trash_kept(
    events: &[Event],
    region: Region,
    entries: &BTreeMap<u32, Vec<(String, Observed)>>,
    tally: &mut Tally,
) {
    let mut acked: BTreeMap<u32, usize> = BTreeMap::new();
    for e in events {
        if let (Op::Mutate { what, .. }, Outcome::Ok) = (&e.op, e.outcome) {
            if what == "unlink" || what == "rmdir" {
                *acked.entry(e.client).or_default() += 1;
            }
        }
    }
    for (client, n) in &acked {
        tally.checked[12] += 1;
        let kept = entries.get(client).map(Vec::as_slice).unwrap_or_default();
        let removed_names = kept
            .iter()
            .filter(|(name, _)| name == "d" || crate::workload::FILES.contains(&name.as_str()))
            .count();
        if removed_names < *n {
            tally.violated(
                12,
                format!(
                    "c{client}: {n} unlinks and rmdirs succeeded, the trash at {region:?} holds \
                     {removed_names} entries of its files and directory"
                ),
                vec![],
            );
        }
    }
    for (client, kept) in entries {
        for (name, seen) in kept {
            tally.checked[12] += 1;
            if let Observed::Garbage(g) = seen {
                tally.violated(
                    12,
                    format!("c{client}'s {name} in the trash at {region:?} reads {g}"),
                    vec![],
                );
            }
        }
    }
}

/// The errno an event's error names ("... (os error N)"), if any.
fn errno_in(e: &Event) -> Option<i32> {
    let text = e.error.as_deref()?;
    let (_, tail) = text.rsplit_once("(os error ")?;
    tail.strip_suffix(')')?.parse().ok()
}

/// Replay each client's history through its model, checking its own reads (checkers 3, 5);
/// returns the models for the final reads.
pub fn replay(events: &[Event], tally: &mut Tally) -> BTreeMap<u32, Model> {
    let mut models: BTreeMap<u32, Model> = BTreeMap::new();
    let mut recent: BTreeMap<u32, VecDeque<String>> = BTreeMap::new();
    let mut order: Vec<&Event> = events.iter().collect();
    order.sort_by_key(|e| (e.client, e.invoke_ms));
    for e in order {
        let m = models.entry(e.client).or_default();
        let r = recent.entry(e.client).or_default();
        r.push_back(describe(e));
        if r.len() > 12 {
            r.pop_front();
        }
        let excerpt = || r.iter().cloned().collect::<Vec<_>>();
        match (&e.op, &e.observed) {
            (Op::Mutate { effects, .. }, _) => {
                tally.checked[3] += 1;
                if let Err(x) = m.operation_errno(effects, e.outcome, errno_in(e)) {
                    tally.violated(
                        3,
                        format!(
                            "c{} at {:?}: {} on {} contradicts every state it could be in ({:?})",
                            e.client, e.region, x.observed, x.name, x.expected
                        ),
                        excerpt(),
                    );
                }
            }
            (_, Some(Observed::Garbage(g))) => {
                tally.checked[5] += 1;
                tally.violated(
                    5,
                    format!(
                        "c{} at {:?} read bytes no write wrote: {g}",
                        e.client, e.region
                    ),
                    excerpt(),
                );
            }
            (Op::Read { name }, Some(Observed::Node(n))) if e.outcome == Outcome::Ok => {
                tally.checked[5] += 1;
                if let Some(Err(x)) = m.check_read(name, n) {
                    tally.checked[3] += 1;
                    tally.violated(
                        3,
                        format!(
                            "c{} at {:?} read {name} as {} but its own history allows only {:?}",
                            e.client, e.region, x.observed, x.expected
                        ),
                        excerpt(),
                    );
                } else {
                    tally.checked[3] += 1;
                }
            }
            (Op::List, Some(Observed::Names(names))) => {
                for n in names {
                    if !NAMES.contains(&n.as_str()) {
                        tally.violated(
                            3,
                            format!(
                                "c{} at {:?} listed a name it never made: {n}",
                                e.client, e.region
                            ),
                            excerpt(),
                        );
                    }
                }
                for n in NAMES {
                    tally.checked[3] += 1;
                    if let Some(Err(x)) = m.check_listed(n, names.iter().any(|x| x == n)) {
                        tally.violated(
                            3,
                            format!(
                                "c{} at {:?}: {n} {} but its history allows only {:?}",
                                e.client, e.region, x.observed, x.expected
                            ),
                            excerpt(),
                        );
                    }
                }
            }
            (Op::RegGet { .. }, Some(Observed::Reg(_))) => tally.checked[5] += 1,
            _ => {}
        }
    }
    models
}

/// Checkers 2 and 4 over the registers: a mount's reads of a register never go back, and a
/// read started more than the bound after a write was acknowledged sees it.
/// A register's acknowledged writes, by (owner, register): (ack time, seq, writer's region).
type Puts<'a> = BTreeMap<(u32, &'a str), Vec<(u64, u64, Region)>>;

pub fn registers(events: &[Event], bounds: Bounds, tally: &mut Tally) {
    // in the owner's order
    let mut puts: Puts = BTreeMap::new();
    let mut gets: Vec<&Event> = vec![];
    for e in events {
        match (&e.op, e.outcome, e.complete_ms) {
            (Op::Mutate { what, seq, .. }, Outcome::Ok, Some(t)) if what == "register" => puts
                .entry((e.client, "reg"))
                .or_default()
                .push((t, *seq, e.region)),
            (Op::Mutate { what, seq, .. }, Outcome::Ok, Some(t)) if what == "cell" => puts
                .entry((e.client, "cell"))
                .or_default()
                .push((t, *seq, e.region)),
            (Op::RegGet { .. }, Outcome::Ok, Some(_)) => gets.push(e),
            _ => {}
        }
    }
    for p in puts.values_mut() {
        p.sort();
    }
    let value = |e: &Event| match &e.observed {
        Some(Observed::Reg(v)) => Some(v.unwrap_or(0)),
        _ => None,
    };
    let owner = |e: &'_ Event| -> (u32, String) {
        match &e.op {
            Op::RegGet { owner, name } => (*owner, name.clone()),
            _ => (u32::MAX, String::new()),
        }
    };
    // 4: freshness
    for g in &gets {
        let Some(v) = value(g) else { continue };
        let (o, reg) = owner(g);
        let Some(ps) = puts.get(&(o, reg.as_str())) else {
            continue;
        };
        let mut required = None;
        for &(ack, seq, wr) in ps {
            let bound = match (g.region, wr) {
                (Region::B, Region::A) if !bounds.mirror_bounded => continue,
                (Region::B, Region::A) => bounds.mirror_ms,
                (r, w) if r == w => 0,
                (Region::A, Region::B) if bounds.a_was_mirror(g.invoke_ms) => {
                    if !bounds.mirror_bounded {
                        continue;
                    }
                    bounds.mirror_ms
                }
                _ => bounds.other_mount_ms,
            };
            if ack + bound < g.invoke_ms {
                required = Some((seq, ack, bound));
            }
        }
        tally.checked[4] += 1;
        if let Some((seq, ack, bound)) = required {
            if v < seq {
                tally.violated(
                    4,
                    format!(
                        "c{} at {:?} read c{o}'s {reg} as #{v} at {} ms, but #{seq} was acknowledged at {ack} ms (bound {bound} ms)",
                        g.client, g.region, g.invoke_ms
                    ),
                    vec![describe(g)],
                );
            }
        }
    }
    // 2: per mount and register, a read never sees less than one that ended before it began.
    // Only values of acknowledged writes count as a floor, and only from their
    // acknowledgment on: a write whose close or fsync failed may have been dropped after a
    // reader at its mount saw it (as a local file system's page cache shows a write that its
    // writeback then fails to store); and a write still in flight may have been committed at
    // a primary that a failover then lost before it replicated it (a reader there saw it),
    // to be made again at the new primary when its mount sends it again, and acknowledged
    // only then (seed 501 of `all`: a cell read at A as #571 at 65.1 s, A lost, #554 read
    // until the resent write was acknowledged at 74.3 s).
    let acknowledged_at = |o: u32, reg: &str, v: u64| -> Option<u64> {
        if v == 0 {
            return Some(0);
        }
        puts.get(&(o, reg))?
            .iter()
            .find(|&&(_, seq, _)| seq == v)
            .map(|&(ack, _, _)| ack)
    };
    let mut by: BTreeMap<(Region, (u32, String)), Vec<&Event>> = BTreeMap::new();
    for g in &gets {
        by.entry((g.region, owner(g))).or_default().push(g);
    }
    for ((region, (o, reg)), list) in by {
        // (when the read's value became a floor: once the read ended and its write was
        // acknowledged, its value, the read)
        let mut ended: Vec<(u64, u64, &Event)> = list
            .iter()
            .filter_map(|g| {
                let v = value(g)?;
                let ack = acknowledged_at(o, &reg, v)?;
                Some((g.complete_ms?.max(ack), v, *g))
            })
            .collect();
        ended.sort_by_key(|x| x.0);
        let mut started: Vec<&Event> = list.clone();
        started.sort_by_key(|g| g.invoke_ms);
        let (mut i, mut best): (usize, Option<(u64, &Event)>) = (0, None);
        for g in started {
            while i < ended.len() && ended[i].0 < g.invoke_ms {
                if best.is_none_or(|(b, _)| ended[i].1 > b) {
                    best = Some((ended[i].1, ended[i].2));
                }
                i += 1;
            }
            let Some(v) = value(g) else { continue };
            tally.checked[2] += 1;
            if let Some((b, earlier)) = best {
                if v < b {
                    tally.violated(
                        2,
                        format!("the mount at {region:?} read c{o}'s {reg} as #{v} after it had read #{b}"),
                        vec![describe(earlier), describe(g)],
                    );
                }
            }
        }
    }
}

/// Which name of which client a final read read, where, and for which checker.
pub struct FinalRead<'a> {
    pub client: u32,
    pub name: &'a str,
    pub region: Region,
    pub checker: usize,
}

/// A final read of a client's name, after the heal, against its model.
pub fn final_read(
    models: &mut BTreeMap<u32, Model>,
    what: FinalRead<'_>,
    observed: &Option<Observed>,
    tally: &mut Tally,
    history: &[Event],
) {
    let FinalRead {
        client,
        name,
        region,
        checker,
    } = what;
    let m = models.entry(client).or_default();
    let excerpt = || {
        let mut v: Vec<String> = history
            .iter()
            .filter(|e| e.client == client && touches(e, name))
            .map(describe)
            .collect();
        let n = v.len();
        v.drain(..n.saturating_sub(12));
        v
    };
    match observed {
        Some(Observed::Node(n)) => {
            tally.checked[checker] += 1;
            if let Some(Err(x)) = m.check_read(name, n) {
                tally.violated(
                    checker,
                    format!(
                        "after the heal, c{client}'s {name} reads at {region:?} as {} but its history allows only {:?}",
                        x.observed, x.expected
                    ),
                    excerpt(),
                );
            }
        }
        Some(Observed::Garbage(g)) => {
            tally.checked[5] += 1;
            tally.violated(
                5,
                format!("after the heal, c{client}'s {name} at {region:?}: {g}"),
                excerpt(),
            );
        }
        _ => tally.violated(
            checker,
            format!("after the heal, c{client}'s {name} could not be read at {region:?}"),
            vec![],
        ),
    }
}

fn touches(e: &Event, name: &str) -> bool {
    match &e.op {
        Op::Mutate { effects, .. } => format!("{effects:?}").contains(&format!("{name:?}")),
        Op::Read { name: n } => n == name,
        _ => false,
    }
}

/// A node as the final read shows it (for messages).
pub fn show(n: &Node) -> String {
    format!("{n:?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Effect;

    fn ev(client: u32, region: Region, op: Op, t: (u64, u64), observed: Option<Observed>) -> Event {
        Event {
            client,
            region,
            op,
            invoke_ms: t.0,
            complete_ms: Some(t.1),
            outcome: Outcome::Ok,
            error: None,
            observed,
        }
    }

    fn put(client: u32, region: Region, seq: u64, t: (u64, u64)) -> Event {
        ev(
            client,
            region,
            Op::Mutate {
                seq,
                what: "register".into(),
                effects: vec![],
            },
            t,
            None,
        )
    }

    fn get(client: u32, region: Region, owner: u32, v: u64, t: (u64, u64)) -> Event {
        ev(
            client,
            region,
            Op::RegGet {
                owner,
                name: "reg".into(),
            },
            t,
            Some(Observed::Reg(Some(v))),
        )
    }

    const B: Bounds = Bounds {
        mirror_bounded: true,
        mirror_ms: 3_000,
        other_mount_ms: 1_000,
        swapped: Vec::new(),
    };

    #[test]
    fn while_the_primary_was_in_region_b_a_read_at_a_is_bounded_as_a_mirrors() {
        let h = vec![
            put(0, Region::B, 5, (10_000, 10_100)),
            // 2 s after B's write: past the other mount's bound, within a mirror's
            get(1, Region::A, 0, 0, (12_100, 12_110)),
            // past the mirror's bound too
            get(1, Region::A, 0, 0, (13_500, 13_510)),
        ];
        let mut t = Tally::default();
        registers(&h, B, &mut t);
        assert_eq!(t.count(4), 2, "A is the primary: both reads are late");
        let mut t = Tally::default();
        let swapped = Bounds {
            swapped: vec![(9_000, 11_000)],
            ..B
        };
        registers(&h, swapped.clone(), &mut t);
        assert_eq!(t.count(4), 1, "A was a mirror: only the second is late");
        // policy serve: a mirror's reads are not bounded, A's then neither
        let mut t = Tally::default();
        registers(
            &h,
            Bounds {
                mirror_bounded: false,
                ..swapped
            },
            &mut t,
        );
        assert_eq!(t.count(4), 0);
    }

    #[test]
    fn a_stale_read_at_the_mirror_past_the_bound_is_a_violation() {
        let h = vec![
            put(0, Region::A, 5, (0, 100)),
            // within the bound: may be stale
            get(1, Region::B, 0, 0, (2_000, 2_010)),
            // past it: must see #5
            get(1, Region::B, 0, 0, (3_500, 3_510)),
        ];
        let mut t = Tally::default();
        registers(&h, B, &mut t);
        assert_eq!(t.count(4), 1, "{:?}", t.violations);
        // with policy serve, nothing is bounded at the mirror
        let mut t = Tally::default();
        registers(
            &h,
            Bounds {
                mirror_bounded: false,
                ..B
            },
            &mut t,
        );
        assert_eq!(t.count(4), 0);
    }

    #[test]
    fn a_mount_that_goes_back_is_a_violation() {
        let h = vec![
            put(0, Region::A, 6, (0, 1)),
            put(0, Region::A, 7, (2, 3)),
            get(1, Region::B, 0, 7, (0, 10)),
            // overlapping reads may see either order
            get(2, Region::B, 0, 6, (5, 20)),
            // started after the first ended: went back
            get(2, Region::B, 0, 6, (30, 40)),
            // the other mount has its own history
            get(3, Region::A, 0, 6, (50, 60)),
        ];
        let mut t = Tally::default();
        registers(&h, B, &mut t);
        assert_eq!(t.count(2), 1, "{:?}", t.violations);
    }

    #[test]
    fn a_value_of_a_write_that_failed_may_vanish() {
        let mut failed = put(0, Region::B, 8, (0, 50));
        failed.outcome = Outcome::Unknown;
        let h = vec![
            put(0, Region::B, 6, (0, 1)),
            failed,
            // the mount showed the buffered write, whose commit then failed
            get(1, Region::B, 0, 8, (10, 20)),
            get(1, Region::B, 0, 6, (60, 70)),
        ];
        let mut t = Tally::default();
        registers(&h, B, &mut t);
        assert_eq!(t.count(2), 0, "{:?}", t.violations);
    }

    fn hold(client: u32, acquired_ms: u64, released_ms: u64) -> (Region, crate::locks::Hold) {
        let h = crate::locks::Hold {
            client,
            acquired_ms,
            released_ms,
            ok: true,
            changed: false,
            note: String::new(),
        };
        (Region::B, h)
    }

    #[test]
    fn two_holds_of_one_region_that_overlap_are_a_violation_and_touching_ones_are_not() {
        let mut t = Tally::default();
        // one ends and the next begins in the same ms: each time is measured inside its hold
        locks_exclude(&[hold(2, 100, 200), hold(3, 200, 300)], &mut t);
        assert_eq!(t.count(9), 0, "{:?}", t.violations);
        locks_exclude(&[hold(2, 100, 200), hold(3, 199, 300)], &mut t);
        assert_eq!(t.count(9), 1, "{:?}", t.violations);
        // the same holder, or another region, never conflicts
        let mut t = Tally::default();
        let (_, other) = hold(3, 150, 160);
        locks_exclude(
            &[hold(2, 100, 200), hold(2, 150, 300), (Region::A, other)],
            &mut t,
        );
        assert_eq!(t.count(9), 0, "{:?}", t.violations);
    }

    #[test]
    fn a_value_seen_before_its_write_was_acknowledged_may_vanish_until_then() {
        // #8 committed at a primary a failover lost (a reader there saw it), made again at
        // the new primary and acknowledged at 100: reads before then may show #6
        let h = vec![
            put(0, Region::B, 6, (0, 1)),
            put(0, Region::B, 8, (5, 100)),
            get(1, Region::A, 0, 8, (10, 20)),
            get(1, Region::A, 0, 6, (60, 70)),
        ];
        let mut t = Tally::default();
        registers(&h, B, &mut t);
        assert_eq!(t.count(2), 0, "{:?}", t.violations);
        // once it was acknowledged, never again
        let h = vec![
            put(0, Region::B, 6, (0, 1)),
            put(0, Region::B, 8, (5, 100)),
            get(1, Region::A, 0, 8, (10, 20)),
            get(1, Region::A, 0, 6, (110, 120)),
        ];
        let mut t = Tally::default();
        registers(&h, B, &mut t);
        assert_eq!(t.count(2), 1, "{:?}", t.violations);
    }

    #[test]
    fn a_lost_write_shows_in_the_replay_and_garbage_in_checker_5() {
        let w = Op::Mutate {
            seq: 1,
            what: "write".into(),
            effects: vec![
                Effect::Truncate {
                    name: "f0".into(),
                    records: 0,
                    create: true,
                },
                Effect::Write {
                    name: "f0".into(),
                    at: Some(0),
                    n: 2,
                    seq: 1,
                },
            ],
        };
        let h = vec![
            ev(0, Region::B, w, (0, 10), None),
            ev(
                0,
                Region::B,
                Op::Read { name: "f0".into() },
                (20, 30),
                Some(Observed::Node(Node::Absent)),
            ),
            ev(
                0,
                Region::B,
                Op::Read { name: "f1".into() },
                (40, 50),
                Some(Observed::Garbage("CRC".into())),
            ),
        ];
        let mut t = Tally::default();
        let mut models = replay(&h, &mut t);
        assert_eq!(t.count(3), 1, "{:?}", t.violations);
        assert_eq!(t.count(5), 1);
        let mut t = Tally::default();
        final_read(
            &mut models,
            FinalRead {
                client: 0,
                name: "f0",
                region: Region::A,
                checker: 1,
            },
            &Some(Observed::Node(Node::File(vec![(1, 2)]))),
            &mut t,
            &h,
        );
        assert_eq!(t.count(1), 0, "{:?}", t.violations);
    }
}
