//! The persistence primitives on this machine's region: flushing a cache
//! line and a page, a lone fence, and a 4 KiB non-temporal copy, beside a
//! plain `copy_from_slice` of the same 4 KiB as the baseline.
//!
//! Run: `cargo bench -p kucofs-common --bench persist`. The region is a file
//! under `/dev/shm` (emulated PM), mapped exactly as Kfs maps it.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kucofs_common::pm::{FlushInstr, Region};

const REGION: u64 = 64 << 20;

fn region() -> (tempfile::TempDir, Region) {
    let dir = tempfile::Builder::new()
        .prefix("kucofs-bench-")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("temporary directory");
    let r = Region::create(&dir.path().join("bench.img"), REGION, false).expect("region");
    // Touch every page once so page faults stay out of the figures.
    r.fill(0, REGION, 1).expect("fill");
    (dir, r)
}

fn primitives(c: &mut Criterion) {
    let (_dir, r) = region();
    println!(
        "flush instruction: {} (persistence backend {}, region {})",
        FlushInstr::detect(),
        r.persist_name(),
        r.mode()
    );
    let page = vec![0x5au8; 4096];
    let mut g = c.benchmark_group("persist");
    // Walk through the region so each iteration touches a different line or
    // page, as a log or a stream of data writes would.
    let mut at = 0u64;
    let mut next = |step: u64| {
        at = ((at / step + 1) * step) % REGION;
        at
    };

    g.throughput(Throughput::Bytes(64));
    g.bench_function("store+flush+fence 64B", |b| {
        b.iter(|| {
            let off = next(64);
            r.write(off, &page[..64]).unwrap();
            r.flush(off, 64).unwrap();
            r.fence();
        })
    });
    g.bench_function("flush 64B (line just written)", |b| {
        b.iter_batched(
            || {
                let off = next(64);
                r.write(off, &page[..64]).unwrap();
                off
            },
            |off| r.flush(off, 64).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.throughput(Throughput::Bytes(4096));
    g.bench_function("flush 4KiB (page just written)", |b| {
        b.iter_batched(
            || {
                let off = next(4096);
                r.write(off, &page).unwrap();
                off
            },
            |off| r.flush(off, 4096).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.throughput(Throughput::Elements(1));
    g.bench_function("fence", |b| b.iter(|| r.fence()));
    g.throughput(Throughput::Bytes(4096));
    g.bench_function("non-temporal copy 4KiB + fence", |b| {
        b.iter(|| {
            let off = next(4096);
            r.write_nt(off, black_box(&page)).unwrap();
            r.fence();
        })
    });
    g.bench_function("cached copy 4KiB + flush + fence", |b| {
        b.iter(|| {
            let off = next(4096);
            r.write(off, black_box(&page)).unwrap();
            r.persist(off, 4096).unwrap();
        })
    });
    // Non-zero so the allocation is touched now, not page-faulted in the loop.
    let mut dst = vec![1u8; 64 << 20];
    let mut slot = 0usize;
    g.bench_function("copy_from_slice 4KiB (baseline, not persistent)", |b| {
        b.iter(|| {
            slot = (slot + 4096) % dst.len();
            dst[slot..slot + 4096].copy_from_slice(black_box(&page));
            black_box(&dst[slot]);
        })
    });
    g.finish();
}

criterion_group!(benches, primitives);
criterion_main!(benches);
