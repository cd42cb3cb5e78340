//! Model-based test of KucoFS's namespace: random operation sequences run
//! on the model (`tests/model`, itself checked against the Linux kernel by
//! `model_vs_kernel`) and on KucoFS must give the same results, errno for
//! errno. Then the file system is closed and reopened, and the tree must be
//! identical; then it is dropped without a clean close (a simulated crash)
//! and reopened, identical again.
//!
//! The sequences also run in a process of a user who is not root, on an
//! image it made, against the model of a caller who owns everything
//! (`Model::new_as_owner`): Kfs's permission checks give the errors the
//! kernel gives. Reads (`stat`, `readlink`, `readdir`) are left out of
//! those sequences: Ulib reads through its mappings, unchecked.

mod model;

mod support;

use std::io;
use std::path::Path;

use kucofs_ulib::{Config, Fs, Metadata, Permissions};
use model::{Errno, Kind, Model, Op, Outcome, Stat, TreeEntry, PERM_MASK, UMASK};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

fn errno(e: io::Error) -> Errno {
    e.raw_os_error()
        .unwrap_or_else(|| panic!("an error without an errno: {e}"))
}

fn done(r: io::Result<()>) -> Outcome {
    Outcome::from_unit(r.map_err(errno))
}

fn kind(m: &Metadata) -> Kind {
    if m.is_dir() {
        Kind::Dir
    } else if m.is_symlink() {
        Kind::Symlink
    } else {
        Kind::File
    }
}

fn stat_of(m: &Metadata) -> Stat {
    let k = kind(m);
    Stat {
        kind: k,
        perm: m.mode() & PERM_MASK,
        nlink: m.nlink(),
        size: if k == Kind::Dir { 0 } else { m.len() },
    }
}

fn apply(fs: &Fs, op: &Op) -> Outcome {
    let stat = |r: io::Result<Metadata>| match r {
        Ok(m) => Outcome::Stat(stat_of(&m)),
        Err(e) => Outcome::Err(errno(e)),
    };
    match op {
        Op::Create(p) => done(fs.create_file(p)),
        Op::Mkdir(p) => done(fs.create_dir(p)),
        Op::Unlink(p) => done(fs.remove_file(p)),
        Op::Rmdir(p) => done(fs.remove_dir(p)),
        Op::Rename {
            from,
            to,
            noreplace: true,
        } => done(fs.rename_noreplace(from, to)),
        Op::Rename { from, to, .. } => done(fs.rename(from, to)),
        Op::Link { existing, new } => done(fs.hard_link(existing, new)),
        Op::Symlink { target, link } => done(fs.symlink(target, link)),
        Op::Readlink(p) => match fs.read_link(p) {
            Ok(t) => Outcome::Target(t.to_str().expect("UTF-8").to_owned()),
            Err(e) => Outcome::Err(errno(e)),
        },
        Op::Stat(p) => stat(fs.metadata(p)),
        Op::Lstat(p) => stat(fs.symlink_metadata(p)),
        Op::ReadDir(p) => match read_dir(fs, p) {
            Ok(v) => Outcome::Entries(v),
            Err(e) => Outcome::Err(errno(e)),
        },
        Op::Chmod { path, mode } => done(fs.set_permissions(path, Permissions::from_mode(*mode))),
    }
}

fn read_dir(fs: &Fs, p: &str) -> io::Result<Vec<(String, Kind)>> {
    let mut v = Vec::new();
    for e in fs.read_dir(p)? {
        let e = e?;
        let t = e.file_type()?;
        let k = if t.is_dir() {
            Kind::Dir
        } else if t.is_symlink() {
            Kind::Symlink
        } else {
            Kind::File
        };
        v.push((e.file_name().into_string().expect("UTF-8"), k));
    }
    v.sort();
    Ok(v)
}

/// The whole tree, in `model::canonical_tree` form.
fn tree(fs: &Fs) -> Vec<TreeEntry> {
    let mut raw = Vec::new();
    let mut pending = vec![String::new()];
    while let Some(prefix) = pending.pop() {
        let dir = if prefix.is_empty() {
            "/".to_owned()
        } else {
            prefix.clone()
        };
        for e in fs.read_dir(&dir).expect("read a directory") {
            let e = e.expect("an entry");
            let name = e.file_name().into_string().expect("UTF-8");
            let path = format!("{prefix}{name}");
            let m = e.metadata().expect("metadata of an entry");
            let s = stat_of(&m);
            let target = (s.kind == Kind::Symlink).then(|| {
                fs.read_link(&path)
                    .expect("readlink")
                    .to_str()
                    .unwrap()
                    .to_owned()
            });
            if s.kind == Kind::Dir {
                pending.push(format!("{path}/"));
            }
            raw.push((
                m.ino(),
                TreeEntry {
                    path,
                    kind: s.kind,
                    perm: s.perm,
                    nlink: s.nlink,
                    target,
                    first_link: None,
                },
            ));
        }
    }
    model::canonical_tree(raw)
}

