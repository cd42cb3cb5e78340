//! Reading the metadata store back at recovery (ARCHITECTURE.md §12):
//! one pass over the owner table, the inode pages, the entry pages and the
//! files' pages, every record checked, the index built as it goes. A
//! damaged or hostile image gets a [`LoadError`] naming what is wrong, never a
//! panic, a loop or an allocation its size does not call for.

use kucofs_common::format::meta::{
    slots_per_page, EntryRef, InodeRecord, Owner, RecordFault, CELL, INODES_PER_PAGE, INODE_RECORD,
};
use kucofs_common::format::{Geometry, OWNER_SIZE, PAGE_LEN, PAGE_SIZE};
use kucofs_common::index::blockmap::MAX_FILE_SIZE;
use kucofs_common::index::{check_name, Ino, InodeOff, Kind};
use kucofs_common::Errno;

use super::{slot_id, Store, StoreUse};
use crate::intmap::IntMap;
use crate::namespace::{LoadedEntry, Namespace, MAX_INODES, ROOT_INO};

/// [`INODES_PER_PAGE`] as a `usize`, for the slots of an inode page.
const SLOTS: usize = PAGE_LEN / INODE_RECORD;
const _: () = assert!(SLOTS as u64 == INODES_PER_PAGE);
// An owner entry is a `u64`.
const _: () = assert!(OWNER_SIZE == 8);

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

