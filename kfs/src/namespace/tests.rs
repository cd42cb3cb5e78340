use kucofs_common::index::layout::{TAG_DIRENT, TAG_INODE};
use kucofs_common::index::BucketTable;
use kucofs_common::proto::{At, Entry, SetAttrs};

use super::*;

const ME: Creds = Creds::new(1000, 100);

fn ns() -> Namespace {
    Namespace::new(ME, 1).unwrap()
}

fn create(ns: &mut Namespace, path: &str) -> Result<Option<Node>, Errno> {
    create_with(ns, path, None)
}

/// A file create that sends `hint` as its pre-located address.
fn create_with(ns: &mut Namespace, path: &str, hint: Option<Hint>) -> Result<Option<Node>, Errno> {
    ns.execute(
        &Request::Create {
            at: Entry::Path(path.as_bytes()),
            mode: libc::S_IFREG | 0o644,
            target: b"",
            hint,
        },
        ME,
    )
}

fn mkdir(ns: &mut Namespace, path: &str) -> Result<Option<Node>, Errno> {
    ns.execute(
        &Request::Create {
            at: Entry::Path(path.as_bytes()),
            mode: libc::S_IFDIR | 0o755,
            target: b"",
            hint: None,
        },
        ME,
    )
}

fn unlink(ns: &mut Namespace, path: &str, rmdir: bool) -> Result<Option<Node>, Errno> {
    ns.execute(
        &Request::Unlink {
            at: Entry::Path(path.as_bytes()),
            rmdir,
            hint: None,
        },
        ME,
    )
}

fn rename(ns: &mut Namespace, from: &str, to: &str) -> Result<Option<Node>, Errno> {
    ns.execute(
        &Request::Rename {
            from: Entry::Path(from.as_bytes()),
            to: Entry::Path(to.as_bytes()),
            noreplace: false,
            hint_from: None,
            hint_to: None,
        },
        ME,
    )
}

fn names(ns: &Namespace, dir: &str) -> Vec<String> {
    let r = ns.reader();
    let d = r.resolve(dir.as_bytes(), true).unwrap();
    let mut out = Vec::new();
    r.read_dir(d, None, usize::MAX, &mut out);
    let mut v: Vec<String> = out
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .collect();
    v.sort();
    v
}

/// What a client would send: the parent and the search result for `path`.
fn hint_for(ns: &Namespace, path: &str) -> Hint {
    ns.reader().locate(path.as_bytes()).unwrap()
}

#[test]
fn a_tree_is_built_read_and_torn_down() {
    let mut ns = ns();
    mkdir(&mut ns, "a").unwrap();
    mkdir(&mut ns, "a/b").unwrap();
    let f = create(&mut ns, "a/b/f").unwrap().unwrap();
    assert_eq!(names(&ns, "a"), ["b"]);
    assert_eq!(names(&ns, "/a/b/"), ["f"]);
    let r = ns.reader();
    let attr = r.attr(r.resolve(b"a//b/./f", true).unwrap()).unwrap();
    assert_eq!(
        (attr.ino, attr.uid, attr.gid, attr.nlink),
        (f.ino, 1000, 100, 1)
    );
    assert_eq!(attr.mode, libc::S_IFREG | 0o644);
    let a = r.attr(r.resolve(b"a", true).unwrap()).unwrap();
    assert_eq!((a.nlink, a.entries), (3, 1));
    assert_eq!(r.resolve(b"a/b/..", true).unwrap(), a.offset);
    assert_eq!(r.resolve(b"../../a", true).unwrap(), a.offset);

    assert_eq!(create(&mut ns, "a/b/f").unwrap_err(), Errno::EEXIST);
    assert_eq!(unlink(&mut ns, "a", true).unwrap_err(), Errno::ENOTEMPTY);
    assert_eq!(unlink(&mut ns, "a/b", false).unwrap_err(), Errno::EISDIR);
    assert_eq!(unlink(&mut ns, "a/b/f", true).unwrap_err(), Errno::ENOTDIR);
    assert_eq!(
        unlink(&mut ns, "a/b/f/", false).unwrap_err(),
        Errno::ENOTDIR
    );
    assert_eq!(create(&mut ns, "a/b/f/g").unwrap_err(), Errno::ENOTDIR);
    assert_eq!(create(&mut ns, "nope/g").unwrap_err(), Errno::ENOENT);
    assert_eq!(
        create(&mut ns, &"x".repeat(256)).unwrap_err(),
        Errno::ENAMETOOLONG
    );
    unlink(&mut ns, "a/b/f", false).unwrap();
    unlink(&mut ns, "a/b", true).unwrap();
    unlink(&mut ns, "a", true).unwrap();
    assert!(names(&ns, "/").is_empty());
    assert_eq!(ns.inode_count(), 1);
    let root = ns.reader().attr(ns.reader().root()).unwrap();
    assert_eq!((root.nlink, root.entries), (2, 0));
}

