//! Permission checks against the kernel's: a client process that is not
//! root (another user, in supplementary groups of its own) runs one table
//! of operations on a tmpfs directory and on KucoFS served by a daemon,
//! both prepared identically by root, and gets the same errno from each,
//! `EACCES` and `EPERM` included; afterwards the two trees hold the same
//! names, kinds, modes and owners (set-ID bits cleared alike).
//!
//! The client is this test binary run again (`support::child_test`) with
//! its groups, group and user set before it starts. Needs root, which the
//! tests run as.

mod support;

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use kucofs::{Fs, OpenOptions, SetTime};
use rustix::fs::{AtFlags, Gid, Mode, OFlags, Timespec, Timestamps, Uid, CWD};
use support::daemon::Daemon;

/// The client's user and group, and the supplementary groups it is in.
const USER: u32 = 1001;
const GROUP: u32 = 1001;
const IN: [u32; 2] = [2001, 2002];
/// Another user, in a group the client is not in.
const OTHER: u32 = 1002;
const OTHER_GROUP: u32 = 2003;
/// The umask both sides create with.
const UMASK: u32 = 0o022;

/// Where the parent tells the child what to work on.
const ENV_KERNEL: &str = "KUCOFS_PERM_KERNEL";
const ENV_SOCKET: &str = "KUCOFS_PERM_SOCKET";

