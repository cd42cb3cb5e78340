//! The data pages as Kfs hands them out (ARCHITECTURE.md §8, §9): free extents,
//! pools granted to client threads, pages in files, and pages replaced by
//! a commit that wait for their grace period.
//!
//! Only the pages files and the metadata store hold are durable (the
//! store's owner table names them); free space, pools and waiting pages
//! live in DRAM and are rebuilt at recovery as "every data page nobody
//! holds", which is how a crash gives back the pools that clients held.

mod free;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kucofs_common::channel::SLOTS;

use kucofs_common::format::Geometry;
use kucofs_common::Errno;

use free::FreeMap;

/// Who holds a pool: a client and one of its request slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Holder {
    /// The client (an attached process).
    pub client: u32,
    /// Its request slot (one per client thread).
    pub slot: u32,
}

const FREE: u32 = 0;
const USED: u32 = 1;
const WAITING: u32 = 2;
/// A page of the metadata store.
const META: u32 = 3;
/// States from here up are pools: `POOL + client * SLOTS + slot`.
const POOL: u32 = 4;

impl Holder {
    /// The page state of this holder's pool pages; `None` for a slot that
    /// does not exist or a client number too large to encode (Kfs numbers
    /// clients from 0).
    fn state(self) -> Option<u32> {
        if self.slot as usize >= SLOTS {
            return None;
        }
        let n = u64::from(self.client) * SLOTS as u64 + u64::from(self.slot);
        u32::try_from(n + u64::from(POOL)).ok()
    }
}

/// Why the pages the files and the metadata store hold are not a set of
/// data pages ([`Pages::new`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeldPagesError {
    /// A page held outside the data pages.
    #[error("page {page} is held, but lies outside the data pages {first}..{end}")]
    Outside { page: u64, first: u64, end: u64 },
    /// A page held twice.
    #[error("page {page} is held twice")]
    Twice { page: u64 },
}

/// The data pages.
#[derive(Debug)]
pub struct Pages {
    /// First data page (a page number in the region).
    first: u64,
    /// One past the last.
    end: u64,
    /// Each data page's state (index: page - first).
    state: Vec<u32>,
    /// The free pages (index: page - first), which find the lowest free
    /// page, and the lowest long run, without walking the others (freed
    /// pages come back scattered).
    free: FreeMap,
    /// Pages files hold (in state `USED`).
    used: u64,
    /// Pages the metadata store holds (in state `META`).
    meta: u64,
    /// Replaced pages: (epoch, page), freed once no reader is older.
    waiting: VecDeque<(u64, u64)>,
    /// One past the highest page ever granted, for the Kfs thread's
    /// provisioning (which prepares memory ahead of it).
    high: Arc<AtomicU64>,
}

/// Where a table with one item per data page lies in memory (the pages'
/// states, [`Pages::state_addr`]; the store's owner entries,
/// [`crate::store::Store::owner_addr`]), for a thread that warms the cache
/// ahead of a change it will make under the volume's lock.
#[derive(Debug, Clone, Copy)]
pub struct PageTableAddr {
    /// The address of the first data page's item.
    base: usize,
    /// Bytes of one item.
    size: usize,
    first: u64,
    end: u64,
}

impl PageTableAddr {
    /// The table of `items` (whose first is data page `first`'s).
    pub fn of<T>(items: &[T], first: u64) -> PageTableAddr {
        PageTableAddr {
            base: items.as_ptr() as usize,
            size: std::mem::size_of::<T>(),
            first,
            end: first + items.len() as u64,
        }
    }

    /// Starts loading page `p`'s item into the cache (nothing for a page
    /// outside the table). Only a hint: the address is never read
    /// through, so it may outlive the table.
    #[inline]
    pub fn prefetch(&self, p: u64) {
        if p >= self.first && p < self.end {
            let at = page_index(p - self.first) * self.size;
            kucofs_common::pm::prefetch(self.base.wrapping_add(at));
        }
    }
}

/// `i`, a data page's index from the first data page (or a count of data
/// pages), as an index into (or the length of) a table with one item per
/// data page.
// Lossless: the data pages lie in the image, which is mapped whole into
// the address space, so their count fits a `usize`.
#[allow(clippy::cast_possible_truncation)]
#[inline]
pub fn page_index(i: u64) -> usize {
    i as usize
}

