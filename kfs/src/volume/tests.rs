use std::collections::BTreeMap;

use kucofs_common::index::Kind;
use kucofs_common::pm::Recorder;
use parking_lot::Mutex;

use super::*;

const ME: Caller = Caller {
    client: 0,
    slot: 0,
    creds: Creds { uid: 0, gid: 0 },
};

fn shm_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("kucofs-volume-")
        .tempdir_in("/dev/shm")
        .unwrap()
}

fn create(v: &mut Volume, path: &str, dir: bool) -> Reply {
    let mode = if dir {
        libc::S_IFDIR | 0o755
    } else {
        libc::S_IFREG | 0o644
    };
    v.handle(
        &Request::Create {
            path: path.as_bytes(),
            mode,
            target: b"",
            hint: None,
        },
        ME,
    )
}

/// The whole tree as (path -> (kind, nlink, mode)).
fn tree(ns: &Namespace) -> BTreeMap<String, (Kind, u32, u32, u64)> {
    let r = ns.reader();
    let mut out = BTreeMap::new();
    let mut stack = vec![(r.root(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let mut es = Vec::new();
        r.read_dir(dir, None, usize::MAX, &mut es);
        for e in es {
            let path = format!("{prefix}/{}", String::from_utf8_lossy(&e.name));
            let a = r.attr(e.inode).unwrap();
            out.insert(path.clone(), (e.kind, a.nlink, a.mode, a.ino));
            if e.kind == Kind::Dir {
                stack.push((e.inode, path));
            }
        }
    }
    out
}

#[test]
fn a_tree_survives_a_clean_close_and_a_crash() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    crate::mkfs(&path, 16 << 20, false).unwrap();
    let mut v = Volume::open(&path).unwrap();
    assert!(!v.image().superblock().clean);
    create(&mut v, "a", true);
    create(&mut v, "a/f", false);
    v.handle(
        &Request::Link {
            from: b"a/f",
            to: b"g",
            hint: None,
        },
        ME,
    );
    let before = tree(v.namespace());
    assert_eq!(before.len(), 3);
    v.close().unwrap();
    assert!(crate::inspect(&path).unwrap().superblock.clean);

    let mut v = Volume::open(&path).unwrap();
    assert_eq!(tree(v.namespace()), before);
    assert_eq!(v.replayed().entries, 0, "a clean close leaves an empty log");
    // Changes after the reopen, then a crash: the log carries them.
    create(&mut v, "a/h", false);
    v.handle(
        &Request::Unlink {
            path: b"g",
            rmdir: false,
            hint: None,
        },
        ME,
    );
    let after = tree(v.namespace());
    drop(v);
    assert!(!crate::inspect(&path).unwrap().superblock.clean);
    let v = Volume::open(&path).unwrap();
    assert_eq!(v.replayed().entries, 2);
    assert_eq!(tree(v.namespace()), after);
}

#[test]
fn checkpoints_taken_as_the_log_fills_lose_nothing() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    // An 8 MiB image has a 512 KiB log: a checkpoint every ~3000 changes.
    crate::mkfs(&path, 8 << 20, false).unwrap();
    let mut v = Volume::open(&path).unwrap();
    create(&mut v, "d", true);
    for i in 0..8000 {
        let r = create(&mut v, &format!("d/file-with-a-longish-name-{i}"), false);
        assert_eq!(r.errno, 0, "create {i}");
        if i % 2 == 0 {
            let p = format!("d/file-with-a-longish-name-{i}");
            assert_eq!(
                v.handle(
                    &Request::Unlink {
                        path: p.as_bytes(),
                        rmdir: false,
                        hint: None
                    },
                    ME
                )
                .errno,
                0
            );
        }
    }
    assert!(v.checkpoints() >= 3, "only {} checkpoints", v.checkpoints());
    let expected = tree(v.namespace());
    drop(v);
    let v = Volume::open(&path).unwrap();
    assert_eq!(tree(v.namespace()), expected);
    assert_eq!(expected.len(), 1 + 4000);
}

#[test]
fn every_crash_image_of_a_create_recovers_to_before_or_after() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    crate::mkfs(&path, 1 << 20, false).unwrap();
    let rec = Arc::new(Recorder::new());
    let mut v = Volume::open_with(&path, rec.clone()).unwrap();
    create(&mut v, "keep", false);
    let before = tree(v.namespace());
    let images = Arc::new(Mutex::new(Vec::new()));
    let sink = images.clone();
    rec.on_fence(move |cp| {
        sink.lock()
            .extend(cp.images(1 << 12).expect("few stores in flight"))
    });
    let reply = create(&mut v, "new", true);
    assert_eq!(reply.errno, 0);
    let after = tree(v.namespace());
    // After the reply, the durable image alone must hold the change.
    let durable = rec.durable_image();
    let images = std::mem::take(&mut *images.lock());
    drop(v);
    assert!(!images.is_empty());
    let check = |image: &[u8]| {
        let img_path = dir.path().join("crash");
        std::fs::write(&img_path, image).unwrap();
        let v = Volume::open(&img_path).unwrap();
        tree(v.namespace())
    };
    assert_eq!(check(&durable), after, "an acknowledged create was lost");
    for image in &images {
        let t = check(image);
        assert!(
            t == before || t == after,
            "a crash image recovered to neither state: {t:?}"
        );
    }
}