#[test]
fn symlinks_are_followed_within_the_limit() {
    let mut ns = ns();
    mkdir(&mut ns, "d").unwrap();
    create(&mut ns, "d/f").unwrap();
    let sym = |ns: &mut Namespace, path: &str, target: &str| {
        ns.execute(
            &Request::Create {
                at: Entry::Path(path.as_bytes()),
                mode: libc::S_IFLNK | 0o777,
                target: target.as_bytes(),
                hint: None,
            },
            ME,
        )
    };
    sym(&mut ns, "l", "d").unwrap();
    sym(&mut ns, "loop", "loop").unwrap();
    sym(&mut ns, "abs", "/d/f").unwrap();
    let r = ns.reader();
    let f = r.resolve(b"d/f", true).unwrap();
    assert_eq!(r.resolve(b"l/f", true).unwrap(), f);
    assert_eq!(r.resolve(b"abs", true).unwrap(), f);
    let l = r.resolve(b"l", false).unwrap();
    assert_eq!(r.kind(l), Some(Kind::Symlink));
    assert_eq!(r.readlink(l).unwrap(), b"d");
    assert_eq!(r.attr(l).unwrap().size, 1);
    assert_eq!(r.resolve(b"loop", true).unwrap_err(), Errno::ELOOP);
    assert_eq!(r.resolve(b"loop/x", true).unwrap_err(), Errno::ELOOP);
    assert_eq!(r.resolve(b"abs/", true).unwrap_err(), Errno::ENOTDIR);
    assert_eq!(sym(&mut ns, "e", "").unwrap_err(), Errno::ENOENT);
    // Creating through a dangling symlink with O_EXCL semantics: EEXIST.
    sym(&mut ns, "dangling", "nowhere").unwrap();
    assert_eq!(create(&mut ns, "dangling").unwrap_err(), Errno::EEXIST);
}

