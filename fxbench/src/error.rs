//! The crate's one error type. Every variant says what was being done and to
//! what; the underlying I/O error, if any, is the `source`, so a caller
//! printing the chain (`{:#}` with anyhow) gets one sentence.

use std::io;
use std::path::{Path, PathBuf};

use crate::workload::Workload;

/// Errors of fxbench.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A workload name that is not one of the FxMark workloads implemented here.
    #[error("unknown workload `{name}` (expected one of {})", Workload::names())]
    UnknownWorkload { name: String },
    /// A backend spec whose kind is not one of those implemented here.
    #[error("unknown backend `{spec}` (expected one of {accepted})")]
    UnknownBackend { spec: String, accepted: String },
    /// A backend spec of a known kind that cannot be used.
    #[error("backend `{spec}`: {why}")]
    UnusableBackend { spec: String, why: String },
    /// A backend whose root could not be checked or written.
    #[error("backend `{spec}`: {action} {path}")]
    BackendIo {
        spec: String,
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A run parameter out of range.
    #[error("{0}")]
    BadParameter(String),
    /// A file-system operation failed while setting up, running or cleaning
    /// up one workload.
    #[error("{workload} on {backend} with {threads} thread(s)")]
    Run {
        workload: Workload,
        backend: String,
        threads: usize,
        #[source]
        source: OpFailure,
    },
    /// The results file could not be created or written.
    #[error("write results to {path}")]
    Results {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// One backend operation that failed, naming the operation and its path
/// relative to the backend's root.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}", path.display())]
pub struct OpFailure {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

impl OpFailure {
    /// Names a failed operation; used as `.map_err(|e| OpFailure::new(..))`
    /// so the path is copied only on failure.
    pub fn new(op: &'static str, path: &Path, source: io::Error) -> Self {
        OpFailure {
            op,
            path: path.to_owned(),
            source,
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Renders an error and its sources as one line, the way `{:#}` does for
/// anyhow.
#[cfg(test)]
pub(crate) fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        line.push_str(": ");
        line.push_str(&e.to_string());
        next = e.source();
    }
    line
}
