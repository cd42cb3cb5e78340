//! `fxbench medium`: what the machine charges for the operations KucoFS's
//! data path is built from, measured through the project's own region
//! code, so that the data workloads' figures can be read against them.
//!
//! - **Page protection** ([`kucofs_common::pm::Protector::set`], i.e.
//!   `mprotect` on a client's read-only view): one page made writable and
//!   back, and a batch's worth ([`BATCH_PAGES`]) made writable and back,
//!   per page; each alone and with a second thread of the process spinning
//!   (on the other CPU, when the scheduler has one free: the figures mean
//!   most on a machine with two or more).
//!   Under `batched`, a page written for the first time is made writable
//!   (with its pool) and read-only again (with its batch), so the
//!   batch-sized figure is its cost per page (a page an overwrite replaced
//!   before its batch's flip stays writable and costs nothing more);
//!   `strict` makes each commit's pages read-only on their
//!   own, half of a one-page pair. A flip changes the page tables of a
//!   process that may run on other CPUs, so the kernel interrupts those to
//!   drop stale translations: the second thread shows what that adds.
//! - **Persisting 4 KiB** the way a copy-on-write overwrite does
//!   (non-temporal copy into a page at a random offset, then a fence),
//!   alone and followed by a persisted 64-byte log record (the least a
//!   durable commit adds: ARCHITECTURE.md §8 persists the data before the record
//!   that names it), in a small region and at random pages of a 256 MiB
//!   one; next to what an in-place overwrite of one cached page costs (a
//!   plain copy into the same page each time, as a page-cache write does).
//! - **Random 4 KiB reads** through a client's view of an emulated region
//!   (a shared file mapping, 4 KiB pages), next to the same reads from
//!   memory mapped with 2 MiB pages where the kernel grants them (a
//!   kernel file system reads through its own map of all memory, which
//!   uses large pages). A read of the view at a random page misses the
//!   TLB.
//!
//! - **The kernel's own** 4 KiB `pwrite` in place and at a random page,
//!   and `pread` at a random page, of the same scratch files (tmpfs when
//!   `dir` is under `/dev/shm`): what DWOL's, RNDWR's and RNDRD's
//!   baselines are made of. Their quotients with the figures above bound
//!   the ratios those workloads can reach on this machine, whatever the
//!   rest of the path costs.
//!
//! Every figure is nanoseconds per operation, the median of [`ROUNDS`].

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use kucofs_common::pm::{Region, RegionView, BATCH_PAGES};
use serde::Serialize;

use crate::rng::XorShift64;

/// Repetitions of each measurement; the median is reported.
pub const ROUNDS: usize = 5;
/// Region for the protection and persistence figures.
const SMALL: u64 = 64 << 20;
/// Region (and huge-page buffer) for the random reads: larger than any
/// last-level cache, as RNDRD's file is.
const LARGE_LEN: usize = 256 << 20;
/// [`LARGE_LEN`] as an offset.
const LARGE: u64 = LARGE_LEN as u64;
const PAGE: u64 = kucofs_common::format::PAGE_SIZE;
const PAGE_LEN: usize = kucofs_common::format::PAGE_LEN;
const HUGE: usize = 2 << 20;
/// A figure [`Medium::bounds`] divides.
const LOGGED: &str = "persist 4 KiB, then a 64-byte log record: random page";
/// A figure [`Medium::bounds`] divides.
const LOGGED_LARGE: &str = "persist 4 KiB + log record: random page of 256 MiB";
/// A figure [`Medium::bounds`] divides.
const RANDOM_PWRITE: &str = "kernel: pwrite 4 KiB at a random page of its file";
/// A figure [`Medium::bounds`] divides.
const PWRITE: &str = "kernel: pwrite 4 KiB in place, same page of its file";
/// A figure [`Medium::bounds`] divides.
const VIEW_READ: &str = "read 4 KiB at a random page: client view (4 KiB pages)";
/// A figure [`Medium::bounds`] divides.
const PREAD: &str = "kernel: pread 4 KiB at a random page of its file";

