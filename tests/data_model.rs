//! Model-based test of file data: random sequences of writes (positional,
//! through a seek, appending; at small offsets, past the end leaving
//! holes, past 4 GiB, near the largest file size), reads, truncations,
//! clean reopens and simulated crashes, on two files, run on KucoFS and on
//! a sparse in-memory model. Every result must match the model's; after a
//! reopen or a crash every write that returned must be there; at the end
//! the whole of both files matches and the image is fsck-clean.
//!
//! `PROPTEST_CASES` overrides the number of cases.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use kucofs::{Config, File, Fs, OpenOptions, Protection};
use kucofs_common::index::blockmap::MAX_FILE_SIZE;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

const PAGE: u64 = PAGE_LEN as u64;
const PAGE_LEN: usize = 4096;
const IMAGE_SIZE: u64 = 64 << 20;
const FILES: [&str; 2] = ["a", "d/b"];
/// Files up to this size are compared byte for byte; larger (sparse) ones
/// page by page wherever they were ever written, and at their ends.
const WHOLE_COMPARE_MAX: u64 = 8 << 20;

type Errno = i32;

/// A length or offset within data held in memory, as an index.
fn idx(x: u64) -> usize {
    usize::try_from(x).expect("bytes held in memory are indexed by a usize")
}

/// A sparse file: the pages that may hold non-zero bytes, and the size.
/// Bytes at or past `size` are always zero.
#[derive(Debug, Default)]
struct ModelFile {
    size: u64,
    pages: BTreeMap<u64, Box<[u8]>>,
    /// Every page ever written: after a shrink these must read as zeros
    /// (or not at all), whatever they held before.
    touched: BTreeSet<u64>,
}

impl ModelFile {
    fn write(&mut self, at: u64, data: &[u8]) -> Result<usize, Errno> {
        let end = at
            .checked_add(data.len() as u64)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(libc::EFBIG)?;
        if data.is_empty() {
            return Ok(0);
        }
        let mut p = at;
        while p < end {
            let (page, o) = (p / PAGE, (p % PAGE) as usize);
            let n = (PAGE_LEN - o).min(idx(end - p));
            let src = &data[idx(p - at)..idx(p - at) + n];
            self.pages
                .entry(page)
                .or_insert_with(|| vec![0u8; PAGE_LEN].into_boxed_slice())[o..o + n]
                .copy_from_slice(src);
            self.touched.insert(page);
            p += n as u64;
        }
        self.size = self.size.max(end);
        Ok(data.len())
    }

    /// The bytes a read of `len` at `at` returns (fewer at the end).
    fn read(&self, at: u64, len: usize) -> Vec<u8> {
        let end = self.size.min(at.saturating_add(len as u64));
        if at >= end {
            return Vec::new();
        }
        let mut out = vec![0u8; idx(end - at)];
        for (&page, bytes) in self.pages.range(at / PAGE..=(end - 1) / PAGE) {
            let (s, t) = (at.max(page * PAGE), end.min(page * PAGE + PAGE));
            out[idx(s - at)..idx(t - at)]
                .copy_from_slice(&bytes[idx(s - page * PAGE)..idx(t - page * PAGE)]);
        }
        out
    }

    fn set_len(&mut self, size: u64) -> Result<(), Errno> {
        if size > MAX_FILE_SIZE {
            return Err(libc::EFBIG);
        }
        if size < self.size {
            self.pages.split_off(&size.div_ceil(PAGE));
            if !size.is_multiple_of(PAGE) {
                if let Some(p) = self.pages.get_mut(&(size / PAGE)) {
                    p[(size % PAGE) as usize..].fill(0);
                }
            }
        }
        self.size = size;
        Ok(())
    }
}

/// An offset: absolute, or relative to the file's size when the operation
/// runs.
#[derive(Debug, Clone, Copy)]
enum Off {
    At(u64),
    End(i64),
}

