//! Requests from a client to Kfs and Kfs's replies, and their fixed-layout
//! encoding in a request slot (ARCHITECTURE.md §5).
//!
//! A request is a small header (format version, operation, length, CRC-32C)
//! followed by the operation's fields and byte strings. Kfs decodes it from
//! its own copy of the slot (a client may change the slot at any time) and
//! checks every field: lengths, names, offsets are never trusted.

use crate::codec::{Reader, Writer};
use crate::index::{DirentOff, InodeOff, PATH_MAX};
use crate::Errno;

/// Version of what a client and Kfs must agree on: the request encoding
/// and the layout of the shared index the client reads (2: directory links
/// carry their next node's hash tag; 3: a grant's reply carries up to
/// [`GRANT_RUNS`] more runs).
pub const PROTO_VERSION: u16 = 3;
/// Largest encoded request.
pub const REQUEST_MAX: usize = 2 * PATH_MAX + 2 * HINT_SIZE + 128;
/// Encoded size of a hint.
pub const HINT_SIZE: usize = 4 + 8 + 4 + 8 + 8 + 4;
/// Encoded size of a reply.
pub const REPLY_SIZE: usize = 32 + 8 * GRANT_RUNS;
/// Runs a grant's reply carries beyond its first: where free pages lie
/// scattered (every random overwrite frees one somewhere), a grant of one
/// run would hand out a page or two, and a writer would ask for a grant
/// before nearly every write.
pub const GRANT_RUNS: usize = 4;
/// A packed run of [`Reply::runs`]: the first page in the low 40 bits
/// (page numbers fit 40 bits, as in block-map entries), the count above.
const RUN_PAGE_BITS: u32 = 40;

/// Where a client found things while resolving a path (collaborative
/// indexing, ARCHITECTURE.md §6): the parent directory and, in its list, the node
/// after which the name is (or would be) linked and the entry itself if it
/// exists. Kfs validates every offset before using any.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hint {
    /// Offset of the parent directory's inode.
    pub dir: InodeOff,
    /// Its generation.
    pub dir_gen: u32,
    /// The node before the name's position.
    pub pred: DirentOff,
    /// The entry with the name, or null if the client found none.
    pub found: DirentOff,
    /// Its generation.
    pub found_gen: u32,
}

/// Attribute changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetAttrs {
    /// New permission bits (the type bits are kept).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New access time (ns since the epoch).
    pub atime: Option<i64>,
    /// New modification time (ns since the epoch).
    pub mtime: Option<i64>,
}

impl SetAttrs {
    /// Writes the changes, each as an optional value (requests and redo
    /// records share this encoding).
    pub fn encode(&self, w: &mut Writer<'_>) {
        w.opt32(self.mode);
        w.opt32(self.uid);
        w.opt32(self.gid);
        w.opt64(self.atime);
        w.opt64(self.mtime);
    }

    /// Reads what [`SetAttrs::encode`] wrote.
    pub fn decode(r: &mut Reader<'_>) -> Result<SetAttrs, Errno> {
        Ok(SetAttrs {
            mode: r.opt32()?,
            uid: r.opt32()?,
            gid: r.opt32()?,
            atime: r.opt64()?,
            mtime: r.opt64()?,
        })
    }
}

