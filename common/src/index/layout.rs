//! Where every field of every index item lives, as byte offsets from the
//! item's start. Kfs writes these fields and readers load them; both go
//! through these constants and nothing else.
//!
//! ```text
//! arena header (offset 0, one page)
//!   MAGIC u64 | EPOCH u64 | ROOT u64 | ITABLE u64 | ITABLE_SLOTS u64 | ...
//!
//! item header word (every item, offset 0):
//!   bits 0..16 tag | bits 16..32 size class | bits 32..64 generation
//!
//! inode (128 bytes)           dirent (48 + 8*height + name bytes)
//!   8  ino                      8  hash       (key, with the name)
//!  16  seq (sequence lock)     16  inode      (offset of the inode)
//!  24  mode u32, nlink u32     24  ino
//!  32  uid u32, gid u32        32  dir        (offset of the directory's inode)
//!  40  size                    40  name_len u16 | height u8 | kind u8
//!  48  atime, mtime, ctime     48  next[height] (offsets; 0 = end)
//!  72  data (dir: list head;   48 + 8*height: name
//!       symlink: target item)
//!  80  parent (dir: its parent's inode)
//!  88  entries (dir: entry count)
//!  96  btime (creation)
//! ```
//!
//! A directory's skip list starts at a head item shaped like a dirent of
//! height [`MAX_HEIGHT`] with an empty name and hash 0, below every key.

/// "KucoIDX1".
pub const MAGIC: u64 = u64::from_le_bytes(*b"KucoIDX1");

// Arena header.
/// Magic.
pub const HDR_MAGIC: u64 = 0;
/// The global reclamation epoch.
pub const HDR_EPOCH: u64 = 8;
/// Offset of the root directory's inode.
pub const HDR_ROOT: u64 = 16;
/// Offset of the inode table's top level.
pub const HDR_ITABLE: u64 = 24;
/// Slots in the top level.
pub const HDR_ITABLE_SLOTS: u64 = 32;
/// Number of live inodes.
pub const HDR_INODES: u64 = 40;
/// Bytes of the arena in use.
pub const HDR_USED: u64 = 48;
/// Size of the arena header.
pub const HEADER_SIZE: u64 = 4096;

// Item header.
/// Tag of an inode.
pub const TAG_INODE: u16 = 1;
/// Tag of a directory entry.
pub const TAG_DIRENT: u16 = 2;
/// Tag of a directory's list head.
pub const TAG_DIRHEAD: u16 = 3;
/// Tag of a symlink target.
pub const TAG_SYMLINK: u16 = 4;
/// Tag of the inode table's top level.
pub const TAG_ITABLE_TOP: u16 = 5;
/// Tag of an inode-table chunk.
pub const TAG_ITABLE_CHUNK: u16 = 6;
/// Set on a removed item: still readable by readers that reached it, but
/// no longer a valid target for a request.
pub const TAG_DEAD: u16 = 0x8000;

/// The header word of a live item.
pub const fn header(tag: u16, class: u16, gen: u32) -> u64 {
    tag as u64 | (class as u64) << 16 | (gen as u64) << 32
}
/// The tag of a header word, with the dead bit.
pub const fn header_tag(h: u64) -> u16 {
    h as u16
}
/// The size class of a header word.
pub const fn header_class(h: u64) -> u16 {
    (h >> 16) as u16
}
/// The generation of a header word.
pub const fn header_gen(h: u64) -> u32 {
    (h >> 32) as u32
}

// Inode.
/// Bytes of an inode.
pub const INODE_SIZE: u64 = 128;
#[allow(missing_docs)]
pub const I_INO: u64 = 8;
#[allow(missing_docs)]
pub const I_SEQ: u64 = 16;
#[allow(missing_docs)]
pub const I_MODE: u64 = 24;
#[allow(missing_docs)]
pub const I_NLINK: u64 = 28;
#[allow(missing_docs)]
pub const I_UID: u64 = 32;
#[allow(missing_docs)]
pub const I_GID: u64 = 36;
#[allow(missing_docs)]
pub const I_SIZE: u64 = 40;
#[allow(missing_docs)]
pub const I_ATIME: u64 = 48;
#[allow(missing_docs)]
pub const I_MTIME: u64 = 56;
#[allow(missing_docs)]
pub const I_CTIME: u64 = 64;
#[allow(missing_docs)]
pub const I_DATA: u64 = 72;
#[allow(missing_docs)]
pub const I_PARENT: u64 = 80;
#[allow(missing_docs)]
pub const I_ENTRIES: u64 = 88;
#[allow(missing_docs)]
pub const I_BTIME: u64 = 96;

// Directory entry and list head.
#[allow(missing_docs)]
pub const D_HASH: u64 = 8;
#[allow(missing_docs)]
pub const D_INODE: u64 = 16;
#[allow(missing_docs)]
pub const D_INO: u64 = 24;
#[allow(missing_docs)]
pub const D_DIR: u64 = 32;
/// name_len (bits 0..16) | height (16..24) | kind (24..32).
pub const D_SHAPE: u64 = 40;
/// First forward link.
pub const D_NEXT: u64 = 48;
/// In a list head (instead of a hash): how many levels are in use. Only
/// grows; a reader that sees an older value searches from a lower level,
/// which is slower but still finds everything.
pub const H_LEVELS: u64 = D_HASH;
/// Highest skip-list level + 1.
pub const MAX_HEIGHT: usize = 20;

/// Packs a dirent's shape word.
pub const fn shape(name_len: u16, height: u8, kind: u8) -> u64 {
    name_len as u64 | (height as u64) << 16 | (kind as u64) << 24
}
/// Bytes of a dirent of this height and name length.
pub const fn dirent_size(height: usize, name_len: usize) -> u64 {
    D_NEXT + 8 * height as u64 + name_len as u64
}
/// Offset of the name inside a dirent of this height.
pub const fn dirent_name(height: usize) -> u64 {
    D_NEXT + 8 * height as u64
}

// Symlink target.
/// Length of the target in bytes.
pub const S_LEN: u64 = 8;
/// The target's bytes.
pub const S_BYTES: u64 = 16;

// Inode table: the top level is a slot array of chunk offsets; each chunk
// maps ITABLE_CHUNK_INOS consecutive inode numbers to inode offsets.
/// Inode numbers per chunk.
pub const ITABLE_CHUNK_INOS: u64 = 4096;
/// First slot in a chunk or in the top level (after the item header).
pub const ITABLE_SLOTS_AT: u64 = 16;
/// Chunks the top level can point at (so 2^25 inode numbers).
pub const ITABLE_TOP_SLOTS: u64 = 8192;
