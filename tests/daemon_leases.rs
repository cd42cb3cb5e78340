//! Write leases between client processes of one daemon, and the eviction
//! of a client that holds a reader epoch too long (ARCHITECTURE.md §8,
//! §9). The writers and the stopped reader are child processes: this
//! test binary run again for one `#[ignore]`d child test, configured
//! through the environment.

mod support;

use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use kucofs::{File, Fs, OpenOptions};
use support::daemon::{child_env, parse_record, record, ChildLines, Daemon, Reaped, Rng, RECORD};

/// An image served by a daemon on a socket beside it (the directory goes
/// when the test ends).
struct Served {
    _dir: tempfile::TempDir,
    image: PathBuf,
    socket: PathBuf,
    daemon: Daemon,
}

fn serve(prefix: &str, size: u64, args: &[&str]) -> Option<Served> {
    let dir = support::shm_dir(prefix)?;
    let image = dir.path().join("fs.img");
    let socket = dir.path().join("kfs.sock");
    Fs::create(&image, size).unwrap().close().unwrap();
    let daemon = Daemon::start(&image, &socket, args);
    Some(Served {
        _dir: dir,
        image,
        socket,
        daemon,
    })
}

/// Writers in each run: records each writes.
const WRITES: u32 = 150;
/// Slots of the file the overwriting writers write records into.
const SLOTS: u32 = 48;

/// Starts child test `lease_writer` as writer `writer` (1 or 2) of file
/// `path` on `socket`, appending or overwriting random slots; it says
/// `READY` once the file is open and waits for a line on its stdin.
fn start_writer(socket: &std::path::Path, writer: u8, append: bool) -> (Reaped, ChildLines) {
    let mut child = support::child_test("lease_writer")
        .env("KUCOFS_SOCKET", socket)
        .env("KUCOFS_WRITER", writer.to_string())
        .env("KUCOFS_APPEND", if append { "1" } else { "0" })
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = ChildLines::of(&mut child);
    lines.expect("READY");
    (Reaped(child), lines)
}

/// Lets writers that said `READY` go, at once.
fn go(writers: &mut [(Reaped, ChildLines)]) {
    for (c, _) in writers.iter_mut() {
        c.0.stdin.take().unwrap().write_all(b"go\n").unwrap();
    }
}

/// Waits for the writers to finish, each having written all its records.
fn finish(writers: Vec<(Reaped, ChildLines)>) {
    for (mut c, mut lines) in writers {
        let done = lines.expect("DONE");
        assert_eq!(done, format!("DONE {WRITES}"));
        assert!(c.0.wait().unwrap().success());
    }
}

#[test]
#[ignore = "a child process of the lease tests"]
fn lease_writer() {
    let Some(socket) = child_env("KUCOFS_SOCKET") else {
        return;
    };
    let writer: u8 = child_env("KUCOFS_WRITER").unwrap().parse().unwrap();
    let append = child_env("KUCOFS_APPEND").as_deref() == Some("1");
    let fs = Fs::connect(&socket).unwrap();
    let f = OpenOptions::new()
        .write(true)
        .append(append)
        .open(&fs, "shared")
        .unwrap();
    println!("READY");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let mut rng = Rng::new("lease_writer");
    for seq in 0..WRITES {
        if append {
            let n = (&f).write(&record(writer, seq, 0)).unwrap();
            assert_eq!(n, RECORD);
        } else {
            let slot = u32::try_from(rng.below(u64::from(SLOTS))).unwrap();
            let at = u64::from(slot) * RECORD as u64;
            let n = f.write_at(&record(writer, seq, slot), at).unwrap();
            assert_eq!(n, RECORD);
        }
    }
    println!("DONE {WRITES}");
    drop(f);
    fs.close().unwrap();
}

