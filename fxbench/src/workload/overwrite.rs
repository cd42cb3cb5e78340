//! DWOL, DWOM, DWSL and RNDWR: each worker overwrites one block per
//! operation (`pwrite`), through a read-write handle it opened in setup;
//! the file never grows.
//!
//! DWOL overwrites block 0 of the worker's own one-block file `wN/file`.
//! DWOM overwrites block N of one file, `shared`, of one block per worker,
//! each worker through a handle of its own (FxMark spaces its workers 8 MiB
//! apart in that file; here they are adjacent blocks). DWSL is DWOL with an
//! `fsync` after every write, the pair one operation, as FxMark's DWSL
//! (`pwrite` at 0 then `fsync`, on a one-block file). RNDWR overwrites
//! blocks picked by the worker's own [`XorShift64`](crate::rng::XorShift64),
//! seeded by its worker number, of its own file of `--file-size` bytes.
//! Every file is written in full and synced in setup, untimed.
//!
//! Each write carries the worker's operation counter in its first 8 bytes
//! (see [`super::block`]).

use std::path::{Path, PathBuf};

use super::block::{self, Place};
use crate::backend::{Backend, FileHandle, OpenOptions};
use crate::error::OpFailure;
use crate::harness::Worker;

/// DWOL: block 0 of a one-block private file per worker.
pub(super) fn private_block(
    fs: &dyn Backend,
    dir: &Path,
    threads: usize,
) -> Result<Vec<Box<dyn Worker>>, OpFailure> {
    private_blocks(fs, dir, threads, false)
}

/// DWSL: DWOL, each write followed by an `fsync`.
pub(super) fn private_block_synced(
    fs: &dyn Backend,
    dir: &Path,
    threads: usize,
) -> Result<Vec<Box<dyn Worker>>, OpFailure> {
    private_blocks(fs, dir, threads, true)
}

fn private_blocks(
    fs: &dyn Backend,
    dir: &Path,
    threads: usize,
    fsync: bool,
) -> Result<Vec<Box<dyn Worker>>, OpFailure> {
    for id in 0..threads {
        block::private_file(fs, dir, id, 1)?;
    }
    (0..threads)
        .map(|id| private_block_worker(fs, dir, id, fsync))
        .collect()
}

/// DWOL's worker `id` (DWSL's with `fsync`), once setup made its file.
pub(super) fn private_block_worker(
    fs: &dyn Backend,
    dir: &Path,
    id: usize,
    fsync: bool,
) -> Result<Box<dyn Worker>, OpFailure> {
    Overwriter::boxed(fs, block::private_path(dir, id), Place::block(0), fsync)
}

/// DWOM: block N of a shared file of one block per worker.
pub(super) fn shared_file(
    fs: &dyn Backend,
    dir: &Path,
    threads: usize,
) -> Result<Vec<Box<dyn Worker>>, OpFailure> {
    block::shared_file(fs, dir, threads as u64)?;
    (0..threads)
        .map(|id| shared_file_worker(fs, dir, id))
        .collect()
}

/// DWOM's worker `id`, once setup made the shared file.
pub(super) fn shared_file_worker(
    fs: &dyn Backend,
    dir: &Path,
    id: usize,
) -> Result<Box<dyn Worker>, OpFailure> {
    let place = Place::block(id as u64);
    Overwriter::boxed(fs, block::shared_path(dir), place, false)
}

/// RNDWR: random blocks of a private file of `blocks` blocks per worker.
pub(super) fn random_blocks(
    fs: &dyn Backend,
    dir: &Path,
    threads: usize,
    blocks: u64,
) -> Result<Vec<Box<dyn Worker>>, OpFailure> {
    for id in 0..threads {
        block::private_file(fs, dir, id, blocks)?;
    }
    (0..threads)
        .map(|id| random_blocks_worker(fs, dir, id, blocks))
        .collect()
}

/// RNDWR's worker `id`, once setup made its file of `blocks` blocks.
pub(super) fn random_blocks_worker(
    fs: &dyn Backend,
    dir: &Path,
    id: usize,
    blocks: u64,
) -> Result<Box<dyn Worker>, OpFailure> {
    let place = Place::random(id as u64, blocks);
    Overwriter::boxed(fs, block::private_path(dir, id), place, false)
}

/// Overwrites a block at each step, and syncs the file if asked to.
struct Overwriter {
    file: Box<dyn FileHandle>,
    /// For failure messages.
    path: PathBuf,
    place: Place,
    fsync: bool,
    buf: Box<block::Buffer>,
    /// Operations done: the stamp of the next write.
    ops: u64,
}

impl Overwriter {
    fn boxed(
        fs: &dyn Backend,
        path: PathBuf,
        place: Place,
        fsync: bool,
    ) -> Result<Box<dyn Worker>, OpFailure> {
        Ok(Box::new(Overwriter {
            file: block::open(fs, &path, OpenOptions::READ_WRITE)?,
            path,
            place,
            fsync,
            buf: block::buffer(),
            ops: 0,
        }))
    }
}

