//! Huge pages for a writable mapping of a tmpfs file (ARCHITECTURE.md §3):
//! which [`HUGE_PAGE`] chunks of the mapping were asked of the kernel,
//! which it made huge, which it would not make huge for a reason of the
//! moment (asked for again, [`Mapping::retry_huge`]), and whether it
//! refused huge pages for good; and provisioning a range ahead of use,
//! huge where it can be, in small pages otherwise.
//!
//! The policy only: the system calls (`MADV_COLLAPSE`, populating and
//! touching pages) are the mapping's, in `mapping.rs`. Kfs's
//! provisioner (`kfs/src/provision.rs`) decides which ranges to make
//! ready, and when.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::mapping::{Mapping, HUGE_PAGE};

/// What became of each [`HUGE_PAGE`] chunk of a mapping asked to be huge.
/// The bits are hints that decide only whether to ask the kernel again:
/// no memory contents depend on them, so every access is Relaxed.
#[derive(Debug)]
pub(super) struct HugeChunks {
    /// The mapping's owner asked for huge pages ([`Mapping::enable_huge`]).
    enabled: AtomicBool,
    /// Bit `c`: chunk `c` was handed to the kernel to be made huge.
    tried: Box<[AtomicU64]>,
    /// Bit `c`: the kernel made chunk `c` huge.
    made: Box<[AtomicU64]>,
    /// Bit `c`: the kernel would not make chunk `c` huge when asked, for a
    /// reason of the moment (no huge page free, a page of it busy), so it
    /// is worth asking again ([`Mapping::retry_huge`]).
    failed: Box<[AtomicU64]>,
    /// How many bits of `failed` are set: whether a retry is due costs one
    /// load, not a scan.
    failed_count: AtomicUsize,
    /// Tests: the next collapse fails as if the kernel had no huge page.
    #[cfg(any(test, feature = "test-hooks"))]
    fail_next: AtomicBool,
    /// The kernel cannot make this file's pages huge at all (a kernel
    /// before 6.1, or huge pages turned off for shared memory).
    refused: AtomicBool,
}

impl HugeChunks {
    fn new(chunks: usize) -> HugeChunks {
        let words = || {
            (0..chunks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect()
        };
        HugeChunks {
            enabled: AtomicBool::new(false),
            tried: words(),
            made: words(),
            failed: words(),
            failed_count: AtomicUsize::new(0),
            #[cfg(any(test, feature = "test-hooks"))]
            fail_next: AtomicBool::new(false),
            refused: AtomicBool::new(false),
        }
    }

    /// Enabled, and not refused.
    fn usable(&self) -> bool {
        self.enabled.load(Ordering::Relaxed) && !self.refused.load(Ordering::Relaxed)
    }

    fn bit(bits: &[AtomicU64], c: usize) -> bool {
        bits[c / 64].load(Ordering::Relaxed) & (1 << (c % 64)) != 0
    }

    /// Sets bit `c`; true if this call set it.
    fn set(bits: &[AtomicU64], c: usize) -> bool {
        let b = 1 << (c % 64);
        bits[c / 64].fetch_or(b, Ordering::Relaxed) & b == 0
    }

    /// Marks chunk `c` for [`Mapping::retry_huge`].
    fn fail(&self, c: usize) {
        if HugeChunks::set(&self.failed, c) {
            self.failed_count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Takes the lowest chunk marked for a retry, if any.
    fn take_failed(&self) -> Option<usize> {
        if self.failed_count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        for (i, w) in self.failed.iter().enumerate() {
            // Clears the word's lowest set bit, however other threads
            // change the word meanwhile.
            let cleared = w.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                (v != 0).then(|| v & (v - 1))
            });
            if let Ok(v) = cleared {
                self.failed_count.fetch_sub(1, Ordering::Relaxed);
                return Some(i * 64 + v.trailing_zeros() as usize);
            }
        }
        None
    }
}

impl Mapping {
    /// Marks a writable mapping of a tmpfs file (see [`on_tmpfs`]) as one
    /// that may have huge pages, once [`Mapping::enable_huge`] asks.
    pub(super) fn allow_huge(&mut self) {
        if self.writable() {
            self.huge = Some(HugeChunks::new(self.len() / HUGE_PAGE));
        }
    }

    /// Lets [`Mapping::make_huge`] ask the kernel for huge pages from now
    /// on; false if this mapping cannot have them.
    pub(super) fn enable_huge(&self) -> bool {
        self.huge.as_ref().is_some_and(|h| {
            h.enabled.store(true, Ordering::Relaxed);
            true
        })
    }

    /// Makes the range ready for use: its chunks huge where
    /// [`Mapping::make_huge`] can (up to `limit`), its pages allocated and
    /// mapped otherwise ([`Mapping::touch`]).
    pub(super) fn provision(&self, offset: u64, len: u64, limit: u64) {
        if !self.make_huge(offset, len, limit) {
            self.touch(offset, len);
        }
    }