/// What root makes before the client runs, on both sides.
enum Node {
    Dir(&'static str, u32, u32, u32),
    File(&'static str, u32, u32, u32),
    Symlink(&'static str, &'static str, u32, u32),
}

use Node::{Dir, File, Symlink};

const SETUP: &[Node] = &[
    Dir("pub", 0o777, 0, 0),
    Dir("pub2", 0o777, 0, 0),
    Dir("pub/odir", 0o755, OTHER, OTHER_GROUP),
    Dir("pub/mdir", 0o755, USER, GROUP),
    Dir("ro", 0o555, 0, 0),
    File("ro/f", 0o666, OTHER, OTHER_GROUP),
    // Read and write for others, no search.
    Dir("nox", 0o776, 0, 0),
    File("nox/f", 0o644, 0, 0),
    Symlink("pub/to_nox", "../nox/f", 0, 0),
    // Searched through the group class (the client is in 2001)...
    Dir("gx", 0o750, OTHER, IN[0]),
    File("gx/f", 0o644, OTHER, IN[0]),
    // ...which alone applies, though others may search.
    Dir("gnox", 0o705, OTHER, IN[0]),
    File("gnox/f", 0o644, OTHER, IN[0]),
    Dir("mine", 0o755, USER, GROUP),
    File("mine/f", 0o644, USER, GROUP),
    File("mine/g", 0o644, USER, GROUP),
    File("mine/h", 0o644, USER, OTHER_GROUP),
    File("mine/suid", 0o6755, USER, GROUP),
    File("mine/sgid", 0o2644, USER, OTHER_GROUP),
    Dir("mine/sub", 0o755, USER, GROUP),
    Dir("theirs", 0o755, OTHER, OTHER_GROUP),
    File("theirs/f", 0o644, OTHER, OTHER_GROUP),
    Dir("sticky", 0o1777, 0, 0),
    File("sticky/other", 0o666, OTHER, OTHER_GROUP),
    File("sticky/other2", 0o666, OTHER, OTHER_GROUP),
    File("sticky/own", 0o644, USER, GROUP),
    Dir("sticky/odir", 0o777, OTHER, OTHER_GROUP),
    Symlink("sticky/olink", "other", OTHER, OTHER_GROUP),
    Symlink("sticky/mlink", "other", USER, GROUP),
    // A sticky directory the client owns.
    Dir("ostick", 0o1777, USER, GROUP),
    File("ostick/other", 0o644, OTHER, OTHER_GROUP),
    Dir("modes", 0o755, 0, 0),
    File("modes/m400", 0o400, USER, GROUP),
    File("modes/m200", 0o200, USER, GROUP),
    File("modes/m000", 0o000, USER, GROUP),
    File("modes/g640", 0o640, OTHER, IN[0]),
    File("modes/g604", 0o604, OTHER, IN[0]),
    File("modes/o604", 0o604, OTHER, OTHER_GROUP),
    File("modes/o606", 0o606, OTHER, OTHER_GROUP),
    Dir("sgiddir", 0o2777, 0, OTHER_GROUP),
];

/// One operation of the table.
#[derive(Debug, Clone, Copy)]
enum Op {
    Create(&'static str),
    Mkdir(&'static str),
    Symlink(&'static str),
    Unlink(&'static str),
    Rmdir(&'static str),
    Rename(&'static str, &'static str),
    Link(&'static str, &'static str),
    Chmod(&'static str, u32),
    Chown(&'static str, Option<u32>, Option<u32>),
    /// Both times to a value.
    Utimes(&'static str),
    /// Both times to now.
    Touch(&'static str),
    /// The access time to now, the modification time left.
    TouchAtime(&'static str),
    /// Both times left: nothing, not even a lookup.
    TouchNothing(&'static str),
    Open(&'static str, Access),
}

/// How an [`Op::Open`] opens.
#[derive(Debug, Clone, Copy)]
enum Access {
    Read,
    Write,
    ReadWrite,
    WriteTrunc,
    /// For writing, creating the file if missing, with this mode.
    Create(u32),
    /// For writing, creating the file, which must be missing.
    CreateNew,
}

const OPS: &[Op] = &[
    // Adding names: write and search on the parent, after existence.
    Op::Create("ro/x"),
    Op::Create("pub/x"),
    Op::Mkdir("ro/d"),
    Op::Mkdir("ro"),
    Op::Mkdir("newtop"),
    Op::Symlink("ro/s"),
    Op::Symlink("pub/s"),
    // Search permission along the path, inside symlinks too.
    Op::Create("nox/y"),
    Op::Create("nox/f/x"),
    Op::Create("gnox/../pub/z"),
    Op::Open("nox/f", Access::Read),
    Op::Open("pub/to_nox", Access::Read),
    Op::Open("gx/f", Access::Read),
    Op::Open("gnox/f", Access::Read),
    // Removing names, the sticky rule.
    Op::Unlink("ro/f"),
    Op::Unlink("sticky/other"),
    Op::Unlink("sticky/own"),
    Op::Rmdir("sticky/odir"),
    Op::Unlink("ostick/other"),
    Op::Rmdir("ro"),
    // Which error comes first: a trailing slash on an unlink's name, then
    // permission, then the kind; existence before permission.
    Op::Unlink("ro/f/"),
    Op::Rmdir("ro/f"),
    Op::Unlink("ro"),
    Op::Rmdir("pub"),
    Op::Mkdir("pub/odir"),
    Op::Link("mine/f", "ro/f"),
    Op::Link("mine", "pub/ld"),
    Op::Link("theirs", "pub/ld"),
    // Renames: both parents, sticky source and target, a directory's "..".
    Op::Rename("sticky/other2", "pub/x2"),
    Op::Rename("pub/x", "sticky/other"),
    Op::Rename("pub/odir", "pub2/odir"),
    Op::Rename("pub/mdir", "pub2/mdir"),
    Op::Rename("pub/odir", "pub/odir2"),
    Op::Rename("pub2/mdir", "ro/mdir"),
    Op::Rename("mine/sub", "pub/sub"),
    Op::Rename("theirs/f", "pub/tf"),
    Op::Rmdir("pub/odir2"),
    // Hard links: protected_hardlinks, then the new parent.
    Op::Link("theirs/f", "pub/l1"),
    Op::Link("modes/o606", "pub/l2"),
    Op::Link("mine/f", "ro/l3"),
    Op::Link("mine/f", "pub/l4"),
    Op::Unlink("pub/l2"),
    // Mode: the owner; a set-group-ID bit kept only in one's group.
    Op::Chmod("theirs/f", 0o777),
    Op::Chmod("mine/f", 0o600),
    Op::Chmod("mine/g", 0o2755),
    Op::Chmod("mine/h", 0o2755),
    // Owner and group.
    Op::Chown("mine/f", Some(OTHER), None),
    Op::Chown("mine/f", Some(USER), None),
    Op::Chown("mine/f", None, Some(IN[0])),
    Op::Chown("mine/f", None, Some(OTHER_GROUP)),
    Op::Chown("theirs/f", None, Some(IN[0])),
    Op::Chown("theirs/f", None, None),
    Op::Chown("mine/suid", None, Some(IN[0])),
    Op::Chown("mine/sgid", None, Some(IN[1])),
    // Times: values need the owner; "now" also anyone who may write.
    Op::Utimes("modes/o606"),
    Op::Touch("modes/o606"),
    Op::Touch("modes/o604"),
    Op::TouchAtime("modes/o606"),
    Op::TouchNothing("nox/f"),
    Op::Utimes("mine/f"),
    // Opens by mode bits.
    Op::Open("modes/m400", Access::Read),
    Op::Open("modes/m400", Access::Write),
    Op::Open("modes/m200", Access::Read),
    Op::Open("modes/m200", Access::Write),
    Op::Open("modes/m000", Access::ReadWrite),
    Op::Open("modes/g640", Access::Read),
    Op::Open("modes/g640", Access::Write),
    Op::Open("modes/g604", Access::Read),
    Op::Open("modes/o604", Access::Read),
    Op::Open("modes/o604", Access::ReadWrite),
    Op::Open("modes/o606", Access::ReadWrite),
    Op::Open("modes/m400", Access::WriteTrunc),
    Op::Open("modes/m200", Access::WriteTrunc),
    Op::Open("ro/new", Access::Create(0o644)),
    // The open that makes a file is not checked against its mode.
    Op::Open("pub/m0", Access::Create(0)),
    Op::Open("pub/m0", Access::Create(0)),
    Op::Open("ro/f", Access::Create(0o644)),
    Op::Open("ro/f", Access::CreateNew),
    Op::Open("mine", Access::Read),
    Op::Open("nox", Access::Read),
    Op::Open("mine", Access::Write),
    // A final symlink in a sticky directory others may write.
    Op::Open("sticky/olink", Access::Read),
    Op::Open("sticky/mlink", Access::Read),
    // Made in a set-group-ID directory of a group the client is not in.
    Op::Open("sgiddir/f", Access::Create(0o2775)),
    Op::Mkdir("sgiddir/d"),
];

/// An errno, 0 for success.
type Errno = i32;

fn os_errno(e: &std::io::Error) -> Errno {
    e.raw_os_error().unwrap_or(-1)
}

fn result<T>(r: std::io::Result<T>) -> Errno {
    r.map_or_else(|e| os_errno(&e), |_| 0)
}

fn rustix_result<T>(r: rustix::io::Result<T>) -> Errno {
    r.map_or_else(|e| e.raw_os_error(), |_| 0)
}

/// The time [`Op::Utimes`] sets.
fn a_while_ago() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000)
}

/// Runs `op` on the kernel's side, under directory `base`.
fn on_kernel(base: &Path, op: Op) -> Errno {
    let p = |s: &str| base.join(s);
    let uid = |u: Option<u32>| u.map(Uid::from_raw);
    let gid = |g: Option<u32>| g.map(Gid::from_raw);
    let at = |tv_sec, tv_nsec| Timespec { tv_sec, tv_nsec };
    let (value, now, omit) = (
        at(1_000_000_000, 0),
        at(0, rustix::fs::UTIME_NOW),
        at(0, rustix::fs::UTIME_OMIT),
    );
    let times = |last_access, last_modification| Timestamps {
        last_access,
        last_modification,
    };
    match op {
        Op::Create(f) => rustix_result(rustix::fs::open(
            p(f),
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY,
            Mode::from_raw_mode(0o666),
        )),
        Op::Mkdir(d) => rustix_result(rustix::fs::mkdir(p(d), Mode::from_raw_mode(0o777))),
        Op::Symlink(s) => rustix_result(rustix::fs::symlink("target", p(s))),
        Op::Unlink(f) => rustix_result(rustix::fs::unlink(p(f))),
        Op::Rmdir(d) => rustix_result(rustix::fs::rmdir(p(d))),
        Op::Rename(a, b) => rustix_result(rustix::fs::rename(p(a), p(b))),
        Op::Link(a, b) => rustix_result(rustix::fs::link(p(a), p(b))),
        Op::Chmod(f, m) => rustix_result(rustix::fs::chmod(p(f), Mode::from_raw_mode(m))),
        Op::Chown(f, u, g) => rustix_result(rustix::fs::chown(p(f), uid(u), gid(g))),
        Op::Utimes(f) => rustix_result(rustix::fs::utimensat(
            CWD,
            p(f),
            &times(value, value),
            AtFlags::empty(),
        )),
        Op::Touch(f) => rustix_result(rustix::fs::utimensat(
            CWD,
            p(f),
            &times(now, now),
            AtFlags::empty(),
        )),
        Op::TouchAtime(f) => rustix_result(rustix::fs::utimensat(
            CWD,
            p(f),
            &times(now, omit),
            AtFlags::empty(),
        )),
        Op::TouchNothing(f) => rustix_result(rustix::fs::utimensat(
            CWD,
            p(f),
            &times(omit, omit),
            AtFlags::empty(),
        )),
        Op::Open(f, access) => {
            let (flags, mode) = match access {
                Access::Read => (OFlags::RDONLY, 0),
                Access::Write => (OFlags::WRONLY, 0),
                Access::ReadWrite => (OFlags::RDWR, 0),
                Access::WriteTrunc => (OFlags::WRONLY | OFlags::TRUNC, 0),
                Access::Create(m) => (OFlags::WRONLY | OFlags::CREATE, m),
                Access::CreateNew => (OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL, 0o644),
            };
            rustix_result(rustix::fs::open(p(f), flags, Mode::from_raw_mode(mode)))
        }
    }
}

/// Runs `op` on KucoFS.
fn on_kucofs(fs: &Fs, op: Op) -> Errno {
    match op {
        Op::Create(f) => result(fs.create_file(f)),
        Op::Mkdir(d) => result(fs.create_dir(d)),
        Op::Symlink(s) => result(fs.symlink("target", s)),
        Op::Unlink(f) => result(fs.remove_file(f)),
        Op::Rmdir(d) => result(fs.remove_dir(d)),
        Op::Rename(a, b) => result(fs.rename(a, b)),
        Op::Link(a, b) => result(fs.hard_link(a, b)),
        Op::Chmod(f, m) => result(fs.set_permissions(f, kucofs::Permissions::from_mode(m))),
        Op::Chown(f, u, g) => result(fs.chown(f, u, g)),
        Op::Utimes(f) => result(fs.set_times(f, Some(a_while_ago()), Some(a_while_ago()))),
        Op::Touch(f) => result(fs.set_times_now(f)),
        Op::TouchAtime(f) => result(fs.utimens(f, SetTime::Now, SetTime::Omit)),
        Op::TouchNothing(f) => result(fs.utimens(f, SetTime::Omit, SetTime::Omit)),
        Op::Open(f, access) => {
            let mut o = OpenOptions::new();
            match access {
                Access::Read => o.read(true),
                Access::Write => o.write(true),
                Access::ReadWrite => o.read(true).write(true),
                Access::WriteTrunc => o.write(true).truncate(true),
                Access::Create(m) => o.write(true).create(true).mode(m),
                Access::CreateNew => o.write(true).create_new(true).mode(0o644),
            };
            result(o.open(fs, f))
        }
    }
}

/// What the trees are compared by: path, kind and permission bits,
/// owner, group, and a symlink's target.
type Entry = (String, u32, u32, u32, Option<Vec<u8>>);

/// The tree under `base` on the kernel's side.
fn kernel_tree(base: &Path) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(base.join(&rel)).unwrap() {
            let e = e.unwrap();
            let path = rel.join(e.file_name());
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            let target = m.file_type().is_symlink().then(|| {
                std::fs::read_link(e.path())
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec()
            });
            if m.is_dir() {
                stack.push(path.clone());
            }
            out.push((
                path.display().to_string(),
                m.mode(),
                m.uid(),
                m.gid(),
                target,
            ));
        }
    }
    out.sort();
    out
}

/// The tree of a KucoFS file system.
fn kucofs_tree(fs: &Fs) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = if rel.as_os_str().is_empty() {
            Path::new("/").to_owned()
        } else {
            rel.clone()
        };
        for e in fs.read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let path = rel.join(e.file_name());
            let m = fs.symlink_metadata(&path).unwrap();
            let target = m
                .file_type()
                .is_symlink()
                .then(|| fs.read_link(&path).unwrap().as_os_str().as_bytes().to_vec());
            if m.is_dir() {
                stack.push(path.clone());
            }
            out.push((
                path.display().to_string(),
                m.mode(),
                m.uid(),
                m.gid(),
                target,
            ));
        }
    }
    out.sort();
    out
}

/// Root makes [`SETUP`] under `base` on the kernel's side.
fn setup_kernel(base: &Path) {
    for node in SETUP {
        let (path, mode, uid, gid) = match *node {
            Dir(d, mode, uid, gid) => {
                std::fs::create_dir(base.join(d)).unwrap();
                (d, Some(mode), uid, gid)
            }
            File(f, mode, uid, gid) => {
                std::fs::File::create(base.join(f)).unwrap();
                (f, Some(mode), uid, gid)
            }
            Symlink(s, target, uid, gid) => {
                std::os::unix::fs::symlink(target, base.join(s)).unwrap();
                (s, None, uid, gid)
            }
        };
        let p = base.join(path);
        std::os::unix::fs::lchown(&p, Some(uid), Some(gid)).unwrap();
        // After the owner: a change of owner clears set-ID bits.
        if let Some(mode) = mode {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
    }
}

/// Root makes [`SETUP`] in `fs`.
fn setup_kucofs(fs: &Fs) {
    for node in SETUP {
        match *node {
            Dir(d, mode, uid, gid) => {
                fs.create_dir(d).unwrap();
                fs.chown(d, Some(uid), Some(gid)).unwrap();
                fs.set_permissions(d, kucofs::Permissions::from_mode(mode))
                    .unwrap();
            }
            File(f, mode, uid, gid) => {
                fs.create_file(f).unwrap();
                fs.chown(f, Some(uid), Some(gid)).unwrap();
                fs.set_permissions(f, kucofs::Permissions::from_mode(mode))
                    .unwrap();
            }
            Symlink(s, target, uid, gid) => {
                fs.symlink(target, s).unwrap();
                fs.lchown(s, Some(uid), Some(gid)).unwrap();
            }
        }
    }
}

/// Whether this process is root; says why the test is skipped if not.
fn is_root() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    println!("SKIPPED: running clients as other users needs root");
    false
}

#[test]
fn a_non_root_client_gets_the_kernels_errnos() {
    if !is_root() {
        return;
    }
    let Some(dir) = support::shm_dir("kucofs-perm-") else {
        return;
    };
    // The client, another user, walks into it.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let kernel = dir.path().join("kernel");
    std::fs::create_dir(&kernel).unwrap();
    std::fs::set_permissions(&kernel, std::fs::Permissions::from_mode(0o755)).unwrap();
    setup_kernel(&kernel);
    let image = dir.path().join("fs.img");
    let fs = Fs::create(&image, 64 << 20).unwrap();
    setup_kucofs(&fs);
    assert_eq!(kucofs_tree(&fs), kernel_tree(&kernel), "the same start");
    fs.close().unwrap();
    let socket = dir.path().join("kfs.sock");
    let daemon = Daemon::start(&image, &socket, &[]);
    // Connecting takes write permission on the socket.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();

    let env = [
        (ENV_KERNEL, kernel.as_os_str()),
        (ENV_SOCKET, socket.as_os_str()),
    ];
    let said = support::run_as_user("client_runs_the_table", USER, GROUP, &IN, &env);
    println!("{said}");
    // More supplementary groups than Kfs checks with: refused at attach.
    let many: Vec<u32> = (3000..3000 + 33).collect();
    support::run_as_user(
        "client_in_too_many_groups_is_refused",
        USER,
        GROUP,
        &many,
        &env,
    );

    let (status, said) = daemon.stop();
    assert!(status.success(), "daemon exited {status:?}: {said}");
    assert!(said.contains("more than 32 supplementary groups"), "{said}");
    let fs = Fs::open(&image).unwrap();
    assert_eq!(kucofs_tree(&fs), kernel_tree(&kernel), "the same end");
    fs.close().unwrap();
}

/// The client's side: every operation of [`OPS`] on both, errno for errno.
#[test]
#[ignore = "run by a_non_root_client_gets_the_kernels_errnos as another user"]
fn client_runs_the_table() {
    assert_eq!(rustix::process::getuid().as_raw(), USER);
    // SAFETY: umask takes no pointers and cannot fail.
    unsafe { libc::umask(UMASK) };
    let kernel = PathBuf::from(std::env::var_os(ENV_KERNEL).unwrap());
    let fs = Fs::connect(std::env::var_os(ENV_SOCKET).unwrap()).unwrap();
    let name = |e: Errno| {
        if e == 0 {
            "ok".to_owned()
        } else {
            format!("{:?}", kucofs_common::Errno::new(e).unwrap())
        }
    };
    let mut table = String::new();
    let mut differ = 0;
    let mut refused = 0;
    for &op in OPS {
        let (k, u) = (on_kernel(&kernel, op), on_kucofs(&fs, op));
        let mark = if k == u { "" } else { "   <- differs" };
        differ += usize::from(k != u);
        refused += usize::from(k == libc::EACCES || k == libc::EPERM);
        table += &format!("{op:?}: kernel {}, kucofs {}{mark}\n", name(k), name(u));
    }
    println!("{table}");
    assert_eq!(differ, 0, "errnos differ:\n{table}");
    // The table tests refusals, not only successes.
    assert!(refused >= 30, "{refused} refusals:\n{table}");
    fs.close().unwrap();
}

/// A client in more groups than Kfs checks with is refused, saying why.
#[test]
#[ignore = "run by a_non_root_client_gets_the_kernels_errnos as another user"]
fn client_in_too_many_groups_is_refused() {
    let groups = rustix::process::getgroups().unwrap();
    assert!(groups.len() > kucofs_common::access::GROUPS_MAX);
    let e = Fs::connect(std::env::var_os(ENV_SOCKET).unwrap()).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ArgumentListTooLong, "{e}");
    assert!(e.to_string().contains("supplementary groups"), "{e}");
}

/// Embedded mode: Kfs in the process acts with the process's credentials.
#[test]
fn an_embedded_client_acts_as_its_process() {
    if !is_root() {
        return;
    }
    let Some(dir) = support::shm_dir("kucofs-perm-embedded-") else {
        return;
    };
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let image = dir.path().join("fs.img");
    let fs = Fs::create(&image, 16 << 20).unwrap();
    fs.create_dir("pub").unwrap();
    fs.set_permissions("pub", kucofs::Permissions::from_mode(0o777))
        .unwrap();
    fs.close().unwrap();
    // The image is the client's to open; its root directory is not.
    std::os::unix::fs::chown(&image, Some(USER), Some(GROUP)).unwrap();
    let image = image.into_os_string();
    support::run_as_user(
        "embedded_client",
        USER,
        GROUP,
        &IN,
        &[(ENV_KERNEL, image.as_os_str())],
    );
    let fs = Fs::open(&image).unwrap();
    let m = fs.metadata("pub/mine").unwrap();
    assert_eq!((m.uid(), m.gid()), (USER, GROUP));
    assert!(!fs.exists("theirs"));
    fs.close().unwrap();
}

#[test]
#[ignore = "run by an_embedded_client_acts_as_its_process as another user"]
fn embedded_client() {
    let fs = Fs::open(std::env::var_os(ENV_KERNEL).unwrap()).unwrap();
    assert_eq!(fs.creds(), (USER, GROUP));
    let e = fs.create_file("theirs").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES));
    fs.create_file("pub/mine").unwrap();
    fs.close().unwrap();
}
