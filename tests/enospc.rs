//! A full file system: a write that finds no free page fails cleanly with
//! `ENOSPC` and leaves every file as it was; removing a file makes room
//! again (Kfs reclaims the freed pages when a grant would fail); and the
//! image survives a clean reopen and a crash, fsck-clean.

mod support;

use std::io::{self, Seek, Write};

use kucofs::{File, Fs, OpenOptions};
use kucofs_common::format::Geometry;

/// A small image: 2 MiB, a few hundred data pages.
const IMAGE_SIZE: u64 = 2 << 20;
const CHUNK: usize = 64 << 10;

/// Bytes that depend on their file offset and on `tag`, so that a page
/// that lands in the wrong place, or in the wrong file, shows.
// A hash of the offset: dropping its high bits is the point.
#[allow(clippy::cast_possible_truncation)]
fn pattern(tag: u8, at: u64, len: usize) -> Vec<u8> {
    (at..at + len as u64)
        .map(|p| (p as u8) ^ ((p >> 12) as u8).wrapping_mul(29) ^ tag)
        .collect()
}

/// The pattern tag of file number `i`: tags repeat every 256 files, and
/// neighbours still differ.
// Taking the low byte is the point.
#[allow(clippy::cast_possible_truncation)]
fn tag(i: u32) -> u8 {
    i as u8
}

fn is_enospc(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOSPC)
}

/// Writes `tag`'s pattern to `f` in 64 KiB chunks from `at` until the file
/// system is full; returns the bytes written. Every failure must be
/// `ENOSPC`, and a chunk may be cut short only by a full file system.
fn fill(f: &File, tag: u8, at: u64) -> u64 {
    let mut written = 0u64;
    loop {
        let off = at + written;
        match f.write_at(&pattern(tag, off, CHUNK), off) {
            Ok(n) if n == CHUNK => written += n as u64,
            Ok(n) => {
                // Cut short by a full file system: the next write must say so.
                written += n as u64;
                let e = f
                    .write_at(&pattern(tag, at + written, CHUNK), at + written)
                    .expect_err("a write after a short one on a full file system");
                assert!(is_enospc(&e), "a write to a full file system: {e}");
                return written;
            }
            Err(e) => {
                assert!(is_enospc(&e), "a write to a full file system: {e}");
                return written;
            }
        }
        assert!(
            written <= IMAGE_SIZE,
            "wrote {written} bytes into a {IMAGE_SIZE}-byte image"
        );
    }
}

fn assert_contents(fs: &Fs, path: &str, tag: u8, len: u64) {
    let got = fs.read(path).expect("read a file back");
    assert_eq!(got.len() as u64, len, "length of {path}");
    assert!(
        got == pattern(tag, 0, got.len()),
        "the contents of {path} changed"
    );
}

/// A fresh small file system in a directory of its own under `/dev/shm`
/// (removed when dropped): the directory, the image's path and the open
/// handle; `None` (the test skips) without `/dev/shm`.
fn small_fs() -> Option<(tempfile::TempDir, std::path::PathBuf, Fs)> {
    let dir = support::shm_dir("kucofs-enospc-")?;
    let image = dir.path().join("img");
    let fs = Fs::create(&image, IMAGE_SIZE).expect("mkfs and open");
    Some((dir, image, fs))
}

/// Closes `fs` cleanly and checks that fsck finds its image consistent.
fn close_and_fsck(fs: Fs, image: &std::path::Path) {
    fs.close().expect("close");
    let report = kucofs_kfs::fsck(image).expect("fsck runs");
    assert!(report.problems.is_empty(), "{report}");
}

