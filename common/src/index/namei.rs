//! Path resolution over the index, as Linux resolves paths: `.` and `..`,
//! repeated slashes, symlinks in the middle of a path (and at its end when
//! asked), at most [`MAX_SYMLINKS`] of them, and a trailing slash that
//! demands a directory. Paths are taken relative to the file system's root
//! whether or not they start with `/`.
//!
//! Ulib walks unchecked, for its own reads; Kfs walks as the caller of a
//! change or open (`resolve_as`, `resolve_parent_as`), checking what
//! Linux's `link_path_walk` checks: search permission on every directory
//! a component is looked up in (the parent of the last component too,
//! also for `.` and `..`), inside the targets of symlinks as well, and,
//! where symlinks are [`Protected`], the rule for following a symlink that
//! ends a path in a sticky directory ([`Creds::may_follow`]).

use super::layout::InodeOff;
use super::read::{IndexReader, Kind};
use super::{NAME_MAX, PATH_MAX};
use crate::access::{Creds, Protected, MAY_EXEC};
use crate::pm::Words;
use crate::Errno;

/// Symlinks one resolution may follow before failing with `ELOOP`.
pub const MAX_SYMLINKS: usize = 40;

/// The last component of a path, as a directory-changing operation sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Last<'p> {
    /// A name to look up in the parent.
    Name(&'p [u8]),
    /// `.`: the parent itself.
    Dot,
    /// `..`.
    DotDot,
    /// The path named the root itself (`/`).
    Root,
}

/// A path split into its resolved parent directory and its last component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent<'p> {
    /// The parent directory's inode.
    pub dir: InodeOff,
    /// The last component.
    pub last: Last<'p>,
    /// The path ended in `/`: the target must be (or become) a directory.
    pub trailing_slash: bool,
}

/// Splits a path into the part naming the parent directory, the last
/// component, and whether the path ended in `/`.
pub fn split_path(path: &[u8]) -> (&[u8], Last<'_>, bool) {
    let trimmed_len = path.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1);
    let trailing_slash = trimmed_len < path.len();
    let trimmed = &path[..trimmed_len];
    let (dir_part, last) = match trimmed.iter().rposition(|&b| b == b'/') {
        Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
        None => (&b""[..], trimmed),
    };
    let last = match last {
        b"" => Last::Root,
        b"." => Last::Dot,
        b".." => Last::DotDot,
        name => Last::Name(name),
    };
    (dir_part, last, trailing_slash)
}

fn components(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.split(|&b| b == b'/').filter(|c| !c.is_empty())
}

/// The checks a walk makes on its way. A type parameter, not a value, so
/// that the unchecked walk compiles to no checks at all.
trait Gate {
    /// May the walk look a name up in directory `dir`?
    fn search<W: Words + ?Sized>(&self, r: &IndexReader<'_, W>, dir: InodeOff)
        -> Result<(), Errno>;
    /// May it follow symlink `link`, which ends the path, found in `dir`?
    fn follow<W: Words + ?Sized>(
        &self,
        r: &IndexReader<'_, W>,
        dir: InodeOff,
        link: InodeOff,
    ) -> Result<(), Errno>;
}

/// No checks: Ulib's own reads.
struct Unchecked;

impl Gate for Unchecked {
    #[inline(always)]
    fn search<W: Words + ?Sized>(&self, _: &IndexReader<'_, W>, _: InodeOff) -> Result<(), Errno> {
        Ok(())
    }

    #[inline(always)]
    fn follow<W: Words + ?Sized>(
        &self,
        _: &IndexReader<'_, W>,
        _: InodeOff,
        _: InodeOff,
    ) -> Result<(), Errno> {
        Ok(())
    }
}

/// A walk for a caller.
struct AsCaller<'c> {
    creds: &'c Creds,
    protected: Protected,
}