/// How the test's file system sends changes to Kfs.
#[derive(Debug, Clone, Copy)]
enum Route {
    /// Applied by the calling thread while Kfs is idle (the default).
    Direct,
    /// Through the request slots to the Kfs thread, with pre-located
    /// addresses.
    Queued,
    /// Through the slots, paths only: Kfs resolves everything.
    QueuedNoHints,
}

fn config(route: Route) -> Config {
    Config {
        direct: matches!(route, Route::Direct),
        collaborative: !matches!(route, Route::QueuedNoHints),
        umask: UMASK,
        ..Config::default()
    }
}

fn check(ops: &[Op], route: Route) -> Result<(), TestCaseError> {
    check_with(ops, route, Model::new())
}

/// Runs `ops` on KucoFS and on `model`, which starts empty.
fn check_with(ops: &[Op], route: Route, mut model: Model) -> Result<(), TestCaseError> {
    let Some(dir) = support::shm_dir("kucofs-model-") else {
        return Ok(());
    };
    let image = dir.path().join("img");
    kucofs_kfs::mkfs(&image, 4 << 20, false).expect("mkfs");
    let fs = Fs::open_with(&image, config(route)).expect("open");
    // The model's root is 0o755 and the caller's, as mkfs makes it.
    for (i, op) in ops.iter().enumerate() {
        let want = model.apply(op);
        let got = apply(&fs, op);
        prop_assert_eq!(&got, &want, "op {} of {:?}: {:?}", i, ops, op);
    }
    let want = model.tree();
    prop_assert_eq!(&tree(&fs), &want, "tree after {:?}", ops);
    // The route asked for is the one taken: queued requests apply nothing
    // directly, and without collaborative indexing none carries addresses.
    let stats = fs.kfs_stats().expect("Kfs runs");
    if !matches!(route, Route::Direct) {
        prop_assert_eq!(stats.direct, 0, "{}", stats);
    }
    if matches!(route, Route::QueuedNoHints) {
        prop_assert_eq!(stats.hints_used + stats.hints_stale, 0, "{}", stats);
    }
    fs.close().expect("close");
    let fs = Fs::open_with(&image, config(route)).expect("reopen");
    prop_assert_eq!(&tree(&fs), &want, "tree after a clean reopen");
    // More changes after the reopen live only in the log; then a crash.
    let extra: Vec<Op> = ops.iter().rev().take(10).cloned().collect();
    for op in &extra {
        model.apply(op);
        apply(&fs, op);
    }
    let want = model.tree();
    prop_assert_eq!(&tree(&fs), &want);
    fs.simulate_crash();
    let fs = Fs::open_with(&image, config(route)).expect("reopen after a crash");
    prop_assert_eq!(&tree(&fs), &want, "tree after crash recovery");
    fs.close().expect("close");
    let report = kucofs_kfs::fsck(Path::new(&image)).expect("fsck runs");
    prop_assert!(report.problems.is_empty(), "fsck: {:?}", report.problems);
    Ok(())
}

fn proptest_config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(proptest_config(256))]

    #[test]
    fn kucofs_matches_the_model(ops in model::ops()) {
        check(&ops, Route::Direct)?;
    }
}

proptest! {
    #![proptest_config(proptest_config(128))]

    #[test]
    fn kucofs_matches_the_model_through_the_kfs_thread(ops in model::ops()) {
        check(&ops, Route::Queued)?;
    }

    #[test]
    fn kucofs_matches_the_model_without_collaborative_indexing(ops in model::ops()) {
        check(&ops, Route::QueuedNoHints)?;
    }
}

/// The user the sequences also run as.
const USER: u32 = 1001;

/// Whether `op` changes the namespace (Kfs checks it) rather than reads.
fn changes(op: &Op) -> bool {
    !matches!(
        op,
        Op::Stat(_) | Op::Lstat(_) | Op::ReadDir(_) | Op::Readlink(_)
    )
}

#[test]
fn kucofs_matches_the_model_as_a_user() {
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED: running the sequences as another user needs root");
        return;
    }
    // A directory the user owns for its images.
    let Some(base) = support::shm_dir("kucofs-model-user-") else {
        return;
    };
    std::os::unix::fs::chown(base.path(), Some(USER), Some(USER)).unwrap();
    support::run_as_user(
        "sequences_as_a_user",
        USER,
        USER,
        &[],
        &[(support::SHM_BASE_ENV, base.path().as_os_str())],
    );
}

#[test]
#[ignore = "run by kucofs_matches_the_model_as_a_user as another user"]
fn sequences_as_a_user() {
    assert_eq!(rustix::process::geteuid().as_raw(), USER);
    for (route, cases) in [(Route::Direct, 128), (Route::Queued, 64)] {
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases,
            // This user may not write beside the sources.
            failure_persistence: None,
            ..ProptestConfig::default()
        });
        let result = runner.run(&model::ops(), |ops| {
            let ops: Vec<Op> = ops.into_iter().filter(changes).collect();
            check_with(&ops, route, Model::new_as_owner())
        });
        if let Err(e) = result {
            panic!("{route:?}: {e}");
        }
    }
}
