use std::collections::{BTreeMap, BTreeSet};

use kucofs_common::index::{name_hash, BucketTable, Ino, InodeOff};
use kucofs_common::proto::{Creds, Entry, Request};

use super::*;
use crate::fsck::tests::problems;

const ME: Creds = Creds::new(1000, 100);

fn ns() -> Namespace {
    Namespace::new(ME, 1).unwrap()
}

fn create(ns: &mut Namespace, path: &str, mode: u32) -> u64 {
    let req = Request::Create {
        at: Entry::Path(path.as_bytes()),
        mode,
        target: b"",
        hint: None,
    };
    ns.execute(&req, ME).unwrap().unwrap().ino.get()
}

fn file(ns: &mut Namespace, path: &str) -> u64 {
    create(ns, path, libc::S_IFREG | 0o644)
}

fn mkdir(ns: &mut Namespace, path: &str) -> u64 {
    create(ns, path, libc::S_IFDIR | 0o755)
}

fn unlink(ns: &mut Namespace, path: &str, rmdir: bool) {
    let req = Request::Unlink {
        at: Entry::Path(path.as_bytes()),
        rmdir,
        hint: None,
    };
    ns.execute(&req, ME).unwrap();
}

fn dir_of(ns: &Namespace, path: &str) -> InodeOff {
    ns.reader().resolve(path.as_bytes(), true).unwrap()
}

/// log2 of the buckets of `dir`'s published table.
fn bits(ns: &Namespace, dir: InodeOff) -> u32 {
    let table = BucketTable::new(ns.arena.get(dir.buckets()));
    u32::try_from(ns.arena.get(table.bits())).unwrap()
}

/// A small random-number generator (xorshift), so that runs repeat.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// `v` as an index.
fn ix(v: u64) -> usize {
    usize::try_from(v).unwrap()
}

/// Checks `dir` against `model` (name → ino): every name is found and
/// names its inode, a listing (whole, and in pages from cookies) gives
/// exactly the model's names in key order, Kfs's own scan of the
/// directory gives them all, the entry count agrees, and fsck finds
/// nothing wrong.
fn check(ns: &Namespace, dir: InodeOff, model: &BTreeMap<Vec<u8>, u64>, gone: &[Vec<u8>]) {
    let r = ns.reader();
    for (name, &ino) in model {
        let found = r.lookup(dir, name);
        assert!(
            !found.is_null(),
            "{:?} not found",
            String::from_utf8_lossy(name)
        );
        assert_eq!(r.dirent(found).ino.get(), ino);
    }
    for name in gone {
        assert!(r.lookup(dir, name).is_null(), "{:?} still found", name);
    }
    let mut keyed: Vec<(u64, &[u8])> = model.keys().map(|n| (name_hash(n), n.as_slice())).collect();
    keyed.sort();
    let want: Vec<&[u8]> = keyed.iter().map(|k| k.1).collect();
    let mut listed = Vec::new();
    assert!(!r.read_dir(dir, None, usize::MAX, &mut listed));
    let names: Vec<&[u8]> = listed.iter().map(|e| e.name.as_slice()).collect();
    assert_eq!(names, want, "listing out of key order or incomplete");
    // In pages of 5, each resumed from the last entry's key through the
    // published table.
    let mut paged = Vec::new();
    let mut after: Option<(u64, Vec<u8>)> = None;
    loop {
        let mut page = Vec::new();
        let more = r.read_dir(
            dir,
            after.as_ref().map(|(h, n)| (*h, n.as_slice())),
            5,
            &mut page,
        );
        after = page.last().map(|e| (e.hash, e.name.clone()));
        paged.extend(page.into_iter().map(|e| e.name));
        if !more {
            break;
        }
    }
    assert_eq!(paged, want);
    let mut scanned = BTreeMap::new();
    r.for_each_entry(dir, |name, ino| {
        assert!(
            scanned.insert(name.to_vec(), ino.get()).is_none(),
            "scanned twice"
        );
    });
    assert_eq!(&scanned, model, "Kfs's scan of the directory");
    assert_eq!(r.attr(dir).unwrap().entries, model.len() as u64);
    assert_eq!(problems(ns), Vec::<String>::new());
}

