//! Copy-on-write commits and truncation (ARCHITECTURE.md §8): the pages
//! a client thread wrote in its pool published in a file's block map,
//! and a file's size set.
//!
//! A client thread writes into pages of its own pool, with non-temporal
//! stores; its commit names them. They are durable before the commit's
//! log entry: the client fences them before it queues the commit, or,
//! applying the commit itself, leaves them to the fence Kfs's log makes
//! before the entry (on the same thread). Kfs checks that the client
//! holds the file's write lease and that every page is an unused page of
//! that thread's pool, logs the commit, publishes the new block-map
//! entries, puts the replaced pages to wait for their grace period, and
//! fences the log entry before it replies.

use kucofs_common::format::{PageNo, PAGE_LEN};
use kucofs_common::index::blockmap::{kept_bytes, MAX_FILE_PAGES, MAX_FILE_SIZE, PAGE};
use kucofs_common::index::{Ino, InodeOff};
use kucofs_common::proto::{Extents, Reply, COMMIT_PAGES_MAX, STAGE_BYTES};
use kucofs_common::Errno;

use super::grants::holder;
use super::{Caller, Volume};
use crate::pages::page_index;
use crate::record::Record;

/// Most pages a staged write fills: its data spans at most this many.
// A few hundred: lossless.
#[allow(clippy::cast_possible_truncation)]
const STAGED_PAGES: usize = STAGE_BYTES.div_ceil(PAGE) as usize + 1;

impl Volume {
    /// Zeroes the bytes of the page holding byte `old_size` from there to
    /// the page's end, before a change makes them part of the file: they
    /// may hold what a shrink left behind. This is the one write to a
    /// committed page, so its entry gets a new version first: a reader
    /// that took its size from before the shrink either loaded the entry
    /// before that (and fails its check of the entries after copying) or
    /// after it (and finds the size changed since it loaded it, before it
    /// copies anything). The size covering the zeros is stored after them.
    fn zero_tail(
        &mut self,
        inode: InodeOff,
        old_size: u64,
        unless: std::ops::Range<u64>,
    ) -> Result<(), Errno> {
        let at = old_size % PAGE;
        let page = old_size / PAGE;
        if at == 0 || unless.contains(&page) {
            return Ok(());
        }
        let Some(data_page) = self.ns.reversion_page(inode, page)? else {
            return Ok(());
        };
        let off = data_page.byte_offset() + at;
        let region = self.image.region();
        region
            .fill(off, PAGE - at, 0)
            .and_then(|()| region.persist(off, PAGE - at))
            .map_err(|_| Errno::EIO)
    }

    pub(super) fn commit(
        &mut self,
        ino: Ino,
        first: u64,
        size: u64,
        extents: &Extents,
        caller: Caller,
    ) -> Result<Reply, Errno> {
        let n = extents.pages();
        if n == 0
            || n > COMMIT_PAGES_MAX
            || first.checked_add(n).is_none_or(|end| end > MAX_FILE_PAGES)
            || size > MAX_FILE_SIZE
        {
            return Err(Errno::EINVAL);
        }
        let inode = self.leased(ino, caller)?;
        let old_size = self.ns.shm_u64(inode.size());
        let new_size = old_size.max(size);
        // The last page committed holds bytes of the file (`first + n` was
        // checked against the largest file, so this cannot overflow).
        if (first + n - 1) * PAGE >= new_size {
            return Err(Errno::EINVAL);
        }
        // At most COMMIT_PAGES_MAX (checked above): lossless.
        #[allow(clippy::cast_possible_truncation)]
        let words = n as usize;
        // Most commits are a few pages: no allocation for those.
        kucofs_common::scratch::with_words(words, |pages| {
            for (slot, p) in pages.iter_mut().zip(extents.iter_pages()) {
                *slot = p.get();
            }
            let pages = &*pages;
            let h = holder(caller);
            self.pages.take(h, pages)?;
            if new_size > old_size {
                if let Err(e) = self.zero_tail(inode, old_size, first..first + n) {
                    self.pages.untake(h, pages);
                    return Err(e);
                }
            }
            let time = self.ns.stamp();
            let rec = Record::Write {
                ino,
                first,
                extents: *extents,
                size: new_size,
                time,
            };
            if let Err(e) = self.log_record(&rec) {
                self.pages.untake(h, pages);
                return Err(e);
            }
            self.ns.write_pages(inode, first, pages, new_size, time)?;
            self.retire_replaced();
            self.after_commit(caller, extents, time);
            self.maybe_checkpoint();
            Ok(Reply::Size(new_size))
        })
    }

    pub(super) fn truncate(&mut self, ino: Ino, size: u64, caller: Caller) -> Result<Reply, Errno> {
        if size > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        let inode = self.leased(ino, caller)?;
        self.set_size(inode, ino, size)?;
        Ok(Reply::Size(size))
    }

    pub(super) fn set_size(&mut self, inode: InodeOff, ino: Ino, size: u64) -> Result<(), Errno> {
        let old_size = self.ns.shm_u64(inode.size());
        if size > old_size {
            self.zero_tail(inode, old_size, 0..0)?;
        }
        let time = self.ns.stamp();
        self.log_record(&Record::Truncate { ino, size, time })?;
        self.ns.truncate_file(inode, size, time)?;
        self.retire_replaced();
        self.maybe_checkpoint();
        Ok(())
    }