/// A table of `n` copies of `item`, one per data page, asked to sit on
/// huge pages where the kernel grants them on request (transparent huge
/// pages in `madvise` mode). Such tables are written at random pages on
/// every copy-on-write write; on 4 KiB pages a table of a large image
/// spans thousands of pages, and each write would also miss the TLB.
pub fn page_table<T: Clone>(n: usize, item: T) -> Vec<T> {
    const HUGE: usize = 2 << 20;
    let mut v = Vec::with_capacity(n);
    let start = v.as_ptr() as usize;
    let end = start + n * std::mem::size_of::<T>();
    let (from, to) = (start.next_multiple_of(HUGE), end & !(HUGE - 1));
    if to > from {
        // SAFETY: [from, to) lies inside the allocation `v` owns, which
        // nothing references yet; the advice changes how the kernel backs
        // the range, never its contents or its validity. Refusal (huge
        // pages disabled) leaves ordinary pages, so the result is ignored.
        let _ = unsafe {
            rustix::mm::madvise(from as *mut _, to - from, rustix::mm::Advice::LinuxHugepage)
        };
    }
    v.resize(n, item);
    v
}

impl Pages {
    /// The data area of `g`, every page free except those files hold,
    /// `used`, and those of the metadata store, `meta`. Fails with the
    /// first page that is outside the data area or held twice.
    pub fn new(
        g: &Geometry,
        used: impl IntoIterator<Item = u64>,
        meta: impl IntoIterator<Item = u64>,
    ) -> Result<Pages, HeldPagesError> {
        let first = g.data.start;
        let end = g.data.end();
        let mut state = page_table(page_index(end - first), FREE);
        let (mut n_used, mut n_meta) = (0u64, 0u64);
        for (p, mark) in used
            .into_iter()
            .map(|p| (p, USED))
            .chain(meta.into_iter().map(|p| (p, META)))
        {
            if p < first || p >= end {
                return Err(HeldPagesError::Outside {
                    page: p,
                    first,
                    end,
                });
            }
            let s = &mut state[page_index(p - first)];
            if *s != FREE {
                return Err(HeldPagesError::Twice { page: p });
            }
            *s = mark;
            if mark == USED {
                n_used += 1;
            } else {
                n_meta += 1;
            }
        }
        let mut pages = Pages {
            first,
            end,
            free: FreeMap::new(state.len() as u64),
            state,
            used: n_used,
            meta: n_meta,
            waiting: VecDeque::new(),
            high: Arc::new(AtomicU64::new(first)),
        };
        let mut p = first;
        while p < end {
            if pages.state(p) != FREE {
                p += 1;
                continue;
            }
            let start = p;
            while p < end && pages.state(p) == FREE {
                p += 1;
            }
            pages.free.set(start - first, p - start, true);
        }
        Ok(pages)
    }

    /// Where the states lie. The state vector is never resized, so this
    /// holds while these pages live.
    pub fn state_addr(&self) -> PageTableAddr {
        PageTableAddr::of(&self.state, self.first)
    }

    fn state(&self, p: u64) -> u32 {
        self.state[page_index(p - self.first)]
    }

    fn set(&mut self, p: u64, s: u32) {
        self.state[page_index(p - self.first)] = s;
    }

    /// Pages free now (neither in a file, nor in a pool, nor waiting).
    pub fn free_pages(&self) -> u64 {
        self.free.count()
    }

    /// Pages that files and the metadata store hold; the others are
    /// free, in a pool, or waiting for their grace period.
    pub fn used_pages(&self) -> u64 {
        self.used + self.meta
    }

    /// Pages the metadata store holds.
    pub fn meta_pages(&self) -> u64 {
        self.meta
    }

    /// Takes the lowest free page for the metadata store.
    pub fn take_meta(&mut self) -> Option<u64> {
        let i = self.free.lowest()?;
        self.free.set(i, 1, false);
        let p = self.first + i;
        self.set(p, META);
        self.meta += 1;
        Some(p)
    }

    /// Gives back a page of the metadata store; it is free at once (no
    /// client reads store pages, so none waits for a grace period).
    pub fn release_meta(&mut self, p: u64) {
        if p >= self.first && p < self.end && self.state(p) == META {
            self.meta -= 1;
            self.free_page(p);
        }
    }

    /// Pages waiting for their grace period.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Pages in files, counted from their states.
    #[cfg(test)]
    fn used_by_scan(&self) -> u64 {
        self.state.iter().filter(|&&s| s == USED).count() as u64
    }

    /// The first data page.
    pub fn first_page(&self) -> u64 {
        self.first
    }

    /// Data pages in all.
    pub fn total_pages(&self) -> u64 {
        self.end - self.first
    }

