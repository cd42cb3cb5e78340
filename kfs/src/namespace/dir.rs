//! Directory lists as Kfs changes them (see the index layout for the
//! structure): creating and dropping a directory's head, sentinels and
//! bucket table, checking a client's pre-located node or searching, and
//! linking, replacing and unlinking entries so that lock-free readers always
//! see a well-formed list.

use std::cmp::Ordering as Cmp;

use kucofs_common::index::layout::*;
use kucofs_common::index::{check_name, name_hash, BucketTable, DirentOff, Ino, InodeOff, Kind};
use kucofs_common::proto::Hint;
use kucofs_common::Errno;

use super::Namespace;

impl Namespace {
    /// Makes the head, the first bucket table and its sentinels of a new
    /// directory, before the directory is reachable.
    pub(super) fn new_dir_list(&mut self, dir: InodeOff) -> Result<(), Errno> {
        let a = &mut self.arena;
        let head = DirentOff::new(a.alloc(TAG_DIRHEAD, dirent_size(0))?);
        a.put(head.dir(), dir.get())?;
        a.put(head.inode(), dir.get())?;
        a.put(head.shape(), shape(0, Kind::Dir.to_byte()))?;
        let bits = BUCKET_BITS_MIN;
        let table = BucketTable::new(a.alloc(TAG_BUCKETS, BucketTable::size(bits))?);
        a.put(table.bits(), u64::from(bits))?;
        a.put(table.slot(0), head.get())?;
        // Sentinels in key order, linked from the last one back, so each is
        // complete before anything points at it.
        let mut next = 0;
        for b in (1..1u64 << bits).rev() {
            let s = DirentOff::new(a.alloc(TAG_SENTINEL, dirent_size(0))?);
            a.put(s.hash(), bucket_start(b, bits))?;
            a.put(s.dir(), dir.get())?;
            a.put(s.next(), next)?;
            a.put(table.slot(b), s.get())?;
            next = link(s, bucket_start(b, bits));
        }
        a.put(head.next(), next)?;
        a.put(dir.data(), head.get())?;
        a.put(dir.buckets(), table.get())
    }

    /// Starts retiring an empty directory's list: its doubling under way
    /// is dropped now, and its sentinels, table and head, and the
    /// directory's inode (marked dead by the caller), go a step at a time
    /// ([`Namespace::dismantle_step`]): a directory that held millions of
    /// entries has millions of sentinels, too many to retire in one
    /// request.
    pub(super) fn drop_dir_list(&mut self, dir: InodeOff) -> Result<(), Errno> {
        if self.arena.get(dir.entries()) != 0 {
            return Err(Errno::ENOTEMPTY);
        }
        self.abandon_doubling(dir)?;
        let r = self.arena.reader();
        let next = r.next(r.dir_head(dir));
        self.dismantling.push(Dismantling { dir, next });
        Ok(())
    }

    /// Retires up to `budget` nodes of removed directories' lists, and
    /// each list's table, head and inode after its last node; true if any
    /// remain. Each change makes a step ([`DISMANTLE_STEP`]), and Kfs
    /// makes more while idle. Until a directory's inode is retired it is
    /// not reused, so that no live directory is named by the nodes still
    /// waiting (a hint naming one is refused as another directory's).
    pub fn dismantle_step(&mut self, mut budget: u64) -> Result<bool, Errno> {
        while let Some(&Dismantling { dir, mut next }) = self.dismantling.last() {
            while !next.is_null() && budget > 0 {
                let r = self.arena.reader();
                let x = next;
                if !r.is_marker(x) {
                    // An entry in a list whose directory held none: the
                    // count and the list disagree. The rest is left
                    // unreclaimed rather than retried at every step.
                    self.dismantling.pop();
                    return Err(Errno::EIO);
                }
                next = r.next(x);
                self.arena.retire(x.get())?;
                budget -= 1;
            }
            if !next.is_null() {
                if let Some(d) = self.dismantling.last_mut() {
                    d.next = next;
                }
                return Ok(true);
            }
            self.dismantling.pop();
            let head = self.arena.reader().dir_head(dir);
            let table = self.arena.get(dir.buckets());
            self.arena.retire(table)?;
            self.arena.retire(head.get())?;
            self.arena.retire(dir.get())?;
            if budget == 0 {
                break;
            }
        }
        Ok(!self.dismantling.is_empty())
    }

