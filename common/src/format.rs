//! The on-media format of a KucoFS image, read from its constants:
//!
//! ```text
//! page 0            superblock, copy A
//! page 1            superblock, copy B
//! log_start ..      operation log: checksummed redo entries, cache-line aligned
//! owners_start ..   owner table: one 8-byte owner entry per data page
//! data_start ..     data pages (4 KiB each): file data, and the metadata
//!                   store's pages (inode table, directory entries, symlink
//!                   targets), which the owner table names
//! ```
//!
//! The metadata store's records are laid out in [`meta`]. Every on-media
//! struct is `#[repr(C)]` or a fixed byte layout with its size pinned by a
//! const assert, stored little-endian (the crate only builds for
//! little-endian x86-64, so native order is little-endian order), and
//! converted to and from its in-memory form here and nowhere else.
//!
//! The two superblock copies are written one after the other, each persisted
//! before the next, and carry a sequence number: an opener takes the valid
//! copy with the higher sequence, so a crash while writing either one leaves
//! the other intact.

use std::fmt;

use bytemuck::{Pod, Zeroable};

pub mod meta;

/// Size of a data page and the unit of every area.
pub const PAGE_SIZE: u64 = PAGE_LEN as u64;
/// [`PAGE_SIZE`] as a `usize`, for buffers and slices of one page.
pub const PAGE_LEN: usize = 4096;

/// The number of a data page: its place in the region, in units of
/// [`PAGE_SIZE`] from the region's start. 0 is the first superblock's
/// page, never a file's, so a block-map entry uses it for a hole.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub struct PageNo(u64);

impl PageNo {
    /// No page (a hole in a block map).
    pub const NONE: PageNo = PageNo(0);

    /// Page `n`.
    #[inline(always)]
    pub const fn new(n: u64) -> PageNo {
        PageNo(n)
    }

    /// The number.
    #[inline(always)]
    pub const fn get(self) -> u64 {
        self.0
    }

    /// True for [`PageNo::NONE`].
    #[inline(always)]
    pub const fn is_none(self) -> bool {
        self.0 == 0
    }

    /// The page's first byte, as an offset in the region.
    #[inline(always)]
    pub const fn byte_offset(self) -> u64 {
        self.0 * PAGE_SIZE
    }

    /// The page `n` pages on.
    #[inline(always)]
    pub const fn plus(self, n: u64) -> PageNo {
        PageNo(self.0 + n)
    }
}

impl fmt::Debug for PageNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "page {}", self.0)
    }
}

impl fmt::Display for PageNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
/// The superblock magic: "KucoFS" and two bytes that make a text file unlikely
/// to match.
pub const MAGIC: [u8; 8] = *b"KucoFS\x00\xf5";
/// The format version this build reads and writes (3: metadata kept in a
/// store of records in the data pages, named by the owner table; 2 kept it
/// in two fixed checkpoint slots).
pub const FORMAT_VERSION: u32 = 3;
/// Bytes of one superblock copy; the rest of its page is unused.
pub const SUPERBLOCK_SIZE: usize = 512;
/// Byte offsets of superblock copies A and B.
pub const SUPERBLOCK_OFFSETS: [u64; 2] = [0, PAGE_SIZE];
/// Pages before the log: the two superblock copies.
pub const SUPERBLOCK_PAGES: u64 = 2;
/// The smallest image mkfs will make.
pub const MIN_IMAGE_SIZE: u64 = 1 << 20;
/// The largest image the format describes (1 PiB).
pub const MAX_IMAGE_SIZE: u64 = 1 << 50;
/// Fewest data pages a geometry may leave.
pub const MIN_DATA_PAGES: u64 = 16;
/// Bytes of one owner entry.
pub const OWNER_SIZE: u64 = 8;
/// Owner entries in one page of the owner table.
pub const OWNERS_PER_PAGE: u64 = PAGE_SIZE / OWNER_SIZE;
/// Log pages between two retirements of the log, at most: the log is
/// retired (its changes written into the metadata store) once the entries
/// since the last retirement and the store records they call for reach
/// this much, or a quarter of the log if that is less. Bounds the work of
/// one retirement, and so Kfs's longest pause.
pub const RETIRE_PAGES_MAX: u64 = 1024;
/// Fewest log pages between two retirements.
pub const RETIRE_PAGES_MIN: u64 = 16;
/// Pages the log keeps beyond what its entries and one retirement need.
pub const LOG_SLACK_PAGES: u64 = 16;

