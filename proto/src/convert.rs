//! Conversions between the wire types of `meta.proto` and fs-core's domain types, and between
//! fs-core errors and gRPC statuses. Wire → domain conversions are fallible: a request from the
//! network is never trusted to hold a valid enum value or a present message.

use strait_fs_core::error::Error;
use strait_fs_core::meta as d;
use tonic::{Code, Status};

use crate::meta as w;

/// Metadata entry holding the Linux errno of a failed call.
pub const ERRNO_HEADER: &str = "x-strait-errno";
/// Metadata entry naming the caller's session.
pub const SESSION_HEADER: &str = "x-strait-session";
/// Metadata entry set on a status that asks the client to open its session again.
pub const RESUME_HEADER: &str = "x-strait-resume";
/// The change-log version a successful mutation committed as (set by a primary); on a read
/// that asked with [`READ_VERSION_HEADER`], a version at least as new as the state it read.
pub const VERSION_HEADER: &str = "x-strait-version";
/// Names one mutation (a mount's id and a sequence number); sent again unchanged when the
/// call is retried after its connection broke, so the daemon runs it once: it answers a
/// retry from the first call's result, kept in memory and, for a change, in a request record
/// committed with the change (so also after the daemon restarted).
pub const REQUEST_ID_HEADER: &str = "x-strait-request-id";
/// Set by a mount on a change it sends again (after an attempt failed on the way: it may
/// have been applied), with the attempt's number. The daemon answers it from its request
/// record all the same; the mark tells it, when records may be missing (removed early, or
/// lost with metadata a primary took back from the replicator), that a missing record does
/// not mean a new call: it answers EIO then instead of running the change perhaps twice.
pub const RETRY_HEADER: &str = "x-strait-retry";
/// Set (to any value) on a read a mirror forwards: the primary then names in
/// [`VERSION_HEADER`] its latest version once the read is done, so the mirror knows which
/// version its region has been shown.
pub const READ_VERSION_HEADER: &str = "x-strait-read-version";

/// Set (to `1`) on the refusal of a `WriteSlice` or `CompactChunk` naming a slice id the
/// daemon did not hand to the calling session (errno EPERM): the mount takes a new range and
/// writes the slice again under an id from it ([`Error::SliceNotAllocated`]).
pub const SLICE_NOT_ALLOCATED_HEADER: &str = "x-strait-slice-not-allocated";

/// A wire value that does not make a valid domain value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub String);

impl From<WireError> for Status {
    fn from(e: WireError) -> Status {
        let mut s = Status::invalid_argument(e.0);
        if let Ok(v) = libc::EINVAL.to_string().parse() {
            s.metadata_mut().insert(ERRNO_HEADER, v);
        }
        s
    }
}

fn code_of(errno: i32) -> Code {
    match errno {
        libc::ENOENT | libc::ENODATA => Code::NotFound,
        libc::EEXIST | libc::ENOTEMPTY => Code::AlreadyExists,
        libc::EACCES | libc::EPERM => Code::PermissionDenied,
        libc::EAGAIN => Code::Unavailable,
        libc::ENOSPC | libc::EDQUOT | libc::EMLINK | libc::EFBIG | libc::E2BIG | libc::ERANGE => {
            Code::ResourceExhausted
        }
        libc::EROFS | libc::ENOTDIR | libc::EISDIR | libc::EXDEV | libc::ENOTSUP => {
            Code::FailedPrecondition
        }
        libc::EIO => Code::Internal,
        libc::ETIMEDOUT => Code::DeadlineExceeded,
        _ => Code::InvalidArgument,
    }
}

/// The status for a failed call: the gRPC code derived from the errno, the errno itself in
/// [`ERRNO_HEADER`], and the error's text as the message.
pub fn to_status(e: &Error) -> Status {
    let errno = e.errno();
    let mut s = Status::new(code_of(errno), e.to_string());
    if let Ok(v) = errno.to_string().parse() {
        s.metadata_mut().insert(ERRNO_HEADER, v);
    }
    if matches!(e, Error::SliceNotAllocated(_)) {
        s.metadata_mut()
            .insert(SLICE_NOT_ALLOCATED_HEADER, "1".parse().expect("ascii"));
    }
    s
}

/// Whether a status refuses a slice id the session was not given (see
/// [`SLICE_NOT_ALLOCATED_HEADER`]).
pub fn is_slice_not_allocated(s: &Status) -> bool {
    s.metadata().get(SLICE_NOT_ALLOCATED_HEADER).is_some()
}

