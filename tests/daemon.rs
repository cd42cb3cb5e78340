//! `kucofs serve`: Kfs in a process of its own, and clients that attach to
//! it with `Fs::connect`.

mod support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kucofs::{Fs, OpenOptions};
use support::daemon::{read_all, write_all_at, Daemon};

/// An image made and filled in this process, then served by a daemon on
/// a socket beside it (the directory goes when the test ends).
struct Served {
    _dir: tempfile::TempDir,
    image: PathBuf,
    socket: PathBuf,
    daemon: Daemon,
}

/// Held while this process has an image open embedded (which maps the
/// image and its index so that they can be made writable) and while a
/// test checks that no mapping of them can: the tests of this binary run
/// in parallel in one process.
static EMBEDDED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn embedded() -> std::sync::MutexGuard<'static, ()> {
    EMBEDDED.lock().unwrap_or_else(|e| e.into_inner())
}

fn serve(prefix: &str) -> Option<Served> {
    let dir = support::shm_dir(prefix)?;
    let image = dir.path().join("fs.img");
    let socket = dir.path().join("kfs.sock");
    // Made and filled in this process, then handed to the daemon.
    let in_process = embedded();
    let fs = Fs::create(&image, 64 << 20).unwrap();
    fs.create_dir_all("docs/old").unwrap();
    let mut f = kucofs::File::create(&fs, "docs/hello").unwrap();
    f.write_all(b"hello from before the daemon").unwrap();
    drop(f);
    fs.close().unwrap();
    drop(in_process);
    let daemon = Daemon::start(&image, &socket, &[]);
    Some(Served {
        _dir: dir,
        image,
        socket,
        daemon,
    })
}

/// Polls `f` until it is true or `limit` passes.
fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    f()
}

#[test]
fn clients_share_a_daemons_file_system_and_it_closes_cleanly() {
    let Some(s) = serve("kucofs-daemon-") else {
        return;
    };
    let (image, socket) = (s.image.clone(), s.socket.clone());
    let a = Fs::connect(&socket).unwrap();
    let b = Fs::connect(&socket).unwrap();
    // What was there, read through the read-only views.
    let mut text = String::new();
    kucofs::OpenOptions::new()
        .read(true)
        .open(&a, "docs/hello")
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    assert_eq!(text, "hello from before the daemon");
    // Changes by one client are seen by the other.
    a.create_dir_all("x/y").unwrap();
    a.create_file("x/y/f").unwrap();
    b.rename("x/y/f", "x/g").unwrap();
    b.symlink("g", "x/link").unwrap();
    assert!(a.metadata("x/g").unwrap().is_file());
    assert!(!a.exists("x/y/f"));
    assert_eq!(a.read_link("x/link").unwrap(), Path::new("g"));
    let mut names: Vec<String> = a
        .read_dir("x")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["g", "link", "y"]);
    // Errors as the file system gives them.
    assert_eq!(
        b.create_dir("x").unwrap_err().raw_os_error(),
        Some(libc::EEXIST)
    );
    assert_eq!(
        b.remove_dir("x").unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    // File data: Kfs copies it from the client's staging area. A write
    // inside a page, one across many pages and past the staging area's
    // size, unaligned, and an overwrite that keeps the bytes around it.
    let mut model = Vec::new();
    let put = |model: &mut Vec<u8>, at: usize, data: &[u8]| {
        if model.len() < at + data.len() {
            model.resize(at + data.len(), 0);
        }
        model[at..at + data.len()].copy_from_slice(data);
    };
    let f = kucofs::File::create(&a, "x/g").unwrap();
    let big: Vec<u8> = (0..1_500_000u32).map(|i| (i % 251) as u8).collect();
    write_all_at(&f, b"hello", 3);
    put(&mut model, 3, b"hello");
    write_all_at(&f, &big, 5000);
    put(&mut model, 5000, &big);
    write_all_at(&f, b"middle", 700_001);
    put(&mut model, 700_001, b"middle");
    assert!(
        read_all(&a, "x/g") == model,
        "the writer reads its data back"
    );
    assert!(read_all(&b, "x/g") == model, "another client reads it too");
    drop(f);
    a.close().unwrap();
    b.close().unwrap();
    let (status, said) = s.daemon.stop();
    assert!(status.success(), "daemon exited {status:?}: {said}");
    assert!(said.contains("closed cleanly"), "{said}");
    assert!(!socket.exists(), "the socket is removed");
    // Everything is in the image, which is clean.
    let report = kucofs_kfs::fsck(&image).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let _in_process = embedded();
    let fs = Fs::open(&image).unwrap();
    assert!(fs.metadata("x/g").unwrap().is_file());
    assert!(fs.exists("docs/old"));
    assert!(read_all(&fs, "x/g") == model, "the data is in the image");
    fs.close().unwrap();
}

