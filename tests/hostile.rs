//! A hostile client of `kucofs serve` (ARCHITECTURE.md §2, "daemon mode +
//! threat model"): a process of another user attaches, then tries every
//! descriptor and mapping it holds and every request it can make against
//! a file and a directory its credentials do not let it read. Nothing it
//! tries may write into the image or the index, find the secret bytes, or
//! stop Kfs serving others; a trusted (root) client may read everything
//! but write nothing either.
//!
//! The child runs this test binary again (the `#[ignore]`d `hostile_child`)
//! as `nobody`, or as root for the trusted run, and reports each attempt
//! on stdout as `HOSTILE <attempt> <outcome>`; the parent judges them.

mod support;

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};

use kucofs::{Fs, OpenOptions};
use kucofs_common::attach::{self, Hello, Welcome, WELCOME_SIZE};
use kucofs_common::channel::{Doorbell, Segment};
use kucofs_common::index::{Ino, InodeOff};
use kucofs_common::proto::{At, Entry, Node, OpenAt, Request};
use support::daemon::Daemon;

/// The user the hostile child runs as.
const NOBODY: u32 = 65534;
/// What the child's secrets are masked with in its environment and in
/// its memory: it scans for a secret without ever holding its bytes.
const MASK: u8 = 0x5a;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn masked(b: &[u8]) -> Vec<u8> {
    b.iter().map(|x| x ^ MASK).collect()
}

/// A node as the environment carries it: `ino:offset:gen`.
fn node_str(n: Node) -> String {
    format!("{}:{}:{}", n.ino.get(), n.inode.get(), n.gen)
}

fn node_of(s: &str) -> Node {
    let v: Vec<u64> = s.split(':').map(|x| x.parse().unwrap()).collect();
    Node {
        ino: Ino::new(v[0]),
        inode: InodeOff::new(v[1]),
        gen: u32::try_from(v[2]).unwrap(),
    }
}

/// What the parent sets up: an image with a secret file, a private
/// directory holding a symlink whose target (kept in the index) is a
/// second secret, and a public directory.
struct Setup {
    dir: tempfile::TempDir,
    image: PathBuf,
    socket: PathBuf,
    secret: Vec<u8>,
    secret_target: Vec<u8>,
    secret_name: String,
    secret_node: Node,
    private_node: Node,
}

fn setup() -> Option<Setup> {
    if rustix::process::geteuid().as_raw() != 0 {
        println!("SKIPPED: the hostile-client test runs a child as another user, which needs root");
        return None;
    }
    let dir = support::shm_dir("kucofs-hostile-")?;
    let image = dir.path().join("fs.img");
    let socket = dir.path().join("kfs.sock");
    let nonce = format!(
        "{:016x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            ^ u128::from(std::process::id())
    );
    let secret = format!("SECRET-DATA-{nonce}-only-root-reads-this").into_bytes();
    let secret_target = format!("SECRET-TARGET-{nonce}-in-the-index").into_bytes();
    let secret_name = format!("hidden-{nonce}");
    // Small: the child scans every byte it can read, in a debug build.
    let fs = Fs::create(&image, 8 << 20).unwrap();
    fs.write("secret", &secret).unwrap();
    fs.set_permissions("secret", kucofs::Permissions::from_mode(0o600))
        .unwrap();
    fs.create_dir("private").unwrap();
    fs.symlink(
        std::ffi::OsStr::new(std::str::from_utf8(&secret_target).unwrap()),
        format!("private/{secret_name}"),
    )
    .unwrap();
    fs.set_permissions("private", kucofs::Permissions::from_mode(0o700))
        .unwrap();
    fs.create_dir("pub").unwrap();
    fs.set_permissions("pub", kucofs::Permissions::from_mode(0o777))
        .unwrap();
    fs.write("pub/hello", b"hello, anyone").unwrap();
    fs.close().unwrap();
    // The nodes a hostile client could guess, read from the image.
    let (secret_node, private_node) = {
        let v = kucofs_kfs::Volume::open(&image).unwrap();
        let r = v.namespace().reader();
        let node = |p: &[u8]| {
            let a = r.attr(r.resolve(p, false).unwrap()).unwrap();
            Node {
                ino: a.ino,
                inode: a.offset,
                gen: a.gen,
            }
        };
        let nodes = (node(b"secret"), node(b"private"));
        v.close().unwrap();
        nodes
    };
    // Only root reads the image file; anyone reaches the socket.
    std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    Some(Setup {
        dir,
        image,
        socket,
        secret,
        secret_target,
        secret_name,
        secret_node,
        private_node,
    })
}

