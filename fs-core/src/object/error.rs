//! An object store's errors, below everything that uses them (the crate's own `Error` wraps
//! them).

/// Whether retrying an object store call can help.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ObjectError {
    #[error("object {0} not found")]
    NotFound(String),
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("cancelled")]
    Cancelled,
    /// A transient failure (connection reset, 5xx, throttling): retrying may help.
    #[error("transient: {0}")]
    Transient(String),
    /// A failure retrying will not fix (access denied, bad configuration, disk full).
    #[error("{0}")]
    Fatal(String),
}

impl ObjectError {
    pub fn is_permanent(&self) -> bool {
        matches!(self, ObjectError::NotFound(_) | ObjectError::Fatal(_))
    }
}
