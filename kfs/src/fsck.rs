//! `kucofs fsck`: recover an image read-only and check every invariant.
//!
//! Checked: both superblock copies; the log (every entry's checksum, a
//! damaged entry told from a torn end, every batch's writes inside the
//! store, every record's replay); the metadata store (every owner entry
//! one the format allows, every inode and entry record's checksum and
//! fields, inode numbers in their slots, targets in the pages the owner
//! table gives them, entries naming inodes of their type); then the
//! rebuilt namespace: every entry is a live item of its directory with the
//! right hash, name, inode number and kind, every directory's list is
//! sorted, loop-free and indexed by the right sentinels, every inode is
//! reachable and in the inode table, link counts, entry counts and `..`
//! links agree with the tree; and the store against the rebuilt index:
//! every page a file holds is one its owner entry gives it and no other
//! file holds, and every owner entry naming a file page is one that file
//! holds.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use kucofs_common::format::{Superblock, PAGE_SIZE, SUPERBLOCK_OFFSETS, SUPERBLOCK_SIZE};
use kucofs_common::index::layout::*;
use kucofs_common::index::{
    check_name, name_hash, BucketTable, DirentOff, IndexReader, Ino, InodeOff, Kind,
};
use kucofs_common::pm::{RegionView, Shm};

use crate::image::select_superblock;
use crate::namespace::Namespace;
use crate::recovery::{recover, Replayed};
use crate::Result;

/// What fsck found.
#[derive(Debug, Clone)]
pub struct FsckReport {
    /// The superblock in force.
    pub superblock: Superblock,
    /// Every broken invariant, one sentence each. Empty: the image is clean.
    pub problems: Vec<String>,
    /// Inodes in the tree.
    pub inodes: u64,
    /// Directory entries in the tree.
    pub entries: u64,
    /// Log entries replayed.
    pub replayed: Replayed,
}

impl fmt::Display for FsckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} inodes, {} directory entries, {} log entries replayed",
            self.inodes, self.entries, self.replayed.entries
        )?;
        if self.problems.is_empty() {
            writeln!(f, "clean")
        } else {
            for p in &self.problems {
                writeln!(f, "problem: {p}")?;
            }
            writeln!(f, "{} problems", self.problems.len())
        }
    }
}

/// Checks the image at `path` without changing it. Fails only when the
/// image cannot be read as KucoFS at all (the same refusals as opening it).
pub fn fsck(path: &Path) -> Result<FsckReport> {
    let view = RegionView::open(path)?;
    let (sb, copy) = select_superblock(path, view.len(), |off, buf| view.read(off, buf))?;
    let mut report = FsckReport {
        superblock: sb.clone(),
        problems: Vec::new(),
        inodes: 0,
        entries: 0,
        replayed: Replayed::default(),
    };
    for (i, off) in SUPERBLOCK_OFFSETS.iter().enumerate() {
        let mut b = [0u8; SUPERBLOCK_SIZE];
        let ok = view.read(*off, &mut b).is_ok() && Superblock::decode(&b).is_ok();
        if !ok {
            report.problems.push(format!(
                "superblock copy {} is damaged (copy {copy:?} is in use)",
                ["A", "B"][i]
            ));
        }
    }
    let ns = match recover(&sb, &|off, buf| view.read(off, buf).is_ok()) {
        Ok((ns, _, replayed)) => {
            report.replayed = replayed;
            ns
        }
        Err(why) => {
            report.problems.push(why.to_string());
            return Ok(report);
        }
    };
    check_tree(&ns, &mut report);
    check_pages(&sb, &ns, &mut report);
    Ok(report)
}