#[test]
fn a_client_asks_the_daemon_for_statfs() {
    let Some(s) = serve("kucofs-daemon-statfs-") else {
        return;
    };
    let (image, socket) = (s.image.clone(), s.socket.clone());
    let a = Fs::connect(&socket).unwrap();
    let b = Fs::connect(&socket).unwrap();
    let empty = a.statfs().unwrap();
    assert_eq!((empty.block_size, empty.name_max), (4096, 255));
    assert!(empty.blocks_free < empty.blocks, "{empty:?}");
    assert_eq!(empty.blocks_avail, empty.blocks_free);
    // Each file made takes one of the inodes that may still be made.
    a.create_file("f").unwrap();
    a.create_file("g").unwrap();
    let made = b.statfs().unwrap();
    assert_eq!(made.files_free, empty.files_free - 2);
    assert_eq!(made.files, empty.files);
    // The pages a client's write makes its file hold, and no more.
    let f = OpenOptions::new().write(true).open(&a, "f").unwrap();
    write_all_at(&f, &[7u8; 10 * 4096], 0);
    drop(f);
    let written = b.statfs().unwrap();
    assert_eq!(written.blocks_free, made.blocks_free - 10);
    a.close().unwrap();
    b.close().unwrap();
    let (status, said) = s.daemon.stop();
    assert!(status.success(), "daemon exited {status:?}: {said}");
    // The daemon counted as Kfs in this process counts.
    let _in_process = embedded();
    let fs = Fs::open(&image).unwrap();
    assert_eq!(fs.statfs().unwrap(), written);
    fs.close().unwrap();
}

#[test]
fn a_client_gets_nothing_it_could_map_writable_but_its_own_segment() {
    let Some(s) = serve("kucofs-daemon-ro-") else {
        return;
    };
    let socket = s.socket.clone();
    let fs = Fs::connect(&socket).unwrap();
    assert!(fs.metadata("docs/hello").unwrap().is_file());
    // Every mapping of this test's image and of the index in this process
    // is read-only, and cannot be made writable (other tests of this
    // binary map images of their own in this process, embedded ones
    // writable, and are kept from opening one meanwhile).
    let _no_embedded = embedded();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let image = s.image.to_str().unwrap();
    let mut tried = 0;
    for line in maps.lines() {
        let shared = line.ends_with(image) || line.contains("kucofs-index");
        if !shared {
            continue;
        }
        let mut parts = line.split_whitespace();
        let range = parts.next().unwrap();
        let perms = parts.next().unwrap();
        assert!(!perms.contains('w'), "writable mapping: {line}");
        let (start, end) = range.split_once('-').unwrap();
        let start = usize::from_str_radix(start, 16).unwrap();
        let end = usize::from_str_radix(end, 16).unwrap();
        // SAFETY: asking for more rights on a mapping this process holds;
        // the call is expected to fail and changes nothing if it does. If
        // it succeeded the assertion below fails the test.
        let rc = unsafe {
            libc::mprotect(
                start as *mut libc::c_void,
                end - start,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        assert_eq!(rc, -1, "a mapping was made writable: {line}");
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EACCES),
            "{line}"
        );
        tried += 1;
    }
    assert!(tried >= 2, "found the image and index mappings:\n{maps}");
    fs.close().unwrap();
}

#[test]
fn a_client_that_goes_away_gives_back_its_write_lease() {
    let Some(s) = serve("kucofs-daemon-lease-") else {
        return;
    };
    let socket = s.socket.clone();
    let a = Fs::connect(&socket).unwrap();
    let b = Fs::connect(&socket).unwrap();
    let open_for_writing = |fs: &Fs| OpenOptions::new().write(true).open(fs, "docs/hello");
    let held = open_for_writing(&a).unwrap();
    assert_eq!(held.write_at(b"A", 0).unwrap(), 1);
    // Another process holds the file's write lease; this one may still
    // open the file for writing, and takes the lease when it writes.
    let theirs = open_for_writing(&b).unwrap();
    // The holder's connection closes with its file still open: the daemon
    // forgets the client, and its lease with it.
    std::mem::forget(held);
    a.close().unwrap();
    assert!(
        eventually(Duration::from_secs(5), || theirs.write_at(b"B", 0).is_ok()),
        "the lease came back"
    );
    assert_eq!(read_all(&b, "docs/hello")[0], b'B');
    drop(theirs);
    b.close().unwrap();
}