/// Who asks: the credentials a change is made with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Creds {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// One metadata request. Paths are relative to the file system's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// Create a file, directory or symlink (by the type bits of `mode`);
    /// exclusive: fails with `EEXIST` if the name exists.
    Create {
        path: &'a [u8],
        mode: u32,
        /// A symlink's target.
        target: &'a [u8],
        hint: Option<Hint>,
    },
    /// Make `to` a new name for what `from` names (not following a final
    /// symlink in `from`).
    Link {
        from: &'a [u8],
        to: &'a [u8],
        hint: Option<Hint>,
    },
    /// Remove a name (`rmdir`: an empty directory; else a non-directory).
    Unlink {
        path: &'a [u8],
        rmdir: bool,
        hint: Option<Hint>,
    },
    /// Rename `from` to `to`.
    Rename {
        from: &'a [u8],
        to: &'a [u8],
        noreplace: bool,
        hint_from: Option<Hint>,
        hint_to: Option<Hint>,
    },
    /// Change attributes of what `path` names.
    SetAttr {
        path: &'a [u8],
        follow: bool,
        attrs: SetAttrs,
    },
    /// Do nothing and reply (to measure a round trip).
    Ping,
    /// Open the file `path` names (following symlinks), with [`open`]
    /// flags; creating it with `mode` if asked. A write open takes the
    /// file's write lease for this client. The reply's `value` is 1 if
    /// this open created the file.
    Open {
        path: &'a [u8],
        flags: u32,
        mode: u32,
        hint: Option<Hint>,
    },
    /// Close a file opened by this client (a write open gives back its
    /// share of the lease).
    Close { ino: u64, write: bool },
    /// Ask for a pool of up to `pages` free data pages for this thread's
    /// slot, made writable for this client. The reply's `inode` is the first
    /// page, its `value` the count, of the first run; its
    /// [`runs`](Reply::runs) may add more ([`Reply::granted`] lists all).
    Grant { pages: u32 },
    /// Commit a copy-on-write: file pages `first..` now live in the pool
    /// pages `extents` name, in order, and the file is at least `size`
    /// bytes long. Needs the write lease.
    Commit {
        ino: u64,
        first: u64,
        size: u64,
        extents: Extents,
    },
    /// Set a file's size (needs the write lease).
    Truncate { ino: u64, size: u64 },
    /// Give back to the free pages `pages` unused pages from `start` of
    /// the pool of this client's slot `slot`: a thread whose grant found
    /// no free page takes back the pools other threads of its process
    /// hold idle, instead of failing with `ENOSPC` while they sit unused.
    Unpool { slot: u32, start: u64, pages: u32 },
}

/// Flags of [`Request::Open`].
pub mod open {
    /// Open for writing (takes the write lease).
    pub const WRITE: u32 = 1;
    /// Create the file if it does not exist.
    pub const CREATE: u32 = 2;
    /// With `CREATE`: fail with `EEXIST` if it exists.
    pub const EXCL: u32 = 4;
    /// Cut the file to length 0 (with `WRITE`).
    pub const TRUNC: u32 = 8;
    /// Every flag.
    pub const ALL: u32 = WRITE | CREATE | EXCL | TRUNC;
}

/// A run of consecutive data pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extent {
    /// First page (a page number in the region).
    pub start: u64,
    /// Pages.
    pub len: u32,
}

/// Most extents in one commit.
pub const EXTENTS_MAX: usize = 8;
/// Most pages in one commit (1 MiB).
pub const COMMIT_PAGES_MAX: u64 = 256;
/// Pages a client thread asks Kfs for at a time: one pool (4 MiB).
pub const POOL_PAGES: u32 = 1024;

/// The pages of a commit: up to [`EXTENTS_MAX`] extents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extents {
    n: u8,
    runs: [Extent; EXTENTS_MAX],
}

impl Extents {
    /// No pages.
    pub const fn new() -> Extents {
        Extents {
            n: 0,
            runs: [Extent { start: 0, len: 0 }; EXTENTS_MAX],
        }
    }

    /// Appends `len` pages from `start`, merging with the last run when
    /// they continue it; `false` if the list is full or the run would end
    /// past the largest page number.
    pub fn push(&mut self, start: u64, len: u32) -> bool {
        if start.checked_add(u64::from(len)).is_none() {
            return false;
        }
        if len == 0 {
            return true;
        }
        if let Some(last) = self.as_slice().last() {
            if last.start.checked_add(u64::from(last.len)) == Some(start) {
                if let Some(l) = last.len.checked_add(len) {
                    self.runs[self.n as usize - 1].len = l;
                    return true;
                }
            }
        }
        if self.n as usize == EXTENTS_MAX {
            return false;
        }
        self.runs[self.n as usize] = Extent { start, len };
        self.n += 1;
        true
    }

    /// Writes the list: a count, then each run's start and length.
    #[inline]
    pub fn encode(&self, w: &mut Writer<'_>) {
        w.u8(self.n);
        for e in self.as_slice() {
            w.u64(e.start);
            w.u32(e.len);
        }
    }

