//! The longest single creates in one directory as it grows: files are
//! created one by one, each create timed, and the slowest few are printed
//! with the entry count they reached. Each is timed twice: by the clock,
//! and by the thread's CPU time, which leaves out the time the thread
//! waited for a core (on a busy machine, tens of milliseconds now and
//! then, whatever the create did).
//!
//! ```sh
//! cargo run --release --example create_stalls -- 4200000          # through the library
//! cargo run --release --example create_stalls -- 4200000 --index  # the index alone
//! ```
//!
//! Through the library, on a fresh image under `/dev/shm` (16 GiB, sparse:
//! a checkpoint slot, a sixteenth of the image, holds a namespace of
//! millions of files), creates are applied as a program's are, with Kfs
//! running beside them. With `--index`, they go straight to a namespace:
//! no log, and no Kfs thread to do anything ahead, so the create that
//! reaches the next 4 MiB of the index populates its pages itself (1,024
//! pages, a millisecond or more), and what is left of a table doubling at
//! the end is then finished in the steps the Kfs thread takes while idle.
//!
//! The default, 4,200,000 entries, passes the table's doubling to 2^23
//! buckets at the 4,194,305th create.

use std::time::{Duration, Instant};

use kucofs_common::proto::{Creds, Entry, Request};
use kucofs_kfs::namespace::Namespace;
use kucofs_kfs::server::IDLE_GROW_STEP;

/// Slowest creates kept.
const KEEP: usize = 6;

/// The calling thread's CPU time.
fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live, writable timespec, and
    // CLOCK_THREAD_CPUTIME_ID a valid clock: the call only writes `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    // A CPU-time clock counts up from zero, in whole seconds and
    // nanoseconds below 10^9.
    let secs = u64::try_from(ts.tv_sec).expect("CPU time is not negative");
    let nanos = u32::try_from(ts.tv_nsec).expect("nanoseconds are below 10^9");
    Duration::new(secs, nanos)
}

/// The slowest creates: (time, entries after the create), slowest first.
#[derive(Default)]
struct Slowest(Vec<(Duration, u64)>);

impl Slowest {
    fn note(&mut self, took: Duration, entries: u64) {
        if self.0.len() < KEEP || took > self.0[KEEP - 1].0 {
            let at = self.0.partition_point(|s| s.0 >= took);
            self.0.insert(at, (took, entries));
            self.0.truncate(KEEP);
        }
    }

    fn print(&self, what: &str) {
        println!("slowest by {what}:");
        for (took, entries) in &self.0 {
            println!("{took:>12.3?} at entry {entries}");
        }
    }
}

/// Makes `n` files in one directory with `create(i)`, timing each.
fn time_creates(n: u64, mut create: impl FnMut(u64)) {
    let (mut wall, mut cpu) = (Slowest::default(), Slowest::default());
    let mut over_ms = 0u64;
    let start = Instant::now();
    for i in 0..n {
        let (t, c) = (Instant::now(), cpu_time());
        create(i);
        let (took, used) = (t.elapsed(), cpu_time() - c);
        over_ms += u64::from(used >= Duration::from_millis(1));
        wall.note(took, i + 1);
        cpu.note(used, i + 1);
    }
    let total = start.elapsed();
    println!(
        "{n} creates in {total:.2?} ({:.0} ns each on average, timing included); \
         {over_ms} took 1 ms of CPU time or more",
        total.as_nanos() as f64 / n as f64
    );
    wall.print("the clock");
    cpu.print("CPU time");
}

fn through_the_library(n: u64) {
    let image = format!("/dev/shm/kucofs-create-stalls-{}.img", std::process::id());
    let fs = kucofs::Fs::create_sparse(&image, 16 << 30).expect("an image under /dev/shm");
    fs.create_dir("d").expect("mkdir d");
    time_creates(n, |i| fs.create_file(format!("d/f{i}")).expect("create"));
    drop(fs);
    let _ = std::fs::remove_file(&image);
}

fn in_the_index(n: u64) {
    let root = Creds::default();
    let mut ns = Namespace::new(root, 1).expect("a namespace");
    let mkdir = Request::Create {
        at: Entry::Path(b"d"),
        mode: libc::S_IFDIR | 0o755,
        target: b"",
        hint: None,
    };
    ns.execute(&mkdir, root).expect("mkdir d");
    time_creates(n, |i| {
        let path = format!("d/f{i}");
        let create = Request::Create {
            at: Entry::Path(path.as_bytes()),
            mode: libc::S_IFREG | 0o644,
            target: b"",
            hint: None,
        };
        ns.execute(&create, root).expect("create");
    });
    let (mut steps, mut longest) = (0u64, Duration::ZERO);
    let start = Instant::now();
    loop {
        let c = cpu_time();
        let more = ns.grow_step(IDLE_GROW_STEP);
        longest = longest.max(cpu_time() - c);
        steps += 1;
        if !more {
            break;
        }
    }
    println!(
        "then {steps} idle steps of {IDLE_GROW_STEP} buckets in {:.2?}, \
         the longest {longest:.3?} of CPU time",
        start.elapsed()
    );
}

fn main() {
    let mut n = 4_200_000;
    let mut index = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--index" => index = true,
            s => n = s.parse().expect("usage: create_stalls [entries] [--index]"),
        }
    }
    if index {
        in_the_index(n);
    } else {
        through_the_library(n);
    }
}
