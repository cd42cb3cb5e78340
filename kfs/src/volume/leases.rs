//! Opens, closes and write leases (ARCHITECTURE.md §8): the opens Kfs
//! counts per client, and the one client per file that holds its write
//! lease and alone may commit to it.
//!
//! Any number of clients may have a file open for writing; the lease moves
//! between them as they write. A client's thread marks in its slot that
//! it writes a file, and under which generation of the lease
//! (`Segment::mark_write`), before it reads anything its write depends on
//! (the size it appends at, the old bytes of a partial page). A client
//! that asks for a lease ([`Request::Lease`]) gets it at once unless the
//! holder has a slot marked writing the file; then it is answered `EAGAIN`
//! and noted as waiting, and the holder hands the lease over right after
//! the last request of its write (the slot says which is last). A holder
//! that stays marked longer than the bound (`Volume::set_lease_wait`)
//! loses the lease anyway. Every move makes a new generation, and a
//! commit whose slot names another generation is refused with `ESTALE`:
//! its process redoes the write under the lease it asks for again.

use std::time::{Duration, Instant};

use kucofs_common::access::MAY_READ;
use kucofs_common::index::{Ino, InodeOff, Kind};
use kucofs_common::proto::{open, Node, OpenAt, Reply, Request};
use kucofs_common::Errno;

use super::{Caller, Volume};

/// Whether `caller` may `want` on `inode`, by its permission bits now.
fn permitted(ns: &crate::namespace::Namespace, inode: InodeOff, caller: Caller, want: u32) -> bool {
    ns.reader()
        .attr(inode)
        .is_some_and(|a| caller.creds.permits(a.mode, a.uid, a.gid, want))
}

/// How long a client may keep writing a file another client waits for
/// before Kfs takes its lease anyway.
pub const LEASE_WAIT: Duration = Duration::from_secs(1);

/// The write lease of one file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lease {
    /// The client that may commit to the file.
    pub(crate) client: u32,
    /// Its generation: new at every move of the lease.
    gen: u64,
}

/// A client waiting for a lease another client holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Waiter {
    pub(crate) client: u32,
    /// When it was first refused.
    since: Instant,
}

impl Volume {
    pub(super) fn open_file(
        &mut self,
        at: OpenAt<'_>,
        flags: u32,
        mode: u32,
        hint: Option<kucofs_common::proto::Hint>,
        caller: Caller,
    ) -> Result<Reply, Errno> {
        if flags & !open::ALL != 0 || mode & !0o7777 != 0 {
            return Err(Errno::EINVAL);
        }
        self.client(caller)?;
        let write = flags & open::WRITE != 0;
        let mut created = false;
        let found = match at {
            OpenAt::Entry(e) => self.ns.resolve_entry_as(e, true, &caller.creds),
            OpenAt::Node(n) => self.ns.node_inode(n),
        };
        let inode = match found {
            Ok(_) if flags & open::CREATE != 0 && flags & open::EXCL != 0 => {
                return Err(Errno::EEXIST)
            }
            Ok(inode) => inode,
            Err(Errno::ENOENT) if flags & open::CREATE != 0 => {
                // A node is found or stale, never missing: only an
                // entry is created.
                let OpenAt::Entry(at) = at else {
                    return Err(Errno::EIO);
                };
                let create = Request::Create {
                    at,
                    mode: libc::S_IFREG | mode,
                    target: b"",
                    hint,
                };
                created = true;
                self.handle_inner(&create, caller.creds)?
                    .ok_or(Errno::EIO)?
                    .inode
            }
            Err(e) => return Err(e),
        };
        let r = self.ns.reader();
        let kind = r.kind(inode).ok_or(Errno::EIO)?;
        let ino = r.ino(inode);
        let gen = kucofs_common::index::layout::header_gen(r.header(inode.get()));
        if kind == Kind::Dir && (write || flags & open::TRUNC != 0) {
            return Err(Errno::EISDIR);
        }
        if !created {
            self.ns.may_open(inode, flags, &caller.creds)?;
        }
        let leased_elsewhere = self
            .data
            .leases
            .get(&ino)
            .is_some_and(|l| l.client != caller.client);
        if write && flags & open::TRUNC != 0 && leased_elsewhere {
            // Another process holds the write lease, and may be in the
            // middle of a write. (Ulib truncates with `Truncate`, under
            // the lease.)
            return Err(Errno::ETXTBSY);
        }
        // As on Linux, truncating a file that was there already changes its
        // times even when it is empty; a file this open made is left alone.
        if write && flags & open::TRUNC != 0 && !created {
            self.set_size(inode, ino, 0)?;
        }
        let reply = Reply::Open {
            node: Node { ino, inode, gen },
            created,
        };
        if kind == Kind::File {
            self.ns.pin(ino);
            let may_read = permitted(&self.ns, inode, caller, MAY_READ);
            let c = self.client(caller)?;
            if may_read {
                c.readable.insert(ino, ());
            }
            let o = c.opens.entry(ino).or_default();
            o.0 += 1;
            o.1 += u32::from(write);
            // The lease goes to the first writer; the others take it when
            // they write (`take_lease`).
            if write && !self.data.leases.contains_key(&ino) {
                self.new_lease(ino, caller.client);
            }
        }
        Ok(reply)
    }

