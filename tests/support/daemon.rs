//! A `kucofs serve` in a child process, for the tests of daemon mode.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The `kucofs` command this package built.
pub fn kucofs() -> Command {
    Command::new(super::companion::binary(env!("CARGO_BIN_EXE_kucofs")))
}

/// A running `kucofs serve`; killed (SIGKILL) when dropped.
pub struct Daemon {
    /// The daemon's process.
    pub child: Child,
}

impl Daemon {
    /// Serves `image` on `socket` with the extra arguments `args`, once
    /// clients can connect.
    pub fn start(image: &Path, socket: &Path, args: &[&str]) -> Daemon {
        let child = kucofs()
            .arg("serve")
            .arg(image)
            .arg("--socket")
            .arg(socket)
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("kucofs serve starts");
        let mut d = Daemon { child };
        // It says so on stderr once clients can connect.
        let line = d.stderr_line();
        assert!(line.contains("serving"), "daemon said {line:?}");
        d
    }

    /// The next line the daemon writes on stderr (without its newline;
    /// empty once stderr has closed).
    pub fn stderr_line(&mut self) -> String {
        let err = self.child.stderr.as_mut().expect("stderr is piped");
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while err.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        String::from_utf8_lossy(&line).into_owned()
    }

    /// Kills it with SIGKILL, as a crash would, and reaps it.
    pub fn kill(mut self) {
        self.child.kill().expect("kill the daemon");
        self.child.wait().expect("reap the daemon");
    }

