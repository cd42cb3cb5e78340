//! An in-memory model of the POSIX namespace as Linux implements it, for
//! model-based tests: the same operation sequence is applied to this model
//! and to a real file system, and every result and errno must agree.
//!
//! `tests/model_vs_kernel.rs` checks the model against the kernel (tmpfs);
//! a KucoFS test can then trust it as the reference.
//!
//! Paths are strings relative to the model's root with `/` separators
//! ("a/b/c"). A leading `/` (only ever seen inside a symlink target; the
//! generator makes relative targets only) means the model's root, as it does
//! for a process chrooted there. The root has no name: `..` of the root is the
//! root, and the empty path is ENOENT as in the kernel.
//!
//! Lookup follows `fs/namei.c` step by step (`link_path_walk`,
//! `walk_component`, `pick_link`, `lookup_last`), because the errno a call
//! returns depends on where the walk stops, and that in turn depends on
//! details such as whether a `/` follows the last component inside a symlink
//! body.
//!
//! Permission checks are modelled for one caller in two roles: root (no
//! checks; [`Model::new`]) or a user who owns every inode
//! ([`Model::new_as_owner`]: the owner's permission bits decide, in the
//! order `fs/namei.c` checks them). Not modelled: file contents, times,
//! other owners and groups, directory sizes (tmpfs counts bytes per entry; `Stat::size`
//! is 0 for a directory and the real side must report 0 too), PATH_MAX and
//! the page-size limit on symlink targets (the generator stays far below
//! both), EMLINK, ENOSPC and RENAME_EXCHANGE.
//!
//! `op.rs` holds what a test shares with the model: `Op`, `Outcome`, the
//! tree listing and the generator (`ops()`).

#![allow(dead_code)]

mod op;

pub use op::*;

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use libc::{
    EACCES, EBUSY, EEXIST, EINVAL, EISDIR, ELOOP, ENAMETOOLONG, ENOENT, ENOTDIR, ENOTEMPTY, EPERM,
};

/// Read, write and search permission, as the owner's bits hold them.
const MAY_READ: u32 = 0o400;
const MAY_WRITE: u32 = 0o200;
const MAY_EXEC: u32 = 0o100;

/// Longest directory entry name, in bytes (NAME_MAX).
pub const NAME_MAX: usize = 255;
/// Symlinks one lookup may follow before ELOOP (MAXSYMLINKS).
pub const MAX_SYMLINKS: u32 = 40;
/// The umask new files and directories are created under; the real side
/// must set the same.
pub const UMASK: u32 = 0o022;
/// The permission bits `chmod` sets and `stat` reports.
pub const PERM_MASK: u32 = 0o7777;

type Ino = u64;
const ROOT: Ino = 1;

enum Body {
    Dir {
        entries: BTreeMap<String, Ino>,
        /// The root is its own parent.
        parent: Ino,
    },
    File,
    Symlink {
        target: String,
    },
}

struct Inode {
    body: Body,
    perm: u32,
    /// Names of the inode. A directory has one (its `nlink` as reported
    /// is derived from its subdirectories instead).
    links: u64,
}

/// The type of the last component a walk parsed (the kernel's `LAST_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LastType {
    Norm,
    Dot,
    DotDot,
    /// No component at all: the path was only slashes.
    Root,
}

/// How `walk_component` treats a symlink it steps on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    /// More components follow: always follow (`WALK_MORE`).
    More,
    /// The last component of a symlink body walked in the middle of a path:
    /// always follow.
    Nested,
    /// The final component of the lookup (`WALK_TRAILING`): follow only
    /// with `LOOKUP_FOLLOW`.
    Trailing,
}

/// Where a lookup stands, after the kernel's `struct nameidata`.
struct NameData {
    /// The inode reached: a directory, except after a trailing step that
    /// did not follow.
    pos: Ino,
    last: String,
    last_type: LastType,
    /// Whether a `/` follows `last` in the string it came from (the
    /// kernel's `last.name[last.len] != 0`): it turns on follow and
    /// must-be-a-directory for the final component.
    trailing_slash: bool,
    /// Symlinks followed so far (`total_link_count`).
    links: u32,
    /// `LOOKUP_FOLLOW`.
    follow: bool,
    /// `LOOKUP_DIRECTORY`.
    directory: bool,
}