#[test]
fn renames_follow_posix() {
    let mut ns = ns();
    mkdir(&mut ns, "a").unwrap();
    mkdir(&mut ns, "a/sub").unwrap();
    mkdir(&mut ns, "b").unwrap();
    create(&mut ns, "f").unwrap();
    create(&mut ns, "g").unwrap();
    assert_eq!(rename(&mut ns, "a", "a/sub/x").unwrap_err(), Errno::EINVAL);
    assert_eq!(rename(&mut ns, "a/sub", "a").unwrap_err(), Errno::ENOTEMPTY);
    assert_eq!(rename(&mut ns, "f", "a").unwrap_err(), Errno::EISDIR);
    assert_eq!(rename(&mut ns, "b", "f").unwrap_err(), Errno::ENOTDIR);
    assert_eq!(rename(&mut ns, "missing", "x").unwrap_err(), Errno::ENOENT);
    assert_eq!(rename(&mut ns, "f", "g/").unwrap_err(), Errno::ENOTDIR);
    assert_eq!(rename(&mut ns, "b", "a").unwrap_err(), Errno::ENOTEMPTY);
    let noreplace = Request::Rename {
        from: Entry::Path(b"f"),
        to: Entry::Path(b"g"),
        noreplace: true,
        hint_from: None,
        hint_to: None,
    };
    assert_eq!(ns.execute(&noreplace, ME).unwrap_err(), Errno::EEXIST);

    // File over file: the target's inode goes away.
    let g_ino = ns.reader().ino(ns.reader().resolve(b"g", true).unwrap());
    let f = rename(&mut ns, "f", "g").unwrap().unwrap();
    assert_eq!(names(&ns, "/"), ["a", "b", "g"]);
    assert_eq!(ns.reader().resolve(b"g", true).unwrap(), f.inode);
    assert!(ns.reader().inode_by_ino(g_ino).is_null());
    // Directory across directories: link counts and "..".
    rename(&mut ns, "a/sub", "b/sub2").unwrap();
    let r = ns.reader();
    let (a, b) = (
        r.resolve(b"a", true).unwrap(),
        r.resolve(b"b", true).unwrap(),
    );
    assert_eq!((r.attr(a).unwrap().nlink, r.attr(b).unwrap().nlink), (2, 3));
    assert_eq!(r.resolve(b"b/sub2/..", true).unwrap(), b);
    // Directory over an empty directory.
    rename(&mut ns, "b/sub2", "a").unwrap();
    assert_eq!(names(&ns, "/"), ["a", "b", "g"]);
    let r = ns.reader();
    let b = r.resolve(b"b", true).unwrap();
    assert_eq!(r.attr(b).unwrap().nlink, 2);
    assert_eq!(r.attr(r.root()).unwrap().nlink, 4);
    // Hard links to one inode: renaming one onto the other changes nothing.
    ns.execute(
        &Request::Link {
            from: At::Path {
                path: b"g",
                follow: false,
            },
            to: Entry::Path(b"h"),
            hint: None,
        },
        ME,
    )
    .unwrap();
    rename(&mut ns, "g", "h").unwrap();
    assert_eq!(names(&ns, "/"), ["a", "b", "g", "h"]);
    let r = ns.reader();
    assert_eq!(r.attr(r.resolve(b"h", true).unwrap()).unwrap().nlink, 2);
    assert_eq!(
        ns.execute(
            &Request::Link {
                from: At::Path {
                    path: b"a",
                    follow: false
                },
                to: Entry::Path(b"z"),
                hint: None
            },
            ME
        )
        .unwrap_err(),
        Errno::EPERM
    );
}

#[test]
fn setattr_changes_permission_bits_owner_and_times() {
    let mut ns = ns();
    create(&mut ns, "f").unwrap();
    let req = Request::SetAttr {
        at: At::Path {
            path: b"f",
            follow: true,
        },
        attrs: SetAttrs {
            mode: Some(0o4711),
            uid: Some(7),
            gid: Some(8),
            atime: Some(11),
            mtime: Some(22),
        },
        now: Default::default(),
    };
    // Only root gives a file away.
    assert_eq!(ns.execute(&req, ME).unwrap_err(), Errno::EPERM);
    ns.execute(&req, Creds::default()).unwrap();
    let r = ns.reader();
    let a = r.attr(r.resolve(b"f", true).unwrap()).unwrap();
    assert_eq!(
        (a.mode, a.uid, a.gid, a.atime, a.mtime),
        (libc::S_IFREG | 0o4711, 7, 8, 11, 22)
    );
    let bad = Request::SetAttr {
        at: At::Path {
            path: b"f",
            follow: true,
        },
        attrs: SetAttrs {
            mode: Some(0o170000),
            ..SetAttrs::default()
        },
        now: Default::default(),
    };
    assert_eq!(ns.execute(&bad, ME).unwrap_err(), Errno::EINVAL);
}

