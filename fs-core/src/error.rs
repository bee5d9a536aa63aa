//! The error type of fs-core. Every error maps to an errno at the FUSE boundary.

use crate::object::error::ObjectError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A POSIX error that is the expected answer to a request (ENOENT, EEXIST, EACCES ...).
    #[error("{}", errno_name(*.0))]
    Sys(i32),
    /// The metadata engine failed (connection lost, I/O error, ...).
    #[error("metadata engine: {0}")]
    Meta(String),
    /// Stored metadata could not be decoded or breaks an invariant.
    #[error("corrupt metadata: {0}")]
    Corrupt(String),
    /// A block read from a store does not match its recorded CRC32 or size.
    #[error("corrupt block {key}: {reason}")]
    CorruptBlock { key: String, reason: String },
    #[error(transparent)]
    Object(#[from] ObjectError),
    /// Bad input from a user of the CLI or configuration.
    #[error("{0}")]
    Invalid(String),
    /// A site daemon refused a written slice whose id it did not hand to this session (it
    /// restarted and forgot its ranges, the session was replaced, or the id was never
    /// given out): nothing was changed. The writer takes a new range and writes the slice's
    /// blocks again under an id from it.
    #[error("slice id not allocated to this session: {0}")]
    SliceNotAllocated(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The errno a file system caller sees for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Sys(e) => *e,
            Error::Invalid(_) => libc::EINVAL,
            Error::SliceNotAllocated(_) => libc::EPERM,
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::Meta(_) | Error::Corrupt(_) | Error::CorruptBlock { .. } | Error::Object(_) => {
                libc::EIO
            }
        }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub fn corrupt(what: impl Into<String>) -> Self {
        Error::Corrupt(what.into())
    }

    /// True for the expected POSIX answers, which callers should not log as failures.
    pub fn is_sys(&self) -> bool {
        matches!(self, Error::Sys(_))
    }
}

impl From<postcard::Error> for Error {
    fn from(e: postcard::Error) -> Self {
        Error::Corrupt(format!("decode: {e}"))
    }
}

/// Shorthand for returning a POSIX error.
pub fn sys<T>(errno: i32) -> Result<T> {
    Err(Error::Sys(errno))
}

pub fn errno_name(e: i32) -> String {
    let name = match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::EACCES => "EACCES",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::EMLINK => "EMLINK",
        libc::ERANGE => "ERANGE",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ENODATA => "ENODATA",
        libc::ENOSYS => "ENOSYS",
        libc::EINTR => "EINTR",
        libc::EDEADLK => "EDEADLK",
        libc::ENOTSUP => "ENOTSUP",
        libc::E2BIG => "E2BIG",
        libc::ELOOP => "ELOOP",
        _ => return format!("errno {e}"),
    };
    name.to_string()
}
