//! The rules of the change log, apart from storage and Raft: what a command does to the log's
//! state, decided from that state and the command alone, so every node decides the same.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use strait_ids::{Epoch, Version};
use strait_proto::replicator::PRIMARY_CURSOR;

pub use strait_proto::limits::{APPEND_BYTES_MAX, APPEND_RECORDS_MAX};
/// Longest mirror name.
pub const MIRROR_NAME_MAX: usize = 256;
/// Most cursors the log keeps (every mirror's, and the primary's durable mark): an ack under a
/// new name past this is refused until a mirror is forgotten.
pub const CURSORS_MAX: usize = 1024;
/// Default retention caps: the log keeps at most this many bytes of records, and records at
/// most this old (by the primary's clock), even when a mirror still needs them.
pub const RETENTION_BYTES_DEFAULT: u64 = 64 << 30;
pub const RETENTION_AGE_MS_DEFAULT: u64 = 7 * 24 * 3600 * 1000;
/// The log's size and age are tracked at about this many points across the retained window.
const MARKS_PER_WINDOW: u64 = 64;

/// Lists of byte strings, encoded as byte strings (serde's default visits each byte, which
/// made encoding and decoding records the largest cost of a commit).
pub mod byte_bufs {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[Vec<u8>], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|b| serde_bytes::Bytes::new(b)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<u8>>, D::Error> {
        let v: Vec<serde_bytes::ByteBuf> = Deserialize::deserialize(d)?;
        Ok(v.into_iter().map(serde_bytes::ByteBuf::into_vec).collect())
    }
}

/// Versioned byte strings, encoded as byte strings.
pub mod versioned_bufs {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[(u64, Vec<u8>)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|(n, b)| (n, serde_bytes::Bytes::new(b))))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(u64, Vec<u8>)>, D::Error> {
        let v: Vec<(u64, serde_bytes::ByteBuf)> = Deserialize::deserialize(d)?;
        Ok(v.into_iter().map(|(n, b)| (n, b.into_vec())).collect())
    }
}

/// A change to the replicated state, proposed through Raft.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Records `first_version ..` from the primary of `epoch`.
    Append {
        epoch: Epoch,
        first_version: Version,
        #[serde(with = "byte_bufs")]
        records: Vec<Vec<u8>>,
    },
    /// Fence every writer of an older epoch (a promotion).
    BumpEpoch { epoch: Epoch },
    /// The primary's clock and latest version, so mirrors tell "caught up" from "cut off".
    Heartbeat {
        epoch: Epoch,
        primary_clock_ms: u64,
        latest_version: Version,
    },
    /// A mirror has applied everything up to `applied_version`.
    Ack {
        mirror: String,
        applied_version: Version,
    },
    /// Change the retention caps.
    SetRetention(Retention),
    /// Drop a mirror's cursor (a mirror taken out of service): it no longer holds back the
    /// log's purge or the primary's GC. Appended last: the variants before keep their
    /// numbers in logs and snapshots written before it existed.
    ForgetMirror { mirror: String },
    /// Fence every writer of an older epoch, naming the primary of the new one (a promoted
    /// mirror), so that the other mirrors forward their writes there. Appended last, as
    /// `ForgetMirror` was.
    Promote { epoch: Epoch, primary: PrimaryAt },
    /// [`Command::Ack`] from the caller `owner` (its principal, `strait_auth::Caller`): a
    /// cursor belongs to the first owner that acks it, and only that owner moves it after
    /// (until it is forgotten). Appended last, as `Promote` was.
    AckAs {
        mirror: String,
        applied_version: Version,
        owner: String,
    },
}

/// Most cursors one owner may hold: one region's credentials cannot fill the log's table of
/// cursors (then no other mirror could register).
pub const CURSORS_PER_OWNER_MAX: usize = 64;

/// Where the primary of an epoch serves, as the other regions reach it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrimaryAt {
    /// Its name (a promoted mirror's id).
    pub id: String,
    /// Its metadata service, `host:port`.
    pub addr: String,
    /// Its object store; empty: unchanged.
    pub data_url: String,
}

/// The longest name, address or URL a [`PrimaryAt`] may hold.
pub const PRIMARY_AT_FIELD_MAX: usize = 1024;

impl PrimaryAt {
    /// Why these fields cannot name a primary, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        for (what, v) in [
            ("id", &self.id),
            ("address", &self.addr),
            ("data URL", &self.data_url),
        ] {
            if v.len() > PRIMARY_AT_FIELD_MAX {
                return Err(format!(
                    "the primary's {what} is {} bytes, more than {PRIMARY_AT_FIELD_MAX}",
                    v.len()
                ));
            }
            if v.chars().any(|c| c.is_control() || c.is_whitespace()) {
                return Err(format!(
                    "the primary's {what} {v:?} holds whitespace or a control character"
                ));
            }
        }
        if self.addr.is_empty() {
            return Err("the primary's address is empty".into());
        }
        match self.addr.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
            _ => Err(format!(
                "the primary's address {:?} is not host:port",
                self.addr
            )),
        }
    }
}

/// How much of the log is kept for mirrors that fall behind. A mirror whose position falls
/// out of it must bootstrap again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    pub max_bytes: u64,
    pub max_age_ms: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            max_bytes: RETENTION_BYTES_DEFAULT,
            max_age_ms: RETENTION_AGE_MS_DEFAULT,
        }
    }
}

/// A point in the log: the bytes appended before `version`, and the primary's clock then.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    pub bytes_before: u64,
    pub at_ms: u64,
}

