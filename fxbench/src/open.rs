//! How long opening a file system takes, after a clean close and after a
//! crash, by the number of files it holds: KucoFS's recovery loads its
//! metadata store in one pass and replays what the log holds since the
//! last retirement (see `fxbench open --help`).

use std::path::Path;
use std::time::{Duration, Instant};

use kucofs_ulib::Fs;
use serde::Serialize;

/// One size measured.
#[derive(Debug, Clone, Serialize)]
pub struct OpenTimes {
    /// Files in the one directory the image holds.
    pub files: u64,
    /// Seconds to make them (one thread, `create_file`).
    pub create_seconds: f64,
    /// Seconds to open the image after a clean close.
    pub clean_open_seconds: f64,
    /// Seconds to open it after a crash.
    pub crash_open_seconds: f64,
    /// Log records the crash's recovery replayed.
    pub replayed: u64,
}

impl OpenTimes {
    /// The measurement as one table line.
    pub fn line(&self) -> String {
        let per_million = |d: f64| d * 1e6 / self.files.max(1) as f64;
        format!(
            "{:>10} files: made in {:.2} s; open after a clean close {:.3} s ({:.3} s per million), after a crash {:.3} s ({:.3} s per million, {} records replayed)",
            self.files,
            self.create_seconds,
            self.clean_open_seconds,
            per_million(self.clean_open_seconds),
            self.crash_open_seconds,
            per_million(self.crash_open_seconds),
            self.replayed,
        )
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Makes an image of `size` bytes at `image`, fills one directory with
/// `files` empty files, closes it and times an open; then makes files
/// `crash_files` more, simulates a crash and times the recovering open.
/// The image is removed afterwards.
pub fn measure(
    image: &Path,
    size: u64,
    files: u64,
    crash_files: u64,
) -> std::io::Result<OpenTimes> {
    let _ = std::fs::remove_file(image);
    let result = (|| {
        let fs = Fs::create(image, size)?;
        fs.create_dir("d")?;
        let t = Instant::now();
        for i in 0..files {
            fs.create_file(format!("d/{i:010}"))?;
        }
        let create_seconds = secs(t.elapsed());
        fs.close()?;
        let t = Instant::now();
        let fs = Fs::open(image)?;
        let clean_open_seconds = secs(t.elapsed());
        for i in 0..crash_files {
            fs.create_file(format!("d/crash-{i:010}"))?;
        }
        fs.simulate_crash();
        let t = Instant::now();
        let fs = Fs::open(image)?;
        let crash_open_seconds = secs(t.elapsed());
        let replayed = fs.kfs_stats().map_or(0, |s| s.replayed);
        let found = fs.read_dir("d")?.count() as u64;
        fs.close()?;
        if found != files + crash_files {
            return Err(std::io::Error::other(format!(
                "{found} files found after recovery, {} made",
                files + crash_files
            )));
        }
        Ok(OpenTimes {
            files,
            create_seconds,
            clean_open_seconds,
            crash_open_seconds,
            replayed,
        })
    })();
    let _ = std::fs::remove_file(image);
    result
}
