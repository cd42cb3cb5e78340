//! The metadata store as Kfs keeps it (ARCHITECTURE.md §11): where each
//! inode, directory entry and symlink target lies in the image, which of
//! them the changes since the last retirement of the log touched, and the
//! retirement that writes those into the store as one batch.
//!
//! The store's records live in data pages the owner table names (see
//! `kucofs_common::format::meta`). Kfs changes its index, not the store,
//! when it applies a change; each hook here notes what the change touched
//! (an inode number, an entry made or removed, a data page's owner). A
//! retirement then turns the notes into physical writes: the records as
//! the index holds them now. Its work is proportional to what changed
//! since the last one, whatever the number of files.
//!
//! Store pages are allocated at retirements only, never while a change is
//! applied: a change made while recovery replays the log must not take a
//! page a later entry of the log names as file data. So that a retirement
//! always finds the pages it needs, a change that will need one *promises*
//! it, within the budget of free pages the volume gives, and is refused
//! with `ENOSPC` when the budget is spent; grants leave the promised pages
//! free.

use kucofs_common::format::meta::{
    cells_for, encode_entry, inode_slot, slots_per_page, BatchWriter, EntryRecord, InodeRecord,
    Owner, CELL, INLINE_TARGET, INODES_PER_PAGE, INODE_RECORD, MAX_CELLS, OWNER_FILE_PAGE_MAX,
    OWNER_INO_MAX,
};
use kucofs_common::format::{Area, Geometry, OWNERS_PER_PAGE, OWNER_SIZE, PAGE_SIZE};
use kucofs_common::index::layout::{D_DIR, D_INO, D_SHAPE, D_SLOT, TAG_DIRENT};
use kucofs_common::index::{Kind, NAME_MAX};
use kucofs_common::Errno;

use crate::intmap::IntMap;
use crate::namespace::Namespace;
use crate::pages::Pages;

/// `itable` value of a table index whose page is promised, not yet taken.
const PENDING: u64 = u64::MAX;

/// An owner-table page with more changed entries than this is written
/// whole; one with fewer, a run at a time.
const OWNER_RUNS_MAX: usize = 16;

/// Where a directory entry's record lies: its page and slot, as the
/// index's entries carry it ([`D_SLOT`]).
fn slot_id(page: u64, slot: u64) -> u64 {
    page << 8 | slot
}

fn slot_parts(id: u64) -> (u64, u64) {
    (id >> 8, id & 0xff)
}

/// One page of directory entries.
#[derive(Debug, Clone)]
struct EntryPage {
    /// The data page (0: this place in the class's list is unused).
    page: u64,
    /// A bit per slot in use.
    used: u64,
    /// Listed in the class's `with_free`.
    listed: bool,
}

/// The entry pages of one record size.
#[derive(Debug, Clone, Default)]
struct Class {
    cells: u8,
    pages: Vec<EntryPage>,
    /// Indices into `pages` that may have a free slot, each at most once
    /// (checked on use: a page filled or given up since is dropped then).
    with_free: Vec<u32>,
    /// Unused places in `pages`.
    spare: Vec<u32>,
    /// Free slots in `pages`.
    free_slots: u64,
    /// Slots free for new entries: free slots in the pages, plus those of
    /// pages promised, less the entries made and not yet given one.
    avail: u64,
    /// Pages promised to this class and not yet taken.
    pending: u64,
}

impl Class {
    fn per_page(&self) -> u64 {
        slots_per_page(self.cells)
    }

    /// Lists page `idx` as one that may have a free slot.
    fn list(&mut self, idx: u32) {
        let ep = &mut self.pages[idx as usize];
        if !ep.listed {
            ep.listed = true;
            self.with_free.push(idx);
        }
    }

    /// Entry pages in use.
    fn page_count(&self) -> u64 {
        (self.pages.len() - self.spare.len()) as u64
    }

    /// Takes a free slot of one of the pages, if any has one.
    fn take_slot(&mut self) -> Option<(u64, u64)> {
        let per = self.per_page();
        let full = if per == 64 { u64::MAX } else { (1 << per) - 1 };
        while let Some(&pi) = self.with_free.last() {
            let ep = &mut self.pages[pi as usize];
            if ep.page == 0 || ep.used & full == full {
                ep.listed = false;
                self.with_free.pop();
                continue;
            }
            let slot = u64::from((!ep.used).trailing_zeros());
            ep.used |= 1 << slot;
            self.free_slots -= 1;
            return Some((ep.page, slot));
        }
        None
    }
}

/// What one retirement wrote and changed.
#[derive(Debug, Default, Clone)]
pub struct Retirement {
    /// Pages it took for the store (to be made read-only in every view).
    pub taken: Vec<u64>,
    /// Records written: inodes, entries, targets, owner entries.
    pub inodes: u64,
    #[allow(missing_docs)]
    pub entries: u64,
    #[allow(missing_docs)]
    pub cleared: u64,
    #[allow(missing_docs)]
    pub owners: u64,
}

/// How much of the image the store uses.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StoreUse {
    /// Pages of the inode table.
    pub inode_pages: u64,
    /// Pages of directory entries.
    pub entry_pages: u64,
    /// Pages of symlink targets.
    pub target_pages: u64,
}