/// Runs the child as `uid` and collects its reports: attempt -> outcome.
fn run_child(s: &Setup, uid: u32, trusted: bool) -> BTreeMap<String, String> {
    let mut c = support::child_test("hostile_child");
    c.env("KUCOFS_HOSTILE_SOCKET", &s.socket)
        .env("KUCOFS_HOSTILE_SECRET", hex(&masked(&s.secret)))
        .env("KUCOFS_HOSTILE_TARGET", hex(&masked(&s.secret_target)))
        .env("KUCOFS_HOSTILE_NAME", &s.secret_name)
        .env("KUCOFS_HOSTILE_SECRET_NODE", node_str(s.secret_node))
        .env("KUCOFS_HOSTILE_PRIVATE_NODE", node_str(s.private_node))
        .env("KUCOFS_HOSTILE_TRUSTED", if trusted { "1" } else { "0" })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if uid != 0 {
        let become_user = move || -> std::io::Result<()> {
            // SAFETY: no pointer: an empty list of groups.
            let groups = unsafe { libc::setgroups(0, std::ptr::null()) };
            // SAFETY: plain system calls on this process's credentials.
            let gid = unsafe { libc::setgid(uid) };
            // SAFETY: as above.
            let user = unsafe { libc::setuid(uid) };
            if groups != 0 || gid != 0 || user != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        };
        // SAFETY: between fork and exec the closure only makes the
        // async-signal-safe calls setgroups, setgid and setuid, and
        // touches no lock or allocation.
        unsafe {
            c.pre_exec(become_user);
        }
    }
    let out = c.output().expect("the child runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let reports: BTreeMap<String, String> = stdout
        .lines()
        .filter_map(|l| l.find("HOSTILE ").map(|at| &l[at + "HOSTILE ".len()..]))
        .map(|l| {
            let (what, outcome) = l.split_once(' ').unwrap_or((l, ""));
            (what.to_owned(), outcome.to_owned())
        })
        .collect();
    assert!(
        reports.contains_key("done"),
        "the child finished:\n{stdout}"
    );
    reports
}

#[test]
fn a_trusted_group_member_reads_every_file_but_writes_nothing() {
    let Some(s) = setup() else {
        return;
    };
    // `nobody` runs in group 65534 (its effective group).
    let daemon = Daemon::start(&s.image, &s.socket, &["--trusted-group", "65534"]);
    std::fs::set_permissions(&s.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_trusted(&run_child(&s, NOBODY, true));
    let (status, said) = daemon.stop();
    assert!(
        status.success() && said.contains("closed cleanly"),
        "the daemon closed cleanly: {status:?} {said}"
    );
    let report = kucofs_kfs::fsck(&s.image).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let fs = Fs::open(&s.image).unwrap();
    assert_eq!(fs.read("secret").unwrap(), s.secret);
    fs.close().unwrap();
}

/// The reports whose attempt starts with `prefix`.
fn with_prefix<'a>(
    r: &'a BTreeMap<String, String>,
    prefix: &'a str,
) -> impl Iterator<Item = (&'a String, &'a String)> + 'a {
    r.iter().filter(move |(k, _)| k.starts_with(prefix))
}

