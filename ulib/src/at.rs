//! Changes and opens by node (ARCHITECTURE.md §6, "addressed by node"):
//! what a FUSE adapter needs, whose operations name a directory's inode
//! and a name, or an inode, never a path. Each method is the node form of
//! a path method of [`Fs`] or [`OpenOptions`] and meets the same checks in
//! Kfs; a [`Node`] names an inode by number, offset and generation, and
//! one that is gone or was reused is refused with `ESTALE` in every mode
//! (embedded, trusted and isolated daemon clients alike). Kfs lets a
//! caller name a directory it could reach by path (it may search every
//! directory above it) and a non-directory only while it has it open,
//! unless it is root. Modes are used as given: a FUSE adapter receives
//! them with the caller's umask applied already. Queued changes of an
//! entry carry the addresses Ulib finds in the directory's index
//! (collaborative indexing), as path changes do.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use kucofs_common::index::layout::TAG_INODE;
use kucofs_common::proto::{At, Entry, Hint, Node, OpenAt, Reply, Request, SetAttrs};
use kucofs_common::Errno;

use crate::file::{File, OpenOptions};
use crate::fs::{err, times, Fs, SetTime};
use crate::metadata::Metadata;

/// Attributes [`Fs::set_attrs_of`] changes, each left as it is by
/// default: what a FUSE `setattr` asks for, its size apart (which takes
/// an open file, [`File::set_len`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewAttrs {
    /// Permission bits (`chmod`).
    pub mode: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// Access time.
    pub accessed: SetTime,
    /// Modification time.
    pub modified: SetTime,
}

impl Default for NewAttrs {
    fn default() -> NewAttrs {
        NewAttrs {
            mode: None,
            uid: None,
            gid: None,
            accessed: SetTime::Omit,
            modified: SetTime::Omit,
        }
    }
}

impl Metadata {
    /// The node this metadata was read from: how the `_at` and `_of`
    /// methods of [`Fs`] name it.
    pub fn node(&self) -> Node {
        Node {
            ino: self.0.ino,
            inode: self.0.offset,
            gen: self.0.gen,
        }
    }
}

fn entry<'a>(dir: Node, name: &'a OsStr) -> Entry<'a> {
    Entry::In {
        dir,
        name: name.as_bytes(),
    }
}

impl Fs {
    /// Sends a change by node from this thread's slot (no hint: Kfs
    /// searches the directory itself).
    fn change_by_node(&self, req: &Request<'_>) -> io::Result<Reply> {
        self.inner().call_here(req)
    }

