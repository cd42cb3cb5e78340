//! Shared memory in DRAM: a memfd that one side maps read-write and others
//! map read-only (the index) or read-write (a client's request segment).
//!
//! A [`Shm`] reserves a large virtual range up front (`MAP_NORESERVE`) and
//! grows the memfd inside it, so offsets handed out never move and every
//! mapping of the same memfd sees the growth without remapping.

use std::fmt;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustix::fs::{ftruncate, memfd_create, MemfdFlags};
use rustix::mm::{MapFlags, ProtFlags};

use super::mapping::{on_tmpfs, Mapping, Placement, WordOp};
use crate::{Error, Result};

/// Read access to shared words, as the index readers need it: loads that
/// never fault and never panic. An offset outside the memory, or misaligned,
/// reads as zero, which every structure treats as "null" or "no such item",
/// so a damaged offset ends a walk instead of crashing it.
pub trait Words {
    /// Loads the 8-byte word at `offset` (zero if out of range).
    fn load_u64(&self, offset: u64, order: Ordering) -> u64;
    /// Loads the 4-byte word at `offset` (zero if out of range).
    fn load_u32(&self, offset: u64, order: Ordering) -> u32;
    /// Copies bytes out; false (and `buf` untouched) if out of range.
    fn read(&self, offset: u64, buf: &mut [u8]) -> bool;
    /// Compares the bytes at `offset` with `other` (`None` if out of range).
    fn cmp_bytes(&self, offset: u64, other: &[u8]) -> Option<std::cmp::Ordering>;
    /// Starts loading the cache line at `offset` (a hint).
    fn prefetch(&self, offset: u64);
}

/// The owner of a shared segment: maps it read-write and may grow it.
pub struct Shm {
    name: String,
    fd: OwnedFd,
    map: Mapping,
    /// Current size of the memfd; accesses are checked against it.
    len: AtomicU64,
    reserve: u64,
}

impl fmt::Debug for Shm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shm")
            .field("name", &self.name)
            .field("len", &self.len())
            .field("reserve", &self.reserve)
            .finish()
    }
}

