//! Results as a terminal table and as a JSON document,
//! `{"machine": {...}, "results": [{...}, ...]}`.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::machine::Machine;
use crate::suite::Measurement;

/// The document written with `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub results: Vec<Row>,
}

/// One result, as written to JSON and shown in the table: one workload on
/// one backend at one thread count, over every round of the plan. With
/// several rounds the figures are those of the median round (for an even
/// number, the lower of the two middle ones): its operations, time, rate
/// and server work, and the median of the rounds' ratios.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub workload: String,
    pub backend: String,
    pub threads: usize,
    pub ops: u64,
    pub seconds: f64,
    pub ops_per_sec: f64,
    /// MiB read or written per second, for a data workload (`null` for a
    /// metadata one).
    pub mib_per_sec: Option<f64>,
    /// The median over the rounds of this row's ops/s over that of the
    /// first backend for the same workload, thread count and round (see
    /// `median`); `None` if that one is missing or did nothing. With
    /// several rounds it need not be this row's `ops_per_sec` over the
    /// first backend's row's: each is the median of its own.
    pub ratio_to_first: Option<f64>,
    /// The lowest and highest of those ratios.
    pub ratio_range: Option<(f64, f64)>,
    /// The ops/s of every round, in round order.
    pub rounds_ops_per_sec: Vec<f64>,
    /// The backend server's work over the run (setup included), per request
    /// type, if it has a server (KucoFS's Kfs).
    pub server: Option<BTreeMap<String, ServerOp>>,
    /// Share of the run's wall time the server spent serving requests.
    pub server_busy: Option<f64>,
    /// The longest time the server served nothing else during the run
    /// (setup included), in ns.
    pub server_longest_pause_ns: Option<u64>,
}

impl Row {
    /// The row's cells in the table, with or without the optional columns.
    fn cells(&self, bandwidth: bool, rounds: bool, server: bool) -> Vec<String> {
        let dash = || "-".to_owned();
        let mut row = vec![
            self.workload.clone(),
            self.backend.clone(),
            self.threads.to_string(),
            self.ops.to_string(),
            format!("{:.3}", self.seconds),
            format!("{:.0}", self.ops_per_sec),
        ];
        if bandwidth {
            row.push(self.mib_per_sec.map_or_else(dash, |x| format!("{x:.1}")));
        }
        row.push(self.ratio_to_first.map_or_else(dash, |x| format!("{x:.2}")));
        if rounds {
            let range = self.ratio_range;
            row.push(range.map_or_else(dash, |(lo, hi)| format!("{lo:.2}-{hi:.2}")));
        }
        if server {
            // The server's most frequent request and its mean service time.
            let busiest = self
                .server
                .as_ref()
                .and_then(|s| s.iter().max_by_key(|(_, o)| o.requests));
            row.push(busiest.map_or_else(String::new, |(k, o)| format!("{k} {:.0} ns", o.mean_ns)));
            row.push(
                self.server_longest_pause_ns
                    .map_or_else(String::new, |ns| format!("{:.2} ms", ns as f64 / 1e6)),
            );
        }
        row
    }
}

/// One request type's figures at the server.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerOp {
    /// Requests served.
    pub requests: u64,
    /// Mean service time per request (Kfs's `L`), in ns.
    pub mean_ns: f64,
}