/// Two processes append records of 6,000 bytes to one file at once: each
/// append lands whole at the end (no record is torn or written over),
/// both get all theirs in, in their order, and their records interleave
/// (the lease went back and forth, not once).
#[test]
fn appends_from_two_processes_land_whole_and_interleave() {
    let Some(s) = serve("kucofs-leases-append-", 64 << 20, &[]) else {
        return;
    };
    let fs = Fs::connect(&s.socket).unwrap();
    fs.create_file("shared").unwrap();
    let mut writers = vec![
        start_writer(&s.socket, 1, true),
        start_writer(&s.socket, 2, true),
    ];
    go(&mut writers);
    finish(writers);
    let data = fs.read("shared").unwrap();
    assert_eq!(data.len(), 2 * WRITES as usize * RECORD);
    let mut next = [0u32; 3];
    let mut switches = 0;
    let mut last = 0;
    for (i, r) in data.chunks(RECORD).enumerate() {
        let (w, seq, _) = parse_record(r).unwrap_or_else(|| panic!("record {i} is torn"));
        assert_eq!(
            seq,
            next[usize::from(w)],
            "record {i}: writer {w} out of order"
        );
        next[usize::from(w)] += 1;
        switches += u32::from(last != 0 && last != w);
        last = w;
    }
    assert_eq!(next, [0, WRITES, WRITES]);
    assert!(
        switches >= 2,
        "the writers took turns {switches} times: one waited for the other's end"
    );
    fs.close().unwrap();
    let (status, _) = s.daemon.stop();
    assert!(status.success());
    support::daemon::assert_fsck_clean(&s.image);
}

/// One of two appending processes is stopped (SIGSTOP) at a random
/// moment, most likely inside a write, holding the lease: the other
/// finishes all its appends while it is stopped (waiting at most the
/// lease bound, 1 s, for it); continued, the stopped one finishes too,
/// its write in flight redone at the new end, and every record is whole,
/// in each writer's order.
#[test]
fn a_stopped_appender_holds_the_other_back_only_for_the_bound() {
    let Some(s) = serve("kucofs-leases-stopped-", 64 << 20, &[]) else {
        return;
    };
    let fs = Fs::connect(&s.socket).unwrap();
    fs.create_file("shared").unwrap();
    let mut writers = vec![
        start_writer(&s.socket, 1, true),
        start_writer(&s.socket, 2, true),
    ];
    go(&mut writers);
    let mut rng = Rng::new("stopped appender");
    std::thread::sleep(Duration::from_micros(500 + rng.below(3000)));
    support::daemon::signal(&writers[0].0 .0, rustix::process::Signal::STOP);
    let second = writers.pop().unwrap();
    let start = Instant::now();
    finish(vec![second]);
    println!("the other writer finished in {:.1?}", start.elapsed());
    support::daemon::signal(&writers[0].0 .0, rustix::process::Signal::CONT);
    finish(writers);
    let data = fs.read("shared").unwrap();
    assert_eq!(data.len(), 2 * WRITES as usize * RECORD);
    let mut next = [0u32; 3];
    for (i, r) in data.chunks(RECORD).enumerate() {
        let (w, seq, _) = parse_record(r).unwrap_or_else(|| panic!("record {i} is torn"));
        assert_eq!(
            seq,
            next[usize::from(w)],
            "record {i}: writer {w} out of order"
        );
        next[usize::from(w)] += 1;
    }
    fs.close().unwrap();
}

/// Two processes overwrite random slots of one file with records while a
/// third (this test) reads random slots: every read finds a whole record
/// of the slot, the writers both write all theirs, and at the end every
/// slot holds a whole record.
#[test]
fn overwrites_from_two_processes_are_whole_to_a_third_reading() {
    let Some(s) = serve("kucofs-leases-overwrite-", 64 << 20, &[]) else {
        return;
    };
    let fs = Fs::connect(&s.socket).unwrap();
    let f = File::create(&fs, "shared").unwrap();
    for slot in 0..SLOTS {
        let at = u64::from(slot) * RECORD as u64;
        assert_eq!(f.write_at(&record(3, 0, slot), at).unwrap(), RECORD);
    }
    drop(f);
    let mut writers = vec![
        start_writer(&s.socket, 1, false),
        start_writer(&s.socket, 2, false),
    ];
    go(&mut writers);
    let f = File::open(&fs, "shared").unwrap();
    let mut rng = Rng::new("overwrites");
    let mut buf = vec![0u8; RECORD];
    let mut reads = 0u32;
    let start = Instant::now();
    while writers
        .iter_mut()
        .any(|w| w.0 .0.try_wait().unwrap().is_none())
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the writers hang"
        );
        let slot = u32::try_from(rng.below(u64::from(SLOTS))).unwrap();
        let at = u64::from(slot) * RECORD as u64;
        assert_eq!(f.read_at(&mut buf, at).unwrap(), RECORD);
        let (_, _, found) = parse_record(&buf).unwrap_or_else(|| panic!("slot {slot} read torn"));
        assert_eq!(found, slot);
        reads += 1;
    }
    finish(writers);
    assert!(reads > 0);
    let data = fs.read("shared").unwrap();
    assert_eq!(data.len(), SLOTS as usize * RECORD);
    for (slot, r) in (0..SLOTS).zip(data.chunks(RECORD)) {
        let (_, _, found) = parse_record(r).unwrap_or_else(|| panic!("slot {slot} is torn"));
        assert_eq!(found, slot);
    }
    drop(f);
    fs.close().unwrap();
}

