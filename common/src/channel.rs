//! Request channels between client threads and Kfs (ARCHITECTURE.md §5).
//!
//! Each client process has a [`Segment`] of shared memory: one slot per
//! client thread, each starting on its own cache line with the words that
//! change hands (request sequence, reply sequence, reader epoch, futex
//! words), followed by the reply and request records. A bitmap of pending
//! slots lets Kfs find work without scanning every slot.
//!
//! Kfs sleeps on the [`Doorbell`], one per Kfs, when it has been idle for a
//! while; a client rings it only if Kfs said it is asleep.
//!
//! Every wait is a Dekker-style handshake with `SeqCst` on both sides: the
//! waiter publishes "I am waiting" then re-checks the condition; the waker
//! publishes the condition then checks "is anyone waiting". In the single
//! total order of `SeqCst` operations one of them sees the other's store,
//! so no wake-up is lost.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::pm::Shm;
use crate::proto::{Reply, ReplyKind, Request, REPLY_SIZE, REQUEST_MAX};
use crate::Errno;

/// Slots in a segment: the client threads one process can have in the file
/// system at once.
pub const SLOTS: usize = 128;
/// Bytes per slot: the control line, the reply and the largest request,
/// rounded up to whole pages.
pub const SLOT_SIZE: u64 = (REQUEST_RECORD + REQUEST_MAX as u64).next_multiple_of(4096);
/// Segment magic, "KucoSEG1".
const MAGIC: u64 = u64::from_le_bytes(*b"KucoSEG1");

// Segment header.
const H_MAGIC: u64 = 0;
const H_SLOTS: u64 = 8;
/// Pending bitmap: one bit per slot, on its own cache line.
const H_PENDING: u64 = 64;
/// Nonzero once Kfs has evicted the client (ARCHITECTURE.md §9): it no
/// longer waits for the client's reader epochs, so a read section that
/// ends and finds this set may have read reused memory. On its own line.
const H_EVICTED: u64 = 128;
const SLOTS_AT: u64 = 4096;

// Slot layout: the control line, then the reply, then the request.
const S_REQ_SEQ: u64 = 0;
const S_RESP_SEQ: u64 = 8;
/// Reader epoch: 0 outside the index, else 1 + the epoch entered in.
const S_EPOCH: u64 = 16;
/// Client waiting for its reply (futex protocol flag).
const S_WAITING: u64 = 24;
/// Futex word the client sleeps on; Kfs bumps it to wake the client.
const S_WAKE: u64 = 28;
const S_REQ_LEN: u64 = 32;
/// The file this slot's thread is writing (0: none), and the lease
/// generation the write runs under (0: not known yet), and whether its
/// last request has gone out (ARCHITECTURE.md §8). Kfs moves a write lease
/// only away from a client none of whose slots writes the file, except
/// after a bound.
const S_WRITE_INO: u64 = 40;
const S_WRITE_LEASE: u64 = 48;
const S_WRITE_LAST: u64 = 56;
const REPLY_RECORD: u64 = 64;
const REQUEST_RECORD: u64 = 192;
// The reply fits between its start and the request's.
const _: () = assert!(REPLY_RECORD + REPLY_SIZE as u64 <= REQUEST_RECORD);

// Doorbell layout.
const D_SLEEPING: u64 = 0;
const D_BELL: u64 = 4;
const DOORBELL_SIZE: u64 = 4096;
/// Bytes of a request segment.
const SEGMENT_SIZE: u64 = SLOTS_AT + SLOTS as u64 * SLOT_SIZE;

/// How long a client spins for its reply before it yields, and then sleeps,
/// counted from the end of its first [`QUICK_POLLS`] polls.
const CLIENT_SPIN: Duration = Duration::from_micros(20);
const CLIENT_YIELD: Duration = Duration::from_micros(200);
/// Polls of the reply sequence a client makes before it reads the clock
/// at all (a few microseconds): most replies come within them, and a
/// clock read costs about a tenth of a whole round trip.
const QUICK_POLLS: u32 = 256;

