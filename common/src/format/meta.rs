//! The metadata store's records: how inodes, directory entries, symlink
//! targets and the owners of data pages lie in the image.
//!
//! ```text
//! owner table (one u64 per data page, in page order):
//!   bits 60..64 kind | bits 0..60 what:
//!   0 free
//!   1 file data      ino (bits 32..60) | file page (bits 0..32)
//!   2 inode page     table index k: holds inodes k*32 .. k*32+31
//!   3 entry page     cells per slot (1..=5): 64/cells slots of 64*cells bytes
//!   4 target page    ino of the symlink whose target it holds
//!
//! inode record (128 bytes, slot ino % 32 of inode page ino / 32):
//!     0 ino u64 (0: the slot is empty)   64 target_len u16, flags u16 (0)
//!     8 mode u32, nlink u32              68 target_crc u32 (target page)
//!    16 uid u32, gid u32                 72 target_page u64 (0: inline)
//!    24 size u64                         80 inline target (44 bytes)
//!    32 atime, mtime, ctime, btime i64  124 crc u32: CRC-32C of bytes 0..124
//!
//! entry record (cells * 64 bytes in an entry page of that many cells):
//!     0 parent ino u64 (0: the slot is empty)
//!     8 ino u64
//!    16 name_len u8, cells u8, kind u8 (the inode's type), 0 u8
//!    20 crc u32: CRC-32C of bytes 0..20 and the name
//!    24 name (name_len bytes)
//! ```
//!
//! The store is changed only by retirements of the log: each writes, as
//! one batch of physical writes (byte ranges of the image, see
//! [`BatchWriter`]), every record the changes since the last retirement
//! touched, logs the batch, then copies it into place. A record is
//! therefore always one the store held at the end of some retirement; its
//! checksum finds damage to the media.

use crate::checksum::crc32c;
use crate::format::PAGE_SIZE;
use crate::index::NAME_MAX;

/// Bits of an owner entry that say what a page holds.
pub const OWNER_KIND_SHIFT: u32 = 60;
/// A free page.
pub const OWNER_FREE: u64 = 0;
/// A page of a regular file's data.
pub const OWNER_FILE: u64 = 1;
/// A page of the inode table.
pub const OWNER_INODES: u64 = 2;
/// A page of directory entries.
pub const OWNER_ENTRIES: u64 = 3;
/// A page holding a symlink's target.
pub const OWNER_TARGET: u64 = 4;
/// The largest inode number an owner entry can name.
pub const OWNER_INO_MAX: u64 = (1 << 28) - 1;
/// The largest file page an owner entry can name.
pub const OWNER_FILE_PAGE_MAX: u64 = u32::MAX as u64;

/// An owner entry, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// Nobody's.
    Free,
    /// Page `page` of file `ino`.
    File { ino: u64, page: u64 },
    /// Page `index` of the inode table.
    Inodes { index: u64 },
    /// An entry page of `cells` cells per slot.
    Entries { cells: u8 },
    /// The target of symlink `ino`.
    Target { ino: u64 },
}

impl Owner {
    /// The entry as stored; `None` if a field does not fit it.
    pub fn encode(self) -> Option<u64> {
        let kind = |k: u64, what: u64| Some(k << OWNER_KIND_SHIFT | what);
        match self {
            Owner::Free => Some(0),
            Owner::File { ino, page } if ino <= OWNER_INO_MAX && page <= OWNER_FILE_PAGE_MAX => {
                kind(OWNER_FILE, ino << 32 | page)
            }
            Owner::Inodes { index } if index < 1 << OWNER_KIND_SHIFT => kind(OWNER_INODES, index),
            Owner::Entries { cells } if (1..=MAX_CELLS).contains(&cells) => {
                kind(OWNER_ENTRIES, u64::from(cells))
            }
            Owner::Target { ino } if ino <= OWNER_INO_MAX => kind(OWNER_TARGET, ino),
            _ => None,
        }
    }

