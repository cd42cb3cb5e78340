//! The index writer (the namespace as Kfs changes it, through the arena,
//! [`crate::arena`]): POSIX checks for every request, the
//! check of a client's pre-located addresses (collaborative indexing,
//! ARCHITECTURE.md §6), and the changes themselves. A metadata change is applied by
//! the same code live (after its log entry is durable) and at log replay;
//! file data changes through [`Namespace::write_pages`] and
//! [`Namespace::truncate_file`], also shared by both, and the metadata
//! store loads through its own `load_*` functions.
//!
//! Ordering for lock-free readers: a created inode is filled before its
//! entry is linked; an entry is unlinked before its inode is retired; a
//! rename links the new entry before it unlinks the old one, and replacing
//! an existing target swaps one entry for another at every level, so a
//! reader always finds the target name.

use std::borrow::Cow;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use kucofs_common::access::{AttrChange, Perm, Protected, Times, MAY_EXEC, MAY_WRITE};
use kucofs_common::format::PageNo;
use kucofs_common::index::layout::*;
use kucofs_common::index::{
    check_name, name_hash, DirentOff, IndexReader, Ino, InodeAttr, InodeOff, Kind, Last, Parent,
    SymlinkOff, PATH_MAX,
};
use kucofs_common::pm::{Shm, Words};
use kucofs_common::proto::{open, At, Creds, Entry, Hint, Node, Request, SetAttrs, TimesNow};
use kucofs_common::Errno;

use crate::arena::{Arena, Attrs};
use crate::record::Record;
use crate::store::Store;

/// Inode number of the root directory.
pub const ROOT_INO: u64 = 1;

/// Inode numbers the index's inode table holds.
pub const MAX_INODES: u64 = ITABLE_CHUNK_INOS * ITABLE_TOP_SLOTS;
// Every inode number fits the store's owner entries.
const _: () = assert!(MAX_INODES <= kucofs_common::format::meta::OWNER_INO_MAX);

/// A validated change, waiting for its log entry to become durable.
#[derive(Debug)]
pub struct Prepared<'a> {
    /// What the log records.
    pub record: Record<'a>,
    plan: Plan,
}

/// Where a validated change goes, so that applying it need not search.
#[derive(Debug, Default, Clone, Copy)]
struct Plan {
    /// Validated node to link the destination entry after.
    dst: Option<DirentOff>,
    /// The existing destination entry (rename over a target).
    dst_found: DirentOff,
    /// Validated node before the entry to remove.
    src: Option<DirentOff>,
    /// The entry to remove.
    src_found: DirentOff,
}

/// What a request resolved to.
#[derive(Debug)]
pub enum Outcome<'a> {
    /// A change to log and then [`Namespace::commit`].
    Change(Prepared<'a>),
    /// Nothing to change (e.g. renaming a name onto another name of the
    /// same inode); reply at once, naming the node if there is one.
    Done(Option<Node>),
}

/// Counters of how requests located their targets.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HintStats {
    /// Pre-located addresses that checked out and were used.
    pub used: u64,
    /// Pre-located addresses that were stale; Kfs searched itself.
    pub stale: u64,
    /// Requests that came without addresses.
    pub absent: u64,
}

/// The live namespace.
#[derive(Debug)]
pub struct Namespace {
    arena: Arena,
    next_ino: u64,
    free_inos: Vec<u64>,
    /// Free inode numbers in descending order: numbers are reused lowest
    /// first, so new files get neighbouring inode-table slots. Refilled by
    /// sorting `free_inos` when empty.
    ordered_inos: Vec<u64>,
    hints: HintStats,
    /// Data pages replaced or dropped since Kfs last collected them.
    replaced: Vec<PageNo>,
    /// A commit's replaced entries (kept to save an allocation each).
    scratch: Vec<u64>,
    /// Open counts of files some client has open: an unlinked file stays
    /// until its last close.
    open: crate::intmap::IntMap<u64, u32>,
    /// The latest time [`Namespace::stamp`] handed out.
    last_stamp: i64,
    /// What the changes since the last retirement of the log touched in
    /// the metadata store, and where its records lie.
    store: Store,
    /// Directories' bucket tables being doubled.
    doublings: grow::Doublings,
    /// Removed directories whose lists are being retired a step at a
    /// time (see [`Namespace::dismantle_step`]).
    dismantling: Vec<dir::Dismantling>,
    /// The link protections changes are checked with.
    protected: Protected,
}

/// The latest stamp of any namespace this process has dropped: a file
/// system closed and opened again within one tick of the coarse clock
/// goes on stamping above what it stamped before.
static DROPPED_STAMP: AtomicI64 = AtomicI64::new(0);

impl Drop for Namespace {
    fn drop(&mut self) {
        // Relaxed: a seed for the next namespace's stamps; the opener
        // of a file system closed by another thread is ordered after it by
        // whatever handed the image over (the image's lock, a join).
        DROPPED_STAMP.fetch_max(self.last_stamp, Ordering::Relaxed);
    }
}

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// How far a stamp may run ahead of the coarse clock (and so of the
/// precise one) to stay above the stamp before it.
pub const STAMP_LEAD: i64 = 1_000_000;

/// The coarse realtime clock (as of the last timer tick), in nanoseconds.
fn coarse_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live, writable timespec; CLOCK_REALTIME_COARSE
    // is a valid clock id, so the call only writes `ts`.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } == 0 {
        ts.tv_sec
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec)
    } else {
        now_ns()
    }
}

/// The stamp after `last` when the coarse clock reads `tick`.
fn next_stamp(last: i64, tick: i64) -> i64 {
    let after = last.saturating_add(1);
    if after <= tick.saturating_add(STAMP_LEAD) {
        tick.max(after)
    } else {
        tick
    }
}

impl Namespace {
    /// The time a change stamps on what it changes (modification, change
    /// and creation times, log records): the clock as of the last timer
    /// tick, as the kernel stamps files, which costs a few nanoseconds
    /// where a precise reading costs tens on every write. Above every
    /// earlier stamp of this namespace (and of those this process dropped
    /// before making it), so that every change moves a file's times
    /// forward: a stamp runs ahead of the tick by 1 ns per
    /// change made within it (changes take longer than that, so a stamp
    /// does not pass the precise clock), and never by more than
    /// [`STAMP_LEAD`]. If the clock is set back further than that, stamps
    /// go back with it, as the kernel's do. Batch deadlines and other
    /// timing use [`now_ns`].
    ///
    /// A plain field, not an atomic: changes to one namespace are made one
    /// at a time, under its volume's lock. That matters to a commit
    /// applied by the thread that just copied its data: a locked
    /// read-modify-write would wait for that copy's non-temporal stores to
    /// drain before the commit's checks, which run meanwhile (see
    /// [`Log::append_prepared`](crate::log::Log::append_prepared)).
    pub fn stamp(&mut self) -> i64 {
        self.last_stamp = next_stamp(self.last_stamp, coarse_ns());
        self.last_stamp
    }

