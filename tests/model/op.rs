//! The operations a model-based test runs, their comparable outcomes,
//! the whole-tree listing compared at the end, and the proptest generator
//! of operation sequences. Shared by the kernel check and the KucoFS test.

use std::collections::HashMap;
use std::fmt;

use proptest::prelude::*;

use super::{NAME_MAX, PERM_MASK};

/// A POSIX error number (`libc::ENOENT`, ...).
pub type Errno = i32;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

/// What `stat`/`lstat` report that the model can predict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub kind: Kind,
    /// `st_mode & 0o7777`.
    pub perm: u32,
    /// For a directory, 2 + its subdirectories, as tmpfs counts.
    pub nlink: u64,
    /// Target length for a symlink, 0 for a file (never written) and 0 for a
    /// directory (not compared: tmpfs reports a per-entry byte count).
    pub size: u64,
}

/// One operation of a test sequence. Paths are relative to the root.
#[derive(Clone, PartialEq, Eq)]
pub enum Op {
    /// `open(path, O_CREAT | O_EXCL | O_WRONLY, 0o666)`.
    Create(String),
    /// `mkdir(path, 0o777)`.
    Mkdir(String),
    Unlink(String),
    Rmdir(String),
    /// `renameat2(from, to, noreplace ? RENAME_NOREPLACE : 0)`.
    Rename {
        from: String,
        to: String,
        noreplace: bool,
    },
    /// `linkat(existing, new, 0)`: does not follow a final symlink.
    Link {
        existing: String,
        new: String,
    },
    Symlink {
        target: String,
        link: String,
    },
    Readlink(String),
    Stat(String),
    Lstat(String),
    ReadDir(String),
    /// `chmod(path, mode)`: follows symlinks.
    Chmod {
        path: String,
        mode: u32,
    },
}

/// The result of one `Op`, comparable across implementations.
#[derive(Clone, PartialEq, Eq)]
pub enum Outcome {
    Done,
    Stat(Stat),
    /// `readlink`.
    Target(String),
    /// `read_dir`: names and kinds in byte order, without "." and "..".
    Entries(Vec<(String, Kind)>),
    Err(Errno),
}

impl Outcome {
    pub fn from_unit(r: Result<(), Errno>) -> Self {
        r.map_or_else(Outcome::Err, |()| Outcome::Done)
    }

    pub fn from_result<T>(r: Result<T, Errno>, ok: impl FnOnce(T) -> Outcome) -> Self {
        r.map_or_else(Outcome::Err, ok)
    }
}

/// One name in a whole-tree listing (`Model::tree`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeEntry {
    /// Relative to the root, e.g. "a/b".
    pub path: String,
    pub kind: Kind,
    pub perm: u32,
    pub nlink: u64,
    /// The symlink target, for a symlink.
    pub target: Option<String>,
    /// For a second (third, ...) hard link, the smallest path naming the
    /// same inode: this compares link structure without inode numbers.
    pub first_link: Option<String>,
}

/// Sorts a listing by path and fills `first_link` from the inode ids given
/// beside each entry (any ids that are equal exactly for hard links).
/// Both the model and a real-file-system walker end with this.
pub fn canonical_tree(mut raw: Vec<(u64, TreeEntry)>) -> Vec<TreeEntry> {
    raw.sort_by(|a, b| a.1.path.cmp(&b.1.path));
    let mut first: HashMap<u64, String> = HashMap::new();
    raw.into_iter()
        .map(|(ino, mut entry)| {
            match first.get(&ino) {
                Some(path) => entry.first_link = Some(path.clone()),
                None => {
                    first.insert(ino, entry.path.clone());
                }
            }
            entry
        })
        .collect()
}

// ---- the generator ----------------------------------------------------------

/// Names the generator draws from: few, so that operations collide.
const POOL: [&str; 4] = ["a", "b", "c", "d"];

/// One path component: a pool name mostly, sometimes ".", "..", the longest
/// legal name or one byte more.
fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        30 => prop::sample::select(&POOL[..]).prop_map(str::to_owned),
        2 => Just(".".to_owned()),
        2 => Just("..".to_owned()),
        1 => Just("y".repeat(NAME_MAX)),
        1 => Just("x".repeat(NAME_MAX + 1)),
    ]
}

