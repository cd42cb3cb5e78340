use std::os::unix::fs::FileExt;
use std::sync::Arc;

use kucofs_common::format::{LogEntryHeader, LOG_ENTRY_HEADER_SIZE, MIN_IMAGE_SIZE, PAGE_LEN};
use kucofs_common::pm::Recorder;
use parking_lot::Mutex;

use super::*;

/// A log entry header's size, as an offset.
const H: u64 = LOG_ENTRY_HEADER_SIZE as u64;

fn shm_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("kucofs-image-")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset).unwrap();
    buf
}

/// Changes a field of a stored superblock copy and re-checksums it, as a
/// newer build or a hostile writer would.
fn reseal_field(path: &Path, copy: u64, field: usize, value: &[u8]) {
    let mut sb = read_at(path, copy, SUPERBLOCK_SIZE);
    sb[field..field + value.len()].copy_from_slice(value);
    let crc = crc32c::crc32c(&sb[..SUPERBLOCK_SIZE - 4]);
    sb[SUPERBLOCK_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
    patch(path, copy, &sb);
}

#[test]
fn mkfs_then_open_gives_the_same_superblock() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    let sb = mkfs(&path, 8 << 20, false).unwrap();
    assert!(sb.clean);
    assert_eq!(sb.geometry.size, 8 << 20);
    let img = Image::open(&path).unwrap();
    assert_eq!(img.superblock(), &sb);
    assert_eq!(img.copy(), Copy::A);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 8 << 20);
}

#[test]
fn mkfs_refuses_small_sizes_and_existing_files() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    let err = mkfs(&path, MIN_IMAGE_SIZE - 4096, false).unwrap_err();
    assert!(err.to_string().contains("minimum"), "{err}");
    assert!(err.to_string().contains("img"), "{err}");
    assert!(
        !path.exists(),
        "a refused mkfs must not leave a file behind"
    );

    mkfs(&path, 2 << 20, false).unwrap();
    let err = mkfs(&path, 2 << 20, false).unwrap_err();
    assert!(err.to_string().contains("--force"), "{err}");
    assert_eq!(err.errno(), libc::EEXIST);
    let again = mkfs(&path, 4 << 20, true).unwrap();
    assert_eq!(Image::open(&path).unwrap().superblock(), &again);
}

#[test]
fn mkfs_over_an_old_image_clears_its_log() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    let sb = mkfs(&path, 4 << 20, false).unwrap();
    let lap = kucofs_common::format::Lap::of(&sb);
    let h = LogEntryHeader::new(&lap, sb.log_seq, 1, b"stale").unwrap();
    patch(&path, sb.geometry.log.offset(), &h.encode());
    patch(&path, sb.geometry.log.offset() + H, b"stale");
    assert_eq!(inspect(&path).unwrap().log_entries, 1);
    mkfs(&path, 4 << 20, true).unwrap();
    assert_eq!(inspect(&path).unwrap().log_entries, 0);
    // Cleared, not just keyed by the new image's uuid.
    let bytes = std::fs::read(&path).unwrap();
    let log = usize::try_from(sb.geometry.log.offset()).unwrap();
    assert!(bytes[log..log + 64].iter().all(|&b| b == 0));
}

#[test]
fn a_file_without_the_magic_is_not_a_kucofs_image() {
    let dir = shm_dir();
    let path = dir.path().join("text");
    std::fs::write(&path, "hello world\n".repeat(100_000)).unwrap();
    let err = Image::open(&path).unwrap_err();
    assert!(matches!(err, Error::NotKucofs { .. }), "{err:?}");
    assert!(err.to_string().contains("not a KucoFS image"));
    assert!(matches!(
        inspect(&path).unwrap_err(),
        Error::NotKucofs { .. }
    ));
    // A file too short to hold even one copy.
    std::fs::write(&path, b"KucoFS").unwrap();
    assert!(matches!(
        Image::open(&path).unwrap_err(),
        Error::NotKucofs { .. }
    ));
}

