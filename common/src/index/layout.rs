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
//! inode (128 bytes)           dirent (64 + name bytes)
//!   8  ino                      8  hash       (key, with the name)
//!  16  seq (sequence lock)     16  inode      (offset of the inode)
//!  24  mode u32, nlink u32     24  ino
//!  32  uid u32, gid u32        32  dir        (offset of the directory's inode)
//!  40  size                    40  name_len u16 | kind u8 (bits 24..32)
//!  48  atime, mtime, ctime     48  next       (offset; 0 = end)
//!  72  data (dir: list head;   56  slot       (Kfs's: where the store
//!       symlink: target item;       keeps the entry; 0 = not yet)
//!       file: block map word)  64  name
//!  80  parent (dir: its parent's inode; file: last commit version)
//!  88  entries (dir: entry count; file: data pages held)
//!  96  btime (creation)
//! 104  buckets (dir: bucket table)
//! ```
//!
//! A directory is a **hash-indexed sorted list**: one singly linked list of
//! entries ordered by key (hash, name), starting at a head item, plus a
//! table of `2^bits` buckets. Bucket `b` covers the hashes whose top `bits`
//! bits are `b`, and its slot points at a permanent *sentinel* in the list
//! with key (first hash of the bucket, empty name), below every entry of
//! the bucket; slot 0 points at the head. A search jumps to its bucket's
//! sentinel and walks a couple of nodes. When the entries outgrow the table
//! (more than [`LOAD`] per bucket), Kfs builds a table of twice the size a
//! few old buckets at a time, adding a sentinel in the middle of each, and
//! publishes it, complete, once every old bucket has its new sentinel,
//! then retires the old one. Until then the old table stays published, and
//! complete, while the list holds new sentinels it does not point at: a
//! search walks past them as ordinary nodes (each sits at its own key),
//! and a bucket's chain ends at the next bucket's sentinel, not at the
//! first marker. Sentinels and the head are dirent-shaped items with an
//! empty name, so a walk treats them as nodes and a listing skips them.
//! Each link holds, beside the next node's offset, the top bits of that
//! node's hash ([`link`]), so a search decides to stop or pass at a node
//! without reading it: a create's search for its (absent) name reads its
//! bucket's slot, sentinel and the entries below the name, and not the
//! node after them.

/// "KucoIDX3" (2: directory links carry their next node's hash tag; 3:
/// entries carry their store slot).
pub const MAGIC: u64 = u64::from_le_bytes(*b"KucoIDX3");

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
/// Tag of a bucket sentinel in a directory's list.
pub const TAG_SENTINEL: u16 = 7;
/// Tag of a directory's bucket table.
pub const TAG_BUCKETS: u16 = 8;
/// Tag of a block-map node of a regular file.
pub const TAG_MAPNODE: u16 = 9;
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
/// Directories: offset of the bucket table.
pub const I_BUCKETS: u64 = 104;
/// Regular files: the block map word (the same field as [`I_DATA`]).
pub const I_MAP: u64 = I_DATA;
/// Regular files: the version of the last commit (Kfs's own counter; the
/// field a directory uses for its parent).
pub const I_VERSION: u64 = I_PARENT;
/// Regular files: data pages the file holds (the field a directory uses
/// for its entry count).
pub const I_BLOCKS: u64 = I_ENTRIES;

// Directory entry, sentinel and list head.
#[allow(missing_docs)]
pub const D_HASH: u64 = 8;
#[allow(missing_docs)]
pub const D_INODE: u64 = 16;
#[allow(missing_docs)]
pub const D_INO: u64 = 24;
#[allow(missing_docs)]
pub const D_DIR: u64 = 32;
/// name_len (bits 0..16) | kind (bits 24..32).
pub const D_SHAPE: u64 = 40;
/// The link to the next node in key order (see [`link`]).
pub const D_NEXT: u64 = 48;
/// Where the metadata store keeps the entry's record (Kfs's own field;
/// readers never load it): its data page shifted left 8 bits, or'd with
/// its slot in that page; 0 until a retirement of the log writes it.
pub const D_SLOT: u64 = 56;
/// The name's bytes.
pub const D_NAME: u64 = 64;

/// Bits of a link that hold the next node's offset: an index is never
/// larger than 2^36 bytes.
pub const LINK_NODE_BITS: u32 = 36;
/// The next node's offset in a link.
pub const LINK_NODE_MASK: u64 = (1 << LINK_NODE_BITS) - 1;

/// A key hash's tag: its top 28 bits (key hashes are below 2^63). Tags are
/// in the order of the hashes, so a smaller tag means a smaller hash and a
/// larger tag a larger one; only equal tags need the hashes themselves.
pub const fn link_tag(hash: u64) -> u64 {
    hash >> (63 - (64 - LINK_NODE_BITS))
}

/// The link to `node`, whose key hash is `hash`: its offset, and its tag
/// above it. A search reads whether it passes or stops at the next node
/// from the link alone, without the cache miss of reading the node; and
/// the two halves change in one store, so a lock-free reader never sees
/// one node's offset with another's tag.
pub const fn link(node: u64, hash: u64) -> u64 {
    node | link_tag(hash) << LINK_NODE_BITS
}

/// Packs a dirent's shape word.
pub const fn shape(name_len: u16, kind: u8) -> u64 {
    name_len as u64 | (kind as u64) << 24
}
/// Bytes of a dirent with a name of this length.
pub const fn dirent_size(name_len: usize) -> u64 {
    D_NAME + name_len as u64
}

// Bucket table.
/// log2 of the number of buckets.
pub const B_BITS: u64 = 8;
/// First slot.
pub const B_SLOTS: u64 = 16;
/// Buckets a new directory starts with (log2).
pub const BUCKET_BITS_MIN: u32 = 2;
/// Most buckets a directory can have (log2): 2^24 slots, 128 MiB.
pub const BUCKET_BITS_MAX: u32 = 24;
/// Entries per bucket beyond which the table doubles. One, not more: a
/// create's search for its name (which is absent) walks its bucket's chain
/// up to the first larger key, a cache miss a node, and in a directory of
/// millions of entries those misses are most of a create. One entry a
/// bucket costs a table slot and a sentinel per entry rather than per
/// two, and saves about an eighth of a create's time.
pub const LOAD: u64 = 1;

/// The bucket of a key hash in a table of `2^bits` buckets.
pub const fn bucket(hash: u64, bits: u32) -> u64 {
    hash >> (63 - bits)
}
/// The first hash of bucket `b` (the key of its sentinel).
pub const fn bucket_start(b: u64, bits: u32) -> u64 {
    b << (63 - bits)
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