/// A relative path of 1 to 3 components (mostly 1), now and then with a doubled
/// separator or a trailing slash; rarely the empty path.
pub fn path() -> impl Strategy<Value = String> {
    let separator = prop_oneof![12 => Just("/"), 1 => Just("//")];
    let trailing = prop_oneof![8 => Just(""), 1 => Just("/"), 1 => Just("//")];
    // Short paths more often, so that operations meet existing names.
    let depth = prop_oneof![5 => Just(0usize), 3 => Just(1usize), 1 => Just(2usize)];
    let more = depth
        .prop_flat_map(move |n| prop::collection::vec((separator.clone(), component()), n..=n));
    let joined = (component(), more, trailing).prop_map(|(first, more, trailing)| {
        let mut path = first;
        for (separator, component) in more {
            path.push_str(separator);
            path.push_str(&component);
        }
        path.push_str(trailing);
        path
    });
    prop_oneof![60 => joined, 1 => Just(String::new())]
}

/// Permission bits for chmod, special bits included: a set-group-ID
/// directory passes the bit on to directories made in it.
fn mode() -> impl Strategy<Value = u32> {
    prop_oneof![
        2 => Just(0o755),
        1 => Just(0o644),
        1 => Just(0o000),
        2 => 0u32..=PERM_MASK,
    ]
}

/// One operation; symlink targets come from the same relative paths, so
/// loops (`a -> a`) and chains are common.
pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => path().prop_map(Op::Create),
        6 => path().prop_map(Op::Mkdir),
        2 => path().prop_map(Op::Unlink),
        2 => path().prop_map(Op::Rmdir),
        6 => (path(), path(), any::<bool>())
            .prop_map(|(from, to, noreplace)| Op::Rename { from, to, noreplace }),
        3 => (path(), path()).prop_map(|(existing, new)| Op::Link { existing, new }),
        5 => (path(), path()).prop_map(|(target, link)| Op::Symlink { target, link }),
        1 => path().prop_map(Op::Readlink),
        2 => path().prop_map(Op::Stat),
        2 => path().prop_map(Op::Lstat),
        1 => path().prop_map(Op::ReadDir),
        2 => (path(), mode()).prop_map(|(path, mode)| Op::Chmod { path, mode }),
    ]
}

/// A test sequence of 1 to 59 operations.
pub fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..60)
}

// ---- readable failure reports -----------------------------------------------

/// A path for a failure report, with long same-letter names shortened to
/// `x*256`.
fn show(path: &str) -> String {
    let parts: Vec<String> = path
        .split('/')
        .map(|part| match part.chars().next() {
            Some(c) if part.len() > 8 && part.chars().all(|d| d == c) => {
                format!("{c}*{}", part.len())
            }
            _ => part.to_owned(),
        })
        .collect();
    format!("{:?}", parts.join("/"))
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Create(p) => write!(f, "create({})", show(p)),
            Op::Mkdir(p) => write!(f, "mkdir({})", show(p)),
            Op::Unlink(p) => write!(f, "unlink({})", show(p)),
            Op::Rmdir(p) => write!(f, "rmdir({})", show(p)),
            Op::Rename {
                from,
                to,
                noreplace,
            } => {
                let call = if *noreplace {
                    "rename_noreplace"
                } else {
                    "rename"
                };
                write!(f, "{call}({}, {})", show(from), show(to))
            }
            Op::Link { existing, new } => write!(f, "link({}, {})", show(existing), show(new)),
            Op::Symlink { target, link } => {
                write!(f, "symlink({}, {})", show(target), show(link))
            }
            Op::Readlink(p) => write!(f, "readlink({})", show(p)),
            Op::Stat(p) => write!(f, "stat({})", show(p)),
            Op::Lstat(p) => write!(f, "lstat({})", show(p)),
            Op::ReadDir(p) => write!(f, "read_dir({})", show(p)),
            Op::Chmod { path, mode } => write!(f, "chmod({}, {mode:#o})", show(path)),
        }
    }
}

impl fmt::Debug for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Done => write!(f, "Ok"),
            Outcome::Stat(stat) => write!(
                f,
                "{:?} perm={:#o} nlink={} size={}",
                stat.kind, stat.perm, stat.nlink, stat.size
            ),
            Outcome::Target(target) => write!(f, "-> {}", show(target)),
            Outcome::Entries(entries) => f.debug_list().entries(entries).finish(),
            Outcome::Err(errno) => write!(f, "{}", errno_name(*errno)),
        }
    }
}

/// The symbolic name of the errnos these operations return.
pub fn errno_name(errno: Errno) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EBUSY => "EBUSY",
        libc::EACCES => "EACCES",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::EMLINK => "EMLINK",
        libc::ENOSPC => "ENOSPC",
        _ => return format!("errno {errno}"),
    };
    name.to_owned()
}
