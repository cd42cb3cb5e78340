//! Runs one workload's workers in step: untimed preparation, a common start
//! at a barrier, timed operations until a stop flag or a per-worker count,
//! and a common finish at the barrier again.
//!
//! A run is one or more *rounds*. Most workloads need a single round: each
//! worker's [`Worker::prepare`] says it can do any number of operations and
//! the round lasts the whole budget. A workload that consumes what setup
//! made (MWUL unlinks pre-created files; DWAL fills a file up to a cap)
//! says how many operations its preparation allows; when every worker has used them up the round ends,
//! and the next round prepares again, untimed, until the budget is spent.
//! Only the rounds' timed phases are summed into the result.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::error::OpFailure;

/// How long each run lasts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    /// Every worker runs until this much timed wall time has passed.
    Time(Duration),
    /// Every worker performs exactly this many timed operations.
    Count(u64),
}

/// One worker's part of a workload.
pub trait Worker: Send {
    /// Untimed: prepares a round in which the harness wants at most `limit`
    /// operations from this worker, and returns how many the round can
    /// hold. By default operations consume nothing: the round holds `limit`.
    fn prepare(&mut self, fs: &dyn Backend, limit: u64) -> Result<u64, OpFailure> {
        let _ = fs;
        Ok(limit)
    }
    /// Timed: one operation.
    fn step(&mut self, fs: &dyn Backend) -> Result<(), OpFailure>;
}

/// What a run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// Operations completed by all workers in the timed phases.
    pub ops: u64,
    /// Wall time of the timed phases, from the common start to the moment
    /// the last worker finished, summed over rounds.
    pub elapsed: Duration,
}

/// Workers that run rounds together: threads of this process ([`run`])
/// or processes of their own ([`crate::process`]).
pub trait Crew {
    /// How many workers there are.
    fn workers(&self) -> usize;
    /// One round: every worker prepares for at most its entry of
    /// `limits` operations, all start together, and the round ends when
    /// every worker has used its allowance or `deadline` has passed; the
    /// first failure (in worker order) if any worker's preparation or
    /// operation fails.
    fn round(&mut self, limits: &[u64], deadline: Option<Duration>) -> Result<Round, OpFailure>;
}

/// Runs `workers`, one thread each, within `budget`. Returns the first
/// failure (in worker order) if any worker's preparation or operation fails.
pub fn run(
    fs: &dyn Backend,
    workers: &mut [Box<dyn Worker>],
    budget: Budget,
) -> Result<Outcome, OpFailure> {
    drive(&mut Threads { fs, workers }, budget)
}

/// Runs `crew`'s rounds until `budget` is spent.
pub fn drive(crew: &mut dyn Crew, budget: Budget) -> Result<Outcome, OpFailure> {
    let n = crew.workers();
    let mut done = vec![0u64; n];
    let mut elapsed = Duration::ZERO;
    loop {
        let (limits, deadline) = match budget {
            Budget::Time(total) => {
                let left = total.saturating_sub(elapsed);
                if left.is_zero() {
                    break;
                }
                (vec![u64::MAX; n], Some(left))
            }
            Budget::Count(want) => {
                if done.iter().all(|&d| d >= want) {
                    break;
                }
                (done.iter().map(|&d| want - d).collect(), None)
            }
        };
        let round = crew.round(&limits, deadline)?;
        elapsed += round.elapsed;
        let round_ops: u64 = round.ops.iter().sum();
        for (d, ops) in done.iter_mut().zip(&round.ops) {
            *d += ops;
        }
        // A round in which nobody could do anything would repeat forever.
        if round_ops == 0 {
            break;
        }
    }
    Ok(Outcome {
        ops: done.iter().sum(),
        elapsed,
    })
}

/// What one round did.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// Each worker's operations.
    pub ops: Vec<u64>,
    /// From the common start until the last worker finished.
    pub elapsed: Duration,
}

/// Workers on threads of this process, sharing `fs`.
struct Threads<'a> {
    fs: &'a dyn Backend,
    workers: &'a mut [Box<dyn Worker>],
}

impl Crew for Threads<'_> {
    fn workers(&self) -> usize {
        self.workers.len()
    }

    fn round(&mut self, limits: &[u64], deadline: Option<Duration>) -> Result<Round, OpFailure> {
        round(self.fs, self.workers, limits, deadline)
    }
}

/// Why a worker stopped before its round ended.
enum Fault {
    Op(OpFailure),
    Panic(Box<dyn Any + Send>),
}

/// What a round's workers share with the thread coordinating them.
struct Shared {
    /// Workers and coordinator meet here twice: to start the timed phase
    /// together, and to end it.
    barrier: Barrier,
    /// Set by the coordinator when time is up, or by a failing worker.
    stop: AtomicBool,
    /// Workers that have finished their timed phase.
    finished: Mutex<usize>,
    finished_changed: Condvar,
}

