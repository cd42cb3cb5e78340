//! File data through `File` and `OpenOptions`: writes, reads, holes,
//! truncation, appends, reopen and crash recovery.

use std::io::{Read, Seek, SeekFrom, Write};

use kucofs::{File, Fs, OpenOptions, Protection};

mod support;

/// A fresh 64 MiB file system, and its image's path (the directory holds
/// it).
fn fresh() -> Option<(tempfile::TempDir, std::path::PathBuf, Fs)> {
    let dir = support::shm_dir("kucofs-data-")?;
    let path = dir.path().join("fs.img");
    let fs = Fs::create(&path, 64 << 20).unwrap();
    Some((dir, path, fs))
}

#[test]
fn write_read_holes_truncate_and_reopen() {
    let Some((_d, path, fs)) = fresh() else {
        return;
    };
    let f = File::create(&fs, "a").unwrap();
    assert_eq!(f.write_at(b"hello", 0).unwrap(), 5);
    assert_eq!(f.write_at(b"world", 10_000).unwrap(), 5);
    let mut buf = vec![0u8; 10_005];
    let g = File::open(&fs, "a").unwrap();
    assert_eq!(g.read_at(&mut buf, 0).unwrap(), 10_005);
    assert_eq!(&buf[..5], b"hello");
    assert!(buf[5..10_000].iter().all(|&b| b == 0));
    assert_eq!(&buf[10_000..], b"world");
    assert_eq!(fs.metadata("a").unwrap().len(), 10_005);
    f.set_len(3).unwrap();
    f.set_len(8).unwrap();
    assert_eq!(fs.read("a").unwrap(), b"hel\0\0\0\0\0");
    drop((f, g));
    fs.write("big", vec![7u8; 5 << 20]).unwrap();
    fs.close().unwrap();
    let fs = Fs::open(&path).unwrap();
    assert_eq!(fs.read("a").unwrap(), b"hel\0\0\0\0\0");
    assert_eq!(fs.read("big").unwrap(), vec![7u8; 5 << 20]);
    let mut f = OpenOptions::new().append(true).open(&fs, "a").unwrap();
    f.write_all(b"XY").unwrap();
    drop(f);
    fs.simulate_crash();
    let fs = Fs::open(&path).unwrap();
    let mut f = File::open(&fs, "a").unwrap();
    let mut s = Vec::new();
    f.read_to_end(&mut s).unwrap();
    assert_eq!(s, b"hel\0\0\0\0\0XY");
    f.seek(SeekFrom::Start(1)).unwrap();
    let mut two = [0u8; 2];
    f.read_exact(&mut two).unwrap();
    assert_eq!(&two, b"el");
    fs.close().unwrap();
    let report = kucofs_kfs::fsck(&path).unwrap();
    assert!(report.problems.is_empty(), "{report}");
}

#[test]
fn statfs_counts_the_pages_files_hold() {
    let Some((_d, path, fs)) = fresh() else {
        return;
    };
    let empty = fs.statfs().unwrap();
    // A new file system's one store page: the root directory's inode.
    assert_eq!(empty.blocks_free, empty.blocks - 1);
    let f = File::create(&fs, "a").unwrap();
    // Its name takes a page of directory entries, which later names share.
    let base = fs.statfs().unwrap().blocks_free;
    assert_eq!(base, empty.blocks_free - 1);
    f.write_at(&vec![1u8; 10 * 4096], 0).unwrap();
    assert_eq!(fs.statfs().unwrap().blocks_free, base - 10);
    // An overwrite replaces pages without holding more.
    f.write_at(&vec![2u8; 4096], 4096).unwrap();
    assert_eq!(fs.statfs().unwrap().blocks_free, base - 10);
    f.set_len(3 * 4096).unwrap();
    assert_eq!(fs.statfs().unwrap().blocks_free, base - 3);
    drop(f);
    fs.close().unwrap();
    let fs = Fs::open(&path).unwrap();
    assert_eq!(fs.statfs().unwrap().blocks_free, base - 3);
    fs.remove_file("a").unwrap();
    assert_eq!(fs.statfs().unwrap().blocks_free, base);
}

