//! KucoFS served by a daemon (`kucofs serve`, ARCHITECTURE.md §2), and the
//! benchmark as one of its client processes.
//!
//! `kucofs-daemon[:OPTION+...]` makes a fresh image under `/dev/shm`
//! (sized as the `kucofs` backend's), starts `kucofs serve` on it, waits
//! until it serves, and attaches with `Fs::connect`; at the end it closes
//! its connection, stops the daemon with SIGTERM (it closes the image
//! cleanly) and removes the image. Options, joined with `+`: `size=SIZE`
//! (default 4G), `sparse`, `image=PATH` (as for `kucofs`), `nohints`
//! (collaborative indexing off), `keep` (the image is left in place,
//! closed cleanly, at the end), `trusted-writes` (the daemon runs with
//! `--trusted-writes`: the benchmark, a trusted client, writes file data
//! into pool pages itself instead of through a staging area Kfs copies
//! from), and `bin=PATH`, the `kucofs` binary to
//! run: by default `$KUCOFS_BIN`, else the `kucofs` beside this
//! program's own executable (`cargo build --release --workspace` builds
//! both).
//!
//! `kucofs-client:SOCKET` attaches to a daemon already serving on
//! `SOCKET`; a worker process of a `kucofs-daemon` run opens the daemon's
//! file system this way (see [`Backend::attach_spec`]).

use std::io::{self, BufRead, BufReader};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use kucofs_ulib::{Config, Fs};

use super::kucofs::{image_path, remove_orphaned_images};
use super::{Backend, FileHandle, OpenOptions};
use crate::error::{Error, Result};

/// How long a daemon may take to open its image and listen.
const START_WAIT: Duration = Duration::from_secs(60);
/// How long a daemon may take to close its image once asked to stop.
const STOP_WAIT: Duration = Duration::from_secs(60);
/// The environment variable naming the `kucofs` binary.
pub const BIN_VAR: &str = "KUCOFS_BIN";

/// What a `kucofs-daemon` spec's options ask for.
#[derive(Debug, Clone, PartialEq)]
struct Options {
    size: u64,
    sparse: bool,
    image: PathBuf,
    collaborative: bool,
    keep: bool,
    /// `kucofs serve --trusted-writes`.
    trusted_writes: bool,
    bin: Option<PathBuf>,
}

impl Options {
    /// Parses the text after `kucofs-daemon:`; an error says why it is
    /// refused.
    fn parse(arg: &str) -> Result<Self, String> {
        let mut options = Options {
            size: 4 << 30,
            sparse: false,
            image: image_path("d"),
            collaborative: true,
            keep: false,
            trusted_writes: false,
            bin: None,
        };
        for opt in arg.split('+').filter(|o| !o.is_empty()) {
            match opt.split_once('=') {
                None if opt == "sparse" => options.sparse = true,
                None if opt == "nohints" => options.collaborative = false,
                None if opt == "keep" => options.keep = true,
                None if opt == "trusted-writes" => options.trusted_writes = true,
                Some(("size", v)) => options.size = kucofs_common::size::parse_size(v)?,
                Some(("image", v)) => options.image = PathBuf::from(v),
                Some(("bin", v)) => options.bin = Some(PathBuf::from(v)),
                _ => {
                    return Err(format!(
                        "unknown option `{opt}` (expected size=SIZE, sparse, image=PATH, \
                         nohints, keep, trusted-writes or bin=PATH)"
                    ))
                }
            }
        }
        Ok(options)
    }
}

/// The `kucofs` binary to run: `bin`, else `$KUCOFS_BIN`, else the one
/// beside this program; an error says where it looked.
fn kucofs_binary(bin: Option<&Path>) -> Result<PathBuf, String> {
    let (path, from) = match (bin, std::env::var_os(BIN_VAR)) {
        (Some(b), _) => (b.to_owned(), "bin="),
        (None, Some(v)) => (PathBuf::from(v), BIN_VAR),
        (None, None) => {
            let exe = std::env::current_exe()
                .map_err(|e| format!("cannot tell where this program is: {e}"))?;
            (exe.with_file_name("kucofs"), "beside fxbench")
        }
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "no kucofs binary at {} ({from}): build it (cargo build --release --workspace) \
             or name one with bin=PATH or {BIN_VAR}",
            path.display()
        ))
    }
}

