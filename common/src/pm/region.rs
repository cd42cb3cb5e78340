//! A region: the image file (or DAX device) mapped into memory, locked
//! against a second opener. Kfs holds the one writable [`Region`]; clients
//! and read-only tools hold a [`RegionView`].

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rustix::fs::{flock, FlockOperation};
use rustix::io::Errno;
use rustix::mm::{MapFlags, ProtFlags};

use super::keys;
use super::mapping::{on_tmpfs, Mapping, Media, Placement};
use super::persist::{Hardware, Persist};
use super::shm::Shm;
use crate::{Error, Result};

/// How the region is mapped, which decides what survives a power failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapMode {
    /// Persistent memory mapped with `MAP_SYNC`: flushed and fenced stores
    /// survive power loss.
    Dax,
    /// An ordinary file (e.g. under `/dev/shm`) standing in for persistent
    /// memory: the same code paths, but the bytes only survive what the
    /// backing file survives (a process crash, not a power loss on tmpfs).
    Emulated,
}

impl fmt::Display for MapMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MapMode::Dax => "DAX (MAP_SYNC)",
            MapMode::Emulated => "emulated (ordinary file mapping)",
        })
    }
}

/// How a new image file comes by its memory.
///
/// A region stands in for a device whose every byte is there from the
/// start. A sparse file on tmpfs is not: the kernel allocates and clears
/// each page at its first touch, on the path of whoever touches it, and a
/// touch of a page the file system holding the image has no room for
/// kills the toucher (`SIGBUS`) rather than failing. Memory allocated
/// with `fallocate` is still cleared at its first touch; on a virtual
/// machine, memory the guest never touched costs a trip to the host too,
/// many times what the write that touches it costs otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Space {
    /// All of it when the image is made (`fallocate`), and cleared then:
    /// making it fails with [`Error::NoSpace`] if the room is not there,
    /// and no write waits for memory later. The default.
    #[default]
    Reserved,
    /// As pages come into use: the data pages as Kfs grants them (which
    /// fails with `ENOSPC` where there is no room), the rest (superblocks,
    /// log, checkpoint slots, bitmap) when the image is made or opened.
    /// For an image much larger than what it will hold.
    Sparse,
}

/// The writable mapping of an image, held by Kfs. All stores go through its
/// [`Persist`] backend.
pub struct Region {
    path: PathBuf,
    /// Kept open: it holds the exclusive lock for the region's lifetime.
    file: File,
    map: Mapping,
    mode: MapMode,
    persist: Arc<dyn Persist>,
    /// Made by `create` from a truncated file: every byte reads as zero.
    zeroed: bool,
    /// Every page of the image has its memory (a device, or a file with
    /// all its blocks allocated when it was mapped).
    reserved: bool,
    /// `create` made the file: [`Region::discard`] removes it.
    created: bool,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("path", &self.path)
            .field("len", &self.map.len())
            .field("mode", &self.mode)
            .field("persist", &self.persist)
            .finish()
    }
}

impl Region {
    /// Creates an image of `size` bytes at `path` (a new file, or an existing
    /// one if `force`), locks and maps it. A block or DAX device must already
    /// be at least `size` bytes and is always reused: devices cannot be
    /// created, so `force` is implied for them.
    /// A new file's memory is reserved ([`Space::Reserved`]).
    pub fn create(path: &Path, size: u64, force: bool) -> Result<Region> {
        Region::create_with(
            path,
            size,
            force,
            Space::Reserved,
            Arc::new(Hardware::new()),
        )
    }

    /// [`Region::create`] with a chosen space (for a file; a device has all
    /// of its own) and persistence backend.
    pub fn create_with(
        path: &Path,
        size: u64,
        force: bool,
        space: Space,
        persist: Arc<dyn Persist>,
    ) -> Result<Region> {
        let exists = path.exists();
        let device = is_device(path);
        if exists && !force && !device {
            return Err(Error::Exists { path: path.into() });
        }
        let mut opts = OpenOptions::new();
        opts.read(true).write(true);
        if !exists {
            opts.create_new(true).mode(0o600);
        }
        let file = opts
            .open(path)
            .map_err(|e| Error::io("create image", path, e))?;
        lock(&file, path, FlockOperation::NonBlockingLockExclusive)?;
        let zeroed = !device;
        if device {
            let have = device_len(&file, path)?;
            if have < size {
                return Err(Error::Unusable {
                    path: path.into(),
                    why: format!("the device holds {have} bytes, fewer than the {size} asked for"),
                });
            }
        } else {
            // Truncating to zero first drops the old contents, so the new
            // image reads as zeros (and without its memory reserved, is
            // sparse).
            let made = file
                .set_len(0)
                .and_then(|()| file.set_len(size))
                .map_err(|e| Error::io("resize image", path, e))
                .and_then(|()| match space {
                    Space::Reserved => reserve(&file, path, 0, size),
                    Space::Sparse => Ok(()),
                });
            if let Err(e) = made {
                discard(&file, path, !exists);
                return Err(e);
            }
        }
        let mut region = Region::map(path, file, size, persist)?;
        region.zeroed = zeroed;
        region.created = !exists;
        if !device && space == Space::Reserved {
            // Reserved memory is cleared at its first fault: clear it now,
            // so that no first write pays for it (and, on a virtual
            // machine, for the host backing the memory it never touched).
            region.map.populate(0, size);
        }
        Ok(region)
    }

    /// Opens an existing image: exclusive lock, read-write mapping of its
    /// whole length.
    pub fn open(path: &Path) -> Result<Region> {
        Region::open_with(path, Arc::new(Hardware::new()))
    }