    /// Reads a list [`Extents::encode`] wrote; `EPROTO` unless it is one
    /// `push` would build (at most [`EXTENTS_MAX`] runs, none empty, none
    /// continuing the one before, none running past the largest page
    /// number).
    pub fn decode(r: &mut Reader<'_>) -> Result<Extents, Errno> {
        let n = r.u8()?;
        if n as usize > EXTENTS_MAX {
            return Err(Errno::EPROTO);
        }
        let mut extents = Extents::new();
        for _ in 0..n {
            let (start, len) = (r.u64()?, r.u32()?);
            if len == 0 || !extents.push(start, len) {
                return Err(Errno::EPROTO);
            }
        }
        if extents.n != n {
            return Err(Errno::EPROTO);
        }
        Ok(extents)
    }

    /// The runs.
    pub fn as_slice(&self) -> &[Extent] {
        &self.runs[..self.n as usize]
    }

    /// Total pages.
    pub fn pages(&self) -> u64 {
        self.as_slice().iter().map(|e| u64::from(e.len)).sum()
    }

    /// Every page, in order.
    pub fn iter_pages(&self) -> impl Iterator<Item = u64> + '_ {
        self.as_slice()
            .iter()
            .flat_map(|e| e.start..e.start + u64::from(e.len))
    }
}

/// Kfs's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reply {
    /// 0, or the errno of the failure.
    pub errno: i32,
    /// The inode created or changed.
    pub ino: u64,
    /// Its offset in the index.
    pub inode: u64,
    /// Its generation.
    pub gen: u32,
    /// A request's own result: a granted pool's page count, the file's
    /// size after a commit or truncation, or 1 if an open created its
    /// file.
    pub value: u64,
    /// A grant's runs after its first, packed (page, count); 0 for none.
    pub runs: [u64; GRANT_RUNS],
}

impl Reply {
    /// A failure reply.
    pub fn err(e: Errno) -> Reply {
        Reply {
            errno: e.get(),
            ..Reply::default()
        }
    }

    /// The reply as a result.
    pub fn result(self) -> Result<Reply, Errno> {
        if self.errno == 0 {
            Ok(self)
        } else {
            // A peer's number out of range is a broken reply, not an
            // errno to hand on.
            Err(Errno::or_eproto(self.errno))
        }
    }

    /// A grant's reply for `runs` of (first page, count): the first in
    /// `inode` and `value`, up to [`GRANT_RUNS`] more packed in `runs`.
    /// `None` for no run, too many, or one that does not pack (a page
    /// number of more than 40 bits, a count of more than 24).
    pub fn grant(runs: &[(u64, u64)]) -> Option<Reply> {
        let (&(inode, value), rest) = runs.split_first()?;
        if rest.len() > GRANT_RUNS {
            return None;
        }
        let mut reply = Reply {
            inode,
            value,
            ..Reply::default()
        };
        for (slot, &(page, n)) in reply.runs.iter_mut().zip(rest) {
            if page >> RUN_PAGE_BITS != 0 || n == 0 || n >> (64 - RUN_PAGE_BITS) != 0 {
                return None;
            }
            *slot = page | n << RUN_PAGE_BITS;
        }
        Some(reply)
    }

    /// The runs of (first page, count) a grant's reply hands out, the
    /// first first.
    pub fn granted(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let more = self
            .runs
            .iter()
            .filter(|&&r| r != 0)
            .map(|&r| (r & ((1 << RUN_PAGE_BITS) - 1), r >> RUN_PAGE_BITS));
        std::iter::once((self.inode, self.value))
            .filter(|&(_, n)| n > 0)
            .chain(more)
    }

    /// The fixed encoding.
    pub fn encode(&self) -> [u8; REPLY_SIZE] {
        let mut b = [0u8; REPLY_SIZE];
        b[0..4].copy_from_slice(&self.errno.to_le_bytes());
        b[4..8].copy_from_slice(&self.gen.to_le_bytes());
        b[8..16].copy_from_slice(&self.ino.to_le_bytes());
        b[16..24].copy_from_slice(&self.inode.to_le_bytes());
        b[24..32].copy_from_slice(&self.value.to_le_bytes());
        for (i, r) in self.runs.iter().enumerate() {
            b[32 + 8 * i..40 + 8 * i].copy_from_slice(&r.to_le_bytes());
        }
        b
    }

