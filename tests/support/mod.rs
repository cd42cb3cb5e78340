//! What several whole-system tests share.

pub mod companion;
#[allow(dead_code)] // Only the daemon's tests use it.
pub mod daemon;

use std::path::{Path, PathBuf};

/// Where a child test running as another user keeps its directories (set
/// by its parent to a directory that user owns: `/dev/shm` itself need
/// not be writable by everyone, as on a DAX mount).
#[allow(dead_code)] // Not every test binary runs children as other users.
pub const SHM_BASE_ENV: &str = "KUCOFS_TEST_SHM_BASE";

/// A fresh directory under `/dev/shm` (or the directory [`SHM_BASE_ENV`]
/// names) named `prefix...`, where a test keeps its images; `None` (after
/// printing why the test is skipped) on a machine without `/dev/shm`.
#[allow(dead_code)] // Not every test binary keeps its images there.
pub fn shm_dir(prefix: &str) -> Option<tempfile::TempDir> {
    if !Path::new("/dev/shm").is_dir() {
        println!("SKIPPED: /dev/shm does not exist; these tests keep their images there");
        return None;
    }
    let base = std::env::var_os(SHM_BASE_ENV).map_or_else(|| "/dev/shm".into(), PathBuf::from);
    Some(
        tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(&base)
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

/// Runs test `name` of this test binary alone, in a child process of
/// user `uid`, group `gid`, in supplementary `groups` (set between fork
/// and exec; this process must be root), with `env`; returns what it
/// printed, and panics, saying that, if it failed.
#[allow(dead_code)] // Not every test binary runs children as other users.
pub fn run_as_user(
    name: &str,
    uid: u32,
    gid: u32,
    groups: &[u32],
    env: &[(&str, &std::ffi::OsStr)],
) -> String {
    use std::os::unix::process::CommandExt;
    let groups = groups.to_vec();
    let mut cmd = child_test(name);
    cmd.envs(env.iter().copied());
    let become_user = move || {
        // SAFETY: `groups` is a live buffer of `groups.len()` ids.
        let rc = unsafe { libc::setgroups(groups.len(), groups.as_ptr()) };
        // SAFETY: setgid and setuid take no pointers.
        if rc != 0 || unsafe { libc::setgid(gid) } != 0 || unsafe { libc::setuid(uid) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the closure runs in the child between fork and exec and
    // makes only system calls that are async-signal-safe (setgroups,
    // setgid, setuid); it allocates nothing.
    unsafe { cmd.pre_exec(become_user) };
    let out = cmd.output().expect("run the child test");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child test {name} failed:\n{said}");
    said
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

/// A tmpfs of a few MiB mounted on a temporary directory for the test's
/// life (unmounted when dropped), where a file system runs out of room
/// at once.
#[allow(dead_code)] // Not every test binary needs one.
pub struct SmallTmpfs {
    dir: tempfile::TempDir,
}

#[allow(dead_code)]
impl SmallTmpfs {
    /// Mounts one of `mib` MiB; `None` (after printing why the test is
    /// skipped) where this process may not mount file systems.
    pub fn mount(mib: u32) -> Option<SmallTmpfs> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!("SKIPPED: mounting a small tmpfs needs root");
            return None;
        }
        let dir = tempfile::tempdir().expect("a temporary directory");
        let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
        let target = c(dir.path().to_str().expect("a UTF-8 path"));
        let (fstype, data) = (c("tmpfs"), c(&format!("size={mib}m")));
        // SAFETY: every pointer is to a NUL-terminated string that outlives
        // the call.
        let rc = unsafe {
            libc::mount(
                fstype.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                0,
                data.as_ptr().cast(),
            )
        };
        if rc != 0 {
            let why = std::io::Error::last_os_error();
            println!("SKIPPED: cannot mount a small tmpfs: {why}");
            return None;
        }
        Some(SmallTmpfs { dir })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let target = std::ffi::CString::new(self.dir.path().to_str().unwrap_or_default());
        if let Ok(target) = target {
            // SAFETY: a NUL-terminated path that outlives the call; a
            // detached unmount never blocks on open files.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }
}