/// Superblock flag: the file system was unmounted cleanly (its log was
/// retired and nothing needs replaying).
pub const FLAG_CLEAN: u64 = 1 << 0;
/// Flags this build understands; others make a copy invalid.
pub const FLAGS_KNOWN: u64 = FLAG_CLEAN;
/// Incompatible features this build supports (none yet): an image with any
/// other incompatible bit set is refused.
pub const INCOMPAT_SUPPORTED: u64 = 0;

/// A contiguous run of pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Area {
    /// First page.
    pub start: u64,
    /// Number of pages.
    pub pages: u64,
}

impl Area {
    /// Byte offset of the area's first page.
    pub fn offset(&self) -> u64 {
        self.start * PAGE_SIZE
    }
    /// Length of the area in bytes.
    pub fn len(&self) -> u64 {
        self.pages * PAGE_SIZE
    }
    /// True if the area holds no page.
    pub fn is_empty(&self) -> bool {
        self.pages == 0
    }
    /// The page after the last one.
    pub fn end(&self) -> u64 {
        self.start + self.pages
    }
    /// True if page `p` lies in the area.
    pub fn contains(&self, p: u64) -> bool {
        p >= self.start && p < self.end()
    }
}

/// Where each area of an image lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes covered by the file system (a whole number of pages).
    pub size: u64,
    /// The operation log.
    pub log: Area,
    /// The owner table: one entry per data page.
    pub owners: Area,
    /// The data pages.
    pub data: Area,
}

/// Why a geometry cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GeometryError {
    /// Below [`MIN_IMAGE_SIZE`] (or too small to leave [`MIN_DATA_PAGES`]).
    TooSmall { size: u64, min: u64 },
    /// Above [`MAX_IMAGE_SIZE`].
    TooLarge { size: u64, max: u64 },
    /// The areas do not tile the image as the format requires.
    Inconsistent(&'static str),
}

impl fmt::Display for GeometryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GeometryError::TooSmall { size, min } => {
                write!(f, "{size} bytes is smaller than the {min}-byte minimum")
            }
            GeometryError::TooLarge { size, max } => {
                write!(f, "{size} bytes is larger than the {max}-byte maximum")
            }
            GeometryError::Inconsistent(why) => write!(f, "inconsistent geometry: {why}"),
        }
    }
}

/// Pages of the owner table for `data_pages` data pages.
pub const fn owner_pages(data_pages: u64) -> u64 {
    data_pages.div_ceil(OWNERS_PER_PAGE)
}

/// The log pages between retirements for an image of `pages` pages: 1/1024
/// of it, within [`RETIRE_PAGES_MIN`]..=[`RETIRE_PAGES_MAX`].
const fn retire_pages_for(pages: u64) -> u64 {
    let p = pages / 1024;
    if p < RETIRE_PAGES_MIN {
        RETIRE_PAGES_MIN
    } else if p > RETIRE_PAGES_MAX {
        RETIRE_PAGES_MAX
    } else {
        p
    }
}

/// The smallest log for an owner table of `owner_pages` pages: room for the
/// entries of one retirement period, for the retirement's own records (one
/// retirement may rewrite the whole owner table, when one change drops a
/// file holding most of the pages, plus as many store records again as the
/// period's entries), and slack.
pub const fn log_pages_for(owner_pages: u64, retire_pages: u64) -> u64 {
    // A batch rewriting the owner table writes it a page at a time, each
    // with a 12-byte header, in log entries with 16-byte headers: a page
    // more per 256.
    owner_pages + owner_pages.div_ceil(256) + 2 * retire_pages + LOG_SLACK_PAGES
}

