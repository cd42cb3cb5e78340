//! The namespace as Kfs changes it: POSIX checks for every request, the
//! check of a client's pre-located addresses (collaborative indexing,
//! DESIGN §6), and [`Namespace::apply`], the one function that changes the
//! index, used alike for live requests (after their log entry is durable)
//! and for log replay at recovery.
//!
//! Ordering for lock-free readers: a created inode is filled before its
//! entry is linked; an entry is unlinked before its inode is retired; a
//! rename links the new entry before it unlinks the old one, and replacing
//! an existing target swaps one entry for another at every level, so a
//! reader always finds the target name.

use std::cmp::Ordering as Cmp;
use std::time::{SystemTime, UNIX_EPOCH};

use kucofs_common::index::layout::*;
use kucofs_common::index::{
    check_name, name_hash, split_path, IndexReader, InodeAttr, Kind, Last, Parent, PATH_MAX,
};
use kucofs_common::pm::Shm;
use kucofs_common::proto::{Creds, Hint, Reply, Request};
use kucofs_common::Errno;

use crate::arena::Arena;
use crate::record::Record;

/// Inode number of the root directory.
pub const ROOT_INO: u64 = 1;

/// A validated change, waiting for its log entry to become durable.
#[derive(Debug)]
pub struct Prepared {
    /// What the log records.
    pub record: Record,
    plan: Plan,
}

/// Where a validated change goes, so that applying it need not search.
#[derive(Debug, Default, Clone, Copy)]
struct Plan {
    /// Validated insertion point at the destination, and the new entry's
    /// height.
    dst: Option<([u64; MAX_HEIGHT], usize)>,
    /// The existing destination entry (rename over a target).
    dst_found: u64,
    /// Validated predecessors of the entry to remove.
    src: Option<[u64; MAX_HEIGHT]>,
    /// The entry to remove.
    src_found: u64,
}

/// What a request resolved to.
#[derive(Debug)]
pub enum Outcome {
    /// A change to log and then [`Namespace::commit`].
    Change(Box<Prepared>),
    /// Nothing to change (e.g. renaming a name onto another name of the
    /// same inode); reply at once.
    Done(Reply),
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
    rng: u64,
    hints: HintStats,
}

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

impl Namespace {
    /// An empty namespace: a root directory owned by `root`.
    pub fn new(root: Creds, time: i64) -> Result<Namespace, Errno> {
        let mut arena = Arena::new()?;
        let top = arena.alloc(TAG_ITABLE_TOP, ITABLE_SLOTS_AT + 8 * ITABLE_TOP_SLOTS)?;
        arena.put(HDR_ITABLE_SLOTS, ITABLE_TOP_SLOTS)?;
        arena.put(HDR_ITABLE, top)?;
        let mut ns = Namespace {
            arena,
            next_ino: ROOT_INO + 1,
            free_inos: Vec::new(),
            rng: 0x9e37_79b9_7f4a_7c15 ^ time as u64,
            hints: HintStats::default(),
        };
        let root_inode = ns.new_inode(
            ROOT_INO,
            libc::S_IFDIR | 0o755,
            root.uid,
            root.gid,
            time,
            0,
            b"",
        )?;
        ns.arena.put(root_inode + I_PARENT, root_inode)?;
        ns.arena.put(HDR_ROOT, root_inode)?;
        Ok(ns)
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

    /// Frees retired items no reader can hold (see [`Arena::reclaim`]).
    pub fn reclaim(&mut self, readers: impl Iterator<Item = u64>) -> Result<usize, Errno> {
        self.arena.reclaim(readers)
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
            if r.inode_by_ino(ino) == 0 {
                free.push(ino);
            } else {
                max = ino;
            }
        }
        free.retain(|&i| i < max);
        free.reverse();
        self.free_inos = free;
        self.next_ino = max + 1;
    }

    fn peek_ino(&self) -> Result<u64, Errno> {
        match self.free_inos.last() {
            Some(&i) => Ok(i),
            None if self.next_ino / ITABLE_CHUNK_INOS < ITABLE_TOP_SLOTS => Ok(self.next_ino),
            None => Err(Errno::ENOSPC),
        }
    }