    /// [`Region::open`] with a chosen persistence backend.
    pub fn open_with(path: &Path, persist: Arc<dyn Persist>) -> Result<Region> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::io("open image", path, e))?;
        lock(&file, path, FlockOperation::NonBlockingLockExclusive)?;
        let len = image_len(&file, path)?;
        Region::map(path, file, len, persist)
    }

    fn map(path: &Path, file: File, len: u64, persist: Arc<dyn Persist>) -> Result<Region> {
        let (map, mode) = map_file(&file, path, len, true, Placement::Huge)?;
        let reserved = is_reserved(&file, len);
        let region = Region {
            path: path.into(),
            file,
            map,
            mode,
            persist,
            zeroed: false,
            reserved,
            created: false,
        };
        region.persist.attach(region.media());
        Ok(region)
    }

    fn media(&self) -> Media<'_> {
        // Regions are always mapped writable (`map` passes `true`).
        self.map
            .media()
            .expect("a Region's mapping is writable by construction")
    }

    /// The image's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True if the region was just created from a truncated file, so every
    /// byte reads as zero without being written (a reused device is not).
    pub fn is_fresh(&self) -> bool {
        self.zeroed
    }

    /// Undoes [`Region::create`] that failed further on, as making a file
    /// system: a file it made is removed, one it reused (`force`) emptied,
    /// so that no half-made image is left behind, nor the memory it took.
    pub fn discard(self) {
        if !is_device(&self.path) {
            discard(&self.file, &self.path, self.created);
        }
    }

    /// True if every page of the image had its memory when it was mapped
    /// (see [`Space`]): a first write to a page then allocates nothing.
    pub fn is_reserved(&self) -> bool {
        self.reserved
    }

    /// Gives the pages of `[offset, offset + len)` their memory now, if
    /// the image is sparse (see [`Space`]): a store to a page without
    /// memory, where the file system under the image has no room left,
    /// kills the process (`SIGBUS`), where this fails with `ENOSPC`.
    /// Nothing to do for a reserved image.
    pub fn reserve(&self, offset: u64, len: u64) -> Result<()> {
        if self.reserved || len == 0 {
            return Ok(());
        }
        self.map
            .check(offset, usize::try_from(len).unwrap_or(usize::MAX))?;
        reserve(&self.file, &self.path, offset, len)
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// True if the mapping is empty (never: mapping an empty file fails).
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// Whether the region is real persistent memory or emulated.
    pub fn mode(&self) -> MapMode {
        self.mode
    }

    /// The persistence backend's name ("clwb", "recorder", ...).
    pub fn persist_name(&self) -> String {
        self.persist.name()
    }

    /// Copies bytes at `offset` out of the region.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.map.read(offset, buf)
    }

    /// Atomically loads the aligned 8-byte word at `offset`.
    pub fn load_u64(&self, offset: u64, order: Ordering) -> Result<u64> {
        self.map.load_u64(offset, order)
    }

    /// Ordinary store of `data` at `offset`; persistent only after
    /// [`flush`](Self::flush) and [`fence`](Self::fence).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let at = self.map.check(offset, data.len())?;
        self.persist.store(self.media(), at, data)
    }

    /// Ordinary store of `len` copies of `byte` at `offset`.
    pub fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<()> {
        let n = usize::try_from(len).map_err(|_| Error::OutOfBounds {
            offset,
            len,
            size: self.len(),
        })?;
        let at = self.map.check(offset, n)?;
        self.persist.fill(self.media(), at, n, byte)
    }

    /// Atomic store of the aligned 8-byte word at `offset`.
    pub fn store_u64(&self, offset: u64, value: u64, order: Ordering) -> Result<()> {
        let at = self.map.check(offset, 8)?;
        self.persist.store_u64(self.media(), at, value, order)
    }

    /// Non-temporal store of `data` at `offset`: persistent after the next
    /// [`fence`](Self::fence) with no flush needed.
    pub fn write_nt(&self, offset: u64, data: &[u8]) -> Result<()> {
        let at = self.map.check(offset, data.len())?;
        self.persist.store_nt(self.media(), at, data)
    }

    /// Non-temporal store at `offset` of the `len` bytes at `src_offset`
    /// of `src`, shared memory another process may store to at any time:
    /// each source byte is read once, straight into the region, and is
    /// persistent after the next [`fence`](Self::fence). The region holds
    /// whatever mix of bytes the source held during the copy.
    pub fn write_nt_from(&self, offset: u64, src: &Shm, src_offset: u64, len: usize) -> Result<()> {
        let at = self.map.check(offset, len)?;
        self.persist
            .store_nt_from(self.media(), at, src, src_offset, len)
    }

    /// Starts writing back the cache lines overlapping the range.
    pub fn flush(&self, offset: u64, len: u64) -> Result<()> {
        let n = usize::try_from(len).map_err(|_| Error::OutOfBounds {
            offset,
            len,
            size: self.len(),
        })?;
        let at = self.map.check(offset, n)?;
        self.persist.flush(self.media(), at, n)
    }

    /// Waits until every earlier flush and non-temporal store is persistent.
    pub fn fence(&self) {
        self.persist.fence();
    }

    /// Flush and fence: the range is persistent on return.
    pub fn persist(&self, offset: u64, len: u64) -> Result<()> {
        self.flush(offset, len)?;
        self.fence();
        Ok(())
    }

    /// Store, flush and fence: `data` is persistent at `offset` on return.
    pub fn write_persist(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write(offset, data)?;
        self.persist(offset, data.len() as u64)
    }

    /// Allocates and maps the pages of a range now rather than at their
    /// first store (emulated regions allocate memory on first touch), a
    /// page fault each, leaving the process's memory map unlocked for the
    /// protection changes of clients in the same process. Contents are
    /// unchanged. On DAX the pages are mapped only: a hole of a sparse
    /// image reads as the zero page and gets its block at its first store
    /// (or from [`Region::reserve`]). With huge pages enabled, an image on
    /// tmpfs gets them for the whole 2 MiB chunks around the range instead
    /// (see [`Region::make_huge`]).
    pub fn prefault(&self, offset: u64, len: u64) {
        self.map.provision(offset, len, self.len());
    }

    /// Allocates, clears and maps the pages of a range now, as
    /// [`Region::prefault`] does, in small pages even with huge pages
    /// enabled. On a sparse image, only after [`Region::reserve`] for the
    /// range succeeded: a page the file system under the image has no
    /// room for kills the process at its first touch.
    pub fn touch(&self, offset: u64, len: u64) {
        self.map.touch(offset, len);
    }

    /// Lets the region use huge pages ([`Region::make_huge`]): an image on
    /// tmpfs only (a DAX device maps huge pages by itself, its mapping
    /// being aligned for them). False if this image cannot have them.
    pub fn enable_huge_pages(&self) -> bool {
        self.map.enable_huge()
    }

    /// With huge pages enabled, for an image on tmpfs: holds each 2 MiB
    /// chunk overlapping the range in one huge page from now on,
    /// allocating it now (contents unchanged), so that every mapping of
    /// the image, a client's view included, reaches the chunk through one
    /// TLB entry. Each chunk is asked for once. True if every chunk of the
    /// range is huge; false for other images, or where the kernel would
    /// not (before Linux 6.1, huge pages turned off, or none free).
    pub fn make_huge(&self, offset: u64, len: u64) -> bool {
        self.map.make_huge(offset, len, self.len())
    }

    /// Asks the kernel again for one chunk that [`Region::make_huge`]
    /// could not have for a reason of the moment (no huge page free then,
    /// or a page of it busy): `Some(true)` if it is huge now, `Some(false)`
    /// if it is not (it waits for the next call), `None` if none waited.
    /// Kfs calls this while idle, now and then, so that such a chunk does
    /// not stay in small pages for good.
    pub fn retry_huge(&self) -> Option<bool> {
        self.map.retry_huge()
    }

    /// True if some chunk waits for [`Region::retry_huge`].
    pub fn huge_retry_due(&self) -> bool {
        self.map.huge_retry_due()
    }

    /// For tests (the `test-hooks` feature): the next chunk asked for
    /// fails as if the kernel had no huge page free at that moment.
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn fail_next_huge(&self) {
        self.map.fail_next_collapse()
    }

    /// True if [`Region::make_huge`] may still succeed: huge pages enabled
    /// for an image on tmpfs, and a kernel that has not refused them.
    pub fn can_make_huge(&self) -> bool {
        self.map.can_make_huge()
    }

    /// How many bytes of the image this region made huge pages.
    pub fn huge_bytes(&self) -> u64 {
        self.map.huge_bytes()
    }

    /// A new descriptor of the image opened read-only, to hand to a
    /// client process: what it maps through it can never be made
    /// writable.
    pub fn read_only_file(&self) -> Result<File> {
        super::shm::reopen_read_only(self.file.as_fd())
            .map(File::from)
            .map_err(|e| Error::io("reopen image read-only", &self.path, e.into()))
    }

    /// A new descriptor of the image opened read-write (not a copy of
    /// this one's description: it holds no lock), to hand to a client
    /// process trusted with writes (ARCHITECTURE.md §2): it can store
    /// into any byte of the image through it.
    pub fn read_write_file(&self) -> Result<File> {
        super::shm::reopen_read_write(self.file.as_fd())
            .map(File::from)
            .map_err(|e| Error::io("reopen image read-write", &self.path, e.into()))
    }

    /// A client's view of the same image: two more mappings of it, both
    /// read-only to start with. Reads go through one whose pages stay
    /// read-only for good; writes go through the other, a window whose
    /// pages Kfs makes writable for the client's pool and read-only again
    /// through the view's [`Protector`] (so the file is opened read-write,
    /// which `mprotect` needs). A protection change of a page inside a
    /// huge mapping splits the mapping first, and the pages of one mapping
    /// changed page by page stay split into many; the reads' mapping is
    /// never changed, so it keeps one TLB entry per 2 MiB wherever the
    /// image is in huge pages, and the window is mapped in small pages
    /// only.
    pub fn view(&self) -> Result<RegionView> {
        self.map_view(None)
    }

    /// A client's view of the image for [`Protection::Keys`]: writable in
    /// its page tables, its pages tagged with the process's protection key,
    /// so that only a [`PoolWriter`] may store through it. `None` where the
    /// CPU or kernel has no protection keys.
    pub fn keyed_view(&self) -> Result<Option<RegionView>> {
        keys::process_key()
            .map(|key| self.map_view(Some(key)))
            .transpose()
    }

    /// Maps a client's view, tagged with `key` if there is one: one
    /// mapping for reads and writes, which starts read-only and becomes
    /// writable only together with its tag, in one call; without a key,
    /// a mapping for reads and a write window (see [`Region::view`]).
    fn map_view(&self, key: Option<keys::Key>) -> Result<RegionView> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.path)
            .map_err(|e| Error::io("open image", &self.path, e))?;
        let (map, mode) = map_file(&file, &self.path, self.len(), false, Placement::Huge)?;
        let map = Arc::new(map);
        let window = match key {
            Some(key) => {
                map.assign_key(key.number())
                    .map_err(|e| Error::io("tag with a protection key a view of", &self.path, e))?;
                map.clone()
            }
            None => {
                let (window, _) = map_file(&file, &self.path, self.len(), false, Placement::Small)?;
                Arc::new(window)
            }
        };
        Ok(RegionView {
            path: self.path.clone(),
            _file: None,
            map,
            window,
            mode,
            flush: super::cpu::FlushInstr::detect(),
            key,
        })
    }
}