#[test]
fn a_dead_daemon_is_enotconn_for_its_clients_not_a_hang() {
    let Some(mut s) = serve("kucofs-daemon-dead-") else {
        return;
    };
    let (image, socket) = (s.image.clone(), s.socket.clone());
    let fs = Fs::connect(&socket).unwrap();
    fs.create_file("before").unwrap();
    s.daemon.child.kill().unwrap();
    s.daemon.child.wait().unwrap();
    let start = Instant::now();
    let e = fs.create_file("after").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    // And so on for every later request.
    assert_eq!(
        fs.create_dir("d").unwrap_err().raw_os_error(),
        Some(libc::ENOTCONN)
    );
    drop(fs);
    drop(s.daemon);
    // The image recovers: what was acknowledged is there.
    let _in_process = embedded();
    let fs = Fs::open(&image).unwrap();
    assert!(fs.metadata("before").unwrap().is_file());
    fs.close().unwrap();
}

#[test]
fn a_client_of_another_protocol_is_refused_with_a_reason() {
    let Some(s) = serve("kucofs-daemon-hello-") else {
        return;
    };
    let (image, socket) = (s.image.clone(), s.socket.clone());
    let mut s = UnixStream::connect(&socket).unwrap();
    let hello = kucofs_common::attach::Hello { version: 1 };
    s.write_all(&hello.encode()).unwrap();
    let mut w = [0u8; kucofs_common::attach::WELCOME_SIZE];
    s.read_exact(&mut w).unwrap();
    let w = kucofs_common::attach::Welcome::decode(&w).unwrap();
    assert_eq!(w.result, Err(kucofs_common::Errno::EPROTO));
    assert_eq!(w.version, kucofs_common::proto::PROTO_VERSION);
    // Then the daemon closes the connection.
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    // A second daemon on the same socket is refused; the first goes on.
    let out = Command::new(support::companion::binary(env!("CARGO_BIN_EXE_kucofs")))
        .arg("serve")
        .arg(&image)
        .arg("--socket")
        .arg(&socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("locked") || said.contains("already"),
        "{said}"
    );
    let fs = Fs::connect(&socket).unwrap();
    assert!(fs.exists("docs/hello"));
    fs.close().unwrap();
}

/// The socket a child client process attaches to.
const SOCKET_ENV: &str = "KUCOFS_TEST_SOCKET";

/// What the child client of
/// `two_processes_see_each_others_changes_at_once` prints before each
/// line meant for its parent (the test harness prints around it).
const SAID: &str = "@@ ";

/// Reads `path` whole as text.
fn text(fs: &Fs, path: &str) -> String {
    String::from_utf8(read_all(fs, path)).unwrap()
}

