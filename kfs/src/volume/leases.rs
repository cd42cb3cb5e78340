//! Opens, closes and write leases (ARCHITECTURE.md §8): the opens Kfs
//! counts per client, and the one client per file that holds its write
//! lease and alone may commit to it.

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
        if write
            && self
                .data
                .leases
                .get(&ino)
                .is_some_and(|&c| c != caller.client)
        {
            // Another process holds the write lease.
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
            if write {
                self.data.leases.insert(ino, caller.client);
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
            self.data.leases.remove(&ino);
        }
        self.ns.unpin(ino)?;
        self.retire_replaced();
        Ok(Reply::Done)
    }

    /// The inode of a file `caller` holds the write lease of. A lease is
    /// only taken on a regular file, which stays while it is open.
    pub(super) fn leased(&self, ino: Ino, caller: Caller) -> Result<InodeOff, Errno> {
        if self.data.leases.get(&ino) != Some(&caller.client) {
            return Err(Errno::EBADF);
        }
        self.ns.file_inode(ino)
    }
}