#[test]
fn good_hints_are_used_and_forged_ones_fall_back_to_a_search() {
    let mut ns = ns();
    mkdir(&mut ns, "d").unwrap();
    for i in 0..200 {
        create(&mut ns, &format!("d/f{i}")).unwrap();
    }
    let before = ns.hint_stats();
    let h = hint_for(&ns, "d/new");
    create_with(&mut ns, "d/new", Some(h)).unwrap();
    assert_eq!(ns.hint_stats().used, before.used + 1);

    let h = hint_for(&ns, "d/f7");
    ns.execute(
        &Request::Unlink {
            at: Entry::Path(b"d/f7"),
            rmdir: false,
            hint: Some(h),
        },
        ME,
    )
    .unwrap();
    assert_eq!(ns.hint_stats().used, before.used + 2);

    // Forgeries of a hint built for the very name created (so that only
    // the forgery can make it stale): every one must be detected, and the
    // request still succeed. (`dir_gen` is not forged: Kfs checks the
    // directory's item itself, not that field.)
    let used = ns.arena().used();
    let root = ns.reader().root();
    let other_list = ns.reader().dir_head(root);
    let forge = |good: Hint| {
        [
            // Out of range, into the middle of an item, at an inode, past
            // the end of the arena.
            Hint {
                pred: DirentOff::new(u64::MAX),
                ..good
            },
            Hint {
                pred: DirentOff::new(good.pred.get() + 8),
                ..good
            },
            Hint {
                pred: DirentOff::new(good.dir.get()),
                ..good
            },
            Hint {
                pred: DirentOff::new(used + 4096),
                ..good
            },
            Hint {
                dir: InodeOff::new(good.dir.get() + 16),
                ..good
            },
            Hint {
                dir: InodeOff::NULL,
                ..good
            },
            Hint { dir: root, ..good },
            // A node of another directory's list.
            Hint {
                pred: other_list,
                ..good
            },
        ]
    };
    let forgeries = forge(hint_for(&ns, "d/x")).len();
    for i in 0..forgeries {
        let path = format!("d/x{i}");
        let h = forge(hint_for(&ns, &path))[i];
        let stale_before = ns.hint_stats().stale;
        let reply = create_with(&mut ns, &path, Some(h)).unwrap().unwrap();
        let r = ns.reader();
        // Even a hint naming another real directory: the file lands where
        // the path says.
        assert_eq!(
            r.resolve(path.as_bytes(), true).unwrap(),
            reply.inode,
            "forgery {i}"
        );
        assert!(r.is_live(reply.inode.get(), TAG_INODE, Some(reply.gen)));
        assert_eq!(
            ns.hint_stats().stale,
            stale_before + 1,
            "forgery {i} not detected"
        );
    }
    // The same hint unforged is used: the count tells the two apart.
    let before = ns.hint_stats();
    let h = hint_for(&ns, "d/honest");
    create_with(&mut ns, "d/honest", Some(h)).unwrap();
    assert_eq!(ns.hint_stats().stale, before.stale);
    assert_eq!(ns.hint_stats().used, before.used + 1);
    // A freed entry as the "found" of an unlink hint.
    let h = hint_for(&ns, "d/f8");
    unlink(&mut ns, "d/f8", false).unwrap();
    let epoch = ns.advance_epoch().unwrap();
    ns.free_retired(epoch).unwrap();
    assert!(!ns.reader().is_live(h.found.get(), TAG_DIRENT, None));
    let req = Request::Unlink {
        at: Entry::Path(b"d/f8"),
        rmdir: false,
        hint: Some(h),
    };
    assert_eq!(ns.execute(&req, ME).unwrap_err(), Errno::ENOENT);
    assert_eq!(names(&ns, "d").len(), 200 - 2 + 1 + forgeries + 1);
}

