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

/// The command that runs test `name` of this test binary alone, in a child
/// process. The child tests are `#[ignore]`d, so that a plain `cargo test`
/// does not run them without the parent's setup; this command asks for them.
#[allow(dead_code)] // Not every test binary runs children.
pub fn child_test(name: &str) -> std::process::Command {
    let mut c =
        std::process::Command::new(std::env::current_exe().expect("the test binary's path"));
    c.args([
        "--exact",
        name,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    c
}

/// Sets its flag when dropped, even by a panic, so that a thread looping
/// until the flag is set stops when the test fails instead of hanging it.
#[allow(dead_code)] // Not every test binary runs such threads.
pub struct SetOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
