//! One owned memory mapping, and [`Media`], the bounds-checked view of a
//! writable mapping that the persistence backends work on.
//!
//! This file holds the only raw pointers into mapped memory in the crate.
//! It is the primitive only: which chunks of a mapping to make huge pages,
//! and when to ask again, is decided in [`super::huge`].

use std::marker::PhantomData;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use rustix::mm::{MapFlags, ProtFlags};

use super::cpu::{self, FlushInstr};
use super::huge::HugeChunks;
use crate::{Error, Result};

/// A read-modify-write operation on a shared word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WordOp {
    /// `fetch_add`.
    Add,
    /// `fetch_or`.
    Or,
    /// `fetch_and`.
    And,
    /// `swap`.
    Swap,
}

/// The size of a huge page: what one page-directory entry maps on x86-64.
/// Mappings start at a multiple of it, so that the kernel can map every
/// aligned 2 MiB of the file that its page cache holds in one huge page
/// with a single TLB entry instead of 512. Random access over a large file
/// then misses the TLB far less, and each miss walks one level less.
pub const HUGE_PAGE: usize = 2 << 20;

/// `madvise(MADV_COLLAPSE)` (Linux 6.1): back a range with huge pages now,
/// copying what it holds into them. The libc crate does not name it.
const MADV_COLLAPSE: libc::c_int = 25;

/// Where [`Mapping::map_placed`] puts a mapping. The kernel maps a huge
/// page only where the address and the file offset agree modulo its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Placement {
    /// At a multiple of [`HUGE_PAGE`], so that the kernel can map every
    /// aligned 2 MiB of the file that its page cache holds in one huge
    /// page.
    Huge,
    /// One small page past such a multiple, so that every kernel maps it
    /// in small pages, even where the file is held in huge pages: for a
    /// mapping whose protection changes a run of pages at a time, where a
    /// change inside a huge mapping would split it first.
    Small,
}

/// An owned `mmap` of an image or shared segment; unmapped on drop.
#[derive(Debug)]
pub(super) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
    /// For a writable mapping of a tmpfs file: whether huge pages were
    /// asked for, and which of its [`HUGE_PAGE`] chunks were made huge
    /// (the policy is in [`super::huge`]).
    pub(super) huge: Option<HugeChunks>,
}

/// True if `fd` is a file of tmpfs (or a memfd, which lives there too):
/// the file systems whose page cache `MADV_COLLAPSE` can make huge
/// whatever their mount options say.
pub(super) fn on_tmpfs(fd: BorrowedFd<'_>) -> bool {
    rustix::fs::fstatfs(fd).is_ok_and(|s| s.f_type == libc::TMPFS_MAGIC)
}

