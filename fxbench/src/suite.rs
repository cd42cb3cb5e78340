//! A benchmark matrix: every workload, at every thread count, on every
//! backend, each run in a directory of its own that is removed afterwards.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::backend::Backend;
use crate::error::{Error, OpFailure, Result};
use crate::harness::{self, Budget};
use crate::workload::{Params, Workload};

/// What to run.
#[derive(Debug)]
pub struct Plan {
    pub workloads: Vec<Workload>,
    /// The first backend is the one others are compared with.
    pub backends: Vec<Box<dyn Backend>>,
    pub threads: Vec<usize>,
    pub budget: Budget,
    pub params: Params,
    /// Times the matrix is measured (at least 1): see [`Plan::run`].
    pub rounds: usize,
    /// How each run goes.
    pub mode: Mode,
}

/// How each run of a plan goes, beside its workload, count and budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mode {
    /// Whether the workers are threads of this process or processes.
    pub workers: Workers,
    /// Leave each run's directory in place afterwards (for a look at
    /// what the run made; the next run of the same workload and count
    /// replaces it).
    pub keep: bool,
}

/// How a run's workers run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Workers {
    /// Threads of this process, sharing its backend.
    #[default]
    Threads,
    /// A process each ([`crate::process`]), as FxMark runs them.
    Processes,
}

impl std::str::FromStr for Workers {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "thread" => Ok(Workers::Threads),
            "process" => Ok(Workers::Processes),
            _ => Err(Error::BadParameter(format!(
                "--workers is thread or process, not `{s}`"
            ))),
        }
    }
}

/// One workload, on one backend, at one thread count, in one round.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    pub workload: Workload,
    /// The backend's name (its spec).
    pub backend: String,
    pub threads: usize,
    /// Which of the plan's rounds (from 0).
    pub round: usize,
    /// Operations completed by all workers in the timed phase.
    pub ops: u64,
    /// Wall time of the timed phase.
    pub seconds: f64,
    /// The backend's server counters over the run (setup included), if it
    /// has a server.
    pub server: Option<crate::backend::ServerCounters>,
}