    /// Reads a stored entry; `None` if it is not one the format allows.
    pub fn decode(v: u64) -> Option<Owner> {
        let what = v & ((1 << OWNER_KIND_SHIFT) - 1);
        match v >> OWNER_KIND_SHIFT {
            OWNER_FREE if what == 0 => Some(Owner::Free),
            OWNER_FILE => {
                let ino = what >> 32;
                (ino != 0).then_some(Owner::File {
                    ino,
                    page: what & 0xffff_ffff,
                })
            }
            OWNER_INODES => Some(Owner::Inodes { index: what }),
            OWNER_ENTRIES => u8::try_from(what)
                .ok()
                .filter(|c| (1..=MAX_CELLS).contains(c))
                .map(|cells| Owner::Entries { cells }),
            OWNER_TARGET if what != 0 && what <= OWNER_INO_MAX => Some(Owner::Target { ino: what }),
            _ => None,
        }
    }
}

// ---- inodes ------------------------------------------------------------------

/// Bytes of an inode record.
pub const INODE_RECORD: usize = 128;
/// Inode records in one inode page.
pub const INODES_PER_PAGE: u64 = PAGE_SIZE / INODE_RECORD as u64;
/// The longest symlink target kept inside its inode record; longer ones
/// take a page of their own.
pub const INLINE_TARGET: usize = 44;

/// An inode as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeRecord {
    /// Inode number (never 0).
    pub ino: u64,
    /// Type and permission bits.
    pub mode: u32,
    /// Link count.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes (symlinks: target length).
    pub size: u64,
    /// Access, modification, change and creation times (ns).
    pub atime: i64,
    #[allow(missing_docs)]
    pub mtime: i64,
    #[allow(missing_docs)]
    pub ctime: i64,
    #[allow(missing_docs)]
    pub btime: i64,
    /// A symlink's target length.
    pub target_len: u16,
    /// The checksum of a target kept in a page of its own.
    pub target_crc: u32,
    /// The page holding the target, 0 if it is inline.
    pub target_page: u64,
    /// An inline target (the first `target_len` bytes).
    pub inline: [u8; INLINE_TARGET],
}

impl Default for InodeRecord {
    fn default() -> Self {
        InodeRecord {
            ino: 0,
            mode: 0,
            nlink: 0,
            uid: 0,
            gid: 0,
            size: 0,
            atime: 0,
            mtime: 0,
            ctime: 0,
            btime: 0,
            target_len: 0,
            target_crc: 0,
            target_page: 0,
            inline: [0; INLINE_TARGET],
        }
    }
}

/// Why a record cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordFault {
    /// Its checksum does not match.
    Checksum,
    /// A field holds what the format does not allow.
    Field(&'static str),
}

impl std::fmt::Display for RecordFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordFault::Checksum => f.write_str("checksum mismatch"),
            RecordFault::Field(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for RecordFault {}

fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}
fn put(b: &mut [u8], at: usize, v: &[u8]) {
    b[at..at + v.len()].copy_from_slice(v);
}

impl InodeRecord {
    /// The record as stored, checksum included.
    pub fn encode(&self) -> [u8; INODE_RECORD] {
        let mut b = [0u8; INODE_RECORD];
        put(&mut b, 0, &self.ino.to_le_bytes());
        put(&mut b, 8, &self.mode.to_le_bytes());
        put(&mut b, 12, &self.nlink.to_le_bytes());
        put(&mut b, 16, &self.uid.to_le_bytes());
        put(&mut b, 20, &self.gid.to_le_bytes());
        put(&mut b, 24, &self.size.to_le_bytes());
        put(&mut b, 32, &self.atime.to_le_bytes());
        put(&mut b, 40, &self.mtime.to_le_bytes());
        put(&mut b, 48, &self.ctime.to_le_bytes());
        put(&mut b, 56, &self.btime.to_le_bytes());
        put(&mut b, 64, &self.target_len.to_le_bytes());
        put(&mut b, 68, &self.target_crc.to_le_bytes());
        put(&mut b, 72, &self.target_page.to_le_bytes());
        put(&mut b, 80, &self.inline);
        let crc = crc32c(&b[..124]);
        put(&mut b, 124, &crc.to_le_bytes());
        b
    }