    /// An empty namespace: a root directory owned by `root`.
    pub fn new(root: Creds, time: i64) -> Result<Namespace, Errno> {
        let mut arena = Arena::new()?;
        let top = arena.alloc(TAG_ITABLE_TOP, ITABLE_TOP_SIZE)?;
        arena.put(HDR_ITABLE_SLOTS, ITABLE_TOP_SLOTS)?;
        arena.put(HDR_ITABLE, top)?;
        let mut ns = Namespace {
            arena,
            next_ino: ROOT_INO + 1,
            free_inos: Vec::new(),
            ordered_inos: Vec::new(),
            hints: HintStats::default(),
            replaced: Vec::new(),
            scratch: Vec::new(),
            open: crate::intmap::IntMap::default(),
            last_stamp: DROPPED_STAMP.load(Ordering::Relaxed),
            store: Store::default(),
            doublings: grow::Doublings::default(),
            dismantling: Vec::new(),
            protected: Protected::host(),
        };
        let root_inode = ns.new_inode(
            Ino::ROOT,
            libc::S_IFDIR | 0o755,
            root.uid,
            root.gid,
            time,
            InodeOff::NULL,
            b"",
        )?;
        ns.arena.put(root_inode.parent(), root_inode.get())?;
        ns.arena.put(HDR_ROOT, root_inode.get())?;
        Ok(ns)
    }

    /// An empty namespace (a root directory owned by `root`) for a new
    /// image of geometry `g`, whose store holds nothing yet: the root is
    /// what the first retirement writes.
    pub fn with_store(
        root: Creds,
        time: i64,
        g: &kucofs_common::format::Geometry,
    ) -> Result<Namespace, Errno> {
        let mut ns = Namespace::new(root, time)?;
        ns.store = Store::new(g);
        ns.store.inode_made(Ino::ROOT, 0);
        Ok(ns)
    }

    /// Checks changes with link protections `p` (the host's by default).
    pub fn set_protected(&mut self, p: Protected) {
        self.protected = p;
    }

    /// The metadata store's bookkeeping.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The metadata store's bookkeeping, to change.
    pub fn store_mut(&mut self) -> &mut Store {
        &mut self.store
    }

    /// Notes where the store keeps index entry `node`'s record (a field
    /// only Kfs reads).
    pub fn set_dirent_slot(&mut self, node: DirentOff, slot: u64) {
        let _ = self.arena.put(node.slot(), slot);
    }