    /// Decodes a reply.
    pub fn decode(b: &[u8; REPLY_SIZE]) -> Reply {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        Reply {
            errno: u32_at(0) as i32,
            gen: u32_at(4),
            ino: u64_at(8),
            inode: u64_at(16),
            value: u64_at(24),
            runs: std::array::from_fn(|i| u64_at(32 + 8 * i)),
        }
    }
}

mod op {
    pub const CREATE: u16 = 1;
    pub const LINK: u16 = 2;
    pub const UNLINK: u16 = 3;
    pub const RENAME: u16 = 4;
    pub const SETATTR: u16 = 5;
    pub const PING: u16 = 6;
    pub const OPEN: u16 = 7;
    pub const CLOSE: u16 = 8;
    pub const GRANT: u16 = 9;
    pub const COMMIT: u16 = 10;
    pub const TRUNCATE: u16 = 11;
    pub const UNPOOL: u16 = 12;
}

/// Bytes before the body: version u16, op u16, body length u32, and the
/// CRC-32C of those eight bytes and the body.
pub const HEADER: usize = 12;

fn put_hint(w: &mut Writer<'_>, h: &Option<Hint>) {
    w.bool(h.is_some());
    if let Some(h) = h {
        w.u64(h.dir.get());
        w.u32(h.dir_gen);
        w.u64(h.pred.get());
        w.u64(h.found.get());
        w.u32(h.found_gen);
    }
}

fn get_hint(r: &mut Reader<'_>) -> Result<Option<Hint>, Errno> {
    if !r.bool()? {
        return Ok(None);
    }
    Ok(Some(Hint {
        dir: InodeOff::new(r.u64()?),
        dir_gen: r.u32()?,
        pred: DirentOff::new(r.u64()?),
        found: DirentOff::new(r.u64()?),
        found_gen: r.u32()?,
    }))
}

/// Longest byte string (path, name or symlink target) in a request.
const STRING_MAX: usize = PATH_MAX - 1;