impl Geometry {
    /// The geometry mkfs lays out for an image of `size` bytes (rounded down
    /// to whole pages): the log sized by [`log_pages_for`], the owner table
    /// the data pages need, and the rest data pages. The log and the owner
    /// table together take at most about 1/160 of an image of 1 GiB or more
    /// and about 1/256 of a large one.
    pub fn for_size(size: u64) -> Result<Geometry, GeometryError> {
        if size < MIN_IMAGE_SIZE {
            return Err(GeometryError::TooSmall {
                size,
                min: MIN_IMAGE_SIZE,
            });
        }
        if size > MAX_IMAGE_SIZE {
            return Err(GeometryError::TooLarge {
                size,
                max: MAX_IMAGE_SIZE,
            });
        }
        let pages = size / PAGE_SIZE;
        // The owner table can be no larger than the one for every page.
        let log_pages = log_pages_for(owner_pages(pages), retire_pages_for(pages));
        let too_small = GeometryError::TooSmall {
            size,
            min: MIN_IMAGE_SIZE,
        };
        let rest = pages
            .checked_sub(SUPERBLOCK_PAGES + log_pages)
            .ok_or(too_small.clone())?;
        // Each owner page covers OWNERS_PER_PAGE data pages, and takes one
        // page itself from the rest.
        let owners = rest.div_ceil(OWNERS_PER_PAGE + 1);
        let data_pages = rest - owners;
        if data_pages < MIN_DATA_PAGES {
            return Err(too_small);
        }
        let log = Area {
            start: SUPERBLOCK_PAGES,
            pages: log_pages,
        };
        let owners = Area {
            start: log.end(),
            pages: owners,
        };
        let data = Area {
            start: owners.end(),
            pages: data_pages,
        };
        let g = Geometry {
            size: pages * PAGE_SIZE,
            log,
            owners,
            data,
        };
        debug_assert_eq!(g.validate(), Ok(()));
        Ok(g)
    }

    /// Checks that the areas tile the image in order with no gap or overlap,
    /// and that the log can hold what one retirement writes, using only
    /// checked arithmetic (the values may come from a damaged or hostile
    /// image).
    pub fn validate(&self) -> Result<(), GeometryError> {
        use GeometryError::Inconsistent as Bad;
        if !self.size.is_multiple_of(PAGE_SIZE) {
            return Err(Bad("size is not a whole number of pages"));
        }
        if self.size < MIN_IMAGE_SIZE {
            return Err(GeometryError::TooSmall {
                size: self.size,
                min: MIN_IMAGE_SIZE,
            });
        }
        if self.size > MAX_IMAGE_SIZE {
            return Err(GeometryError::TooLarge {
                size: self.size,
                max: MAX_IMAGE_SIZE,
            });
        }
        let end = |a: &Area| a.start.checked_add(a.pages).ok_or(Bad("area overflows"));
        if self.log.start != SUPERBLOCK_PAGES {
            return Err(Bad("the log does not follow the superblocks"));
        }
        if self.owners.start != end(&self.log)? {
            return Err(Bad("the owner table does not follow the log"));
        }
        if self.data.start != end(&self.owners)? {
            return Err(Bad("the data pages do not follow the owner table"));
        }
        if end(&self.data)? != self.size / PAGE_SIZE {
            return Err(Bad("the data pages do not end at the end of the image"));
        }
        if self.data.pages < MIN_DATA_PAGES {
            return Err(Bad("fewer data pages than the minimum"));
        }
        if self.owners.pages < owner_pages(self.data.pages) {
            return Err(Bad("the owner table is too small for the data pages"));
        }
        if self.log.pages < log_pages_for(self.owners.pages, RETIRE_PAGES_MIN) {
            return Err(Bad("the log is too small to retire into the store"));
        }
        Ok(())
    }

    /// Bytes of log entries and store records after which the log is
    /// retired: a quarter of what the log holds beyond one rewrite of the
    /// owner table, at most [`RETIRE_PAGES_MAX`] pages.
    pub fn retire_bytes(&self) -> u64 {
        let spare = self.log.pages.saturating_sub(self.owners.pages) / 4;
        spare.clamp(1, RETIRE_PAGES_MAX) * PAGE_SIZE
    }

    /// Byte offset of the owner entry of data page `p` (which must lie in
    /// the data area).
    pub fn owner_offset(&self, p: u64) -> u64 {
        self.owners.offset() + (p - self.data.start) * OWNER_SIZE
    }
}

/// The superblock, as the rest of the code sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Incremented on every superblock update; the higher valid copy wins.
    pub seq: u64,
    /// Compatible feature bits (an older reader may ignore them).
    pub compat: u64,
    /// Incompatible feature bits (an older reader must refuse the image).
    pub incompat: u64,
    /// Set at clean unmount, cleared while a Kfs has the image open.
    pub clean: bool,
    /// Identifies the file system.
    pub uuid: [u8; 16],
    /// When mkfs made it, in nanoseconds since the Unix epoch.
    pub created_ns: u64,
    /// Where the areas lie.
    pub geometry: Geometry,
    /// Sequence number of the log entry at the start of the log area:
    /// everything before it is in the metadata store, and recovery reads
    /// the log from there.
    pub log_seq: u64,
}

