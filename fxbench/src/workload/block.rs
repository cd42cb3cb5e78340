//! Blocks: the unit every data workload reads or writes, where in its file
//! a worker's next block lies, and the files setup makes of them.
//!
//! Every block written carries something that changes, so that no layer
//! can skip a write as a no-op and a test can tell which write landed
//! where: setup stamps block `i` of a file with `i` in its first 8 bytes
//! (little-endian) and fills the rest with a byte that depends on `i`; a
//! timed write stamps the worker's operation counter into its first 8
//! bytes.

use std::io;
use std::path::{Path, PathBuf};

use super::{make_dir, worker_dir};
use crate::backend::{Backend, FileHandle, OpenOptions};
use crate::error::OpFailure;
use crate::rng::XorShift64;

/// Bytes in a block: what one data operation reads or writes.
pub const BLOCK: usize = 4096;

/// Blocks per write while setup fills a file: 1 MiB, so a 256 MiB file
/// takes 256 writes.
const FILL_CHUNK: usize = 256;

/// Where a worker's next block is.
#[derive(Debug, Clone)]
pub(super) enum Place {
    /// Always the same block, at this byte offset.
    Fixed(u64),
    /// A block picked at random among the first `blocks` of the file.
    Random { rng: XorShift64, blocks: u64 },
}

impl Place {
    /// Always block `index`.
    pub(super) fn block(index: u64) -> Place {
        Place::Fixed(index * BLOCK as u64)
    }

    /// Random blocks of a file of `blocks` blocks, in an order fixed by
    /// `seed`.
    pub(super) fn random(seed: u64, blocks: u64) -> Place {
        Place::Random {
            rng: XorShift64::new(seed),
            blocks,
        }
    }

    /// The byte offset of the next block.
    pub(super) fn next_offset(&mut self) -> u64 {
        match self {
            Place::Fixed(offset) => *offset,
            Place::Random { rng, blocks } => rng.below(*blocks) * BLOCK as u64,
        }
    }
}

/// A block-sized buffer that starts on a page, as the one an operation
/// reads into or writes from. Where a buffer starts matters: both the
/// kernel's copy to user memory and the C library's copy slow down two-
/// to fivefold on some CPUs (this machine's among them) when the
/// destination's place within a cache line differs from the source's,
/// and a heap buffer lands at a different place from run to run. Every
/// backend gets the same, page-aligned, place.
#[derive(Debug)]
#[repr(C, align(4096))]
pub(crate) struct Buffer([u8; BLOCK]);

impl std::ops::Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

/// A zeroed [`Buffer`].
pub(crate) fn buffer() -> Box<Buffer> {
    Box::new(Buffer([0; BLOCK]))
}

/// The byte a data file's block `index` is filled with past its stamp.
// The low byte of the index, mixed: dropping the rest is intended.
#[allow(clippy::cast_possible_truncation)]
fn fill_byte(index: u64) -> u8 {
    index as u8 ^ 0x5a
}

/// Writes `value` into the first 8 bytes of `block`.
pub(super) fn stamp(block: &mut [u8], value: u64) {
    block[..8].copy_from_slice(&value.to_le_bytes());
}

/// The value in the first 8 bytes of `block`.
#[cfg(test)]
pub(super) fn stamp_of(block: &[u8]) -> u64 {
    u64::from_le_bytes(block[..8].try_into().expect("a block has 8 bytes"))
}

/// The stamps of every block of the file at `path` (read through std).
#[cfg(test)]
pub(super) fn stamps(path: &Path) -> Vec<u64> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(BLOCK)
        .map(stamp_of)
        .collect()
}

/// Opens `path`, naming it on failure.
pub(super) fn open(
    fs: &dyn Backend,
    path: &Path,
    options: OpenOptions,
) -> Result<Box<dyn FileHandle>, OpFailure> {
    fs.open_file(path, options)
        .map_err(|e| OpFailure::new("open", path, e))
}

/// Fails unless `done` bytes are a whole block: one timed operation is one
/// call, so a short transfer is an error rather than something to retry.
pub(super) fn whole(op: &'static str, path: &Path, done: usize) -> Result<(), OpFailure> {
    if done == BLOCK {
        return Ok(());
    }
    let kind = if op == "read" {
        io::ErrorKind::UnexpectedEof
    } else {
        io::ErrorKind::WriteZero
    };
    let why = format!("{done} of {BLOCK} bytes transferred");
    Err(OpFailure::new(op, path, io::Error::new(kind, why)))
}

