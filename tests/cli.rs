//! The `kucofs` command as a user runs it: mkfs and info on images under
//! `/dev/shm`, and the one-sentence errors for everything that can go wrong.

mod support;

use std::path::Path;
use std::process::{Command, Output};

fn kucofs(args: &[&str]) -> Output {
    Command::new(support::companion::binary(env!("CARGO_BIN_EXE_kucofs")))
        .args(args)
        .output()
        .expect("run kucofs")
}

fn shm_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("kucofs-cli-")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Asserts a failure with a single-line message naming `needle`, no panic.
fn assert_refused(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "expected failure, got: {}", stdout(o));
    assert!(!err.contains("panicked"), "panic: {err}");
    assert!(err.starts_with("kucofs: "), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.contains(needle), "{needle:?} not in: {err}");
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn mkfs_then_info_describes_the_image() {
    let dir = shm_dir();
    let img = dir.path().join("a.img");
    let o = kucofs(&["mkfs", p(&img), "--size", "64M"]);
    assert!(o.status.success(), "{o:?}");
    assert!(stdout(&o).contains("64.0 MiB"), "{}", stdout(&o));
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 << 20);

    let o = kucofs(&["info", p(&img)]);
    assert!(o.status.success(), "{o:?}");
    let text = stdout(&o);
    // The mapping the image's file allows, from what the kernel says of
    // the file: MAP_SYNC on DAX, an ordinary one on tmpfs.
    let mapping = if kucofs_common::pm::is_dax(&img) == Some(true) {
        "mapping:      DAX (MAP_SYNC)"
    } else {
        "mapping:      emulated"
    };
    for needle in [
        "KucoFS version 3",
        mapping,
        "state:        clean",
        "0 B file data, 4.0 KiB metadata",
        "0 entries",
        "data",
        "owner table",
    ] {
        assert!(text.contains(needle), "{needle:?} missing:\n{text}");
    }
}

