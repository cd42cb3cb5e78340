//! The index: Kfs's live metadata in DRAM, shared read-only with every
//! client (ARCHITECTURE.md §4).
//!
//! It lives in one memfd arena ([`Shm`](crate::pm::Shm)). Everything in it is
//! addressed by byte offsets into the arena, never pointers, since each
//! process maps it at its own address; offset 0 is the arena header, so 0
//! doubles as "null". Every item starts with a header word holding its type
//! tag, size class and generation, so that Kfs can check that an offset a
//! client sent really is a live item of the expected type.
//!
//! Only Kfs writes the index ([`layout`] says where each field lives). Clients
//! read it lock-free through [`IndexReader`]: published links are stored with
//! `Release` and loaded with `Acquire`, inode attributes sit behind a
//! per-inode sequence lock, and removed items are only reused after every
//! reader has left the epoch in which they were removed (ARCHITECTURE.md §9).

pub mod blockmap;
pub mod layout;
mod namei;
mod read;

pub use namei::{split_path, Last, Parent, MAX_SYMLINKS};
pub use read::{DirEntryInfo, IndexReader, InodeAttr, Kind, Search, Timespec};

pub use layout::{BucketTable, DirentOff, InodeOff, SymlinkOff};

/// An inode number: what the log, the metadata store and the inode table
/// name an inode by (its offset in the index, [`InodeOff`], changes from
/// one run to the next; its number does not).
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub struct Ino(u64);

impl Ino {
    /// The root directory's number.
    pub const ROOT: Ino = Ino(1);

    /// Inode number `n`.
    #[inline(always)]
    pub const fn new(n: u64) -> Ino {
        Ino(n)
    }

    /// The number.
    #[inline(always)]
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Debug for Ino {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ino {}", self.0)
    }
}

impl std::fmt::Display for Ino {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Longest name of a directory entry, in bytes.
pub const NAME_MAX: usize = 255;
/// Longest path, in bytes, including the terminating NUL a C caller would add.
pub const PATH_MAX: usize = 4096;

/// The key of a name inside a directory: its 63-bit hash, never below 3 so
/// that readdir cookies 0 ("start"), 1 (".") and 2 ("..") stay free. Entries
/// are ordered by (hash, name), so equal hashes are still distinct keys.
pub fn name_hash(name: &[u8]) -> u64 {
    // Eight bytes at a time through a multiply-rotate mix, then the
    // splitmix64 finaliser; the length goes in too, so that names that
    // differ only by trailing zero bytes still differ.
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ (name.len() as u64).wrapping_mul(K);
    let mut chunks = name.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(K).rotate_left(29);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(K).rotate_left(29);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    (h >> 1).max(3)
}

/// Checks a single name as it may appear in a directory: 1 to 255 bytes, no
/// `/`, no NUL, not `.` or `..`.
pub fn check_name(name: &[u8]) -> Result<(), crate::Errno> {
    use crate::Errno;
    if name.is_empty() {
        return Err(Errno::ENOENT);
    }
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}
