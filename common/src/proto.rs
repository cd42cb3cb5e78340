//! Requests from a client to Kfs and Kfs's replies, and their fixed-layout
//! encoding in a request slot (ARCHITECTURE.md §5).
//!
//! A request is a small header (format version, operation, length, CRC-32C)
//! followed by the operation's fields and byte strings. Kfs decodes it from
//! its own copy of the slot (a client may change the slot at any time) and
//! checks every field: lengths, names, offsets are never trusted.

use crate::codec::{Reader, Writer};
use crate::format::PageNo;
use crate::index::{DirEntryInfo, DirentOff, Ino, InodeAttr, InodeOff, Kind, NAME_MAX, PATH_MAX};
use crate::Errno;

/// Version of what a client and Kfs must agree on: the request encoding
/// and the layout of the shared index the client reads (2: directory links
/// carry their next node's hash tag; 3: a grant's reply carries up to
/// [`GRANT_RUNS`] more runs; 4: a reply carries a kind tag, and the
/// fields of its kind only; 5: [`Request::Write`]; 6: [`Request::Statfs`],
/// [`open::READ`], [`Request::SetAttr`] carries [`TimesNow`], the
/// reading requests of an isolated client, [`Request::Stat`] to
/// [`Request::Read`], with their replies [`Reply::Attr`] and
/// [`Reply::Listing`], [`Request::Lease`], and the write marks and
/// eviction word of the request segment; 7: the changes and
/// [`Request::Open`] name what they change by path or by node
/// ([`Entry`], [`At`], [`OpenAt`]), and the welcome's `direct_writes`
/// flag, `common::attach`).
pub const PROTO_VERSION: u16 = 7;
/// Largest encoded request.
pub const REQUEST_MAX: usize = 2 * PATH_MAX + 2 * HINT_SIZE + 128;
/// Encoded size of a hint.
pub const HINT_SIZE: usize = 4 + 8 + 4 + 8 + 8 + 4;
/// Encoded size of a reply: the largest, an inode's attributes.
pub const REPLY_SIZE: usize = R_ATTR_END;
/// Runs a grant's reply carries beyond its first: where free pages lie
/// scattered (every random overwrite frees one somewhere), a grant of one
/// run would hand out a page or two, and a writer would ask for a grant
/// before nearly every write.
pub const GRANT_RUNS: usize = 4;
/// A packed run of a [`Grant`] after its first: the first page in the low 40 bits
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

/// Which times a [`Request::SetAttr`] sets to the time of the change
/// (`UTIME_NOW`); a time set so has no value in the [`SetAttrs`]
/// (`EINVAL` if it has). Requests only: Kfs writes the time it chose into
/// the change's record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimesNow {
    /// The access time.
    pub atime: bool,
    /// The modification time.
    pub mtime: bool,
}

impl TimesNow {
    /// Both times, as `utimes(path, NULL)` sets them.
    pub const BOTH: TimesNow = TimesNow {
        atime: true,
        mtime: true,
    };

    fn encode(self, w: &mut Writer<'_>) {
        w.u8(u8::from(self.atime) | u8::from(self.mtime) << 1);
    }

    fn decode(r: &mut Reader<'_>) -> Result<TimesNow, Errno> {
        match r.u8()? {
            b @ 0..=3 => Ok(TimesNow {
                atime: b & 1 != 0,
                mtime: b & 2 != 0,
            }),
            _ => Err(Errno::EPROTO),
        }
    }
}

pub use crate::access::Creds;

/// One metadata request. Paths are relative to the file system's root;
/// a change names what it changes by path or by node (a directory's
/// node and a name, or a node: [`Entry`], [`At`], [`OpenAt`]), as a
/// FUSE adapter gets it. A hint (collaborative indexing) applies to
/// either form: Kfs checks it against the parent it resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// Create a file, directory or symlink (by the type bits of `mode`);
    /// exclusive: fails with `EEXIST` if the name exists.
    Create {
        at: Entry<'a>,
        mode: u32,
        /// A symlink's target.
        target: &'a [u8],
        hint: Option<Hint>,
    },
    /// Make `to` a new name for what `from` names (by path, following a
    /// final symlink only if asked, as `linkat` with `AT_SYMLINK_FOLLOW`;
    /// or by node).
    Link {
        from: At<'a>,
        to: Entry<'a>,
        hint: Option<Hint>,
    },
    /// Remove a name (`rmdir`: an empty directory; else a non-directory).
    Unlink {
        at: Entry<'a>,
        rmdir: bool,
        hint: Option<Hint>,
    },
    /// Rename `from` to `to`.
    Rename {
        from: Entry<'a>,
        to: Entry<'a>,
        noreplace: bool,
        hint_from: Option<Hint>,
        hint_to: Option<Hint>,
    },
    /// Change attributes of what `at` names: `attrs`, and the times
    /// `now` names to the time of the change.
    SetAttr {
        at: At<'a>,
        attrs: SetAttrs,
        now: TimesNow,
    },
    /// Do nothing and reply (to measure a round trip).
    Ping,
    /// Open the file `at` names (following symlinks), with [`open`]
    /// flags; creating it with `mode` if asked (and `at` names an
    /// entry). A write open takes the file's write lease for this
    /// client. Replied [`Reply::Open`], which says whether this open
    /// created the file.
    Open {
        at: OpenAt<'a>,
        flags: u32,
        mode: u32,
        hint: Option<Hint>,
    },
    /// Close a file opened by this client (a write open gives back its
    /// share of the lease).
    Close { ino: Ino, write: bool },
    /// Ask for a pool of up to `pages` free data pages for this thread's
    /// slot, made writable for this client. Replied [`Reply::Grant`]: up to
    /// 1 + [`GRANT_RUNS`] runs of pages.
    Grant { pages: u32 },
    /// Commit a copy-on-write: file pages `first..` now live in the pool
    /// pages `extents` name, in order, and the file is at least `size`
    /// bytes long. Needs the write lease.
    Commit {
        ino: Ino,
        first: u64,
        size: u64,
        extents: Extents,
    },
    /// Set a file's size (needs the write lease).
    Truncate { ino: Ino, size: u64 },
    /// Give back to the free pages `pages` unused pages from `start` of
    /// the pool of this client's slot `slot`: a thread whose grant found
    /// no free page takes back the pools other threads of its process
    /// hold idle, instead of failing with `ENOSPC` while they sit unused.
    Unpool {
        slot: u32,
        start: PageNo,
        pages: u32,
    },
    /// Write the `len` bytes waiting in this slot's part of the client's
    /// staging area (see [`STAGE_BYTES`]) into the file at `offset`, as
    /// one commit: Kfs copies them into pages it takes itself, for a
    /// client that cannot write into the image (a daemon's). Needs the
    /// write lease. The reply is the file's size.
    Write { ino: Ino, offset: u64, len: u32 },
    /// Report the file system's size and free space, as `statfs` does.
    /// Replied [`Reply::Statfs`]: a client that cannot read Kfs's
    /// counters (a daemon's) learns them this way.
    Statfs,
    /// The attributes of what `at` names. Replied [`Reply::Attr`]. Like
    /// the requests after it, it reads and changes nothing: an isolated
    /// client (ARCHITECTURE.md §2), which maps neither the index nor the
    /// image, reads through these, and Kfs checks each against the
    /// caller's credentials (search permission along a path).
    Stat { at: At<'a> },
    /// The entry `name` in directory `dir` (which needs search
    /// permission): its node and attributes, replied [`Reply::Attr`].
    Lookup { dir: Node, name: &'a [u8] },
    /// Entries of the directory `dir` names (which needs read
    /// permission), in key order, from the one after the entry `after`
    /// (its key hash and name; `None`: from the first): as many as fit
    /// are written into this slot's part of the staging area
    /// ([`STAGE_BYTES`]) as [`Listed`] records. Replied
    /// [`Reply::Listing`].
    ReadDir {
        dir: At<'a>,
        after: Option<(u64, &'a [u8])>,
    },
    /// The target of the symlink `at` names, written into this slot's
    /// part of the staging area. Replied [`Reply::Size`]: its length.
    ReadLink { at: At<'a> },
    /// Up to `len` (at most [`STAGE_BYTES`]) bytes of the file `ino` from
    /// `offset`, copied by Kfs into this slot's part of the staging area;
    /// the client must have the file open, and have been allowed to read
    /// it when it opened it. Replied [`Reply::Size`]: the bytes copied (0
    /// at or past the end).
    Read { ino: Ino, offset: u64, len: u32 },
    /// Take the write lease of a file this client has open for writing,
    /// or learn the generation of the lease it holds (ARCHITECTURE.md
    /// §8). `EAGAIN` while another client writes the file (ask again
    /// later). The reply is [`Reply::Size`] holding the lease's
    /// generation, which the thread's write mark then names.
    Lease { ino: Ino },
}

impl<'a> At<'a> {
    /// The path, or nothing for a node.
    pub fn path(&self) -> &'a [u8] {
        match *self {
            At::Path { path, .. } => path,
            At::Node(_) => b"",
        }
    }
}

/// What a reading request names: a path (resolved from the root,
/// following a final symlink if `follow`) or a node (its inode number,
/// offset and generation, all three checked: a node that is gone or was
/// reused is `ESTALE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At<'a> {
    /// A path.
    Path { path: &'a [u8], follow: bool },
    /// A node.
    Node(Node),
}

/// Where a change finds the name it adds or removes: a path (its last
/// component in the directory the rest resolves to), or a directory's
/// node and a name in it. A node is checked as [`At::Node`] is
/// (`ESTALE` if it is gone or reused), must be a directory (`ENOTDIR`)
/// the caller may reach (ARCHITECTURE.md §6); the name is one component:
/// `EINVAL` for an empty one, one with a `/`, and `.` or `..` (which a
/// FUSE adapter never sends for a change).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry<'a> {
    /// A path.
    Path(&'a [u8]),
    /// A name in a directory.
    In {
        /// The directory.
        dir: Node,
        /// The name.
        name: &'a [u8],
    },
}

impl<'a> Entry<'a> {
    /// Its byte strings' longest (the path or the name), for the
    /// encoder's size check.
    fn string(&self) -> &'a [u8] {
        match *self {
            Entry::Path(p) => p,
            Entry::In { name, .. } => name,
        }
    }
}

/// What [`Request::Open`] opens: an entry (which it may create), or a
/// node (checked as [`At::Node`] is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenAt<'a> {
    /// A path, or a name in a directory.
    Entry(Entry<'a>),
    /// A node.
    Node(Node),
}

/// One directory entry as [`Request::ReadDir`] writes it into the staging
/// area: key hash, inode number and inode offset (8 bytes each), kind (1),
/// name length (1), name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed<'a> {
    /// Its key hash (with the name, where the next listing resumes).
    pub hash: u64,
    /// The inode number it names.
    pub ino: Ino,
    /// That inode's offset in the index.
    pub inode: InodeOff,
    /// The kind of what it names.
    pub kind: Kind,
    /// The name.
    pub name: &'a [u8],
}