    /// Reads a stored record: `Ok(None)` for an empty slot.
    pub fn decode(b: &[u8; INODE_RECORD]) -> Result<Option<InodeRecord>, RecordFault> {
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        if crc32c(&b[..124]) != get_u32(b, 124) {
            return Err(RecordFault::Checksum);
        }
        let mut inline = [0u8; INLINE_TARGET];
        inline.copy_from_slice(&b[80..80 + INLINE_TARGET]);
        let r = InodeRecord {
            ino: get_u64(b, 0),
            mode: get_u32(b, 8),
            nlink: get_u32(b, 12),
            uid: get_u32(b, 16),
            gid: get_u32(b, 20),
            size: get_u64(b, 24),
            atime: get_u64(b, 32).cast_signed(),
            mtime: get_u64(b, 40).cast_signed(),
            ctime: get_u64(b, 48).cast_signed(),
            btime: get_u64(b, 56).cast_signed(),
            target_len: get_u16(b, 64),
            target_crc: get_u32(b, 68),
            target_page: get_u64(b, 72),
            inline,
        };
        if r.ino == 0 {
            return Err(RecordFault::Field("a used inode slot names inode 0"));
        }
        if get_u16(b, 66) != 0 {
            return Err(RecordFault::Field("unknown inode flags"));
        }
        if r.target_page == 0 && usize::from(r.target_len) > INLINE_TARGET {
            return Err(RecordFault::Field(
                "an inline target longer than the record",
            ));
        }
        Ok(Some(r))
    }

    /// The inline target, if the target is inline.
    pub fn inline_target(&self) -> Option<&[u8]> {
        (self.target_page == 0).then(|| &self.inline[..usize::from(self.target_len)])
    }
}

/// Where inode `ino`'s record lies: the inode page's table index and the
/// byte offset inside that page.
pub const fn inode_slot(ino: u64) -> (u64, u64) {
    (
        ino / INODES_PER_PAGE,
        (ino % INODES_PER_PAGE) * INODE_RECORD as u64,
    )
}

// ---- directory entries -----------------------------------------------------

/// Bytes of one cell of an entry page.
pub const CELL: usize = 64;
/// Bytes of an entry record before the name.
pub const ENTRY_HEAD: usize = 24;
/// Most cells an entry takes (a name of [`NAME_MAX`] bytes).
pub const MAX_CELLS: u8 = cells_for(NAME_MAX);

/// Cells an entry with a name of `len` (at most [`NAME_MAX`]) bytes takes.
// Exact for any length under 16 KiB (255 cells); a name is at most 255
// bytes, 5 cells.
#[allow(clippy::cast_possible_truncation)]
pub const fn cells_for(len: usize) -> u8 {
    (ENTRY_HEAD + len).div_ceil(CELL) as u8
}

/// Slots in an entry page of `cells` cells per slot.
pub const fn slots_per_page(cells: u8) -> u64 {
    PAGE_SIZE / (CELL as u64 * cells as u64)
}

/// A directory entry as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryRecord {
    /// The directory's inode number.
    pub parent: u64,
    /// The inode number it names.
    pub ino: u64,
    /// The type byte of that inode (as the index's entries carry it).
    pub kind: u8,
    /// The name.
    pub name: Vec<u8>,
}

fn entry_crc(head: &[u8], name: &[u8]) -> u32 {
    crate::checksum::crc32c_append(crc32c(&head[..20]), name)
}

