//! Workers in processes of their own (`fxbench run --workers process`),
//! as FxMark runs them: a worker's file system calls then come from a
//! process of its own, with its own file table, its own mappings and,
//! for a KucoFS daemon, its own connection and request slots.
//!
//! The parent sets the workload up once, as for threads, and then starts
//! one process per worker: this program again, with the hidden `worker`
//! subcommand naming the workload, the spec through which the worker
//! reaches the same file system ([`Backend::attach_spec`]), the run's
//! directory, the worker's number and the workload's parameters. The
//! worker opens the backend, makes its [`Worker`] with
//! [`Workload::worker`], and follows the parent's orders, one JSON line
//! each on its stdin, answering with one JSON line each on its stdout:
//!
//! - [`Order::Prepare`] with a limit: it prepares a round and answers
//!   [`Report::Ready`] with the operations the round can hold;
//! - [`Order::Go`], sent to every worker once all are ready (the start
//!   barrier): it runs until it has done that many or is told to stop,
//!   and answers [`Report::Done`] with its count;
//! - [`Order::Stop`], sent when the time is up or another worker failed;
//! - the end of its stdin: it closes the file system and exits.
//!
//! Either answer may instead be [`Report::Failed`], naming the operation,
//! its path and its errno. Rounds, budgets and their sums are the
//! harness's ([`harness::drive`]), as for threads; the round's time runs
//! from the moment the parent sends the last `Go` to the moment it reads
//! the last `Done`.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::backend::{self, Backend};
use crate::error::OpFailure;
use crate::harness::{self, Crew, Round, Worker};
use crate::workload::{Params, Workload};

/// The hidden subcommand a worker process runs.
pub const SUBCOMMAND: &str = "worker";
/// How long a worker process may take to exit once its stdin closes.
pub const EXIT_WAIT: Duration = Duration::from_secs(30);

/// What the parent tells a worker process, one JSON line each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// Prepare a round of at most `limit` operations.
    Prepare { limit: u64 },
    /// Start the round.
    Go,
    /// End the round now.
    Stop,
}

/// What a worker process answers, one JSON line each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Report {
    /// Prepared: the round can hold `capacity` operations.
    Ready { capacity: u64 },
    /// The round is over for this worker: it did `ops` operations.
    Done { ops: u64 },
    /// An operation failed.
    Failed(Failure),
}

/// An [`OpFailure`] as a worker process reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub op: String,
    pub path: PathBuf,
    /// The errno, if the error carried one.
    pub errno: Option<i32>,
    pub message: String,
}

impl From<&OpFailure> for Failure {
    fn from(f: &OpFailure) -> Self {
        Failure {
            op: f.op.to_owned(),
            path: f.path.clone(),
            errno: f.source.raw_os_error(),
            message: f.source.to_string(),
        }
    }
}

impl Failure {
    /// The failure as the harness reports one: the operation's name if it
    /// is one the workloads use, the errno's error if it has one.
    fn into_op_failure(self, worker: usize) -> OpFailure {
        const OPS: [&str; 13] = [
            "create",
            "create directory",
            "stat",
            "unlink",
            "rename",
            "read",
            "write",
            "append",
            "fsync",
            "truncate",
            "open",
            "open backend",
            "make worker",
        ];
        let op = OPS.into_iter().find(|&o| o == self.op);
        let source = match self.errno {
            Some(e) => io::Error::from_raw_os_error(e),
            None => io::Error::other(self.message.clone()),
        };
        let source = match op {
            Some(_) => source,
            None => io::Error::new(source.kind(), format!("{}: {source}", self.op)),
        };
        OpFailure::new(
            op.unwrap_or("operation"),
            &self.path,
            io::Error::new(
                source.kind(),
                WorkerError {
                    worker,
                    error: source,
                },
            ),
        )
    }
}

/// What a failure of a worker process itself is named after.
pub(crate) const WORKER_OP: &str = "run worker processes in";