/// Why one superblock copy is not usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SuperblockFault {
    /// The magic is absent: not a KucoFS superblock at all.
    NoMagic,
    /// The checksum does not match the contents.
    BadChecksum,
    /// A valid copy of a version this build does not read.
    UnsupportedVersion(u32),
    /// A valid copy needing features this build lacks.
    UnsupportedFeatures(u64),
    /// A field holds a value the format does not allow.
    BadField(&'static str),
    /// The geometry is not one the format allows.
    BadGeometry(GeometryError),
}

impl fmt::Display for SuperblockFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SuperblockFault::NoMagic => f.write_str("no KucoFS magic"),
            SuperblockFault::BadChecksum => f.write_str("checksum mismatch"),
            SuperblockFault::UnsupportedVersion(v) => {
                write!(f, "format version {v} (this build reads {FORMAT_VERSION})")
            }
            SuperblockFault::UnsupportedFeatures(bits) => {
                write!(f, "unsupported incompatible features {bits:#x}")
            }
            SuperblockFault::BadField(why) => f.write_str(why),
            SuperblockFault::BadGeometry(e) => e.fmt(f),
        }
    }
}

/// The superblock exactly as stored.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct RawSuperblock {
    magic: [u8; 8],
    version: u32,
    sb_size: u32,
    seq: u64,
    incompat: u64,
    compat: u64,
    flags: u64,
    uuid: [u8; 16],
    created_ns: u64,
    size: u64,
    page_size: u32,
    pad: u32,
    log_start: u64,
    log_pages: u64,
    owners_start: u64,
    owners_pages: u64,
    data_start: u64,
    data_pages: u64,
    log_seq: u64,
    reserved: [u8; 364],
    /// CRC-32C of every byte before it.
    crc: u32,
}

const _: () = assert!(std::mem::size_of::<RawSuperblock>() == SUPERBLOCK_SIZE);
const _: () = assert!(std::mem::offset_of!(RawSuperblock, crc) == SUPERBLOCK_SIZE - 4);
const _: () = assert!(std::mem::offset_of!(RawSuperblock, log_start) == 88);
// Where the version lies in every format version: a reader finds it there
// to refuse an image it does not read.
const _: () = assert!(std::mem::offset_of!(RawSuperblock, version) == 8);

// The stored `sb_size` and `page_size` fields are `u32`s; both sizes (512
// and 4096) fit one by far.
#[allow(clippy::cast_possible_truncation)]
const SB_SIZE_FIELD: u32 = SUPERBLOCK_SIZE as u32;
#[allow(clippy::cast_possible_truncation)]
const PAGE_SIZE_FIELD: u32 = PAGE_SIZE as u32;

impl Superblock {
    /// The superblock as stored, checksum included.
    pub fn encode(&self) -> [u8; SUPERBLOCK_SIZE] {
        let g = &self.geometry;
        let mut raw = RawSuperblock {
            magic: MAGIC,
            version: FORMAT_VERSION,
            sb_size: SB_SIZE_FIELD,
            seq: self.seq,
            incompat: self.incompat,
            compat: self.compat,
            flags: if self.clean { FLAG_CLEAN } else { 0 },
            uuid: self.uuid,
            created_ns: self.created_ns,
            size: g.size,
            page_size: PAGE_SIZE_FIELD,
            pad: 0,
            log_start: g.log.start,
            log_pages: g.log.pages,
            owners_start: g.owners.start,
            owners_pages: g.owners.pages,
            data_start: g.data.start,
            data_pages: g.data.pages,
            log_seq: self.log_seq,
            reserved: [0; 364],
            crc: 0,
        };
        raw.crc = crate::checksum::crc32c(&bytemuck::bytes_of(&raw)[..SUPERBLOCK_SIZE - 4]);
        let mut out = [0u8; SUPERBLOCK_SIZE];
        out.copy_from_slice(bytemuck::bytes_of(&raw));
        out
    }