/// Appends the record of an entry named `name` (1..=255 bytes) in
/// directory `parent` for inode `ino` of type byte `kind`, as stored (its
/// cells, padded with zeros), to `out`.
pub fn encode_entry(parent: u64, ino: u64, kind: u8, name: &[u8], out: &mut Vec<u8>) {
    let cells = cells_for(name.len());
    let start = out.len();
    out.resize(start + usize::from(cells) * CELL, 0);
    let b = &mut out[start..];
    put(b, 0, &parent.to_le_bytes());
    put(b, 8, &ino.to_le_bytes());
    b[16] = u8::try_from(name.len()).expect("a name is at most NAME_MAX (255) bytes");
    b[17] = cells;
    b[18] = kind;
    put(b, ENTRY_HEAD, name);
    let crc = entry_crc(b, name);
    put(b, 20, &crc.to_le_bytes());
}

impl EntryRecord {
    /// Appends the record as stored (its cells, padded with zeros) to `out`.
    /// The name must be 1..=255 bytes.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        encode_entry(self.parent, self.ino, self.kind, &self.name, out);
    }

    /// Reads a stored record of an entry page of `cells` cells per slot
    /// (`b` holds the slot): `Ok(None)` for an empty slot.
    pub fn decode(b: &[u8], cells: u8) -> Result<Option<EntryRecord>, RecordFault> {
        Ok(EntryRef::decode(b, cells)?.map(|e| EntryRecord {
            parent: e.parent,
            ino: e.ino,
            kind: e.kind,
            name: e.name.to_vec(),
        }))
    }
}

/// An entry record read in place: its name borrowed from the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryRef<'a> {
    /// The directory's inode number.
    pub parent: u64,
    /// The inode number it names.
    pub ino: u64,
    /// The type byte of that inode.
    pub kind: u8,
    /// The name.
    pub name: &'a [u8],
}

impl<'a> EntryRef<'a> {
    /// [`EntryRecord::decode`], without copying the name.
    pub fn decode(b: &'a [u8], cells: u8) -> Result<Option<EntryRef<'a>>, RecordFault> {
        if b.len() < usize::from(cells) * CELL || b.len() < ENTRY_HEAD {
            return Err(RecordFault::Field("an entry slot is cut short"));
        }
        if b[..ENTRY_HEAD].iter().all(|&x| x == 0) {
            return Ok(None);
        }
        let len = usize::from(b[16]);
        if len == 0 || cells_for(len) != cells || b[17] != cells || b[19] != 0 {
            return Err(RecordFault::Field("an entry's name does not fit its slot"));
        }
        let name = &b[ENTRY_HEAD..ENTRY_HEAD + len];
        if entry_crc(b, name) != get_u32(b, 20) {
            return Err(RecordFault::Checksum);
        }
        Ok(Some(EntryRef {
            parent: get_u64(b, 0),
            ino: get_u64(b, 8),
            kind: b[18],
            name,
        }))
    }
}

// ---- batches ---------------------------------------------------------------

/// Flag in a batch write's length: the range is to be filled with zeros
/// (no bytes follow).
pub const BATCH_ZERO: u32 = 1 << 31;
/// Bytes of a batch write's header: image offset u64, length u32.
pub const BATCH_WRITE_HEAD: usize = 12;

/// Builds the payload of a retirement batch: a sequence of physical
/// writes, each an image byte offset, a length (with [`BATCH_ZERO`] for a
/// range of zeros) and the bytes. Applying a batch twice changes nothing
/// the first time did not, so recovery applies a logged batch again
/// without knowing how much of it reached the store.
#[derive(Debug, Default)]
pub struct BatchWriter {
    buf: Vec<u8>,
    writes: u64,
}

/// The length field of a write of `len` bytes; panics if `len` reaches
/// [`BATCH_ZERO`] (2 GiB), the flag bit: the store writes records and
/// pages, far shorter.
fn write_len(len: usize) -> u32 {
    u32::try_from(len)
        .ok()
        .filter(|&n| n < BATCH_ZERO)
        .expect("a batch write is under 2 GiB")
}

impl BatchWriter {
    /// An empty batch.
    pub fn new() -> BatchWriter {
        BatchWriter::default()
    }

