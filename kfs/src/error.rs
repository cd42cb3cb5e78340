//! The crate's one error type, mapping to POSIX errnos.

use std::path::PathBuf;

use kucofs_common::format::SuperblockFault;

/// Errors of Kfs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The region or another common primitive failed.
    #[error(transparent)]
    Region(#[from] kucofs_common::Error),
    /// Neither superblock copy carries the KucoFS magic.
    #[error("{path} is not a KucoFS image (no superblock magic found)")]
    NotKucofs { path: PathBuf },
    /// An intact superblock of a format version this build cannot read.
    #[error("{path} has format version {version}, but this build of KucoFS reads version {supported} only")]
    UnsupportedVersion {
        path: PathBuf,
        version: u32,
        supported: u32,
    },
    /// An intact superblock that needs features this build lacks.
    #[error(
        "{path} needs features this build of KucoFS lacks (incompatible feature bits {bits:#x})"
    )]
    UnsupportedFeatures { path: PathBuf, bits: u64 },
    /// Both superblock copies are damaged.
    #[error("both superblock copies of {path} are corrupt (copy A: {a}; copy B: {b})")]
    BothCorrupt {
        path: PathBuf,
        a: SuperblockFault,
        b: SuperblockFault,
    },
    /// Recovery could not rebuild the file system from its metadata store
    /// and log.
    #[error("recovering {path} failed: {cause} (run kucofs fsck for details)")]
    Recovery {
        path: PathBuf,
        cause: crate::recovery::RecoveryError,
    },
    /// The Kfs thread serving an image could not be started.
    #[error("could not start the Kfs thread for {path}: {cause}")]
    ThreadStart {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// The Kfs thread serving an image panicked; what it had not made
    /// durable is recovered from the log at the next open.
    #[error("the Kfs thread serving {path} panicked; open the image again to recover it")]
    ThreadPanicked { path: PathBuf },
    /// The daemon's socket could not be made or served.
    #[error("the socket {path}: {cause}")]
    Socket {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// Another daemon answers on the socket.
    #[error("a KucoFS daemon already serves on {path}")]
    SocketInUse { path: PathBuf },
    /// The image is shorter than the geometry its superblock describes.
    #[error("{path} holds {len} bytes, but its superblock describes a {needed}-byte file system (was the image truncated?)")]
    TooShort {
        path: PathBuf,
        len: u64,
        needed: u64,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The POSIX errno that best describes this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Region(e) => e.errno(),
            Error::NotKucofs { .. }
            | Error::UnsupportedVersion { .. }
            | Error::UnsupportedFeatures { .. } => libc::EINVAL,
            Error::BothCorrupt { .. }
            | Error::TooShort { .. }
            | Error::Recovery { .. }
            | Error::ThreadPanicked { .. } => libc::EIO,
            Error::ThreadStart { cause, .. } => cause.raw_os_error().unwrap_or(libc::EAGAIN),
            Error::Socket { cause, .. } => cause.raw_os_error().unwrap_or(libc::EIO),
            Error::SocketInUse { .. } => libc::EADDRINUSE,
        }
    }
}