/// One round: every worker prepares, all start together, and the round ends
/// when every worker has used its allowance or `deadline` has passed.
fn round(
    fs: &dyn Backend,
    workers: &mut [Box<dyn Worker>],
    limits: &[u64],
    deadline: Option<Duration>,
) -> Result<Round, OpFailure> {
    let n = workers.len();
    let shared = Shared {
        barrier: Barrier::new(n + 1),
        stop: AtomicBool::new(false),
        finished: Mutex::new(0),
        finished_changed: Condvar::new(),
    };

    let (results, elapsed) = thread::scope(|s| {
        let handles: Vec<_> = workers
            .iter_mut()
            .zip(limits)
            .map(|(worker, &limit)| {
                let shared = &shared;
                s.spawn(move || work(worker.as_mut(), fs, limit, shared))
            })
            .collect();

        shared.barrier.wait();
        let start = Instant::now();
        let unfinished = |count: &mut usize| *count < n;
        let count = shared.finished.lock().unwrap_or_else(|e| e.into_inner());
        let count = match deadline {
            Some(d) => {
                shared
                    .finished_changed
                    .wait_timeout_while(count, d, unfinished)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => shared
                .finished_changed
                .wait_while(count, unfinished)
                .unwrap_or_else(|e| e.into_inner()),
        };
        drop(count);
        shared.stop.store(true, Ordering::Relaxed);
        shared.barrier.wait();
        let elapsed = start.elapsed();
        let results: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| panic::resume_unwind(p)))
            .collect();
        (results, elapsed)
    });

    let mut ops = Vec::with_capacity(n);
    for (count, fault) in results {
        match fault {
            None => ops.push(count),
            Some(Fault::Op(f)) => return Err(f),
            Some(Fault::Panic(p)) => panic::resume_unwind(p),
        }
    }
    Ok(Round { ops, elapsed })
}

/// One worker's round on its own thread; returns its operation count and
/// why it stopped early, if it did.
fn work(
    worker: &mut dyn Worker,
    fs: &dyn Backend,
    limit: u64,
    shared: &Shared,
) -> (u64, Option<Fault>) {
    let (capacity, mut fault) = match catch(|| worker.prepare(fs, limit)) {
        Ok(capacity) => (capacity.min(limit), None),
        Err(fault) => (0, Some(fault)),
    };
    shared.barrier.wait();
    let mut ops = 0;
    if fault.is_none() {
        // Relaxed is enough: the flag only asks workers to stop soon; the
        // barrier below orders everything they did before the coordinator
        // reads the results.
        let timed = catch(|| {
            while ops < capacity && !shared.stop.load(Ordering::Relaxed) {
                worker.step(fs)?;
                ops += 1;
            }
            Ok(())
        });
        fault = timed.err();
    }
    if fault.is_some() {
        shared.stop.store(true, Ordering::Relaxed);
    }
    *shared.finished.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    shared.finished_changed.notify_one();
    shared.barrier.wait();
    (ops, fault)
}

