//! Checks the namespace model (`tests/model`) against the Linux kernel:
//! random operation sequences run on the model and on a fresh tmpfs
//! directory under /dev/shm must give the same results, errno for errno,
//! and leave the same tree.
//!
//! The kernel side runs in a thread of its own that unshares its
//! filesystem context (CLONE_FS: root, cwd and umask) and chroots into the
//! sandbox directory, so that the sandbox behaves like the model's root:
//! `..` of it is itself and an absolute symlink target stays inside. This
//! needs root, which the tests run as.
//!
//! Each sequence also runs as a user who is not root (`USER`): the
//! sandbox is theirs, and the kernel thread takes that user's ids for
//! its operations alone (`setresuid` and `setresgid` as raw system calls
//! change only the calling thread), against the model of a caller who
//! owns everything (`Model::new_as_owner`), so that the modes `chmod`
//! sets give the permission errors.

mod model;

use std::ffi::CString;
use std::fs::{self, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::thread;

use model::{Errno, Kind, Model, Op, Outcome, Stat, TreeEntry, PERM_MASK, UMASK};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// The user and group the sequences also run as.
const USER: (u32, u32) = (1001, 1001);

/// Runs `ops` in a fresh sandbox, as root or as `user` (who then owns the
/// sandbox); returns each outcome and the final tree.
fn run_on_kernel(ops: &[Op], user: Option<(u32, u32)>) -> (Vec<Outcome>, Vec<TreeEntry>) {
    let sandbox = tempfile::Builder::new()
        .prefix("kucofs-model-")
        .tempdir_in("/dev/shm")
        .expect("sandbox directory under /dev/shm");
    // The model's root starts as 0o755; tempfile makes 0o700.
    fs::set_permissions(sandbox.path(), Permissions::from_mode(0o755)).expect("chmod sandbox");
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(sandbox.path(), Some(uid), Some(gid)).expect("chown sandbox");
    }
    let root = sandbox.path().to_owned();
    let ops = ops.to_vec();
    thread::spawn(move || {
        enter(&root);
        if let Some((uid, gid)) = user {
            become_user(uid, gid);
        }
        let outcomes = ops.iter().map(apply).collect();
        // Root again, to list what the user may no longer read.
        if user.is_some() {
            become_root();
        }
        (outcomes, tree())
    })
    .join()
    .expect("kernel thread")
}

/// Makes `uid`:`gid` (no supplementary groups) this thread's effective
/// ids, keeping root's real and saved ids so that it may come back.
/// Raw system calls: the C library's wrappers would change every thread.
fn become_user(uid: u32, gid: u32) {
    let keep = libc::c_long::from(-1i32);
    let (uid, gid) = (libc::c_long::from(uid), libc::c_long::from(gid));
    // SAFETY: setgroups with a count of 0 reads no buffer; the other two
    // take only ids. Each acts on the calling thread only.
    let groups = unsafe { libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) };
    // SAFETY: as above.
    let g = unsafe { libc::syscall(libc::SYS_setresgid, keep, gid, keep) };
    // SAFETY: as above.
    let u = unsafe { libc::syscall(libc::SYS_setresuid, keep, uid, keep) };
    assert!(
        groups == 0 && g == 0 && u == 0,
        "set this thread's ids: {}",
        io::Error::last_os_error()
    );
}

/// Undoes [`become_user`]: the user id first, which gives back the
/// capability to set the group's.
fn become_root() {
    let keep = libc::c_long::from(-1i32);
    // SAFETY: setresuid and setresgid take only ids, and act on the
    // calling thread only.
    let u = unsafe { libc::syscall(libc::SYS_setresuid, keep, 0, keep) };
    // SAFETY: as above.
    let g = unsafe { libc::syscall(libc::SYS_setresgid, keep, 0, keep) };
    assert!(
        u == 0 && g == 0,
        "set this thread's ids back: {}",
        io::Error::last_os_error()
    );
}

