//! A buggy application's stray store into file data (ARCHITECTURE.md §13): data
//! pages are mapped read-only into the client, so the store faults and the
//! process dies of `SIGSEGV` instead of corrupting a file. The store runs
//! in a child process (this test binary again, running one of the `child_`
//! tests); the parent then recovers the image and checks that the file is
//! unchanged and the image fsck-clean.

mod support;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kucofs::{Config, File, Fs, Protection};

/// Names the image a child works on; without it a `child_` test does nothing.
const IMAGE_VAR: &str = "KUCOFS_STRAY_WRITE_IMAGE";
/// The protection mode the child opens the file system with.
const MODE_VAR: &str = "KUCOFS_STRAY_WRITE_PROTECTION";

const FILE: &str = "victim";
const LEN: usize = 5 * 4096 + 123;
/// The file byte whose page the child stores into (in the third page).
const TARGET: u64 = 2 * 4096 + 17;

// A hash of the offset: dropping its high bits is the point.
#[allow(clippy::cast_possible_truncation)]
fn contents() -> Vec<u8> {
    (0..LEN)
        .map(|i| (i as u8) ^ ((i >> 12) as u8).wrapping_mul(41))
        .collect()
}

fn config(protection: Protection) -> Config {
    Config {
        protection,
        ..Config::default()
    }
}

/// What the child was asked to do, or `None` when this is no child.
fn child_args() -> Option<(PathBuf, Protection)> {
    let image = PathBuf::from(std::env::var_os(IMAGE_VAR)?);
    let mode = std::env::var(MODE_VAR)
        .expect("the parent names a protection mode")
        .parse()
        .expect("a protection mode");
    Some((image, mode))
}

/// Stores one byte at `addr`, which must fault; if it does not, the child
/// exits with a status the parent reports.
fn stray_store(addr: usize) -> ! {
    // Keep the expected crash from writing a core file.
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit only reads the struct passed by reference.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_CORE, &no_core) };
    assert_eq!(rc, 0, "setrlimit(RLIMIT_CORE, 0)");
    eprintln!("child: storing to {addr:#x}");
    // SAFETY: `addr` lies inside the client's read-only mapping of the
    // region (a data page of a committed file), so this store is expected
    // to fault with SIGSEGV and kill the process before it changes a byte.
    // Should the page be writable after all (the bug this test looks for),
    // the store lands in mapped memory that no Rust reference points at, and
    // the child exits at once, reporting it.
    unsafe { std::ptr::write_volatile((addr + (TARGET % 4096) as usize) as *mut u8, 0xa5) };
    eprintln!("child: the store did not fault");
    std::process::exit(3)
}

/// Runs child test `name` on `image` and checks that it died of SIGSEGV.
fn run_child(name: &str, image: &Path, protection: Protection) {
    let out = support::child_test(name)
        .env(IMAGE_VAR, image)
        .env(MODE_VAR, protection.name())
        .output()
        .expect("run the child");
    let log = format!(
        "child {name} ({}): {}\nstdout:\n{}\nstderr:\n{}",
        protection.name(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("child: storing to"),
        "the child died before its stray store\n{log}"
    );
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "the stray store should have killed the child\n{log}"
    );
}

/// Recovers the image the dead child left and checks the file is intact.
fn check_after_crash(image: &Path) {
    let fs = Fs::open(image).expect("recover the image the child left");
    let got = fs.read(FILE).expect("read the file");
    assert!(got == contents(), "the file's data changed");
    fs.close().expect("close");
    let report = kucofs_kfs::fsck(image).expect("fsck runs");
    assert!(report.problems.is_empty(), "{report}");
}

/// Child: opens a file system that was closed cleanly, only reads, and
/// stores into a data page of a file.
#[test]
#[ignore = "a child of the stray-write tests, run by run_child"]
fn child_store_into_a_read_page() {
    let Some((image, protection)) = child_args() else {
        return;
    };
    let fs = Fs::open_with(&image, config(protection)).expect("child: open");
    let f = File::open(&fs, FILE).expect("child: open the file");
    let mut buf = vec![0u8; LEN];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), LEN);
    assert!(
        buf == contents(),
        "child: the file's data is not what was written"
    );
    // Through the mapping writes go through: the one whose protection
    // Kfs changes (the mapping reads go through is never writable).
    let addr = f
        .debug_window_address(TARGET)
        .expect("child: page address")
        .expect("child: the target byte is in a page");
    stray_store(addr);
}

/// How the child lets the Kfs thread start before it writes.
#[derive(Clone, Copy, PartialEq)]
enum Start {
    /// Not at all: the write comes at once.
    Now,
    /// Its start-up work (populating the index and the log ahead of use)
    /// done at once on this thread, then a moment to fall asleep.
    Asleep,
}