/// The namespace: a tree of inodes under `ROOT`.
pub struct Model {
    inodes: HashMap<Ino, Inode>,
    next_ino: Ino,
    /// The caller is not root but owns every inode: permission checks
    /// apply, the owner's bits decide.
    as_owner: bool,
}

impl Default for Model {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.tree()).finish()
    }
}

impl Model {
    /// An empty root directory with permission bits 0o755.
    pub fn new() -> Self {
        let root = Inode {
            body: Body::Dir {
                entries: BTreeMap::new(),
                parent: ROOT,
            },
            perm: 0o755,
            links: 0,
        };
        Model {
            inodes: HashMap::from([(ROOT, root)]),
            next_ino: ROOT + 1,
            as_owner: false,
        }
    }

    /// [`Model::new`] for a caller that is not root and owns the root
    /// directory and everything it makes.
    pub fn new_as_owner() -> Self {
        Model {
            as_owner: true,
            ..Model::new()
        }
    }

    /// `inode_permission`: EACCES unless the caller may `want` (a mask of
    /// the owner's bits) on `ino`; root may anything asked here.
    fn may(&self, ino: Ino, want: u32) -> Result<(), Errno> {
        if self.as_owner && self.inode(ino).perm & want != want {
            return Err(EACCES);
        }
        Ok(())
    }

    pub fn apply(&mut self, op: &Op) -> Outcome {
        match op {
            Op::Create(path) => Outcome::from_unit(self.create(path)),
            Op::Mkdir(path) => Outcome::from_unit(self.mkdir(path)),
            Op::Unlink(path) => Outcome::from_unit(self.unlink(path)),
            Op::Rmdir(path) => Outcome::from_unit(self.rmdir(path)),
            Op::Rename {
                from,
                to,
                noreplace,
            } => Outcome::from_unit(self.rename(from, to, *noreplace)),
            Op::Link { existing, new } => Outcome::from_unit(self.link(existing, new)),
            Op::Symlink { target, link } => Outcome::from_unit(self.symlink(target, link)),
            Op::Readlink(path) => Outcome::from_result(self.readlink(path), Outcome::Target),
            Op::Stat(path) => Outcome::from_result(self.stat(path), Outcome::Stat),
            Op::Lstat(path) => Outcome::from_result(self.lstat(path), Outcome::Stat),
            Op::ReadDir(path) => Outcome::from_result(self.read_dir(path), Outcome::Entries),
            Op::Chmod { path, mode } => Outcome::from_unit(self.chmod(path, *mode)),
        }
    }

    // ---- operations -------------------------------------------------------

    /// `open(O_CREAT | O_EXCL)`. O_EXCL implies O_NOFOLLOW, so anything at
    /// the name, a dangling symlink included, is EEXIST.
    pub fn create(&mut self, path: &str) -> Result<(), Errno> {
        let nd = self.path_parent(path)?;
        // `open_last_lookups` checks "." and ".." before the trailing slash;
        // `do_open` then finds an existing inode it did not create.
        if nd.last_type != LastType::Norm {
            return Err(EEXIST);
        }
        if nd.trailing_slash {
            return Err(EISDIR);
        }
        self.expect_absent(nd.pos, &nd.last)?;
        self.may(nd.pos, MAY_WRITE | MAY_EXEC)?;
        self.add(nd.pos, nd.last, Body::File, 0o666 & !UMASK);
        Ok(())
    }

    pub fn mkdir(&mut self, path: &str) -> Result<(), Errno> {
        let (dir, name) = self.filename_create(path, true)?;
        self.may(dir, MAY_WRITE | MAY_EXEC)?;
        // A directory made in a set-group-ID directory inherits the bit.
        let perm = (0o777 & !UMASK) | (self.inode(dir).perm & libc::S_ISGID);
        let body = Body::Dir {
            entries: BTreeMap::new(),
            parent: dir,
        };
        self.add(dir, name, body, perm);
        Ok(())
    }