#[test]
fn an_intact_superblock_of_another_version_is_refused_by_name() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    mkfs(&path, 2 << 20, false).unwrap();
    // Only copy B from a newer build: still refused, never rolled back to A.
    reseal_field(&path, SUPERBLOCK_OFFSETS[1], 8, &7u32.to_le_bytes());
    let err = Image::open(&path).unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedVersion { version: 7, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("version 7"), "{err}");
}

#[test]
fn unsupported_incompatible_features_are_refused() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    mkfs(&path, 2 << 20, false).unwrap();
    for copy in SUPERBLOCK_OFFSETS {
        reseal_field(&path, copy, 24, &(1u64 << 9).to_le_bytes());
    }
    let err = Image::open(&path).unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedFeatures { bits: 0x200, .. }),
        "{err:?}"
    );
}

#[test]
fn both_copies_corrupt_is_its_own_error() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    mkfs(&path, 2 << 20, false).unwrap();
    patch(&path, SUPERBLOCK_OFFSETS[0] + 100, &[0xaa]);
    patch(&path, SUPERBLOCK_OFFSETS[1] + 200, &[0xbb]);
    let err = Image::open(&path).unwrap_err();
    match &err {
        Error::BothCorrupt { a, b, .. } => {
            assert_eq!(a, &SuperblockFault::BadChecksum);
            assert_eq!(b, &SuperblockFault::BadChecksum);
        }
        other => panic!("expected BothCorrupt, got {other:?}"),
    }
    assert!(err.to_string().contains("both superblock copies"), "{err}");
}

#[test]
fn an_image_shorter_than_its_geometry_is_refused() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    mkfs(&path, 8 << 20, false).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(5 << 20)
        .unwrap();
    let err = Image::open(&path).unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooShort {
                len: 5242880,
                needed: 8388608,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn the_newer_valid_copy_wins() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    let original = mkfs(&path, 2 << 20, false).unwrap();
    // Copy B alone carries a newer update (as after a crash between the two
    // writes of an update, had B been written first).
    let newer = Superblock {
        seq: 9,
        clean: false,
        log_seq: 77,
        ..original.clone()
    };
    patch(&path, SUPERBLOCK_OFFSETS[1], &newer.encode());
    let img = Image::open(&path).unwrap();
    assert_eq!((img.superblock(), img.copy()), (&newer, Copy::B));
    drop(img);
    // And once B is damaged, A (older but valid) is used.
    patch(&path, SUPERBLOCK_OFFSETS[1] + 40, &[0xff]);
    let img = Image::open(&path).unwrap();
    assert_eq!((img.superblock(), img.copy()), (&original, Copy::A));
}

#[test]
fn flipping_any_byte_of_one_copy_never_panics_and_never_misleads() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    let original = mkfs(&path, 2 << 20, false).unwrap();
    let page = PAGE_LEN;
    let copy_a = read_at(&path, 0, page);
    let copy_b = read_at(&path, PAGE_SIZE, page);
    for (target, other) in [(0u64, PAGE_SIZE), (PAGE_SIZE, 0u64)] {
        let pristine = if target == 0 { &copy_a } else { &copy_b };
        for i in 0..page {
            // With the other copy intact: always a clean open of the original.
            let mut damaged = pristine.clone();
            damaged[i] ^= 0xff;
            patch(&path, target, &damaged);
            let img =
                Image::open(&path).unwrap_or_else(|e| panic!("copy at {target}, byte {i}: {e}"));
            assert_eq!(img.superblock(), &original, "copy at {target}, byte {i}");
            drop(img);
            // With the other copy destroyed: a clear error, unless the byte
            // lies past the 512 bytes a copy occupies.
            patch(&path, other, &vec![0u8; page]);
            match Image::open(&path) {
                Ok(img) => {
                    assert!(i >= SUPERBLOCK_SIZE, "byte {i} flipped yet accepted");
                    assert_eq!(img.superblock(), &original);
                }
                Err(e) => {
                    assert!(i < SUPERBLOCK_SIZE, "byte {i}: {e}");
                    assert!(
                        matches!(e, Error::NotKucofs { .. } | Error::BothCorrupt { .. }),
                        "byte {i}: {e:?}"
                    );
                }
            }
            patch(&path, other, if other == 0 { &copy_a } else { &copy_b });
        }
        patch(&path, target, pristine);
    }
}