    /// True if `node` is a live node of `dir`'s list (entry, sentinel or
    /// head). Each check runs only if the ones before it passed, so a forged
    /// offset is never used beyond its header.
    fn is_node_of(&self, node: DirentOff, dir: InodeOff) -> bool {
        let r = self.arena.reader();
        (r.is_live(node.get(), TAG_DIRENT, None)
            || r.is_live(node.get(), TAG_SENTINEL, None)
            || r.is_live(node.get(), TAG_DIRHEAD, None))
            && self.arena.get(node.dir()) == dir.get()
    }

    /// Where a new key goes in `dir`: the node to link it after, checked
    /// from a hint or searched, and the entry already holding the key (null
    /// if none).
    pub(super) fn insert_point(
        &mut self,
        dir: InodeOff,
        hash: u64,
        name: &[u8],
        hint: Option<&Hint>,
    ) -> (DirentOff, DirentOff) {
        if let Some(h) = hint {
            let r = self.arena.reader();
            let ok = h.dir == dir
                && self.is_node_of(h.pred, dir)
                && r.cmp_key(h.pred, hash, name) == Cmp::Less
                && {
                    // The link says where its node stands (Kfs wrote it), so
                    // the node itself is read only on a tag collision.
                    let l = r.link(h.pred);
                    link_node(l).is_null() || r.cmp_link(l, hash, name) == Cmp::Greater
                };
            if ok {
                self.hints.used += 1;
                return (h.pred, DirentOff::NULL);
            }
            self.hints.stale += 1;
        } else {
            self.hints.absent += 1;
        }
        let s = self.arena.reader().search(dir, hash, name);
        (s.pred, s.found)
    }

    /// The entry named `name` in `dir` and the node before it, checked from
    /// a hint or searched; a null found offset if there is none.
    pub(super) fn find_entry(
        &mut self,
        dir: InodeOff,
        name: &[u8],
        hint: Option<&Hint>,
    ) -> (DirentOff, DirentOff) {
        if let Some(h) = hint {
            let r = self.arena.reader();
            let f = h.found;
            let ok = h.dir == dir
                && !f.is_null()
                && r.is_live(f.get(), TAG_DIRENT, Some(h.found_gen))
                && self.arena.get(f.dir()) == dir.get()
                && r.cmp_key(f, name_hash(name), name) == Cmp::Equal
                && self.is_node_of(h.pred, dir)
                && r.next(h.pred) == f;
            if ok {
                self.hints.used += 1;
                return (h.pred, f);
            }
            self.hints.stale += 1;
        } else {
            self.hints.absent += 1;
        }
        let s = self.arena.reader().search(dir, name_hash(name), name);
        (s.pred, s.found)
    }

    /// A new entry item for `inode` named `name` in `dir`, not yet linked,
    /// whose own link is `next`.
    fn new_entry(
        &mut self,
        dir: InodeOff,
        hash: u64,
        name: &[u8],
        inode: InodeOff,
        next: u64,
    ) -> Result<DirentOff, Errno> {
        let r = self.arena.reader();
        let ino = r.ino(inode);
        let kind = r.kind(inode).ok_or(Errno::EIO)?;
        self.new_entry_of(dir, hash, name, inode, ino, kind, next)
    }

    /// [`Namespace::new_entry`] for an inode whose number and kind the
    /// caller knows.
    #[allow(clippy::too_many_arguments)]
    fn new_entry_of(
        &mut self,
        dir: InodeOff,
        hash: u64,
        name: &[u8],
        inode: InodeOff,
        ino: Ino,
        kind: Kind,
        next: u64,
    ) -> Result<DirentOff, Errno> {
        // A name is at most `NAME_MAX` (255) bytes: path resolution refuses
        // a longer one before any entry is made, and an entry copied from
        // another holds a name that was checked so.
        #[allow(clippy::cast_possible_truncation)]
        let name_len = name.len() as u16;
        let a = &mut self.arena;
        let node = DirentOff::new(a.alloc(TAG_DIRENT, dirent_size(name.len()))?);
        a.put(node.hash(), hash)?;
        a.put(node.inode(), inode.get())?;
        a.put(node.ino(), ino.get())?;
        a.put(node.dir(), dir.get())?;
        a.put(node.shape(), shape(name_len, kind.to_byte()))?;
        a.put_bytes(node.name(), name)?;
        a.put(node.next(), next)?;
        self.store.entry_made(node, name.len());
        Ok(node)
    }

