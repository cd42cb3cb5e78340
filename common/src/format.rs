//! The on-media format of a KucoFS image, read from its constants:
//!
//! ```text
//! page 0            superblock, copy A
//! page 1            superblock, copy B
//! log_start ..      operation log: checksummed redo entries, cache-line aligned
//! ckpt_start ..     checkpoint area: two slots of ckpt_slot_pages each
//! bitmap_start ..   free-page bitmap: one bit per data page, 1 = in use
//! data_start ..     data pages (4 KiB each)
//! ```
//!
//! Every on-media struct is `#[repr(C)]` with its size pinned by a const
//! assert, stored little-endian (the crate only builds for little-endian
//! x86-64, so native order is little-endian order), and converted to and
//! from its in-memory form here and nowhere else.
//!
//! The two superblock copies are written one after the other, each persisted
//! before the next, and carry a sequence number: an opener takes the valid
//! copy with the higher sequence, so a crash while writing either one leaves
//! the other intact.

use std::fmt;

use bytemuck::{Pod, Zeroable};

/// Size of a data page and the unit of every area.
pub const PAGE_SIZE: u64 = 4096;
/// Bits in one bitmap page: the data pages it can describe.
pub const BITS_PER_BITMAP_PAGE: u64 = PAGE_SIZE * 8;
/// The superblock magic: "KucoFS" and two bytes that make a text file unlikely
/// to match.
pub const MAGIC: [u8; 8] = *b"KucoFS\x00\xf5";
/// The format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 2;
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
/// Log size bounds, in pages: 64 KiB to 1 GiB. A larger log means rarer
/// checkpoints (each serializes the whole namespace) and longer replay.
pub const LOG_PAGES_MIN: u64 = 16;
/// See [`LOG_PAGES_MIN`].
pub const LOG_PAGES_MAX: u64 = 256 * 1024;
/// Smallest checkpoint slot, in pages.
pub const CKPT_SLOT_PAGES_MIN: u64 = 16;

/// Superblock flag: the file system was unmounted cleanly (no recovery
/// needed beyond loading the checkpoint and an empty log).
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
}

/// Where each area of an image lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes covered by the file system (a whole number of pages).
    pub size: u64,
    /// The operation log.
    pub log: Area,
    /// Both checkpoint slots, `ckpt_slot_pages` each.
    pub checkpoint: Area,
    /// Pages in one checkpoint slot.
    pub ckpt_slot_pages: u64,
    /// The free-page bitmap.
    pub bitmap: Area,
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