/// A read-only mapping of an image: what a client maps, and what read-only
/// tools (`info`, `fsck`) open. Any store through its address faults; a
/// [`PoolWriter`] stores into pool pages through the view's write window
/// (see [`Region::view`]).
#[derive(Debug)]
pub struct RegionView {
    path: PathBuf,
    /// For a view opened on its own: holds a shared lock, so that no Kfs
    /// opens the image while a tool reads it.
    _file: Option<File>,
    /// What reads go through: read-only for good (or keyed), so that
    /// the kernel may map it in huge pages and keep them mapped so.
    map: Arc<Mapping>,
    /// What writes go through: a second mapping of the image whose pages
    /// Kfs makes writable and read-only again, a run of pool pages at a
    /// time, placed so that the kernel maps it in small pages only (a
    /// protection change inside a huge mapping splits it first). The same
    /// mapping as `map` for a keyed view, whose protection never changes,
    /// and for a view opened on its own, which nothing writes through.
    window: Arc<Mapping>,
    mode: MapMode,
    flush: super::cpu::FlushInstr,
    /// The protection key of a [keyed view](Region::keyed_view): its page
    /// tables allow stores, the threads' rights to the key do not.
    key: Option<keys::Key>,
}

/// Stores into a client's pool pages ([`RegionView::pool_writer`]).
#[derive(Debug)]
pub struct PoolWriter<'a> {
    view: &'a RegionView,
    /// Open while this lives, for a keyed view.
    _window: Option<keys::WriteWindow>,
}

impl PoolWriter<'_> {
    /// Copies `data` to `offset` with non-temporal stores: persistent after
    /// [`RegionView::fence`]. The pages must be in this client's pool: Kfs
    /// made them writable, or the view is keyed (whose window lets this
    /// thread store anywhere in the view, so the library writes only
    /// through here, and only into its pool).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.view.window.copy_in_nt(offset, data, self.view.flush)
    }
}

/// How long a client's data pages stay writable (ARCHITECTURE.md §13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protection {
    /// Every commit makes its pages read-only again at once.
    Strict,
    /// Committed pages become read-only in batches: once
    /// [`BATCH_PAGES`] of a pool are committed, or [`BATCH_TIME`] after the
    /// first of them was, whichever comes first. A page no file holds by
    /// then (an overwrite replaced it) stays writable for this client
    /// until Kfs grants it to another.
    Batched,
    /// Pool pages stay writable after their commit.
    Off,
    /// The client's view is tagged with a memory protection key: no thread
    /// may store through it except the library's own copy of a write's
    /// data, for as long as that copy takes (see [`keys`]). No page's
    /// protection ever changes, so freed pages are reused at once, as
    /// under `off`. Where the CPU or kernel has no protection keys, a
    /// client asking for this mode gets [`Protection::Batched`].
    #[default]
    Keys,
}