thread_local! {
    static ENCODE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn slot_at(slot: usize) -> u64 {
    SLOTS_AT + slot as u64 * SLOT_SIZE
}

/// A client's request segment, as either side maps it.
#[derive(Debug)]
pub struct Segment {
    shm: Shm,
}

impl Segment {
    /// A new segment with all slots free.
    pub fn create() -> crate::Result<Segment> {
        let len = SEGMENT_SIZE;
        let shm = Shm::create("kucofs-channel", len, len)?;
        // A client process holds this read-write: it must not be able to
        // truncate it under Kfs's mapping.
        shm.seal_size()?;
        shm.store_u64(H_SLOTS, SLOTS as u64, Ordering::Relaxed)?;
        shm.store_u64(H_MAGIC, MAGIC, Ordering::Release)?;
        Ok(Segment { shm })
    }

    /// The segment behind `fd`, as another process handed it: checked to
    /// be one (its size and magic) before it is used.
    pub fn from_fd(fd: std::os::fd::OwnedFd) -> crate::Result<Segment> {
        let shm = Shm::from_fd(fd, "kucofs-channel")?;
        let len = SEGMENT_SIZE;
        let magic = shm.try_load_u64(H_MAGIC, Ordering::Acquire).ok();
        let slots = shm.try_load_u64(H_SLOTS, Ordering::Relaxed).ok();
        if shm.len() != len || magic != Some(MAGIC) || slots != Some(SLOTS as u64) {
            return Err(crate::Error::Unusable {
                path: "kucofs-channel".into(),
                why: "it is not a request segment of this version".into(),
            });
        }
        Ok(Segment { shm })
    }

    /// The segment's descriptor, to hand to a client process.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.shm.fd()
    }

    /// The other side's mapping of the same segment.
    pub fn map_again(&self) -> crate::Result<Segment> {
        Ok(Segment {
            shm: self.shm.map_again()?,
        })
    }

    fn word(&self, slot: usize, field: u64) -> u64 {
        slot_at(slot) + field
    }

    // ---- client side --------------------------------------------------------

    /// Sends `req` from `slot` and waits for Kfs's reply: the reply, or
    /// the failure Kfs answered, or `EPROTO` for a reply not of the kind
    /// `req` expects (see [`Reply::decode`]).
    pub fn call(
        &self,
        slot: usize,
        doorbell: &Doorbell,
        req: &Request<'_>,
    ) -> Result<Reply, Errno> {
        self.call_while(slot, doorbell, req, &|| true)
    }

    /// [`Segment::call`] to a Kfs that may go away: while it waits long
    /// enough to sleep, it asks `alive` every time it wakes (at least
    /// every 100 ms), and gives up with `ENOTCONN` once that says no.
    pub fn call_while(
        &self,
        slot: usize,
        doorbell: &Doorbell,
        req: &Request<'_>,
        alive: &dyn Fn() -> bool,
    ) -> Result<Reply, Errno> {
        if slot >= SLOTS {
            return Err(Errno::EINVAL);
        }
        let io = |_| Errno::EIO;
        let shm = &self.shm;
        // Encoded in a per-thread buffer: zeroing a fresh one per call would
        // cost more than the encoding.
        let len = ENCODE.with(|b| -> Result<usize, Errno> {
            let mut buf = b.borrow_mut();
            let len = req.encode(&mut buf)?;
            shm.write(self.word(slot, REQUEST_RECORD), &buf[..len])
                .map_err(io)?;
            Ok(len)
        })?;
        shm.store_u64(self.word(slot, S_REQ_LEN), len as u64, Ordering::Relaxed)
            .map_err(io)?;
        let seq = shm
            .try_load_u64(self.word(slot, S_REQ_SEQ), Ordering::Relaxed)
            .map_err(io)?
            + 1;
        // Release: the request bytes are visible before the new sequence
        // (pairs with Kfs's Acquire load of the request sequence).
        shm.store_u64(self.word(slot, S_REQ_SEQ), seq, Ordering::Release)
            .map_err(io)?;
        // SeqCst: ordered before the load of "Kfs sleeping" in `ring`.
        shm.fetch_or_u64(
            H_PENDING + 8 * (slot as u64 / 64),
            1 << (slot % 64),
            Ordering::SeqCst,
        )
        .map_err(io)?;
        doorbell.ring();
        self.wait_reply(slot, seq, req.reply_kind(), alive)
    }

    fn wait_reply(
        &self,
        slot: usize,
        seq: u64,
        expect: ReplyKind,
        alive: &dyn Fn() -> bool,
    ) -> Result<Reply, Errno> {
        let shm = &self.shm;
        let io = |_| Errno::EIO;
        let resp = self.word(slot, S_RESP_SEQ);
        // Acquire pairs with Kfs's Release store of the reply sequence: the
        // reply bytes are visible once the sequence is.
        let done = || shm.try_load_u64(resp, Ordering::Acquire).map(|s| s == seq);
        let mut polls = 0;
        let mut start = None;
        while !done().map_err(io)? {
            if polls < QUICK_POLLS {
                polls += 1;
                std::hint::spin_loop();
                continue;
            }
            let waited = start.get_or_insert_with(Instant::now).elapsed();
            if waited < CLIENT_SPIN {
                std::hint::spin_loop();
            } else if waited < CLIENT_YIELD {
                std::thread::yield_now();
            } else {
                let wake = self.word(slot, S_WAKE);
                let w = shm.try_load_u32(wake, Ordering::SeqCst).map_err(io)?;
                shm.store_u32(self.word(slot, S_WAITING), 1, Ordering::SeqCst)
                    .map_err(io)?;
                // SeqCst fence: the flag is ordered before the re-check's
                // load (pairs with Kfs's fence between its reply sequence
                // store and its load of the flag). Without it the re-check,
                // an Acquire load, could miss the reply while Kfs misses the
                // flag, and the client would sleep out its timeout.
                std::sync::atomic::fence(Ordering::SeqCst);
                if !done().map_err(io)? {
                    shm.futex_wait(wake, w, Some(Duration::from_millis(100)))
                        .map_err(io)?;
                }
                shm.store_u32(self.word(slot, S_WAITING), 0, Ordering::Relaxed)
                    .map_err(io)?;
                if !done().map_err(io)? && !alive() {
                    return Err(Errno::ENOTCONN);
                }
            }
        }
        let mut r = [0u8; REPLY_SIZE];
        shm.try_read(self.word(slot, REPLY_RECORD), &mut r)
            .map_err(io)?;
        Reply::decode(&r, expect)
    }

    /// Enters the index for reading from `slot` (epoch-based reclamation,
    /// ARCHITECTURE.md §9): items removed from now on are not reused until
    /// [`unpin`](Self::unpin). `epoch` reads the index's global epoch.
    pub fn pin(&self, slot: usize, epoch: impl Fn() -> u64) {
        let at = self.word(slot, S_EPOCH);
        loop {
            let e = epoch();
            // SeqCst store then SeqCst re-load of the epoch: pairs with
            // Kfs's SeqCst epoch bump followed by its slot loads, so either
            // Kfs sees this slot or this thread sees the new epoch.
            if self.shm.store_u64(at, e + 1, Ordering::SeqCst).is_err() || epoch() == e {
                return;
            }
        }
    }

    /// Leaves the index.
    pub fn unpin(&self, slot: usize) {
        // Release: every read of the index happens before the slot says
        // "outside" (pairs with Kfs's slot loads before it reuses items).
        let _ = self
            .shm
            .store_u64(self.word(slot, S_EPOCH), 0, Ordering::Release);
    }

    /// True once Kfs has evicted this client ([`Segment::evict`]). A
    /// reader calls this after [`unpin`](Self::unpin): if it is false,
    /// nothing the read section loaded came from memory Kfs reused.
    pub fn evicted(&self) -> bool {
        // Acquire fence: the read section's loads are ordered before this
        // load. Pairs with Kfs's SeqCst store of the word in `evict`, made
        // before it frees anything this client may be reading, and so
        // before any store into that memory once reused: if a load of the
        // section saw such a store, this load sees the word (loads are
        // not reordered with loads on x86-64, the one target).
        std::sync::atomic::fence(Ordering::Acquire);
        self.shm
            .try_load_u64(H_EVICTED, Ordering::Acquire)
            .map_or(true, |e| e != 0)
    }

    /// Marks `slot`'s thread as writing file `ino` (ARCHITECTURE.md §8),
    /// under the lease generation `lease` (0 while it does not know one).
    /// Kfs does not take the file's lease from this client while the mark
    /// stands (up to a bound), and refuses a commit whose slot names
    /// another generation than the lease's.
    pub fn mark_write(&self, slot: usize, ino: u64, lease: u64) {
        let _ = self
            .shm
            .store_u64(self.word(slot, S_WRITE_LAST), 0, Ordering::Relaxed);
        let _ = self
            .shm
            .store_u64(self.word(slot, S_WRITE_LEASE), lease, Ordering::Relaxed);
        // SeqCst: pairs with Kfs's SeqCst loads of the marks when it
        // decides whether to move the lease. A mark Kfs misses costs the
        // write a redo, never its atomicity: the commit's check of the
        // generation decides that.
        let _ = self
            .shm
            .store_u64(self.word(slot, S_WRITE_INO), ino, Ordering::SeqCst);
    }

    /// Says that the request `slot` sends next is the last of its write:
    /// once Kfs has applied it, Kfs may hand the lease to a client that
    /// asked for it.
    pub fn mark_last(&self, slot: usize) {
        // Relaxed: the request's Release store of its sequence publishes it.
        let _ = self
            .shm
            .store_u64(self.word(slot, S_WRITE_LAST), 1, Ordering::Relaxed);
    }

    /// Clears `slot`'s write mark, once the write's last reply is in.
    pub fn clear_write(&self, slot: usize) {
        // Release: nothing of the write happens after the mark is gone
        // (pairs with Kfs's SeqCst loads of the marks).
        let _ = self
            .shm
            .store_u64(self.word(slot, S_WRITE_INO), 0, Ordering::Release);
    }

    // ---- Kfs side -----------------------------------------------------------

    /// The write mark of `slot` ([`Segment::mark_write`]): the file, the
    /// lease generation and whether the write's last request is out;
    /// `None` if the slot is not writing. Untrusted, as every word of the
    /// segment.
    pub fn write_mark(&self, slot: usize) -> Option<(u64, u64, bool)> {
        if slot >= SLOTS {
            return None;
        }
        let load = |f| {
            self.shm
                .try_load_u64(self.word(slot, f), Ordering::SeqCst)
                .unwrap_or(0)
        };
        let ino = load(S_WRITE_INO);
        (ino != 0).then(|| (ino, load(S_WRITE_LEASE), load(S_WRITE_LAST) != 0))
    }

    /// The slots whose threads are writing file `ino`.
    pub fn writers_of(&self, ino: u64) -> impl Iterator<Item = usize> + '_ {
        (0..SLOTS).filter(move |&s| self.write_mark(s).is_some_and(|m| m.0 == ino))
    }

    /// Evicts the client (see [`Segment::evicted`]): called by Kfs before
    /// it stops waiting for the client's reader epochs.
    pub fn evict(&self) {
        // SeqCst: ordered before every store Kfs or a writer makes into
        // memory freed after this (pairs with the fence in `evicted`).
        let _ = self.shm.store_u64(H_EVICTED, 1, Ordering::SeqCst);
    }

    /// Takes the pending bits of slots `64 * word ..`.
    pub fn take_pending(&self, word: usize) -> u64 {
        let at = H_PENDING + 8 * word as u64;
        // A plain load first: polling must not take the line exclusively
        // (as a swap would) while clients are setting bits in it.
        if self.shm.try_load_u64(at, Ordering::Relaxed).unwrap_or(0) == 0 {
            return 0;
        }
        // AcqRel: pairs with the clients' SeqCst fetch_or.
        self.shm.swap_u64(at, 0, Ordering::AcqRel).unwrap_or(0)
    }

    /// True if any slot is pending.
    pub fn any_pending(&self) -> bool {
        (0..SLOTS / 64).any(|w| {
            self.shm
                .try_load_u64(H_PENDING + 8 * w as u64, Ordering::SeqCst)
                .unwrap_or(0)
                != 0
        })
    }

    /// Serves the request in `slot`, if one is waiting: copies it out (the
    /// client may scribble on the slot at any time), decodes it, calls
    /// `handle`, writes the reply and wakes the client. Returns whether a
    /// request was served.
    pub fn serve(
        &self,
        slot: usize,
        buf: &mut [u8; REQUEST_MAX],
        handle: impl FnOnce(Result<Request<'_>, Errno>) -> Result<Reply, Errno>,
    ) -> bool {
        let shm = &self.shm;
        let Ok(seq) = shm.try_load_u64(self.word(slot, S_REQ_SEQ), Ordering::Acquire) else {
            return false;
        };
        let done = shm
            .try_load_u64(self.word(slot, S_RESP_SEQ), Ordering::Relaxed)
            .unwrap_or(seq);
        if seq == done {
            return false;
        }
        let len = shm
            .try_load_u64(self.word(slot, S_REQ_LEN), Ordering::Relaxed)
            .unwrap_or(u64::MAX);
        let req = match usize::try_from(len) {
            Ok(n) if n <= REQUEST_MAX => {
                if shm
                    .try_read(self.word(slot, REQUEST_RECORD), &mut buf[..n])
                    .is_ok()
                {
                    Request::decode(&buf[..n])
                } else {
                    Err(Errno::EPROTO)
                }
            }
            _ => Err(Errno::EPROTO),
        };
        let reply = handle(req);
        let _ = shm.write(self.word(slot, REPLY_RECORD), &Reply::encode(&reply));
        // Release: the reply bytes are visible before the sequence (pairs
        // with the client's Acquire load in `wait_reply`).
        let _ = shm.store_u64(self.word(slot, S_RESP_SEQ), seq, Ordering::Release);
        // SeqCst: the reply sequence is ordered before the load of the
        // client's waiting flag (pairs with the client's SeqCst store of the
        // flag followed by its re-check).
        std::sync::atomic::fence(Ordering::SeqCst);
        if matches!(
            shm.try_load_u32(self.word(slot, S_WAITING), Ordering::SeqCst),
            Ok(1)
        ) {
            // S_WAKE is the upper half of the 8-byte word at S_WAITING
            // (little-endian), so adding 1 << 32 to that word bumps it.
            let _ = shm.fetch_add_u64(self.word(slot, S_WAITING), 1 << 32, Ordering::SeqCst);
            let _ = shm.futex_wake(self.word(slot, S_WAKE), 1);
        }
        true
    }

    /// Every slot's reader epoch word (0 = outside the index).
    pub fn epochs(&self) -> impl Iterator<Item = u64> + '_ {
        (0..SLOTS).map(|s| {
            self.shm
                .try_load_u64(self.word(s, S_EPOCH), Ordering::SeqCst)
                .unwrap_or(0)
        })
    }
}