/// Frees everything retired (no reader holds anything).
fn reclaim_all(ns: &mut Namespace) {
    while ns.dismantle_step(1000).unwrap() {}
    while ns.arena.retired() > 0 {
        let epoch = ns.advance_epoch().unwrap();
        ns.free_retired(epoch).unwrap();
    }
}

#[test]
fn a_directory_grown_across_doublings_with_unlinks_matches_a_model_at_every_step() {
    let mut ns = ns();
    mkdir(&mut ns, "d");
    let dir = dir_of(&ns, "d");
    let mut model: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let mut gone = Vec::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Unlinks and adds made while a doubling was under way, in buckets it
    // had migrated and in buckets it had not.
    let (mut unlinks, mut adds) = ([0u32; 2], [0u32; 2]);
    let mut doublings = 0;
    let mut i = 0u64;
    while bits(&ns, dir) < 10 {
        let before = ns.doubling(dir);
        let old_bits = bits(&ns, dir);
        // Whether a name falls in a bucket the doubling under way migrated.
        let migrated = |name: &[u8]| {
            before.map(|(_, next)| usize::from(bucket(name_hash(name), old_bits) < next))
        };
        if !model.is_empty() && rng.below(10) < 3 {
            let k = ix(rng.below(model.len() as u64));
            let name: Vec<u8> = model.keys().nth(k).unwrap().clone();
            unlink(
                &mut ns,
                &format!("d/{}", String::from_utf8_lossy(&name)),
                false,
            );
            if let Some(m) = migrated(&name) {
                unlinks[m] += 1;
            }
            model.remove(&name);
            gone.push(name);
        } else {
            let name = format!("f{i}");
            i += 1;
            let ino = file(&mut ns, &format!("d/{name}"));
            if let Some(m) = migrated(name.as_bytes()) {
                adds[m] += 1;
            }
            model.insert(name.into_bytes(), ino);
        }
        if rng.below(40) == 0 {
            // Kfs idle between requests.
            ns.grow_step(3);
        }
        doublings += u32::from(bits(&ns, dir) > old_bits);
        let recent = gone.len().saturating_sub(20);
        check(&ns, dir, &model, &gone[recent..]);
    }
    assert_eq!(doublings, 10 - BUCKET_BITS_MIN);
    assert!(unlinks.iter().all(|&n| n > 0), "{unlinks:?}");
    assert!(adds.iter().all(|&n| n > 0), "{adds:?}");
    // Emptied while growing again, then grown to the end.
    while ns.doubling(dir).is_none() {
        let name = format!("f{i}");
        i += 1;
        let ino = file(&mut ns, &format!("d/{name}"));
        model.insert(name.into_bytes(), ino);
    }
    for name in std::mem::take(&mut model).into_keys() {
        unlink(
            &mut ns,
            &format!("d/{}", String::from_utf8_lossy(&name)),
            false,
        );
        gone.push(name);
    }
    assert!(ns.doubling(dir).is_some());
    check(&ns, dir, &model, &gone);
    while ns.grow_step(7) {}
    assert_eq!(bits(&ns, dir), 11);
    check(&ns, dir, &model, &gone);
}