/// Why an append (or a heartbeat, or an epoch change) was refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum AppendError {
    #[error("gap: the log ends at version {last}, the batch starts at {first}")]
    Gap { last: Version, first: Version },
    #[error("overlap: version {version} is already in the log with different contents")]
    Overlap { version: Version },
    #[error("stale epoch {got}: the current epoch is {current}")]
    StaleEpoch { current: Epoch, got: Epoch },
    #[error("epoch {got} was never started (the current epoch is {current}): bump it first")]
    FutureEpoch { current: Epoch, got: Epoch },
    #[error("malformed: {0}")]
    Malformed(String),
    /// Appended last: the variants before keep their numbers in replies.
    #[error(
        "the cursor {cursor:?} belongs to other credentials: a mirror moves only the cursors it \
         registered (`strait replicator forget-mirror` releases one)"
    )]
    NotOwner { cursor: String },
}

impl AppendError {
    /// The short name clients see in the `x-strait-append` metadata entry.
    pub fn kind(&self) -> &'static str {
        match self {
            AppendError::Gap { .. } => "gap",
            AppendError::Overlap { .. } => "overlap",
            AppendError::StaleEpoch { .. } => "stale-epoch",
            AppendError::FutureEpoch { .. } => "future-epoch",
            AppendError::Malformed(_) => "malformed",
            AppendError::NotOwner { .. } => "not-owner",
        }
    }
}

/// What a command did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Membership changes and blank entries.
    #[default]
    None,
    Appended {
        last_version: Version,
    },
    /// Every record was already in the log, identical: nothing changed.
    Duplicate {
        last_version: Version,
    },
    Epoch {
        epoch: Epoch,
        last_version: Version,
    },
    Done,
    Refused(AppendError),
}

/// A mirror's position.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    pub applied_version: Version,
    /// The log was purged past this mirror's position: it must bootstrap again.
    pub needs_bootstrap: bool,
}

/// The log's state besides its records.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogState {
    pub epoch: Epoch,
    /// The last version in the log (0: none yet).
    pub last_version: Version,
    /// The first version still held; everything before it was purged. 1 until a purge.
    pub earliest_version: Version,
    /// The primary's last heartbeat: (clock in ms, latest version).
    pub heartbeat: Option<(u64, Version)>,
    pub cursors: BTreeMap<String, Cursor>,
    pub retention: Retention,
    /// Bytes of records ever appended.
    pub appended_bytes: u64,
    /// Points of the log by version, for the retention caps: the first one is at or before
    /// `earliest_version`.
    pub marks: BTreeMap<Version, Mark>,
    /// The last version purged and the SHA-256 of its record: a primary whose metadata went
    /// back compares its own record of that version with it when the log no longer holds the
    /// versions both have (strait-primary's `history`). None until a purge.
    #[serde(default)]
    pub purged_last: Option<(Version, Vec<u8>)>,
    /// The primary the current epoch named (a promotion), with that epoch. None until a
    /// promotion names one, and again after an epoch raised without a name.
    #[serde(default)]
    pub primary: Option<(Epoch, PrimaryAt)>,
    /// Who registered each cursor (the principal of the mirror's credentials): only it moves
    /// the cursor. Cursors registered before owners were kept, and those the primary acks,
    /// have none here until a mirror acks them.
    #[serde(default)]
    pub cursor_owners: BTreeMap<String, String>,
}

impl LogState {
    /// Bytes of records the log holds (counted from the mark at or before its start, so at
    /// most one mark's interval too many).
    pub fn held_bytes(&self) -> u64 {
        self.marks
            .values()
            .next()
            .map(|m| self.appended_bytes - m.bytes_before)
            .unwrap_or(0)
    }

    fn clock_ms(&self) -> u64 {
        self.heartbeat.map(|(c, _)| c).unwrap_or(0)
    }

    /// About how long ago (ms, by the primary's clock) the log reached the version after
    /// `applied`: the age of the oldest record a mirror at `applied` still needs (from the
    /// newest mark at or before it, so it errs old by at most one mark's interval). None when
    /// nothing after it is in the log, or no clock is known yet.
    pub fn position_age_ms(&self, applied: Version) -> Option<u64> {
        if applied >= self.last_version || self.heartbeat.is_none() {
            return None;
        }
        let (_, m) = self.marks.range(..=applied.next()).next_back()?;
        Some(self.clock_ms().saturating_sub(m.at_ms))
    }

    /// Remember where an append of `bytes` starting at `version` lies.
    fn mark(&mut self, version: Version, bytes: u64) {
        let (at_ms, before) = (self.clock_ms(), self.appended_bytes);
        let due = match self.marks.values().next_back() {
            None => true,
            Some(last) => {
                before - last.bytes_before >= self.retention.max_bytes / MARKS_PER_WINDOW
                    || at_ms.saturating_sub(last.at_ms)
                        >= self.retention.max_age_ms / MARKS_PER_WINDOW
            }
        };
        if due {
            self.marks.insert(
                version,
                Mark {
                    bytes_before: before,
                    at_ms,
                },
            );
        }
        self.appended_bytes += bytes;
    }

