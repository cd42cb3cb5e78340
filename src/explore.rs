//! `kucofs crashtest`: the crash-state explorer
//! ([`kucofs_kfs::crashtest`]), split over processes.
//!
//! Checking a crash image maps and unmaps memory many times over, and the
//! threads of one process take turns at its memory map: one process per
//! core, each exploring its share of the sequences, goes as many times
//! faster as there are cores, where threads would not.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::Context as _;
use kucofs_common::size::parse_size;
use kucofs_kfs::crashtest::{self, Config, Event, Summary};

/// The arguments of `kucofs crashtest`.
#[derive(Debug, clap::Args)]
pub struct Args {
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
    /// Processes exploring at once (default: one per core).
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
    /// Explore share I of N (I/N) and end with a line of totals: what a
    /// process of a run over several does.
    #[arg(long, hide = true, value_parser = parse_shard)]
    shard: Option<(usize, usize)>,
}

/// The line a share's process ends with, before its totals.
const TOTALS: &str = "crashtest share totals:";

fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let (i, n) = s.split_once('/').ok_or("expected I/N")?;
    let (i, n) = (
        i.parse::<usize>().map_err(|e| e.to_string())?,
        n.parse::<usize>().map_err(|e| e.to_string())?,
    );
    if i >= n {
        return Err(format!("share {i} of {n} does not exist"));
    }
    Ok((i, n))
}

impl Args {
    fn config(&self) -> Config {
        Config {
            k: self.k,
            seq: self.seq,
            filter: self.filter.clone(),
            sample: self.sample,
            seed: self.seed,
            image_size: self.image_size,
            checkpoints: !self.no_checkpoints,
            recovery: !self.no_recovery,
            shard: self.shard.unwrap_or((0, 1)),
            ..Config::default()
        }
    }

    /// The arguments of the process exploring share `i` of `n`.
    fn share(&self, i: usize, n: usize) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "crashtest".into(),
            format!("--k={}", self.k),
            format!("--seq={}", self.seq),
            format!("--seed={}", self.seed),
            format!("--image-size={}", self.image_size),
            format!("--shard={i}/{n}"),
        ];
        if let Some(f) = &self.filter {
            a.push(format!("--filter={f}"));
        }
        if let Some(n) = self.sample {
            a.push(format!("--sample={n}"));
        }
        if self.no_checkpoints {
            a.push("--no-checkpoints".into());
        }
        if self.no_recovery {
            a.push("--no-recovery".into());
        }
        a
    }
}

/// What a run counts: [`Summary`]'s numbers, added up over processes.
#[derive(Debug, Default)]
struct Totals {
    sequences: u64,
    checked: u64,
    bounded: u64,
    recovered: u64,
    raw_problems: u64,
    violations: u64,
}

impl Totals {
    fn of(s: &Summary) -> Totals {
        Totals {
            sequences: s.sequences,
            checked: s.checked,
            bounded: s.bounded,
            recovered: s.recovered,
            raw_problems: s.raw_problems,
            violations: s.violations.len() as u64,
        }
    }

    fn fields(&self) -> [u64; 6] {
        [
            self.sequences,
            self.checked,
            self.bounded,
            self.recovered,
            self.raw_problems,
            self.violations,
        ]
    }

    fn parse(line: &str) -> Option<Totals> {
        let n: Vec<u64> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let &[sequences, checked, bounded, recovered, raw_problems, violations] = n.as_slice()
        else {
            return None;
        };
        Some(Totals {
            sequences,
            checked,
            bounded,
            recovered,
            raw_problems,
            violations,
        })
    }

    fn add(&mut self, o: &Totals) {
        self.sequences += o.sequences;
        self.checked += o.checked;
        self.bounded += o.bounded;
        self.recovered += o.recovered;
        self.raw_problems += o.raw_problems;
        self.violations += o.violations;
    }
}

/// Prints a group's line or a violation's.
fn print_event(event: Event<'_>) {
    match event {
        Event::Group { name, summary } => {
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
        Event::Violation(v) => println!("{v}"),
    }
}

/// `kucofs crashtest`: one line per operation (or per group of pairs),
/// one per violation, then the count.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.list {
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
    let started = Instant::now();
    if args.shard.is_some() {
        let s = crashtest::run(&args.config(), print_event).context("crashtest")?;
        let fields = Totals::of(&s).fields().map(|n| n.to_string());
        println!("{TOTALS} {}", fields.join(" "));
        return Ok(());
    }
    // Refused here (a filter that names nothing) rather than by every
    // process; no more processes than groups of sequences to share.
    let sequences = crashtest::sequences(&args.config()).context("crashtest")?;
    let mut groups = sequences.iter().map(|s| s[0].name).collect::<Vec<_>>();
    groups.dedup();
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, groups.len().max(1));
    let totals = if jobs == 1 {
        Totals::of(&crashtest::run(&args.config(), print_event).context("crashtest")?)
    } else {
        shares(&args, jobs)?
    };
    println!(
        "{} sequences, k = {}: {} crash images within the bound, {} recovered \
         ({} with problems fsck saw before recovery), {:.1} s",
        totals.sequences,
        args.k,
        totals.bounded,
        totals.recovered,
        totals.raw_problems,
        started.elapsed().as_secs_f64()
    );
    println!(
        "crash states: {} checked, {} violations",
        totals.checked, totals.violations
    );
    if totals.violations > 0 {
        anyhow::bail!("{} crash states failed their checks", totals.violations);
    }
    Ok(())
}

/// Runs `jobs` processes of this program, each exploring its share,
/// passes their lines on as they come, and adds up their totals.
fn shares(args: &Args, jobs: usize) -> anyhow::Result<Totals> {
    let exe = std::env::current_exe().context("crashtest: finding this program")?;
    let mut children = Vec::new();
    for i in 0..jobs {
        let child = Command::new(&exe)
            .args(args.share(i, jobs))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("crashtest: starting {}", exe.display()))?;
        children.push(child);
    }
    let out = std::sync::Mutex::new(std::io::stdout());
    let results: Vec<anyhow::Result<Totals>> = std::thread::scope(|s| {
        let readers: Vec<_> = children
            .iter_mut()
            .enumerate()
            .map(|(i, child)| {
                let stdout = child.stdout.take();
                let out = &out;
                s.spawn(move || -> anyhow::Result<Totals> {
                    let mut totals = None;
                    for line in BufReader::new(stdout.context("no output")?).lines() {
                        let line = line?;
                        match line.strip_prefix(TOTALS) {
                            Some(t) => totals = Totals::parse(t),
                            None => {
                                let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
                                writeln!(o, "{line}")?;
                                o.flush()?;
                            }
                        }
                    }
                    totals.with_context(|| format!("share {i} of {jobs} gave no totals"))
                })
            })
            .collect();
        readers
            .into_iter()
            .map(|r| {
                r.join()
                    .unwrap_or_else(|_| anyhow::bail!("a reader panicked"))
            })
            .collect()
    });
    let mut all = Totals::default();
    for (i, (child, r)) in children.iter_mut().zip(results).enumerate() {
        let status = child.wait()?;
        if !status.success() {
            anyhow::bail!("crashtest: the process exploring share {i} of {jobs} failed ({status})");
        }
        all.add(&r.with_context(|| format!("crashtest: share {i} of {jobs}"))?);
    }
    Ok(all)
}