impl Off {
    /// The absolute offset, clamped at 0.
    fn resolve(self, size: u64) -> u64 {
        match self {
            Off::At(a) => a,
            Off::End(d) => size.saturating_add_signed(d),
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// `write_at`.
    WriteAt {
        file: usize,
        at: Off,
        len: usize,
        seed: u8,
    },
    /// `read_at`.
    ReadAt { file: usize, at: Off, len: usize },
    /// `set_len`: cut or extend.
    SetLen { file: usize, size: Off },
    /// `write_all` through a fresh `OpenOptions::append` handle.
    Append { file: usize, len: usize, seed: u8 },
    /// `seek` (from the start, or from the end) and `write_all`.
    SeekWrite {
        file: usize,
        at: Off,
        len: usize,
        seed: u8,
    },
    /// `seek` and `read` until `len` bytes or the end.
    SeekRead { file: usize, at: Off, len: usize },
    /// Close the file system cleanly and open it again.
    Reopen,
    /// Drop the file system without a clean close, and recover it.
    Crash {
        /// Close the files before the crash, or leave them open across it.
        close_files_first: bool,
    },
}

/// Bytes that depend on their offset and on `seed`, never zero, so that a
/// page in the wrong place or a hole where data belongs shows.
// A hash of the offset: dropping its high bits is the point.
#[allow(clippy::cast_possible_truncation)]
fn data(seed: u8, at: u64, len: usize) -> Vec<u8> {
    (at..at + len as u64)
        .map(|p| {
            let h = (p as u8) ^ ((p >> 12) as u8).wrapping_mul(29) ^ ((p >> 32) as u8) ^ seed;
            h.max(1)
        })
        .collect()
}

fn offset() -> impl Strategy<Value = Off> {
    const GIB4: u64 = 4 << 30;
    prop_oneof![
        6 => (0u64..256 << 10).prop_map(Off::At),
        2 => (0u64..1024).prop_map(|p| Off::At(p * PAGE)),
        2 => (0u64..4 << 20).prop_map(Off::At),
        4 => (-(64i64 << 10)..64 << 10).prop_map(Off::End),
        1 => (-2i64..2).prop_map(|p| Off::End(p * i64::try_from(PAGE).unwrap())),
        2 => (GIB4 - (64 << 10)..GIB4 + (64 << 10)).prop_map(Off::At),
        1 => (0u64..1 << 40).prop_map(Off::At),
        1 => (MAX_FILE_SIZE - (32 << 10)..MAX_FILE_SIZE + PAGE).prop_map(Off::At),
    ]
}

fn length() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 0usize..=9000,
        2 => (1usize..=8).prop_map(|n| n * PAGE_LEN),
        // Past one commit (1 MiB).
        1 => (1usize << 20) - 3 * PAGE_LEN..(1 << 20) + 3 * PAGE_LEN,
    ]
}

fn read_length() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 0usize..=20_000,
        1 => 0usize..=300 << 10,
        // Past one read chunk (1 MiB).
        1 => (1usize << 20) - 8192..(1 << 20) + 8192,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let file = 0..FILES.len();
    prop_oneof![
        6 => (file.clone(), offset(), length(), any::<u8>())
            .prop_map(|(file, at, len, seed)| Op::WriteAt { file, at, len, seed }),
        4 => (file.clone(), offset(), read_length())
            .prop_map(|(file, at, len)| Op::ReadAt { file, at, len }),
        2 => (file.clone(), offset()).prop_map(|(file, size)| Op::SetLen { file, size }),
        2 => (file.clone(), length(), any::<u8>())
            .prop_map(|(file, len, seed)| Op::Append { file, len, seed }),
        2 => (file.clone(), offset(), length(), any::<u8>())
            .prop_map(|(file, at, len, seed)| Op::SeekWrite { file, at, len, seed }),
        1 => (file, offset(), read_length())
            .prop_map(|(file, at, len)| Op::SeekRead { file, at, len }),
        1 => Just(Op::Reopen),
        1 => any::<bool>().prop_map(|close_files_first| Op::Crash { close_files_first }),
    ]
}

fn protection() -> impl Strategy<Value = Protection> {
    prop_oneof![
        Just(Protection::Strict),
        Just(Protection::Batched),
        Just(Protection::Off),
        Just(Protection::Keys)
    ]
}

fn errno(e: io::Error) -> Errno {
    e.raw_os_error()
        .unwrap_or_else(|| panic!("an error without an errno: {e}"))
}

/// The file system under test and a read-write handle on each file.
struct Sut {
    image: PathBuf,
    config: Config,
    fs: Fs,
    files: Vec<File>,
}

impl Sut {
    fn create(image: PathBuf, config: Config) -> Sut {
        kucofs_kfs::mkfs(&image, IMAGE_SIZE, false).expect("mkfs");
        let fs = Fs::open_with(&image, config).expect("open");
        fs.create_dir("d").expect("mkdir");
        let files = FILES
            .iter()
            .map(|p| File::create_new(&fs, p).expect("create a file"))
            .collect();
        Sut {
            image,
            config,
            fs,
            files,
        }
    }

