//! Where every field of every index item lives, as byte offsets from the
//! item's start. Kfs writes these fields and readers load them; both go
//! through these constants and nothing else: outside this module, through
//! the typed offsets [`InodeOff`], [`DirentOff`], [`BucketTable`] and
//! [`SymlinkOff`], whose methods give each field's offset, and
//! [`itable_slot`].
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
// The tag is the word's low 16 bits: dropping the rest is the point.
#[allow(clippy::cast_possible_truncation)]
pub const fn header_tag(h: u64) -> u16 {
    h as u16
}
/// The size class of a header word.
// The class is bits 16..32: dropping the generation above is the point.
#[allow(clippy::cast_possible_truncation)]
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
const I_INO: u64 = 8;
const I_SEQ: u64 = 16;
const I_MODE: u64 = 24;
const I_NLINK: u64 = 28;
const I_UID: u64 = 32;
const I_GID: u64 = 36;
const I_SIZE: u64 = 40;
const I_ATIME: u64 = 48;
const I_MTIME: u64 = 56;
const I_CTIME: u64 = 64;
const I_DATA: u64 = 72;
const I_PARENT: u64 = 80;
const I_ENTRIES: u64 = 88;
const I_BTIME: u64 = 96;
/// Directories: offset of the bucket table.
const I_BUCKETS: u64 = 104;
/// Regular files: the block map word (the same field as [`I_DATA`]).
const I_MAP: u64 = I_DATA;
/// Regular files: the version of the last commit (Kfs's own counter; the
/// field a directory uses for its parent).
const I_VERSION: u64 = I_PARENT;
/// Regular files: data pages the file holds (the field a directory uses
/// for its entry count).
const I_BLOCKS: u64 = I_ENTRIES;

// Directory entry, sentinel and list head.
const D_HASH: u64 = 8;
const D_INODE: u64 = 16;
const D_INO: u64 = 24;
const D_DIR: u64 = 32;
/// name_len (bits 0..16) | kind (bits 24..32).
const D_SHAPE: u64 = 40;
/// The link to the next node in key order (see [`link`]).
const D_NEXT: u64 = 48;
/// Where the metadata store keeps the entry's record (Kfs's own field;
/// readers never load it): its data page shifted left 8 bits, or'd with
/// its slot in that page; 0 until a retirement of the log writes it.
const D_SLOT: u64 = 56;
/// The name's bytes.
const D_NAME: u64 = 64;

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
pub const fn link(node: DirentOff, hash: u64) -> u64 {
    node.get() | link_tag(hash) << LINK_NODE_BITS
}
/// The next node's offset in a link (null at the end of the list).
#[inline(always)]
pub const fn link_node(link: u64) -> DirentOff {
    DirentOff::new(link & LINK_NODE_MASK)
}

/// Packs a dirent's shape word.
pub const fn shape(name_len: u16, kind: u8) -> u64 {
    name_len as u64 | (kind as u64) << 24
}
/// The kind byte of a dirent's shape word (bits 24..32).
// Taking the byte's bits, and dropping the zeros above, is the point.
#[allow(clippy::cast_possible_truncation)]
#[inline(always)]
pub const fn shape_kind(shape: u64) -> u8 {
    (shape >> 24) as u8
}
/// Bytes of a dirent with a name of this length.
pub const fn dirent_size(name_len: usize) -> u64 {
    D_NAME + name_len as u64
}

// Bucket table.
/// log2 of the number of buckets.
const B_BITS: u64 = 8;
/// First slot.
const B_SLOTS: u64 = 16;
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

/// The log2 bucket count a table's bits word holds.
// Kfs stores a `u32` of at most `BUCKET_BITS_MAX` there, widened, so the
// low 32 bits are the whole word; a lock-free reader range-checks the
// result before trusting it.
#[allow(clippy::cast_possible_truncation)]
#[inline(always)]
pub const fn table_bits(word: u64) -> u32 {
    word as u32
}
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
const S_LEN: u64 = 8;
/// The target's bytes.
const S_BYTES: u64 = 16;

