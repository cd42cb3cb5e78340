//! The FxMark workloads (Min et al., "Understanding Manycore Scalability
//! of File Systems", USENIX ATC 2016) this crate implements, and two of
//! random I/O.
//!
//! A name reads as FxMark's: M (metadata) or D (data), then R or W (read or
//! write), then the operation (metadata: C create, P path resolution, U
//! unlink, R rename; data: B read a block, O overwrite, A append, S
//! overwrite and sync), then the sharing level (L low: each worker has its
//! own directory or file; M medium: workers share a directory or file, each
//! on its own names or blocks). RNDRD and RNDWR read and overwrite random
//! blocks of a private file.
//!
//! Data workloads move one 4 KiB block ([`BLOCK`]) per operation and set
//! up their files untimed; every block written carries a counter, so no
//! write is a no-op.

mod append;
mod block;
mod create;
mod overwrite;
mod read;
mod rename;
mod stat;
mod unlink;

pub(crate) use block::buffer;

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::backend::Backend;
use crate::error::{Error, OpFailure};
use crate::harness::Worker;

pub use block::BLOCK;

/// One workload.
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
    /// Read one block of a private file.
    Drbl,
    /// Read a private block of one shared file.
    Drbm,
    /// Overwrite one block of a private file.
    Dwol,
    /// Overwrite a private block of one shared file.
    Dwom,
    /// Append blocks to a private file; when it reaches
    /// [`Params::file_size`] it is truncated to 0, untimed, between rounds
    /// (only appends count).
    Dwal,
    /// Overwrite one block of a private file and `fsync` it.
    Dwsl,
    /// Read random blocks of a private file.
    Rndrd,
    /// Overwrite random blocks of a private file.
    Rndwr,
}

/// What sizes the workloads that take one use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Bytes in each worker's file for RNDRD and RNDWR, and the size at
    /// which DWAL empties its file: a positive multiple of [`BLOCK`].
    pub file_size: u64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            file_size: 256 << 20,
        }
    }
}

impl Params {
    /// Refuses sizes the workloads cannot use.
    pub fn check(&self) -> Result<(), Error> {
        let block = BLOCK as u64;
        if self.file_size < block || !self.file_size.is_multiple_of(block) {
            return Err(Error::BadParameter(format!(
                "--file-size must be a positive multiple of {BLOCK} bytes, not {}",
                self.file_size
            )));
        }
        Ok(())
    }

    /// [`Params::file_size`] in blocks.
    fn file_blocks(&self) -> u64 {
        self.file_size / BLOCK as u64
    }
}

impl Workload {
    /// Every workload, in the order `fxbench list` shows them.
    pub const ALL: [Workload; 14] = [
        Workload::Mwcl,
        Workload::Mwcm,
        Workload::Mrpl,
        Workload::Mrpm,
        Workload::Mwul,
        Workload::Mwrl,
        Workload::Drbl,
        Workload::Drbm,
        Workload::Dwol,
        Workload::Dwom,
        Workload::Dwal,
        Workload::Dwsl,
        Workload::Rndrd,
        Workload::Rndwr,
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
            Workload::Drbl => "DRBL",
            Workload::Drbm => "DRBM",
            Workload::Dwol => "DWOL",
            Workload::Dwom => "DWOM",
            Workload::Dwal => "DWAL",
            Workload::Dwsl => "DWSL",
            Workload::Rndrd => "RNDRD",
            Workload::Rndwr => "RNDWR",
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
            Workload::Drbl => "read block 0 (4 KiB) of a private file",
            Workload::Drbm => "read block N (4 KiB) of one shared file, worker N",
            Workload::Dwol => "overwrite block 0 (4 KiB) of a private file",
            Workload::Dwom => "overwrite block N (4 KiB) of one shared file, worker N",
            Workload::Dwal => {
                "append 4 KiB blocks to a private file, emptied untimed at --file-size (default 256M)"
            }
            Workload::Dwsl => "overwrite block 0 (4 KiB) of a private file, then fsync it",
            Workload::Rndrd => {
                "read random 4 KiB blocks of a private file of --file-size (default 256M), written untimed"
            }
            Workload::Rndwr => {
                "overwrite random 4 KiB blocks of a private file of --file-size (default 256M), written untimed"
            }
        }
    }

    /// Bytes one operation reads or writes, for a data workload.
    pub fn bytes_per_op(self) -> Option<u64> {
        match self {
            Workload::Mwcl
            | Workload::Mwcm
            | Workload::Mrpl
            | Workload::Mrpm
            | Workload::Mwul
            | Workload::Mwrl => None,
            Workload::Drbl
            | Workload::Drbm
            | Workload::Dwol
            | Workload::Dwom
            | Workload::Dwal
            | Workload::Dwsl
            | Workload::Rndrd
            | Workload::Rndwr => Some(BLOCK as u64),
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
        params: &Params,
    ) -> Result<Vec<Box<dyn Worker>>, OpFailure> {
        match self {
            Workload::Mwcl => create::private_dirs(fs, dir, threads),
            Workload::Mwcm => create::shared_dir(fs, dir, threads),
            Workload::Mrpl => stat::private_paths(fs, dir, threads),
            Workload::Mrpm => stat::shared_tree(fs, dir, threads),
            Workload::Mwul => unlink::private_dirs(fs, dir, threads),
            Workload::Mwrl => rename::private_dirs(fs, dir, threads),
            Workload::Drbl => read::private_block(fs, dir, threads),
            Workload::Drbm => read::shared_file(fs, dir, threads),
            Workload::Dwol => overwrite::private_block(fs, dir, threads),
            Workload::Dwom => overwrite::shared_file(fs, dir, threads),
            Workload::Dwal => append::private_files(fs, dir, threads, params.file_blocks()),
            Workload::Dwsl => overwrite::private_block_synced(fs, dir, threads),
            Workload::Rndrd => read::random_blocks(fs, dir, threads, params.file_blocks()),
            Workload::Rndwr => overwrite::random_blocks(fs, dir, threads, params.file_blocks()),
        }
    }
}