    /// Sends a change of the entry `name` in `dir`: applied directly, or
    /// else queued with the addresses found in `dir` if collaborative
    /// indexing is on (as [`Fs::change`] does for a path).
    fn change_in<'p>(
        &self,
        dir: Node,
        name: &[u8],
        make: impl Fn(Option<Hint>) -> Request<'p>,
    ) -> io::Result<Reply> {
        let inner = self.inner();
        let slot = inner.slot()?;
        if let Some(r) = inner.conn.try_direct(slot, &make(None)) {
            return r;
        }
        let hint = if inner.config.collaborative && !inner.isolated() {
            inner.with_index(|r| r.locate_in(dir.inode, name))?
        } else {
            None
        };
        inner.conn.queue(slot, &make(hint))
    }

    fn create_at(&self, dir: Node, name: &OsStr, mode: u32, target: &[u8]) -> io::Result<Node> {
        self.change_in(dir, name.as_bytes(), |hint| Request::Create {
            at: entry(dir, name),
            mode,
            target,
            hint,
        })?
        .into_node()
        .map_err(err)
    }

    /// The metadata of `node` (FUSE `getattr`).
    pub fn metadata_of(&self, node: Node) -> io::Result<Metadata> {
        let inner = self.inner();
        if inner.isolated() {
            return inner.stat_of(At::Node(node)).map(Metadata);
        }
        inner
            .with_index(|r| {
                let live = r.is_live(node.inode.get(), TAG_INODE, Some(node.gen))
                    && r.ino(node.inode) == node.ino;
                if !live {
                    return Err(Errno::ESTALE);
                }
                r.attr(node.inode).ok_or(Errno::ESTALE)
            })?
            .map(Metadata)
            .map_err(err)
    }

    /// The metadata of the entry `name` in directory `dir` (FUSE
    /// `lookup`), not following a symlink.
    pub fn lookup_at(&self, dir: Node, name: impl AsRef<OsStr>) -> io::Result<Metadata> {
        let name = name.as_ref().as_bytes();
        let inner = self.inner();
        if inner.isolated() {
            return inner
                .call_here(&Request::Lookup { dir, name })?
                .into_attr()
                .map(Metadata)
                .map_err(err);
        }
        inner
            .with_index(|r| {
                let live = r.is_live(dir.inode.get(), TAG_INODE, Some(dir.gen))
                    && r.ino(dir.inode) == dir.ino;
                if !live {
                    return Err(Errno::ESTALE);
                }
                kucofs_common::index::check_name(name)?;
                let e = r.lookup(dir.inode, name);
                if e.is_null() {
                    return Err(Errno::ENOENT);
                }
                r.attr(r.dirent_inode(e)).ok_or(Errno::ENOENT)
            })?
            .map(Metadata)
            .map_err(err)
    }

    /// Creates the empty regular file `name` in `dir` with permission
    /// bits `mode` (FUSE `mknod` of a regular file): [`Fs::create_file`]
    /// by node.
    pub fn create_file_at(
        &self,
        dir: Node,
        name: impl AsRef<OsStr>,
        mode: u32,
    ) -> io::Result<Node> {
        self.create_at(dir, name.as_ref(), libc::S_IFREG | (mode & 0o7777), b"")
    }

    /// Creates the directory `name` in `dir` (FUSE `mkdir`):
    /// [`Fs::create_dir`] by node.
    pub fn create_dir_at(&self, dir: Node, name: impl AsRef<OsStr>, mode: u32) -> io::Result<Node> {
        self.create_at(dir, name.as_ref(), libc::S_IFDIR | (mode & 0o7777), b"")
    }

    /// Creates the symlink `name` in `dir` pointing at `target` (FUSE
    /// `symlink`): [`Fs::symlink`] by node.
    pub fn symlink_at(
        &self,
        target: impl AsRef<Path>,
        dir: Node,
        name: impl AsRef<OsStr>,
    ) -> io::Result<Node> {
        let target = target.as_ref().as_os_str().as_bytes();
        self.create_at(dir, name.as_ref(), libc::S_IFLNK | 0o777, target)
    }

    /// Makes `name` in `dir` a new name for `node` (FUSE `link`):
    /// [`Fs::hard_link`] by node.
    pub fn hard_link_at(&self, node: Node, dir: Node, name: impl AsRef<OsStr>) -> io::Result<Node> {
        let name = name.as_ref();
        self.change_in(dir, name.as_bytes(), |hint| Request::Link {
            from: At::Node(node),
            to: entry(dir, name),
            hint,
        })?
        .into_node()
        .map_err(err)
    }

    fn unlink_at(&self, dir: Node, name: &OsStr, rmdir: bool) -> io::Result<()> {
        self.change_in(dir, name.as_bytes(), |hint| Request::Unlink {
            at: entry(dir, name),
            rmdir,
            hint,
        })
        .map(drop)
    }

    /// Removes the non-directory `name` from `dir` (FUSE `unlink`):
    /// [`Fs::remove_file`] by node.
    pub fn remove_file_at(&self, dir: Node, name: impl AsRef<OsStr>) -> io::Result<()> {
        self.unlink_at(dir, name.as_ref(), false)
    }

    /// Removes the empty directory `name` from `dir` (FUSE `rmdir`):
    /// [`Fs::remove_dir`] by node.
    pub fn remove_dir_at(&self, dir: Node, name: impl AsRef<OsStr>) -> io::Result<()> {
        self.unlink_at(dir, name.as_ref(), true)
    }

    /// Renames `name` in `dir` to `new_name` in `new_dir` (FUSE
    /// `rename`), replacing what is there unless `noreplace`
    /// (`RENAME_NOREPLACE`: then `EEXIST`): [`Fs::rename`] and
    /// [`Fs::rename_noreplace`] by node.
    pub fn rename_at(
        &self,
        dir: Node,
        name: impl AsRef<OsStr>,
        new_dir: Node,
        new_name: impl AsRef<OsStr>,
        noreplace: bool,
    ) -> io::Result<()> {
        let (name, new_name) = (name.as_ref(), new_name.as_ref());
        let make = |hint_from, hint_to| Request::Rename {
            from: entry(dir, name),
            to: entry(new_dir, new_name),
            noreplace,
            hint_from,
            hint_to,
        };
        let inner = self.inner();
        let slot = inner.slot()?;
        if let Some(r) = inner.conn.try_direct(slot, &make(None, None)) {
            return r.map(drop);
        }
        let (from, to) = if inner.config.collaborative && !inner.isolated() {
            inner.with_index(|r| {
                (
                    r.locate_in(dir.inode, name.as_bytes()),
                    r.locate_in(new_dir.inode, new_name.as_bytes()),
                )
            })?
        } else {
            (None, None)
        };
        inner.conn.queue(slot, &make(from, to)).map(drop)
    }

    /// Changes the attributes of `node` as `attrs` says (FUSE `setattr`
    /// but its size), with the rules of [`Fs::set_permissions`],
    /// [`Fs::chown`] and [`Fs::utimens`]; one request, so nothing at all
    /// changes if any part is refused. Changing nothing does nothing.
    pub fn set_attrs_of(&self, node: Node, attrs: &NewAttrs) -> io::Result<()> {
        let (times, now) = times(attrs.accessed, attrs.modified)?;
        let set = SetAttrs {
            mode: attrs.mode,
            uid: attrs.uid,
            gid: attrs.gid,
            ..times
        };
        if set == SetAttrs::default() && now == Default::default() {
            return Ok(());
        }
        self.change_by_node(&Request::SetAttr {
            at: At::Node(node),
            attrs: set,
            now,
        })
        .map(drop)
    }
}

