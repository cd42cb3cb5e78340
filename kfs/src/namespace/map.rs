//! Regular files' block maps as Kfs changes them (ARCHITECTURE.md §7, §8): growing
//! the tree, publishing a commit's entries in the order readers rely on
//! ([`blockmap::publish`]), cutting a file, and dropping a map.
//!
//! Every node a commit needs is allocated, and the map word naming a new
//! root published, before the first entry is stored: storing the entries
//! cannot fail half-way.

use kucofs_common::format::PageNo;
use kucofs_common::index::blockmap::{
    self, capacity, entry_page, word_capacity, EntrySource, EntryStore, MapReader, FANOUT,
    MAP_HEIGHT, MAP_ROOT, MAP_SMALL, MAX_HEIGHT, NODE_SIZE, PAGE, SMALL_FANOUT, SMALL_SIZE,
};
use kucofs_common::index::layout::*;
use kucofs_common::index::{Ino, InodeOff};
use kucofs_common::Errno;

use super::Namespace;
use crate::arena::Arena;

/// A file's map, for changing it.
struct MapWriter<'a> {
    arena: &'a mut Arena,
    word: u64,
}

impl EntrySource for MapWriter<'_> {
    fn entry(&self, page: u64) -> u64 {
        MapReader::new(self.arena.shm(), self.word).entry(page)
    }
}

impl EntryStore for MapWriter<'_> {
    fn set_entry(&mut self, page: u64, e: u64) {
        self.swap_entry(page, e);
    }

    fn swap_entry(&mut self, page: u64, e: u64) -> u64 {
        // Every slot a commit stores into was made by `ensure` first; the
        // neighbours' slots it may flag exist whenever they hold an entry.
        let Some(slot) = MapReader::new(self.arena.shm(), self.word).slot(page) else {
            return 0;
        };
        let old = self.arena.get(slot);
        // Release: pairs with the reader's Acquire load of the entry.
        let _ = self.arena.put(slot, e);
        old
    }
}

impl MapWriter<'_> {
    fn view(&self) -> MapRef<'_> {
        MapRef {
            arena: self.arena,
            word: self.word,
        }
    }

    /// Makes the leaf holding page `page` exist (the tree already covers
    /// it). A new node is zeroed (all holes) before it is linked.
    fn ensure(&mut self, page: u64) -> Result<(), Errno> {
        let w = self.word;
        if w & MAP_SMALL != 0 {
            return Ok(());
        }
        let mut node = w & MAP_ROOT;
        let mut level = (w & MAP_HEIGHT) as u32;
        while level > 0 {
            let at = blockmap::node_slot(node, blockmap::digit(page, level));
            let mut child = self.arena.get(at);
            if child == 0 {
                child = self.arena.alloc(TAG_MAPNODE, NODE_SIZE)?;
                // Release: the zeroed node before the link to it.
                self.arena.put(at, child)?;
            }
            node = child;
            level -= 1;
        }
        Ok(())
    }

    /// Grows the tree to cover `pages` pages; the old root becomes the
    /// new root's first child, or (a small leaf) is copied into a full one
    /// and retired. Returns true if the map word changed.
    fn grow(&mut self, pages: u64) -> Result<bool, Errno> {
        if pages <= word_capacity(self.word) {
            return Ok(false);
        }
        if self.word == 0 && pages <= SMALL_FANOUT {
            self.word = self.arena.alloc(TAG_MAPNODE, SMALL_SIZE)? | MAP_SMALL;
            return Ok(true);
        }
        if self.word == 0 {
            self.word = self.arena.alloc(TAG_MAPNODE, NODE_SIZE)?;
        } else if self.word & MAP_SMALL != 0 {
            let small = self.word & MAP_ROOT;
            let leaf = self.arena.alloc(TAG_MAPNODE, NODE_SIZE)?;
            for i in 0..SMALL_FANOUT {
                let e = self.arena.get(blockmap::node_slot(small, i));
                self.arena.put(blockmap::node_slot(leaf, i), e)?;
            }
            self.arena.retire(small)?;
            self.word = leaf;
        }
        while capacity((self.word & MAP_HEIGHT) as u32) < pages {
            let height = (self.word & MAP_HEIGHT) as u32;
            if height >= MAX_HEIGHT {
                return Err(Errno::EFBIG);
            }
            let root = self.arena.alloc(TAG_MAPNODE, NODE_SIZE)?;
            self.arena
                .put(blockmap::node_slot(root, 0), self.word & MAP_ROOT)?;
            self.word = root | u64::from(height + 1);
        }
        Ok(true)
    }
}