#[test]
fn a_hostile_client_reads_and_writes_nothing_it_may_not() {
    let Some(s) = setup() else {
        return;
    };
    let image_before = std::fs::metadata(&s.image).unwrap();
    let daemon = Daemon::start(&s.image, &s.socket, &[]);
    std::fs::set_permissions(&s.socket, std::fs::Permissions::from_mode(0o666)).unwrap();

    let r = run_child(&s, NOBODY, false);
    let all: String = r.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
    // It was isolated: it holds no descriptor of the index or the image,
    // and maps neither.
    assert_eq!(
        r.get("welcome").map(String::as_str),
        Some("isolated"),
        "{all}"
    );
    let image_id = format!("{}:{}", image_before.dev(), image_before.ino());
    for (k, v) in with_prefix(&r, "fd-target-") {
        assert!(
            !v.contains("kucofs-index") && !v.contains("fs.img"),
            "{k} {v}\n{all}"
        );
    }
    for (k, v) in with_prefix(&r, "fd-id-") {
        assert_ne!(*v, image_id, "{k}: a descriptor of the image\n{all}");
    }
    for (k, v) in with_prefix(&r, "map-") {
        if k.ends_with("-name") {
            assert!(
                !v.contains("kucofs-index") && !v.contains("fs.img"),
                "{k} {v}\n{all}"
            );
        }
    }
    // Nothing it could read held a secret.
    let scans = with_prefix(&r, "scan-").count();
    assert!(scans > 10, "it scanned its descriptors and mappings\n{all}");
    for (k, v) in with_prefix(&r, "scan-") {
        assert_eq!(v, "clean", "{k}\n{all}");
    }
    // What it may not change, it could not: no descriptor resized or
    // re-permitted, no read-only shared mapping made writable or written
    // through /proc/self/mem.
    let refused = |k: &str, v: &str| assert!(v.starts_with("refused"), "{k} {v}\n{all}");
    for (k, v) in with_prefix(&r, "ftruncate-") {
        refused(k, v);
    }
    for (k, v) in with_prefix(&r, "fchmod-") {
        refused(k, v);
    }
    for (k, v) in with_prefix(&r, "mprotect-") {
        refused(k, v);
    }
    for (k, v) in with_prefix(&r, "procmem-") {
        refused(k, v);
    }
    // Writes it could make went only into its own segment, staging area
    // and the doorbell.
    for prefix in ["pwrite-", "mmapw-"] {
        for (k, v) in with_prefix(&r, prefix) {
            if v == "done" {
                let fd = k.trim_start_matches(prefix);
                let target = &r[&format!("fd-target-{fd}")];
                assert!(
                    ["kucofs-channel", "kucofs-staging", "kucofs-doorbell"]
                        .iter()
                        .any(|m| target.contains(m)),
                    "{k} wrote to {target}\n{all}"
                );
            }
        }
    }
    // Requests for what its credentials do not allow were refused: a
    // path through the private directory, its listing, the secret file's
    // data, a node it guessed.
    for (k, want) in [
        ("raw-welcome", "isolated"),
        ("stat-private-entry", "refused EACCES"),
        ("readlink-private-entry", "refused EACCES"),
        ("readdir-private", "refused EACCES"),
        ("raw-lookup-private-entry", "refused EACCES"),
        ("raw-readdir-private-node", "refused EACCES"),
        ("raw-readdir-private-path", "refused EACCES"),
        ("raw-stat-secret-node", "refused EACCES"),
        ("raw-stat-stale-node", "refused ESTALE"),
        ("raw-read-unopened-secret", "refused EBADF"),
    ] {
        assert_eq!(r.get(k).map(String::as_str), Some(want), "{k}\n{all}");
    }
    // Its open of the secret file is refused, so neither Ulib's read nor
    // a raw read after the open gets anything.
    for k in ["read-secret", "raw-read-opened-secret"] {
        assert_eq!(
            r.get(k).map(String::as_str),
            Some("refused EACCES"),
            "{k}\n{all}"
        );
    }
    // What it may do, it did, through requests.
    for k in [
        "read-pub-hello",
        "readdir-pub",
        "stat-private",
        "write-pub-mine",
        "read-pub-mine",
        "read-pub-big",
        "file-pub-big",
        "readdir-pub-many",
        "served-after-garbage",
    ] {
        assert_eq!(r.get(k).map(String::as_str), Some("ok"), "{k}\n{all}");
    }

    // Kfs goes on serving another client.
    let fs = Fs::connect(&s.socket).unwrap();
    assert_eq!(fs.read("secret").unwrap(), s.secret);
    assert_eq!(fs.read("pub/mine").unwrap(), b"written by nobody");
    fs.close().unwrap();

    // The trusted run: root may read through its mappings, yet writes
    // nothing through them either.
    assert_trusted(&run_child(&s, 0, true));

    // The image changed by the valid requests only, and checks clean.
    let (status, said) = daemon.stop();
    assert!(
        status.success() && said.contains("closed cleanly"),
        "the daemon closed cleanly: {status:?} {said}"
    );
    let report = kucofs_kfs::fsck(&s.image).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let fs = Fs::open(&s.image).unwrap();
    assert_eq!(fs.read("secret").unwrap(), s.secret);
    assert_eq!(fs.metadata("secret").unwrap().mode() & 0o7777, 0o600);
    assert_eq!(fs.metadata("private").unwrap().mode() & 0o7777, 0o700);
    let names = |d: &str| {
        let mut v: Vec<String> = fs
            .read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names("/"), ["private", "pub", "secret"]);
    assert_eq!(names("private"), std::slice::from_ref(&s.secret_name));
    assert_eq!(names("pub"), ["big", "hello", "many", "mine"]);
    assert_eq!(names("pub/many").len(), 1100);
    assert_eq!(
        fs.read_link(format!("private/{}", s.secret_name)).unwrap(),
        Path::new(std::str::from_utf8(&s.secret_target).unwrap())
    );
    assert_eq!(fs.metadata("pub/mine").unwrap().uid(), NOBODY);
    fs.close().unwrap();
    drop(s.dir);
}