fn check_tree(ns: &Namespace, report: &mut FsckReport) {
    let r = ns.reader();
    let p = &mut report.problems;
    let root = r.root();
    // Inode -> names pointing at it; directory -> its subdirectories.
    let mut refs: HashMap<InodeOff, u32> = HashMap::new();
    let mut subdirs: HashMap<InodeOff, u32> = HashMap::new();
    let mut stack = vec![root];
    let mut seen_dirs = std::collections::HashSet::new();
    seen_dirs.insert(root);
    while let Some(dir) = stack.pop() {
        let dir_ino = r.ino(dir);
        let head = r.dir_head(dir);
        if !r.is_live(head.get(), TAG_DIRHEAD, None) {
            p.push(format!(
                "directory {dir_ino}: list head is not a live head item"
            ));
            continue;
        }
        // The list's shape (loops, foreign nodes, key order) is checked
        // once, there; a list that loops cannot be walked for its entries.
        if !check_list(&r, ns, dir, head, dir_ino, p) {
            continue;
        }
        let mut count = 0u64;
        let mut x = r.next(head);
        while !x.is_null() {
            if r.is_marker(x) {
                x = r.next(x);
                continue;
            }
            count += 1;
            report.entries += 1;
            let e = r.dirent(x);
            let name = String::from_utf8_lossy(&e.name).into_owned();
            let at = format!("entry {name:?} in directory {dir_ino}");
            if check_name(&e.name).is_err() {
                p.push(format!("{at}: invalid name"));
            }
            if e.hash != name_hash(&e.name) {
                p.push(format!("{at}: stored hash does not match the name"));
            }
            let inode = e.inode;
            match r.attr(inode) {
                None => p.push(format!("{at}: names something that is not an inode")),
                Some(a) => {
                    if !r.is_live(inode.get(), TAG_INODE, None) {
                        p.push(format!("{at}: names a removed inode"));
                    }
                    if a.ino != e.ino {
                        p.push(format!(
                            "{at}: records inode {} but names inode {}",
                            e.ino, a.ino
                        ));
                    }
                    if a.kind() != Some(e.kind) {
                        p.push(format!(
                            "{at}: records kind {:?} but the inode is {:?}",
                            e.kind,
                            a.kind()
                        ));
                    }
                    if r.inode_by_ino(a.ino) != inode {
                        p.push(format!("{at}: inode {} is not in the inode table", a.ino));
                    }
                    *refs.entry(inode).or_default() += 1;
                    if a.kind() == Some(Kind::Dir) {
                        *subdirs.entry(dir).or_default() += 1;
                        if r.parent(inode) != dir {
                            p.push(format!(
                                "{at}: the directory's \"..\" names another directory"
                            ));
                        }
                        if seen_dirs.insert(inode) {
                            stack.push(inode);
                        } else {
                            p.push(format!("{at}: a directory with more than one name"));
                        }
                    }
                    if a.kind() == Some(Kind::Symlink)
                        && r.readlink(inode).is_none_or(|t| t.is_empty())
                    {
                        p.push(format!("{at}: symlink without a target"));
                    }
                }
            }
            x = r.next(x);
        }
        if let Some(a) = r.attr(dir) {
            if a.entries != count {
                p.push(format!(
                    "directory {dir_ino}: records {} entries but holds {count}",
                    a.entries
                ));
            }
        }
    }
    // Link counts, and reachability of everything in the inode table.
    let mut in_table = 0u64;
    let top = ns.arena().get(HDR_ITABLE);
    for chunk_no in 0..ITABLE_TOP_SLOTS {
        let chunk = ns.arena().get(itable_slot(top, chunk_no));
        if chunk == 0 {
            continue;
        }
        for slot in 0..ITABLE_CHUNK_INOS {
            let inode = InodeOff::new(ns.arena().get(itable_slot(chunk, slot)));
            if inode.is_null() {
                continue;
            }
            in_table += 1;
            let ino = Ino::new(chunk_no * ITABLE_CHUNK_INOS + slot);
            let Some(a) = r.attr(inode) else {
                p.push(format!(
                    "inode table: inode {ino} points at something that is not an inode"
                ));
                continue;
            };
            if a.ino != ino {
                p.push(format!("inode table: slot {ino} holds inode {}", a.ino));
            }
            let names = refs.get(&inode).copied().unwrap_or(0);
            if inode != root && names == 0 {
                p.push(format!("inode {ino} is not reachable from the root"));
                continue;
            }
            let want = match a.kind() {
                Some(Kind::Dir) => 2 + subdirs.get(&inode).copied().unwrap_or(0),
                _ => names,
            };
            if a.nlink != want {
                p.push(format!(
                    "inode {ino}: link count {} but {want} expected",
                    a.nlink
                ));
            }
        }
    }
    report.inodes = in_table;
    if ns.arena().get(HDR_INODES) != in_table {
        p.push(format!(
            "the index counts {} inodes but its table holds {in_table}",
            ns.arena().get(HDR_INODES)
        ));
    }
}

