//! The built `fxbench` binary, end to end, on a directory under /dev/shm.

// Shared with the root package's tests, which find their binary alike.
#[path = "../../tests/support/companion.rs"]
mod companion;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const WORKLOADS: [&str; 6] = ["MWCL", "MWCM", "MRPL", "MRPM", "MWUL", "MWRL"];
const DATA_WORKLOADS: [&str; 8] = [
    "DRBL", "DRBM", "DWOL", "DWOM", "DWAL", "DWSL", "RNDRD", "RNDWR",
];

/// A scratch directory on tmpfs if there is one, else in the temp dir.
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_owned()
    } else {
        std::env::temp_dir()
    };
    tempfile::Builder::new()
        .prefix("fxbench-test.")
        .tempdir_in(base)
        .unwrap()
}

fn fxbench(args: &[&str]) -> Output {
    Command::new(companion::binary(env!("CARGO_BIN_EXE_fxbench")))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `fxbench run` of the metadata workloads on `dir` and returns
/// stdout and the parsed JSON.
fn run(dir: &Path, budget: &[&str], threads: &str) -> (String, serde_json::Value) {
    run_workloads(dir, &WORKLOADS.join(","), budget, threads)
}

/// Runs `fxbench run` of `workloads` on `dir` and returns stdout and the
/// parsed JSON.
fn run_workloads(
    dir: &Path,
    workloads: &str,
    budget: &[&str],
    threads: &str,
) -> (String, serde_json::Value) {
    let json: PathBuf = dir.join("out.json");
    let backend = format!("dir:{}", dir.display());
    let mut args = vec![
        "run",
        "--workloads",
        workloads,
        "--backends",
        &backend,
        "--threads",
        threads,
        "--json",
        json.to_str().unwrap(),
    ];
    args.extend_from_slice(budget);
    let out = fxbench(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (stdout, value)
}

/// The table line for a workload and thread count, split into cells.
fn table_row<'a>(table: &'a str, workload: &str, threads: u64) -> Vec<&'a str> {
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|cells| cells[0] == workload && cells[2] == threads.to_string())
        .collect();
    assert_eq!(rows.len(), 1, "{workload} at {threads} in\n{table}");
    rows.into_iter().next().unwrap()
}

#[test]
fn all_six_workloads_run_for_an_exact_count_and_clean_up() {
    let tmp = scratch();
    let (table, json) = run(tmp.path(), &["--count", "300"], "1,2");
    let results = json["results"].as_array().unwrap();
    assert_eq!(results.len(), 12, "{json}");
    for w in WORKLOADS {
        for threads in [1, 2] {
            let r = results
                .iter()
                .find(|r| r["workload"] == w && r["threads"] == threads)
                .unwrap_or_else(|| panic!("no {w} at {threads} in {json}"));
            // --count is exact: 300 operations per worker.
            assert_eq!(r["ops"], 300 * threads, "{r}");
            assert!(r["seconds"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["ops_per_sec"].as_f64().unwrap() > 0.0, "{r}");
            assert_eq!(r["ratio_to_first"], 1.0, "{r}");
            let cells = table_row(&table, w, threads);
            assert_eq!(cells[3], (300 * threads).to_string(), "{table}");
        }
    }
    let machine = &json["machine"];
    for key in [
        "hostname",
        "kernel",
        "cpu_model",
        "logical_cpus",
        "memory_bytes",
        "date",
    ] {
        assert!(machine.get(key).is_some(), "no {key} in {machine}");
    }
    // Every run removed its directory: only the JSON file is left.
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["out.json"]);
}

#[test]
fn all_data_workloads_run_with_a_small_file_size_and_report_bandwidth() {
    let tmp = scratch();
    let budget = ["--count", "100", "--file-size", "64K"];
    let (table, json) = run_workloads(tmp.path(), &DATA_WORKLOADS.join(","), &budget, "1,2");
    let results = json["results"].as_array().unwrap();
    assert_eq!(results.len(), 16, "{json}");
    let header: Vec<_> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["workload", "backend", "threads", "ops", "seconds", "ops/s", "MiB/s", "ratio"]
    );
    for w in DATA_WORKLOADS {
        for threads in [1, 2] {
            let r = results
                .iter()
                .find(|r| r["workload"] == w && r["threads"] == threads)
                .unwrap_or_else(|| panic!("no {w} at {threads} in {json}"));
            assert_eq!(r["ops"], 100 * threads, "{r}");
            let ops_per_sec = r["ops_per_sec"].as_f64().unwrap();
            let mib_per_sec = r["mib_per_sec"].as_f64().unwrap();
            assert!(
                (mib_per_sec * 256.0 - ops_per_sec).abs() <= 1e-6 * ops_per_sec,
                "{r}"
            );
            let cells = table_row(&table, w, threads);
            assert_eq!(cells[6], format!("{mib_per_sec:.1}"), "{table}");
        }
    }
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["out.json"]);
}

