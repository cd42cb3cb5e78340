//! `kucofs`: make, inspect and check KucoFS images.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kucofs_common::pm::{Hardware, Space};
use kucofs_common::size::{format_size, parse_size};

mod explore;

#[derive(Debug, Parser)]
#[command(
    name = "kucofs",
    version,
    about = "A user-space persistent-memory file system",
    after_help = "Exit status: 0 success; 1 failure (the reason on stderr, one sentence); \
2 usage error; 4 fsck found the image damaged (the problems on stdout)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Make an empty file system in IMAGE (a file, e.g. under /dev/shm, or a DAX device).
    Mkfs {
        /// The image to create.
        image: PathBuf,
        /// Size of the file system, e.g. 64M, 4G (at least 1M).
        #[arg(long, short, value_parser = parse_size)]
        size: u64,
        /// Overwrite IMAGE if it exists.
        #[arg(long)]
        force: bool,
        /// Leave a new image file sparse: its data pages take memory as
        /// they come into use, instead of all of it now (the default
        /// reserves it, as a device has it, and fails now if there is no
        /// room for it).
        #[arg(long)]
        sparse: bool,
    },
    /// Show an image's geometry, space, log fill and state, without changing it.
    Info {
        /// The image to inspect.
        image: PathBuf,
    },
    /// Check every invariant of an image (read-only); exits non-zero listing what is wrong.
    Fsck {
        /// The image to check.
        image: PathBuf,
    },
    /// Serve IMAGE to other processes (`Fs::connect(SOCKET)`) until
    /// SIGTERM or SIGINT, then close it cleanly. Runs in the foreground
    /// and says on stderr when clients can connect.
    Serve {
        /// The image to serve.
        image: PathBuf,
        /// The Unix socket clients connect to (made; a stale one from a
        /// daemon that is gone is replaced).
        #[arg(long)]
        socket: PathBuf,
        /// Return once clients can connect, leaving the daemon running
        /// in its own session (its messages still go to stderr; stop it
        /// with SIGTERM, e.g. `kill PID` with the PID it prints).
        #[arg(long)]
        background: bool,
        /// Trust the members of GROUP (a name or a number) as root and the
        /// daemon's own user are trusted: they get read-only mappings of
        /// the whole index and image for fast reads. This weakens
        /// isolation: each member can read every file in the image,
        /// whatever its permissions, through its mappings. Without it,
        /// other users' clients map nothing of the file system and read
        /// through requests the daemon checks.
        #[arg(long, value_name = "GROUP")]
        trusted_group: Option<String>,
        /// Let trusted clients (root, the daemon's own user, members of
        /// --trusted-group) write file data into the image themselves,
        /// through a read-write mapping of it, as an embedded client
        /// does, instead of through a staging area the daemon copies
        /// from. This weakens safety much further: such a client can
        /// write any byte of the image, any file's data and the on-media
        /// metadata records, and so corrupt the file system for every
        /// client. Only for clients as trusted as the daemon itself (the
        /// same user). The daemon still checks every metadata request.
        #[arg(long)]
        trusted_writes: bool,
        /// Evict a client whose thread holds back reclamation with one
        /// reader epoch this many milliseconds (default 5000): its
        /// connection is closed and its reads fail.
        #[arg(long, value_name = "MS")]
        evict_after_ms: Option<u64>,
    },
    /// Crash every operation at every fence: recover each crash image the
    /// hardware allows (up to K torn cache lines) and check it; exits
    /// non-zero if any check fails.
    Crashtest(explore::Args),
}