    /// A reader over Kfs's own mapping of the index.
    pub fn reader(&self) -> IndexReader<'_, Shm> {
        self.arena.reader()
    }

    /// The index's shared memory (to map into clients).
    pub fn shm(&self) -> &Shm {
        self.arena.shm()
    }

    /// The arena (allocation and reclamation figures).
    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    /// Loads a word of the index through Kfs's mapping.
    pub fn shm_u64(&self, off: u64) -> u64 {
        self.arena.get(off)
    }

    /// The current reclamation epoch.
    pub fn epoch(&self) -> u64 {
        self.arena.get(HDR_EPOCH)
    }

    /// Starts a new reclamation epoch; returns it.
    pub fn advance_epoch(&mut self) -> Result<u64, Errno> {
        self.arena.advance_epoch()
    }

    /// Frees retired items no reader older than `oldest_reader` can hold.
    pub fn free_retired(&mut self, oldest_reader: u64) -> Result<usize, Errno> {
        self.arena.free_retired(oldest_reader)
    }

    /// Counts an open of file `ino`.
    pub fn pin(&mut self, ino: Ino) {
        *self.open.entry(ino.get()).or_default() += 1;
    }

    /// Counts a close of file `ino`; at the last close of a file without a
    /// name, drops it.
    pub fn unpin(&mut self, ino: Ino) -> Result<(), Errno> {
        let Some(n) = self.open.get_mut(&ino.get()) else {
            return Err(Errno::EBADF);
        };
        *n -= 1;
        if *n > 0 {
            return Ok(());
        }
        self.open.remove(&ino.get());
        let inode = self.inode_of(ino)?;
        if self.nlink(inode) == 0 {
            self.drop_inode(inode)?;
        }
        Ok(())
    }

    /// The inode of file number `ino` (`ENOENT` if none).
    pub fn file_inode(&self, ino: Ino) -> Result<InodeOff, Errno> {
        self.inode_of(ino)
    }

    /// How requests located their targets so far.
    pub fn hint_stats(&self) -> HintStats {
        self.hints
    }

    /// Live inodes.
    pub fn inode_count(&self) -> u64 {
        self.arena.get(HDR_INODES)
    }

    /// After recovery: the lowest unused inode numbers become free again.
    pub fn rebuild_free_inos(&mut self) {
        let r = self.reader();
        let mut max = ROOT_INO;
        let mut free = Vec::new();
        for ino in ROOT_INO..self.next_ino {
            if r.inode_by_ino(Ino::new(ino)).is_null() {
                free.push(ino);
            } else {
                max = ino;
            }
        }
        free.retain(|&i| i < max);
        free.reverse();
        self.ordered_inos = free;
        self.free_inos.clear();
        self.next_ino = max + 1;
    }

    fn peek_ino(&mut self) -> Result<Ino, Errno> {
        if self.ordered_inos.is_empty() && !self.free_inos.is_empty() {
            std::mem::swap(&mut self.ordered_inos, &mut self.free_inos);
            self.ordered_inos.sort_unstable_by(|a, b| b.cmp(a));
        }
        match self.ordered_inos.last() {
            Some(&i) => Ok(Ino::new(i)),
            None if self.next_ino / ITABLE_CHUNK_INOS < ITABLE_TOP_SLOTS => {
                Ok(Ino::new(self.next_ino))
            }
            None => Err(Errno::ENOSPC),
        }
    }

    fn take_ino(&mut self, ino: Ino) {
        let ino = ino.get();
        if self.ordered_inos.last() == Some(&ino) {
            self.ordered_inos.pop();
        } else if ino >= self.next_ino {
            self.next_ino = ino + 1;
        } else if let Some(i) = self.ordered_inos.iter().position(|&x| x == ino) {
            self.ordered_inos.remove(i);
        } else if let Some(i) = self.free_inos.iter().position(|&x| x == ino) {
            self.free_inos.swap_remove(i);
        }
    }

    // ---- the inode table --------------------------------------------------

    fn itable_set(&mut self, ino: Ino, inode: InodeOff) -> Result<(), Errno> {
        let ino = ino.get();
        let top = self.arena.get(HDR_ITABLE);
        let chunk_no = ino / ITABLE_CHUNK_INOS;
        if chunk_no >= ITABLE_TOP_SLOTS {
            return Err(Errno::ENOSPC);
        }
        let slot_of_chunk = itable_slot(top, chunk_no);
        let mut chunk = self.arena.get(slot_of_chunk);
        if chunk == 0 {
            chunk = self.arena.alloc(TAG_ITABLE_CHUNK, ITABLE_CHUNK_SIZE)?;
            self.arena.put(slot_of_chunk, chunk)?;
        }
        self.arena
            .put(itable_slot(chunk, ino % ITABLE_CHUNK_INOS), inode.get())?;
        let n = self.arena.get(HDR_INODES);
        let n = if inode.is_null() { n - 1 } else { n + 1 };
        self.arena.put(HDR_INODES, n)
    }

    fn inode_of(&self, ino: Ino) -> Result<InodeOff, Errno> {
        match self.reader().inode_by_ino(ino) {
            off if off.is_null() => Err(Errno::ENOENT),
            off => Ok(off),
        }
    }

    // ---- inodes ------------------------------------------------------------

    #[allow(clippy::too_many_arguments)]
    fn new_inode(
        &mut self,
        ino: Ino,
        mode: u32,
        uid: u32,
        gid: u32,
        time: i64,
        parent: InodeOff,
        target: &[u8],
    ) -> Result<InodeOff, Errno> {
        let a = &mut self.arena;
        let inode = InodeOff::new(a.alloc(TAG_INODE, INODE_SIZE)?);
        a.put(inode.ino(), ino.get())?;
        a.put32(inode.mode(), mode)?;
        a.put32(inode.uid(), uid)?;
        a.put32(inode.gid(), gid)?;
        for at in [inode.atime(), inode.mtime(), inode.ctime(), inode.btime()] {
            a.put(at, time.cast_unsigned())?;
        }
        match Kind::from_mode(mode) {
            Some(Kind::Dir) => {
                a.put(inode.parent(), parent.get())?;
                a.put32(inode.nlink(), 2)?;
                self.new_dir_list(inode)?;
            }
            Some(Kind::Symlink) => {
                let t =
                    SymlinkOff::new(a.alloc(TAG_SYMLINK, SymlinkOff::size(target.len() as u64))?);
                a.put(t.length(), target.len() as u64)?;
                a.put_bytes(t.bytes(), target)?;
                a.put(inode.data(), t.get())?;
                a.put(inode.size(), target.len() as u64)?;
                a.put32(inode.nlink(), 1)?;
            }
            Some(Kind::File) => a.put32(inode.nlink(), 1)?,
            None => return Err(Errno::EINVAL),
        }
        self.itable_set(ino, inode)?;
        self.take_ino(ino);
        self.store.inode_made(ino, target.len());
        Ok(inode)
    }

    /// Changes inode fields under its sequence lock.
    fn update(
        &mut self,
        inode: InodeOff,
        f: impl FnOnce(&Attrs<'_>) -> Result<(), Errno>,
    ) -> Result<(), Errno> {
        self.store
            .inode_changed(Ino::new(self.arena.get(inode.ino())));
        self.arena.attrs(inode)?.change(f)
    }

    /// An inode's link count. Kfs is the only writer of inodes, so it
    /// reads its own fields without the sequence lock readers need.
    fn nlink(&self, inode: InodeOff) -> u32 {
        self.arena.get32(inode.nlink())
    }

    fn add_nlink(&mut self, inode: InodeOff, delta: i32, time: i64) -> Result<u32, Errno> {
        let n = self.nlink(inode).saturating_add_signed(delta);
        self.update(inode, |a| {
            a.put32(inode.nlink(), n)?;
            a.put(inode.ctime(), time.cast_unsigned())
        })?;
        Ok(n)
    }

    /// Directory bookkeeping after an entry was added (+1) or removed (-1),
    /// and `subdirs` subdirectories with it.
    fn touch_dir(
        &mut self,
        dir: InodeOff,
        entries: i64,
        subdirs: i32,
        time: i64,
    ) -> Result<(), Errno> {
        // Kfs's own fields: no sequence lock needed to read them.
        let count = self.arena.get(dir.entries());
        let nlink = self.nlink(dir);
        self.update(dir, |a| {
            a.put(dir.entries(), count.saturating_add_signed(entries))?;
            a.put32(dir.nlink(), nlink.saturating_add_signed(subdirs))?;
            a.put(dir.mtime(), time.cast_unsigned())?;
            a.put(dir.ctime(), time.cast_unsigned())
        })?;
        if entries > 0 {
            self.maybe_grow(dir)?;
        }
        Ok(())
    }

    /// Retires an inode and what hangs off it, and frees its number; a
    /// file that is still open stays, nameless, until its last close.
    fn drop_inode(&mut self, inode: InodeOff) -> Result<(), Errno> {
        let r = self.reader();
        let ino = r.ino(inode);
        let kind = r.kind(inode);
        if kind == Some(Kind::File) && self.open.contains_key(&ino.get()) {
            return Ok(());
        }
        let data = self.arena.get(inode.data());
        match kind {
            Some(Kind::Dir) => self.drop_dir_list(inode)?,
            Some(Kind::Symlink) if data != 0 => self.arena.retire(data)?,
            Some(Kind::File) => self.drop_map(inode)?,
            _ => {}
        }
        self.itable_set(ino, InodeOff::NULL)?;
        if kind == Some(Kind::Dir) {
            // Dead now, but kept from reuse until its list is retired
            // (whose nodes name it).
            self.arena.mark_dead(inode.get())?;
        } else {
            self.arena.retire(inode.get())?;
        }
        self.free_inos.push(ino.get());
        self.store.inode_dropped(ino);
        Ok(())
    }

    /// After recovery: drops the files that have no name (they were open
    /// when the file system went down, after their last name went).
    /// Returns how many.
    pub fn drop_orphans(&mut self) -> Result<u64, Errno> {
        let mut orphans = Vec::new();
        {
            let r = self.reader();
            for ino in ROOT_INO..self.next_ino {
                let inode = r.inode_by_ino(Ino::new(ino));
                if !inode.is_null() && r.kind(inode) != Some(Kind::Dir) && self.nlink(inode) == 0 {
                    orphans.push(inode);
                }
            }
        }
        for &inode in &orphans {
            self.drop_inode(inode)?;
        }
        // Their pages are free, with no reader to wait for.
        self.replaced.clear();
        Ok(orphans.len() as u64)
    }

    /// Takes page `p` out of the files: it waits for its grace period (see
    /// [`Namespace::drain_replaced`]), and its owner entry is cleared.
    fn drop_data_page(&mut self, p: PageNo) {
        self.replaced.push(p);
        self.store.page_freed(p);
    }

    // ---- resolving requests ----------------------------------------------------

    /// The parent directory and last component of `at`. Kfs always
    /// resolves the parent itself (a walk over a few, usually cached,
    /// directories, or a check of a node): a client's pre-located
    /// addresses are used only if they belong to that directory, and they
    /// save the costly part, the search inside it.
    ///
    /// A directory named by node must be live (`ESTALE`) and a directory
    /// (`ENOTDIR`), and is searched as a path's last directory is
    /// (`EACCES`); its name must be one component (`EINVAL` for an empty
    /// one, one with a `/`, `.` and `..`). Whether the caller may name
    /// the node at all is the volume's to check (ARCHITECTURE.md §6).
    /// From here on both forms meet the same checks.
    pub fn parent_of<'p>(&self, at: Entry<'p>, creds: &Creds) -> Result<Parent<'p>, Errno> {
        match at {
            Entry::Path(path) => self.reader().resolve_parent_as(path, creds),
            Entry::In { dir, name } => {
                let dir = self.node_inode(dir)?;
                if self.reader().kind(dir) != Some(Kind::Dir) {
                    return Err(Errno::ENOTDIR);
                }
                if matches!(name, b"" | b"." | b"..") || name.contains(&b'/') {
                    return Err(Errno::EINVAL);
                }
                if !creds.is_root() {
                    creds.may(self.perm(dir)?, MAY_EXEC)?;
                }
                Ok(Parent {
                    dir,
                    last: Last::Name(name),
                    trailing_slash: false,
                })
            }
        }
    }

    /// The inode of node `n` (inode number, offset and generation, all
    /// three checked against the inode table): `ESTALE` if it is gone or
    /// was reused, or the offset names no inode.
    pub fn node_inode(&self, n: Node) -> Result<InodeOff, Errno> {
        let r = self.reader();
        let live = r.is_live(n.inode.get(), TAG_INODE, Some(n.gen))
            && r.ino(n.inode) == n.ino
            && r.inode_by_ino(n.ino) == n.inode;
        if live {
            Ok(n.inode)
        } else {
            Err(Errno::ESTALE)
        }
    }

    /// The inode `at` names: a path resolved as `creds` would
    /// ([`Namespace::resolve_as`]), or a live node.
    pub fn inode_at(&self, at: At<'_>, creds: &Creds) -> Result<InodeOff, Errno> {
        match at {
            At::Path { path, follow } => self.resolve_as(path, follow, creds),
            At::Node(n) => self.node_inode(n),
        }
    }

    /// The inode an entry names, following a final symlink if `follow`:
    /// a path resolved as `creds` would, or the name looked up in the
    /// directory ([`Namespace::parent_of`]'s checks) as `openat` does.
    pub fn resolve_entry_as(
        &self,
        at: Entry<'_>,
        follow: bool,
        creds: &Creds,
    ) -> Result<InodeOff, Errno> {
        match at {
            Entry::Path(path) => self.resolve_as(path, follow, creds),
            Entry::In { name, .. } => {
                let p = self.parent_of(at, creds)?;
                self.reader()
                    .resolve_in_as(p.dir, name, follow, creds, self.protected)
            }
        }
    }

    /// Resolves `path` as `creds` would (following a final symlink if
    /// `follow`): the errors of [`IndexReader::resolve`], and `EACCES`
    /// where they may not search a directory on the way (the targets of
    /// symlinks included) or follow a final symlink out of a sticky
    /// directory where symlinks are protected (see [`Creds::may_follow`]).
    pub fn resolve_as(&self, path: &[u8], follow: bool, creds: &Creds) -> Result<InodeOff, Errno> {
        self.reader()
            .resolve_as(path, follow, creds, self.protected)
    }

    fn is_ancestor_or_self(&self, ancestor: InodeOff, mut dir: InodeOff) -> bool {
        let r = self.reader();
        let root = r.root();
        for _ in 0..1 << 20 {
            if dir == ancestor {
                return true;
            }
            if dir == root || dir.is_null() {
                return false;
            }
            dir = r.parent(dir);
        }
        false
    }

    /// Checks a request and works out the change it makes.
    pub fn prepare<'a>(&mut self, req: &Request<'a>, creds: Creds) -> Result<Outcome<'a>, Errno> {
        let time = self.stamp();
        match *req {
            Request::Create {
                at,
                mode,
                target,
                hint,
            } => self.prepare_create(at, mode, target, hint.as_ref(), creds, time),
            Request::Link { from, to, hint } => {
                self.prepare_link(from, to, hint.as_ref(), &creds, time)
            }
            Request::Unlink { at, rmdir, hint } => {
                self.prepare_unlink(at, rmdir, hint.as_ref(), &creds, time)
            }
            Request::Rename {
                from,
                to,
                noreplace,
                hint_from,
                hint_to,
            } => self.prepare_rename(
                from,
                to,
                noreplace,
                hint_from.as_ref(),
                hint_to.as_ref(),
                &creds,
                time,
            ),
            Request::SetAttr { at, attrs, now } => {
                self.prepare_set_attr(at, attrs, now, &creds, time)
            }
            Request::Ping => Ok(Outcome::Done(None)),
            // Data requests are the volume's.
            Request::Open { .. }
            | Request::Close { .. }
            | Request::Grant { .. }
            | Request::Commit { .. }
            | Request::Truncate { .. }
            | Request::Unpool { .. }
            | Request::Write { .. }
            | Request::Statfs
            | Request::Stat { .. }
            | Request::Lookup { .. }
            | Request::ReadDir { .. }
            | Request::ReadLink { .. }
            | Request::Read { .. }
            | Request::Lease { .. } => Err(Errno::EINVAL),
        }
    }

    fn prepare_set_attr<'a>(
        &mut self,
        at: At<'_>,
        mut attrs: SetAttrs,
        now: TimesNow,
        creds: &Creds,
        time: i64,
    ) -> Result<Outcome<'a>, Errno> {
        let inode = self.inode_at(at, creds)?;
        if attrs.mode.is_some_and(|m| m & !0o7777 != 0)
            || (now.atime && attrs.atime.is_some())
            || (now.mtime && attrs.mtime.is_some())
        {
            return Err(Errno::EINVAL);
        }
        let times = if now.atime && now.mtime {
            Times::Touch
        } else if now.atime || now.mtime || attrs.atime.is_some() || attrs.mtime.is_some() {
            Times::Explicit
        } else {
            Times::Keep
        };
        let change = AttrChange {
            mode: attrs.mode,
            uid: attrs.uid,
            gid: attrs.gid,
            chown: attrs.mode.is_none() && times == Times::Keep,
            times,
        };
        attrs.mode = creds.set_attr(self.perm(inode)?, &change)?;
        if now.atime {
            attrs.atime = Some(time);
        }
        if now.mtime {
            attrs.mtime = Some(time);
        }
        Ok(Outcome::Change(Prepared {
            record: Record::SetAttr {
                ino: self.reader().ino(inode),
                attrs,
                time,
            },
            plan: Plan::default(),
        }))
    }

    /// What permission checks read of `inode`.
    fn perm(&self, inode: InodeOff) -> Result<Perm, Errno> {
        self.reader().perm(inode).ok_or(Errno::EIO)
    }

    /// Checks that `creds` may open `inode` with [`open`] `flags` (see
    /// [`Creds::may_open`]); a file the open just created is not checked.
    pub fn may_open(&self, inode: InodeOff, flags: u32, creds: &Creds) -> Result<(), Errno> {
        creds.may_open(self.perm(inode)?, open::wants(flags))
    }

    fn prepare_create<'a>(
        &mut self,
        at: Entry<'a>,
        mode: u32,
        target: &'a [u8],
        hint: Option<&Hint>,
        creds: Creds,
        time: i64,
    ) -> Result<Outcome<'a>, Errno> {
        let kind = Kind::from_mode(mode).ok_or(Errno::EINVAL)?;
        if mode & !(libc::S_IFMT | 0o7777) != 0 {
            return Err(Errno::EINVAL);
        }
        if kind == Kind::Symlink {
            if target.is_empty() {
                return Err(Errno::ENOENT);
            }
            if target.len() >= PATH_MAX || target.contains(&0) {
                return Err(Errno::ENAMETOOLONG);
            }
        } else if !target.is_empty() {
            return Err(Errno::EINVAL);
        }
        let p = self.parent_of(at, &creds)?;
        // The order of Linux's checks: "." and "..", then (for a regular
        // file, as open(O_CREAT) sees it) a trailing slash, then existence,
        // then (for symlinks) a trailing slash on a name that is free.
        let Last::Name(name) = p.last else {
            return Err(Errno::EEXIST);
        };
        if p.trailing_slash && kind == Kind::File {
            return Err(Errno::EISDIR);
        }
        check_name(name)?;
        let (pred, found) = self.insert_point(p.dir, name_hash(name), name, hint);
        if !found.is_null() {
            return Err(Errno::EEXIST);
        }
        if p.trailing_slash && kind != Kind::Dir {
            return Err(Errno::ENOENT);
        }
        let dir = self.perm(p.dir)?;
        creds.may_create_in(dir)?;
        // In a set-group-ID directory, new entries take its group, and new
        // directories its set-group-ID bit too.
        let mode = creds.create_mode(dir, mode);
        let (mode, gid) = if dir.mode & libc::S_ISGID != 0 {
            let bit = if kind == Kind::Dir { libc::S_ISGID } else { 0 };
            (mode | bit, dir.gid)
        } else {
            (mode, creds.gid)
        };
        let ino = self.peek_ino()?;
        self.store.check_create(ino, name.len(), target.len())?;
        Ok(Outcome::Change(Prepared {
            record: Record::Create {
                parent: self.reader().ino(p.dir),
                name: Cow::Borrowed(name),
                ino,
                mode,
                uid: creds.uid,
                gid,
                time,
                target: Cow::Borrowed(target),
            },
            plan: Plan {
                dst: Some(pred),
                ..Plan::default()
            },
        }))
    }

    fn prepare_link<'a>(
        &mut self,
        from: At<'_>,
        to: Entry<'a>,
        hint: Option<&Hint>,
        creds: &Creds,
        time: i64,
    ) -> Result<Outcome<'a>, Errno> {
        let src = self.inode_at(from, creds)?;
        let p = self.parent_of(to, creds)?;
        let Last::Name(name) = p.last else {
            return Err(Errno::EEXIST);
        };
        check_name(name)?;
        let (pred, found) = self.insert_point(p.dir, name_hash(name), name, hint);
        if !found.is_null() {
            return Err(Errno::EEXIST);
        }
        if p.trailing_slash {
            return Err(Errno::ENOENT);
        }
        if self.protected.hardlinks {
            creds.may_hard_link(self.perm(src)?)?;
        }
        creds.may_create_in(self.perm(p.dir)?)?;
        if self.reader().kind(src) == Some(Kind::Dir) {
            return Err(Errno::EPERM);
        }
        if self.nlink(src) >= u32::MAX - 1 {
            return Err(Errno::EMLINK);
        }
        self.store.check_entry(name.len())?;
        Ok(Outcome::Change(Prepared {
            record: Record::Link {
                parent: self.reader().ino(p.dir),
                name: Cow::Borrowed(name),
                ino: self.reader().ino(src),
                time,
            },
            plan: Plan {
                dst: Some(pred),
                ..Plan::default()
            },
        }))
    }

    fn prepare_unlink<'a>(
        &mut self,
        at: Entry<'a>,
        rmdir: bool,
        hint: Option<&Hint>,
        creds: &Creds,
        time: i64,
    ) -> Result<Outcome<'a>, Errno> {
        let p = self.parent_of(at, creds)?;
        let name = match (p.last, rmdir) {
            (Last::Name(n), _) => n,
            (_, false) => return Err(Errno::EISDIR),
            (Last::Dot, true) => return Err(Errno::EINVAL),
            (Last::DotDot, true) => return Err(Errno::ENOTEMPTY),
            (Last::Root, true) => return Err(Errno::EBUSY),
        };
        if name.len() > kucofs_common::index::NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let (pred, found) = self.find_entry(p.dir, name, hint);
        if found.is_null() {
            return Err(Errno::ENOENT);
        }
        let r = self.reader();
        let inode = r.dirent_inode(found);
        let is_dir = r.kind(inode).ok_or(Errno::EIO)? == Kind::Dir;
        // Linux's order: a trailing slash on an unlink's name, then
        // permission, then the kind.
        if !rmdir && p.trailing_slash {
            return Err(if is_dir {
                Errno::EISDIR
            } else {
                Errno::ENOTDIR
            });
        }
        creds.may_delete_in(self.perm(p.dir)?, self.perm(inode)?)?;
        if rmdir {
            if !is_dir {
                return Err(Errno::ENOTDIR);
            }
            if self.arena.get(inode.entries()) > 0 {
                return Err(Errno::ENOTEMPTY);
            }
        } else if is_dir {
            return Err(Errno::EISDIR);
        }
        Ok(Outcome::Change(Prepared {
            record: Record::Unlink {
                parent: r.ino(p.dir),
                name: Cow::Borrowed(name),
                ino: r.ino(inode),
                time,
            },
            plan: Plan {
                src: Some(pred),
                src_found: found,
                ..Plan::default()
            },
        }))
    }

    #[allow(clippy::too_many_arguments)]
    fn prepare_rename<'a>(
        &mut self,
        from: Entry<'a>,
        to: Entry<'a>,
        noreplace: bool,
        hint_from: Option<&Hint>,
        hint_to: Option<&Hint>,
        creds: &Creds,
        time: i64,
    ) -> Result<Outcome<'a>, Errno> {
        let sp = self.parent_of(from, creds)?;
        let dp = self.parent_of(to, creds)?;
        let Last::Name(sname) = sp.last else {
            return Err(Errno::EBUSY);
        };
        let Last::Name(dname) = dp.last else {
            return Err(if noreplace {
                Errno::EEXIST
            } else {
                Errno::EBUSY
            });
        };
        // Each name is checked where Linux looks it up: the source first.
        check_name(sname)?;
        let (spred, sfound) = self.find_entry(sp.dir, sname, hint_from);
        if sfound.is_null() {
            return Err(Errno::ENOENT);
        }
        check_name(dname)?;
        let (dpred, dfound) = self.insert_point(dp.dir, name_hash(dname), dname, hint_to);
        if noreplace && !dfound.is_null() {
            return Err(Errno::EEXIST);
        }
        let r = self.reader();
        let sinode = r.dirent_inode(sfound);
        let skind = r.kind(sinode).ok_or(Errno::EIO)?;
        if skind != Kind::Dir && (sp.trailing_slash || dp.trailing_slash) {
            return Err(Errno::ENOTDIR);
        }
        if skind == Kind::Dir && sp.dir != dp.dir && self.is_ancestor_or_self(sinode, dp.dir) {
            return Err(Errno::EINVAL);
        }
        let dinode = (!dfound.is_null()).then(|| r.dirent_inode(dfound));
        if let Some(dinode) = dinode {
            if sp.dir != dp.dir && self.is_ancestor_or_self(dinode, sp.dir) {
                return Err(Errno::ENOTEMPTY);
            }
            if dinode == sinode {
                return Ok(Outcome::Done(None));
            }
        }
        // Linux's order (`vfs_rename`): removing the old name, then
        // adding the new one or removing the target it replaces, with
        // their kinds; a directory that changes parent needs write
        // permission on itself (its ".." changes); then the link count,
        // and a target directory's emptiness.
        let sperm = self.perm(sinode)?;
        creds.may_delete_in(self.perm(sp.dir)?, sperm)?;
        let mut target_entries = 0;
        match dinode {
            None => creds.may_create_in(self.perm(dp.dir)?)?,
            Some(dinode) => {
                let dattr = r.attr(dinode).ok_or(Errno::EIO)?;
                creds.may_delete_in(self.perm(dp.dir)?, self.perm(dinode)?)?;
                match (skind == Kind::Dir, dattr.kind() == Some(Kind::Dir)) {
                    (true, false) => return Err(Errno::ENOTDIR),
                    (false, true) => return Err(Errno::EISDIR),
                    _ => target_entries = dattr.entries,
                }
            }
        }
        if skind == Kind::Dir && sp.dir != dp.dir {
            creds.may(sperm, MAY_WRITE)?;
            if dinode.is_none() && self.nlink(dp.dir) >= u32::MAX - 1 {
                return Err(Errno::EMLINK);
            }
        }
        if skind == Kind::Dir && target_entries > 0 {
            return Err(Errno::ENOTEMPTY);
        }
        let sdir_ino = r.ino(sp.dir);
        let ddir_ino = r.ino(dp.dir);
        let sino = r.ino(sinode);
        self.store.check_entry(dname.len())?;
        Ok(Outcome::Change(Prepared {
            record: Record::Rename {
                src_parent: sdir_ino,
                src_name: Cow::Borrowed(sname),
                dst_parent: ddir_ino,
                dst_name: Cow::Borrowed(dname),
                ino: sino,
                time,
            },
            plan: Plan {
                dst: Some(dpred),
                dst_found: dfound,
                src: Some(spred),
                src_found: sfound,
            },
        }))
    }

    // ---- applying changes ----------------------------------------------------------

    /// Makes sure applying any one change cannot run out of index space
    /// ([`Arena::make_room`]); `ENOMEM` if the index is that full.
    pub fn make_room(&mut self) -> Result<(), Errno> {
        self.arena.make_room()
    }

    /// Applies a prepared change; its log entry must already be durable.
    /// Returns the node the change named, if any.
    pub fn commit(&mut self, p: Prepared<'_>) -> Result<Option<Node>, Errno> {
        self.apply_planned(&p.record, p.plan)
    }

    /// Applies a record read back from the log. Records already applied
    /// change nothing.
    pub fn apply(&mut self, rec: &Record<'_>) -> Result<Option<Node>, Errno> {
        self.apply_planned(rec, Plan::default())
    }

    fn reply_for(&self, inode: InodeOff) -> Option<Node> {
        let r = self.reader();
        Some(Node {
            ino: r.ino(inode),
            inode,
            gen: header_gen(r.header(inode.get())),
        })
    }

    fn apply_planned(&mut self, rec: &Record<'_>, plan: Plan) -> Result<Option<Node>, Errno> {
        match rec {
            Record::Create {
                parent,
                name,
                ino,
                mode,
                uid,
                gid,
                time,
                target,
            } => {
                if let Ok(existing) = self.inode_of(*ino) {
                    return Ok(self.reply_for(existing));
                }
                let dir = self.inode_of(*parent)?;
                let kind = Kind::from_mode(*mode).ok_or(Errno::EINVAL)?;
                let pred = match plan.dst {
                    Some(p) => p,
                    None => {
                        let (p, found) = self.insert_point(dir, name_hash(name), name, None);
                        if !found.is_null() {
                            return Err(Errno::EEXIST);
                        }
                        p
                    }
                };
                let inode = self.new_inode(*ino, *mode, *uid, *gid, *time, dir, target)?;
                self.link_entry(dir, name, inode, pred)?;
                self.touch_dir(dir, 1, i32::from(kind == Kind::Dir), *time)?;
                Ok(self.reply_for(inode))
            }
            Record::Link {
                parent,
                name,
                ino,
                time,
            } => {
                let dir = self.inode_of(*parent)?;
                let inode = self.inode_of(*ino)?;
                let pred = match plan.dst {
                    Some(p) => p,
                    None => {
                        let (p, found) = self.insert_point(dir, name_hash(name), name, None);
                        if !found.is_null() {
                            // Already applied (replay).
                            return Ok(self.reply_for(inode));
                        }
                        p
                    }
                };
                self.add_nlink(inode, 1, *time)?;
                self.link_entry(dir, name, inode, pred)?;
                self.touch_dir(dir, 1, 0, *time)?;
                Ok(self.reply_for(inode))
            }
            Record::Unlink {
                parent,
                name,
                ino,
                time,
            } => {
                let dir = self.inode_of(*parent)?;
                let (pred, found) = match plan.src {
                    Some(p) => (p, plan.src_found),
                    None => self.find_entry(dir, name, None),
                };
                let r = self.reader();
                if found.is_null() || r.ino(r.dirent_inode(found)) != *ino {
                    // Already applied (replay).
                    return Ok(None);
                }
                let inode = r.dirent_inode(found);
                let is_dir = r.kind(inode) == Some(Kind::Dir);
                self.unlink_entry(found, pred)?;
                self.touch_dir(dir, -1, -i32::from(is_dir), *time)?;
                if is_dir || self.add_nlink(inode, -1, *time)? == 0 {
                    self.drop_inode(inode)?;
                }
                Ok(None)
            }
            Record::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
                ino,
                time,
            } => self.apply_rename(
                *src_parent,
                src_name,
                *dst_parent,
                dst_name,
                *ino,
                *time,
                plan,
            ),
            Record::SetAttr { ino, attrs, time } => {
                let inode = self.inode_of(*ino)?;
                let mode = self.reader().mode(inode);
                self.update(inode, |a| {
                    if let Some(m) = attrs.mode {
                        a.put32(inode.mode(), (mode & libc::S_IFMT) | (m & 0o7777))?;
                    }
                    if let Some(u) = attrs.uid {
                        a.put32(inode.uid(), u)?;
                    }
                    if let Some(g) = attrs.gid {
                        a.put32(inode.gid(), g)?;
                    }
                    if let Some(t) = attrs.atime {
                        a.put(inode.atime(), t.cast_unsigned())?;
                    }
                    if let Some(t) = attrs.mtime {
                        a.put(inode.mtime(), t.cast_unsigned())?;
                    }
                    a.put(inode.ctime(), time.cast_unsigned())
                })?;
                Ok(self.reply_for(inode))
            }
            Record::Write {
                ino,
                first,
                extents,
                size,
                time,
            } => {
                // A file written while open after its last name went, and
                // dropped since (replay after a crash): nothing to do.
                let Ok(inode) = self.inode_of(*ino) else {
                    return Ok(None);
                };
                if self.reader().kind(inode) != Some(Kind::File) {
                    return Err(Errno::EINVAL);
                }
                let pages: Vec<u64> = extents.iter_pages().map(PageNo::get).collect();
                self.write_pages(inode, *first, &pages, *size, *time)?;
                Ok(self.reply_for(inode))
            }
            Record::Truncate { ino, size, time } => {
                let Ok(inode) = self.inode_of(*ino) else {
                    return Ok(None);
                };
                if self.reader().kind(inode) != Some(Kind::File) {
                    return Err(Errno::EINVAL);
                }
                self.truncate_file(inode, *size, *time)?;
                Ok(self.reply_for(inode))
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn apply_rename(
        &mut self,
        src_parent: Ino,
        src_name: &[u8],
        dst_parent: Ino,
        dst_name: &[u8],
        ino: Ino,
        time: i64,
        plan: Plan,
    ) -> Result<Option<Node>, Errno> {
        let sdir = self.inode_of(src_parent)?;
        let ddir = self.inode_of(dst_parent)?;
        let inode = self.inode_of(ino)?;
        let src_found = match plan.src {
            Some(_) => plan.src_found,
            None => self.find_entry(sdir, src_name, None).1,
        };
        let r = self.reader();
        if src_found.is_null() || r.dirent_inode(src_found) != inode {
            // Already applied (replay).
            return Ok(self.reply_for(inode));
        }
        let is_dir = r.kind(inode) == Some(Kind::Dir);
        let (dpred, dfound) = match plan.dst {
            Some(p) => (p, plan.dst_found),
            None => self.insert_point(ddir, name_hash(dst_name), dst_name, None),
        };
        // The new name first: a reader finds the inode under at least one.
        let mut victim = InodeOff::NULL;
        if !dfound.is_null() {
            victim = self.reader().dirent_inode(dfound);
            self.replace_entry(ddir, dfound, dpred, inode)?;
        } else {
            self.link_entry(ddir, dst_name, inode, dpred)?;
        }
        // Then the old name, with its predecessor found afresh: the entry
        // linked above may have become it.
        let s = self.reader().search(sdir, name_hash(src_name), src_name);
        if s.found != src_found {
            return Err(Errno::EIO);
        }
        self.unlink_entry(src_found, s.pred)?;
        let moved_dir = i32::from(is_dir && sdir != ddir);
        self.touch_dir(sdir, -1, -moved_dir, time)?;
        self.touch_dir(ddir, i64::from(dfound.is_null()), moved_dir, time)?;
        if is_dir && sdir != ddir {
            self.update(inode, |a| a.put(inode.parent(), ddir.get()))?;
        }
        self.update(inode, |a| a.put(inode.ctime(), time.cast_unsigned()))?;
        if !victim.is_null() {
            let victim_dir = self.reader().kind(victim) == Some(Kind::Dir);
            if victim_dir {
                // The replaced directory's ".." no longer links ddir.
                self.touch_dir(ddir, 0, -1, time)?;
                self.drop_inode(victim)?;
            } else if self.add_nlink(victim, -1, time)? == 0 {
                self.drop_inode(victim)?;
            }
        }
        Ok(self.reply_for(inode))
    }

    // ---- loading from the store ----------------------------------------------------

    /// Restores an inode from the store (the root's attributes overwrite
    /// the fresh root's).
    pub fn load_inode(&mut self, a: &InodeAttr, target: &[u8]) -> Result<InodeOff, Errno> {
        let inode = match self.reader().inode_by_ino(a.ino) {
            none if none.is_null() => {
                if Kind::from_mode(a.mode).is_none() || a.ino.get() == 0 {
                    return Err(Errno::EINVAL);
                }
                let parent = InodeOff::NULL;
                self.new_inode(a.ino, a.mode, a.uid, a.gid, a.ctime, parent, target)?
            }
            existing if a.ino == Ino::ROOT && a.mode & libc::S_IFMT == libc::S_IFDIR => existing,
            _ => return Err(Errno::EEXIST),
        };
        self.update(inode, |x| {
            x.put32(inode.mode(), a.mode)?;
            x.put32(inode.nlink(), a.nlink)?;
            x.put32(inode.uid(), a.uid)?;
            x.put32(inode.gid(), a.gid)?;
            x.put(inode.size(), a.size)?;
            x.put(inode.atime(), a.atime.cast_unsigned())?;
            x.put(inode.mtime(), a.mtime.cast_unsigned())?;
            x.put(inode.ctime(), a.ctime.cast_unsigned())?;
            x.put(inode.btime(), a.btime.cast_unsigned())
        })?;
        Ok(inode)
    }

    /// Calls `f` for every inode that has a name (a directory, or a link
    /// count above zero), in inode-number order. Found through the inode
    /// table rather than through the names: the table and the inodes are
    /// read in the order they were made, so a large namespace costs a
    /// sequential read, not a cache miss per inode. (An unlinked file still
    /// open is left out, as recovery would drop it. Whether every inode is
    /// reachable is fsck's `check_tree`'s question.)
    pub fn for_each_inode(&self, mut f: impl FnMut(&InodeAttr)) {
        let r = self.reader();
        // Inodes AHEAD numbers on are fetched while this one is read; their
        // offsets wait in a ring, so each table slot is read once.
        const AHEAD: usize = 8;
        let mut ring = [InodeOff::NULL; AHEAD];
        let end = self.next_ino;
        for ino in ROOT_INO..end + AHEAD as u64 {
            // A remainder below `AHEAD`, which any `usize` holds.
            #[allow(clippy::cast_possible_truncation)]
            let slot = (ino % AHEAD as u64) as usize;
            let inode = ring[slot];
            ring[slot] = if ino < end {
                r.inode_by_ino(Ino::new(ino))
            } else {
                InodeOff::NULL
            };
            if !ring[slot].is_null() {
                r.mem().prefetch(ring[slot].seq());
                r.mem().prefetch(ring[slot].size());
            }
            if inode.is_null() {
                continue;
            }
            let Some(a) = r.attr(inode) else { continue };
            if a.kind() == Some(Kind::Dir) || a.nlink > 0 {
                f(&a);
            }
        }
    }

    /// Calls `f(parent ino, name, ino)` for every entry of every directory,
    /// directories in inode-number order (see [`IndexReader::for_each_entry`]
    /// for the order within one).
    pub fn for_each_entry(&self, mut f: impl FnMut(Ino, &[u8], Ino)) {
        let r = self.reader();
        for ino in ROOT_INO..self.next_ino {
            let ino = Ino::new(ino);
            let dir = r.inode_by_ino(ino);
            if !dir.is_null() && r.kind(dir) == Some(Kind::Dir) {
                r.for_each_entry(dir, |name, child| f(ino, name, child));
            }
        }
    }

    /// Visits the tree depth-first from the root: every inode once, before
    /// any entry that names it, and every entry (parent ino, name, ino).
    /// The tests' reference for [`Namespace::for_each_inode`] and
    /// [`Namespace::for_each_entry`].
    #[cfg(test)]
    pub fn walk(
        &self,
        mut inode_fn: impl FnMut(&InodeAttr, Option<Vec<u8>>),
        mut entry_fn: impl FnMut(Ino, &[u8], Ino),
    ) {
        let r = self.reader();
        let root = r.root();
        let Some(root_attr) = r.attr(root) else {
            return;
        };
        inode_fn(&root_attr, None);
        let mut seen = std::collections::HashSet::new();
        let mut stack = vec![root];
        while let Some(dir) = stack.pop() {
            let dir_ino = r.ino(dir);
            let mut after: Option<(u64, Vec<u8>)> = None;
            loop {
                let mut batch = Vec::new();
                let more = r.read_dir(
                    dir,
                    after.as_ref().map(|(h, n)| (*h, n.as_slice())),
                    1024,
                    &mut batch,
                );
                for e in &batch {
                    if seen.insert(e.ino) {
                        if let Some(a) = r.attr(e.inode) {
                            inode_fn(&a, r.readlink(e.inode));
                        }
                        if e.kind == Kind::Dir {
                            stack.push(e.inode);
                        }
                    }
                    entry_fn(dir_ino, &e.name, e.ino);
                }
                after = batch.last().map(|e| (e.hash, e.name.clone()));
                if !more {
                    break;
                }
            }
        }
    }

    /// Prepares and applies a request with no log (tests and tools).
    pub fn execute(&mut self, req: &Request<'_>, creds: Creds) -> Result<Option<Node>, Errno> {
        match self.prepare(req, creds)? {
            Outcome::Done(r) => Ok(r),
            Outcome::Change(p) => self.commit(p),
        }
    }
}

mod dir;
mod grow;
mod map;

pub use dir::{LoadedEntry, DISMANTLE_STEP};
pub use grow::GROW_STEP;

#[cfg(test)]
mod permission_tests;
#[cfg(test)]
mod tests;