/// Why [`load`] refused a store: one variant per kind of fault, each
/// carrying the numbers that place it (data page, slot, inode number) and
/// the lower error where there is one (the record's [`RecordFault`], the
/// index's [`Errno`]). Each reads as a sentence naming what is wrong where,
/// which fsck reports and recovery's error carries.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The empty index could not be made.
    #[error("index: {0}")]
    Index(#[source] Errno),
    /// The owner table does not fit in memory.
    #[error("the owner table is larger than the address space")]
    OwnerTableTooLarge,
    /// The owner table could not be read.
    #[error("the owner table is outside the image")]
    OwnerTableOutside,
    /// An owner entry decodes to no owner.
    #[error("data page {page}: owner entry {entry:#x} is not one the format allows")]
    BadOwner { page: u64, entry: u64 },
    /// An owner entry names an inode table page past every inode number.
    #[error("data page {page}: inode table index {index} is out of range")]
    InodeTableIndex { page: u64, index: u64 },
    /// Two owner entries name the same inode table page.
    #[error("data pages {first} and {page} both hold inode table page {index}")]
    InodeTablePageTwice { first: u64, page: u64, index: usize },
    /// Two owner entries name the target of the same inode.
    #[error("two pages hold the target of inode {ino}")]
    TargetTwice { ino: u64 },
    /// The inode table has more pages than a `u32` counts.
    #[error("the inode table has too many pages")]
    InodeTableTooLong,
    /// An inode page could not be read.
    #[error("inode page {index} (data page {page}) is outside the image")]
    InodePageOutside { index: usize, page: u64 },
    /// An inode record fails its checks.
    #[error("inode {ino} (data page {page}): {fault}")]
    InodeRecord {
        ino: u64,
        page: u64,
        #[source]
        fault: RecordFault,
    },
    /// The record in an inode's slot names another inode.
    #[error("the record in inode {ino}'s slot names inode {named}")]
    InodeSlot { ino: u64, named: u64 },
    /// An inode's target page is not the one the owner table gives it,
    /// or its length does not fit a page.
    #[error("inode {ino}: its target page {page} is not one the owner table gives it")]
    TargetPageNotOwned { ino: u64, page: u64 },
    /// An inode's target page could not be read.
    #[error("inode {ino}: target page {page} is outside the image")]
    TargetPageOutside { ino: u64, page: u64 },
    /// An inode's target does not match its checksum.
    #[error("inode {ino}: its target (data page {page}): checksum mismatch")]
    TargetChecksum { ino: u64, page: u64 },
    /// An inode's mode is of no known type.
    #[error("inode {ino}: mode {mode:#o} is no known type")]
    UnknownMode { ino: u64, mode: u32 },
    /// A target on an inode that is no symlink, or a symlink without one.
    #[error("inode {ino}: a target on a non-symlink or none on a symlink")]
    TargetKind { ino: u64 },
    /// An inode's size is not one its type allows.
    #[error("inode {ino}: size {size} is not one it can have")]
    BadSize { ino: u64, size: u64 },
    /// The root inode is not a directory.
    #[error("the root is not a directory")]
    RootNotDir,
    /// The index refused an inode.
    #[error("inode {ino}: {errno:?}")]
    LoadInode {
        ino: u64,
        #[source]
        errno: Errno,
    },
    /// No record for the root.
    #[error("the store holds no root directory")]
    NoRoot,
    /// A target page whose inode is no symlink (or has its target inline).
    #[error("a target page belongs to no symlink")]
    StrayTarget,
    /// More entry pages than a class's list can hold.
    #[error("{pages} entry pages are more than the store can list")]
    TooManyEntryPages { pages: usize },
    /// The entry pages' slots do not fit in memory.
    #[error("the entry pages hold more slots than the address space")]
    EntrySlotsTooMany,
    /// An entry page could not be read.
    #[error("entry page {page} is outside the image")]
    EntryPageOutside { page: u64 },
    /// An entry record fails its checks.
    #[error("entry slot {slot} of data page {page}: {fault}")]
    EntryRecord {
        page: u64,
        slot: u64,
        #[source]
        fault: RecordFault,
    },
    /// An entry record's name is not one a directory can hold.
    #[error(
        "entry slot {slot} of data page {page}: {:?} is not a name a directory can hold",
        String::from_utf8_lossy(.name)
    )]
    BadName {
        page: u64,
        slot: u64,
        name: Vec<u8>,
        #[source]
        errno: Errno,
    },
    /// An entry names an inode that does not exist.
    #[error(
        "entry {:?} in directory {parent} names inode {ino}, which does not exist",
        String::from_utf8_lossy(.name)
    )]
    EntryToNothing {
        parent: u64,
        name: Vec<u8>,
        ino: u64,
    },
    /// An entry names an inode of another type than its own, or the root.
    #[error(
        "entry {:?} in directory {parent} names inode {ino}, of another type, or the root",
        String::from_utf8_lossy(.name)
    )]
    EntryKind {
        parent: u64,
        name: Vec<u8>,
        ino: u64,
    },
    /// The names take more bytes than a `u32` counts.
    #[error("too many names")]
    TooManyNames,
    /// The index refused a directory's entries (a repeated name, one
    /// under no directory).
    #[error("the entries of directory {parent}: {errno:?}")]
    LoadDir {
        parent: u64,
        #[source]
        errno: Errno,
    },
    /// An inode's link count is not the one its entries give it.
    #[error("inode {ino} has a link count of {nlink}, but the entries give it {want}")]
    LinkCount { ino: u64, nlink: u32, want: u32 },
    /// A data page belongs to an inode that is no regular file.
    #[error("data page {page} belongs to inode {ino}, which is no regular file")]
    NotAFile { page: u64, ino: u64 },
    /// Two data pages hold the same page of a file.
    #[error("two data pages hold page {index} of inode {ino}")]
    FilePageTwice { ino: u64, index: u64 },
    /// A data page holds a page of a file past its size.
    #[error("data page {page} holds page {index} of inode {ino}, past its size {size}")]
    PastSize {
        page: u64,
        index: u64,
        ino: u64,
        size: u64,
    },
    /// The index refused a file's pages.
    #[error("pages of inode {ino}: {errno:?}")]
    LoadPages {
        ino: u64,
        #[source]
        errno: Errno,
    },
    /// Dropping the files without a name failed.
    #[error("dropping unnamed files: {0:?}")]
    DropOrphans(#[source] Errno),
}