/// Runs `f`, turning a panic into a [`Fault`]: a worker that unwound past
/// the barrier would leave every other thread waiting there forever, so the
/// panic is carried to the coordinating thread and resumed there.
fn catch<T>(f: impl FnOnce() -> Result<T, OpFailure>) -> Result<T, Fault> {
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result.map_err(Fault::Op),
        Err(payload) => Err(Fault::Panic(payload)),
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::path::Path;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    use super::*;
    use crate::backend::{FileHandle, OpenOptions};

    /// A backend that is never called: these workers do no I/O.
    #[derive(Debug)]
    struct Unused;

    impl Backend for Unused {
        fn name(&self) -> &str {
            "unused"
        }
        fn create_dir_all(&self, _: &Path) -> io::Result<()> {
            unreachable!()
        }
        fn create_file(&self, _: &Path) -> io::Result<()> {
            unreachable!()
        }
        fn stat(&self, _: &Path) -> io::Result<()> {
            unreachable!()
        }
        fn remove_file(&self, _: &Path) -> io::Result<()> {
            unreachable!()
        }
        fn rename(&self, _: &Path, _: &Path) -> io::Result<()> {
            unreachable!()
        }
        fn remove_dir_all(&self, _: &Path) -> io::Result<()> {
            unreachable!()
        }
        fn open_file(&self, _: &Path, _: OpenOptions) -> io::Result<Box<dyn FileHandle>> {
            unreachable!()
        }
    }

    /// Counts its steps and preparations; a round holds at most `batch`
    /// steps, and the step numbered `fail_at` (if any) fails.
    #[derive(Default)]
    struct Probe {
        steps: Arc<AtomicU64>,
        prepares: Arc<AtomicU64>,
        batch: Option<u64>,
        fail_at: Option<u64>,
        fail_prepare: bool,
        panic_at: Option<u64>,
        pause: Duration,
    }

    fn failure() -> OpFailure {
        OpFailure::new("probe", Path::new("p"), io::Error::other("injected"))
    }

    impl Worker for Probe {
        fn prepare(&mut self, _: &dyn Backend, limit: u64) -> Result<u64, OpFailure> {
            self.prepares.fetch_add(1, Ordering::Relaxed);
            if self.fail_prepare {
                return Err(failure());
            }
            Ok(self.batch.map_or(limit, |b| b.min(limit)))
        }

        fn step(&mut self, _: &dyn Backend) -> Result<(), OpFailure> {
            let n = self.steps.fetch_add(1, Ordering::Relaxed);
            if Some(n) == self.fail_at {
                return Err(failure());
            }
            if Some(n) == self.panic_at {
                panic!("injected panic");
            }
            if !self.pause.is_zero() {
                thread::sleep(self.pause);
            }
            Ok(())
        }
    }

    fn boxed(probes: Vec<Probe>) -> Vec<Box<dyn Worker>> {
        probes
            .into_iter()
            .map(|p| Box::new(p) as Box<dyn Worker>)
            .collect()
    }

    #[test]
    fn a_count_budget_runs_exactly_that_many_steps_per_worker() {
        let probes: Vec<Probe> = (0..3).map(|_| Probe::default()).collect();
        let steps: Vec<_> = probes.iter().map(|p| p.steps.clone()).collect();
        let mut workers = boxed(probes);
        let out = run(&Unused, &mut workers, Budget::Count(1000)).unwrap();
        assert_eq!(out.ops, 3000);
        for s in steps {
            assert_eq!(s.load(Ordering::Relaxed), 1000);
        }
    }

    #[test]
    fn a_time_budget_stops_unbounded_workers_after_the_duration() {
        let mut workers = boxed((0..2).map(|_| Probe::default()).collect());
        let wall = Instant::now();
        let out = run(
            &Unused,
            &mut workers,
            Budget::Time(Duration::from_millis(100)),
        )
        .unwrap();
        assert!(out.ops > 0);
        assert!(out.elapsed >= Duration::from_millis(100), "{out:?}");
        assert!(wall.elapsed() < Duration::from_secs(2), "{out:?}");
    }

    #[test]
    fn batched_workers_prepare_again_until_the_count_is_met() {
        let probe = Probe {
            batch: Some(7),
            ..Probe::default()
        };
        let (steps, prepares) = (probe.steps.clone(), probe.prepares.clone());
        let mut workers = boxed(vec![probe]);
        let out = run(&Unused, &mut workers, Budget::Count(20)).unwrap();
        assert_eq!(out.ops, 20);
        assert_eq!(steps.load(Ordering::Relaxed), 20);
        // 7 + 7 + 6.
        assert_eq!(prepares.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn batched_workers_prepare_again_until_the_time_is_spent() {
        let probe = Probe {
            batch: Some(5),
            pause: Duration::from_millis(1),
            ..Probe::default()
        };
        let (steps, prepares) = (probe.steps.clone(), probe.prepares.clone());
        let mut workers = boxed(vec![probe]);
        let out = run(
            &Unused,
            &mut workers,
            Budget::Time(Duration::from_millis(60)),
        )
        .unwrap();
        assert!(prepares.load(Ordering::Relaxed) > 1);
        assert_eq!(out.ops, steps.load(Ordering::Relaxed));
        assert!(out.elapsed >= Duration::from_millis(60), "{out:?}");
    }

    #[test]
    fn a_failing_step_stops_every_worker_and_is_reported() {
        let failing = Probe {
            fail_at: Some(3),
            ..Probe::default()
        };
        let mut workers = boxed(vec![Probe::default(), failing]);
        let wall = Instant::now();
        let err = run(&Unused, &mut workers, Budget::Time(Duration::from_secs(20))).unwrap_err();
        assert_eq!(err.op, "probe");
        assert!(wall.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_failing_preparation_is_reported_without_hanging() {
        let failing = Probe {
            fail_prepare: true,
            ..Probe::default()
        };
        let steps = failing.steps.clone();
        let mut workers = boxed(vec![failing, Probe::default()]);
        let wall = Instant::now();
        let err = run(&Unused, &mut workers, Budget::Time(Duration::from_secs(20))).unwrap_err();
        assert_eq!(err.source.to_string(), "injected");
        assert_eq!(steps.load(Ordering::Relaxed), 0);
        assert!(wall.elapsed() < Duration::from_secs(5));
    }

    #[test]
    #[should_panic(expected = "injected panic")]
    fn a_panicking_worker_panics_the_run_instead_of_hanging_it() {
        let panicking = Probe {
            panic_at: Some(3),
            ..Probe::default()
        };
        let mut workers = boxed(vec![Probe::default(), panicking]);
        let _ = run(&Unused, &mut workers, Budget::Count(u64::MAX));
    }
}
