//! Attribute changes and file-system statistics through the `Fs` API:
//! chown and lchown (which must not follow a final symlink), set_times,
//! set_permissions through a symlink, and statfs's inode counts, all
//! surviving a reopen.

mod support;

use std::time::{Duration, UNIX_EPOCH};

use kucofs_ulib::{Fs, Permissions};

#[test]
fn owners_times_permissions_and_statfs() {
    let Some(dir) = support::shm_dir("kucofs-attr-") else {
        return;
    };
    let image = dir.path().join("img");
    let fs = Fs::create(&image, 16 << 20).unwrap();
    let before = fs.statfs().unwrap();
    fs.create_file("f").unwrap();
    fs.symlink("f", "l").unwrap();
    let after = fs.statfs().unwrap();
    assert_eq!(after.files_free, before.files_free - 2);
    assert_eq!(
        (after.files, after.name_max, after.block_size),
        (before.files, 255, 4096)
    );

    fs.chown("l", Some(1234), None).unwrap();
    assert_eq!(
        fs.metadata("f").unwrap().uid(),
        1234,
        "chown follows the symlink"
    );
    assert_ne!(fs.symlink_metadata("l").unwrap().uid(), 1234);
    fs.lchown("l", Some(77), Some(88)).unwrap();
    let link = fs.symlink_metadata("l").unwrap();
    assert_eq!((link.uid(), link.gid()), (77, 88));
    assert_eq!(
        fs.metadata("f").unwrap().uid(),
        1234,
        "lchown left the target alone"
    );

    let atime = UNIX_EPOCH + Duration::new(1_000_000, 5);
    let mtime = UNIX_EPOCH + Duration::new(2_000_000, 7);
    fs.set_times("l", Some(atime), Some(mtime)).unwrap();
    fs.set_permissions("l", Permissions::from_mode(0o640))
        .unwrap();
    let check = |fs: &Fs| {
        let m = fs.metadata("f").unwrap();
        assert_eq!(m.accessed().unwrap(), atime);
        assert_eq!(m.modified().unwrap(), mtime);
        assert_eq!(m.permissions().mode(), 0o640);
        assert_eq!(m.uid(), 1234);
        assert_eq!(
            fs.symlink_metadata("l").unwrap().permissions().mode(),
            0o777
        );
    };
    check(&fs);
    assert_eq!(
        fs.chown("missing", Some(1), None)
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENOENT)
    );
    fs.close().unwrap();
    let fs = Fs::open(&image).unwrap();
    check(&fs);
    assert_eq!(fs.statfs().unwrap(), after);
}

/// Opening a file that exists with truncation changes its modification
/// and change times, as on Linux, even when it is empty already; creating
/// a file with truncation asks for no truncation of its own.
#[test]
fn a_truncating_open_of_an_existing_file_changes_its_times() {
    let Some(dir) = support::shm_dir("kucofs-attr-") else {
        return;
    };
    let fs = Fs::create(dir.path().join("img"), 16 << 20).unwrap();
    let old = UNIX_EPOCH + Duration::new(1_000_000, 0);
    for (name, data) in [("empty", &b""[..]), ("full", &b"data"[..])] {
        fs.write(name, data).unwrap();
        fs.set_times(name, Some(old), Some(old)).unwrap();
        drop(kucofs_ulib::File::create(&fs, name).unwrap());
        let m = fs.metadata(name).unwrap();
        assert_eq!(m.len(), 0, "{name}");
        assert!(m.modified().unwrap() > old, "{name}: mtime unchanged");
    }
    let truncations = |fs: &Fs| {
        fs.kfs_stats()
            .and_then(|s| {
                s.per_kind
                    .iter()
                    .find(|k| k.0 == kucofs_common::proto::RequestKind::Truncate)
                    .map(|k| k.1)
            })
            .unwrap_or(0)
    };
    let before = truncations(&fs);
    drop(kucofs_ulib::File::create(&fs, "new").unwrap());
    assert_eq!(truncations(&fs), before, "a create truncated its new file");
}
