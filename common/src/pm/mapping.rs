//! One owned memory mapping, and [`Media`], the bounds-checked view of a
//! writable mapping that the persistence backends work on.
//!
//! This file holds the only raw pointers into mapped memory in the crate.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use super::cpu::{self, FlushInstr};
use crate::{Error, Result};

/// An owned `mmap` of an image; unmapped on drop.
#[derive(Debug)]
pub(super) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

// SAFETY: a Mapping is a plain range of process memory with no thread
// affinity; all access goes through the bounds-checked methods below, which
// are sound from any thread (shared memory is accessed by copies and atomics).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` exposes no `&`/`&mut` references into the
// memory, only copies and atomic operations.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Takes ownership of a mapping made by the region.
    ///
    /// # Safety
    ///
    /// `ptr` must be the start of a live `mmap` of exactly `len` bytes that
    /// nothing else unmaps, readable, and writable if `writable` is set.
    pub(super) unsafe fn from_raw(ptr: NonNull<u8>, len: usize, writable: bool) -> Mapping {
        Mapping { ptr, len, writable }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The address `offset` bytes into the mapping. Computing it is safe;
    /// callers check bounds before dereferencing it.
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

    fn check_atomic(&self, offset: u64) -> Result<usize> {
        if offset % 8 != 0 {
            return Err(Error::Misaligned { offset, align: 8 });
        }
        self.check(offset, 8)
    }

    /// Copies `buf.len()` bytes at `offset` out of the mapping.
    pub(super) fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let start = self.check(offset, buf.len())?;
        // SAFETY: `check` proved `[start, start + len)` is inside the live
        // mapping; `buf` is a distinct local buffer. Concurrent writers of the
        // same bytes (Kfs) make the copied value possibly stale, never unsound
        // to hold as plain bytes; readers that need consistency validate it.
        unsafe { std::ptr::copy_nonoverlapping(self.at(start), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// Atomically loads the 8-byte word at `offset`.
    pub(super) fn load_u64(&self, offset: u64, order: Ordering) -> Result<u64> {
        let start = self.check_atomic(offset)?;
        // SAFETY: in bounds and 8-byte aligned (checked; the mapping is
        // page-aligned), and every access to such words goes through atomics.
        let word = unsafe { AtomicU64::from_ptr(self.at(start) as *mut u64) };
        Ok(word.load(order))
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

    /// Sets `len` bytes at `offset` to `byte` with ordinary stores.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<()> {
        self.check(offset, len)?;
        // SAFETY: bounds checked above; writable mapping.
        unsafe { std::ptr::write_bytes(self.at(offset), byte, len) };
        Ok(())
    }

    /// Atomic 8-byte store at an 8-aligned `offset`.
    pub fn store_u64(&self, offset: usize, value: u64, order: Ordering) -> Result<()> {
        if offset % 8 != 0 {
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