#[test]
fn an_add_migrates_at_most_a_step_and_a_doubling_ends_well_before_the_next_is_due() {
    let mut ns = ns();
    mkdir(&mut ns, "d");
    let dir = dir_of(&ns, "d");
    let mut expected = 0u64;
    let mut steps = vec![0u32; ix(GROW_STEP) + 1];
    for i in 0..21_000 {
        let before = ns.doublings.migrated;
        let old_bits = bits(&ns, dir);
        let pending = ns.doubling(dir);
        file(&mut ns, &format!("d/f{i}"));
        let moved = ns.doublings.migrated - before;
        assert!(moved <= GROW_STEP, "create {i} migrated {moved} buckets");
        steps[ix(moved)] += 1;
        // A doubling under way, or starting, moves a whole step unless its
        // last buckets are fewer.
        if let Some((_, next)) = pending {
            assert_eq!(moved, GROW_STEP.min((1 << old_bits) - next));
        }
        let entries = ns.reader().attr(dir).unwrap().entries;
        match ns.doubling(dir) {
            Some((table, next)) => {
                let b = bits(&ns, dir);
                assert_eq!(ns.arena.get(table.bits()), u64::from(b) + 1);
                assert!(next > 0 && next < 1 << b);
                // Within a step per add of where it started: a quarter of
                // the way to the next doubling.
                assert!(
                    entries <= (LOAD << b) + (1 << b) / GROW_STEP,
                    "{entries} entries, {b} bits"
                );
            }
            None => assert!(entries <= LOAD << bits(&ns, dir)),
        }
        if bits(&ns, dir) > old_bits {
            expected += 1 << old_bits;
        }
    }
    assert_eq!(bits(&ns, dir), 15);
    // Every old bucket of every doubling migrated once, by the adds alone.
    assert_eq!(
        ns.doublings.migrated,
        expected + ns.doubling(dir).map_or(0, |d| d.1)
    );
    assert!(steps[ix(GROW_STEP)] > 1000, "{steps:?}");
    assert_eq!(problems(&ns), Vec::<String>::new());
}

#[test]
fn a_doubling_past_its_next_threshold_ends_before_another_starts() {
    let mut ns = ns();
    mkdir(&mut ns, "d");
    let dir = dir_of(&ns, "d");
    let mut model = BTreeMap::new();
    let mut i = 0;
    let mut add = |ns: &mut Namespace, model: &mut BTreeMap<Vec<u8>, u64>| {
        let name = format!("f{i}");
        i += 1;
        let ino = file(ns, &format!("d/{name}"));
        model.insert(name.into_bytes(), ino);
    };
    for _ in 0..40 {
        add(&mut ns, &mut model);
    }
    // Adds that migrate nothing: the doubling that starts stays where it
    // is while the entries pass twice its old table's size.
    ns.doublings.per_add = 0;
    while ns.doubling(dir).is_none() {
        add(&mut ns, &mut model);
    }
    let b = bits(&ns, dir);
    let started = ns.doubling(dir).unwrap();
    assert_eq!(started.1, 0);
    while model.len() as u64 <= 2 * (LOAD << (b + 1)) {
        add(&mut ns, &mut model);
        assert_eq!(ns.doubling(dir), Some(started));
        assert_eq!(bits(&ns, dir), b);
    }
    check(&ns, dir, &model, &[]);
    // Stepping again, it ends first, with its own table...
    ns.doublings.per_add = GROW_STEP;
    while ns.doubling(dir).is_some() {
        add(&mut ns, &mut model);
    }
    assert_eq!(bits(&ns, dir), b + 1);
    assert_eq!(ns.arena.get(dir.buckets()), started.0.get());
    check(&ns, dir, &model, &[]);
    // ...and the next add starts the next doubling.
    add(&mut ns, &mut model);
    let (next_table, _) = ns.doubling(dir).unwrap();
    assert_eq!(ns.arena.get(next_table.bits()), u64::from(b) + 2);
    check(&ns, dir, &model, &[]);
}