    pub fn unlink(&mut self, path: &str) -> Result<(), Errno> {
        let nd = self.path_parent(path)?;
        if nd.last_type != LastType::Norm {
            return Err(EISDIR);
        }
        let victim = self.lookup(nd.pos, &nd.last)?;
        let is_dir = self.kind(victim) == Kind::Dir;
        // The trailing slash is judged only once the name is known to exist.
        if nd.trailing_slash {
            return Err(if is_dir { EISDIR } else { ENOTDIR });
        }
        // `may_delete`: permission, then the kind.
        self.may(nd.pos, MAY_WRITE | MAY_EXEC)?;
        if is_dir {
            return Err(EISDIR);
        }
        self.remove(nd.pos, &nd.last);
        Ok(())
    }

    pub fn rmdir(&mut self, path: &str) -> Result<(), Errno> {
        let nd = self.path_parent(path)?;
        match nd.last_type {
            LastType::Norm => {}
            LastType::Dot => return Err(EINVAL),
            LastType::DotDot => return Err(ENOTEMPTY),
            LastType::Root => return Err(EBUSY),
        }
        let victim = self.lookup(nd.pos, &nd.last)?;
        self.may(nd.pos, MAY_WRITE | MAY_EXEC)?;
        // A final symlink is not followed, even with a trailing slash.
        if self.kind(victim) != Kind::Dir {
            return Err(ENOTDIR);
        }
        if !self.entries(victim).is_empty() {
            return Err(ENOTEMPTY);
        }
        self.remove(nd.pos, &nd.last);
        Ok(())
    }

    /// `renameat2`, checks in the order of `do_renameat2` and `vfs_rename`.
    pub fn rename(&mut self, from: &str, to: &str, noreplace: bool) -> Result<(), Errno> {
        let old = self.path_parent(from)?;
        let new = self.path_parent(to)?;
        if old.last_type != LastType::Norm {
            return Err(EBUSY);
        }
        if new.last_type != LastType::Norm {
            return Err(if noreplace { EEXIST } else { EBUSY });
        }
        let source = self.lookup(old.pos, &old.last)?;
        let target = match self.lookup(new.pos, &new.last) {
            Ok(target) => Some(target),
            Err(ENOENT) => None,
            Err(e) => return Err(e),
        };
        if noreplace && target.is_some() {
            return Err(EEXIST);
        }
        let source_is_dir = self.kind(source) == Kind::Dir;
        if !source_is_dir && (old.trailing_slash || new.trailing_slash) {
            return Err(ENOTDIR);
        }
        // `lock_rename` finds the "trap": the source may not be an ancestor
        // of the target's parent, and the target may not be an ancestor of
        // the source's parent. These come before the same-inode shortcut.
        if self.is_ancestor_or_self(source, new.pos) {
            return Err(EINVAL);
        }
        if target.is_some_and(|t| self.is_ancestor_or_self(t, old.pos)) {
            return Err(ENOTEMPTY);
        }
        // Two names of one inode (or one name twice): nothing happens.
        if target == Some(source) {
            return Ok(());
        }
        // `vfs_rename`: removing the source, then adding the new name or
        // removing the target (with its kind), then write permission on a
        // directory whose ".." changes, then the target's emptiness.
        self.may(old.pos, MAY_WRITE | MAY_EXEC)?;
        self.may(new.pos, MAY_WRITE | MAY_EXEC)?;
        if let Some(target) = target {
            match (source_is_dir, self.kind(target) == Kind::Dir) {
                (true, false) => return Err(ENOTDIR),
                (false, true) => return Err(EISDIR),
                _ => {}
            }
        }
        if source_is_dir && old.pos != new.pos {
            self.may(source, MAY_WRITE)?;
        }
        if let Some(target) = target {
            if source_is_dir && !self.entries(target).is_empty() {
                return Err(ENOTEMPTY);
            }
            self.remove(new.pos, &new.last);
        }
        self.entries_mut(old.pos).remove(&old.last);
        self.entries_mut(new.pos).insert(new.last, source);
        if let Body::Dir { parent, .. } = &mut self.inode_mut(source).body {
            *parent = new.pos;
        }
        Ok(())
    }