impl Gate for AsCaller<'_> {
    fn search<W: Words + ?Sized>(
        &self,
        r: &IndexReader<'_, W>,
        dir: InodeOff,
    ) -> Result<(), Errno> {
        // Root searches every directory: no need to read its mode.
        if self.creds.is_root() {
            return Ok(());
        }
        self.creds.may(r.perm(dir).ok_or(Errno::EIO)?, MAY_EXEC)
    }

    fn follow<W: Words + ?Sized>(
        &self,
        r: &IndexReader<'_, W>,
        dir: InodeOff,
        link: InodeOff,
    ) -> Result<(), Errno> {
        if !self.protected.symlinks {
            return Ok(());
        }
        let (dir, link) = (r.perm(dir), r.perm(link));
        self.creds
            .may_follow(dir.ok_or(Errno::EIO)?, link.ok_or(Errno::EIO)?)
    }
}

impl<W: Words + ?Sized> IndexReader<'_, W> {
    /// Resolves `path` to an inode offset, following a final symlink if
    /// `follow` (a trailing slash always follows it).
    pub fn resolve(&self, path: &[u8], follow: bool) -> Result<InodeOff, Errno> {
        self.resolve_gated(&Unchecked, path, follow)
    }

    /// [`IndexReader::resolve`] as `creds` would: `EACCES` where they
    /// may not search a directory on the way, or follow a final symlink
    /// (where symlinks are `protected`).
    pub fn resolve_as(
        &self,
        path: &[u8],
        follow: bool,
        creds: &Creds,
        protected: Protected,
    ) -> Result<InodeOff, Errno> {
        self.resolve_gated(&AsCaller { creds, protected }, path, follow)
    }

    /// Resolves the name `name` in directory `dir` as `creds` would,
    /// following it if it is a symlink and `follow` (a relative target
    /// from `dir`), as `openat(dir, name)` does: the checks of
    /// [`IndexReader::resolve_as`] from `dir` on.
    pub fn resolve_in_as(
        &self,
        dir: InodeOff,
        name: &[u8],
        follow: bool,
        creds: &Creds,
        protected: Protected,
    ) -> Result<InodeOff, Errno> {
        let gate = AsCaller { creds, protected };
        let mut links = 0;
        self.walk(&gate, dir, name, follow, true, &mut links)
    }

    /// Resolves every component of `path` but the last, which it returns.
    pub fn resolve_parent<'p>(&self, path: &'p [u8]) -> Result<Parent<'p>, Errno> {
        self.resolve_parent_gated(&Unchecked, path)
    }

    /// [`IndexReader::resolve_parent`] as `creds` would: `EACCES` where
    /// they may not search a directory on the way, the parent included
    /// (where the last component is to be looked up) unless the path names
    /// the root.
    pub fn resolve_parent_as<'p>(
        &self,
        path: &'p [u8],
        creds: &Creds,
    ) -> Result<Parent<'p>, Errno> {
        // The last component is not walked: no symlink ends this walk.
        let gate = AsCaller {
            creds,
            protected: Protected::NONE,
        };
        self.resolve_parent_gated(&gate, path)
    }

    fn resolve_gated<G: Gate>(
        &self,
        gate: &G,
        path: &[u8],
        follow: bool,
    ) -> Result<InodeOff, Errno> {
        if path.is_empty() {
            return Err(Errno::ENOENT);
        }
        if path.len() >= PATH_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let mut links = 0;
        let trailing = path.ends_with(b"/");
        let inode = self.walk(
            gate,
            self.root(),
            path,
            follow || trailing,
            true,
            &mut links,
        )?;
        if trailing && self.kind(inode) != Some(Kind::Dir) {
            return Err(Errno::ENOTDIR);
        }
        Ok(inode)
    }

    fn resolve_parent_gated<'p, G: Gate>(
        &self,
        gate: &G,
        path: &'p [u8],
    ) -> Result<Parent<'p>, Errno> {
        if path.is_empty() {
            return Err(Errno::ENOENT);
        }
        if path.len() >= PATH_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let (dir_part, last, trailing_slash) = split_path(path);
        let root = self.root();
        let mut links = 0;
        let dir = self.walk(gate, root, dir_part, true, false, &mut links)?;
        if self.kind(dir) != Some(Kind::Dir) {
            return Err(Errno::ENOTDIR);
        }
        if last != Last::Root {
            gate.search(self, dir)?;
        }
        Ok(Parent {
            dir,
            last,
            trailing_slash,
        })
    }

    /// The addresses a change of `path` will need, as a client finds them
    /// (collaborative indexing): the parent directory, the node after which
    /// the last component is or would be linked, and its entry if it
    /// exists. `None` if the parent does not resolve or the last component
    /// is not a name.
    pub fn locate(&self, path: &[u8]) -> Option<crate::proto::Hint> {
        let p = self.resolve_parent(path).ok()?;
        let Last::Name(name) = p.last else {
            return None;
        };
        self.locate_in(p.dir, name)
    }

    /// [`IndexReader::locate`] for the name `name` in directory `dir`
    /// (a change addressed by node); `None` unless `dir` is a live
    /// directory's inode and `name` could be an entry's.
    pub fn locate_in(&self, dir: InodeOff, name: &[u8]) -> Option<crate::proto::Hint> {
        use super::layout::{header_gen, TAG_INODE};
        if !self.is_live(dir.get(), TAG_INODE, None) || self.kind(dir) != Some(Kind::Dir) {
            return None;
        }
        if name.is_empty() || name.len() > NAME_MAX {
            return None;
        }
        let s = self.search(dir, super::name_hash(name), name);
        Some(crate::proto::Hint {
            dir,
            dir_gen: header_gen(self.header(dir.get())),
            pred: s.pred,
            found: s.found,
            found_gen: if !s.found.is_null() {
                header_gen(self.header(s.found.get()))
            } else {
                0
            },
        })
    }

    /// Walks `path` from directory `start`, through `gate`. A symlink
    /// that ends the path is followed if `follow_last`; `trailing` says
    /// whether the path's end is the end of the whole resolution (the
    /// path itself, or the target of a symlink that ended it), which is
    /// where [`Gate::follow`] applies.
    fn walk<G: Gate>(
        &self,
        gate: &G,
        start: InodeOff,
        path: &[u8],
        follow_last: bool,
        trailing: bool,
        links: &mut usize,
    ) -> Result<InodeOff, Errno> {
        let mut cur = start;
        let mut comps = components(path).peekable();
        while let Some(c) = comps.next() {
            let is_last = comps.peek().is_none();
            if self.kind(cur) != Some(Kind::Dir) {
                return Err(Errno::ENOTDIR);
            }
            gate.search(self, cur)?;
            cur = match c {
                b"." => cur,
                b".." => self.parent(cur),
                name => {
                    if name.len() > NAME_MAX {
                        return Err(Errno::ENAMETOOLONG);
                    }
                    let dirent = self.lookup(cur, name);
                    if dirent.is_null() {
                        return Err(Errno::ENOENT);
                    }
                    let inode = self.dirent_inode(dirent);
                    if self.kind(inode) == Some(Kind::Symlink) && (!is_last || follow_last) {
                        *links += 1;
                        if *links > MAX_SYMLINKS {
                            return Err(Errno::ELOOP);
                        }
                        let ends = is_last && trailing;
                        if ends {
                            gate.follow(self, cur, inode)?;
                        }
                        let target = self.readlink(inode).ok_or(Errno::EIO)?;
                        if target.is_empty() {
                            return Err(Errno::ENOENT);
                        }
                        let base = if target.starts_with(b"/") {
                            self.root()
                        } else {
                            cur
                        };
                        let inode = self.walk(gate, base, &target, true, ends, links)?;
                        // A target ending in "/" names a directory or nothing.
                        if target.ends_with(b"/") && self.kind(inode) != Some(Kind::Dir) {
                            return Err(Errno::ENOTDIR);
                        }
                        inode
                    } else {
                        inode
                    }
                }
            };
            if cur.is_null() {
                return Err(Errno::EIO);
            }
        }
        Ok(cur)
    }
}
