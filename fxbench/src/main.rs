//! `fxbench`: run FxMark-style metadata and data benchmarks on one or more
//! backends and print (and optionally save) the results side by side.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use fxbench::machine::Machine;
use fxbench::report::{Report, ResultsFile};
use fxbench::suite::{self, Mode, Plan, Workers};
use fxbench::workload::Params;
use fxbench::{backend, Budget, Workload};

#[derive(Debug, Parser)]
#[command(
    name = "fxbench",
    version,
    about = "FxMark-style metadata and data benchmarks, KucoFS beside the kernel's file systems"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run workloads on backends at thread counts, and print a table.
    Run(RunArgs),
    /// List the workloads, metadata then data.
    List,
    /// Measure what the machine charges for the data path's building
    /// blocks: page protection changes, persisting a page, random reads
    /// through a view of small pages.
    Medium(MediumArgs),
    /// Time opening a KucoFS image after a clean close and after a crash,
    /// by the number of files it holds (all in one directory).
    Open(OpenArgs),
    /// Against a KucoFS daemon (`kucofs serve` on a fresh image): the
    /// round trip of a client's requests (a ping, and each step of a
    /// small file's life), beside the daemon's own service time per
    /// request, which it reports at shutdown.
    Roundtrip(RoundtripArgs),
    /// One worker process of `run --workers process` (started by `run`
    /// itself; it takes its orders on stdin).
    #[command(name = fxbench::process::SUBCOMMAND, hide = true)]
    Worker(WorkerArgs),
}

#[derive(Debug, clap::Args)]
struct RoundtripArgs {
    /// Calls timed of each kind.
    #[arg(long, default_value_t = 20_000)]
    requests: u64,
    /// The kucofs-daemon backend's options (size=SIZE, sparse,
    /// image=PATH, nohints, trusted-writes, bin=PATH), joined with `+`.
    #[arg(long, default_value = "size=256M")]
    daemon: String,
    /// Also write the figures as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

fn roundtrip(args: RoundtripArgs) -> anyhow::Result<()> {
    let json = args.json.as_deref().map(ResultsFile::create).transpose()?;
    let figures = fxbench::roundtrip::measure(&args.daemon, args.requests)?;
    print!("{}", figures.table());
    if let Some(mut file) = json {
        file.write(&serde_json::json!({
            "machine": Machine::describe(),
            "roundtrip": figures,
        }))?;
    }
    Ok(())
}

#[derive(Debug, clap::Args)]
struct WorkerArgs {
    #[arg(long)]
    workload: String,
    /// The spec through which the worker reaches the file system.
    #[arg(long)]
    backend: String,
    /// The run's directory, relative to the backend's root.
    #[arg(long)]
    dir: PathBuf,
    /// The worker's number.
    #[arg(long)]
    index: usize,
    #[arg(long)]
    file_size: u64,
}

fn worker(args: WorkerArgs) -> anyhow::Result<()> {
    let assignment = fxbench::process::Assignment {
        workload: args.workload.parse()?,
        backend: args.backend,
        dir: args.dir,
        index: args.index,
        params: Params {
            file_size: args.file_size,
        },
    };
    Ok(fxbench::process::work(&assignment)?)
}

#[derive(Debug, clap::Args)]
struct OpenArgs {
    /// Numbers of files, comma-separated (each measured on a fresh image).
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000")]
    files: Vec<u64>,
    /// Files made after the clean open and before the crash: what the
    /// recovery finds in the log (at most what the log holds between two
    /// retirements into the store).
    #[arg(long, default_value_t = 2000)]
    crash_files: u64,
    /// Image size, e.g. 8G (an image under /dev/shm, its memory reserved).
    #[arg(long, default_value = "8G", value_parser = kucofs_common::size::parse_size)]
    size: u64,
    /// Directory for the image.
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
    /// Also write the figures as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

fn open(args: OpenArgs) -> anyhow::Result<()> {
    let json = args.json.as_deref().map(ResultsFile::create).transpose()?;
    let image = args
        .dir
        .join(format!("fxbench-open-{}.img", std::process::id()));
    let mut all = Vec::new();
    for &n in &args.files {
        let t = fxbench::open::measure(&image, args.size, n, args.crash_files)
            .map_err(|e| anyhow::anyhow!("{n} files in {}: {e}", image.display()))?;
        println!("{}", t.line());
        all.push(t);
    }
    if let Some(mut file) = json {
        file.write(&serde_json::json!({
            "machine": Machine::describe(),
            "open": all,
        }))?;
    }
    Ok(())
}

#[derive(Debug, clap::Args)]
struct MediumArgs {
    /// Directory for the scratch images (an emulated region's default
    /// home).
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
    /// Also write the figures as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

fn medium(args: MediumArgs) -> anyhow::Result<()> {
    // A path that cannot be written is refused before measuring.
    let json = args.json.as_deref().map(ResultsFile::create).transpose()?;
    let m = fxbench::medium::measure(&args.dir)?;
    print!("{}", m.table());
    if let Some(mut file) = json {
        file.write(&serde_json::json!({
            "machine": Machine::describe(),
            "medium": m,
        }))?;
    }
    Ok(())
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Workloads to run, comma-separated (see `fxbench list`); the default
    /// is the metadata ones. Data: DRBL, DRBM, DWOL, DWOM, DWAL, DWSL,
    /// RNDRD, RNDWR.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "MWCL,MWCM,MRPL,MRPM,MWUL,MWRL"
    )]
    workloads: Vec<String>,
    #[arg(long, value_delimiter = ',', required = true, help = backends_help())]
    backends: Vec<String>,
    /// Worker counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    threads: Vec<usize>,
    /// How the workers run: `thread`, threads of this process sharing its
    /// backend, or `process`, a process each (this program again, as
    /// FxMark runs them), each opening the file system for itself; the
    /// workload's files are made once, before the workers start. Needs
    /// backends other processes can reach: dir: and kucofs-daemon, not
    /// kucofs (its Kfs serves this process only).
    #[arg(long, default_value = "thread", value_name = "thread|process")]
    workers: String,
    /// Leave each run's directory in place afterwards, to look at what it
    /// made (kucofs-daemon's image goes at the end unless it has `keep`).
    #[arg(long)]
    keep: bool,
    /// Timed seconds per run (fractions allowed).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Instead of a time, have every worker perform exactly N operations
    /// (for creation workloads, the number of files each worker makes).
    #[arg(long, value_name = "N", conflicts_with = "seconds")]
    count: Option<u64>,
    /// Each worker's file in RNDRD and RNDWR (written untimed before the
    /// run), and the size at which DWAL empties its file: a multiple of
    /// 4096, with an optional K, M or G.
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = kucofs_common::size::parse_size)]
    file_size: u64,
    /// Measure everything N times, the backends taking turns within each
    /// round, and report each result's median round with the range of its
    /// ratios: on a shared machine one run can be far off. An odd N has a
    /// true median.
    #[arg(long, value_name = "N", default_value_t = 1)]
    rounds: usize,
    /// Also write the machine description and results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