/// A trusted client's reports: it holds the image (and maps the index),
/// could write through none of it, and could read the secret.
fn assert_trusted(t: &BTreeMap<String, String>) {
    let all: String = t.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
    assert_eq!(
        t.get("welcome").map(String::as_str),
        Some("trusted"),
        "{all}"
    );
    let mut shared = 0;
    for (k, target) in with_prefix(t, "fd-target-") {
        let fd = k.trim_start_matches("fd-target-");
        if target.contains("kucofs-index") || target.contains("fs.img") {
            shared += 1;
            for attempt in ["pwrite", "mmapw", "ftruncate"] {
                let v = &t[&format!("{attempt}-{fd}")];
                assert!(
                    v.starts_with("refused"),
                    "{attempt} on {target}: {v}\n{all}"
                );
            }
        }
    }
    // The image's descriptor (the index's is closed once mapped).
    assert!(shared >= 1, "the trusted client holds the image\n{all}");
    let mut maps = 0;
    for (k, name) in with_prefix(t, "map-") {
        if !k.ends_with("-name") || !(name.contains("kucofs-index") || name.contains("fs.img")) {
            continue;
        }
        maps += 1;
        let at = k.trim_start_matches("map-").trim_end_matches("-name");
        for attempt in ["mprotect", "procmem"] {
            let v = &t[&format!("{attempt}-{at}")];
            assert!(v.starts_with("refused"), "{attempt} on {name}: {v}\n{all}");
        }
    }
    assert!(
        maps >= 2,
        "the trusted client maps the index and image\n{all}"
    );
    // The weakening the docs state: it can read the secret.
    assert!(
        with_prefix(t, "scan-").any(|(_, v)| v == "found"),
        "a trusted client reads every file through its mappings\n{all}"
    );
}

// ---- the child ---------------------------------------------------------------

fn report(what: impl std::fmt::Display, outcome: impl std::fmt::Display) {
    println!("HOSTILE {what} {outcome}");
}

fn errno_name(e: i32) -> String {
    match e {
        libc::EACCES => "EACCES".into(),
        libc::EPERM => "EPERM".into(),
        libc::EBADF => "EBADF".into(),
        libc::EINVAL => "EINVAL".into(),
        libc::ESTALE => "ESTALE".into(),
        libc::ENOENT => "ENOENT".into(),
        libc::EIO => "EIO".into(),
        libc::EFAULT => "EFAULT".into(),
        libc::ESPIPE => "ESPIPE".into(),
        libc::ENODEV => "ENODEV".into(),
        e => format!("errno{e}"),
    }
}

fn outcome<T>(r: std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("refused {}", errno_name(e.raw_os_error().unwrap_or(0))),
    }
}

fn req_outcome<T>(r: Result<T, kucofs_common::Errno>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("refused {}", errno_name(e.get())),
    }
}

