//! `fxbench roundtrip`: what a request costs a client of a KucoFS daemon
//! (`kucofs serve`, ARCHITECTURE.md §2), and what of that the daemon
//! spends serving it.
//!
//! A fresh daemon (the `kucofs-daemon` backend) serves one client thread
//! of this process, which times, each over `requests` calls, the round
//! trip of a `Ping` (a request Kfs answers doing nothing: the channel's
//! own cost, slot to Kfs thread and back) and of each step of a small
//! file's life: create it, open it for writing, write 4 KiB (a staged
//! `Write`: the data goes through the client's staging area and Kfs
//! copies it), close it, unlink it; each step is one request. The daemon
//! is then stopped, and its service time per request kind is read from
//! the counters it prints at shutdown (Kfs times one request in 8; the
//! whole session counts, the daemon's few own requests aside). A round
//! trip less its service time is what the channel and the client add.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

use crate::backend::daemon::{parse_served, DaemonBackend, Served};
use crate::backend::Backend as _;

/// Repetitions of the ping measurement; the median is reported.
pub const ROUNDS: usize = 5;
/// Pings before the timed ones, to have the daemon's thread awake and
/// the caches warm.
const WARM: u64 = 1000;

/// One client-side figure.
#[derive(Debug, Clone, Serialize)]
pub struct RoundTrip {
    /// What one call is.
    pub what: &'static str,
    /// The request it sends.
    pub request: &'static str,
    /// Mean nanoseconds per call (for the ping, the median of
    /// [`ROUNDS`] means).
    pub ns: f64,
}

/// Everything `fxbench roundtrip` measures.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    /// Calls timed of each kind.
    pub requests: u64,
    /// The client's round trips.
    pub client: Vec<RoundTrip>,
    /// The daemon's own counts and mean service times, by request kind.
    pub served: Vec<Served>,
}

impl Figures {
    /// The figures as a table, client round trips beside the daemon's
    /// service times.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<28} {:<8} {:>14} {:>14}\n",
            "client call", "request", "round trip ns", "service ns"
        );
        for r in &self.client {
            let served = self
                .served
                .iter()
                .find(|s| s.request == r.request)
                .map_or_else(|| "-".to_owned(), |s| s.mean_ns.to_string());
            out += &format!(
                "{:<28} {:<8} {:>14.0} {:>14}\n",
                r.what, r.request, r.ns, served
            );
        }
        out += "\ndaemon's counters at shutdown (whole session):\n";
        for s in &self.served {
            out += &format!(
                "  {:<10} {:>9} served, mean service time {} ns\n",
                s.request, s.count, s.mean_ns
            );
        }
        out
    }
}

/// Starts a daemon as `options` say (the `kucofs-daemon` backend's), times
/// `requests` calls of each kind from one client thread, stops the daemon
/// and reads its counters.
pub fn measure(options: &str, requests: u64) -> anyhow::Result<Figures> {
    anyhow::ensure!(requests > 0, "--requests must be at least 1");
    let spec = format!("kucofs-daemon:{options}");
    let backend = DaemonBackend::start(&spec, options)?;
    let client = calls(&backend, requests).with_context(|| format!("on {spec}"))?;
    let said = backend.stop()?.unwrap_or_default();
    let served = parse_served(&said);
    anyhow::ensure!(
        !served.is_empty(),
        "{spec}: the daemon printed no counters at shutdown; it said: {}",
        said.trim()
    );
    Ok(Figures {
        requests,
        client,
        served,
    })
}

/// Times the client's calls.
fn calls(backend: &DaemonBackend, requests: u64) -> anyhow::Result<Vec<RoundTrip>> {
    let fs = backend.fs();
    for _ in 0..WARM {
        fs.ping()?;
    }
    let mut pings = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for _ in 0..requests {
            fs.ping()?;
        }
        pings.push(start.elapsed().as_nanos() as f64 / requests as f64);
    }
    pings.sort_by(f64::total_cmp);
    let dir = Path::new("roundtrip");
    backend.create_dir_all(dir)?;
    // Nanoseconds spent in each step of a file's life, summed (each
    // with the two clock reads around it, a few tens of ns).
    let mut spent = [0u128; 5];
    let block = crate::workload::buffer();
    for i in 0..requests {
        let path = dir.join(i.to_string());
        let t = Instant::now();
        fs.create_file(&path)?;
        spent[0] += t.elapsed().as_nanos();
        let t = Instant::now();
        let f = kucofs_ulib::OpenOptions::new()
            .write(true)
            .open(fs, &path)?;
        spent[1] += t.elapsed().as_nanos();
        let t = Instant::now();
        let n = f.write_at(&block, 0)?;
        spent[2] += t.elapsed().as_nanos();
        anyhow::ensure!(n == block.len(), "a short write to {}", path.display());
        let t = Instant::now();
        drop(f);
        spent[3] += t.elapsed().as_nanos();
        let t = Instant::now();
        fs.remove_file(&path)?;
        spent[4] += t.elapsed().as_nanos();
    }
    backend.remove_dir_all(dir)?;
    let mean = |step: usize| spent[step] as f64 / requests as f64;
    Ok(vec![
        RoundTrip {
            what: "ping",
            request: "Ping",
            ns: pings[ROUNDS / 2],
        },
        RoundTrip {
            what: "create an empty file",
            request: "Create",
            ns: mean(0),
        },
        RoundTrip {
            what: "open it for writing",
            request: "Open",
            ns: mean(1),
        },
        RoundTrip {
            what: "write 4 KiB at 0",
            request: "Write",
            ns: mean(2),
        },
        RoundTrip {
            what: "close it",
            request: "Close",
            ns: mean(3),
        },
        RoundTrip {
            what: "unlink it",
            request: "Unlink",
            ns: mean(4),
        },
    ])
}
