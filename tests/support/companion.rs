//! Finding a binary of the package that an integration test runs (the
//! `kucofs` command, `fxbench`), wherever the test binary runs.
//!
//! Cargo builds the binary before the test and names its path to the test
//! at compile time (`CARGO_BIN_EXE_<name>`). A test binary copied away
//! from its build tree finds nothing there: CI runs every test binary in a
//! virtual machine with a DAX file system, which gets one file per
//! program. CI then appends the binary to the test binary's file (an ELF
//! executable runs the same with bytes after its end), followed by its
//! length as [`LEN_DIGITS`] decimal digits and [`MAGIC`]; the test writes
//! that copy out to a file of its own and runs it.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Ends a test binary that carries a copy of the binary it runs.
const MAGIC: &[u8] = b"KUCOFS-COMPANION\n";
/// Digits of the copy's length, just before [`MAGIC`].
const LEN_DIGITS: usize = 20;

/// The binary cargo built at `built`, or else the copy of it appended to
/// this test binary, written out once to the temporary directory. A test
/// binary runs one binary: `built` is the same at every call. Panics if
/// there is neither: a test binary copied without the binary it runs
/// cannot test it.
#[allow(dead_code)] // Not every test binary runs a binary.
pub fn binary(built: &str) -> PathBuf {
    static FOUND: OnceLock<(String, Option<PathBuf>)> = OnceLock::new();
    let (first, found) = FOUND.get_or_init(|| {
        let path = Path::new(built);
        if path.exists() {
            return (built.to_owned(), Some(path.to_owned()));
        }
        let name = path.file_name().expect("a binary's file name");
        let copy = appended().expect("read this test binary");
        let written = copy.map(|bytes| {
            let path = std::env::temp_dir().join(format!(
                "{}-{}",
                name.to_string_lossy(),
                std::process::id()
            ));
            // Written and closed before anything runs it: a file still
            // open for writing cannot be executed (ETXTBSY).
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o755)
                .open(&path)
                .expect("create the binary's copy");
            f.write_all(&bytes).expect("write the binary's copy");
            path
        });
        (built.to_owned(), written)
    });
    assert_eq!(first, built, "a test binary carries one binary's copy");
    found
        .clone()
        .unwrap_or_else(|| panic!("no binary at {built}, nor a copy appended to this test binary"))
}

/// The copy of a binary appended to this test binary, if there is one.
fn appended() -> std::io::Result<Option<Vec<u8>>> {
    let mut exe = std::fs::read(std::env::current_exe()?)?;
    let Some(rest) = exe.strip_suffix(MAGIC) else {
        return Ok(None);
    };
    let Some(digits_at) = rest.len().checked_sub(LEN_DIGITS) else {
        return Ok(None);
    };
    let len = std::str::from_utf8(&rest[digits_at..])
        .ok()
        .and_then(|d| d.parse::<usize>().ok());
    let Some(start) = len.and_then(|len| digits_at.checked_sub(len)) else {
        return Ok(None);
    };
    exe.truncate(digits_at);
    Ok(Some(exe.split_off(start)))
}
