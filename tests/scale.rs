//! One directory with a million entries: create, look up, list and unlink
//! all of them, then the file system is checked. Runs in a release build
//! (`cargo test --release --test scale`); a debug build checks 100,000.

mod support;

use std::collections::HashSet;
use std::path::Path;

use kucofs_ulib::Fs;

#[test]
fn one_directory_holds_a_million_entries() {
    let n: u64 = if cfg!(debug_assertions) {
        100_000
    } else {
        1_000_000
    };
    let Some(dir) = support::shm_dir("kucofs-scale-") else {
        return;
    };
    let image = dir.path().join("img");
    // Sparse: the entries take a small part of the data pages (the log,
    // checkpoint slots and bitmap, 3/16 of the image, get their memory
    // all the same).
    let fs = Fs::create_sparse(&image, 4 << 30).unwrap();
    fs.create_dir("big").unwrap();
    for i in 0..n {
        fs.create_file(format!("big/entry-{i}")).unwrap();
    }
    assert_eq!(fs.metadata("big").unwrap().nlink(), 2);
    for i in (0..n).step_by(7) {
        assert!(fs.metadata(format!("big/entry-{i}")).unwrap().is_file());
    }
    assert!(fs.metadata(format!("big/entry-{n}")).is_err());
    let mut seen = HashSet::with_capacity(usize::try_from(n).unwrap());
    for e in fs.read_dir("big").unwrap() {
        assert!(seen.insert(e.unwrap().file_name()), "listed twice");
    }
    assert_eq!(seen.len() as u64, n);
    // Survives a reopen at this size.
    fs.close().unwrap();
    let fs = Fs::open(&image).unwrap();
    assert_eq!(fs.read_dir("big").unwrap().count() as u64, n);
    for i in 0..n {
        fs.remove_file(format!("big/entry-{i}")).unwrap();
    }
    assert_eq!(fs.read_dir("big").unwrap().count(), 0);
    fs.remove_dir("big").unwrap();
    fs.close().unwrap();
    let report = kucofs_kfs::fsck(Path::new(&image)).unwrap();
    assert!(report.problems.is_empty(), "{report}");
    assert_eq!(report.inodes, 1);
}
