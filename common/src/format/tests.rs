use proptest::prelude::*;

use super::*;

const UUID: [u8; 16] = [7; 16];

fn superblock_for(size: u64) -> Superblock {
    Superblock {
        seq: 1,
        compat: 0,
        incompat: 0,
        clean: true,
        uuid: [7; 16],
        created_ns: 42,
        geometry: Geometry::for_size(size).unwrap(),
        log_seq: 1,
    }
}

/// The log and the owner table take at most 1/160 of an image of 1 GiB or
/// more, and about 1/256 of a large one.
fn assert_overhead(size: u64) {
    let g = Geometry::for_size(size).unwrap();
    let pages = size / PAGE_SIZE;
    let overhead = g.log.pages + g.owners.pages;
    if size >= 1 << 30 {
        assert!(overhead * 160 < pages, "{overhead} of {pages}");
    }
    if size >= 1 << 36 {
        assert!(overhead * 240 < pages, "{overhead} of {pages}");
    }
}

#[test]
fn metadata_overhead_is_bounded_where_the_retirement_period_peaks() {
    // Random sizes over the whole range seldom land near these, where the
    // retirement period is largest against the image.
    for size in [
        1 << 30,
        3 << 30,
        4 << 30,
        (4 << 30) + PAGE_SIZE,
        8 << 30,
        1 << 36,
    ] {
        assert_overhead(size);
    }
}