/// An error a worker process reported, naming the worker (the error's
/// text is part of this one's, not a source of its own: it is said
/// once).
#[derive(Debug, thiserror::Error)]
#[error("in worker process {worker}: {error}")]
struct WorkerError {
    worker: usize,
    error: io::Error,
}

/// What one worker process is to do: the arguments of its subcommand.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    pub workload: Workload,
    /// How it reaches the file system ([`Backend::attach_spec`]).
    pub backend: String,
    /// The run's directory, relative to the backend's root.
    pub dir: PathBuf,
    /// Its worker number.
    pub index: usize,
    pub params: Params,
}

impl Assignment {
    /// The command line that runs it: this program's `worker` subcommand.
    fn command(&self, exe: &Path) -> Command {
        let mut c = Command::new(exe);
        c.arg(SUBCOMMAND)
            .arg("--workload")
            .arg(self.workload.name())
            .arg("--backend")
            .arg(&self.backend)
            .arg("--dir")
            .arg(&self.dir)
            .arg("--index")
            .arg(self.index.to_string())
            .arg("--file-size")
            .arg(self.params.file_size.to_string());
        c
    }
}

/// One worker process, as the parent holds it.
#[derive(Debug)]
struct Member {
    child: Child,
    /// Its orders; `None` once closed, which ends it.
    orders: Option<ChildStdin>,
}

/// The worker processes of one run.
#[derive(Debug)]
pub struct Processes {
    members: Vec<Member>,
    /// Every worker's reports, with its number; `None` once its stdout
    /// closed.
    reports: mpsc::Receiver<(usize, Option<Report>)>,
    dir: PathBuf,
}

impl Processes {
    /// Starts `threads` worker processes of `workload` in `dir`, reaching
    /// the file system through `spec`; the workload is set up already.
    pub fn start(
        spec: &str,
        workload: Workload,
        dir: &Path,
        threads: usize,
        params: &Params,
    ) -> Result<Processes, OpFailure> {
        let failed = |e| OpFailure::new(WORKER_OP, dir, e);
        let exe = std::env::current_exe().map_err(failed)?;
        let (tx, reports) = mpsc::channel();
        let mut crew = Processes {
            members: Vec::with_capacity(threads),
            reports,
            dir: dir.to_owned(),
        };
        for index in 0..threads {
            let assignment = Assignment {
                workload,
                backend: spec.to_owned(),
                dir: dir.to_owned(),
                index,
                params: *params,
            };
            let mut command = assignment.command(&exe);
            command
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            // SAFETY: the closure runs in the child between fork and
            // exec, where only async-signal-safe calls are allowed: it
            // makes one `prctl` system call and allocates nothing. A
            // worker whose parent died is killed rather than left
            // waiting for orders.
            unsafe {
                command.pre_exec(|| {
                    rustix::process::set_parent_process_death_signal(Some(
                        rustix::process::Signal::KILL,
                    ))
                    .map_err(io::Error::from)
                })
            };
            // On failure `crew` is dropped, which ends those started.
            let mut child = command.spawn().map_err(failed)?;
            let orders = child.stdin.take();
            let out = child.stdout.take();
            crew.members.push(Member { child, orders });
            let tx = tx.clone();
            let read = move || {
                if let Some(out) = out {
                    for line in BufReader::new(out).lines() {
                        let report = line.ok().and_then(|l| serde_json::from_str(&l).ok());
                        let end = report.is_none();
                        if tx.send((index, report)).is_err() || end {
                            return;
                        }
                    }
                }
                let _ = tx.send((index, None));
            };
            std::thread::Builder::new()
                .name(format!("fxbench-worker-{index}"))
                .spawn(read)
                .map_err(failed)?;
        }
        Ok(crew)
    }

    /// Sends `order` to worker `i`; a worker whose pipe is closed has
    /// ended, and that is the failure.
    fn send(&mut self, i: usize, order: Order) -> Result<(), OpFailure> {
        let mut line = serde_json::to_vec(&order).expect("an order encodes");
        line.push(b'\n');
        let sent = match self.members[i].orders.as_mut() {
            Some(pipe) => pipe.write_all(&line).is_ok(),
            None => false,
        };
        if sent {
            Ok(())
        } else {
            Err(self.lost(i))
        }
    }