/// A file's map, for reading it as Kfs.
struct MapRef<'a> {
    arena: &'a Arena,
    word: u64,
}

impl MapRef<'_> {
    /// Calls `f(page, entry)` for every non-hole entry, in page order.
    fn for_each(&self, mut f: impl FnMut(u64, u64)) {
        let w = self.word;
        if w == 0 {
            return;
        }
        if w & MAP_SMALL != 0 {
            for i in 0..SMALL_FANOUT {
                let e = self.arena.get(blockmap::node_slot(w & MAP_ROOT, i));
                if e != 0 {
                    f(i, e);
                }
            }
            return;
        }
        self.walk(w & MAP_ROOT, (w & MAP_HEIGHT) as u32, 0, &mut f);
    }

    fn walk(&self, node: u64, level: u32, base: u64, f: &mut impl FnMut(u64, u64)) {
        for i in 0..FANOUT {
            let v = self.arena.get(blockmap::node_slot(node, i));
            if v == 0 {
                continue;
            }
            if level == 0 {
                f(base + i, v);
            } else {
                self.walk(v, level - 1, base + i * capacity(level - 1), f);
            }
        }
    }

    /// Every node of the tree, children before parents.
    fn nodes(&self, out: &mut Vec<u64>) {
        fn visit(a: &Arena, node: u64, level: u32, out: &mut Vec<u64>) {
            if level > 0 {
                for i in 0..FANOUT {
                    let c = a.get(blockmap::node_slot(node, i));
                    if c != 0 {
                        visit(a, c, level - 1, out);
                    }
                }
            }
            out.push(node);
        }
        let w = self.word;
        if w == 0 {
            return;
        }
        if w & MAP_SMALL != 0 {
            out.push(w & MAP_ROOT);
        } else {
            visit(self.arena, w & MAP_ROOT, (w & MAP_HEIGHT) as u32, out);
        }
    }
}