impl StoreUse {
    /// Every page the store holds.
    pub fn pages(&self) -> u64 {
        self.inode_pages + self.entry_pages + self.target_pages
    }
}

/// The metadata store's bookkeeping.
#[derive(Debug, Default)]
pub struct Store {
    /// Off for a namespace with no image behind it (tests, tools).
    enabled: bool,
    /// While the store itself is read back: nothing is new.
    loading: bool,
    data: Option<Area>,
    owners_at: u64,
    /// Every data page's owner entry as the store should hold it.
    owners: Vec<u64>,
    dirty_pages: Vec<u64>,
    dirty_page_bits: Vec<u64>,
    /// Inode page of each table index (0: none; [`PENDING`]: promised).
    itable: Vec<u64>,
    /// Inodes of the index in each table index's range.
    ilive: Vec<u8>,
    dirty_inos: Vec<u64>,
    dirty_ino_bits: Vec<u64>,
    classes: Vec<Class>,
    /// Entry page -> index in its class's `pages`.
    entry_pages: IntMap<u64, u32>,
    /// Index entries made since the last retirement (offsets; some may be
    /// removed since, or reused).
    new_entries: Vec<u64>,
    /// Slots of entries removed since the last retirement.
    freed_slots: Vec<u64>,
    /// Symlinks whose target has a page: ino -> page (0: promised).
    targets: IntMap<u64, u64>,
    /// Entries of `targets` still promised (page 0).
    targets_promised: u64,
    /// Pages promised and not yet taken.
    promised: u64,
    /// Pages that may still be promised.
    budget: u64,
    /// Pages the last retirement gave up, free once it is durable.
    released: Vec<u64>,
    /// Bytes of records the notes since the last retirement call for, as
    /// an upper bound (to retire before the log cannot hold them).
    pending_bytes: u64,
}

fn set_bit(bits: &mut Vec<u64>, i: u64) -> bool {
    let w = (i / 64) as usize;
    if w >= bits.len() {
        bits.resize((w + 1).next_power_of_two(), 0);
    }
    let m = 1u64 << (i % 64);
    let was = bits[w] & m != 0;
    bits[w] |= m;
    !was
}

impl Store {
    /// The bookkeeping for an image of geometry `g` whose store is empty
    /// (mkfs; [`load`] fills it from an image).
    pub fn new(g: &Geometry) -> Store {
        Store {
            enabled: true,
            data: Some(g.data),
            owners_at: g.owners.offset(),
            owners: vec![0; g.data.pages as usize],
            dirty_page_bits: vec![0; (g.data.pages as usize).div_ceil(64)],
            classes: (1..=MAX_CELLS)
                .map(|cells| Class {
                    cells,
                    ..Class::default()
                })
                .collect(),
            ..Store::default()
        }
    }

    /// True if changes are noted (a namespace with an image behind it).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Sets the pages that may still be promised: the free pages less
    /// those already promised (the volume calls this before each change).
    pub fn set_budget(&mut self, free_pages: u64) {
        self.budget = free_pages;
    }

    /// Pages promised to the store and not yet taken: grants leave them.
    pub fn promised(&self) -> u64 {
        self.promised
    }

    /// An upper bound on the bytes of the batch a retirement now would
    /// write.
    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// True if a retirement now would write nothing.
    pub fn is_clean(&self) -> bool {
        self.dirty_inos.is_empty()
            && self.dirty_pages.is_empty()
            && self.new_entries.is_empty()
            && self.freed_slots.is_empty()
    }

    /// Pages the store holds, by kind.
    pub fn usage(&self) -> StoreUse {
        StoreUse {
            inode_pages: self
                .itable
                .iter()
                .filter(|&&p| p != 0 && p != PENDING)
                .count() as u64,
            entry_pages: self.classes.iter().map(Class::page_count).sum(),
            target_pages: self.targets.values().filter(|&&p| p != 0).count() as u64,
        }
    }

    /// Files the store can still take, as far as the free pages allow:
    /// each costs an inode record and a short-named entry record, and the
    /// count is of the bytes free for them, in free pages and in free
    /// slots of the store's pages, so that it falls by one with each file
    /// made whatever pages that takes, and rises with each one removed.
    pub fn files_free(&self, free_pages: u64, inodes: u64, max_inodes: u64) -> u64 {
        let inode_slots: u64 = self
            .itable
            .iter()
            .zip(&self.ilive)
            .filter(|(&p, _)| p != 0)
            .map(|(_, &n)| INODES_PER_PAGE - u64::from(n))
            .sum();
        let entry_bytes: u64 = self
            .classes
            .iter()
            .map(|c| c.avail * (CELL as u64) * u64::from(c.cells))
            .sum::<u64>()
            + self.freed_slots.len() as u64 * CELL as u64;
        let bytes = free_pages.saturating_sub(self.promised) * PAGE_SIZE
            + inode_slots * INODE_RECORD as u64
            + entry_bytes;
        (bytes / (INODE_RECORD + CELL) as u64).min(max_inodes.saturating_sub(inodes))
    }

    // ---- promises ------------------------------------------------------

    fn class(&self, name_len: usize) -> &Class {
        &self.classes[usize::from(cells_for(name_len)) - 1]
    }

    /// Pages a new entry with a name of `name_len` bytes needs promised.
    fn entry_needs(&self, name_len: usize) -> u64 {
        u64::from(self.enabled && self.class(name_len).avail == 0)
    }

