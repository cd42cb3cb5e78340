//! Requests a buggy or hostile client could send, straight into a request
//! slot of a running Kfs: forged pre-located addresses (out of range, into
//! the middle of an item, at an item of the wrong type, at a freed item,
//! with a wrong generation) and invalid names and paths. Each is refused
//! with an errno, or — for addresses, which Kfs checks and then ignores —
//! gives exactly the result the path alone gives; meanwhile another client
//! thread keeps being served, and the file system stays consistent.

mod support;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kucofs_common::channel::{Doorbell, Segment};
use kucofs_common::index::layout::header_gen;
use kucofs_common::index::{name_hash, DirentOff, IndexReader, InodeOff};
use kucofs_common::proto::{Creds, Entry, Hint, Reply, Request};
use kucofs_common::Errno;
use kucofs_kfs::{Client, Kfs, ServerConfig, Volume};

fn create<'a>(path: &'a [u8], hint: Option<Hint>) -> Request<'a> {
    Request::Create {
        at: Entry::Path(path),
        mode: libc::S_IFREG | 0o644,
        target: b"",
        hint,
    }
}

/// Forged addresses tried on creates.
const FORGED_CREATES: usize = 8;

#[test]
fn forged_addresses_and_bad_names_never_hurt_kfs_or_other_clients() {
    let Some(dir) = support::shm_dir("kucofs-bad-") else {
        return;
    };
    let image = dir.path().join("img");
    kucofs_kfs::mkfs(&image, 64 << 20, false).unwrap();
    let volume = Volume::open(&image).unwrap();
    let index = volume.namespace().shm().view().unwrap();
    let bell = Doorbell::create().unwrap();
    let kfs = Kfs::start(volume, &bell, ServerConfig::default()).unwrap();
    let seg = Segment::create().unwrap();
    kfs.attach(Client {
        segment: seg.map_again().unwrap(),
        creds: Creds::default(),
        protector: None,
        protection: Default::default(),
        staging: None,
        hangup: None,
    })
    .unwrap();
    let call = |slot: usize, req: &Request<'_>| seg.call(slot, &bell, req);
    let r = IndexReader::new(&index);

    call(
        0,
        &Request::Create {
            at: Entry::Path(b"d"),
            mode: libc::S_IFDIR | 0o755,
            target: b"",
            hint: None,
        },
    )
    .unwrap();
    for i in 0..100 {
        call(0, &create(format!("d/f{i}").as_bytes(), None)).unwrap();
    }
    let d = r.resolve(b"d", true).unwrap();
    let f5 = r.lookup(d, b"f5");
    let good = |name: &[u8]| {
        let s = r.search(d, name_hash(name), name);
        Hint {
            dir: d,
            dir_gen: header_gen(r.header(d.get())),
            pred: s.pred,
            found: s.found,
            found_gen: if !s.found.is_null() {
                header_gen(r.header(s.found.get()))
            } else {
                0
            },
        }
    };
    // An entry removed and reclaimed, whose address a client kept.
    let stale = good(b"f7");
    call(
        0,
        &Request::Unlink {
            at: Entry::Path(b"d/f7"),
            rmdir: false,
            hint: None,
        },
    )
    .unwrap();

    let stop = AtomicBool::new(false);
    // Rounds (create and unlink) the other client has completed.
    let rounds = AtomicU64::new(0);
    // Waits until the other client completes a round after `seen` rounds,
    // so the test does not depend on how the scheduler ran it.
    let served_after = |seen: u64| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while rounds.load(Ordering::Relaxed) <= seen {
            assert!(
                Instant::now() < deadline,
                "the other client was not served for 30 s"
            );
            std::thread::yield_now();
        }
    };
    // Stops the other client even if a check below fails, so the failure
    // is reported instead of the scope waiting forever.
    std::thread::scope(|s| {
        // Another client thread, served throughout.
        let other = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let p = format!("other-{}", rounds.load(Ordering::Relaxed));
                call(1, &create(p.as_bytes(), None)).unwrap();
                call(
                    1,
                    &Request::Unlink {
                        at: Entry::Path(p.as_bytes()),
                        rmdir: false,
                        hint: None,
                    },
                )
                .unwrap();
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        });

        let _stop = support::SetOnDrop(&stop);
        served_after(0);
        // Forgeries of a create's address: each is refused (counted stale)
        // and the create happens where the path says. An honest address is
        // used, which shows the count can tell the two apart.
        let forge = |name: &[u8], i: usize| {
            let g = good(name);
            [
                Hint {
                    pred: DirentOff::new(u64::MAX - 3),
                    ..g
                },
                Hint {
                    pred: DirentOff::new(g.pred.get() + 8),
                    ..g
                },
                Hint {
                    pred: DirentOff::new(d.get()),
                    ..g
                },
                Hint {
                    pred: DirentOff::new(1 << 40),
                    ..g
                },
                Hint {
                    dir: InodeOff::new(d.get() + 24),
                    ..g
                },
                Hint {
                    dir: InodeOff::new(u64::MAX),
                    ..g
                },
                Hint {
                    pred: stale.found,
                    ..g
                },
                // A real directory, but not the one the path names.
                Hint {
                    dir: r.root(),
                    pred: r.dir_head(r.root()),
                    ..g
                },
            ][i]
        };
        let used = kfs.stats().hints_used;
        call(0, &create(b"d/honest", Some(good(b"honest")))).unwrap();
        assert_eq!(
            kfs.stats().hints_used,
            used + 1,
            "an honest address was not used"
        );
        for i in 0..FORGED_CREATES {
            // With a path that resolves, the change happens where the path
            // says, and nowhere else.
            let p = format!("d/x{i}");
            let h = forge(&p.as_bytes()[2..], i);
            let stale_before = kfs.stats().hints_stale;
            let node = call(0, &create(p.as_bytes(), Some(h)))
                .and_then(Reply::into_node)
                .unwrap();
            assert_eq!(
                kfs.stats().hints_stale,
                stale_before + 1,
                "forgery {i} was not refused"
            );
            assert_eq!(r.resolve(p.as_bytes(), true), Ok(node.inode), "forgery {i}");
            // With a path that does not, the error the path alone gives.
            let missing = format!("nowhere/x{i}");
            assert_eq!(
                call(0, &create(missing.as_bytes(), Some(h))),
                Err(Errno::ENOENT),
                "forgery {i}"
            );
        }
        // Forged "found" entries for unlinks: a freed one, one of another
        // name, a wrong generation, the middle of an item.
        let f5h = good(b"f5");
        for h in [
            Hint {
                found: stale.found,
                found_gen: stale.found_gen,
                ..stale
            },
            Hint {
                found: f5,
                ..good(b"f6")
            },
            Hint {
                found_gen: f5h.found_gen.wrapping_add(1),
                ..f5h
            },
            Hint {
                found: DirentOff::new(f5.get() + 16),
                ..f5h
            },
        ] {
            assert_eq!(
                call(
                    0,
                    &Request::Unlink {
                        at: Entry::Path(b"d/f7"),
                        rmdir: false,
                        hint: Some(h)
                    }
                ),
                Err(Errno::ENOENT)
            );
        }
        assert!(
            !r.lookup(d, b"f5").is_null() && !r.lookup(d, b"f6").is_null(),
            "a forged address removed a wrong entry"
        );
        // Invalid names and paths.
        let long = vec![b'n'; 256];
        let long_path = [b"d/".as_slice(), &long].concat();
        let huge = vec![b'a'; 5000];
        let cases: [(&[u8], Errno); 6] = [
            (b"", Errno::ENOENT),
            (&long_path, Errno::ENAMETOOLONG),
            (b"d/.", Errno::EEXIST),
            (b"d/..", Errno::EEXIST),
            (b"d/f1/x", Errno::ENOTDIR),
            (&huge, Errno::ENAMETOOLONG),
        ];
        for (path, want) in cases {
            assert_eq!(
                call(0, &create(path, None)).map(drop),
                Err(want),
                "{:?}",
                String::from_utf8_lossy(&path[..path.len().min(20)])
            );
        }
        // Mode bits that are no file type, and a symlink with no target.
        assert_eq!(
            call(
                0,
                &Request::Create {
                    at: Entry::Path(b"d/m"),
                    mode: 0o170777,
                    target: b"",
                    hint: None
                }
            )
            .map(drop),
            Err(Errno::EINVAL)
        );
        assert_eq!(
            call(
                0,
                &Request::Create {
                    at: Entry::Path(b"d/l"),
                    mode: libc::S_IFLNK | 0o777,
                    target: b"",
                    hint: None
                }
            )
            .map(drop),
            Err(Errno::ENOENT)
        );
        // Still served after every hostile request above.
        served_after(rounds.load(Ordering::Relaxed));
        stop.store(true, Ordering::Relaxed);
        other.join().unwrap();
    });
    // Every forged address, the creates' and the unlinks', and only those.
    let stats = kfs.stats();
    assert_eq!(stats.hints_stale, FORGED_CREATES as u64 + 4, "{stats}");
    kfs.shutdown().unwrap();
    let report = kucofs_kfs::fsck(Path::new(&image)).unwrap();
    assert!(report.problems.is_empty(), "{report}");
    assert_eq!(report.entries, 101 - 1 + 1 + FORGED_CREATES as u64);
}
