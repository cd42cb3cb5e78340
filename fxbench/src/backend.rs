//! The file systems a benchmark runs on, behind one trait, and the parser
//! that turns a `--backends` spec such as `dir:/dev/shm/fxb` into one.
//!
//! # Adding a backend
//!
//! Write a module beside [`dir`] with a type implementing [`Backend`] and a
//! constructor `fn(spec: &str, arg: &str) -> Result<Box<dyn Backend>>`, then
//! add one [`Kind`] entry to [`KINDS`]. The parser, its error message and
//! `fxbench run --help` all read that table.
//!
//! Metadata operations are methods of [`Backend`]; file data goes through
//! a [`FileHandle`] that [`Backend::open_file`] returns, so a data
//! workload's timed loop is one positioned read or write on a handle it
//! opened in setup, as FxMark's `pread`/`pwrite` on a file descriptor.

pub mod daemon;
pub mod dir;
pub mod kucofs;

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::Path;

use crate::error::{Error, Result};

pub use daemon::DaemonBackend;
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
    /// Opens a regular file as `options` say, like `std::fs::OpenOptions`.
    fn open_file(&self, path: &Path, options: OpenOptions) -> io::Result<Box<dyn FileHandle>>;
    /// Counters of the backend's server, if it has one (KucoFS's Kfs):
    /// read before and after a run to report the server's share.
    fn server_counters(&self) -> Option<ServerCounters> {
        None
    }
    /// Does now, untimed, the background work that setup or a run left
    /// behind (KucoFS: provisioning, and its idle checkpoint), so that it
    /// runs beside neither this run's timed phase nor the next backend's
    /// in this process: a run measures the steady state.
    fn settle(&self) -> io::Result<()> {
        Ok(())
    }
    /// The spec another process opens to reach this same file system, as
    /// a worker process does (`--workers process`); `None` if no other
    /// process can (KucoFS with Kfs embedded in this one).
    fn attach_spec(&self) -> Option<String> {
        None
    }
}

/// How [`Backend::open_file`] opens a file: the flags of
/// `std::fs::OpenOptions` that the workloads use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    pub read: bool,
    pub write: bool,
    /// Every write goes to the end of the file (`O_APPEND`).
    pub append: bool,
    pub create: bool,
    pub truncate: bool,
}

impl OpenOptions {
    /// An existing file, read-only (`File::open`).
    pub const READ: OpenOptions = OpenOptions {
        read: true,
        write: false,
        append: false,
        create: false,
        truncate: false,
    };
    /// An existing file, for reading and writing in place.
    pub const READ_WRITE: OpenOptions = OpenOptions {
        write: true,
        ..OpenOptions::READ
    };
    /// A new or emptied file, for writing (`File::create`).
    pub const CREATE: OpenOptions = OpenOptions {
        read: false,
        write: true,
        append: false,
        create: true,
        truncate: true,
    };
    /// A file, made if missing, that every write extends.
    pub const APPEND: OpenOptions = OpenOptions {
        read: false,
        write: true,
        append: true,
        create: true,
        truncate: false,
    };
}

/// An open regular file of a backend. Offsets and lengths are in bytes;
/// each method is one file-system operation (one system call for `dir:`).
pub trait FileHandle: fmt::Debug + Send + Sync {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read
    /// (fewer at the end of the file).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes up to `buf.len()` bytes at `offset`; returns how many were
    /// written.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize>;
    /// Writes up to `buf.len()` bytes at the end of a file opened with
    /// [`OpenOptions::append`]; returns how many were written.
    fn append(&self, buf: &[u8]) -> io::Result<usize>;
    /// Truncates or extends the file to `size` bytes.
    fn set_len(&self, size: u64) -> io::Result<()>;
    /// Makes the file's data and metadata durable (`fsync`).
    fn sync_all(&self) -> io::Result<()>;
    /// The file's current size in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Whether the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        self.len().map(|n| n == 0)
    }
}

/// A server's cumulative counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerCounters {
    /// Time spent serving requests, in ns.
    pub busy_ns: u64,
    /// Per request type: (requests, total service time in ns).
    pub per_op: BTreeMap<String, (u64, u64)>,
    /// The longest time the server served nothing else since the last
    /// reading, in ns.
    pub longest_pause_ns: u64,
}

impl ServerCounters {
    /// What happened between `before` and `self`.
    pub fn since(&self, before: &ServerCounters) -> ServerCounters {
        ServerCounters {
            busy_ns: self.busy_ns.saturating_sub(before.busy_ns),
            per_op: self
                .per_op
                .iter()
                .map(|(k, &(n, ns))| {
                    let (n0, ns0) = before.per_op.get(k).copied().unwrap_or_default();
                    // The service times are estimates from samples and
                    // need not grow in step with the counts.
                    (k.clone(), (n.saturating_sub(n0), ns.saturating_sub(ns0)))
                })
                .filter(|(_, (n, _))| *n > 0)
                .collect(),
            // Each reading takes the longest since the one before.
            longest_pause_ns: self.longest_pause_ns,
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
        usage: "kucofs[:queued+nohints+huge+nohuge+ahead+noahead+sparse+protect=strict|batched|off|keys+size=SIZE+image=PATH]",
        about: "KucoFS with Kfs embedded, on a fresh image under /dev/shm",
        open: KucofsBackend::open_boxed,
    },
    Kind {
        name: "kucofs-daemon",
        usage: "kucofs-daemon[:size=SIZE+sparse+image=PATH+nohints+keep+trusted-writes+bin=PATH]",
        about: "KucoFS served by `kucofs serve` (from bin=, $KUCOFS_BIN, or beside fxbench) on a fresh image under /dev/shm, this program its client",
        open: DaemonBackend::start_boxed,
    },
    Kind {
        name: "kucofs-client",
        usage: "kucofs-client:SOCKET",
        about: "a KucoFS daemon already serving on SOCKET",
        open: DaemonBackend::connect_boxed,
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