/// Fixed bytes of a [`Listed`] record before its name.
pub const LISTED_HEAD: usize = 8 + 8 + 8 + 1 + 1;

impl<'a> Listed<'a> {
    /// The record of a directory entry Kfs read.
    pub fn of(e: &'a DirEntryInfo) -> Listed<'a> {
        Listed {
            hash: e.hash,
            ino: e.ino,
            inode: e.inode,
            kind: e.kind,
            name: &e.name,
        }
    }

    /// Bytes of the record.
    pub fn encoded_len(&self) -> usize {
        LISTED_HEAD + self.name.len()
    }

    /// Appends the record to `out`; `ENAMETOOLONG` for a name no entry has.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), Errno> {
        if self.name.len() > usize::from(u8::MAX) {
            return Err(Errno::ENAMETOOLONG);
        }
        let mut w = Writer(out);
        w.u64(self.hash);
        w.u64(self.ino.get());
        w.u64(self.inode.get());
        w.u8(self.kind.to_byte());
        w.bytes8(self.name)
    }

    /// The records of a listing of `count` entries in `buf`; `EPROTO`
    /// unless `buf` holds exactly that many well-formed records (a kind
    /// that is one, a name of 1 to [`NAME_MAX`] bytes).
    pub fn decode_all(buf: &'a [u8], count: u32) -> Result<Vec<Listed<'a>>, Errno> {
        let mut out = Vec::new();
        let mut r = Reader::new(buf);
        for _ in 0..count {
            let hash = r.u64()?;
            let ino = Ino::new(r.u64()?);
            let inode = InodeOff::new(r.u64()?);
            let kind = Kind::from_byte(r.u8()?).ok_or(Errno::EPROTO)?;
            let name = r.bytes8(NAME_MAX)?;
            if name.is_empty() {
                return Err(Errno::EPROTO);
            }
            out.push(Listed {
                hash,
                ino,
                inode,
                kind,
                name,
            });
        }
        if !r.done() {
            return Err(Errno::EPROTO);
        }
        Ok(out)
    }
}

/// Bytes of a slot's part of a client's staging area: the most one
/// [`Request::Write`] carries (128 pages, so that an unaligned write
/// spans at most 129, well inside a commit).
pub const STAGE_BYTES: u64 = 128 * 4096;

/// Flags of [`Request::Open`]. As with `O_RDONLY`, an open that asks
/// for neither reading nor writing is one for reading.
pub mod open {
    /// Open for writing (takes the write lease if no client holds it;
    /// see [`Request::Lease`](super::Request::Lease)).
    pub const WRITE: u32 = 1;
    /// Create the file if it does not exist.
    pub const CREATE: u32 = 2;
    /// With `CREATE`: fail with `EEXIST` if it exists.
    pub const EXCL: u32 = 4;
    /// Cut the file to length 0 (with `WRITE`).
    pub const TRUNC: u32 = 8;
    /// Open for reading too (with `WRITE`; an open without `WRITE` is
    /// one for reading).
    pub const READ: u32 = 16;
    /// Every flag.
    pub const ALL: u32 = WRITE | CREATE | EXCL | TRUNC | READ;

    /// The accesses (`MAY_READ`, `MAY_WRITE` of
    /// [`access`](crate::access)) an open with `flags` asks for: a
    /// truncation asks for writing, as on Linux.
    pub fn wants(flags: u32) -> u32 {
        use crate::access::{MAY_READ, MAY_WRITE};
        let read = flags & WRITE == 0 || flags & READ != 0;
        let write = flags & (WRITE | TRUNC) != 0;
        (if read { MAY_READ } else { 0 }) | (if write { MAY_WRITE } else { 0 })
    }
}

/// A run of consecutive data pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extent {
    /// First page.
    pub start: PageNo,
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
            runs: [Extent {
                start: PageNo::NONE,
                len: 0,
            }; EXTENTS_MAX],
        }
    }

    /// Appends `len` pages from `start`, merging with the last run when
    /// they continue it; `false` if the list is full or the run would end
    /// past the largest page number.
    pub fn push(&mut self, start: PageNo, len: u32) -> bool {
        if start.get().checked_add(u64::from(len)).is_none() {
            return false;
        }
        if len == 0 {
            return true;
        }
        if let Some(last) = self.as_slice().last() {
            if last.start.get().checked_add(u64::from(last.len)) == Some(start.get()) {
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
            w.u64(e.start.get());
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
            let (start, len) = (PageNo::new(r.u64()?), r.u32()?);
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
    pub fn iter_pages(&self) -> impl Iterator<Item = PageNo> + '_ {
        self.as_slice()
            .iter()
            .flat_map(|e| (0..u64::from(e.len)).map(|i| e.start.plus(i)))
    }
}

/// A created or linked node, or the file an open found or made: what a
/// client needs to reach it in the index (ARCHITECTURE.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Node {
    /// Its inode number.
    pub ino: Ino,
    /// Its inode's offset in the index.
    pub inode: InodeOff,
    /// Its inode's generation.
    pub gen: u32,
}

/// The runs of pool pages a grant hands out: the first run as (first
/// page, count), up to [`GRANT_RUNS`] more packed in a word each: the
/// first page in the low 40 bits, the count above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    first: (PageNo, u64),
    /// Packed runs after the first; 0 past the last.
    more: [u64; GRANT_RUNS],
}

impl Grant {
    /// A grant of `runs` of (first page, count), the first first. `None`
    /// for no run, too many, an empty one, or one after the first that
    /// does not pack (a page number of more than 40 bits, a count of more
    /// than 24).
    pub fn new(runs: &[(PageNo, u64)]) -> Option<Grant> {
        let (&first, rest) = runs.split_first()?;
        if rest.len() > GRANT_RUNS || first.1 == 0 {
            return None;
        }
        let mut more = [0; GRANT_RUNS];
        for (slot, &(page, n)) in more.iter_mut().zip(rest) {
            let page = page.get();
            if page >> RUN_PAGE_BITS != 0 || n == 0 || n >> (64 - RUN_PAGE_BITS) != 0 {
                return None;
            }
            *slot = page | n << RUN_PAGE_BITS;
        }
        Some(Grant { first, more })
    }

