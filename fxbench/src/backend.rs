//! The file systems a benchmark runs on, behind one trait, and the parser
//! that turns a `--backends` spec such as `dir:/dev/shm/fxb` into one.
//!
//! # Adding a backend
//!
//! Write a module beside [`dir`] with a type implementing [`Backend`] and a
//! constructor `fn(spec: &str, arg: &str) -> Result<Box<dyn Backend>>`, then
//! add one [`Kind`] entry to [`KINDS`]. The parser, its error message and
//! `fxbench run --help` all read that table.

pub mod dir;
pub mod kucofs;

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::Path;

use crate::error::{Error, Result};

pub use dir::DirBackend;
pub use kucofs::KucofsBackend;

/// A file system under test. Paths are relative to the backend's root; the
/// backend joins them. Every method is one file-system operation, so a
/// workload's timed loop measures the backend and little else.
pub trait Backend: fmt::Debug + Send + Sync {
    /// The spec this backend was opened from, e.g. `dir:/dev/shm/fxb`.
    fn name(&self) -> &str;
    /// Creates a directory and any missing parents.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Creates an empty regular file; fails with `AlreadyExists` if the
    /// name is taken.
    fn create_file(&self, path: &Path) -> io::Result<()>;
    /// Looks up the metadata of `path`, following symbolic links.
    fn stat(&self, path: &Path) -> io::Result<()>;
    /// Unlinks a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Renames `from` to `to`, replacing `to` if it exists.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a directory and everything below it.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Counters of the backend's server, if it has one (KucoFS's Kfs):
    /// read before and after a run to report the server's share.
    fn server_counters(&self) -> Option<ServerCounters> {
        None
    }
}

/// A server's cumulative counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerCounters {
    /// Time spent serving requests, in ns.
    pub busy_ns: u64,
    /// Per request type: (requests, total service time in ns).
    pub per_op: BTreeMap<String, (u64, u64)>,
}

impl ServerCounters {
    /// What happened between `before` and `self`.
    pub fn since(&self, before: &ServerCounters) -> ServerCounters {
        ServerCounters {
            busy_ns: self.busy_ns - before.busy_ns,
            per_op: self
                .per_op
                .iter()
                .map(|(k, &(n, ns))| {
                    let (n0, ns0) = before.per_op.get(k).copied().unwrap_or_default();
                    (k.clone(), (n - n0, ns - ns0))
                })
                .filter(|(_, (n, _))| *n > 0)
                .collect(),
        }
    }
}

/// One kind of backend the spec parser knows.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    /// The spec prefix before the first `:`.
    pub name: &'static str,
    /// How a spec of this kind is written, for messages and `--help`.
    pub usage: &'static str,
    /// What the backend is, for `--help`.
    pub about: &'static str,
    /// Opens a backend from the whole spec and the text after the `:`.
    pub open: fn(spec: &str, arg: &str) -> Result<Box<dyn Backend>>,
}

/// Every backend kind, in the order they are listed to the user.
pub const KINDS: &[Kind] = &[
    Kind {
        name: "dir",
        usage: "dir:PATH",
        about: "an existing directory, through the kernel's file system",
        open: DirBackend::open_boxed,
    },
    Kind {
        name: "kucofs",
        usage: "kucofs[:queued+nohints+size=SIZE+image=PATH]",
        about: "KucoFS with Kfs embedded, on a fresh image under /dev/shm",
        open: KucofsBackend::open_boxed,
    },
];

/// Opens the backend a spec names, e.g. `dir:/dev/shm/fxb`.
pub fn open(spec: &str) -> Result<Box<dyn Backend>> {
    let (name, arg) = spec.split_once(':').unwrap_or((spec, ""));
    match KINDS.iter().find(|k| k.name == name) {
        Some(kind) => (kind.open)(spec, arg),
        None => Err(Error::UnknownBackend {
            spec: spec.to_owned(),
            accepted: accepted(),
        }),
    }
}

/// The accepted spec forms, joined for a message.
pub fn accepted() -> String {
    KINDS.iter().map(|k| k.usage).collect::<Vec<_>>().join(", ")
}

/// The accepted spec forms with what each is, for `--help`.
pub fn help() -> String {
    KINDS
        .iter()
        .map(|k| format!("{} ({})", k.usage, k.about))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::chain;

    #[test]
    fn unknown_kind_lists_the_accepted_ones() {
        let err = open("nfs:/mnt").unwrap_err();
        let msg = chain(&err);
        assert!(msg.contains("unknown backend `nfs:/mnt`"), "{msg}");
        assert!(msg.contains("dir:PATH"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }

    #[test]
    fn a_spec_without_a_colon_is_an_unknown_kind() {
        assert!(matches!(
            open("/dev/shm").unwrap_err(),
            Error::UnknownBackend { .. }
        ));
    }

    #[test]
    fn dir_spec_opens_a_dir_backend_named_after_the_spec() {
        let tmp = crate::testing::tempdir();
        let spec = format!("dir:{}", tmp.path().display());
        let fs = open(&spec).unwrap();
        assert_eq!(fs.name(), spec);
    }
}