// Inode table: the top level is a slot array of chunk offsets; each chunk
// maps ITABLE_CHUNK_INOS consecutive inode numbers to inode offsets.
/// Inode numbers per chunk.
pub const ITABLE_CHUNK_INOS: u64 = 4096;
/// First slot in a chunk or in the top level (after the item header).
const ITABLE_SLOTS_AT: u64 = 16;
/// Chunks the top level can point at (so 2^25 inode numbers).
pub const ITABLE_TOP_SLOTS: u64 = 8192;

/// The offset of an item's field `at` bytes in. Wrapping, as every load of
/// the index is: a reader may hold an offset a damaged or stale link gave
/// it, and a load outside the index reads as nothing rather than
/// panicking (Kfs's own offsets never wrap).
#[inline(always)]
const fn field(item: u64, at: u64) -> u64 {
    item.wrapping_add(at)
}

/// Writes `kind@0x…` (or `kind@null` for offset 0).
fn fmt_off(f: &mut std::fmt::Formatter<'_>, kind: &str, off: u64) -> std::fmt::Result {
    if off == 0 {
        write!(f, "{kind}@null")
    } else {
        write!(f, "{kind}@{off:#x}")
    }
}

macro_rules! offset_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[repr(transparent)]
        pub struct $name(u64);

        impl $name {
            /// Offset 0: no item (the arena header is never one).
            pub const NULL: $name = $name(0);

            /// The item at byte offset `off` of the index (unchecked: a
            /// reader's load of a bad offset reads as nothing, and Kfs
            /// checks the tag of an offset a client sent before using it).
            #[inline(always)]
            pub const fn new(off: u64) -> $name {
                $name(off)
            }

            /// The byte offset of the item in the index.
            #[inline(always)]
            pub const fn get(self) -> u64 {
                self.0
            }

            /// True for [`Self::NULL`].
            #[inline(always)]
            pub const fn is_null(self) -> bool {
                self.0 == 0
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                fmt_off(f, $kind, self.0)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                fmt_off(f, $kind, self.0)
            }
        }
    };
}