    /// The next report, waiting at most `timeout` (`None`: for ever);
    /// `Ok(None)` if none came in time.
    fn next(&mut self, timeout: Option<Duration>) -> Result<Option<(usize, Report)>, OpFailure> {
        // Every reading thread says `None` before it ends, and that is
        // taken as its worker's end: the channel cannot close first.
        let silent = || {
            let why = io::Error::other("every worker process's reports ended");
            OpFailure::new(WORKER_OP, &self.dir, why)
        };
        let got = match timeout {
            Some(t) => match self.reports.recv_timeout(t) {
                Ok(r) => r,
                Err(mpsc::RecvTimeoutError::Timeout) => return Ok(None),
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(silent()),
            },
            None => self.reports.recv().map_err(|_| silent())?,
        };
        match got {
            (i, Some(report)) => Ok(Some((i, report))),
            (i, None) => Err(self.lost(i)),
        }
    }

    /// The failure of a worker process that ended or garbled its reports.
    fn lost(&mut self, i: usize) -> OpFailure {
        let m = &mut self.members[i];
        m.orders = None;
        // It may still run (a report it garbled): it is ended either way.
        let _ = m.child.kill();
        let status = m
            .child
            .wait()
            .map_or_else(|e| e.to_string(), |s| s.to_string());
        OpFailure::new(
            WORKER_OP,
            &self.dir,
            io::Error::other(format!(
                "worker process {i} ended without reporting ({status})"
            )),
        )
    }

    /// Ends every worker process: closes its orders, and waits for it to
    /// close the file system and exit. A worker that does not exit
    /// within [`EXIT_WAIT`] is killed, and that is the failure.
    pub fn end(mut self) -> Result<(), OpFailure> {
        self.end_all()
    }

    fn end_all(&mut self) -> Result<(), OpFailure> {
        for m in &mut self.members {
            m.orders = None;
        }
        let start = Instant::now();
        let mut first = Ok(());
        for (i, m) in self.members.iter_mut().enumerate() {
            let status = loop {
                match m.child.try_wait() {
                    Ok(Some(status)) => break Ok(status),
                    Ok(None) if start.elapsed() < EXIT_WAIT => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Ok(None) => break Err(io::Error::other("did not exit; killed")),
                    Err(e) => break Err(e),
                }
            };
            let failed = match status {
                Ok(s) if s.success() => continue,
                Ok(s) => io::Error::other(format!("ended with {s}")),
                Err(e) => {
                    let _ = m.child.kill();
                    let _ = m.child.wait();
                    e
                }
            };
            let why = format!("worker process {i}: {failed}");
            first = first.and(Err(OpFailure::new(
                WORKER_OP,
                &self.dir,
                io::Error::other(why),
            )));
        }
        self.members.clear();
        first
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        let _ = self.end_all();
    }
}

impl Crew for Processes {
    fn workers(&self) -> usize {
        self.members.len()
    }