    /// `linkat(existing, new, 0)`.
    pub fn link(&mut self, existing: &str, new: &str) -> Result<(), Errno> {
        let inode = self.path_lookup(existing, false)?;
        let (dir, name) = self.filename_create(new, false)?;
        // The caller owns the source: protected hard links allow it.
        self.may(dir, MAY_WRITE | MAY_EXEC)?;
        if self.kind(inode) == Kind::Dir {
            return Err(EPERM);
        }
        self.inode_mut(inode).links += 1;
        self.entries_mut(dir).insert(name, inode);
        Ok(())
    }

    pub fn symlink(&mut self, target: &str, link: &str) -> Result<(), Errno> {
        // The target is copied in (and refused if empty) before the link
        // path is looked at.
        if target.is_empty() {
            return Err(ENOENT);
        }
        let (dir, name) = self.filename_create(link, false)?;
        self.may(dir, MAY_WRITE | MAY_EXEC)?;
        let body = Body::Symlink {
            target: target.to_owned(),
        };
        self.add(dir, name, body, 0o777);
        Ok(())
    }

    pub fn readlink(&self, path: &str) -> Result<String, Errno> {
        let inode = self.path_lookup(path, false)?;
        match &self.inode(inode).body {
            Body::Symlink { target } => Ok(target.clone()),
            _ => Err(EINVAL),
        }
    }

    pub fn stat(&self, path: &str) -> Result<Stat, Errno> {
        let inode = self.path_lookup(path, true)?;
        Ok(self.stat_of(inode))
    }

    pub fn lstat(&self, path: &str) -> Result<Stat, Errno> {
        let inode = self.path_lookup(path, false)?;
        Ok(self.stat_of(inode))
    }

    /// `opendir` + `readdir`: follows symlinks, then needs a directory.
    pub fn read_dir(&self, path: &str) -> Result<Vec<(String, Kind)>, Errno> {
        let dir = self.path_lookup(path, true)?;
        if self.kind(dir) != Kind::Dir {
            return Err(ENOTDIR);
        }
        self.may(dir, MAY_READ)?;
        let entries = self.entries(dir);
        Ok(entries
            .iter()
            .map(|(name, &ino)| (name.clone(), self.kind(ino)))
            .collect())
    }

    pub fn chmod(&mut self, path: &str, mode: u32) -> Result<(), Errno> {
        let inode = self.path_lookup(path, true)?;
        self.inode_mut(inode).perm = mode & PERM_MASK;
        Ok(())
    }

    /// Every name under the root, depth first, in canonical form.
    pub fn tree(&self) -> Vec<TreeEntry> {
        let mut raw = Vec::new();
        let mut pending = vec![(ROOT, String::new())];
        while let Some((dir, prefix)) = pending.pop() {
            for (name, &ino) in self.entries(dir) {
                let path = format!("{prefix}{name}");
                let stat = self.stat_of(ino);
                let target = match &self.inode(ino).body {
                    Body::Symlink { target } => Some(target.clone()),
                    _ => None,
                };
                if stat.kind == Kind::Dir {
                    pending.push((ino, format!("{path}/")));
                }
                let entry = TreeEntry {
                    path,
                    kind: stat.kind,
                    perm: stat.perm,
                    nlink: stat.nlink,
                    target,
                    first_link: None,
                };
                raw.push((ino, entry));
            }
        }
        canonical_tree(raw)
    }

    // ---- path lookup (fs/namei.c) -----------------------------------------

    /// `path_init`: every walk starts at the root, which is also the
    /// current directory. The empty path is refused when it is copied in.
    fn path_init(path: &str, follow: bool) -> Result<NameData, Errno> {
        if path.is_empty() {
            return Err(ENOENT);
        }
        Ok(NameData {
            pos: ROOT,
            last: String::new(),
            last_type: LastType::Root,
            trailing_slash: false,
            links: 0,
            follow,
            directory: false,
        })
    }