    /// The first run: (first page, count).
    pub fn first(&self) -> (PageNo, u64) {
        self.first
    }

    /// Every run of (first page, count), the first first.
    pub fn runs(&self) -> impl Iterator<Item = (PageNo, u64)> + '_ {
        let more = self.more.iter().take_while(|&&r| r != 0).map(|&r| {
            (
                PageNo::new(r & ((1 << RUN_PAGE_BITS) - 1)),
                r >> RUN_PAGE_BITS,
            )
        });
        std::iter::once(self.first).chain(more)
    }

    /// Pages in all.
    pub fn pages(&self) -> u64 {
        self.runs().map(|(_, n)| n).sum()
    }
}

/// What `statfs` reports, counted by Kfs ([`Reply::Statfs`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Statfs {
    /// Bytes in a block (a data page).
    pub block_size: u32,
    /// Data pages in the file system.
    pub blocks: u64,
    /// Data pages no file nor the metadata store holds.
    pub blocks_free: u64,
    /// Free pages an unprivileged caller may use: all of them (none are
    /// kept back for root).
    pub blocks_avail: u64,
    /// Inodes in use plus those the free space can still hold.
    pub files: u64,
    /// Inodes the free space can still hold, each with a short-named
    /// entry.
    pub files_free: u64,
    /// Longest name.
    pub name_max: u64,
}

/// Kfs's answer to a request that succeeded: one variant per shape of
/// result, each request expecting one (see [`Request::reply_kind`]).
/// Failures travel as the `Err` of a `Result<Reply, Errno>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Unlink, rename, set-attributes, ping, close, unpool: nothing to
    /// return.
    Done,
    /// Create (file, directory, symlink) and link: the node named.
    Node(Node),
    /// Open: the file, and whether this open created it.
    Open {
        /// The file opened.
        node: Node,
        /// This open created the file.
        created: bool,
    },
    /// Grant: the pool pages handed out.
    Grant(Grant),
    /// Commit and truncate: the file's size after the change; write:
    /// its size; read-link and read: the bytes written into the staging
    /// area.
    Size(u64),
    /// Statfs: the file system's size and free space.
    Statfs(Statfs),
    /// Stat and lookup: the node's attributes (its inode offset,
    /// generation and number among them).
    Attr(InodeAttr),
    /// Read-dir: the entries written into the staging area.
    Listing {
        /// How many records.
        entries: u32,
        /// Their bytes.
        bytes: u32,
        /// The directory has entries after the last one written.
        more: bool,
    },
}

/// The shapes of [`Reply`], and the kind tag of its encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ReplyKind {
    #[allow(missing_docs)]
    Done = 1,
    #[allow(missing_docs)]
    Node = 2,
    #[allow(missing_docs)]
    Open = 3,
    #[allow(missing_docs)]
    Grant = 4,
    #[allow(missing_docs)]
    Size = 5,
    #[allow(missing_docs)]
    Statfs = 6,
    #[allow(missing_docs)]
    Attr = 7,
    #[allow(missing_docs)]
    Listing = 8,
}

/// The kind tag of a failure's encoding.
const TAG_ERR: u8 = 0xff;

// Reply encoding: byte 0 the kind tag; byte 1 an open's `created`; bytes
// 4..8 a failure's errno or a node's generation; 8..16 a node's inode
// number, a size, or a grant's first page; 16..24 a node's inode offset or
// a grant's first count; then a grant's packed runs. A statfs fills the
// words from byte 4 to 56 (see `Reply::encode`). Attributes: the
// node's generation, number and offset as a node's, then from `R_ATTR` the
// mode, link count, owner and group (4 bytes each), size, access,
// modification, status-change and creation times, and entries (8 each). A
// listing: byte 1 `more`, 4..8 the records, 8..12 their bytes. Every other
// byte is 0.
const R_TAG: usize = 0;
const R_CREATED: usize = 1;
const R_WORD: usize = 4;
const R_A: usize = 8;
const R_B: usize = 16;
const R_RUNS: usize = 24;
const R_ATTR: usize = 24;
const R_ATTR_END: usize = R_ATTR + 4 * 4 + 8 * 6;
const _: () = assert!(R_RUNS + 8 * GRANT_RUNS <= REPLY_SIZE);

impl Reply {
    /// The reply's shape.
    pub fn kind(&self) -> ReplyKind {
        match self {
            Reply::Done => ReplyKind::Done,
            Reply::Node(_) => ReplyKind::Node,
            Reply::Open { .. } => ReplyKind::Open,
            Reply::Grant(_) => ReplyKind::Grant,
            Reply::Size(_) => ReplyKind::Size,
            Reply::Statfs(_) => ReplyKind::Statfs,
            Reply::Attr(_) => ReplyKind::Attr,
            Reply::Listing { .. } => ReplyKind::Listing,
        }
    }

    /// A create's or link's node (or an open's); `EPROTO` for any other
    /// reply.
    pub fn into_node(self) -> Result<Node, Errno> {
        match self {
            Reply::Node(n) | Reply::Open { node: n, .. } => Ok(n),
            _ => Err(Errno::EPROTO),
        }
    }

    /// An open's file and whether the open created it; `EPROTO` for any
    /// other reply.
    pub fn into_open(self) -> Result<(Node, bool), Errno> {
        match self {
            Reply::Open { node, created } => Ok((node, created)),
            _ => Err(Errno::EPROTO),
        }
    }

    /// A grant's pages; `EPROTO` for any other reply.
    pub fn into_grant(self) -> Result<Grant, Errno> {
        match self {
            Reply::Grant(g) => Ok(g),
            _ => Err(Errno::EPROTO),
        }
    }

    /// A commit's or truncation's size; `EPROTO` for any other reply.
    pub fn into_size(self) -> Result<u64, Errno> {
        match self {
            Reply::Size(s) => Ok(s),
            _ => Err(Errno::EPROTO),
        }
    }

    /// A statfs's figures; `EPROTO` for any other reply.
    pub fn into_statfs(self) -> Result<Statfs, Errno> {
        match self {
            Reply::Statfs(s) => Ok(s),
            _ => Err(Errno::EPROTO),
        }
    }

    /// A stat's or lookup's attributes; `EPROTO` for any other reply.
    pub fn into_attr(self) -> Result<InodeAttr, Errno> {
        match self {
            Reply::Attr(a) => Ok(a),
            _ => Err(Errno::EPROTO),
        }
    }

    /// The reply to a namespace change (ARCHITECTURE.md §6) of a request
    /// expecting `kind`, given the node the change named, if any: that
    /// node for a create or link, nothing for the others. `EIO` for a
    /// create or link that named none, or a kind no such change has.
    pub fn of_change(kind: ReplyKind, node: Option<Node>) -> Result<Reply, Errno> {
        match kind {
            ReplyKind::Node => node.map(Reply::Node).ok_or(Errno::EIO),
            ReplyKind::Done => Ok(Reply::Done),
            ReplyKind::Open
            | ReplyKind::Grant
            | ReplyKind::Size
            | ReplyKind::Statfs
            | ReplyKind::Attr
            | ReplyKind::Listing => Err(Errno::EIO),
        }
    }