impl OpenOptions {
    /// Opens the entry `name` in `dir` with these options, creating it if
    /// they ask with their [`mode`](OpenOptions::mode) as given (FUSE
    /// `create`): [`OpenOptions::open`] by node.
    pub fn open_at(&self, fs: &Fs, dir: Node, name: impl AsRef<OsStr>) -> io::Result<File> {
        let name = name.as_ref();
        let at = OpenAt::Entry(entry(dir, name));
        let mode = self.mode_bits();
        self.open_as(fs, |flags| {
            fs.change_in(dir, name.as_bytes(), |hint| Request::Open {
                at,
                flags,
                mode,
                hint,
            })
        })
    }

    /// Opens `node` with these options (FUSE `open`); creating makes no
    /// sense here, and truncating works as by path. The caller must be
    /// root or have the file open already (a directory: be able to reach
    /// it), as the module says.
    pub fn open_node(&self, fs: &Fs, node: Node) -> io::Result<File> {
        self.open_as(fs, |flags| {
            fs.inner().call_here(&Request::Open {
                at: OpenAt::Node(node),
                flags,
                mode: 0,
                hint: None,
            })
        })
    }
}

#[cfg(all(test, feature = "embedded"))]
mod tests {
    use super::*;
    use crate::fs::Config;

    fn code(e: io::Error) -> Option<i32> {
        e.raw_os_error()
    }

    /// The node forms in embedded mode, applied directly and queued with
    /// the hints Ulib finds in the directory a node names: each leaves
    /// what its path form would, and a node that is gone is `ESTALE`.
    #[test]
    fn changes_by_node_in_embedded_mode_direct_and_queued() {
        for direct in [true, false] {
            let dir = tempfile::Builder::new()
                .prefix("kucofs-at-")
                .tempdir_in("/dev/shm")
                .unwrap();
            let image = dir.path().join("fs.img");
            Fs::create(&image, 64 << 20).unwrap().close().unwrap();
            let config = Config {
                direct,
                collaborative: true,
                ..Config::default()
            };
            let fs = Fs::open_with(&image, config).unwrap();
            let root = fs.metadata("/").unwrap().node();
            let d = fs.create_dir_at(root, "d", 0o750).unwrap();
            let m = fs.metadata("d").unwrap();
            assert_eq!((m.node(), m.permissions().mode() & 0o7777), (d, 0o750));
            let f = fs.create_file_at(d, "f", 0o640).unwrap();
            assert_eq!(fs.lookup_at(d, "f").unwrap().node(), f);
            // The hint a queued change by node carries: the entry found
            // in the directory; none for a node that is no directory.
            let locate = |n: Node| fs.inner().with_index(|r| r.locate_in(n.inode, b"f"));
            let hint = locate(d).unwrap().unwrap();
            assert_eq!((hint.dir, hint.dir_gen), (d.inode, d.gen));
            assert!(!hint.found.is_null());
            assert_eq!(locate(f).unwrap(), None);
            let again = fs.create_file_at(d, "f", 0o640).unwrap_err();
            assert_eq!(code(again), Some(libc::EEXIST));
            fs.hard_link_at(f, root, "g").unwrap();
            fs.rename_at(root, "g", d, "h", false).unwrap();
            assert_eq!(fs.metadata("d/h").unwrap().node(), f);
            assert_eq!(fs.metadata_of(f).unwrap().nlink(), 2);
            let attrs = NewAttrs {
                mode: Some(0o600),
                accessed: SetTime::Now,
                modified: SetTime::Now,
                ..NewAttrs::default()
            };
            fs.set_attrs_of(f, &attrs).unwrap();
            assert_eq!(
                fs.metadata("d/f").unwrap().permissions().mode() & 0o7777,
                0o600
            );
            let mut file = OpenOptions::new()
                .write(true)
                .create(true)
                .mode(0o644)
                .open_at(&fs, d, "o")
                .unwrap();
            io::Write::write_all(&mut file, b"by node").unwrap();
            drop(file);
            assert_eq!(fs.metadata("d/o").unwrap().len(), 7);
            fs.remove_file_at(d, "f").unwrap();
            fs.remove_file_at(d, "h").unwrap();
            let gone = fs.remove_file_at(d, "h").unwrap_err();
            assert_eq!(code(gone), Some(libc::ENOENT));
            fs.remove_file_at(d, "o").unwrap();
            fs.remove_dir_at(root, "d").unwrap();
            assert!(!fs.exists("d"));
            for r in [
                fs.create_file_at(d, "x", 0o644).map(drop),
                fs.metadata_of(f).map(drop),
                fs.set_attrs_of(f, &attrs),
                OpenOptions::new().read(true).open_node(&fs, f).map(drop),
            ] {
                assert_eq!(r.map_err(code), Err(Some(libc::ESTALE)), "direct {direct}");
            }
            fs.close().unwrap();
        }
    }
}