/// A directory's list is sorted and loop-free, holds only live nodes of
/// the directory, and its bucket table points at the right sentinels;
/// while the table doubles, the list also holds the sentinels of the old
/// buckets migrated so far, and the new table points at them. False if
/// the list loops (it cannot be walked to its end).
fn check_list(
    r: &IndexReader<'_, Shm>,
    ns: &Namespace,
    dir: InodeOff,
    head: DirentOff,
    dir_ino: Ino,
    p: &mut Vec<String>,
) -> bool {
    let mut seen = std::collections::HashSet::new();
    let mut l = r.link(head);
    let mut x = link_node(l);
    let mut prev: Option<(u64, Vec<u8>)> = None;
    let mut sentinels = 0u64;
    while !x.is_null() {
        if !seen.insert(x) {
            p.push(format!("directory {dir_ino}: its list loops"));
            return false;
        }
        let marker = r.is_marker(x);
        let tag = if marker { TAG_SENTINEL } else { TAG_DIRENT };
        if !r.is_live(x.get(), tag, None) || ns.arena().get(x.dir()) != dir.get() {
            p.push(format!(
                "directory {dir_ino}: its list holds a node that is not its own live item"
            ));
        }
        sentinels += u64::from(marker);
        let e = r.dirent(x);
        if l >> LINK_NODE_BITS != link_tag(e.hash) {
            p.push(format!(
                "directory {dir_ino}: a link's tag does not match the node it leads to"
            ));
        }
        if let Some((h, n)) = &prev {
            if (*h, n.as_slice()) >= (e.hash, e.name.as_slice()) {
                p.push(format!("directory {dir_ino}: its list is out of key order"));
            }
        }
        prev = Some((e.hash, e.name));
        l = r.link(x);
        x = link_node(l);
    }
    let table = BucketTable::new(ns.arena().get(dir.buckets()));
    let bits = u32::try_from(ns.arena().get(table.bits()))
        .ok()
        .filter(|b| (BUCKET_BITS_MIN..=BUCKET_BITS_MAX).contains(b));
    let Some(bits) = bits.filter(|_| r.is_live(table.get(), TAG_BUCKETS, None)) else {
        p.push(format!("directory {dir_ino}: no valid bucket table"));
        return true;
    };
    let doubling = ns.doubling(dir);
    let migrated = doubling.map_or(0, |(_, m)| m);
    if sentinels != (1 << bits) - 1 + migrated {
        let split = match doubling {
            Some(_) => format!(", {migrated} of them split"),
            None => String::new(),
        };
        p.push(format!(
            "directory {dir_ino}: {sentinels} sentinels for a table of {} buckets{split}",
            1u64 << bits
        ));
    }
    // A sentinel of this directory with the key `bucket_start(b, bits)`.
    let is_sentinel = |s: DirentOff, b: u64, bits: u32| {
        seen.contains(&s) && r.is_marker(s) && r.dirent(s).hash == bucket_start(b, bits)
    };
    for b in 0..1u64 << bits {
        let s = DirentOff::new(ns.arena().get(table.slot(b)));
        let ok = if b == 0 {
            s == head
        } else {
            is_sentinel(s, b, bits)
        };
        if !ok {
            p.push(format!(
                "directory {dir_ino}: bucket {b} does not start at its sentinel"
            ));
        }
    }
    let Some((new, migrated)) = doubling else {
        return true;
    };
    // The sentinels counted above are the old table's and, in the new
    // table's odd slots, distinct keys: every sentinel is accounted for.
    let nb = bits + 1;
    if !r.is_live(new.get(), TAG_BUCKETS, None) || ns.arena().get(new.bits()) != u64::from(nb) {
        p.push(format!(
            "directory {dir_ino}: its growing table is no table of {} buckets",
            1u64 << nb
        ));
        return true;
    }
    for b in 0..migrated {
        let low = ns.arena().get(new.slot(2 * b));
        let high = DirentOff::new(ns.arena().get(new.slot(2 * b + 1)));
        if low != ns.arena().get(table.slot(b)) || !is_sentinel(high, 2 * b + 1, nb) {
            p.push(format!(
                "directory {dir_ino}: bucket {b} is not split at its new sentinel"
            ));
        }
    }
    true
}