/// One measured figure.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    /// What was measured.
    pub what: String,
    /// Nanoseconds per operation (median of [`ROUNDS`]).
    pub ns: f64,
    /// What one operation is.
    pub per: &'static str,
}

/// Everything `fxbench medium` measures.
#[derive(Debug, Clone, Serialize)]
pub struct Medium {
    /// The figures, in the order printed.
    pub figures: Vec<Figure>,
    /// Whether the kernel backed the comparison buffer with 2 MiB pages
    /// (if not, the two read figures compare 4 KiB pages with 4 KiB pages).
    pub huge_pages_granted: bool,
}

/// Measures everything, with scratch images under `dir` (removed after).
pub fn measure(dir: &Path) -> anyhow::Result<Medium> {
    let mut figures = Vec::new();
    let data = vec![0x5au8; PAGE_LEN];
    {
        let scratch = Scratch::new(dir, "protect")?;
        let region = Region::create(&scratch.0, SMALL, true).context("create a scratch region")?;
        region.prefault(0, SMALL);
        let view = region.view().context("map a client view")?;
        view_touch(&view, SMALL);
        // The changes below are made on the view's write window: map its
        // pages first, as a writer's stores do, so that making them
        // read-only has entries to change and translations to flush.
        let window = view.protector().context("an unkeyed view's protector")?;
        window.set(0, SMALL / PAGE, true)?;
        window.populate(0, SMALL / PAGE);
        window.set(0, SMALL / PAGE, false)?;
        let protect = |pages: u64, iters: u64| -> anyhow::Result<f64> {
            let p = &window;
            let span = SMALL / PAGE - pages;
            let mut i = 0;
            let per_call = ns_per(iters, || {
                let first = (i * pages) % span;
                i += 1;
                p.set(first, pages, true)?;
                Ok(p.set(first, pages, false)?)
            })?;
            Ok(per_call / pages as f64)
        };
        for busy in [false, true] {
            let _spinner = busy.then(Busy::start);
            for (pages, iters) in [(1, 2000), (BATCH_PAGES, 40)] {
                let what = match busy {
                    false => format!("protection: {pages} page(s) writable and back"),
                    true => format!("protection: {pages} page(s), another thread running"),
                };
                figures.push(Figure {
                    what,
                    ns: protect(pages, iters)?,
                    per: "page",
                });
            }
        }

        let pages = SMALL / PAGE;
        figures.push(Figure {
            what: "persist 4 KiB: non-temporal copy + fence, random page".into(),
            ns: {
                let mut rng = XorShift64::new(1);
                ns_per(100_000, || {
                    region.write_nt(rng.below(pages) * PAGE, &data)?;
                    region.fence();
                    Ok(())
                })?
            },
            per: "4 KiB",
        });
        figures.push(Figure {
            what: LOGGED.into(),
            ns: logged_writes(&region, SMALL, &data, 3)?,
            per: "4 KiB",
        });
        figures.push(Figure {
            what: "overwrite 4 KiB in place: cached copy, same page".into(),
            ns: ns_per(
                100_000,
                || Ok(region.write(0, std::hint::black_box(&data))?),
            )?,
            per: "4 KiB",
        });
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&scratch.0)
            .context("open the scratch image")?;
        figures.push(Figure {
            what: PWRITE.into(),
            ns: ns_per(100_000, || {
                file.write_all_at(std::hint::black_box(&data), 0)?;
                Ok(())
            })?,
            per: "4 KiB",
        });
    }

    let scratch = Scratch::new(dir, "read")?;
    let region = Region::create(&scratch.0, LARGE, true).context("create a scratch region")?;
    region.fill(0, LARGE, 1)?;
    let view = region.view().context("map a client view")?;
    view_touch(&view, LARGE);
    let mut buf = crate::workload::buffer();
    let reads = 200_000u64;
    figures.push(Figure {
        what: VIEW_READ.into(),
        ns: {
            let mut rng = XorShift64::new(2);
            ns_per(reads, || {
                view.read(rng.below(LARGE / PAGE) * PAGE, &mut buf)?;
                std::hint::black_box(&buf);
                Ok(())
            })?
        },
        per: "4 KiB",
    });
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&scratch.0)
        .context("open the scratch image")?;
    figures.push(Figure {
        what: PREAD.into(),
        ns: {
            let mut rng = XorShift64::new(2);
            ns_per(reads, || {
                file.read_exact_at(&mut buf, rng.below(LARGE / PAGE) * PAGE)?;
                std::hint::black_box(&buf);
                Ok(())
            })?
        },
        per: "4 KiB",
    });
    figures.push(Figure {
        what: LOGGED_LARGE.into(),
        ns: logged_writes(&region, LARGE, &data, 4)?,
        per: "4 KiB",
    });
    figures.push(Figure {
        what: RANDOM_PWRITE.into(),
        ns: {
            let mut rng = XorShift64::new(5);
            ns_per(100_000, || {
                file.write_all_at(&data, rng.below(LARGE / PAGE) * PAGE)?;
                Ok(())
            })?
        },
        per: "4 KiB",
    });
    drop(view);
    drop(region);
    drop(scratch);

    let before = anon_huge_kib();
    let mut big = vec![0u8; LARGE_LEN + HUGE];
    let skip = big.as_ptr().align_offset(HUGE);
    let aligned = &mut big[skip..skip + LARGE_LEN];
    // SAFETY: the range is the live, writable, 2 MiB-aligned slice
    // `aligned` of `big`; MADV_HUGEPAGE only asks the kernel to back it
    // with larger pages and changes no contents.
    let _ = unsafe {
        rustix::mm::madvise(
            aligned.as_mut_ptr().cast(),
            aligned.len(),
            rustix::mm::Advice::LinuxHugepage,
        )
    };
    aligned.fill(1);
    // Granted if at least half of the buffer is on huge pages.
    let huge_pages_granted = anon_huge_kib().saturating_sub(before) >= LARGE / 1024 / 2;
    figures.push(Figure {
        what: if huge_pages_granted {
            "read 4 KiB at a random page: memory on 2 MiB pages"
        } else {
            "read 4 KiB at a random page: memory (no 2 MiB pages granted)"
        }
        .into(),
        ns: {
            let mut rng = XorShift64::new(2);
            ns_per(reads, || {
                // Below LARGE, which is a `usize` (LARGE_LEN).
                #[allow(clippy::cast_possible_truncation)]
                let at = (rng.below(LARGE / PAGE) * PAGE) as usize;
                buf.copy_from_slice(&aligned[at..at + PAGE_LEN]);
                std::hint::black_box(&buf);
                Ok(())
            })?
        },
        per: "4 KiB",
    });
    Ok(Medium {
        figures,
        huge_pages_granted,
    })
}