/// Makes `root` this thread's root and current directory, with the
/// model's umask, leaving the rest of the process alone.
fn enter(root: &Path) {
    // SAFETY: unshare takes no pointers; CLONE_FS only gives this thread a
    // private copy of its root, cwd and umask.
    let rc = unsafe { libc::unshare(libc::CLONE_FS) };
    assert_eq!(rc, 0, "unshare(CLONE_FS): {}", io::Error::last_os_error());
    std::os::unix::fs::chroot(root).expect("chroot into the sandbox (needs root)");
    std::env::set_current_dir("/").expect("chdir to the sandbox root");
    // SAFETY: umask takes no pointers and cannot fail.
    unsafe { libc::umask(UMASK) };
}

fn errno(e: io::Error) -> Errno {
    e.raw_os_error().expect("an error from a system call")
}

fn done(r: io::Result<()>) -> Outcome {
    Outcome::from_unit(r.map_err(errno))
}

fn stat_of(meta: &fs::Metadata) -> Stat {
    let kind = kind_of(meta.file_type());
    Stat {
        kind,
        perm: meta.mode() & PERM_MASK,
        nlink: meta.nlink(),
        // tmpfs counts directory sizes in bytes per entry: not modelled.
        size: if kind == Kind::Dir { 0 } else { meta.size() },
    }
}

fn kind_of(t: fs::FileType) -> Kind {
    if t.is_dir() {
        Kind::Dir
    } else if t.is_symlink() {
        Kind::Symlink
    } else {
        assert!(t.is_file(), "only files, directories and symlinks are made");
        Kind::File
    }
}

fn text(p: &Path) -> String {
    p.to_str().expect("paths are UTF-8").to_owned()
}

/// The operation as a system call, in the sandbox thread.
fn apply(op: &Op) -> Outcome {
    match op {
        Op::Create(p) => done(
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(p)
                .map(drop),
        ),
        Op::Mkdir(p) => done(fs::create_dir(p)),
        Op::Unlink(p) => done(fs::remove_file(p)),
        Op::Rmdir(p) => done(fs::remove_dir(p)),
        Op::Rename {
            from,
            to,
            noreplace,
        } => done(renameat2(from, to, *noreplace)),
        Op::Link { existing, new } => done(fs::hard_link(existing, new)),
        Op::Symlink { target, link } => done(std::os::unix::fs::symlink(target, link)),
        Op::Readlink(p) => match fs::read_link(p) {
            Ok(target) => Outcome::Target(text(&target)),
            Err(e) => Outcome::Err(errno(e)),
        },
        Op::Stat(p) => match fs::metadata(p) {
            Ok(meta) => Outcome::Stat(stat_of(&meta)),
            Err(e) => Outcome::Err(errno(e)),
        },
        Op::Lstat(p) => match fs::symlink_metadata(p) {
            Ok(meta) => Outcome::Stat(stat_of(&meta)),
            Err(e) => Outcome::Err(errno(e)),
        },
        Op::ReadDir(p) => match read_dir(Path::new(p)) {
            Ok(entries) => Outcome::Entries(entries),
            Err(e) => Outcome::Err(errno(e)),
        },
        Op::Chmod { path, mode } => done(fs::set_permissions(path, Permissions::from_mode(*mode))),
    }
}

fn renameat2(from: &str, to: &str, noreplace: bool) -> io::Result<()> {
    let from = CString::new(from).expect("no NUL in paths");
    let to = CString::new(to).expect("no NUL in paths");
    let flags = if noreplace { libc::RENAME_NOREPLACE } else { 0 };
    // SAFETY: both paths are NUL-terminated and outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn read_dir(dir: &Path) -> io::Result<Vec<(String, Kind)>> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().into_string().expect("UTF-8 names");
        entries.push((name, kind_of(entry.file_type()?)));
    }
    entries.sort();
    Ok(entries)
}

