//! Changes and opens addressed by node (ARCHITECTURE.md §6): each gives
//! what its path form gives, a stale node is `ESTALE`, and the node form
//! meets the path form's permission checks and the rule for naming a
//! node without a path (`Volume::may_name`).

use kucofs_common::index::layout::header_gen;
use kucofs_common::index::{Ino, InodeOff, Kind};
use kucofs_common::proto::{open, At, Creds, Entry, Node, OpenAt, Reply, Request, SetAttrs};
use kucofs_common::Errno;

use super::{Caller, Volume};

const ROOT: Caller = Caller {
    client: 0,
    slot: 0,
    creds: Creds::new(0, 0),
};
const USER: Caller = Caller {
    client: 2,
    slot: 1,
    creds: Creds::new(1000, 1000),
};

fn volume(dir: &tempfile::TempDir, name: &str) -> Volume {
    let image = dir.path().join(name);
    crate::mkfs(&image, 16 << 20, false).unwrap();
    let mut v = Volume::open(&image).unwrap();
    v.attach_client(ROOT.client, None, Default::default(), None);
    v.attach_client(USER.client, None, Default::default(), None);
    v
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("kucofs-node-")
        .tempdir_in("/dev/shm")
        .unwrap()
}

/// The node `path` names now (not following a final symlink).
fn node(v: &Volume, path: &[u8]) -> Node {
    let r = v.ns.reader();
    let inode = r.resolve(path, false).unwrap();
    Node {
        ino: r.ino(inode),
        inode,
        gen: header_gen(r.header(inode.get())),
    }
}

fn root(v: &Volume) -> Node {
    node(v, b"/")
}

fn mkdir(v: &mut Volume, path: &[u8], mode: u32, who: Caller) -> Result<Reply, Errno> {
    v.handle(
        &Request::Create {
            at: Entry::Path(path),
            mode: libc::S_IFDIR | mode,
            target: b"",
            hint: None,
        },
        who,
    )
}

fn chmod(v: &mut Volume, at: At<'_>, mode: u32, who: Caller) -> Result<Reply, Errno> {
    v.handle(
        &Request::SetAttr {
            at,
            attrs: SetAttrs {
                mode: Some(mode),
                ..SetAttrs::default()
            },
            now: Default::default(),
        },
        who,
    )
}

/// A name and what it names: path, inode number, kind, mode, owner, link
/// count, size, symlink target.
type Named = (Vec<u8>, Ino, u8, u32, u32, u32, u64, Vec<u8>);

/// Every name in the volume with what it names, depth first: the tree
/// two volumes are compared by (inode numbers included: both allocate
/// them in the same order).
fn tree(v: &Volume) -> Vec<Named> {
    let r = v.ns.reader();
    let mut out = Vec::new();
    let mut todo: Vec<(Vec<u8>, InodeOff)> = vec![(Vec::new(), r.root())];
    while let Some((path, dir)) = todo.pop() {
        let mut entries = Vec::new();
        assert!(!r.read_dir(dir, None, 1 << 16, &mut entries));
        for e in entries {
            let mut p = path.clone();
            p.push(b'/');
            p.extend_from_slice(&e.name);
            let a = r.attr(e.inode).unwrap();
            let target = r.readlink(e.inode).unwrap_or_default();
            out.push((
                p.clone(),
                e.ino,
                e.kind.to_byte(),
                a.mode,
                a.uid,
                a.nlink,
                a.size,
                target,
            ));
            if e.kind == Kind::Dir {
                todo.push((p, e.inode));
            }
        }
    }
    out.sort();
    out
}

/// The result of a request with what differs by volume (inode offsets
/// and generations) left out.
fn outcome(r: Result<Reply, Errno>) -> Result<(Option<Ino>, bool), Errno> {
    r.map(|reply| match reply {
        Reply::Node(n) => (Some(n.ino), false),
        Reply::Open { node, created } => (Some(node.ino), created),
        _ => (None, false),
    })
}

