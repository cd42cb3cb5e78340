//! `dir:PATH`: the kernel baseline, every operation a system call through
//! `std::fs` on a directory of any mounted file system (tmpfs under
//! `/dev/shm`, ext4-DAX, ...).

use std::fs::{self, File};
use std::io::{self, Write as _};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{Backend, FileHandle, OpenOptions};
use crate::error::{Error, Result};

/// A directory of a kernel file system.
#[derive(Debug)]
pub struct DirBackend {
    spec: String,
    root: PathBuf,
}

impl DirBackend {
    /// Opens `root`, which must be an existing directory this process can
    /// create entries in; `spec` is the name the backend reports.
    pub fn open(spec: &str, root: &Path) -> Result<Self> {
        let unusable = |why: String| Error::UnusableBackend {
            spec: spec.to_owned(),
            why,
        };
        if root.as_os_str().is_empty() {
            return Err(unusable("no directory given (write dir:PATH)".into()));
        }
        match fs::metadata(root) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(unusable(format!("{} is not a directory", root.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(unusable(format!(
                    "directory {} does not exist (create it first)",
                    root.display()
                )))
            }
            Err(source) => {
                return Err(Error::BackendIo {
                    spec: spec.to_owned(),
                    action: "stat",
                    path: root.to_owned(),
                    source,
                })
            }
        }
        // Checked now so that a read-only directory fails before any
        // benchmark runs rather than halfway through the matrix.
        let probe = root.join(format!(".fxbench-probe.{}", std::process::id()));
        fs::create_dir(&probe)
            .and_then(|()| fs::remove_dir(&probe))
            .map_err(|source| Error::BackendIo {
                spec: spec.to_owned(),
                action: "create entries in",
                path: root.to_owned(),
                source,
            })?;
        Ok(DirBackend {
            spec: spec.to_owned(),
            root: root.to_owned(),
        })
    }

    /// [`DirBackend::open`] for the spec table.
    pub(crate) fn open_boxed(spec: &str, arg: &str) -> Result<Box<dyn Backend>> {
        Ok(Box::new(DirBackend::open(spec, Path::new(arg))?))
    }

    fn at(&self, path: &Path) -> PathBuf {
        self.root.join(path)
    }
}

impl Backend for DirBackend {
    fn name(&self) -> &str {
        &self.spec
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(self.at(path))
    }

    fn create_file(&self, path: &Path) -> io::Result<()> {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(self.at(path))
            .map(drop)
    }

    fn stat(&self, path: &Path) -> io::Result<()> {
        fs::metadata(self.at(path)).map(drop)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(self.at(path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(self.at(from), self.at(to))
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir_all(self.at(path))
    }

    fn open_file(&self, path: &Path, options: OpenOptions) -> io::Result<Box<dyn FileHandle>> {
        let file = fs::OpenOptions::new()
            .read(options.read)
            .write(options.write)
            .append(options.append)
            .create(options.create)
            .truncate(options.truncate)
            .open(self.at(path))?;
        Ok(Box::new(file))
    }

    fn attach_spec(&self) -> Option<String> {
        Some(self.spec.clone())
    }
}

/// A kernel file: `pread`, `pwrite`, `write` on an `O_APPEND` descriptor,
/// `ftruncate`, `fsync` and `fstat`.
impl FileHandle for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        FileExt::write_at(self, buf, offset)
    }

    fn append(&self, buf: &[u8]) -> io::Result<usize> {
        // `O_APPEND` puts every write at the end, whatever the position.
        let mut file: &File = self;
        file.write(buf)
    }

    fn set_len(&self, size: u64) -> io::Result<()> {
        File::set_len(self, size)
    }

    fn sync_all(&self) -> io::Result<()> {
        File::sync_all(self)
    }