#[test]
fn a_crash_anywhere_in_a_superblock_update_leaves_old_or_new() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    mkfs(&path, 2 << 20, false).unwrap();
    let rec = Arc::new(Recorder::new());
    let mut img = Image::open_with(&path, rec.clone()).unwrap();
    let before = img.superblock().clone();
    let images = Arc::new(Mutex::new(Vec::new()));
    let sink = images.clone();
    rec.on_fence(move |cp| {
        sink.lock()
            .extend(cp.images(4096).expect("few stores are in flight"))
    });
    img.set_clean(false).unwrap();
    let after = img.superblock().clone();
    assert_eq!(after.seq, before.seq + 1);
    assert!(!after.clean);
    // And a crash after the last fence.
    images.lock().push(rec.durable_image());

    let images = images.lock();
    assert!(images.len() > 2, "only {} crash images", images.len());
    let (mut saw_old, mut saw_new) = (false, false);
    for image in images.iter() {
        let (sb, _) = select_superblock(&path, image.len() as u64, |off, buf| {
            let off = usize::try_from(off).unwrap();
            buf.copy_from_slice(&image[off..off + buf.len()]);
            Ok(())
        })
        .expect("every crash image opens");
        if sb == before {
            saw_old = true;
        } else {
            assert_eq!(sb, after);
            saw_new = true;
        }
    }
    assert!(saw_old && saw_new);
}

#[test]
fn inspect_reports_a_fresh_image_and_respects_the_lock() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    let sb = mkfs(&path, 64 << 20, false).unwrap();
    let report = inspect(&path).unwrap();
    assert_eq!(report.superblock, sb);
    // The root directory's inode page is the only page in use.
    assert_eq!((report.file_pages, report.log_entries), (0, 0));
    assert_eq!(report.store.pages(), 1);
    assert!(report.other_copy_valid);
    // The mapping the image's file allows, from what the kernel says of
    // the file: MAP_SYNC on DAX, an ordinary one on tmpfs.
    let (mode, named) = if kucofs_common::pm::is_dax(&path) == Some(true) {
        (MapMode::Dax, "DAX (MAP_SYNC)")
    } else {
        (MapMode::Emulated, "emulated")
    };
    assert_eq!(report.mode, mode);
    let text = report.to_string();
    for needle in ["clean", named, "64.0 MiB", "log:", "0 entries"] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    // Give three data pages to a file and write one log entry.
    let g = sb.geometry;
    for (i, p) in [5u64, 6, 9].into_iter().enumerate() {
        let o = kucofs_common::format::meta::Owner::File {
            ino: 7,
            page: i as u64,
        };
        patch(
            &path,
            g.owner_offset(g.data.start + p),
            &o.encode().unwrap().to_le_bytes(),
        );
    }
    let lap = kucofs_common::format::Lap::of(&sb);
    let h = LogEntryHeader::new(&lap, sb.log_seq, 2, &[1u8; 100]).unwrap();
    patch(&path, sb.geometry.log.offset(), &h.encode());
    patch(&path, sb.geometry.log.offset() + H, &[1u8; 100]);
    let report = inspect(&path).unwrap();
    assert_eq!((report.file_pages, report.log_entries), (3, 1));
    // A 16-byte header and 100 bytes of payload, padded to two lines.
    assert_eq!(report.log_bytes, 128);

    let _kfs = Image::open(&path).unwrap();
    assert!(matches!(
        inspect(&path).unwrap_err(),
        Error::Region(kucofs_common::Error::Locked { .. })
    ));
}
