//! Lock-free reading of the index, shared by clients (through their
//! read-only view) and Kfs (through its own mapping).

use std::cmp::Ordering as Cmp;
use std::sync::atomic::{fence, Ordering};

use super::layout::*;
use super::{name_hash, NAME_MAX};
use crate::pm::Words;

/// What kind of file an inode or entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
}

impl Kind {
    /// The kind encoded in a mode's `S_IFMT` bits.
    pub fn from_mode(mode: u32) -> Option<Kind> {
        match mode & libc::S_IFMT {
            libc::S_IFREG => Some(Kind::File),
            libc::S_IFDIR => Some(Kind::Dir),
            libc::S_IFLNK => Some(Kind::Symlink),
            _ => None,
        }
    }

    /// The byte stored in a dirent.
    pub fn to_byte(self) -> u8 {
        match self {
            Kind::File => 1,
            Kind::Dir => 2,
            Kind::Symlink => 3,
        }
    }

    /// The kind a dirent byte encodes.
    pub fn from_byte(b: u8) -> Option<Kind> {
        match b {
            1 => Some(Kind::File),
            2 => Some(Kind::Dir),
            3 => Some(Kind::Symlink),
            _ => None,
        }
    }
}

/// A time in nanoseconds since the Unix epoch.
pub type Timespec = i64;

/// A consistent copy of an inode's attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InodeAttr {
    /// Offset of the inode in the index.
    pub offset: u64,
    /// Generation of the inode item.
    pub gen: u32,
    /// Inode number.
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
    /// Last access.
    pub atime: Timespec,
    /// Last modification.
    pub mtime: Timespec,
    /// Last status change.
    pub ctime: Timespec,
    /// Creation.
    pub btime: Timespec,
    /// Directories: number of entries.
    pub entries: u64,
}

impl InodeAttr {
    /// The kind, from the mode's type bits.
    pub fn kind(&self) -> Option<Kind> {
        Kind::from_mode(self.mode)
    }
}

/// One directory entry as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntryInfo {
    /// Offset of the dirent.
    pub offset: u64,
    /// Its key hash (also its readdir cookie).
    pub hash: u64,
    /// The name.
    pub name: Vec<u8>,
    /// Offset of the inode it names.
    pub inode: u64,
    /// Inode number.
    pub ino: u64,
    /// Kind of the inode.
    pub kind: Kind,
}

/// The outcome of a search for a key in a directory: the last node before
/// the key (an entry, a sentinel or the head), and the entry holding the key
/// if there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Search {
    /// The node after which the key is, or would be, linked.
    pub pred: u64,
    /// The entry with exactly this key, or 0.
    pub found: u64,
}

/// Reads an index through any [`Words`] (a client's read-only view, or
/// Kfs's own mapping).
#[derive(Debug)]
pub struct IndexReader<'a, W: Words + ?Sized> {
    mem: &'a W,
}

impl<W: Words + ?Sized> Clone for IndexReader<'_, W> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<W: Words + ?Sized> Copy for IndexReader<'_, W> {}

impl<'a, W: Words + ?Sized> IndexReader<'a, W> {
    /// A reader over `mem`.
    pub fn new(mem: &'a W) -> Self {
        IndexReader { mem }
    }