    /// Pages a new inode `ino` needs promised.
    fn inode_needs(&self, ino: u64) -> u64 {
        let k = (ino / INODES_PER_PAGE) as usize;
        u64::from(self.enabled && self.itable.get(k).is_none_or(|&p| p == 0))
    }

    /// `ENOSPC` unless the store can promise the pages a create of inode
    /// `ino` named by `name_len` bytes, with a symlink target of
    /// `target_len` bytes, needs.
    pub fn check_create(&self, ino: u64, name_len: usize, target_len: usize) -> Result<(), Errno> {
        let target = u64::from(self.enabled && target_len > INLINE_TARGET);
        self.check(self.inode_needs(ino) + self.entry_needs(name_len) + target)
    }

    /// `ENOSPC` unless the store can promise what a new entry named by
    /// `name_len` bytes needs.
    pub fn check_entry(&self, name_len: usize) -> Result<(), Errno> {
        self.check(self.entry_needs(name_len))
    }

    fn check(&self, pages: u64) -> Result<(), Errno> {
        if self.loading || pages == 0 || self.promised + pages <= self.budget {
            Ok(())
        } else {
            Err(Errno::ENOSPC)
        }
    }

    fn promise(&mut self, n: u64) {
        self.promised += n;
        self.pending_bytes += n * (PAGE_SIZE + 16);
    }

    // ---- hooks: what changes touch ---------------------------------------

    /// Inode `ino`'s attributes changed (or it was made or dropped).
    #[inline]
    pub fn inode_changed(&mut self, ino: u64) {
        if self.enabled && !self.loading && set_bit(&mut self.dirty_ino_bits, ino) {
            self.dirty_inos.push(ino);
            self.pending_bytes += INODE_RECORD as u64 + 16;
        }
    }

    /// Inode `ino` was made, with a symlink target of `target_len` bytes.
    pub fn inode_made(&mut self, ino: u64, target_len: usize) {
        if !self.enabled {
            return;
        }
        let k = (ino / INODES_PER_PAGE) as usize;
        if k >= self.itable.len() {
            self.itable.resize(k + 1, 0);
            self.ilive.resize(k + 1, 0);
        }
        self.ilive[k] += 1;
        if self.loading {
            return;
        }
        if self.itable[k] == 0 {
            self.itable[k] = PENDING;
            self.promise(1);
        }
        if target_len > INLINE_TARGET {
            self.targets.insert(ino, 0);
            self.targets_promised += 1;
            self.promise(1);
            self.pending_bytes += target_len as u64;
        }
        self.inode_changed(ino);
    }

    /// Inode `ino` was dropped.
    pub fn inode_dropped(&mut self, ino: u64) {
        if !self.enabled {
            return;
        }
        let k = (ino / INODES_PER_PAGE) as usize;
        if let Some(n) = self.ilive.get_mut(k) {
            *n = n.saturating_sub(1);
        }
        match self.targets.remove(&ino) {
            // Promised, never taken.
            Some(0) => {
                self.promised -= 1;
                self.targets_promised -= 1;
            }
            Some(p) => self.release(p),
            None => {}
        }
        self.inode_changed(ino);
    }

    /// An index entry was made at `node` with a name of `name_len` bytes.
    #[inline]
    pub fn entry_made(&mut self, node: u64, name_len: usize) {
        if !self.enabled || self.loading {
            return;
        }
        let ci = usize::from(cells_for(name_len)) - 1;
        if self.classes[ci].avail == 0 {
            let per = self.classes[ci].per_page();
            self.classes[ci].avail += per;
            self.classes[ci].pending += 1;
            self.promise(1);
        }
        self.classes[ci].avail -= 1;
        self.new_entries.push(node);
        self.pending_bytes += (CELL * usize::from(cells_for(name_len))) as u64 + 16;
    }

    /// The index entry whose store slot is `slot` (0 if it had none yet),
    /// named by `name_len` bytes, was removed.
    #[inline]
    pub fn entry_removed(&mut self, slot: u64, name_len: usize) {
        if !self.enabled {
            return;
        }
        if slot == 0 {
            // Made since the last retirement: its promise is given back.
            self.classes[usize::from(cells_for(name_len)) - 1].avail += 1;
        } else {
            self.freed_slots.push(slot);
            self.pending_bytes += 16;
        }
    }

    /// Data page `p` now holds page `file_page` of file `ino`.
    #[inline]
    pub fn page_owned(&mut self, p: u64, ino: u64, file_page: u64) {
        if self.enabled {
            debug_assert!(ino <= OWNER_INO_MAX && file_page <= OWNER_FILE_PAGE_MAX);
            let o = Owner::File {
                ino,
                page: file_page,
            }
            .encode()
            .unwrap_or(0);
            self.set_owner(p, o);
        }
    }

    /// Data page `p` no longer holds file data.
    #[inline]
    pub fn page_freed(&mut self, p: u64) {
        if self.enabled {
            self.set_owner(p, 0);
        }
    }

    fn set_owner(&mut self, p: u64, o: u64) {
        let Some(data) = self.data else { return };
        if !data.contains(p) {
            return;
        }
        let i = p - data.start;
        self.owners[i as usize] = o;
        if !self.loading && set_bit(&mut self.dirty_page_bits, i) {
            self.dirty_pages.push(i);
            self.pending_bytes += OWNER_SIZE + 12;
        }
    }