    fn round(&mut self, limits: &[u64], deadline: Option<Duration>) -> Result<Round, OpFailure> {
        let n = self.members.len();
        for (i, &limit) in limits.iter().enumerate() {
            self.send(i, Order::Prepare { limit })?;
        }
        let mut failures: Vec<Option<Failure>> = vec![None; n];
        let mut ready = 0;
        while ready < n {
            match self.next(None)? {
                Some((_, Report::Ready { .. })) => {}
                Some((i, Report::Failed(f))) => failures[i] = Some(f),
                Some((i, Report::Done { .. })) => return Err(self.lost(i)),
                None => continue,
            }
            ready += 1;
        }
        if let Some((i, f)) = first(failures) {
            return Err(f.into_op_failure(i));
        }
        // Every worker has prepared: they start together.
        for i in 0..n {
            self.send(i, Order::Go)?;
        }
        let start = Instant::now();
        let mut ops: Vec<Option<u64>> = vec![None; n];
        let mut failures: Vec<Option<Failure>> = vec![None; n];
        let mut stopping = false;
        let mut reported = 0;
        while reported < n {
            let wait = match deadline {
                Some(d) if !stopping => Some(d.saturating_sub(start.elapsed())),
                _ => None,
            };
            let report = self.next(wait)?;
            if report.is_some() {
                reported += 1;
            }
            let failed = match report {
                Some((i, Report::Done { ops: done })) => {
                    ops[i] = Some(done);
                    false
                }
                Some((i, Report::Failed(f))) => {
                    ops[i] = Some(0);
                    failures[i] = Some(f);
                    true
                }
                Some((i, Report::Ready { .. })) => return Err(self.lost(i)),
                // The time is up.
                None => true,
            };
            if failed && !stopping {
                stopping = true;
                for i in (0..n).filter(|&i| ops[i].is_none()) {
                    self.send(i, Order::Stop)?;
                }
            }
        }
        let elapsed = start.elapsed();
        if let Some((i, f)) = first(failures) {
            return Err(f.into_op_failure(i));
        }
        Ok(Round {
            ops: ops.into_iter().map(|o| o.unwrap_or(0)).collect(),
            elapsed,
        })
    }
}

/// The first failure, in worker order, with its worker's number.
fn first(failures: Vec<Option<Failure>>) -> Option<(usize, Failure)> {
    failures
        .into_iter()
        .enumerate()
        .find_map(|(i, f)| f.map(|f| (i, f)))
}

/// Runs one worker process: `assignment`, under the orders on stdin,
/// reporting on stdout (see the module's documentation). Returns once
/// stdin closes; an error only if stdout cannot be written.
pub fn work(assignment: &Assignment) -> io::Result<()> {
    let mut out = io::stdout().lock();
    let mut report = |r: &Report| -> io::Result<()> {
        let mut line = serde_json::to_vec(r).map_err(io::Error::other)?;
        line.push(b'\n');
        out.write_all(&line)?;
        out.flush()
    };
    let dir = &assignment.dir;
    // A worker that cannot start answers its first order with why, and
    // waits for the end of its orders as the others do: the parent
    // hears the reason, not a closed pipe.
    let started = backend::open(&assignment.backend)
        .map_err(|e| OpFailure::new("open backend", dir, io::Error::other(chain(&e))))
        .and_then(|fs| {
            let w = assignment.workload.worker(
                fs.as_ref(),
                dir,
                assignment.index,
                &assignment.params,
            )?;
            Ok((fs, w))
        });
    let stop = Arc::new(AtomicBool::new(false));
    let orders = read_orders(stop.clone());
    let (fs, mut worker) = match started {
        Ok(s) => s,
        Err(failure) => {
            for order in orders {
                if order != Order::Go {
                    report(&Report::Failed((&failure).into()))?;
                }
            }
            return Ok(());
        }
    };
    // What the last preparation allowed.
    let mut capacity = 0;
    for order in orders {
        let r = match order {
            Order::Prepare { limit } => {
                // Any stop meant for the round before came before this
                // order (the reading thread handles orders in turn).
                stop.store(false, Ordering::Relaxed);
                match worker.prepare(fs.as_ref(), limit) {
                    Ok(c) => {
                        capacity = c.min(limit);
                        Report::Ready { capacity }
                    }
                    Err(f) => {
                        capacity = 0;
                        Report::Failed((&f).into())
                    }
                }
            }
            Order::Go => run(worker.as_mut(), fs.as_ref(), capacity, &stop),
            // Stops are handled by the reading thread.
            Order::Stop => continue,
        };
        report(&r)?;
    }
    Ok(())
}

/// A round's timed phase: steps until `capacity` are done or `stop` is
/// set.
fn run(worker: &mut dyn Worker, fs: &dyn Backend, capacity: u64, stop: &AtomicBool) -> Report {
    let mut ops = 0;
    // Relaxed is enough: the flag only asks the worker to stop soon.
    while ops < capacity && !stop.load(Ordering::Relaxed) {
        if let Err(f) = worker.step(fs) {
            return Report::Failed((&f).into());
        }
        ops += 1;
    }
    Report::Done { ops }
}