    fn open_files(fs: &Fs) -> Vec<File> {
        FILES
            .iter()
            .map(|p| {
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(fs, p)
                    .expect("reopen a file")
            })
            .collect()
    }

    fn reopen(self) -> Sut {
        let Sut {
            image,
            config,
            fs,
            files,
        } = self;
        drop(files);
        fs.close().expect("close");
        let fs = Fs::open_with(&image, config).expect("open after a clean close");
        let files = Sut::open_files(&fs);
        Sut {
            image,
            config,
            fs,
            files,
        }
    }

    fn crash(self, close_files_first: bool) -> Sut {
        let Sut {
            image,
            config,
            fs,
            files,
        } = self;
        if close_files_first {
            drop(files);
            fs.simulate_crash();
        } else {
            fs.simulate_crash();
            drop(files);
        }
        let fs = Fs::open_with(&image, config).expect("recover after a crash");
        let files = Sut::open_files(&fs);
        Sut {
            image,
            config,
            fs,
            files,
        }
    }
}

/// Checks the whole of file `i` against the model.
fn check_file(sut: &Sut, i: usize, m: &ModelFile, when: &str) -> Result<(), TestCaseError> {
    let (f, path) = (&sut.files[i], FILES[i]);
    let len = f.metadata().expect("metadata").len();
    prop_assert_eq!(len, m.size, "size of {} {}", path, when);
    if m.size <= WHOLE_COMPARE_MAX {
        let got = sut.fs.read(path).expect("read a whole file");
        let want = m.read(0, idx(m.size));
        return same_bytes(&got, &want, format_args!("contents of {path} {when}"));
    }
    // Every page ever written, its neighbours, and both ends.
    let last = (m.size - 1) / PAGE;
    let pages: BTreeSet<u64> = m
        .touched
        .iter()
        .flat_map(|&p| [p.saturating_sub(1), p, p + 1])
        .chain([0, last])
        .filter(|&p| p <= last)
        .collect();
    let mut buf = vec![0u8; PAGE_LEN];
    for p in pages {
        let n = f.read_at(&mut buf, p * PAGE).expect("read a page");
        let want = m.read(p * PAGE, PAGE_LEN);
        same_bytes(&buf[..n], &want, format_args!("page {p} of {path} {when}"))?;
    }
    prop_assert_eq!(f.read_at(&mut buf, m.size).expect("read at the end"), 0);
    Ok(())
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or_else(|| (a.len() != b.len()).then(|| a.len().min(b.len())))
}

/// Fails unless `got` is `want`, naming `what` and the first byte that
/// differs.
fn same_bytes(got: &[u8], want: &[u8], what: std::fmt::Arguments<'_>) -> Result<(), TestCaseError> {
    prop_assert!(
        got == want,
        "{}: got {} bytes, first difference at byte {:?}",
        what,
        got.len(),
        first_difference(got, want)
    );
    Ok(())
}

fn check_all(sut: &Sut, model: &[ModelFile], when: &str) -> Result<(), TestCaseError> {
    for (i, m) in model.iter().enumerate() {
        check_file(sut, i, m, when)?;
    }
    Ok(())
}