/// `kucofs fsck`'s exit status for an image it found damaged (as e2fsck's
/// "errors left uncorrected"), told apart from a check that could not run.
const DAMAGED: u8 = 4;

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Mkfs {
            image,
            size,
            force,
            sparse,
        } => {
            let space = if sparse {
                Space::Sparse
            } else {
                Space::Reserved
            };
            let persist = Arc::new(Hardware::new());
            let sb = kucofs_kfs::mkfs_with(&image, size, force, space, persist).context("mkfs")?;
            let g = sb.geometry;
            println!(
                "made a {} KucoFS on {}: {} data pages ({}) for files and metadata, log {}, owner table {}",
                format_size(g.size),
                image.display(),
                g.data.pages,
                format_size(g.data.len()),
                format_size(g.log.len()),
                format_size(g.owners.len()),
            );
        }
        Command::Info { image } => {
            let report = kucofs_kfs::inspect(&image).context("info")?;
            print!("{report}");
        }
        Command::Fsck { image } => {
            let report = kucofs_kfs::fsck(&image).context("fsck")?;
            print!("{report}");
            if !report.problems.is_empty() {
                eprintln!(
                    "kucofs: fsck: {} has {} problems (listed above)",
                    image.display(),
                    report.problems.len()
                );
                return Ok(ExitCode::from(DAMAGED));
            }
        }
        Command::Serve {
            image,
            socket,
            background,
            trusted_group,
            trusted_writes,
            evict_after_ms,
        } => {
            let trust = kucofs_kfs::daemon::Trust {
                group: trusted_group.as_deref().map(group_id).transpose()?,
                writes: trusted_writes,
            };
            let config = kucofs_kfs::ServerConfig {
                evict_after: evict_after_ms.map(std::time::Duration::from_millis),
                ..kucofs_kfs::ServerConfig::default()
            };
            let ready_pipe = if background {
                match daemonize().context("serve --background")? {
                    Side::Parent(code) => return Ok(code),
                    Side::Child(pipe) => Some(pipe),
                }
            } else {
                None
            };
            on_stop_signals();
            kucofs_kfs::daemon::serve(&image, &socket, config, trust, &STOP, || {
                eprintln!(
                    "kucofs: serving {} on {} (SIGTERM or SIGINT to stop)",
                    image.display(),
                    socket.display()
                );
                if let Some(pipe) = ready_pipe {
                    // The parent waits for this byte; closing the pipe
                    // lets it go.
                    let _ = rustix::io::write(&pipe, b"r");
                }
            })
            .with_context(|| format!("serve {}", image.display()))?;
            eprintln!("kucofs: {} closed cleanly", image.display());
        }
        Command::Crashtest(args) => explore::run(args)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Which process `daemonize` returned in.
enum Side {
    /// The command's own process, with the exit status to end with.
    Parent(ExitCode),
    /// The daemon, with the pipe that tells the parent it is ready.
    Child(rustix::fd::OwnedFd),
}

/// Forks `kucofs serve --background`: the child becomes the daemon in a
/// session of its own; the parent waits until the child says it serves
/// (then prints its PID and succeeds) or ends (then fails: the child's
/// stderr said why).
fn daemonize() -> anyhow::Result<Side> {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    // SAFETY: called from `run` before anything has started a thread (the
    // daemon's threads start after this returns in the child), so the
    // child is a complete copy of a single-threaded process.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    if pid == 0 {
        drop(read);
        // Out of the terminal's session and process group: the shell's
        // job control and hang-up do not reach the daemon.
        let _ = rustix::process::setsid();
        // Nothing reads its stdin, and its stdout (where the parent prints
        // the PID) must not keep a `$(kucofs serve --background …)` waiting.
        if let Ok(null) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
        {
            let _ = rustix::stdio::dup2_stdin(&null);
            let _ = rustix::stdio::dup2_stdout(&null);
        }
        return Ok(Side::Child(write));
    }
    drop(write);
    let mut byte = [0u8; 1];
    let ready = loop {
        match rustix::io::read(&read, &mut byte) {
            Ok(n) => break n == 1,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    if ready {
        println!("{pid}");
        return Ok(Side::Parent(ExitCode::SUCCESS));
    }
    let mut status = 0;
    // SAFETY: `status` is a valid place for waitpid to write; `pid` is our
    // child, which has ended or is ending (its end of the pipe closed).
    unsafe { libc::waitpid(pid, &mut status, 0) };
    Err(anyhow::anyhow!("the daemon ended before it could serve"))
}

/// The group `group` names: a number, or a name in `/etc/group`.
fn group_id(group: &str) -> anyhow::Result<u32> {
    if let Ok(gid) = group.parse() {
        return Ok(gid);
    }
    let table = std::fs::read_to_string("/etc/group")
        .with_context(|| format!("look up group {group}: read /etc/group"))?;
    table
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let gid = f.nth(1)?.parse().ok()?;
            (name == group).then_some(gid)
        })
        .next()
        .with_context(|| format!("look up group {group}: no such group in /etc/group"))
}

/// Set by SIGTERM and SIGINT: `kucofs serve` stops.
static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn stop_on_signal(_: libc::c_int) {
    // An atomic store is async-signal-safe.
    STOP.store(true, std::sync::atomic::Ordering::Release);
}

/// Makes SIGTERM and SIGINT set [`STOP`] instead of ending the process.
fn on_stop_signals() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe; `signal` with a valid handler pointer has no
        // other precondition.
        unsafe { libc::signal(sig, stop_on_signal as *const () as libc::sighandler_t) };
    }
}

fn main() -> ExitCode {
    // A closed pipe ends the command quietly, as it does a Unix tool
    // (`kucofs info IMAGE | head -1`): Rust ignores SIGPIPE, and printing
    // to the closed pipe would panic instead.
    // SAFETY: restoring a signal's default disposition at the start of
    // main, before any thread exists, races with nothing and installs no
    // handler.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            // Each layer names what it was doing; `{:#}` joins them into one
            // sentence ("mkfs /dev/shm/a.img: a size of ... is smaller ...").
            eprintln!("kucofs: {e:#}");
            ExitCode::FAILURE
        }
    }
}
