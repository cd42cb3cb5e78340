//! The FxMark metadata workloads (Min et al., "Understanding Manycore
//! Scalability of File Systems", USENIX ATC 2016) this crate implements.
//!
//! A name reads as FxMark's: M (metadata), then R or W (read or write),
//! then the operation (C create, P path resolution, U unlink, R rename),
//! then the sharing level (L low: each worker in its own directory; M
//! medium: workers share a directory).

mod create;
mod rename;
mod stat;
mod unlink;

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::backend::Backend;
use crate::error::{Error, OpFailure};
use crate::harness::Worker;

/// One FxMark metadata workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Workload {
    /// Create empty files, each worker in its own directory.
    Mwcl,
    /// Create empty files, all workers in one shared directory.
    Mwcm,
    /// Stat a private 5-deep path, one per worker.
    Mrpl,
    /// Stat random leaves of a shared 8-ary tree 5 levels deep.
    Mrpm,
    /// Unlink pre-created files, each worker in its own directory.
    Mwul,
    /// Rename a file back and forth, each worker in its own directory.
    Mwrl,
}

impl Workload {
    /// Every workload, in the order `fxbench list` shows them.
    pub const ALL: [Workload; 6] = [
        Workload::Mwcl,
        Workload::Mwcm,
        Workload::Mrpl,
        Workload::Mrpm,
        Workload::Mwul,
        Workload::Mwrl,
    ];

    /// FxMark's name for the workload.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Mwcl => "MWCL",
            Workload::Mwcm => "MWCM",
            Workload::Mrpl => "MRPL",
            Workload::Mrpm => "MRPM",
            Workload::Mwul => "MWUL",
            Workload::Mwrl => "MWRL",
        }
    }

    /// What one worker does, in a line.
    pub fn description(self) -> &'static str {
        match self {
            Workload::Mwcl => "create empty files, each worker in its own directory",
            Workload::Mwcm => "create empty files, all workers in one shared directory",
            Workload::Mrpl => "stat a private 5-deep path (wN/d1/d2/d3/d4/file), one per worker",
            Workload::Mrpm => {
                "stat random files of a shared 8-ary tree 5 levels deep (32768 files)"
            }
            Workload::Mwul => {
                "unlink files pre-created untimed in batches of 10000, each worker in its own directory"
            }
            Workload::Mwrl => "rename a file a -> b -> a ..., each worker in its own directory",
        }
    }

    /// All names, joined for a message.
    pub fn names() -> String {
        Workload::ALL.map(Workload::name).join(", ")
    }

    /// Untimed setup in `dir` (relative to the backend's root, already
    /// created and empty): makes what the workload needs and returns one
    /// worker per thread.
    pub fn setup(
        self,
        fs: &dyn Backend,
        dir: &Path,
        threads: usize,
    ) -> Result<Vec<Box<dyn Worker>>, OpFailure> {
        match self {
            Workload::Mwcl => create::private_dirs(fs, dir, threads),
            Workload::Mwcm => create::shared_dir(fs, dir, threads),
            Workload::Mrpl => stat::private_paths(fs, dir, threads),
            Workload::Mrpm => stat::shared_tree(fs, dir, threads),
            Workload::Mwul => unlink::private_dirs(fs, dir, threads),
            Workload::Mwrl => rename::private_dirs(fs, dir, threads),
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Workload {
    type Err = Error;

    /// Parses a name, ignoring case (`mwcl` is `MWCL`).
    fn from_str(s: &str) -> Result<Self, Error> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| Error::UnknownWorkload { name: s.to_owned() })
    }
}

/// The private directory of worker `id` below `dir`.
fn worker_dir(dir: &Path, id: usize) -> std::path::PathBuf {
    dir.join(format!("w{id}"))
}

/// Makes `path` and its parents, naming it on failure.
fn make_dir(fs: &dyn Backend, path: &Path) -> Result<(), OpFailure> {
    fs.create_dir_all(path)
        .map_err(|e| OpFailure::new("create directory", path, e))
}

/// Makes an empty file, naming it on failure.
fn make_file(fs: &dyn Backend, path: &Path) -> Result<(), OpFailure> {
    fs.create_file(path)
        .map_err(|e| OpFailure::new("create", path, e))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::backend::DirBackend;
    use crate::error::chain;

    /// A dir backend on a fresh temporary directory.
    pub(crate) fn scratch() -> (tempfile::TempDir, DirBackend) {
        let tmp = crate::testing::tempdir();
        let fs = DirBackend::open("dir:scratch", tmp.path()).unwrap();
        (tmp, fs)
    }

    /// Prepares every worker for `n` operations and performs them.
    pub(crate) fn steps(fs: &dyn Backend, workers: &mut [Box<dyn Worker>], n: u64) {
        for w in workers {
            assert_eq!(w.prepare(fs, n).unwrap(), n);
            for _ in 0..n {
                w.step(fs).unwrap();
            }
        }
    }

    /// The names in a directory, sorted.
    pub(crate) fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn names_round_trip_ignoring_case() {
        for w in Workload::ALL {
            assert_eq!(w.name().parse::<Workload>().unwrap(), w);
            assert_eq!(w.name().to_lowercase().parse::<Workload>().unwrap(), w);
            assert_eq!(w.to_string(), w.name());
        }
    }

    #[test]
    fn descriptions_quote_the_sizes_in_use() {
        let mrpm = Workload::Mrpm.description();
        assert!(
            mrpm.contains(&format!("({} files)", stat::LEAVES)),
            "{mrpm}"
        );
        let mwul = Workload::Mwul.description();
        assert!(
            mwul.contains(&format!("batches of {}", unlink::BATCH)),
            "{mwul}"
        );
    }

    #[test]
    fn an_unknown_name_lists_the_known_ones() {
        let err = "MWXX".parse::<Workload>().unwrap_err();
        assert_eq!(
            chain(&err),
            "unknown workload `MWXX` (expected one of MWCL, MWCM, MRPL, MRPM, MWUL, MWRL)"
        );
    }
}