impl<'a> Request<'a> {
    /// Encodes the request into `out` (replacing what it held) and returns
    /// its length. Fails with `ENAMETOOLONG` for an oversized path.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<usize, Errno> {
        let strings: [&[u8]; 2] = match self {
            Request::Create { path, target, .. } => [path, target],
            Request::Link { from, to, .. } | Request::Rename { from, to, .. } => [from, to],
            Request::Unlink { path, .. }
            | Request::SetAttr { path, .. }
            | Request::Open { path, .. } => [path, b""],
            _ => [b"", b""],
        };
        if strings.iter().any(|s| s.len() > STRING_MAX) {
            return Err(Errno::ENAMETOOLONG);
        }
        out.clear();
        out.resize(HEADER, 0);
        let mut w = Writer(out);
        let op = match self {
            Request::Create {
                path,
                mode,
                target,
                hint,
            } => {
                w.bytes(path);
                w.u32(*mode);
                w.bytes(target);
                put_hint(&mut w, hint);
                op::CREATE
            }
            Request::Link { from, to, hint } => {
                w.bytes(from);
                w.bytes(to);
                put_hint(&mut w, hint);
                op::LINK
            }
            Request::Unlink { path, rmdir, hint } => {
                w.bytes(path);
                w.bool(*rmdir);
                put_hint(&mut w, hint);
                op::UNLINK
            }
            Request::Rename {
                from,
                to,
                noreplace,
                hint_from,
                hint_to,
            } => {
                w.bytes(from);
                w.bytes(to);
                w.bool(*noreplace);
                put_hint(&mut w, hint_from);
                put_hint(&mut w, hint_to);
                op::RENAME
            }
            Request::SetAttr {
                path,
                follow,
                attrs,
            } => {
                w.bytes(path);
                w.bool(*follow);
                attrs.encode(&mut w);
                op::SETATTR
            }
            Request::Ping => op::PING,
            Request::Open {
                path,
                flags,
                mode,
                hint,
            } => {
                w.bytes(path);
                w.u32(*flags);
                w.u32(*mode);
                put_hint(&mut w, hint);
                op::OPEN
            }
            Request::Close { ino, write } => {
                w.u64(*ino);
                w.bool(*write);
                op::CLOSE
            }
            Request::Grant { pages } => {
                w.u32(*pages);
                op::GRANT
            }
            Request::Commit {
                ino,
                first,
                size,
                extents,
            } => {
                w.u64(*ino);
                w.u64(*first);
                w.u64(*size);
                extents.encode(&mut w);
                op::COMMIT
            }
            Request::Truncate { ino, size } => {
                w.u64(*ino);
                w.u64(*size);
                op::TRUNCATE
            }
            Request::Unpool { slot, start, pages } => {
                w.u32(*slot);
                w.u64(*start);
                w.u32(*pages);
                op::UNPOOL
            }
        };
        let len = out.len();
        let body = (len - HEADER) as u32;
        out[0..2].copy_from_slice(&PROTO_VERSION.to_le_bytes());
        out[2..4].copy_from_slice(&op.to_le_bytes());
        out[4..8].copy_from_slice(&body.to_le_bytes());
        let crc =
            crate::checksum::crc32c_append(crate::checksum::crc32c(&out[..8]), &out[HEADER..len]);
        out[8..12].copy_from_slice(&crc.to_le_bytes());
        Ok(len)
    }

    /// Decodes a request from `buf` (Kfs's private copy of a slot). Every
    /// malformed input gives `EPROTO`, never a panic.
    pub fn decode(buf: &'a [u8]) -> Result<Request<'a>, Errno> {
        if buf.len() < HEADER {
            return Err(Errno::EPROTO);
        }
        let version = u16::from_le_bytes([buf[0], buf[1]]);
        let op = u16::from_le_bytes([buf[2], buf[3]]);
        let body = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
        let crc = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]);
        if version != PROTO_VERSION {
            return Err(Errno::EPROTO);
        }
        let end = HEADER.checked_add(body).ok_or(Errno::EPROTO)?;
        let body = buf.get(HEADER..end).ok_or(Errno::EPROTO)?;
        // The checksum covers version, op and length too.
        if crate::checksum::crc32c_append(crate::checksum::crc32c(&buf[..8]), body) != crc {
            return Err(Errno::EPROTO);
        }
        let mut r = Reader::new(body);
        let req = match op {
            op::CREATE => Request::Create {
                path: r.bytes(STRING_MAX)?,
                mode: r.u32()?,
                target: r.bytes(STRING_MAX)?,
                hint: get_hint(&mut r)?,
            },
            op::LINK => Request::Link {
                from: r.bytes(STRING_MAX)?,
                to: r.bytes(STRING_MAX)?,
                hint: get_hint(&mut r)?,
            },
            op::UNLINK => Request::Unlink {
                path: r.bytes(STRING_MAX)?,
                rmdir: r.bool()?,
                hint: get_hint(&mut r)?,
            },
            op::RENAME => Request::Rename {
                from: r.bytes(STRING_MAX)?,
                to: r.bytes(STRING_MAX)?,
                noreplace: r.bool()?,
                hint_from: get_hint(&mut r)?,
                hint_to: get_hint(&mut r)?,
            },
            op::SETATTR => Request::SetAttr {
                path: r.bytes(STRING_MAX)?,
                follow: r.bool()?,
                attrs: SetAttrs::decode(&mut r)?,
            },
            op::PING => Request::Ping,
            op::OPEN => Request::Open {
                path: r.bytes(STRING_MAX)?,
                flags: r.u32()?,
                mode: r.u32()?,
                hint: get_hint(&mut r)?,
            },
            op::CLOSE => Request::Close {
                ino: r.u64()?,
                write: r.bool()?,
            },
            op::GRANT => Request::Grant { pages: r.u32()? },
            op::COMMIT => Request::Commit {
                ino: r.u64()?,
                first: r.u64()?,
                size: r.u64()?,
                extents: Extents::decode(&mut r)?,
            },
            op::TRUNCATE => Request::Truncate {
                ino: r.u64()?,
                size: r.u64()?,
            },
            op::UNPOOL => Request::Unpool {
                slot: r.u32()?,
                start: r.u64()?,
                pages: r.u32()?,
            },
            _ => return Err(Errno::EPROTO),
        };
        if !r.done() {
            return Err(Errno::EPROTO);
        }
        Ok(req)
    }

    /// A short name of the operation, for statistics.
    pub fn kind(&self) -> RequestKind {
        match self {
            Request::Create { mode, .. } => match mode & libc::S_IFMT {
                libc::S_IFDIR => RequestKind::Mkdir,
                libc::S_IFLNK => RequestKind::Symlink,
                _ => RequestKind::Create,
            },
            Request::Link { .. } => RequestKind::Link,
            Request::Unlink { rmdir: true, .. } => RequestKind::Rmdir,
            Request::Unlink { .. } => RequestKind::Unlink,
            Request::Rename { .. } => RequestKind::Rename,
            Request::SetAttr { .. } => RequestKind::SetAttr,
            Request::Ping => RequestKind::Ping,
            Request::Open { .. } => RequestKind::Open,
            Request::Close { .. } => RequestKind::Close,
            Request::Grant { .. } => RequestKind::Grant,
            Request::Commit { .. } => RequestKind::Commit,
            Request::Truncate { .. } => RequestKind::Truncate,
            Request::Unpool { .. } => RequestKind::Unpool,
        }
    }
}