    /// Where the log may start now: above the lowest cursor of the mirrors still following,
    /// and within the retention caps. Moves `earliest_version` there and marks the mirrors
    /// left behind; returns the new start when it moved.
    fn enforce(&mut self) -> Option<Version> {
        let mut start = self.earliest_version;
        if let Some(low) = self
            .cursors
            .iter()
            .filter(|(name, c)| !c.needs_bootstrap && name.as_str() != PRIMARY_CURSOR)
            .map(|(_, c)| c.applied_version)
            .min()
        {
            // the primary's durable mark holds the mirrors' purge back (a power loss takes the
            // primary back to it, and it catches up from the records above it); alone, with no
            // mirror, it purges nothing
            let durable = self
                .cursors
                .get(PRIMARY_CURSOR)
                .map_or(low, |c| c.applied_version);
            start = start.max(low.min(durable).next());
        }
        // the first mark from which the log fits both caps (the newest mark always stays)
        let now = self.clock_ms();
        let fits = |m: &Mark| {
            self.appended_bytes - m.bytes_before <= self.retention.max_bytes
                && now.saturating_sub(m.at_ms) <= self.retention.max_age_ms
        };
        let newest = self.marks.keys().next_back().copied();
        if let Some(v) = self
            .marks
            .iter()
            .find(|(_, m)| fits(m))
            .map(|(v, _)| *v)
            .or(newest)
        {
            start = start.max(v);
        }
        // the last record always stays: a primary whose metadata went back compares its own
        // record of that version with it, to tell a history of its own (a diverged copy at
        // or past the log's end) from records it shipped itself (strait-primary's `history`)
        start = start.min(self.last_version.max(Version(1)));
        if start <= self.earliest_version {
            return None;
        }
        self.earliest_version = start;
        // keep the mark at or before the new start (it bounds the bytes held) and those after
        let keep_from = self
            .marks
            .range(..=start)
            .next_back()
            .map(|(v, _)| *v)
            .unwrap_or(start);
        self.marks = self.marks.split_off(&keep_from);
        for c in self.cursors.values_mut() {
            if c.applied_version.next() < start {
                c.needs_bootstrap = true;
            }
        }
        Some(start)
    }

    pub fn new() -> Self {
        LogState {
            earliest_version: Version(1),
            ..Default::default()
        }
    }
}

/// What applying a command writes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Effect {
    pub outcome: Outcome,
    /// Records to store: (version, bytes).
    pub put: Vec<(Version, Vec<u8>)>,
    /// Purge every record below this version.
    pub purge_below: Option<Version>,
}

/// A mirror has applied everything up to `applied_version`: its cursor moves there (never
/// back, nor past the log's end), registered first when new.
fn ack(state: &mut LogState, mirror: String, applied_version: Version) -> Effect {
    if mirror.is_empty() || mirror.len() > MIRROR_NAME_MAX {
        return refused(AppendError::Malformed(format!(
            "a mirror name has 1 to {MIRROR_NAME_MAX} bytes"
        )));
    }
    if !state.cursors.contains_key(&mirror) && state.cursors.len() >= CURSORS_MAX {
        return refused(AppendError::Malformed(format!(
            "the log keeps {CURSORS_MAX} cursors, its most: forget a mirror first"
        )));
    }
    let c = state.cursors.entry(mirror).or_default();
    // a cursor never moves back, nor past the log's end
    c.applied_version = c
        .applied_version
        .max(applied_version.min(state.last_version));
    // the versions after its position were purged: it cannot follow from there (a
    // mirror that bootstrapped again acks its new position and follows again)
    c.needs_bootstrap = c.applied_version.next() < state.earliest_version;
    // keep everything above the lowest cursor of the mirrors still following
    Effect {
        outcome: Outcome::Done,
        purge_below: state.enforce(),
        ..Effect::default()
    }
}

/// Refuse `owner` a cursor another owner registered, and a new cursor to an owner that holds
/// [`CURSORS_PER_OWNER_MAX`] already.
pub fn check_cursor_owner(state: &LogState, mirror: &str, owner: &str) -> Result<(), AppendError> {
    match state.cursor_owners.get(mirror) {
        Some(o) if o != owner => Err(AppendError::NotOwner {
            cursor: mirror.to_string(),
        }),
        Some(_) => Ok(()),
        None if owner.is_empty() || state.cursors.contains_key(mirror) => Ok(()),
        None => {
            let held = state.cursor_owners.values().filter(|o| *o == owner).count();
            if held >= CURSORS_PER_OWNER_MAX {
                return Err(AppendError::Malformed(format!(
                    "these credentials hold {held} cursors, the most one mirror's may: forget \
                     one (strait replicator forget-mirror) before registering another"
                )));
            }
            Ok(())
        }
    }
}

fn check_epoch(state: &LogState, epoch: Epoch) -> Result<(), AppendError> {
    if epoch < state.epoch {
        Err(AppendError::StaleEpoch {
            current: state.epoch,
            got: epoch,
        })
    } else if epoch > state.epoch {
        Err(AppendError::FutureEpoch {
            current: state.epoch,
            got: epoch,
        })
    } else {
        Ok(())
    }
}

/// Apply `cmd` to `state` (changed in place). `existing(v)` reads the record at version `v`
/// when the log still holds it.
pub fn apply(
    state: &mut LogState,
    cmd: Command,
    mut existing: impl FnMut(Version) -> Option<Vec<u8>>,
) -> Effect {
    let effect = apply_command(state, cmd, &mut existing);
    if let Some(start) = effect.purge_below {
        // the last record purged (still held until the effect is stored)
        let last = Version(start.0.saturating_sub(1));
        if last > Version::ZERO {
            if let Some(r) = existing(last) {
                state.purged_last = Some((last, strait_replicator_client::record_digest(&r)));
            }
        }
    }
    effect
}