    /// The memory read.
    pub fn mem(&self) -> &'a W {
        self.mem
    }

    /// Offset of the root directory's inode.
    pub fn root(&self) -> u64 {
        self.mem.load_u64(HDR_ROOT, Ordering::Acquire)
    }

    /// Number of live inodes.
    pub fn inode_count(&self) -> u64 {
        self.mem.load_u64(HDR_INODES, Ordering::Relaxed)
    }

    /// The global reclamation epoch.
    pub fn epoch(&self) -> u64 {
        self.mem.load_u64(HDR_EPOCH, Ordering::SeqCst)
    }

    /// An item's header word.
    pub fn header(&self, off: u64) -> u64 {
        self.mem.load_u64(off, Ordering::Acquire)
    }

    /// True if `off` is a live item with tag `tag` (and generation `gen`,
    /// if given).
    pub fn is_live(&self, off: u64, tag: u16, gen: Option<u32>) -> bool {
        if off < HEADER_SIZE || !off.is_multiple_of(8) {
            return false;
        }
        let h = self.header(off);
        header_tag(h) == tag && gen.is_none_or(|g| header_gen(h) == g)
    }

    /// True if `off` is an item with tag `tag`, live or removed (removed
    /// items stay readable until the grace period ends).
    pub fn has_tag(&self, off: u64, tag: u16) -> bool {
        off >= HEADER_SIZE && header_tag(self.header(off)) & !TAG_DEAD == tag
    }

    /// The inode's type and permission bits. The type bits never change
    /// after creation, so one load suffices for type checks.
    pub fn mode(&self, inode: u64) -> u32 {
        self.mem
            .load_u32(inode.wrapping_add(I_MODE), Ordering::Acquire)
    }

    /// The inode's kind, or `None` if `inode` is not an inode.
    pub fn kind(&self, inode: u64) -> Option<Kind> {
        if !self.has_tag(inode, TAG_INODE) {
            return None;
        }
        Kind::from_mode(self.mode(inode))
    }

    /// The inode's number.
    pub fn ino(&self, inode: u64) -> u64 {
        self.mem
            .load_u64(inode.wrapping_add(I_INO), Ordering::Acquire)
    }

    /// A directory's parent directory (the root is its own parent).
    pub fn parent(&self, dir: u64) -> u64 {
        self.mem
            .load_u64(dir.wrapping_add(I_PARENT), Ordering::Acquire)
    }

    /// A consistent snapshot of an inode's attributes, or `None` if `off`
    /// is not an inode.
    pub fn attr(&self, off: u64) -> Option<InodeAttr> {
        let m = self.mem;
        loop {
            let h = self.header(off);
            if header_tag(h) & !TAG_DEAD != TAG_INODE || off < HEADER_SIZE {
                return None;
            }
            // Sequence lock: Kfs makes `seq` odd, fences, writes, then makes
            // it even with Release. This Acquire pairs with that Release.
            let s1 = m.load_u64(off.wrapping_add(I_SEQ), Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let r = |f: u64| m.load_u64(off.wrapping_add(f), Ordering::Relaxed);
            let a = InodeAttr {
                offset: off,
                gen: header_gen(h),
                ino: r(I_INO),
                mode: m.load_u32(off.wrapping_add(I_MODE), Ordering::Relaxed),
                nlink: m.load_u32(off.wrapping_add(I_NLINK), Ordering::Relaxed),
                uid: m.load_u32(off.wrapping_add(I_UID), Ordering::Relaxed),
                gid: m.load_u32(off.wrapping_add(I_GID), Ordering::Relaxed),
                size: r(I_SIZE),
                atime: r(I_ATIME) as i64,
                mtime: r(I_MTIME) as i64,
                ctime: r(I_CTIME) as i64,
                btime: r(I_BTIME) as i64,
                entries: r(I_ENTRIES),
            };
            // Orders the field loads above before the re-check of `seq`
            // (pairs with Kfs's Release fence after making `seq` odd).
            fence(Ordering::Acquire);
            if m.load_u64(off.wrapping_add(I_SEQ), Ordering::Relaxed) == s1 {
                return Some(a);
            }
        }
    }

    /// The inode with number `ino`, or 0.
    pub fn inode_by_ino(&self, ino: u64) -> u64 {
        let top = self.mem.load_u64(HDR_ITABLE, Ordering::Acquire);
        let chunk_no = ino / ITABLE_CHUNK_INOS;
        if top == 0 || chunk_no >= ITABLE_TOP_SLOTS {
            return 0;
        }
        let chunk = self.mem.load_u64(
            top.wrapping_add(ITABLE_SLOTS_AT + 8 * chunk_no),
            Ordering::Acquire,
        );
        if chunk == 0 {
            return 0;
        }
        let slot = ino % ITABLE_CHUNK_INOS;
        self.mem.load_u64(
            chunk.wrapping_add(ITABLE_SLOTS_AT + 8 * slot),
            Ordering::Acquire,
        )
    }

    /// The node after `node` in key order (0 at the end).
    #[inline]
    pub fn next(&self, node: u64) -> u64 {
        self.link(node) & LINK_NODE_MASK
    }

    /// `node`'s link: the next node's offset and tag (see [`link`]).
    #[inline]
    pub fn link(&self, node: u64) -> u64 {
        // Acquire pairs with Kfs's Release store when it links a node, so
        // the node's fields are visible once its offset is.
        self.mem
            .load_u64(node.wrapping_add(D_NEXT), Ordering::Acquire)
    }

    /// How the node a link (non-zero) leads to compares with (`hash`,
    /// `name`): from the link's tag alone unless the tags are equal.
    #[inline]
    pub fn cmp_link(&self, link: u64, hash: u64, name: &[u8]) -> Cmp {
        match (link >> LINK_NODE_BITS).cmp(&link_tag(hash)) {
            Cmp::Equal => self.cmp_key(link & LINK_NODE_MASK, hash, name),
            other => other,
        }
    }

    /// True for a sentinel or a list head (an empty-named node).
    #[inline]
    pub fn is_marker(&self, node: u64) -> bool {
        self.mem
            .load_u64(node.wrapping_add(D_SHAPE), Ordering::Relaxed)
            & 0xffff
            == 0
    }

    /// Copies a dirent's name into `buf` and returns its length.
    pub fn name_into(&self, node: u64, buf: &mut [u8; NAME_MAX]) -> usize {
        let shape = self
            .mem
            .load_u64(node.wrapping_add(D_SHAPE), Ordering::Relaxed);
        let len = ((shape & 0xffff) as usize).min(NAME_MAX);
        if !self.mem.read(node.wrapping_add(D_NAME), &mut buf[..len]) {
            return 0;
        }
        len
    }

    /// Compares a dirent's key with (`hash`, `name`).
    #[inline]
    pub fn cmp_key(&self, node: u64, hash: u64, name: &[u8]) -> Cmp {
        let h = self
            .mem
            .load_u64(node.wrapping_add(D_HASH), Ordering::Relaxed);
        match h.cmp(&hash) {
            Cmp::Equal => self.cmp_name(node, name),
            other => other,
        }
    }

    /// Compares a dirent's name with `name` (same hash: almost always the
    /// same name), in place.
    fn cmp_name(&self, node: u64, name: &[u8]) -> Cmp {
        let shape = self
            .mem
            .load_u64(node.wrapping_add(D_SHAPE), Ordering::Relaxed);
        let len = ((shape & 0xffff) as usize).min(NAME_MAX);
        let common = len.min(name.len());
        match self
            .mem
            .cmp_bytes(node.wrapping_add(D_NAME), &name[..common])
        {
            Some(Cmp::Equal) => len.cmp(&name.len()),
            Some(other) => other,
            None => Cmp::Less,
        }
    }

    /// The head of a directory's list (0 if `dir` is not a directory).
    pub fn dir_head(&self, dir: u64) -> u64 {
        self.mem
            .load_u64(dir.wrapping_add(I_DATA), Ordering::Acquire)
    }

    /// The sentinel (or head) that starts `hash`'s bucket in `dir`.
    #[inline]
    pub fn bucket_start(&self, dir: u64, hash: u64) -> u64 {
        // Acquire pairs with Kfs's Release store of a new table: its slots
        // and sentinels are visible once the table is.
        let table = self
            .mem
            .load_u64(dir.wrapping_add(I_BUCKETS), Ordering::Acquire);
        if table == 0 {
            return self.dir_head(dir);
        }
        let bits = self
            .mem
            .load_u64(table.wrapping_add(B_BITS), Ordering::Relaxed) as u32;
        if !(BUCKET_BITS_MIN..=BUCKET_BITS_MAX).contains(&bits) {
            return self.dir_head(dir);
        }
        let slot = table.wrapping_add(B_SLOTS + 8 * bucket(hash, bits));
        match self.mem.load_u64(slot, Ordering::Acquire) {
            0 => self.dir_head(dir),
            s => s,
        }
    }

    /// Searches directory `dir` for the key (`hash`, `name`), from the
    /// sentinel of its bucket.
    pub fn search(&self, dir: u64, hash: u64, name: &[u8]) -> Search {
        self.search_from(self.bucket_start(dir, hash), hash, name)
    }

    /// Searches for the key walking from `start`, a node below it.
    pub fn search_from(&self, start: u64, hash: u64, name: &[u8]) -> Search {
        let mut x = start;
        if x == 0 {
            return Search { pred: 0, found: 0 };
        }
        loop {
            let l = self.link(x);
            let nx = l & LINK_NODE_MASK;
            if nx == 0 {
                return Search { pred: x, found: 0 };
            }
            match self.cmp_link(l, hash, name) {
                Cmp::Less => x = nx,
                Cmp::Equal => return Search { pred: x, found: nx },
                Cmp::Greater => return Search { pred: x, found: 0 },
            }
        }
    }

    /// Looks `name` up in directory `dir`: the dirent's offset, or 0.
    pub fn lookup(&self, dir: u64, name: &[u8]) -> u64 {
        self.search(dir, name_hash(name), name).found
    }

    /// The inode a dirent names.
    pub fn dirent_inode(&self, dirent: u64) -> u64 {
        self.mem
            .load_u64(dirent.wrapping_add(D_INODE), Ordering::Acquire)
    }

    /// Reads one dirent.
    pub fn dirent(&self, off: u64) -> DirEntryInfo {
        let mut buf = [0u8; NAME_MAX];
        let n = self.name_into(off, &mut buf);
        let shape = self
            .mem
            .load_u64(off.wrapping_add(D_SHAPE), Ordering::Relaxed);
        DirEntryInfo {
            offset: off,
            hash: self
                .mem
                .load_u64(off.wrapping_add(D_HASH), Ordering::Relaxed),
            name: buf[..n].to_vec(),
            inode: self.dirent_inode(off),
            ino: self
                .mem
                .load_u64(off.wrapping_add(D_INO), Ordering::Relaxed),
            kind: Kind::from_byte((shape >> 24) as u8).unwrap_or(Kind::File),
        }
    }

    /// Appends up to `max` entries of `dir` that come after the key `after`
    /// (or from the start) to `out`, in key order. Returns false when the
    /// directory has no more entries.
    pub fn read_dir(
        &self,
        dir: u64,
        after: Option<(u64, &[u8])>,
        max: usize,
        out: &mut Vec<DirEntryInfo>,
    ) -> bool {
        let mut x = match after {
            None => self.dir_head(dir),
            Some((hash, name)) => {
                let s = self.search(dir, hash, name);
                if s.found != 0 {
                    s.found
                } else {
                    s.pred
                }
            }
        };
        if x == 0 {
            return false;
        }
        let mut taken = 0;
        loop {
            x = self.next(x);
            if x == 0 {
                return false;
            }
            if self.is_marker(x) {
                continue;
            }
            if taken == max {
                return true;
            }
            out.push(self.dirent(x));
            taken += 1;
        }
    }

    /// Calls `f(name, ino)` for every entry of `dir`, in no set order, with
    /// no allocation: the single writer's way to list a directory whole (a
    /// reader that may race the writer pages with [`IndexReader::read_dir`]).
    ///
    /// Each bucket's entries lie between its sentinel and the next
    /// bucket's, and the entries of a large directory lie wherever they
    /// were made: walking the one list node by node is a cache miss per
    /// entry. So the chains of [`CHAINS`] buckets are walked in step, each
    /// next node prefetched, and their misses overlap. A chain ends at the
    /// next bucket's own sentinel, not at the first marker: while the
    /// table doubles, a bucket's chain also holds the new table's sentinel
    /// in its middle.
    pub fn for_each_entry(&self, dir: u64, mut f: impl FnMut(&[u8], u64)) {
        const CHAINS: usize = 32;
        let mut buf = [0u8; NAME_MAX];
        let mut visit = |x: u64| {
            let n = self.name_into(x, &mut buf);
            f(
                &buf[..n],
                self.mem.load_u64(x.wrapping_add(D_INO), Ordering::Relaxed),
            );
        };
        let table = self
            .mem
            .load_u64(dir.wrapping_add(I_BUCKETS), Ordering::Acquire);
        let bits = self
            .mem
            .load_u64(table.wrapping_add(B_BITS), Ordering::Relaxed) as u32;
        let slot = |b: u64| {
            self.mem
                .load_u64(table.wrapping_add(B_SLOTS + 8 * b), Ordering::Acquire)
        };
        let buckets = 1u64 << bits.min(BUCKET_BITS_MAX);
        let chained = table != 0
            && (BUCKET_BITS_MIN..=BUCKET_BITS_MAX).contains(&bits)
            && slot(0) == self.dir_head(dir)
            && (0..buckets).all(|b| slot(b) != 0);
        if !chained {
            // No table (or one still being built): the list, node by node.
            let mut x = self.next(self.dir_head(dir));
            while x != 0 {
                if !self.is_marker(x) {
                    visit(x);
                }
                x = self.next(x);
            }
            return;
        }
        let mut first = 0;
        while first < buckets {
            let n = (CHAINS as u64).min(buckets - first) as usize;
            // Each chain's next node, and where it ends (the next bucket's
            // sentinel, or 0 for the last bucket); the node is 0 once the
            // chain reached its end.
            let mut at = [0u64; CHAINS];
            let mut end = [0u64; CHAINS];
            let mut left = 0;
            for (i, (a, e)) in at.iter_mut().zip(&mut end).enumerate().take(n) {
                let b = first + i as u64;
                *e = if b + 1 < buckets { slot(b + 1) } else { 0 };
                *a = self.next(slot(b));
                if *a == *e {
                    *a = 0;
                }
                self.mem.prefetch(*a);
                left += usize::from(*a != 0);
            }
            while left > 0 {
                for (a, &e) in at.iter_mut().zip(&end).take(n) {
                    if *a == 0 {
                        continue;
                    }
                    let x = *a;
                    *a = self.next(x);
                    if *a == e {
                        *a = 0;
                        left -= 1;
                    } else {
                        self.mem.prefetch(*a);
                    }
                    if !self.is_marker(x) {
                        visit(x);
                    }
                }
            }
            first += n as u64;
        }
    }

    /// A symlink's target, or `None` if `inode` is not a symlink.
    pub fn readlink(&self, inode: u64) -> Option<Vec<u8>> {
        if self.kind(inode) != Some(Kind::Symlink) {
            return None;
        }
        let t = self
            .mem
            .load_u64(inode.wrapping_add(I_DATA), Ordering::Acquire);
        if !self.has_tag(t, TAG_SYMLINK) {
            return None;
        }
        let len = self.mem.load_u64(t.wrapping_add(S_LEN), Ordering::Relaxed) as usize;
        let mut v = vec![0u8; len.min(super::PATH_MAX)];
        self.mem.read(t.wrapping_add(S_BYTES), &mut v).then_some(v)
    }
}