impl Measurement {
    /// Throughput of all workers together.
    pub fn ops_per_sec(&self) -> f64 {
        if self.seconds > 0.0 {
            self.ops as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// Bytes read or written per second by all workers together, in MiB,
    /// for a data workload.
    pub fn mib_per_sec(&self) -> Option<f64> {
        let bytes = self.workload.bytes_per_op()?;
        Some(self.ops_per_sec() * bytes as f64 / f64::from(1 << 20))
    }
}

impl Plan {
    /// Refuses an empty or out-of-range plan before anything runs.
    pub fn check(&self) -> Result<()> {
        let bad = |why: &str| Err(Error::BadParameter(why.to_owned()));
        if self.workloads.is_empty() {
            return bad("no workloads given");
        }
        if self.backends.is_empty() {
            return bad("no backends given");
        }
        if self.threads.is_empty() || self.threads.contains(&0) {
            return bad("thread counts must be given and at least 1");
        }
        if self.rounds == 0 {
            return bad("--rounds must be at least 1");
        }
        let names: Vec<&str> = self.backends.iter().map(|b| b.name()).collect();
        if let Some(twice) = names
            .iter()
            .enumerate()
            .find(|(i, n)| names[..*i].contains(n))
        {
            return Err(Error::BadParameter(format!(
                "backend {} is given twice: results are told apart by name",
                twice.1
            )));
        }
        if self.mode.workers == Workers::Processes {
            if let Some(b) = self.backends.iter().find(|b| b.attach_spec().is_none()) {
                return Err(Error::BadParameter(format!(
                    "backend {} cannot run with --workers process: no other process can \
                     reach its file system (KucoFS with Kfs embedded serves the process \
                     that opened its image; kucofs-daemon serves several)",
                    b.name()
                )));
            }
        }
        match self.budget {
            Budget::Time(d) if d.is_zero() => bad("--seconds must be more than 0"),
            Budget::Count(0) => bad("--count must be at least 1"),
            _ => self.params.check(),
        }
    }

    /// Runs the matrix, workload by workload, then thread count, then
    /// round, then backend, calling `each` with the measurements so far
    /// (the newest last) as every one completes. The backends take their
    /// turns round after round, so that a change in what else the machine
    /// is doing falls on all of them alike.
    pub fn run(&self, mut each: impl FnMut(&[Measurement])) -> Result<Vec<Measurement>> {
        self.check()?;
        let mut all = Vec::new();
        for &workload in &self.workloads {
            for &threads in &self.threads {
                for round in 0..self.rounds {
                    for fs in &self.backends {
                        let mut m = run_one(
                            fs.as_ref(),
                            workload,
                            threads,
                            self.mode,
                            self.budget,
                            &self.params,
                        )?;
                        m.round = round;
                        all.push(m);
                        each(&all);
                    }
                }
            }
        }
        Ok(all)
    }
}

/// Runs one workload in a fresh directory `fxbench-<WORKLOAD>-<threads>`
/// below the backend's root: setup, the timed phase (in `threads`
/// workers, threads or processes as `mode` says), and removal of the
/// directory, which happens even if the run fails (unless `mode` keeps
/// it).
pub fn run_one(
    fs: &dyn Backend,
    workload: Workload,
    threads: usize,
    mode: Mode,
    budget: Budget,
    params: &Params,
) -> Result<Measurement> {
    let dir = PathBuf::from(format!("fxbench-{workload}-{threads}"));
    let context = |source| Error::Run {
        workload,
        backend: fs.name().to_owned(),
        threads,
        source,
    };
    // A run that was killed leaves its directory behind.
    match fs.remove_dir_all(&dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(context(OpFailure::new("remove leftover", &dir, e)))
        }
        _ => {}
    }
    let before = fs.server_counters();
    let outcome = setup_and_run(fs, workload, &dir, threads, mode.workers, budget, params);
    let server = fs
        .server_counters()
        .zip(before)
        .map(|(after, before)| after.since(&before));
    let removed = match mode.keep {
        true => Ok(()),
        false => fs.remove_dir_all(&dir),
    };
    let cleanup = removed
        .and_then(|()| fs.settle())
        .map_err(|e| OpFailure::new("remove and settle", &dir, e));
    let outcome = outcome.and_then(|o| cleanup.map(|()| o)).map_err(context)?;
    Ok(Measurement {
        workload,
        backend: fs.name().to_owned(),
        threads,
        round: 0,
        ops: outcome.ops,
        seconds: outcome.elapsed.as_secs_f64(),
        server,
    })
}

fn setup_and_run(
    fs: &dyn Backend,
    workload: Workload,
    dir: &Path,
    threads: usize,
    mode: Workers,
    budget: Budget,
    params: &Params,
) -> Result<harness::Outcome, OpFailure> {
    fs.create_dir_all(dir)
        .map_err(|e| OpFailure::new("create directory", dir, e))?;
    // The workers, and the files they hold open, are dropped before the
    // caller removes the directory.
    let mut workers = workload.setup(fs, dir, threads, params)?;
    fs.settle()
        .map_err(|e| OpFailure::new("settle after setup", dir, e))?;
    match mode {
        Workers::Threads => harness::run(fs, &mut workers, budget),
        Workers::Processes => {
            // Setup made the files; each process makes its own worker,
            // after this process has closed the files setup's opened (a
            // write open here would hold the file's write lease).
            drop(workers);
            let spec = fs.attach_spec().ok_or_else(|| {
                let why = "no other process can reach this file system";
                OpFailure::new(crate::process::WORKER_OP, dir, io::Error::other(why))
            })?;
            crate::process::run_workers(&spec, workload, dir, threads, budget, params)
        }
    }
}

/// A time budget from a number of seconds, refusing what `Duration` cannot
/// hold.
pub fn seconds(secs: f64) -> Result<Budget> {
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if !d.is_zero() => Ok(Budget::Time(d)),
        _ => Err(Error::BadParameter(format!(
            "--seconds must be a positive number, not {secs}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{DirBackend, FileHandle, OpenOptions};
    use crate::error::chain;

    fn plan(tmp: &Path, threads: Vec<usize>, budget: Budget) -> Plan {
        Plan {
            workloads: vec![Workload::Mwcl, Workload::Mwrl],
            backends: vec![
                Box::new(DirBackend::open("dir:a", tmp).unwrap()),
                Box::new(DirBackend::open("dir:b", tmp).unwrap()),
            ],
            threads,
            budget,
            params: Params::default(),
            rounds: 1,
            mode: Mode::default(),
        }
    }

    #[test]
    fn the_matrix_runs_in_order_and_leaves_nothing_behind() {
        let tmp = crate::testing::tempdir();
        let mut seen = 0;
        let all = plan(tmp.path(), vec![1, 2], Budget::Count(50))
            .run(|_| seen += 1)
            .unwrap();
        assert_eq!(seen, 8);
        let keys: Vec<_> = all
            .iter()
            .map(|m| (m.workload.name(), m.threads, m.backend.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                ("MWCL", 1, "dir:a"),
                ("MWCL", 1, "dir:b"),
                ("MWCL", 2, "dir:a"),
                ("MWCL", 2, "dir:b"),
                ("MWRL", 1, "dir:a"),
                ("MWRL", 1, "dir:b"),
                ("MWRL", 2, "dir:a"),
                ("MWRL", 2, "dir:b"),
            ]
        );
        for m in &all {
            assert_eq!(m.ops, 50 * m.threads as u64);
            assert!(m.seconds > 0.0 && m.ops_per_sec() > 0.0, "{m:?}");
        }
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn rounds_repeat_each_combination_with_the_backends_in_turn() {
        let tmp = crate::testing::tempdir();
        let mut plan = plan(tmp.path(), vec![1], Budget::Count(5));
        plan.rounds = 3;
        let all = plan.run(|_| {}).unwrap();
        let keys: Vec<_> = all
            .iter()
            .map(|m| (m.workload.name(), m.round, m.backend.as_str()))
            .collect();
        let mut expected = Vec::new();
        for w in ["MWCL", "MWRL"] {
            for round in 0..3 {
                expected.push((w, round, "dir:a"));
                expected.push((w, round, "dir:b"));
            }
        }
        assert_eq!(keys, expected);
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_leftover_run_directory_is_replaced() {
        let tmp = crate::testing::tempdir();
        std::fs::create_dir_all(tmp.path().join("fxbench-MWCL-1/w0")).unwrap();
        std::fs::write(tmp.path().join("fxbench-MWCL-1/w0/0"), b"").unwrap();
        let fs = DirBackend::open("dir:a", tmp.path()).unwrap();
        let m = run_one(
            &fs,
            Workload::Mwcl,
            1,
            Mode::default(),
            Budget::Count(5),
            &Params::default(),
        )
        .unwrap();
        assert_eq!(m.ops, 5);
    }

    /// A dir backend whose `stat` always fails.
    #[derive(Debug)]
    struct BrokenStat(DirBackend);

    impl Backend for BrokenStat {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn create_dir_all(&self, path: &Path) -> io::Result<()> {
            self.0.create_dir_all(path)
        }
        fn create_file(&self, path: &Path) -> io::Result<()> {
            self.0.create_file(path)
        }
        fn stat(&self, _: &Path) -> io::Result<()> {
            // EIO.
            Err(io::Error::from_raw_os_error(5))
        }
        fn remove_file(&self, path: &Path) -> io::Result<()> {
            self.0.remove_file(path)
        }
        fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
            self.0.rename(from, to)
        }
        fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
            self.0.remove_dir_all(path)
        }
        fn open_file(&self, path: &Path, options: OpenOptions) -> io::Result<Box<dyn FileHandle>> {
            self.0.open_file(path, options)
        }
    }

    #[test]
    fn a_failing_run_names_workload_backend_and_path_and_still_cleans_up() {
        let tmp = crate::testing::tempdir();
        let fs = BrokenStat(DirBackend::open("dir:a", tmp.path()).unwrap());
        let err = run_one(
            &fs,
            Workload::Mrpl,
            2,
            Mode::default(),
            Budget::Count(5),
            &Params::default(),
        )
        .unwrap_err();
        let msg = chain(&err);
        assert!(
            msg.starts_with("MRPL on dir:a with 2 thread(s): stat fxbench-MRPL-2/w"),
            "{msg}"
        );
        assert!(msg.ends_with("(os error 5)"), "{msg}");
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_leftover_that_cannot_be_removed_is_reported() {
        let tmp = crate::testing::tempdir();
        let fs = DirBackend::open("dir:a", tmp.path()).unwrap();
        std::fs::write(tmp.path().join("fxbench-MWCL-1"), b"").unwrap();
        let msg = chain(
            &run_one(
                &fs,
                Workload::Mwcl,
                1,
                Mode::default(),
                Budget::Count(5),
                &Params::default(),
            )
            .unwrap_err(),
        );
        assert!(
            msg.starts_with("MWCL on dir:a with 1 thread(s): remove leftover fxbench-MWCL-1: "),
            "{msg}"
        );
    }

    #[test]
    fn every_data_workload_runs_on_a_dir_backend_and_leaves_nothing_behind() {
        let tmp = crate::testing::tempdir();
        let data: Vec<_> = Workload::ALL
            .into_iter()
            .filter(|w| w.bytes_per_op().is_some())
            .collect();
        assert_eq!(data.len(), 8);
        let plan = Plan {
            workloads: data.clone(),
            backends: vec![Box::new(DirBackend::open("dir:a", tmp.path()).unwrap())],
            threads: vec![1, 2],
            budget: Budget::Count(40),
            // DWAL's cap of 16 blocks makes it empty its file twice.
            params: Params {
                file_size: 16 * 4096,
            },
            rounds: 1,
            mode: Mode::default(),
        };
        let all = plan.run(|_| {}).unwrap();
        assert_eq!(all.len(), 16);
        for (m, w) in all.iter().zip(data.iter().flat_map(|&w| [w, w])) {
            assert_eq!(m.workload, w);
            assert_eq!(m.ops, 40 * m.threads as u64, "{m:?}");
            let mib = m.mib_per_sec().unwrap();
            let expected = m.ops_per_sec() * 4096.0 / 1048576.0;
            assert!((mib - expected).abs() <= 1e-9 * expected, "{m:?}");
        }
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn every_data_workload_runs_on_kucofs() {
        let tmp = crate::testing::tempdir();
        let arg = format!("size=64M+image={}", tmp.path().join("img").display());
        let fs = crate::backend::KucofsBackend::open("kucofs:t", &arg).unwrap();
        let params = Params {
            file_size: 64 << 10,
        };
        for w in Workload::ALL
            .into_iter()
            .filter(|w| w.bytes_per_op().is_some())
        {
            let m = run_one(&fs, w, 2, Mode::default(), Budget::Count(40), &params).unwrap();
            assert_eq!(m.ops, 80, "{m:?}");
        }
    }

    #[test]
    fn metadata_workloads_have_no_bandwidth() {
        let m = Measurement {
            workload: Workload::Mwcl,
            backend: "dir:a".into(),
            threads: 1,
            round: 0,
            ops: 10,
            seconds: 1.0,
            server: None,
        };
        assert_eq!(m.mib_per_sec(), None);
    }

    #[test]
    fn a_file_size_that_is_not_whole_blocks_is_refused_before_running() {
        let tmp = crate::testing::tempdir();
        let mut plan = plan(tmp.path(), vec![1], Budget::Count(1));
        plan.params.file_size = 5000;
        let msg = chain(&plan.run(|_| panic!("ran")).unwrap_err());
        assert!(msg.contains("--file-size"), "{msg}");
    }

    #[test]
    fn empty_or_zero_parameters_are_refused() {
        let tmp = crate::testing::tempdir();
        assert!(plan(tmp.path(), vec![], Budget::Count(1)).check().is_err());
        assert!(plan(tmp.path(), vec![0], Budget::Count(1)).check().is_err());
        assert!(plan(tmp.path(), vec![1], Budget::Count(0)).check().is_err());
        assert!(plan(tmp.path(), vec![1], Budget::Count(1)).check().is_ok());
        let mut no_rounds = plan(tmp.path(), vec![1], Budget::Count(1));
        no_rounds.rounds = 0;
        assert!(no_rounds.check().is_err());
        let mut twice = plan(tmp.path(), vec![1], Budget::Count(1));
        twice
            .backends
            .push(Box::new(DirBackend::open("dir:a", tmp.path()).unwrap()));
        let e = twice.check().unwrap_err().to_string();
        assert!(e.contains("dir:a is given twice"), "{e}");
        assert!(seconds(0.0).is_err());
        assert!(seconds(-1.0).is_err());
        assert!(seconds(f64::NAN).is_err());
        assert_eq!(
            seconds(0.5).unwrap(),
            Budget::Time(Duration::from_millis(500))
        );
    }
}