    /// Writes `bytes` at image offset `offset`.
    pub fn put(&mut self, offset: u64, bytes: &[u8]) {
        self.buf.extend_from_slice(&offset.to_le_bytes());
        self.buf
            .extend_from_slice(&write_len(bytes.len()).to_le_bytes());
        self.buf.extend_from_slice(bytes);
        self.writes += 1;
    }

    /// Starts a write of `len` bytes at `offset` whose bytes the caller
    /// appends to the returned buffer (exactly `len` of them).
    pub fn put_with(&mut self, offset: u64, len: usize) -> &mut Vec<u8> {
        self.buf.extend_from_slice(&offset.to_le_bytes());
        self.buf.extend_from_slice(&write_len(len).to_le_bytes());
        self.writes += 1;
        &mut self.buf
    }

    /// Fills `len` bytes at `offset` with zeros.
    pub fn zero(&mut self, offset: u64, len: u32) {
        debug_assert!(len < BATCH_ZERO);
        self.buf.extend_from_slice(&offset.to_le_bytes());
        self.buf
            .extend_from_slice(&(len | BATCH_ZERO).to_le_bytes());
        self.writes += 1;
    }

    /// The payload so far.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Writes so far.
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// Empties the batch, keeping its buffer.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.writes = 0;
    }
}

/// One write of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchWrite<'a> {
    /// These bytes at this image offset.
    Bytes(u64, &'a [u8]),
    /// This many zeros at this image offset.
    Zero(u64, u64),
}

impl BatchWrite<'_> {
    /// The image byte range written.
    pub fn range(&self) -> (u64, u64) {
        match *self {
            BatchWrite::Bytes(at, b) => (at, b.len() as u64),
            BatchWrite::Zero(at, n) => (at, n),
        }
    }
}