fn names(fs: &Fs, dir: &str) -> Vec<String> {
    let mut v: Vec<String> = fs
        .read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn two_processes_see_each_others_changes_at_once() {
    let Some(s) = serve("kucofs-share-") else {
        return;
    };
    let fs = Fs::connect(&s.socket).unwrap();
    fs.create_dir("shared").unwrap();
    let mut child = support::child_test("share_child")
        .env(SOCKET_ENV, &s.socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_child = child.stdin.take().unwrap();
    let mut from_child = std::io::BufReader::new(child.stdout.take().unwrap());
    // The child's next line for us, skipping what the harness prints.
    let mut hear = || {
        let mut line = String::new();
        loop {
            line.clear();
            let n = std::io::BufRead::read_line(&mut from_child, &mut line).unwrap();
            assert!(n > 0, "the child ended early");
            // The harness's "test share_child ... " may lead the line.
            if let Some(at) = line.find(SAID) {
                return line[at + SAID.len()..].trim_end().to_owned();
            }
        }
    };
    // Each step runs right after the other process's reply: no waiting,
    // no retry; what one changed, the other sees at once.
    assert_eq!(hear(), "made c1");
    assert_eq!(text(&fs, "shared/c1"), "from the child");
    fs.rename("shared/c1", "shared/p1").unwrap();
    let f = kucofs::File::create(&fs, "shared/p2").unwrap();
    write_all_at(&f, b"from the parent", 0);
    drop(f);
    writeln!(to_child, "go").unwrap();
    assert_eq!(hear(), "saw p1 p2, renamed p2 to c2, appended");
    assert_eq!(names(&fs, "shared"), ["c2", "p1"]);
    assert_eq!(text(&fs, "shared/c2"), "from the parent, and the child");
    // Both at once: each makes and writes files while the other does,
    // then checks every file of both.
    writeln!(to_child, "go").unwrap();
    for i in 0..200 {
        let f = kucofs::File::create(&fs, format!("shared/p-{i}")).unwrap();
        write_all_at(&f, format!("parent {i}").as_bytes(), 0);
    }
    assert_eq!(hear(), "made 200");
    for i in 0..200 {
        assert_eq!(text(&fs, &format!("shared/c-{i}")), format!("child {i}"));
    }
    writeln!(to_child, "go").unwrap();
    assert_eq!(hear(), "saw 200");
    assert!(child.wait().unwrap().success());
    assert_eq!(names(&fs, "shared").len(), 402);
    fs.close().unwrap();
    let (status, said) = s.daemon.stop();
    assert!(status.success(), "daemon exited {status:?}: {said}");
    let report = kucofs_kfs::fsck(&s.image).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// The other process of `two_processes_see_each_others_changes_at_once`.
#[test]
#[ignore = "run by two_processes_see_each_others_changes_at_once"]
fn share_child() {
    let socket = std::env::var_os(SOCKET_ENV).expect("the daemon's socket");
    let fs = Fs::connect(Path::new(&socket)).unwrap();
    let stdin = std::io::stdin();
    let wait = || {
        let mut line = String::new();
        stdin.read_line(&mut line).unwrap();
        assert_eq!(line.trim_end(), "go");
    };
    let f = kucofs::File::create(&fs, "shared/c1").unwrap();
    write_all_at(&f, b"from the child", 0);
    drop(f);
    println!("{SAID}made c1");
    wait();
    assert!(!fs.exists("shared/c1"));
    assert_eq!(text(&fs, "shared/p1"), "from the child");
    assert_eq!(text(&fs, "shared/p2"), "from the parent");
    assert_eq!(names(&fs, "shared"), ["p1", "p2"]);
    fs.rename("shared/p2", "shared/c2").unwrap();
    let f = OpenOptions::new()
        .write(true)
        .open(&fs, "shared/c2")
        .unwrap();
    write_all_at(&f, b", and the child", 15);
    drop(f);
    println!("{SAID}saw p1 p2, renamed p2 to c2, appended");
    wait();
    for i in 0..200 {
        let f = kucofs::File::create(&fs, format!("shared/c-{i}")).unwrap();
        write_all_at(&f, format!("child {i}").as_bytes(), 0);
    }
    println!("{SAID}made 200");
    wait();
    for i in 0..200 {
        assert_eq!(text(&fs, &format!("shared/p-{i}")), format!("parent {i}"));
    }
    println!("{SAID}saw 200");
    fs.close().unwrap();
}

/// Where the child of `a_client_changes_the_file_system_by_node` finds
/// the daemon's socket.
const ENV_NODE_SOCKET: &str = "KUCOFS_NODE_SOCKET";
/// The user that child runs as.
const NODE_USER: u32 = 4242;

/// Creates, writes, renames, links, changes and removes by node in
/// directory `dir` (which the caller may write), as a FUSE adapter
/// would, checking each step by path; `tag` names what it leaves behind,
/// a file `<dir>/<tag>` of mode 0600 holding `tag`.
fn changes_by_node(fs: &Fs, dir: &str, tag: &str) {
    use kucofs::{NewAttrs, SetTime};
    let stale = |r: std::io::Result<()>| r.unwrap_err().raw_os_error() == Some(libc::ESTALE);
    let d = fs.metadata(dir).unwrap().node();
    let a = fs.create_dir_at(d, "a", 0o755).unwrap();
    assert_eq!(fs.metadata(format!("{dir}/a")).unwrap().node(), a);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open_at(fs, a, "f")
        .unwrap();
    write_all_at(&f, tag.as_bytes(), 0);
    let file = fs.lookup_at(a, "f").unwrap();
    assert_eq!(file.permissions().mode() & 0o7777, 0o644);
    let node = file.node();
    fs.rename_at(a, "f", d, tag, false).unwrap();
    assert!(!fs.exists(format!("{dir}/a/f")));
    assert_eq!(fs.metadata(format!("{dir}/{tag}")).unwrap().node(), node);
    // The caller has the file open: it may name it by node.
    let when = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let attrs = NewAttrs {
        mode: Some(0o600),
        modified: SetTime::At(when),
        ..NewAttrs::default()
    };
    fs.set_attrs_of(node, &attrs).unwrap();
    let m = fs.metadata(format!("{dir}/{tag}")).unwrap();
    assert_eq!(m.permissions().mode() & 0o7777, 0o600);
    assert_eq!(m.modified().unwrap(), when);
    assert_eq!(fs.metadata_of(node).unwrap(), m);
    fs.symlink_at(tag, a, "l").unwrap();
    assert_eq!(fs.read_link(format!("{dir}/a/l")).unwrap().as_os_str(), tag);
    fs.hard_link_at(node, a, "h").unwrap();
    assert_eq!(fs.metadata_of(node).unwrap().nlink(), 2);
    // Renaming onto a name that is there, unless that is refused.
    let refused = fs.rename_at(a, "l", a, "h", true).unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EEXIST));
    fs.rename_at(a, "l", a, "h", false).unwrap();
    assert!(fs
        .symlink_metadata(format!("{dir}/a/h"))
        .unwrap()
        .is_symlink());
    assert_eq!(fs.metadata_of(node).unwrap().nlink(), 1);
    let busy = fs.remove_dir_at(d, "a").unwrap_err();
    assert_eq!(busy.raw_os_error(), Some(libc::ENOTEMPTY));
    fs.remove_file_at(a, "h").unwrap();
    fs.remove_dir_at(d, "a").unwrap();
    assert!(!fs.exists(format!("{dir}/a")));
    // A node that is gone is stale, whatever names it.
    assert!(stale(fs.create_file_at(a, "x", 0o644).map(drop)));
    assert!(stale(fs.metadata_of(a).map(drop)));
    assert!(stale(fs.set_attrs_of(a, &attrs)));
    // Opened again by node, the file reads what was written.
    let again = OpenOptions::new().read(true).open_node(fs, node).unwrap();
    let mut got = Vec::new();
    (&again).read_to_end(&mut got).unwrap();
    assert_eq!(got, tag.as_bytes());
    drop((f, again));
}

/// A client changes the file system by node, as a FUSE adapter will: as
/// a trusted client (root), and, in a child process of another user, as
/// an isolated one, whose node forms meet the same permission checks.
#[test]
fn a_client_changes_the_file_system_by_node() {
    use std::os::unix::fs::PermissionsExt;
    let Some(s) = serve("kucofs-daemon-node-") else {
        return;
    };
    let fs = Fs::connect(&s.socket).unwrap();
    fs.create_dir("pub").unwrap();
    fs.set_permissions("pub", kucofs::Permissions::from_mode(0o777))
        .unwrap();
    changes_by_node(&fs, "pub", "by-root");
    if !rustix::process::geteuid().is_root() {
        println!("SKIPPED: the isolated client runs as another user, which needs root");
        return;
    }
    // The child, another user, reaches the socket.
    std::fs::set_permissions(s._dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&s.socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let env = [(ENV_NODE_SOCKET, s.socket.as_os_str())];
    support::run_as_user("changes_by_node_child", NODE_USER, NODE_USER, &[], &env);
    // What the child left, as root sees it.
    let m = fs.metadata("pub/by-user").unwrap();
    assert_eq!((m.uid(), m.gid()), (NODE_USER, NODE_USER));
    assert_eq!(m.permissions().mode() & 0o7777, 0o600);
    assert_eq!(read_all(&fs, "pub/by-user"), b"by-user");
    assert!(!fs.exists("pub/a"));
    fs.close().unwrap();
}

/// The child of `a_client_changes_the_file_system_by_node`: an isolated
/// client of another user.
#[test]
#[ignore = "run by a_client_changes_the_file_system_by_node as another user"]
fn changes_by_node_child() {
    let socket = std::env::var_os(ENV_NODE_SOCKET).expect("the socket");
    let fs = Fs::connect(&socket).unwrap();
    changes_by_node(&fs, "pub", "by-user");
    // Root's directory, by node as by path: no write permission.
    let root = fs.metadata("/").unwrap().node();
    let denied = fs.create_file_at(root, "nope", 0o644).unwrap_err();
    assert_eq!(denied.raw_os_error(), Some(libc::EACCES));
    // Root's file, not open: it may not be named by node.
    let docs = fs.metadata("docs").unwrap().node();
    let hello = fs.lookup_at(docs, "hello").unwrap().node();
    let attrs = kucofs::NewAttrs {
        accessed: kucofs::SetTime::Now,
        modified: kucofs::SetTime::Now,
        ..kucofs::NewAttrs::default()
    };
    let named = fs.set_attrs_of(hello, &attrs).unwrap_err();
    assert_eq!(named.raw_os_error(), Some(libc::EACCES));
    fs.close().unwrap();
}