/// Opening with `truncate` while another thread of the process writes the
/// file: the write lands wholly before the cut (an empty file) or wholly
/// after it (zeros, then the byte written), never on the old contents.
#[test]
fn truncating_open_and_a_concurrent_write_are_ordered() {
    let Some((_d, _, fs)) = fresh() else {
        return;
    };
    let rounds = if cfg!(debug_assertions) { 300 } else { 2_000 };
    for _ in 0..rounds {
        fs.write("f", vec![b'A'; 8192]).unwrap();
        let w = OpenOptions::new().write(true).open(&fs, "f").unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let writing = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    w.write_at(b"X", 100).unwrap();
                    writing.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            });
            let _stop = support::SetOnDrop(&stop);
            // Truncate while the writer is under way, not before it starts.
            while !writing.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::spin_loop();
            }
            drop(File::create(&fs, "f").unwrap());
        });
        let got = fs.read("f").unwrap();
        let after_cut = got.len() == 101 && got[..100].iter().all(|&b| b == 0) && got[100] == b'X';
        assert!(
            got.is_empty() || after_cut,
            "{} bytes, starting {:?}",
            got.len(),
            &got[..got.len().min(8)]
        );
    }
}

/// Threads sharing one `File` through `&File` each write at a position of
/// their own, as threads sharing a file description do on Linux: no two
/// writes land at the same offset, and the file holds every byte written.
#[test]
fn threads_sharing_a_file_position_never_write_at_the_same_offset() {
    let Some((_d, _, fs)) = fresh() else {
        return;
    };
    let f = File::create(&fs, "shared").unwrap();
    const THREADS: u8 = 4;
    const RECORD: usize = 100;
    let writes = if cfg!(debug_assertions) { 500 } else { 5_000 };
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let f = &f;
            s.spawn(move || {
                for _ in 0..writes {
                    (&*f).write_all(&[b'a' + t; RECORD]).unwrap();
                }
            });
        }
    });
    let got = fs.read("shared").unwrap();
    assert_eq!(got.len(), THREADS as usize * writes * RECORD);
    let mut per_thread = [0usize; THREADS as usize];
    for (i, rec) in got.chunks(RECORD).enumerate() {
        assert!(
            rec.iter().all(|&b| b == rec[0]) && (b'a'..b'a' + THREADS).contains(&rec[0]),
            "record {i} is mixed: {:?}",
            &rec[..8]
        );
        per_thread[(rec[0] - b'a') as usize] += 1;
    }
    assert_eq!(per_thread, [writes; THREADS as usize]);
}

/// The errors POSIX gives for using a handle the wrong way.
#[test]
fn a_handle_used_against_its_mode_or_kind_is_refused_with_the_posix_error() {
    let Some((_d, _, fs)) = fresh() else {
        return;
    };
    let errno = |e: std::io::Error| e.raw_os_error();
    fs.write("f", b"data").unwrap();
    fs.create_dir("d").unwrap();
    let ro = File::open(&fs, "f").unwrap();
    assert_eq!(ro.write_at(b"x", 0).map_err(errno), Err(Some(libc::EBADF)));
    assert_eq!((&ro).write(b"x").map_err(errno), Err(Some(libc::EBADF)));
    assert_eq!(ro.set_len(0).map_err(errno), Err(Some(libc::EINVAL)));
    let wo = OpenOptions::new().write(true).open(&fs, "f").unwrap();
    let mut buf = [0u8; 4];
    assert_eq!(
        wo.read_at(&mut buf, 0).map_err(errno),
        Err(Some(libc::EBADF))
    );
    // A directory opens for reading, as on Linux, but reads no bytes.
    let dir = File::open(&fs, "d").unwrap();
    assert_eq!(
        dir.read_at(&mut buf, 0).map_err(errno),
        Err(Some(libc::EISDIR))
    );
    let for_write = OpenOptions::new().write(true).open(&fs, "d");
    assert_eq!(for_write.map_err(errno).err(), Some(Some(libc::EISDIR)));
    // Nothing changed.
    assert_eq!(fs.read("f").unwrap(), b"data");
}

/// An unlinked file stays readable and writable through the handles open
/// on it; its pages are freed when the last one closes, and the image is
/// consistent after a clean close.
#[test]
fn an_unlinked_file_lives_until_its_last_handle_closes() {
    let Some((_d, path, fs)) = fresh() else {
        return;
    };
    let f = File::create(&fs, "gone").unwrap();
    let empty = fs.statfs().unwrap().blocks_free;
    f.write_at(&vec![5u8; 3 * 4096], 0).unwrap();
    let g = File::open(&fs, "gone").unwrap();
    fs.remove_file("gone").unwrap();
    assert_eq!(
        fs.metadata("gone").map_err(|e| e.raw_os_error()).err(),
        Some(Some(libc::ENOENT))
    );
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    f.write_at(&vec![6u8; 4096], 3 * 4096).unwrap();
    let mut buf = vec![0u8; 4 * 4096];
    assert_eq!(g.read_at(&mut buf, 0).unwrap(), 4 * 4096);
    assert!(buf[..3 * 4096].iter().all(|&b| b == 5));
    assert!(buf[3 * 4096..].iter().all(|&b| b == 6));
    assert_eq!(fs.statfs().unwrap().blocks_free, empty - 4);
    drop(f);
    assert_eq!(
        fs.statfs().unwrap().blocks_free,
        empty - 4,
        "g is still open"
    );
    drop(g);
    assert_eq!(fs.statfs().unwrap().blocks_free, empty);
    // A new file may take the name; the old data is nowhere.
    fs.write("gone", b"new").unwrap();
    assert_eq!(fs.read("gone").unwrap(), b"new");
    fs.close().unwrap();
    let report = kucofs_kfs::fsck(&path).unwrap();
    assert!(report.problems.is_empty(), "{report}");
}