    /// Gives up store page `p`: its owner entry is cleared by the coming
    /// retirement, and it is free once that retirement is durable.
    fn release(&mut self, p: u64) {
        self.set_owner(p, 0);
        self.released.push(p);
    }

    /// Makes page `p`, just taken, a store page of `owner`'s, cleared by
    /// the batch before anything is written into it.
    fn use_page(&mut self, p: u64, owner: Owner, batch: &mut BatchWriter) {
        batch.zero(p * PAGE_SIZE, PAGE_SIZE as u32);
        self.set_owner(p, owner.encode().unwrap_or(0));
    }

    /// The owner entry the store should hold for data page `p`.
    fn owner(&self, p: u64) -> Option<Owner> {
        let data = self.data?;
        data.contains(p)
            .then(|| Owner::decode(self.owners[(p - data.start) as usize]))
            .flatten()
    }

    /// Adds entry page `p` to class `ci`, with the slots `used` in use.
    fn add_entry_page(&mut self, ci: usize, p: u64, used: u64) {
        let c = &mut self.classes[ci];
        let entry = EntryPage {
            page: p,
            used,
            listed: false,
        };
        let idx = match c.spare.pop() {
            Some(i) => {
                // A stale listing of the place stays: it now lists this page.
                let listed = c.pages[i as usize].listed;
                c.pages[i as usize] = EntryPage { listed, ..entry };
                i
            }
            None => {
                c.pages.push(entry);
                c.pages.len() as u32 - 1
            }
        };
        self.entry_pages.insert(p, idx);
        let free = c.per_page() - u64::from(used.count_ones());
        if free > 0 {
            c.free_slots += free;
            c.list(idx);
        }
    }

    // ---- loading -------------------------------------------------------------

    fn load_owner(&mut self, p: u64, o: Owner) {
        if let Some(data) = self.data {
            self.owners[(p - data.start) as usize] = o.encode().unwrap_or(0);
        }
    }
}

/// The record of inode `inode` (at that index offset) as the index holds
/// it, with its target page.
fn inode_record(ns: &Namespace, inode: u64, target_page: u64) -> Option<(InodeRecord, Vec<u8>)> {
    let r = ns.reader();
    let a = r.attr(inode)?;
    let mut rec = InodeRecord {
        ino: a.ino,
        mode: a.mode,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        btime: a.btime,
        ..InodeRecord::default()
    };
    let mut target = Vec::new();
    if a.kind() == Some(Kind::Symlink) {
        target = r.readlink(inode).unwrap_or_default();
        rec.target_len = target.len() as u16;
        if target.len() > INLINE_TARGET {
            rec.target_page = target_page;
            rec.target_crc = kucofs_common::checksum::crc32c(&target);
        } else {
            rec.inline[..target.len()].copy_from_slice(&target);
            target.clear();
        }
    }
    Some((rec, target))
}