    /// The lowest free run: its first page and its length, counted no
    /// further than `max` (a run of fresh pages can be the whole area).
    pub fn lowest_free(&self, max: u64) -> Option<(u64, u64)> {
        let i = self.free.lowest()?;
        Some((self.first + i, self.free.run_from(i, max)))
    }

    /// True if page `p` is in a file (committed, not replaced).
    pub fn in_file(&self, p: u64) -> bool {
        p >= self.first && p < self.end && self.state(p) == USED
    }

    /// True if page `p` is in a client thread's pool.
    pub fn in_pool(&self, p: u64) -> bool {
        p >= self.first && p < self.end && self.state(p) >= POOL
    }

    /// Takes up to `want` free pages, in one run, for `h`'s pool: the
    /// lowest free run, or with `long` the lowest long one when there is
    /// one (a run covering a whole aligned group of 64 pages: every run of
    /// 127 pages or more, none under 64). `ENOSPC` if no page is free.
    ///
    /// Low pages first keeps the pages in use together, and takes pages
    /// freed by earlier commits before pages never written (a fresh page
    /// costs a fault in the client's view). `long` is for clients whose
    /// pool pages are made writable one run at a time: a run of one page
    /// would cost them a protection change of its own. Both picks are a
    /// few word reads of the free map's summaries, however scattered the
    /// free pages are.
    pub fn grant(&mut self, h: Holder, want: u64, long: bool) -> Result<(u64, u64), Errno> {
        let mark = h.state().ok_or(Errno::EINVAL)?;
        let want = want.max(1);
        let i = long
            .then(|| self.free.lowest_long())
            .flatten()
            .or_else(|| self.free.lowest())
            .ok_or(Errno::ENOSPC)?;
        let take = self.free.run_from(i, want);
        self.free.set(i, take, false);
        let start = self.first + i;
        for p in start..start + take {
            self.set(p, mark);
        }
        // Relaxed: the provisioner reads it as a hint of where grants are
        // heading; nothing it does depends on seeing the latest value.
        self.high.fetch_max(start + take, Ordering::Relaxed);
        Ok((start, take))
    }

    /// One past the highest page granted so far, as it moves.
    pub fn high_water_handle(&self) -> Arc<AtomicU64> {
        self.high.clone()
    }

    /// Frees the pool pages `start..start + n`, unchecked: a grant just
    /// made, `(start, n)` from [`Pages::grant`], that could not be handed
    /// over, or a run [`Pages::unpool`] checked. The holder's other pool
    /// pages stay.
    pub fn ungrant(&mut self, start: u64, n: u64) {
        for p in start..start + n {
            self.set(p, FREE);
        }
        self.free.set(start - self.first, n, true);
    }

    /// Frees the run of `n` pages from `start`, every one of which must be
    /// in `h`'s pool (`EINVAL`, and nothing changes, otherwise).
    pub fn unpool(&mut self, h: Holder, start: u64, n: u64) -> Result<(), Errno> {
        let mark = h.state().ok_or(Errno::EINVAL)?;
        let end = start.checked_add(n).ok_or(Errno::EINVAL)?;
        if n == 0 || start < self.first || end > self.end {
            return Err(Errno::EINVAL);
        }
        if (start..end).any(|p| self.state(p) != mark) {
            return Err(Errno::EINVAL);
        }
        self.ungrant(start, n);
        Ok(())
    }

    /// Checks that every page of `pages` is in `h`'s pool and unused, with
    /// none named twice; then moves them into a file.
    pub fn take(&mut self, h: Holder, pages: &[u64]) -> Result<(), Errno> {
        let mark = h.state().ok_or(Errno::EINVAL)?;
        for (i, &p) in pages.iter().enumerate() {
            if p < self.first || p >= self.end || self.state(p) != mark {
                self.untake(h, &pages[..i]);
                return Err(Errno::EINVAL);
            }
            // Marked as we go, so that a page named twice fails the check.
            self.set(p, USED);
            self.used += 1;
        }
        Ok(())
    }

    /// Undoes [`Pages::take`] of pages a failed commit had claimed.
    pub fn untake(&mut self, h: Holder, pages: &[u64]) {
        if let Some(mark) = h.state() {
            for &p in pages {
                if p >= self.first && p < self.end && self.state(p) == USED {
                    self.set(p, mark);
                    self.used -= 1;
                }
            }
        }
    }

