//! The crate's one error type. Every variant says what was being done and to
//! what, and maps to the POSIX errno a file-system caller expects.

use std::io;
use std::path::PathBuf;

/// Errors of the region, the persistence primitives and the on-media format.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call on the image failed.
    #[error("{action} {path}: {cause}")]
    Io {
        action: &'static str,
        path: PathBuf,
        /// Kept out of `source()`: the message already ends with it, and a
        /// chain printer would say it twice.
        cause: io::Error,
    },
    /// Another opener holds the image's exclusive lock.
    #[error("{path} is already open by another KucoFS instance (the image is locked)")]
    Locked { path: PathBuf },
    /// An access fell outside the mapping.
    #[error("access of {len} bytes at offset {offset} is outside the {size}-byte region")]
    OutOfBounds { offset: u64, len: u64, size: u64 },
    /// An atomic access was not naturally aligned.
    #[error("atomic access at offset {offset} is not {align}-byte aligned")]
    Misaligned { offset: u64, align: u64 },
    /// A store was attempted through a read-only mapping.
    #[error("store at offset {offset} through a read-only mapping")]
    ReadOnly { offset: u64 },
    /// A size given for a new image is too small to hold a file system.
    #[error("{path}: a size of {size} bytes is smaller than the {min}-byte minimum")]
    TooSmall { path: PathBuf, size: u64, min: u64 },
    /// A size given for a new image is larger than the format can describe.
    #[error("{path}: a size of {size} bytes is larger than the {max}-byte maximum")]
    TooLarge { path: PathBuf, size: u64, max: u64 },
    /// `mkfs` would overwrite an existing image.
    #[error("{path} already exists (pass --force to overwrite it)")]
    Exists { path: PathBuf },
    /// Memory for an image could not be reserved: the file system holding
    /// it has too little room.
    #[error(
        "{path}: the file system it is on has {free} bytes free, too few for the \
         {size} bytes the image needs now (free some room there; a new image can be made smaller or sparse)"
    )]
    NoSpace { path: PathBuf, size: u64, free: u64 },
    /// An image is empty or is not a regular file, block device or DAX device.
    #[error("{path}: {why}")]
    Unusable { path: PathBuf, why: String },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The POSIX errno that best describes this error to a file-system caller.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io { cause, .. } => cause.raw_os_error().unwrap_or(libc::EIO),
            Error::Locked { .. } => libc::EBUSY,
            Error::OutOfBounds { .. } | Error::Misaligned { .. } | Error::ReadOnly { .. } => {
                libc::EFAULT
            }
            Error::TooSmall { .. } | Error::TooLarge { .. } | Error::Unusable { .. } => {
                libc::EINVAL
            }
            Error::Exists { .. } => libc::EEXIST,
            Error::NoSpace { .. } => libc::ENOSPC,
        }
    }

    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, cause: io::Error) -> Self {
        Error::Io {
            action,
            path: path.into(),
            cause,
        }
    }
}