#[test]
fn a_checkpoint_on_request_is_written_only_when_something_changed() {
    let Some((_d, path, fs)) = fresh() else {
        return;
    };
    let checkpoints = |fs: &Fs| fs.kfs_stats().unwrap().checkpoints;
    let before = checkpoints(&fs);
    fs.write("a", b"kept").unwrap();
    fs.checkpoint().unwrap();
    assert_eq!(checkpoints(&fs), before + 1);
    fs.checkpoint().unwrap();
    assert_eq!(checkpoints(&fs), before + 1, "nothing changed since");
    fs.simulate_crash();
    let fs = Fs::open(&path).unwrap();
    assert_eq!(fs.read("a").unwrap(), b"kept");
    fs.close().unwrap();
}

/// True if the image at `path` is on DAX, as the kernel says of the file:
/// its pages are the device's own, which the kernel maps huge by itself
/// where the file's blocks line up, so Kfs makes huge pages of the index
/// only (it lives in memory), and [`Fs::huge_page_bytes`] counts those.
fn on_dax(path: &std::path::Path) -> bool {
    kucofs_common::pm::is_dax(path) == Some(true)
}

/// With huge pages asked for, Kfs holds the image's memory in 2 MiB pages
/// as it comes into use (on tmpfs; on DAX the index's only); file data
/// written before and after reads back the same, through a crash and a
/// reopen without huge pages, and fsck finds nothing wrong.
#[test]
fn huge_pages_hold_the_image_and_change_no_byte() {
    let Some((_d, path, fs)) = fresh() else {
        return;
    };
    let dax = on_dax(&path);
    fs.write("before", pattern(3 << 20, 1)).unwrap();
    fs.close().unwrap();
    let mut config = kucofs::Config::default();
    config.server.huge_pages = Some(true);
    let fs = Fs::open_with(&path, config).unwrap();
    // Kfs provisions the log, the index and the data pages ahead of use
    // on its own thread: give it a moment, writing meanwhile (on DAX,
    // where none will come, each file once).
    let mut huge = 0;
    for round in 0..200 {
        fs.write(format!("f{}", round % 8), pattern(256 << 10, round))
            .unwrap();
        huge = fs.huge_page_bytes().unwrap();
        if huge >= 4 << 20 || (dax && round == 7) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if dax {
        assert_eq!(huge % (2 << 20), 0, "the index's whole chunks");
    } else if huge == 0 && !kernel_makes_huge_shmem() {
        println!("SKIPPED: this kernel makes no huge pages of tmpfs (MADV_COLLAPSE)");
        return;
    } else {
        assert!(huge >= 4 << 20, "only {huge} bytes in huge pages");
        assert_eq!(huge % (2 << 20), 0);
    }
    fs.write("after", pattern(5 << 20, 2)).unwrap();
    assert_eq!(fs.read("before").unwrap(), pattern(3 << 20, 1));
    assert_eq!(fs.read("after").unwrap(), pattern(5 << 20, 2));
    fs.simulate_crash();
    let mut config = kucofs::Config::default();
    config.server.huge_pages = Some(false);
    let fs = Fs::open_with(&path, config).unwrap();
    assert_eq!(fs.huge_page_bytes().unwrap(), 0);
    assert_eq!(fs.read("before").unwrap(), pattern(3 << 20, 1));
    assert_eq!(fs.read("after").unwrap(), pattern(5 << 20, 2));
    fs.close().unwrap();
    let report = kucofs_kfs::fsck(&path).unwrap();
    assert!(report.problems.is_empty(), "{report}");
}

/// `Fs::settle` does at once the provisioning Kfs's thread would get to
/// in its own time: afterwards the pages of a file just written, which
/// the write took faster than that thread makes huge pages, are in huge
/// pages (on tmpfs; on DAX the image has none), the thread finds nothing
/// more to make huge, and the data reads back unchanged.
#[test]
fn settle_leaves_just_written_data_in_huge_pages() {
    let Some((_d, path, fs)) = fresh() else {
        return;
    };
    fs.close().unwrap();
    let mut config = kucofs::Config::default();
    config.server.huge_pages = Some(true);
    let fs = Fs::open_with(&path, config).unwrap();
    let data = pattern(16 << 20, 5);
    fs.write("big", &data).unwrap();
    fs.settle().unwrap();
    let huge = fs.huge_page_bytes().unwrap();
    if on_dax(&path) {
        assert_eq!(huge % (2 << 20), 0, "the index's whole chunks");
    } else if huge == 0 && !kernel_makes_huge_shmem() {
        println!("SKIPPED: this kernel makes no huge pages of tmpfs (MADV_COLLAPSE)");
        return;
    } else {
        assert!(huge >= 16 << 20, "only {huge} bytes in huge pages");
        // Nothing was left for Kfs's thread to do: a while later, no more.
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(
            fs.huge_page_bytes().unwrap(),
            huge,
            "provisioning was left due"
        );
    }
    assert_eq!(fs.read("big").unwrap(), data);
    fs.close().unwrap();
    let report = kucofs_kfs::fsck(&path).unwrap();
    assert!(report.problems.is_empty(), "{report}");
}

/// By default huge pages are on whatever the protection mode, batched
/// too, which changes the protection of the view's write window page by
/// page: a file written and then left alone comes to be held in huge
/// pages, which Kfs makes once nothing has been asked of it for a while,
/// and reading it maps them huge in the library's view, whose reads go
/// through a mapping no protection change splits. (On DAX the image has
/// none: the file reads back all the same.)
#[test]
fn by_default_a_file_left_alone_is_read_through_huge_mappings() {
    let Some((_d, path, fs)) = fresh() else {
        return;
    };
    fs.close().unwrap();
    let config = kucofs::Config {
        protection: Protection::Batched,
        ..kucofs::Config::default()
    };
    let fs = Fs::open_with(&path, config).unwrap();
    assert_eq!(fs.protection(), Protection::Batched);
    let data = pattern(8 << 20, 9);
    fs.write("f", &data).unwrap();
    let f = File::open(&fs, "f").unwrap();
    let mut back = vec![0u8; data.len()];
    if on_dax(&path) {
        assert_eq!(f.read_at(&mut back, 0).unwrap(), data.len());
    } else {
        let page = f.debug_page_address(4 << 20).unwrap().unwrap();
        let mut huge = 0;
        for _ in 0..100 {
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert_eq!(f.read_at(&mut back, 0).unwrap(), data.len());
            huge = pmd_mapped_kib(page);
            if huge > 0 {
                break;
            }
        }
        if huge == 0 && !kernel_makes_huge_shmem() {
            println!("SKIPPED: this kernel makes no huge pages of tmpfs (MADV_COLLAPSE)");
            return;
        }
        assert!(huge >= 2048, "the view maps {huge} KiB huge");
    }
    assert_eq!(back, data);
    drop(f);
    fs.close().unwrap();
    let report = kucofs_kfs::fsck(&path).unwrap();
    assert!(report.problems.is_empty(), "{report}");
}

/// The kibibytes of the mapping holding `addr` that huge page-table
/// entries map, from `/proc/self/smaps`.
fn pmd_mapped_kib(addr: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let holds = |l: &str| {
        let Some((range, _)) = l.split_once(' ') else {
            return false;
        };
        let Some((a, b)) = range.split_once('-') else {
            return false;
        };
        match (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
            (Ok(a), Ok(b)) => a <= addr && addr < b,
            _ => false,
        }
    };
    smaps
        .lines()
        .skip_while(|l| !holds(l))
        .take_while(|l| !l.starts_with("VmFlags"))
        .find_map(|l| l.strip_prefix("ShmemPmdMapped:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// `len` bytes that differ from page to page and with `seed`.
// A hash of the offset: dropping its high bits is the point.
#[allow(clippy::cast_possible_truncation)]
fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32 / 4093) ^ seed.wrapping_mul(131) ^ i as u32) as u8)
        .collect()
}

/// True if `MADV_COLLAPSE` makes a tmpfs file's page huge here (Linux 6.1
/// and later, with huge pages for shared memory not denied).
fn kernel_makes_huge_shmem() -> bool {
    let Some(dir) = support::shm_dir("kucofs-huge-probe-") else {
        return false;
    };
    let path = dir.path().join("probe.img");
    let region = kucofs_common::pm::Region::create(&path, 4 << 20, false).unwrap();
    region.enable_huge_pages() && region.make_huge(0, 1)
}