impl Report {
    /// The report of `results`, comparing every backend with
    /// `first_backend`: one row per workload, backend and thread count, in
    /// the order they first appear, over all the rounds of each.
    pub fn new(machine: Machine, results: &[Measurement], first_backend: &str) -> Self {
        let same_cell =
            |a: &Measurement, b: &Measurement| a.workload == b.workload && a.threads == b.threads;
        let same = |a: &Measurement, b: &Measurement| same_cell(a, b) && a.backend == b.backend;
        // This round's ratio to the first backend's.
        let ratio = |m: &Measurement| {
            results
                .iter()
                .find(|b| same_cell(b, m) && b.round == m.round && b.backend == first_backend)
                .map(Measurement::ops_per_sec)
                .filter(|&b| b > 0.0)
                .map(|b| m.ops_per_sec() / b)
        };
        let mut rows = Vec::new();
        for (i, first) in results.iter().enumerate() {
            if results[..i].iter().any(|r| same(r, first)) {
                continue;
            }
            let mut rounds: Vec<&Measurement> = results.iter().filter(|r| same(r, first)).collect();
            rounds.sort_by_key(|m| m.round);
            let rounds_ops_per_sec = rounds.iter().map(|m| m.ops_per_sec()).collect();
            let mut ratios: Vec<f64> = rounds.iter().filter_map(|m| ratio(m)).collect();
            ratios.sort_by(f64::total_cmp);
            // The round shown: the median by rate (the lower middle one of
            // an even number, a round that happened).
            let mut by_rate = rounds.clone();
            by_rate.sort_by(|a, b| a.ops_per_sec().total_cmp(&b.ops_per_sec()));
            let m = by_rate[(by_rate.len() - 1) / 2];
            rows.push(Row {
                workload: m.workload.name().to_owned(),
                backend: m.backend.clone(),
                threads: m.threads,
                ops: m.ops,
                seconds: m.seconds,
                ops_per_sec: m.ops_per_sec(),
                mib_per_sec: m.mib_per_sec(),
                ratio_to_first: median(&ratios),
                ratio_range: ratios.first().zip(ratios.last()).map(|(&lo, &hi)| (lo, hi)),
                rounds_ops_per_sec,
                server: m.server.as_ref().map(|c| {
                    c.per_op
                        .iter()
                        .map(|(k, &(n, ns))| {
                            let op = ServerOp {
                                requests: n,
                                mean_ns: ns as f64 / n.max(1) as f64,
                            };
                            (k.clone(), op)
                        })
                        .collect()
                }),
                server_busy: m
                    .server
                    .as_ref()
                    .filter(|_| m.seconds > 0.0)
                    .map(|c| c.busy_ns as f64 / 1e9 / m.seconds),
                server_longest_pause_ns: m.server.as_ref().map(|c| c.longest_pause_ns),
            });
        }
        Report {
            machine,
            results: rows,
        }
    }

    /// The results as an aligned text table with a header line. The
    /// bandwidth column is there only when some result is of a data
    /// workload, the ratios' range only when some result had several
    /// rounds, the server column only when some backend has a server.
    pub fn table(&self) -> String {
        let bandwidth = self.results.iter().any(|r| r.mib_per_sec.is_some());
        let rounds = self.results.iter().any(|r| r.rounds_ops_per_sec.len() > 1);
        let server = self.results.iter().any(|r| r.server.is_some());
        let mut header = vec!["workload", "backend", "threads", "ops", "seconds", "ops/s"];
        if bandwidth {
            header.push("MiB/s");
        }
        header.push("ratio");
        if rounds {
            header.push("ratio range");
        }
        if server {
            header.push("server L");
            header.push("longest pause");
        }
        let mut cells = vec![header.into_iter().map(str::to_owned).collect::<Vec<_>>()];
        cells.extend(
            self.results
                .iter()
                .map(|r| r.cells(bandwidth, rounds, server)),
        );
        let columns = cells[0].len();
        let mut widths = vec![0; columns];
        for row in &cells {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let mut out = String::new();
        for row in &cells {
            let mut line = String::new();
            for (i, (cell, &w)) in row.iter().zip(&widths).enumerate() {
                // Names read left to right; numbers line up on the right.
                let text = if i < 2 {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                };
                if i > 0 {
                    line.push_str("  ");
                }
                line.push_str(&text);
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// The median of `sorted` (ascending); for an even count, the geometric
/// mean of the two middle values, so that the median of ratios is the
/// reciprocal of the median of their inverses. `None` if empty.
pub(crate) fn median(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] * sorted[n / 2]).sqrt()),
    }
}

/// The `--json` file, created before the benchmarks run so that an
/// unwritable path fails at once rather than after them.
#[derive(Debug)]
pub struct ResultsFile {
    path: PathBuf,
}

impl ResultsFile {
    /// Creates (or truncates) the file at `path`: a path that cannot be
    /// written is refused before anything is measured.
    pub fn create(path: &Path) -> Result<Self> {
        File::create(path).map_err(|source| Error::Results {
            path: path.to_owned(),
            source,
        })?;
        Ok(ResultsFile {
            path: path.to_owned(),
        })
    }