    fn take_ino(&mut self, ino: u64) {
        if self.free_inos.last() == Some(&ino) {
            self.free_inos.pop();
        } else if ino >= self.next_ino {
            self.next_ino = ino + 1;
        } else if let Some(i) = self.free_inos.iter().position(|&x| x == ino) {
            self.free_inos.remove(i);
        }
    }

    fn random_height(&mut self) -> usize {
        // xorshift64*; each extra level with probability 1/4.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let r = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (1 + r.trailing_zeros() as usize / 2).min(MAX_HEIGHT)
    }

    // ---- the inode table --------------------------------------------------

    fn itable_set(&mut self, ino: u64, inode: u64) -> Result<(), Errno> {
        let top = self.arena.get(HDR_ITABLE);
        let chunk_no = ino / ITABLE_CHUNK_INOS;
        if chunk_no >= ITABLE_TOP_SLOTS {
            return Err(Errno::ENOSPC);
        }
        let slot_of_chunk = top + ITABLE_SLOTS_AT + 8 * chunk_no;
        let mut chunk = self.arena.get(slot_of_chunk);
        if chunk == 0 {
            chunk = self
                .arena
                .alloc(TAG_ITABLE_CHUNK, ITABLE_SLOTS_AT + 8 * ITABLE_CHUNK_INOS)?;
            self.arena.put(slot_of_chunk, chunk)?;
        }
        self.arena.put(
            chunk + ITABLE_SLOTS_AT + 8 * (ino % ITABLE_CHUNK_INOS),
            inode,
        )?;
        let n = self.arena.get(HDR_INODES);
        let n = if inode == 0 { n - 1 } else { n + 1 };
        self.arena.put(HDR_INODES, n)
    }

    fn inode_of(&self, ino: u64) -> Result<u64, Errno> {
        match self.reader().inode_by_ino(ino) {
            0 => Err(Errno::ENOENT),
            off => Ok(off),
        }
    }

    // ---- inodes ------------------------------------------------------------

    #[allow(clippy::too_many_arguments)]
    fn new_inode(
        &mut self,
        ino: u64,
        mode: u32,
        uid: u32,
        gid: u32,
        time: i64,
        parent: u64,
        target: &[u8],
    ) -> Result<u64, Errno> {
        let a = &mut self.arena;
        let inode = a.alloc(TAG_INODE, INODE_SIZE)?;
        a.put(inode + I_INO, ino)?;
        a.put32(inode + I_MODE, mode)?;
        a.put32(inode + I_UID, uid)?;
        a.put32(inode + I_GID, gid)?;
        for f in [I_ATIME, I_MTIME, I_CTIME, I_BTIME] {
            a.put(inode + f, time as u64)?;
        }
        match Kind::from_mode(mode) {
            Some(Kind::Dir) => {
                let head = a.alloc(TAG_DIRHEAD, dirent_size(MAX_HEIGHT, 0))?;
                a.put(head + D_DIR, inode)?;
                a.put(head + D_INODE, inode)?;
                a.put(
                    head + D_SHAPE,
                    shape(0, MAX_HEIGHT as u8, Kind::Dir.to_byte()),
                )?;
                a.put(inode + I_DATA, head)?;
                a.put(inode + I_PARENT, parent)?;
                a.put32(inode + I_NLINK, 2)?;
            }
            Some(Kind::Symlink) => {
                let t = a.alloc(TAG_SYMLINK, S_BYTES + target.len() as u64)?;
                a.put(t + S_LEN, target.len() as u64)?;
                a.put_bytes(t + S_BYTES, target)?;
                a.put(inode + I_DATA, t)?;
                a.put(inode + I_SIZE, target.len() as u64)?;
                a.put32(inode + I_NLINK, 1)?;
            }
            Some(Kind::File) => a.put32(inode + I_NLINK, 1)?,
            None => return Err(Errno::EINVAL),
        }
        self.itable_set(ino, inode)?;
        self.take_ino(ino);
        Ok(inode)
    }

    /// Changes inode fields under its sequence lock.
    fn update(
        &mut self,
        inode: u64,
        f: impl FnOnce(&Arena) -> Result<(), Errno>,
    ) -> Result<(), Errno> {
        self.arena.seq_begin(inode)?;
        let r = f(&self.arena);
        self.arena.seq_end(inode)?;
        r
    }