impl Medium {
    /// The most a workload's ratio to the kernel can be on this machine,
    /// from the kernel's figure over the steps KucoFS cannot skip: RNDRD's
    /// copy out of a client view; DWOL's and RNDWR's persisted copy
    /// followed by a persisted log record (ARCHITECTURE.md §8: the data is durable
    /// before the record that names it, and the record before the reply).
    /// The commit's checks, map update and protection come on top.
    pub fn bounds(&self) -> Vec<(String, f64)> {
        let ns = |what: &str| self.figures.iter().find(|f| f.what == what).map(|f| f.ns);
        let mut out = Vec::new();
        if let (Some(k), Some(v)) = (ns(PREAD), ns(VIEW_READ)) {
            out.push((
                "bound on RNDRD's ratio (pread / view read)".to_string(),
                k / v,
            ));
        }
        if let (Some(k), Some(p)) = (ns(PWRITE), ns(LOGGED)) {
            out.push((
                "bound on DWOL's ratio (pwrite / persist + log)".to_string(),
                k / p,
            ));
        }
        if let (Some(k), Some(p)) = (ns(RANDOM_PWRITE), ns(LOGGED_LARGE)) {
            out.push((
                "bound on RNDWR's ratio (random pwrite / persist + log)".to_string(),
                k / p,
            ));
        }
        out
    }

