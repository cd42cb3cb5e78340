//! MRPL and MRPM: path resolution, measured by `stat`.
//!
//! MRPL gives each worker its own file five components deep,
//! `wN/d1/d2/d3/d4/file`, and stats it over and over.
//!
//! MRPM shares one tree among all workers: directories at levels 1 to 4
//! with [`FANOUT`] children each, and [`FANOUT`] files in every level-4
//! directory, so [`LEAVES`] = 8^5 = 32768 files at depth 5
//! (`tree/3/0/7/1/5`) below 4680 directories. Each worker stats leaves
//! picked by its own [`XorShift64`], seeded by its worker number, so every
//! run makes the same picks. Setup (about 37,000 creations, single-threaded)
//! takes a fraction of a second on tmpfs.

use std::path::{Path, PathBuf};

use super::{make_dir, make_file, worker_dir};
use crate::backend::Backend;
use crate::error::OpFailure;
use crate::harness::Worker;
use crate::rng::XorShift64;

/// Children per directory in the MRPM tree.
pub(super) const FANOUT: u64 = 8;
/// Levels of the MRPM tree, the last being files.
pub(super) const DEPTH: u32 = 5;
/// Files in the MRPM tree.
pub(super) const LEAVES: u64 = FANOUT.pow(DEPTH);

/// MRPL: one private 5-deep file per worker.
pub(super) fn private_paths(
    fs: &dyn Backend,
    dir: &Path,
    threads: usize,
) -> Result<Vec<Box<dyn Worker>>, OpFailure> {
    for id in 0..threads {
        let file = private_path(dir, id);
        make_dir(fs, file.parent().unwrap_or(dir))?;
        make_file(fs, &file)?;
    }
    Ok((0..threads)
        .map(|id| private_path_worker(dir, id))
        .collect())
}

/// Worker `id`'s file in MRPL.
fn private_path(dir: &Path, id: usize) -> PathBuf {
    worker_dir(dir, id).join("d1/d2/d3/d4/file")
}

/// MRPL's worker `id`, once setup made its file.
pub(super) fn private_path_worker(dir: &Path, id: usize) -> Box<dyn Worker> {
    Box::new(StatOne {
        file: private_path(dir, id),
    })
}

/// Stats one path.
struct StatOne {
    file: PathBuf,
}

impl Worker for StatOne {
    fn step(&mut self, fs: &dyn Backend) -> Result<(), OpFailure> {
        fs.stat(&self.file)
            .map_err(|e| OpFailure::new("stat", &self.file, e))
    }
}

/// MRPM: the shared tree, and a worker per thread picking its leaves.
pub(super) fn shared_tree(
    fs: &dyn Backend,
    dir: &Path,
    threads: usize,
) -> Result<Vec<Box<dyn Worker>>, OpFailure> {
    let root = tree_root(dir);
    let mut path = String::new();
    for parent in 0..LEAVES / FANOUT {
        leaf_path(&mut path, &root, parent * FANOUT);
        let (parent_dir, _) = path.rsplit_once('/').unwrap_or((&path, ""));
        make_dir(fs, Path::new(parent_dir))?;
        for leaf in parent * FANOUT..(parent + 1) * FANOUT {
            leaf_path(&mut path, &root, leaf);
            make_file(fs, Path::new(&path))?;
        }
    }
    Ok((0..threads).map(|id| shared_tree_worker(dir, id)).collect())
}

/// Where MRPM's tree is.
fn tree_root(dir: &Path) -> String {
    dir.join("tree").to_string_lossy().into_owned()
}

/// MRPM's worker `id`, once setup made the tree.
pub(super) fn shared_tree_worker(dir: &Path, id: usize) -> Box<dyn Worker> {
    Box::new(StatRandom {
        root: tree_root(dir),
        rng: XorShift64::new(id as u64),
        path: String::new(),
    })
}

/// Writes the path of leaf `index` into `out`: its base-[`FANOUT`] digits,
/// most significant first, one per level (`root/3/0/7/1/5`).
fn leaf_path(out: &mut String, root: &str, index: u64) {
    out.clear();
    out.push_str(root);
    for level in (0..DEPTH).rev() {
        let digit = index / FANOUT.pow(level) % FANOUT;
        out.push('/');
        // One digit, since FANOUT <= 10.
        out.push(char::from(b'0' + digit as u8));
    }
}

/// Stats leaves of the shared tree at random.
struct StatRandom {
    root: String,
    rng: XorShift64,
    /// Reused so the timed loop does not allocate.
    path: String,
}

impl Worker for StatRandom {
    fn step(&mut self, fs: &dyn Backend) -> Result<(), OpFailure> {
        leaf_path(&mut self.path, &self.root, self.rng.below(LEAVES));
        let path = Path::new(&self.path);
        fs.stat(path).map_err(|e| OpFailure::new("stat", path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{scratch, steps};
    use super::*;

    const _: () = assert!(FANOUT <= 10, "leaf_path writes one digit per level");

    #[test]
    fn leaf_paths_spell_the_index_in_base_fanout() {
        let mut p = String::new();
        leaf_path(&mut p, "run/tree", 0);
        assert_eq!(p, "run/tree/0/0/0/0/0");
        leaf_path(&mut p, "run/tree", 0o30715);
        assert_eq!(p, "run/tree/3/0/7/1/5");
        leaf_path(&mut p, "run/tree", LEAVES - 1);
        assert_eq!(p, "run/tree/7/7/7/7/7");
    }

    #[test]
    fn mrpl_stats_each_workers_own_deep_file() {
        let (tmp, fs) = scratch();
        let mut workers = private_paths(&fs, Path::new("run"), 2).unwrap();
        assert!(tmp.path().join("run/w1/d1/d2/d3/d4/file").is_file());
        steps(&fs, &mut workers, 10);
        fs.remove_file(Path::new("run/w1/d1/d2/d3/d4/file"))
            .unwrap();
        workers[0].step(&fs).unwrap();
        let err = workers[1].step(&fs).unwrap_err();
        assert_eq!(err.path, Path::new("run/w1/d1/d2/d3/d4/file"));
    }

    #[test]
    fn mrpm_builds_the_whole_tree_and_stats_its_leaves() {
        let (tmp, fs) = scratch();
        let mut workers = shared_tree(&fs, Path::new("run"), 2).unwrap();
        let (mut dirs, mut files) = (0, 0);
        let mut todo = vec![tmp.path().join("run/tree")];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(d).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    dirs += 1;
                    todo.push(e.path());
                } else {
                    files += 1;
                }
            }
        }
        assert_eq!((dirs, files), (8 + 64 + 512 + 4096, LEAVES));
        steps(&fs, &mut workers, 1000);
    }
}
