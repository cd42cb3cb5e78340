use std::collections::BTreeMap;

use kucofs_common::index::Kind;
use kucofs_common::proto::{open, At, Creds, Entry, Extents, OpenAt, Reply, Request, SetAttrs};

use crate::namespace::Namespace;
use crate::volume::{Caller, Volume};

const ME: Caller = Caller {
    client: 0,
    slot: 0,
    creds: Creds::new(0, 0),
};

/// A small deterministic generator (xorshift), so a failure names its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// [`below`](Self::below) as another integer type.
    fn below_as<T: TryFrom<u64>>(&mut self, n: u64) -> T
    where
        T::Error: std::fmt::Debug,
    {
        T::try_from(self.below(n)).unwrap()
    }
}

/// What a file system holds, as one map per path: kind, links, mode,
/// owner, size, symlink target, and (files) every page's data page.
type Tree = BTreeMap<String, (Kind, u32, u32, u32, u64, Vec<u8>, Vec<(u64, u64)>)>;

fn tree(ns: &Namespace) -> Tree {
    let r = ns.reader();
    let mut out = BTreeMap::new();
    let mut stack = vec![(r.root(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let mut es = Vec::new();
        r.read_dir(dir, None, usize::MAX, &mut es);
        for e in es {
            let path = format!("{prefix}/{}", String::from_utf8_lossy(&e.name));
            let a = r.attr(e.inode).unwrap();
            let mut pages = Vec::new();
            if e.kind == Kind::File {
                ns.file_pages(e.inode, |p, d| pages.push((p, d.get())));
            }
            let target = r.readlink(e.inode).unwrap_or_default();
            out.insert(
                path.clone(),
                (e.kind, a.nlink, a.mode, a.uid, a.size, target, pages),
            );
            if e.kind == Kind::Dir {
                stack.push((e.inode, path));
            }
        }
    }
    out
}

/// The namespace the image holds now, recovered read-only: the store with
/// the log replayed over it.
fn recovered(v: &Volume) -> Tree {
    let sb = v.image().superblock().clone();
    let region = v.image().region();
    let (ns, _, _) =
        crate::recovery::recover(&sb, &|off, buf| region.read(off, buf).is_ok()).unwrap();
    tree(&ns)
}

fn path_of(rng: &mut Rng) -> String {
    let dir = ["", "a/", "a/b/", "c/"][rng.below_as::<usize>(4)];
    let long = "n".repeat(60);
    let name = match rng.below(3) {
        0 => format!("f{}", rng.below(24)),
        1 => format!("{long}{}", rng.below(8)),
        _ => format!("s{}", rng.below(6)),
    };
    format!("{dir}{name}")
}

fn handle(v: &mut Volume, req: &Request<'_>) -> Result<Reply, kucofs_common::Errno> {
    v.handle(req, ME)
}

/// Writes `pages` pages at file page `first` of `path` (made if missing).
fn write(v: &mut Volume, path: &str, first: u64, pages: u32, truncate_to: Option<u64>) {
    let f = handle(
        v,
        &Request::Open {
            at: OpenAt::Entry(Entry::Path(path.as_bytes())),
            flags: open::WRITE | open::CREATE,
            mode: 0o644,
            hint: None,
        },
    );
    let Ok(f) = f.and_then(Reply::into_node) else {
        return;
    };
    let g = handle(v, &Request::Grant { pages });
    if let Ok(g) = g {
        let mut extents = Extents::new();
        let mut n = 0;
        for (s, l) in g.into_grant().unwrap().runs() {
            extents.push(s, u32::try_from(l).unwrap());
            n += l;
        }
        let size = (first + n) * 4096 - 100;
        let c = handle(
            v,
            &Request::Commit {
                ino: f.ino,
                first,
                size,
                extents,
            },
        );
        assert!(c.is_ok(), "commit to {path}: {c:?}");
    }
    if let Some(size) = truncate_to {
        let cut = handle(v, &Request::Truncate { ino: f.ino, size });
        assert_eq!(cut, Ok(Reply::Size(size)));
    }
    let _ = handle(
        v,
        &Request::Close {
            ino: f.ino,
            write: true,
        },
    );
}

/// One random change.
fn step(v: &mut Volume, rng: &mut Rng) {
    let p = path_of(rng);
    let q = path_of(rng);
    match rng.below(11) {
        0..=2 => {
            let _ = handle(
                v,
                &Request::Create {
                    at: Entry::Path(p.as_bytes()),
                    mode: libc::S_IFREG | 0o644,
                    target: b"",
                    hint: None,
                },
            );
        }
        3 => {
            let _ = handle(
                v,
                &Request::Unlink {
                    at: Entry::Path(p.as_bytes()),
                    rmdir: false,
                    hint: None,
                },
            );
        }
        4 => {
            let _ = handle(
                v,
                &Request::Rename {
                    from: Entry::Path(p.as_bytes()),
                    to: Entry::Path(q.as_bytes()),
                    noreplace: false,
                    hint_from: None,
                    hint_to: None,
                },
            );
        }
        5 => {
            let _ = handle(
                v,
                &Request::Link {
                    from: At::Path {
                        path: p.as_bytes(),
                        follow: false,
                    },
                    to: Entry::Path(q.as_bytes()),
                    hint: None,
                },
            );
        }
        6 => {
            let target = if rng.below(2) == 0 {
                "short".to_string()
            } else {
                "t".repeat(100 + rng.below_as::<usize>(200))
            };
            let _ = handle(
                v,
                &Request::Create {
                    at: Entry::Path(p.as_bytes()),
                    mode: libc::S_IFLNK | 0o777,
                    target: target.as_bytes(),
                    hint: None,
                },
            );
        }
        7 => {
            let _ = handle(
                v,
                &Request::SetAttr {
                    at: At::Path {
                        path: p.as_bytes(),
                        follow: false,
                    },
                    attrs: SetAttrs {
                        mode: Some(0o600 + rng.below_as::<u32>(8)),
                        uid: Some(rng.below_as::<u32>(3)),
                        ..SetAttrs::default()
                    },
                    now: Default::default(),
                },
            );
        }
        8 | 9 => {
            let first = rng.below(6);
            let pages = 1 + rng.below_as::<u32>(3);
            let cut = (rng.below(4) == 0).then(|| rng.below(4) * 3000);
            write(v, &p, first, pages, cut);
        }
        _ => {
            // Directories come and go too (rmdir fails on full ones).
            let d = ["a", "a/b", "c", "c/e"][rng.below_as::<usize>(4)];
            if rng.below(2) == 0 {
                let _ = handle(
                    v,
                    &Request::Create {
                        at: Entry::Path(d.as_bytes()),
                        mode: libc::S_IFDIR | 0o755,
                        target: b"",
                        hint: None,
                    },
                );
            } else {
                let _ = handle(
                    v,
                    &Request::Unlink {
                        at: Entry::Path(d.as_bytes()),
                        rmdir: true,
                        hint: None,
                    },
                );
            }
        }
    }
}

fn shm_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("kucofs-store-")
        .tempdir_in("/dev/shm")
        .unwrap()
}

/// After any sequence of changes, with retirements of the log at random
/// points, the image recovers to what the index holds: from the store
/// alone right after a retirement, from the store and the log between
/// them, after a crash and after a clean close; and fsck finds it clean.
#[test]
fn the_image_recovers_to_the_index_after_any_changes_and_retirements() {
    for seed in 1..=6u64 {
        let dir = shm_dir();
        let path = dir.path().join("img");
        crate::mkfs(&path, 4 << 20, false).unwrap();
        let mut v = Volume::open(&path).unwrap();
        v.attach_client(0, None, Default::default(), None);
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        for d in ["a", "a/b", "c"] {
            let _ = handle(
                &mut v,
                &Request::Create {
                    at: Entry::Path(d.as_bytes()),
                    mode: libc::S_IFDIR | 0o755,
                    target: b"",
                    hint: None,
                },
            );
        }
        for i in 0..600 {
            step(&mut v, &mut rng);
            if rng.below(4) == 0 {
                // Removed items are reused for new ones (no reader holds
                // them back here).
                v.reclaim_now();
            }
            if rng.below(8) == 0 {
                v.checkpoint().unwrap();
                assert_eq!(v.log().entries(), 0);
            }
            if i % 25 == 0 {
                assert_eq!(recovered(&v), tree(v.namespace()), "seed {seed}, step {i}");
            }
        }
        let live = tree(v.namespace());
        assert!(live.len() > 10, "seed {seed}: {} paths", live.len());
        // A crash (no retirement, no clean flag), then a clean close.
        drop(v);
        let v = Volume::open(&path).unwrap();
        assert_eq!(tree(v.namespace()), live, "seed {seed}: after a crash");
        v.close().unwrap();
        let report = crate::fsck(&path).unwrap();
        assert!(report.problems.is_empty(), "seed {seed}: {report}");
        let v = Volume::open(&path).unwrap();
        assert_eq!(tree(v.namespace()), live, "seed {seed}: after a close");
        assert_eq!(v.replayed().entries, 0);
        let sizes: u64 = live.values().map(|e| e.4).sum();
        assert!(sizes > 0);
    }
}