/// The errno a status carries, if it carries one.
pub fn status_errno(s: &Status) -> Option<i32> {
    s.metadata()
        .get(ERRNO_HEADER)?
        .to_str()
        .ok()?
        .parse::<i32>()
        .ok()
        .filter(|e| *e > 0 && *e < 4096)
}

fn need<T>(v: Option<T>, what: &str) -> Result<T, WireError> {
    v.ok_or_else(|| WireError(format!("the request lacks {what}")))
}

// ---- credentials ----------------------------------------------------------------------------

impl From<&d::Ctx> for w::Ctx {
    fn from(c: &d::Ctx) -> Self {
        w::Ctx {
            uid: c.uid,
            gid: c.gid,
            groups: c.groups.clone(),
            pid: c.pid,
        }
    }
}

/// Most handles one Release call may name.
pub const RELEASE_BATCH_MAX: usize = 4096;

/// Most supplementary groups a caller may claim (Linux's NGROUPS_MAX).
pub const GROUPS_MAX: usize = 65536;

/// The caller's credentials in a request (they must be present).
pub fn ctx_from_wire(c: Option<w::Ctx>) -> Result<d::Ctx, WireError> {
    {
        let c = need(c, "the caller's credentials (ctx)")?;
        if c.groups.len() > GROUPS_MAX {
            return Err(WireError(format!(
                "the caller claims {} supplementary groups; at most {GROUPS_MAX} are allowed",
                c.groups.len()
            )));
        }
        Ok(d::Ctx {
            uid: c.uid,
            gid: c.gid,
            groups: c.groups,
            pid: c.pid,
        })
    }
}

// ---- kinds and attributes -------------------------------------------------------------------

impl From<d::FileKind> for w::FileKind {
    fn from(k: d::FileKind) -> Self {
        match k {
            d::FileKind::File => w::FileKind::File,
            d::FileKind::Dir => w::FileKind::Dir,
            d::FileKind::Symlink => w::FileKind::Symlink,
            d::FileKind::Fifo => w::FileKind::Fifo,
            d::FileKind::Socket => w::FileKind::Socket,
            d::FileKind::CharDev => w::FileKind::CharDev,
            d::FileKind::BlockDev => w::FileKind::BlockDev,
        }
    }
}

pub fn kind_from_wire(k: i32) -> Result<d::FileKind, WireError> {
    let k = w::FileKind::try_from(k).map_err(|_| WireError(format!("unknown file kind {k}")))?;
    Ok(match k {
        w::FileKind::File => d::FileKind::File,
        w::FileKind::Dir => d::FileKind::Dir,
        w::FileKind::Symlink => d::FileKind::Symlink,
        w::FileKind::Fifo => d::FileKind::Fifo,
        w::FileKind::Socket => d::FileKind::Socket,
        w::FileKind::CharDev => d::FileKind::CharDev,
        w::FileKind::BlockDev => d::FileKind::BlockDev,
    })
}

impl From<&d::Attr> for w::Attr {
    fn from(a: &d::Attr) -> Self {
        w::Attr {
            kind: w::FileKind::from(a.kind) as i32,
            perm: a.perm as u32,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            length: a.length,
            rdev: a.rdev,
            atime_ns: a.atime_ns,
            mtime_ns: a.mtime_ns,
            ctime_ns: a.ctime_ns,
            parent: a.parent,
        }
    }
}

/// The attributes in a reply (they must be present).
pub fn attr_from_wire(a: Option<w::Attr>) -> Result<d::Attr, WireError> {
    {
        let a = need(a, "attributes")?;
        if a.perm > 0o7777 {
            return Err(WireError(format!(
                "permission bits {:o} out of range",
                a.perm
            )));
        }
        Ok(d::Attr {
            kind: kind_from_wire(a.kind)?,
            perm: a.perm as u16,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            length: a.length,
            rdev: a.rdev,
            atime_ns: a.atime_ns,
            mtime_ns: a.mtime_ns,
            ctime_ns: a.ctime_ns,
            parent: a.parent,
        })
    }
}

impl From<&d::Format> for w::Format {
    fn from(f: &d::Format) -> Self {
        w::Format {
            name: f.name.clone(),
            uuid: f.uuid.clone(),
            data_url: f.data_url.clone(),
            block_size: f.block_size,
            capacity_bytes: f.capacity_bytes,
            trash_delay_s: f.trash_delay_s,
            created_ns: f.created_ns,
        }
    }
}