    /// Puts `page`, replaced in a file during `epoch`, to wait for the
    /// grace period.
    pub fn retire(&mut self, page: u64, epoch: u64) {
        if page >= self.first && page < self.end && self.state(page) == USED {
            self.set(page, WAITING);
            self.used -= 1;
            self.waiting.push_back((epoch, page));
        }
    }

    fn free_page(&mut self, p: u64) {
        self.set(p, FREE);
        self.free.set(p - self.first, 1, true);
    }

    /// Frees the waiting pages replaced before `oldest_reader`'s epoch.
    pub fn reclaim(&mut self, oldest_reader: u64) -> usize {
        let mut n = 0;
        while let Some(&(epoch, p)) = self.waiting.front() {
            if epoch >= oldest_reader {
                break;
            }
            self.waiting.pop_front();
            self.free_page(p);
            n += 1;
        }
        n
    }

    /// Frees the pool pages whose state is in `marks`; returns how many.
    /// A scan of every data page: pools are given back rarely (a client
    /// going away), so Kfs keeps no list of them.
    fn release_marked(&mut self, marks: std::ops::Range<u64>) -> u64 {
        let mut freed = 0;
        for p in self.first..self.end {
            if marks.contains(&u64::from(self.state(p))) {
                self.free_page(p);
                freed += 1;
            }
        }
        freed
    }

    #[cfg(test)]
    /// Frees the unused pages of `h`'s pool; returns how many.
    pub fn release(&mut self, h: Holder) -> u64 {
        match h.state() {
            Some(m) => self.release_marked(u64::from(m)..u64::from(m) + 1),
            None => 0,
        }
    }