#[test]
#[ignore = "a child process of the eviction test"]
fn stopped_reader() {
    let Some(socket) = child_env("KUCOFS_SOCKET") else {
        return;
    };
    let fs = Fs::connect(&socket).unwrap();
    let f = File::open(&fs, "big").unwrap();
    let mut buf = vec![0u8; BIG];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), BIG);
    assert!(buf == big(1));
    println!("READ-OK");
    let mut paused = false;
    let r = f.debug_read_at_paused(&mut buf, 0, || {
        if !paused {
            paused = true;
            println!("PAUSED");
            std::io::stdout().flush().unwrap();
            // SAFETY: raise has no preconditions; the process stops here
            // until its parent continues it.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
    });
    let errno = |r: std::io::Result<()>| r.err().and_then(|e| e.raw_os_error()).unwrap_or(0);
    println!("RESULT {}", errno(r.map(|_| ())));
    println!("AFTER {}", errno(fs.metadata("big").map(|_| ())));
}

/// Bytes of the file the stopped reader reads.
const BIG: usize = 4 << 20;

/// The contents of a file of [`BIG`] bytes, version `v`.
fn big(v: u8) -> Vec<u8> {
    (0..BIG)
        .map(|i| u8::try_from(i % 253).unwrap() ^ v)
        .collect()
}

/// True once process `pid` is stopped.
fn stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command's closing parenthesis.
    stat.rsplit_once(") ")
        .is_some_and(|(_, rest)| rest.starts_with('T'))
}

/// A client stopped (SIGSTOP) inside a read holds back reclamation only
/// until the bound (1 s here): then the daemon evicts it, the other
/// client goes on overwriting many times the image's size, and the
/// stopped one, continued, gets `ENOTCONN` from the read it was in (not
/// the data of pages reused meanwhile) and from every call after.
#[test]
fn a_client_stopped_in_a_read_is_evicted_and_reclamation_goes_on() {
    const IMAGE: u64 = 32 << 20;
    let Some(mut s) = serve("kucofs-evict-", IMAGE, &["--evict-after-ms", "1000"]) else {
        return;
    };
    let fs = Fs::connect(&s.socket).unwrap();
    fs.write("big", big(1)).unwrap();
    let mut child = Reaped(
        support::child_test("stopped_reader")
            .env("KUCOFS_SOCKET", &s.socket)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = ChildLines::of(&mut child.0);
    lines.expect("READ-OK");
    lines.expect("PAUSED");
    let start = Instant::now();
    while !stopped(child.0.id()) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the child did not stop"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The pages the stopped reader found go, and four times the image's
    // size is written over one file: without reclamation the image fills
    // after less than one.
    fs.remove_file("big").unwrap();
    let data = big(2);
    let mut rounds = 0;
    while rounds < 4 * IMAGE / BIG as u64 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "reclamation stopped: {rounds} rounds written"
        );
        match fs.write("churn", &data) {
            Ok(()) => rounds += 1,
            // Freed pages wait for reclamation, and for the eviction.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("the other client failed: {e}"),
        }
    }
    assert!(fs.read("churn").unwrap() == data);
    let said = s.daemon.stderr_line();
    assert!(said.contains("evicted"), "the daemon said {said:?}");
    support::daemon::signal(&child.0, rustix::process::Signal::CONT);
    let enotconn = format!("{}", libc::ENOTCONN);
    assert_eq!(lines.expect("RESULT"), format!("RESULT {enotconn}"));
    assert_eq!(lines.expect("AFTER"), format!("AFTER {enotconn}"));
    assert!(child.0.wait().unwrap().success());
    fs.close().unwrap();
}
