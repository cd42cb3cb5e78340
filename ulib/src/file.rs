//! Files: [`File`] and [`OpenOptions`], shaped like `std::fs`'s, with the
//! file system handle as an extra argument.
//!
//! Reads copy straight from the data pages mapped read-only into the
//! process, checking the block map's versions around the copy (ARCHITECTURE.md §7):
//! no lock and no request. Writes copy on write (ARCHITECTURE.md §8): under a range
//! lock on the pages they touch, they fill fresh pages of this thread's
//! pool with the old bytes and the new, persist them, and send Kfs a commit
//! for every 256 pages they touch (more when a thread's pool hands out
//! scattered runs); Kfs makes the change durable before it replies.

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use kucofs_common::format::{PageNo, PAGE_LEN};
use kucofs_common::index::blockmap::{
    entries_unchanged, entry_page, kept_bytes, load_entries, runs_are_whole, EntrySource,
    MapReader, FANOUT, MAX_FILE_SIZE, N_SLOTS, PAGE,
};
use kucofs_common::index::{Ino, InodeOff, Kind};
use kucofs_common::pm::{PoolWriter, Words};
use kucofs_common::proto::{
    open, At, Entry, Extents, Node, OpenAt, Request, COMMIT_PAGES_MAX, STAGE_BYTES,
};
use kucofs_common::Errno;

use crate::fs::{bytes, common_err, err, Fs, Inner};
use crate::metadata::Metadata;
use crate::range_lock::RangeLock;

/// Options for opening a file, as `std::fs::OpenOptions`.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    append: bool,
    truncate: bool,
    create: bool,
    create_new: bool,
    mode: u32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions::new()
    }
}

impl OpenOptions {
    /// All options off; a created file gets mode `0o666` less the umask.
    pub fn new() -> OpenOptions {
        OpenOptions {
            read: false,
            write: false,
            append: false,
            truncate: false,
            create: false,
            create_new: false,
            mode: 0o666,
        }
    }
    /// Open for reading.
    pub fn read(&mut self, v: bool) -> &mut Self {
        self.read = v;
        self
    }
    /// Open for writing.
    pub fn write(&mut self, v: bool) -> &mut Self {
        self.write = v;
        self
    }
    /// Every write goes to the end of the file (implies writing).
    pub fn append(&mut self, v: bool) -> &mut Self {
        self.append = v;
        self
    }
    /// Cut the file to length 0 (needs writing).
    pub fn truncate(&mut self, v: bool) -> &mut Self {
        self.truncate = v;
        self
    }
    /// Create the file if it does not exist (needs writing).
    pub fn create(&mut self, v: bool) -> &mut Self {
        self.create = v;
        self
    }
    /// Create the file, failing if it exists (needs writing).
    pub fn create_new(&mut self, v: bool) -> &mut Self {
        self.create_new = v;
        self
    }
    /// Permission bits of a created file (before the umask).
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }

    /// The permission bits a created file gets, as given.
    pub(crate) fn mode_bits(&self) -> u32 {
        self.mode & 0o7777
    }

    /// Opens `path` in `fs` with these options. The same refusals as
    /// `std`: no access mode, or truncation or creation without writing,
    /// is `EINVAL`.
    pub fn open(&self, fs: &Fs, path: impl AsRef<Path>) -> io::Result<File> {
        let p = bytes(path.as_ref());
        let mode = self.mode & 0o7777 & !fs.inner().config.umask;
        self.open_as(fs, |flags| {
            fs.change(p, |hint| Request::Open {
                at: OpenAt::Entry(Entry::Path(p)),
                flags,
                mode,
                hint,
            })
        })
    }

    /// Opens with these options what `call` sends Kfs (given the
    /// [`open`] flags): by path ([`OpenOptions::open`]) or by node
    /// (`open_at`, `open_node`).
    pub(crate) fn open_as(
        &self,
        fs: &Fs,
        call: impl FnOnce(u32) -> io::Result<kucofs_common::proto::Reply>,
    ) -> io::Result<File> {
        let write = self.write || self.append;
        if !self.read && !write {
            return Err(err(Errno::EINVAL));
        }
        if !write && (self.truncate || self.create || self.create_new) {
            return Err(err(Errno::EINVAL));
        }
        if self.append && self.truncate {
            return Err(err(Errno::EINVAL));
        }
        let mut flags = 0;
        if write {
            flags |= open::WRITE;
            if self.read {
                flags |= open::READ;
            }
        }
        if self.create || self.create_new {
            flags |= open::CREATE;
        }
        if self.create_new {
            flags |= open::EXCL;
        }
        let (node, created) = call(flags)?.into_open().map_err(err)?;
        let inner = fs.inner().clone();
        let kind = if inner.isolated() {
            inner.stat_of(At::Node(node))?.kind()
        } else {
            inner.with_index(|r| r.kind(node.inode))?
        }
        .ok_or_else(|| err(Errno::EIO))?;
        let lock = inner.range_lock(node.ino);
        let file = File {
            fs: inner,
            ino: node.ino,
            inode: node.inode,
            gen: node.gen,
            kind,
            read: self.read,
            write,
            append: self.append,
            pos: Mutex::new(0),
            lock,
            last_line: AtomicU64::new(0),
            layout: AtomicU64::new(Layout::NONE),
            lease: AtomicU64::new(0),
        };
        // Truncation as `set_len` does it, under the file's range lock, so
        // that a write another thread has under way lands wholly before
        // the cut or wholly after it (Kfs's own `open::TRUNC` cannot wait
        // for this process's writers). As on Linux, truncating a file that
        // was there already changes its times even when it is empty, and a
        // file this open made (Kfs's reply says so) is left alone.
        if self.truncate && !created {
            file.set_len(0)?;
        }
        Ok(file)
    }
}