    /// Notes that entry `node` leaves the index (its store record goes at
    /// the next retirement).
    fn entry_gone(&mut self, node: DirentOff) {
        if self.store.enabled() {
            let len = (self.arena.get(node.shape()) & 0xffff) as usize;
            self.store.entry_removed(self.arena.get(node.slot()), len);
        }
    }

    /// Links a new entry for `inode` into `dir` after `pred`.
    pub(super) fn link_entry(
        &mut self,
        dir: InodeOff,
        name: &[u8],
        inode: InodeOff,
        pred: DirentOff,
    ) -> Result<DirentOff, Errno> {
        let next = self.arena.reader().link(pred);
        let hash = name_hash(name);
        let node = self.new_entry(dir, hash, name, inode, next)?;
        // Release: the node is fully written before a reader can reach it
        // (readers Acquire the link).
        self.arena.put(pred.next(), link(node, hash))?;
        Ok(node)
    }

    /// Swaps entry `old` (after `pred`) for a new one of the same name
    /// naming `inode`, in one store, so the name never vanishes.
    pub(super) fn replace_entry(
        &mut self,
        dir: InodeOff,
        old: DirentOff,
        pred: DirentOff,
        inode: InodeOff,
    ) -> Result<DirentOff, Errno> {
        let r = self.arena.reader();
        if r.next(pred) != old {
            return Err(Errno::EIO);
        }
        let info = r.dirent(old);
        let next = r.link(old);
        let node = self.new_entry(dir, info.hash, &info.name, inode, next)?;
        self.arena.put(pred.next(), link(node, info.hash))?;
        self.entry_gone(old);
        self.arena.retire(old.get())?;
        Ok(node)
    }

    /// Unlinks entry `node` (after `pred`) and retires it. Its own link
    /// stays intact, so a reader standing on it walks on.
    pub(super) fn unlink_entry(&mut self, node: DirentOff, pred: DirentOff) -> Result<(), Errno> {
        let r = self.arena.reader();
        if r.next(pred) != node {
            return Err(Errno::EIO);
        }
        self.arena.put(pred.next(), r.link(node))?;
        self.entry_gone(node);
        self.arena.retire(node.get())
    }
}

/// Sentinels of removed directories each change retires (a cache miss
/// each).
pub const DISMANTLE_STEP: u64 = 16;

/// A removed directory whose list is being retired.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dismantling {
    /// The directory's inode (dead, not yet retired).
    dir: InodeOff,
    /// The next node of its list to retire (null once all are).
    next: DirentOff,
}

/// How many entries ahead [`Namespace::load_dir`] asks for a name.
const PREFETCH_AHEAD: usize = 16;

/// One entry of a directory loaded whole (see [`Namespace::load_dir`]).
/// Its name lies in a buffer shared by all the entries, so that the
/// entries sort without touching the names.
#[derive(Debug, Clone, Copy)]
pub struct LoadedEntry {
    /// The directory it is in (by inode number).
    pub parent: Ino,
    /// Its key hash ([`name_hash`] of the name).
    pub hash: u64,
    /// The inode number it names.
    pub ino: Ino,
    /// That inode, and its kind, as loaded (the caller looked them up).
    pub inode: InodeOff,
    /// Where the metadata store keeps its record ([`DirentOff::slot`]).
    pub slot: u64,
    /// Where its name starts in the names buffer.
    pub name_at: u32,
    /// Its name's length.
    pub name_len: u8,
    #[allow(missing_docs)]
    pub kind: Kind,
}

impl LoadedEntry {
    /// Its name, out of `names` (empty where `names` does not hold it,
    /// which no valid name is).
    pub fn name<'a>(&self, names: &'a [u8]) -> &'a [u8] {
        let at = self.name_at as usize;
        names
            .get(at..at + usize::from(self.name_len))
            .unwrap_or(&[])
    }
}