impl Namespace {
    fn map_writer(&mut self, inode: InodeOff) -> MapWriter<'_> {
        let word = self.arena.get(inode.map());
        MapWriter {
            arena: &mut self.arena,
            word,
        }
    }

    /// Hands `f` each data page replaced or dropped by the changes since
    /// the last call (they wait for their grace period before reuse).
    pub fn drain_replaced(&mut self, f: impl FnMut(PageNo)) {
        self.replaced.drain(..).for_each(f);
    }

    /// Makes file pages `first..` live in the data pages `pages` (page
    /// numbers as requests and the log carry them) and sets the size to
    /// `size`. The replaced pages go to [`Namespace::drain_replaced`].
    pub fn write_pages(
        &mut self,
        inode: InodeOff,
        first: u64,
        pages: &[u64],
        size: u64,
        time: i64,
    ) -> Result<(), Errno> {
        let n = pages.len() as u64;
        // Page numbers come from validated requests, or from an image that
        // may be damaged: one that does not fit an entry is refused, not
        // truncated into another page's number.
        if pages.iter().any(|&p| p == 0 || p > blockmap::E_PAGE)
            || first
                .checked_add(n)
                .is_none_or(|e| e > blockmap::MAX_FILE_PAGES)
            || size > blockmap::MAX_FILE_SIZE
        {
            return Err(Errno::EINVAL);
        }
        let last_version = self.arena.get(inode.version());
        let mut w = self.map_writer(inode);
        let old_word = w.word;
        if n > 0 {
            w.grow(first + n)?;
            // Once per leaf: pages `k * FANOUT..(k + 1) * FANOUT` share one.
            let mut p = first;
            while p < first + n {
                w.ensure(p)?;
                p = (p / FANOUT + 1) * FANOUT;
            }
        }
        let word = w.word;
        if word != old_word {
            // Release: the new root is filled in before it is named.
            self.arena.put(inode.map(), word)?;
        }
        let mut w = MapWriter {
            arena: &mut self.arena,
            word,
        };
        let version = blockmap::next_version(&w, last_version, first, n);
        let mut replaced = std::mem::take(&mut self.scratch);
        replaced.clear();
        blockmap::publish(&mut w, first, pages, version, &mut replaced);
        let mut dropped = 0;
        for &e in &replaced {
            if e != 0 {
                dropped += 1;
                self.drop_data_page(entry_page(e));
            }
        }
        self.scratch = replaced;
        if self.store.enabled() {
            let ino = Ino::new(self.arena.get(inode.ino()));
            for (i, &p) in pages.iter().enumerate() {
                self.store.page_owned(PageNo::new(p), ino, first + i as u64);
            }
        }
        let blocks = self.arena.get(inode.blocks()) + n - dropped;
        self.update(inode, |a| {
            a.put(inode.version(), version)?;
            a.put(inode.blocks(), blocks)?;
            // Release, after the entries: a reader that sees the new size
            // sees the pages under it.
            a.put(inode.size(), size)?;
            a.put(inode.mtime(), time.cast_unsigned())?;
            a.put(inode.ctime(), time.cast_unsigned())
        })
    }

    /// Gives page `page`'s entry a new version, its data page unchanged,
    /// before Kfs changes that page in place: a reader that loaded the
    /// entry earlier sees it change when it checks again, and reads again
    /// instead of keeping a half-changed copy. Nothing is replaced. Returns
    /// the data page, or `None` for a hole (left as it is).
    pub fn reversion_page(&mut self, inode: InodeOff, page: u64) -> Result<Option<PageNo>, Errno> {
        let last_version = self.arena.get(inode.version());
        let mut old = std::mem::take(&mut self.scratch);
        old.clear();
        let mut w = self.map_writer(inode);
        let e = w.entry(page);
        if e == 0 {
            self.scratch = old;
            return Ok(None);
        }
        let version = blockmap::next_version(&w, last_version, page, 1);
        blockmap::publish(&mut w, page, &[entry_page(e).get()], version, &mut old);
        self.scratch = old;
        self.update(inode, |a| a.put(inode.version(), version))?;
        Ok(Some(entry_page(e)))
    }

    /// Sets a file's size; pages wholly past the new end are dropped (to
    /// [`Namespace::drain_replaced`]).
    pub fn truncate_file(&mut self, inode: InodeOff, size: u64, time: i64) -> Result<(), Errno> {
        let keep = size.div_ceil(PAGE);
        // The size first: a reader that still sees the old size may read
        // zeros where dropped pages were, never a reused page (they wait for
        // the grace period).
        self.update(inode, |a| {
            a.put(inode.size(), size)?;
            a.put(inode.mtime(), time.cast_unsigned())?;
            a.put(inode.ctime(), time.cast_unsigned())
        })?;
        let mut w = self.map_writer(inode);
        let mut dropped = Vec::new();
        w.view().for_each(|p, e| {
            if p >= keep {
                dropped.push((p, e));
            }
        });
        if dropped.is_empty() {
            return Ok(());
        }
        if keep > 0 {
            let left = w.entry(keep - 1);
            if left != 0 {
                w.set_entry(keep - 1, left | blockmap::E_END);
            }
        }
        for &(p, _) in &dropped {
            w.set_entry(p, 0);
        }
        let blocks = self.arena.get(inode.blocks()) - dropped.len() as u64;
        for &(_, e) in &dropped {
            self.drop_data_page(entry_page(e));
        }
        self.update(inode, |a| a.put(inode.blocks(), blocks))
    }

    /// Retires a file's map nodes and gives its pages to
    /// [`Namespace::drain_replaced`] (the file is being dropped).
    pub(super) fn drop_map(&mut self, inode: InodeOff) -> Result<(), Errno> {
        let w = self.map_ref(inode);
        let mut pages = Vec::new();
        w.for_each(|_, e| pages.push(entry_page(e)));
        let mut nodes = Vec::new();
        w.nodes(&mut nodes);
        for p in pages {
            self.drop_data_page(p);
        }
        for n in nodes {
            self.arena.retire(n)?;
        }
        Ok(())
    }

    /// Restores pages `first..` of a file from the metadata store, keeping
    /// the attributes its inode record holds.
    pub fn load_pages(
        &mut self,
        inode: InodeOff,
        first: u64,
        pages: &[u64],
        a: &kucofs_common::index::InodeAttr,
    ) -> Result<(), Errno> {
        // `write_pages` refuses a range past the largest file.
        self.write_pages(inode, first, pages, a.size, a.mtime)?;
        self.update(inode, |x| x.put(inode.ctime(), a.ctime.cast_unsigned()))
    }

    /// Calls `f(file page, data page)` for every page a file holds, in
    /// file order.
    pub fn file_pages(&self, inode: InodeOff, mut f: impl FnMut(u64, PageNo)) {
        self.map_ref(inode).for_each(|p, e| f(p, entry_page(e)));
    }

    fn map_ref(&self, inode: InodeOff) -> MapRef<'_> {
        MapRef {
            arena: &self.arena,
            word: self.arena.get(inode.map()),
        }
    }
}
