//! MWRL: each worker renames one file back and forth in its own directory,
//! `wN/a` -> `wN/b` -> `wN/a` ...

use std::path::{Path, PathBuf};

use super::{make_dir, make_file, worker_dir};
use crate::backend::Backend;
use crate::error::OpFailure;
use crate::harness::Worker;

/// MWRL: one private directory holding `a` per worker.
pub(super) fn private_dirs(
    fs: &dyn Backend,
    dir: &Path,
    threads: usize,
) -> Result<Vec<Box<dyn Worker>>, OpFailure> {
    for id in 0..threads {
        let own = worker_dir(dir, id);
        make_dir(fs, &own)?;
        make_file(fs, &own.join("a"))?;
    }
    Ok((0..threads).map(|id| private_dir_worker(dir, id)).collect())
}

/// MWRL's worker `id`, once setup made its directory and file.
pub(super) fn private_dir_worker(dir: &Path, id: usize) -> Box<dyn Worker> {
    let own = worker_dir(dir, id);
    Box::new(Renamer {
        here: own.join("a"),
        there: own.join("b"),
    })
}

/// Renames `here` to `there`, then swaps the two.
struct Renamer {
    here: PathBuf,
    there: PathBuf,
}

impl Worker for Renamer {
    fn step(&mut self, fs: &dyn Backend) -> Result<(), OpFailure> {
        fs.rename(&self.here, &self.there)
            .map_err(|e| OpFailure::new("rename", &self.here, e))?;
        std::mem::swap(&mut self.here, &mut self.there);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{names_in, scratch};
    use super::*;

    #[test]
    fn the_file_goes_back_and_forth() {
        let (tmp, fs) = scratch();
        let mut workers = private_dirs(&fs, Path::new("run"), 2).unwrap();
        let w1 = tmp.path().join("run/w1");
        assert_eq!(names_in(&w1), ["a"]);
        workers[1].step(&fs).unwrap();
        assert_eq!(names_in(&w1), ["b"]);
        workers[1].step(&fs).unwrap();
        assert_eq!(names_in(&w1), ["a"]);
        assert_eq!(names_in(&tmp.path().join("run/w0")), ["a"]);
    }
}