/// The file system's settings in a reply (they must be present).
pub fn format_from_wire(f: Option<w::Format>) -> Result<d::Format, WireError> {
    {
        let f = need(f, "the file system's format")?;
        if f.block_size == 0 {
            return Err(WireError("the file system's block size is 0".into()));
        }
        Ok(d::Format {
            name: f.name,
            uuid: f.uuid,
            data_url: f.data_url,
            block_size: f.block_size,
            capacity_bytes: f.capacity_bytes,
            trash_delay_s: f.trash_delay_s,
            created_ns: f.created_ns,
        })
    }
}

impl From<&d::DirEntry> for w::DirEntry {
    fn from(e: &d::DirEntry) -> Self {
        w::DirEntry {
            name: e.name.clone(),
            ino: e.ino,
            kind: w::FileKind::from(e.kind) as i32,
        }
    }
}

impl TryFrom<w::DirEntry> for d::DirEntry {
    type Error = WireError;
    fn try_from(e: w::DirEntry) -> Result<Self, WireError> {
        Ok(d::DirEntry {
            kind: kind_from_wire(e.kind)?,
            name: e.name,
            ino: e.ino,
        })
    }
}

impl From<&d::StatFs> for w::StatFsReply {
    fn from(s: &d::StatFs) -> Self {
        w::StatFsReply {
            total_bytes: s.total_bytes,
            used_bytes: s.used_bytes,
            inodes: s.inodes,
            block_size: s.block_size,
        }
    }
}

impl From<w::StatFsReply> for d::StatFs {
    fn from(s: w::StatFsReply) -> Self {
        d::StatFs {
            total_bytes: s.total_bytes,
            used_bytes: s.used_bytes,
            inodes: s.inodes,
            block_size: s.block_size,
        }
    }
}

// ---- setattr --------------------------------------------------------------------------------

impl From<d::TimeSet> for w::TimeSet {
    fn from(t: d::TimeSet) -> Self {
        w::TimeSet {
            to: Some(match t {
                d::TimeSet::Now => w::time_set::To::Now(w::Empty {}),
                d::TimeSet::At(ns) => w::time_set::To::AtNs(ns),
            }),
        }
    }
}

fn time_from_wire(t: Option<w::TimeSet>) -> Result<Option<d::TimeSet>, WireError> {
    match t {
        None => Ok(None),
        Some(w::TimeSet { to: None }) => Err(WireError("a time to set names no time".into())),
        Some(w::TimeSet {
            to: Some(w::time_set::To::Now(_)),
        }) => Ok(Some(d::TimeSet::Now)),
        Some(w::TimeSet {
            to: Some(w::time_set::To::AtNs(ns)),
        }) => Ok(Some(d::TimeSet::At(ns))),
    }
}

/// The setattr request for `ino` with the caller's credentials.
pub fn setattr_to_wire(ctx: &d::Ctx, ino: d::Ino, s: &d::SetAttr) -> w::SetAttrRequest {
    w::SetAttrRequest {
        ctx: Some(ctx.into()),
        ino,
        mode: s.mode,
        uid: s.uid,
        gid: s.gid,
        size: s.size,
        atime: s.atime.map(Into::into),
        mtime: s.mtime.map(Into::into),
        ctime_ns: s.ctime_ns,
        via_handle: s.via_handle,
    }
}

/// The domain setattr request in a wire request.
pub fn setattr_from_wire(r: &w::SetAttrRequest) -> Result<d::SetAttr, WireError> {
    Ok(d::SetAttr {
        mode: r.mode,
        uid: r.uid,
        gid: r.gid,
        size: r.size,
        atime: time_from_wire(r.atime)?,
        mtime: time_from_wire(r.mtime)?,
        ctime_ns: r.ctime_ns,
        via_handle: r.via_handle,
    })
}

// ---- slices ---------------------------------------------------------------------------------

/// Most blocks one slice may have (a 64 MiB chunk in blocks of at least 4 KiB).
pub const SLICE_BLOCKS_MAX: usize = 16384;

impl From<&d::SliceRef> for w::SliceRef {
    fn from(s: &d::SliceRef) -> Self {
        w::SliceRef {
            id: s.id.0,
            size: s.size,
            off: s.off,
            len: s.len,
            pos: s.pos,
            crcs: s.crcs.clone(),
        }
    }
}

impl TryFrom<w::SliceRef> for d::SliceRef {
    type Error = WireError;
    fn try_from(s: w::SliceRef) -> Result<Self, WireError> {
        if s.crcs.len() > SLICE_BLOCKS_MAX {
            return Err(WireError(format!(
                "slice {} lists {} block checksums; at most {SLICE_BLOCKS_MAX} are allowed",
                s.id,
                s.crcs.len()
            )));
        }
        Ok(d::SliceRef {
            id: strait_fs_core::SliceId(s.id),
            size: s.size,
            off: s.off,
            len: s.len,
            pos: s.pos,
            crcs: s.crcs,
        })
    }
}