    /// Frees the unused pool pages of every slot of `client`.
    pub fn release_client(&mut self, client: u32) -> u64 {
        let first = u64::from(POOL) + u64::from(client) * SLOTS as u64;
        self.release_marked(first..first + SLOTS as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry() -> Geometry {
        Geometry::for_size(8 << 20).unwrap()
    }

    const A: Holder = Holder { client: 0, slot: 0 };
    const B: Holder = Holder { client: 0, slot: 1 };

    /// The free runs, each as long as it goes, from a scan of every page.
    fn runs(p: &Pages) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for q in p.first..p.end {
            if !p.free.is_free(q - p.first) {
                continue;
            }
            match runs.last_mut() {
                Some((s, l)) if *s + *l == q => *l += 1,
                _ => runs.push((q, 1)),
            }
        }
        runs
    }

    /// Grants `A` a pool of `n` pages at the bottom of a fresh data area
    /// and puts them all in a file; returns the first.
    fn pool_in_a_file(p: &mut Pages, n: u64) -> u64 {
        let (s, got) = p.grant(A, n, true).unwrap();
        assert_eq!(got, n);
        let pages: Vec<u64> = (s..s + n).collect();
        p.take(A, &pages).unwrap();
        s
    }

    #[test]
    fn pools_commits_and_grace_periods() {
        let g = geometry();
        let mut p = Pages::new(&g, [], []).unwrap();
        let total = p.free_pages();
        let (s, n) = p.grant(A, 16, true).unwrap();
        assert_eq!(n, 16);
        assert_eq!(p.free_pages(), total - 16);
        // Another slot cannot commit A's pages; A can, once.
        assert_eq!(p.take(B, &[s]), Err(Errno::EINVAL));
        p.take(A, &[s, s + 1]).unwrap();
        assert_eq!(p.take(A, &[s]), Err(Errno::EINVAL));
        assert_eq!(p.take(A, &[s + 2, s + 2]), Err(Errno::EINVAL));
        p.untake(A, &[s + 2]);
        assert_eq!(p.take(A, &[g.data.end()]), Err(Errno::EINVAL));
        // A replaced page waits for readers older than its epoch.
        p.retire(s, 5);
        assert_eq!(p.reclaim(5), 0);
        assert_eq!(p.reclaim(6), 1);
        // Unused pool pages come back on release: 16 - 2 taken.
        assert_eq!(p.release(A), 14);
        assert_eq!(p.free_pages(), total - 1);
        assert_eq!(p.used_pages(), 1);
        assert_eq!(p.used_by_scan(), 1);
    }

    #[test]
    fn a_slot_past_the_last_is_no_holder_and_cannot_take_another_clients_pages() {
        let g = geometry();
        let mut p = Pages::new(&g, [], []).unwrap();
        // Slot SLOTS of client 0 would encode as slot 0 of client 1.
        let next_client = Holder { client: 1, slot: 0 };
        let (s, _) = p.grant(next_client, 8, true).unwrap();
        let past = Holder {
            client: 0,
            slot: u32::try_from(SLOTS).unwrap(),
        };
        assert_eq!(p.take(past, &[s]), Err(Errno::EINVAL));
        assert_eq!(p.grant(past, 8, true), Err(Errno::EINVAL));
        assert_eq!(p.release(past), 0);
        p.take(next_client, &[s]).unwrap();
    }

    /// A fresh data area whose every page is granted to `A`: the pages,
    /// the first and the count.
    fn all_granted_to_a() -> (Pages, u64, u64) {
        let mut p = Pages::new(&geometry(), [], []).unwrap();
        let total = p.free_pages();
        let (s, n) = p.grant(A, u64::MAX, true).unwrap();
        assert_eq!(n, total);
        (p, s, n)
    }

    #[test]
    fn running_out_is_enospc_and_freeing_merges_runs() {
        let (mut p, s, total) = all_granted_to_a();
        assert_eq!(p.grant(B, 1, true), Err(Errno::ENOSPC));
        assert_eq!(p.release(A), total);
        assert_eq!(p.grant(B, u64::MAX, true).unwrap(), (s, total));
    }

    #[test]
    fn unpool_frees_only_unused_pages_of_the_named_pool() {
        let (mut p, s, n) = all_granted_to_a();
        p.take(A, &[s + 4]).unwrap();
        // Another holder's pool, a page in a file, a run past the end, an
        // empty run, a slot past the last: refused, and nothing changes.
        assert_eq!(p.unpool(B, s, 4), Err(Errno::EINVAL));
        assert_eq!(p.unpool(A, s, 5), Err(Errno::EINVAL));
        assert_eq!(p.unpool(A, s + 5, n), Err(Errno::EINVAL));
        assert_eq!(p.unpool(A, u64::MAX, 2), Err(Errno::EINVAL));
        assert_eq!(p.unpool(A, s, 0), Err(Errno::EINVAL));
        let past = Holder {
            client: 0,
            slot: u32::try_from(SLOTS).unwrap(),
        };
        assert_eq!(p.unpool(past, s, 1), Err(Errno::EINVAL));
        assert_eq!(p.free_pages(), 0);
        // The unused pages either side of the file's page come back, as
        // two runs another holder can be granted; the file's page stays.
        p.unpool(A, s, 4).unwrap();
        p.unpool(A, s + 5, n - 5).unwrap();
        assert_eq!(p.free_pages(), n - 1);
        assert_eq!(p.grant(B, u64::MAX, true).unwrap(), (s + 5, n - 5));
        assert_eq!(p.grant(B, u64::MAX, true).unwrap(), (s, 4));
        assert_eq!(p.unpool(A, s, 1), Err(Errno::EINVAL));
        assert_eq!(p.used_pages(), 1);
        assert_eq!(p.used_by_scan(), 1);
    }

    #[test]
    fn recovery_refuses_pages_outside_or_held_twice() {
        let g = geometry();
        assert!(Pages::new(&g, [g.data.start], [g.data.start]).is_err());
        assert!(Pages::new(&g, [0], []).is_err());
        let p = Pages::new(&g, [g.data.start + 3], [g.data.start + 1]).unwrap();
        assert_eq!(p.used_pages(), 2);
        assert_eq!((p.used_by_scan(), p.meta_pages()), (1, 1));
        assert!(p.in_file(g.data.start + 3) && !p.in_file(g.data.start + 1));
    }

    #[test]
    fn store_pages_come_lowest_first_from_the_free_pages() {
        let g = geometry();
        let mut p = Pages::new(&g, [], []).unwrap();
        let total = p.free_pages();
        assert_eq!(p.take_meta(), Some(g.data.start));
        assert_eq!(p.take_meta(), Some(g.data.start + 1));
        assert_eq!((p.free_pages(), p.meta_pages()), (total - 2, 2));
        p.release_meta(g.data.start);
        assert_eq!(p.free_pages(), total - 1);
        // A page that is not the store's is not given back as one.
        p.release_meta(g.data.start + 5);
        assert_eq!(p.free_pages(), total - 1);
        // Grants take every free page, and the store none after them.
        let mut granted = 0;
        while p.free_pages() > 2 {
            granted += p.grant(A, p.free_pages() - 2, false).unwrap().1;
        }
        assert_eq!(granted, total - 1 - 2);
        assert!(p.take_meta().is_some() && p.take_meta().is_some());
        assert_eq!(p.take_meta(), None);
        assert_eq!(p.grant(A, 1, false), Err(Errno::ENOSPC));
    }

    #[test]
    fn an_ungranted_pool_run_comes_back_and_the_earlier_one_stays() {
        let g = geometry();
        let mut p = Pages::new(&g, [], []).unwrap();
        let total = p.free_pages();
        let (s1, n1) = p.grant(A, 8, true).unwrap();
        let (s2, n2) = p.grant(A, 8, true).unwrap();
        p.ungrant(s2, n2);
        assert_eq!(p.free_pages(), total - n1);
        assert_eq!(p.take(A, &[s2]), Err(Errno::EINVAL));
        p.take(A, &[s1 + n1 - 1]).unwrap();
        // The run merged back: the next grant starts where it did.
        assert_eq!(p.grant(B, 8, true).unwrap().0, s2);
    }

    #[test]
    fn freed_pages_are_granted_before_fresh_ones_and_long_grants_skip_short_runs() {
        let g = geometry();
        let mut p = Pages::new(&g, [], []).unwrap();
        let n = 1024;
        // The pool is committed, then every other page of it replaced.
        let s = pool_in_a_file(&mut p, n);
        for q in (s..s + n).step_by(2) {
            p.retire(q, 1);
        }
        assert_eq!(p.reclaim(2), 512);
        // Any length: the lowest freed page, one at a time, never a fresh
        // page while freed ones are left.
        for k in 0..3 {
            assert_eq!(p.grant(B, 16, false).unwrap(), (s + 2 * k, 1));
        }
        // Long: past the short runs, to the fresh pages after the pool.
        assert_eq!(p.grant(B, 16, true).unwrap(), (s + n, 16));
        // With no long run left, a long grant takes a short one.
        p.grant(B, u64::MAX, true).unwrap();
        assert_eq!(p.grant(B, 16, true).unwrap(), (s + 6, 1));
    }

    #[test]
    fn a_freed_page_merges_with_the_free_runs_beside_it_and_only_those() {
        let g = geometry();
        let mut p = Pages::new(&g, [], []).unwrap();
        let n = 16;
        let s = pool_in_a_file(&mut p, n);
        let near = |p: &Pages| -> Vec<(u64, u64)> {
            runs(p)
                .into_iter()
                .filter(|&(a, _)| a <= s + n)
                .map(|(a, l)| (a - s, l.min(n + 1 - (a - s))))
                .collect()
        };
        // Pages 3 and 5 between pages in use: runs of their own. (The
        // fresh pages after the pool are a run starting at 16.)
        for q in [3, 5] {
            p.retire(s + q, 1);
        }
        p.reclaim(2);
        assert_eq!(near(&p), [(3, 1), (5, 1), (16, 1)]);
        // 4 joins both neighbours; 6 joins the run on its left; 15 the
        // fresh run on its right; 0, at the start of the data pages, none.
        for q in [4, 6, 15, 0] {
            p.retire(s + q, 3);
        }
        p.reclaim(4);
        assert_eq!(near(&p), [(0, 1), (3, 4), (15, 2)]);
        let all = runs(&p);
        assert_eq!(p.free_pages(), all.iter().map(|r| r.1).sum::<u64>());
        assert_eq!(all.len(), 3, "no other run: {all:?}");
        // The lowest free run is the first, as long as it goes.
        assert_eq!(p.lowest_free(u64::MAX), Some((s, 1)));
        assert_eq!(p.lowest_free(0), Some((s, 0)));
    }

    #[test]
    fn the_free_count_follows_every_change_of_the_runs() {
        let g = geometry();
        let mut p = Pages::new(&g, [], []).unwrap();
        let sum = |p: &Pages| runs(p).iter().map(|r| r.1).sum::<u64>();
        assert_eq!(p.free_pages(), sum(&p));
        let (s, n) = p.grant(A, 40, false).unwrap();
        let (s2, _) = p.grant(A, 100, true).unwrap();
        assert_eq!(p.free_pages(), sum(&p));
        p.take(A, &[s, s + 1, s + 5, s2]).unwrap();
        for (i, page) in [s, s + 5, s2].into_iter().enumerate() {
            p.retire(page, i as u64);
        }
        assert_eq!(p.free_pages(), sum(&p));
        p.reclaim(u64::MAX);
        p.ungrant(s + 10, n - 10);
        assert_eq!(p.free_pages(), sum(&p));
        p.release(A);
        assert_eq!(p.free_pages(), sum(&p));
        assert_eq!(p.free_pages() + p.used_pages(), p.total_pages());
    }
}
