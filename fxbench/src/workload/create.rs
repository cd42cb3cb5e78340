//! MWCL and MWCM: create empty files under fresh, counter-based names,
//! each worker in its own directory (MWCL) or all in one (MWCM).

use std::fmt::Write as _;
use std::path::Path;

use super::{make_dir, make_file, worker_dir};
use crate::backend::Backend;
use crate::error::OpFailure;
use crate::harness::Worker;

/// MWCL: worker N creates `wN/0`, `wN/1`, ...
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

/// MWCL's worker `id`, once setup made its directory.
pub(super) fn private_dir_worker(dir: &Path, id: usize) -> Box<dyn Worker> {
    Box::new(Creator::new(&worker_dir(dir, id), ""))
}

/// MWCM: worker N creates `shared/wN-0`, `shared/wN-1`, ...
pub(super) fn shared_dir(
    fs: &dyn Backend,
    dir: &Path,
    threads: usize,
) -> Result<Vec<Box<dyn Worker>>, OpFailure> {
    make_dir(fs, &dir.join("shared"))?;
    Ok((0..threads).map(|id| shared_dir_worker(dir, id)).collect())
}

/// MWCM's worker `id`, once setup made the shared directory.
pub(super) fn shared_dir_worker(dir: &Path, id: usize) -> Box<dyn Worker> {
    Box::new(Creator::new(&dir.join("shared"), &format!("w{id}-")))
}

/// Creates `<dir>/<prefix><n>` for n = 0, 1, ...
struct Creator {
    /// The path being built: `<dir>/<prefix>` then the counter.
    path: String,
    /// Length of `path` without the counter.
    stem: usize,
    next: u64,
}

impl Creator {
    fn new(dir: &Path, prefix: &str) -> Self {
        let path = format!("{}/{prefix}", dir.display());
        Creator {
            stem: path.len(),
            path,
            next: 0,
        }
    }
}

impl Worker for Creator {
    fn step(&mut self, fs: &dyn Backend) -> Result<(), OpFailure> {
        // Reusing one buffer keeps allocation out of the timed loop.
        self.path.truncate(self.stem);
        let _ = write!(self.path, "{}", self.next);
        make_file(fs, Path::new(&self.path))?;
        self.next += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{names_in, scratch, steps};
    use super::*;

    #[test]
    fn mwcl_workers_create_fresh_names_in_their_own_directories() {
        let (tmp, fs) = scratch();
        let mut workers = private_dirs(&fs, Path::new("run"), 2).unwrap();
        steps(&fs, &mut workers, 3);
        assert_eq!(names_in(&tmp.path().join("run")), ["w0", "w1"]);
        for w in ["w0", "w1"] {
            assert_eq!(names_in(&tmp.path().join("run").join(w)), ["0", "1", "2"]);
        }
    }

    #[test]
    fn mwcm_workers_create_unique_names_in_one_directory() {
        let (tmp, fs) = scratch();
        let mut workers = shared_dir(&fs, Path::new("run"), 2).unwrap();
        steps(&fs, &mut workers, 2);
        assert_eq!(
            names_in(&tmp.path().join("run/shared")),
            ["w0-0", "w0-1", "w1-0", "w1-1"]
        );
    }

    #[test]
    fn a_create_failure_names_the_path() {
        let (_tmp, fs) = scratch();
        let mut workers = private_dirs(&fs, Path::new("run"), 1).unwrap();
        fs.create_file(Path::new("run/w0/0")).unwrap();
        let err = workers[0].step(&fs).unwrap_err();
        assert_eq!(err.op, "create");
        assert_eq!(err.path, Path::new("run/w0/0"));
        assert_eq!(err.source.kind(), std::io::ErrorKind::AlreadyExists);
    }
}
