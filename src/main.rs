//! `kucofs`: make, inspect and check KucoFS images.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kucofs_common::pm::{Hardware, Space};
use kucofs_common::size::{format_size, parse_size};
use kucofs_kfs::crashtest;

#[derive(Debug, Parser)]
#[command(
    name = "kucofs",
    version,
    about = "A user-space persistent-memory file system"
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
    /// Crash every operation at every fence: recover each crash image the
    /// hardware allows (up to K torn cache lines) and check it; exits
    /// non-zero if any check fails.
    Crashtest {
        /// Most in-flight cache lines a crash image takes stores from.
        #[arg(long, default_value_t = 2)]
        k: usize,
        /// Operations in a sequence: 1 (each alone) or 2 (every ordered pair).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=2))]
        seq: u32,
        /// Only operations whose name contains OP (for pairs: either one).
        #[arg(long, value_name = "OP")]
        filter: Option<String>,
        /// Explore only N sequences, picked pseudo-randomly by --seed.
        #[arg(long, value_name = "N")]
        sample: Option<usize>,
        /// Seed of --sample.
        #[arg(long, value_name = "S", default_value_t = 1)]
        seed: u64,
        /// Threads checking crash images (default: one per core).
        #[arg(long)]
        jobs: Option<usize>,
        /// Size of the image the operations run on (at least 1M).
        #[arg(long, value_parser = parse_size, default_value = "1M")]
        image_size: u64,
        /// Skip the crashes during the checkpoint and the clean close after
        /// each sequence.
        #[arg(long)]
        no_checkpoints: bool,
        /// Skip the crashes during the recovery of each fence's image.
        #[arg(long)]
        no_recovery: bool,
        /// List the operations and the starting tree, and explore nothing.
        #[arg(long)]
        list: bool,
    },
}

fn run(cli: Cli) -> anyhow::Result<()> {
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
                "made a {} KucoFS on {}: {} data pages ({}), log {}, checkpoint {}",
                format_size(g.size),
                image.display(),
                g.data.pages,
                format_size(g.data.len()),
                format_size(g.log.len()),
                format_size(g.checkpoint.len()),
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
                anyhow::bail!(
                    "fsck: {} has {} problems (listed above)",
                    image.display(),
                    report.problems.len()
                );
            }
        }
        Command::Crashtest {
            k,
            seq,
            filter,
            sample,
            seed,
            jobs,
            image_size,
            no_checkpoints,
            no_recovery,
            list,
        } => crashtest(
            crashtest::Config {
                k,
                seq,
                filter,
                sample,
                seed,
                jobs: jobs.unwrap_or(crashtest::Config::default().jobs),
                image_size,
                checkpoints: !no_checkpoints,
                recovery: !no_recovery,
                ..crashtest::Config::default()
            },
            list,
        )?,
    }
    Ok(())
}

/// `kucofs crashtest`: one line per operation (or per pair group), one
/// per violation, then the count.
fn crashtest(config: crashtest::Config, list: bool) -> anyhow::Result<()> {
    if list {
        println!("starting tree:");
        for line in crashtest::STARTING_TREE {
            println!("  {line}");
        }
        println!("operations:");
        for op in crashtest::OPS {
            println!("  {}", op.name);
        }
        return Ok(());
    }
    let summary = crashtest::run(&config, |event| match event {
        crashtest::Event::Group { name, summary } => {
            let refused = if summary.refused > 0 {
                format!(", {} refused", summary.refused)
            } else {
                String::new()
            };
            println!(
                "{name}: {} sequences, {} crash states, {} violations{refused}",
                summary.sequences,
                summary.checked,
                summary.violations.len(),
            )
        }
        crashtest::Event::Violation(v) => println!("{v}"),
    })
    .context("crashtest")?;
    println!(
        "{} sequences, k = {}: {} crash images within the bound, {} recovered \
         ({} with problems fsck saw before recovery), {:.1} s",
        summary.sequences,
        config.k,
        summary.bounded,
        summary.recovered,
        summary.raw_problems,
        summary.elapsed.as_secs_f64()
    );
    println!(
        "crash states: {} checked, {} violations",
        summary.checked,
        summary.violations.len()
    );
    if !summary.violations.is_empty() {
        anyhow::bail!(
            "{} crash states failed their checks",
            summary.violations.len()
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Each layer names what it was doing; `{:#}` joins them into one
            // sentence ("mkfs /dev/shm/a.img: a size of ... is smaller ...").
            eprintln!("kucofs: {e:#}");
            ExitCode::FAILURE
        }
    }
}