/// A new open file description of what `fd` names, read-only (through
/// `/proc/self/fd`, which opens the file itself, not a copy of `fd`'s
/// description): a descriptor to hand another process that can map it
/// for reading only.
pub(super) fn reopen_read_only(fd: BorrowedFd<'_>) -> rustix::io::Result<OwnedFd> {
    let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
    rustix::fs::open(
        path.as_str(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
}

/// A new read-write descriptor of the file `fd` refers to (through
/// `/proc/self/fd`, as [`reopen_read_only`]): a description of its own,
/// which shares no lock with `fd`'s.
pub(super) fn reopen_read_write(fd: BorrowedFd<'_>) -> rustix::io::Result<OwnedFd> {
    let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
    rustix::fs::open(
        path.as_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
}

fn map_fd(fd: BorrowedFd<'_>, name: &str, len: u64, writable: bool) -> Result<Mapping> {
    let bad = |why: String| Error::Unusable {
        path: name.into(),
        why,
    };
    let n = usize::try_from(len).map_err(|_| bad(format!("{len} bytes do not fit")))?;
    let prot = if writable {
        ProtFlags::READ | ProtFlags::WRITE
    } else {
        ProtFlags::READ
    };
    let mut map = Mapping::map_placed(
        fd,
        n,
        prot,
        MapFlags::SHARED | MapFlags::NORESERVE,
        Placement::Huge,
    )
    .map_err(|e| Error::io("map shared memory", name, e.into()))?;
    if writable && on_tmpfs(fd) {
        map.allow_huge();
    }
    Ok(map)
}

impl Shm {
    /// A new memfd named `name` (for /proc/PID/maps), `len` bytes long,
    /// mapped read-write over a reserved range of `reserve` bytes.
    pub fn create(name: &str, len: u64, reserve: u64) -> Result<Shm> {
        // Sealing allowed, so that memory another process is handed can
        // have its size fixed (`Shm::seal_size`).
        let fd = memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(|e| Error::io("create shared memory", name, e.into()))?;
        ftruncate(&fd, len).map_err(|e| Error::io("size shared memory", name, e.into()))?;
        let map = map_fd(fd.as_fd(), name, reserve.max(len), true)?;
        Ok(Shm {
            name: name.into(),
            fd,
            map,
            len: AtomicU64::new(len),
            reserve: reserve.max(len),
        })
    }

    /// Another read-write mapping of the same memory (the other side of a
    /// request segment).
    pub fn map_again(&self) -> Result<Shm> {
        let fd = self
            .fd
            .try_clone()
            .map_err(|e| Error::io("duplicate shared memory", &self.name, e))?;
        let map = map_fd(fd.as_fd(), &self.name, self.reserve, true)?;
        Ok(Shm {
            name: self.name.clone(),
            fd,
            map,
            len: AtomicU64::new(self.len()),
            reserve: self.reserve,
        })
    }

    /// The same memory as another process maps it (through a descriptor
    /// it was handed): read-write, `fd`'s whole current size, which it
    /// keeps (a request segment or a doorbell, which never grow).
    pub fn from_fd(fd: OwnedFd, name: &str) -> Result<Shm> {
        let len = rustix::fs::fstat(&fd)
            .map_err(|e| Error::io("inspect shared memory", name, e.into()))?
            .st_size;
        let len = u64::try_from(len).map_err(|_| Error::Unusable {
            path: name.into(),
            why: format!("a size of {len} bytes"),
        })?;
        if len == 0 {
            return Err(Error::Unusable {
                path: name.into(),
                why: "it is empty".into(),
            });
        }
        let map = map_fd(fd.as_fd(), name, len, true)?;
        Ok(Shm {
            name: name.into(),
            fd,
            map,
            len: AtomicU64::new(len),
            reserve: len,
        })
    }

    /// Fixes the memory's size for good: seals against shrinking, growing
    /// and any further seal. A process handed the (read-write) descriptor
    /// then cannot truncate the memory under another process's mapping,
    /// whose loads past the new end would fault (`SIGBUS`), nor seal it
    /// against the other's writes.
    pub fn seal_size(&self) -> Result<()> {
        use rustix::fs::SealFlags;
        rustix::fs::fcntl_add_seals(
            &self.fd,
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
        )
        .map_err(|e| Error::io("seal the size of shared memory", &self.name, e.into()))
    }

    /// The memory's descriptor, to hand to another process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A new descriptor of the memory opened read-only: one another
    /// process can map for reading only (`mmap` with `PROT_WRITE`, and
    /// `mprotect` adding it to a shared mapping, fail with `EACCES`), and
    /// cannot resize.
    pub fn read_only_fd(&self) -> Result<OwnedFd> {
        reopen_read_only(self.fd.as_fd())
            .map_err(|e| Error::io("reopen shared memory read-only", &self.name, e.into()))
    }

    /// A read-only mapping of the same memory, as a client maps the index.
    pub fn view(&self) -> Result<ShmView> {
        Ok(ShmView {
            map: map_fd(self.fd.as_fd(), &self.name, self.reserve, false)?,
        })
    }

    /// Lets [`Shm::populate`] make the memory huge pages (2 MiB each, one
    /// TLB entry for what takes 512 small pages); false if it cannot.
    pub fn enable_huge_pages(&self) -> bool {
        self.map.enable_huge()
    }

    /// Asks the kernel again for one chunk it would not make huge for a
    /// reason of the moment, as [`Region::retry_huge`](super::Region::retry_huge)
    /// does.
    pub fn retry_huge(&self) -> Option<bool> {
        self.map.retry_huge()
    }

    /// True if some chunk waits for [`Shm::retry_huge`].
    pub fn huge_retry_due(&self) -> bool {
        self.map.huge_retry_due()
    }

    /// How many bytes of the segment were made huge pages.
    pub fn huge_bytes(&self) -> u64 {
        self.map.huge_bytes()
    }

    /// Current size in bytes.
    #[inline]
    pub fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    /// True if the segment has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The reserved size: the segment can grow up to it.
    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    /// Grows the segment to `new_len` bytes (never shrinks).
    pub fn grow(&self, new_len: u64) -> Result<()> {
        if new_len <= self.len() {
            return Ok(());
        }
        if new_len > self.reserve {
            return Err(Error::OutOfBounds {
                offset: 0,
                len: new_len,
                size: self.reserve,
            });
        }
        ftruncate(&self.fd, new_len)
            .map_err(|e| Error::io("grow shared memory", &self.name, e.into()))?;
        // Release: pairs with the Acquire in `len()` of any thread that then
        // checks an offset against the new size.
        self.len.store(new_len, Ordering::Release);
        Ok(())
    }

    #[inline]
    fn check(&self, offset: u64, n: u64) -> Result<()> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(Error::OutOfBounds {
                offset,
                len: n,
                size: self.len(),
            }),
        }
    }

    /// Loads the 8-byte word at `offset`.
    #[inline]
    pub fn try_load_u64(&self, offset: u64, order: Ordering) -> Result<u64> {
        self.check(offset, 8)?;
        self.map.load_u64(offset, order)
    }

    /// Loads the 4-byte word at `offset`.
    #[inline]
    pub fn try_load_u32(&self, offset: u64, order: Ordering) -> Result<u32> {
        self.check(offset, 4)?;
        self.map.load_u32(offset, order)
    }

    /// Copies bytes out of the segment.
    #[inline]
    pub fn try_read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.map.read(offset, buf)
    }

    /// The address of `[offset, offset + len)`, checked against the
    /// current size, for a copy out of it made inside this module (see
    /// [`Persist::store_nt_from`](super::Persist::store_nt_from)).
    #[inline]
    pub(super) fn range_ptr(&self, offset: u64, len: usize) -> Result<*const u8> {
        self.check(offset, len as u64)?;
        self.map.range_ptr(offset, len)
    }

    /// Allocates and maps the pages of a range now rather than at their
    /// first touch; with huge pages enabled, makes the 2 MiB chunks around
    /// it huge pages instead (see [`Region::prefault`](super::Region::prefault)).
    pub fn populate(&self, offset: u64, len: u64) {
        let end = offset.saturating_add(len).min(self.len());
        if end > offset {
            self.map.provision(offset, end - offset, self.len());
        }
    }

    /// Stores the 8-byte word at `offset`.
    #[inline]
    pub fn store_u64(&self, offset: u64, value: u64, order: Ordering) -> Result<()> {
        self.check(offset, 8)?;
        self.map.store_u64(offset, value, order)
    }

    /// The `n` 8-byte words from the aligned `offset`, checked once, for a
    /// run of stores into one item.
    #[inline]
    pub fn words(&self, offset: u64, n: usize) -> Result<&[std::sync::atomic::AtomicU64]> {
        self.check(offset, (n as u64).saturating_mul(8))?;
        self.map.words64(offset, n)
    }

    /// Stores the 4-byte word at `offset`.
    pub fn store_u32(&self, offset: u64, value: u32, order: Ordering) -> Result<()> {
        self.check(offset, 4)?;
        self.map.store_u32(offset, value, order)
    }

    /// `fetch_add` on the 8-byte word at `offset`; returns the old value.
    pub fn fetch_add_u64(&self, offset: u64, v: u64, order: Ordering) -> Result<u64> {
        self.check(offset, 8)?;
        self.map.update_u64(offset, WordOp::Add, v, order)
    }

    /// `fetch_or` on the 8-byte word at `offset`; returns the old value.
    pub fn fetch_or_u64(&self, offset: u64, v: u64, order: Ordering) -> Result<u64> {
        self.check(offset, 8)?;
        self.map.update_u64(offset, WordOp::Or, v, order)
    }

    /// `fetch_and` on the 8-byte word at `offset`; returns the old value.
    pub fn fetch_and_u64(&self, offset: u64, v: u64, order: Ordering) -> Result<u64> {
        self.check(offset, 8)?;
        self.map.update_u64(offset, WordOp::And, v, order)
    }

    /// `swap` on the 8-byte word at `offset`; returns the old value.
    pub fn swap_u64(&self, offset: u64, v: u64, order: Ordering) -> Result<u64> {
        self.check(offset, 8)?;
        self.map.update_u64(offset, WordOp::Swap, v, order)
    }

    /// Copies `data` into the segment at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check(offset, data.len() as u64)?;
        self.map.write(offset, data)
    }

    /// Sleeps while the 4-byte word at `offset` equals `expected` (shared
    /// futex), for at most `timeout`.
    pub fn futex_wait(&self, offset: u64, expected: u32, timeout: Option<Duration>) -> Result<()> {
        self.check(offset, 4)?;
        self.map.futex_wait(offset, expected, timeout)
    }

    /// Wakes up to `n` sleepers on the word at `offset`.
    pub fn futex_wake(&self, offset: u64, n: u32) -> Result<()> {
        self.check(offset, 4)?;
        self.map.futex_wake(offset, n)
    }
}

