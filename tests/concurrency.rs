//! Many threads changing one directory at once. Each thread owns a set of
//! names, so its own results are predictable and checked one by one; all
//! threads also fight over a few shared names, whose successful creates and
//! unlinks must alternate. The final tree must be exactly what the results
//! say, survive a reopen, and pass fsck.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use kucofs_ulib::{Config, Fs};

const THREADS: usize = 4;
const OPS: usize = 3000;
const SHARED: usize = 8;

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

#[test]
fn four_threads_create_rename_and_unlink_in_one_directory() {
    run(true);
}

#[test]
fn four_threads_in_one_directory_all_through_the_kfs_thread() {
    run(false);
}

fn run(direct: bool) {
    let Some(dir) = support::shm_dir("kucofs-conc-") else {
        return;
    };
    let image = dir.path().join("img");
    kucofs_kfs::mkfs(&image, 64 << 20, false).unwrap();
    let config = Config {
        direct,
        ..Config::default()
    };
    let fs = Fs::open_with(&image, config).unwrap();
    fs.create_dir("d").unwrap();
    // Per shared name: (successful creates, successful unlinks).
    let shared = Mutex::new(vec![(0u32, 0u32); SHARED]);
    let owned: Vec<BTreeSet<String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (fs, shared) = (&fs, &shared);
                s.spawn(move || {
                    let mut mine = BTreeSet::new();
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1);
                    for _ in 0..OPS {
                        let r = xorshift(&mut rng);
                        let a = format!("t{t}-{}", r % 50);
                        let b = format!("t{t}-{}", (r >> 8) % 50);
                        let pa = format!("d/{a}");
                        match (r >> 16) % 5 {
                            0 | 1 => {
                                let res = fs.create_file(&pa);
                                assert_eq!(
                                    res.is_ok(),
                                    mine.insert(a.clone()),
                                    "create {pa}: {res:?}"
                                );
                            }
                            2 => {
                                let res = fs.remove_file(&pa);
                                assert_eq!(res.is_ok(), mine.remove(&a), "unlink {pa}: {res:?}");
                            }
                            3 => {
                                let res = fs.rename(&pa, format!("d/{b}"));
                                assert_eq!(res.is_ok(), mine.contains(&a), "rename {pa}: {res:?}");
                                if res.is_ok() && a != b {
                                    mine.remove(&a);
                                    mine.insert(b);
                                }
                            }
                            _ => {
                                let k = ((r >> 24) % SHARED as u64) as usize;
                                let p = format!("d/s-{k}");
                                if (r >> 32) & 1 == 0 {
                                    if fs.create_file(&p).is_ok() {
                                        shared.lock().unwrap()[k].0 += 1;
                                    }
                                } else if fs.remove_file(&p).is_ok() {
                                    shared.lock().unwrap()[k].1 += 1;
                                }
                            }
                        }
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut expected: BTreeSet<String> = owned.into_iter().flatten().collect();
    for (k, &(c, u)) in shared.lock().unwrap().iter().enumerate() {
        assert!(
            c == u || c == u + 1,
            "s-{k}: {c} creates but {u} unlinks succeeded"
        );
        if c == u + 1 {
            expected.insert(format!("s-{k}"));
        }
    }
    let listed = |fs: &Fs| -> BTreeSet<String> {
        fs.read_dir("d")
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    };
    assert_eq!(listed(&fs), expected);
    assert_eq!(fs.metadata("d").unwrap().nlink(), 2);
    let stats = fs.kfs_stats().unwrap();
    eprintln!("{stats}");
    // The route asked for is the one taken.
    assert_eq!(stats.direct > 0, direct, "{stats}");
    fs.close().unwrap();
    let fs = Fs::open(&image).unwrap();
    assert_eq!(listed(&fs), expected);
    fs.close().unwrap();
    let report = kucofs_kfs::fsck(Path::new(&image)).unwrap();
    assert!(report.problems.is_empty(), "{report}");
}

#[test]
fn a_listing_during_changes_returns_every_stable_entry_exactly_once() {
    let Some(dir) = support::shm_dir("kucofs-conc-") else {
        return;
    };
    let fs = Fs::create(dir.path().join("img"), 64 << 20).unwrap();
    fs.create_dir("d").unwrap();
    // 2,040 names: the table has 2,048 buckets (one entry a bucket), so the
    // churn's ninth create starts doubling it, and its creates, each
    // migrating a step of the old buckets, end the doubling by its 520th.
    let stable: BTreeSet<String> = (0..2040).map(|i| format!("stable-{i}")).collect();
    for name in &stable {
        fs.create_file(format!("d/{name}")).unwrap();
    }
    let stop = AtomicBool::new(false);
    let listing = AtomicBool::new(false);
    // Creates the churn thread has made.
    let churned = AtomicU64::new(0);
    std::thread::scope(|s| {
        // Churn: names come and go while the listings run, the first ones
        // doubling the bucket table once the first listing has begun.
        let churn = s.spawn(|| {
            while !listing.load(Ordering::Relaxed) {
                std::thread::yield_now();
            }
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                fs.create_file(format!("d/churn-{i}")).unwrap();
                if i >= 50 {
                    fs.remove_file(format!("d/churn-{}", i - 50)).unwrap();
                }
                i += 1;
                churned.store(i, Ordering::Relaxed);
            }
        });
        for round in 0..5 {
            let mut seen = Vec::new();
            for e in fs.read_dir("d").unwrap() {
                listing.store(true, Ordering::Relaxed);
                let name = e.unwrap().file_name().into_string().unwrap();
                if name.starts_with("stable-") {
                    seen.push(name);
                }
                // Give the churn thread time to change the directory between
                // the listing's visits.
                if seen.len() % 100 == 0 {
                    std::thread::yield_now();
                }
                // The first listing waits, part-way, for the churn to double
                // the table and go on, whatever the scheduler does.
                if round == 0 && seen.len() == 1000 {
                    let doubled = 9 + 2048 / kucofs_kfs::namespace::GROW_STEP + 50;
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
                    while churned.load(Ordering::Relaxed) < doubled {
                        assert!(
                            std::time::Instant::now() < deadline,
                            "the churn thread did not run"
                        );
                        std::thread::yield_now();
                    }
                }
            }
            let unique: BTreeSet<String> = seen.iter().cloned().collect();
            assert_eq!(
                unique.len(),
                seen.len(),
                "round {round}: an entry appeared twice"
            );
            assert_eq!(unique, stable, "round {round}: a stable entry is missing");
        }
        stop.store(true, Ordering::Relaxed);
        churn.join().unwrap();
    });
}