/// Runs `op` on the file system and the model; checks the results agree.
fn step(sut: Sut, model: &mut [ModelFile], op: &Op, at: &str) -> Result<Sut, TestCaseError> {
    match *op {
        Op::WriteAt {
            file,
            at: off,
            len,
            seed,
        } => {
            let m = &mut model[file];
            let off = off.resolve(m.size);
            let buf = data(seed, off, len);
            let got = sut.files[file].write_at(&buf, off).map_err(errno);
            prop_assert_eq!(got, m.write(off, &buf), "{}: write_at {}", at, off);
        }
        Op::ReadAt { file, at: off, len } => {
            let m = &model[file];
            let off = off.resolve(m.size);
            let mut buf = vec![0u8; len];
            let n = sut.files[file].read_at(&mut buf, off).expect("read_at");
            let want = m.read(off, len);
            same_bytes(
                &buf[..n],
                &want,
                format_args!("{at}: read_at {off} of {len} bytes"),
            )?;
        }
        Op::SetLen { file, size } => {
            let m = &mut model[file];
            let size = size.resolve(m.size);
            let got = sut.files[file].set_len(size).map_err(errno);
            prop_assert_eq!(got, m.set_len(size), "{}: set_len {}", at, size);
        }
        Op::Append { file, len, seed } => {
            let m = &mut model[file];
            let buf = data(seed, m.size, len);
            let mut a = OpenOptions::new()
                .append(true)
                .open(&sut.fs, FILES[file])
                .expect("open to append");
            let got = a.write_all(&buf).map_err(errno);
            let size = m.size;
            let want = m.write(size, &buf).map(drop);
            prop_assert_eq!(got, want, "{}: append at {}", at, size);
            if want.is_ok() {
                // A fresh handle: appending nothing writes nothing and
                // leaves the position at 0 (as std and Linux do).
                let pos = a.stream_position().expect("position");
                let end = if buf.is_empty() { 0 } else { m.size };
                prop_assert_eq!(pos, end, "{}: position after an append", at);
            }
        }
        Op::SeekWrite {
            file,
            at: off,
            len,
            seed,
        } => {
            let m = &mut model[file];
            let mut f = &sut.files[file];
            let (to, want_pos) = match off {
                Off::At(a) => (SeekFrom::Start(a), Some(a)),
                Off::End(d) => (SeekFrom::End(d), m.size.checked_add_signed(d)),
            };
            let got = f.seek(to).map_err(errno);
            prop_assert_eq!(got, want_pos.ok_or(libc::EINVAL), "{}: seek {:?}", at, to);
            if let Some(pos) = want_pos {
                let buf = data(seed, pos, len);
                let got = f.write_all(&buf).map_err(errno);
                // `write_all` of nothing writes nothing, wherever.
                let want = if buf.is_empty() {
                    Ok(())
                } else {
                    m.write(pos, &buf).map(drop)
                };
                prop_assert_eq!(got, want, "{}: write_all at {}", at, pos);
                let end = if want.is_ok() { pos + len as u64 } else { pos };
                let now = f.stream_position().expect("position");
                prop_assert_eq!(now, end, "{}: position after a write", at);
            }
        }
        Op::SeekRead { file, at: off, len } => {
            let m = &model[file];
            let mut f = &sut.files[file];
            let pos = off.resolve(m.size);
            f.seek(SeekFrom::Start(pos)).expect("seek");
            let mut buf = vec![0u8; len];
            let mut n = 0;
            while n < len {
                match f.read(&mut buf[n..]).expect("read") {
                    0 => break,
                    k => n += k,
                }
            }
            let want = m.read(pos, len);
            same_bytes(
                &buf[..n],
                &want,
                format_args!("{at}: read at {pos} of {len} bytes"),
            )?;
            let now = f.stream_position().expect("position");
            prop_assert_eq!(now, pos + n as u64, "{}: position after a read", at);
        }
        Op::Reopen => {
            let sut = sut.reopen();
            check_all(&sut, model, &format!("after {at} (a clean reopen)"))?;
            return Ok(sut);
        }
        Op::Crash { close_files_first } => {
            let sut = sut.crash(close_files_first);
            check_all(&sut, model, &format!("after {at} (a crash)"))?;
            return Ok(sut);
        }
    }
    for (i, m) in model.iter().enumerate() {
        let len = sut.fs.metadata(FILES[i]).expect("metadata").len();
        prop_assert_eq!(len, m.size, "{}: size of {}", at, FILES[i]);
    }
    Ok(sut)
}

fn check(protection: Protection, ops: &[Op]) -> Result<(), TestCaseError> {
    let Some(dir) = support::shm_dir("kucofs-data-model-") else {
        return Ok(());
    };
    let image = dir.path().join("img");
    let config = Config {
        protection,
        ..Config::default()
    };
    let mut sut = Sut::create(image.clone(), config);
    let mut model: Vec<ModelFile> = FILES.iter().map(|_| ModelFile::default()).collect();
    for (i, op) in ops.iter().enumerate() {
        sut = step(sut, &mut model, op, &format!("op {i} ({op:?})"))?;
    }
    check_all(&sut, &model, "at the end")?;
    let sut = sut.reopen();
    check_all(&sut, &model, "after the final reopen")?;
    drop(sut.files);
    sut.fs.close().expect("close");
    let report = kucofs_kfs::fsck(Path::new(&image)).expect("fsck runs");
    prop_assert!(report.problems.is_empty(), "fsck: {}", report);
    Ok(())
}

fn proptest_config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(proptest_config())]

    #[test]
    fn file_data_matches_a_sparse_model(
        protection in protection(),
        ops in prop::collection::vec(op(), 10..50),
    ) {
        check(protection, &ops)?;
    }
}