// SAFETY: a Mapping is a plain range of process memory with no thread
// affinity; all access goes through the bounds-checked methods below, which
// are sound from any thread (shared memory is accessed by copies and atomics).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` exposes no `&`/`&mut` references into the
// memory, only copies and atomic operations.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` from its start with `prot` and `flags`
    /// (shared), placed as `placement` says. The mapping is made inside a
    /// reservation of inaccessible bytes (`len`, a [`HUGE_PAGE`] for the
    /// alignment, and the small page of [`Placement::Small`]), and the
    /// reservation's slack on either side is returned.
    pub(super) fn map_placed(
        fd: BorrowedFd<'_>,
        len: usize,
        prot: ProtFlags,
        flags: MapFlags,
        placement: Placement,
    ) -> rustix::io::Result<Mapping> {
        let skew = match placement {
            Placement::Huge => 0,
            Placement::Small => 4096,
        };
        let span = len
            .checked_add(HUGE_PAGE + skew)
            .ok_or(rustix::io::Errno::NOMEM)?;
        // SAFETY: a fresh inaccessible anonymous mapping chosen by the kernel
        // (null hint) aliases nothing; this function owns it until it is
        // replaced or unmapped below.
        let base = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                span,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }?;
        let head = (base as usize).next_multiple_of(HUGE_PAGE) - base as usize + skew;
        let at = base.cast::<u8>().wrapping_add(head);
        // SAFETY: `[at, at + len)` lies inside the reservation just made,
        // which nothing else uses; MAP_FIXED replaces that part of it.
        let mapped =
            unsafe { rustix::mm::mmap(at.cast(), len, prot, flags | MapFlags::FIXED, fd, 0) };
        if let Err(e) = mapped {
            // SAFETY: the whole reservation is this function's: unmapping
            // it (or what a failed MAP_FIXED left of it) touches nothing else.
            let _ = unsafe { rustix::mm::munmap(base, span) };
            return Err(e);
        }
        if head > 0 {
            // SAFETY: the slack before `at` is part of the reservation,
            // which nothing else uses.
            let _ = unsafe { rustix::mm::munmap(base, head) };
        }
        // SAFETY: the slack after `at + len` is the rest of the reservation.
        let _ = unsafe { rustix::mm::munmap(at.wrapping_add(len).cast(), span - head - len) };
        let ptr = NonNull::new(at).ok_or(rustix::io::Errno::NOMEM)?;
        Ok(Mapping {
            ptr,
            len,
            writable: prot.contains(ProtFlags::WRITE),
            huge: None,
        })
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// True for a mapping made writable.
    pub(super) fn writable(&self) -> bool {
        self.writable
    }

    /// The address `offset` bytes into the mapping. Computing it is safe;
    /// callers check bounds before dereferencing it.
    #[inline]
    fn at(&self, offset: usize) -> *mut u8 {
        self.ptr.as_ptr().wrapping_add(offset)
    }

    /// The address of the mapping, for identification only (diagnostics,
    /// tests that play a stray write); it is never dereferenced outside
    /// this module.
    pub(super) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Checks that `[offset, offset + len)` lies inside the mapping and
    /// returns the offset as a `usize`.
    #[inline]
    pub(super) fn check(&self, offset: u64, len: usize) -> Result<usize> {
        let out = || Error::OutOfBounds {
            offset,
            len: len as u64,
            size: self.len as u64,
        };
        let start = usize::try_from(offset).map_err(|_| out())?;
        let end = start.checked_add(len).ok_or_else(out)?;
        if end > self.len {
            return Err(out());
        }
        Ok(start)
    }

    #[inline]
    fn check_atomic(&self, offset: u64) -> Result<usize> {
        if !offset.is_multiple_of(8) {
            return Err(Error::Misaligned { offset, align: 8 });
        }
        self.check(offset, 8)
    }

    /// Copies `buf.len()` bytes at `offset` out of the mapping.
    #[inline]
    pub(super) fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let start = self.check(offset, buf.len())?;
        // SAFETY: `check` proved `[start, start + len)` is inside the live
        // mapping; `buf` is a distinct local buffer. Concurrent writers of the
        // same bytes (Kfs) make the copied value possibly stale, never unsound
        // to hold as plain bytes; readers that need consistency validate it.
        unsafe { cpu::copy_out(buf.as_mut_ptr(), self.at(start), buf.len()) };
        Ok(())
    }

    /// The address of the checked range `[offset, offset + len)`, for a
    /// copy out of it made inside this module (see
    /// [`Media::copy_in_nt_from`]).
    #[inline]
    pub(super) fn range_ptr(&self, offset: u64, len: usize) -> Result<*const u8> {
        let start = self.check(offset, len)?;
        Ok(self.at(start).cast_const())
    }

    /// Atomically loads the 8-byte word at `offset`.
    #[inline]
    pub(super) fn load_u64(&self, offset: u64, order: Ordering) -> Result<u64> {
        Ok(self.word64(offset)?.load(order))
    }

    /// The atomic 8-byte word at a checked, aligned `offset`.
    #[inline]
    fn word64(&self, offset: u64) -> Result<&AtomicU64> {
        let start = self.check_atomic(offset)?;
        // SAFETY: in bounds and 8-byte aligned (checked; the mapping is
        // page-aligned); the reference lives no longer than `&self`, which
        // keeps the mapping alive; every access to such words is atomic.
        Ok(unsafe { AtomicU64::from_ptr(self.at(start) as *mut u64) })
    }

    /// The `n` atomic 8-byte words from a checked, aligned `offset`, for
    /// storing into (writable mappings only).
    #[inline]
    pub(super) fn words64(&self, offset: u64, n: usize) -> Result<&[AtomicU64]> {
        self.writable_or_err(offset)?;
        if !offset.is_multiple_of(8) {
            return Err(Error::Misaligned { offset, align: 8 });
        }
        let len = n.checked_mul(8).ok_or(Error::OutOfBounds {
            offset,
            len: u64::MAX,
            size: self.len as u64,
        })?;
        let start = self.check(offset, len)?;
        // SAFETY: in bounds and 8-byte aligned (checked; the mapping is
        // page-aligned); the slice lives no longer than `&self`, which keeps
        // the mapping alive; every access to these bytes is atomic (some as
        // 4-byte halves, from the one writer, as `word32` gives them).
        Ok(unsafe { std::slice::from_raw_parts(self.at(start) as *const AtomicU64, n) })
    }

    /// The atomic 4-byte word at a checked, aligned `offset`.
    #[inline]
    fn word32(&self, offset: u64) -> Result<&AtomicU32> {
        if !offset.is_multiple_of(4) {
            return Err(Error::Misaligned { offset, align: 4 });
        }
        let start = self.check(offset, 4)?;
        // SAFETY: as in `word64`, for a 4-byte aligned word.
        Ok(unsafe { AtomicU32::from_ptr(self.at(start) as *mut u32) })
    }

    #[inline]
    fn writable_or_err(&self, offset: u64) -> Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(Error::ReadOnly { offset })
        }
    }

    /// Asks the CPU to start loading the cache line at `offset` (a hint;
    /// nothing happens for an offset outside the mapping).
    #[inline]
    pub(super) fn prefetch(&self, offset: u64) {
        if let Ok(start) = self.check(offset, 1) {
            // SAFETY: PREFETCHT0 never faults and changes no memory; the
            // address is inside the live mapping anyway.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    self.at(start) as *const i8,
                )
            };
        }
    }

    /// Asks the CPU to start loading the cache lines of `[offset, offset +
    /// len)` (a hint; nothing happens for a range not inside the mapping).
    #[inline]
    pub(super) fn prefetch_range(&self, offset: u64, len: usize) {
        if let Ok(start) = self.check(offset, len) {
            let p = self.at(start);
            for l in (0..len).step_by(64) {
                // SAFETY: PREFETCHT0 never faults and changes no memory; the
                // address is inside the live mapping anyway.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        p.wrapping_add(l) as *const i8,
                    )
                };
            }
        }
    }

    /// Maps and allocates the pages of `[offset, offset + len)` writable
    /// now, in one call, instead of one page fault per page on first touch
    /// (`MADV_POPULATE_WRITE`). Only a hint: kernels without it, and pages
    /// not writable now (in a read-only mapping, or a view's pages not
    /// made writable), are left to fault as usual.
    pub(super) fn populate(&self, offset: u64, len: u64) {
        let Ok(n) = usize::try_from(len) else { return };
        let Ok(start) = self.check(offset, n) else {
            return;
        };
        if n == 0 {
            return;
        }
        // Whole pages: the mapping is page-aligned, so align the range.
        let first = start & !4095;
        let end = (start + n).next_multiple_of(4096).min(self.len);
        // SAFETY: `[first, end)` lies inside this live mapping; populating
        // pages changes no memory contents (new pages read as zeros, as
        // they would at their first fault).
        let _ = unsafe {
            rustix::mm::madvise(
                self.at(first).cast(),
                end - first,
                rustix::mm::Advice::LinuxPopulateWrite,
            )
        };
    }

    /// Has the pages of `[offset, offset + len)` allocated and mapped by
    /// reading a byte of each through this mapping (a file on tmpfs, or a
    /// memfd, allocates and clears a page at its first fault, a read one
    /// included; on other file systems a read fault may only map a page,
    /// and its first store allocates it). Contents are unchanged. Each page
    /// faults alone, under this mapping's own lock, where
    /// [`Mapping::populate`] holds the process's memory-map lock over the
    /// whole range, which a protection change of any mapping of the
    /// process (a client's view, in the same process as Kfs) waits for.
    pub(super) fn touch(&self, offset: u64, len: u64) {
        let Ok(n) = usize::try_from(len) else { return };
        let Ok(start) = self.check(offset, n) else {
            return;
        };
        for at in (start & !4095..start + n).step_by(4096) {
            // SAFETY: `at` lies inside this live mapping (the range was
            // checked, and its first page starts at or after the
            // page-aligned mapping's start); a byte has no alignment. Other
            // threads and processes store to these bytes with plain and
            // non-temporal stores, as everywhere in a mapping of the
            // region; the value read is discarded, and on x86 such a load
            // beside those stores reads some byte and nothing else.
            unsafe { std::sync::atomic::AtomicU8::from_ptr(self.at(at)) }.load(Ordering::Relaxed);
        }
    }

    /// Asks the kernel to hold the [`HUGE_PAGE`] chunk at `offset` in one
    /// huge page now, and to map it so here (`MADV_COLLAPSE`). Contents
    /// are unchanged: the kernel copies what the chunk holds into its huge
    /// page and zeroes the rest, as holes read. The kernel's error if it
    /// would not (`EINVAL` too for a chunk not inside the mapping).
    pub(super) fn madvise_collapse(&self, offset: usize) -> std::io::Result<()> {
        let start = self
            .check(offset as u64, HUGE_PAGE)
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: the chunk lies inside this live mapping (checked);
        // collapsing changes which memory backs it, never what it holds.
        let r = unsafe { libc::madvise(self.at(start).cast(), HUGE_PAGE, MADV_COLLAPSE) };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Makes the whole mapping readable and writable in its page tables
    /// and tags its pages with protection key `key`, so that each thread's
    /// rights to the key decide what it may do (see [`super::keys`]).
    pub(super) fn assign_key(&self, key: u32) -> std::io::Result<()> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: the range is exactly this live mapping; the call changes
        // page-table entries, not memory contents, and no Rust reference
        // points into the mapping (all access is by copies and atomics).
        let r = unsafe {
            libc::syscall(
                libc::SYS_pkey_mprotect,
                self.at(0),
                self.len,
                prot,
                // A protection key is below 16 (see `keys::process_key`).
                key.cast_signed(),
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Changes the protection of the whole pages `[offset, offset + len)`
    /// (page-aligned) to read-write or read-only; an error names `path`,
    /// the file mapped.
    pub(super) fn protect(
        &self,
        offset: u64,
        len: u64,
        writable: bool,
        path: &std::path::Path,
    ) -> Result<()> {
        let n = usize::try_from(len).map_err(|_| Error::Misaligned {
            offset,
            align: 4096,
        })?;
        let start = self.check(offset, n)?;
        if start % 4096 != 0 || n % 4096 != 0 {
            return Err(Error::Misaligned {
                offset,
                align: 4096,
            });
        }
        if n == 0 {
            return Ok(());
        }
        let prot = if writable {
            rustix::mm::MprotectFlags::READ | rustix::mm::MprotectFlags::WRITE
        } else {
            rustix::mm::MprotectFlags::READ
        };
        // SAFETY: `[start, start + n)` is whole pages inside this live
        // mapping (checked above); changing their protection changes no
        // memory contents and no Rust reference points into them (all
        // access is by copies and atomics).
        unsafe { rustix::mm::mprotect(self.at(start).cast(), n, prot) }.map_err(|e| Error::Io {
            action: "change the protection of",
            path: path.into(),
            cause: e.into(),
        })
    }

    /// Non-temporal copy of `data` to `offset`, persistent after the next
    /// fence, into pages that must have been made writable with
    /// [`Mapping::protect`] (a store into a read-only page faults: that is
    /// the protection working).
    pub(super) fn copy_in_nt(&self, offset: u64, data: &[u8], flush: FlushInstr) -> Result<()> {
        let start = self.check(offset, data.len())?;
        // SAFETY: bounds checked; `data` is a distinct local buffer. The
        // destination pages belong to the caller's pool: no one else writes
        // them, and readers reach them only after the commit that follows
        // the fence. If they are read-only the store faults, which is sound.
        unsafe { cpu::copy_nt(self.at(start), data.as_ptr(), data.len(), flush) };
        Ok(())
    }

    /// Compares the `other.len()` bytes at `offset` with `other`,
    /// lexicographically, without copying them out.
    #[inline]
    pub(super) fn cmp_bytes(&self, offset: u64, other: &[u8]) -> Result<std::cmp::Ordering> {
        let start = self.check(offset, other.len())?;
        let p = self.at(start);
        let n = other.len();
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `[start + i, start + i + 8)` is inside the checked
            // range; an unaligned read of plain bytes has no other
            // requirement.
            let a = unsafe { (p.wrapping_add(i) as *const u64).read_unaligned() };
            let mut w = [0u8; 8];
            w.copy_from_slice(&other[i..i + 8]);
            let b = u64::from_ne_bytes(w);
            if a != b {
                // Big-endian order compares like the bytes do.
                return Ok(a.swap_bytes().cmp(&b.swap_bytes()));
            }
            i += 8;
        }
        while i < n {
            // SAFETY: inside the checked range.
            let a = unsafe { p.wrapping_add(i).read() };
            if a != other[i] {
                return Ok(a.cmp(&other[i]));
            }
            i += 1;
        }
        Ok(std::cmp::Ordering::Equal)
    }

    /// Atomically loads the 4-byte word at `offset`.
    #[inline]
    pub(super) fn load_u32(&self, offset: u64, order: Ordering) -> Result<u32> {
        Ok(self.word32(offset)?.load(order))
    }

    /// Atomic store of the 8-byte word at `offset` (writable mappings only).
    #[inline]
    pub(super) fn store_u64(&self, offset: u64, value: u64, order: Ordering) -> Result<()> {
        self.writable_or_err(offset)?;
        self.word64(offset)?.store(value, order);
        Ok(())
    }

    /// Atomic store of the 4-byte word at `offset` (writable mappings only).
    #[inline]
    pub(super) fn store_u32(&self, offset: u64, value: u32, order: Ordering) -> Result<()> {
        self.writable_or_err(offset)?;
        self.word32(offset)?.store(value, order);
        Ok(())
    }

    /// Atomic read-modify-write of the 8-byte word at `offset`.
    pub(super) fn update_u64(
        &self,
        offset: u64,
        op: WordOp,
        value: u64,
        order: Ordering,
    ) -> Result<u64> {
        self.writable_or_err(offset)?;
        let w = self.word64(offset)?;
        Ok(match op {
            WordOp::Add => w.fetch_add(value, order),
            WordOp::Or => w.fetch_or(value, order),
            WordOp::And => w.fetch_and(value, order),
            WordOp::Swap => w.swap(value, order),
        })
    }

    /// Copies `data` into the mapping at `offset` (writable mappings only).
    #[inline]
    pub(super) fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.writable_or_err(offset)?;
        let start = self.check(offset, data.len())?;
        // SAFETY: in bounds (checked), writable (checked), `data` distinct.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.at(start), data.len()) };
        Ok(())
    }

    /// Sleeps while the 4-byte word at `offset` holds `expected`, at most
    /// `timeout`. The futex is shared (not private), so a waker in another
    /// process that maps the same memory wakes it.
    pub(super) fn futex_wait(
        &self,
        offset: u64,
        expected: u32,
        timeout: Option<std::time::Duration>,
    ) -> Result<()> {
        use rustix::thread::futex;
        let w = self.word32(offset)?;
        let ts = timeout.map(|d| rustix::time::Timespec {
            // Past `i64::MAX` seconds (some 292 billion years) the wait
            // is as good as unbounded.
            tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(d.subsec_nanos()),
        });
        // Waking early, on a changed value or a timeout are all normal
        // outcomes: the caller re-checks its condition.
        let _ = futex::wait(w, futex::Flags::empty(), expected, ts.as_ref());
        Ok(())
    }

    /// Wakes up to `n` sleepers on the word at `offset`.
    pub(super) fn futex_wake(&self, offset: u64, n: u32) -> Result<()> {
        use rustix::thread::futex;
        let w = self.word32(offset)?;
        let _ = futex::wake(w, futex::Flags::empty(), n);
        Ok(())
    }

    /// The writable view of this mapping, or `None` for a read-only one.
    pub(super) fn media(&self) -> Option<Media<'_>> {
        self.writable.then_some(Media {
            ptr: self.ptr,
            len: self.len,
            _mapping: PhantomData,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe a mapping this value owns (from_raw's
        // contract), and no reference into it can outlive `self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A bounds-checked, writable view of a mapped region: what a [`Persist`]
/// backend stores into, flushes, and (for the recorder) reads back.
///
/// [`Persist`]: super::Persist
#[derive(Debug, Clone, Copy)]
pub struct Media<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _mapping: PhantomData<&'a Mapping>,
}

impl Media<'_> {
    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The address `offset` bytes into the mapping. Computing it is safe;
    /// callers check bounds before dereferencing it.
    fn at(&self, offset: usize) -> *mut u8 {
        self.ptr.as_ptr().wrapping_add(offset)
    }

    /// True for an empty mapping (never the case for a region).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Checks that `[offset, offset + len)` lies inside the mapping.
    pub fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::OutOfBounds {
                offset: offset as u64,
                len: len as u64,
                size: self.len as u64,
            }),
        }
    }

    /// Copies `buf.len()` bytes at `offset` out of the mapping.
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len())?;
        // SAFETY: bounds checked above; `buf` is distinct from the mapping.
        unsafe { std::ptr::copy_nonoverlapping(self.at(offset), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// Ordinary (cached) store of `data` at `offset`.
    pub fn copy_in(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        // SAFETY: bounds checked above; the mapping is writable (only writable
        // mappings hand out a Media) and `data` is distinct from it.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.at(offset), data.len()) };
        Ok(())
    }

    /// Non-temporal store of `data` at `offset`: persistent after the next
    /// fence, without further flushes.
    pub fn copy_in_nt(&self, offset: usize, data: &[u8], flush: FlushInstr) -> Result<()> {
        self.check(offset, data.len())?;
        // SAFETY: bounds checked above; writable mapping; `data` is distinct.
        unsafe { cpu::copy_nt(self.at(offset), data.as_ptr(), data.len(), flush) };
        Ok(())
    }

    /// Non-temporal store at `offset` of the `len` bytes at `src`, read
    /// once each, straight into the media: persistent after the next
    /// fence, without further flushes.
    ///
    /// # Safety
    ///
    /// `src` must be valid for reads of `len` bytes for the whole call,
    /// outside this mapping. Another process may store to those bytes
    /// meanwhile: the copy then holds some mix of old and new bytes, which
    /// is sound to hold as plain bytes.
    pub(super) unsafe fn copy_in_nt_from(
        &self,
        offset: usize,
        src: *const u8,
        len: usize,
        flush: FlushInstr,
    ) -> Result<()> {
        self.check(offset, len)?;
        // SAFETY: bounds checked above; writable mapping (only writable
        // mappings hand out a Media); `src` readable for `len` bytes and
        // outside this mapping (the caller's contract), so no overlap.
        unsafe { cpu::copy_nt(self.at(offset), src, len, flush) };
        Ok(())
    }

    /// Sets `len` bytes at `offset` to `byte` with ordinary stores.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<()> {
        self.check(offset, len)?;
        // SAFETY: bounds checked above; writable mapping.
        unsafe { std::ptr::write_bytes(self.at(offset), byte, len) };
        Ok(())
    }

    /// Atomic 8-byte store at an 8-aligned `offset`.
    pub fn store_u64(&self, offset: usize, value: u64, order: Ordering) -> Result<()> {
        if !offset.is_multiple_of(8) {
            return Err(Error::Misaligned {
                offset: offset as u64,
                align: 8,
            });
        }
        self.check(offset, 8)?;
        // SAFETY: in bounds, aligned (the mapping is page-aligned), writable,
        // and every access to such words goes through atomics.
        let word = unsafe { AtomicU64::from_ptr(self.at(offset) as *mut u64) };
        word.store(value, order);
        Ok(())
    }

    /// Writes back every cache line overlapping `[offset, offset + len)`.
    pub fn flush(&self, offset: usize, len: usize, instr: FlushInstr) -> Result<()> {
        self.check(offset, len)?;
        // SAFETY: the range is inside the live mapping (checked above).
        unsafe { instr.flush(self.at(offset), len) };
        Ok(())
    }
}
