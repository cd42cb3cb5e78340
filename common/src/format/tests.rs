use proptest::prelude::*;

use super::*;

fn superblock_for(size: u64) -> Superblock {
    Superblock {
        seq: 1,
        compat: 0,
        incompat: 0,
        clean: true,
        uuid: [7; 16],
        created_ns: 42,
        geometry: Geometry::for_size(size).unwrap(),
        checkpoint: None,
        log_seq: 1,
    }
}

proptest! {
    #[test]
    fn every_size_in_range_gets_a_valid_geometry(size in MIN_IMAGE_SIZE..=(1u64 << 44)) {
        let g = Geometry::for_size(size).unwrap();
        prop_assert_eq!(g.validate(), Ok(()));
        prop_assert!(g.size <= size && size - g.size < PAGE_SIZE);
        prop_assert!(g.bitmap.pages * BITS_PER_BITMAP_PAGE >= g.data.pages);
        // The bitmap is no bigger than it must be: one page fewer could not
        // cover the data pages that page would then leave to the data.
        prop_assert!((g.bitmap.pages - 1) * BITS_PER_BITMAP_PAGE < g.data.pages + 1);
        prop_assert!((LOG_PAGES_MIN..=LOG_PAGES_MAX).contains(&g.log.pages));
    }

    #[test]
    fn superblock_round_trips(
        size in MIN_IMAGE_SIZE..=MAX_IMAGE_SIZE,
        seq: u64,
        compat: u64,
        clean: bool,
        uuid: [u8; 16],
        created_ns: u64,
        ckpt in proptest::option::of((0u8..2, any::<u64>())),
        log_seq: u64,
    ) {
        let sb = Superblock {
            seq,
            compat,
            incompat: 0,
            clean,
            uuid,
            created_ns,
            geometry: Geometry::for_size(size).unwrap(),
            checkpoint: ckpt.map(|(slot, seq)| CheckpointRef { slot, seq }),
            log_seq,
        };
        let bytes = sb.encode();
        prop_assert_eq!(Superblock::decode(&bytes), Ok(sb.clone()));
        // Re-encoding the decoded copy gives the same bytes.
        prop_assert_eq!(Superblock::decode(&bytes).unwrap().encode(), bytes);
    }

    #[test]
    fn log_entries_round_trip_and_scan(payloads in proptest::collection::vec(
        proptest::collection::vec(any::<u8>(), 0..300), 0..20), first_seq: u32) {
        let first_seq = u64::from(first_seq);
        let mut log = vec![0u8; 64 * 1024];
        let mut at = 0usize;
        for (i, p) in payloads.iter().enumerate() {
            let h = LogEntryHeader::new(first_seq + i as u64, 3, p).unwrap();
            log[at..at + LOG_ENTRY_HEADER_SIZE].copy_from_slice(&h.encode());
            log[at + LOG_ENTRY_HEADER_SIZE..at + LOG_ENTRY_HEADER_SIZE + p.len()].copy_from_slice(p);
            prop_assert_eq!(LogEntryHeader::decode(&log[at..]), Some(h));
            at += h.footprint() as usize;
        }
        let found = scan_log(&log, first_seq);
        prop_assert_eq!(found.len(), payloads.len());
        for ((off, h), p) in found.iter().zip(&payloads) {
            prop_assert_eq!(h.len as usize, p.len());
            prop_assert_eq!(*off % LOG_ENTRY_ALIGN, 0);
        }
    }
}

#[test]
fn sizes_below_the_minimum_are_refused() {
    assert_eq!(
        Geometry::for_size(MIN_IMAGE_SIZE - 1),
        Err(GeometryError::TooSmall {
            size: MIN_IMAGE_SIZE - 1,
            min: MIN_IMAGE_SIZE
        })
    );
    assert!(Geometry::for_size(0).is_err());
    assert!(matches!(
        Geometry::for_size(MAX_IMAGE_SIZE + 1),
        Err(GeometryError::TooLarge { .. })
    ));
    assert!(Geometry::for_size(MIN_IMAGE_SIZE).is_ok());
}

#[test]
fn a_changed_byte_fails_the_checksum() {
    let bytes = superblock_for(64 << 20).encode();
    for i in 8..SUPERBLOCK_SIZE {
        let mut b = bytes;
        b[i] ^= 0x01;
        assert_eq!(
            Superblock::decode(&b),
            Err(SuperblockFault::BadChecksum),
            "byte {i}"
        );
    }
    for i in 0..8 {
        let mut b = bytes;
        b[i] ^= 0x80;
        assert_eq!(
            Superblock::decode(&b),
            Err(SuperblockFault::NoMagic),
            "byte {i}"
        );
    }
}

