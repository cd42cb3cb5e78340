//! Permission checks of changes (ARCHITECTURE.md §6): what a caller that
//! is not root may do, in the order Linux checks it.

use kucofs_common::access::{MAY_READ, MAY_WRITE};
use kucofs_common::proto::{At, Entry, SetAttrs};

use super::*;

const ROOT: Creds = Creds::new(0, 0);
const ME: Creds = Creds::new(1000, 100);

/// A namespace whose root (0755) is root's, where root made `nodes`:
/// (path, mode with type bits, owner, symlink target).
fn ns_with(nodes: &[(&str, u32, u32, &str)]) -> Namespace {
    let mut ns = Namespace::new(ROOT, 1).unwrap();
    ns.set_protected(Protected::ALL);
    for &(path, mode, uid, target) in nodes {
        let req = Request::Create {
            at: Entry::Path(path.as_bytes()),
            mode: mode & libc::S_IFMT | 0o700,
            target: target.as_bytes(),
            hint: None,
        };
        ns.execute(&req, ROOT).unwrap();
        let attrs = SetAttrs {
            mode: (mode & libc::S_IFMT != libc::S_IFLNK).then_some(mode & 0o7777),
            uid: Some(uid),
            ..SetAttrs::default()
        };
        set_attr(&mut ns, path, attrs, TimesNow::default(), ROOT).unwrap();
    }
    ns
}

const DIR: u32 = libc::S_IFDIR;
const REG: u32 = libc::S_IFREG;
const LNK: u32 = libc::S_IFLNK;

fn set_attr(
    ns: &mut Namespace,
    path: &str,
    attrs: SetAttrs,
    now: TimesNow,
    creds: Creds,
) -> Result<Option<Node>, Errno> {
    let req = Request::SetAttr {
        at: At::Path {
            path: path.as_bytes(),
            follow: false,
        },
        attrs,
        now,
    };
    ns.execute(&req, creds)
}

fn create(ns: &mut Namespace, path: &str, mode: u32) -> Result<Option<Node>, Errno> {
    let req = Request::Create {
        at: Entry::Path(path.as_bytes()),
        mode,
        target: b"",
        hint: None,
    };
    ns.execute(&req, ME)
}

fn unlink(ns: &mut Namespace, path: &str, rmdir: bool) -> Result<Option<Node>, Errno> {
    let req = Request::Unlink {
        at: Entry::Path(path.as_bytes()),
        rmdir,
        hint: None,
    };
    ns.execute(&req, ME)
}

fn rename(ns: &mut Namespace, from: &str, to: &str) -> Result<Option<Node>, Errno> {
    let req = Request::Rename {
        from: Entry::Path(from.as_bytes()),
        to: Entry::Path(to.as_bytes()),
        noreplace: false,
        hint_from: None,
        hint_to: None,
    };
    ns.execute(&req, ME)
}

fn link(ns: &mut Namespace, from: &str, to: &str) -> Result<Option<Node>, Errno> {
    let req = Request::Link {
        from: At::Path {
            path: from.as_bytes(),
            follow: false,
        },
        to: Entry::Path(to.as_bytes()),
        hint: None,
    };
    ns.execute(&req, ME)
}

fn attr(ns: &Namespace, path: &str) -> InodeAttr {
    let r = ns.reader();
    r.attr(r.resolve(path.as_bytes(), false).unwrap()).unwrap()
}

#[test]
fn every_directory_walked_needs_search_permission() {
    let mut ns = ns_with(&[
        ("pub", DIR | 0o777, 0, ""),
        ("pub/closed", DIR | 0o776, 0, ""),
        ("pub/closed/f", REG | 0o666, 1000, ""),
        ("pub/via", LNK, 0, "closed/f"),
        ("pub/up", LNK, 0, "closed/.."),
    ]);
    let as_me = |ns: &Namespace, p: &str, follow| ns.resolve_as(p.as_bytes(), follow, &ME);
    assert_eq!(as_me(&ns, "pub/closed/f", true), Err(Errno::EACCES));
    assert_eq!(as_me(&ns, "pub/closed/..", true), Err(Errno::EACCES));
    assert_eq!(as_me(&ns, "pub/closed/.", true), Err(Errno::EACCES));
    // Inside a symlink's target too, but not to name the link itself.
    assert_eq!(as_me(&ns, "pub/via", true), Err(Errno::EACCES));
    assert_eq!(as_me(&ns, "pub/up/pub", true), Err(Errno::EACCES));
    assert!(as_me(&ns, "pub/via", false).is_ok());
    // The directory itself is found: it is looked up in "pub".
    assert!(as_me(&ns, "pub/closed", true).is_ok());
    assert!(as_me(&ns, "/", true).is_ok());
    // Root searches any directory.
    assert!(ns.resolve_as(b"pub/via", true, &ROOT).is_ok());
    // Every change through it.
    assert_eq!(
        create(&mut ns, "pub/closed/g", REG | 0o644),
        Err(Errno::EACCES)
    );
    assert_eq!(unlink(&mut ns, "pub/closed/f", false), Err(Errno::EACCES));
    assert_eq!(rename(&mut ns, "pub/closed/f", "pub/g"), Err(Errno::EACCES));
    assert_eq!(
        rename(&mut ns, "pub/via", "pub/closed/g"),
        Err(Errno::EACCES)
    );
    assert_eq!(link(&mut ns, "pub/closed/f", "pub/g"), Err(Errno::EACCES));
    let chmod = SetAttrs {
        mode: Some(0o600),
        ..SetAttrs::default()
    };
    let now = TimesNow::default();
    assert_eq!(
        set_attr(&mut ns, "pub/closed/f", chmod, now, ME),
        Err(Errno::EACCES)
    );
    // Looked up in a searchable parent, the directory is only not ME's.
    assert_eq!(
        set_attr(&mut ns, "pub/closed", chmod, now, ME),
        Err(Errno::EPERM)
    );
}