/// Writes into `batch` every record the changes since the last retirement
/// touched, taking the store pages they need from `pages`, and notes the
/// new entries' slots in the index. The caller logs the batch, applies it,
/// and then calls [`retired`]. The writes come in an order in which each
/// range is written after anything it overlaps: new pages are cleared
/// before records go into them, and an entry slot freed now is reused only
/// by a later retirement.
///
/// Every page it needs was promised, so `pages` has them free. It takes
/// them before it changes anything, calling `reserve` on each (an image
/// file whose pages take memory only when asked); if a page is missing or
/// `reserve` fails, it gives them back, nothing changes, and the error is
/// `ENOSPC`: the log stays as it is, to be retired once there is room.
pub fn retire(
    ns: &mut Namespace,
    pages: &mut Pages,
    batch: &mut BatchWriter,
    reserve: &dyn Fn(u64) -> bool,
) -> Result<Retirement, Errno> {
    let mut out = Retirement::default();
    if !ns.store().enabled {
        return Ok(out);
    }
    // The entries to write: made since, still in the index, with no slot.
    // An item removed and reused for a newer entry since is listed twice
    // and written once.
    let fresh: Vec<(u64, usize)> = {
        let r = ns.reader();
        let mut nodes = ns.store().new_entries.clone();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
            .into_iter()
            .filter(|&node| r.is_live(node, TAG_DIRENT, None) && ns.shm_u64(node + D_SLOT) == 0)
            .map(|node| {
                let len = (ns.shm_u64(node + D_SHAPE) & 0xffff) as usize;
                (node, usize::from(cells_for(len.clamp(1, NAME_MAX))) - 1)
            })
            .collect()
    };
    let needed = {
        let st = ns.store();
        let r = ns.reader();
        let mut want = [0u64; MAX_CELLS as usize];
        for &(_, ci) in &fresh {
            want[ci] += 1;
        }
        let entry_pages: u64 = st
            .classes
            .iter()
            .zip(want)
            .map(|(c, w)| w.saturating_sub(c.free_slots).div_ceil(c.per_page()))
            .sum();
        let inode_pages = st
            .dirty_inos
            .iter()
            .filter(|&&ino| {
                let k = (ino / INODES_PER_PAGE) as usize;
                matches!(st.itable.get(k), Some(&0) | Some(&PENDING) | None)
                    && r.inode_by_ino(ino) != 0
            })
            .map(|&ino| ino / INODES_PER_PAGE)
            .collect::<std::collections::BTreeSet<u64>>()
            .len() as u64;
        let target_pages = st.targets_promised;
        entry_pages + inode_pages + target_pages
    };
    let mut stock = Vec::with_capacity(needed as usize);
    while (stock.len() as u64) < needed {
        match pages.take_meta() {
            Some(p) if reserve(p) => stock.push(p),
            taken => {
                stock.extend(taken);
                for p in stock {
                    pages.release_meta(p);
                }
                return Err(Errno::ENOSPC);
            }
        }
    }
    // Lowest first.
    stock.reverse();
    let mut st = std::mem::take(ns.store_mut());
    let mut take = |st: &mut Store, owner: Owner, batch: &mut BatchWriter, out: &mut Retirement| {
        // Counted above: there is one for every page used below.
        let p = stock.pop().unwrap_or_default();
        st.use_page(p, owner, batch);
        out.taken.push(p);
        p
    };
    // Entries removed: their slots cleared.
    for &id in &st.freed_slots {
        let (p, s) = slot_parts(id);
        let Some(Owner::Entries { cells }) = st.owner(p) else {
            continue;
        };
        let at = p * PAGE_SIZE + s * (CELL as u64) * u64::from(cells);
        batch.zero(at, (CELL * usize::from(cells)) as u32);
        out.cleared += 1;
    }
    // Entries made: a slot each, and their records.
    let mut name = [0u8; NAME_MAX];
    for &(node, ci) in &fresh {
        let (page, slot) = match st.classes[ci].take_slot() {
            Some(at) => at,
            None => {
                let cells = st.classes[ci].cells;
                let p = take(&mut st, Owner::Entries { cells }, batch, &mut out);
                st.add_entry_page(ci, p, 0);
                st.classes[ci].take_slot().unwrap_or((p, 0))
            }
        };
        let r = ns.reader();
        let len = r.name_into(node, &mut name);
        let parent = r.ino(ns.shm_u64(node + D_DIR));
        let ino = ns.shm_u64(node + D_INO);
        let kind = (ns.shm_u64(node + D_SHAPE) >> 24) as u8;
        let cells = st.classes[ci].cells;
        let at = page * PAGE_SIZE + slot * (CELL as u64) * u64::from(cells);
        encode_entry(
            parent,
            ino,
            kind,
            &name[..len],
            batch.put_with(at, CELL * usize::from(cells)),
        );
        ns.set_dirent_slot(node, slot_id(page, slot));
        out.entries += 1;
    }
    st.new_entries.clear();
    // Every entry has its slot: what was promised for entries is settled.
    for c in &mut st.classes {
        c.pending = 0;
        c.avail = c.free_slots;
    }
    // Inodes: their records as the index holds them, or cleared.
    let mut dirty = std::mem::take(&mut st.dirty_inos);
    dirty.sort_unstable();
    for &ino in &dirty {
        st.dirty_ino_bits[(ino / 64) as usize] &= !(1 << (ino % 64));
        let (k, at) = inode_slot(ino);
        let k = k as usize;
        if k >= st.itable.len() {
            st.itable.resize(k + 1, 0);
            st.ilive.resize(k + 1, 0);
        }
        let inode = ns.reader().inode_by_ino(ino);
        if inode == 0 {
            // Gone. Its page goes too once the last inode in it has.
            match st.itable[k] {
                // Promised for inodes all dropped before they were written.
                PENDING if st.ilive[k] == 0 => st.itable[k] = 0,
                PENDING | 0 => {}
                p if st.ilive[k] == 0 => {
                    st.release(p);
                    st.itable[k] = 0;
                }
                p => {
                    batch.zero(p * PAGE_SIZE + at, INODE_RECORD as u32);
                    out.inodes += 1;
                }
            }
            continue;
        }
        if st.itable[k] == PENDING || st.itable[k] == 0 {
            st.itable[k] = take(&mut st, Owner::Inodes { index: k as u64 }, batch, &mut out);
        }
        let target_page = match st.targets.get(&ino).copied() {
            Some(0) => {
                let p = take(&mut st, Owner::Target { ino }, batch, &mut out);
                st.targets.insert(ino, p);
                st.targets_promised -= 1;
                p
            }
            Some(p) => p,
            None => 0,
        };
        let Some((record, target)) = inode_record(ns, inode, target_page) else {
            continue;
        };
        if !target.is_empty() {
            batch.put(target_page * PAGE_SIZE, &target);
        }
        batch.put(st.itable[k] * PAGE_SIZE + at, &record.encode());
        out.inodes += 1;
    }
    dirty.clear();
    st.dirty_inos = dirty;
    // Owner entries, in page order: runs within an owner page, or the
    // whole page where many changed.
    let mut dirty = std::mem::take(&mut st.dirty_pages);
    dirty.sort_unstable();
    let mut i = 0;
    while i < dirty.len() {
        let group = dirty[i] / OWNERS_PER_PAGE;
        let mut j = i;
        while j < dirty.len() && dirty[j] / OWNERS_PER_PAGE == group {
            j += 1;
        }
        let first = group * OWNERS_PER_PAGE;
        let end = (first + OWNERS_PER_PAGE).min(st.owners.len() as u64);
        let runs = dirty[i..j].windows(2).filter(|w| w[1] != w[0] + 1).count() + 1;
        let mut put = |from: u64, to: u64| {
            let buf = batch.put_with(
                st.owners_at + from * OWNER_SIZE,
                ((to - from) * OWNER_SIZE) as usize,
            );
            for o in &st.owners[from as usize..to as usize] {
                buf.extend_from_slice(&o.to_le_bytes());
            }
        };
        if runs > OWNER_RUNS_MAX {
            put(first, end);
        } else {
            let mut a = i;
            while a < j {
                let mut b = a + 1;
                while b < j && dirty[b] == dirty[b - 1] + 1 {
                    b += 1;
                }
                put(dirty[a], dirty[b - 1] + 1);
                a = b;
            }
        }
        out.owners += (j - i) as u64;
        i = j;
    }
    for &d in &dirty {
        st.dirty_page_bits[(d / 64) as usize] &= !(1 << (d % 64));
    }
    dirty.clear();
    st.dirty_pages = dirty;
    // Everything promised was taken or is no longer needed.
    st.promised = 0;
    st.pending_bytes = 0;
    *ns.store_mut() = st;
    Ok(out)
}