fn last_err() -> String {
    format!(
        "refused {}",
        errno_name(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    )
}

/// Whether `hay` holds `needle`, compared without holding `needle`'s
/// bytes: `masked` is the needle XOR [`MASK`].
fn holds(hay: &[u8], masked: &[u8]) -> bool {
    let first = masked[0] ^ MASK;
    hay.windows(masked.len())
        .any(|w| w[0] == first && w.iter().zip(masked).all(|(a, b)| a ^ MASK == *b))
}

/// The secrets the child scans for.
struct Needles(Vec<Vec<u8>>);

impl Needles {
    fn scan(&self, what: &str, bytes: &[u8]) {
        let found = self.0.iter().any(|n| holds(bytes, n));
        report(what, if found { "found" } else { "clean" });
    }
}

/// Every open descriptor of this process: (number, what it names).
fn descriptors() -> Vec<(i32, String)> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let fd: i32 = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            Some((fd, target.to_string_lossy().replace(' ', "_")))
        })
        .collect()
}

/// Tries every descriptor: maps it writable, reads it through a mapping
/// and `pread` looking for the secrets, writes a byte back where it read
/// it, truncates it, changes its mode.
fn attack_descriptors(needles: &Needles, trusted: bool) {
    for (fd, target) in descriptors() {
        report(format!("fd-target-{fd}"), &target);
        // SAFETY: fstat writes into the zeroed struct it is given.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above; an fd that closed meanwhile fails the call.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            continue;
        }
        report(
            format!("fd-id-{fd}"),
            format!("{}:{}", st.st_dev, st.st_ino),
        );
        // Pipes, sockets, the terminal, anything the test harness has
        // open: nothing of the file system, and not to be damaged.
        let ours = target.starts_with("/memfd:") || target.contains("fs.img");
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || !ours {
            continue;
        }
        let len = usize::try_from(st.st_size).unwrap_or(0);
        if len > 0 {
            // SAFETY: a new mapping the kernel places; nothing is read
            // through it, and it is unmapped at once if it was made.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                report(format!("mmapw-{fd}"), last_err());
            } else {
                report(format!("mmapw-{fd}"), "done");
                // SAFETY: the mapping just made, of `len` bytes.
                unsafe { libc::munmap(p, len) };
            }
            // SAFETY: a new read-only mapping the kernel places; read
            // below only within its `len` bytes, then unmapped. Reading
            // past the memory's end would fault, so the read stops at the
            // size fstat gave (the memory cannot shrink: it is sealed or
            // read-only).
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                // Through /proc/self/mem, which fails rather than faults on
                // a page that is not there.
                let mut bytes = vec![0u8; len];
                let mem = std::fs::File::open("/proc/self/mem").unwrap();
                let n = mem.read_at(&mut bytes, p as u64).unwrap_or(0);
                needles.scan(&format!("scan-mmap-{fd}"), &bytes[..n]);
                // SAFETY: the mapping just made.
                unsafe { libc::munmap(p, len) };
            }
        }
        let mut bytes = vec![0u8; len.min(128 << 20)];
        // SAFETY: `bytes` is a live buffer of its length.
        let n = unsafe { libc::pread(fd, bytes.as_mut_ptr().cast(), bytes.len(), 0) };
        if n >= 0 {
            needles.scan(
                &format!("scan-pread-{fd}"),
                &bytes[..usize::try_from(n).unwrap()],
            );
        }
        // The last byte (which no structure uses) written back as it was
        // read: proof of write access that changes nothing if it works.
        let last = i64::try_from(len.saturating_sub(1)).unwrap();
        let mut one = [0u8; 1];
        // SAFETY: `one` is a live one-byte buffer.
        unsafe { libc::pread(fd, one.as_mut_ptr().cast(), 1, last) };
        // SAFETY: as above.
        let w = unsafe { libc::pwrite(fd, one.as_ptr().cast(), 1, last) };
        report(
            format!("pwrite-{fd}"),
            if w == 1 { "done".into() } else { last_err() },
        );
        // SAFETY: a plain system call on a descriptor of this process.
        let t = unsafe { libc::ftruncate(fd, 0) };
        report(
            format!("ftruncate-{fd}"),
            if t == 0 { "done".into() } else { last_err() },
        );
        if !trusted {
            // Root owns the image and may change its mode anyway.
            // SAFETY: a plain system call on a descriptor of this process.
            let c = unsafe { libc::fchmod(fd, 0o666) };
            report(
                format!("fchmod-{fd}"),
                if c == 0 { "done".into() } else { last_err() },
            );
        }
    }
}