    pub(super) fn close_file(
        &mut self,
        ino: Ino,
        write: bool,
        caller: Caller,
    ) -> Result<Reply, Errno> {
        let c = self.client(caller)?;
        let Some(o) = c.opens.get_mut(&ino) else {
            return Err(Errno::EBADF);
        };
        // A write close needs a write open, and a read close a read open:
        // a client that closed a write open as a read one would keep the
        // file's lease with nothing left open.
        if (write && o.1 == 0) || (!write && o.0 == o.1) {
            return Err(Errno::EBADF);
        }
        o.0 -= 1;
        o.1 -= u32::from(write);
        let (opens, writes) = *o;
        if opens == 0 {
            c.opens.remove(&ino);
            c.readable.remove(&ino);
        }
        if write && writes == 0 {
            let c = caller.client;
            if self.data.leases.get(&ino).is_some_and(|l| l.client == c) {
                self.data.leases.remove(&ino);
            }
            if self.data.waiters.get(&ino).is_some_and(|w| w.client == c) {
                self.data.waiters.remove(&ino);
            }
        }
        self.ns.unpin(ino)?;
        self.retire_replaced();
        Ok(Reply::Done)
    }

    /// The inode of a file `caller` holds the write lease of, under the
    /// generation its slot's write mark names (a slot with no mark for
    /// the file is taken at its word: only its own write's atomicity is at
    /// stake). A lease is only taken on a regular file, which stays while
    /// it is open. `ESTALE` for a client that has the file open for
    /// writing but lost the lease (it asks again and redoes the write),
    /// `EBADF` for one that has not.
    pub(super) fn leased(&self, ino: Ino, caller: Caller) -> Result<InodeOff, Errno> {
        let held = self.data.leases.get(&ino).is_some_and(|l| {
            l.client == caller.client
                && self
                    .mark(caller)
                    .is_none_or(|(i, gen, _)| i != ino.get() || gen == l.gen)
        });
        if !held {
            return Err(if self.writes(caller.client, ino) {
                Errno::ESTALE
            } else {
                Errno::EBADF
            });
        }
        self.ns.file_inode(ino)
    }