    /// `path_parentat`: walks all but the last component, which is left in
    /// `last` unlooked-up, with `pos` its directory.
    fn path_parent(&self, path: &str) -> Result<NameData, Errno> {
        let mut nd = Self::path_init(path, false)?;
        self.link_path_walk(&mut nd, path)?;
        Ok(nd)
    }

    /// `path_lookupat`: resolves the whole path; the final symlink is
    /// followed if `follow` or if a slash follows it.
    fn path_lookup(&self, path: &str, follow: bool) -> Result<Ino, Errno> {
        let mut nd = Self::path_init(path, follow)?;
        let mut rest = path.to_owned();
        loop {
            self.link_path_walk(&mut nd, &rest)?;
            // `lookup_last`
            if nd.last_type == LastType::Norm && nd.trailing_slash {
                nd.follow = true;
                nd.directory = true;
            }
            match self.walk_component(&mut nd, Step::Trailing)? {
                Some(body) => rest = body,
                None => break,
            }
        }
        if nd.directory && self.kind(nd.pos) != Kind::Dir {
            return Err(ENOTDIR);
        }
        Ok(nd.pos)
    }

    /// `link_path_walk`: walks every component but the last of `path`,
    /// following symlinks met on the way (their bodies are walked in full,
    /// last component included, before the rest of the path).
    fn link_path_walk(&self, nd: &mut NameData, path: &str) -> Result<(), Errno> {
        // What is left of each outer string while a symlink body is walked.
        let mut stack: Vec<String> = Vec::new();
        let mut name = path.trim_start_matches('/').to_owned();
        if name.is_empty() {
            return Ok(());
        }
        loop {
            // `may_lookup`: search permission on the directory each
            // component is looked up in, "." and ".." too.
            self.may(nd.pos, MAY_EXEC)?;
            let (component, after) = match name.split_once('/') {
                Some((component, after)) => (component, Some(after)),
                None => (name.as_str(), None),
            };
            nd.last_type = match component {
                "." => LastType::Dot,
                ".." => LastType::DotDot,
                _ => LastType::Norm,
            };
            nd.last = component.to_owned();
            nd.trailing_slash = after.is_some();
            let rest = after.unwrap_or("").trim_start_matches('/').to_owned();

            let link = if !rest.is_empty() {
                name = rest;
                self.walk_component(nd, Step::More)?
            } else if let Some(outer) = stack.pop() {
                // The body of a symlink is done: its last component is
                // walked like any other, and the outer path resumes.
                name = outer;
                self.walk_component(nd, Step::Nested)?
            } else {
                return Ok(());
            };
            if let Some(body) = link {
                stack.push(std::mem::replace(&mut name, body));
                continue;
            }
            if self.kind(nd.pos) != Kind::Dir {
                return Err(ENOTDIR);
            }
        }
    }

    /// `walk_component` + `step_into` + `pick_link`: steps onto `nd.last`
    /// from the directory `nd.pos`. Returns a symlink body to walk next,
    /// with a leading `/` already turned into a jump to the root.
    fn walk_component(&self, nd: &mut NameData, step: Step) -> Result<Option<String>, Errno> {
        match nd.last_type {
            LastType::Norm => {}
            LastType::DotDot => {
                nd.pos = self.parent(nd.pos);
                return Ok(None);
            }
            LastType::Dot | LastType::Root => return Ok(None),
        }
        let child = self.lookup(nd.pos, &nd.last)?;
        let follow = step != Step::Trailing || nd.follow;
        match &self.inode(child).body {
            Body::Symlink { target } if follow => {
                if nd.links >= MAX_SYMLINKS {
                    return Err(ELOOP);
                }
                nd.links += 1;
                // A relative body resolves from the symlink's directory,
                // which `nd.pos` still is.
                let body = target.trim_start_matches('/');
                if body.len() != target.len() {
                    nd.pos = ROOT;
                }
                Ok((!body.is_empty()).then(|| body.to_owned()))
            }
            _ => {
                nd.pos = child;
                Ok(None)
            }
        }
    }