/// Builds the namespace the store of an image of geometry `g` holds,
/// reading image bytes through `read`. Every record is checked; the first
/// that fails makes the error.
pub fn load(
    g: &Geometry,
    read: &dyn Fn(u64, &mut [u8]) -> bool,
) -> Result<(Namespace, Loaded), LoadError> {
    let mut ns =
        Namespace::new(kucofs_common::proto::Creds::default(), 0).map_err(LoadError::Index)?;
    let mut st = Store::new(g);
    st.loading = true;
    let mut loaded = Loaded::default();
    let table_len = usize::try_from(g.owners.len()).map_err(|_| LoadError::OwnerTableTooLarge)?;
    let mut table = vec![0u8; table_len];
    if !read(g.owners.offset(), &mut table) {
        return Err(LoadError::OwnerTableOutside);
    }
    let mut files: Vec<(u64, u64, u64)> = Vec::new();
    let mut entry_pages: Vec<(u64, u8)> = Vec::new();
    let mut targets: IntMap<u64, u64> = IntMap::default();
    // A valid geometry's owner table has an entry for every data page.
    for (i, entry) in (0..g.data.pages).zip(table.chunks_exact(8)) {
        let v = u64::from_le_bytes(entry.try_into().expect("8 bytes"));
        let p = g.data.start + i;
        let o = Owner::decode(v).ok_or(LoadError::BadOwner { page: p, entry: v })?;
        match o {
            Owner::Free => continue,
            Owner::File { ino, page } => files.push((ino, page, p)),
            Owner::Inodes { index } => {
                let k = usize::try_from(index)
                    .ok()
                    .filter(|&k| (k as u64) < MAX_INODES / INODES_PER_PAGE)
                    .ok_or(LoadError::InodeTableIndex { page: p, index })?;
                if k >= st.itable.len() {
                    st.itable.resize(k + 1, 0);
                    st.ilive.resize(k + 1, 0);
                }
                if st.itable[k] != 0 {
                    return Err(LoadError::InodeTablePageTwice {
                        first: st.itable[k],
                        page: p,
                        index: k,
                    });
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
                    return Err(LoadError::TargetTwice { ino });
                }
                loaded.store.target_pages += 1;
            }
        }
        st.load_owner(p, o);
    }
    drop(table);
    *ns.store_mut() = st;
    // Inodes, page by page.
    let mut page = vec![0u8; PAGE_LEN];
    let itable = ns.store().itable.clone();
    let mut target = vec![0u8; PAGE_LEN];
    let mut saw_root = false;
    // Each loaded inode's place in the index, kind and link count, by
    // number, for the entries (a lookup in the index's table would miss
    // the cache twice): a block of 32 for every inode page the store has,
    // so that a damaged table index costs no more than the page itself.
    let mut block_of: Vec<u32> = vec![u32::MAX; itable.len()];
    let mut blocks: Vec<[Loading; SLOTS]> = Vec::new();
    for (k, &p) in itable.iter().enumerate() {
        if p != 0 {
            block_of[k] = u32::try_from(blocks.len()).map_err(|_| LoadError::InodeTableTooLong)?;
            blocks.push([Loading::default(); SLOTS]);
        }
    }
    let slot_of = |ino: u64| -> Option<(usize, usize)> {
        let k = usize::try_from(ino / INODES_PER_PAGE).ok()?;
        let b = *block_of.get(k)?;
        let s = usize::try_from(ino % INODES_PER_PAGE).ok()?;
        (b != u32::MAX).then_some((b as usize, s))
    };
    for (k, &p) in itable.iter().enumerate() {
        if p == 0 {
            continue;
        }
        if !read(p * PAGE_SIZE, &mut page) {
            return Err(LoadError::InodePageOutside { index: k, page: p });
        }
        for (s, b) in page.chunks_exact(INODE_RECORD).enumerate() {
            let b: &[u8; INODE_RECORD] = b.try_into().expect("record");
            let ino = k as u64 * INODES_PER_PAGE + s as u64;
            let rec = InodeRecord::decode(b).map_err(|fault| LoadError::InodeRecord {
                ino,
                page: p,
                fault,
            })?;
            let Some(rec) = rec else { continue };
            if rec.ino != ino {
                return Err(LoadError::InodeSlot {
                    ino,
                    named: rec.ino,
                });
            }
            let t: &[u8] = match rec.inline_target() {
                Some(t) => t,
                None => {
                    let tp = rec.target_page;
                    let len = usize::from(rec.target_len);
                    if targets.get(&ino) != Some(&tp) || len >= PAGE_LEN {
                        return Err(LoadError::TargetPageNotOwned { ino, page: tp });
                    }
                    if !read(tp * PAGE_SIZE, &mut target[..len]) {
                        return Err(LoadError::TargetPageOutside { ino, page: tp });
                    }
                    if kucofs_common::checksum::crc32c(&target[..len]) != rec.target_crc {
                        return Err(LoadError::TargetChecksum { ino, page: tp });
                    }
                    ns.store_mut().targets.insert(ino, tp);
                    &target[..len]
                }
            };
            let kind = Kind::from_mode(rec.mode).ok_or(LoadError::UnknownMode {
                ino,
                mode: rec.mode,
            })?;
            if (kind == Kind::Symlink) != (rec.target_len > 0) {
                return Err(LoadError::TargetKind { ino });
            }
            let size_ok = match kind {
                Kind::File => rec.size <= MAX_FILE_SIZE,
                Kind::Symlink => rec.size == u64::from(rec.target_len),
                Kind::Dir => true,
            };
            if !size_ok {
                return Err(LoadError::BadSize {
                    ino,
                    size: rec.size,
                });
            }
            let attr = kucofs_common::index::InodeAttr {
                offset: InodeOff::NULL,
                gen: 0,
                ino: Ino::new(ino),
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
            if ino == ROOT_INO {
                if kind != Kind::Dir {
                    return Err(LoadError::RootNotDir);
                }
                saw_root = true;
            }
            let inode = ns
                .load_inode(&attr, t)
                .map_err(|errno| LoadError::LoadInode { ino, errno })?;
            blocks[block_of[k] as usize][s] = Loading {
                inode,
                kind: kind.to_byte(),
                nlink: rec.nlink,
                names: 0,
            };
            loaded.inodes += 1;
        }
    }
    if !saw_root {
        return Err(LoadError::NoRoot);
    }
    // Inodes of the index per inode page (the root was made before the
    // store was read, so the counts are taken from the index).
    let live: Vec<u8> = {
        let r = ns.reader();
        (0..itable.len() as u64)
            .map(|k| {
                let n = (0..INODES_PER_PAGE)
                    .filter(|s| !r.inode_by_ino(Ino::new(k * INODES_PER_PAGE + s)).is_null())
                    .count();
                u8::try_from(n).expect("at most INODES_PER_PAGE (32)")
            })
            .collect()
    };
    let st = ns.store_mut();
    st.ilive = live;
    st.inode_slots = (0..st.itable.len()).map(|k| st.slots_of(k)).sum();
    if targets.len() != ns.store().targets.len() {
        return Err(LoadError::StrayTarget);
    }
    // Each entry page's place in its class's list is a `u32`, `u32::MAX`
    // meaning none.
    if u32::try_from(entry_pages.len()).is_err() {
        return Err(LoadError::TooManyEntryPages {
            pages: entry_pages.len(),
        });
    }
    // Entries, page by page: each name checked and its inode looked up
    // in the order the store holds them (which follows the order they
    // were made in, as the inodes' numbers do, so the lookups mostly hit
    // the cache); then sorted by directory and key, and each directory
    // built in one pass.
    let slots: u64 = entry_pages.iter().map(|&(_, c)| slots_per_page(c)).sum();
    let slots = usize::try_from(slots).map_err(|_| LoadError::EntrySlotsTooMany)?;
    let mut found: Vec<LoadedEntry> = Vec::with_capacity(slots);
    let mut names: Vec<u8> = Vec::with_capacity(slots * 16);
    for &(p, cells) in &entry_pages {
        if !read(p * PAGE_SIZE, &mut page) {
            return Err(LoadError::EntryPageOutside { page: p });
        }
        let mut used = 0u64;
        let size = CELL * usize::from(cells);
        for (s, rec) in (0..slots_per_page(cells)).zip(page.chunks_exact(size)) {
            let rec = EntryRef::decode(rec, cells).map_err(|fault| LoadError::EntryRecord {
                page: p,
                slot: s,
                fault,
            })?;
            let Some(rec) = rec else { continue };
            let (parent, name) = (rec.parent, rec.name);
            check_name(name).map_err(|errno| LoadError::BadName {
                page: p,
                slot: s,
                name: name.to_vec(),
                errno,
            })?;
            let at = slot_of(rec.ino).filter(|_| rec.ino != ROOT_INO);
            let (inode, kind) = at.map_or((InodeOff::NULL, 0), |(b, s)| {
                let l = &mut blocks[b][s];
                l.names += 1;
                (l.inode, l.kind)
            });
            if kind == Kind::Dir.to_byte() {
                if let Some((b, s)) = slot_of(parent) {
                    blocks[b][s].names += 1;
                }
            }
            let kind = Kind::from_byte(kind).filter(|_| !inode.is_null());
            let Some(kind) = kind.filter(|k| k.to_byte() == rec.kind) else {
                let (name, ino) = (name.to_vec(), rec.ino);
                return Err(if inode.is_null() {
                    LoadError::EntryToNothing { parent, name, ino }
                } else {
                    LoadError::EntryKind { parent, name, ino }
                });
            };
            let name_at = u32::try_from(names.len()).map_err(|_| LoadError::TooManyNames)?;
            names.extend_from_slice(name);
            found.push(LoadedEntry {
                parent: Ino::new(parent),
                hash: kucofs_common::index::name_hash(name),
                ino: Ino::new(rec.ino),
                inode,
                slot: slot_id(p, s),
                name_at,
                name_len: u8::try_from(name.len()).expect("check_name allows NAME_MAX (255) bytes"),
                kind,
            });
            used |= 1 << s;
        }
        ns.store_mut()
            .add_entry_page(usize::from(cells) - 1, p, used);
    }
    found.sort_unstable_by(|a, b| {
        (a.parent, a.hash)
            .cmp(&(b.parent, b.hash))
            .then_with(|| a.name(&names).cmp(b.name(&names)))
    });
    loaded.entries = found.len() as u64;
    for group in found.chunk_by(|a, b| a.parent == b.parent) {
        let parent = group[0].parent;
        ns.load_dir(parent, &names, group)
            .map_err(|errno| LoadError::LoadDir {
                parent: parent.get(),
                errno,
            })?;
    }
    drop(found);
    drop(names);
    // Link counts: a file's or symlink's is its names (none for one that
    // was open when the file system went down, dropped below); a
    // directory's, 2 and one for each directory in it (`names` counted
    // its name and its subdirectories).
    for (k, &b) in block_of.iter().enumerate() {
        if b == u32::MAX {
            continue;
        }
        for (s, l) in blocks[b as usize].iter().enumerate() {
            let ino = k as u64 * INODES_PER_PAGE + s as u64;
            let want = match Kind::from_byte(l.kind) {
                None => continue,
                Some(Kind::Dir) => l.names + u32::from(ino == ROOT_INO) + 1,
                Some(_) => l.names,
            };
            let orphan = l.nlink == 0 && l.names == 0 && l.kind != Kind::Dir.to_byte();
            if l.nlink != want && !orphan {
                return Err(LoadError::LinkCount {
                    ino,
                    nlink: l.nlink,
                    want,
                });
            }
        }
    }
    for c in &mut ns.store_mut().classes {
        c.avail = c.free_slots;
    }
    // File data, a run of consecutive pages at a time.
    files.sort_unstable();
    let mut i = 0;
    while i < files.len() {
        let (ino, first, p) = files[i];
        let inode = ns.reader().inode_by_ino(Ino::new(ino));
        let attr = ns
            .reader()
            .attr(inode)
            .filter(|a| a.kind() == Some(Kind::File));
        let Some(attr) = attr.filter(|_| !inode.is_null()) else {
            return Err(LoadError::NotAFile { page: p, ino });
        };
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
            return Err(LoadError::FilePageTwice {
                ino,
                index: files[j].1,
            });
        }
        let last = first + run.len() as u64 - 1;
        if last * PAGE_SIZE >= attr.size {
            return Err(LoadError::PastSize {
                page: run[run.len() - 1],
                index: last,
                ino,
                size: attr.size,
            });
        }
        ns.load_pages(inode, first, &run, &attr)
            .map_err(|errno| LoadError::LoadPages { ino, errno })?;
        loaded.file_pages += run.len() as u64;
        i = j;
    }
    ns.store_mut().loading = false;
    loaded.orphans = ns.drop_orphans().map_err(LoadError::DropOrphans)?;
    Ok((ns, loaded))
}

/// The data pages the files of `ns` hold, and those its store holds: its
/// records' pages, and those it gave up whose owner entries are not yet
/// cleared in the image (a symlink dropped by the replay gives its target
/// page up; the image still names it until the next retirement).
pub fn held_pages(ns: &Namespace) -> (Vec<u64>, Vec<u64>) {
    let st = ns.store();
    let (mut files, mut store) = (Vec::new(), st.released.clone());
    let Some(data) = st.data else {
        return (files, store);
    };
    for (i, &o) in st.owners.iter().enumerate() {
        let p = data.start + i as u64;
        match Owner::decode(o & !super::DIRTY) {
            Some(Owner::Free) | None => {}
            Some(Owner::File { .. }) => files.push(p),
            Some(_) => store.push(p),
        }
    }
    (files, store)
}

/// An inode as loaded, for the entries that name it.
#[derive(Debug, Clone, Copy, Default)]
struct Loading {
    /// Its offset in the index (null: no inode).
    inode: InodeOff,
    /// Its type byte.
    kind: u8,
    /// Its link count in the store.
    nlink: u32,
    /// Names it has (for a directory, its name and its subdirectories).
    names: u32,
}