    /// The fixed encoding of a reply or a failure.
    pub fn encode(reply: &Result<Reply, Errno>) -> [u8; REPLY_SIZE] {
        let mut b = [0u8; REPLY_SIZE];
        let mut put = |at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
        let tag = match reply {
            Err(e) => {
                put(R_WORD, &e.get().to_le_bytes());
                TAG_ERR
            }
            Ok(r) => {
                match *r {
                    Reply::Done => {}
                    Reply::Node(n) | Reply::Open { node: n, .. } => {
                        put(R_WORD, &n.gen.to_le_bytes());
                        put(R_A, &n.ino.get().to_le_bytes());
                        put(R_B, &n.inode.get().to_le_bytes());
                    }
                    Reply::Grant(g) => {
                        put(R_A, &g.first.0.get().to_le_bytes());
                        put(R_B, &g.first.1.to_le_bytes());
                        for (i, r) in g.more.iter().enumerate() {
                            put(R_RUNS + 8 * i, &r.to_le_bytes());
                        }
                    }
                    Reply::Size(s) => put(R_A, &s.to_le_bytes()),
                    Reply::Statfs(s) => {
                        put(R_WORD, &s.block_size.to_le_bytes());
                        let words = [
                            s.blocks,
                            s.blocks_free,
                            s.blocks_avail,
                            s.files,
                            s.files_free,
                            s.name_max,
                        ];
                        for (i, w) in words.iter().enumerate() {
                            put(R_A + 8 * i, &w.to_le_bytes());
                        }
                    }
                    Reply::Attr(a) => {
                        put(R_WORD, &a.gen.to_le_bytes());
                        put(R_A, &a.ino.get().to_le_bytes());
                        put(R_B, &a.offset.get().to_le_bytes());
                        for (i, v) in [a.mode, a.nlink, a.uid, a.gid].iter().enumerate() {
                            put(R_ATTR + 4 * i, &v.to_le_bytes());
                        }
                        let wide = [
                            a.size,
                            a.atime.cast_unsigned(),
                            a.mtime.cast_unsigned(),
                            a.ctime.cast_unsigned(),
                            a.btime.cast_unsigned(),
                            a.entries,
                        ];
                        for (i, v) in wide.iter().enumerate() {
                            put(R_ATTR + 16 + 8 * i, &v.to_le_bytes());
                        }
                    }
                    Reply::Listing {
                        entries,
                        bytes,
                        more,
                    } => {
                        put(R_CREATED, &[u8::from(more)]);
                        put(R_WORD, &entries.to_le_bytes());
                        put(R_A, &bytes.to_le_bytes());
                    }
                }
                if let Reply::Open { created: true, .. } = r {
                    put(R_CREATED, &[1]);
                }
                r.kind() as u8
            }
        };
        b[R_TAG] = tag;
        b
    }

    /// Decodes a reply to a request that expects `expect`: the reply, or
    /// the failure it carries. `EPROTO`, never a panic, for a reply of
    /// another kind, an errno out of range, or any byte the encoding
    /// leaves 0 that is not.
    pub fn decode(b: &[u8; REPLY_SIZE], expect: ReplyKind) -> Result<Reply, Errno> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        // Bytes the reply's kind leaves unused must be 0.
        let zero = |r: std::ops::Range<usize>| b[r].iter().all(|&x| x == 0);
        let tag = b[R_TAG];
        if tag == TAG_ERR {
            // The word holds an `i32`'s bits; `Errno::new` refuses what
            // reads back negative.
            let e = u32_at(R_WORD).cast_signed();
            return match Errno::new(e) {
                Some(e) if zero(1..R_WORD) && zero(R_A..REPLY_SIZE) => Err(e),
                _ => Err(Errno::EPROTO),
            };
        }
        if tag != expect as u8 {
            return Err(Errno::EPROTO);
        }
        let node = || Node {
            ino: Ino::new(u64_at(R_A)),
            inode: InodeOff::new(u64_at(R_B)),
            gen: u32_at(R_WORD),
        };
        let (reply, ok) = match expect {
            ReplyKind::Done => (Reply::Done, zero(1..REPLY_SIZE)),
            ReplyKind::Node => (
                Reply::Node(node()),
                zero(1..R_WORD) && zero(R_RUNS..REPLY_SIZE),
            ),
            ReplyKind::Open => (
                Reply::Open {
                    node: node(),
                    created: b[R_CREATED] == 1,
                },
                b[R_CREATED] <= 1 && zero(R_CREATED + 1..R_WORD) && zero(R_RUNS..REPLY_SIZE),
            ),
            ReplyKind::Grant => {
                let first = (u64_at(R_A), u64_at(R_B));
                let more: [u64; GRANT_RUNS] = std::array::from_fn(|i| u64_at(R_RUNS + 8 * i));
                // What `Grant::new` builds: no run empty, none packed
                // after a 0 (a packed run's page fits by construction).
                let listed = more.iter().take_while(|&&r| r != 0).count();
                let ok = first.1 != 0
                    && more[..listed].iter().all(|&r| r >> RUN_PAGE_BITS != 0)
                    && more[listed..].iter().all(|&r| r == 0)
                    && zero(1..R_A)
                    && zero(R_RUNS + 8 * GRANT_RUNS..REPLY_SIZE);
                (
                    Reply::Grant(Grant {
                        first: (PageNo::new(first.0), first.1),
                        more,
                    }),
                    ok,
                )
            }
            ReplyKind::Size => (
                Reply::Size(u64_at(R_A)),
                zero(1..R_A) && zero(R_B..REPLY_SIZE),
            ),
            ReplyKind::Statfs => {
                let s = Statfs {
                    block_size: u32_at(R_WORD),
                    blocks: u64_at(R_A),
                    blocks_free: u64_at(R_A + 8),
                    blocks_avail: u64_at(R_A + 16),
                    files: u64_at(R_A + 24),
                    files_free: u64_at(R_A + 32),
                    name_max: u64_at(R_A + 40),
                };
                // What Kfs counts: no more free than there are, no more
                // available than free.
                let ok = zero(1..R_WORD)
                    && zero(R_A + 48..REPLY_SIZE)
                    && s.blocks_free <= s.blocks
                    && s.blocks_avail <= s.blocks_free
                    && s.files_free <= s.files;
                (Reply::Statfs(s), ok)
            }
            ReplyKind::Attr => {
                let wide = |i: usize| u64_at(R_ATTR + 16 + 8 * i);
                let n = node();
                let attr = InodeAttr {
                    offset: n.inode,
                    gen: n.gen,
                    ino: n.ino,
                    mode: u32_at(R_ATTR),
                    nlink: u32_at(R_ATTR + 4),
                    uid: u32_at(R_ATTR + 8),
                    gid: u32_at(R_ATTR + 12),
                    size: wide(0),
                    atime: wide(1).cast_signed(),
                    mtime: wide(2).cast_signed(),
                    ctime: wide(3).cast_signed(),
                    btime: wide(4).cast_signed(),
                    entries: wide(5),
                };
                (Reply::Attr(attr), zero(1..R_WORD))
            }
            ReplyKind::Listing => (
                Reply::Listing {
                    entries: u32_at(R_WORD),
                    bytes: u32_at(R_A),
                    more: b[R_CREATED] == 1,
                },
                b[R_CREATED] <= 1 && zero(R_CREATED + 1..R_WORD) && zero(R_A + 4..REPLY_SIZE),
            ),
        };
        if !ok {
            return Err(Errno::EPROTO);
        }
        Ok(reply)
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
    pub const WRITE: u16 = 13;
    pub const STATFS: u16 = 14;
    pub const STAT: u16 = 15;
    pub const LOOKUP: u16 = 16;
    pub const READDIR: u16 = 17;
    pub const READLINK: u16 = 18;
    pub const READ: u16 = 19;
    pub const LEASE: u16 = 20;
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

fn put_node(w: &mut Writer<'_>, n: &Node) {
    w.u64(n.ino.get());
    w.u64(n.inode.get());
    w.u32(n.gen);
}

fn get_node(r: &mut Reader<'_>) -> Result<Node, Errno> {
    Ok(Node {
        ino: Ino::new(r.u64()?),
        inode: InodeOff::new(r.u64()?),
        gen: r.u32()?,
    })
}

fn put_at(w: &mut Writer<'_>, at: &At<'_>) {
    match at {
        At::Path { path, follow } => {
            w.u8(0);
            w.bytes(path);
            w.bool(*follow);
        }
        At::Node(n) => {
            w.u8(1);
            put_node(w, n);
        }
    }
}

fn get_at<'a>(r: &mut Reader<'a>) -> Result<At<'a>, Errno> {
    match r.u8()? {
        0 => Ok(At::Path {
            path: r.bytes(STRING_MAX)?,
            follow: r.bool()?,
        }),
        1 => Ok(At::Node(get_node(r)?)),
        _ => Err(Errno::EPROTO),
    }
}

fn put_entry(w: &mut Writer<'_>, e: &Entry<'_>) {
    match e {
        Entry::Path(path) => {
            w.u8(0);
            w.bytes(path);
        }
        Entry::In { dir, name } => {
            w.u8(1);
            put_node(w, dir);
            w.bytes(name);
        }
    }
}

/// The tags of an [`Entry`] (0 and 1), and an [`OpenAt::Node`] (2).
fn get_tagged_entry<'a>(r: &mut Reader<'a>, tag: u8) -> Result<Entry<'a>, Errno> {
    match tag {
        0 => Ok(Entry::Path(r.bytes(STRING_MAX)?)),
        1 => Ok(Entry::In {
            dir: get_node(r)?,
            name: r.bytes(STRING_MAX)?,
        }),
        _ => Err(Errno::EPROTO),
    }
}