/// An open file of a KucoFS file system, as `std::fs::File`: `Read`,
/// `Write` and `Seek` (also through `&File`), and positional
/// `read_at`/`write_at`. `Send + Sync`; threads may share one.
#[derive(Debug)]
pub struct File {
    fs: Arc<Inner>,
    ino: Ino,
    inode: InodeOff,
    /// The inode's generation (with `ino` and `inode`, how an isolated
    /// client names the file to Kfs).
    gen: u32,
    kind: Kind,
    read: bool,
    write: bool,
    append: bool,
    /// The position `Read`, `Write` and `Seek` use. It is held over a
    /// whole read or write, as Linux holds a shared file's position, so
    /// that threads sharing one `File` each get their own bytes.
    pos: Mutex<u64>,
    lock: Arc<RangeLock>,
    /// The map-entry cache line ([`entry_line`]) of this handle's last
    /// directly applied commit, plus 1 (0: none yet). A commit on the same
    /// line finds its entry cached, and warms nothing.
    last_line: AtomicU64,
    /// Where this handle's reads find their pages: a [`Layout`] word.
    layout: AtomicU64,
    /// The generation of the file's write lease as Kfs last told this
    /// handle (0: not known). Kfs refuses a commit made under another
    /// generation than the lease's (`ESTALE`): the lease moved to another
    /// process meanwhile (ARCHITECTURE.md §8).
    lease: AtomicU64,
}

/// A write's mark in its slot (ARCHITECTURE.md §8): the thread is writing
/// the file, and Kfs does not hand its lease to another process until
/// the write's last request. Cleared when dropped.
struct WriteMark<'a> {
    fs: &'a Inner,
    slot: usize,
}

impl Drop for WriteMark<'_> {
    fn drop(&mut self) {
        self.fs.conn.clear_write(self.slot);
    }
}

/// The first and the longest wait before asking again for a lease another
/// process's write holds: its write ends within microseconds to
/// milliseconds, and Kfs hands the lease over at its end (or, past a
/// bound, takes it).
const LEASE_RETRY_FIRST: std::time::Duration = std::time::Duration::from_micros(20);
const LEASE_RETRY_MAX: std::time::Duration = std::time::Duration::from_millis(2);

/// True for Kfs's answer to a commit made under a lease this process no
/// longer holds: the write is redone under the lease asked for again.
fn lost_lease(e: &io::Error) -> bool {
    e.raw_os_error() == Some(Errno::ESTALE.get())
}

/// Where a file's pages lie in the region, as its reads found them: a
/// guess at the pages of the next read, which that read starts loading
/// (with the page-table walk to them) and copies while it looks them up in
/// the block map, so that the misses overlap (a random 4 KiB read out of a
/// 256 MiB file misses the cache on both). The guess is never trusted: the
/// read keeps that copy only if the map names those pages.
///
/// A file written front to back on a fresh file system lies in one run of
/// adjacent pages (its writes take the pool's pages in order, and grants
/// come in order off the free space), so each page sits at its file page
/// number plus one offset, the *shift*. A read records the shift of the
/// page it found; the next read prefetches only if two reads in a row
/// found the same shift, so a file scattered by random overwrites costs
/// its reads no useless loads. The prefetch covers the first 256 bytes of
/// the page: fewer left the copy waiting, more (up to the whole page)
/// queued their loads ahead of the block map's and made reads slower.
struct Layout;

impl Layout {
    /// No read has found a page yet.
    const NONE: u64 = 0;
    /// The bit of a word whose shift two reads in a row found.
    const CONFIRMED: u64 = 1;
    /// A bit every word a read stored has, so that none is [`Self::NONE`].
    const FOUND: u64 = 2;
    /// The bytes of a guessed page prefetched.
    const PREFETCH: usize = 256;
    /// The most pages a read copies from a guess.
    const PAGES: u64 = 4;

    /// The word for `shift` (region page minus file page, wrapping: a
    /// two's-complement number far smaller than 2^62 either way, as both
    /// page numbers are below 2^52), found again (`confirmed`) or not.
    fn word(shift: u64, confirmed: bool) -> u64 {
        (shift << 2) | Self::FOUND | u64::from(confirmed)
    }