#[test]
fn mkfs_refusals_are_one_sentence() {
    let dir = shm_dir();
    let img = dir.path().join("b.img");
    assert_refused(
        &kucofs(&["mkfs", p(&img), "--size", "4K"]),
        "smaller than the 1048576-byte minimum",
    );
    assert!(!img.exists());
    assert!(kucofs(&["mkfs", p(&img), "--size", "2M"]).status.success());
    assert_refused(&kucofs(&["mkfs", p(&img), "--size", "2M"]), "--force");
    assert!(kucofs(&["mkfs", p(&img), "--size", "3M", "--force"])
        .status
        .success());
    assert_refused(
        &kucofs(&[
            "mkfs",
            p(&dir.path().join("no/such/dir.img")),
            "--size",
            "2M",
        ]),
        "No such file or directory",
    );
    // Bad sizes are caught by the argument parser, also without a panic.
    let o = kucofs(&["mkfs", p(&img), "--size", "lots"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not start with a number"));
}

#[test]
fn mkfs_reserves_an_images_memory_and_refuses_an_image_without_room() {
    let dir = shm_dir();
    let img = dir.path().join("r.img");
    assert!(kucofs(&["mkfs", p(&img), "--size", "8M"]).status.success());
    let text = stdout(&kucofs(&["info", p(&img)]));
    assert!(
        text.contains("memory:       8.0 MiB of 8.0 MiB allocated (reserved)"),
        "{text}"
    );
    let img = dir.path().join("s.img");
    let o = kucofs(&["mkfs", p(&img), "--size", "8M", "--sparse"]);
    assert!(o.status.success(), "{o:?}");
    let text = stdout(&kucofs(&["info", p(&img)]));
    assert!(text.contains("of 8.0 MiB allocated (sparse"), "{text}");

    let Some(small) = support::SmallTmpfs::mount(16) else {
        return;
    };
    let img = small.path().join("big.img");
    assert_refused(
        &kucofs(&["mkfs", p(&img), "--size", "64M"]),
        "too few for the 67108864 bytes the image needs now (free some room there; a new image can be made smaller or sparse)",
    );
    // Nothing is left behind: neither the file nor the room it took.
    assert!(!img.exists());
    let o = kucofs(&["mkfs", p(&img), "--size", "12M"]);
    assert!(o.status.success(), "{o:?}");
    // A sparse image reserves its log and owner table only: about 6 MiB of
    // a 1 GiB one, which the 4 MiB left cannot hold, and under 1 MiB of a
    // 64 MiB one, which fits.
    let sparse = small.path().join("sparse.img");
    let o = kucofs(&["mkfs", p(&sparse), "--size", "1G", "--sparse"]);
    assert_refused(&o, "too few for the");
    assert!(!sparse.exists());
    let o = kucofs(&["mkfs", p(&sparse), "--size", "64M", "--sparse"]);
    assert!(o.status.success(), "{o:?}");
    std::fs::remove_file(&img).unwrap();
    let text = stdout(&kucofs(&["info", p(&sparse)]));
    assert!(text.contains("of 64.0 MiB allocated (sparse"), "{text}");
}

#[test]
fn info_refusals_are_one_sentence() {
    let dir = shm_dir();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "x".repeat(20_000)).unwrap();
    assert_refused(&kucofs(&["info", p(&text)]), "is not a KucoFS image");
    assert_refused(
        &kucofs(&["info", p(&dir.path().join("missing.img"))]),
        "No such file or directory",
    );
    let img = dir.path().join("c.img");
    assert!(kucofs(&["mkfs", p(&img), "--size", "8M"]).status.success());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    assert_refused(&kucofs(&["info", p(&img)]), "truncated");
}

#[test]
fn fsck_passes_a_fresh_image_and_lists_damage() {
    let dir = shm_dir();
    let img = dir.path().join("f.img");
    assert!(kucofs(&["mkfs", p(&img), "--size", "8M"]).status.success());
    let o = kucofs(&["fsck", p(&img)]);
    assert!(o.status.success(), "{o:?}");
    assert!(stdout(&o).contains("clean"), "{}", stdout(&o));
    // Give a data page to a file that does not exist, and damage
    // superblock copy B.
    let g = kucofs_kfs::inspect(&img).unwrap().superblock.geometry;
    let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    use std::os::unix::fs::FileExt;
    let stray = kucofs_common::format::meta::Owner::File { ino: 42, page: 0 };
    f.write_all_at(
        &stray.encode().unwrap().to_le_bytes(),
        g.owner_offset(g.data.start + 3),
    )
    .unwrap();
    f.write_all_at(&[0xee], 4096 + 100).unwrap();
    let o = kucofs(&["fsck", p(&img)]);
    assert_eq!(o.status.code(), Some(4), "{o:?}");
    let out = stdout(&o);
    assert!(out.contains("superblock copy B is damaged"), "{out}");
    assert!(
        out.contains(&format!(
            "data page {} belongs to inode 42",
            g.data.start + 3
        )),
        "{out}"
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("2 problems"));
}

/// A log entry damaged in the middle of the log, with acknowledged
/// entries after it, is reported as damage by fsck and refused by open,
/// each in a sentence; a torn last entry is the log's end, as after any
/// crash.
#[test]
fn a_damaged_log_entry_is_told_from_a_torn_end() {
    let dir = shm_dir();
    let img = dir.path().join("l.img");
    assert!(kucofs(&["mkfs", p(&img), "--size", "8M"]).status.success());
    // Four changes, each one log entry, left in the log by a crash (Kfs
    // would retire the log into the store if left idle for long).
    let mut config = kucofs_ulib::Config::default();
    config.server.idle_checkpoint = std::time::Duration::from_secs(3600);
    let fs = kucofs_ulib::Fs::open_with(&img, config).unwrap();
    for name in ["a", "b", "c", "d"] {
        fs.create_file(name).unwrap();
    }
    fs.simulate_crash();
    let g = kucofs_kfs::inspect(&img).unwrap();
    assert_eq!(g.log_entries, 4);
    let log = g.superblock.geometry.log.offset();
    let flip = |at: u64| {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&img)
            .unwrap();
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x10], at).unwrap();
    };
    // The last entry torn: fsck finds three entries and a clean image.
    let last = log + 3 * 64;
    flip(last + 20);
    let o = kucofs(&["fsck", p(&img)]);
    assert!(o.status.success(), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("3 log entries replayed"),
        "{}",
        stdout(&o)
    );
    flip(last + 20);
    // Bit 4 of the first entry's first byte: damage, with three entries
    // after it.
    flip(log);
    let o = kucofs(&["fsck", p(&img)]);
    assert_eq!(o.status.code(), Some(4), "{o:?}");
    let out = stdout(&o);
    assert!(
        out.contains("is damaged, and 3 acknowledged entries follow it"),
        "{out}"
    );
    let err = kucofs_ulib::Fs::open(&img).unwrap_err().to_string();
    assert!(
        err.contains("is damaged, and 3 acknowledged entries follow it"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// `kucofs crashtest` explores what it is told, prints one line per
/// operation, and ends with the count line; an unknown operation is one
/// sentence naming the ones there are.
#[test]
fn crashtest_of_one_operation_ends_with_the_count_line() {
    let o = kucofs(&["crashtest", "--filter", "chown", "--k", "1", "--jobs", "1"]);
    assert!(o.status.success(), "{o:?}");
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("chown: 1 sequences, "), "{text}");
    let last = lines.last().unwrap();
    let n: u64 = last
        .strip_prefix("crash states: ")
        .and_then(|l| l.strip_suffix(" checked, 0 violations"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("last line: {last:?}"));
    assert!(n > 0);
    assert_refused(
        &kucofs(&["crashtest", "--filter", "no-such-op"]),
        "rename-dir-over-across",
    );
}

/// Two processes, each exploring its share, add up to the same count as
/// one.
#[test]
fn crashtest_in_two_processes_counts_what_one_does() {
    let count = |jobs: &str| {
        let o = kucofs(&[
            "crashtest",
            "--filter",
            "ch",
            "--k",
            "0",
            "--no-recovery",
            "--jobs",
            jobs,
        ]);
        assert!(o.status.success(), "{o:?}");
        let text = stdout(&o);
        assert!(text.contains("chmod: 1 sequences") && text.contains("chown: 1 sequences"));
        text.lines().last().unwrap().to_owned()
    };
    let one = count("1");
    assert!(one.starts_with("crash states: ") && one.ends_with(" checked, 0 violations"));
    assert_eq!(count("2"), one);
}

/// A closed pipe ends a command quietly, as it does a Unix tool
/// (`kucofs info IMAGE | head -1`): no panic and no message.
#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    use std::process::Stdio;
    let dir = shm_dir();
    let img = dir.path().join("pipe.img");
    assert!(kucofs(&["mkfs", p(&img), "--size", "8M"]).status.success());
    let mut child = Command::new(support::companion::binary(env!("CARGO_BIN_EXE_kucofs")))
        .args(["info", p(&img)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kucofs");
    // The reader goes away before the command prints (it has an image to
    // open first), as `head` does after its lines.
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.is_empty(), "{err}");
    assert_ne!(o.status.code(), Some(101), "{o:?}");
}

/// Usage errors exit with 2, failures with 1, each with a sentence.
#[test]
fn exit_statuses_tell_usage_from_failure() {
    let o = kucofs(&["mkfs"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let o = kucofs(&["info", "/nonexistent/kucofs.img"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
}

#[test]
fn serve_in_the_background_returns_once_clients_can_connect() {
    let dir = shm_dir();
    let img = dir.path().join("a.img");
    let sock = dir.path().join("s");
    assert!(kucofs(&["mkfs", p(&img), "--size", "64M"]).status.success());
    // Its stdout is read to the end: the daemon must not hold it open.
    let o = Command::new(support::companion::binary(env!("CARGO_BIN_EXE_kucofs")))
        .args(["serve", p(&img), "--socket", p(&sock), "--background"])
        .stderr(std::process::Stdio::null())
        .output()
        .expect("run kucofs");
    assert!(o.status.success(), "{o:?}");
    let pid: i32 = stdout(&o).trim().parse().expect("the daemon's PID");
    // Ready when it returned: the socket answers at once.
    std::os::unix::net::UnixStream::connect(&sock).expect("the daemon answers");
    // SAFETY: kill takes no pointers; `pid` is the daemon just started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while sock.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon did not stop"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // It closed the image cleanly: it opens without recovery and checks.
    let o = kucofs(&["fsck", p(&img)]);
    assert!(o.status.success(), "{}", stdout(&o));

    // One that cannot serve fails, and says so.
    let o = Command::new(support::companion::binary(env!("CARGO_BIN_EXE_kucofs")))
        .args([
            "serve",
            p(&dir.path().join("missing.img")),
            "--socket",
            p(&sock),
            "--background",
        ])
        .output()
        .expect("run kucofs");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("ended before it could serve"), "{err}");
}