/// Tries every mapping: a shared read-only one made writable, or written
/// through /proc/self/mem; every readable one scanned for the secrets
/// (for a trusted client, which may read, only the image's: the index's
/// is large and sparse, and holds no file data).
fn attack_mappings(needles: &Needles, trusted: bool) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")
        .unwrap();
    for line in maps.lines() {
        let mut parts = line.split_whitespace();
        let (Some(range), Some(perms)) = (parts.next(), parts.next()) else {
            continue;
        };
        let name = parts.nth(3).unwrap_or("").to_owned();
        let (start, end) = range.split_once('-').unwrap();
        let start = usize::from_str_radix(start, 16).unwrap();
        let end = usize::from_str_radix(end, 16).unwrap();
        if name == "[vvar]" || name == "[vsyscall]" || name == "[vvar_vclock]" {
            continue;
        }
        report(format!("map-{start:x}-name"), name.replace(' ', "_"));
        let shared = perms.as_bytes().get(3) == Some(&b's');
        let writable = perms.as_bytes().get(1) == Some(&b'w');
        if perms.starts_with('r') && (!trusted || name.contains("fs.img")) {
            let mut at = start;
            let mut found = false;
            let mut buf = vec![0u8; 1 << 20];
            while at < end {
                let n = (end - at).min(buf.len());
                // A mapping reserved past its memory's end (the index's)
                // reads short there, and so on to its end.
                let Ok(got) = mem.read_at(&mut buf[..n], at as u64) else {
                    break;
                };
                found |= needles.0.iter().any(|x| holds(&buf[..got], x));
                if got < n {
                    break;
                }
                at += n;
            }
            report(
                format!("scan-map-{start:x}"),
                if found { "found" } else { "clean" },
            );
        }
        if shared && !writable {
            // SAFETY: asking for more rights on a mapping this process
            // holds; expected to fail, and a success is reported (nothing
            // is written through it).
            let rc = unsafe {
                libc::mprotect(
                    start as *mut libc::c_void,
                    end - start,
                    libc::PROT_READ | libc::PROT_WRITE,
                )
            };
            report(
                format!("mprotect-{start:x}"),
                if rc == 0 { "done".into() } else { last_err() },
            );
            let mut one = [0u8; 1];
            let _ = mem.read_at(&mut one, start as u64);
            report(
                format!("procmem-{start:x}"),
                outcome(mem.write_at(&one, start as u64)),
            );
        }
    }
}

/// A client that speaks the protocol itself, not through Ulib.
struct Raw {
    _sock: std::os::unix::net::UnixStream,
    segment: Segment,
    doorbell: Doorbell,
    trusted: bool,
}

fn raw_connect(socket: &Path) -> Raw {
    let sock = std::os::unix::net::UnixStream::connect(socket).unwrap();
    attach::send_with_fds(&sock, &Hello::current().encode(), &[]).unwrap();
    let mut w = [0u8; WELCOME_SIZE];
    let fds = attach::recv_with_fds(&sock, &mut w).unwrap();
    let welcome = Welcome::decode(&w).unwrap();
    welcome.result.unwrap();
    let mut fds = fds.into_iter();
    let segment = Segment::from_fd(fds.next().unwrap()).unwrap();
    let doorbell = Doorbell::from_fd(fds.next().unwrap()).unwrap();
    Raw {
        _sock: sock,
        segment,
        doorbell,
        trusted: welcome.trusted,
    }
}