    /// Reads one superblock copy, checking magic, checksum, version,
    /// features, flags and geometry, in that order: a damaged field shows as
    /// a checksum mismatch rather than as an odd version.
    pub fn decode(bytes: &[u8]) -> Result<Superblock, SuperblockFault> {
        if bytes.len() < SUPERBLOCK_SIZE || bytes[..8] != MAGIC {
            return Err(SuperblockFault::NoMagic);
        }
        let raw: RawSuperblock = bytemuck::pod_read_unaligned(&bytes[..SUPERBLOCK_SIZE]);
        if crate::checksum::crc32c(&bytes[..SUPERBLOCK_SIZE - 4]) != raw.crc {
            return Err(SuperblockFault::BadChecksum);
        }
        if raw.version != FORMAT_VERSION {
            return Err(SuperblockFault::UnsupportedVersion(raw.version));
        }
        if raw.incompat & !INCOMPAT_SUPPORTED != 0 {
            return Err(SuperblockFault::UnsupportedFeatures(
                raw.incompat & !INCOMPAT_SUPPORTED,
            ));
        }
        if raw.sb_size as usize != SUPERBLOCK_SIZE {
            return Err(SuperblockFault::BadField("superblock size is not 512"));
        }
        if u64::from(raw.page_size) != PAGE_SIZE {
            return Err(SuperblockFault::BadField("page size is not 4096"));
        }
        if raw.flags & !FLAGS_KNOWN != 0 {
            return Err(SuperblockFault::BadField("unknown flags are set"));
        }
        if raw.pad != 0 || raw.reserved.iter().any(|&b| b != 0) {
            return Err(SuperblockFault::BadField("reserved bytes are not zero"));
        }
        let geometry = Geometry {
            size: raw.size,
            log: Area {
                start: raw.log_start,
                pages: raw.log_pages,
            },
            owners: Area {
                start: raw.owners_start,
                pages: raw.owners_pages,
            },
            data: Area {
                start: raw.data_start,
                pages: raw.data_pages,
            },
        };
        geometry.validate().map_err(SuperblockFault::BadGeometry)?;
        if raw.log_seq == 0 || raw.log_seq >= LOG_SEQ_MAX {
            return Err(SuperblockFault::BadField(
                "the log sequence is out of range",
            ));
        }
        Ok(Superblock {
            seq: raw.seq,
            compat: raw.compat,
            incompat: raw.incompat,
            clean: raw.flags & FLAG_CLEAN != 0,
            uuid: raw.uuid,
            created_ns: raw.created_ns,
            geometry,
            log_seq: raw.log_seq,
        })
    }
}

/// Size of a log entry header.
pub const LOG_ENTRY_HEADER_SIZE: usize = 16;
/// Largest payload a log entry holds (its length is a `u16`).
pub const LOG_PAYLOAD_MAX: usize = u16::MAX as usize;
/// Log entries start on cache-line boundaries, so that an entry's persist
/// never shares a line with the next entry's stores.
pub const LOG_ENTRY_ALIGN: u64 = 64;

/// The header of one operation-log entry. The payload (`len` bytes, the
/// redo record of one operation) follows it; the next entry starts at the
/// next [`LOG_ENTRY_ALIGN`] boundary. The header is 16 bytes so that the
/// commonest entries (a create or an unlink with a short name, a one-page
/// write) fit one cache line: one line to persist, and a log that holds
/// twice as many of them before it needs a checkpoint.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
pub struct LogEntryHeader {
    /// CRC-32C of the header's bytes after this field, then the payload.
    pub crc: u32,
    /// Payload length in bytes.
    pub len: u16,
    /// Operation code of the payload.
    pub op: u16,
    /// Log sequence number: consecutive from the superblock's `log_seq`.
    pub seq: u64,
}

const _: () = assert!(std::mem::size_of::<LogEntryHeader>() == LOG_ENTRY_HEADER_SIZE);

/// A lap of the log: the entries written from the log area's beginning
/// after one retirement (or mkfs), with consecutive sequence numbers from
/// `first_seq`. Their checksums are keyed by the image's uuid and
/// `first_seq`, so that bytes left in the area by an earlier lap never
/// verify as entries of a later one, nor do bytes a user of the file
/// system chose (file names, times: a retirement's batch carries store
/// records as they are), without the uuid, which only the image holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lap {
    /// The sequence number of the lap's first entry.
    pub first_seq: u64,
    key: u32,
}

