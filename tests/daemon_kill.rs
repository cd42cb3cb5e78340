//! `kill -9` of daemon clients and of the daemon itself, in the middle of
//! writes (ARCHITECTURE.md §2, daemon mode): what was acknowledged stays,
//! what a dead client held comes back, and the image stays sound. The
//! clients are child processes (this test binary run again for one
//! `#[ignore]`d child test); each reports every write it was
//! acknowledged through its stdout, a pipe the test reads.

mod support;

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use kucofs::{File, Fs, OpenOptions};
use support::daemon::{
    assert_fsck_clean, child_env, parse_record, record, ChildLines, Daemon, Reaped, Rng, RECORD,
};

/// Every this many records, a writer also makes a file.
const MAKE_EVERY: u32 = 4;

#[test]
#[ignore = "a child process of the kill tests"]
fn acked_writer() {
    let (Some(socket), Some(file)) = (child_env("KUCOFS_SOCKET"), child_env("KUCOFS_FILE")) else {
        return;
    };
    let fs = Fs::connect(&socket).unwrap();
    let f = File::create(&fs, &file).unwrap();
    drop(f);
    let f = OpenOptions::new().append(true).open(&fs, &file).unwrap();
    println!("READY");
    for seq in 0.. {
        if let Err(e) = (&f).write_all(&record(1, seq, 0)) {
            println!("END {}", e.raw_os_error().unwrap_or(0));
            return;
        }
        println!("ACK {seq}");
        if seq % MAKE_EVERY == 0 {
            if let Err(e) = fs.create_file(format!("{file}-m{seq}")) {
                println!("END {}", e.raw_os_error().unwrap_or(0));
                return;
            }
            println!("MADE {seq}");
        }
    }
}

/// What a writer was acknowledged: records appended, and the files made
/// (by the record they followed).
#[derive(Debug, Default)]
struct Acked {
    records: u32,
    made: Vec<u32>,
}

impl Acked {
    /// Takes in one line of a writer's report.
    fn note(&mut self, line: &str) {
        match line.split_once(' ') {
            Some(("ACK", n)) => {
                let n: u32 = n.parse().unwrap();
                assert_eq!(n, self.records, "acknowledgements out of order");
                self.records += 1;
            }
            Some(("MADE", n)) => self.made.push(n.parse().unwrap()),
            _ => {}
        }
    }

    /// Checks that `fs` holds everything acknowledged of `file`: each
    /// record whole and in order (one more, in flight when the writer
    /// died, may be there, whole), and each file made.
    fn check(&self, fs: &Fs, file: &str) {
        let data = fs.read(file).unwrap();
        assert_eq!(data.len() % RECORD, 0, "{file}: a torn record at the end");
        let n = data.len() / RECORD;
        let acked = self.records as usize;
        assert!(
            n == acked || n == acked + 1,
            "{file}: {n} records, {acked} acknowledged"
        );
        for (seq, r) in (0u32..).zip(data.chunks(RECORD)) {
            assert_eq!(parse_record(r), Some((1, seq, 0)), "{file}: record {seq}");
        }
        for m in &self.made {
            assert!(fs.exists(format!("{file}-m{m}")), "{file}-m{m} is gone");
        }
    }
}

/// Starts an [`acked_writer`] of `file`, once it is ready to write.
fn start_writer(socket: &Path, file: &str) -> (Reaped, ChildLines) {
    let mut child = support::child_test("acked_writer")
        .env("KUCOFS_SOCKET", socket)
        .env("KUCOFS_FILE", file)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = ChildLines::of(&mut child);
    lines.expect("READY");
    (Reaped(child), lines)
}

#[test]
#[ignore = "a child process of the kill tests"]
fn steady_client() {
    let Some(socket) = child_env("KUCOFS_SOCKET") else {
        return;
    };
    let fs = Fs::connect(&socket).unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .open(&fs, "steady")
        .unwrap();
    // Its parent closes stdin to stop it.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
        flag.store(true, std::sync::atomic::Ordering::Release);
    });
    println!("READY");
    let mut buf = vec![0u8; RECORD];
    let mut done = 0u32;
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        let slot = done % 16;
        let at = u64::from(slot) * RECORD as u64;
        f.write_at(&record(2, done, slot), at).unwrap();
        assert_eq!(f.read_at(&mut buf, at).unwrap(), RECORD);
        assert_eq!(parse_record(&buf), Some((2, done, slot)));
        let name = format!("steady-{}", done % 8);
        fs.create_file(&name).unwrap();
        fs.remove_file(&name).unwrap();
        done += 1;
    }
    println!("DONE {done}");
}