    /// [`Request::Lease`]: the generation of the lease of `ino`, moved to
    /// `caller` if another client holds it and none of its slots is
    /// writing the file, or if it has been writing longer than the bound
    /// since `caller` first asked; `EAGAIN` otherwise.
    pub(super) fn take_lease(&mut self, ino: Ino, caller: Caller) -> Result<Reply, Errno> {
        self.client(caller)?;
        if !self.writes(caller.client, ino) {
            return Err(Errno::EBADF);
        }
        let gen = match self.data.leases.get(&ino).copied() {
            None => self.new_lease(ino, caller.client),
            Some(l) if l.client == caller.client => l.gen,
            Some(l) if !self.writing(l.client, ino, None) => self.new_lease(ino, caller.client),
            Some(_) => {
                let now = Instant::now();
                let w = match self.data.waiters.get(&ino).copied() {
                    // Another client waits, and still may: first come.
                    Some(w) if w.client != caller.client && self.writes(w.client, ino) => {
                        return Err(Errno::EAGAIN)
                    }
                    Some(w) if w.client == caller.client => w,
                    _ => {
                        let w = Waiter {
                            client: caller.client,
                            since: now,
                        };
                        self.data.waiters.insert(ino, w);
                        w
                    }
                };
                if now.duration_since(w.since) < self.data.lease_wait {
                    return Err(Errno::EAGAIN);
                }
                // A holder stuck (or stopped) in its write: its commit
                // will name the old generation, and be refused.
                self.new_lease(ino, caller.client)
            }
        };
        Ok(Reply::Size(gen))
    }

    /// After `caller` changed file `ino` under its lease: if another
    /// client waits for the lease, and this was the last request of the
    /// caller's write (or not part of a marked write) and no other slot of
    /// the caller is writing the file, the lease goes to the waiter.
    pub(super) fn hand_over(&mut self, ino: Ino, caller: Caller) {
        let Some(w) = self.data.waiters.get(&ino).copied() else {
            return;
        };
        let holds = |l: &Lease| l.client == caller.client;
        if !self.data.leases.get(&ino).is_some_and(holds) {
            return;
        }
        if w.client == caller.client || !self.writes(w.client, ino) {
            self.data.waiters.remove(&ino);
            return;
        }
        let done = self
            .mark(caller)
            .is_none_or(|(i, _, last)| i != ino.get() || last);
        if done && !self.writing(caller.client, ino, Some(caller.slot)) {
            self.new_lease(ino, w.client);
        }
    }

    /// Gives the lease of `ino` to `client` under a new generation;
    /// returns the generation.
    fn new_lease(&mut self, ino: Ino, client: u32) -> u64 {
        self.data.next_lease += 1;
        let gen = self.data.next_lease;
        self.data.leases.insert(ino, Lease { client, gen });
        self.data.waiters.remove(&ino);
        gen
    }

    /// True if `client` has `ino` open for writing.
    fn writes(&self, client: u32, ino: Ino) -> bool {
        self.data
            .clients
            .get(&client)
            .and_then(|c| c.opens.get(&ino))
            .is_some_and(|o| o.1 > 0)
    }

    /// The write mark of `caller`'s slot, if its segment is known (a
    /// volume used without the Kfs thread has none).
    fn mark(&self, caller: Caller) -> Option<(u64, u64, bool)> {
        let slot = usize::try_from(caller.slot).ok()?;
        let readers = self.readers.lock();
        let (_, seg) = readers.iter().find(|(id, _)| *id == caller.client)?;
        seg.write_mark(slot)
    }

    /// True if a slot of `client` (other than `except`) is marked writing
    /// `ino`.
    fn writing(&self, client: u32, ino: Ino, except: Option<u32>) -> bool {
        let readers = self.readers.lock();
        readers.iter().any(|(id, seg)| {
            *id == client
                && seg
                    .writers_of(ino.get())
                    .any(|s| except.is_none_or(|e| usize::try_from(e).ok() != Some(s)))
        })
    }

    /// Sets how long a client may keep writing a file another waits for
    /// before it loses the lease (default [`LEASE_WAIT`]).
    pub fn set_lease_wait(&mut self, wait: Duration) {
        self.data.lease_wait = wait;
    }
}