/// The whole sandbox, in `model::canonical_tree` form.
fn tree() -> Vec<TreeEntry> {
    let mut raw = Vec::new();
    let mut pending = vec![(Path::new("/").to_owned(), String::new())];
    while let Some((dir, prefix)) = pending.pop() {
        for entry in fs::read_dir(&dir).expect("read a sandbox directory") {
            let entry = entry.expect("a directory entry");
            let name = entry.file_name().into_string().expect("UTF-8 names");
            let meta = entry.metadata().expect("lstat a directory entry");
            let stat = stat_of(&meta);
            let path = format!("{prefix}{name}");
            let target = (stat.kind == Kind::Symlink)
                .then(|| text(&fs::read_link(entry.path()).expect("readlink")));
            if stat.kind == Kind::Dir {
                pending.push((entry.path(), format!("{path}/")));
            }
            let entry = TreeEntry {
                path,
                kind: stat.kind,
                perm: stat.perm,
                nlink: stat.nlink,
                target,
                first_link: None,
            };
            raw.push((meta.ino(), entry));
        }
    }
    model::canonical_tree(raw)
}

/// Runs `ops` on the model and on the kernel, as root; fails at the first
/// operation whose outcome differs, or on a different final tree.
fn check(ops: &[Op]) -> Result<(), TestCaseError> {
    check_as(ops, None)
}

/// [`check`] as root or as `user`.
fn check_as(ops: &[Op], user: Option<(u32, u32)>) -> Result<(), TestCaseError> {
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED: the kernel side runs in a chroot(2) sandbox, which needs root");
        return Ok(());
    }
    let (outcomes, kernel_tree) = run_on_kernel(ops, user);
    let mut model = if user.is_some() {
        Model::new_as_owner()
    } else {
        Model::new()
    };
    for (i, (op, kernel)) in ops.iter().zip(&outcomes).enumerate() {
        let got = model.apply(op);
        prop_assert_eq!(
            &got,
            kernel,
            "op #{} {:?} (model left, kernel right)",
            i,
            op
        );
    }
    prop_assert_eq!(
        model.tree(),
        kernel_tree,
        "final trees (model left, kernel right)"
    );
    Ok(())
}

/// 1024 cases, or `PROPTEST_CASES` for a longer hunt.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1024)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn model_matches_kernel(ops in model::ops()) {
        check(&ops)?;
    }

    #[test]
    fn model_matches_kernel_as_a_user(ops in model::ops()) {
        check_as(&ops, Some(USER))?;
    }
}

// Cases the generator cannot reach: exact link-count limits, absolute
// symlink targets and the root named by slashes alone.

fn s(path: &str) -> String {
    path.to_owned()
}

fn repeat(component: &str, n: usize) -> String {
    vec![component; n].join("/")
}

#[test]
fn symlink_limit_is_40_per_lookup() {
    // `s` -> "." costs one link per use; `t` costs 11.
    let mut ops = vec![
        Op::Symlink {
            target: s("."),
            link: s("s"),
        },
        Op::Symlink {
            target: repeat("s", 10),
            link: s("t"),
        },
    ];
    for n in [39, 40, 41] {
        ops.push(Op::Stat(repeat("s", n)));
        ops.push(Op::Lstat(repeat("s", n + 1)));
        ops.push(Op::Mkdir(format!("{}/d{n}", repeat("s", n))));
        ops.push(Op::Create(format!("{}/f{n}", repeat("s", n))));
    }
    for tail in [6, 7, 8] {
        ops.push(Op::Stat(format!("t/t/t/{}", repeat("s", tail))));
    }
    check(&ops).unwrap();
}