/// The writes of a batch payload, in order; an `Err` item (and nothing
/// after it) for a payload that does not parse.
pub fn batch_writes(mut p: &[u8]) -> impl Iterator<Item = Result<BatchWrite<'_>, RecordFault>> {
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || p.is_empty() {
            return None;
        }
        if p.len() < BATCH_WRITE_HEAD {
            failed = true;
            return Some(Err(RecordFault::Field("a batch write is cut short")));
        }
        let at = get_u64(p, 0);
        let len = get_u32(p, 8);
        p = &p[BATCH_WRITE_HEAD..];
        if len & BATCH_ZERO != 0 {
            return Some(Ok(BatchWrite::Zero(at, u64::from(len & !BATCH_ZERO))));
        }
        let Some(bytes) = p.get(..len as usize) else {
            failed = true;
            return Some(Err(RecordFault::Field("a batch write is cut short")));
        };
        p = &p[len as usize..];
        Some(Ok(BatchWrite::Bytes(at, bytes)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn entries_of_every_name_length_fit_their_cells() {
        assert_eq!(MAX_CELLS, 5);
        assert_eq!(cells_for(1), 1);
        assert_eq!(cells_for(CELL - ENTRY_HEAD), 1);
        assert_eq!(cells_for(CELL - ENTRY_HEAD + 1), 2);
        assert_eq!(cells_for(NAME_MAX), MAX_CELLS);
        for cells in 1..=MAX_CELLS {
            assert!(slots_per_page(cells) * CELL as u64 * u64::from(cells) <= PAGE_SIZE);
            assert!(slots_per_page(cells) >= 12);
        }
    }

    #[test]
    fn an_empty_slot_reads_as_none_and_a_changed_byte_as_damage() {
        assert_eq!(InodeRecord::decode(&[0; INODE_RECORD]), Ok(None));
        assert_eq!(EntryRecord::decode(&[0; CELL], 1), Ok(None));
        let r = InodeRecord {
            ino: 9,
            mode: libc::S_IFLNK | 0o777,
            nlink: 1,
            size: 3,
            target_len: 3,
            inline: {
                let mut t = [0; INLINE_TARGET];
                t[..3].copy_from_slice(b"abc");
                t
            },
            ..InodeRecord::default()
        };
        let b = r.encode();
        assert_eq!(InodeRecord::decode(&b), Ok(Some(r.clone())));
        assert_eq!(
            InodeRecord::decode(&b).unwrap().unwrap().inline_target(),
            Some(&b"abc"[..])
        );
        for i in 0..INODE_RECORD {
            let mut d = b;
            d[i] ^= 0x10;
            assert!(InodeRecord::decode(&d).is_err(), "byte {i}");
        }
        let e = EntryRecord {
            parent: 1,
            ino: 9,
            kind: 2,
            name: b"a-name".to_vec(),
        };
        let mut out = Vec::new();
        e.encode_into(&mut out);
        assert_eq!(out.len(), CELL);
        assert_eq!(EntryRecord::decode(&out, 1), Ok(Some(e)));
        assert!(EntryRecord::decode(&out, 2).is_err());
        for i in 0..ENTRY_HEAD + 6 {
            let mut d = out.clone();
            d[i] ^= 0x04;
            assert!(EntryRecord::decode(&d, 1).is_err(), "byte {i}");
        }
    }

    proptest! {
        #[test]
        fn owners_round_trip(ino in 1u64..=OWNER_INO_MAX, page in 0u64..=OWNER_FILE_PAGE_MAX,
                             index in 0u64..1 << 40, cells in 1u8..=MAX_CELLS) {
            for o in [
                Owner::Free,
                Owner::File { ino, page },
                Owner::Inodes { index },
                Owner::Entries { cells },
                Owner::Target { ino },
            ] {
                prop_assert_eq!(Owner::decode(o.encode().unwrap()), Some(o));
            }
        }

        #[test]
        fn entry_records_round_trip(name in proptest::collection::vec(1u8..=255, 1..=NAME_MAX),
                                    parent: u64, ino: u64, kind: u8) {
            let e = EntryRecord { parent: parent.max(1), ino, kind, name };
            let mut out = Vec::new();
            e.encode_into(&mut out);
            let cells = cells_for(e.name.len());
            prop_assert_eq!(out.len(), usize::from(cells) * CELL);
            prop_assert_eq!(EntryRecord::decode(&out, cells), Ok(Some(e)));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400), v: u64) {
            let _ = Owner::decode(v);
            let cells = u8::try_from((bytes.len() / CELL).clamp(1, 5)).unwrap();
            let _ = EntryRecord::decode(&bytes, cells);
            if bytes.len() >= INODE_RECORD {
                let mut b = [0u8; INODE_RECORD];
                b.copy_from_slice(&bytes[..INODE_RECORD]);
                let _ = InodeRecord::decode(&b);
            }
            for w in batch_writes(&bytes) {
                let _ = w;
            }
        }

        #[test]
        fn batches_round_trip(writes in proptest::collection::vec(
            (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..100), any::<bool>()), 0..20)) {
            let mut b = BatchWriter::new();
            for (at, bytes, zero) in &writes {
                if *zero { b.zero(*at, u32::try_from(bytes.len()).unwrap()) } else { b.put(*at, bytes) }
            }
            let back: Vec<_> = batch_writes(b.bytes()).collect::<Result<_, _>>().unwrap();
            prop_assert_eq!(back.len(), writes.len());
            for (w, (at, bytes, zero)) in back.iter().zip(&writes) {
                if *zero {
                    prop_assert_eq!(*w, BatchWrite::Zero(*at, bytes.len() as u64));
                } else {
                    prop_assert_eq!(*w, BatchWrite::Bytes(*at, &bytes[..]));
                }
            }
        }
    }
}
