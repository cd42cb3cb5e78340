//! `kucofs[:OPTION+...]`: KucoFS through its library, with Kfs embedded in
//! the benchmark process, on an image under `/dev/shm` made for the run and
//! removed afterwards.
//!
//! Options, joined with `+` (commas separate backends): `queued` (every change goes to the Kfs thread through the
//! request slots, even when Kfs is idle), `nohints` (collaborative indexing
//! off: Kfs resolves every queued path itself), `size=SIZE` (the image's size, default 8G; the file is sparse),
//! `image=PATH` (where to make it).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use kucofs_ulib::{Config, Fs};

use super::{Backend, ServerCounters};
use crate::error::{Error, Result};

/// KucoFS on an image of its own.
#[derive(Debug)]
pub struct KucofsBackend {
    spec: String,
    image: PathBuf,
    fs: Option<Fs>,
}

fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let (num, shift) = match t.char_indices().last()? {
        (i, 'K' | 'k') => (&t[..i], 10),
        (i, 'M' | 'm') => (&t[..i], 20),
        (i, 'G' | 'g') => (&t[..i], 30),
        (i, 'T' | 't') => (&t[..i], 40),
        _ => (t, 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1 << shift)
}

impl KucofsBackend {
    /// Makes a fresh image as `arg` says and opens it.
    pub fn open(spec: &str, arg: &str) -> Result<Self> {
        let bad = |why: String| Error::UnusableBackend {
            spec: spec.to_owned(),
            why,
        };
        let mut config = Config::default();
        let mut size = 8u64 << 30;
        let mut image = PathBuf::from(format!(
            "/dev/shm/fxbench-kucofs-{}.img",
            std::process::id()
        ));
        for opt in arg.split('+').filter(|o| !o.is_empty()) {
            match opt.split_once('=') {
                None if opt == "nohints" => config.collaborative = false,
                None if opt == "queued" => config.direct = false,
                Some(("size", v)) => {
                    size = parse_size(v)
                        .ok_or_else(|| bad(format!("size `{v}` is not a size like 8G")))?
                }
                Some(("image", v)) => image = PathBuf::from(v),
                _ => {
                    return Err(bad(format!(
                        "unknown option `{opt}` (expected queued, nohints, size=SIZE or image=PATH)"
                    )))
                }
            }
        }
        // A leftover image of an earlier, killed run with this name.
        let _ = std::fs::remove_file(&image);
        let fs = Fs::create(&image, size)
            .and_then(|fs| {
                let c = config;
                fs.close()?;
                Fs::open_with(&image, c)
            })
            .map_err(|e| {
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

    fn server_counters(&self) -> Option<ServerCounters> {
        let s = self.fs().kfs_stats()?;
        Some(ServerCounters {
            busy_ns: s.busy.as_nanos() as u64,
            per_op: s
                .per_kind
                .iter()
                .map(|&(k, n, ns)| (format!("{k:?}"), (n, ns)))
                .collect::<BTreeMap<_, _>>(),
        })
    }
}