#[test]
fn absolute_symlink_targets_start_at_the_root() {
    let ops = vec![
        Op::Mkdir(s("a")),
        Op::Mkdir(s("a/b")),
        Op::Symlink {
            target: s("/"),
            link: s("a/r"),
        },
        Op::Symlink {
            target: s("/a"),
            link: s("a/b/l"),
        },
        Op::Symlink {
            target: s("//a//b/"),
            link: s("m"),
        },
        Op::Symlink {
            target: s("/.."),
            link: s("up"),
        },
        Op::Stat(s("a/r")),
        Op::Stat(s("a/r/a/b")),
        Op::Stat(s("a/b/l/b")),
        Op::Stat(s("m")),
        Op::Stat(s("up/a")),
        Op::ReadDir(s("a/r")),
        Op::Readlink(s("m")),
        Op::Create(s("a/b/l/f")),
        Op::Create(s("m/g")),
        Op::Rename {
            from: s("a/r/a/f"),
            to: s("up/up/h"),
            noreplace: false,
        },
        Op::Rmdir(s("a/r/")),
        Op::Unlink(s("a/r")),
    ];
    check(&ops).unwrap();
}

#[test]
fn the_root_itself() {
    let ops = vec![
        Op::Mkdir(s("a")),
        Op::Stat(s("/")),
        Op::Lstat(s("//")),
        Op::Mkdir(s("/")),
        Op::Rmdir(s("/")),
        Op::Rmdir(s("/.")),
        Op::Rmdir(s("/..")),
        Op::Unlink(s("/")),
        Op::Create(s("/")),
        Op::Rename {
            from: s("/"),
            to: s("b"),
            noreplace: false,
        },
        Op::Rename {
            from: s("a"),
            to: s("/"),
            noreplace: false,
        },
        Op::Rename {
            from: s("a"),
            to: s("/"),
            noreplace: true,
        },
        Op::Rename {
            from: s("a"),
            to: s(".."),
            noreplace: false,
        },
        Op::Link {
            existing: s("/"),
            new: s("b"),
        },
        Op::Link {
            existing: s("a"),
            new: s("/"),
        },
        Op::Symlink {
            target: s("a"),
            link: s("/"),
        },
        Op::Readlink(s("/")),
        Op::ReadDir(s("/")),
        Op::Chmod {
            path: s("/"),
            mode: 0o2700,
        },
        Op::Mkdir(s("/c")),
        Op::Stat(s("/c")),
    ];
    check(&ops).unwrap();
}

#[test]
fn a_user_is_refused_by_the_modes_it_set() {
    let chmod = |path: &str, mode| Op::Chmod {
        path: s(path),
        mode,
    };
    let ops = vec![
        Op::Mkdir(s("d")),
        Op::Mkdir(s("d/e")),
        Op::Create(s("d/f")),
        Op::Symlink {
            target: s("d/e"),
            link: s("l"),
        },
        // No search: nothing inside, through a symlink neither.
        chmod("d", 0o600),
        Op::Stat(s("d/f")),
        Op::Stat(s("d/.")),
        Op::Stat(s("l")),
        Op::Lstat(s("l")),
        Op::Create(s("d/g")),
        Op::Unlink(s("d/f")),
        Op::ReadDir(s("d")),
        // No write: no names added or removed, errors in Linux's order.
        chmod("d", 0o500),
        Op::Create(s("d/f")),
        Op::Create(s("d/g")),
        Op::Mkdir(s("d/e")),
        Op::Unlink(s("d/f/")),
        Op::Unlink(s("d/e")),
        Op::Rmdir(s("d/f")),
        Op::Rmdir(s("d/e")),
        Op::Rename {
            from: s("d/f"),
            to: s("f"),
            noreplace: false,
        },
        Op::Link {
            existing: s("d/f"),
            new: s("d/h"),
        },
        Op::Link {
            existing: s("d/f"),
            new: s("h"),
        },
        // No read: no listing.
        chmod("d", 0o300),
        Op::ReadDir(s("d")),
        Op::Create(s("d/g")),
        // A directory moved to another parent needs write on itself.
        chmod("d/e", 0o500),
        Op::Rename {
            from: s("d/e"),
            to: s("e"),
            noreplace: false,
        },
        Op::Rename {
            from: s("d/e"),
            to: s("d/e2"),
            noreplace: false,
        },
        chmod("/", 0o500),
        Op::Mkdir(s("x")),
        Op::Stat(s("/")),
    ];
    check_as(&ops, Some(USER)).unwrap();
}
