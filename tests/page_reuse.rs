//! Data pages are reused many times over: a small image in which one file
//! is overwritten again and again, so that every write lives on pages an
//! earlier write replaced (copy-on-write retires them; Kfs frees them after
//! their grace period and grants them again). The writes must keep
//! succeeding — with no space left only when live data fills the image —
//! under every protection mode, and beside a reader that keeps reading.
//!
//! Under batched protection a mistake in which pages a late protection
//! flip covers would kill the writer with `SIGSEGV`, so each mode's writer
//! runs in a child process (this test binary again, running
//! `child_overwrite_one_record`), and the parent reports how it died.

mod support;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;

use kucofs::{Config, File, Fs, Protection};

/// A 4 MiB image: a few hundred data pages, which a thread's first pool
/// takes whole.
const IMAGE_SIZE: u64 = 4 << 20;
const RECORD: usize = 16 << 10;
/// Enough overwrites to go through every data page about ten times.
const WRITES: u64 = 4_000;

/// The image a child makes; without it the child test does nothing.
const IMAGE_VAR: &str = "KUCOFS_PAGE_REUSE_IMAGE";
/// The protection mode a child runs with.
const MODE_VAR: &str = "KUCOFS_PAGE_REUSE_PROTECTION";

fn record(stamp: u64) -> Vec<u8> {
    stamp.to_le_bytes().repeat(RECORD / 8)
}

fn open(image: &Path, protection: Protection) -> Fs {
    kucofs_kfs::mkfs(image, IMAGE_SIZE, false).expect("mkfs");
    Fs::open_with(
        image,
        Config {
            protection,
            ..Config::default()
        },
    )
    .expect("open")
}

fn close_and_fsck(fs: Fs, image: &Path, last: u64) {
    assert!(fs.read("r").expect("read the record") == record(last));
    fs.close().expect("close");
    let fs = Fs::open(image).expect("reopen");
    assert!(fs.read("r").expect("read the record after a reopen") == record(last));
    fs.close().expect("close");
    let report = kucofs_kfs::fsck(image).expect("fsck runs");
    assert!(report.problems.is_empty(), "{report}");
}

/// Child: overwrites one record `WRITES` times under the protection mode
/// the parent names.
#[test]
#[ignore = "a child of overwrites_reuse_pages_under_every_protection_mode"]
fn child_overwrite_one_record() {
    let Some(image) = std::env::var_os(IMAGE_VAR).map(PathBuf::from) else {
        return;
    };
    let protection: Protection = std::env::var(MODE_VAR)
        .expect("the parent names a protection mode")
        .parse()
        .expect("a protection mode");
    let fs = open(&image, protection);
    let f = File::create_new(&fs, "r").expect("create the record's file");
    for i in 0..WRITES {
        f.write_at(&record(i), 0)
            .unwrap_or_else(|e| panic!("write {i} of {WRITES}: {e}"));
    }
    drop(f);
    close_and_fsck(fs, &image, WRITES - 1);
}

#[test]
fn overwrites_reuse_pages_under_every_protection_mode() {
    let Some(dir) = support::shm_dir("kucofs-reuse-") else {
        return;
    };
    let mut failed = Vec::new();
    for mode in Protection::ALL.map(Protection::name) {
        let out = support::child_test("child_overwrite_one_record")
            .env(IMAGE_VAR, dir.path().join(format!("{mode}.img")))
            .env(MODE_VAR, mode)
            .output()
            .expect("run the child");
        if !out.status.success() {
            let how = match out.status.signal() {
                Some(s) => format!("killed by signal {s}"),
                None => format!("{}", out.status),
            };
            failed.push(format!(
                "{mode}: the writer {how}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        } else if !String::from_utf8_lossy(&out.stdout).contains("1 passed") {
            // A child that matched no test would exit 0 having run nothing.
            failed.push(format!("{mode}: the child ran no writer"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Overwrites of one record while another thread keeps reading it: each
/// write replaces pages a reader may hold, so they wait for its epoch, and
/// the writes must still find free pages in a small image.
#[test]
fn overwrites_beside_a_busy_reader_do_not_run_out_of_space() {
    let Some(dir) = support::shm_dir("kucofs-reuse-") else {
        return;
    };
    let image = dir.path().join("img");
    let fs = open(&image, Protection::Batched);
    let f = File::create_new(&fs, "r").expect("create the record's file");
    f.write_at(&record(0), 0).expect("the first write");
    let done = AtomicBool::new(false);
    let start = Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Reads back to back, so that almost always one is under way
            // (what the records hold is `torn_read`'s business).
            let mut buf = vec![0u8; RECORD];
            start.wait();
            while !done.load(Ordering::Relaxed) {
                assert_eq!(f.read_at(&mut buf, 0).expect("read the record"), RECORD);
            }
        });
        let _stop = support::SetOnDrop(&done);
        start.wait();
        for i in 1..WRITES {
            f.write_at(&record(i), 0).unwrap_or_else(|e| {
                panic!("write {i} of {WRITES}, with {RECORD} bytes of live data: {e}")
            });
        }
    });
    drop(f);
    close_and_fsck(fs, &image, WRITES - 1);
}