fn backends_help() -> String {
    format!(
        "Backends, comma-separated; the first is the baseline of the ratio column. Accepted: {}",
        backend::help()
    )
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    // Everything that can be refused is refused before the first run.
    let workloads = args
        .workloads
        .iter()
        .map(|w| w.parse::<Workload>())
        .collect::<Result<Vec<_>, _>>()?;
    let backends = args
        .backends
        .iter()
        .map(|spec| backend::open(spec))
        .collect::<Result<Vec<_>, _>>()?;
    let budget = match args.count {
        Some(n) => Budget::Count(n),
        None => suite::seconds(args.seconds)?,
    };
    let plan = Plan {
        workloads,
        backends,
        threads: args.threads,
        budget,
        params: Params {
            file_size: args.file_size,
        },
        rounds: args.rounds,
        mode: Mode {
            workers: args.workers.parse::<Workers>()?,
            keep: args.keep,
        },
    };
    plan.check()?;
    let mut json = args.json.as_deref().map(ResultsFile::create).transpose()?;

    let machine = Machine::describe();
    let baseline = plan.backends[0].name();
    let workers = match plan.mode.workers {
        Workers::Threads => "thread(s)",
        Workers::Processes => "process(es)",
    };
    let mut written = Ok(());
    let results = plan.run(|so_far| {
        let Some(m) = so_far.last() else { return };
        let bandwidth = m
            .mib_per_sec()
            .map_or_else(String::new, |b| format!(" ({b:.1} MiB/s)"));
        let round = if args.rounds > 1 {
            format!(", round {} of {}", m.round + 1, args.rounds)
        } else {
            String::new()
        };
        eprintln!(
            "{} on {} with {} {workers}{round}: {} ops in {:.3} s{bandwidth}",
            m.workload, m.backend, m.threads, m.ops, m.seconds
        );
        // The file holds every measurement so far, so a run cut short
        // keeps them; the last rewrite holds the whole report, and its
        // failure is the run's.
        if let Some(file) = json.as_mut() {
            written = file.write(&Report::new(machine.clone(), so_far, baseline));
        }
    })?;
    print!("{}", Report::new(machine, &results, baseline).table());
    Ok(written?)
}

fn list() {
    for w in Workload::ALL {
        println!("{:<5}  {}", w.name(), w.description());
    }
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Run(args) => run(args),
        Command::List => {
            list();
            Ok(())
        }
        Command::Medium(args) => medium(args),
        Command::Open(args) => open(args),
        Command::Worker(args) => worker(args),
        Command::Roundtrip(args) => roundtrip(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Each layer names what it was doing; `{:#}` joins them into one
            // sentence ("MWCL on dir:/x with 2 thread(s): create ...: ...").
            eprintln!("fxbench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