/// Most committed pages a client's thread may leave writable under
/// [`Protection::Batched`]: a pool's worth (4 MiB), so that a thread
/// writing through its pool pays about one protection change per pool.
pub const BATCH_PAGES: u64 = crate::proto::POOL_PAGES as u64;
/// Longest a committed page stays writable under [`Protection::Batched`].
pub const BATCH_TIME: std::time::Duration = std::time::Duration::from_millis(10);

impl Protection {
    /// Every mode.
    pub const ALL: [Protection; 4] = [
        Protection::Strict,
        Protection::Batched,
        Protection::Off,
        Protection::Keys,
    ];

    /// The mode's name, as [`FromStr`](std::str::FromStr) takes it.
    pub fn name(self) -> &'static str {
        match self {
            Protection::Strict => "strict",
            Protection::Batched => "batched",
            Protection::Off => "off",
            Protection::Keys => "keys",
        }
    }
}

impl std::str::FromStr for Protection {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Protection, String> {
        Protection::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown protection mode {s:?}: expected {}",
                    Protection::ALL.map(Protection::name).join(", ")
                )
            })
    }
}

/// Changes the protection of pages of one client's view, in its write
/// window (embedded mode: Kfs runs in the client's process). It keeps the
/// window's mapping alive, so it never touches memory that was unmapped
/// and reused.
#[derive(Debug, Clone)]
pub struct Protector {
    map: Arc<Mapping>,
    /// The image's path, which an error names.
    path: Arc<Path>,
}

impl Protector {
    /// Makes `pages` pages from region page `first` writable (`true`) or
    /// read-only.
    pub fn set(&self, first: u64, pages: u64, writable: bool) -> Result<()> {
        self.map
            .protect(first * 4096, pages * 4096, writable, &self.path)
    }

    /// Faults in `pages` writable pages from region page `first` in one
    /// call, so that the client's first stores to them do not fault one
    /// page at a time.
    pub fn populate(&self, first: u64, pages: u64) {
        self.map.populate(first * 4096, pages * 4096);
    }
}

impl RegionView {
    /// A read-only view of the image `file` (a descriptor another process
    /// handed over, opened read-only: the mapping can never be made
    /// writable), named `path` in errors. It takes no lock: the process
    /// that handed it holds the image (or, from [`RegionView::open`], the
    /// file holds the lock it took).
    pub fn from_file(file: File, path: &Path) -> Result<RegionView> {
        RegionView::map_handed(file, path, false)
    }

    /// A writable view of the image `file` (a descriptor opened
    /// read-write that a daemon handed a client it trusts with writes,
    /// ARCHITECTURE.md §2), named `path` in errors: reads and pool writes
    /// go through one mapping whose pages stay writable (no Kfs in this
    /// process changes their protection). It takes no lock: the daemon
    /// holds the image.
    pub fn from_file_writable(file: File, path: &Path) -> Result<RegionView> {
        RegionView::map_handed(file, path, true)
    }

    /// One mapping of a handed-over image `file`, writable or not.
    fn map_handed(file: File, path: &Path, writable: bool) -> Result<RegionView> {
        let len = image_len(&file, path)?;
        let (map, mode) = map_file(&file, path, len, writable, Placement::Huge)?;
        let map = Arc::new(map);
        Ok(RegionView {
            path: path.into(),
            _file: Some(file),
            window: map.clone(),
            map,
            mode,
            flush: super::cpu::FlushInstr::detect(),
            key: None,
        })
    }

    /// Opens an image read-only for inspection, under a shared lock (fails
    /// with [`Error::Locked`] while a Kfs has it open).
    pub fn open(path: &Path) -> Result<RegionView> {
        let file = OpenOptions::new()
            .read(true)
            .open(path)
            .map_err(|e| Error::io("open image", path, e))?;
        lock(&file, path, FlockOperation::NonBlockingLockShared)?;
        RegionView::from_file(file, path)
    }

    /// The image's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// True if the mapping is empty (never: mapping an empty file fails).
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// Whether the image is real persistent memory or emulated.
    pub fn mode(&self) -> MapMode {
        self.mode
    }

    /// Copies bytes at `offset` out of the image.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        if let Some(key) = self.key {
            keys::allow_reads(key);
        }
        self.map.read(offset, buf)
    }

    /// Atomically loads the aligned 8-byte word at `offset`.
    pub fn load_u64(&self, offset: u64, order: Ordering) -> Result<u64> {
        if let Some(key) = self.key {
            keys::allow_reads(key);
        }
        self.map.load_u64(offset, order)
    }

    /// A handle with which Kfs changes the protection of this view's pages;
    /// `None` for a keyed view, whose page protection never changes (and
    /// whose pages Kfs could not populate for writing: the kernel checks
    /// the populating thread's rights to the key).
    pub fn protector(&self) -> Option<Protector> {
        self.key.is_none().then(|| Protector {
            map: self.window.clone(),
            path: self.path.as_path().into(),
        })
    }

    /// Asks the CPU to start loading the cache line at `offset`, and with it
    /// the page-table entries that map it for reads (a hint: nothing
    /// happens for an offset outside the region).
    pub fn prefetch(&self, offset: u64) {
        self.map.prefetch(offset)
    }

    /// [`RegionView::prefetch`] for a store: the cache line at `offset`
    /// and the page-table entries that map it in the write window.
    pub fn prefetch_for_write(&self, offset: u64) {
        self.window.prefetch(offset)
    }

    /// Asks the CPU to start loading the cache lines of `[offset, offset +
    /// len)`, and with them the page-table entries that map them for
    /// reads (a hint: nothing happens for a range outside the region).
    /// Never inlined: inlined into a read, the same prefetches made random
    /// small reads slower, the read's next loads queued behind them.
    #[inline(never)]
    pub fn prefetch_range(&self, offset: u64, len: usize) {
        self.map.prefetch_range(offset, len)
    }

    /// What copies a write's data into this client's pool pages. For a
    /// keyed view it opens the calling thread's write window, which stays
    /// open until it is dropped: make one for a write's copies, not one
    /// per page (a window costs two PKRU writes), and none that outlives
    /// them.
    pub fn pool_writer(&self) -> PoolWriter<'_> {
        PoolWriter {
            view: self,
            _window: self.key.map(keys::WriteWindow::open),
        }
    }

    /// Orders the earlier [`PoolWriter::write`] copies before later
    /// stores: they are persistent once it returns.
    pub fn fence(&self) {
        super::cpu::sfence();
    }

    /// The virtual address of the mapping reads go through, in this
    /// process. It is never dereferenced by this crate outside the mapping
    /// module; it exists so that tests can play a buggy application's stray
    /// store and check that it faults.
    pub fn address(&self) -> usize {
        self.map.addr()
    }

    /// The virtual address of the mapping writes go through (the same as
    /// [`RegionView::address`] for a keyed view and a view opened on its
    /// own): for tests only, as there.
    pub fn window_address(&self) -> usize {
        self.window.addr()
    }
}

