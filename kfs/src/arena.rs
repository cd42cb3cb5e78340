//! The index arena as Kfs writes it: allocation of items by size class, the
//! writes that publish them to lock-free readers, and retirement of removed
//! items until no reader can still hold them (ARCHITECTURE.md §4, §9).

use std::collections::VecDeque;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use kucofs_common::index::layout::*;
use kucofs_common::index::IndexReader;
use kucofs_common::pm::Shm;
use kucofs_common::Errno;

/// Virtual range reserved for an index (the memfd grows inside it).
pub const INDEX_RESERVE: u64 = 64 << 30;
// Every offset in the index fits a directory link's offset bits.
const _: () = assert!(INDEX_RESERVE <= 1 << kucofs_common::index::layout::LINK_NODE_BITS);
/// Free items of a class sorted at a time for reuse, lowest address first
/// (about a millisecond of sorting): after millions of removals, sorting
/// them all would stop the allocation that needs one for a quarter of a
/// second.
const REFILL: usize = 32 << 10;
/// Step by which the memfd grows.
const GROW_STEP: u64 = 64 << 20;
/// Pages are allocated ahead of the allocation pointer, in one call,
/// rather than one fault at a time: as far ahead as the index has pages
/// already, from this much up to [`POPULATE_STEP`]. A small index (a
/// fresh or small file system, an fsck of one) takes little memory and
/// little time to clear it, and a large one populates in steps that make
/// the calls few.
const POPULATE_FIRST: u64 = 64 << 10;
/// The longest step of population ahead.
const POPULATE_STEP: u64 = 4 << 20;
/// Fresh index space that is made to exist before a change that allocates
/// is logged: more than any one change allocates (the most is an add
/// that starts a directory's doubling to its largest table, and migrates
/// the doubling's first step of buckets; see `worst_change` in the tests).
/// Growing the shared memory only sets its length, so the room costs no
/// memory until it is used.
pub const ROOM: u64 = 1 << 30;

/// Most items one reclamation frees.
pub const RECLAIM_BATCH: usize = 4096;

/// Number of size classes. Item sizes: multiples of 16 up to 512, then
/// powers of two up to 256 MiB (a directory's largest bucket table is
/// 128 MiB).
const CLASSES: u16 = 51;

fn class_size(class: u16) -> u64 {
    let c = u64::from(class);
    if c < 32 {
        16 * (c + 1)
    } else {
        1024 << (c - 32)
    }
}

// A size of at most 512 bytes has a class under 32, which a `u16` holds.
#[allow(clippy::cast_possible_truncation)]
fn class_for(size: u64) -> Option<u16> {
    if size <= 512 {
        Some((size.max(1).div_ceil(16) - 1) as u16)
    } else {
        (32u16..CLASSES).find(|&c| class_size(c) >= size)
    }
}

/// The oldest epoch a reader may still be in, read just after `epoch`
/// began: `slots` yields every client thread's epoch slot, 0 when it is
/// outside the index, else 1 + the epoch it entered in. What was retired
/// before it can be freed.
pub fn oldest_reader(slots: impl Iterator<Item = u64>, epoch: u64) -> u64 {
    slots
        .filter(|&s| s != 0)
        .map(|s| s - 1)
        .min()
        .unwrap_or(epoch)
}

/// The writable index: its memory, the allocator, and the retired items.
#[derive(Debug)]
pub struct Arena {
    shm: Arc<Shm>,
    /// End of the allocated part.
    used: u64,
    /// Free items by size class, as they were freed.
    free: Vec<Vec<u64>>,
    /// Free items by size class in descending address order: allocation
    /// takes from here, lowest address first, so reused items lie together
    /// as fresh ones do (freed ones come back in scattered order, and
    /// scattered items cost a cache miss each). Refilled when empty by
    /// sorting at most [`REFILL`] of `free`.
    ordered: Vec<Vec<u64>>,
    /// Removed items waiting for their grace period: (epoch, offset).
    retired: VecDeque<(u64, u64)>,
    /// End of the part whose pages are allocated.
    populated: u64,
}