impl Namespace {
    /// Gives the empty directory `parent` (by inode number) all of its
    /// entries at once, `entries` sorted by key (hash, then name), their
    /// names in `names`: the list is built in one pass, with a bucket
    /// table of the size the entries call for, instead of one search and
    /// insertion each (how a directory of millions of entries loads in
    /// seconds, not minutes). The keys' order and each entry's parent are
    /// checked before anything changes (a key that comes twice is
    /// `EEXIST`); a directory named twice is found as the list is built
    /// and is `EMLINK`, with the list already changed, which recovery,
    /// the one caller, then discards with the whole namespace. The
    /// caller vouches for each entry's name (checked with [`check_name`];
    /// in key order the names lie scattered, and a second look at each
    /// would cost a cache miss), hash (the name's), inode and kind.
    pub fn load_dir(
        &mut self,
        parent: Ino,
        names: &[u8],
        entries: &[LoadedEntry],
    ) -> Result<(), Errno> {
        let dir = self.inode_of(parent)?;
        let r = self.arena.reader();
        if r.kind(dir) != Some(Kind::Dir) {
            return Err(Errno::ENOTDIR);
        }
        if !r.next(r.dir_head(dir)).is_null() && self.arena.get(dir.entries()) > 0 {
            return Err(Errno::EEXIST);
        }
        // The key checks before anything changes (names only where two
        // hashes are equal).
        for (i, e) in entries.iter().enumerate() {
            debug_assert!(check_name(e.name(names)).is_ok());
            debug_assert_eq!(e.hash, name_hash(e.name(names)));
            if e.parent != parent {
                return Err(Errno::EINVAL);
            }
            if i > 0 {
                let p = &entries[i - 1];
                if p.hash > e.hash || (p.hash == e.hash && p.name(names) >= e.name(names)) {
                    return Err(Errno::EEXIST);
                }
            }
        }
        let n = entries.len() as u64;
        let mut bits = BUCKET_BITS_MIN;
        while bits < BUCKET_BITS_MAX && n > LOAD << bits {
            bits += 1;
        }
        // The list the directory was made with (head, first table and its
        // sentinels) gives way to one built for these entries.
        let head = r.dir_head(dir);
        let old_table = self.arena.get(dir.buckets());
        let mut old = Vec::new();
        let mut x = r.next(head);
        while !x.is_null() {
            old.push(x);
            x = r.next(x);
        }
        let table = BucketTable::new(self.arena.alloc(TAG_BUCKETS, BucketTable::size(bits))?);
        self.arena.put(table.bits(), u64::from(bits))?;
        self.arena.put(table.slot(0), head.get())?;
        // Built from the last node back, so that each is complete before
        // anything links to it.
        let mut next = 0u64;
        let mut k = entries.len();
        for b in (0..1u64 << bits).rev() {
            while k > 0 && bucket(entries[k - 1].hash, bits) == b {
                k -= 1;
                // The names lie scattered in key order: ask for one a few
                // entries ahead, so that the cache misses overlap.
                if let Some(ahead) = k.checked_sub(PREFETCH_AHEAD) {
                    let at = entries[ahead].name_at as usize;
                    kucofs_common::pm::prefetch(names.as_ptr() as usize + at);
                }
                let e = entries[k];
                let name = e.name(names);
                let node = self.new_entry_of(dir, e.hash, name, e.inode, e.ino, e.kind, next)?;
                self.arena.put(node.slot(), e.slot)?;
                next = link(node, e.hash);
            }
            if b == 0 {
                break;
            }
            let s = DirentOff::new(self.arena.alloc(TAG_SENTINEL, dirent_size(0))?);
            self.arena.put(s.hash(), bucket_start(b, bits))?;
            self.arena.put(s.dir(), dir.get())?;
            self.arena.put(s.next(), next)?;
            self.arena.put(table.slot(b), s.get())?;
            next = link(s, bucket_start(b, bits));
        }
        self.arena.put(head.next(), next)?;
        self.arena.put(dir.buckets(), table.get())?;
        for s in old {
            self.arena.retire(s.get())?;
        }
        self.arena.retire(old_table)?;
        self.update(dir, |a| a.put(dir.entries(), n))?;
        for e in entries.iter().filter(|e| e.kind == Kind::Dir) {
            let inode = e.inode;
            let r = self.arena.reader();
            {
                // A directory has one name (the root none).
                if !r.parent(inode).is_null() {
                    return Err(Errno::EMLINK);
                }
                self.update(inode, |a| a.put(inode.parent(), dir.get()))?;
            }
        }
        Ok(())
    }
}