fn lock(file: &File, path: &Path, op: FlockOperation) -> Result<()> {
    // A lock can outlive its holder's close for a moment: a process that
    // forks while it has the image open shares the open file (and its lock)
    // with the child until the child execs. So a refusal is retried
    // briefly before it is reported.
    for attempt in 0..LOCK_TRIES {
        match flock(file, op) {
            Ok(()) => return Ok(()),
            Err(Errno::WOULDBLOCK) => {
                if attempt + 1 < LOCK_TRIES {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            }
            Err(e) => return Err(Error::io("lock image", path, e.into())),
        }
    }
    Err(Error::Locked { path: path.into() })
}

/// Attempts at locking an image, 2 ms apart.
const LOCK_TRIES: u32 = 25;

/// Allocates the memory (or blocks) of `[offset, offset + len)` of the
/// image file at `path`, within its size, [`RESERVE_STEP`] bytes a call.
/// A file system that cannot allocate ahead leaves the file as it is.
fn reserve(file: &File, path: &Path, offset: u64, len: u64) -> Result<()> {
    use rustix::fs::{fallocate, FallocateFlags};
    let end = offset.saturating_add(len);
    let mut at = offset;
    while at < end {
        let n = (end - at).min(RESERVE_STEP);
        match fallocate(file, FallocateFlags::empty(), at, n) {
            Ok(()) => at += n,
            Err(Errno::OPNOTSUPP) => return Ok(()),
            // tmpfs gives up (and gives back what the call took) when a
            // signal arrives: that step again, the signal handled.
            Err(Errno::INTR) => continue,
            Err(Errno::NOSPC) => {
                // What an unprivileged user may still take there.
                let free = rustix::fs::fstatvfs(file)
                    .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
                    .unwrap_or(0);
                return Err(Error::NoSpace {
                    path: path.into(),
                    size: len,
                    free,
                });
            }
            Err(e) => return Err(Error::io("reserve memory for", path, e.into())),
        }
    }
    Ok(())
}

/// The most [`reserve`] asks for in one call: a call that a signal cuts
/// short is made again from its start, so a large image is reserved in
/// steps that each finish however often signals come.
const RESERVE_STEP: u64 = 64 << 20;

/// Empties the image file at `path`, whose memory goes with its contents,
/// and removes it if `remove`.
fn discard(file: &File, path: &Path, remove: bool) {
    let _ = file.set_len(0);
    if remove {
        let _ = std::fs::remove_file(path);
    }
}

/// The bytes of memory (or blocks) an image file has, from its metadata;
/// `None` for a device, which has all of its own.
pub fn allocated(meta: &std::fs::Metadata) -> Option<u64> {
    meta.is_file().then(|| meta.blocks().saturating_mul(512))
}

/// True if `file`, `len` bytes long, has memory (or blocks) for all of
/// them (see [`allocated`]).
fn is_reserved(file: &File, len: u64) -> bool {
    file.metadata()
        .is_ok_and(|m| allocated(&m).is_none_or(|have| have >= len))
}

/// Whether the kernel reports the file at `path` as accessed directly,
/// without a page cache (DAX, `STATX_ATTR_DAX`): a file that a
/// [`Region`] maps with `MAP_SYNC` ([`MapMode::Dax`]). `None` where the
/// kernel does not say (before Linux 5.8) or the file cannot be reached.
/// Asked of the file system, not of a mapping, so that it can check what
/// mapping a region got.
pub fn is_dax(path: &Path) -> Option<bool> {
    use rustix::fs::{statx, AtFlags, StatxAttributes, StatxFlags, CWD};
    let st = statx(CWD, path, AtFlags::empty(), StatxFlags::BASIC_STATS).ok()?;
    st.stx_attributes_mask
        .contains(StatxAttributes::DAX)
        .then(|| st.stx_attributes.contains(StatxAttributes::DAX))
}

fn is_device(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.file_type().is_block_device() || m.file_type().is_char_device())
        .unwrap_or(false)
}

/// The usable length of an image: a regular file's size, a block device's
/// capacity, or a DAX character device's size from sysfs.
fn image_len(file: &File, path: &Path) -> Result<u64> {
    let meta = file
        .metadata()
        .map_err(|e| Error::io("stat image", path, e))?;
    let ft = meta.file_type();
    let len = if ft.is_file() {
        meta.len()
    } else if ft.is_block_device() || ft.is_char_device() {
        device_len(file, path)?
    } else {
        return Err(Error::Unusable {
            path: path.into(),
            why: "not a regular file, block device or DAX device".into(),
        });
    };
    if len == 0 {
        return Err(Error::Unusable {
            path: path.into(),
            why: "the image is empty".into(),
        });
    }
    Ok(len)
}

fn device_len(file: &File, path: &Path) -> Result<u64> {
    let meta = file
        .metadata()
        .map_err(|e| Error::io("stat device", path, e))?;
    if meta.file_type().is_block_device() {
        use std::io::Seek;
        let mut f = file;
        return f
            .seek(io::SeekFrom::End(0))
            .map_err(|e| Error::io("size block device", path, e));
    }
    // A device-DAX character device publishes its size in sysfs.
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let sys = format!("/sys/dev/char/{major}:{minor}/size");
    std::fs::read_to_string(&sys)
        .map_err(|e| Error::io("read device size from sysfs for", path, e))?
        .trim()
        .parse()
        .map_err(|_| Error::Unusable {
            path: path.into(),
            why: format!("{sys} does not hold a size"),
        })
}