#[test]
fn a_final_symlink_in_an_open_sticky_directory_is_protected() {
    let mut ns = ns_with(&[
        ("tmp", DIR | 0o1777, 0, ""),
        ("tmp/f", REG | 0o666, 0, ""),
        ("tmp/l", LNK, 2000, "f"),
        ("tmp/d", LNK, 2000, "."),
        ("tmp/root", LNK, 0, "f"),
    ]);
    assert_eq!(ns.resolve_as(b"tmp/l", true, &ME), Err(Errno::EACCES));
    assert_eq!(ns.resolve_as(b"tmp/l", true, &ROOT), Err(Errno::EACCES));
    // One the directory's owner owns.
    assert!(ns.resolve_as(b"tmp/root", true, &ME).is_ok());
    assert_eq!(ns.resolve_as(b"tmp/l/", true, &ME), Err(Errno::EACCES));
    // Only where the walk ends.
    assert!(ns.resolve_as(b"tmp/d/f", true, &ME).is_ok());
    assert!(ns.resolve_as(b"tmp/l", false, &ME).is_ok());
    ns.set_protected(Protected::NONE);
    assert!(ns.resolve_as(b"tmp/l", true, &ME).is_ok());
}

#[test]
fn removals_check_the_sticky_rule_and_report_in_linuxs_order() {
    let mut ns = ns_with(&[
        ("ro", DIR | 0o555, 0, ""),
        ("ro/f", REG | 0o666, 1000, ""),
        ("ro/d", DIR | 0o777, 1000, ""),
        ("tmp", DIR | 0o1777, 0, ""),
        ("tmp/theirs", REG | 0o666, 0, ""),
        ("tmp/mine", REG | 0o600, 1000, ""),
    ]);
    // A trailing slash first, then permission, then the kind.
    assert_eq!(unlink(&mut ns, "ro/f/", false), Err(Errno::ENOTDIR));
    assert_eq!(unlink(&mut ns, "ro/d/", false), Err(Errno::EISDIR));
    assert_eq!(unlink(&mut ns, "ro/d", false), Err(Errno::EACCES));
    assert_eq!(unlink(&mut ns, "ro/f", true), Err(Errno::EACCES));
    assert_eq!(unlink(&mut ns, "ro/g", false), Err(Errno::ENOENT));
    assert_eq!(unlink(&mut ns, "tmp/theirs", false), Err(Errno::EPERM));
    assert_eq!(rename(&mut ns, "tmp/theirs", "tmp/x"), Err(Errno::EPERM));
    assert_eq!(rename(&mut ns, "tmp/mine", "tmp/theirs"), Err(Errno::EPERM));
    assert_eq!(unlink(&mut ns, "tmp/mine", false), Ok(None));
    assert!(ns.resolve_as(b"tmp/mine", false, &ROOT).is_err());
}

#[test]
fn a_directory_moved_to_another_parent_needs_write_on_itself() {
    let mut ns = ns_with(&[
        ("a", DIR | 0o777, 0, ""),
        ("b", DIR | 0o777, 0, ""),
        ("a/theirs", DIR | 0o755, 0, ""),
        ("a/mine", DIR | 0o755, 1000, ""),
        ("a/f", REG | 0o644, 0, ""),
    ]);
    assert_eq!(rename(&mut ns, "a/theirs", "b/theirs"), Err(Errno::EACCES));
    // Its ".." stays: same parent, no write on it needed; nor for a file.
    assert_eq!(rename(&mut ns, "a/theirs", "a/t2").map(drop), Ok(()));
    assert_eq!(rename(&mut ns, "a/f", "b/f").map(drop), Ok(()));
    assert_eq!(rename(&mut ns, "a/mine", "b/mine").map(drop), Ok(()));
    assert_eq!(attr(&ns, "b").nlink, 3);
}