/// Request types, for Kfs's per-type statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RequestKind {
    #[allow(missing_docs)]
    Create,
    #[allow(missing_docs)]
    Mkdir,
    #[allow(missing_docs)]
    Symlink,
    #[allow(missing_docs)]
    Link,
    #[allow(missing_docs)]
    Unlink,
    #[allow(missing_docs)]
    Rmdir,
    #[allow(missing_docs)]
    Rename,
    #[allow(missing_docs)]
    SetAttr,
    #[allow(missing_docs)]
    Ping,
    #[allow(missing_docs)]
    Open,
    #[allow(missing_docs)]
    Close,
    #[allow(missing_docs)]
    Grant,
    #[allow(missing_docs)]
    Commit,
    #[allow(missing_docs)]
    Truncate,
    #[allow(missing_docs)]
    Unpool,
    /// A request that failed to decode.
    Malformed,
}

impl RequestKind {
    /// Every kind, in display order.
    pub const ALL: [RequestKind; 16] = [
        RequestKind::Create,
        RequestKind::Mkdir,
        RequestKind::Symlink,
        RequestKind::Link,
        RequestKind::Unlink,
        RequestKind::Rmdir,
        RequestKind::Rename,
        RequestKind::SetAttr,
        RequestKind::Ping,
        RequestKind::Open,
        RequestKind::Close,
        RequestKind::Grant,
        RequestKind::Commit,
        RequestKind::Truncate,
        RequestKind::Unpool,
        RequestKind::Malformed,
    ];
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn an_extent_running_past_the_last_page_number_is_refused() {
        let mut buf = Vec::new();
        let mut w = Writer(&mut buf);
        w.u8(1);
        w.u64(u64::MAX - 1);
        w.u32(5);
        assert_eq!(Extents::decode(&mut Reader::new(&buf)), Err(Errno::EPROTO));
    }