impl Arena {
    /// A new, empty arena with its header written.
    pub fn new() -> Result<Arena, Errno> {
        Arena::with_reserve(INDEX_RESERVE)
    }

    /// [`Arena::new`] that may grow to `reserve` bytes.
    fn with_reserve(reserve: u64) -> Result<Arena, Errno> {
        let shm = Arc::new(
            Shm::create("kucofs-index", GROW_STEP.min(reserve), reserve)
                .map_err(|_| Errno::ENOMEM)?,
        );
        let a = Arena {
            shm,
            used: HEADER_SIZE,
            free: vec![Vec::new(); CLASSES as usize],
            ordered: vec![Vec::new(); CLASSES as usize],
            retired: VecDeque::new(),
            populated: 0,
        };
        a.put(HDR_EPOCH, 1)?;
        a.put(HDR_USED, HEADER_SIZE)?;
        a.put(HDR_MAGIC, MAGIC)?;
        Ok(a)
    }

    /// The shared memory, for mapping into clients.
    pub fn shm(&self) -> &Shm {
        &self.shm
    }

    /// A handle on the shared memory, for provisioning it from another
    /// thread.
    pub fn shm_handle(&self) -> Arc<Shm> {
        self.shm.clone()
    }

    /// A reader over Kfs's own mapping.
    pub fn reader(&self) -> IndexReader<'_, Shm> {
        IndexReader::new(&self.shm)
    }

    /// Bytes of the arena in use (allocated, live or waiting).
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Items waiting for a grace period.
    pub fn retired(&self) -> usize {
        self.retired.len()
    }

    /// Stores a word that readers may load concurrently. `Release`: every
    /// earlier store to the item is visible to a reader that `Acquire`s it.
    #[inline]
    pub fn put(&self, off: u64, v: u64) -> Result<(), Errno> {
        self.shm
            .store_u64(off, v, Ordering::Release)
            .map_err(|_| Errno::EFAULT)
    }

    /// The words of the inode at `inode`, checked once, for a change of
    /// its attributes under its sequence lock.
    #[inline]
    pub fn attrs(&self, inode: InodeOff) -> Result<Attrs<'_>, Errno> {
        let words = self
            .shm
            .words(inode.get(), (INODE_SIZE / 8) as usize)
            .map_err(|_| Errno::EFAULT)?;
        Ok(Attrs {
            arena: self,
            inode,
            words,
        })
    }

    /// Stores a 4-byte word.
    #[inline]
    pub fn put32(&self, off: u64, v: u32) -> Result<(), Errno> {
        self.shm
            .store_u32(off, v, Ordering::Release)
            .map_err(|_| Errno::EFAULT)
    }

    /// Loads a word through Kfs's mapping.
    #[inline]
    pub fn get(&self, off: u64) -> u64 {
        use kucofs_common::pm::Words;
        self.shm.load_u64(off, Ordering::Acquire)
    }

    /// Loads a 4-byte word through Kfs's mapping.
    #[inline]
    pub fn get32(&self, off: u64) -> u32 {
        use kucofs_common::pm::Words;
        self.shm.load_u32(off, Ordering::Acquire)
    }

    /// Copies bytes into an item that is not yet published.
    pub fn put_bytes(&self, off: u64, bytes: &[u8]) -> Result<(), Errno> {
        self.shm.write(off, bytes).map_err(|_| Errno::EFAULT)
    }

    /// Allocates an item of at least `size` bytes, tagged `tag`, zeroed, and
    /// returns its offset. Its header is written last, so a stale client
    /// offset to the old item fails the generation check from then on.
    pub fn alloc(&mut self, tag: u16, size: u64) -> Result<u64, Errno> {
        self.alloc_item(tag, size, true)
    }

    /// [`Arena::alloc`] for an item whose every byte that is ever read the
    /// caller writes before publishing it (a directory's bucket table): a
    /// reused one is not zeroed, and fresh pages are not populated now,
    /// but fault in as the caller's writes reach them. For a large item
    /// either would be one long stop: a 64 MiB table is 16,384 pages to
    /// clear or to allocate.
    pub fn alloc_unset(&mut self, tag: u16, size: u64) -> Result<u64, Errno> {
        self.alloc_item(tag, size, false)
    }

    /// [`Arena::alloc`], made ready for reading (zeroed, its pages
    /// populated) if `ready`.
    fn alloc_item(&mut self, tag: u16, size: u64, ready: bool) -> Result<u64, Errno> {
        let class = class_for(size).ok_or(Errno::ENOMEM)?;
        let bytes = class_size(class);
        let c = class as usize;
        if self.ordered[c].is_empty() && !self.free[c].is_empty() {
            let free = &mut self.free[c];
            let mut some = free.split_off(free.len().saturating_sub(REFILL));
            some.sort_unstable_by(|a, b| b.cmp(a));
            self.ordered[c] = some;
        }
        let (off, gen) = match self.ordered[c].pop() {
            Some(off) => {
                if ready {
                    // A reused item holds what its last owner left.
                    let zeros = [0u8; 512];
                    let mut at = 8;
                    while at < bytes {
                        let n = (bytes - at).min(512);
                        self.put_bytes(off + at, &zeros[..n as usize])?;
                        at += n;
                    }
                }
                (off, header_gen(self.get(off)).wrapping_add(1))
            }
            None => {
                let off = self.used;
                let end = off + bytes;
                // Grow half a step early, so pages ahead of the allocation
                // point exist for the Kfs thread to provision.
                if end + GROW_STEP / 2 > self.shm.len() {
                    let want = (end + GROW_STEP).next_multiple_of(GROW_STEP);
                    // Only early: an allocation that still fits goes on
                    // even if growing failed.
                    let _ = self.shm.grow(want.min(self.shm.reserve()));
                    if end > self.shm.len() {
                        return Err(Errno::ENOMEM);
                    }
                }
                self.used = end;
                self.put(HDR_USED, end)?;
                if !ready {
                    // Its pages are left to its writes; populating goes on
                    // from its end.
                    self.populated = self.populated.max(end);
                } else if end > self.populated {
                    let step = self.populated.clamp(POPULATE_FIRST, POPULATE_STEP);
                    let to = end.max(self.populated + step).min(self.shm.len());
                    self.shm.populate(self.populated, to - self.populated);
                    self.populated = to;
                }
                // Never written: the shared memory grows zero-filled.
                (off, 1)
            }
        };
        self.put(off, header(tag, class, gen))?;
        Ok(off)
    }

    /// Makes sure the next [`ROOM`] bytes of fresh space exist, so that
    /// the change about to be logged cannot run out of index space half
    /// applied (the allocator's `ENOMEM`; growing the shared memory only
    /// sets its length, and the pages come from the kernel when touched):
    /// Kfs calls this before it makes a change that allocates durable, and
    /// refuses the change with `ENOMEM` if the room is not there.
    pub fn make_room(&mut self) -> Result<(), Errno> {
        let end = self.used + ROOM;
        if end <= self.shm.len() {
            return Ok(());
        }
        if end > self.shm.reserve() {
            return Err(Errno::ENOMEM);
        }
        self.shm
            .grow(end.next_multiple_of(GROW_STEP).min(self.shm.reserve()))
            .map_err(|_| Errno::ENOMEM)
    }

    /// Marks an item removed, as [`Arena::retire`] does, but keeps it from
    /// reuse until it is retired (which may come later, and again marks
    /// it).
    pub fn mark_dead(&mut self, off: u64) -> Result<(), Errno> {
        let h = self.get(off);
        self.put(
            off,
            header(header_tag(h) | TAG_DEAD, header_class(h), header_gen(h)),
        )
    }

    /// Marks an item removed: it stays readable for readers that reached it,
    /// but no request may name it any more. It is reused after the grace
    /// period of the current epoch.
    pub fn retire(&mut self, off: u64) -> Result<(), Errno> {
        self.mark_dead(off)?;
        let epoch = self.get(HDR_EPOCH);
        self.retired.push_back((epoch, off));
        Ok(())
    }

    /// Starts a new epoch if anything waits for one, and frees (at most
    /// [`RECLAIM_BATCH`] of) what no reader can hold any more (see
    /// [`oldest_reader`]).
    #[cfg(test)]
    fn reclaim(&mut self, readers: impl Iterator<Item = u64>) -> Result<usize, Errno> {
        if self.retired.is_empty() {
            return Ok(0);
        }
        let epoch = self.advance_epoch()?;
        self.free_retired(oldest_reader(readers, epoch))
    }

    /// Starts a new epoch and returns it. The caller then loads every
    /// reader's epoch slot: SeqCst orders the new epoch before those loads
    /// in the single total order, pairing with a reader's SeqCst store of
    /// its slot followed by its SeqCst re-load of the epoch: either Kfs
    /// sees its slot, or it sees the new epoch (and cannot reach what was
    /// unlinked before it).
    pub fn advance_epoch(&mut self) -> Result<u64, Errno> {
        let next = self.get(HDR_EPOCH) + 1;
        self.shm
            .store_u64(HDR_EPOCH, next, Ordering::SeqCst)
            .map_err(|_| Errno::EFAULT)?;
        fence(Ordering::SeqCst);
        Ok(next)
    }

    /// Frees (at most [`RECLAIM_BATCH`] of) the items retired before
    /// `oldest_reader`'s epoch.
    pub fn free_retired(&mut self, oldest_reader: u64) -> Result<usize, Errno> {
        let mut freed = 0;
        while let Some(&(epoch, off)) = self.retired.front() {
            // Bounded, so that the lock around the volume is not held long
            // (client threads apply requests directly under it).
            if epoch >= oldest_reader || freed == RECLAIM_BATCH {
                break;
            }
            self.retired.pop_front();
            let class = header_class(self.get(off));
            self.put(off, header(0, class, header_gen(self.get(off))))?;
            self.free[class as usize].push(off);
            freed += 1;
        }
        Ok(freed)
    }
}

