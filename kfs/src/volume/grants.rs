//! Grants and pools (ARCHITECTURE.md §8): the free pages Kfs hands a
//! client thread as its pool, given their memory on a sparse image and
//! made writable in the client's view, and the idle pool pages a thread
//! gives back.

use kucofs_common::format::PageNo;
use kucofs_common::index::blockmap::PAGE;
use kucofs_common::pm::Protection;
use kucofs_common::proto::{Grant, Reply, GRANT_RUNS};
use kucofs_common::Errno;

use super::{Caller, Volume};
use crate::pages::Holder;

/// Largest pool one grant hands out (16 MiB).
pub const POOL_MAX: u32 = 4096;
/// A grant hands out at most this fraction of the free pages: a pool is
/// one thread's stock, and the other threads must find pages too when the
/// file system is nearly full (a pool's unused pages come back when its
/// process goes, or when a thread of it finds no page free and asks,
/// [`Request::Unpool`](kucofs_common::proto::Request::Unpool)).
const POOL_SHARE: u64 = 8;
/// Reclamation rounds a grant waits for replaced pages before `ENOSPC`.
const GRANT_TRIES: u32 = 10_000;

impl Volume {
    pub(super) fn grant(&mut self, pages: u32, caller: Caller) -> Result<Reply, Errno> {
        let protection = self.client(caller)?.protection;
        let want = u64::from(pages.clamp(1, POOL_MAX));
        if self.pages.free_pages() == 0 {
            // The last free pages go to file data before a grant fails:
            // those no reader holds any more, then the store's stock
            // beyond what it has promised. (Only then: given back any
            // earlier, the stock would be taken again before the next
            // change, at every grant.)
            self.reclaim_now();
            if self.pages.free_pages() == 0 {
                for p in self.ns.store_mut().spare_stock() {
                    self.pages.release_meta(p);
                }
            }
        }
        // Pages replaced a moment ago become free once the readers still
        // in their epoch move on (readers take no lock, so waiting here
        // holds none of them up).
        let mut tries = 0;
        let mut unreserved = 0;
        let ((start, n), lowest_ready, cap) = loop {
            // The lowest free pages when they are writable here already
            // (always under `off`, which never flips them back); else,
            // since each run costs a protection change, the lowest long
            // run.
            let lowest_ready = match protection {
                Protection::Off | Protection::Keys => true,
                Protection::Strict => false,
                Protection::Batched => match &self.data.clients[&caller.client].view {
                    Some(v) => self
                        .pages
                        .lowest_free(want)
                        .is_some_and(|(s, l)| v.writable(s..s + l)),
                    None => true,
                },
            };
            let share = (self.pages.free_pages() / POOL_SHARE).max(1);
            let cap = want.min(share);
            match self.grant_reserved(caller, cap, !lowest_ready, &mut unreserved) {
                Ok(g) => break (g, lowest_ready, cap),
                // Reserving failed again after a reclamation (which may
                // have freed pages that have memory): the room is gone.
                Err(e) if self.pages.waiting() == 0 || tries == GRANT_TRIES || unreserved > 1 => {
                    return Err(e)
                }
                Err(_) => {
                    if tries > 0 {
                        std::thread::yield_now();
                    }
                    self.reclaim_now();
                    tries += 1;
                }
            }
        };
        // Where free pages lie scattered (each random overwrite frees one
        // somewhere), up to GRANT_RUNS runs more, so that a pool holds
        // more than the page or two of one: under `off` and `keys`, whose
        // pages are writable already, not where each run may cost a
        // protection change.
        let mut runs = [(0, 0); 1 + GRANT_RUNS];
        runs[0] = (start, n);
        let mut count = 1;
        let mut total = n;
        let more = lowest_ready && matches!(protection, Protection::Off | Protection::Keys);
        while more && count < runs.len() && total < cap {
            let Ok(g) = self.grant_reserved(caller, cap - total, false, &mut unreserved) else {
                break;
            };
            runs[count] = g;
            count += 1;
            total += g.1;
        }
        let granted = runs.map(|(s, n)| (PageNo::new(s), n));
        let runs = &runs[..count];
        let changes = &mut self.protection.changes;
        for (&id, c) in self.data.clients.iter_mut() {
            let Some(v) = &mut c.view else { continue };
            // Another client's view may still have some of these pages
            // writable (they left a file there): not any more.
            for &(s, n) in runs {
                v.set(s, n, id == caller.client, changes);
            }
        }
        let reply = Grant::new(&granted[..count])
            .map(Reply::Grant)
            .ok_or(Errno::EIO);
        if self.settle_protection().is_err() || reply.is_err() {
            for &(s, n) in runs {
                self.undo_grant(caller, s, n);
            }
            return Err(Errno::EIO);
        }
        reply
    }