/// Raise the epoch to `epoch`, naming its primary (or none).
fn bump_epoch(state: &mut LogState, epoch: Epoch, primary: Option<PrimaryAt>) -> Effect {
    if epoch <= state.epoch {
        return refused(AppendError::StaleEpoch {
            current: state.epoch,
            got: epoch,
        });
    }
    state.epoch = epoch;
    state.primary = primary.map(|p| (epoch, p));
    Effect {
        outcome: Outcome::Epoch {
            epoch,
            last_version: state.last_version,
        },
        ..Effect::default()
    }
}

fn apply_command(
    state: &mut LogState,
    cmd: Command,
    existing: impl FnMut(Version) -> Option<Vec<u8>>,
) -> Effect {
    match cmd {
        Command::Append {
            epoch,
            first_version,
            records,
        } => match append(state, epoch, first_version, records, existing) {
            Ok(e) => e,
            Err(e) => Effect {
                outcome: Outcome::Refused(e),
                ..Effect::default()
            },
        },
        Command::BumpEpoch { epoch } => bump_epoch(state, epoch, None),
        Command::Promote { epoch, primary } => bump_epoch(state, epoch, Some(primary)),
        Command::Heartbeat {
            epoch,
            primary_clock_ms,
            latest_version,
        } => {
            if let Err(e) = check_epoch(state, epoch) {
                return refused(e);
            }
            state.heartbeat = Some((primary_clock_ms, latest_version));
            // records appended before the first heartbeat are as old as it
            for m in state.marks.values_mut().filter(|m| m.at_ms == 0) {
                m.at_ms = primary_clock_ms;
            }
            Effect {
                outcome: Outcome::Done,
                purge_below: state.enforce(),
                ..Effect::default()
            }
        }
        Command::AckAs {
            mirror,
            applied_version,
            owner,
        } => {
            if let Err(e) = check_cursor_owner(state, &mirror, &owner) {
                return refused(e);
            }
            let effect = ack(state, mirror.clone(), applied_version);
            if effect.outcome == Outcome::Done && !owner.is_empty() {
                state.cursor_owners.entry(mirror).or_insert(owner);
            }
            effect
        }
        Command::Ack {
            mirror,
            applied_version,
        } => ack(state, mirror, applied_version),
        Command::SetRetention(r) => {
            if r.max_bytes == 0 || r.max_age_ms == 0 {
                return refused(AppendError::Malformed(
                    "retention caps must be positive".into(),
                ));
            }
            state.retention = r;
            Effect {
                outcome: Outcome::Done,
                purge_below: state.enforce(),
                ..Effect::default()
            }
        }
        Command::ForgetMirror { mirror } => {
            state.cursor_owners.remove(&mirror);
            if state.cursors.remove(&mirror).is_none() {
                return refused(AppendError::Malformed(format!(
                    "no mirror named {mirror:?} has a cursor here"
                )));
            }
            Effect {
                outcome: Outcome::Done,
                purge_below: state.enforce(),
                ..Effect::default()
            }
        }
    }
}

fn refused(e: AppendError) -> Effect {
    Effect {
        outcome: Outcome::Refused(e),
        ..Effect::default()
    }
}

/// What can be checked of a batch without the log: not empty, within
/// [`APPEND_RECORDS_MAX`] and [`APPEND_BYTES_MAX`], versions from 1 that do not overflow.
/// Returns the batch's last version. The service checks this before it proposes an append to
/// Raft, and the state machine again when it applies one.
pub fn check_batch(first_version: Version, records: &[Vec<u8>]) -> Result<Version, AppendError> {
    if records.is_empty() {
        return Err(AppendError::Malformed("the batch holds no records".into()));
    }
    if records.len() > APPEND_RECORDS_MAX {
        return Err(AppendError::Malformed(format!(
            "the batch holds {} records; at most {APPEND_RECORDS_MAX} are allowed",
            records.len()
        )));
    }
    let bytes: usize = records.iter().map(Vec::len).sum();
    if bytes > APPEND_BYTES_MAX {
        return Err(AppendError::Malformed(format!(
            "the batch holds {bytes} bytes; at most {APPEND_BYTES_MAX} are allowed"
        )));
    }
    if first_version == Version::ZERO {
        return Err(AppendError::Malformed("versions start at 1".into()));
    }
    first_version
        .0
        .checked_add(records.len() as u64 - 1)
        .map(Version)
        .ok_or_else(|| AppendError::Malformed("the batch's versions overflow".into()))
}