/// A `kucofs serve` this backend started, and the image it serves.
#[derive(Debug)]
struct Daemon {
    child: Child,
    image: PathBuf,
    socket: PathBuf,
    /// Leave the image in place when it stops.
    keep: bool,
    /// What [`Daemon::stop`] found, once it has run.
    stopped: Option<Result<String, String>>,
    /// The daemon's stderr, a line at a time, read by a thread of its own
    /// so that the pipe never fills (in a mutex only to make the backend
    /// `Sync`: this type alone reads it).
    said: Mutex<mpsc::Receiver<String>>,
}

impl Daemon {
    /// Makes a file system in `options.image`, serves it with the
    /// `kucofs` binary, and returns once the daemon listens.
    fn start(options: &Options) -> Result<Daemon, String> {
        let bin = kucofs_binary(options.bin.as_deref())?;
        remove_orphaned_images();
        let image = options.image.clone();
        let mut socket = image.clone().into_os_string();
        socket.push(".sock");
        let socket = PathBuf::from(socket);
        // Leftovers of an earlier, killed run with these names.
        let _ = std::fs::remove_file(&image);
        let _ = std::fs::remove_file(&socket);
        let made = if options.sparse {
            Fs::create_sparse(&image, options.size)
        } else {
            Fs::create(&image, options.size)
        };
        made.and_then(Fs::close).map_err(|e| {
            let _ = std::fs::remove_file(&image);
            format!("cannot make a file system in {}: {e}", image.display())
        })?;
        let mut command = Command::new(&bin);
        command
            .arg("serve")
            .arg(&image)
            .arg("--socket")
            .arg(&socket)
            .args(options.trusted_writes.then_some("--trusted-writes"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: the closure runs in the child between fork and exec,
        // where only async-signal-safe calls are allowed: it makes one
        // `prctl` system call and allocates nothing. A daemon whose
        // benchmark died is then stopped (cleanly: SIGTERM) rather than
        // left serving.
        unsafe {
            command.pre_exec(|| {
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::TERM,
                ))
                .map_err(io::Error::from)
            })
        };
        let mut child = command.spawn().map_err(|e| {
            let _ = std::fs::remove_file(&image);
            format!("cannot run {}: {e}", bin.display())
        })?;
        let said = Mutex::new(stderr_lines(&mut child));
        let mut daemon = Daemon {
            child,
            image,
            socket,
            keep: options.keep,
            stopped: None,
            said,
        };
        // It says so on stderr once it serves, or why it cannot.
        let first = daemon.said().recv_timeout(START_WAIT);
        match first {
            Ok(line) if line.contains("serving") => Ok(daemon),
            first => {
                let _ = daemon.child.kill();
                let _ = daemon.child.wait();
                let said = first.map_or_else(|_| daemon.rest(), |l| l + &daemon.rest());
                let why = format!(
                    "{} serve {} did not start serving: {}",
                    bin.display(),
                    daemon.image.display(),
                    said.trim()
                );
                // Reaped: nothing is left to stop (its process id may be
                // another's by now).
                daemon.stopped = Some(Err(why.clone()));
                Err(why)
            }
        }
    }

    fn said(&self) -> std::sync::MutexGuard<'_, mpsc::Receiver<String>> {
        self.said.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the daemon said that was not read yet.
    fn rest(&self) -> String {
        self.said().try_iter().collect()
    }

    /// Stops the daemon with SIGTERM and waits for it to close the image
    /// (killing it if it takes longer than [`STOP_WAIT`]); what it said
    /// since it started serving, or what went wrong, in a sentence. Only
    /// the first call stops it; later ones return what the first did.
    fn stop(&mut self) -> Result<String, String> {
        if let Some(done) = &self.stopped {
            return done.clone();
        }
        let pid = rustix::process::Pid::from_raw(self.child.id().cast_signed());
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let start = Instant::now();
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if start.elapsed() < STOP_WAIT => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break None;
                }
            }
        };
        // It has exited: the pipe is closed, and the reading thread ends
        // once it has passed on the last line.
        let said: String = self.said().iter().collect();
        let done = match status {
            Some(s) if s.success() => Ok(said),
            Some(s) => Err(format!(
                "kucofs serve {} ended with {s}: {}",
                self.image.display(),
                said.trim()
            )),
            None => Err(format!(
                "kucofs serve {} did not stop within {STOP_WAIT:?}; killed",
                self.image.display()
            )),
        };
        self.stopped = Some(done.clone());
        done
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let reported = self.stopped.is_some();
        if let (Err(why), false) = (self.stop(), reported) {
            eprintln!("fxbench: {why}");
        }
        if !self.keep {
            let _ = std::fs::remove_file(&self.image);
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// The lines `child` writes to its piped stderr, each with its newline,
/// read on a thread of its own until the pipe closes.
fn stderr_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    if let Some(err) = child.stderr.take() {
        let read = move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line + "\n").is_err() {
                    break;
                }
            }
        };
        // Without the thread nothing reads the pipe: the start then
        // times out, and says so.
        let _ = std::thread::Builder::new()
            .name("kucofs-serve-stderr".into())
            .spawn(read);
    }
    rx
}