    /// Sends SIGTERM and returns its exit status and the rest of stderr.
    pub fn stop(mut self) -> (std::process::ExitStatus, String) {
        signal(&self.child, rustix::process::Signal::TERM);
        let mut rest = String::new();
        let mut err = self.child.stderr.take().expect("stderr is piped");
        err.read_to_string(&mut rest)
            .expect("read the daemon's stderr");
        (self.child.wait().expect("reap the daemon"), rest)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child process killed (SIGKILL, which also ends a stopped one) and
/// reaped when dropped, so that a failing test leaves none behind.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends `sig` to `child`.
pub fn signal(child: &Child, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(child.id().cast_signed()).expect("a child's pid");
    rustix::process::kill_process(pid, sig).expect("signal a child");
}

/// Runs `kucofs fsck` on `image` and panics, with its report, unless it
/// finds the image clean.
pub fn assert_fsck_clean(image: &Path) {
    let out = kucofs()
        .arg("fsck")
        .arg(image)
        .output()
        .expect("kucofs fsck runs");
    assert!(
        out.status.success(),
        "fsck of {} failed:\n{}\n{}",
        image.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A small pseudo-random generator (xorshift64*), seeded from the clock
/// unless `KUCOFS_SEED` names a seed; the seed is printed, so that a
/// failure can be run again.
pub struct Rng(u64);

impl Rng {
    /// A generator for the test named `what`.
    pub fn new(what: &str) -> Rng {
        let seed = std::env::var("KUCOFS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                t.as_secs() ^ u64::from(t.subsec_nanos()) ^ u64::from(std::process::id())
            })
            | 1;
        println!("{what}: KUCOFS_SEED={seed}");
        Rng(seed)
    }

    /// A number below `n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// Bytes of a test record: a header (writer, sequence number, slot) and
/// a body that follows from it, so that a record made of two writes'
/// bytes does not parse. Not a multiple of a page: records straddle
/// pages, and a write of one copies the old bytes around it.
pub const RECORD: usize = 6000;

/// Byte `i` of the body of record (`writer`, `seq`, `slot`).
fn body_byte(writer: u8, seq: u32, slot: u32, i: usize) -> u8 {
    let x = u64::from(writer) * 31 + u64::from(seq) * 7 + u64::from(slot) * 13 + i as u64;
    u8::try_from(x % 251).expect("below 251")
}

/// Record `seq` of `writer`, meant for `slot`.
pub fn record(writer: u8, seq: u32, slot: u32) -> Vec<u8> {
    let mut r = vec![0u8; RECORD];
    r[0] = writer;
    r[1..5].copy_from_slice(&seq.to_le_bytes());
    r[5..9].copy_from_slice(&slot.to_le_bytes());
    for (i, b) in r[9..].iter_mut().enumerate() {
        *b = body_byte(writer, seq, slot, i);
    }
    r
}

/// The (writer, sequence number, slot) of a whole record; `None` if `r`
/// is not one (torn, or zeros).
pub fn parse_record(r: &[u8]) -> Option<(u8, u32, u32)> {
    if r.len() != RECORD || r[0] == 0 {
        return None;
    }
    let word = |at: usize| u32::from_le_bytes(r[at..at + 4].try_into().expect("4 bytes"));
    let (writer, seq, slot) = (r[0], word(1), word(5));
    let whole = r[9..]
        .iter()
        .enumerate()
        .all(|(i, &b)| b == body_byte(writer, seq, slot, i));
    whole.then_some((writer, seq, slot))
}

/// The value of environment variable `name` in a child test; `None` when
/// it is not set (the child test was run on its own, not by its parent).
pub fn child_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// A child test's standard output, line by line: the lines it writes
/// for its parent start with a capital word (`READY`, `ACK 3`); the test
/// harness's own lines are skipped.
pub struct ChildLines(std::io::BufReader<std::process::ChildStdout>);

impl ChildLines {
    /// The lines of `child`'s standard output (piped).
    pub fn of(child: &mut Child) -> ChildLines {
        ChildLines(std::io::BufReader::new(
            child.stdout.take().expect("stdout is piped"),
        ))
    }

    /// The next line the child test wrote for its parent; `None` at the
    /// end of its output.
    pub fn next_line(&mut self) -> Option<String> {
        use std::io::BufRead;
        loop {
            let mut line = String::new();
            if self.0.read_line(&mut line).ok()? == 0 {
                return None;
            }
            // With `--nocapture` the harness starts the test's line
            // (`test name ... `) before the test writes anything.
            let line = line.trim_end();
            let line = line.rsplit_once(" ... ").map_or(line, |(_, l)| l);
            if line.starts_with(|c: char| c.is_ascii_uppercase())
                && line
                    .split(' ')
                    .next()
                    .is_some_and(|w| w.chars().all(|c| c.is_ascii_uppercase() || c == '-'))
            {
                return Some(line.to_owned());
            }
        }
    }

    /// Skips lines until one starting with `word`; panics at the end of
    /// the output.
    pub fn expect(&mut self, word: &str) -> String {
        loop {
            let line = self
                .next_line()
                .unwrap_or_else(|| panic!("the child ended before saying {word}"));
            if line.split(' ').next() == Some(word) {
                return line;
            }
        }
    }
}

/// Bytes of each file [`capacity`] writes.
pub const FILL: usize = 512 << 10;

/// How many bytes of files `fs` takes before it is full, found by
/// writing files of [`FILL`] bytes until the writes keep failing with
/// `ENOSPC` (freed pages come back after their grace period: a failure
/// is tried again a few times); the files are removed again. (`statfs`
/// counts pool pages as free: only filling shows who holds them.)
pub fn capacity(fs: &kucofs::Fs) -> usize {
    let data = vec![7u8; FILL];
    let mut files = 0;
    let mut refused = 0;
    while refused < 5 {
        match fs.write(format!("fill-{files}"), &data) {
            Ok(()) => {
                files += 1;
                refused = 0;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                refused += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => panic!("fill: {e}"),
        }
    }
    for i in 0..=files {
        let _ = fs.remove_file(format!("fill-{i}"));
    }
    files * FILL
}

/// Writes all of `data` at `offset`.
pub fn write_all_at(f: &kucofs::File, mut data: &[u8], mut offset: u64) {
    while !data.is_empty() {
        let n = f.write_at(data, offset).unwrap();
        assert!(n > 0);
        data = &data[n..];
        offset += n as u64;
    }
}

/// The whole of file `path`.
pub fn read_all(fs: &kucofs::Fs, path: &str) -> Vec<u8> {
    let mut got = Vec::new();
    kucofs::OpenOptions::new()
        .read(true)
        .open(fs, path)
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    got
}