/// After a retirement's batch is durable and in place: the slots it freed
/// take new entries, entry pages left empty go (when the class keeps a
/// page's worth of free slots besides), and the pages given up by earlier
/// retirements whose owner entries are now cleared in the store go back
/// to `pages`.
pub fn retired(ns: &mut Namespace, pages: &mut Pages) {
    let st = ns.store_mut();
    if !st.enabled {
        return;
    }
    for id in std::mem::take(&mut st.freed_slots) {
        let (p, s) = slot_parts(id);
        let Some(&idx) = st.entry_pages.get(&p) else {
            continue;
        };
        let Some(Owner::Entries { cells }) = st.owner(p) else {
            continue;
        };
        let ci = usize::from(cells) - 1;
        let c = &mut st.classes[ci];
        let per = c.per_page();
        let ep = &mut c.pages[idx as usize];
        if ep.used & (1 << s) == 0 {
            continue;
        }
        ep.used &= !(1 << s);
        let empty = ep.used == 0;
        c.free_slots += 1;
        c.avail += 1;
        c.list(idx);
        if !empty || c.free_slots < 2 * per {
            continue;
        }
        // An empty page: given up. Its owner entry is cleared by the next
        // retirement, and it is free once that one is durable.
        c.free_slots -= per;
        c.avail -= per;
        let ep = &mut c.pages[idx as usize];
        let gone = std::mem::replace(&mut ep.page, 0);
        c.spare.push(idx);
        st.entry_pages.remove(&gone);
        st.release(gone);
    }
    // Given-up pages whose cleared owner entries are in the store now.
    let data = st.data;
    let dirty = &st.dirty_page_bits;
    let (ready, later): (Vec<u64>, Vec<u64>) = st.released.drain(..).partition(|&p| {
        data.is_some_and(|d| {
            let i = p - d.start;
            dirty
                .get((i / 64) as usize)
                .is_none_or(|w| w & (1 << (i % 64)) == 0)
        })
    });
    st.released = later;
    for p in ready {
        pages.release_meta(p);
    }
}

/// What [`load`] read.
#[derive(Debug, Default, Clone, Copy)]
pub struct Loaded {
    /// Inode records.
    pub inodes: u64,
    /// Entry records.
    pub entries: u64,
    /// File data pages.
    pub file_pages: u64,
    /// Store pages.
    pub store: StoreUse,
    /// Files without a name (open when the file system went down), dropped.
    pub orphans: u64,
}