#[test]
fn a_large_directory_lists_in_key_order_and_resumes_by_key() {
    let mut ns = ns();
    mkdir(&mut ns, "big").unwrap();
    for i in 0..5000 {
        create(&mut ns, &format!("big/file-{i}")).unwrap();
    }
    let r = ns.reader();
    let d = r.resolve(b"big", true).unwrap();
    let mut all = Vec::new();
    let mut after: Option<(u64, Vec<u8>)> = None;
    loop {
        let mut batch = Vec::new();
        let more = r.read_dir(
            d,
            after.as_ref().map(|(h, n)| (*h, n.as_slice())),
            333,
            &mut batch,
        );
        after = batch.last().map(|e| (e.hash, e.name.clone()));
        all.extend(batch);
        if !more {
            break;
        }
    }
    assert_eq!(all.len(), 5000);
    assert!(all
        .windows(2)
        .all(|w| (w[0].hash, &w[0].name) < (w[1].hash, &w[1].name)));
    for i in (0..5000).step_by(2) {
        unlink(&mut ns, &format!("big/file-{i}"), false).unwrap();
    }
    assert_eq!(names(&ns, "big").len(), 2500);
    assert_eq!(
        ns.reader()
            .attr(ns.reader().resolve(b"big", true).unwrap())
            .unwrap()
            .entries,
        2500
    );
}

#[test]
fn replaying_records_twice_changes_nothing_the_second_time() {
    let mut a = ns();
    let mut log = Vec::new();
    for req in [
        Request::Create {
            at: Entry::Path(b"d"),
            mode: libc::S_IFDIR | 0o700,
            target: b"",
            hint: None,
        },
        Request::Create {
            at: Entry::Path(b"d/f"),
            mode: libc::S_IFREG | 0o600,
            target: b"",
            hint: None,
        },
        Request::Link {
            from: At::Path {
                path: b"d/f",
                follow: false,
            },
            to: Entry::Path(b"g"),
            hint: None,
        },
        Request::Rename {
            from: Entry::Path(b"g"),
            to: Entry::Path(b"d/h"),
            noreplace: false,
            hint_from: None,
            hint_to: None,
        },
        Request::Unlink {
            at: Entry::Path(b"d/f"),
            rmdir: false,
            hint: None,
        },
    ] {
        if let Outcome::Change(p) = a.prepare(&req, ME).unwrap() {
            log.push(p.record.clone().into_owned());
            a.commit(p).unwrap();
        }
    }
    let mut b = Namespace::new(ME, 1).unwrap();
    for rec in log.iter().chain(log.iter()) {
        b.apply(rec).unwrap();
    }
    assert_eq!(names(&b, "d"), ["h"]);
    assert_eq!(names(&b, "/"), ["d"]);
    let r = b.reader();
    assert_eq!(r.attr(r.resolve(b"d/h", true).unwrap()).unwrap().nlink, 1);
}

#[test]
fn requests_whose_every_address_is_stale_still_do_the_right_thing() {
    let mut ns = ns();
    mkdir(&mut ns, "d").unwrap();
    for i in 0..300 {
        create(&mut ns, &format!("d/f{i}")).unwrap();
    }
    // Addresses for unlinking every file, taken now...
    let hints: Vec<Hint> = (0..300)
        .map(|i| hint_for(&ns, &format!("d/f{i}")))
        .collect();
    // ...made stale: every entry is replaced by a new one of the same name,
    // and every old item is reclaimed.
    for i in 0..300 {
        unlink(&mut ns, &format!("d/f{i}"), false).unwrap();
        create(&mut ns, &format!("d/f{i}")).unwrap();
    }
    let epoch = ns.advance_epoch().unwrap();
    ns.free_retired(epoch).unwrap();
    let stale_before = ns.hint_stats().stale;
    for (i, h) in hints.iter().enumerate() {
        let path = format!("d/f{i}");
        let req = Request::Unlink {
            at: Entry::Path(path.as_bytes()),
            rmdir: false,
            hint: Some(*h),
        };
        ns.execute(&req, ME).unwrap();
        assert_eq!(
            ns.reader().resolve(path.as_bytes(), true),
            Err(Errno::ENOENT)
        );
    }
    assert_eq!(ns.hint_stats().stale, stale_before + 300);
    assert!(names(&ns, "d").is_empty());
    // And creates with insertion points taken before 300 other inserts.
    let hints: Vec<Hint> = (0..300)
        .map(|i| hint_for(&ns, &format!("d/g{i}")))
        .collect();
    for i in 0..300 {
        create(&mut ns, &format!("d/x{i}")).unwrap();
    }
    for (i, h) in hints.iter().enumerate() {
        let path = format!("d/g{i}");
        create_with(&mut ns, &path, Some(*h)).unwrap();
    }
    let listed = names(&ns, "d");
    assert_eq!(listed.len(), 600);
    let r = ns.reader();
    let d = r.resolve(b"d", true).unwrap();
    let mut es = Vec::new();
    r.read_dir(d, None, usize::MAX, &mut es);
    assert!(es
        .windows(2)
        .all(|w| (w[0].hash, &w[0].name) < (w[1].hash, &w[1].name)));
}