    fn nlink(&self, inode: u64) -> u32 {
        self.reader().attr(inode).map_or(0, |a| a.nlink)
    }

    fn add_nlink(&mut self, inode: u64, delta: i32, time: i64) -> Result<u32, Errno> {
        let n = self.nlink(inode).saturating_add_signed(delta);
        self.update(inode, |a| {
            a.put32(inode + I_NLINK, n)?;
            a.put(inode + I_CTIME, time as u64)
        })?;
        Ok(n)
    }

    /// Directory bookkeeping after an entry was added (+1) or removed (-1),
    /// and `subdirs` subdirectories with it.
    fn touch_dir(&mut self, dir: u64, entries: i64, subdirs: i32, time: i64) -> Result<(), Errno> {
        let attr = self.reader().attr(dir).ok_or(Errno::EIO)?;
        self.update(dir, |a| {
            a.put(dir + I_ENTRIES, attr.entries.saturating_add_signed(entries))?;
            a.put32(dir + I_NLINK, attr.nlink.saturating_add_signed(subdirs))?;
            a.put(dir + I_MTIME, time as u64)?;
            a.put(dir + I_CTIME, time as u64)
        })
    }

    /// Retires an inode and what hangs off it, and frees its number.
    fn drop_inode(&mut self, inode: u64) -> Result<(), Errno> {
        let r = self.reader();
        let ino = r.ino(inode);
        let kind = r.kind(inode);
        let data = self.arena.get(inode + I_DATA);
        if matches!(kind, Some(Kind::Dir) | Some(Kind::Symlink)) && data != 0 {
            self.arena.retire(data)?;
        }
        self.itable_set(ino, 0)?;
        self.arena.retire(inode)?;
        self.free_inos.push(ino);
        Ok(())
    }

    // ---- skip lists ----------------------------------------------------------

    /// The insertion point for a new key, checked from a hint or searched.
    fn insert_point(
        &mut self,
        dir: u64,
        hash: u64,
        name: &[u8],
        hint: Option<&Hint>,
    ) -> ([u64; MAX_HEIGHT], u64, usize) {
        let height = self.random_height();
        let r = self.arena.reader();
        if let Some(h) = hint {
            let head = r.dir_head(dir);
            let mut preds = [head; MAX_HEIGHT];
            let n = (h.npreds as usize).min(MAX_HEIGHT);
            preds[..n].copy_from_slice(&h.preds[..n]);
            let ok = h.dir == dir
                && (0..height).all(|i| {
                    let p = preds[i];
                    // Each check runs only once the ones before it passed, so
                    // a forged offset is never used for arithmetic or loads
                    // beyond its header.
                    let p_ok = p == head
                        || (r.is_live(p, TAG_DIRENT, None)
                            && self.arena.get(p + D_DIR) == dir
                            && r.height(p) > i
                            && r.cmp_key(p, hash, name) == Cmp::Less);
                    p_ok && {
                        let nx = r.next(p, i);
                        nx == 0 || r.cmp_key(nx, hash, name) == Cmp::Greater
                    }
                });
            if ok {
                self.hints.used += 1;
                return (preds, 0, height);
            }
            self.hints.stale += 1;
        } else {
            self.hints.absent += 1;
        }
        let s = r.search(dir, hash, name);
        (s.preds, s.found, height)
    }

    /// The entry named `name` in `dir` and its predecessors, checked from a
    /// hint or searched. Returns a found offset of 0 if there is none.
    fn find_entry(
        &mut self,
        dir: u64,
        name: &[u8],
        hint: Option<&Hint>,
    ) -> ([u64; MAX_HEIGHT], u64) {
        let r = self.arena.reader();
        if let Some(h) = hint {
            let head = r.dir_head(dir);
            let f = h.found;
            let found_ok = h.dir == dir
                && f != 0
                && r.is_live(f, TAG_DIRENT, Some(h.found_gen))
                && self.arena.get(f + D_DIR) == dir
                && r.cmp_key(f, name_hash(name), name) == Cmp::Equal;
            if found_ok {
                let mut preds = [head; MAX_HEIGHT];
                let n = (h.npreds as usize).min(MAX_HEIGHT);
                preds[..n].copy_from_slice(&h.preds[..n]);
                if (0..r.height(f)).all(|i| r.next(preds[i], i) == f) {
                    self.hints.used += 1;
                    return (preds, f);
                }
            }
            self.hints.stale += 1;
        } else {
            self.hints.absent += 1;
        }
        let s = r.search(dir, name_hash(name), name);
        (s.preds, s.found)
    }