    /// A directory lookup. A name over NAME_MAX can never exist; tmpfs
    /// refuses it in `->lookup`, so it is ENAMETOOLONG wherever a lookup
    /// happens, and only there.
    fn lookup(&self, dir: Ino, name: &str) -> Result<Ino, Errno> {
        if name.len() > NAME_MAX {
            return Err(ENAMETOOLONG);
        }
        self.entries(dir).get(name).copied().ok_or(ENOENT)
    }

    fn expect_absent(&self, dir: Ino, name: &str) -> Result<(), Errno> {
        match self.lookup(dir, name) {
            Ok(_) => Err(EEXIST),
            Err(ENOENT) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `filename_create`: the parent and the new name for mkdir, symlink
    /// and link. Only mkdir (`want_dir`) accepts a trailing slash.
    fn filename_create(&self, path: &str, want_dir: bool) -> Result<(Ino, String), Errno> {
        let nd = self.path_parent(path)?;
        if nd.last_type != LastType::Norm {
            return Err(EEXIST);
        }
        self.expect_absent(nd.pos, &nd.last)?;
        if nd.trailing_slash && !want_dir {
            return Err(ENOENT);
        }
        Ok((nd.pos, nd.last))
    }

    // ---- the inode table --------------------------------------------------

    fn inode(&self, ino: Ino) -> &Inode {
        &self.inodes[&ino]
    }

    fn inode_mut(&mut self, ino: Ino) -> &mut Inode {
        self.inodes.get_mut(&ino).expect("live inode")
    }

    fn kind(&self, ino: Ino) -> Kind {
        match self.inode(ino).body {
            Body::Dir { .. } => Kind::Dir,
            Body::File => Kind::File,
            Body::Symlink { .. } => Kind::Symlink,
        }
    }

    fn entries(&self, dir: Ino) -> &BTreeMap<String, Ino> {
        match &self.inode(dir).body {
            Body::Dir { entries, .. } => entries,
            _ => panic!("inode {dir} is not a directory"),
        }
    }

    fn entries_mut(&mut self, dir: Ino) -> &mut BTreeMap<String, Ino> {
        match &mut self.inode_mut(dir).body {
            Body::Dir { entries, .. } => entries,
            _ => panic!("inode {dir} is not a directory"),
        }
    }

    fn parent(&self, dir: Ino) -> Ino {
        match self.inode(dir).body {
            Body::Dir { parent, .. } => parent,
            _ => panic!("inode {dir} is not a directory"),
        }
    }

    /// Whether `ancestor` is `ino` or one of the directories above it.
    fn is_ancestor_or_self(&self, ancestor: Ino, mut ino: Ino) -> bool {
        loop {
            if ino == ancestor {
                return true;
            }
            if ino == ROOT || self.kind(ino) != Kind::Dir {
                return false;
            }
            ino = self.parent(ino);
        }
    }

    fn stat_of(&self, ino: Ino) -> Stat {
        let inode = self.inode(ino);
        let (nlink, size) = match &inode.body {
            Body::Dir { entries, .. } => {
                let subdirs = entries
                    .values()
                    .filter(|&&child| self.kind(child) == Kind::Dir)
                    .count();
                (2 + subdirs as u64, 0)
            }
            Body::File => (inode.links, 0),
            Body::Symlink { target } => (inode.links, target.len() as u64),
        };
        Stat {
            kind: self.kind(ino),
            perm: inode.perm,
            nlink,
            size,
        }
    }

    fn add(&mut self, dir: Ino, name: String, body: Body, perm: u32) {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.inodes.insert(
            ino,
            Inode {
                body,
                perm,
                links: 1,
            },
        );
        self.entries_mut(dir).insert(name, ino);
    }

    /// Removes a name; the inode goes with its last name (directories have
    /// only one, and are empty by now).
    fn remove(&mut self, dir: Ino, name: &str) {
        let ino = self.entries_mut(dir).remove(name).expect("name to remove");
        let inode = self.inode_mut(ino);
        inode.links -= 1;
        if inode.links == 0 {
            self.inodes.remove(&ino);
        }
    }
}