#[test]
fn each_change_by_node_does_what_its_path_form_does() {
    let dir = tempdir();
    let (mut by_path, mut by_node) = (volume(&dir, "path"), volume(&dir, "node"));
    // Each step as a pair: the path form, and the node form built from
    // the node volume as it is when the step runs.
    type Step = (
        Request<'static>,
        Box<dyn Fn(&Volume) -> Request<'static>>,
        Caller,
    );
    let r = |v: &Volume| root(v);
    let d = |v: &Volume| node(v, b"d");
    let steps: Vec<Step> = vec![
        (
            Request::Create {
                at: Entry::Path(b"d"),
                mode: libc::S_IFDIR | 0o777,
                target: b"",
                hint: None,
            },
            Box::new(move |v| Request::Create {
                at: Entry::In {
                    dir: r(v),
                    name: b"d",
                },
                mode: libc::S_IFDIR | 0o777,
                target: b"",
                hint: None,
            }),
            ROOT,
        ),
        (
            Request::Create {
                at: Entry::Path(b"d/f"),
                mode: libc::S_IFREG | 0o644,
                target: b"",
                hint: None,
            },
            Box::new(move |v| Request::Create {
                at: Entry::In {
                    dir: d(v),
                    name: b"f",
                },
                mode: libc::S_IFREG | 0o644,
                target: b"",
                hint: None,
            }),
            USER,
        ),
        // The same name again: EEXIST both ways.
        (
            Request::Create {
                at: Entry::Path(b"d/f"),
                mode: libc::S_IFREG | 0o644,
                target: b"",
                hint: None,
            },
            Box::new(move |v| Request::Create {
                at: Entry::In {
                    dir: d(v),
                    name: b"f",
                },
                mode: libc::S_IFREG | 0o644,
                target: b"",
                hint: None,
            }),
            USER,
        ),
        (
            Request::Create {
                at: Entry::Path(b"d/l"),
                mode: libc::S_IFLNK | 0o777,
                target: b"f",
                hint: None,
            },
            Box::new(move |v| Request::Create {
                at: Entry::In {
                    dir: d(v),
                    name: b"l",
                },
                mode: libc::S_IFLNK | 0o777,
                target: b"f",
                hint: None,
            }),
            USER,
        ),
        (
            Request::Link {
                from: At::Path {
                    path: b"d/f",
                    follow: false,
                },
                to: Entry::Path(b"g"),
                hint: None,
            },
            Box::new(move |v| Request::Link {
                from: At::Node(node(v, b"d/f")),
                to: Entry::In {
                    dir: r(v),
                    name: b"g",
                },
                hint: None,
            }),
            ROOT,
        ),
        (
            Request::Rename {
                from: Entry::Path(b"g"),
                to: Entry::Path(b"d/h"),
                noreplace: false,
                hint_from: None,
                hint_to: None,
            },
            Box::new(move |v| Request::Rename {
                from: Entry::In {
                    dir: r(v),
                    name: b"g",
                },
                to: Entry::In {
                    dir: d(v),
                    name: b"h",
                },
                noreplace: false,
                hint_from: None,
                hint_to: None,
            }),
            ROOT,
        ),
        (
            Request::Rename {
                from: Entry::Path(b"d/l"),
                to: Entry::Path(b"d/h"),
                noreplace: true,
                hint_from: None,
                hint_to: None,
            },
            Box::new(move |v| Request::Rename {
                from: Entry::In {
                    dir: d(v),
                    name: b"l",
                },
                to: Entry::In {
                    dir: d(v),
                    name: b"h",
                },
                noreplace: true,
                hint_from: None,
                hint_to: None,
            }),
            ROOT,
        ),
        (
            Request::SetAttr {
                at: At::Path {
                    path: b"d/h",
                    follow: false,
                },
                attrs: SetAttrs {
                    mode: Some(0o600),
                    uid: Some(7),
                    ..SetAttrs::default()
                },
                now: Default::default(),
            },
            Box::new(move |v| Request::SetAttr {
                at: At::Node(node(v, b"d/h")),
                attrs: SetAttrs {
                    mode: Some(0o600),
                    uid: Some(7),
                    ..SetAttrs::default()
                },
                now: Default::default(),
            }),
            ROOT,
        ),
        (
            Request::Unlink {
                at: Entry::Path(b"d"),
                rmdir: true,
                hint: None,
            },
            Box::new(move |v| Request::Unlink {
                at: Entry::In {
                    dir: r(v),
                    name: b"d",
                },
                rmdir: true,
                hint: None,
            }),
            ROOT,
        ),
        (
            Request::Unlink {
                at: Entry::Path(b"d/l"),
                rmdir: false,
                hint: None,
            },
            Box::new(move |v| Request::Unlink {
                at: Entry::In {
                    dir: d(v),
                    name: b"l",
                },
                rmdir: false,
                hint: None,
            }),
            USER,
        ),
        (
            Request::Unlink {
                at: Entry::Path(b"d/l"),
                rmdir: false,
                hint: None,
            },
            Box::new(move |v| Request::Unlink {
                at: Entry::In {
                    dir: d(v),
                    name: b"l",
                },
                rmdir: false,
                hint: None,
            }),
            USER,
        ),
        (
            Request::Open {
                at: OpenAt::Entry(Entry::Path(b"d/o")),
                flags: open::WRITE | open::CREATE,
                mode: 0o640,
                hint: None,
            },
            Box::new(move |v| Request::Open {
                at: OpenAt::Entry(Entry::In {
                    dir: d(v),
                    name: b"o",
                }),
                flags: open::WRITE | open::CREATE,
                mode: 0o640,
                hint: None,
            }),
            USER,
        ),
        // Root opens by node what it could open by path, truncating it.
        (
            Request::Open {
                at: OpenAt::Entry(Entry::Path(b"d/f")),
                flags: open::WRITE | open::TRUNC,
                mode: 0,
                hint: None,
            },
            Box::new(move |v| Request::Open {
                at: OpenAt::Node(node(v, b"d/f")),
                flags: open::WRITE | open::TRUNC,
                mode: 0,
                hint: None,
            }),
            ROOT,
        ),
        (
            Request::Unlink {
                at: Entry::Path(b"d/h"),
                rmdir: false,
                hint: None,
            },
            Box::new(move |v| Request::Unlink {
                at: Entry::In {
                    dir: d(v),
                    name: b"h",
                },
                rmdir: false,
                hint: None,
            }),
            ROOT,
        ),
    ];
    let mut failures = 0;
    for (i, (path_form, node_form, who)) in steps.iter().enumerate() {
        let want = outcome(by_path.handle(path_form, *who));
        let req = node_form(&by_node);
        let got = outcome(by_node.handle(&req, *who));
        assert_eq!(got, want, "step {i}: {path_form:?} vs {req:?}");
        failures += usize::from(want.is_err());
        assert_eq!(tree(&by_node), tree(&by_path), "after step {i}");
    }
    // EEXIST, ENOTEMPTY, EEXIST (noreplace), ENOENT.
    assert_eq!(failures, 4);
    assert!(tree(&by_node).iter().any(|e| e.0 == b"/d/o"));
}