/// The domain slices of a wire list.
pub fn slices_from_wire(v: Vec<w::SliceRef>) -> Result<Vec<d::SliceRef>, WireError> {
    v.into_iter().map(TryInto::try_into).collect()
}

/// The wire slices of a domain list.
pub fn slices_to_wire(v: &[d::SliceRef]) -> Vec<w::SliceRef> {
    v.iter().map(Into::into).collect()
}

// ---- locks ----------------------------------------------------------------------------------

impl From<d::LockType> for w::LockType {
    fn from(t: d::LockType) -> Self {
        match t {
            d::LockType::Read => w::LockType::Read,
            d::LockType::Write => w::LockType::Write,
            d::LockType::Unlock => w::LockType::Unlock,
        }
    }
}

pub fn lock_type_from_wire(t: i32) -> Result<d::LockType, WireError> {
    match w::LockType::try_from(t) {
        Ok(w::LockType::Read) => Ok(d::LockType::Read),
        Ok(w::LockType::Write) => Ok(d::LockType::Write),
        Ok(w::LockType::Unlock) => Ok(d::LockType::Unlock),
        Err(_) => Err(WireError(format!("unknown lock type {t}"))),
    }
}

impl From<&d::PosixLock> for w::PosixLock {
    fn from(l: &d::PosixLock) -> Self {
        w::PosixLock {
            session: l.sid,
            owner: l.owner,
            pid: l.pid,
            typ: w::LockType::from(l.typ) as i32,
            start: l.start,
            end: l.end,
        }
    }
}

impl TryFrom<w::PosixLock> for d::PosixLock {
    type Error = WireError;
    fn try_from(l: w::PosixLock) -> Result<Self, WireError> {
        Ok(d::PosixLock {
            sid: l.session,
            owner: l.owner,
            pid: l.pid,
            typ: lock_type_from_wire(l.typ)?,
            start: l.start,
            end: l.end,
        })
    }
}

/// A held lock as a resumed session names it: (inode, lock).
pub fn held_lock_from_wire(l: &w::HeldLock) -> Result<(d::Ino, d::HeldLock), WireError> {
    let typ = lock_type_from_wire(l.typ)?;
    if typ == d::LockType::Unlock {
        return Err(WireError("a held lock of type unlock".into()));
    }
    if !l.flock && l.start > l.end {
        return Err(WireError(format!(
            "a held lock from {} to {}: the range is empty",
            l.start, l.end
        )));
    }
    Ok((
        l.ino,
        d::HeldLock {
            owner: l.owner,
            pid: l.pid,
            typ,
            start: l.start,
            end: l.end,
            flock: l.flock,
        },
    ))
}

pub fn held_lock_to_wire(ino: d::Ino, l: &d::HeldLock) -> w::HeldLock {
    w::HeldLock {
        ino,
        owner: l.owner,
        pid: l.pid,
        typ: w::LockType::from(l.typ) as i32,
        start: l.start,
        end: l.end,
        flock: l.flock,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip() {
        let a = d::Attr {
            kind: d::FileKind::Symlink,
            perm: 0o1755,
            uid: 7,
            gid: 8,
            nlink: 2,
            length: 1 << 40,
            rdev: 3,
            atime_ns: -1,
            mtime_ns: 5,
            ctime_ns: 6,
            parent: 0,
        };
        assert_eq!(attr_from_wire(Some(w::Attr::from(&a))), Ok(a));
    }

    #[test]
    fn invalid_wire_values_are_refused() {
        let bad_kind = w::Attr {
            kind: 99,
            ..Default::default()
        };
        assert!(attr_from_wire(Some(bad_kind)).is_err());
        assert!(ctx_from_wire(None).is_err());
        assert!(lock_type_from_wire(-1).is_err());
        let r = w::SetAttrRequest {
            atime: Some(w::TimeSet { to: None }),
            ..Default::default()
        };
        assert!(setattr_from_wire(&r).is_err());
    }

    #[test]
    fn errors_keep_their_errno() {
        let s = to_status(&Error::Sys(libc::ENOTEMPTY));
        assert_eq!(s.code(), Code::AlreadyExists);
        assert_eq!(status_errno(&s), Some(libc::ENOTEMPTY));
    }
}
