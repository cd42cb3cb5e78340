//! Path resolution as a caller may do it: [`Namespace::resolve_as`]
//! resolves a path as the index reader does (`.`, `..`, symlinks, a
//! trailing slash) and refuses with `EACCES` a path through a directory
//! the caller may not search (POSIX: search permission on every directory
//! a component is looked up in, ARCHITECTURE.md §2).

use kucofs_common::access::MAY_EXEC;
use kucofs_common::index::{IndexReader, InodeOff, Kind, MAX_SYMLINKS, NAME_MAX, PATH_MAX};
use kucofs_common::pm::Shm;
use kucofs_common::proto::Creds;
use kucofs_common::Errno;

use super::Namespace;

impl Namespace {
    /// Resolves `path` from the root as `creds` may: following a final
    /// symlink if `follow` (a trailing slash always follows it), with
    /// search permission checked on every directory a component is
    /// looked up in.
    pub fn resolve_as(&self, path: &[u8], follow: bool, creds: &Creds) -> Result<InodeOff, Errno> {
        if path.is_empty() {
            return Err(Errno::ENOENT);
        }
        if path.len() >= PATH_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let r = self.reader();
        let trailing = path.ends_with(b"/");
        let mut links = 0;
        let inode = walk(&r, creds, r.root(), path, follow || trailing, &mut links)?;
        if trailing && r.kind(inode) != Some(Kind::Dir) {
            return Err(Errno::ENOTDIR);
        }
        Ok(inode)
    }
}

/// Whether `creds` may search directory `dir`.
pub(crate) fn may_search(r: &IndexReader<'_, Shm>, creds: &Creds, dir: InodeOff) -> bool {
    r.attr(dir)
        .is_some_and(|a| creds.permits(a.mode, a.uid, a.gid, MAY_EXEC))
}

/// Walks `path` from directory `start` (as `IndexReader::resolve` does),
/// checking search permission before each lookup.
fn walk(
    r: &IndexReader<'_, Shm>,
    creds: &Creds,
    start: InodeOff,
    path: &[u8],
    follow_last: bool,
    links: &mut usize,
) -> Result<InodeOff, Errno> {
    let mut cur = start;
    let mut comps = path
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty())
        .peekable();
    while let Some(c) = comps.next() {
        let is_last = comps.peek().is_none();
        if r.kind(cur) != Some(Kind::Dir) {
            return Err(Errno::ENOTDIR);
        }
        if !may_search(r, creds, cur) {
            return Err(Errno::EACCES);
        }
        cur = match c {
            b"." => cur,
            b".." => r.parent(cur),
            name => {
                if name.len() > NAME_MAX {
                    return Err(Errno::ENAMETOOLONG);
                }
                let dirent = r.lookup(cur, name);
                if dirent.is_null() {
                    return Err(Errno::ENOENT);
                }
                let inode = r.dirent_inode(dirent);
                if r.kind(inode) == Some(Kind::Symlink) && (!is_last || follow_last) {
                    *links += 1;
                    if *links > MAX_SYMLINKS {
                        return Err(Errno::ELOOP);
                    }
                    let target = r.readlink(inode).ok_or(Errno::EIO)?;
                    if target.is_empty() {
                        return Err(Errno::ENOENT);
                    }
                    let base = if target.starts_with(b"/") {
                        r.root()
                    } else {
                        cur
                    };
                    let inode = walk(r, creds, base, &target, true, links)?;
                    if target.ends_with(b"/") && r.kind(inode) != Some(Kind::Dir) {
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

#[cfg(test)]
mod tests {
    use kucofs_common::proto::{Request, SetAttrs};

    use super::*;

    #[test]
    fn a_directory_the_caller_may_not_search_refuses_the_path_through_it() {
        let mut ns = Namespace::new(Creds::default(), 1).unwrap();
        let root = Creds::default();
        let make = |ns: &mut Namespace, path: &[u8], mode: u32| {
            ns.execute(
                &Request::Create {
                    path,
                    mode,
                    target: b"",
                    hint: None,
                },
                root,
            )
            .unwrap();
        };
        make(&mut ns, b"/d", libc::S_IFDIR | 0o700);
        make(&mut ns, b"/d/f", libc::S_IFREG | 0o644);
        make(&mut ns, b"/open", libc::S_IFDIR | 0o755);
        ns.execute(
            &Request::Create {
                path: b"/open/link",
                mode: libc::S_IFLNK | 0o777,
                target: b"/d/f",
                hint: None,
            },
            root,
        )
        .unwrap();
        let user = Creds::new(1000, 1000);
        assert_eq!(ns.resolve_as(b"/d/f", true, &user), Err(Errno::EACCES));
        // The directory itself resolves: only its parent is searched.
        assert!(ns.resolve_as(b"/d", true, &user).is_ok());
        // Through a symlink, the target's directories are searched too.
        assert_eq!(
            ns.resolve_as(b"/open/link", true, &user),
            Err(Errno::EACCES)
        );
        assert!(ns.resolve_as(b"/open/link", false, &user).is_ok());
        // Root, and the owner once it is the owner, may.
        assert_eq!(
            ns.resolve_as(b"/d/f", true, &root),
            ns.reader().resolve(b"/d/f", true)
        );
        ns.execute(
            &Request::SetAttr {
                path: b"/d",
                follow: true,
                attrs: SetAttrs {
                    uid: Some(1000),
                    ..SetAttrs::default()
                },
            },
            root,
        )
        .unwrap();
        assert_eq!(
            ns.resolve_as(b"/d/f", true, &user),
            ns.reader().resolve(b"/d/f", true)
        );
        // What resolution refuses anyway stays refused.
        assert_eq!(ns.resolve_as(b"", true, &user), Err(Errno::ENOENT));
        assert_eq!(ns.resolve_as(b"/d/f/", true, &user), Err(Errno::ENOTDIR));
    }
}