impl Words for Shm {
    #[inline]
    fn load_u64(&self, offset: u64, order: Ordering) -> u64 {
        self.try_load_u64(offset, order).unwrap_or(0)
    }
    #[inline]
    fn load_u32(&self, offset: u64, order: Ordering) -> u32 {
        self.try_load_u32(offset, order).unwrap_or(0)
    }
    #[inline]
    fn read(&self, offset: u64, buf: &mut [u8]) -> bool {
        self.try_read(offset, buf).is_ok()
    }
    #[inline]
    fn cmp_bytes(&self, offset: u64, other: &[u8]) -> Option<std::cmp::Ordering> {
        self.check(offset, other.len() as u64).ok()?;
        self.map.cmp_bytes(offset, other).ok()
    }
    #[inline]
    fn prefetch(&self, offset: u64) {
        if offset < self.len() {
            self.map.prefetch(offset);
        }
    }
}

/// A read-only mapping of a shared segment. Its reads are checked against
/// the reserved range only: the owner publishes offsets only after growing
/// the memory behind them, and a reader only follows published offsets.
#[derive(Debug)]
pub struct ShmView {
    map: Mapping,
}

impl ShmView {
    /// A read-only mapping of `reserve` bytes of the memory behind `fd`
    /// (as another process was handed it), which may grow up to that.
    pub fn from_fd(fd: OwnedFd, name: &str, reserve: u64) -> Result<ShmView> {
        Ok(ShmView {
            map: map_fd(fd.as_fd(), name, reserve, false)?,
        })
    }
}