impl Lap {
    /// The lap of image `uuid` that starts at sequence `first_seq`.
    pub fn new(uuid: &[u8; 16], first_seq: u64) -> Lap {
        let key =
            crate::checksum::crc32c_append(crate::checksum::crc32c(uuid), &first_seq.to_le_bytes());
        Lap { first_seq, key }
    }

    /// The lap the superblock `sb` names.
    pub fn of(sb: &Superblock) -> Lap {
        Lap::new(&sb.uuid, sb.log_seq)
    }
}

impl LogEntryHeader {
    /// The header for a payload of `lap`, checksum computed; `None` if the
    /// payload is longer than [`LOG_PAYLOAD_MAX`].
    pub fn new(lap: &Lap, seq: u64, op: u16, payload: &[u8]) -> Option<LogEntryHeader> {
        let mut h = LogEntryHeader {
            crc: 0,
            len: u16::try_from(payload.len()).ok()?,
            op,
            seq,
        };
        h.crc = h.checksum(lap, payload);
        Some(h)
    }

    fn checksum(&self, lap: &Lap, payload: &[u8]) -> u32 {
        let head = crate::checksum::crc32c_append(lap.key, &bytemuck::bytes_of(self)[4..]);
        crate::checksum::crc32c_append(head, payload)
    }

    /// The header's bytes.
    pub fn encode(&self) -> [u8; LOG_ENTRY_HEADER_SIZE] {
        let mut out = [0u8; LOG_ENTRY_HEADER_SIZE];
        out.copy_from_slice(bytemuck::bytes_of(self));
        out
    }

    /// Reads a header from the first [`LOG_ENTRY_HEADER_SIZE`] bytes.
    pub fn decode(bytes: &[u8]) -> Option<LogEntryHeader> {
        bytes
            .get(..LOG_ENTRY_HEADER_SIZE)
            .map(bytemuck::pod_read_unaligned)
    }

    /// True if `payload` is this entry's intact payload, in `lap`.
    pub fn verify(&self, lap: &Lap, payload: &[u8]) -> bool {
        payload.len() == usize::from(self.len) && self.checksum(lap, payload) == self.crc
    }

    /// Bytes the entry occupies in the log, padding included.
    pub fn footprint(&self) -> u64 {
        (LOG_ENTRY_HEADER_SIZE as u64 + u64::from(self.len)).next_multiple_of(LOG_ENTRY_ALIGN)
    }

    /// [`footprint`](Self::footprint) as a buffer length.
    // The payload length is a `u16`: a footprint is at most 64 KiB and a
    // header, which any `usize` holds.
    #[allow(clippy::cast_possible_truncation)]
    pub fn footprint_len(&self) -> usize {
        self.footprint() as usize
    }
}

/// Log sequence numbers stay below this (2^62): far more entries than a
/// file system writes, and room for any arithmetic on them.
pub const LOG_SEQ_MAX: u64 = 1 << 62;

/// Operation codes a log entry may carry are `1..=LOG_OP_MAX` (Kfs's redo
/// records and its retirement batches; see Kfs's record module).
pub const LOG_OP_MAX: u16 = 63;

/// How a walk of the log from its start ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogEnd {
    /// Byte offset just past the last valid entry: where the next goes.
    pub pos: u64,
    /// The sequence number the next entry gets.
    pub next_seq: u64,
    /// Valid entries walked.
    pub entries: u64,
}

/// An entry that fails its checks with acknowledged entries after it:
/// damage to the media, not a crash (a crash tears at most the last entry,
/// since each entry is durable before the next one is stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogDamage {
    /// Byte offset (in the log area) of the damaged entry.
    pub at: u64,
    /// The sequence number it should have had.
    pub seq: u64,
    /// Valid entries of the same lap found after it.
    pub following: u64,
}

impl fmt::Display for LogDamage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the log entry with sequence {} (log offset {}) is damaged, and {} acknowledged \
             entr{} follow{} it",
            self.seq,
            self.at,
            self.following,
            if self.following == 1 { "y" } else { "ies" },
            if self.following == 1 { "s" } else { "" },
        )
    }
}

/// Walks the valid entries of `lap` in a log area held in `log` (the
/// whole area's bytes), and returns them with their byte offsets. The walk
/// stops at the first entry that is torn, out of sequence, or would run
/// past the area: that is the log's end.
pub fn scan_log(log: &[u8], lap: &Lap) -> Vec<(u64, LogEntryHeader)> {
    let mut entries = Vec::new();
    scan_log_with(log.len() as u64, lap, slice_reader(log), |at, h, _| {
        entries.push((at, *h))
    });
    entries
}

