//! `kucofs[:OPTION+...]`: KucoFS through its library, with Kfs embedded in
//! the benchmark process, on an image under `/dev/shm` made for the run and
//! removed afterwards.
//!
//! Options, joined with `+` (commas separate backends): `queued` (every
//! change goes to the Kfs thread through the request slots, even when Kfs is
//! idle), `nohints` (collaborative indexing off: Kfs resolves every queued
//! path itself), `protect=strict|batched|off|keys` (the library's
//! `Config::protection`), `huge` and `nohuge` (the log, index and data pages in huge
//! pages, or not: `ServerConfig::huge_pages`; by default the library's
//! choice, on), `ahead` and `noahead` (data chunks made huge ahead of the
//! writes, or once they pause: `ServerConfig::huge_ahead`; by default the
//! library's choice, ahead under `keys`), `size=SIZE` (the image's size,
//! default 4G, reserved as `Fs::create` reserves it: all of its memory
//! allocated and cleared when it is made; an image with little free
//! space left leaves random overwriters grants of a few pages each, each
//! a protection change), `sparse` (the
//! image's data pages take memory as they are granted instead:
//! `Fs::create_sparse`), `image=PATH` (where to make it).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kucofs_ulib::{Config, Fs, Protection};

use super::{Backend, FileHandle, OpenOptions, ServerCounters};
use crate::error::{Error, Result};

/// Where a backend's image goes unless `image=` says, and how its name
/// starts (the process id and a count follow).
const IMAGE_DIR: &str = "/dev/shm";
const IMAGE_PREFIX: &str = "fxbench-kucofs-";

