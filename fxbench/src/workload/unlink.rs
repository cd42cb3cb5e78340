//! MWUL: each worker unlinks files in its own directory.
//!
//! Unlinking consumes files, and a time-bounded run cannot know how many it
//! will consume, so files are made in rounds: before each round every
//! worker creates up to [`BATCH`] files, untimed; the round then unlinks
//! them, timed, until the batch is gone or the time is up, and the next
//! round begins. Only the unlinks and their wall time are counted (see
//! [`crate::harness`]). Names count up across rounds (`wN/0`, `wN/1`, ...),
//! so a batch never meets a leftover of the one before.

use std::fmt::Write as _;
use std::path::Path;

use super::{make_dir, make_file, worker_dir};
use crate::backend::Backend;
use crate::error::OpFailure;
use crate::harness::Worker;

/// Files each worker creates, untimed, before each round.
pub(super) const BATCH: u64 = 10_000;

/// MWUL: one private directory per worker.
pub(super) fn private_dirs(
    fs: &dyn Backend,
    dir: &Path,
    threads: usize,
) -> Result<Vec<Box<dyn Worker>>, OpFailure> {
    for id in 0..threads {
        make_dir(fs, &worker_dir(dir, id))?;
    }
    Ok((0..threads).map(|id| private_dir_worker(dir, id)).collect())
}

/// MWUL's worker `id`, once setup made its directory.
pub(super) fn private_dir_worker(dir: &Path, id: usize) -> Box<dyn Worker> {
    let path = format!("{}/", worker_dir(dir, id).display());
    Box::new(Unlinker {
        stem: path.len(),
        path,
        made: 0,
        removed: 0,
    })
}

/// Unlinks `<dir>/<n>` for n = 0, 1, ..., having made them in batches.
struct Unlinker {
    /// The path being built: `<dir>/` then the counter.
    path: String,
    /// Length of `path` without the counter.
    stem: usize,
    /// Files made so far: names `0..made`.
    made: u64,
    /// Files unlinked so far: names `0..removed`.
    removed: u64,
}

impl Unlinker {
    fn name(&mut self, n: u64) -> &Path {
        self.path.truncate(self.stem);
        let _ = write!(self.path, "{n}");
        Path::new(&self.path)
    }
}

impl Worker for Unlinker {
    fn prepare(&mut self, fs: &dyn Backend, limit: u64) -> Result<u64, OpFailure> {
        // Start from the first file not unlinked: a round cut short by the
        // clock may leave some of its batch behind.
        let batch = limit.min(BATCH);
        let want = self.removed + batch;
        while self.made < want {
            let n = self.made;
            make_file(fs, self.name(n))?;
            self.made += 1;
        }
        Ok(batch)
    }

    fn step(&mut self, fs: &dyn Backend) -> Result<(), OpFailure> {
        let n = self.removed;
        let path = self.name(n);
        fs.remove_file(path)
            .map_err(|e| OpFailure::new("unlink", path, e))?;
        self.removed += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{names_in, scratch};
    use super::*;

    #[test]
    fn each_round_makes_a_batch_and_steps_unlink_it() {
        let (tmp, fs) = scratch();
        let mut workers = private_dirs(&fs, Path::new("run"), 1).unwrap();
        let w = &mut workers[0];
        assert_eq!(w.prepare(&fs, 3).unwrap(), 3);
        assert_eq!(names_in(&tmp.path().join("run/w0")), ["0", "1", "2"]);
        w.step(&fs).unwrap();
        w.step(&fs).unwrap();
        assert_eq!(names_in(&tmp.path().join("run/w0")), ["2"]);
        w.step(&fs).unwrap();
        assert_eq!(w.step(&fs).unwrap_err().op, "unlink");

        assert_eq!(w.prepare(&fs, 2).unwrap(), 2);
        assert_eq!(names_in(&tmp.path().join("run/w0")), ["3", "4"]);
    }

    #[test]
    fn a_round_cut_short_leaves_files_the_next_one_reuses() {
        let (tmp, fs) = scratch();
        let mut workers = private_dirs(&fs, Path::new("run"), 1).unwrap();
        let w = &mut workers[0];
        w.prepare(&fs, 3).unwrap();
        w.step(&fs).unwrap();
        // Cut short after one unlink; the next round of 3 makes one more.
        assert_eq!(w.prepare(&fs, 3).unwrap(), 3);
        assert_eq!(names_in(&tmp.path().join("run/w0")), ["1", "2", "3"]);
    }

    #[test]
    fn a_batch_is_at_most_batch_files() {
        let (_tmp, fs) = scratch();
        let mut workers = private_dirs(&fs, Path::new("run"), 1).unwrap();
        assert_eq!(workers[0].prepare(&fs, 0).unwrap(), 0);
        assert_eq!(workers[0].prepare(&fs, u64::MAX).unwrap(), BATCH);
    }
}