    /// Asks the kernel to hold each [`HUGE_PAGE`] chunk overlapping
    /// `[offset, offset + len)` in one huge page (`MADV_COLLAPSE`), and to
    /// map it so here. Contents are unchanged: the kernel copies what a
    /// chunk holds into its huge page and zeroes the rest, as holes read.
    /// A chunk is asked for once here: the kernel keeps a chunk huge as
    /// long as the file is not cut inside it, and every other mapping of
    /// the file then maps it huge at its next fault there; one the kernel
    /// would not make huge for the moment is asked for again only by
    /// [`Mapping::retry_huge`]. Chunks reaching past `limit` (the file's
    /// end) are left alone.
    ///
    /// True if every chunk of the range is huge now; false if any is not,
    /// or if huge pages were not enabled (the caller then provisions the
    /// range in small pages).
    pub(super) fn make_huge(&self, offset: u64, len: u64, limit: u64) -> bool {
        let Some(h) = self.huge.as_ref().filter(|h| h.usable()) else {
            return false;
        };
        if len == 0 {
            return false;
        }
        let limit = limit.min(self.len() as u64);
        let size = HUGE_PAGE as u64;
        let first = offset / size;
        let Some(end) = offset.checked_add(len).map(|e| e.div_ceil(size)) else {
            return false;
        };
        let mut all = true;
        for c in first..end {
            if (c + 1) * size > limit {
                all = false;
                continue;
            }
            // The chunk ends within `limit`, at most `self.len()`: its
            // index fits a `usize`.
            #[allow(clippy::cast_possible_truncation)]
            let c = c as usize;
            if HugeChunks::bit(&h.made, c) {
                continue;
            }
            // Only the thread that marks a chunk tried asks for it; others
            // take it as not huge (yet).
            if !HugeChunks::set(&h.tried, c) || !self.collapse(c, h) {
                all = false;
                continue;
            }
            HugeChunks::set(&h.made, c);
        }
        all
    }

    /// Asks the kernel again for one chunk it would not make huge earlier
    /// for a reason of the moment (the lowest such chunk): `Some(true)` if
    /// it is huge now, `Some(false)` if not (it waits for the next call
    /// again), `None` if no chunk waited.
    pub(super) fn retry_huge(&self) -> Option<bool> {
        let h = self.huge.as_ref().filter(|h| h.usable())?;
        let c = h.take_failed()?;
        let made = self.collapse(c, h);
        if made {
            HugeChunks::set(&h.made, c);
        }
        Some(made)
    }

    /// True if some chunk waits for [`Mapping::retry_huge`].
    pub(super) fn huge_retry_due(&self) -> bool {
        self.huge
            .as_ref()
            .is_some_and(|h| h.usable() && h.failed_count.load(Ordering::Relaxed) > 0)
    }

    /// Tests: the next collapse fails as for want of a huge page.
    #[cfg(any(test, feature = "test-hooks"))]
    pub(super) fn fail_next_collapse(&self) {
        if let Some(h) = &self.huge {
            h.fail_next.store(true, Ordering::Relaxed);
        }
    }

    /// Makes chunk `c` huge; false if the kernel would not. A chunk it
    /// would not make huge for a reason of the moment is marked for
    /// [`Mapping::retry_huge`].
    fn collapse(&self, c: usize, h: &HugeChunks) -> bool {
        #[cfg(any(test, feature = "test-hooks"))]
        if h.fail_next.swap(false, Ordering::Relaxed) {
            h.fail(c);
            return false;
        }
        // A chunk the file holds no page of is no candidate for the kernel:
        // give it one first.
        self.populate((c * HUGE_PAGE) as u64, 4096);
        let Err(e) = self.madvise_collapse(c * HUGE_PAGE) else {
            return true;
        };
        // EINVAL for a chunk that holds a page means no huge pages here at
        // all; others (EAGAIN, ENOMEM) are about this chunk, this time.
        if e.raw_os_error() == Some(libc::EINVAL) {
            h.refused.store(true, Ordering::Relaxed);
        } else {
            h.fail(c);
        }
        false
    }

    /// True if huge pages were enabled for the mapping and the kernel has
    /// not refused them.
    pub(super) fn can_make_huge(&self) -> bool {
        self.huge.as_ref().is_some_and(HugeChunks::usable)
    }

    /// How many bytes of the mapping are held in huge pages the kernel
    /// made at this mapping's request.
    pub(super) fn huge_bytes(&self) -> u64 {
        self.huge.as_ref().map_or(0, |h| {
            let chunks: u32 = h
                .made
                .iter()
                .map(|w| w.load(Ordering::Relaxed).count_ones())
                .sum();
            u64::from(chunks) * HUGE_PAGE as u64
        })
    }
}