/// The word Kfs sleeps on when idle, and the flag saying it does.
#[derive(Debug)]
pub struct Doorbell {
    shm: Shm,
}

impl Doorbell {
    /// A new doorbell.
    pub fn create() -> crate::Result<Doorbell> {
        let shm = Shm::create("kucofs-doorbell", DOORBELL_SIZE, DOORBELL_SIZE)?;
        // Every client process holds this read-write (see `Segment::create`).
        shm.seal_size()?;
        Ok(Doorbell { shm })
    }

    /// The doorbell behind `fd`, as another process handed it.
    pub fn from_fd(fd: std::os::fd::OwnedFd) -> crate::Result<Doorbell> {
        let shm = Shm::from_fd(fd, "kucofs-doorbell")?;
        if shm.len() != DOORBELL_SIZE {
            return Err(crate::Error::Unusable {
                path: "kucofs-doorbell".into(),
                why: "it is not a doorbell of this version".into(),
            });
        }
        Ok(Doorbell { shm })
    }

    /// The doorbell's descriptor, to hand to a client process.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.shm.fd()
    }

    /// Another mapping of it (for a client).
    pub fn map_again(&self) -> crate::Result<Doorbell> {
        Ok(Doorbell {
            shm: self.shm.map_again()?,
        })
    }

    /// Wakes Kfs if it is asleep. Callers publish their work (SeqCst)
    /// before ringing.
    pub fn ring(&self) {
        if matches!(self.shm.try_load_u32(D_SLEEPING, Ordering::SeqCst), Ok(1)) {
            self.wake();
        }
    }

    /// Wakes Kfs unconditionally (shutdown, new client).
    pub fn wake(&self) {
        // D_BELL is the upper half of the 8-byte word at D_SLEEPING
        // (little-endian), so adding 1 << 32 to that word bumps it.
        let _ = self
            .shm
            .fetch_add_u64(D_SLEEPING, 1 << 32, Ordering::SeqCst);
        let _ = self.shm.futex_wake(D_BELL, 1);
    }

    /// Kfs: sleeps until rung or `timeout`, unless `work` (checked after
    /// saying "asleep") finds something to do.
    pub fn sleep(&self, timeout: Duration, work: impl Fn() -> bool) {
        let bell = self.shm.try_load_u32(D_BELL, Ordering::SeqCst).unwrap_or(0);
        let _ = self.shm.store_u32(D_SLEEPING, 1, Ordering::SeqCst);
        if !work() {
            let _ = self.shm.futex_wait(D_BELL, bell, Some(timeout));
        }
        let _ = self.shm.store_u32(D_SLEEPING, 0, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Entry;

    /// The errno [`serve_until`] answers an unlink of `path` with.
    fn len_errno(path: &[u8]) -> Errno {
        i32::try_from(path.len())
            .ok()
            .and_then(Errno::new)
            .expect("test paths are 1 to 200 bytes")
    }

    /// A minimal Kfs: answers an unlink with its path's length as the
    /// errno, and every other request with success.
    fn serve_until(seg: &Segment, bell: &Doorbell, stop: &std::sync::atomic::AtomicBool) -> u64 {
        let mut buf = [0u8; REQUEST_MAX];
        let mut served = 0;
        let mut idle = Instant::now();
        while !stop.load(Ordering::Acquire) {
            let mut any = false;
            for w in 0..SLOTS / 64 {
                let mut bits = seg.take_pending(w);
                while bits != 0 {
                    let s = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    any |= seg.serve(s, &mut buf, |req| match req {
                        Ok(Request::Unlink {
                            at: Entry::Path(path),
                            ..
                        }) => Err(len_errno(path)),
                        Ok(_) => Ok(Reply::Done),
                        Err(e) => Err(e),
                    });
                    served += 1;
                }
            }
            if any {
                idle = Instant::now();
            } else if idle.elapsed() > Duration::from_millis(2) {
                bell.sleep(Duration::from_millis(50), || {
                    seg.any_pending() || stop.load(Ordering::Acquire)
                });
            }
        }
        served
    }

    #[test]
    fn many_threads_get_their_own_replies_through_sleeps_and_wakes() {
        let kfs_side = Segment::create().unwrap();
        let client = kfs_side.map_again().unwrap();
        let bell = Doorbell::create().unwrap();
        let client_bell = bell.map_again().unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let server = s.spawn(|| serve_until(&kfs_side, &bell, &stop));
            let workers: Vec<_> = (0..4)
                .map(|t| {
                    let (client, client_bell) = (&client, &client_bell);
                    s.spawn(move || {
                        for i in 0..300usize {
                            let path = vec![b'x'; 1 + (t * 300 + i) % 200];
                            let req = Request::Unlink {
                                at: Entry::Path(&path),
                                rmdir: false,
                                hint: None,
                            };
                            let r = client.call(t, client_bell, &req);
                            assert_eq!(r, Err(len_errno(&path)));
                            if i % 100 == 0 {
                                // Long enough for Kfs to fall asleep.
                                std::thread::sleep(Duration::from_millis(5));
                            }
                        }
                    })
                })
                .collect();
            for w in workers {
                w.join().unwrap();
            }
            stop.store(true, Ordering::Release);
            bell.wake();
            assert_eq!(server.join().unwrap(), 1200);
        });
    }

    #[test]
    fn a_scribbled_slot_gets_an_error_reply() {
        let seg = Segment::create().unwrap();
        // A client writes garbage and claims a huge length.
        seg.shm
            .write(seg.word(3, REQUEST_RECORD), &[0xff; 64])
            .unwrap();
        seg.shm
            .store_u64(seg.word(3, S_REQ_LEN), u64::MAX, Ordering::Relaxed)
            .unwrap();
        seg.shm
            .store_u64(seg.word(3, S_REQ_SEQ), 1, Ordering::Release)
            .unwrap();
        let mut buf = [0u8; REQUEST_MAX];
        let mut got = None;
        assert!(seg.serve(3, &mut buf, |r| {
            got = Some(r.clone().map(|_| ()));
            Err(r.unwrap_err())
        }));
        assert_eq!(got, Some(Err(Errno::EPROTO)));
        // Plausible length, garbage bytes.
        seg.shm
            .store_u64(seg.word(3, S_REQ_LEN), 64, Ordering::Relaxed)
            .unwrap();
        seg.shm
            .store_u64(seg.word(3, S_REQ_SEQ), 2, Ordering::Release)
            .unwrap();
        assert!(seg.serve(3, &mut buf, |r| Err(r.unwrap_err())));
        // Nothing new: nothing served.
        assert!(!seg.serve(3, &mut buf, |_| unreachable!()));
    }

    #[test]
    fn pinning_publishes_the_epoch_and_unpinning_clears_it() {
        let seg = Segment::create().unwrap();
        seg.pin(5, || 41);
        assert_eq!(seg.epochs().nth(5), Some(42));
        assert_eq!(seg.epochs().filter(|&e| e != 0).count(), 1);
        seg.unpin(5);
        assert!(seg.epochs().all(|e| e == 0));
    }
}