/// A directory half-way through a doubling: `entries` files made, of
/// which those at every `keep`th index stay (none if `keep` is 0).
fn growing_dir(ns: &mut Namespace, path: &str, entries: u64, keep: u64) -> InodeOff {
    mkdir(ns, path);
    let dir = dir_of(ns, path);
    for i in 0..entries {
        file(ns, &format!("{path}/f{i}"));
    }
    let (_, next) = ns.doubling(dir).expect("a doubling under way");
    assert!(next > 0 && next < 1 << bits(ns, dir));
    for i in (0..entries).filter(|i| keep == 0 || i % keep != 0) {
        unlink(ns, &format!("{path}/f{i}"), false);
    }
    dir
}

#[test]
fn a_directory_removed_while_growing_leaves_nothing_behind() {
    let mut ns = ns();
    // One round: a directory emptied and removed mid-doubling, and
    // another replaced by a rename while it is.
    let round = |ns: &mut Namespace| {
        let d = growing_dir(ns, "d", 300, 0);
        assert!(ns.doubling(d).is_some());
        unlink(ns, "d", true);
        mkdir(ns, "src");
        let e = growing_dir(ns, "e", 300, 0);
        assert!(ns.doubling(e).is_some());
        let req = Request::Rename {
            from: Entry::Path(b"src"),
            to: Entry::Path(b"e"),
            noreplace: false,
            hint_from: None,
            hint_to: None,
        };
        ns.execute(&req, ME).unwrap();
        assert!(ns.doublings.dirs.is_empty());
        assert_eq!(problems(ns), Vec::<String>::new());
        unlink(ns, "e", true);
        assert_eq!(problems(ns), Vec::<String>::new());
    };
    round(&mut ns);
    reclaim_all(&mut ns);
    let used = ns.arena.used();
    // The same again takes only what the first round freed: a table or a
    // sentinel left behind would have taken fresh space.
    round(&mut ns);
    reclaim_all(&mut ns);
    assert_eq!(ns.arena.used(), used);
}

/// Removing a directory that held many entries retires its sentinels a
/// step at a time; its inode is not reused meanwhile, and once the steps
/// are done everything it took is free again.
#[test]
fn a_removed_directory_is_retired_a_step_at_a_time() {
    let round = |ns: &mut Namespace| {
        let d = mkdir(ns, "d");
        let d_inode = dir_of(ns, "d");
        for i in 0..5000 {
            file(ns, &format!("d/f{i}"));
        }
        while ns.grow_step(1 << 20) {}
        let buckets = 1u64 << bits(ns, d_inode);
        assert!(buckets >= 4096, "{buckets} buckets");
        for i in 0..5000 {
            unlink(ns, &format!("d/f{i}"), false);
        }
        reclaim_all(ns);
        unlink(ns, "d", true);
        assert!(ns.reader().inode_by_ino(Ino::new(d)).is_null());
        // The removal itself retired none of the sentinels.
        assert!(ns.arena.retired() < 8, "{}", ns.arena.retired());
        let mut steps = 0;
        while ns.dismantle_step(100).unwrap() {
            steps += 1;
            // Not reused while its nodes wait: a directory made now gets
            // another inode.
            let epoch = ns.advance_epoch().unwrap();
            ns.free_retired(epoch).unwrap();
            mkdir(ns, "e");
            assert_ne!(dir_of(ns, "e"), d_inode);
            unlink(ns, "e", true);
        }
        assert!(
            steps >= buckets / 100 - 1,
            "{steps} steps for {buckets} sentinels"
        );
        assert_eq!(problems(ns), Vec::<String>::new());
    };
    let mut ns = ns();
    round(&mut ns);
    reclaim_all(&mut ns);
    let used = ns.arena.used();
    // The same again takes only what the first round freed: a sentinel,
    // table or inode left behind would have taken fresh space.
    round(&mut ns);
    reclaim_all(&mut ns);
    assert_eq!(ns.arena.used(), used);
}