    fn len(&self) -> io::Result<u64> {
        self.metadata().map(|m| m.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::chain;

    fn backend() -> (tempfile::TempDir, DirBackend) {
        let tmp = crate::testing::tempdir();
        let fs = DirBackend::open("dir:test", tmp.path()).unwrap();
        (tmp, fs)
    }

    #[test]
    fn operations_act_below_the_root() {
        let (tmp, fs) = backend();
        fs.create_dir_all(Path::new("a/b")).unwrap();
        fs.create_file(Path::new("a/b/f")).unwrap();
        assert!(tmp.path().join("a/b/f").is_file());
        fs.stat(Path::new("a/b/f")).unwrap();

        fs.rename(Path::new("a/b/f"), Path::new("a/g")).unwrap();
        assert!(!tmp.path().join("a/b/f").exists());
        fs.stat(Path::new("a/g")).unwrap();

        fs.remove_file(Path::new("a/g")).unwrap();
        let err = fs.stat(Path::new("a/g")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);

        fs.remove_dir_all(Path::new("a")).unwrap();
        assert!(!tmp.path().join("a").exists());
    }

    #[test]
    fn create_file_refuses_an_existing_name() {
        let (_tmp, fs) = backend();
        fs.create_file(Path::new("f")).unwrap();
        let err = fs.create_file(Path::new("f")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
    }

    #[test]
    fn stat_follows_symlinks() {
        let (tmp, fs) = backend();
        std::os::unix::fs::symlink("missing", tmp.path().join("dangling")).unwrap();
        assert_eq!(
            fs.stat(Path::new("dangling")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn a_missing_root_is_refused_in_one_sentence() {
        let tmp = crate::testing::tempdir();
        let missing = tmp.path().join("nope");
        let err = DirBackend::open("dir:x", &missing).unwrap_err();
        let msg = chain(&err);
        assert!(msg.contains("does not exist"), "{msg}");
        assert!(!tmp.path().join("nope").exists());
    }

    #[test]
    fn a_file_root_is_refused() {
        let tmp = crate::testing::tempdir();
        let file = tmp.path().join("f");
        fs::write(&file, b"").unwrap();
        let msg = chain(&DirBackend::open("dir:x", &file).unwrap_err());
        assert!(msg.contains("is not a directory"), "{msg}");
    }

    #[test]
    fn an_empty_path_is_refused() {
        let msg = chain(&DirBackend::open("dir:", Path::new("")).unwrap_err());
        assert!(msg.contains("no directory given"), "{msg}");
    }

    #[test]
    fn file_handles_read_write_append_and_resize() {
        let (tmp, fs) = backend();
        let path = Path::new("f");
        let f = fs.open_file(path, OpenOptions::CREATE).unwrap();
        assert_eq!(f.write_at(b"hello", 0).unwrap(), 5);
        assert_eq!(f.write_at(b"HE", 0).unwrap(), 2);
        f.sync_all().unwrap();
        assert_eq!(f.len().unwrap(), 5);
        drop(f);

        let a = fs.open_file(path, OpenOptions::APPEND).unwrap();
        assert_eq!(a.append(b" world").unwrap(), 6);
        assert_eq!(fs::read(tmp.path().join("f")).unwrap(), b"HEllo world");
        a.set_len(3).unwrap();
        assert_eq!(a.append(b"!").unwrap(), 1);
        assert_eq!(fs::read(tmp.path().join("f")).unwrap(), b"HEl!");

        let r = fs.open_file(path, OpenOptions::READ).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(r.read_at(&mut buf, 1).unwrap(), 3);
        assert_eq!(&buf[..3], b"El!");
        assert_eq!(r.read_at(&mut buf, 10).unwrap(), 0);
        assert!(r.write_at(b"x", 0).is_err(), "a read-only handle wrote");
        a.set_len(0).unwrap();
        assert!(r.is_empty().unwrap());
    }

    #[test]
    fn opening_a_missing_file_without_create_fails() {
        let (_tmp, fs) = backend();
        for options in [OpenOptions::READ, OpenOptions::READ_WRITE] {
            let err = fs.open_file(Path::new("nope"), options).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::NotFound);
        }
    }

    #[test]
    fn the_writability_probe_leaves_nothing_behind() {
        let (tmp, _fs) = backend();
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
    }
}