/// One inode's words (from [`Arena::attrs`]), stored into without a
/// bounds check per store: an attribute change stores half a dozen.
#[derive(Debug)]
pub struct Attrs<'a> {
    arena: &'a Arena,
    inode: InodeOff,
    words: &'a [std::sync::atomic::AtomicU64],
}

impl Attrs<'_> {
    /// Stores the word at `off` (an offset in the arena, inside the
    /// inode) with `Release`, as [`Arena::put`].
    #[inline]
    pub fn put(&self, off: u64, v: u64) -> Result<(), Errno> {
        let i = off.wrapping_sub(self.inode.get());
        let w = i
            .is_multiple_of(8)
            .then(|| self.words.get((i / 8) as usize))
            .flatten()
            .ok_or(Errno::EFAULT)?;
        w.store(v, Ordering::Release);
        Ok(())
    }

    /// Stores a 4-byte word inside the inode, as [`Arena::put32`].
    pub fn put32(&self, off: u64, v: u32) -> Result<(), Errno> {
        if off.wrapping_sub(self.inode.get()) > INODE_SIZE - 4 {
            return Err(Errno::EFAULT);
        }
        self.arena.put32(off, v)
    }

    /// Begins a change of the inode's attributes (sequence lock: odd).
    #[inline]
    fn begin(&self) -> u64 {
        let seq = &self.words[InodeOff::SEQ_WORD];
        let s = seq.load(Ordering::Relaxed) | 1;
        seq.store(s, Ordering::Relaxed);
        // Orders the odd sequence before the field stores that follow;
        // pairs with the reader's Acquire fence before its re-check of
        // `seq`.
        fence(Ordering::Release);
        s
    }

    /// Ends the change begun at odd sequence `s` (even again). Release:
    /// the field stores are visible before it; pairs with the reader's
    /// Acquire load of `seq`.
    #[inline]
    fn end(&self, s: u64) {
        self.words[InodeOff::SEQ_WORD].store(s + 1, Ordering::Release);
    }

    /// Runs `f`, a change of the inode's attributes, under its sequence
    /// lock.
    #[inline]
    pub fn change<R>(&self, f: impl FnOnce(&Self) -> R) -> R {
        let s = self.begin();
        let r = f(self);
        self.end(s);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_cover_every_size() {
        for size in (1..=131072u64).chain([1 << 20, (128 << 20) + 16, 256 << 20]) {
            let c = class_for(size).unwrap();
            assert!(class_size(c) >= size);
            if c > 0 && c < 32 {
                assert!(class_size(c - 1) < size);
            }
        }
        assert_eq!(class_for((256 << 20) + 1), None);
    }

    #[test]
    fn items_are_reused_only_after_every_reader_left_their_epoch() {
        let mut a = Arena::new().unwrap();
        let x = a.alloc(TAG_INODE, INODE_SIZE).unwrap();
        let gen = header_gen(a.get(x));
        a.retire(x).unwrap();
        assert_eq!(header_tag(a.get(x)), TAG_INODE | TAG_DEAD);
        let retired_in = a.get(HDR_EPOCH);
        // A reader pinned in the retiring epoch holds it back.
        assert_eq!(a.reclaim([retired_in + 1, 0].into_iter()).unwrap(), 0);
        let y = a.alloc(TAG_INODE, INODE_SIZE).unwrap();
        assert_ne!(x, y);
        // Once every reader is outside or later, it is freed and reused with
        // a new generation.
        assert_eq!(a.reclaim([0, a.get(HDR_EPOCH) + 1].into_iter()).unwrap(), 1);
        let z = a.alloc(TAG_INODE, INODE_SIZE).unwrap();
        assert_eq!(z, x);
        assert_eq!(header_gen(a.get(z)), gen + 1);
    }

    #[test]
    fn an_unset_item_is_neither_cleared_nor_populated_but_gets_a_new_generation() {
        let mut a = Arena::new().unwrap();
        let size = BucketTable::size(20);
        let class = class_for(size).unwrap();
        let x = BucketTable::new(a.alloc_unset(TAG_BUCKETS, size).unwrap());
        assert_eq!(a.get(x.get()), header(TAG_BUCKETS, class, 1));
        // Fresh: its pages are left to its writes, and populating goes on
        // from its end.
        assert_eq!(a.populated, a.used());
        a.put(x.slot(1000), 0xabcd).unwrap();
        a.retire(x.get()).unwrap();
        assert_eq!(a.reclaim([0].into_iter()).unwrap(), 1);
        // Reused: what its last owner left is still there, under the next
        // generation, written last.
        let y = BucketTable::new(a.alloc_unset(TAG_BUCKETS, size).unwrap());
        assert_eq!(y, x);
        assert_eq!(a.get(y.get()), header(TAG_BUCKETS, class, 2));
        assert_eq!(a.get(y.slot(1000)), 0xabcd);
        // An ordinary allocation of it is cleared.
        a.retire(y.get()).unwrap();
        assert_eq!(a.reclaim([0].into_iter()).unwrap(), 1);
        let z = BucketTable::new(a.alloc(TAG_BUCKETS, size).unwrap());
        assert_eq!(z, x);
        assert_eq!(a.get(z.get()), header(TAG_BUCKETS, class, 3));
        assert_eq!(a.get(z.slot(1000)), 0);
    }

    /// The most fresh space one change can allocate: a directory's table
    /// doubling to its largest size, started by the change, with a
    /// migration step's sentinels (a change allocates one table at most,
    /// and migrates at most a step: see `maybe_grow`), plus a new inode,
    /// entry, inode-table chunk and symlink target, plus a largest
    /// commit's map nodes: its leaves, two new interior nodes on every
    /// level (its pages may straddle two), and a new root for every level
    /// of a tree grown from nothing.
    fn worst_change() -> u64 {
        let item = |size| class_size(class_for(size).unwrap());
        let table = item(BucketTable::size(BUCKET_BITS_MAX));
        let sentinels = crate::namespace::GROW_STEP * item(dirent_size(0));
        let create = item(INODE_SIZE)
            + item(dirent_size(kucofs_common::index::NAME_MAX))
            + item(ITABLE_CHUNK_SIZE)
            + item(SymlinkOff::size(kucofs_common::index::PATH_MAX as u64));
        use kucofs_common::index::blockmap::{FANOUT, MAX_HEIGHT, NODE_SIZE};
        let commit = (kucofs_common::proto::COMMIT_PAGES_MAX.div_ceil(FANOUT)
            + 1
            + 2 * u64::from(MAX_HEIGHT)
            + u64::from(MAX_HEIGHT)
            + 1)
            * item(NODE_SIZE);
        table + sentinels + create + commit
    }

    #[test]
    fn room_covers_the_largest_change() {
        assert!(worst_change() <= ROOM, "{} > {ROOM}", worst_change());
    }

    #[test]
    fn room_is_made_ahead_and_refused_when_the_reserve_cannot_hold_it() {
        let mut a = Arena::new().unwrap();
        a.make_room().unwrap();
        assert!(a.shm().len() >= a.used() + ROOM);
        // An arena whose reserve is smaller than the room refuses before
        // anything is allocated.
        let mut small = Arena::with_reserve(ROOM / 2).unwrap();
        let used = small.used();
        assert_eq!(small.make_room(), Err(Errno::ENOMEM));
        assert_eq!(small.used(), used);
    }

    #[test]
    fn the_arena_grows_past_its_first_step() {
        let mut a = Arena::new().unwrap();
        let first = a.shm().len();
        for _ in 0..(first / 65536 + 2) {
            a.alloc(TAG_DIRENT, 65536).unwrap();
        }
        assert!(a.shm().len() > first);
    }

    #[test]
    fn an_attribute_change_stores_its_fields_inside_one_even_to_even_sequence() {
        let mut a = Arena::new().unwrap();
        let inode = InodeOff::new(a.alloc(TAG_INODE, INODE_SIZE).unwrap());
        let seq = a.get(inode.seq());
        assert_eq!(seq % 2, 0);
        let attrs = a.attrs(inode).unwrap();
        let seen = attrs.change(|x| {
            x.put(inode.size(), 4096).unwrap();
            x.put32(inode.nlink(), 3).unwrap();
            // Odd while the change is under way.
            a.get(inode.seq())
        });
        assert_eq!(seen, seq | 1);
        assert_eq!(a.get(inode.seq()), seq + 2);
        assert_eq!(a.get(inode.size()), 4096);
        assert_eq!(a.get32(inode.nlink()), 3);
        // A word past the inode is not this change's to store.
        let at = inode.get();
        assert_eq!(attrs.put(at + INODE_SIZE, 1), Err(Errno::EFAULT));
        assert_eq!(attrs.put(at.wrapping_sub(8), 1), Err(Errno::EFAULT));
        assert_eq!(attrs.put(inode.size() + 4, 1), Err(Errno::EFAULT));
        assert_eq!(attrs.put32(at + INODE_SIZE - 2, 1), Err(Errno::EFAULT));
        assert_eq!(attrs.put32(at.wrapping_sub(4), 1), Err(Errno::EFAULT));
    }
}