/// Every record `walk` gives, sorted: inodes as (ino, nlink, target), entries
/// as (parent, name, ino).
type Records = (Vec<(Ino, u32, Option<Vec<u8>>)>, Vec<(Ino, Vec<u8>, Ino)>);

fn records(ns: &Namespace, scan: bool) -> Records {
    let (mut inodes, mut entries) = (Vec::new(), Vec::new());
    let mut on_entry = |p: Ino, n: &[u8], i: Ino| entries.push((p, n.to_vec(), i));
    if scan {
        let target = |a: &InodeAttr| ns.reader().readlink(a.offset);
        ns.for_each_inode(|a| inodes.push((a.ino, a.nlink, target(a))));
        ns.for_each_entry(on_entry);
    } else {
        ns.walk(|a, t| inodes.push((a.ino, a.nlink, t)), &mut on_entry);
    }
    inodes.sort();
    entries.sort();
    (inodes, entries)
}

#[test]
fn the_inode_table_finds_what_a_walk_finds_in_a_grown_directory_with_links() {
    let mut ns = ns();
    mkdir(&mut ns, "big").unwrap();
    mkdir(&mut ns, "big/sub").unwrap();
    mkdir(&mut ns, "emptied").unwrap();
    for i in 0..3000 {
        create(&mut ns, &format!("big/f{i}")).unwrap();
    }
    // Holes in the chains, and in the inode numbers.
    for i in (0..3000).step_by(7) {
        unlink(&mut ns, &format!("big/f{i}"), false).unwrap();
    }
    create(&mut ns, "emptied/x").unwrap();
    unlink(&mut ns, "emptied/x", false).unwrap();
    ns.execute(
        &Request::Link {
            from: At::Path {
                path: b"big/f1",
                follow: false,
            },
            to: Entry::Path(b"big/sub/also-f1"),
            hint: None,
        },
        ME,
    )
    .unwrap();
    ns.execute(
        &Request::Create {
            at: Entry::Path(b"big/sub/link"),
            mode: libc::S_IFLNK | 0o777,
            target: b"../f2",
            hint: None,
        },
        ME,
    )
    .unwrap();
    let walked = records(&ns, false);
    let scanned = records(&ns, true);
    // 3000 - 429 files, 3 directories and the root, one symlink.
    assert_eq!(walked.0.len(), 3000 - 429 + 5);
    assert_eq!(walked.1.len(), 3000 - 429 + 5);
    assert_eq!(scanned, walked);
    // The big directory grew past its first table, so its chains were
    // walked in step.
    let r = ns.reader();
    let big = r.resolve(b"big", true).unwrap();
    let table = BucketTable::new(
        r.mem()
            .load_u64(big.buckets(), std::sync::atomic::Ordering::Acquire),
    );
    assert!(
        r.mem()
            .load_u64(table.bits(), std::sync::atomic::Ordering::Relaxed)
            > 8
    );
}

