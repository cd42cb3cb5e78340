//! The persistence backend: every store that must survive a crash, every
//! flush and every fence goes through [`Persist`], so that tests can replace
//! the hardware with a [`Recorder`](super::Recorder) that keeps the image the
//! media would hold after a crash.

use std::fmt;
use std::sync::atomic::Ordering;

use super::cpu::{self, FlushInstr};
use super::mapping::Media;
use super::shm::Shm;
use crate::Result;

/// How stores into a region are made and made persistent.
///
/// The contract (x86 with ADR): a cached store ([`store`](Persist::store),
/// [`store_u64`](Persist::store_u64), [`fill`](Persist::fill)) is persistent
/// once its cache line was [`flush`](Persist::flush)ed and a
/// [`fence`](Persist::fence) followed; a non-temporal store
/// ([`store_nt`](Persist::store_nt)) once a fence followed. Until then it may
/// or may not survive a crash.
pub trait Persist: Send + Sync + fmt::Debug {
    /// A short name for reports ("clwb", "recorder").
    fn name(&self) -> String;
    /// A region was mapped: its current contents are what the media holds.
    fn attach(&self, _media: Media<'_>) {}
    /// Ordinary store of `data` at `offset`.
    fn store(&self, media: Media<'_>, offset: usize, data: &[u8]) -> Result<()>;
    /// Ordinary store of `len` copies of `byte` at `offset`.
    fn fill(&self, media: Media<'_>, offset: usize, len: usize, byte: u8) -> Result<()>;
    /// Atomic store of an aligned 8-byte word at `offset`.
    fn store_u64(&self, media: Media<'_>, offset: usize, value: u64, order: Ordering)
        -> Result<()>;
    /// Non-temporal store of `data` at `offset`.
    fn store_nt(&self, media: Media<'_>, offset: usize, data: &[u8]) -> Result<()>;
    /// Non-temporal store at `offset` of the `len` bytes at `src_offset`
    /// of `src`, shared memory another process may store to at any time
    /// (a daemon client's staging area): each source byte is read once,
    /// and only to be stored. This default goes through a small buffer on
    /// the stack and [`store_nt`](Persist::store_nt), so that a backend
    /// that records stores sees them as such; [`Hardware`] copies straight
    /// from the source into the media.
    fn store_nt_from(
        &self,
        media: Media<'_>,
        offset: usize,
        src: &Shm,
        src_offset: u64,
        len: usize,
    ) -> Result<()> {
        let mut chunk = [0u8; 512];
        let mut done = 0;
        while done < len {
            let k = (len - done).min(chunk.len());
            src.try_read(src_offset + done as u64, &mut chunk[..k])?;
            self.store_nt(media, offset + done, &chunk[..k])?;
            done += k;
        }
        Ok(())
    }
    /// Starts the write-back of the cache lines overlapping the range.
    fn flush(&self, media: Media<'_>, offset: usize, len: usize) -> Result<()>;
    /// Waits until every earlier flush and non-temporal store is persistent.
    fn fence(&self);
}

/// The real thing: CPU stores, the best flush instruction CPUID offers, and
/// `sfence`.
#[derive(Debug, Clone, Copy)]
pub struct Hardware {
    instr: FlushInstr,
}

impl Hardware {
    /// The backend with the flush instruction detected on this CPU.
    pub fn new() -> Hardware {
        Hardware {
            instr: FlushInstr::detect(),
        }
    }
}

impl Default for Hardware {
    fn default() -> Self {
        Hardware::new()
    }
}

impl Persist for Hardware {
    fn name(&self) -> String {
        self.instr.to_string()
    }

    fn store(&self, media: Media<'_>, offset: usize, data: &[u8]) -> Result<()> {
        media.copy_in(offset, data)
    }

    fn fill(&self, media: Media<'_>, offset: usize, len: usize, byte: u8) -> Result<()> {
        media.fill(offset, len, byte)
    }

    fn store_u64(
        &self,
        media: Media<'_>,
        offset: usize,
        value: u64,
        order: Ordering,
    ) -> Result<()> {
        media.store_u64(offset, value, order)
    }

    fn store_nt(&self, media: Media<'_>, offset: usize, data: &[u8]) -> Result<()> {
        media.copy_in_nt(offset, data, self.instr)
    }

    fn store_nt_from(
        &self,
        media: Media<'_>,
        offset: usize,
        src: &Shm,
        src_offset: u64,
        len: usize,
    ) -> Result<()> {
        let from = src.range_ptr(src_offset, len)?;
        // SAFETY: `from` is a checked range of `src`'s live mapping, which
        // the borrow of `src` keeps mapped for the call; `src` is shared
        // memory, never a mapping of a region, so it lies outside `media`.
        // Its owner's stores meanwhile leave some mix of bytes in the copy,
        // which the caller makes no decision on (see `Media::copy_in_nt_from`).
        unsafe { media.copy_in_nt_from(offset, from, len, self.instr) }
    }

    fn flush(&self, media: Media<'_>, offset: usize, len: usize) -> Result<()> {
        media.flush(offset, len, self.instr)
    }

    fn fence(&self) {
        cpu::sfence();
    }
}