/// A client process killed (SIGKILL) at random moments in a stream of
/// writes, 24 times: after each kill every write it had acknowledged is
/// there, whole; another client process writes and checks its own writes
/// throughout, unharmed; at the end, with the files removed, the file
/// system takes as much again as before (nothing a dead client held stays
/// held), and fsck finds the image clean.
#[test]
fn killed_clients_lose_no_acknowledged_write_and_keep_nothing() {
    let Some(dir) = support::shm_dir("kucofs-kill-clients-") else {
        return;
    };
    let (image, socket) = (dir.path().join("fs.img"), dir.path().join("kfs.sock"));
    Fs::create(&image, 32 << 20).unwrap().close().unwrap();
    let daemon = Daemon::start(&image, &socket, &[]);
    let fs = Fs::connect(&socket).unwrap();
    let before = support::daemon::capacity(&fs);
    assert!(before > 16 << 20, "only {before} bytes fit");

    let mut steady = Reaped(
        support::child_test("steady_client")
            .env("KUCOFS_SOCKET", &socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut steady_lines = ChildLines::of(&mut steady.0);
    steady_lines.expect("READY");

    let mut rng = Rng::new("killed clients");
    let start = Instant::now();
    for round in 0..24 {
        let file = format!("kill-{round}");
        let (mut child, mut lines) = start_writer(&socket, &file);
        let mut acked = Acked::default();
        // Killed after a random number of acknowledged writes, and a
        // random while into the next one.
        let wait = rng.below(30);
        while u64::from(acked.records) <= wait {
            let line = lines.next_line().expect("the writer goes on");
            acked.note(&line);
        }
        std::thread::sleep(Duration::from_micros(rng.below(2000)));
        child.0.kill().unwrap();
        child.0.wait().unwrap();
        // What it wrote into the pipe before it died was acknowledged too.
        while let Some(line) = lines.next_line() {
            acked.note(&line);
        }
        acked.check(&fs, &file);
    }
    println!("24 clients killed in {:.1?}", start.elapsed());

    // The steady client kept working, and stops cleanly.
    drop(steady.0.stdin.take());
    let done = steady_lines.expect("DONE");
    assert!(steady.0.wait().unwrap().success());
    let n: u32 = done["DONE ".len()..].parse().unwrap();
    assert!(n > 0, "the steady client wrote nothing");

    // Everything removed: the file system holds as much as before.
    for name in fs.read_dir("/").unwrap() {
        fs.remove_file(name.unwrap().file_name()).unwrap();
    }
    let after = support::daemon::capacity(&fs);
    assert!(
        after + (1 << 20) >= before,
        "{before} bytes fitted before, {after} after: pages stayed held"
    );
    fs.close().unwrap();
    let (status, _) = daemon.stop();
    assert!(status.success());
    assert_fsck_clean(&image);
}

/// The daemon killed (SIGKILL) while two client processes write, three
/// times over one image: the clients get an error, not a hang; the
/// daemon restarted on the image recovers it, with every write and every
/// file made that a client had acknowledged; fsck finds it clean.
#[test]
fn a_killed_daemon_recovers_every_acknowledged_operation() {
    let Some(dir) = support::shm_dir("kucofs-kill-daemon-") else {
        return;
    };
    let (image, socket) = (dir.path().join("fs.img"), dir.path().join("kfs.sock"));
    Fs::create(&image, 64 << 20).unwrap().close().unwrap();
    let mut rng = Rng::new("killed daemon");
    for round in 0..3 {
        let daemon = Daemon::start(&image, &socket, &[]);
        let files = [format!("r{round}-a"), format!("r{round}-b")];
        let mut writers: Vec<_> = files.iter().map(|f| start_writer(&socket, f)).collect();
        let mut acked = [Acked::default(), Acked::default()];
        let wait = 5 + rng.below(30);
        for (w, a) in writers.iter_mut().zip(&mut acked) {
            while u64::from(a.records) < wait {
                a.note(&w.1.next_line().expect("the writer goes on"));
            }
        }
        std::thread::sleep(Duration::from_micros(rng.below(2000)));
        daemon.kill();
        for ((mut child, mut lines), a) in writers.into_iter().zip(&mut acked) {
            let mut end = None;
            while let Some(line) = lines.next_line() {
                if let Some(e) = line.strip_prefix("END ") {
                    end = Some(e.to_owned());
                }
                a.note(&line);
            }
            assert!(child.0.wait().unwrap().success());
            assert_eq!(end, Some(libc::ENOTCONN.to_string()));
        }
        let daemon = Daemon::start(&image, &socket, &[]);
        let fs = Fs::connect(&socket).unwrap();
        for (a, f) in acked.iter().zip(&files) {
            a.check(&fs, f);
        }
        fs.close().unwrap();
        let (status, _) = daemon.stop();
        assert!(status.success());
        assert_fsck_clean(&image);
    }
}