/// Re-checksums a raw superblock after a field was changed on purpose.
fn reseal(bytes: &mut [u8; SUPERBLOCK_SIZE]) {
    let crc = crc32c::crc32c(&bytes[..SUPERBLOCK_SIZE - 4]);
    bytes[SUPERBLOCK_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn valid_copies_of_other_versions_and_features_are_named() {
    // Version 1 (32-byte log entry headers) and a version from later.
    for v in [1, FORMAT_VERSION + 1] {
        let mut b = superblock_for(8 << 20).encode();
        b[8..12].copy_from_slice(&v.to_le_bytes());
        reseal(&mut b);
        assert_eq!(
            Superblock::decode(&b),
            Err(SuperblockFault::UnsupportedVersion(v))
        );
    }

    let mut b = superblock_for(8 << 20).encode();
    b[24..32].copy_from_slice(&0x10u64.to_le_bytes());
    reseal(&mut b);
    assert_eq!(
        Superblock::decode(&b),
        Err(SuperblockFault::UnsupportedFeatures(0x10))
    );
}

#[test]
fn resealed_nonsense_geometry_is_refused_without_overflow() {
    // Each geometry field (offsets 72..152) set to extreme values and
    // resealed: decode must refuse with BadGeometry or BadField, not panic.
    for field in (72..152).step_by(8) {
        for v in [0u64, 1, u64::MAX, u64::MAX / 2, 1 << 40] {
            let mut b = superblock_for(16 << 20).encode();
            b[field..field + 8].copy_from_slice(&v.to_le_bytes());
            reseal(&mut b);
            let original = superblock_for(16 << 20).encode();
            if b == original {
                continue;
            }
            let r = Superblock::decode(&b);
            assert!(
                matches!(
                    r,
                    Err(SuperblockFault::BadGeometry(_)) | Err(SuperblockFault::BadField(_))
                ),
                "field {field} = {v}: {r:?}"
            );
        }
    }
}

#[test]
fn log_scan_stops_at_a_torn_or_out_of_sequence_entry() {
    const H: usize = LOG_ENTRY_HEADER_SIZE;
    let mut log = vec![0u8; 4096];
    let mut at = 0usize;
    for seq in 10..14u64 {
        let payload = vec![seq as u8; 40];
        let h = LogEntryHeader::new(seq, 1, &payload).unwrap();
        log[at..at + H].copy_from_slice(&h.encode());
        log[at + H..at + H + 40].copy_from_slice(&payload);
        at += h.footprint() as usize;
    }
    assert_eq!(scan_log(&log, 10).len(), 4);
    // A log that starts later in sequence has no entries yet.
    assert_eq!(scan_log(&log, 11).len(), 0);
    // Tear the third entry's payload (entries are one line each): only
    // two survive.
    log[2 * 64 + H + 20] ^= 0xff;
    assert_eq!(scan_log(&log, 10).len(), 2);
    // A header whose length runs past the area ends the scan.
    let mut tiny = vec![0u8; 64];
    let h = LogEntryHeader::new(0, 1, &[0u8; 100]).unwrap();
    tiny[..H].copy_from_slice(&h.encode());
    assert_eq!(scan_log(&tiny, 0).len(), 0);
}

#[test]
fn an_entry_of_up_to_48_payload_bytes_is_one_line_and_a_payload_of_64_kib_is_refused() {
    let line = |n: usize| {
        LogEntryHeader::new(1, 1, &vec![7u8; n])
            .unwrap()
            .footprint()
    };
    assert_eq!(line(0), 64);
    assert_eq!(line(64 - LOG_ENTRY_HEADER_SIZE), 64);
    assert_eq!(line(64 - LOG_ENTRY_HEADER_SIZE + 1), 128);
    assert!(LogEntryHeader::new(1, 1, &vec![0u8; LOG_PAYLOAD_MAX]).is_some());
    assert_eq!(
        LogEntryHeader::new(1, 1, &vec![0u8; LOG_PAYLOAD_MAX + 1]),
        None
    );
}

/// Where the pages left after the log and checkpoints are one more than a
/// multiple of a bitmap page plus the data pages it covers, one page can
/// go neither to the data (it would need a bitmap page more) nor nowhere
/// (the areas tile the image): the bitmap keeps it, covering nothing.
#[test]
fn a_rest_one_past_a_whole_number_of_bitmap_groups_leaves_the_bitmap_a_spare_page() {
    let g = Geometry::for_size(3_994_288_054_272).unwrap();
    assert_eq!(g.validate(), Ok(()));
    let rest = g.bitmap.pages + g.data.pages;
    assert_eq!(rest % (BITS_PER_BITMAP_PAGE + 1), 1);
    assert_eq!((g.bitmap.pages - 1) * BITS_PER_BITMAP_PAGE, g.data.pages);
}