    /// The figures as a table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        for f in &self.figures {
            s += &format!("{:<58} {:>9.1} ns per {}\n", f.what, f.ns, f.per);
        }
        for (what, x) in self.bounds() {
            s += &format!("{what:<58} {x:>9.2}x\n");
        }
        if !self.huge_pages_granted {
            s += "(the kernel did not grant 2 MiB pages: the client-view read and the memory read \
                  compare 4 KiB pages with 4 KiB pages)\n";
        }
        s
    }
}

/// Nanoseconds per call of `op`: the median over [`ROUNDS`] rounds of `n`
/// calls each.
fn ns_per(n: u64, mut op: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let mut rounds = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..n {
            op()?;
        }
        rounds.push(t.elapsed().as_nanos() as f64 / n as f64);
    }
    rounds.sort_by(f64::total_cmp);
    crate::report::median(&rounds).context("no rounds")
}

/// Nanoseconds per durable 4 KiB write as a copy-on-write commit needs
/// at least: the data copied non-temporally into a random page of the
/// `len`-byte `region` and fenced, then a 64-byte record stored into the
/// region's first MiB (a log, written in order) and fenced.
fn logged_writes(region: &Region, len: u64, data: &[u8], seed: u64) -> anyhow::Result<f64> {
    const LOG: u64 = 1 << 20;
    let record = [0xa5u8; 64];
    let (mut rng, mut next) = (XorShift64::new(seed), 0);
    ns_per(100_000, || {
        region.write_nt(LOG + PAGE * rng.below((len - LOG) / PAGE), data)?;
        region.fence();
        region.write_nt(64 * next % LOG, &record)?;
        region.fence();
        next += 1;
        Ok(())
    })
}

/// Reads every page of a view once, so that later reads pay for a missed
/// translation, not for a first fault.
fn view_touch(view: &RegionView, len: u64) {
    let mut b = [0u8; 1];
    for off in (0..len).step_by(PAGE_LEN) {
        let _ = view.read(off, &mut b);
    }
}

/// Kilobytes of this process's anonymous memory on huge pages.
fn anon_huge_kib() -> u64 {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|s| crate::machine::kib_field(&s, "AnonHugePages"))
        .unwrap_or(0)
}

/// A thread of this process spinning until dropped.
struct Busy {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Busy {
    /// Starts the spinner and returns once it runs.
    fn start() -> Busy {
        let stop = Arc::new(AtomicBool::new(false));
        let running = Arc::new(AtomicBool::new(false));
        let (s, r) = (stop.clone(), running.clone());
        let thread = std::thread::spawn(move || {
            // Relaxed, both flags: they carry no data, and a late sight of
            // either costs a few more spins.
            r.store(true, Ordering::Relaxed);
            while !s.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        while !running.load(Ordering::Relaxed) {
            std::thread::yield_now();
        }
        Busy {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A scratch image path, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(dir: &Path, what: &str) -> anyhow::Result<Scratch> {
        anyhow::ensure!(
            dir.is_dir(),
            "{} is not a directory (the scratch images go there)",
            dir.display()
        );
        Ok(Scratch(dir.join(format!(
            "fxbench-medium-{what}-{}.img",
            std::process::id()
        ))))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_is_refused_by_name() {
        let e = measure(Path::new("/nonexistent/fxbench")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/fxbench"), "{e}");
    }

    #[test]
    fn every_figure_is_measured() {
        let dir = Path::new("/dev/shm");
        if !dir.is_dir() {
            println!("SKIPPED: no /dev/shm for the scratch regions");
            return;
        }
        let m = measure(dir).unwrap();
        assert_eq!(m.figures.len(), 13);
        assert_eq!(m.bounds().len(), 3, "{}", m.table());
        for f in &m.figures {
            assert!(f.ns.is_finite() && f.ns > 0.0, "{}: {}", f.what, f.ns);
        }
        // A flip of a range costs less per page than a flip of one page:
        // the call, the walk and the translation flush are shared.
        assert!(m.figures[1].ns < m.figures[0].ns, "{}", m.table());
        let mine = format!("-{}.img", std::process::id());
        let leftovers = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("fxbench-medium-") && name.ends_with(&mine)
            })
            .count();
        assert_eq!(leftovers, 0, "scratch images are removed");
    }
}
