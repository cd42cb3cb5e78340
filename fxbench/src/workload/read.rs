//! DRBL, DRBM and RNDRD: each worker reads one block per operation
//! (`pread`), through a read-only handle it opened in setup.
//!
//! DRBL reads block 0 of the worker's own one-block file `wN/file`. DRBM
//! reads block N of one file, `shared`, of one block per worker, each
//! worker through a handle of its own (FxMark spaces its workers 8 MiB
//! apart in that file; here they are adjacent blocks). RNDRD reads blocks
//! picked by the worker's own [`XorShift64`](crate::rng::XorShift64),
//! seeded by its worker number, of its own file of `--file-size` bytes.
//! Every file is written in full and synced in setup, untimed.
//!
//! A read is checked only for its length; its bytes land in the worker's
//! buffer and are not looked at.

use std::path::{Path, PathBuf};

use super::block::{self, Place};
use crate::backend::{Backend, FileHandle, OpenOptions};
use crate::error::OpFailure;
use crate::harness::Worker;

/// DRBL: block 0 of a one-block private file per worker.
pub(super) fn private_block(
    fs: &dyn Backend,
    dir: &Path,
    threads: usize,
) -> Result<Vec<Box<dyn Worker>>, OpFailure> {
    for id in 0..threads {
        block::private_file(fs, dir, id, 1)?;
    }
    (0..threads)
        .map(|id| private_block_worker(fs, dir, id))
        .collect()
}

/// DRBL's worker `id`, once setup made its file.
pub(super) fn private_block_worker(
    fs: &dyn Backend,
    dir: &Path,
    id: usize,
) -> Result<Box<dyn Worker>, OpFailure> {
    Reader::boxed(fs, block::private_path(dir, id), Place::block(0))
}

/// DRBM: block N of a shared file of one block per worker.
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

/// DRBM's worker `id`, once setup made the shared file.
pub(super) fn shared_file_worker(
    fs: &dyn Backend,
    dir: &Path,
    id: usize,
) -> Result<Box<dyn Worker>, OpFailure> {
    Reader::boxed(fs, block::shared_path(dir), Place::block(id as u64))
}

/// RNDRD: random blocks of a private file of `blocks` blocks per worker.
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

/// RNDRD's worker `id`, once setup made its file of `blocks` blocks.
pub(super) fn random_blocks_worker(
    fs: &dyn Backend,
    dir: &Path,
    id: usize,
    blocks: u64,
) -> Result<Box<dyn Worker>, OpFailure> {
    let place = Place::random(id as u64, blocks);
    Reader::boxed(fs, block::private_path(dir, id), place)
}

/// Reads a block at each step.
struct Reader {
    file: Box<dyn FileHandle>,
    /// For failure messages.
    path: PathBuf,
    place: Place,
    buf: Box<block::Buffer>,
}

impl Reader {
    fn new(fs: &dyn Backend, path: PathBuf, place: Place) -> Result<Reader, OpFailure> {
        Ok(Reader {
            file: block::open(fs, &path, OpenOptions::READ)?,
            path,
            place,
            buf: block::buffer(),
        })
    }

    fn boxed(fs: &dyn Backend, path: PathBuf, place: Place) -> Result<Box<dyn Worker>, OpFailure> {
        Ok(Box::new(Reader::new(fs, path, place)?))
    }
}

impl Worker for Reader {
    fn step(&mut self, _: &dyn Backend) -> Result<(), OpFailure> {
        let offset = self.place.next_offset();
        let n = self
            .file
            .read_at(&mut self.buf, offset)
            .map_err(|e| OpFailure::new("read", &self.path, e))?;
        block::whole("read", &self.path, n)?;
        // The bytes were copied out; that they are never looked at must not
        // let the compiler drop anything.
        std::hint::black_box(&self.buf);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{scratch, steps};
    use super::*;
    use crate::workload::BLOCK;

    #[test]
    fn drbl_reads_block_0_of_each_workers_own_file() {
        let (tmp, fs) = scratch();
        let mut workers = private_block(&fs, Path::new("run"), 2).unwrap();
        for w in ["w0", "w1"] {
            let len = std::fs::metadata(tmp.path().join("run").join(w).join("file"))
                .unwrap()
                .len();
            assert_eq!(len, BLOCK as u64);
        }
        steps(&fs, &mut workers, 10);
        let mut reader = Reader::new(&fs, "run/w1/file".into(), Place::block(0)).unwrap();
        reader.step(&fs).unwrap();
        assert_eq!(block::stamp_of(&reader.buf), 0);
    }

    #[test]
    fn drbm_workers_read_their_own_block_of_one_file() {
        let (tmp, fs) = scratch();
        let mut workers = shared_file(&fs, Path::new("run"), 3).unwrap();
        let len = std::fs::metadata(tmp.path().join("run/shared"))
            .unwrap()
            .len();
        assert_eq!(len, 3 * BLOCK as u64);
        steps(&fs, &mut workers, 10);
        let mut reader = Reader::new(&fs, "run/shared".into(), Place::block(2)).unwrap();
        reader.step(&fs).unwrap();
        assert_eq!(block::stamp_of(&reader.buf), 2);
    }

    #[test]
    fn rndrd_reads_blocks_all_over_its_file() {
        let (tmp, fs) = scratch();
        let mut workers = random_blocks(&fs, Path::new("run"), 2, 16).unwrap();
        let len = std::fs::metadata(tmp.path().join("run/w0/file"))
            .unwrap()
            .len();
        assert_eq!(len, 16 * BLOCK as u64);
        steps(&fs, &mut workers, 50);
        let place = Place::random(0, 16);
        let mut reader = Reader::new(&fs, "run/w0/file".into(), place.clone()).unwrap();
        let mut expected = place;
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..100 {
            reader.step(&fs).unwrap();
            let index = expected.next_offset() / BLOCK as u64;
            assert_eq!(block::stamp_of(&reader.buf), index);
            seen.insert(index);
        }
        assert!(seen.len() > 8, "{seen:?}");
    }

    #[test]
    fn a_short_read_fails_naming_the_file() {
        let (tmp, fs) = scratch();
        let mut workers = private_block(&fs, Path::new("run"), 1).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(tmp.path().join("run/w0/file"))
            .unwrap()
            .set_len(10)
            .unwrap();
        let err = workers[0].step(&fs).unwrap_err();
        assert_eq!(
            (err.op, err.path.as_path()),
            ("read", Path::new("run/w0/file"))
        );
        assert_eq!(err.source.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