macro_rules! fields {
    ($($(#[$doc:meta])* $method:ident = $at:ident;)*) => {
        $(
            $(#[$doc])*
            #[inline(always)]
            pub const fn $method(self) -> u64 {
                field(self.0, $at)
            }
        )*
    };
}

offset_type!(
    /// The offset of an inode item in the index. Its methods give the
    /// offsets of its fields (for the loads and stores of the index's
    /// words); the item layout is in this module's docs.
    InodeOff,
    "inode"
);

impl InodeOff {
    fields! {
        /// Its inode number.
        ino = I_INO;
        /// The sequence lock over its attributes.
        seq = I_SEQ;
        /// Type and permission bits (u32).
        mode = I_MODE;
        /// Link count (u32).
        nlink = I_NLINK;
        /// Owner (u32).
        uid = I_UID;
        /// Group (u32).
        gid = I_GID;
        /// Size in bytes (symlinks: the target's length).
        size = I_SIZE;
        /// Last access.
        atime = I_ATIME;
        /// Last modification.
        mtime = I_MTIME;
        /// Last status change.
        ctime = I_CTIME;
        /// Creation.
        btime = I_BTIME;
        /// The data word: a directory's list head, a symlink's target item,
        /// a regular file's block map word.
        data = I_DATA;
        /// Directories: the parent directory's inode.
        parent = I_PARENT;
        /// Directories: the entry count.
        entries = I_ENTRIES;
        /// Directories: the bucket table.
        buckets = I_BUCKETS;
        /// Regular files: the block map word (the same field as
        /// [`InodeOff::data`]).
        map = I_MAP;
        /// Regular files: the version of the last commit (the field a
        /// directory uses for its parent).
        version = I_VERSION;
        /// Regular files: data pages the file holds (the field a directory
        /// uses for its entry count).
        blocks = I_BLOCKS;
    }

    /// Index of the sequence lock's word among the inode's 8-byte words.
    pub const SEQ_WORD: usize = (I_SEQ / 8) as usize;
}

offset_type!(
    /// The offset of a node of a directory's list in the index: an entry,
    /// a bucket sentinel or the list head (the last two are entry-shaped
    /// with an empty name). Its methods give the offsets of its fields.
    DirentOff,
    "dirent"
);

impl DirentOff {
    fields! {
        /// The key hash.
        hash = D_HASH;
        /// The inode the entry names (the head: its directory).
        inode = D_INODE;
        /// That inode's number.
        ino = D_INO;
        /// The directory's inode.
        dir = D_DIR;
        /// The shape word: name length (bits 0..16), kind (bits 24..32).
        shape = D_SHAPE;
        /// The link to the next node in key order (see [`link`]).
        next = D_NEXT;
        /// Kfs's own: where the metadata store keeps the entry's record
        /// (its data page shifted left 8 bits, or'd with its slot in that
        /// page; 0 until a retirement of the log writes it).
        slot = D_SLOT;
        /// The name's bytes.
        name = D_NAME;
    }
}

offset_type!(
    /// The offset of a directory's bucket table in the index.
    BucketTable,
    "buckets"
);

impl BucketTable {
    fields! {
        /// log2 of the number of buckets.
        bits = B_BITS;
    }

    /// Bucket `b`'s slot (the offset of its sentinel).
    #[inline(always)]
    pub const fn slot(self, b: u64) -> u64 {
        field(self.0, B_SLOTS + 8 * b)
    }

    /// Bytes of a table of `2^bits` buckets.
    #[inline]
    pub const fn size(bits: u32) -> u64 {
        B_SLOTS + (8 << bits)
    }
}

offset_type!(
    /// The offset of a symlink's target item in the index.
    SymlinkOff,
    "symlink"
);

impl SymlinkOff {
    fields! {
        /// The target's length in bytes.
        length = S_LEN;
        /// The target's bytes.
        bytes = S_BYTES;
    }

    /// Bytes of the item for a target of `len` bytes.
    #[inline]
    pub const fn size(len: u64) -> u64 {
        S_BYTES + len
    }
}

/// Slot `i` of an inode-table level (the top level's item or a chunk).
#[inline(always)]
pub const fn itable_slot(level: u64, i: u64) -> u64 {
    field(level, ITABLE_SLOTS_AT + 8 * i)
}
/// Bytes of the inode table's top level.
pub const ITABLE_TOP_SIZE: u64 = ITABLE_SLOTS_AT + 8 * ITABLE_TOP_SLOTS;
/// Bytes of an inode-table chunk.
pub const ITABLE_CHUNK_SIZE: u64 = ITABLE_SLOTS_AT + 8 * ITABLE_CHUNK_INOS;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_offsets_are_the_layouts() {
        let i = InodeOff::new(0x1000);
        assert_eq!(i.ino(), 0x1000 + I_INO);
        assert_eq!(i.seq(), 0x1000 + I_SEQ);
        assert_eq!(i.size(), 0x1000 + I_SIZE);
        assert_eq!(i.buckets(), 0x1000 + I_BUCKETS);
        assert_eq!(
            (i.map(), i.version(), i.blocks()),
            (i.data(), i.parent(), i.entries())
        );
        assert_eq!(InodeOff::SEQ_WORD * 8, usize::try_from(I_SEQ).unwrap());
        let d = DirentOff::new(0x2000);
        assert_eq!(d.next(), 0x2000 + D_NEXT);
        assert_eq!(d.name(), 0x2000 + D_NAME);
        assert_eq!(d.slot(), 0x2000 + D_SLOT);
        let t = BucketTable::new(0x3000);
        assert_eq!(
            (t.bits(), t.slot(5)),
            (0x3000 + B_BITS, 0x3000 + B_SLOTS + 40)
        );
        assert_eq!(BucketTable::size(BUCKET_BITS_MIN), B_SLOTS + 32);
        assert_eq!(itable_slot(0x4000, 2), 0x4000 + ITABLE_SLOTS_AT + 16);
        // A damaged offset wraps to one the loads refuse, never panics.
        assert_eq!(InodeOff::new(u64::MAX).seq(), I_SEQ - 1);
    }

    #[test]
    fn links_carry_their_node_and_offsets_print_as_what_they_are() {
        let node = DirentOff::new(0x1_2340);
        let hash = 0x5abc_def0_1234_5678;
        assert_eq!(link_node(link(node, hash)), node);
        assert!(link_node(0).is_null());
        assert_eq!(format!("{node:?}"), "dirent@0x12340");
        assert_eq!(InodeOff::NULL.to_string(), "inode@null");
        assert!(!node.is_null() && InodeOff::default().is_null());
    }
}