impl Geometry {
    /// The geometry mkfs lays out for an image of `size` bytes (rounded down
    /// to whole pages): the log takes 1/16 of the pages (64 KiB to 1 GiB),
    /// each checkpoint slot 1/16, the bitmap what the data pages need.
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
        let log_pages = (pages / 16).clamp(LOG_PAGES_MIN, LOG_PAGES_MAX);
        let slot = (pages / 16).max(CKPT_SLOT_PAGES_MIN);
        let fixed = SUPERBLOCK_PAGES + log_pages + 2 * slot;
        let rest = pages.checked_sub(fixed).ok_or(GeometryError::TooSmall {
            size,
            min: MIN_IMAGE_SIZE,
        })?;
        // Each bitmap page covers BITS_PER_BITMAP_PAGE data pages, and takes
        // one page itself from the rest.
        let bitmap_pages = rest.div_ceil(BITS_PER_BITMAP_PAGE + 1);
        let data_pages = rest - bitmap_pages;
        if data_pages < MIN_DATA_PAGES {
            return Err(GeometryError::TooSmall {
                size,
                min: MIN_IMAGE_SIZE,
            });
        }
        let log = Area {
            start: SUPERBLOCK_PAGES,
            pages: log_pages,
        };
        let checkpoint = Area {
            start: log.end(),
            pages: 2 * slot,
        };
        let bitmap = Area {
            start: checkpoint.end(),
            pages: bitmap_pages,
        };
        let data = Area {
            start: bitmap.end(),
            pages: data_pages,
        };
        let g = Geometry {
            size: pages * PAGE_SIZE,
            log,
            checkpoint,
            ckpt_slot_pages: slot,
            bitmap,
            data,
        };
        debug_assert_eq!(g.validate(), Ok(()));
        Ok(g)
    }

    /// Checks that the areas tile the image in order with no gap or overlap,
    /// using only checked arithmetic (the values may come from a damaged or
    /// hostile image).
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
        if self.log.pages == 0 {
            return Err(Bad("the log is empty"));
        }
        if self.checkpoint.start != end(&self.log)? {
            return Err(Bad("the checkpoint area does not follow the log"));
        }
        if self.ckpt_slot_pages == 0
            || self.ckpt_slot_pages.checked_mul(2) != Some(self.checkpoint.pages)
        {
            return Err(Bad("the checkpoint area is not two equal non-empty slots"));
        }
        if self.bitmap.start != end(&self.checkpoint)? {
            return Err(Bad("the bitmap does not follow the checkpoint area"));
        }
        if self.data.start != end(&self.bitmap)? {
            return Err(Bad("the data pages do not follow the bitmap"));
        }
        if end(&self.data)? != self.size / PAGE_SIZE {
            return Err(Bad("the data pages do not end at the end of the image"));
        }
        if self.data.pages < MIN_DATA_PAGES {
            return Err(Bad("fewer data pages than the minimum"));
        }
        if self.bitmap.pages.checked_mul(BITS_PER_BITMAP_PAGE) < Some(self.data.pages) {
            return Err(Bad("the bitmap is too small for the data pages"));
        }
        Ok(())
    }

    /// Byte offset of checkpoint slot `slot` (0 or 1).
    pub fn checkpoint_slot(&self, slot: u8) -> Area {
        Area {
            start: self.checkpoint.start + u64::from(slot & 1) * self.ckpt_slot_pages,
            pages: self.ckpt_slot_pages,
        }
    }
}

/// Which checkpoint is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointRef {
    /// The slot (0 or 1) holding it.
    pub slot: u8,
    /// Its sequence number: the log sequence it includes everything before.
    pub seq: u64,
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
    /// The current checkpoint; `None` on a fresh image (only the root
    /// directory exists).
    pub checkpoint: Option<CheckpointRef>,
    /// Sequence number of the first log entry not in the checkpoint: replay
    /// starts there.
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
    ckpt_valid: u32,
    log_start: u64,
    log_pages: u64,
    ckpt_start: u64,
    ckpt_slot_pages: u64,
    bitmap_start: u64,
    bitmap_pages: u64,
    data_start: u64,
    data_pages: u64,
    ckpt_slot: u64,
    ckpt_seq: u64,
    log_seq: u64,
    reserved: [u8; 332],
    /// CRC-32C of every byte before it.
    crc: u32,
}

const _: () = assert!(std::mem::size_of::<RawSuperblock>() == SUPERBLOCK_SIZE);
const _: () = assert!(std::mem::offset_of!(RawSuperblock, crc) == SUPERBLOCK_SIZE - 4);
const _: () = assert!(std::mem::offset_of!(RawSuperblock, log_start) == 88);

