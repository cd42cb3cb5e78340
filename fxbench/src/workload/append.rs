//! DWAL: each worker appends blocks to its own file `wN/file`, opened in
//! setup with `O_APPEND`, so every operation allocates a block (FxMark's
//! "block alloc" test).
//!
//! FxMark appends without bound; a long run on a RAM-backed file system
//! would fill memory, so the file is capped at `--file-size` (default
//! 256 MiB). Appends go in rounds (see [`crate::harness`]): before each
//! round a worker, untimed, empties its file if it has reached the cap
//! (`ftruncate` to 0, keeping the same file and handle) and offers as many
//! appends as fit below the cap; the round's appends are timed. Only
//! appends count as operations, and truncation is never timed. Each
//! appended block carries the worker's operation counter in its first 8
//! bytes (see [`super::block`]).

use std::path::{Path, PathBuf};

use super::block::{self, BLOCK};
use super::{make_dir, worker_dir};
use crate::backend::{Backend, FileHandle, OpenOptions};
use crate::error::OpFailure;
use crate::harness::Worker;

/// DWAL: a private file per worker, emptied at `cap` blocks.
pub(super) fn private_files(
    fs: &dyn Backend,
    dir: &Path,
    threads: usize,
    cap: u64,
) -> Result<Vec<Box<dyn Worker>>, OpFailure> {
    for id in 0..threads {
        make_dir(fs, &worker_dir(dir, id))?;
    }
    (0..threads)
        .map(|id| private_file_worker(fs, dir, id, cap))
        .collect()
}

/// DWAL's worker `id`, once setup made its directory: it opens (and
/// makes, the first time) its file.
pub(super) fn private_file_worker(
    fs: &dyn Backend,
    dir: &Path,
    id: usize,
    cap: u64,
) -> Result<Box<dyn Worker>, OpFailure> {
    let path = worker_dir(dir, id).join("file");
    Ok(Box::new(Appender {
        file: block::open(fs, &path, OpenOptions::APPEND)?,
        path,
        cap,
        buf: block::buffer(),
        ops: 0,
    }))
}

/// Appends a block at each step.
struct Appender {
    file: Box<dyn FileHandle>,
    /// For failure messages.
    path: PathBuf,
    /// Blocks the file may hold.
    cap: u64,
    buf: Box<block::Buffer>,
    /// Operations done: the stamp of the next block.
    ops: u64,
}

impl Worker for Appender {
    fn prepare(&mut self, _: &dyn Backend, limit: u64) -> Result<u64, OpFailure> {
        let len = self
            .file
            .len()
            .map_err(|e| OpFailure::new("stat", &self.path, e))?;
        let mut room = self.cap.saturating_sub(len / BLOCK as u64);
        if room == 0 {
            self.file
                .set_len(0)
                .map_err(|e| OpFailure::new("truncate", &self.path, e))?;
            room = self.cap;
        }
        Ok(room.min(limit))
    }

    fn step(&mut self, _: &dyn Backend) -> Result<(), OpFailure> {
        block::stamp(&mut self.buf, self.ops);
        let n = self
            .file
            .append(&self.buf)
            .map_err(|e| OpFailure::new("append", &self.path, e))?;
        block::whole("append", &self.path, n)?;
        self.ops += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::scratch;
    use super::*;
    use crate::harness::{self, Budget};

    #[test]
    fn appends_fill_the_file_up_to_the_cap_then_start_again_from_empty() {
        let (tmp, fs) = scratch();
        let mut workers = private_files(&fs, Path::new("run"), 1, 4).unwrap();
        let file = tmp.path().join("run/w0/file");
        let w = &mut workers[0];
        assert_eq!(w.prepare(&fs, 100).unwrap(), 4);
        for _ in 0..3 {
            w.step(&fs).unwrap();
        }
        assert_eq!(block::stamps(&file), [0, 1, 2]);
        // A round cut short: the next one offers what is left.
        assert_eq!(w.prepare(&fs, 100).unwrap(), 1);
        w.step(&fs).unwrap();
        assert_eq!(block::stamps(&file), [0, 1, 2, 3]);
        // Full: emptied, untimed, and offered whole again.
        assert_eq!(w.prepare(&fs, 2).unwrap(), 2);
        assert!(block::stamps(&file).is_empty());
        w.step(&fs).unwrap();
        assert_eq!(block::stamps(&file), [4]);
    }

    #[test]
    fn a_count_budget_counts_appends_across_truncations() {
        let (tmp, fs) = scratch();
        let mut workers = private_files(&fs, Path::new("run"), 2, 3).unwrap();
        let out = harness::run(&fs, &mut workers, Budget::Count(10)).unwrap();
        assert_eq!(out.ops, 20);
        // 10 appends with a cap of 3: 3, 3, 3, then 1 in a fresh file.
        for w in ["w0", "w1"] {
            assert_eq!(
                block::stamps(&tmp.path().join("run").join(w).join("file")),
                [9]
            );
        }
    }
}