#[test]
fn a_node_that_is_gone_or_reused_is_stale() {
    let dir = tempdir();
    let mut v = volume(&dir, "img");
    mkdir(&mut v, b"d", 0o777, ROOT).unwrap();
    let d = node(&v, b"d");
    let create = |dir: Node, name: &'static [u8]| Request::Create {
        at: Entry::In { dir, name },
        mode: libc::S_IFREG | 0o644,
        target: b"",
        hint: None,
    };
    v.handle(&create(d, b"f"), ROOT).unwrap();
    let f = node(&v, b"d/f");
    // A wrong generation, number or offset names nothing.
    for bad in [
        Node {
            gen: d.gen.wrapping_add(1),
            ..d
        },
        Node {
            ino: Ino::new(d.ino.get() + 1),
            ..d
        },
        Node {
            inode: InodeOff::new(d.inode.get() + 8),
            ..d
        },
        Node {
            inode: InodeOff::new(u64::MAX - 7),
            ..d
        },
    ] {
        assert_eq!(v.handle(&create(bad, b"g"), ROOT), Err(Errno::ESTALE));
    }
    // Gone: every form that names it.
    v.handle(
        &Request::Unlink {
            at: Entry::In { dir: d, name: b"f" },
            rmdir: false,
            hint: None,
        },
        ROOT,
    )
    .unwrap();
    v.handle(
        &Request::Unlink {
            at: Entry::In {
                dir: root(&v),
                name: b"d",
            },
            rmdir: true,
            hint: None,
        },
        ROOT,
    )
    .unwrap();
    assert_eq!(v.handle(&create(d, b"g"), ROOT), Err(Errno::ESTALE));
    assert_eq!(chmod(&mut v, At::Node(f), 0o600, ROOT), Err(Errno::ESTALE));
    let open_f = Request::Open {
        at: OpenAt::Node(f),
        flags: 0,
        mode: 0,
        hint: None,
    };
    assert_eq!(v.handle(&open_f, ROOT), Err(Errno::ESTALE));
    // Reused: a new directory in the same place is not the old one.
    mkdir(&mut v, b"d", 0o777, ROOT).unwrap();
    let again = node(&v, b"d");
    assert_eq!(v.handle(&create(d, b"g"), ROOT), Err(Errno::ESTALE));
    v.handle(&create(again, b"g"), ROOT).unwrap();
}

#[test]
fn a_node_form_names_one_component_of_a_directory() {
    let dir = tempdir();
    let mut v = volume(&dir, "img");
    mkdir(&mut v, b"d", 0o777, ROOT).unwrap();
    let d = node(&v, b"d");
    let create = |dir: Node, name: &'static [u8]| Request::Create {
        at: Entry::In { dir, name },
        mode: libc::S_IFDIR | 0o755,
        target: b"",
        hint: None,
    };
    for name in [&b""[..], b".", b"..", b"a/b", b"/"] {
        assert_eq!(
            v.handle(&create(d, name), ROOT),
            Err(Errno::EINVAL),
            "{name:?}"
        );
    }
    v.handle(&create(d, b"x"), ROOT).unwrap();
    let file = Request::Open {
        at: OpenAt::Entry(Entry::In { dir: d, name: b"f" }),
        flags: open::WRITE | open::CREATE,
        mode: 0o644,
        hint: None,
    };
    v.handle(&file, ROOT).unwrap();
    let f = node(&v, b"d/f");
    assert_eq!(v.handle(&create(f, b"y"), ROOT), Err(Errno::ENOTDIR));
    let rename = Request::Rename {
        from: Entry::In { dir: d, name: b"x" },
        to: Entry::In {
            dir: d,
            name: b"..",
        },
        noreplace: false,
        hint_from: None,
        hint_to: None,
    };
    assert_eq!(v.handle(&rename, ROOT), Err(Errno::EINVAL));
}

