//! Kfs's service time `L` for metadata requests, measured by calling the
//! volume directly on one thread (no channel, no second core): creates with
//! and without pre-located addresses, and a ping (a request that changes
//! nothing).
//!
//! Run: `cargo bench -p kucofs-kfs --bench volume`.

use std::hint::black_box;

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use kucofs_common::proto::{Entry, Hint, Request};
use kucofs_kfs::Volume;

fn volume() -> (tempfile::TempDir, Volume) {
    let dir = tempfile::Builder::new()
        .prefix("kucofs-bench-")
        .tempdir_in("/dev/shm")
        .expect("temp dir");
    let path = dir.path().join("img");
    kucofs_kfs::mkfs(&path, 4 << 30, false).expect("mkfs");
    let mut v = Volume::open(&path).expect("open");
    let r = v.handle(
        &Request::Create {
            at: Entry::Path(b"d"),
            mode: libc::S_IFDIR | 0o755,
            target: b"",
            hint: None,
        },
        kucofs_kfs::Caller::default(),
    );
    assert!(r.is_ok(), "{r:?}");
    (dir, v)
}

fn hint(v: &Volume, path: &[u8]) -> Hint {
    v.namespace()
        .reader()
        .locate(path)
        .expect("the parent resolves")
}

fn create(c: &mut Criterion) {
    let mut g = c.benchmark_group("kfs");
    for with_hint in [true, false] {
        let (_dir, mut v) = volume();
        let mut i = 0u64;
        let name = if with_hint {
            "create (pre-located)"
        } else {
            "create (path only)"
        };
        // Only `handle` is timed; the hint is computed outside the clock, as
        // a client computes it. Growth of tables and arena is amortized over
        // the iterations, as it is in a real run.
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    i += 1;
                    let path = format!("d/f{i}").into_bytes();
                    let h = with_hint.then(|| hint(&v, &path));
                    let req = Request::Create {
                        at: Entry::Path(&path),
                        mode: libc::S_IFREG | 0o644,
                        target: b"",
                        hint: h,
                    };
                    let t0 = Instant::now();
                    let _ = black_box(v.handle(&req, kucofs_kfs::Caller::default()));
                    total += t0.elapsed();
                }
                total
            })
        });
    }
    let (_dir, mut v) = volume();
    g.bench_function("ping", |b| {
        b.iter(|| black_box(v.handle(&Request::Ping, kucofs_kfs::Caller::default())))
    });
    g.finish();
}

criterion_group!(benches, create);
criterion_main!(benches);
