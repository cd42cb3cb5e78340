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
        /// Trust the members of GROUP (a name or a number) as root and the
        /// daemon's own user are trusted: they get read-only mappings of
        /// the whole index and image for fast reads. This weakens
        /// isolation: each member can read every file in the image,
        /// whatever its permissions, through its mappings. Without it,
        /// other users' clients map nothing of the file system and read
        /// through requests the daemon checks.
        #[arg(long, value_name = "GROUP")]
        trusted_group: Option<String>,
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
            trusted_group,
        } => {
            let trust = kucofs_kfs::daemon::Trust {
                group: trusted_group.as_deref().map(group_id).transpose()?,
            };
            on_stop_signals();
            kucofs_kfs::daemon::serve(
                &image,
                &socket,
                kucofs_kfs::ServerConfig::default(),
                trust,
                &STOP,
                || {
                    eprintln!(
                        "kucofs: serving {} on {} (SIGTERM or SIGINT to stop)",
                        image.display(),
                        socket.display()
                    );
                },
            )
            .with_context(|| format!("serve {}", image.display()))?;
            eprintln!("kucofs: {} closed cleanly", image.display());
        }
        Command::Crashtest(args) => explore::run(args)?,
    }
    Ok(ExitCode::SUCCESS)
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
