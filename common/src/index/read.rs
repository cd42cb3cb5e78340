//! Lock-free reading of the index, shared by clients (through their
//! read-only view) and Kfs (through its own mapping).

use std::cmp::Ordering as Cmp;
use std::sync::atomic::{fence, Ordering};

use super::layout::*;
use super::{name_hash, Ino, NAME_MAX};
use crate::access::Perm;
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
    pub offset: InodeOff,
    /// Generation of the inode item.
    pub gen: u32,
    /// Inode number.
    pub ino: Ino,
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
    pub offset: DirentOff,
    /// Its key hash (also its readdir cookie).
    pub hash: u64,
    /// The name.
    pub name: Vec<u8>,
    /// Offset of the inode it names.
    pub inode: InodeOff,
    /// Inode number.
    pub ino: Ino,
    /// Kind of the inode.
    pub kind: Kind,
}

/// The outcome of a search for a key in a directory: the last node before
/// the key (an entry, a sentinel or the head), and the entry holding the key
/// if there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Search {
    /// The node after which the key is, or would be, linked.
    pub pred: DirentOff,
    /// The entry with exactly this key, or null.
    pub found: DirentOff,
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
    pub fn root(&self) -> InodeOff {
        InodeOff::new(self.mem.load_u64(HDR_ROOT, Ordering::Acquire))
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
    pub fn mode(&self, inode: InodeOff) -> u32 {
        self.mem.load_u32(inode.mode(), Ordering::Acquire)
    }

    /// The inode's kind, or `None` if `inode` is not an inode.
    pub fn kind(&self, inode: InodeOff) -> Option<Kind> {
        if !self.has_tag(inode.get(), TAG_INODE) {
            return None;
        }
        Kind::from_mode(self.mode(inode))
    }

    /// The inode's number.
    pub fn ino(&self, inode: InodeOff) -> Ino {
        Ino::new(self.mem.load_u64(inode.ino(), Ordering::Acquire))
    }

    /// A directory's parent directory (the root is its own parent).
    pub fn parent(&self, dir: InodeOff) -> InodeOff {
        InodeOff::new(self.mem.load_u64(dir.parent(), Ordering::Acquire))
    }

    /// A consistent snapshot of an inode's attributes, or `None` if `off`
    /// is not an inode.
    pub fn attr(&self, off: InodeOff) -> Option<InodeAttr> {
        let m = self.mem;
        loop {
            let h = self.header(off.get());
            if header_tag(h) & !TAG_DEAD != TAG_INODE || off.get() < HEADER_SIZE {
                return None;
            }
            // Sequence lock: Kfs makes `seq` odd, fences, writes, then makes
            // it even with Release. This Acquire pairs with that Release.
            let s1 = m.load_u64(off.seq(), Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let r = |at: u64| m.load_u64(at, Ordering::Relaxed);
            let r32 = |at: u64| m.load_u32(at, Ordering::Relaxed);
            let a = InodeAttr {
                offset: off,
                gen: header_gen(h),
                ino: Ino::new(r(off.ino())),
                mode: r32(off.mode()),
                nlink: r32(off.nlink()),
                uid: r32(off.uid()),
                gid: r32(off.gid()),
                size: r(off.size()),
                atime: r(off.atime()).cast_signed(),
                mtime: r(off.mtime()).cast_signed(),
                ctime: r(off.ctime()).cast_signed(),
                btime: r(off.btime()).cast_signed(),
                entries: r(off.entries()),
            };
            // Orders the field loads above before the re-check of `seq`
            // (pairs with Kfs's Release fence after making `seq` odd).
            fence(Ordering::Acquire);
            if m.load_u64(off.seq(), Ordering::Relaxed) == s1 {
                return Some(a);
            }
        }
    }

    /// A consistent copy of an inode's mode, owner and group (what a
    /// permission check reads), or `None` if `off` is not an inode.
    pub fn perm(&self, off: InodeOff) -> Option<Perm> {
        let m = self.mem;
        loop {
            if !self.has_tag(off.get(), TAG_INODE) {
                return None;
            }
            // The sequence lock as in `attr`: this Acquire pairs with
            // Kfs's Release store that makes `seq` even.
            let s1 = m.load_u64(off.seq(), Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let p = Perm {
                mode: m.load_u32(off.mode(), Ordering::Relaxed),
                uid: m.load_u32(off.uid(), Ordering::Relaxed),
                gid: m.load_u32(off.gid(), Ordering::Relaxed),
            };
            // Orders the loads above before the re-check of `seq` (pairs
            // with Kfs's Release fence after making `seq` odd).
            fence(Ordering::Acquire);
            if m.load_u64(off.seq(), Ordering::Relaxed) == s1 {
                return Some(p);
            }
        }
    }

    /// The inode with number `ino`, or null.
    pub fn inode_by_ino(&self, ino: Ino) -> InodeOff {
        let ino = ino.get();
        let top = self.mem.load_u64(HDR_ITABLE, Ordering::Acquire);
        let chunk_no = ino / ITABLE_CHUNK_INOS;
        if top == 0 || chunk_no >= ITABLE_TOP_SLOTS {
            return InodeOff::NULL;
        }
        let chunk = self
            .mem
            .load_u64(itable_slot(top, chunk_no), Ordering::Acquire);
        if chunk == 0 {
            return InodeOff::NULL;
        }
        let slot = ino % ITABLE_CHUNK_INOS;
        InodeOff::new(
            self.mem
                .load_u64(itable_slot(chunk, slot), Ordering::Acquire),
        )
    }

    /// The node after `node` in key order (null at the end).
    #[inline]
    pub fn next(&self, node: DirentOff) -> DirentOff {
        link_node(self.link(node))
    }

    /// `node`'s link: the next node's offset and tag (see [`link`]).
    #[inline]
    pub fn link(&self, node: DirentOff) -> u64 {
        // Acquire pairs with Kfs's Release store when it links a node, so
        // the node's fields are visible once its offset is.
        self.mem.load_u64(node.next(), Ordering::Acquire)
    }

    /// How the node a link (non-zero) leads to compares with (`hash`,
    /// `name`): from the link's tag alone unless the tags are equal.
    #[inline]
    pub fn cmp_link(&self, link: u64, hash: u64, name: &[u8]) -> Cmp {
        match (link >> LINK_NODE_BITS).cmp(&link_tag(hash)) {
            Cmp::Equal => self.cmp_key(link_node(link), hash, name),
            other => other,
        }
    }

    /// True for a sentinel or a list head (an empty-named node).
    #[inline]
    pub fn is_marker(&self, node: DirentOff) -> bool {
        self.mem.load_u64(node.shape(), Ordering::Relaxed) & 0xffff == 0
    }

    /// Copies a dirent's name into `buf` and returns its length.
    pub fn name_into(&self, node: DirentOff, buf: &mut [u8; NAME_MAX]) -> usize {
        let shape = self.mem.load_u64(node.shape(), Ordering::Relaxed);
        let len = ((shape & 0xffff) as usize).min(NAME_MAX);
        if !self.mem.read(node.name(), &mut buf[..len]) {
            return 0;
        }
        len
    }

    /// Compares a dirent's key with (`hash`, `name`).
    #[inline]
    pub fn cmp_key(&self, node: DirentOff, hash: u64, name: &[u8]) -> Cmp {
        let h = self.mem.load_u64(node.hash(), Ordering::Relaxed);
        match h.cmp(&hash) {
            Cmp::Equal => self.cmp_name(node, name),
            other => other,
        }
    }

    /// Compares a dirent's name with `name` (same hash: almost always the
    /// same name), in place.
    fn cmp_name(&self, node: DirentOff, name: &[u8]) -> Cmp {
        let shape = self.mem.load_u64(node.shape(), Ordering::Relaxed);
        let len = ((shape & 0xffff) as usize).min(NAME_MAX);
        let common = len.min(name.len());
        match self.mem.cmp_bytes(node.name(), &name[..common]) {
            Some(Cmp::Equal) => len.cmp(&name.len()),
            Some(other) => other,
            None => Cmp::Less,
        }
    }

    /// The head of a directory's list (null if `dir` is not a directory).
    pub fn dir_head(&self, dir: InodeOff) -> DirentOff {
        DirentOff::new(self.mem.load_u64(dir.data(), Ordering::Acquire))
    }

    /// The sentinel (or head) that starts `hash`'s bucket in `dir`.
    #[inline]
    pub fn bucket_start(&self, dir: InodeOff, hash: u64) -> DirentOff {
        // Acquire pairs with Kfs's Release store of a new table: its slots
        // and sentinels are visible once the table is.
        let table = BucketTable::new(self.mem.load_u64(dir.buckets(), Ordering::Acquire));
        if table.is_null() {
            return self.dir_head(dir);
        }
        let bits = table_bits(self.mem.load_u64(table.bits(), Ordering::Relaxed));
        if !(BUCKET_BITS_MIN..=BUCKET_BITS_MAX).contains(&bits) {
            return self.dir_head(dir);
        }
        let slot = table.slot(bucket(hash, bits));
        match self.mem.load_u64(slot, Ordering::Acquire) {
            0 => self.dir_head(dir),
            s => DirentOff::new(s),
        }
    }

    /// Searches directory `dir` for the key (`hash`, `name`), from the
    /// sentinel of its bucket.
    pub fn search(&self, dir: InodeOff, hash: u64, name: &[u8]) -> Search {
        self.search_from(self.bucket_start(dir, hash), hash, name)
    }

    /// Searches for the key walking from `start`, a node below it.
    pub fn search_from(&self, start: DirentOff, hash: u64, name: &[u8]) -> Search {
        let mut x = start;
        if x.is_null() {
            return Search {
                pred: DirentOff::NULL,
                found: DirentOff::NULL,
            };
        }
        loop {
            let l = self.link(x);
            let nx = link_node(l);
            if nx.is_null() {
                return Search {
                    pred: x,
                    found: DirentOff::NULL,
                };
            }
            match self.cmp_link(l, hash, name) {
                Cmp::Less => x = nx,
                Cmp::Equal => return Search { pred: x, found: nx },
                Cmp::Greater => {
                    return Search {
                        pred: x,
                        found: DirentOff::NULL,
                    }
                }
            }
        }
    }

    /// Looks `name` up in directory `dir`: the dirent's offset, or null.
    pub fn lookup(&self, dir: InodeOff, name: &[u8]) -> DirentOff {
        self.search(dir, name_hash(name), name).found
    }

    /// The inode a dirent names.
    pub fn dirent_inode(&self, dirent: DirentOff) -> InodeOff {
        InodeOff::new(self.mem.load_u64(dirent.inode(), Ordering::Acquire))
    }

    /// Reads one dirent.
    pub fn dirent(&self, off: DirentOff) -> DirEntryInfo {
        let mut buf = [0u8; NAME_MAX];
        let n = self.name_into(off, &mut buf);
        let shape = self.mem.load_u64(off.shape(), Ordering::Relaxed);
        DirEntryInfo {
            offset: off,
            hash: self.mem.load_u64(off.hash(), Ordering::Relaxed),
            name: buf[..n].to_vec(),
            inode: self.dirent_inode(off),
            ino: Ino::new(self.mem.load_u64(off.ino(), Ordering::Relaxed)),
            kind: Kind::from_byte(shape_kind(shape)).unwrap_or(Kind::File),
        }
    }

    /// Appends up to `max` entries of `dir` that come after the key `after`
    /// (or from the start) to `out`, in key order. Returns false when the
    /// directory has no more entries.
    pub fn read_dir(
        &self,
        dir: InodeOff,
        after: Option<(u64, &[u8])>,
        max: usize,
        out: &mut Vec<DirEntryInfo>,
    ) -> bool {
        let mut x = match after {
            None => self.dir_head(dir),
            Some((hash, name)) => {
                let s = self.search(dir, hash, name);
                if !s.found.is_null() {
                    s.found
                } else {
                    s.pred
                }
            }
        };
        if x.is_null() {
            return false;
        }
        let mut taken = 0;
        loop {
            x = self.next(x);
            if x.is_null() {
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
    /// entry. So the chains of `CHAINS` buckets are walked in step, each
    /// next node prefetched, and their misses overlap. A chain ends at the
    /// next bucket's own sentinel, not at the first marker: while the
    /// table doubles, a bucket's chain also holds the new table's sentinel
    /// in its middle.
    pub fn for_each_entry(&self, dir: InodeOff, mut f: impl FnMut(&[u8], Ino)) {
        const CHAINS: usize = 32;
        let mut buf = [0u8; NAME_MAX];
        let mut visit = |x: DirentOff| {
            let n = self.name_into(x, &mut buf);
            f(
                &buf[..n],
                Ino::new(self.mem.load_u64(x.ino(), Ordering::Relaxed)),
            );
        };
        let table = BucketTable::new(self.mem.load_u64(dir.buckets(), Ordering::Acquire));
        let bits = table_bits(self.mem.load_u64(table.bits(), Ordering::Relaxed));
        let slot = |b: u64| DirentOff::new(self.mem.load_u64(table.slot(b), Ordering::Acquire));
        let buckets = 1u64 << bits.min(BUCKET_BITS_MAX);
        let chained = !table.is_null()
            && (BUCKET_BITS_MIN..=BUCKET_BITS_MAX).contains(&bits)
            && slot(0) == self.dir_head(dir)
            && (0..buckets).all(|b| !slot(b).is_null());
        if !chained {
            // No table (or one still being built): the list, node by node.
            let mut x = self.next(self.dir_head(dir));
            while !x.is_null() {
                if !self.is_marker(x) {
                    visit(x);
                }
                x = self.next(x);
            }
            return;
        }
        let mut first = 0;
        while first < buckets {
            // At most `CHAINS`, which any `usize` holds.
            #[allow(clippy::cast_possible_truncation)]
            let n = (buckets - first).min(CHAINS as u64) as usize;
            // Each chain's next node, and where it ends (the next bucket's
            // sentinel, or null for the last bucket); the node is null once
            // the chain reached its end.
            let mut at = [DirentOff::NULL; CHAINS];
            let mut end = [DirentOff::NULL; CHAINS];
            let mut left = 0;
            for (i, (a, e)) in at.iter_mut().zip(&mut end).enumerate().take(n) {
                let b = first + i as u64;
                *e = if b + 1 < buckets {
                    slot(b + 1)
                } else {
                    DirentOff::NULL
                };
                *a = self.next(slot(b));
                if *a == *e {
                    *a = DirentOff::NULL;
                }
                self.mem.prefetch(a.get());
                left += usize::from(!a.is_null());
            }
            while left > 0 {
                for (a, &e) in at.iter_mut().zip(&end).take(n) {
                    if a.is_null() {
                        continue;
                    }
                    let x = *a;
                    *a = self.next(x);
                    if *a == e {
                        *a = DirentOff::NULL;
                        left -= 1;
                    } else {
                        self.mem.prefetch(a.get());
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
    pub fn readlink(&self, inode: InodeOff) -> Option<Vec<u8>> {
        if self.kind(inode) != Some(Kind::Symlink) {
            return None;
        }
        let t = SymlinkOff::new(self.mem.load_u64(inode.data(), Ordering::Acquire));
        if !self.has_tag(t.get(), TAG_SYMLINK) {
            return None;
        }
        // Bounded by `PATH_MAX` before the cast, which so loses nothing.
        #[allow(clippy::cast_possible_truncation)]
        let len = self
            .mem
            .load_u64(t.length(), Ordering::Relaxed)
            .min(super::PATH_MAX as u64) as usize;
        let mut v = vec![0u8; len];
        self.mem.read(t.bytes(), &mut v).then_some(v)
    }
}