    /// Frees a run of idle pages from the pool of the caller's slot `slot`
    /// (see [`Request::Unpool`](kucofs_common::proto::Request::Unpool)). Under `strict` they become read-only in
    /// the caller's view at once; otherwise they stay writable there until
    /// Kfs grants them to another client, as pages a batch left writable
    /// do.
    pub(super) fn unpool(
        &mut self,
        slot: u32,
        start: PageNo,
        pages: u32,
        caller: Caller,
    ) -> Result<Reply, Errno> {
        let start = start.get();
        let h = Holder {
            client: caller.client,
            slot,
        };
        let n = u64::from(pages);
        // Refused for a client that is not attached too: it holds no pool.
        self.pages.unpool(h, start, n)?;
        let Some(c) = self.data.clients.get_mut(&caller.client) else {
            return Ok(Reply::Done);
        };
        if let (Protection::Strict, Some(v)) = (c.protection, &mut c.view) {
            // Free pages hold nothing a file reads: a failed change costs
            // protection, not data.
            v.set(start, n, false, &mut self.protection.changes);
            let _ = self.settle_protection();
        }
        Ok(Reply::Done)
    }

    /// Grants `caller` up to `cap` free pages (the lowest long run if
    /// `long`, see `Pages::grant`) and gives them their memory
    /// ([`Volume::reserve_granted`]), counting in `unreserved` the calls
    /// whose first reservation failed. Where a sparse image's file system has no
    /// room for a long run, pages never used, the lowest free pages next:
    /// used before, they may have their memory still.
    fn grant_reserved(
        &mut self,
        caller: Caller,
        cap: u64,
        long: bool,
        unreserved: &mut u32,
    ) -> Result<(u64, u64), Errno> {
        let h = holder(caller);
        let (s, n) = self.pages.grant(h, cap, long)?;
        let reserved = self.reserve_granted(caller, s, n);
        if reserved.is_ok() {
            return reserved;
        }
        *unreserved += 1;
        if !long {
            return reserved;
        }
        let (s, n) = self.pages.grant(h, cap, false)?;
        self.reserve_granted(caller, s, n)
    }

    /// Gives the `n` pages from `start` just granted to `caller` their
    /// memory, if the image is sparse, before the client may store to
    /// them: a store to a page the file system under the image has no room
    /// for would kill the client. Where the room runs out, the grant is cut
    /// short (the rest goes back); with none, it fails (`ENOSPC`).
    fn reserve_granted(&mut self, caller: Caller, start: u64, n: u64) -> Result<(u64, u64), Errno> {
        let (got, why) = reserve_prefix(self.image.region(), start, n);
        if got < n {
            self.undo_grant(caller, start + got, n - got);
        }
        match got {
            0 => Err(why.unwrap_or(Errno::ENOSPC)),
            _ => Ok((start, got)),
        }
    }

    /// Takes back a grant whose pages could not be made writable, or
    /// given memory: they go back to the free ones
    /// ([`Volume::protection_failed`] has counted those not made writable
    /// as not known in the caller's view).
    pub(super) fn undo_grant(&mut self, caller: Caller, start: u64, n: u64) {
        let _ = self.pages.unpool(holder(caller), start, n);
    }
}

/// How many of the `n` pages from page `s` have their memory now (see
/// [`Region::reserve`](kucofs_common::pm::Region::reserve)): all of
/// them, or where the file system under a sparse image has too little
/// room, the longest prefix found by halving, and why the rest has not.
fn reserve_prefix(region: &kucofs_common::pm::Region, s: u64, n: u64) -> (u64, Option<Errno>) {
    let mut want = n;
    let mut why = None;
    while want > 0 {
        match region.reserve(s * PAGE, want * PAGE) {
            Ok(()) => return (want, why),
            Err(e) => why = Some(Errno::new(e.errno()).unwrap_or(Errno::EIO)),
        }
        want /= 2;
    }
    (0, why)
}

pub(super) fn holder(caller: Caller) -> Holder {
    Holder {
        client: caller.client,
        slot: caller.slot,
    }
}