/// A reader over bytes in memory, for [`scan_log_with`] and [`find_damage`].
pub fn slice_reader(log: &[u8]) -> impl Fn(u64, &mut [u8]) -> bool + '_ {
    move |at, buf| {
        usize::try_from(at)
            .ok()
            .and_then(|a| log.get(a..a.checked_add(buf.len())?))
            .map(|src| buf.copy_from_slice(src))
            .is_some()
    }
}

/// Reads the entry at `at` if it is a valid entry of `lap` of sequence
/// `seq` (any sequence in `seq..` when `exact` is false) whose payload lies
/// inside an area of `len` bytes; its header, and the payload in `payload`.
fn entry_at(
    len: u64,
    lap: &Lap,
    at: u64,
    seq: u64,
    exact: bool,
    read: &impl Fn(u64, &mut [u8]) -> bool,
    payload: &mut Vec<u8>,
) -> Option<LogEntryHeader> {
    let mut hb = [0u8; LOG_ENTRY_HEADER_SIZE];
    if at.checked_add(LOG_ENTRY_HEADER_SIZE as u64)? > len || !read(at, &mut hb) {
        return None;
    }
    let header = LogEntryHeader::decode(&hb)?;
    let in_sequence = if exact {
        header.seq == seq
    } else {
        // A lap holds fewer than 2^40 entries: a stale or random line
        // claiming a sequence far beyond is not an entry of it.
        header.seq >= seq && header.seq - seq < 1 << 40
    };
    let start = at + LOG_ENTRY_HEADER_SIZE as u64;
    if !in_sequence
        || header.op == 0
        || header.op > LOG_OP_MAX
        || start + u64::from(header.len) > len
    {
        return None;
    }
    payload.resize(header.len as usize, 0);
    (read(start, payload) && header.verify(lap, payload)).then_some(header)
}

/// [`scan_log`] over a log area of `len` bytes read through `read` (which
/// copies bytes at an offset into the area, false if it cannot), one entry
/// at a time, calling `visit` with each valid entry's offset, header and
/// payload. Returns where the walk ended.
pub fn scan_log_with(
    len: u64,
    lap: &Lap,
    read: impl Fn(u64, &mut [u8]) -> bool,
    mut visit: impl FnMut(u64, &LogEntryHeader, &[u8]),
) -> LogEnd {
    let mut end = LogEnd {
        pos: 0,
        next_seq: lap.first_seq,
        entries: 0,
    };
    let mut payload = Vec::new();
    while let Some(header) = entry_at(len, lap, end.pos, end.next_seq, true, &read, &mut payload) {
        visit(end.pos, &header, &payload);
        end.pos += header.footprint();
        end.next_seq += 1;
        end.entries += 1;
    }
    end
}

/// Tells a torn end of the log from damage: looks past `end` (where
/// [`scan_log_with`] stopped) for any valid entry of the same lap (its
/// checksum keyed by the lap, its sequence after `end`'s). Past the lap's
/// valid entries the area holds only bytes of earlier laps, which fail a
/// later lap's checksums, torn leftovers, and zeros: each entry is durable
/// before the next is stored, and recovery invalidates the entries of a
/// retirement's batch left without its end before it writes over them.
/// So a valid entry of the lap found here was acknowledged after the
/// entry at `end`, which therefore was damaged after it became durable.
/// Reads the rest of the area once, header by header.
pub fn find_damage(
    len: u64,
    lap: &Lap,
    end: &LogEnd,
    read: impl Fn(u64, &mut [u8]) -> bool,
) -> Option<LogDamage> {
    let mut payload = Vec::new();
    let mut at = end.pos + LOG_ENTRY_ALIGN;
    let mut found = 0;
    while at + LOG_ENTRY_HEADER_SIZE as u64 <= len {
        match entry_at(len, lap, at, end.next_seq, false, &read, &mut payload) {
            Some(h) => {
                found += 1;
                at += h.footprint();
            }
            None => at += LOG_ENTRY_ALIGN,
        }
    }
    (found > 0).then_some(LogDamage {
        at: end.pos,
        seq: end.next_seq,
        following: found,
    })
}

#[cfg(test)]
mod tests;