/// The orders on stdin, read by a thread of their own: a `Stop` sets
/// `stop` at once (the worker's loop is busy then), the others are passed
/// on. The iterator ends with stdin, which stops a round in progress
/// too (the parent is gone, or gave up on the run).
fn read_orders(stop: Arc<AtomicBool>) -> mpsc::IntoIter<Order> {
    let (tx, rx) = mpsc::channel();
    let read = move || {
        let _end = StopOnDrop(stop.clone());
        for line in io::stdin().lock().lines() {
            let Ok(order) = line.map(|l| serde_json::from_str::<Order>(&l)) else {
                break;
            };
            match order {
                Ok(Order::Stop) => stop.store(true, Ordering::Relaxed),
                Ok(o) => {
                    if tx.send(o).is_err() {
                        break;
                    }
                }
                // An order this build does not know: the parent is
                // another build, and the worker gives up.
                Err(_) => break,
            }
        }
    };
    // Without the thread no order comes: the iterator ends at once, and
    // the parent hears of a worker that ended without reporting.
    let _ = std::thread::Builder::new()
        .name("fxbench-orders".into())
        .spawn(read);
    rx.into_iter()
}

/// Sets its flag when dropped: when the thread reading orders ends,
/// however it ends.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// An error and its sources in one line.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        line.push_str(": ");
        line.push_str(&e.to_string());
        next = e.source();
    }
    line
}

/// Runs a workload's timed phase in worker processes (see the module's
/// documentation), the workload set up in `dir` already.
pub fn run_workers(
    spec: &str,
    workload: Workload,
    dir: &Path,
    threads: usize,
    budget: harness::Budget,
    params: &Params,
) -> Result<harness::Outcome, OpFailure> {
    let mut crew = Processes::start(spec, workload, dir, threads, params)?;
    let outcome = harness::drive(&mut crew, budget);
    // The workers close the file system before the caller removes the
    // run's directory.
    let ended = crew.end();
    let outcome = outcome?;
    ended.map(|()| outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::chain;

    #[test]
    fn a_reported_failure_reads_as_the_workers_own_once() {
        let f = OpFailure::new(
            "create",
            Path::new("run/w1/3"),
            io::Error::from_raw_os_error(rustix::io::Errno::EXIST.raw_os_error()),
        );
        let back = Failure::from(&f).into_op_failure(1);
        assert_eq!(
            (back.op, back.path.as_path()),
            ("create", Path::new("run/w1/3"))
        );
        assert_eq!(back.source.kind(), io::ErrorKind::AlreadyExists);
        let msg = chain(&back);
        assert!(
            msg.starts_with("create run/w1/3: in worker process 1: "),
            "{msg}"
        );
        assert_eq!(msg.matches("os error 17").count(), 1, "{msg}");
        // An operation no workload names, and an error without an errno.
        let odd = Failure {
            op: "juggle".into(),
            path: PathBuf::from("x"),
            errno: None,
            message: "dropped".into(),
        };
        let msg = chain(&odd.into_op_failure(0));
        assert_eq!(msg, "operation x: in worker process 0: juggle: dropped");
    }

    #[test]
    fn orders_and_reports_are_one_json_line_each() {
        for order in [Order::Prepare { limit: 7 }, Order::Go, Order::Stop] {
            let line = serde_json::to_string(&order).unwrap();
            assert!(!line.contains('\n'));
            assert_eq!(serde_json::from_str::<Order>(&line).unwrap(), order);
        }
        let report = Report::Failed(Failure {
            op: "open".into(),
            path: PathBuf::from("a\nb"),
            errno: Some(2),
            message: "gone".into(),
        });
        let line = serde_json::to_string(&report).unwrap();
        assert!(!line.contains('\n'), "{line}");
        assert_eq!(serde_json::from_str::<Report>(&line).unwrap(), report);
    }
}