/// A client of a KucoFS daemon: one this backend started
/// (`kucofs-daemon`), or one already serving (`kucofs-client`).
#[derive(Debug)]
pub struct DaemonBackend {
    spec: String,
    socket: PathBuf,
    /// Closed before the daemon stops.
    fs: Option<Fs>,
    daemon: Option<Daemon>,
}

impl DaemonBackend {
    /// Starts a daemon on a fresh image as `arg` says, and attaches to
    /// it.
    pub fn start(spec: &str, arg: &str) -> Result<Self> {
        let bad = |why: String| Error::UnusableBackend {
            spec: spec.to_owned(),
            why,
        };
        let options = Options::parse(arg).map_err(bad)?;
        let daemon = Daemon::start(&options).map_err(bad)?;
        let config = Config {
            collaborative: options.collaborative,
            ..Config::default()
        };
        // Dropped on failure: the daemon stops and its image goes.
        let fs = Fs::connect_with(&daemon.socket, config).map_err(|e| bad(e.to_string()))?;
        Ok(DaemonBackend {
            spec: spec.to_owned(),
            socket: daemon.socket.clone(),
            fs: Some(fs),
            daemon: Some(daemon),
        })
    }

    /// Attaches to the daemon serving on `socket`.
    pub fn connect(spec: &str, socket: &Path) -> Result<Self> {
        if socket.as_os_str().is_empty() {
            return Err(Error::UnusableBackend {
                spec: spec.to_owned(),
                why: "no socket given (write kucofs-client:SOCKET)".into(),
            });
        }
        let fs = Fs::connect(socket).map_err(|e| Error::UnusableBackend {
            spec: spec.to_owned(),
            why: e.to_string(),
        })?;
        Ok(DaemonBackend {
            spec: spec.to_owned(),
            socket: socket.to_owned(),
            fs: Some(fs),
            daemon: None,
        })
    }

    /// [`DaemonBackend::start`] for the spec table.
    pub(crate) fn start_boxed(spec: &str, arg: &str) -> Result<Box<dyn Backend>> {
        Ok(Box::new(DaemonBackend::start(spec, arg)?))
    }

    /// [`DaemonBackend::connect`] for the spec table.
    pub(crate) fn connect_boxed(spec: &str, arg: &str) -> Result<Box<dyn Backend>> {
        Ok(Box::new(DaemonBackend::connect(spec, Path::new(arg))?))
    }

    /// The file system, as this process's client of the daemon.
    pub fn fs(&self) -> &Fs {
        self.fs
            .as_ref()
            .expect("the file system is attached until drop")
    }

    /// The socket the daemon serves on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl DaemonBackend {
    /// Detaches, stops the daemon this backend started, and returns what
    /// the daemon said on stderr since it started serving (Kfs's counters
    /// among it: see [`parse_served`]); `None` for a daemon this backend
    /// did not start.
    pub fn stop(mut self) -> Result<Option<String>> {
        if let Some(fs) = self.fs.take() {
            let _ = fs.close();
        }
        let Some(daemon) = self.daemon.as_mut() else {
            return Ok(None);
        };
        daemon
            .stop()
            .map(Some)
            .map_err(|why| Error::UnusableBackend {
                spec: self.spec.clone(),
                why,
            })
    }
}

impl Drop for DaemonBackend {
    fn drop(&mut self) {
        if let Some(fs) = self.fs.take() {
            let _ = fs.close();
        }
        // Then the daemon stops (see `Daemon`'s drop).
        self.daemon.take();
    }
}

/// One kind of request a daemon served, as its log says at shutdown.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Served {
    /// The request kind (`Create`, `Write`, ...).
    pub request: String,
    /// Requests served.
    pub count: u64,
    /// Their mean service time, in ns (Kfs times one request in 8).
    pub mean_ns: u64,
}