    /// The shift a word holds (an arithmetic shift: a negative shift
    /// stays negative).
    fn shift(w: u64) -> u64 {
        (w.cast_signed() >> 2).cast_unsigned()
    }

    /// The shift of a word, if two reads in a row found it.
    fn confirmed(w: u64) -> Option<u64> {
        (w & Self::CONFIRMED != 0).then_some(Self::shift(w))
    }

    /// The word after a read found file page `first` in region page
    /// `page`, the word before being `w`.
    fn after(w: u64, first: u64, page: u64) -> u64 {
        let shift = page.wrapping_sub(first);
        let same = w != Self::NONE && Self::shift(w) == shift;
        Self::word(shift, same)
    }
}

/// Which cache line holds file page `page`'s block-map entry, as a number
/// that differs between lines: the leaf (`page / FANOUT`), and the line
/// within it (entries of 8 bytes follow an `N_SLOTS`-byte header). Exact
/// where leaves start on a line; a hint either way.
fn entry_line(page: u64) -> u64 {
    const LINE: u64 = 64;
    let leaf = page / FANOUT;
    let at = N_SLOTS + 8 * (page % FANOUT);
    leaf * (N_SLOTS + 8 * FANOUT).div_ceil(LINE) + at / LINE
}

/// Pages a read checks and copies at once.
const READ_CHUNK: u64 = COMMIT_PAGES_MAX;

// The block map's pages are the format's: `PAGE_LEN` bytes hold one.
const _: () = assert!(PAGE_LEN as u64 == PAGE);

/// `n` as a `usize`, for a count or offset that every caller bounds by
/// memory in hand: a buffer's length, a page, [`READ_CHUNK`] entries, the
/// mapped region.
// Bounded so, nothing is lost; and KucoFS builds for x86-64 only (see
// `kucofs_common`), where a `usize` holds any `u64`. No check: reads and
// writes convert several times per chunk.
#[allow(clippy::cast_possible_truncation)]
#[inline(always)]
pub(crate) fn to_len(n: u64) -> usize {
    n as usize
}

impl File {
    /// Opens a file for reading.
    pub fn open(fs: &Fs, path: impl AsRef<Path>) -> io::Result<File> {
        OpenOptions::new().read(true).open(fs, path)
    }

    /// Opens a file for writing, creating it or cutting it to length 0.
    pub fn create(fs: &Fs, path: impl AsRef<Path>) -> io::Result<File> {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(fs, path)
    }