#[test]
fn creating_needs_write_on_the_parent_after_existence() {
    let mut ns = ns_with(&[
        ("ro", DIR | 0o755, 0, ""),
        ("ro/f", REG | 0o644, 0, ""),
        ("sgid", DIR | 0o2777, 0, ""),
    ]);
    assert_eq!(create(&mut ns, "ro/f", REG | 0o644), Err(Errno::EEXIST));
    assert_eq!(create(&mut ns, "ro/g", REG | 0o644), Err(Errno::EACCES));
    assert_eq!(create(&mut ns, "ro/g", DIR | 0o755), Err(Errno::EACCES));
    assert_eq!(link(&mut ns, "ro/f", "ro/f"), Err(Errno::EEXIST));
    // Made in a set-group-ID directory of a group ME is not in (0): the
    // directory's group, and no set-group-ID program.
    create(&mut ns, "sgid/p", REG | 0o2755).unwrap();
    let a = attr(&ns, "sgid/p");
    assert_eq!((a.mode, a.uid, a.gid), (REG | 0o755, 1000, 0));
    create(&mut ns, "sgid/d", DIR | 0o755).unwrap();
    assert_eq!(attr(&ns, "sgid/d").mode, DIR | 0o2755);
}

#[test]
fn hard_links_to_anothers_file_are_protected() {
    let mut ns = ns_with(&[
        ("pub", DIR | 0o777, 0, ""),
        ("pub/ro", REG | 0o644, 0, ""),
        ("pub/rw", REG | 0o666, 0, ""),
    ]);
    assert_eq!(link(&mut ns, "pub/ro", "pub/l"), Err(Errno::EPERM));
    assert_eq!(link(&mut ns, "pub/rw", "pub/l").map(drop), Ok(()));
    ns.set_protected(Protected::NONE);
    assert_eq!(link(&mut ns, "pub/ro", "pub/l2").map(drop), Ok(()));
    assert_eq!(attr(&ns, "pub/ro").nlink, 2);
}

#[test]
fn times_set_to_now_are_the_changes_time_and_need_write() {
    let mut ns = ns_with(&[("w", REG | 0o666, 0, ""), ("r", REG | 0o644, 0, "")]);
    let none = SetAttrs::default();
    set_attr(&mut ns, "w", none, TimesNow::BOTH, ME).unwrap();
    let a = attr(&ns, "w");
    assert_eq!((a.atime, a.mtime), (a.ctime, a.ctime));
    assert_eq!(
        set_attr(&mut ns, "r", none, TimesNow::BOTH, ME),
        Err(Errno::EACCES)
    );
    let one = TimesNow {
        atime: true,
        mtime: false,
    };
    assert_eq!(set_attr(&mut ns, "w", none, one, ME), Err(Errno::EPERM));
    let explicit = SetAttrs {
        mtime: Some(5),
        ..SetAttrs::default()
    };
    assert_eq!(
        set_attr(&mut ns, "w", explicit, TimesNow::default(), ME),
        Err(Errno::EPERM)
    );
    // A time both set to now and given a value.
    assert_eq!(
        set_attr(&mut ns, "w", explicit, TimesNow::BOTH, ROOT),
        Err(Errno::EINVAL)
    );
    set_attr(&mut ns, "w", explicit, one, ROOT).unwrap();
    let b = attr(&ns, "w");
    assert_eq!((b.atime, b.mtime), (b.ctime, 5));
    assert!(b.ctime > a.ctime);
}

#[test]
fn opens_are_checked_by_the_access_they_ask_for() {
    let ns = ns_with(&[("r", REG | 0o604, 0, ""), ("d", DIR | 0o777, 0, "")]);
    let inode = |p: &str| ns.reader().resolve(p.as_bytes(), false).unwrap();
    assert_eq!(ns.may_open(inode("r"), 0, &ME), Ok(()));
    assert_eq!(
        ns.may_open(inode("r"), open::WRITE, &ME),
        Err(Errno::EACCES)
    );
    let rw = open::WRITE | open::READ;
    assert_eq!(ns.may_open(inode("r"), rw, &ROOT), Ok(()));
    assert_eq!(
        ns.may_open(inode("d"), open::WRITE, &ME),
        Err(Errno::EISDIR)
    );
    // A truncation asks for writing.
    assert_eq!(open::wants(open::TRUNC), MAY_READ | MAY_WRITE);
    assert_eq!(
        ns.may_open(inode("r"), open::TRUNC, &ME),
        Err(Errno::EACCES)
    );
}