    fn bytes() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 0..300)
    }

    fn hint() -> impl Strategy<Value = Option<Hint>> {
        proptest::option::of(
            (
                any::<u64>(),
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                any::<u32>(),
            )
                .prop_map(|(dir, dir_gen, pred, found, found_gen)| Hint {
                    dir: InodeOff::new(dir),
                    dir_gen,
                    pred: DirentOff::new(pred),
                    found: DirentOff::new(found),
                    found_gen,
                }),
        )
    }

    proptest! {
        #[test]
        fn requests_round_trip_and_damage_is_refused(
            a in bytes(), b in bytes(), mode: u32, h1 in hint(), h2 in hint(),
            which in 0..12u8, flip in any::<prop::sample::Index>(),
            x: u64, y: u64, runs in proptest::collection::vec((any::<u64>(), any::<u32>()), 0..=EXTENTS_MAX)
        ) {
            let req = match which {
                0 => Request::Create { path: &a, mode, target: &b, hint: h1 },
                1 => Request::Link { from: &a, to: &b, hint: h1 },
                2 => Request::Unlink { path: &a, rmdir: mode & 1 == 1, hint: h1 },
                3 => Request::Rename { from: &a, to: &b, noreplace: true, hint_from: h1, hint_to: h2 },
                4 => Request::SetAttr { path: &a, follow: false, attrs: SetAttrs { mode: Some(mode), ..SetAttrs::default() } },
                5 => Request::Open { path: &a, flags: mode, mode: mode >> 3, hint: h1 },
                6 => Request::Close { ino: x, write: y & 1 == 1 },
                7 => Request::Grant { pages: mode },
                8 => {
                    let mut extents = Extents::new();
                    for (s, l) in &runs {
                        extents.push(*s, *l);
                    }
                    Request::Commit { ino: x, first: y, size: x ^ y, extents }
                }
                9 => Request::Truncate { ino: x, size: y },
                10 => Request::Unpool { slot: mode, start: x, pages: y as u32 },
                _ => Request::Ping,
            };
            let mut buf = Vec::new();
            let n = req.encode(&mut buf).unwrap();
            prop_assert_eq!(Request::decode(&buf[..n]), Ok(req.clone()));
            let mut bad = buf[..n].to_vec();
            let i = flip.index(n);
            bad[i] ^= 0x40;
            // A flipped byte is caught by the version, length or checksum.
            prop_assert!(Request::decode(&bad).is_err());
        }

        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = Request::decode(&buf);
        }
    }

    #[test]
    fn every_kind_is_listed_at_its_own_index() {
        for (i, k) in RequestKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i, "{k:?}");
        }
        assert_eq!(RequestKind::ALL.last(), Some(&RequestKind::Malformed));
    }

    #[test]
    fn oversized_paths_are_refused_when_encoding() {
        let long = vec![b'a'; PATH_MAX];
        let mut buf = Vec::new();
        let req = Request::Unlink {
            path: &long,
            rmdir: false,
            hint: None,
        };
        assert_eq!(req.encode(&mut buf), Err(Errno::ENAMETOOLONG));
    }

    #[test]
    fn replies_round_trip() {
        let r = Reply {
            errno: 2,
            ino: 7,
            inode: 4096,
            gen: 3,
            value: 9,
            runs: [1 | 2 << 40, 0, 7 << 40, u64::MAX],
        };
        assert_eq!(Reply::decode(&r.encode()), r);
        assert_eq!(r.result(), Err(Errno::ENOENT));
    }

    #[test]
    fn a_grant_reply_carries_its_runs_and_refuses_what_does_not_pack() {
        let runs = [(100, 5), (7, 1), ((1 << 40) - 1, (1 << 24) - 1), (0, 3)];
        let r = Reply::grant(&runs).unwrap();
        assert_eq!((r.inode, r.value), (100, 5));
        let back = Reply::decode(&r.encode());
        assert_eq!(back.granted().collect::<Vec<_>>(), runs);
        // One run: nothing packed.
        let one = Reply::grant(&[(9, 4)]).unwrap();
        assert_eq!(one.runs, [0; GRANT_RUNS]);
        assert_eq!(one.granted().collect::<Vec<_>>(), [(9, 4)]);
        // Too many runs, none, a page past 40 bits, a count past 24 or 0.
        assert!(Reply::grant(&[(1, 1); GRANT_RUNS + 2]).is_none());
        assert!(Reply::grant(&[]).is_none());
        assert!(Reply::grant(&[(1, 1), (1 << 40, 1)]).is_none());
        assert!(Reply::grant(&[(1, 1), (2, 1 << 24)]).is_none());
        assert!(Reply::grant(&[(1, 1), (2, 0)]).is_none());
        // Not a grant: no run.
        assert_eq!(Reply::default().granted().count(), 0);
    }
}