#[test]
fn a_full_file_system_refuses_writes_cleanly_and_recovers_room() {
    let g = Geometry::for_size(IMAGE_SIZE).expect("the test's image size is valid");
    assert!(
        g.data.pages * 4096 >= 8 * CHUNK as u64,
        "a {IMAGE_SIZE}-byte image has only {} data pages",
        g.data.pages
    );
    let Some((_dir, image, fs)) = small_fs() else {
        return;
    };

    let keep_len = 3 * 4096 + 100;
    fs.write("keep", pattern(1, 0, keep_len)).unwrap();
    let keep_len = keep_len as u64;

    let f = File::create_new(&fs, "fill").unwrap();
    let filled = fill(&f, 2, 0);
    assert!(
        filled >= (g.data.pages * 4096) / 2,
        "only {filled} bytes fit in {} data pages",
        g.data.pages
    );
    assert_eq!(f.metadata().unwrap().len(), filled);
    assert_contents(&fs, "fill", 2, filled);
    assert_contents(&fs, "keep", 1, keep_len);

    // Every kind of write that needs more pages than are left (fewer than
    // a chunk's) fails the same way, and changes nothing.
    let e = f
        .write_at(&[0xee; CHUNK], 0)
        .expect_err("an overwrite needs fresh pages");
    assert!(is_enospc(&e), "overwrite on a full file system: {e}");
    let mut a = OpenOptions::new().append(true).open(&fs, "keep").unwrap();
    let e = a
        .write_all(&[0xee; CHUNK])
        .expect_err("an append needs pages");
    assert!(is_enospc(&e), "append on a full file system: {e}");
    let e = fs
        .write("new", vec![0xee; CHUNK])
        .expect_err("a new file needs pages");
    assert!(is_enospc(&e), "fs.write on a full file system: {e}");
    drop(a);
    assert_contents(&fs, "keep", 1, keep_len);
    assert_contents(&fs, "fill", 2, filled);
    assert_eq!(fs.metadata("new").unwrap().len(), 0);

    // Removing the big file makes room: its pages come back once no reader
    // can still see them.
    drop(f);
    fs.remove_file("fill").unwrap();
    let k = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fs, "keep")
        .unwrap();
    k.write_at(&pattern(1, 0, 4096), 0)
        .expect("an overwrite after a file was removed");
    let mut a = OpenOptions::new().append(true).open(&fs, "keep").unwrap();
    a.write_all(&pattern(1, keep_len, CHUNK))
        .expect("an append after a file was removed");
    drop((a, k));
    let keep_len = keep_len + CHUNK as u64;
    assert_contents(&fs, "keep", 1, keep_len);

    // The room is all there: a second fill gets about as far as the first.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fs, "new")
        .unwrap();
    f.set_len(0).unwrap();
    let refilled = fill(&f, 3, 0);
    assert!(
        refilled + 2 * CHUNK as u64 >= filled,
        "after removing {filled} bytes only {refilled} fit again"
    );
    drop(f);
    assert_contents(&fs, "new", 3, refilled);

    fs.close().expect("close a full file system");
    let fs = Fs::open(&image).expect("reopen a full file system");
    assert_contents(&fs, "keep", 1, keep_len);
    assert_contents(&fs, "new", 3, refilled);
    assert!(!fs.exists("fill"));
    // Still full after the reopen; then a crash with the failure behind it.
    let e = fs.write("more", [7u8; CHUNK]).expect_err("still full");
    assert!(is_enospc(&e), "a write after a reopen: {e}");
    fs.remove_file("new").unwrap();
    fs.write("more", pattern(4, 0, CHUNK)).expect("room again");
    fs.simulate_crash();
    let fs = Fs::open(&image).expect("recover a full file system");
    assert_contents(&fs, "keep", 1, keep_len);
    assert_contents(&fs, "more", 4, CHUNK as u64);
    assert!(!fs.exists("new"));
    close_and_fsck(fs, &image);
}

/// With free space only in single scattered pages, grants hand out one
/// page each, so a long write needs more runs than one commit carries: it
/// commits what it has and asks again, and every free page can be used.
#[test]
fn scattered_free_pages_can_all_be_written() {
    let Some((_dir, image, fs)) = small_fs() else {
        return;
    };
    let page = 4096usize;
    // Fill the data area with one-page files.
    let mut files = 0u32;
    loop {
        let f = match File::create(&fs, format!("f{files}")) {
            Ok(f) => f,
            Err(e) if is_enospc(&e) => break,
            Err(e) => panic!("create f{files}: {e}"),
        };
        match f.write_at(&pattern(tag(files), 0, page), 0) {
            Ok(n) => assert_eq!(n, page),
            Err(e) if is_enospc(&e) => {
                drop(f);
                fs.remove_file(format!("f{files}"))
                    .expect("remove the empty file");
                break;
            }
            Err(e) => panic!("write f{files}: {e}"),
        }
        files += 1;
    }
    assert!(files > 64, "only {files} one-page files fit");
    // Free every other page, then reopen so that the pool is given back
    // and the free space is those single pages.
    for i in (0..files).step_by(2) {
        fs.remove_file(format!("f{i}")).expect("remove");
    }
    fs.close().expect("close");
    let fs = Fs::open(&image).expect("reopen");
    let freed = files.div_ceil(2) as usize;
    let big = pattern(0xa5, 0, freed * page);
    let f = File::create(&fs, "big").expect("create big");
    assert_eq!(
        f.write_at(&big, 0).expect("write into scattered pages"),
        big.len(),
        "every freed page takes data"
    );
    drop(f);
    assert_contents(&fs, "big", 0xa5, big.len() as u64);
    for i in (1..files).step_by(2) {
        assert_contents(&fs, &format!("f{i}"), tag(i), page as u64);
    }
    close_and_fsck(fs, &image);
}