/// Maps `len` bytes of `file`: with `MAP_SYNC` when the kernel accepts it for
/// this file (DAX), else as an ordinary shared mapping.
fn map_file(
    file: &File,
    path: &Path,
    len: u64,
    writable: bool,
    placement: Placement,
) -> Result<(Mapping, MapMode)> {
    let len = usize::try_from(len).map_err(|_| Error::Unusable {
        path: path.into(),
        why: format!("{len} bytes do not fit in this address space"),
    })?;
    let prot = if writable {
        ProtFlags::READ | ProtFlags::WRITE
    } else {
        ProtFlags::READ
    };
    let sync = Mapping::map_placed(
        file.as_fd(),
        len,
        prot,
        MapFlags::SHARED_VALIDATE | MapFlags::SYNC,
        placement,
    );
    let (mut map, mode) = match sync {
        Ok(m) => (m, MapMode::Dax),
        // Not DAX (EOPNOTSUPP), or a kernel without MAP_SYNC (EINVAL).
        Err(Errno::OPNOTSUPP | Errno::INVAL) => {
            let m = Mapping::map_placed(file.as_fd(), len, prot, MapFlags::SHARED, placement)
                .map_err(|e| Error::io("map image", path, e.into()))?;
            (m, MapMode::Emulated)
        }
        Err(e) => return Err(Error::io("map image", path, e.into())),
    };
    if mode == MapMode::Emulated && on_tmpfs(file.as_fd()) {
        map.allow_huge();
    }
    Ok((map, mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shm_dir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("kucofs-region-")
            .tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .unwrap()
    }

    /// The value of field `name` (with its colon) in `/proc/self/smaps`
    /// for the mapping starting at `addr`; its fields end at `VmFlags`.
    fn smaps_field(addr: usize, name: &str) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let head = format!("{addr:x}-");
        smaps
            .lines()
            .skip_while(|l| !l.starts_with(&head))
            .take_while(|l| !l.starts_with("VmFlags"))
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
    }

    /// The mapping a region of the file at `path` gets, from what the
    /// kernel says of the file itself: `MAP_SYNC` where it is DAX, an
    /// ordinary shared mapping elsewhere (tmpfs, or a kernel that does not
    /// say).
    fn expected_mode(path: &Path) -> MapMode {
        if is_dax(path) == Some(true) {
            MapMode::Dax
        } else {
            MapMode::Emulated
        }
    }

    /// The flags of the mapping starting at `addr` (`VmFlags` in
    /// `/proc/self/smaps`), e.g. `sf` for synchronous page faults, which
    /// `MAP_SYNC` asks for.
    fn vm_flags(addr: usize) -> Vec<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let head = format!("{addr:x}-");
        smaps
            .lines()
            .skip_while(|l| !l.starts_with(&head))
            .find_map(|l| l.strip_prefix("VmFlags:"))
            .expect("the mapping is listed with its flags")
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }

    /// The kibibytes of the mapping starting at `addr` that huge page
    /// table entries map, from `/proc/self/smaps`.
    fn pmd_mapped_kib(addr: usize) -> u64 {
        smaps_field(addr, "ShmemPmdMapped:")
            .and_then(|v| v.trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    #[test]
    fn a_keyed_view_is_tagged_and_written_only_through_a_pool_writer() {
        let dir = shm_dir();
        let path = dir.path().join("img");
        let r = Region::create(&path, 4 << 20, false).unwrap();
        let Some(view) = r.keyed_view().unwrap() else {
            println!("SKIPPED: this CPU or kernel has no memory protection keys");
            return;
        };
        let key = keys::process_key().unwrap();
        assert!(view.protector().is_none());
        assert_eq!(
            smaps_field(view.map.addr(), "ProtectionKey:"),
            Some(key.number().to_string())
        );
        let data: Vec<u8> = (0..253u8).cycle().take(8192).collect();
        view.pool_writer().write(4096, &data).unwrap();
        view.fence();
        let mut back = vec![0; data.len()];
        view.read(4096, &mut back).unwrap();
        assert_eq!(back, data);
        // Kfs's own mapping sees the same bytes.
        r.read(4096, &mut back).unwrap();
        assert_eq!(back, data);
        // An unkeyed view of the same image is untagged.
        let plain = r.view().unwrap();
        assert!(plain.protector().is_some());
        assert_eq!(
            smaps_field(plain.map.addr(), "ProtectionKey:").as_deref(),
            Some("0")
        );
    }

    /// The read and write letters ("rw" or "r-") of the page at `addr`,
    /// from `/proc/self/maps`.
    fn perms(addr: usize) -> String {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .find_map(|l| {
                let (range, rest) = l.split_once(' ')?;
                let (a, b) = range.split_once('-')?;
                let a = usize::from_str_radix(a, 16).ok()?;
                let b = usize::from_str_radix(b, 16).ok()?;
                (a <= addr && addr < b).then(|| rest[..2].to_owned())
            })
            .unwrap()
    }

    /// A plain view writes through a window of its own, whose pages the
    /// protector changes, and reads through a mapping whose pages stay
    /// read-only, and huge where the image is: the window's protection
    /// changes never split the read mapping's huge pages.
    #[test]
    fn a_plain_views_reads_keep_their_mapping_while_its_write_window_changes() {
        let dir = shm_dir();
        let r = Region::create(&dir.path().join("img"), 4 << 20, false).unwrap();
        let view = r.view().unwrap();
        let (read, window) = (view.address(), view.window_address());
        assert_ne!(read, window);
        assert_eq!(read % crate::pm::HUGE_PAGE, 0);
        // Off a huge-page boundary: the kernel can map the window small only.
        assert_eq!(window % crate::pm::HUGE_PAGE, 4096);
        let p = view.protector().unwrap();
        p.set(3, 2, true).unwrap();
        assert_eq!(perms(window + 3 * 4096), "rw");
        assert_eq!(perms(read + 3 * 4096), "r-");
        let data: Vec<u8> = (0..249u8).cycle().take(8192).collect();
        view.pool_writer().write(3 * 4096, &data).unwrap();
        view.fence();
        let mut back = vec![0; data.len()];
        view.read(3 * 4096, &mut back).unwrap();
        assert_eq!(back, data);
        r.read(3 * 4096, &mut back).unwrap();
        assert_eq!(back, data);
        p.set(3, 2, false).unwrap();
        assert_eq!(perms(window + 3 * 4096), "r-");
        // A view opened on its own, which nothing writes through, has one.
        drop(r);
        let tool = RegionView::open(&dir.path().join("img")).unwrap();
        assert_eq!(tool.address(), tool.window_address());
        drop(tool);
        let r = Region::open(&dir.path().join("img")).unwrap();
        let view = r.view().unwrap();
        let p = view.protector().unwrap();
        p.set(3, 1, true).unwrap();
        if expected_mode(&r.path) == MapMode::Dax {
            // Huge pages are asked of the kernel for tmpfs images only (a
            // DAX file's are mapped huge by the kernel where its blocks
            // line up): the read mapping stays as it was, bytes and all.
            assert!(!r.enable_huge_pages());
            assert_eq!(perms(view.window_address() + 3 * 4096), "rw");
            assert_eq!(perms(view.address() + 3 * 4096), "r-");
            view.read(3 * 4096, &mut back).unwrap();
            assert_eq!(back, data);
            return;
        }
        if !r.enable_huge_pages() || !r.make_huge(0, 4096) {
            println!("SKIPPED: this kernel makes no huge pages of tmpfs (MADV_COLLAPSE)");
            return;
        }
        p.set(5, 1, true).unwrap();
        view.read(10 * 4096, &mut back).unwrap();
        assert_eq!(pmd_mapped_kib(view.address()), 2048);
        view.read(3 * 4096, &mut back).unwrap();
        assert_eq!(back, data, "made huge, the bytes are the same");
        // The window's whole chunk writable and mapped: in small pages.
        p.set(0, 512, true).unwrap();
        p.populate(0, 512);
        assert_eq!(pmd_mapped_kib(view.window_address()), 0);
        assert!(smaps_field(view.window_address(), "Rss:").is_some());
    }

    #[test]
    fn huge_pages_come_only_when_enabled_and_keep_every_byte() {
        let dir = shm_dir();
        let path = dir.path().join("img");
        let r = Region::create(&path, 8 << 20, false).unwrap();
        // Mappings start on a huge-page boundary, the view's too.
        assert_eq!(r.map.addr() % crate::pm::HUGE_PAGE, 0);
        let view = r.view().unwrap();
        assert_eq!(view.map.addr() % crate::pm::HUGE_PAGE, 0);
        let data: Vec<u8> = (0..251u8).cycle().take(3 * 4096 + 100).collect();
        let at = (2 << 20) - 4096;
        r.write(at, &data).unwrap();
        // Not enabled: nothing is asked of the kernel.
        assert!(!r.can_make_huge());
        assert!(!r.make_huge(0, 8 << 20));
        assert_eq!(r.huge_bytes(), 0);
        if expected_mode(&path) == MapMode::Dax {
            // A DAX file's pages are the device's own: the kernel maps them
            // huge by itself where the file's blocks line up, and there is
            // nothing to ask of it. Enabling is refused, no chunk is ever
            // made or retried, and the bytes are all there.
            assert!(!r.enable_huge_pages());
            assert!(!r.can_make_huge());
            assert!(!r.make_huge(at, 8192));
            assert!(!r.huge_retry_due());
            assert_eq!(r.retry_huge(), None);
            assert_eq!(r.huge_bytes(), 0);
            let mut back = vec![0u8; data.len()];
            r.read(at, &mut back).unwrap();
            assert_eq!(back, data);
            view.read(at, &mut back).unwrap();
            assert_eq!(back, data);
            return;
        }
        if !dir.path().starts_with("/dev/shm") {
            println!("SKIPPED: no tmpfs under /dev/shm for huge pages");
            return;
        }
        assert!(r.enable_huge_pages());
        // The chunks the range overlaps: the first two of four.
        if !r.make_huge(at, 8192) {
            assert!(
                !r.can_make_huge(),
                "a chunk failed, yet the kernel did not refuse"
            );
            println!("SKIPPED: this kernel makes no huge pages of tmpfs (MADV_COLLAPSE)");
            return;
        }
        assert_eq!(r.huge_bytes(), 4 << 20);
        // The kernel maps them huge here (and only they are huge so far).
        assert_eq!(pmd_mapped_kib(r.map.addr()), 4096);
        // Asked again: nothing more to do, and still true.
        assert!(r.make_huge(0, 4 << 20));
        assert_eq!(r.huge_bytes(), 4 << 20);
        let mut back = vec![0u8; data.len()];
        r.read(at, &mut back).unwrap();
        assert_eq!(back, data);
        view.read(at, &mut back).unwrap();
        assert_eq!(back, data);
        // A hole made huge reads as zeros; the chunk reaching past the
        // end of a range is made whole.
        let mut zeros = vec![1u8; 4096];
        r.read(0, &mut zeros).unwrap();
        assert!(zeros.iter().all(|&b| b == 0));
        assert!(r.make_huge(6 << 20, 1));
        assert_eq!(r.huge_bytes(), 6 << 20);
        // Past the end: refused, nothing made.
        assert!(!r.make_huge(8 << 20, 4096));
        assert_eq!(r.huge_bytes(), 6 << 20);
        // A chunk the kernel would not make huge for the moment is not
        // asked for again by make_huge, but is by retry_huge, once.
        assert!(!r.huge_retry_due());
        assert_eq!(r.retry_huge(), None);
        r.fail_next_huge();
        assert!(!r.make_huge(4 << 20, 1));
        assert!(!r.make_huge(4 << 20, 1));
        assert_eq!(r.huge_bytes(), 6 << 20);
        assert!(r.huge_retry_due());
        assert_eq!(r.retry_huge(), Some(true));
        assert_eq!(r.huge_bytes(), 8 << 20);
        assert!(r.make_huge(4 << 20, 1));
        assert!(!r.huge_retry_due());
        assert_eq!(r.retry_huge(), None);
        assert_eq!(pmd_mapped_kib(r.map.addr()), 8192);
        r.read(at, &mut back).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn a_second_opener_gets_a_clear_error_naming_the_image() {
        let dir = shm_dir();
        let path = dir.path().join("img");
        let _r = Region::create(&path, 1 << 20, false).unwrap();
        let err = Region::open(&path).unwrap_err();
        assert!(matches!(err, Error::Locked { .. }), "{err:?}");
        assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
        assert_eq!(err.errno(), libc::EBUSY);
        // Read-only tools are kept out too while Kfs holds it.
        assert!(matches!(
            RegionView::open(&path).unwrap_err(),
            Error::Locked { .. }
        ));
        // A second create --force must not truncate an image in use.
        assert!(matches!(
            Region::create(&path, 1 << 20, true).unwrap_err(),
            Error::Locked { .. }
        ));
    }

    #[test]
    fn the_lock_is_released_on_drop() {
        let dir = shm_dir();
        let path = dir.path().join("img");
        drop(Region::create(&path, 1 << 20, false).unwrap());
        drop(Region::open(&path).unwrap());
        let v1 = RegionView::open(&path).unwrap();
        // Shared locks coexist.
        let _v2 = RegionView::open(&path).unwrap();
        drop(v1);
    }

    /// Bytes of memory (or blocks) the file at `path` has.
    fn memory(path: &Path) -> u64 {
        allocated(&std::fs::metadata(path).unwrap()).unwrap()
    }

    #[test]
    fn a_new_image_has_all_its_memory_unless_made_sparse() {
        let dir = shm_dir();
        let size = 8 << 20;
        let reserved = dir.path().join("reserved");
        let r = Region::create(&reserved, size, false).unwrap();
        assert!(memory(&reserved) >= size);
        assert!(r.is_reserved() && r.is_fresh());
        // Cleared too: tmpfs reports memory allocated but not cleared yet
        // as a hole.
        let file = File::open(&reserved).unwrap();
        let hole = rustix::fs::seek(&file, rustix::fs::SeekFrom::Hole(0)).unwrap();
        assert_eq!(hole, size);
        // Reserved memory reads as zeros, as a sparse image's holes do.
        let mut buf = vec![1u8; 4096];
        r.read(size - 4096, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        drop(r);
        assert!(Region::open(&reserved).unwrap().is_reserved());

        let sparse = dir.path().join("sparse");
        let hardware = Arc::new(Hardware::new());
        let r = Region::create_with(&sparse, size, false, Space::Sparse, hardware).unwrap();
        assert!(memory(&sparse) < size / 2);
        assert!(!r.is_reserved() && r.is_fresh());
        assert_eq!(r.len(), size);
        drop(r);
        assert!(!Region::open(&sparse).unwrap().is_reserved());
    }

    #[test]
    fn create_refuses_an_existing_file_unless_forced() {
        let dir = shm_dir();
        let path = dir.path().join("img");
        std::fs::write(&path, b"precious").unwrap();
        let err = Region::create(&path, 1 << 20, false).unwrap_err();
        assert!(matches!(err, Error::Exists { .. }));
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
        let r = Region::create(&path, 1 << 20, true).unwrap();
        assert_eq!(r.len(), 1 << 20);
        let mut head = [0xffu8; 8];
        r.read(0, &mut head).unwrap();
        assert_eq!(head, [0u8; 8], "a forced create starts from zeros");
    }

    /// A region is mapped with `MAP_SYNC` exactly where its file is DAX
    /// (the kernel says which of the file, and marks a `MAP_SYNC`
    /// mapping's faults synchronous, `sf`): under `/dev/shm` on tmpfs an
    /// ordinary mapping, on a file system mounted with `-o dax` the real
    /// thing. Either way, a view sees the region's stores.
    #[test]
    fn a_region_maps_with_map_sync_exactly_on_dax_and_views_see_writes() {
        let dir = shm_dir();
        let path = dir.path().join("img");
        let r = Region::create(&path, 1 << 20, false).unwrap();
        let want = expected_mode(&path);
        assert_eq!(r.mode(), want);
        let synchronous = |addr| vm_flags(addr).iter().any(|f| f == "sf");
        assert_eq!(synchronous(r.map.addr()), want == MapMode::Dax);
        let v = r.view().unwrap();
        assert_eq!(v.mode(), want);
        assert_eq!(synchronous(v.address()), want == MapMode::Dax);
        assert_eq!(v.len(), r.len());
        r.write_persist(12345, b"shared").unwrap();
        let mut buf = [0u8; 6];
        v.read(12345, &mut buf).unwrap();
        assert_eq!(&buf, b"shared");
        r.store_u64(64, 0xdead_beef, Ordering::Release).unwrap();
        assert_eq!(v.load_u64(64, Ordering::Acquire).unwrap(), 0xdead_beef);
        assert_ne!(v.address(), 0);
    }

    /// True if the page holding `addr` is mapped in this process's page
    /// tables (the present bit of its entry in `/proc/self/pagemap`).
    fn mapped(addr: usize) -> bool {
        use std::os::unix::fs::FileExt;
        let pagemap = File::open("/proc/self/pagemap").unwrap();
        let mut entry = [0u8; 8];
        pagemap
            .read_exact_at(&mut entry, (addr / 4096 * 8) as u64)
            .unwrap();
        u64::from_le_bytes(entry) >> 63 == 1
    }

    /// `prefault` readies every page a range touches and no other, and
    /// changes no byte. On tmpfs it allocates them: they are holes no
    /// more. On DAX it maps them: a read fault there maps a hole to the
    /// zero page and allocates no block (a page gets its block at its
    /// first store, or from `reserve`), so the file's holes stay.
    #[test]
    fn prefault_readies_exactly_a_range_and_keeps_its_bytes() {
        use rustix::fs::SeekFrom;
        let dir = shm_dir();
        let path = dir.path().join("img");
        let hardware = Arc::new(Hardware::new());
        let r = Region::create_with(&path, 1 << 20, false, Space::Sparse, hardware).unwrap();
        r.write_persist(5 * 4096 + 100, b"kept").unwrap();
        let image = File::open(&path).unwrap();
        let hole_at = |at: u64| rustix::fs::seek(&image, SeekFrom::Hole(at)).unwrap();
        assert_eq!(hole_at(8 * 4096), 8 * 4096, "fresh pages are a hole");
        let page = |n: usize| r.map.addr() + n * 4096;
        let dax = expected_mode(&path) == MapMode::Dax;
        if dax {
            let untouched = (3..11).filter(|&n| n != 5);
            assert!(untouched.into_iter().all(|n| !mapped(page(n))));
        }
        // Unaligned ends: every page the range touches, and no other.
        r.prefault(4 * 4096 + 10, 5 * 4096);
        if dax {
            for n in 3..11 {
                assert_eq!(mapped(page(n)), (4..10).contains(&n), "page {n}");
            }
            assert_eq!(hole_at(4 * 4096), 4 * 4096, "a block allocated");
            assert_eq!(hole_at(6 * 4096), 6 * 4096, "a block allocated");
        } else {
            assert_eq!(hole_at(4 * 4096), 10 * 4096);
            assert_eq!(hole_at(3 * 4096), 3 * 4096, "a page before the range");
        }
        let mut buf = vec![0xffu8; 6 * 4096];
        r.read(4 * 4096, &mut buf).unwrap();
        assert_eq!(&buf[4096 + 100..4096 + 104], b"kept");
        buf[4096 + 100..4096 + 104].fill(0);
        assert!(buf.iter().all(|&b| b == 0));
        // Out of bounds: nothing happens (a hint).
        r.prefault(1 << 20, 4096);
        r.prefault(u64::MAX - 10, 100);
    }

    #[test]
    fn accesses_are_bounds_and_alignment_checked() {
        let dir = shm_dir();
        let r = Region::create(&dir.path().join("img"), 1 << 20, false).unwrap();
        let mut buf = [0u8; 16];
        assert!(matches!(
            r.read((1 << 20) - 8, &mut buf),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.read(u64::MAX, &mut buf),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.write(u64::MAX - 3, &buf),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.fill(10, u64::MAX, 0),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.load_u64(4, Ordering::Relaxed),
            Err(Error::Misaligned { .. })
        ));
        assert!(matches!(
            r.store_u64(1 << 20, 1, Ordering::Relaxed),
            Err(Error::OutOfBounds { .. })
        ));
        // Reads and writes that end exactly at the end are fine.
        r.write((1 << 20) - 16, &buf).unwrap();
        r.read((1 << 20) - 16, &mut buf).unwrap();
    }

    #[test]
    fn empty_and_odd_images_are_refused_with_a_reason() {
        let dir = shm_dir();
        let path = dir.path().join("empty");
        std::fs::write(&path, b"").unwrap();
        let err = Region::open(&path).unwrap_err();
        assert!(matches!(err, Error::Unusable { .. }), "{err:?}");
        assert!(err.to_string().contains("empty"));
        let err = Region::open(dir.path()).unwrap_err();
        assert!(
            matches!(err, Error::Io { .. } | Error::Unusable { .. }),
            "{err:?}"
        );
        let err = Region::open(&dir.path().join("missing")).unwrap_err();
        assert_eq!(err.errno(), libc::ENOENT);
    }
}