/// Removes the images of earlier runs, by their default names, whose
/// process is gone: a run that was killed could not remove its own, and
/// each holds all of its memory until it is removed.
pub(super) fn remove_orphaned_images() {
    let Ok(dir) = std::fs::read_dir(IMAGE_DIR) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(IMAGE_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let gone = !Path::new(&format!("/proc/{pid}")).exists();
        if gone && pid != std::process::id() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// KucoFS on an image of its own.
#[derive(Debug)]
pub struct KucofsBackend {
    spec: String,
    image: PathBuf,
    fs: Option<Fs>,
}

/// Numbers the default images of one process's backends.
static NEXT_IMAGE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A fresh default image path, one per backend of a run (a run may list
/// several): the process id, then `tag` and a count.
pub(super) fn image_path(tag: &str) -> PathBuf {
    PathBuf::from(format!(
        "{IMAGE_DIR}/{IMAGE_PREFIX}{}-{tag}{}.img",
        std::process::id(),
        NEXT_IMAGE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ))
}

/// What a spec's options ask for.
#[derive(Debug, Clone, PartialEq)]
struct Options {
    collaborative: bool,
    direct: bool,
    protection: Protection,
    huge: Option<bool>,
    ahead: Option<bool>,
    size: u64,
    sparse: bool,
    image: PathBuf,
}

impl Options {
    /// Parses the text after `kucofs:`; an error says why it is refused.
    fn parse(arg: &str) -> Result<Self, String> {
        let mut options = Options {
            collaborative: true,
            direct: true,
            protection: Protection::default(),
            huge: None,
            ahead: None,
            size: 4 << 30,
            sparse: false,
            image: image_path(""),
        };
        for opt in arg.split('+').filter(|o| !o.is_empty()) {
            match opt.split_once('=') {
                None if opt == "nohints" => options.collaborative = false,
                None if opt == "queued" => options.direct = false,
                None if opt == "huge" => options.huge = Some(true),
                None if opt == "nohuge" => options.huge = Some(false),
                None if opt == "ahead" => options.ahead = Some(true),
                None if opt == "noahead" => options.ahead = Some(false),
                None if opt == "sparse" => options.sparse = true,
                Some(("protect", v)) => options.protection = v.parse()?,
                Some(("size", v)) => options.size = kucofs_common::size::parse_size(v)?,
                Some(("image", v)) => options.image = PathBuf::from(v),
                _ => {
                    return Err(format!(
                        "unknown option `{opt}` (expected queued, nohints, huge, nohuge, ahead, noahead, \
                         sparse, protect={}, size=SIZE or image=PATH)",
                        Protection::ALL.map(Protection::name).join("|")
                    ))
                }
            }
        }
        Ok(options)
    }

    /// The library configuration these options ask for.
    fn config(&self) -> Config {
        let mut config = Config {
            collaborative: self.collaborative,
            direct: self.direct,
            protection: self.protection,
            ..Config::default()
        };
        config.server.huge_pages = self.huge;
        config.server.huge_ahead = self.ahead;
        config
    }
}

impl KucofsBackend {
    /// Makes a fresh image as `arg` says and opens it.
    pub fn open(spec: &str, arg: &str) -> Result<Self> {
        let bad = |why: String| Error::UnusableBackend {
            spec: spec.to_owned(),
            why,
        };
        let options = Options::parse(arg).map_err(bad)?;
        let config = options.config();
        let image = options.image;
        remove_orphaned_images();
        // A leftover image of an earlier, killed run with this name.
        let _ = std::fs::remove_file(&image);
        let made = if options.sparse {
            Fs::create_sparse(&image, options.size)
        } else {
            Fs::create(&image, options.size)
        };
        let fs = made
            .and_then(|fs| {
                fs.close()?;
                Fs::open_with(&image, config)
            })
            .map_err(|e| {
                // Made but not opened: its memory is not left behind.
                let _ = std::fs::remove_file(&image);
                bad(format!(
                    "cannot make a file system in {}: {e}",
                    image.display()
                ))
            })?;
        Ok(KucofsBackend {
            spec: spec.to_owned(),
            image,
            fs: Some(fs),
        })
    }

    /// [`KucofsBackend::open`] for the spec table.
    pub(crate) fn open_boxed(spec: &str, arg: &str) -> Result<Box<dyn Backend>> {
        Ok(Box::new(KucofsBackend::open(spec, arg)?))
    }

    fn fs(&self) -> &Fs {
        self.fs
            .as_ref()
            .expect("the file system is open until drop")
    }
}

impl Drop for KucofsBackend {
    fn drop(&mut self) {
        if let Some(fs) = self.fs.take() {
            let _ = fs.close();
        }
        let _ = std::fs::remove_file(&self.image);
    }
}

/// Opens `path` on `fs` with fxbench's `options` (the embedded backend's
/// and the daemon's clients' way alike).
pub(super) fn open_on(
    fs: &kucofs_ulib::Fs,
    path: &Path,
    options: OpenOptions,
) -> io::Result<Box<dyn FileHandle>> {
    let file = kucofs_ulib::OpenOptions::new()
        .read(options.read)
        .write(options.write)
        .append(options.append)
        .create(options.create)
        .truncate(options.truncate)
        .open(fs, path)?;
    Ok(Box::new(file))
}

impl Backend for KucofsBackend {
    fn name(&self) -> &str {
        &self.spec
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.fs().create_dir_all(path)
    }

    fn create_file(&self, path: &Path) -> io::Result<()> {
        self.fs().create_file(path)
    }

    fn stat(&self, path: &Path) -> io::Result<()> {
        self.fs().metadata(path).map(drop)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.fs().remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.fs().rename(from, to)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.fs().remove_dir_all(path)
    }

    fn open_file(&self, path: &Path, options: OpenOptions) -> io::Result<Box<dyn FileHandle>> {
        open_on(self.fs(), path, options)
    }

    fn server_counters(&self) -> Option<ServerCounters> {
        let s = self.fs().kfs_stats()?;
        Some(ServerCounters {
            busy_ns: nanos(s.busy),
            per_op: s
                .per_kind
                .iter()
                .map(|&(k, n, ns)| (format!("{k:?}"), (n, ns)))
                .collect::<BTreeMap<_, _>>(),
            longest_pause_ns: self.fs().take_longest_pause().map_or(0, nanos),
        })
    }

    fn settle(&self) -> io::Result<()> {
        self.fs().settle()
    }
}

/// A KucoFS file: the library's own positioned reads and writes, which
/// mirror `std::os::unix::fs::FileExt`.
impl FileHandle for kucofs_ulib::File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        kucofs_ulib::File::read_at(self, buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        kucofs_ulib::File::write_at(self, buf, offset)
    }

    fn append(&self, buf: &[u8]) -> io::Result<usize> {
        // Opened with `append`, every write goes to the end.
        let mut file: &kucofs_ulib::File = self;
        io::Write::write(&mut file, buf)
    }

    fn set_len(&self, size: u64) -> io::Result<()> {
        kucofs_ulib::File::set_len(self, size)
    }

    fn sync_all(&self) -> io::Result<()> {
        kucofs_ulib::File::sync_all(self)
    }

    fn len(&self) -> io::Result<u64> {
        self.metadata().map(|m| m.len())
    }
}

/// `d` in nanoseconds, saturating (a `u64` holds 584 years of them).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_parsed_in_any_order() {
        let o = Options::parse(
            "protect=batched+queued+size=64M+image=/tmp/x.img+nohints+huge+ahead+sparse",
        )
        .unwrap();
        assert_eq!(
            o,
            Options {
                collaborative: false,
                direct: false,
                protection: Protection::Batched,
                huge: Some(true),
                ahead: Some(true),
                size: 64 << 20,
                sparse: true,
                image: PathBuf::from("/tmp/x.img"),
            }
        );
        let d = Options::parse("").unwrap();
        assert!(d.collaborative && d.direct && d.huge.is_none());
        assert_eq!(o.config().server.huge_pages, Some(true));
        assert_eq!(d.config().server.huge_pages, None);
        assert_eq!(o.config().server.huge_ahead, Some(true));
        assert_eq!(d.config().server.huge_ahead, None);
        let no_ahead = Options::parse("noahead").unwrap();
        assert_eq!(no_ahead.config().server.huge_ahead, Some(false));
        let n = Options::parse("nohuge").unwrap();
        assert_eq!(n.config().server.huge_pages, Some(false));
        assert_eq!(d.protection, Protection::default());
        assert_eq!((d.size, d.sparse), (4 << 30, false));
        for p in Protection::ALL {
            let o = Options::parse(&format!("protect={}", p.name())).unwrap();
            assert_eq!(o.protection, p);
        }
    }

    #[test]
    fn bad_options_are_refused_naming_what_is_accepted() {
        let msg = Options::parse("protect=maybe").unwrap_err();
        assert!(msg.contains("strict, batched, off"), "{msg}");
        let msg = Options::parse("fast").unwrap_err();
        assert!(msg.contains("unknown option `fast`"), "{msg}");
        assert!(msg.contains("protect=strict|batched|off|keys"), "{msg}");
        assert!(Options::parse("size=lots").is_err());
    }

    #[test]
    fn images_left_by_runs_whose_process_is_gone_are_removed() {
        let path = |pid: u32| Path::new(IMAGE_DIR).join(format!("{IMAGE_PREFIX}{pid}-0.img"));
        // No process has an id this high (the kernel's most is 2^22).
        let (gone, alive) = (path(99_999_999), path(1));
        if !Path::new("/proc/1").exists() || !Path::new(IMAGE_DIR).is_dir() {
            println!("SKIPPED: no /proc to tell which processes are alive, or no {IMAGE_DIR}");
            return;
        }
        std::fs::write(&gone, b"left").unwrap();
        let kept = !alive.exists();
        if kept {
            std::fs::write(&alive, b"in use").unwrap();
        }
        let tmp = crate::testing::tempdir();
        let arg = format!("size=16M+image={}", tmp.path().join("img").display());
        let fs = KucofsBackend::open(&format!("kucofs:{arg}"), &arg).unwrap();
        drop(fs);
        assert!(!gone.exists());
        assert!(alive.exists());
        if kept {
            std::fs::remove_file(&alive).unwrap();
        }
    }

    #[test]
    fn files_are_written_and_read_back_with_each_protection() {
        let tmp = crate::testing::tempdir();
        for p in Protection::ALL {
            let arg = format!(
                "size=16M+image={}+protect={}",
                tmp.path().join("img").display(),
                p.name()
            );
            let fs = KucofsBackend::open(&format!("kucofs:{arg}"), &arg).unwrap();
            let w = fs.open_file(Path::new("f"), OpenOptions::CREATE).unwrap();
            assert_eq!(w.write_at(&[7u8; 5000], 3).unwrap(), 5000);
            let f = fs.open_file(Path::new("f"), OpenOptions::READ).unwrap();
            let mut buf = [0u8; 5003];
            assert_eq!(f.read_at(&mut buf, 0).unwrap(), 5003);
            assert_eq!(&buf[..3], &[0, 0, 0]);
            assert!(buf[3..].iter().all(|&b| b == 7));
            assert_eq!(f.len().unwrap(), 5003);
            drop((w, f));
            drop(fs);
            assert!(!tmp.path().join("img").exists());
        }
    }
}