/// Requests for what the child may not read, and garbage.
fn attack_requests(socket: &Path, fs: &Fs) {
    let env = |k: &str| std::env::var(k).unwrap();
    let name = env("KUCOFS_HOSTILE_NAME");
    let secret_node = node_of(&env("KUCOFS_HOSTILE_SECRET_NODE"));
    let private_node = node_of(&env("KUCOFS_HOSTILE_PRIVATE_NODE"));
    let entry = format!("private/{name}");
    // Through Ulib.
    report("stat-private-entry", outcome(fs.symlink_metadata(&entry)));
    report("readlink-private-entry", outcome(fs.read_link(&entry)));
    report("readdir-private", outcome(fs.read_dir("private")));
    report("read-secret", outcome(fs.read("secret")));
    report("stat-private", outcome(fs.metadata("private")));
    report(
        "read-pub-hello",
        match fs.read("pub/hello") {
            Ok(b) if b == b"hello, anyone" => "ok".into(),
            other => format!("wrong {other:?}"),
        },
    );
    report(
        "readdir-pub",
        match fs.read_dir("pub") {
            Ok(d) => {
                let names: Vec<_> = d.map(|e| e.map(|e| e.file_name())).collect();
                if names.iter().any(|n| matches!(n, Ok(n) if n == "hello")) {
                    "ok".into()
                } else {
                    format!("wrong {names:?}")
                }
            }
            Err(e) => outcome::<()>(Err(e)),
        },
    );
    report(
        "write-pub-mine",
        outcome(fs.write("pub/mine", b"written by nobody")),
    );
    report(
        "read-pub-mine",
        match fs.read("pub/mine") {
            Ok(b) if b == b"written by nobody" => "ok".into(),
            other => format!("wrong {other:?}"),
        },
    );
    // Reads of several staging slots' worth, and listings of several
    // batches.
    let big: Vec<u8> = (0..1_200_000u32).map(|i| (i % 241) as u8).collect();
    report(
        "read-pub-big",
        match fs.write("pub/big", &big).and_then(|()| fs.read("pub/big")) {
            Ok(b) if b == big => "ok".into(),
            Ok(b) => format!("wrong {} bytes", b.len()),
            Err(e) => outcome::<()>(Err(e)),
        },
    );
    let file = || -> std::io::Result<bool> {
        use std::io::{Seek, SeekFrom};
        let mut f = OpenOptions::new().read(true).open(fs, "pub/big")?;
        let end = f.seek(SeekFrom::End(-10))?;
        let mut tail = Vec::new();
        f.read_to_end(&mut tail)?;
        Ok(end == 1_199_990 && tail == big[1_199_990..] && f.metadata()?.len() == 1_200_000)
    };
    report(
        "file-pub-big",
        match file() {
            Ok(true) => "ok".into(),
            other => format!("wrong {other:?}"),
        },
    );
    let many = || -> std::io::Result<usize> {
        fs.create_dir("pub/many")?;
        for i in 0..1100 {
            fs.create_file(format!("pub/many/{i}"))?;
        }
        let mut n = 0;
        for e in fs.read_dir("pub/many")? {
            let e = e?;
            n += usize::from(e.metadata()?.is_file());
        }
        Ok(n)
    };
    report(
        "readdir-pub-many",
        match many() {
            Ok(1100) => "ok".into(),
            other => format!("wrong {other:?}"),
        },
    );

    // Straight into a slot of its own segment.
    let raw = raw_connect(socket);
    report(
        "raw-welcome",
        if raw.trusted { "trusted" } else { "isolated" },
    );
    let call = |req: &Request<'_>| raw.segment.call(0, &raw.doorbell, req);
    report(
        "raw-lookup-private-entry",
        req_outcome(call(&Request::Lookup {
            dir: private_node,
            name: name.as_bytes(),
        })),
    );
    report(
        "raw-readdir-private-node",
        req_outcome(call(&Request::ReadDir {
            dir: At::Node(private_node),
            after: None,
        })),
    );
    report(
        "raw-readdir-private-path",
        req_outcome(call(&Request::ReadDir {
            dir: At::Path {
                path: b"/private",
                follow: true,
            },
            after: None,
        })),
    );
    report(
        "raw-stat-secret-node",
        req_outcome(call(&Request::Stat {
            at: At::Node(secret_node),
        })),
    );
    let stale = Node {
        gen: secret_node.gen.wrapping_add(1),
        ..secret_node
    };
    report(
        "raw-stat-stale-node",
        req_outcome(call(&Request::Stat {
            at: At::Node(stale),
        })),
    );
    let read_secret = Request::Read {
        ino: secret_node.ino,
        offset: 0,
        len: 4096,
    };
    report("raw-read-unopened-secret", req_outcome(call(&read_secret)));
    let opened = call(&Request::Open {
        at: OpenAt::Entry(Entry::Path(b"secret")),
        flags: 0,
        mode: 0,
        hint: None,
    });
    report(
        "raw-read-opened-secret",
        match opened {
            Err(e) => req_outcome::<()>(Err(e)),
            Ok(_) => {
                let r = req_outcome(call(&read_secret));
                let _ = call(&Request::Close {
                    ino: secret_node.ino,
                    write: false,
                });
                r
            }
        },
    );

    // Garbage: a thread scribbles over slot 0's request length, reply and
    // request record (not the sequence words its calls wait on) while
    // requests go through it, then random bytes over the whole segment
    // and a wake of Kfs. Kfs must answer or ignore each, and go on
    // serving.
    let stop = AtomicBool::new(false);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let seg_map = raw_map_own_segment();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut x = 0x2545_f491_4f6c_dd1du64;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                seg_map.scribble(x, SLOT0 + 32, SLOT0 + 4096);
            }
        });
        for _ in 0..300 {
            let _ = call(&Request::Stat {
                at: At::Path {
                    path: b"pub/hello",
                    follow: true,
                },
            });
        }
        stop.store(true, Ordering::Relaxed);
    });
    for _ in 0..4 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seg_map.scribble(seed, 0, seg_map.len);
        raw.doorbell.wake();
    }
    // Another client (its Ulib connection, its own segment) is served.
    report(
        "served-after-garbage",
        match fs.read("pub/hello") {
            Ok(b) if b == b"hello, anyone" => "ok".into(),
            other => format!("wrong {other:?}"),
        },
    );
    drop(raw);
}