impl Words for ShmView {
    #[inline]
    fn load_u64(&self, offset: u64, order: Ordering) -> u64 {
        self.map.load_u64(offset, order).unwrap_or(0)
    }
    #[inline]
    fn load_u32(&self, offset: u64, order: Ordering) -> u32 {
        self.map.load_u32(offset, order).unwrap_or(0)
    }
    #[inline]
    fn read(&self, offset: u64, buf: &mut [u8]) -> bool {
        self.map.read(offset, buf).is_ok()
    }
    #[inline]
    fn cmp_bytes(&self, offset: u64, other: &[u8]) -> Option<std::cmp::Ordering> {
        self.map.cmp_bytes(offset, other).ok()
    }
    #[inline]
    fn prefetch(&self, offset: u64) {
        self.map.prefetch(offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_sees_growth_and_stores_without_remapping() {
        let shm = Shm::create("kucofs-test", 4096, 1 << 30).unwrap();
        let view = shm.view().unwrap();
        shm.store_u64(8, 77, Ordering::Release).unwrap();
        assert_eq!(view.load_u64(8, Ordering::Acquire), 77);
        // Beyond the current size: the owner refuses, the view reads zero
        // only for out-of-reserve offsets (it must not be asked for others).
        assert!(shm.store_u64(8192, 1, Ordering::Relaxed).is_err());
        shm.grow(1 << 20).unwrap();
        shm.store_u64(8192, 5, Ordering::Release).unwrap();
        assert_eq!(view.load_u64(8192, Ordering::Acquire), 5);
        assert_eq!(view.load_u64(1 << 40, Ordering::Acquire), 0);
        assert_eq!(
            view.load_u64(3, Ordering::Acquire),
            0,
            "misaligned reads as zero"
        );
        assert!(shm.grow(2 << 30).is_err());
    }

    #[test]
    fn a_second_writable_mapping_shares_the_words() {
        let a = Shm::create("kucofs-test", 4096, 4096).unwrap();
        let b = a.map_again().unwrap();
        a.fetch_or_u64(0, 0b101, Ordering::AcqRel).unwrap();
        assert_eq!(b.fetch_and_u64(0, !0b1, Ordering::AcqRel).unwrap(), 0b101);
        assert_eq!(a.try_load_u64(0, Ordering::Acquire).unwrap(), 0b100);
        b.write(100, b"abc").unwrap();
        let mut buf = [0u8; 3];
        a.try_read(100, &mut buf).unwrap();
        assert_eq!(&buf, b"abc");
    }

    #[test]
    fn futex_wakes_a_sleeper_in_another_thread() {
        let a = Shm::create("kucofs-test", 4096, 4096).unwrap();
        let b = a.map_again().unwrap();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                while b.try_load_u32(64, Ordering::Acquire).unwrap() == 0 {
                    b.futex_wait(64, 0, Some(Duration::from_secs(5))).unwrap();
                }
            });
            std::thread::sleep(Duration::from_millis(20));
            a.store_u32(64, 1, Ordering::Release).unwrap();
            a.futex_wake(64, 1).unwrap();
            waiter.join().unwrap();
        });
    }
}
