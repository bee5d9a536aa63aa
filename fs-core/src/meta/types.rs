//! Plain metadata types shared by the semantic layer, the change records and the VFS.

use serde::{Deserialize, Serialize};

use crate::SliceId;

pub type Ino = u64;

/// The root directory's inode number.
pub const ROOT_INO: Ino = 1;
/// The trash directory's inode number: `/.trash`, a directory no key holds, listed from the
/// trash entries (far above any number the inode counter hands out, as JuiceFS numbers its
/// own).
pub const TRASH_INO: Ino = 0x7FFF_FFFF_1000_0000;
/// The trash directory's name at the root (not listed there, as JuiceFS's is not).
pub const TRASH_NAME: &[u8] = b".trash";
/// How many days the trash keeps what is deleted when the file system's setting is unset (as
/// JuiceFS's `trash-days`).
pub const TRASH_DAYS_DEFAULT: u32 = 1;
/// Longest name of a directory entry, in bytes.
pub const NAME_LEN_MAX: usize = 255;
/// Longest symlink target, in bytes.
pub const SYMLINK_LEN_MAX: usize = 4096;
/// Largest xattr value, in bytes (the Linux limit).
pub const XATTR_VALUE_LEN_MAX: usize = 65536;
/// Longest xattr name, in bytes (the Linux limit).
pub const XATTR_NAME_LEN_MAX: usize = 255;
/// Largest file size: 2^50 bytes (1 PiB), far beyond any chunk index overflow.
pub const FILE_SIZE_MAX: u64 = 1 << 50;
/// Largest number of hard links to one inode.
pub const NLINK_MAX: u32 = 65000;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl FileKind {
    /// From the S_IFMT bits of a mode.
    pub fn from_mode(mode: u32) -> Option<Self> {
        match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => Some(FileKind::File),
            libc::S_IFDIR => Some(FileKind::Dir),
            libc::S_IFLNK => Some(FileKind::Symlink),
            libc::S_IFIFO => Some(FileKind::Fifo),
            libc::S_IFSOCK => Some(FileKind::Socket),
            libc::S_IFCHR => Some(FileKind::CharDev),
            libc::S_IFBLK => Some(FileKind::BlockDev),
            _ => None,
        }
    }
    pub fn ifmt(self) -> u32 {
        match self {
            FileKind::File => libc::S_IFREG,
            FileKind::Dir => libc::S_IFDIR,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::Fifo => libc::S_IFIFO,
            FileKind::Socket => libc::S_IFSOCK,
            FileKind::CharDev => libc::S_IFCHR,
            FileKind::BlockDev => libc::S_IFBLK,
        }
    }
    pub fn code(self) -> u8 {
        self as u8
    }
    pub fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            0 => FileKind::File,
            1 => FileKind::Dir,
            2 => FileKind::Symlink,
            3 => FileKind::Fifo,
            4 => FileKind::Socket,
            5 => FileKind::CharDev,
            6 => FileKind::BlockDev,
            _ => return None,
        })
    }
}

/// An inode's attributes. Times are nanoseconds since the Unix epoch.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub kind: FileKind,
    /// Permission bits including setuid, setgid and sticky (mode & 0o7777).
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub length: u64,
    pub rdev: u32,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// The directory holding the inode's entry (the root is its own parent). Exact for a
    /// directory; for another kind, the directory of its first link, moved with a rename of
    /// that link: a hard-linked file may have entries elsewhere too. 0 for a file made by a
    /// release before parents were kept for every kind (a confined credential cannot name
    /// such a file by its inode number: docs/security.md, "Subtrees").
    pub parent: Ino,
}

impl Attr {
    pub fn is_dir(&self) -> bool {
        self.kind == FileKind::Dir
    }
    pub fn mode(&self) -> u32 {
        self.kind.ifmt() | self.perm as u32
    }
    /// Space the file occupies for statfs accounting (length rounded up to 4 KiB).
    pub fn space(&self) -> i64 {
        match self.kind {
            FileKind::File => (self.length.div_ceil(4096) * 4096) as i64,
            FileKind::Dir | FileKind::Symlink => 4096,
            _ => 0,
        }
    }
}

/// Who is asking: the caller's credentials, as the kernel reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ctx {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary gid need not be repeated).
    pub groups: Vec<u32>,
    pub pid: u32,
}

impl Ctx {
    pub fn root() -> Self {
        Ctx::default()
    }
    pub fn new(uid: u32, gid: u32) -> Self {
        Ctx {
            uid,
            gid,
            groups: vec![],
            pid: 0,
        }
    }
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// One slice's reference in a chunk: bytes `[off, off + len)` of slice object `id` (whose
/// total size is `size`) appear at position `pos` of the chunk. [`SliceId::HOLE`] is a hole
/// (zeros).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct SliceRef {
    pub id: SliceId,
    pub size: u32,
    pub off: u32,
    pub len: u32,
    pub pos: u32,
    /// CRC32 of each block of the slice object, in block order (empty for holes).
    pub crcs: Vec<u32>,
}

/// The file system's settings, written by `format`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Format {
    pub name: String,
    pub uuid: String,
    pub data_url: String,
    pub block_size: u32,
    /// Capacity reported by statfs, in bytes (0: unlimited, reported as 1 PiB).
    pub capacity_bytes: u64,
    /// Seconds before a dead slice's blocks are deleted.
    pub trash_delay_s: u64,
    pub created_ns: i64,
}

/// What statfs reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatFs {
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub inodes: u64,
    pub block_size: u32,
}

/// A directory entry as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: FileKind,
}

/// Setattr request: each Some field is changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    pub ctime_ns: Option<i64>,
    /// The change comes through a handle opened for writing (ftruncate): no write check.
    pub via_handle: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(i64),
}

/// Lock types for flock and POSIX byte-range locks.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockType {
    Read,
    Write,
    Unlock,
}

impl LockType {
    pub fn from_libc(t: i32) -> Option<Self> {
        match t {
            libc::F_RDLCK => Some(LockType::Read),
            libc::F_WRLCK => Some(LockType::Write),
            libc::F_UNLCK => Some(LockType::Unlock),
            _ => None,
        }
    }
    pub fn to_libc(self) -> i32 {
        match self {
            LockType::Read => libc::F_RDLCK,
            LockType::Write => libc::F_WRLCK,
            LockType::Unlock => libc::F_UNLCK,
        }
    }
}

/// A POSIX lock held on `[start, end]` (inclusive end, as FUSE sends it).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PosixLock {
    pub sid: u64,
    pub owner: u64,
    pub pid: u32,
    pub typ: LockType,
    pub start: u64,
    pub end: u64,
}

/// A lock a mount holds, as it names it when it takes it again at its session's resumption
/// (see [`crate::meta::LOCK_GRACE`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLock {
    pub owner: u64,
    pub pid: u32,
    pub typ: LockType,
    pub start: u64,
    pub end: u64,
    /// flock(2) rather than a POSIX byte-range lock (`pid`, `start` and `end` unused).
    pub flock: bool,
}