#[test]
fn a_timed_run_lasts_about_its_budget() {
    let tmp = scratch();
    let (table, json) = run(tmp.path(), &["--seconds", "0.3"], "2");
    for r in json["results"].as_array().unwrap() {
        let seconds = r["seconds"].as_f64().unwrap();
        assert!((0.3..2.0).contains(&seconds), "{r}");
        assert!(r["ops"].as_u64().unwrap() > 0, "{r}");
        table_row(&table, r["workload"].as_str().unwrap(), 2);
    }
    assert_eq!(json["results"].as_array().unwrap().len(), 6);
}

#[test]
fn list_names_every_workload() {
    let out = fxbench(&["list"]);
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let names: Vec<_> = stdout
        .lines()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(names, [&WORKLOADS[..], &DATA_WORKLOADS[..]].concat());
}

/// Runs with one bad argument and returns the error line.
fn refused(args: &[&str]) -> String {
    let out = fxbench(args);
    assert!(!out.status.success(), "{args:?} succeeded");
    let err = stderr(&out);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    err
}

#[test]
fn bad_arguments_are_refused_in_one_sentence() {
    let tmp = scratch();
    let dir = format!("dir:{}", tmp.path().display());
    fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        [&["run", "--count", "1"][..], extra].concat()
    }

    let err = refused(&with(&["--workloads", "MWCL,NOPE", "--backends", &dir]));
    assert!(err.contains("unknown workload `NOPE`"), "{err}");

    let err = refused(&with(&["--backends", "nfs:/x"]));
    assert!(
        err.contains("unknown backend `nfs:/x`") && err.contains("dir:PATH"),
        "{err}"
    );

    let missing = format!("dir:{}/missing", tmp.path().display());
    let err = refused(&with(&["--backends", &missing]));
    assert!(err.contains("does not exist"), "{err}");

    let json = format!("{}/missing/out.json", tmp.path().display());
    let err = refused(&with(&["--backends", &dir, "--json", &json]));
    assert!(err.contains("write results to"), "{err}");

    let err = refused(&with(&["--backends", &dir, "--threads", "0"]));
    assert!(err.contains("at least 1"), "{err}");

    let err = refused(&with(&["--backends", &dir, "--file-size", "5000"]));
    assert!(
        err.contains("--file-size must be a positive multiple of 4096"),
        "{err}"
    );

    let err = refused(&with(&["--backends", &dir, "--workers", "fibers"]));
    assert!(err.contains("--workers is thread or process"), "{err}");

    // Nothing ran, so nothing was left behind.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[test]
fn embedded_kucofs_is_refused_with_process_workers() {
    let tmp = scratch();
    let image = tmp.path().join("img");
    let spec = format!("kucofs:size=16M+image={}", image.display());
    let err = refused(&["run", "--backends", &spec, "--workers", "process"]);
    assert!(
        err.contains("cannot run with --workers process") && err.contains("kucofs-daemon"),
        "{err}"
    );
    assert!(!image.exists());
}