    /// Opens a file for reading and writing, creating it; fails if it exists.
    pub fn create_new(fs: &Fs, path: impl AsRef<Path>) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(fs, path)
    }

    /// The file's inode number.
    pub fn ino(&self) -> u64 {
        self.ino.get()
    }

    /// The file's size. No reader epoch: Kfs keeps an open regular file's
    /// inode (its open count pins it), so the word stays this file's. (A
    /// directory opened as a `File` is not pinned; this word of its inode
    /// is only read for `seek(SeekFrom::End)`, where a removed directory's
    /// stale size is as good an answer as any.)
    fn size(&self) -> io::Result<u64> {
        if self.fs.isolated() {
            return Ok(self.fs.stat_of(At::Node(self.node()))?.size);
        }
        // Acquire: pairs with Kfs's Release store of the size, made after
        // the entries under it.
        Ok(self
            .fs
            .index()?
            .load_u64(self.inode.size(), Ordering::Acquire))
    }

    /// The file as Kfs names it.
    fn node(&self) -> Node {
        Node {
            ino: self.ino,
            inode: self.inode,
            gen: self.gen,
        }
    }

    /// The file's metadata.
    pub fn metadata(&self) -> io::Result<Metadata> {
        if self.fs.isolated() {
            return self.fs.stat_of(At::Node(self.node())).map(Metadata);
        }
        self.fs
            .with_index(|r| r.attr(self.inode))?
            .map(Metadata)
            .ok_or_else(|| err(Errno::EIO))
    }

    /// Reads from `offset` without moving the position; returns the bytes
    /// read (0 at or past the end).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.read_paused(buf, offset, || {})
    }

    /// [`File::read_at`] that runs `pause` once the map entries of each
    /// chunk are loaded, before their pages are copied: for tests that
    /// stop a reader inside its read section (ARCHITECTURE.md §9).
    #[doc(hidden)]
    pub fn debug_read_at_paused(
        &self,
        buf: &mut [u8],
        offset: u64,
        pause: impl FnMut(),
    ) -> io::Result<usize> {
        self.read_paused(buf, offset, pause)
    }

    fn read_paused(&self, buf: &mut [u8], offset: u64, pause: impl FnMut()) -> io::Result<usize> {
        if !self.read {
            return Err(err(Errno::EBADF));
        }
        if self.kind == Kind::Dir {
            return Err(err(Errno::EISDIR));
        }
        if self.fs.isolated() {
            return self.fs.read_file(self.ino, buf, offset);
        }
        // Room for the entries of one chunk: an unaligned read touches one
        // page more than its length fills. Most reads are a few pages: no
        // allocation (nor a large clear) for those.
        let pages = ((buf.len() as u64).div_ceil(PAGE) + 1).min(READ_CHUNK);
        kucofs_common::scratch::with_words(to_len(pages), |entries| {
            self.read_into(entries, buf, offset, pause)
        })
    }

    /// [`File::read_at`], with room for `entries.len()` map entries at a
    /// time; `pause` runs between loading a chunk's entries and copying
    /// its pages.
    fn read_into(
        &self,
        entries: &mut [u64],
        buf: &mut [u8],
        offset: u64,
        mut pause: impl FnMut(),
    ) -> io::Result<usize> {
        let region = self.fs.region()?;
        let mut done = 0usize;
        while done < buf.len() {
            let at = offset + done as u64;
            // One chunk: the pages of up to READ_CHUNK, copied from one
            // state of the map, in a read section of its own: a long read
            // holds back reclamation (and nears eviction, ARCHITECTURE.md
            // §9) for no longer than one chunk's copy.
            let copied = self.fs.with_index(|r| -> io::Result<usize> {
                let mem = r.mem();
                Ok(loop {
                    let size = mem.load_u64(self.inode.size(), Ordering::Acquire);
                    if at >= size {
                        break 0;
                    }
                    let first = at / PAGE;
                    let end = (at + (buf.len() - done) as u64)
                        .min(size)
                        .min((first + entries.len() as u64) * PAGE);
                    let n = (end - 1) / PAGE - first + 1;
                    // What this chunk copies: at most what `buf` has left.
                    let len = to_len(end - at);
                    // Relaxed: a hint, shared by the threads reading
                    // through this handle.
                    let layout = self.layout.load(Ordering::Relaxed);
                    let guess = Layout::confirmed(layout)
                        .and_then(|shift| first.wrapping_add(shift).checked_mul(PAGE));
                    // Small reads only: a chunk of many pages is likelier
                    // to hold a hole or a moved page, and copied twice then.
                    let guess = guess.filter(|_| n <= Layout::PAGES);
                    if let Some(g) = guess {
                        region.prefetch_range(g + at % PAGE, Layout::PREFETCH);
                    }
                    let map = MapReader::of_inode(mem, self.inode);
                    let snap = &mut entries[..to_len(n)];
                    load_entries(&map, first, snap);
                    pause();
                    if snap[0] != 0 {
                        let next = Layout::after(layout, first, entry_page(snap[0]).get());
                        // Stored only when it changes: a contiguous file's
                        // reads leave the line shared.
                        if next != layout {
                            self.layout.store(next, Ordering::Relaxed);
                        }
                    }
                    // Copied from the guessed pages before the entries
                    // are checked, so that the copy's loads need not wait
                    // for the entries' (the two miss the cache at once),
                    // and kept if the entries name those pages and pass
                    // every check the copy below passes. This copy comes
                    // after the entries' Acquire loads as that one does,
                    // and after the size's second load, as there: a size
                    // that went away and back during the copy (a shrink
                    // zeroing a page's tail in place, then a grow) must
                    // not pass. A wrong guess costs one copy.
                    if let Some(g) = guess {
                        let again = mem.load_u64(self.inode.size(), Ordering::Acquire);
                        let out = &mut buf[done..done + len];
                        if region.read(g + at % PAGE, out).is_ok()
                            && again == size
                            && names_run(snap, g / PAGE)
                            && runs_are_whole(snap)
                            && entries_unchanged(&map, first, snap)
                            && map.is_current(self.inode)
                        {
                            break len;
                        }
                    }
                    // The size again, after the entries (Acquire loads, in
                    // order): Kfs zeroes a page's tail in place only after
                    // giving its entry a new version, and stores the size
                    // that covers the zeros after them, so a size unchanged
                    // here means no zeroing of these pages can overlap the
                    // copy unless the check of the entries below fails.
                    if !runs_are_whole(snap)
                        || mem.load_u64(self.inode.size(), Ordering::Acquire) != size
                    {
                        std::hint::spin_loop();
                        continue;
                    }
                    let out = &mut buf[done..done + len];
                    let whole = copy_pages(region, snap, first, at, out);
                    if entries_unchanged(&map, first, snap) && map.is_current(self.inode) {
                        if !whole {
                            return Err(err(Errno::EIO));
                        }
                        break len;
                    }
                })
            })??;
            if copied == 0 {
                break;
            }
            done += copied;
        }
        Ok(done)
    }

    /// Writes all of `buf` at `offset` (durably) without moving the
    /// position; returns its length, or fewer bytes if a later part could
    /// not be written (the file system filled up part-way: the next write
    /// reports the error).
    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        if !self.write {
            return Err(err(Errno::EBADF));
        }
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or_else(|| err(Errno::EFBIG))?;
        if buf.is_empty() {
            return Ok(0);
        }
        let first = offset / PAGE;
        let last = (end - 1) / PAGE;
        let _g = self.lock.lock(first * PAGE, (last + 1) * PAGE);
        let slot = self.fs.slot()?;
        let _mark = self.begin_write(slot)?;
        self.write_locked(slot, buf, offset, false)
    }

    /// Marks `slot` as writing this file, then makes sure this process
    /// holds the file's write lease (ARCHITECTURE.md §8): from then on
    /// the lease stays here until the write's last request (or a bound),
    /// so what the write reads of the file (its size, old bytes) is what
    /// it commits over.
    fn begin_write(&self, slot: usize) -> io::Result<WriteMark<'_>> {
        // Relaxed: a hint; Kfs checks the generation at the commit.
        let lease = self.lease.load(Ordering::Relaxed);
        self.fs.conn.mark_write(slot, self.ino.get(), lease);
        let mark = WriteMark { fs: &self.fs, slot };
        if lease == 0 {
            self.renew_lease(slot)?;
        }
        Ok(mark)
    }

    /// Asks Kfs for the file's write lease (or its generation, if this
    /// process holds it), again and again while another process writes the
    /// file, and marks `slot` with it.
    fn renew_lease(&self, slot: usize) -> io::Result<()> {
        let ino = self.ino.get();
        // Writing, under no lease yet: the reads of the write come after.
        self.fs.conn.mark_write(slot, ino, 0);
        let mut wait = LEASE_RETRY_FIRST;
        loop {
            match self.fs.call_as(slot, &Request::Lease { ino: self.ino }) {
                Ok(r) => {
                    let lease = r.into_size().map_err(err)?;
                    self.lease.store(lease, Ordering::Relaxed);
                    self.fs.conn.mark_write(slot, ino, lease);
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(Errno::EAGAIN.get()) => {
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(LEASE_RETRY_MAX);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Appends `buf` at the end of the file; returns the offset it was
    /// written at and the bytes written (fewer than `buf.len()` if the
    /// file system filled up part-way, as [`File::write_at`]).
    fn append(&self, buf: &[u8]) -> io::Result<(u64, usize)> {
        let slot = self.fs.slot()?;
        loop {
            let size = self.size()?;
            let _g = self.lock.lock(size / PAGE * PAGE, u64::MAX);
            // Under the lease from here: no other process appends until
            // this write's last request.
            let _mark = self.begin_write(slot)?;
            // Another thread, or process, may have appended meanwhile.
            if self.size()? != size {
                continue;
            }
            size.checked_add(buf.len() as u64)
                .filter(|&e| e <= MAX_FILE_SIZE)
                .ok_or_else(|| err(Errno::EFBIG))?;
            match self.write_locked(slot, buf, size, true) {
                // The lease moved before anything was written: the end
                // may have too.
                Err(e) if lost_lease(&e) => self.lease.store(0, Ordering::Relaxed),
                r => return Ok((size, r?)),
            }
        }
    }

    /// The copy-on-write of `buf` at `offset` from `slot`; the caller
    /// holds the range lock over the pages it touches, and the slot's
    /// write mark. A write is committed a chunk at a time: once one chunk
    /// is in the file, a failure of a later one ends the write short (as
    /// POSIX `write` reports a partial write), and the caller's next
    /// write gets the error. A chunk refused because the lease moved is
    /// redone under the lease asked for again; if it is the first of an
    /// append (`append`), the error goes to the caller, which finds the
    /// end again.
    fn write_locked(
        &self,
        slot: usize,
        buf: &[u8],
        offset: u64,
        append: bool,
    ) -> io::Result<usize> {
        let fs = &self.fs;
        if let Some(staging) = fs.conn.staging() {
            return self.write_staged(slot, staging, buf, offset, append);
        }
        let end = offset + buf.len() as u64;
        let mut at = offset;
        while at < end {
            let first = at / PAGE;
            let want_end = end.min((first + COMMIT_PAGES_MAX) * PAGE);
            let n = (want_end - 1) / PAGE - first + 1;
            let extents = match fs.take_pages(slot, n) {
                Ok(e) => e,
                Err(_) if at > offset => break,
                Err(e) => return Err(e),
            };
            // Fewer pages than asked: this commit covers what they hold.
            let chunk_end = want_end.min((first + extents.pages()) * PAGE);
            let data = &buf[to_len(at - offset)..to_len(chunk_end - offset)];
            if chunk_end == end {
                fs.conn.mark_last(slot);
            }
            if let Err(e) = self.write_chunk(slot, &extents, first, at, chunk_end, data) {
                // Not in the file: the pages serve the next write.
                fs.untake_pages(slot, &extents);
                let e = match e {
                    e if lost_lease(&e) && !(append && at == offset) => {
                        match self.renew_lease(slot) {
                            Ok(()) => continue,
                            Err(e) => e,
                        }
                    }
                    e => e,
                };
                if at > offset {
                    break;
                }
                return Err(e);
            }
            at = chunk_end;
        }
        Ok(to_len(at - offset))
    }

    /// [`File::write_locked`] for a daemon's client, which cannot write
    /// into the image: each chunk of up to [`STAGE_BYTES`] goes into
    /// `slot`'s part of the staging area, and Kfs copies it into the file
    /// as one commit ([`Request::Write`]).
    fn write_staged(
        &self,
        slot: usize,
        staging: &kucofs_common::pm::Shm,
        buf: &[u8],
        offset: u64,
        append: bool,
    ) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let n = (buf.len() - done).min(to_len(STAGE_BYTES));
            staging
                .write(slot as u64 * STAGE_BYTES, &buf[done..done + n])
                .map_err(common_err)?;
            let req = Request::Write {
                ino: self.ino,
                offset: offset + done as u64,
                len: u32::try_from(n).expect("a chunk is at most STAGE_BYTES"),
            };
            if done + n == buf.len() {
                self.fs.conn.mark_last(slot);
            }
            let e = match self.fs.call_as(slot, &req) {
                Ok(_) => {
                    done += n;
                    continue;
                }
                // Redone under the lease asked for again (the bytes are
                // still in the staging area); not the start of an append,
                // whose end may have moved.
                Err(e) if lost_lease(&e) && !(append && done == 0) => {
                    match self.renew_lease(slot) {
                        Ok(()) => continue,
                        Err(e) => e,
                    }
                }
                Err(e) => e,
            };
            if done > 0 {
                break;
            }
            return Err(e);
        }
        Ok(done)
    }

    /// Copies `data` (file bytes `at..end`, starting in file page `first`)
    /// into the pool pages `extents` and commits them, durable first (see
    /// [`Inner::commit_after`](crate::fs::Inner::commit_after)).
    fn write_chunk(
        &self,
        slot: usize,
        extents: &Extents,
        first: u64,
        at: u64,
        end: u64,
        data: &[u8],
    ) -> io::Result<()> {
        let fs = &self.fs;
        // Applied on this thread: the commit's map entry, and then the
        // state of the page it replaces, load while the data drains; not
        // again on the line of this handle's last commit, which is cached.
        // Relaxed: a hint, shared by the threads writing through this
        // handle; a load and a store, not a locked swap, which would wait
        // for the previous commit's stores to drain.
        let line = entry_line(first) + 1;
        let warmer = fs
            .warmer()
            .filter(|_| self.last_line.load(Ordering::Relaxed) != line);
        let warm = warmer.and_then(|w| {
            self.last_line.store(line, Ordering::Relaxed);
            w.map(self.inode, first)
        });
        let commit = Request::Commit {
            ino: self.ino,
            first,
            size: end,
            extents: *extents,
        };
        fs.commit_after(slot, &commit, extents.pages(), || {
            self.fill_pages(extents, first, at, data)?;
            if let (Some(w), Some(e)) = (warmer, warm) {
                w.replaced(e);
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Fills the pool pages `extents` with file pages `first..`: `data`
    /// (which starts at byte `at`), and around it in the first and last
    /// page the old bytes of the file, zeros in a hole and past the end.
    /// Only those two pages read the map.
    fn fill_pages(&self, extents: &Extents, first: u64, at: u64, data: &[u8]) -> io::Result<()> {
        let region = self.fs.region()?;
        // One writer (under protection keys, one window) for the whole
        // chunk's copies.
        let pool = region.pool_writer();
        let end = at + data.len() as u64;
        for (i, dst) in extents.iter_pages().enumerate() {
            let fp = first + i as u64;
            let (ps, pe) = (fp * PAGE, fp * PAGE + PAGE);
            let (ds, de) = (at.max(ps), end.min(pe));
            let src = &data[to_len(ds - at)..to_len(de - at)];
            if ds == ps && de == pe {
                pool.write(dst.byte_offset(), src).map_err(common_err)?;
            } else {
                self.fill_partial(&pool, dst, fp, to_len(ds - ps), src)?;
            }
        }
        Ok(())
    }

    /// Fills pool page `dst` with file page `fp`: `src` at byte `at` of
    /// it, the old bytes around.
    fn fill_partial(
        &self,
        pool: &PoolWriter<'_>,
        dst: PageNo,
        fp: u64,
        at: usize,
        src: &[u8],
    ) -> io::Result<()> {
        let mut page = [0u8; PAGE_LEN];
        self.fs
            .with_index(|r| self.old_page(r.mem(), fp, &mut page))??;
        page[at..at + src.len()].copy_from_slice(src);
        pool.write(dst.byte_offset(), &page).map_err(common_err)
    }

    /// Copies file page `fp` into `page`: its bytes inside the file (past
    /// its end, a page may hold what a shrink left behind), zeros for a
    /// hole and past the end.
    fn old_page(
        &self,
        mem: &kucofs_common::pm::ShmView,
        fp: u64,
        page: &mut [u8; PAGE_LEN],
    ) -> io::Result<()> {
        let size = mem.load_u64(self.inode.size(), Ordering::Acquire);
        let old = match kept_bytes(mem, self.inode, size, fp) {
            Some((at, keep)) => {
                self.fs
                    .region()?
                    .read(at.byte_offset(), &mut page[..keep])
                    .map_err(common_err)?;
                keep
            }
            None => 0,
        };
        page[old..].fill(0);
        Ok(())
    }

    /// The address, in this process, of the start of the region page that
    /// holds file byte `offset` in the mapping this handle reads through,
    /// which is never writable; `None` for a hole. Only for tests that
    /// play a buggy application's stray store (ARCHITECTURE.md §13): this crate
    /// never dereferences it, and a store through it must fault.
    #[doc(hidden)]
    pub fn debug_page_address(&self, offset: u64) -> io::Result<Option<usize>> {
        self.page_address(self.fs.region()?.address(), offset)
    }

    /// [`File::debug_page_address`] in the mapping this process's writes
    /// go through (the same mapping under protection keys): a store
    /// through it must fault outside the protection mode's writable
    /// window.
    #[doc(hidden)]
    pub fn debug_window_address(&self, offset: u64) -> io::Result<Option<usize>> {
        self.page_address(self.fs.region()?.window_address(), offset)
    }

    /// The address of the page holding file byte `offset` in a mapping of
    /// the region at `base`; `None` for a hole.
    fn page_address(&self, base: usize, offset: u64) -> io::Result<Option<usize>> {
        self.fs.with_index(|r| {
            let e = MapReader::of_inode(r.mem(), self.inode).entry(offset / PAGE);
            (e != 0).then(|| base + to_len(entry_page(e).byte_offset()))
        })
    }

    /// Sets the file's length: cut, or extended with zeros.
    pub fn set_len(&self, size: u64) -> io::Result<()> {
        if !self.write {
            return Err(err(Errno::EINVAL));
        }
        if size > MAX_FILE_SIZE {
            return Err(err(Errno::EFBIG));
        }
        let old = self.size()?;
        let _g = self.lock.lock(size.min(old) / PAGE * PAGE, u64::MAX);
        let slot = self.fs.slot()?;
        let _mark = self.begin_write(slot)?;
        let cut = Request::Truncate {
            ino: self.ino,
            size,
        };
        loop {
            self.fs.conn.mark_last(slot);
            match self.fs.call_as(slot, &cut) {
                Err(e) if lost_lease(&e) => self.renew_lease(slot)?,
                r => return r.map(|_| ()),
            }
        }
    }

    /// Every write is durable when it returns: nothing to do but report
    /// success (as `fsync`).
    pub fn sync_all(&self) -> io::Result<()> {
        Ok(())
    }

    /// As [`File::sync_all`].
    pub fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn read_pos(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut pos = self.pos.lock();
        let n = self.read_at(buf, *pos)?;
        *pos += n as u64;
        Ok(n)
    }

    fn write_pos(&self, buf: &[u8]) -> io::Result<usize> {
        let mut pos = self.pos.lock();
        if self.append {
            // Like Linux: appending nothing neither writes nor moves.
            if buf.is_empty() {
                return Ok(0);
            }
            let (at, n) = self.append(buf)?;
            *pos = at + n as u64;
            return Ok(n);
        }
        let n = self.write_at(buf, *pos)?;
        *pos += n as u64;
        Ok(n)
    }

    fn seek_pos(&self, to: SeekFrom) -> io::Result<u64> {
        let mut pos = self.pos.lock();
        let (base, by) = match to {
            SeekFrom::Start(n) => (n, 0),
            SeekFrom::Current(d) => (*pos, d),
            SeekFrom::End(d) => (self.size()?, d),
        };
        *pos = base
            .checked_add_signed(by)
            .ok_or_else(|| err(Errno::EINVAL))?;
        Ok(*pos)
    }
}

/// True if `entries` name the pages from `page` on, one after another.
fn names_run(entries: &[u64], page: u64) -> bool {
    entries
        .iter()
        .zip(page..)
        .all(|(&e, p)| e != 0 && entry_page(e).get() == p)
}

/// Copies file bytes `[at, at + out.len())`, whose pages from `first` have
/// the map entries `entries`, into `out`; holes read as zeros. False if an
/// entry names a page outside the region (a damaged map, if the entries
/// hold still: the caller checks that first).
fn copy_pages(
    region: &kucofs_common::pm::RegionView,
    entries: &[u64],
    first: u64,
    at: u64,
    out: &mut [u8],
) -> bool {
    let mut whole = true;
    let end = at + out.len() as u64;
    for (i, &e) in entries.iter().enumerate() {
        let fp = first + i as u64;
        let (s, t) = (at.max(fp * PAGE), end.min(fp * PAGE + PAGE));
        if s >= t {
            continue;
        }
        let dst = &mut out[to_len(s - at)..to_len(t - at)];
        if e == 0 {
            dst.fill(0);
        } else if region
            .read(entry_page(e).get() * PAGE + s % PAGE, dst)
            .is_err()
        {
            whole = false;
        }
    }
    whole
}

impl Drop for File {
    fn drop(&mut self) {
        if self.kind == Kind::File {
            // Best effort: if Kfs has stopped, the open ended with it.
            let _ = self.fs.call_here(&Request::Close {
                ino: self.ino,
                write: self.write,
            });
        }
    }
}

impl Read for File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_pos(buf)
    }
}
impl Read for &File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_pos(buf)
    }
}
impl Write for File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_pos(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
impl Write for &File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_pos(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
impl Seek for File {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.seek_pos(to)
    }
}
impl Seek for &File {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.seek_pos(to)
    }
}

impl Fs {
    /// Reads a whole file (as `std::fs::read`).
    pub fn read(&self, path: impl AsRef<Path>) -> io::Result<Vec<u8>> {
        let f = File::open(self, path)?;
        let size = usize::try_from(f.size()?).map_err(|_| err(Errno::EFBIG))?;
        let mut out = vec![0u8; size];
        let n = f.read_at(&mut out, 0)?;
        out.truncate(n);
        Ok(out)
    }

    /// Writes a whole file, creating or replacing its contents (as
    /// `std::fs::write`).
    pub fn write(&self, path: impl AsRef<Path>, data: impl AsRef<[u8]>) -> io::Result<()> {
        let f = File::create(self, path)?;
        let d = data.as_ref();
        if f.write_at(d, 0)? < d.len() {
            return Err(err(Errno::ENOSPC));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leaf's first seven entries share its first line with the header;
    /// each line after holds eight; the next leaf starts a new line.
    #[test]
    fn entry_lines_follow_the_leaf_layout() {
        assert!((0..7).all(|p| entry_line(p) == entry_line(0)));
        assert_ne!(entry_line(7), entry_line(6));
        assert!((7..15).all(|p| entry_line(p) == entry_line(7)));
        assert_ne!(entry_line(FANOUT), entry_line(FANOUT - 1));
        assert_eq!(entry_line(FANOUT) - entry_line(0), 8);
    }

    #[test]
    fn layout_words_keep_negative_shifts_and_confirm_a_shift_found_twice() {
        let w = Layout::after(Layout::NONE, 10, 3);
        assert_eq!(Layout::confirmed(w), None);
        let w = Layout::after(w, 20, 13);
        assert_eq!(Layout::confirmed(w), Some(3u64.wrapping_sub(10)));
        assert_eq!(30u64.wrapping_add(Layout::confirmed(w).unwrap()), 23);
        let w = Layout::after(w, 5, (1 << 40) + 5);
        assert_eq!(Layout::confirmed(w), None);
        assert_eq!(
            Layout::confirmed(Layout::after(w, 6, (1 << 40) + 6)),
            Some(1 << 40)
        );
    }

    /// The region page holding file page `page` of `f`.
    #[cfg(feature = "embedded")]
    fn page_of(f: &File, page: u64) -> u64 {
        f.fs.with_index(|r| entry_page(MapReader::of_inode(r.mem(), f.inode).entry(page)).get())
            .unwrap()
    }

    /// Page `p` of the test file as written in round `round`: bytes that
    /// differ with the page, the place in it and the round.
    // The low bits of the page and the place are enough to tell pages apart.
    #[cfg(feature = "embedded")]
    #[allow(clippy::cast_possible_truncation)]
    fn page_bytes(p: u64, round: u8) -> Vec<u8> {
        (0..PAGE_LEN)
            .map(|i| (p as u8) ^ round ^ (i as u8))
            .collect()
    }

    #[test]
    #[cfg(feature = "embedded")]
    fn reads_learn_a_front_to_back_layout_and_stay_right_when_it_breaks() {
        let (_dir, fs) = crate::fs::tests::scratch("kucofs-layout-");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .open(&fs, "f")
            .unwrap();
        const PAGES: u64 = 64;
        for p in 0..PAGES {
            assert_eq!(f.write_at(&page_bytes(p, 0), p * PAGE).unwrap(), PAGE_LEN);
        }
        // What the prefetch rests on: written front to back on a fresh
        // file system, the file is one run of adjacent pages.
        let shift = page_of(&f, 0).wrapping_sub(0);
        assert!((0..PAGES).all(|p| page_of(&f, p).wrapping_sub(p) == shift));

        let mut buf = vec![0u8; PAGE_LEN];
        let mut read = |p: u64, round: u8| {
            assert_eq!(f.read_at(&mut buf, p * PAGE).unwrap(), PAGE_LEN);
            assert!(buf == page_bytes(p, round), "page {p} read wrong");
            Layout::confirmed(f.layout.load(Ordering::Relaxed))
        };
        assert_eq!(read(3, 0), None);
        assert_eq!(read(50, 0), Some(shift));
        assert_eq!(read(17, 0), Some(shift));

        // An overwrite moves page 9 out of the run: its read, prefetching
        // the old page, copies the new one, and unconfirms the guess.
        f.write_at(&page_bytes(9, 1), 9 * PAGE).unwrap();
        assert_ne!(page_of(&f, 9).wrapping_sub(9), shift);
        assert_eq!(read(9, 1), None);
        assert_eq!(read(40, 0), None);
        assert_eq!(read(41, 0), Some(shift));
        drop(f);
        fs.close().unwrap();
    }
}
