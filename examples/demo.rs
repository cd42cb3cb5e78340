//! A tour of KucoFS from a Rust program: make a file system under
//! `/dev/shm`, build a small tree, write and read files, list it, rename
//! and link things, then close, reopen, and simulate a crash — the tree and
//! the data survive both.
//!
//! Run: `cargo run --release --example demo`.

use std::io::{self, Read, Seek, SeekFrom, Write};

use kucofs::{File, Fs, OpenOptions, Permissions};

fn show(fs: &Fs, dir: &str, depth: usize) -> io::Result<()> {
    let mut entries: Vec<_> = fs.read_dir(dir)?.collect::<io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        let meta = fs.symlink_metadata(&path)?;
        let name = e.file_name().to_string_lossy().into_owned();
        let what = if meta.is_dir() {
            "dir".to_owned()
        } else if meta.is_symlink() {
            format!("symlink -> {}", fs.read_link(&path)?.display())
        } else {
            format!("file, {} bytes, {} links", meta.len(), meta.nlink())
        };
        println!(
            "{:indent$}{name}  ({what}, mode {:o})",
            "",
            meta.permissions().mode(),
            indent = depth * 2
        );
        if meta.is_dir() {
            show(fs, &path.to_string_lossy(), depth + 1)?;
        }
    }
    Ok(())
}

/// Stops the demo with an error if what was read back is not what was
/// written, so that a run that prints is a run that checked.
fn expect_eq(what: &str, got: &[u8], want: &[u8]) -> io::Result<()> {
    if got == want {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "{what}: read back {:?}, expected {:?}",
        String::from_utf8_lossy(got),
        String::from_utf8_lossy(want)
    )))
}

const README: &str = "KucoFS: a user-space PM file system\n";
const NOTES: &str = "first line\nappended line\n";

fn main() -> io::Result<()> {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let image = dir.join(format!("kucofs-demo-{}.img", std::process::id()));
    let result = tour(&image);
    // The image goes, whether the tour got through or not.
    let _ = std::fs::remove_file(&image);
    result
}

fn tour(image: &std::path::Path) -> io::Result<()> {
    println!("making a 64 MiB file system in {}", image.display());
    let fs = Fs::create(image, 64 << 20)?;

    fs.create_dir_all("projects/kucofs/src")?;
    fs.write("projects/kucofs/README", README)?;
    fs.write(
        "projects/kucofs/src/main.rs",
        "fn main() {\n    println!(\"hello\");\n}\n",
    )?;
    // A file written through a handle: a write far past the end leaves a
    // hole that reads as zeros; an append goes to the end.
    let mut notes = File::create(&fs, "projects/notes")?;
    notes.write_all(b"first line\n")?;
    notes.write_at(b"far away", 1 << 20)?;
    let mut hole = [1u8; 16];
    File::open(&fs, "projects/notes")?.read_at(&mut hole, 4096)?;
    println!("16 bytes of the hole: {hole:?}");
    expect_eq("the hole", &hole, &[0; 16])?;
    notes.set_len(11)?;
    drop(notes);
    let mut log = OpenOptions::new()
        .append(true)
        .open(&fs, "projects/notes")?;
    log.write_all(b"appended line\n")?;
    drop(log);
    fs.hard_link("projects/notes", "projects/notes.bak")?;
    fs.symlink("kucofs/src", "projects/code")?;
    fs.rename("projects/notes", "projects/todo")?;
    fs.set_permissions("projects/todo", Permissions::from_mode(0o600))?;
    // Errors are POSIX errnos, as from std::fs.
    let err = fs.create_dir("projects").unwrap_err();
    println!("create_dir of an existing name: {err}");
    println!(
        "through the symlink: {:?}",
        fs.metadata("projects/code/main.rs")?.file_type()
    );

    let mut f = File::open(&fs, "projects/code/main.rs")?;
    f.seek(SeekFrom::Start(3))?;
    let mut text = String::new();
    f.read_to_string(&mut text)?;
    println!("projects/code/main.rs from byte 3: {text:?}");
    let bak = fs.read("projects/notes.bak")?;
    println!("projects/notes.bak: {:?}", String::from_utf8_lossy(&bak));
    expect_eq("projects/notes.bak", &bak, NOTES.as_bytes())?;

    println!("\nthe tree:");
    show(&fs, "/", 1)?;
    let stats = fs.statfs()?;
    println!("\n{} of {} inodes free", stats.files_free, stats.files);

    if let Some(s) = fs.kfs_stats() {
        print!("\n{s}");
    }
    fs.close()?;
    let fs = Fs::open(image)?;
    println!("\nafter close and reopen:");
    show(&fs, "/", 1)?;
    let readme = fs.read("projects/kucofs/README")?;
    println!(
        "projects/kucofs/README: {:?}",
        String::from_utf8_lossy(&readme)
    );
    expect_eq("README after reopen", &readme, README.as_bytes())?;
    expect_eq(
        "projects/todo after reopen",
        &fs.read("projects/todo")?,
        NOTES.as_bytes(),
    )?;

    fs.write("projects/written-just-before-the-crash", "still here")?;
    fs.simulate_crash();
    let fs = Fs::open(image)?;
    println!("\nafter a crash and recovery (the log replayed):");
    show(&fs, "/projects", 1)?;
    let last = fs.read("projects/written-just-before-the-crash")?;
    println!(
        "projects/written-just-before-the-crash: {:?}",
        String::from_utf8_lossy(&last)
    );
    expect_eq("the file written before the crash", &last, b"still here")?;
    expect_eq(
        "README after recovery",
        &fs.read("projects/kucofs/README")?,
        README.as_bytes(),
    )?;
    fs.close()
}
