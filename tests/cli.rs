//! The `kucofs` command as a user runs it: mkfs and info on images under
//! `/dev/shm`, and the one-sentence errors for everything that can go wrong.

mod support;

use std::path::Path;
use std::process::{Command, Output};

fn kucofs(args: &[&str]) -> Output {
    Command::new(support::companion::binary(env!("CARGO_BIN_EXE_kucofs")))
        .args(args)
        .output()
        .expect("run kucofs")
}

fn shm_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("kucofs-cli-")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Asserts a failure with a single-line message naming `needle`, no panic.
fn assert_refused(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "expected failure, got: {}", stdout(o));
    assert!(!err.contains("panicked"), "panic: {err}");
    assert!(err.starts_with("kucofs: "), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.contains(needle), "{needle:?} not in: {err}");
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn mkfs_then_info_describes_the_image() {
    let dir = shm_dir();
    let img = dir.path().join("a.img");
    let o = kucofs(&["mkfs", p(&img), "--size", "64M"]);
    assert!(o.status.success(), "{o:?}");
    assert!(stdout(&o).contains("64.0 MiB"), "{}", stdout(&o));
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 << 20);

    let o = kucofs(&["info", p(&img)]);
    assert!(o.status.success(), "{o:?}");
    let text = stdout(&o);
    // The mapping the image's file allows, from what the kernel says of
    // the file: MAP_SYNC on DAX, an ordinary one on tmpfs.
    let mapping = if kucofs_common::pm::is_dax(&img) == Some(true) {
        "mapping:      DAX (MAP_SYNC)"
    } else {
        "mapping:      emulated"
    };
    for needle in [
        "KucoFS version 2",
        mapping,
        "state:        clean",
        "0 B used",
        "0 entries",
        "data",
        "bitmap",
    ] {
        assert!(text.contains(needle), "{needle:?} missing:\n{text}");
    }
}

#[test]
fn mkfs_refusals_are_one_sentence() {
    let dir = shm_dir();
    let img = dir.path().join("b.img");
    assert_refused(
        &kucofs(&["mkfs", p(&img), "--size", "4K"]),
        "smaller than the 1048576-byte minimum",
    );
    assert!(!img.exists());
    assert!(kucofs(&["mkfs", p(&img), "--size", "2M"]).status.success());
    assert_refused(&kucofs(&["mkfs", p(&img), "--size", "2M"]), "--force");
    assert!(kucofs(&["mkfs", p(&img), "--size", "3M", "--force"])
        .status
        .success());
    assert_refused(
        &kucofs(&[
            "mkfs",
            p(&dir.path().join("no/such/dir.img")),
            "--size",
            "2M",
        ]),
        "No such file or directory",
    );
    // Bad sizes are caught by the argument parser, also without a panic.
    let o = kucofs(&["mkfs", p(&img), "--size", "lots"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not start with a number"));
}

#[test]
fn mkfs_reserves_an_images_memory_and_refuses_an_image_without_room() {
    let dir = shm_dir();
    let img = dir.path().join("r.img");
    assert!(kucofs(&["mkfs", p(&img), "--size", "8M"]).status.success());
    let text = stdout(&kucofs(&["info", p(&img)]));
    assert!(
        text.contains("memory:       8.0 MiB of 8.0 MiB allocated (reserved)"),
        "{text}"
    );
    let img = dir.path().join("s.img");
    let o = kucofs(&["mkfs", p(&img), "--size", "8M", "--sparse"]);
    assert!(o.status.success(), "{o:?}");
    let text = stdout(&kucofs(&["info", p(&img)]));
    assert!(text.contains("of 8.0 MiB allocated (sparse"), "{text}");

    let Some(small) = support::SmallTmpfs::mount(16) else {
        return;
    };
    let img = small.path().join("big.img");
    assert_refused(
        &kucofs(&["mkfs", p(&img), "--size", "64M"]),
        "too few for the 67108864 bytes the image needs now (free some room there; a new image can be made smaller or sparse)",
    );
    // Nothing is left behind: neither the file nor the room it took.
    assert!(!img.exists());
    let o = kucofs(&["mkfs", p(&img), "--size", "12M"]);
    assert!(o.status.success(), "{o:?}");
    // A sparse image reserves its metadata (3/16 of it) only: 12 MiB of a
    // 64 MiB one, which the 4 MiB left cannot hold; then, it fits.
    let sparse = small.path().join("sparse.img");
    let o = kucofs(&["mkfs", p(&sparse), "--size", "64M", "--sparse"]);
    assert_refused(&o, "too few for the 12");
    assert!(!sparse.exists());
    std::fs::remove_file(&img).unwrap();
    let o = kucofs(&["mkfs", p(&sparse), "--size", "64M", "--sparse"]);
    assert!(o.status.success(), "{o:?}");
    let text = stdout(&kucofs(&["info", p(&sparse)]));
    assert!(text.contains("of 64.0 MiB allocated (sparse"), "{text}");
}

#[test]
fn info_refusals_are_one_sentence() {
    let dir = shm_dir();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "x".repeat(20_000)).unwrap();
    assert_refused(&kucofs(&["info", p(&text)]), "is not a KucoFS image");
    assert_refused(
        &kucofs(&["info", p(&dir.path().join("missing.img"))]),
        "No such file or directory",
    );
    let img = dir.path().join("c.img");
    assert!(kucofs(&["mkfs", p(&img), "--size", "8M"]).status.success());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    assert_refused(&kucofs(&["info", p(&img)]), "truncated");
}

#[test]
fn fsck_passes_a_fresh_image_and_lists_damage() {
    let dir = shm_dir();
    let img = dir.path().join("f.img");
    assert!(kucofs(&["mkfs", p(&img), "--size", "8M"]).status.success());
    let o = kucofs(&["fsck", p(&img)]);
    assert!(o.status.success(), "{o:?}");
    assert!(stdout(&o).contains("clean"), "{}", stdout(&o));
    // Mark a data page used that no file owns, and damage superblock copy B.
    let report = kucofs_kfs::inspect(&img).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&[1], report.superblock.geometry.bitmap.offset())
        .unwrap();
    f.write_all_at(&[0xee], 4096 + 100).unwrap();
    let o = kucofs(&["fsck", p(&img)]);
    assert!(!o.status.success());
    let out = stdout(&o);
    assert!(out.contains("superblock copy B is damaged"), "{out}");
    assert!(out.contains("marks 1 data pages in use"), "{out}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("2 problems"));
}