/// The `kucofs` binary the kucofs-daemon backend runs: beside fxbench's
/// (`cargo test --workspace` builds both), else built now with the cargo
/// that runs this test; `None` where neither can be (a test binary run
/// away from its build tree).
fn kucofs_binary() -> Option<PathBuf> {
    let beside = companion::binary(env!("CARGO_BIN_EXE_fxbench")).with_file_name("kucofs");
    if beside.is_file() {
        return Some(beside);
    }
    let cargo = std::env::var_os("CARGO")?;
    let mut build = Command::new(cargo);
    build
        .args(["build", "-p", "kucofs", "--bin", "kucofs"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if !cfg!(debug_assertions) {
        build.arg("--release");
    }
    let built = build.status().is_ok_and(|s| s.success());
    (built && beside.is_file()).then_some(beside)
}

/// The names in directory `path` of `fs`.
fn names_in(fs: &kucofs_ulib::Fs, path: &str) -> Vec<String> {
    fs.read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// The names in directory `path` of the kernel's file system.
fn kernel_names_in(path: &Path) -> Vec<String> {
    std::fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn process_workers_make_the_files_they_count_on_a_directory_and_a_daemon() {
    let Some(kucofs) = kucofs_binary() else {
        println!("SKIPPED: no kucofs binary beside fxbench's, and no cargo to build one");
        return;
    };
    let tmp = scratch();
    let root = tmp.path().join("dir");
    std::fs::create_dir(&root).unwrap();
    let image = tmp.path().join("img");
    let json = tmp.path().join("out.json");
    let dir = format!("dir:{}", root.display());
    let daemon = format!(
        "kucofs-daemon:size=64M+image={}+keep+bin={}",
        image.display(),
        kucofs.display()
    );
    let backends = format!("{dir},{daemon}");
    let out = fxbench(&[
        "run",
        "--workloads",
        "MWCL,MWCM",
        "--backends",
        &backends,
        "--threads",
        "2",
        "--workers",
        "process",
        "--seconds",
        "0.3",
        "--keep",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("with 2 process(es)"),
        "{}",
        stderr(&out)
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let ops = |workload: &str, backend: &str| {
        let r = json["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["workload"] == workload && r["backend"] == backend)
            .unwrap_or_else(|| panic!("no {workload} on {backend} in {json}"));
        r["ops"].as_u64().unwrap()
    };
    // The kernel's directory: every file a worker counted is there, and
    // both workers made some.
    let (w0, w1) = (
        kernel_names_in(&root.join("fxbench-MWCL-2/w0")).len(),
        kernel_names_in(&root.join("fxbench-MWCL-2/w1")).len(),
    );
    assert!(w0 > 0 && w1 > 0, "{w0} and {w1} files");
    assert_eq!((w0 + w1) as u64, ops("MWCL", &dir));
    let shared = kernel_names_in(&root.join("fxbench-MWCM-2/shared"));
    assert_eq!(shared.len() as u64, ops("MWCM", &dir));
    assert!(
        shared.iter().any(|n| n.starts_with("w0-")) && shared.iter().any(|n| n.starts_with("w1-"))
    );
    // The daemon's image, closed cleanly and kept: the same.
    let fs = kucofs_ulib::Fs::open(&image).unwrap();
    let (w0, w1) = (
        names_in(&fs, "fxbench-MWCL-2/w0").len(),
        names_in(&fs, "fxbench-MWCL-2/w1").len(),
    );
    assert!(w0 > 0 && w1 > 0, "{w0} and {w1} files");
    assert_eq!((w0 + w1) as u64, ops("MWCL", &daemon));
    let shared = names_in(&fs, "fxbench-MWCM-2/shared");
    assert_eq!(shared.len() as u64, ops("MWCM", &daemon));
    assert!(
        shared.iter().any(|n| n.starts_with("w0-")) && shared.iter().any(|n| n.starts_with("w1-"))
    );
    fs.close().unwrap();
    // Nothing but the kept image is left of the daemon.
    let mut left = kernel_names_in(tmp.path());
    left.sort();
    assert_eq!(left, ["dir", "img", "out.json"]);
}

#[test]
fn roundtrip_times_a_daemons_client_and_reads_its_service_times() {
    let Some(kucofs) = kucofs_binary() else {
        println!("SKIPPED: no kucofs binary beside fxbench's, and no cargo to build one");
        return;
    };
    let tmp = scratch();
    let json = tmp.path().join("out.json");
    let daemon = format!(
        "size=64M+image={}+bin={}",
        tmp.path().join("img").display(),
        kucofs.display()
    );
    let out = fxbench(&[
        "roundtrip",
        "--requests",
        "50",
        "--daemon",
        &daemon,
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = String::from_utf8(out.stdout).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let figures = &json["roundtrip"];
    let client = figures["client"].as_array().unwrap();
    let requests: Vec<_> = client
        .iter()
        .map(|c| c["request"].as_str().unwrap())
        .collect();
    assert_eq!(
        requests,
        ["Ping", "Create", "Open", "Write", "Close", "Unlink"]
    );
    let served = figures["served"].as_array().unwrap();
    for c in client {
        assert!(c["ns"].as_f64().unwrap() > 0.0, "{c}");
        let request = c["request"].as_str().unwrap();
        let s = served
            .iter()
            .find(|s| s["request"] == request)
            .unwrap_or_else(|| panic!("the daemon served no {request}: {figures}"));
        // Each step of a file's life is one request, 50 files; the pings
        // are warm-up and 5 rounds of 50.
        let count = s["count"].as_u64().unwrap();
        match request {
            "Ping" => assert_eq!(count, 1000 + 5 * 50, "{s}"),
            _ => assert_eq!(count, 50, "{s}"),
        }
        assert!(table.lines().any(|l| l.contains(request)), "{table}");
    }
    // The daemon stopped and its image went.
    let left = kernel_names_in(tmp.path());
    assert_eq!(left, ["out.json"]);
}