#[test]
fn a_directory_with_entries_is_not_removed_while_growing() {
    let mut ns = ns();
    let d = growing_dir(&mut ns, "d", 300, 100);
    let req = Request::Unlink {
        at: Entry::Path(b"d"),
        rmdir: true,
        hint: None,
    };
    assert_eq!(ns.execute(&req, ME), Err(Errno::ENOTEMPTY));
    assert!(ns.doubling(d).is_some());
    assert_eq!(problems(&ns), Vec::<String>::new());
}

#[test]
fn idle_steps_end_every_doubling_within_their_budget() {
    let mut ns = ns();
    let a = growing_dir(&mut ns, "a", 600, 3);
    let b = growing_dir(&mut ns, "b", 150, 1);
    let left = |ns: &Namespace| {
        [a, b]
            .iter()
            .filter_map(|&d| ns.doubling(d).map(|(_, next)| (1 << bits(ns, d)) - next))
            .sum::<u64>()
    };
    let mut total = left(&ns);
    assert!(total > 10);
    loop {
        let before = ns.doublings.migrated;
        let more = ns.grow_step(10);
        assert_eq!(ns.doublings.migrated - before, 10.min(total));
        total = left(&ns);
        assert_eq!(more, total > 0);
        assert_eq!(problems(&ns), Vec::<String>::new());
        if !more {
            break;
        }
    }
    assert!(ns.doubling(a).is_none() && ns.doubling(b).is_none());
    assert!(!ns.grow_step(10));
}

#[test]
fn a_namespace_retired_into_its_store_mid_doubling_loads_whole() {
    use kucofs_common::format::meta::BatchWriter;
    use kucofs_common::format::Geometry;
    use kucofs_common::pm::Region;
    let g = Geometry::for_size(64 << 20).unwrap();
    let mut ns = Namespace::with_store(ME, 1, &g).unwrap();
    let mut pages = crate::pages::Pages::new(&g, [], []).unwrap();
    // Stock for every store page the files below call for.
    for _ in 0..64 {
        let p = pages.take_meta().unwrap();
        ns.store_mut().add_stock(p);
    }
    let d = growing_dir(&mut ns, "d", 550, 2);
    assert!(ns.doubling(d).is_some());
    let entries = |ns: &Namespace| {
        let mut out = BTreeSet::new();
        ns.walk(|_, _| {}, |p, n, i| assert!(out.insert((p, n.to_vec(), i))));
        out
    };
    let mut scanned = BTreeSet::new();
    ns.for_each_entry(|p, n, i| assert!(scanned.insert((p, n.to_vec(), i))));
    assert_eq!(scanned, entries(&ns));
    // The store written as a retirement writes it, then loaded back.
    let tmp = tempfile::tempdir().unwrap();
    let region = Region::create(&tmp.path().join("img"), g.size, false).unwrap();
    let mut batch = BatchWriter::new();
    crate::store::retire(&mut ns, &mut pages, &mut batch, &|_| true, u64::MAX).unwrap();
    crate::volume::apply_batch(&region, &g, batch.bytes()).unwrap();
    let read_at = |off: u64, buf: &mut [u8]| region.read(off, buf).is_ok();
    let (loaded, _) = crate::store::load(&g, &read_at).unwrap();
    assert_eq!(entries(&loaded), entries(&ns));
    assert_eq!(problems(&loaded), Vec::<String>::new());
}

#[test]
fn fsck_reports_a_split_bucket_without_its_new_sentinel() {
    let mut ns = ns();
    let d = growing_dir(&mut ns, "d", 300, 1);
    let (table, next) = ns.doubling(d).unwrap();
    assert_eq!(problems(&ns), Vec::<String>::new());
    // The new table's slot for the upper half of the last split bucket
    // names the lower half's sentinel instead.
    let b = next - 1;
    let low = ns.arena.get(table.slot(2 * b));
    ns.arena.put(table.slot(2 * b + 1), low).unwrap();
    assert_eq!(
        problems(&ns),
        [format!(
            "directory {}: bucket {b} is not split at its new sentinel",
            ns.reader().ino(d)
        )]
    );
}
