//! What several whole-system tests share.

use std::path::Path;

/// A fresh directory under `/dev/shm` named `prefix...`, where a test keeps
/// its images; `None` (after printing why the test is skipped) on a machine
/// without `/dev/shm`.
pub fn shm_dir(prefix: &str) -> Option<tempfile::TempDir> {
    if !Path::new("/dev/shm").is_dir() {
        println!("SKIPPED: /dev/shm does not exist; these tests keep their images there");
        return None;
    }
    Some(
        tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in("/dev/shm")
            .expect("a temporary directory under /dev/shm"),
    )
}