/// Every page a file holds is a data page held by no other file, whose
/// owner entry names that file and page, and a file's page count agrees
/// with its map; every owner entry naming a file page names one the file
/// holds.
fn check_pages(sb: &Superblock, ns: &Namespace, report: &mut FsckReport) {
    use kucofs_common::format::meta::Owner;
    let g = sb.geometry;
    let mut owner: HashMap<u64, Ino> = HashMap::new();
    let mut files = Vec::new();
    ns.for_each_inode(|a| {
        if a.kind() == Some(Kind::File) {
            files.push(*a);
        }
    });
    for a in &files {
        let mut count = 0u64;
        let mut past_end = false;
        ns.file_pages(a.offset, |fp, p| {
            let p = p.get();
            count += 1;
            past_end |= fp * PAGE_SIZE >= a.size;
            if p < g.data.start || p >= g.data.end() {
                report.problems.push(format!(
                    "file {}: page {fp} is in region page {p}, outside the data pages",
                    a.ino
                ));
                return;
            }
            if let Some(other) = owner.insert(p, a.ino) {
                report.problems.push(format!(
                    "region page {p} is held by file {other} and by file {}",
                    a.ino
                ));
            }
            let named = ns.store().owner(p);
            if named
                != Some(Owner::File {
                    ino: a.ino.get(),
                    page: fp,
                })
            {
                report.problems.push(format!(
                    "file {}: page {fp} is in region page {p}, whose owner entry says {named:?}",
                    a.ino
                ));
            }
        });
        if count != a.entries {
            report.problems.push(format!(
                "file {}: holds {count} pages but counts {}",
                a.ino, a.entries
            ));
        }
        if past_end {
            report
                .problems
                .push(format!("file {}: holds pages past its size", a.ino));
        }
    }
    let mut strays = 0u64;
    for p in g.data.start..g.data.end() {
        if let Some(Owner::File { .. }) = ns.store().owner(p) {
            strays += u64::from(!owner.contains_key(&p));
        }
    }
    if strays > 0 {
        report.problems.push(format!(
            "{strays} owner entries name file pages that no file holds"
        ));
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use kucofs_common::proto::{Creds, Entry, Request};

    fn superblock() -> Superblock {
        Superblock {
            seq: 1,
            compat: 0,
            incompat: 0,
            clean: true,
            uuid: [0; 16],
            created_ns: 0,
            geometry: kucofs_common::format::Geometry::for_size(8 << 20).unwrap(),
            log_seq: 1,
        }
    }

    /// A namespace with three files in its root.
    fn three_files() -> Namespace {
        let mut ns = Namespace::new(Creds::default(), 1).unwrap();
        for name in ["a", "b", "c"] {
            let create = Request::Create {
                at: Entry::Path(name.as_bytes()),
                mode: libc::S_IFREG | 0o644,
                target: b"",
                hint: None,
            };
            ns.execute(&create, Creds::default()).unwrap();
        }
        ns
    }

    /// The problems `check_tree` finds.
    pub(crate) fn problems(ns: &Namespace) -> Vec<String> {
        let mut report = FsckReport {
            superblock: superblock(),
            problems: Vec::new(),
            inodes: 0,
            entries: 0,
            replayed: Replayed::default(),
        };
        check_tree(ns, &mut report);
        report.problems
    }

    #[test]
    fn a_looping_directory_list_is_reported_once_and_fsck_ends() {
        let ns = three_files();
        assert_eq!(problems(&ns), Vec::<String>::new());
        let r = ns.reader();
        let root = r.root();
        // The list's last node links back to its first.
        let mut x = r.next(r.dir_head(root));
        while !r.next(x).is_null() {
            x = r.next(x);
        }
        ns.arena().put(x.next(), r.link(r.dir_head(root))).unwrap();
        let problems = problems(&ns);
        let loops = problems.iter().filter(|p| p.contains("loops")).count();
        assert_eq!(loops, 1, "{problems:?}");
    }

    #[test]
    fn a_link_whose_tag_is_not_its_nodes_is_reported() {
        let ns = three_files();
        let r = ns.reader();
        let head = r.dir_head(r.root());
        ns.arena()
            .put(head.next(), r.link(head) ^ 1 << LINK_NODE_BITS)
            .unwrap();
        assert_eq!(
            problems(&ns),
            ["directory 1: a link's tag does not match the node it leads to"]
        );
    }
}