fn get_entry<'a>(r: &mut Reader<'a>) -> Result<Entry<'a>, Errno> {
    let tag = r.u8()?;
    get_tagged_entry(r, tag)
}

fn get_open_at<'a>(r: &mut Reader<'a>) -> Result<OpenAt<'a>, Errno> {
    match r.u8()? {
        2 => Ok(OpenAt::Node(get_node(r)?)),
        tag => Ok(OpenAt::Entry(get_tagged_entry(r, tag)?)),
    }
}

impl<'a> Request<'a> {
    /// Encodes the request into `out` (replacing what it held) and returns
    /// its length. Fails with `ENAMETOOLONG` for an oversized path.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<usize, Errno> {
        let strings: [&[u8]; 2] = match self {
            Request::Create { at, target, .. } => [at.string(), target],
            Request::Link { from, to, .. } => [from.path(), to.string()],
            Request::Rename { from, to, .. } => [from.string(), to.string()],
            Request::Unlink { at, .. } => [at.string(), b""],
            Request::Open {
                at: OpenAt::Entry(at),
                ..
            } => [at.string(), b""],
            Request::Stat { at } | Request::ReadLink { at } | Request::SetAttr { at, .. } => {
                [at.path(), b""]
            }
            Request::Lookup { name, .. } => [name, b""],
            Request::ReadDir { dir, after } => [dir.path(), after.map_or(&b""[..], |a| a.1)],
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
                at,
                mode,
                target,
                hint,
            } => {
                put_entry(&mut w, at);
                w.u32(*mode);
                w.bytes(target);
                put_hint(&mut w, hint);
                op::CREATE
            }
            Request::Link { from, to, hint } => {
                put_at(&mut w, from);
                put_entry(&mut w, to);
                put_hint(&mut w, hint);
                op::LINK
            }
            Request::Unlink { at, rmdir, hint } => {
                put_entry(&mut w, at);
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
                put_entry(&mut w, from);
                put_entry(&mut w, to);
                w.bool(*noreplace);
                put_hint(&mut w, hint_from);
                put_hint(&mut w, hint_to);
                op::RENAME
            }
            Request::SetAttr { at, attrs, now } => {
                put_at(&mut w, at);
                attrs.encode(&mut w);
                now.encode(&mut w);
                op::SETATTR
            }
            Request::Ping => op::PING,
            Request::Open {
                at,
                flags,
                mode,
                hint,
            } => {
                match at {
                    OpenAt::Entry(e) => put_entry(&mut w, e),
                    OpenAt::Node(n) => {
                        w.u8(2);
                        put_node(&mut w, n);
                    }
                }
                w.u32(*flags);
                w.u32(*mode);
                put_hint(&mut w, hint);
                op::OPEN
            }
            Request::Close { ino, write } => {
                w.u64(ino.get());
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
                w.u64(ino.get());
                w.u64(*first);
                w.u64(*size);
                extents.encode(&mut w);
                op::COMMIT
            }
            Request::Truncate { ino, size } => {
                w.u64(ino.get());
                w.u64(*size);
                op::TRUNCATE
            }
            Request::Write { ino, offset, len } => {
                w.u64(ino.get());
                w.u64(*offset);
                w.u32(*len);
                op::WRITE
            }
            Request::Lease { ino } => {
                w.u64(ino.get());
                op::LEASE
            }
            Request::Unpool { slot, start, pages } => {
                w.u32(*slot);
                w.u64(start.get());
                w.u32(*pages);
                op::UNPOOL
            }
            Request::Statfs => op::STATFS,
            Request::Stat { at } => {
                put_at(&mut w, at);
                op::STAT
            }
            Request::Lookup { dir, name } => {
                put_node(&mut w, dir);
                w.bytes(name);
                op::LOOKUP
            }
            Request::ReadDir { dir, after } => {
                put_at(&mut w, dir);
                w.bool(after.is_some());
                let (hash, name) = after.unwrap_or((0, b""));
                w.u64(hash);
                w.bytes(name);
                op::READDIR
            }
            Request::ReadLink { at } => {
                put_at(&mut w, at);
                op::READLINK
            }
            Request::Read { ino, offset, len } => {
                w.u64(ino.get());
                w.u64(*offset);
                w.u32(*len);
                op::READ
            }
        };
        let len = out.len();
        // Strings are at most `STRING_MAX` bytes and commits at most
        // `EXTENTS_MAX` runs: a body stays under `REQUEST_MAX`, far inside
        // a `u32`.
        #[allow(clippy::cast_possible_truncation)]
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
                at: get_entry(&mut r)?,
                mode: r.u32()?,
                target: r.bytes(STRING_MAX)?,
                hint: get_hint(&mut r)?,
            },
            op::LINK => Request::Link {
                from: get_at(&mut r)?,
                to: get_entry(&mut r)?,
                hint: get_hint(&mut r)?,
            },
            op::UNLINK => Request::Unlink {
                at: get_entry(&mut r)?,
                rmdir: r.bool()?,
                hint: get_hint(&mut r)?,
            },
            op::RENAME => Request::Rename {
                from: get_entry(&mut r)?,
                to: get_entry(&mut r)?,
                noreplace: r.bool()?,
                hint_from: get_hint(&mut r)?,
                hint_to: get_hint(&mut r)?,
            },
            op::SETATTR => Request::SetAttr {
                at: get_at(&mut r)?,
                attrs: SetAttrs::decode(&mut r)?,
                now: TimesNow::decode(&mut r)?,
            },
            op::PING => Request::Ping,
            op::OPEN => Request::Open {
                at: get_open_at(&mut r)?,
                flags: r.u32()?,
                mode: r.u32()?,
                hint: get_hint(&mut r)?,
            },
            op::CLOSE => Request::Close {
                ino: Ino::new(r.u64()?),
                write: r.bool()?,
            },
            op::GRANT => Request::Grant { pages: r.u32()? },
            op::COMMIT => Request::Commit {
                ino: Ino::new(r.u64()?),
                first: r.u64()?,
                size: r.u64()?,
                extents: Extents::decode(&mut r)?,
            },
            op::TRUNCATE => Request::Truncate {
                ino: Ino::new(r.u64()?),
                size: r.u64()?,
            },
            op::WRITE => Request::Write {
                ino: Ino::new(r.u64()?),
                offset: r.u64()?,
                len: r.u32()?,
            },
            op::LEASE => Request::Lease {
                ino: Ino::new(r.u64()?),
            },
            op::UNPOOL => Request::Unpool {
                slot: r.u32()?,
                start: PageNo::new(r.u64()?),
                pages: r.u32()?,
            },
            op::STATFS => Request::Statfs,
            op::STAT => Request::Stat {
                at: get_at(&mut r)?,
            },
            op::LOOKUP => Request::Lookup {
                dir: get_node(&mut r)?,
                name: r.bytes(STRING_MAX)?,
            },
            op::READDIR => {
                let dir = get_at(&mut r)?;
                let some = r.bool()?;
                let hash = r.u64()?;
                let name = r.bytes(STRING_MAX)?;
                // No listing resumes after nothing: an absent key is
                // written as zeros.
                if !some && (hash != 0 || !name.is_empty()) {
                    return Err(Errno::EPROTO);
                }
                Request::ReadDir {
                    dir,
                    after: some.then_some((hash, name)),
                }
            }
            op::READLINK => Request::ReadLink {
                at: get_at(&mut r)?,
            },
            op::READ => Request::Read {
                ino: Ino::new(r.u64()?),
                offset: r.u64()?,
                len: r.u32()?,
            },
            _ => return Err(Errno::EPROTO),
        };
        if !r.done() {
            return Err(Errno::EPROTO);
        }
        Ok(req)
    }

    /// The shape of the reply this request expects.
    pub fn reply_kind(&self) -> ReplyKind {
        match self {
            Request::Create { .. } | Request::Link { .. } => ReplyKind::Node,
            Request::Open { .. } => ReplyKind::Open,
            Request::Grant { .. } => ReplyKind::Grant,
            Request::Statfs => ReplyKind::Statfs,
            Request::Commit { .. }
            | Request::Truncate { .. }
            | Request::Write { .. }
            | Request::ReadLink { .. }
            | Request::Read { .. }
            | Request::Lease { .. } => ReplyKind::Size,
            Request::Stat { .. } | Request::Lookup { .. } => ReplyKind::Attr,
            Request::ReadDir { .. } => ReplyKind::Listing,
            Request::Unlink { .. }
            | Request::Rename { .. }
            | Request::SetAttr { .. }
            | Request::Ping
            | Request::Close { .. }
            | Request::Unpool { .. } => ReplyKind::Done,
        }
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
            Request::Stat { .. } => RequestKind::Stat,
            Request::Lookup { .. } => RequestKind::Lookup,
            Request::ReadDir { .. } => RequestKind::ReadDir,
            Request::ReadLink { .. } => RequestKind::ReadLink,
            Request::Read { .. } => RequestKind::Read,
            Request::Write { .. } => RequestKind::Write,
            Request::Statfs => RequestKind::Statfs,
            Request::Lease { .. } => RequestKind::Lease,
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
    #[allow(missing_docs)]
    Write,
    #[allow(missing_docs)]
    Statfs,
    #[allow(missing_docs)]
    Stat,
    #[allow(missing_docs)]
    Lookup,
    #[allow(missing_docs)]
    ReadDir,
    #[allow(missing_docs)]
    ReadLink,
    #[allow(missing_docs)]
    Read,
    #[allow(missing_docs)]
    Lease,
    /// A request that failed to decode.
    Malformed,
}