/// An append that the file system can take only part of appends that part
/// and says so, as POSIX `write` does: the count written, the position
/// after it; the next append gets `ENOSPC`.
#[test]
fn an_append_cut_short_reports_what_it_appended() {
    let Some((_dir, image, fs)) = small_fs() else {
        return;
    };
    let page = 4096u64;
    let big = File::create(&fs, "big").expect("create big");
    let len = fill(&big, 1, 0);
    // Eight pages come free (once their grace period ends).
    big.set_len(len / page * page - 8 * page).expect("shrink");
    let mut a = OpenOptions::new()
        .append(true)
        .create(true)
        .open(&fs, "a")
        .expect("open for appending");
    let data = pattern(2, 0, usize::try_from(16 * page).unwrap());
    let n = a.write(&data).expect("a short append is not an error");
    assert!(
        n > 0 && n < data.len(),
        "appended {n} of {} bytes into eight free pages",
        data.len()
    );
    assert_eq!(a.stream_position().expect("position"), n as u64);
    assert_contents(&fs, "a", 2, n as u64);
    let e = a
        .write(&data[n..])
        .expect_err("an append to a full file system");
    assert!(is_enospc(&e), "an append to a full file system: {e}");
    assert_contents(&fs, "a", 2, n as u64);
    drop((a, big));
    close_and_fsck(fs, &image);
}

/// A thread's pool of free pages is its own stock while there are free
/// pages to grant; once there are none, a thread that needs pages takes
/// back what the pools of the process's other threads hold unused. After
/// three threads (still running) have each written a page, keeping their
/// pools, a fourth fills every page `statfs` reports free: whether the
/// last free page runs out at the end of one of its writes or in the
/// middle (it writes 16 pages at a time, after a first write of `lead`
/// pages), and in the middle, the write cut short is the last to succeed.
#[test]
fn idle_pools_of_other_threads_are_used_before_enospc() {
    for lead in 0..4 {
        the_last_thread_fills_every_free_page(lead);
    }
}

fn the_last_thread_fills_every_free_page(lead: usize) {
    let Some((_dir, image, fs)) = small_fs() else {
        return;
    };
    let page = 4096usize;
    let wrote = std::sync::Barrier::new(4);
    std::thread::scope(|s| {
        let small: Vec<_> = (0..3u8)
            .map(|t| {
                let (fs, wrote) = (&fs, &wrote);
                s.spawn(move || {
                    let r = File::create(fs, format!("small{t}"))
                        .and_then(|f| f.write_at(&pattern(t, 0, page), 0));
                    // Stay alive, holding this thread's pool, until the
                    // last thread has written (a failure is reported
                    // after, so that no thread waits for a panicked one).
                    wrote.wait();
                    wrote.wait();
                    r
                })
            })
            .collect();
        wrote.wait();
        let free = fs.statfs().expect("statfs").blocks_free;
        let last = s
            .spawn(|| {
                let f = File::create(&fs, "last").expect("create the last file");
                let first = pattern(9, 0, lead * page);
                assert_eq!(f.write_at(&first, 0).expect("the first write"), first.len());
                (lead * page) as u64 + fill(&f, 9, (lead * page) as u64)
            })
            .join();
        wrote.wait();
        let last = last.expect("the last thread filling the file system");
        for (t, h) in small.into_iter().enumerate() {
            let r = h.join().expect("a small writer");
            assert_eq!(r.ok(), Some(page), "thread {t}'s one-page write");
        }
        assert_eq!(
            last / page as u64,
            free,
            "the last thread's pages after a first write of {lead}; statfs said {free} were free"
        );
        assert_contents(&fs, "last", 9, last);
    });
    close_and_fsck(fs, &image);
}

/// A 16 MiB tmpfs mounted for the test (unmounted when dropped), and where
/// an image on it goes; `None` (the test skips) where it cannot be.
fn on_small_tmpfs() -> Option<(support::SmallTmpfs, std::path::PathBuf)> {
    let small = support::SmallTmpfs::mount(16)?;
    let image = small.path().join("img");
    Some((small, image))
}

/// An image whose memory the file system under it has no room for is not
/// made: `ENOSPC` now, rather than a process killed by `SIGBUS` when a
/// write reaches a page there is no memory for.
#[test]
fn an_image_is_not_made_where_its_memory_has_no_room() {
    let Some((_small, image)) = on_small_tmpfs() else {
        return;
    };
    let e = Fs::create(&image, 64 << 20).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::StorageFull, "{e}");
    assert!(e.to_string().contains("too few"), "{e}");
    assert!(!image.exists());
    let fs = Fs::create(&image, 8 << 20).unwrap();
    fs.write("f", pattern(1, 0, 1 << 20)).unwrap();
    assert_contents(&fs, "f", 1, 1 << 20);
    close_and_fsck(fs, &image);
}