impl Superblock {
    /// The superblock as stored, checksum included.
    pub fn encode(&self) -> [u8; SUPERBLOCK_SIZE] {
        let g = &self.geometry;
        let mut raw = RawSuperblock {
            magic: MAGIC,
            version: FORMAT_VERSION,
            sb_size: SUPERBLOCK_SIZE as u32,
            seq: self.seq,
            incompat: self.incompat,
            compat: self.compat,
            flags: if self.clean { FLAG_CLEAN } else { 0 },
            uuid: self.uuid,
            created_ns: self.created_ns,
            size: g.size,
            page_size: PAGE_SIZE as u32,
            ckpt_valid: u32::from(self.checkpoint.is_some()),
            log_start: g.log.start,
            log_pages: g.log.pages,
            ckpt_start: g.checkpoint.start,
            ckpt_slot_pages: g.ckpt_slot_pages,
            bitmap_start: g.bitmap.start,
            bitmap_pages: g.bitmap.pages,
            data_start: g.data.start,
            data_pages: g.data.pages,
            ckpt_slot: self.checkpoint.map_or(0, |c| u64::from(c.slot)),
            ckpt_seq: self.checkpoint.map_or(0, |c| c.seq),
            log_seq: self.log_seq,
            reserved: [0; 332],
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
        if raw.reserved.iter().any(|&b| b != 0) {
            return Err(SuperblockFault::BadField("reserved bytes are not zero"));
        }
        let checkpoint = match raw.ckpt_valid {
            0 if raw.ckpt_slot == 0 && raw.ckpt_seq == 0 => None,
            1 if raw.ckpt_slot <= 1 => Some(CheckpointRef {
                slot: raw.ckpt_slot as u8,
                seq: raw.ckpt_seq,
            }),
            _ => return Err(SuperblockFault::BadField("checkpoint reference is invalid")),
        };
        let geometry = Geometry {
            size: raw.size,
            log: Area {
                start: raw.log_start,
                pages: raw.log_pages,
            },
            checkpoint: Area {
                start: raw.ckpt_start,
                pages: raw.ckpt_slot_pages.wrapping_mul(2),
            },
            ckpt_slot_pages: raw.ckpt_slot_pages,
            bitmap: Area {
                start: raw.bitmap_start,
                pages: raw.bitmap_pages,
            },
            data: Area {
                start: raw.data_start,
                pages: raw.data_pages,
            },
        };
        geometry.validate().map_err(SuperblockFault::BadGeometry)?;
        Ok(Superblock {
            seq: raw.seq,
            compat: raw.compat,
            incompat: raw.incompat,
            clean: raw.flags & FLAG_CLEAN != 0,
            uuid: raw.uuid,
            created_ns: raw.created_ns,
            geometry,
            checkpoint,
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

impl LogEntryHeader {
    /// The header for a payload, checksum computed; `None` if the payload
    /// is longer than [`LOG_PAYLOAD_MAX`].
    pub fn new(seq: u64, op: u16, payload: &[u8]) -> Option<LogEntryHeader> {
        let mut h = LogEntryHeader {
            crc: 0,
            len: u16::try_from(payload.len()).ok()?,
            op,
            seq,
        };
        h.crc = h.checksum(payload);
        Some(h)
    }

    fn checksum(&self, payload: &[u8]) -> u32 {
        let head = crate::checksum::crc32c(&bytemuck::bytes_of(self)[4..]);
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

    /// True if `payload` is this entry's intact payload.
    pub fn verify(&self, payload: &[u8]) -> bool {
        payload.len() == usize::from(self.len) && self.checksum(payload) == self.crc
    }

    /// Bytes the entry occupies in the log, padding included.
    pub fn footprint(&self) -> u64 {
        (LOG_ENTRY_HEADER_SIZE as u64 + u64::from(self.len)).next_multiple_of(LOG_ENTRY_ALIGN)
    }
}

/// Walks the valid entries of a log area held in `log` (the whole area's
/// bytes), starting at sequence `first_seq`, and returns them with their
/// byte offsets. The walk stops at the first entry that is torn, out of
/// sequence, or would run past the area: that is the log's end.
pub fn scan_log(log: &[u8], first_seq: u64) -> Vec<(u64, LogEntryHeader)> {
    let mut entries = Vec::new();
    scan_log_with(
        log.len() as u64,
        first_seq,
        |at, buf| {
            usize::try_from(at)
                .ok()
                .and_then(|a| log.get(a..a.checked_add(buf.len())?))
                .map(|src| buf.copy_from_slice(src))
                .is_some()
        },
        |at, h, _| entries.push((at, *h)),
    );
    entries
}

/// [`scan_log`] over a log area of `len` bytes read through `read` (which
/// copies bytes at an offset into the area, false if it cannot), one entry
/// at a time, calling `visit` with each valid entry's offset, header and
/// payload.
pub fn scan_log_with(
    len: u64,
    first_seq: u64,
    read: impl Fn(u64, &mut [u8]) -> bool,
    mut visit: impl FnMut(u64, &LogEntryHeader, &[u8]),
) {
    let mut at = 0u64;
    let mut seq = first_seq;
    let mut hb = [0u8; LOG_ENTRY_HEADER_SIZE];
    let mut payload = Vec::new();
    while at + LOG_ENTRY_HEADER_SIZE as u64 <= len && read(at, &mut hb) {
        let Some(header) = LogEntryHeader::decode(&hb) else {
            break;
        };
        let start = at + LOG_ENTRY_HEADER_SIZE as u64;
        if header.seq != seq || start + u64::from(header.len) > len {
            break;
        }
        payload.resize(header.len as usize, 0);
        if !read(start, &mut payload) || !header.verify(&payload) {
            break;
        }
        visit(at, &header, &payload);
        at += header.footprint();
        seq += 1;
    }
}

/// Size of a checkpoint header.
pub const CHECKPOINT_HEADER_SIZE: usize = 64;
/// "KucoCKP1".
pub const CHECKPOINT_MAGIC: [u8; 8] = *b"KucoCKP1";

/// The header at the start of a checkpoint slot. The body (the serialized
/// namespace, see Kfs's checkpoint module) follows it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
pub struct CheckpointHeader {
    /// [`CHECKPOINT_MAGIC`].
    pub magic: [u8; 8],
    /// The log sequence the checkpoint covers everything before.
    pub seq: u64,
    /// Bytes of the body.
    pub body_len: u64,
    /// Inode records in the body.
    pub inodes: u64,
    /// Entry records in the body.
    pub entries: u64,
    /// CRC-32C of the body.
    pub body_crc: u32,
    /// Zero.
    pub pad: u32,
    /// Zero.
    pub reserved: [u8; 12],
    /// CRC-32C of the header's bytes before this field.
    pub header_crc: u32,
}

const _: () = assert!(std::mem::size_of::<CheckpointHeader>() == CHECKPOINT_HEADER_SIZE);

impl CheckpointHeader {
    /// A header for a body of `body_len` bytes whose CRC-32C is `body_crc`
    /// (a body checksummed as it was written).
    pub fn with_crc(
        seq: u64,
        body_len: u64,
        body_crc: u32,
        inodes: u64,
        entries: u64,
    ) -> CheckpointHeader {
        let mut h = CheckpointHeader {
            magic: CHECKPOINT_MAGIC,
            seq,
            body_len,
            inodes,
            entries,
            body_crc,
            pad: 0,
            reserved: [0; 12],
            header_crc: 0,
        };
        h.header_crc =
            crate::checksum::crc32c(&bytemuck::bytes_of(&h)[..CHECKPOINT_HEADER_SIZE - 4]);
        h
    }

    /// The header's bytes.
    pub fn encode(&self) -> [u8; CHECKPOINT_HEADER_SIZE] {
        let mut out = [0u8; CHECKPOINT_HEADER_SIZE];
        out.copy_from_slice(bytemuck::bytes_of(self));
        out
    }

    /// Reads and checks a header: magic, header checksum, zero padding.
    pub fn decode(bytes: &[u8]) -> Result<CheckpointHeader, &'static str> {
        let b = bytes
            .get(..CHECKPOINT_HEADER_SIZE)
            .ok_or("checkpoint header is truncated")?;
        let h: CheckpointHeader = bytemuck::pod_read_unaligned(b);
        if h.magic != CHECKPOINT_MAGIC {
            return Err("checkpoint has no magic");
        }
        if crate::checksum::crc32c(&b[..CHECKPOINT_HEADER_SIZE - 4]) != h.header_crc {
            return Err("checkpoint header checksum mismatch");
        }
        if h.pad != 0 || h.reserved != [0; 12] {
            return Err("checkpoint header reserved bytes are not zero");
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests;