    /// A write whose data Kfs copies (ARCHITECTURE.md §2, daemon mode):
    /// the `len` bytes in `caller`'s slot of its staging area go to the
    /// file at `offset`, through pages Kfs takes for the caller's pool and
    /// fills itself (with the file's old bytes around the write in its
    /// first and last page), durable before the commit that publishes
    /// them. Each staged byte is read once, by the copy that stores it
    /// into its page: the client may change the area at any time, and
    /// only its own write would see that; Kfs decides nothing on those
    /// bytes. One commit, unless the pages Kfs finds lie in more runs than
    /// a commit carries: then the write is published a run of commits at
    /// a time, each whole.
    pub(super) fn write_staged(
        &mut self,
        ino: Ino,
        offset: u64,
        len: u32,
        caller: Caller,
    ) -> Result<Reply, Errno> {
        let len64 = u64::from(len);
        if len == 0 || len64 > STAGE_BYTES {
            return Err(Errno::EINVAL);
        }
        let end = offset
            .checked_add(len64)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(Errno::EFBIG)?;
        let inode = self.leased(ino, caller)?;
        let staged = u64::from(caller.slot) * STAGE_BYTES;
        if self
            .client(caller)?
            .staging
            .as_ref()
            .ok_or(Errno::EOPNOTSUPP)?
            .len()
            < staged + STAGE_BYTES
        {
            return Err(Errno::EFAULT);
        }
        let (first, last) = (offset / PAGE, (end - 1) / PAGE);
        // At most STAGED_PAGES (`len` was checked): lossless.
        #[allow(clippy::cast_possible_truncation)]
        let n = (last - first + 1) as usize;
        // The pages, taken into the caller's pool as a grant would. A
        // client that writes through its staging area never holds pool
        // pages (it is refused grants): those not in the file when this
        // returns go back, so that it cannot commit them unwritten.
        let mut taken = [0u64; STAGED_PAGES];
        let mut got = 0;
        while got < n {
            let want = u32::try_from(n - got).map_err(|_| Errno::EINVAL)?;
            match self.grant(want, caller).and_then(Reply::into_grant) {
                Ok(g) => {
                    for p in g.runs().flat_map(|(s, k)| s.get()..s.get() + k) {
                        // A grant hands out at most the pages asked for;
                        // any beyond them would go straight back.
                        match taken.get_mut(got).filter(|_| got < n) {
                            Some(slot) => {
                                *slot = p;
                                got += 1;
                            }
                            None => self.give_back(caller, &[p]),
                        }
                    }
                }
                Err(e) => {
                    self.give_back(caller, &taken[..got]);
                    return Err(e);
                }
            }
        }
        let pages = &taken[..n];
        let old_size = self.ns.shm_u64(inode.size());
        if let Err(e) = self.fill_staged(inode, old_size, offset, len64, caller, pages) {
            self.give_back(caller, pages);
            return Err(e);
        }
        let mut done = 0;
        let mut size = old_size;
        while done < n {
            let mut extents = Extents::new();
            let mut k = 0;
            while done + k < n && extents.push(PageNo::new(pages[done + k]), 1) {
                k += 1;
            }
            let chunk_first = first + done as u64;
            let chunk_end = end.min((chunk_first + k as u64) * PAGE);
            match self
                .commit(ino, chunk_first, chunk_end, &extents, caller)
                .and_then(Reply::into_size)
            {
                Ok(s) => size = s,
                Err(e) => {
                    self.give_back(caller, &pages[done..]);
                    return Err(e);
                }
            }
            done += k;
        }
        Ok(Reply::Size(size))
    }

    /// Fills `pages` with file bytes from the page holding `offset`: the
    /// `len` bytes staged in `caller`'s slot at `offset`, copied straight
    /// from the staging area into the pages, and the file's old bytes
    /// around them in the first and last page (zeros past `old_size`);
    /// and makes them durable.
    fn fill_staged(
        &self,
        inode: InodeOff,
        old_size: u64,
        offset: u64,
        len: u64,
        caller: Caller,
        pages: &[u64],
    ) -> Result<(), Errno> {
        let staging = self
            .data
            .clients
            .get(&caller.client)
            .and_then(|c| c.staging.as_ref())
            .ok_or(Errno::EOPNOTSUPP)?;
        let staged = u64::from(caller.slot) * STAGE_BYTES;
        let end = offset + len;
        let first = offset / PAGE;
        let region = self.image.region();
        let io = |_| Errno::EIO;
        for (i, &dest) in pages.iter().enumerate() {
            let base = (first + i as u64) * PAGE;
            let (from, to) = (offset.max(base), end.min(base + PAGE));
            if from > base || to < base + PAGE {
                // The file's bytes around the write, zeros past its end
                // and in a hole.
                let mut old = [0u8; PAGE_LEN];
                if let Some((at, keep)) = kept_bytes(self.ns.shm(), inode, old_size, base / PAGE) {
                    region
                        .read(at.byte_offset(), &mut old[..keep])
                        .map_err(io)?;
                }
                let (a, b) = (page_index(from - base), page_index(to - base));
                region.write_nt(dest * PAGE, &old[..a]).map_err(io)?;
                region
                    .write_nt(dest * PAGE + (to - base), &old[b..])
                    .map_err(io)?;
            }
            region
                .write_nt_from(
                    dest * PAGE + (from - base),
                    staging,
                    staged + (from - offset),
                    page_index(to - from),
                )
                .map_err(|_| Errno::EFAULT)?;
        }
        // Durable before the commit's entry, as a client's copy is.
        region.fence();
        Ok(())
    }

    /// Gives `pages` of `caller`'s pool back to the free pages.
    fn give_back(&mut self, caller: Caller, pages: &[u64]) {
        for &p in pages {
            self.undo_grant(caller, p, 1);
        }
    }
}