impl Workload {
    /// Worker `id` of a run whose [`Workload::setup`] has made what the
    /// workload needs in `dir` already, perhaps in another process: what
    /// a worker process runs (`--workers process`). It makes nothing but
    /// what the worker itself makes (DWAL's file, on its first open), and
    /// opens the files it uses.
    pub fn worker(
        self,
        fs: &dyn Backend,
        dir: &Path,
        id: usize,
        params: &Params,
    ) -> Result<Box<dyn Worker>, OpFailure> {
        Ok(match self {
            Workload::Mwcl => create::private_dir_worker(dir, id),
            Workload::Mwcm => create::shared_dir_worker(dir, id),
            Workload::Mrpl => stat::private_path_worker(dir, id),
            Workload::Mrpm => stat::shared_tree_worker(dir, id),
            Workload::Mwul => unlink::private_dir_worker(dir, id),
            Workload::Mwrl => rename::private_dir_worker(dir, id),
            Workload::Drbl => read::private_block_worker(fs, dir, id)?,
            Workload::Drbm => read::shared_file_worker(fs, dir, id)?,
            Workload::Dwol => overwrite::private_block_worker(fs, dir, id, false)?,
            Workload::Dwom => overwrite::shared_file_worker(fs, dir, id)?,
            Workload::Dwal => append::private_file_worker(fs, dir, id, params.file_blocks())?,
            Workload::Dwsl => overwrite::private_block_worker(fs, dir, id, true)?,
            Workload::Rndrd => read::random_blocks_worker(fs, dir, id, params.file_blocks())?,
            Workload::Rndwr => overwrite::random_blocks_worker(fs, dir, id, params.file_blocks())?,
        })
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

    /// Every file below `dir` with its bytes, and every directory, by
    /// path relative to `dir`.
    fn tree(dir: &Path) -> Vec<(String, Option<Vec<u8>>)> {
        let mut out = Vec::new();
        let mut todo = vec![dir.to_owned()];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let path = e.unwrap().path();
                let name = path.strip_prefix(dir).unwrap().display().to_string();
                if path.is_dir() {
                    todo.push(path);
                    out.push((name, None));
                } else {
                    out.push((name, Some(std::fs::read(&path).unwrap())));
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn workers_made_apart_from_setup_do_what_setups_own_would() {
        // Setup's workers, and workers made by `worker` after a setup
        // whose own were dropped unused (as a worker process makes its
        // own), take the same steps and leave the same tree.
        let params = Params {
            file_size: 8 * BLOCK as u64,
        };
        for w in Workload::ALL {
            let (tmp, fs) = scratch();
            let (a, b) = (Path::new("a"), Path::new("b"));
            let mut together = w.setup(&fs, a, 2, &params).unwrap();
            steps(&fs, &mut together, 3);
            drop(together);
            drop(w.setup(&fs, b, 2, &params).unwrap());
            let mut apart: Vec<_> = (0..2)
                .map(|id| w.worker(&fs, b, id, &params).unwrap())
                .collect();
            steps(&fs, &mut apart, 3);
            drop(apart);
            let tree_a = tree(&tmp.path().join(a));
            assert!(!tree_a.is_empty(), "{w}");
            assert!(tree_a == tree(&tmp.path().join(b)), "{w}");
        }
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
            "unknown workload `MWXX` (expected one of MWCL, MWCM, MRPL, MRPM, MWUL, MWRL, \
             DRBL, DRBM, DWOL, DWOM, DWAL, DWSL, RNDRD, RNDWR)"
        );
    }

    #[test]
    fn data_workloads_and_only_they_move_a_block_per_operation() {
        for w in Workload::ALL {
            let data = !w.name().starts_with('M');
            assert_eq!(w.bytes_per_op().is_some(), data, "{w}");
            if data {
                assert_eq!(w.bytes_per_op(), Some(4096), "{w}");
            }
        }
    }

    #[test]
    fn the_default_file_size_is_256_mib_and_the_description_says_so() {
        assert_eq!(Params::default().file_size, 256 << 20);
        for w in [Workload::Dwal, Workload::Rndrd, Workload::Rndwr] {
            assert!(w.description().contains("256M"), "{w}");
        }
    }

    #[test]
    fn file_sizes_must_be_whole_blocks() {
        for bad in [0, 1, 4095, 4097, 3 * 4096 + 1] {
            let err = Params { file_size: bad }.check().unwrap_err();
            assert!(
                chain(&err).contains("--file-size must be a positive multiple of 4096"),
                "{bad}"
            );
        }
        for good in [4096, 8192, 256 << 20] {
            Params { file_size: good }.check().unwrap();
        }
    }
}