/// Makes `path` (new, or emptied) hold `blocks` stamped blocks, and syncs
/// it, so that the timed phase does not also pay for setup's writes.
pub(super) fn make_data_file(fs: &dyn Backend, path: &Path, blocks: u64) -> Result<(), OpFailure> {
    let file = open(fs, path, OpenOptions::CREATE)?;
    let mut chunk = vec![0u8; FILL_CHUNK * BLOCK];
    let mut next = 0;
    while next < blocks {
        let n = usize::try_from(blocks - next).map_or(FILL_CHUNK, |n| n.min(FILL_CHUNK));
        let bytes = &mut chunk[..n * BLOCK];
        for (index, block) in (next..).zip(bytes.chunks_exact_mut(BLOCK)) {
            block.fill(fill_byte(index));
            stamp(block, index);
        }
        write_all_at(file.as_ref(), bytes, next * BLOCK as u64)
            .map_err(|e| OpFailure::new("write", path, e))?;
        next += n as u64;
    }
    file.sync_all()
        .map_err(|e| OpFailure::new("fsync", path, e))
}

/// Makes worker `id`'s directory below `dir` and in it a file of `blocks`
/// stamped blocks; returns the file's path.
pub(super) fn private_file(
    fs: &dyn Backend,
    dir: &Path,
    id: usize,
    blocks: u64,
) -> Result<PathBuf, OpFailure> {
    let path = private_path(dir, id);
    make_dir(fs, path.parent().unwrap_or(dir))?;
    make_data_file(fs, &path, blocks)?;
    Ok(path)
}

/// Worker `id`'s own file below `dir`.
pub(super) fn private_path(dir: &Path, id: usize) -> PathBuf {
    worker_dir(dir, id).join("file")
}

/// The file all workers share below `dir`.
pub(super) fn shared_path(dir: &Path) -> PathBuf {
    dir.join("shared")
}

/// Makes `dir/shared`, a file of `blocks` stamped blocks for all workers;
/// returns its path.
pub(super) fn shared_file(fs: &dyn Backend, dir: &Path, blocks: u64) -> Result<PathBuf, OpFailure> {
    make_dir(fs, dir)?;
    let path = shared_path(dir);
    make_data_file(fs, &path, blocks)?;
    Ok(path)
}

/// Writes all of `buf` at `offset`, however many calls it takes.
fn write_all_at(file: &dyn FileHandle, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match file.write_at(buf, offset)? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => {
                buf = &buf[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::tests::scratch;
    use super::*;

    #[test]
    fn buffers_start_on_a_page_and_hold_a_block() {
        for _ in 0..4 {
            // A small allocation first, so that a heap buffer would land
            // off a page boundary.
            let _nudge = std::hint::black_box(Box::new([0u8; 24]));
            let b = buffer();
            assert_eq!(b.as_ptr() as usize % 4096, 0);
            assert_eq!(b.len(), BLOCK);
            assert!(b.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn data_files_hold_stamped_blocks_across_fill_chunks() {
        let (tmp, fs) = scratch();
        let blocks = FILL_CHUNK as u64 + 3;
        let path = private_file(&fs, Path::new("run"), 1, blocks).unwrap();
        assert_eq!(path, Path::new("run/w1/file"));
        let bytes = std::fs::read(tmp.path().join("run/w1/file")).unwrap();
        assert_eq!(bytes.len(), (FILL_CHUNK + 3) * BLOCK);
        for (i, block) in bytes.chunks_exact(BLOCK).enumerate() {
            assert_eq!(stamp_of(block), i as u64);
            assert!(
                block[8..].iter().all(|&b| b == fill_byte(i as u64)),
                "block {i}"
            );
        }
    }

    #[test]
    fn a_data_file_replaces_what_was_there() {
        let (tmp, fs) = scratch();
        std::fs::write(tmp.path().join("f"), vec![1u8; 3 * BLOCK]).unwrap();
        make_data_file(&fs, Path::new("f"), 1).unwrap();
        assert_eq!(std::fs::read(tmp.path().join("f")).unwrap().len(), BLOCK);
    }

    #[test]
    fn places_are_block_aligned_and_inside_the_file() {
        let mut fixed = Place::block(3);
        assert_eq!(fixed.next_offset(), 3 * 4096);
        assert_eq!(fixed.next_offset(), 3 * 4096);

        let mut random = Place::random(0, 5);
        let mut seen = [false; 5];
        for _ in 0..200 {
            let off = random.next_offset();
            assert_eq!(off % BLOCK as u64, 0);
            seen[usize::try_from(off / BLOCK as u64).unwrap()] = true;
        }
        assert_eq!(seen, [true; 5]);
    }

    #[test]
    fn a_short_transfer_is_a_failure_naming_the_file() {
        whole("read", Path::new("f"), BLOCK).unwrap();
        let err = whole("read", Path::new("f"), 100).unwrap_err();
        assert_eq!(err.path, Path::new("f"));
        assert_eq!(err.source.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(err.source.to_string(), "100 of 4096 bytes transferred");
        let err = whole("write", Path::new("f"), 0).unwrap_err();
        assert_eq!(err.source.kind(), io::ErrorKind::WriteZero);
    }
}