/// Builds the namespace the store of an image of geometry `g` holds,
/// reading image bytes through `read`. Every record is checked; the first
/// that fails makes the error.
pub fn load(
    g: &Geometry,
    read: &dyn Fn(u64, &mut [u8]) -> bool,
) -> Result<(Namespace, Loaded), String> {
    let mut ns = Namespace::new(kucofs_common::proto::Creds::default(), 0)
        .map_err(|e| format!("index: {e}"))?;
    let mut st = Store::new(g);
    st.loading = true;
    let mut loaded = Loaded::default();
    let mut table = vec![0u8; g.owners.len() as usize];
    if !read(g.owners.offset(), &mut table) {
        return Err("the owner table is outside the image".into());
    }
    let mut files: Vec<(u64, u64, u64)> = Vec::new();
    let mut entry_pages: Vec<(u64, u8)> = Vec::new();
    let mut targets: IntMap<u64, u64> = IntMap::default();
    for i in 0..g.data.pages {
        let at = (i * OWNER_SIZE) as usize;
        let v = u64::from_le_bytes(table[at..at + 8].try_into().expect("8 bytes"));
        let p = g.data.start + i;
        let o = Owner::decode(v).ok_or_else(|| {
            format!("data page {p}: owner entry {v:#x} is not one the format allows")
        })?;
        match o {
            Owner::Free => continue,
            Owner::File { ino, page } => files.push((ino, page, p)),
            Owner::Inodes { index } => {
                let k = usize::try_from(index)
                    .ok()
                    .filter(|&k| k < 1 << 28)
                    .ok_or_else(|| {
                        format!("data page {p}: inode table index {index} is out of range")
                    })?;
                if k >= st.itable.len() {
                    st.itable.resize(k + 1, 0);
                    st.ilive.resize(k + 1, 0);
                }
                if st.itable[k] != 0 {
                    return Err(format!(
                        "data pages {} and {p} both hold inode table page {k}",
                        st.itable[k]
                    ));
                }
                st.itable[k] = p;
                loaded.store.inode_pages += 1;
            }
            Owner::Entries { cells } => {
                entry_pages.push((p, cells));
                loaded.store.entry_pages += 1;
            }
            Owner::Target { ino } => {
                if targets.insert(ino, p).is_some() {
                    return Err(format!("two pages hold the target of inode {ino}"));
                }
                loaded.store.target_pages += 1;
            }
        }
        st.load_owner(p, o);
    }
    drop(table);
    *ns.store_mut() = st;
    // Inodes, page by page.
    let mut page = vec![0u8; PAGE_SIZE as usize];
    let itable = ns.store().itable.clone();
    let mut target = vec![0u8; PAGE_SIZE as usize];
    let mut saw_root = false;
    // Each loaded inode's place in the index and kind, by number, for the
    // entries (a lookup in the index's table would miss the cache twice).
    let mut by_ino: Vec<(u64, u8)> = vec![(0, 0); itable.len() * INODES_PER_PAGE as usize];
    by_ino[crate::namespace::ROOT_INO as usize] = (ns.reader().root(), Kind::Dir.to_byte());
    for (k, &p) in itable.iter().enumerate() {
        if p == 0 {
            continue;
        }
        if !read(p * PAGE_SIZE, &mut page) {
            return Err(format!(
                "inode page {k} (data page {p}) is outside the image"
            ));
        }
        for s in 0..INODES_PER_PAGE {
            let at = (s as usize) * INODE_RECORD;
            let b: &[u8; INODE_RECORD] = page[at..at + INODE_RECORD].try_into().expect("record");
            let ino = k as u64 * INODES_PER_PAGE + s;
            let rec =
                InodeRecord::decode(b).map_err(|e| format!("inode {ino} (data page {p}): {e}"))?;
            let Some(rec) = rec else { continue };
            if rec.ino != ino {
                return Err(format!(
                    "the record in inode {ino}'s slot names inode {}",
                    rec.ino
                ));
            }
            let t: &[u8] = match rec.inline_target() {
                Some(t) => t,
                None => {
                    let tp = rec.target_page;
                    let len = usize::from(rec.target_len);
                    if targets.get(&ino) != Some(&tp) || len >= PAGE_SIZE as usize {
                        return Err(format!(
                            "inode {ino}: its target page {tp} is not one the owner table gives it"
                        ));
                    }
                    if !read(tp * PAGE_SIZE, &mut target[..len]) {
                        return Err(format!(
                            "inode {ino}: target page {tp} is outside the image"
                        ));
                    }
                    if kucofs_common::checksum::crc32c(&target[..len]) != rec.target_crc {
                        return Err(format!(
                            "inode {ino}: its target (data page {tp}): checksum mismatch"
                        ));
                    }
                    ns.store_mut().targets.insert(ino, tp);
                    &target[..len]
                }
            };
            let kind = Kind::from_mode(rec.mode)
                .ok_or_else(|| format!("inode {ino}: mode {:#o} is no known type", rec.mode))?;
            if (kind == Kind::Symlink) != (rec.target_len > 0) {
                return Err(format!(
                    "inode {ino}: a target on a non-symlink or none on a symlink"
                ));
            }
            let attr = kucofs_common::index::InodeAttr {
                offset: 0,
                gen: 0,
                ino,
                mode: rec.mode,
                nlink: rec.nlink,
                uid: rec.uid,
                gid: rec.gid,
                size: rec.size,
                atime: rec.atime,
                mtime: rec.mtime,
                ctime: rec.ctime,
                btime: rec.btime,
                entries: 0,
            };
            if ino == crate::namespace::ROOT_INO {
                if kind != Kind::Dir {
                    return Err("the root is not a directory".into());
                }
                saw_root = true;
            }
            let inode = ns
                .load_inode(&attr, t)
                .map_err(|e| format!("inode {ino}: {e:?}"))?;
            by_ino[ino as usize] = (inode, kind.to_byte());
            loaded.inodes += 1;
        }
    }
    if !saw_root {
        return Err("the store holds no root directory".into());
    }
    // Inodes of the index per inode page (the root was made before the
    // store was read, so the counts are taken from the index).
    let live: Vec<u8> = {
        let r = ns.reader();
        (0..itable.len() as u64)
            .map(|k| {
                (0..INODES_PER_PAGE)
                    .filter(|s| r.inode_by_ino(k * INODES_PER_PAGE + s) != 0)
                    .count() as u8
            })
            .collect()
    };
    ns.store_mut().ilive = live;
    if targets.len() != ns.store().targets.len() {
        return Err("a target page belongs to no symlink".into());
    }
    // Entries, page by page, gathered by directory and key, then each
    // directory built in one pass.
    struct Found {
        parent: u64,
        hash: u64,
        ino: u64,
        slot: u64,
        kind: u8,
        name: (u32, u8),
    }
    let mut found: Vec<Found> = Vec::new();
    let mut names: Vec<u8> = Vec::new();
    for &(p, cells) in &entry_pages {
        if !read(p * PAGE_SIZE, &mut page) {
            return Err(format!("entry page {p} is outside the image"));
        }
        let mut used = 0u64;
        let size = CELL * usize::from(cells);
        for s in 0..slots_per_page(cells) {
            let at = s as usize * size;
            let rec = EntryRecord::decode(&page[at..at + size], cells)
                .map_err(|e| format!("entry slot {s} of data page {p}: {e}"))?;
            let Some(rec) = rec else { continue };
            let at = u32::try_from(names.len()).map_err(|_| "too many names".to_string())?;
            names.extend_from_slice(&rec.name);
            found.push(Found {
                parent: rec.parent,
                hash: kucofs_common::index::name_hash(&rec.name),
                ino: rec.ino,
                slot: slot_id(p, s),
                kind: rec.kind,
                name: (at, rec.name.len() as u8),
            });
            used |= 1 << s;
        }
        ns.store_mut()
            .add_entry_page(usize::from(cells) - 1, p, used);
    }
    let name_of = |f: &Found| &names[f.name.0 as usize..f.name.0 as usize + usize::from(f.name.1)];
    found.sort_unstable_by(|a, b| {
        (a.parent, a.hash)
            .cmp(&(b.parent, b.hash))
            .then_with(|| name_of(a).cmp(name_of(b)))
    });
    loaded.entries = found.len() as u64;
    let mut batch = Vec::new();
    for group in found.chunk_by(|a, b| a.parent == b.parent) {
        let parent = group[0].parent;
        batch.clear();
        for f in group {
            let (inode, kind) = usize::try_from(f.ino)
                .ok()
                .and_then(|i| by_ino.get(i))
                .copied()
                .unwrap_or_default();
            let kind =
                Kind::from_byte(kind).filter(|_| inode != 0 && f.ino != crate::namespace::ROOT_INO);
            let Some(kind) = kind.filter(|k| k.to_byte() == f.kind) else {
                return Err(format!(
                    "entry {:?} in directory {parent} names inode {}, {}",
                    String::from_utf8_lossy(name_of(f)),
                    f.ino,
                    if inode == 0 {
                        "which does not exist"
                    } else {
                        "of another type, or the root"
                    }
                ));
            };
            batch.push(crate::namespace::LoadedEntry {
                hash: f.hash,
                name: name_of(f),
                ino: f.ino,
                inode,
                kind,
                slot: f.slot,
            });
        }
        ns.load_dir(parent, &batch)
            .map_err(|e| format!("the entries of directory {parent}: {e:?}"))?;
    }
    drop(batch);
    drop(found);
    for c in &mut ns.store_mut().classes {
        c.avail = c.free_slots;
    }
    // File data, a run of consecutive pages at a time.
    files.sort_unstable();
    let mut i = 0;
    while i < files.len() {
        let (ino, first, p) = files[i];
        let inode = ns.reader().inode_by_ino(ino);
        let attr = ns
            .reader()
            .attr(inode)
            .filter(|a| a.kind() == Some(Kind::File));
        let Some(attr) = attr.filter(|_| inode != 0) else {
            return Err(format!(
                "data page {p} belongs to inode {ino}, which is no regular file"
            ));
        };
        if first * PAGE_SIZE >= attr.size {
            return Err(format!(
                "data page {p} holds page {first} of inode {ino}, past its size {}",
                attr.size
            ));
        }
        let mut run = vec![p];
        let mut j = i + 1;
        while j < files.len()
            && run.len() < 256
            && files[j].0 == ino
            && files[j].1 == first + run.len() as u64
        {
            run.push(files[j].2);
            j += 1;
        }
        if j < files.len() && files[j].0 == ino && files[j].1 < first + run.len() as u64 {
            return Err(format!(
                "two data pages hold page {} of inode {ino}",
                files[j].1
            ));
        }
        ns.load_pages(inode, first, &run, &attr)
            .map_err(|e| format!("pages of inode {ino}: {e:?}"))?;
        loaded.file_pages += run.len() as u64;
        i = j;
    }
    ns.store_mut().loading = false;
    loaded.orphans = ns
        .drop_orphans()
        .map_err(|e| format!("dropping unnamed files: {e:?}"))?;
    Ok((ns, loaded))
}

/// The data pages the files of `ns` hold, and those its store holds.
pub fn held_pages(ns: &Namespace) -> (Vec<u64>, Vec<u64>) {
    let st = ns.store();
    let (mut files, mut store) = (Vec::new(), Vec::new());
    let Some(data) = st.data else {
        return (files, store);
    };
    for (i, &o) in st.owners.iter().enumerate() {
        let p = data.start + i as u64;
        match Owner::decode(o) {
            Some(Owner::Free) | None => {}
            Some(Owner::File { .. }) => files.push(p),
            Some(_) => store.push(p),
        }
    }
    (files, store)
}

/// The owner entry the store should hold for data page `p` (for fsck's
/// cross-check).
pub fn owner_of(ns: &Namespace, p: u64) -> Option<Owner> {
    let st = ns.store();
    let data = st.data?;
    data.contains(p)
        .then(|| Owner::decode(st.owners[(p - data.start) as usize]))
        .flatten()
}

#[cfg(test)]
mod tests;