    /// Links a new entry for `inode` into `dir` at a checked insertion point.
    #[allow(clippy::too_many_arguments)]
    fn link_entry(
        &mut self,
        dir: u64,
        name: &[u8],
        inode: u64,
        preds: &[u64; MAX_HEIGHT],
        height: usize,
    ) -> Result<u64, Errno> {
        let r = self.reader();
        let ino = r.ino(inode);
        let kind = r.kind(inode).ok_or(Errno::EIO)?;
        let next: Vec<u64> = (0..height).map(|i| r.next(preds[i], i)).collect();
        let head = r.dir_head(dir);
        let levels = r.levels(head);
        let a = &mut self.arena;
        let node = a.alloc(TAG_DIRENT, dirent_size(height, name.len()))?;
        a.put(node + D_HASH, name_hash(name))?;
        a.put(node + D_INODE, inode)?;
        a.put(node + D_INO, ino)?;
        a.put(node + D_DIR, dir)?;
        a.put(
            node + D_SHAPE,
            shape(name.len() as u16, height as u8, kind.to_byte()),
        )?;
        a.put_bytes(node + dirent_name(height), name)?;
        for (i, n) in next.iter().enumerate() {
            a.put(node + D_NEXT + 8 * i as u64, *n)?;
        }
        // Bottom level first: once a reader can reach the node at level 0
        // (Release store; readers Acquire `next`), it is fully written.
        for (i, p) in preds.iter().enumerate().take(height) {
            a.put(p + D_NEXT + 8 * i as u64, node)?;
        }
        if levels < height {
            a.put(head + H_LEVELS, height as u64)?;
        }
        Ok(node)
    }

    /// Swaps entry `old` in `dir` for a new one of the same name naming
    /// `inode`, level by level from the bottom, so the name never vanishes.
    fn replace_entry(
        &mut self,
        dir: u64,
        old: u64,
        preds: &[u64; MAX_HEIGHT],
        inode: u64,
    ) -> Result<u64, Errno> {
        let r = self.reader();
        let height = r.height(old);
        let info = r.dirent(old);
        let kind = r.kind(inode).ok_or(Errno::EIO)?;
        let ino = r.ino(inode);
        let next: Vec<u64> = (0..height).map(|i| r.next(old, i)).collect();
        let a = &mut self.arena;
        let node = a.alloc(TAG_DIRENT, dirent_size(height, info.name.len()))?;
        a.put(node + D_HASH, info.hash)?;
        a.put(node + D_INODE, inode)?;
        a.put(node + D_INO, ino)?;
        a.put(node + D_DIR, dir)?;
        a.put(
            node + D_SHAPE,
            shape(info.name.len() as u16, height as u8, kind.to_byte()),
        )?;
        a.put_bytes(node + dirent_name(height), &info.name)?;
        for (i, n) in next.iter().enumerate() {
            a.put(node + D_NEXT + 8 * i as u64, *n)?;
        }
        for (i, p) in preds.iter().enumerate().take(height) {
            a.put(p + D_NEXT + 8 * i as u64, node)?;
        }
        a.retire(old)?;
        Ok(node)
    }

    /// Unlinks entry `node` (top level first) and retires it. Its own links
    /// stay intact, so a reader standing on it walks on.
    fn unlink_entry(&mut self, node: u64, preds: &[u64; MAX_HEIGHT]) -> Result<(), Errno> {
        let r = self.reader();
        let height = r.height(node);
        for i in (0..height).rev() {
            if r.next(preds[i], i) != node {
                return Err(Errno::EIO);
            }
            self.arena
                .put(preds[i] + D_NEXT + 8 * i as u64, r.next(node, i))?;
        }
        self.arena.retire(node)
    }

    // ---- resolving requests ----------------------------------------------------

