//! A tour of KucoFS from a Rust program: make a file system under
//! `/dev/shm`, build a small tree, list it, rename and link things, then
//! close, reopen, and simulate a crash — the tree survives both.
//!
//! Run: `cargo run --release --example demo`.

use std::io;

use kucofs::{Fs, Permissions};

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
            format!("file, {} links", meta.nlink())
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

fn main() -> io::Result<()> {
    let image = std::env::temp_dir().join(format!("kucofs-demo-{}.img", std::process::id()));
    let image = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm").join(image.file_name().unwrap_or_default())
    } else {
        image
    };
    println!("making a 64 MiB file system in {}", image.display());
    let fs = Fs::create(&image, 64 << 20)?;

    fs.create_dir_all("projects/kucofs/src")?;
    fs.create_file("projects/kucofs/README")?;
    fs.create_file("projects/kucofs/src/main.rs")?;
    fs.create_file("projects/notes")?;
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

    println!("\nthe tree:");
    show(&fs, "/", 1)?;
    let stats = fs.statfs()?;
    println!("\n{} of {} inodes free", stats.files_free, stats.files);

    if let Some(s) = fs.kfs_stats() {
        print!("\n{s}");
    }
    fs.close()?;
    let fs = Fs::open(&image)?;
    println!("\nafter close and reopen:");
    show(&fs, "/", 1)?;

    fs.create_file("projects/written-just-before-the-crash")?;
    fs.simulate_crash();
    let fs = Fs::open(&image)?;
    println!("\nafter a crash and recovery (the log replayed):");
    show(&fs, "/projects", 1)?;
    fs.close()?;
    std::fs::remove_file(&image)?;
    Ok(())
}