/// Makes a file system on `image`, opens it with `config`, lets the Kfs
/// thread start as `start` says, and writes the file; returns the open
/// file system and the address of the target byte's page in the mapping
/// the library's writes go through.
fn write_fresh_file(image: &Path, config: Config, start: Start) -> (Fs, usize) {
    kucofs_kfs::mkfs(image, 16 << 20, false).expect("child: mkfs");
    let fs = Fs::open_with(image, config).expect("child: open");
    if start == Start::Asleep {
        // The Kfs thread flips no batch while it has start-up work left,
        // which takes as long as the machine makes it (page faults on DAX
        // under emulation, hundreds of milliseconds): done here, it is
        // left nothing to do but sleep.
        fs.settle().expect("child: settle");
        std::thread::sleep(Duration::from_millis(300));
    }
    let f = File::create_new(&fs, FILE).expect("child: create the file");
    assert_eq!(f.write_at(&contents(), 0).unwrap(), LEN);
    let addr = f
        .debug_window_address(TARGET)
        .expect("child: page address")
        .expect("child: the target byte is in a page");
    (fs, addr)
}

/// Child: makes a file system, writes the file under strict protection
/// (every commit makes its pages read-only at once) or under protection
/// keys (no store but the library's own copy is ever allowed), and stores
/// into a page it has just written.
#[test]
#[ignore = "a child of the stray-write tests, run by run_child"]
fn child_store_into_a_just_written_page() {
    let Some((image, protection)) = child_args() else {
        return;
    };
    assert!(matches!(protection, Protection::Strict | Protection::Keys));
    let (fs, addr) = write_fresh_file(&image, config(protection), Start::Now);
    assert_eq!(fs.protection(), protection, "child: the mode in effect");
    stray_store(addr);
}

/// The read and write letters ("rw" or "r-") of the page at `addr`, from
/// `/proc/self/maps`.
fn perms(addr: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    maps.lines()
        .find_map(|l| {
            let (range, rest) = l.split_once(' ')?;
            let (a, b) = range.split_once('-')?;
            let a = usize::from_str_radix(a, 16).ok()?;
            let b = usize::from_str_radix(b, 16).ok()?;
            (a <= addr && addr < b).then(|| rest[..2].to_owned())
        })
        .expect("the page is mapped")
}

/// How long the child waits for its batch to be made read-only: far less
/// than the minute its Kfs thread sleeps when idle, far more than any
/// machine, emulated ones included, takes to wake the thread and change
/// a page's protection.
const BATCH_WAIT: Duration = Duration::from_secs(5);

/// Child: opens a fresh file system whose idle Kfs thread sleeps for a
/// minute at a time, has its start-up work done and lets it fall asleep,
/// writes the file under batched protection, then stops writing and waits
/// (at most [`BATCH_WAIT`]) for the page to turn read-only before storing
/// into it: the write must have woken the Kfs thread, which must have
/// made the page read-only at the batch's deadline, not when its sleep
/// ended.
#[test]
#[ignore = "a child of the stray-write tests, run by run_child"]
fn child_store_into_a_page_after_its_batch_expired() {
    let Some((image, protection)) = child_args() else {
        return;
    };
    assert_eq!(protection, Protection::Batched);
    let sleepy = Config {
        server: kucofs::ServerConfig {
            sleep: Duration::from_secs(60),
            ..kucofs::ServerConfig::default()
        },
        ..config(protection)
    };
    let (_fs, addr) = write_fresh_file(&image, sleepy, Start::Asleep);
    let written = std::time::Instant::now();
    std::thread::sleep(kucofs_common::pm::BATCH_TIME);
    while perms(addr) != "r-" && written.elapsed() < BATCH_WAIT {
        std::thread::sleep(Duration::from_millis(5));
    }
    stray_store(addr);
}

/// Runs child test `name` on a fresh image under `protection`, then
/// checks the image it left.
fn run_child_on_a_fresh_image(name: &str, protection: Protection) {
    let Some(dir) = support::shm_dir("kucofs-stray-") else {
        return;
    };
    let image = dir.path().join(format!("{}.img", protection.name()));
    run_child(name, &image, protection);
    check_after_crash(&image);
}

#[test]
fn a_stray_store_into_file_data_kills_the_process_and_changes_nothing() {
    let Some(dir) = support::shm_dir("kucofs-stray-") else {
        return;
    };
    for protection in Protection::ALL {
        let image = dir.path().join(format!("{}.img", protection.name()));
        let fs = Fs::create(&image, 16 << 20).expect("mkfs and open");
        fs.write(FILE, contents()).expect("write the file");
        fs.close().expect("close");
        run_child("child_store_into_a_read_page", &image, protection);
        check_after_crash(&image);
    }
}

#[test]
fn a_stray_store_into_just_written_data_faults_under_strict_protection() {
    run_child_on_a_fresh_image("child_store_into_a_just_written_page", Protection::Strict);
}

#[test]
fn a_stray_store_into_just_written_data_faults_under_protection_keys() {
    if kucofs_common::pm::keys::process_key().is_none() {
        println!("SKIPPED: this CPU or kernel has no memory protection keys");
        return;
    }
    run_child_on_a_fresh_image("child_store_into_a_just_written_page", Protection::Keys);
}

#[test]
fn a_batch_of_written_pages_turns_read_only_without_further_writes() {
    run_child_on_a_fresh_image(
        "child_store_into_a_page_after_its_batch_expired",
        Protection::Batched,
    );
}