proptest! {
    #[test]
    fn every_size_in_range_gets_a_valid_geometry(size in MIN_IMAGE_SIZE..=(1u64 << 44)) {
        let g = Geometry::for_size(size).unwrap();
        prop_assert_eq!(g.validate(), Ok(()));
        prop_assert!(g.size <= size && size - g.size < PAGE_SIZE);
        prop_assert!(g.owners.pages * OWNERS_PER_PAGE >= g.data.pages);
        // The owner table is no bigger than it must be: one page fewer could
        // not cover the data pages that page would then leave to the data.
        prop_assert!((g.owners.pages - 1) * OWNERS_PER_PAGE < g.data.pages + 1);
        // The log holds a rewrite of the whole owner table and two
        // retirement periods.
        prop_assert!(g.log.pages >= log_pages_for(g.owners.pages, RETIRE_PAGES_MIN));
        prop_assert!(g.retire_bytes() >= PAGE_SIZE);
        assert_overhead(size);
    }

    #[test]
    fn superblock_round_trips(
        size in MIN_IMAGE_SIZE..=MAX_IMAGE_SIZE,
        seq: u64,
        compat: u64,
        clean: bool,
        uuid: [u8; 16],
        created_ns: u64,
        log_seq in 1..LOG_SEQ_MAX,
    ) {
        let sb = Superblock {
            seq,
            compat,
            incompat: 0,
            clean,
            uuid,
            created_ns,
            geometry: Geometry::for_size(size).unwrap(),
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
            let h = LogEntryHeader::new(&Lap::new(&UUID, first_seq), first_seq + i as u64, 3, p).unwrap();
            log[at..at + LOG_ENTRY_HEADER_SIZE].copy_from_slice(&h.encode());
            log[at + LOG_ENTRY_HEADER_SIZE..at + LOG_ENTRY_HEADER_SIZE + p.len()].copy_from_slice(p);
            prop_assert_eq!(LogEntryHeader::decode(&log[at..]), Some(h));
            at += h.footprint_len();
        }
        let found = scan_log(&log, &Lap::new(&UUID, first_seq));
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
    // Version 1 (32-byte log entry headers), 2 (checkpoint slots) and a
    // version from later.
    for v in [1, 2, FORMAT_VERSION + 1] {
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
    // Each geometry field (offsets 72..136) set to extreme values and
    // resealed: decode must refuse with BadGeometry or BadField, not panic.
    for field in (72..136).step_by(8) {
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
        let payload = vec![u8::try_from(seq).unwrap(); 40];
        let h = LogEntryHeader::new(&Lap::new(&UUID, 10), seq, 1, &payload).unwrap();
        log[at..at + H].copy_from_slice(&h.encode());
        log[at + H..at + H + 40].copy_from_slice(&payload);
        at += h.footprint_len();
    }
    assert_eq!(scan_log(&log, &Lap::new(&UUID, 10)).len(), 4);
    // A lap that starts later in sequence has no entries yet, nor does
    // the same lap of another image.
    assert_eq!(scan_log(&log, &Lap::new(&UUID, 11)).len(), 0);
    assert_eq!(scan_log(&log, &Lap::new(&[8; 16], 10)).len(), 0);
    // Tear the third entry's payload (entries are one line each): only
    // two survive.
    log[2 * 64 + H + 20] ^= 0xff;
    assert_eq!(scan_log(&log, &Lap::new(&UUID, 10)).len(), 2);
    // A header whose length runs past the area ends the scan.
    let mut tiny = vec![0u8; 64];
    let h = LogEntryHeader::new(&Lap::new(&UUID, 1), 1, 1, &[0u8; 100]).unwrap();
    tiny[..H].copy_from_slice(&h.encode());
    assert_eq!(scan_log(&tiny, &Lap::new(&UUID, 1)).len(), 0);
}

#[test]
fn an_entry_of_up_to_48_payload_bytes_is_one_line_and_a_payload_of_64_kib_is_refused() {
    let line = |n: usize| {
        LogEntryHeader::new(&Lap::new(&UUID, 1), 1, 1, &vec![7u8; n])
            .unwrap()
            .footprint()
    };
    assert_eq!(line(0), 64);
    assert_eq!(line(64 - LOG_ENTRY_HEADER_SIZE), 64);
    assert_eq!(line(64 - LOG_ENTRY_HEADER_SIZE + 1), 128);
    let lap = Lap::new(&UUID, 1);
    assert!(LogEntryHeader::new(&lap, 1, 1, &vec![0u8; LOG_PAYLOAD_MAX]).is_some());
    assert_eq!(
        LogEntryHeader::new(&lap, 1, 1, &vec![0u8; LOG_PAYLOAD_MAX + 1]),
        None
    );
}

/// Where the pages left after the log are one more than a multiple of an
/// owner page plus the data pages it covers, one page can go neither to the
/// data (it would need an owner page more) nor nowhere (the areas tile the
/// image): the owner table keeps it, covering nothing.
#[test]
fn a_rest_one_past_a_whole_number_of_owner_groups_leaves_the_table_a_spare_page() {
    let size = (0u64..)
        .map(|k| (1u64 << 30) + k * PAGE_SIZE)
        .find(|&s| {
            let g = Geometry::for_size(s).unwrap();
            (g.owners.pages + g.data.pages) % (OWNERS_PER_PAGE + 1) == 1
        })
        .unwrap();
    let g = Geometry::for_size(size).unwrap();
    assert_eq!(g.validate(), Ok(()));
    assert_eq!((g.owners.pages - 1) * OWNERS_PER_PAGE, g.data.pages);
}

#[test]
fn a_log_that_cannot_hold_a_rewrite_of_the_owner_table_is_refused() {
    let mut g = Geometry::for_size(64 << 20).unwrap();
    g.log.pages = g.owners.pages;
    g.owners.start = g.log.end();
    g.data.start = g.owners.end();
    g.data.pages = g.size / PAGE_SIZE - g.data.start;
    assert!(matches!(g.validate(), Err(GeometryError::Inconsistent(_))));
}

fn lap(first_seq: u64, entries: usize) -> (Vec<u8>, Vec<u64>) {
    const H: usize = LOG_ENTRY_HEADER_SIZE;
    let mut log = vec![0u8; 16 * 1024];
    let mut offsets = Vec::new();
    let mut at = 0usize;
    for i in 0..entries {
        let payload = vec![u8::try_from(i).unwrap(); 30 + 20 * (i % 4)];
        let h = LogEntryHeader::new(
            &Lap::new(&UUID, first_seq),
            first_seq + i as u64,
            1,
            &payload,
        )
        .unwrap();
        log[at..at + H].copy_from_slice(&h.encode());
        log[at + H..at + H + payload.len()].copy_from_slice(&payload);
        offsets.push(at as u64);
        at += h.footprint_len();
    }
    (log, offsets)
}

#[test]
fn damage_with_entries_after_it_is_told_from_a_torn_end() {
    let (mut log, offsets) = lap(100, 10);
    let len = log.len() as u64;
    let end = scan_log_with(len, &Lap::new(&UUID, 100), slice_reader(&log), |_, _, _| {});
    assert_eq!((end.entries, end.next_seq), (10, 110));
    assert_eq!(
        find_damage(len, &Lap::new(&UUID, 100), &end, slice_reader(&log)),
        None
    );
    // The last entry torn: the end, not damage.
    log[usize::try_from(offsets[9]).unwrap() + 20] ^= 0x10;
    let end = scan_log_with(len, &Lap::new(&UUID, 100), slice_reader(&log), |_, _, _| {});
    assert_eq!(end.entries, 9);
    assert_eq!(
        find_damage(len, &Lap::new(&UUID, 100), &end, slice_reader(&log)),
        None
    );
    // Bit 4 of an earlier entry's first byte flipped: five acknowledged
    // entries follow it, and the scan says so.
    log[usize::try_from(offsets[3]).unwrap()] ^= 0x10;
    let end = scan_log_with(len, &Lap::new(&UUID, 100), slice_reader(&log), |_, _, _| {});
    assert_eq!(end.entries, 3);
    let damage = find_damage(len, &Lap::new(&UUID, 100), &end, slice_reader(&log)).unwrap();
    assert_eq!(
        (damage.at, damage.seq, damage.following),
        (offsets[3], 103, 5)
    );
    assert!(damage.to_string().contains("sequence 103"));
}

#[test]
fn entries_of_an_earlier_lap_past_the_end_are_not_damage() {
    // An earlier lap wrote 10 entries; the lap after it, starting over at
    // the area's beginning with higher sequences, wrote 3 over them.
    let (mut log, _) = lap(100, 10);
    let (newer, offsets) = lap(500, 3);
    let over = usize::try_from(offsets[2]).unwrap() + 128;
    log[..over].copy_from_slice(&newer[..over]);
    let len = log.len() as u64;
    let end = scan_log_with(len, &Lap::new(&UUID, 500), slice_reader(&log), |_, _, _| {});
    assert_eq!(end.entries, 3);
    assert_eq!(
        find_damage(len, &Lap::new(&UUID, 500), &end, slice_reader(&log)),
        None
    );
}