/// Two names whose hashes share a link tag (the top 28 bits) but differ,
/// the smaller hash first: found by trying names until two collide.
fn names_sharing_a_tag() -> (String, String) {
    use kucofs_common::index::layout::link_tag;
    let mut seen = std::collections::HashMap::new();
    for i in 0u64.. {
        let name = format!("t{i}");
        let hash = name_hash(name.as_bytes());
        if let Some((other, h)) = seen.insert(link_tag(hash), (name.clone(), hash)) {
            if h != hash {
                return if h < hash {
                    (other, name)
                } else {
                    (name, other)
                };
            }
        }
    }
    unreachable!()
}

#[test]
fn names_whose_links_share_a_tag_are_told_apart_by_their_keys() {
    let (low, high) = names_sharing_a_tag();
    let mut ns = ns();
    // The lower key first, then the higher, and the other way round: a
    // search meets a link with its own tag and must read the node to pass
    // it (low, then high) or stop at it (high, then low).
    for (dir, first, second) in [("a", &low, &high), ("b", &high, &low)] {
        mkdir(&mut ns, dir).unwrap();
        create(&mut ns, &format!("{dir}/{first}")).unwrap();
        let d = ns.reader().resolve(dir.as_bytes(), true).unwrap();
        assert!(ns.reader().lookup(d, second.as_bytes()).is_null(), "{dir}");
        // The pre-located place of the second name is checked through the
        // same links, and used.
        let path = format!("{dir}/{second}");
        let used = ns.hint_stats().used;
        let h = hint_for(&ns, &path);
        create_with(&mut ns, &path, Some(h)).unwrap();
        assert_eq!(ns.hint_stats().used, used + 1, "{dir}");
        let r = ns.reader();
        assert_ne!(r.lookup(d, low.as_bytes()), r.lookup(d, high.as_bytes()));
        assert!(!r.lookup(d, low.as_bytes()).is_null(), "{dir}");
        assert!(!r.lookup(d, high.as_bytes()).is_null(), "{dir}");
        let mut want = vec![low.clone(), high.clone()];
        want.sort();
        assert_eq!(names(&ns, dir), want);
        unlink(&mut ns, &format!("{dir}/{first}"), false).unwrap();
        assert!(ns.reader().lookup(d, first.as_bytes()).is_null(), "{dir}");
        assert!(!ns.reader().lookup(d, second.as_bytes()).is_null(), "{dir}");
    }
}

/// A namespace's stamps move forward with every change, even within one
/// tick of the coarse clock, and never run ahead of the precise clock.
#[test]
fn stamps_increase_and_never_pass_the_clock() {
    let mut ns = ns();
    let mut seen = Vec::with_capacity(40_000);
    for _ in 0..40_000 {
        let s = ns.stamp();
        assert!(s <= super::now_ns(), "stamp {s} ahead of the clock");
        seen.push(s);
    }
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "stamps went back or repeated"
    );
}

/// A stamp follows the tick, moves 1 ns past the last stamp within one,
/// and goes back with a clock set back by more than the lead it may take.
#[test]
fn a_stamp_leads_the_tick_by_little_and_follows_a_clock_set_back() {
    let t = 1_000_000_000_000;
    assert_eq!(super::next_stamp(t - 5, t), t);
    assert_eq!(super::next_stamp(t, t), t + 1);
    assert_eq!(super::next_stamp(t + STAMP_LEAD - 1, t), t + STAMP_LEAD);
    assert_eq!(super::next_stamp(t + STAMP_LEAD, t), t);
    assert_eq!(super::next_stamp(t + 3_600_000_000_000, t), t);
}

/// A file system closed and opened again in one process, within one
/// tick of the coarse clock, goes on stamping above its last stamp.
#[test]
fn a_namespace_stamps_above_the_last_one_dropped() {
    let mut before = ns();
    // As after a burst of changes within one tick: a little ahead of it.
    before.last_stamp = super::coarse_ns() + 100;
    let last = before.stamp();
    drop(before);
    let mut after = ns();
    // Its stamps start from the dropped one's, whatever the clock did
    // meanwhile (making a namespace may take longer than a tick).
    assert!(after.last_stamp >= last);
    assert!(after.stamp() > last);
}