#[test]
fn the_node_form_meets_the_path_forms_permission_checks() {
    let dir = tempdir();
    let mut v = volume(&dir, "img");
    mkdir(&mut v, b"ro", 0o755, ROOT).unwrap();
    mkdir(&mut v, b"top", 0o700, ROOT).unwrap();
    mkdir(&mut v, b"top/inner", 0o777, ROOT).unwrap();
    mkdir(&mut v, b"pub", 0o1777, ROOT).unwrap();
    let (ro, inner, public) = (node(&v, b"ro"), node(&v, b"top/inner"), node(&v, b"pub"));
    let create = |at: Entry<'static>| Request::Create {
        at,
        mode: libc::S_IFREG | 0o644,
        target: b"",
        hint: None,
    };
    // No write permission on the parent: EACCES either way.
    assert_eq!(
        v.handle(&create(Entry::Path(b"ro/x")), USER),
        Err(Errno::EACCES)
    );
    assert_eq!(
        v.handle(
            &create(Entry::In {
                dir: ro,
                name: b"x"
            }),
            USER
        ),
        Err(Errno::EACCES)
    );
    // A directory the caller could not reach by path: EACCES either
    // way, though the directory itself is open to all.
    assert_eq!(
        v.handle(&create(Entry::Path(b"top/inner/x")), USER),
        Err(Errno::EACCES)
    );
    assert_eq!(
        v.handle(
            &create(Entry::In {
                dir: inner,
                name: b"x"
            }),
            USER
        ),
        Err(Errno::EACCES)
    );
    v.handle(
        &create(Entry::In {
            dir: inner,
            name: b"x",
        }),
        ROOT,
    )
    .unwrap();
    // The sticky rule: another's file in a sticky directory stays.
    v.handle(
        &create(Entry::In {
            dir: public,
            name: b"roots",
        }),
        ROOT,
    )
    .unwrap();
    let unlink = |at| Request::Unlink {
        at,
        rmdir: false,
        hint: None,
    };
    assert_eq!(
        v.handle(&unlink(Entry::Path(b"pub/roots")), USER),
        Err(Errno::EPERM)
    );
    assert_eq!(
        v.handle(
            &unlink(Entry::In {
                dir: public,
                name: b"roots"
            }),
            USER
        ),
        Err(Errno::EPERM)
    );
    // A file by node: only while the caller has it open (or is root).
    v.handle(
        &create(Entry::In {
            dir: public,
            name: b"mine",
        }),
        USER,
    )
    .unwrap();
    let mine = node(&v, b"pub/mine");
    assert_eq!(
        chmod(&mut v, At::Node(mine), 0o600, USER),
        Err(Errno::EACCES)
    );
    let open_mine = Request::Open {
        at: OpenAt::Node(mine),
        flags: 0,
        mode: 0,
        hint: None,
    };
    assert_eq!(v.handle(&open_mine, USER), Err(Errno::EACCES));
    let (opened, _) = v
        .handle(
            &Request::Open {
                at: OpenAt::Entry(Entry::In {
                    dir: public,
                    name: b"mine",
                }),
                flags: 0,
                mode: 0,
                hint: None,
            },
            USER,
        )
        .unwrap()
        .into_open()
        .unwrap();
    assert_eq!(opened, mine);
    chmod(&mut v, At::Node(mine), 0o600, USER).unwrap();
    // Open, it is still checked as by path: not the owner, no chmod.
    let roots = node(&v, b"pub/roots");
    let (r, _) = v
        .handle(
            &Request::Open {
                at: OpenAt::Entry(Entry::Path(b"pub/roots")),
                flags: 0,
                mode: 0,
                hint: None,
            },
            USER,
        )
        .unwrap()
        .into_open()
        .unwrap();
    assert_eq!(r, roots);
    assert_eq!(
        chmod(&mut v, At::Node(roots), 0o666, USER),
        Err(Errno::EPERM)
    );
    assert_eq!(
        chmod(
            &mut v,
            At::Path {
                path: b"pub/roots",
                follow: false
            },
            0o666,
            USER
        ),
        Err(Errno::EPERM)
    );
    let attr =
        v.ns.reader()
            .attr(v.ns.reader().resolve(b"pub/mine", false).unwrap())
            .unwrap();
    assert_eq!(attr.mode & 0o7777, 0o600);
}