/// Where slot 0 starts in a request segment (after the segment's header
/// page); its first 32 bytes are the sequence and epoch words.
const SLOT0: usize = 4096;

/// The raw client's segment mapped read-write by hand, to scribble on.
struct OwnMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is to a shared mapping that lives as long as the
// value; scribbling from several threads is the point (volatile stores of
// bytes, no reference ever made into it).
unsafe impl Sync for OwnMap {}

impl OwnMap {
    /// Fills bytes `from..to` with a pattern from `seed`.
    fn scribble(&self, seed: u64, from: usize, to: usize) {
        let bytes = seed.to_le_bytes();
        for i in from..to.min(self.len) {
            // SAFETY: `i` is inside the mapping; a volatile store of a
            // byte into shared memory another process reads is what this
            // test does on purpose.
            unsafe { self.ptr.wrapping_add(i).write_volatile(bytes[i % 8]) };
        }
    }
}

/// Maps the newest request segment descriptor this process holds (the
/// raw client's: made after the Ulib one).
fn raw_map_own_segment() -> OwnMap {
    let (fd, _) = descriptors()
        .into_iter()
        .filter(|(_, t)| t.contains("kucofs-channel"))
        .max_by_key(|(fd, _)| *fd)
        .expect("a request segment");
    // SAFETY: fstat writes into the zeroed struct it is given.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
    let len = usize::try_from(st.st_size).unwrap();
    // SAFETY: a new shared mapping the kernel places, of the memory's
    // whole (sealed) size; it stays mapped for the process's life.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    OwnMap { ptr: p.cast(), len }
}

#[test]
#[ignore = "run by a_hostile_client_reads_and_writes_nothing_it_may_not, as another user"]
fn hostile_child() {
    let env = |k: &str| std::env::var(k).unwrap();
    let socket = PathBuf::from(env("KUCOFS_HOSTILE_SOCKET"));
    let trusted = env("KUCOFS_HOSTILE_TRUSTED") == "1";
    let needles = Needles(vec![
        unhex(&env("KUCOFS_HOSTILE_SECRET")),
        unhex(&env("KUCOFS_HOSTILE_TARGET")),
    ]);
    let fs = Fs::connect(&socket).unwrap();
    // Whether the daemon trusted it shows in what it mapped.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    report(
        "welcome",
        if maps.contains("kucofs-index") {
            "trusted"
        } else {
            "isolated"
        },
    );
    if !trusted {
        attack_requests(&socket, &fs);
    } else {
        // Reads through its mappings, as a trusted client does.
        let mut hello = String::new();
        OpenOptions::new()
            .read(true)
            .open(&fs, "pub/hello")
            .and_then(|mut f| f.read_to_string(&mut hello))
            .unwrap();
        assert_eq!(hello, "hello, anyone");
    }
    attack_descriptors(&needles, trusted);
    attack_mappings(&needles, trusted);
    fs.close().unwrap();
    report("done", "");
}
