//! Helpers for the crate's unit tests.

use std::path::Path;

/// A fresh temporary directory on tmpfs if the machine has `/dev/shm`:
/// workloads make tens of thousands of files, which a disk-backed `/tmp`
/// can take many seconds over.
pub(crate) fn tempdir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_owned()
    } else {
        std::env::temp_dir()
    };
    tempfile::Builder::new()
        .prefix("fxbench-unit.")
        .tempdir_in(base)
        .expect("create a temporary directory")
}