    /// Writes `report` (a [`Report`], or any other record) as
    /// pretty-printed JSON, in place of what an earlier call wrote: a run
    /// rewrites its file after every measurement, so one cut short keeps
    /// what it measured. The new text goes to a file beside it, renamed
    /// over it once whole, so the file is never found half-written.
    pub fn write(&mut self, report: &impl Serialize) -> Result<()> {
        let err = |source| Error::Results {
            path: self.path.clone(),
            source,
        };
        let mut json =
            serde_json::to_string_pretty(report).map_err(|e| err(std::io::Error::from(e)))?;
        json.push('\n');
        let mut name = self.path.as_os_str().to_owned();
        name.push(".partial");
        let partial = PathBuf::from(name);
        File::create(&partial)
            .and_then(|mut f| f.write_all(json.as_bytes()).and_then(|()| f.sync_data()))
            .and_then(|()| std::fs::rename(&partial, &self.path))
            .map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Workload;

    fn m(workload: Workload, backend: &str, threads: usize, ops: u64) -> Measurement {
        Measurement {
            workload,
            backend: backend.to_owned(),
            threads,
            round: 0,
            ops,
            seconds: 2.0,
            server: None,
        }
    }

    fn report() -> Report {
        let results = [
            m(Workload::Mwcl, "dir:a", 1, 100),
            m(Workload::Mwcl, "dir:b", 1, 300),
            m(Workload::Mwcl, "dir:a", 2, 400),
            m(Workload::Mwcl, "dir:b", 2, 100),
            m(Workload::Mwrl, "dir:a", 1, 0),
            m(Workload::Mwrl, "dir:b", 1, 10),
        ];
        Report::new(Machine::describe(), &results, "dir:a")
    }

    #[test]
    fn ratios_compare_with_the_first_backend_at_the_same_workload_and_threads() {
        let ratios: Vec<_> = report().results.iter().map(|r| r.ratio_to_first).collect();
        assert_eq!(
            ratios,
            [Some(1.0), Some(3.0), Some(1.0), Some(0.25), None, None]
        );
    }

    #[test]
    fn rounds_make_one_row_of_the_median_round_with_the_ratios_range() {
        let r = |backend: &str, round: usize, ops: u64| Measurement {
            round,
            ..m(Workload::Mwcl, backend, 1, ops)
        };
        // Per-round ratios b/a: 3, 0.5, 2.
        let results = [
            r("dir:a", 0, 100),
            r("dir:b", 0, 300),
            r("dir:a", 1, 400),
            r("dir:b", 1, 200),
            r("dir:a", 2, 100),
            r("dir:b", 2, 200),
        ];
        let report = Report::new(Machine::describe(), &results, "dir:a");
        assert_eq!(report.results.len(), 2);
        let (a, b) = (&report.results[0], &report.results[1]);
        assert_eq!((a.backend.as_str(), b.backend.as_str()), ("dir:a", "dir:b"));
        // The median round's rate (ops over the 2 s each run took).
        assert_eq!(a.rounds_ops_per_sec, [50.0, 200.0, 50.0]);
        assert_eq!(a.ops_per_sec, 50.0);
        assert_eq!(b.rounds_ops_per_sec, [150.0, 100.0, 100.0]);
        assert_eq!((b.ops, b.ops_per_sec), (200, 100.0));
        assert_eq!(b.ratio_to_first, Some(2.0));
        assert_eq!(b.ratio_range, Some((0.5, 3.0)));
        assert_eq!(a.ratio_range, Some((1.0, 1.0)));
        let table = report.table();
        assert!(
            table.lines().next().unwrap().contains("ratio range"),
            "{table}"
        );
        assert!(table.contains("0.50-3.00"), "{table}");
        // One round: no range column.
        assert!(!self::report().table().contains("range"));
    }

    #[test]
    fn the_median_of_an_even_count_is_the_geometric_mean_of_the_middle_two() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[1.0, 2.0, 9.0]), Some(2.0));
        assert_eq!(median(&[0.5, 2.0, 8.0, 9.0]), Some(4.0));
        // The median of the inverses is the inverse of the median.
        assert_eq!(median(&[1.0 / 9.0, 0.125, 0.5, 2.0]), Some(0.25));
    }

    #[test]
    fn the_table_has_a_header_and_one_aligned_line_per_result() {
        let table = report().table();
        let lines: Vec<_> = table.lines().collect();
        assert_eq!(lines.len(), 7, "{table}");
        assert!(
            lines[0].starts_with("workload  backend  threads"),
            "{table}"
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["MWCL", "dir:b", "1", "300", "2.000", "150", "3.00"]
        );
        assert!(lines[5].ends_with(" -"), "{table}");
        // Numbers are right-aligned: every line ends where the ratio column does.
        let ends: Vec<_> = lines
            .iter()
            .map(|l| l.rfind(|c: char| !c.is_whitespace()).unwrap())
            .collect();
        assert!(ends.iter().all(|&e| e == ends[0]), "{table}");
    }

    #[test]
    fn data_workloads_add_a_bandwidth_column() {
        let results = [
            m(Workload::Mwcl, "dir:a", 1, 100),
            m(Workload::Dwol, "dir:a", 1, 1024),
            m(Workload::Dwol, "dir:b", 1, 2048),
        ];
        let table = Report::new(Machine::describe(), &results, "dir:a").table();
        let lines: Vec<Vec<_>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines,
            [
                vec!["workload", "backend", "threads", "ops", "seconds", "ops/s", "MiB/s", "ratio"],
                vec!["MWCL", "dir:a", "1", "100", "2.000", "50", "-", "1.00"],
                vec!["DWOL", "dir:a", "1", "1024", "2.000", "512", "2.0", "1.00"],
                vec!["DWOL", "dir:b", "1", "2048", "2.000", "1024", "4.0", "2.00"],
            ],
            "{table}"
        );
    }

    #[test]
    fn a_later_write_replaces_the_earlier_one_whole() {
        let tmp = crate::testing::tempdir();
        let path = tmp.path().join("out.json");
        let mut file = ResultsFile::create(&path).unwrap();
        file.write(&serde_json::json!({ "long": "x".repeat(200) }))
            .unwrap();
        file.write(&serde_json::json!({ "short": 1 })).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v, serde_json::json!({ "short": 1 }));
    }

    #[test]
    fn the_json_has_exactly_machine_and_results() {
        let tmp = crate::testing::tempdir();
        let path = tmp.path().join("out.json");
        ResultsFile::create(&path)
            .unwrap()
            .write(&report())
            .unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["machine", "results"]);
        let first = &v["results"][1];
        assert_eq!(first["workload"], "MWCL");
        assert_eq!(first["backend"], "dir:b");
        assert_eq!(first["threads"], 1);
        assert_eq!(first["ops"], 300);
        assert_eq!(first["seconds"], 2.0);
        assert_eq!(first["ops_per_sec"], 150.0);
        assert_eq!(first["ratio_to_first"], 3.0);
        assert!(first["mib_per_sec"].is_null());
        assert!(v["machine"]["date"].as_str().unwrap().ends_with('Z'));
    }

    #[test]
    fn the_json_of_a_data_workload_has_its_bandwidth() {
        let report = Report::new(
            Machine::describe(),
            &[m(Workload::Rndrd, "dir:a", 2, 512)],
            "dir:a",
        );
        let v = serde_json::to_value(&report).unwrap();
        let row = &v["results"][0];
        assert_eq!(row["workload"], "RNDRD");
        assert_eq!(row["ops_per_sec"], 256.0);
        assert_eq!(row["mib_per_sec"], 1.0);
        assert_eq!(row["ratio_to_first"], 1.0);
    }

    #[test]
    fn an_unwritable_path_fails_at_creation() {
        let tmp = crate::testing::tempdir();
        let err = ResultsFile::create(&tmp.path().join("missing/out.json")).unwrap_err();
        assert!(err.to_string().starts_with("write results to "), "{err}");
    }
}