impl RequestKind {
    /// Every kind, in display order.
    pub const ALL: [RequestKind; 24] = [
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
        RequestKind::Write,
        RequestKind::Statfs,
        RequestKind::Stat,
        RequestKind::Lookup,
        RequestKind::ReadDir,
        RequestKind::ReadLink,
        RequestKind::Read,
        RequestKind::Lease,
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

    /// The low half of `x`, to draw a `u32` from a drawn `u64`.
    // Dropping the high half is the point.
    #[allow(clippy::cast_possible_truncation)]
    fn low32(x: u64) -> u32 {
        x as u32
    }

    proptest! {
        #[test]
        fn requests_round_trip_and_damage_is_refused(
            a in bytes(), b in bytes(), mode: u32, h1 in hint(), h2 in hint(),
            which in 0..21u8, by_node: bool, flip in any::<prop::sample::Index>(),
            x: u64, y: u64, runs in proptest::collection::vec((any::<u64>(), any::<u32>()), 0..=EXTENTS_MAX)
        ) {
            // Each change by path, or by node (a directory's and a name,
            // or a node's own).
            let n1 = Node { ino: Ino::new(x), inode: InodeOff::new(y), gen: mode };
            let n2 = Node { ino: Ino::new(y), inode: InodeOff::new(x), gen: !mode };
            let (ea, eb) = if by_node {
                (Entry::In { dir: n1, name: &a }, Entry::In { dir: n2, name: &b })
            } else {
                (Entry::Path(&a), Entry::Path(&b))
            };
            let at = if by_node { At::Node(n2) } else { At::Path { path: &a, follow: x & 4 == 4 } };
            let req = match which {
                0 => Request::Create { at: ea, mode, target: &b, hint: h1 },
                1 => Request::Link { from: at, to: ea, hint: h1 },
                2 => Request::Unlink { at: ea, rmdir: mode & 1 == 1, hint: h1 },
                3 => Request::Rename { from: ea, to: eb, noreplace: true, hint_from: h1, hint_to: h2 },
                4 => Request::SetAttr {
                    at,
                    attrs: SetAttrs { mode: Some(mode), ..SetAttrs::default() },
                    now: TimesNow { atime: x & 1 == 1, mtime: x & 2 == 2 },
                },
                5 => Request::Open {
                    at: if by_node && x & 8 == 8 { OpenAt::Node(n1) } else { OpenAt::Entry(ea) },
                    flags: mode,
                    mode: mode >> 3,
                    hint: h1,
                },
                6 => Request::Close {
                    ino: Ino::new(x),
                    write: y & 1 == 1,
                },
                7 => Request::Grant { pages: mode },
                8 => {
                    let mut extents = Extents::new();
                    for (s, l) in &runs {
                        extents.push(PageNo::new(*s), *l);
                    }
                    Request::Commit {
                        ino: Ino::new(x),
                        first: y,
                        size: x ^ y,
                        extents,
                    }
                }
                9 => Request::Truncate {
                    ino: Ino::new(x),
                    size: y,
                },
                10 => Request::Unpool {
                    slot: mode,
                    start: PageNo::new(x),
                    pages: low32(y),
                },
                11 => Request::Write {
                    ino: Ino::new(x),
                    offset: y,
                    len: mode,
                },
                12 => Request::Stat { at: At::Path { path: &a, follow: mode & 1 == 1 } },
                13 => Request::Stat { at: At::Node(Node { ino: Ino::new(x), inode: InodeOff::new(y), gen: mode }) },
                14 => Request::Lookup { dir: Node { ino: Ino::new(x), inode: InodeOff::new(y), gen: mode }, name: &b },
                15 => Request::ReadDir {
                    dir: if x & 1 == 0 { At::Path { path: &a, follow: true } } else { At::Node(Node::default()) },
                    after: (y & 1 == 1).then_some((x, &b[..])),
                },
                16 => Request::ReadLink { at: At::Path { path: &a, follow: false } },
                17 => Request::Read { ino: Ino::new(x), offset: y, len: mode },
                18 => Request::Statfs,
                19 => Request::Lease { ino: Ino::new(x) },
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
        fn a_change_naming_nothing_known_is_refused(
            which in 0..6u8, tag in 2..=u8::MAX, cut in 1..24usize, name in bytes(),
        ) {
            // The first byte of each change's body tags what it names: a
            // tag no form has (`Open`'s third, its node, leaves the name's
            // bytes over), or a node cut short, is `EPROTO`, never a
            // misread.
            let e = Entry::In { dir: Node::default(), name: &name };
            let req = match which {
                0 => Request::Create { at: e, mode: 0, target: b"", hint: None },
                1 => Request::Link { from: At::Node(Node::default()), to: e, hint: None },
                2 => Request::Unlink { at: e, rmdir: false, hint: None },
                3 => Request::Rename { from: e, to: e, noreplace: false, hint_from: None, hint_to: None },
                4 => Request::SetAttr { at: At::Node(Node::default()), attrs: SetAttrs::default(), now: TimesNow::default() },
                _ => Request::Open { at: OpenAt::Entry(e), flags: 0, mode: 0, hint: None },
            };
            let mut buf = Vec::new();
            let n = req.encode(&mut buf).unwrap();
            let reseal = |b: &mut Vec<u8>| {
                let body = u32::try_from(b.len() - HEADER).unwrap();
                b[4..8].copy_from_slice(&body.to_le_bytes());
                let crc = crate::checksum::crc32c_append(crate::checksum::crc32c(&b[..8]), &b[HEADER..]);
                b[8..12].copy_from_slice(&crc.to_le_bytes());
            };
            let mut bad = buf[..n].to_vec();
            bad[HEADER] = tag;
            reseal(&mut bad);
            prop_assert_eq!(Request::decode(&bad), Err(Errno::EPROTO));
            let mut short = buf[..HEADER + 1 + cut.min(19)].to_vec();
            reseal(&mut short);
            prop_assert_eq!(Request::decode(&short), Err(Errno::EPROTO));
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
            at: Entry::Path(&long),
            rmdir: false,
            hint: None,
        };
        assert_eq!(req.encode(&mut buf), Err(Errno::ENAMETOOLONG));
        let req = Request::Create {
            at: Entry::In {
                dir: Node::default(),
                name: &long,
            },
            mode: 0,
            target: b"",
            hint: None,
        };
        assert_eq!(req.encode(&mut buf), Err(Errno::ENAMETOOLONG));
    }

    #[test]
    fn the_largest_requests_by_path_or_node_fit_a_slot() {
        let long = vec![b'a'; STRING_MAX];
        let hint = Some(Hint::default());
        let n = Node::default();
        let mut buf = Vec::new();
        for (from, to) in [
            (Entry::Path(&long), Entry::Path(&long)),
            (
                Entry::In {
                    dir: n,
                    name: &long,
                },
                Entry::In {
                    dir: n,
                    name: &long,
                },
            ),
        ] {
            let rename = Request::Rename {
                from,
                to,
                noreplace: false,
                hint_from: hint,
                hint_to: hint,
            };
            assert!(rename.encode(&mut buf).unwrap() <= REQUEST_MAX);
            let link = Request::Link {
                from: At::Path {
                    path: &long,
                    follow: true,
                },
                to,
                hint,
            };
            assert!(link.encode(&mut buf).unwrap() <= REQUEST_MAX);
            let create = Request::Create {
                at: from,
                mode: 0,
                target: &long,
                hint,
            };
            assert!(create.encode(&mut buf).unwrap() <= REQUEST_MAX);
        }
    }

    fn node() -> impl Strategy<Value = Node> {
        (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(ino, inode, gen)| Node {
            ino: Ino::new(ino),
            inode: InodeOff::new(inode),
            gen,
        })
    }

    /// Runs of (first page, count) with typed pages.
    fn typed(runs: &[(u64, u64)]) -> Vec<(PageNo, u64)> {
        runs.iter().map(|&(p, n)| (PageNo::new(p), n)).collect()
    }

    fn grant() -> impl Strategy<Value = Grant> {
        (
            (any::<u64>(), 1..u64::MAX),
            proptest::collection::vec((0..1u64 << 40, 1..1u64 << 24), 0..=GRANT_RUNS),
        )
            .prop_map(|(first, rest)| {
                let runs: Vec<_> = std::iter::once(first).chain(rest).collect();
                Grant::new(&typed(&runs)).unwrap()
            })
    }

    fn attr() -> impl Strategy<Value = InodeAttr> {
        (
            node(),
            proptest::array::uniform4(any::<u32>()),
            proptest::array::uniform6(any::<u64>()),
        )
            .prop_map(|(n, [mode, nlink, uid, gid], w)| InodeAttr {
                offset: n.inode,
                gen: n.gen,
                ino: n.ino,
                mode,
                nlink,
                uid,
                gid,
                size: w[0],
                atime: w[1].cast_signed(),
                mtime: w[2].cast_signed(),
                ctime: w[3].cast_signed(),
                btime: w[4].cast_signed(),
                entries: w[5],
            })
    }

    fn reply() -> impl Strategy<Value = Reply> {
        prop_oneof![
            Just(Reply::Done),
            node().prop_map(Reply::Node),
            (node(), any::<bool>()).prop_map(|(node, created)| Reply::Open { node, created }),
            grant().prop_map(Reply::Grant),
            any::<u64>().prop_map(Reply::Size),
            statfs().prop_map(Reply::Statfs),
            attr().prop_map(Reply::Attr),
            (any::<u32>(), any::<u32>(), any::<bool>()).prop_map(|(entries, bytes, more)| {
                Reply::Listing {
                    entries,
                    bytes,
                    more,
                }
            }),
        ]
    }

    /// Figures as Kfs counts them: no more free than there are.
    fn statfs() -> impl Strategy<Value = Statfs> {
        (
            any::<u32>(),
            any::<[u64; 3]>(),
            any::<[u64; 2]>(),
            any::<u64>(),
        )
            .prop_map(|(block_size, mut blocks, mut files, name_max)| {
                blocks.sort_unstable();
                files.sort_unstable();
                Statfs {
                    block_size,
                    blocks: blocks[2],
                    blocks_free: blocks[1],
                    blocks_avail: blocks[0],
                    files: files[1],
                    files_free: files[0],
                    name_max,
                }
            })
    }

    const KINDS: [ReplyKind; 8] = [
        ReplyKind::Done,
        ReplyKind::Node,
        ReplyKind::Open,
        ReplyKind::Grant,
        ReplyKind::Size,
        ReplyKind::Statfs,
        ReplyKind::Attr,
        ReplyKind::Listing,
    ];

    proptest! {
        #[test]
        fn replies_round_trip_and_other_kinds_are_refused(r in reply()) {
            let b = Reply::encode(&Ok(r));
            for k in KINDS {
                let want = if k == r.kind() { Ok(r) } else { Err(Errno::EPROTO) };
                prop_assert_eq!(Reply::decode(&b, k), want);
            }
        }

        #[test]
        fn failures_round_trip_for_every_kind(e in 1..=Errno::MAX) {
            let b = Reply::encode(&Err(Errno::new(e).unwrap()));
            for k in KINDS {
                prop_assert_eq!(Reply::decode(&b, k), Err(Errno::new(e).unwrap()));
            }
        }

        #[test]
        fn a_stray_byte_in_a_reply_is_refused(r in reply(), at in 0..REPLY_SIZE, x in 1..=255u8) {
            let mut b = Reply::encode(&Ok(r));
            b[at] ^= x;
            // A byte the reply's kind does not use, or the tag, must be
            // refused; a changed field of it decodes as another value of
            // that kind (or is refused, where the kind checks the field).
            if let Ok(back) = Reply::decode(&b, r.kind()) {
                prop_assert_eq!(back.kind(), r.kind());
                prop_assert_ne!(back, r);
                prop_assert_eq!(Reply::encode(&Ok(back)), b);
            }
        }

        #[test]
        fn garbage_replies_never_panic(bytes in proptest::collection::vec(any::<u8>(), REPLY_SIZE)) {
            let mut buf = [0u8; REPLY_SIZE];
            buf.copy_from_slice(&bytes);
            for k in KINDS {
                if let Ok(r) = Reply::decode(&buf, k) {
                    // Only what `encode` writes decodes.
                    prop_assert_eq!(Reply::encode(&Ok(r)), buf);
                }
            }
        }
    }

    #[test]
    fn errnos_out_of_range_and_unknown_tags_are_refused() {
        // A failure's encoding with a number no `Errno` holds.
        for e in [0, -1, Errno::MAX + 1, i32::MIN, i32::MAX] {
            let mut b = Reply::encode(&Err(Errno::EIO));
            b[R_WORD..R_WORD + 4].copy_from_slice(&e.to_le_bytes());
            assert_eq!(
                Reply::decode(&b, ReplyKind::Done),
                Err(Errno::EPROTO),
                "{e}"
            );
        }
        for tag in [0, 9, 0x7f, 0xfe] {
            let mut b = [0u8; REPLY_SIZE];
            b[R_TAG] = tag;
            for k in KINDS {
                assert_eq!(Reply::decode(&b, k), Err(Errno::EPROTO), "{tag}");
            }
        }
        // An all-zero slot (a reply never written) is no reply.
        for k in KINDS {
            assert_eq!(Reply::decode(&[0; REPLY_SIZE], k), Err(Errno::EPROTO));
        }
        // A listing's `more` is 0 or 1.
        let mut b = Reply::encode(&Ok(Reply::Listing {
            entries: 1,
            bytes: 40,
            more: true,
        }));
        b[R_CREATED] = 2;
        assert_eq!(Reply::decode(&b, ReplyKind::Listing), Err(Errno::EPROTO));
        // An open's `created` is 0 or 1.
        let mut b = Reply::encode(&Ok(Reply::Open {
            node: Node::default(),
            created: true,
        }));
        b[R_CREATED] = 2;
        assert_eq!(Reply::decode(&b, ReplyKind::Open), Err(Errno::EPROTO));
    }

    #[test]
    fn every_request_expects_the_reply_its_kind_gives() {
        let expect = |req: Request<'_>| req.reply_kind();
        assert_eq!(
            expect(Request::Create {
                at: Entry::Path(b"a"),
                mode: 0,
                target: b"",
                hint: None
            }),
            ReplyKind::Node
        );
        assert_eq!(
            expect(Request::Link {
                from: At::Path {
                    path: b"a",
                    follow: false
                },
                to: Entry::Path(b"b"),
                hint: None
            }),
            ReplyKind::Node
        );
        assert_eq!(
            expect(Request::Open {
                at: OpenAt::Entry(Entry::Path(b"a")),
                flags: 0,
                mode: 0,
                hint: None
            }),
            ReplyKind::Open
        );
        assert_eq!(expect(Request::Grant { pages: 1 }), ReplyKind::Grant);
        assert_eq!(
            expect(Request::Truncate {
                ino: Ino::new(1),
                size: 0
            }),
            ReplyKind::Size
        );
        assert_eq!(expect(Request::Ping), ReplyKind::Done);
        assert_eq!(
            expect(Request::Unpool {
                slot: 0,
                start: PageNo::NONE,
                pages: 1
            }),
            ReplyKind::Done
        );
        // A namespace change's reply: its node where the kind has one.
        let n = Node {
            ino: Ino::new(3),
            inode: InodeOff::new(4096),
            gen: 1,
        };
        assert_eq!(
            Reply::of_change(ReplyKind::Node, Some(n)),
            Ok(Reply::Node(n))
        );
        assert_eq!(Reply::of_change(ReplyKind::Node, None), Err(Errno::EIO));
        assert_eq!(Reply::of_change(ReplyKind::Done, Some(n)), Ok(Reply::Done));
        assert_eq!(Reply::of_change(ReplyKind::Grant, Some(n)), Err(Errno::EIO));
        // The accessors refuse another kind.
        assert_eq!(Reply::Node(n).into_node(), Ok(n));
        assert_eq!(
            Reply::Open {
                node: n,
                created: true
            }
            .into_open(),
            Ok((n, true))
        );
        assert_eq!(
            Reply::Open {
                node: n,
                created: false
            }
            .into_node(),
            Ok(n)
        );
        assert_eq!(Reply::Done.into_node(), Err(Errno::EPROTO));
        assert_eq!(Reply::Node(n).into_open(), Err(Errno::EPROTO));
        assert_eq!(Reply::Size(5).into_grant(), Err(Errno::EPROTO));
        assert_eq!(Reply::Size(5).into_size(), Ok(5));
        assert_eq!(Reply::Done.into_size(), Err(Errno::EPROTO));
    }

    #[test]
    fn a_statfs_reply_carries_every_figure_and_refuses_impossible_ones() {
        assert_eq!(Request::Statfs.reply_kind(), ReplyKind::Statfs);
        let s = Statfs {
            block_size: 4096,
            blocks: 1000,
            blocks_free: 600,
            blocks_avail: 600,
            files: 900,
            files_free: 800,
            name_max: 255,
        };
        let b = Reply::encode(&Ok(Reply::Statfs(s)));
        let back = Reply::decode(&b, ReplyKind::Statfs).and_then(Reply::into_statfs);
        assert_eq!(back, Ok(s));
        assert_eq!(Reply::Size(1).into_statfs(), Err(Errno::EPROTO));
        // More free than there are, more available than free, more free
        // inodes than inodes.
        for bad in [
            Statfs {
                blocks_free: 1001,
                blocks_avail: 0,
                ..s
            },
            Statfs {
                blocks_avail: 601,
                ..s
            },
            Statfs {
                files_free: 901,
                ..s
            },
        ] {
            let b = Reply::encode(&Ok(Reply::Statfs(bad)));
            assert_eq!(Reply::decode(&b, ReplyKind::Statfs), Err(Errno::EPROTO));
        }
        // A byte between the tag and the block size.
        let mut b = Reply::encode(&Ok(Reply::Statfs(s)));
        b[2] = 1;
        assert_eq!(Reply::decode(&b, ReplyKind::Statfs), Err(Errno::EPROTO));
    }

    #[test]
    fn reading_requests_expect_their_replies() {
        let n = Node {
            ino: Ino::new(2),
            inode: InodeOff::new(64),
            gen: 3,
        };
        let at = At::Node(n);
        assert_eq!(Request::Stat { at }.reply_kind(), ReplyKind::Attr);
        assert_eq!(
            Request::Lookup { dir: n, name: b"x" }.reply_kind(),
            ReplyKind::Attr
        );
        assert_eq!(
            Request::ReadDir {
                dir: at,
                after: None
            }
            .reply_kind(),
            ReplyKind::Listing
        );
        assert_eq!(Request::ReadLink { at }.reply_kind(), ReplyKind::Size);
        assert_eq!(
            Request::Read {
                ino: n.ino,
                offset: 0,
                len: 1
            }
            .reply_kind(),
            ReplyKind::Size
        );
        assert_eq!(Reply::Done.into_attr(), Err(Errno::EPROTO));
    }

    #[test]
    fn a_read_dir_that_starts_from_nothing_names_no_key() {
        // Encoded by hand: no key, yet a hash after it.
        let mut req = Vec::new();
        Request::ReadDir {
            dir: At::Path {
                path: b"d",
                follow: true,
            },
            after: None,
        }
        .encode(&mut req)
        .unwrap();
        assert!(Request::decode(&req).is_ok());
        // The hash sits after the path (tag, length, byte, follow) and
        // the `after` flag; the checksum is recomputed so that only the
        // field is wrong.
        let at = HEADER + 1 + 4 + 1 + 4 + 4;
        req[at] = 1;
        let crc =
            crate::checksum::crc32c_append(crate::checksum::crc32c(&req[..8]), &req[HEADER..]);
        req[8..12].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(Request::decode(&req), Err(Errno::EPROTO));
    }

    proptest! {
        #[test]
        fn listings_round_trip_and_garbage_is_refused(
            names in proptest::collection::vec(proptest::collection::vec(1..=255u8, 1..=NAME_MAX), 0..8),
            hash: u64, ino: u64, cut in any::<prop::sample::Index>(),
        ) {
            let mut buf = Vec::new();
            let listed: Vec<Listed<'_>> = names.iter().map(|n| Listed {
                hash,
                ino: Ino::new(ino),
                inode: InodeOff::new(ino ^ hash),
                kind: Kind::Dir,
                name: n,
            }).collect();
            for l in &listed {
                l.encode(&mut buf).unwrap();
            }
            prop_assert_eq!(buf.len(), listed.iter().map(Listed::encoded_len).sum::<usize>());
            let count = u32::try_from(listed.len()).unwrap();
            prop_assert_eq!(Listed::decode_all(&buf, count), Ok(listed.clone()));
            // Cut short, or a record more than there is, or an unknown kind.
            if !buf.is_empty() {
                let at = cut.index(buf.len());
                prop_assert_eq!(Listed::decode_all(&buf[..at], count), Err(Errno::EPROTO));
                let mut bad = buf.clone();
                bad[24] = 9;
                prop_assert_eq!(Listed::decode_all(&bad, count), Err(Errno::EPROTO));
            }
            prop_assert_eq!(Listed::decode_all(&buf, count + 1), Err(Errno::EPROTO));
        }

        #[test]
        fn garbage_listings_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..600), count in 0..20u32) {
            let _ = Listed::decode_all(&buf, count);
        }
    }

    #[test]
    fn a_grant_carries_its_runs_and_refuses_what_does_not_pack() {
        let runs = typed(&[(100, 5), (7, 1), ((1 << 40) - 1, (1 << 24) - 1), (0, 3)]);
        let g = Grant::new(&runs).unwrap();
        assert_eq!(g.first(), (PageNo::new(100), 5));
        assert_eq!(g.pages(), 5 + 1 + ((1 << 24) - 1) + 3);
        let back = Reply::decode(&Reply::encode(&Ok(Reply::Grant(g))), ReplyKind::Grant);
        assert_eq!(
            back.and_then(Reply::into_grant)
                .unwrap()
                .runs()
                .collect::<Vec<_>>(),
            runs
        );
        // One run, of any size: nothing packed.
        let one = Grant::new(&typed(&[(9, 1 << 50)])).unwrap();
        assert_eq!(one.runs().collect::<Vec<_>>(), typed(&[(9, 1 << 50)]));
        // Too many runs, none, an empty first, a page past 40 bits, a
        // count past 24 or 0.
        assert!(Grant::new(&typed(&[(1, 1); GRANT_RUNS + 2])).is_none());
        assert!(Grant::new(&typed(&[])).is_none());
        assert!(Grant::new(&typed(&[(1, 0)])).is_none());
        assert!(Grant::new(&typed(&[(1, 1), (1 << 40, 1)])).is_none());
        assert!(Grant::new(&typed(&[(1, 1), (2, 1 << 24)])).is_none());
        assert!(Grant::new(&typed(&[(1, 1), (2, 0)])).is_none());
        // On the wire: a run listed after an empty one, or an empty first.
        let mut b = Reply::encode(&Ok(Reply::Grant(
            Grant::new(&typed(&[(1, 1), (5, 2)])).unwrap(),
        )));
        b.copy_within(R_RUNS..R_RUNS + 8, R_RUNS + 8);
        b[R_RUNS..R_RUNS + 8].fill(0);
        assert_eq!(Reply::decode(&b, ReplyKind::Grant), Err(Errno::EPROTO));
        let mut b = Reply::encode(&Ok(Reply::Grant(one)));
        b[R_B..R_RUNS].fill(0);
        assert_eq!(Reply::decode(&b, ReplyKind::Grant), Err(Errno::EPROTO));
        // A packed run of no pages.
        let mut b = Reply::encode(&Ok(Reply::Grant(one)));
        b[R_RUNS] = 7;
        assert_eq!(Reply::decode(&b, ReplyKind::Grant), Err(Errno::EPROTO));
    }
}