/// A sparse image larger than the room of the file system under it: its
/// metadata has its memory from the start, and a write that needs memory
/// the file system has no room for fails with `ENOSPC` (the process is
/// not killed); what was written stays, and the image is fsck-clean.
#[test]
fn a_sparse_image_refuses_writes_cleanly_once_its_file_system_is_full() {
    let Some((_small, image)) = on_small_tmpfs() else {
        return;
    };
    let fs = Fs::create_sparse(&image, 64 << 20).unwrap();
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .open(&fs, "a")
        .unwrap();
    let mut written = 0u64;
    let e = loop {
        match f.write_at(&pattern(1, written, CHUNK), written) {
            Ok(n) => written += n as u64,
            Err(e) => break e,
        }
        assert!(
            written <= 16 << 20,
            "wrote {written} bytes on a 16 MiB tmpfs"
        );
    };
    assert!(is_enospc(&e), "a write with no memory left: {e}");
    // The file system itself had room for more: the memory ran out first.
    assert!(written > 0, "nothing written");
    let free = fs.statfs().unwrap().blocks_free * 4096;
    assert!(free > 16 << 20, "{free} bytes free in the file system");
    drop(f);
    assert_contents(&fs, "a", 1, written);
    // Freed pages keep their memory, and are written again.
    fs.remove_file("a").unwrap();
    fs.write("b", pattern(2, 0, 1 << 20)).unwrap();
    assert_contents(&fs, "b", 2, 1 << 20);
    close_and_fsck(fs, &image);
}

/// Metadata takes pages from the same free space as data: a small image
/// filled with empty files until the first `ENOSPC` (then data pages in a
/// file, then more empty files) refuses cleanly, and from then on every
/// removal works, a file's data can be cut, and the room freed takes new
/// files again; statfs counts files down to zero room, and the image
/// survives a crash and a clean close, fsck-clean.
#[test]
fn a_file_system_full_of_files_refuses_creates_and_still_removes() {
    let Some(dir) = support::shm_dir("kucofs-enospc-") else {
        return;
    };
    let image = dir.path().join("img");
    let fs = Fs::create(&image, IMAGE_SIZE).unwrap();
    fs.create_dir("d").unwrap();
    let name = |i: u32| format!("d/file-number-{i:06}");
    let mut made = 0u32;
    let err = loop {
        match fs.create_file(name(made)) {
            Ok(()) => made += 1,
            Err(e) => break e,
        }
        assert!(made < 1_000_000, "a 2 MiB image never filled");
    };
    assert!(is_enospc(&err), "{err}");
    assert!(made > 1000, "only {made} files");
    let st = fs.statfs().unwrap();
    assert!(st.files_free < 32, "{st:?}");
    assert_eq!(st.files, u64::from(made) + 2 + st.files_free);
    // A directory, and a symlink whose target needs a page of its own,
    // are refused too.
    assert!(is_enospc(&fs.create_dir("e").unwrap_err()));
    let far = "t".repeat(200);
    assert!(is_enospc(&fs.symlink(&far, "d/link").unwrap_err()));
    // Removing works with the store full, and retiring the log, which
    // needs no page, too.
    for i in (0..made).step_by(3) {
        fs.remove_file(name(i)).unwrap();
    }
    fs.checkpoint().unwrap();
    let removed = made.div_ceil(3);
    assert!(fs.statfs().unwrap().files_free >= u64::from(removed) / 2);
    // The room taken back holds new files.
    let mut again = 0;
    while again < removed / 2 {
        fs.create_file(format!("d/again-{again}")).unwrap();
        again += 1;
    }
    // Slots freed here and there leave no page free for data; the files
    // made last, removed, empty whole pages of entries, which go back to
    // the free pages once two retirements have passed (one clears their
    // owner entries, the next finds that durable).
    assert!(is_enospc(
        &fs.write("d/again-0", vec![7u8; 4096]).unwrap_err()
    ));
    let mut gone = 0;
    for i in made / 2..made {
        if i % 3 != 0 {
            fs.remove_file(name(i)).unwrap();
            gone += 1;
        }
    }
    fs.checkpoint().unwrap();
    fs.checkpoint().unwrap();
    fs.write("d/again-0", vec![7u8; 4096]).unwrap();
    assert_eq!(fs.read("d/again-0").unwrap(), vec![7u8; 4096]);
    let left = u32::try_from(fs.read_dir("d").unwrap().count()).unwrap();
    assert_eq!(left, made - removed - gone + again);
    fs.simulate_crash();
    let fs = Fs::open(&image).unwrap();
    assert_eq!(
        u32::try_from(fs.read_dir("d").unwrap().count()).unwrap(),
        left
    );
    // Everything goes, and the image is as empty as it was.
    fs.remove_dir_all("d").unwrap();
    close_and_fsck(fs, &image);
    let fs = Fs::open(&image).unwrap();
    assert!(fs.statfs().unwrap().files_free > u64::from(made) / 2);
    close_and_fsck(fs, &image);
}