    /// The parent directory and last component of `path`: from a checked
    /// hint, or by resolving the path.
    fn parent_of<'p>(&mut self, path: &'p [u8], hint: Option<&Hint>) -> Result<Parent<'p>, Errno> {
        if path.is_empty() {
            return Err(Errno::ENOENT);
        }
        if path.len() >= PATH_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let r = self.reader();
        if let Some(h) = hint {
            let (_, last, trailing_slash) = split_path(path);
            if matches!(last, Last::Name(_))
                && r.is_live(h.dir, TAG_INODE, Some(h.dir_gen))
                && r.kind(h.dir) == Some(Kind::Dir)
            {
                return Ok(Parent {
                    dir: h.dir,
                    last,
                    trailing_slash,
                });
            }
        }
        r.resolve_parent(path)
    }

    fn is_ancestor_or_self(&self, ancestor: u64, mut dir: u64) -> bool {
        let r = self.reader();
        let root = r.root();
        for _ in 0..1 << 20 {
            if dir == ancestor {
                return true;
            }
            if dir == root || dir == 0 {
                return false;
            }
            dir = r.parent(dir);
        }
        false
    }

    /// Checks a request and works out the change it makes.
    pub fn prepare(&mut self, req: &Request<'_>, creds: Creds) -> Result<Outcome, Errno> {
        let time = now_ns();
        match *req {
            Request::Create {
                path,
                mode,
                target,
                hint,
            } => self.prepare_create(path, mode, target, hint.as_ref(), creds, time),
            Request::Link { from, to, hint } => self.prepare_link(from, to, hint.as_ref(), time),
            Request::Unlink { path, rmdir, hint } => {
                self.prepare_unlink(path, rmdir, hint.as_ref(), time)
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
                time,
            ),
            Request::SetAttr {
                path,
                follow,
                attrs,
            } => {
                let inode = self.reader().resolve(path, follow)?;
                if attrs.mode.is_some_and(|m| m & !0o7777 != 0) {
                    return Err(Errno::EINVAL);
                }
                Ok(Outcome::Change(Box::new(Prepared {
                    record: Record::SetAttr {
                        ino: self.reader().ino(inode),
                        attrs,
                        time,
                    },
                    plan: Plan::default(),
                })))
            }
            Request::Ping => Ok(Outcome::Done(Reply::default())),
        }
    }

    fn prepare_create(
        &mut self,
        path: &[u8],
        mode: u32,
        target: &[u8],
        hint: Option<&Hint>,
        creds: Creds,
        time: i64,
    ) -> Result<Outcome, Errno> {
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
        let p = self.parent_of(path, hint)?;
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
        let (preds, found, height) = self.insert_point(p.dir, name_hash(name), name, hint);
        if found != 0 {
            return Err(Errno::EEXIST);
        }
        if p.trailing_slash && kind != Kind::Dir {
            return Err(Errno::ENOENT);
        }
        // In a set-group-ID directory, new entries take its group, and new
        // directories its set-group-ID bit too.
        let parent = self.reader().attr(p.dir).ok_or(Errno::EIO)?;
        let (mode, gid) = if parent.mode & libc::S_ISGID != 0 {
            let bit = if kind == Kind::Dir { libc::S_ISGID } else { 0 };
            (mode | bit, parent.gid)
        } else {
            (mode, creds.gid)
        };
        let ino = self.peek_ino()?;
        Ok(Outcome::Change(Box::new(Prepared {
            record: Record::Create {
                parent: self.reader().ino(p.dir),
                name: name.to_vec(),
                ino,
                mode,
                uid: creds.uid,
                gid,
                time,
                target: target.to_vec(),
            },
            plan: Plan {
                dst: Some((preds, height)),
                ..Plan::default()
            },
        })))
    }

    fn prepare_link(
        &mut self,
        from: &[u8],
        to: &[u8],
        hint: Option<&Hint>,
        time: i64,
    ) -> Result<Outcome, Errno> {
        let src = self.reader().resolve(from, false)?;
        let p = self.parent_of(to, hint)?;
        let Last::Name(name) = p.last else {
            return Err(Errno::EEXIST);
        };
        check_name(name)?;
        let (preds, found, height) = self.insert_point(p.dir, name_hash(name), name, hint);
        if found != 0 {
            return Err(Errno::EEXIST);
        }
        if p.trailing_slash {
            return Err(Errno::ENOENT);
        }
        if self.reader().kind(src) == Some(Kind::Dir) {
            return Err(Errno::EPERM);
        }
        if self.nlink(src) >= u32::MAX - 1 {
            return Err(Errno::EMLINK);
        }
        Ok(Outcome::Change(Box::new(Prepared {
            record: Record::Link {
                parent: self.reader().ino(p.dir),
                name: name.to_vec(),
                ino: self.reader().ino(src),
                time,
            },
            plan: Plan {
                dst: Some((preds, height)),
                ..Plan::default()
            },
        })))
    }

    fn prepare_unlink(
        &mut self,
        path: &[u8],
        rmdir: bool,
        hint: Option<&Hint>,
        time: i64,
    ) -> Result<Outcome, Errno> {
        let p = self.parent_of(path, hint)?;
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
        let (preds, found) = self.find_entry(p.dir, name, hint);
        if found == 0 {
            return Err(Errno::ENOENT);
        }
        let r = self.reader();
        let inode = r.dirent_inode(found);
        let attr = r.attr(inode).ok_or(Errno::EIO)?;
        let is_dir = attr.kind() == Some(Kind::Dir);
        if rmdir {
            if !is_dir {
                return Err(Errno::ENOTDIR);
            }
            if attr.entries > 0 {
                return Err(Errno::ENOTEMPTY);
            }
        } else if is_dir {
            return Err(Errno::EISDIR);
        } else if p.trailing_slash {
            return Err(Errno::ENOTDIR);
        }
        Ok(Outcome::Change(Box::new(Prepared {
            record: Record::Unlink {
                parent: r.ino(p.dir),
                name: name.to_vec(),
                ino: attr.ino,
                time,
            },
            plan: Plan {
                src: Some(preds),
                src_found: found,
                ..Plan::default()
            },
        })))
    }

    #[allow(clippy::too_many_arguments)]
    fn prepare_rename(
        &mut self,
        from: &[u8],
        to: &[u8],
        noreplace: bool,
        hint_from: Option<&Hint>,
        hint_to: Option<&Hint>,
        time: i64,
    ) -> Result<Outcome, Errno> {
        let sp = self.parent_of(from, hint_from)?;
        let dp = self.parent_of(to, hint_to)?;
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
        let (spreds, sfound) = self.find_entry(sp.dir, sname, hint_from);
        if sfound == 0 {
            return Err(Errno::ENOENT);
        }
        check_name(dname)?;
        let (dpreds, dfound, height) = self.insert_point(dp.dir, name_hash(dname), dname, hint_to);
        if noreplace && dfound != 0 {
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
        if dfound != 0 {
            let dinode = r.dirent_inode(dfound);
            if sp.dir != dp.dir && self.is_ancestor_or_self(dinode, sp.dir) {
                return Err(Errno::ENOTEMPTY);
            }
            if dinode == sinode {
                return Ok(Outcome::Done(Reply::default()));
            }
            let dattr = r.attr(dinode).ok_or(Errno::EIO)?;
            match (skind == Kind::Dir, dattr.kind() == Some(Kind::Dir)) {
                (true, false) => return Err(Errno::ENOTDIR),
                (false, true) => return Err(Errno::EISDIR),
                (true, true) if dattr.entries > 0 => return Err(Errno::ENOTEMPTY),
                _ => {}
            }
        }
        if skind == Kind::Dir
            && sp.dir != dp.dir
            && dfound == 0
            && self.nlink(dp.dir) >= u32::MAX - 1
        {
            return Err(Errno::EMLINK);
        }
        let sdir_ino = r.ino(sp.dir);
        let ddir_ino = r.ino(dp.dir);
        Ok(Outcome::Change(Box::new(Prepared {
            record: Record::Rename {
                src_parent: sdir_ino,
                src_name: sname.to_vec(),
                dst_parent: ddir_ino,
                dst_name: dname.to_vec(),
                ino: r.ino(sinode),
                time,
            },
            plan: Plan {
                dst: Some((dpreds, height)),
                dst_found: dfound,
                src: Some(spreds),
                src_found: sfound,
            },
        })))
    }

    // ---- applying changes ----------------------------------------------------------

    /// Applies a prepared change; its log entry must already be durable.
    pub fn commit(&mut self, p: Prepared) -> Result<Reply, Errno> {
        self.apply_planned(&p.record, p.plan)
    }

    /// Applies a record read back from the log. Records already applied
    /// change nothing.
    pub fn apply(&mut self, rec: &Record) -> Result<Reply, Errno> {
        self.apply_planned(rec, Plan::default())
    }

    fn reply_for(&self, inode: u64) -> Reply {
        let r = self.reader();
        Reply {
            errno: 0,
            ino: r.ino(inode),
            inode,
            gen: header_gen(r.header(inode)),
        }
    }

    fn apply_planned(&mut self, rec: &Record, plan: Plan) -> Result<Reply, Errno> {
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
                let (preds, height) = match plan.dst {
                    Some(d) => d,
                    None => {
                        let (p, found, h) = self.insert_point(dir, name_hash(name), name, None);
                        if found != 0 {
                            return Err(Errno::EEXIST);
                        }
                        (p, h)
                    }
                };
                let inode = self.new_inode(*ino, *mode, *uid, *gid, *time, dir, target)?;
                self.link_entry(dir, name, inode, &preds, height)?;
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
                let (preds, height) = match plan.dst {
                    Some(d) => d,
                    None => {
                        let (p, found, h) = self.insert_point(dir, name_hash(name), name, None);
                        if found != 0 {
                            // Already applied (replay).
                            return Ok(self.reply_for(inode));
                        }
                        (p, h)
                    }
                };
                self.add_nlink(inode, 1, *time)?;
                self.link_entry(dir, name, inode, &preds, height)?;
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
                let (preds, found) = match plan.src {
                    Some(p) => (p, plan.src_found),
                    None => self.find_entry(dir, name, None),
                };
                let r = self.reader();
                if found == 0 || r.ino(r.dirent_inode(found)) != *ino {
                    // Already applied (replay).
                    return Ok(Reply::default());
                }
                let inode = r.dirent_inode(found);
                let is_dir = r.kind(inode) == Some(Kind::Dir);
                self.unlink_entry(found, &preds)?;
                self.touch_dir(dir, -1, -i32::from(is_dir), *time)?;
                if is_dir || self.add_nlink(inode, -1, *time)? == 0 {
                    self.drop_inode(inode)?;
                }
                Ok(Reply::default())
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
                        a.put32(inode + I_MODE, (mode & libc::S_IFMT) | (m & 0o7777))?;
                    }
                    if let Some(u) = attrs.uid {
                        a.put32(inode + I_UID, u)?;
                    }
                    if let Some(g) = attrs.gid {
                        a.put32(inode + I_GID, g)?;
                    }
                    if let Some(t) = attrs.atime {
                        a.put(inode + I_ATIME, t as u64)?;
                    }
                    if let Some(t) = attrs.mtime {
                        a.put(inode + I_MTIME, t as u64)?;
                    }
                    a.put(inode + I_CTIME, *time as u64)
                })?;
                Ok(self.reply_for(inode))
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn apply_rename(
        &mut self,
        src_parent: u64,
        src_name: &[u8],
        dst_parent: u64,
        dst_name: &[u8],
        ino: u64,
        time: i64,
        plan: Plan,
    ) -> Result<Reply, Errno> {
        let sdir = self.inode_of(src_parent)?;
        let ddir = self.inode_of(dst_parent)?;
        let inode = self.inode_of(ino)?;
        let src_found = match plan.src {
            Some(_) => plan.src_found,
            None => self.find_entry(sdir, src_name, None).1,
        };
        let r = self.reader();
        if src_found == 0 || r.dirent_inode(src_found) != inode {
            // Already applied (replay).
            return Ok(self.reply_for(inode));
        }
        let is_dir = r.kind(inode) == Some(Kind::Dir);
        let (dpreds, dfound, height) = match plan.dst {
            Some((p, h)) => (p, plan.dst_found, h),
            None => self.insert_point(ddir, name_hash(dst_name), dst_name, None),
        };
        // The new name first: a reader finds the inode under at least one.
        let mut victim = 0;
        if dfound != 0 {
            victim = self.reader().dirent_inode(dfound);
            self.replace_entry(ddir, dfound, &dpreds, inode)?;
        } else {
            self.link_entry(ddir, dst_name, inode, &dpreds, height)?;
        }
        // Then the old name, with predecessors found afresh: the insertion
        // above may have become one of them.
        let s = self.reader().search(sdir, name_hash(src_name), src_name);
        if s.found != src_found {
            return Err(Errno::EIO);
        }
        self.unlink_entry(src_found, &s.preds)?;
        let moved_dir = i32::from(is_dir && sdir != ddir);
        self.touch_dir(sdir, -1, -moved_dir, time)?;
        self.touch_dir(ddir, i64::from(dfound == 0), moved_dir, time)?;
        if is_dir && sdir != ddir {
            self.update(inode, |a| a.put(inode + I_PARENT, ddir))?;
        }
        self.update(inode, |a| a.put(inode + I_CTIME, time as u64))?;
        if victim != 0 {
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

    // ---- checkpoints -------------------------------------------------------------

    /// Restores an inode from a checkpoint (the root's attributes overwrite
    /// the fresh root's).
    pub fn load_inode(&mut self, a: &InodeAttr, target: &[u8]) -> Result<u64, Errno> {
        let inode = match self.reader().inode_by_ino(a.ino) {
            0 => {
                if Kind::from_mode(a.mode).is_none() || a.ino == 0 {
                    return Err(Errno::EINVAL);
                }
                self.new_inode(a.ino, a.mode, a.uid, a.gid, a.ctime, 0, target)?
            }
            existing if a.ino == ROOT_INO && a.mode & libc::S_IFMT == libc::S_IFDIR => existing,
            _ => return Err(Errno::EEXIST),
        };
        self.update(inode, |x| {
            x.put32(inode + I_MODE, a.mode)?;
            x.put32(inode + I_NLINK, a.nlink)?;
            x.put32(inode + I_UID, a.uid)?;
            x.put32(inode + I_GID, a.gid)?;
            x.put(inode + I_SIZE, a.size)?;
            x.put(inode + I_ATIME, a.atime as u64)?;
            x.put(inode + I_MTIME, a.mtime as u64)?;
            x.put(inode + I_CTIME, a.ctime as u64)?;
            x.put(inode + I_BTIME, a.btime as u64)
        })?;
        Ok(inode)
    }

    /// Restores a directory entry from a checkpoint; both inodes exist.
    pub fn load_entry(&mut self, parent: u64, name: &[u8], ino: u64) -> Result<(), Errno> {
        check_name(name)?;
        let dir = self.inode_of(parent)?;
        let inode = self.inode_of(ino)?;
        if self.reader().kind(dir) != Some(Kind::Dir) {
            return Err(Errno::ENOTDIR);
        }
        let (preds, found, height) = self.insert_point(dir, name_hash(name), name, None);
        if found != 0 {
            return Err(Errno::EEXIST);
        }
        self.link_entry(dir, name, inode, &preds, height)?;
        let entries = self.reader().attr(dir).ok_or(Errno::EIO)?.entries + 1;
        self.update(dir, |a| a.put(dir + I_ENTRIES, entries))?;
        if self.reader().kind(inode) == Some(Kind::Dir) {
            if self.reader().parent(inode) != 0 {
                // A directory with two names.
                return Err(Errno::EMLINK);
            }
            self.update(inode, |a| a.put(inode + I_PARENT, dir))?;
        }
        Ok(())
    }

    /// Visits the tree depth-first from the root: every inode once, before
    /// any entry that names it, and every entry (parent ino, name, ino).
    pub fn walk(
        &self,
        mut inode_fn: impl FnMut(&InodeAttr, Option<Vec<u8>>),
        mut entry_fn: impl FnMut(u64, &[u8], u64),
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
    pub fn execute(&mut self, req: &Request<'_>, creds: Creds) -> Result<Reply, Errno> {
        match self.prepare(req, creds)? {
            Outcome::Done(r) => Ok(r),
            Outcome::Change(p) => self.commit(*p),
        }
    }
}

#[cfg(test)]
mod tests;