/// The per-kind lines of Kfs's counters in a daemon's log
/// (`kfs:   Create: 10 served, mean service time L = 900 ns`, as
/// `StatsSnapshot`'s `Display` writes them), in order.
pub fn parse_served(log: &str) -> Vec<Served> {
    log.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("kfs:   ")?;
            let (request, rest) = rest.split_once(": ")?;
            let (count, rest) = rest.split_once(" served, mean service time L = ")?;
            let mean = rest.strip_suffix(" ns")?;
            Some(Served {
                request: request.to_owned(),
                count: count.parse().ok()?,
                mean_ns: mean.parse().ok()?,
            })
        })
        .collect()
}

impl Backend for DaemonBackend {
    fn name(&self) -> &str {
        &self.spec
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.fs().create_dir_all(path)
    }

    fn create_file(&self, path: &Path) -> io::Result<()> {
        self.fs().create_file(path)
    }

    fn stat(&self, path: &Path) -> io::Result<()> {
        self.fs().metadata(path).map(drop)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.fs().remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.fs().rename(from, to)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.fs().remove_dir_all(path)
    }

    fn open_file(&self, path: &Path, options: OpenOptions) -> io::Result<Box<dyn FileHandle>> {
        super::kucofs::open_on(self.fs(), path, options)
    }

    fn attach_spec(&self) -> Option<String> {
        Some(format!("kucofs-client:{}", self.socket.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_parsed_in_any_order_and_bad_ones_refused() {
        let o = Options::parse(
            "bin=/x/kucofs+sparse+size=64M+image=/tmp/d.img+nohints+keep+trusted-writes",
        )
        .unwrap();
        assert_eq!(
            o,
            Options {
                size: 64 << 20,
                sparse: true,
                image: PathBuf::from("/tmp/d.img"),
                collaborative: false,
                keep: true,
                trusted_writes: true,
                bin: Some(PathBuf::from("/x/kucofs")),
            }
        );
        let d = Options::parse("").unwrap();
        assert_eq!(
            (d.size, d.sparse, d.collaborative, d.keep, d.trusted_writes),
            (4 << 30, false, true, false, false)
        );
        assert!(d.image.starts_with("/dev/shm"), "{}", d.image.display());
        let msg = Options::parse("queued").unwrap_err();
        assert!(msg.contains("unknown option `queued`"), "{msg}");
        assert!(msg.contains("bin=PATH"), "{msg}");
        assert!(Options::parse("size=lots").is_err());
    }

    #[test]
    fn served_lines_are_read_back_from_kfs_counters() {
        // Kfs's own counters, as an embedded one keeps them and a daemon
        // prints them.
        let tmp = crate::testing::tempdir();
        let config = Config {
            direct: false,
            ..Config::default()
        };
        let image = tmp.path().join("img");
        Fs::create(&image, 16 << 20).and_then(Fs::close).unwrap();
        let fs = Fs::open_with(&image, config).unwrap();
        fs.create_file("a").unwrap();
        fs.create_dir("d").unwrap();
        fs.remove_file("a").unwrap();
        let stats = fs.kfs_stats().unwrap();
        fs.close().unwrap();
        let served = parse_served(&format!("kucofs: serving\n{stats}kucofs: closed\n"));
        let expected: Vec<Served> = stats
            .per_kind
            .iter()
            .map(|&(k, n, ns)| Served {
                request: format!("{k:?}"),
                count: n,
                mean_ns: ns / n.max(1),
            })
            .collect();
        assert!(
            expected.iter().any(|s| s.request == "Mkdir"),
            "{expected:?}"
        );
        assert_eq!(served, expected);
    }

    #[test]
    fn a_missing_kucofs_binary_is_refused_in_one_sentence() {
        let tmp = crate::testing::tempdir();
        let arg = format!(
            "size=16M+image={}+bin={}",
            tmp.path().join("img").display(),
            tmp.path().join("nope").display()
        );
        let err = DaemonBackend::start(&format!("kucofs-daemon:{arg}"), &arg).unwrap_err();
        let msg = crate::error::chain(&err);
        assert!(msg.contains("no kucofs binary at"), "{msg}");
        assert!(msg.contains("bin=PATH"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
        // Nothing was made.
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_client_of_no_daemon_is_refused() {
        let tmp = crate::testing::tempdir();
        let sock = tmp.path().join("none.sock");
        let spec = format!("kucofs-client:{}", sock.display());
        let msg = crate::error::chain(&DaemonBackend::connect(&spec, &sock).unwrap_err());
        assert!(msg.contains("cannot connect to the KucoFS daemon"), "{msg}");
        let msg = crate::error::chain(
            &DaemonBackend::connect("kucofs-client:", Path::new("")).unwrap_err(),
        );
        assert!(msg.contains("no socket given"), "{msg}");
    }
}