impl Worker for Overwriter {
    fn step(&mut self, _: &dyn Backend) -> Result<(), OpFailure> {
        block::stamp(&mut self.buf, self.ops);
        let offset = self.place.next_offset();
        let n = self
            .file
            .write_at(&self.buf, offset)
            .map_err(|e| OpFailure::new("write", &self.path, e))?;
        block::whole("write", &self.path, n)?;
        if self.fsync {
            self.file
                .sync_all()
                .map_err(|e| OpFailure::new("fsync", &self.path, e))?;
        }
        self.ops += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::super::tests::{scratch, steps};
    use super::*;
    use crate::backend::DirBackend;

    #[test]
    fn dwol_leaves_the_last_stamp_in_block_0_of_each_file() {
        let (tmp, fs) = scratch();
        let mut workers = private_block(&fs, Path::new("run"), 2).unwrap();
        steps(&fs, &mut workers, 7);
        for w in ["w0", "w1"] {
            assert_eq!(
                block::stamps(&tmp.path().join("run").join(w).join("file")),
                [6]
            );
        }
    }

    #[test]
    fn dwom_workers_overwrite_only_their_own_block() {
        let (tmp, fs) = scratch();
        let mut workers = shared_file(&fs, Path::new("run"), 3).unwrap();
        let shared = tmp.path().join("run/shared");
        assert_eq!(block::stamps(&shared), [0, 1, 2]);
        assert_eq!(workers[1].prepare(&fs, 5).unwrap(), 5);
        for _ in 0..5 {
            workers[1].step(&fs).unwrap();
        }
        assert_eq!(block::stamps(&shared), [0, 4, 2]);
        steps(&fs, &mut workers, 10);
        assert_eq!(block::stamps(&shared), [9, 14, 9]);
    }

    #[test]
    fn rndwr_overwrites_blocks_in_place_without_growing_the_file() {
        let (tmp, fs) = scratch();
        let mut workers = random_blocks(&fs, Path::new("run"), 1, 8).unwrap();
        let file = tmp.path().join("run/w0/file");
        assert_eq!(block::stamps(&file), (0..8).collect::<Vec<_>>());
        steps(&fs, &mut workers, 200);
        let after = block::stamps(&file);
        assert_eq!(after.len(), 8);
        // Every block was hit at least once in 200 tries (1 - (7/8)^200), and
        // the last write stamped 199 somewhere.
        assert!(after.iter().all(|&s| s >= 8), "{after:?}");
        assert!(after.contains(&199), "{after:?}");
    }

    /// A dir backend whose files count their `fsync`s.
    #[derive(Debug)]
    struct CountingSync {
        dir: DirBackend,
        syncs: Arc<AtomicU64>,
    }

    #[derive(Debug)]
    struct CountedFile {
        file: Box<dyn FileHandle>,
        syncs: Arc<AtomicU64>,
    }

    impl FileHandle for CountedFile {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            self.file.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
            self.file.write_at(buf, offset)
        }
        fn append(&self, buf: &[u8]) -> io::Result<usize> {
            self.file.append(buf)
        }
        fn set_len(&self, size: u64) -> io::Result<()> {
            self.file.set_len(size)
        }
        fn sync_all(&self) -> io::Result<()> {
            self.syncs.fetch_add(1, Ordering::Relaxed);
            self.file.sync_all()
        }
        fn len(&self) -> io::Result<u64> {
            self.file.len()
        }
    }

    impl Backend for CountingSync {
        fn name(&self) -> &str {
            self.dir.name()
        }
        fn create_dir_all(&self, path: &Path) -> io::Result<()> {
            self.dir.create_dir_all(path)
        }
        fn create_file(&self, path: &Path) -> io::Result<()> {
            self.dir.create_file(path)
        }
        fn stat(&self, path: &Path) -> io::Result<()> {
            self.dir.stat(path)
        }
        fn remove_file(&self, path: &Path) -> io::Result<()> {
            self.dir.remove_file(path)
        }
        fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
            self.dir.rename(from, to)
        }
        fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
            self.dir.remove_dir_all(path)
        }
        fn open_file(&self, path: &Path, options: OpenOptions) -> io::Result<Box<dyn FileHandle>> {
            Ok(Box::new(CountedFile {
                file: self.dir.open_file(path, options)?,
                syncs: self.syncs.clone(),
            }))
        }
    }

    #[test]
    fn dwsl_syncs_after_every_write_and_dwol_never_does() {
        let (tmp, dir) = scratch();
        let fs = CountingSync {
            dir,
            syncs: Arc::default(),
        };
        let mut dwsl = private_block_synced(&fs, Path::new("s"), 2).unwrap();
        // Setup syncs each file it fills once.
        assert_eq!(fs.syncs.swap(0, Ordering::Relaxed), 2);
        steps(&fs, &mut dwsl, 5);
        assert_eq!(fs.syncs.swap(0, Ordering::Relaxed), 10);
        assert_eq!(block::stamps(&tmp.path().join("s/w1/file")), [4]);

        let mut dwol = private_block(&fs, Path::new("o"), 1).unwrap();
        fs.syncs.store(0, Ordering::Relaxed);
        steps(&fs, &mut dwol, 5);
        assert_eq!(fs.syncs.load(Ordering::Relaxed), 0);
    }
}