fn append(
    state: &mut LogState,
    epoch: Epoch,
    first_version: Version,
    records: Vec<Vec<u8>>,
    mut existing: impl FnMut(Version) -> Option<Vec<u8>>,
) -> Result<Effect, AppendError> {
    let last_in_batch = check_batch(first_version, &records)?;
    check_epoch(state, epoch)?;
    if first_version > state.last_version.next() {
        return Err(AppendError::Gap {
            last: state.last_version,
            first: first_version,
        });
    }
    // versions already in the log must hold the same bytes (purged ones cannot be checked:
    // they were committed and consumed)
    for (i, r) in records.iter().enumerate() {
        let v = first_version + i as u64;
        if v > state.last_version {
            break;
        }
        if let Some(old) = existing(v) {
            if &old != r {
                return Err(AppendError::Overlap { version: v });
            }
        }
    }
    if last_in_batch <= state.last_version {
        return Ok(Effect {
            outcome: Outcome::Duplicate {
                last_version: state.last_version,
            },
            ..Effect::default()
        });
    }
    let skip = (state.last_version.0 + 1 - first_version.0) as usize;
    let put: Vec<(Version, Vec<u8>)> = records
        .into_iter()
        .enumerate()
        .skip(skip)
        .map(|(i, r)| (first_version + i as u64, r))
        .collect();
    let new_bytes: usize = put.iter().map(|(_, r)| r.len()).sum();
    state.mark(state.last_version.next(), new_bytes as u64);
    state.last_version = last_in_batch;
    Ok(Effect {
        outcome: Outcome::Appended {
            last_version: last_in_batch,
        },
        put,
        purge_below: state.enforce(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(state: &mut LogState, log: &mut BTreeMap<Version, Vec<u8>>, cmd: Command) -> Outcome {
        let snapshot = log.clone();
        let e = apply(state, cmd, |v| snapshot.get(&v).cloned());
        for (v, r) in e.put {
            log.insert(v, r);
        }
        if let Some(p) = e.purge_below {
            log.retain(|&v, _| v >= p);
        }
        e.outcome
    }

    fn app(epoch: u64, first: u64, recs: &[&str]) -> Command {
        Command::Append {
            epoch: Epoch(epoch),
            first_version: Version(first),
            records: recs.iter().map(|r| r.as_bytes().to_vec()).collect(),
        }
    }

    /// Raft entries, responses and state-machine snapshots written while versions and epochs
    /// were bare u64 decode unchanged, and new ones are the same bytes.
    #[test]
    fn commands_and_state_encode_as_with_bare_u64() {
        // an append as postcard wrote it: variant 0, epoch 2, first version 300 (ac 02), one
        // record "ab"
        let before = [0x00, 0x02, 0xac, 0x02, 0x01, 0x02, b'a', b'b'];
        let cmd = app(2, 300, &["ab"]);
        assert_eq!(postcard::to_stdvec(&cmd).unwrap(), before);
        assert_eq!(postcard::from_bytes::<Command>(&before).unwrap(), cmd);

        // the log's state beside the struct it was with u64 fields
        #[derive(Serialize)]
        struct CursorU64 {
            applied_version: u64,
            needs_bootstrap: bool,
        }
        #[derive(Serialize)]
        struct LogStateU64 {
            epoch: u64,
            last_version: u64,
            earliest_version: u64,
            heartbeat: Option<(u64, u64)>,
            cursors: BTreeMap<String, CursorU64>,
            retention: Retention,
            appended_bytes: u64,
            marks: BTreeMap<u64, Mark>,
        }
        let mark = Mark {
            bytes_before: 10,
            at_ms: 20,
        };
        let old = LogStateU64 {
            epoch: 3,
            last_version: 1 << 40,
            earliest_version: 7,
            heartbeat: Some((99, 1 << 40)),
            cursors: [(
                "m".to_string(),
                CursorU64 {
                    applied_version: 6,
                    needs_bootstrap: true,
                },
            )]
            .into(),
            retention: Retention::default(),
            appended_bytes: 12345,
            marks: [(7, mark)].into(),
        };
        let new = LogState {
            epoch: Epoch(3),
            last_version: Version(1 << 40),
            earliest_version: Version(7),
            heartbeat: Some((99, Version(1 << 40))),
            cursors: [(
                "m".to_string(),
                Cursor {
                    applied_version: Version(6),
                    needs_bootstrap: true,
                },
            )]
            .into(),
            retention: Retention::default(),
            appended_bytes: 12345,
            marks: [(Version(7), mark)].into(),
            purged_last: None,
            primary: None,
            cursor_owners: BTreeMap::new(),
        };
        // `purged_last`, `primary` and `cursor_owners` came later, as the last fields: the old
        // bytes and a None or an empty map each (one zero byte) are the new encoding (the
        // store completes old states so when it reads them)
        let mut bytes = postcard::to_stdvec(&old).unwrap();
        bytes.extend([0, 0, 0]);
        assert_eq!(postcard::to_stdvec(&new).unwrap(), bytes);
        assert_eq!(postcard::from_bytes::<LogState>(&bytes).unwrap(), new);

        // a refusal as a response carries its numbers the same way
        let refusal = Outcome::Refused(AppendError::StaleEpoch {
            current: Epoch(4),
            got: Epoch(3),
        });
        // variant 5 (Refused), 2 (StaleEpoch), current 4, got 3
        assert_eq!(postcard::to_stdvec(&refusal).unwrap(), [5, 2, 4, 3]);
    }

    #[test]
    fn appends_take_only_the_next_version_under_the_current_epoch() {
        let mut s = LogState::new();
        let mut log = BTreeMap::new();
        assert_eq!(
            run(&mut s, &mut log, app(0, 1, &["a", "b"])),
            Outcome::Appended {
                last_version: Version(2)
            }
        );
        // exact duplicate: acknowledged, nothing changes
        let before = (s.clone(), log.clone());
        assert_eq!(
            run(&mut s, &mut log, app(0, 1, &["a", "b"])),
            Outcome::Duplicate {
                last_version: Version(2)
            }
        );
        assert_eq!((s.clone(), log.clone()), before);
        // an overlap with the same bytes plus new ones: the new ones are taken
        assert_eq!(
            run(&mut s, &mut log, app(0, 2, &["b", "c"])),
            Outcome::Appended {
                last_version: Version(3)
            }
        );
        assert_eq!(log.get(&Version(3)).map(|r| r.as_slice()), Some(&b"c"[..]));
        // refusals leave everything unchanged
        let before = (s.clone(), log.clone());
        for (cmd, kind) in [
            (app(0, 5, &["e"]), "gap"),
            (app(0, 3, &["X", "d"]), "overlap"),
            (app(1, 4, &["d"]), "future-epoch"),
            (app(0, 0, &["d"]), "malformed"),
            (app(0, 4, &[]), "malformed"),
            (
                Command::Append {
                    epoch: Epoch(0),
                    first_version: Version(u64::MAX),
                    records: vec![vec![1], vec![2]],
                },
                "malformed",
            ),
        ] {
            match run(&mut s, &mut log, cmd.clone()) {
                Outcome::Refused(e) => assert_eq!(e.kind(), kind, "{cmd:?}: {e}"),
                o => panic!("{cmd:?} was taken: {o:?}"),
            }
            assert_eq!((s.clone(), log.clone()), before, "{cmd:?} changed the log");
        }
    }

    #[test]
    fn bumping_the_epoch_fences_older_writers() {
        let mut s = LogState::new();
        let mut log = BTreeMap::new();
        run(&mut s, &mut log, app(0, 1, &["a"]));
        assert_eq!(
            run(&mut s, &mut log, Command::BumpEpoch { epoch: Epoch(3) }),
            Outcome::Epoch {
                epoch: Epoch(3),
                last_version: Version(1)
            }
        );
        match run(&mut s, &mut log, app(0, 2, &["b"])) {
            Outcome::Refused(AppendError::StaleEpoch {
                current: Epoch(3),
                got: Epoch(0),
            }) => {}
            o => panic!("{o:?}"),
        }
        match run(&mut s, &mut log, Command::BumpEpoch { epoch: Epoch(3) }) {
            Outcome::Refused(AppendError::StaleEpoch { .. }) => {}
            o => panic!("{o:?}"),
        }
        assert_eq!(
            run(&mut s, &mut log, app(3, 2, &["b"])),
            Outcome::Appended {
                last_version: Version(2)
            }
        );
        let hb = Command::Heartbeat {
            epoch: Epoch(0),
            primary_clock_ms: 5,
            latest_version: Version(2),
        };
        assert!(matches!(run(&mut s, &mut log, hb), Outcome::Refused(_)));
        assert_eq!(s.heartbeat, None);
    }

    #[test]
    fn a_promotion_names_the_primary_of_its_epoch_until_the_next_bump() {
        let mut s = LogState::new();
        let mut log = BTreeMap::new();
        let b = PrimaryAt {
            id: "region-b".into(),
            addr: "10.0.2.1:7100".into(),
            data_url: "s3://b?endpoint=http://10.0.2.1:3900".into(),
        };
        let promote = |epoch, p: &PrimaryAt| Command::Promote {
            epoch: Epoch(epoch),
            primary: p.clone(),
        };
        assert!(matches!(
            run(&mut s, &mut log, promote(2, &b)),
            Outcome::Epoch { .. }
        ));
        assert_eq!(s.primary, Some((Epoch(2), b.clone())));
        // a stale promotion changes nothing
        let c = PrimaryAt {
            id: "region-c".into(),
            ..b.clone()
        };
        assert!(matches!(
            run(&mut s, &mut log, promote(2, &c)),
            Outcome::Refused(AppendError::StaleEpoch { .. })
        ));
        assert_eq!(s.primary, Some((Epoch(2), b.clone())));
        // an epoch raised without a name names no primary
        run(&mut s, &mut log, Command::BumpEpoch { epoch: Epoch(3) });
        assert_eq!(s.primary, None);
        assert_eq!(s.epoch, Epoch(3));
    }

    #[test]
    fn a_primary_is_named_by_a_host_and_port_without_whitespace() {
        let ok = PrimaryAt {
            id: "b".into(),
            addr: "[::1]:7100".into(),
            data_url: String::new(),
        };
        assert_eq!(ok.check(), Ok(()));
        for addr in [
            "",
            "host",
            ":7100",
            "host:port",
            "host:99999",
            "a b:1",
            "h:1\n",
        ] {
            let p = PrimaryAt {
                addr: addr.into(),
                ..ok.clone()
            };
            assert!(p.check().is_err(), "{addr:?} passed");
        }
        let long = PrimaryAt {
            data_url: "x".repeat(PRIMARY_AT_FIELD_MAX + 1),
            ..ok
        };
        assert!(long.check().unwrap_err().contains("more than"));
    }

    #[test]
    fn a_forgotten_mirror_no_longer_holds_the_log_back() {
        let mut s = LogState::new();
        let mut log = BTreeMap::new();
        run(&mut s, &mut log, app(0, 1, &["a", "b", "c", "d", "e"]));
        let ack = |m: &str, v| Command::Ack {
            mirror: m.into(),
            applied_version: Version(v),
        };
        run(&mut s, &mut log, ack("gone", 1));
        run(&mut s, &mut log, ack("live", 5));
        assert_eq!(s.earliest_version, Version(2));
        let forget = |m: &str| Command::ForgetMirror { mirror: m.into() };
        assert_eq!(run(&mut s, &mut log, forget("gone")), Outcome::Done);
        assert!(!s.cursors.contains_key("gone"));
        // the log may now start above the live mirror's cursor, but keeps its last record
        assert_eq!(s.earliest_version, Version(5));
        // a name with no cursor: refused, nothing changes
        assert!(matches!(
            run(&mut s, &mut log, forget("never")),
            Outcome::Refused(_)
        ));
        assert_eq!(s.cursors.len(), 1);
    }

    #[test]
    fn the_primarys_durable_mark_holds_the_purge_back_but_purges_nothing_alone() {
        let mut s = LogState::new();
        let mut log = BTreeMap::new();
        run(&mut s, &mut log, app(0, 1, &["a", "b", "c", "d", "e"]));
        let ack = |m: &str, v| Command::Ack {
            mirror: m.into(),
            applied_version: Version(v),
        };
        // alone, the primary's mark purges nothing: a mirror added later reads the log
        run(&mut s, &mut log, ack(PRIMARY_CURSOR, 4));
        assert_eq!(s.earliest_version, Version(1));
        // a mirror past the mark purges only up to it: a power loss takes the primary back
        // to 4 at worst, and it catches up from 5
        run(&mut s, &mut log, ack("m1", 5));
        assert_eq!(s.earliest_version, Version(5));
        run(&mut s, &mut log, ack(PRIMARY_CURSOR, 5));
        // every cursor at the end: the last record stays (a primary compares its own with it)
        assert_eq!(s.earliest_version, Version(5));
        assert_eq!(log.keys().copied().collect::<Vec<_>>(), vec![Version(5)]);
        // the last record purged is kept by its digest
        assert_eq!(
            s.purged_last,
            Some((Version(4), strait_replicator_client::record_digest(b"d")))
        );
    }

    #[test]
    fn acks_purge_below_the_lowest_cursor() {
        let mut s = LogState::new();
        let mut log = BTreeMap::new();
        run(&mut s, &mut log, app(0, 1, &["a", "b", "c", "d"]));
        let ack = |m: &str, v| Command::Ack {
            mirror: m.into(),
            applied_version: Version(v),
        };
        run(&mut s, &mut log, ack("m1", 3));
        assert_eq!(s.earliest_version, Version(4));
        assert_eq!(log.keys().copied().collect::<Vec<_>>(), vec![Version(4)]);
        // a second mirror behind the purge point must bootstrap... it acks what it has
        run(&mut s, &mut log, ack("m2", 1));
        assert_eq!(s.earliest_version, Version(4), "a purge is never undone");
        assert!(s.cursors["m2"].needs_bootstrap);
        assert!(!s.cursors["m1"].needs_bootstrap);
        // cursors do not move back, nor past the end
        run(&mut s, &mut log, ack("m1", 1));
        run(&mut s, &mut log, ack("m1", 99));
        assert_eq!(s.cursors["m1"].applied_version, Version(4));
        assert!(matches!(
            run(&mut s, &mut log, ack("", 1)),
            Outcome::Refused(_)
        ));
    }

    #[test]
    fn retention_caps_bound_the_log_and_send_laggards_to_bootstrap() {
        let mut s = LogState::new();
        let mut log = BTreeMap::new();
        let caps = Retention {
            max_bytes: 1000,
            max_age_ms: 10_000,
        };
        assert_eq!(
            run(&mut s, &mut log, Command::SetRetention(caps)),
            Outcome::Done
        );
        // a mirror that never moves holds nothing back past the caps
        run(
            &mut s,
            &mut log,
            Command::Ack {
                mirror: "slow".into(),
                applied_version: Version(0),
            },
        );
        let hb = |ms: u64| Command::Heartbeat {
            epoch: Epoch(0),
            primary_clock_ms: ms,
            latest_version: Version(0),
        };
        let rec = "0123456789"; // 10 bytes; 10 per append
                                // appended before any heartbeat: as old as the first one, not as old as the epoch
        run(&mut s, &mut log, app(0, 1, &["x"]));
        run(&mut s, &mut log, hb(1_000));
        assert_eq!(s.earliest_version, Version(1));
        for i in 0..50u64 {
            run(&mut s, &mut log, hb(1_000 + i * 10));
            let o = run(&mut s, &mut log, app(0, i * 10 + 2, &[rec; 10]));
            assert_eq!(
                o,
                Outcome::Appended {
                    last_version: Version(i * 10 + 11)
                }
            );
            let held: usize = log.values().map(Vec::len).sum();
            assert!(held <= 1000 + 100, "{held} bytes held after append {i}");
            assert_eq!(log.keys().next().copied(), Some(s.earliest_version));
            assert_eq!(
                log.len() as u64,
                s.last_version.0 - s.earliest_version.0 + 1
            );
        }
        assert!(s.earliest_version > Version(1));
        assert!(s.held_bytes() <= 1100, "{}", s.held_bytes());
        assert!(s.cursors["slow"].needs_bootstrap);
        assert!(s.marks.len() <= 12, "{} marks", s.marks.len());
        // the age cap: 20 s later by the primary's clock, only the newest batch stays
        run(&mut s, &mut log, hb(1_000 + 50 * 10 + 20_000));
        assert_eq!(s.earliest_version, Version(492));
        assert_eq!(log.len(), 10);
        // a mirror that bootstrapped again acks its new position and follows
        run(
            &mut s,
            &mut log,
            Command::Ack {
                mirror: "slow".into(),
                applied_version: Version(496),
            },
        );
        assert!(!s.cursors["slow"].needs_bootstrap);
        assert_eq!(s.earliest_version, Version(497));
        // caps must be positive; a refusal changes nothing
        let before = (s.clone(), log.clone());
        assert!(matches!(
            run(
                &mut s,
                &mut log,
                Command::SetRetention(Retention {
                    max_bytes: 0,
                    max_age_ms: 1
                })
            ),
            Outcome::Refused(AppendError::Malformed(_))
        ));
        assert_eq!((s, log), before);
    }

    #[test]
    fn a_cursors_position_age_comes_from_the_marks_by_the_primarys_clock() {
        let mut s = LogState::new();
        s.last_version = Version(100);
        // no clock yet: unknown
        assert_eq!(s.position_age_ms(Version(10)), None);
        s.heartbeat = Some((50_000, Version(100)));
        let mark = |at_ms| Mark {
            bytes_before: 0,
            at_ms,
        };
        s.marks.insert(Version(1), mark(1_000));
        s.marks.insert(Version(40), mark(20_000));
        s.marks.insert(Version(90), mark(45_000));
        // a mirror at 10 needs version 11, written after the mark at 1: 49 s ago at most
        assert_eq!(s.position_age_ms(Version(10)), Some(49_000));
        // at 39 it needs 40, marked at 20 s
        assert_eq!(s.position_age_ms(Version(39)), Some(30_000));
        assert_eq!(s.position_age_ms(Version(95)), Some(5_000));
        // caught up: nothing it needs is in the log
        assert_eq!(s.position_age_ms(Version(100)), None);
    }

    #[test]
    fn the_log_keeps_a_bounded_number_of_cursors() {
        let mut s = LogState::new();
        let mut log = BTreeMap::new();
        run(&mut s, &mut log, app(0, 1, &["a"]));
        let ack = |m: String| Command::Ack {
            mirror: m,
            applied_version: Version(1),
        };
        for i in 0..CURSORS_MAX {
            assert_eq!(run(&mut s, &mut log, ack(format!("m{i}"))), Outcome::Done);
        }
        // one more name is refused; a known one still moves
        assert!(matches!(
            run(&mut s, &mut log, ack("one-too-many".into())),
            Outcome::Refused(AppendError::Malformed(_))
        ));
        assert_eq!(run(&mut s, &mut log, ack("m0".into())), Outcome::Done);
        assert_eq!(s.cursors.len(), CURSORS_MAX);
        // forgetting one makes room
        let forget = Command::ForgetMirror {
            mirror: "m7".into(),
        };
        assert_eq!(run(&mut s, &mut log, forget), Outcome::Done);
        assert_eq!(
            run(&mut s, &mut log, ack("one-too-many".into())),
            Outcome::Done
        );
    }

    /// Issue 43, item 5: any mirror's credentials moved any mirror's cursor, and registered
    /// up to the log's 1,024 (one region could release another's GC horizon, or leave no
    /// room). Now a cursor belongs to the credentials that registered it, and one owner holds
    /// at most 64.
    #[test]
    fn a_cursor_belongs_to_the_owner_that_registered_it() {
        let mut s = LogState::new();
        let mut log = BTreeMap::new();
        run(&mut s, &mut log, app(0, 1, &["a", "b", "c"]));
        let ack = |m: &str, v: u64, owner: &str| Command::AckAs {
            mirror: m.into(),
            applied_version: Version(v),
            owner: owner.into(),
        };
        assert_eq!(run(&mut s, &mut log, ack("b", 1, "token:b")), Outcome::Done);
        // another owner may not move it, forward or back; nothing changes
        let before = s.clone();
        assert_eq!(
            run(&mut s, &mut log, ack("b", 3, "token:c")),
            Outcome::Refused(AppendError::NotOwner { cursor: "b".into() })
        );
        assert_eq!(s, before);
        // its owner moves it
        assert_eq!(run(&mut s, &mut log, ack("b", 2, "token:b")), Outcome::Done);
        assert_eq!(s.cursors["b"].applied_version, Version(2));
        // a cursor of no owner (an earlier release's, or the primary's plain ack) is taken by
        // the first owner that acks it
        let plain = Command::Ack {
            mirror: "old".into(),
            applied_version: Version(1),
        };
        assert_eq!(run(&mut s, &mut log, plain), Outcome::Done);
        assert_eq!(
            run(&mut s, &mut log, ack("old", 2, "cert:c")),
            Outcome::Done
        );
        assert!(matches!(
            run(&mut s, &mut log, ack("old", 3, "token:b")),
            Outcome::Refused(AppendError::NotOwner { .. })
        ));
        // forgetting a cursor releases it to the next owner
        let forget = Command::ForgetMirror { mirror: "b".into() };
        assert_eq!(run(&mut s, &mut log, forget), Outcome::Done);
        assert_eq!(run(&mut s, &mut log, ack("b", 1, "token:c")), Outcome::Done);
        assert_eq!(s.cursor_owners["b"], "token:c");
        // one owner holds at most CURSORS_PER_OWNER_MAX (it has "b" already)
        for i in 1..CURSORS_PER_OWNER_MAX {
            let name = format!("c{i}");
            assert_eq!(
                run(&mut s, &mut log, ack(&name, 1, "token:c")),
                Outcome::Done
            );
        }
        assert!(matches!(
            run(&mut s, &mut log, ack("one-more", 1, "token:c")),
            Outcome::Refused(AppendError::Malformed(_))
        ));
        // ... while another owner still registers, and the first still moves its own
        assert_eq!(run(&mut s, &mut log, ack("d", 1, "token:d")), Outcome::Done);
        assert_eq!(
            run(&mut s, &mut log, ack("c1", 3, "token:c")),
            Outcome::Done
        );
    }

    #[test]
    fn a_batch_is_checked_before_it_is_proposed() {
        assert!(check_batch(Version(1), &[]).is_err());
        assert!(check_batch(Version(0), &[vec![1]]).is_err());
        assert!(check_batch(Version(u64::MAX), &[vec![1], vec![2]]).is_err());
        assert!(check_batch(Version(1), &[vec![0; APPEND_BYTES_MAX + 1]]).is_err());
        assert!(check_batch(Version(1), &vec![vec![]; APPEND_RECORDS_MAX + 1]).is_err());
        assert_eq!(
            check_batch(Version(u64::MAX), &[vec![1]]).unwrap(),
            Version(u64::MAX)
        );
        assert_eq!(
            check_batch(Version(5), &[vec![1], vec![2]]).unwrap(),
            Version(6)
        );
    }
}
