//! Who asks and what they may do: a caller's credentials and the POSIX
//! permission rule Kfs checks every change and open against
//! (ARCHITECTURE.md §2).

use crate::Errno;

/// The most supplementary groups a caller's credentials carry. A process
/// in more groups is refused at attach rather than checked against only
/// some of them.
pub const GROUPS_MAX: usize = 32;

/// Read permission (the `r` bit of a class).
pub const MAY_READ: u32 = 4;
/// Write permission (`w`).
pub const MAY_WRITE: u32 = 2;
/// Execute permission (`x`; search, for a directory).
pub const MAY_EXEC: u32 = 1;

/// Who asks: the effective user and group and the supplementary groups a
/// change or open is checked and made with. `Copy`, so that a request
/// carries it by value: the groups live inline.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Creds {
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
    groups: [u32; GROUPS_MAX],
    ngroups: u8,
}

impl Default for Creds {
    /// Root, in no supplementary group.
    fn default() -> Creds {
        Creds::new(0, 0)
    }
}

impl std::fmt::Debug for Creds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Creds")
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .field("groups", &self.groups())
            .finish()
    }
}

impl Creds {
    /// A user and group in no supplementary group.
    pub const fn new(uid: u32, gid: u32) -> Creds {
        Creds {
            uid,
            gid,
            groups: [0; GROUPS_MAX],
            ngroups: 0,
        }
    }

    /// A user and group with supplementary `groups`; `None` if there are
    /// more than [`GROUPS_MAX`].
    pub fn with_groups(uid: u32, gid: u32, groups: &[u32]) -> Option<Creds> {
        let mut c = Creds::new(uid, gid);
        c.groups.get_mut(..groups.len())?.copy_from_slice(groups);
        c.ngroups = u8::try_from(groups.len()).ok()?;
        Some(c)
    }

    /// This process's effective user and group and its supplementary
    /// groups (the first [`GROUPS_MAX`] of them if it has more).
    pub fn current() -> Creds {
        let uid = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        let groups: Vec<u32> = rustix::process::getgroups()
            .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_default();
        let n = groups.len().min(GROUPS_MAX);
        Creds::with_groups(uid, gid, &groups[..n]).unwrap_or(Creds::new(uid, gid))
    }

    /// The supplementary groups.
    pub fn groups(&self) -> &[u32] {
        &self.groups[..usize::from(self.ngroups)]
    }

    /// Whether these credentials are the superuser's.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether the caller is in group `gid` (its effective group or a
    /// supplementary one).
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups().contains(&gid)
    }

    /// Whether a file with permission bits `mode` (type bits ignored),
    /// owned by `uid`:`gid`, grants every access in `want` (a mask of
    /// [`MAY_READ`], [`MAY_WRITE`], [`MAY_EXEC`]) to these credentials.
    ///
    /// As Linux decides it: the owner's class if the caller owns the
    /// file, else the group's if it is in the file's group, else the
    /// others'; exactly one class applies. Root may read and write
    /// anything, and execute (search) a directory, or a file that has an
    /// execute bit for some class.
    pub fn permits(&self, mode: u32, uid: u32, gid: u32, want: u32) -> bool {
        if self.is_root() {
            let exec_ok =
                want & MAY_EXEC == 0 || mode & libc::S_IFMT == libc::S_IFDIR || mode & 0o111 != 0;
            return exec_ok;
        }
        let class = if self.uid == uid {
            mode >> 6
        } else if self.in_group(gid) {
            mode >> 3
        } else {
            mode
        } & 7;
        class & want == want
    }
}

/// Which of Linux's link protections apply (`fs.protected_symlinks`,
/// `fs.protected_hardlinks`): Kfs applies the host's, as the kernel
/// applies them to its own file systems.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protected {
    /// A final symlink in a sticky directory others may write is
    /// followed only as [`Creds::may_follow`] says.
    pub symlinks: bool,
    /// A hard link is made only as [`Creds::may_hard_link`] says.
    pub hardlinks: bool,
}

impl Protected {
    /// Both protections.
    pub const ALL: Protected = Protected {
        symlinks: true,
        hardlinks: true,
    };
    /// Neither.
    pub const NONE: Protected = Protected {
        symlinks: false,
        hardlinks: false,
    };

    /// The host's settings, from `/proc/sys/fs`; a setting that cannot be
    /// read counts as on.
    pub fn host() -> Protected {
        let on = |name: &str| {
            std::fs::read_to_string(format!("/proc/sys/fs/{name}"))
                .map_or(true, |v| v.trim() != "0")
        };
        Protected {
            symlinks: on("protected_symlinks"),
            hardlinks: on("protected_hardlinks"),
        }
    }
}

/// What a permission check reads of an inode: its type and permission
/// bits, owner and group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Perm {
    /// Type and permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
}

impl Perm {
    fn is_dir(self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
}

/// The POSIX and Linux rules for each kind of change, as `fs/namei.c`,
/// `fs/attr.c` and `fs/open.c` apply them (ARCHITECTURE.md §6). Each
/// returns the errno Linux gives, or what the change becomes.
impl Creds {
    /// `permits` as a result: `EACCES` unless every access in `want` is
    /// granted.
    pub fn may(&self, p: Perm, want: u32) -> Result<(), Errno> {
        if self.permits(p.mode, p.uid, p.gid, want) {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    }

    /// Whether the caller owns `p` or is root (Linux's
    /// `inode_owner_or_capable`).
    pub fn owns(&self, p: Perm) -> bool {
        self.is_root() || self.uid == p.uid
    }

    /// Whether the caller is in group `gid` or is root (`CAP_FSETID`,
    /// Linux's `in_group_or_capable`).
    fn in_group_or_root(&self, gid: u32) -> bool {
        self.is_root() || self.in_group(gid)
    }

    /// Adding an entry to directory `dir` (create, mkdir, symlink, the new
    /// name of a link or a rename): write and search permission on it.
    pub fn may_create_in(&self, dir: Perm) -> Result<(), Errno> {
        self.may(dir, MAY_WRITE | MAY_EXEC)
    }

    /// Removing `victim`'s entry from directory `dir` (unlink, rmdir, the
    /// old name of a rename, a target a rename replaces): write and
    /// search permission on `dir` (`EACCES`), and in a sticky directory
    /// only the owner of `victim` or of `dir`, or root (`EPERM`).
    pub fn may_delete_in(&self, dir: Perm, victim: Perm) -> Result<(), Errno> {
        self.may(dir, MAY_WRITE | MAY_EXEC)?;
        let sticky = dir.mode & libc::S_ISVTX != 0;
        if sticky && self.uid != victim.uid && self.uid != dir.uid && !self.is_root() {
            return Err(Errno::EPERM);
        }
        Ok(())
    }

    /// Following a symlink `link` that ends a path, found in directory
    /// `dir`, where symlinks are [`Protected`]: in a sticky directory
    /// that others may write, only a link the caller owns or one owned by
    /// the directory's owner (`EACCES`); root is no exception.
    pub fn may_follow(&self, dir: Perm, link: Perm) -> Result<(), Errno> {
        let open_sticky = libc::S_ISVTX | 0o002;
        if dir.mode & open_sticky != open_sticky || self.uid == link.uid || dir.uid == link.uid {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    }

    /// Making a new name for `src`, where hard links are [`Protected`]:
    /// its owner or root may; anyone else only for a regular file that is
    /// not set-user-ID, not a set-group-ID executable, and that the
    /// caller may read and write (`EPERM`).
    pub fn may_hard_link(&self, src: Perm) -> Result<(), Errno> {
        let sgid_exec = libc::S_ISGID | 0o010;
        let safe = src.mode & libc::S_IFMT == libc::S_IFREG
            && src.mode & libc::S_ISUID == 0
            && src.mode & sgid_exec != sgid_exec
            && self.permits(src.mode, src.uid, src.gid, MAY_READ | MAY_WRITE);
        if safe || self.owns(src) {
            Ok(())
        } else {
            Err(Errno::EPERM)
        }
    }

    /// The permission bits a new inode of `mode` gets in directory `dir`
    /// (Linux's `mode_strip_sgid`): a set-group-ID executable file made in
    /// a set-group-ID directory of a group the caller is not in loses its
    /// set-group-ID bit.
    pub fn create_mode(&self, dir: Perm, mode: u32) -> u32 {
        let sgid_exec = libc::S_ISGID | 0o010;
        if mode & libc::S_IFMT != libc::S_IFDIR
            && mode & sgid_exec == sgid_exec
            && dir.mode & libc::S_ISGID != 0
            && !self.in_group_or_root(dir.gid)
        {
            mode & !libc::S_ISGID
        } else {
            mode
        }
    }

    /// Opening `p` with access `want` ([`MAY_READ`], [`MAY_WRITE`]; a
    /// truncation asks for writing): a directory is never opened for
    /// writing (`EISDIR`), and otherwise the mode bits decide (`EACCES`).
    pub fn may_open(&self, p: Perm, want: u32) -> Result<(), Errno> {
        if p.is_dir() && want & MAY_WRITE != 0 {
            return Err(Errno::EISDIR);
        }
        self.may(p, want)
    }

    /// Checks an attribute change of `p` and works out its mode (Linux's
    /// `chown_common`, `notify_change`, `setattr_prepare` and
    /// `setattr_copy`, in their order): `Ok(Some(mode))` if the
    /// permission bits change (what they become, type bits dropped),
    /// `Ok(None)` if they stay.
    ///
    /// - Owner (`uid`): only root changes it; the owner may "change" it to
    ///   itself (`EPERM`).
    /// - Group (`gid`): root, or the owner to its own group or one it is
    ///   in (`EPERM`).
    /// - Mode: the owner or root (`EPERM`); a caller not in the file's
    ///   (new) group and not root sets no set-group-ID bit: it is cleared
    ///   silently.
    /// - A change of owner or group alone (a `chown`, even to the same
    ///   ids) of a non-directory clears set-user-ID, and set-group-ID if
    ///   the group may execute or the caller is neither in the file's
    ///   group nor root; root's `chown` too, as on Linux.
    /// - Times: set explicitly (or one to "now" and the other left), the
    ///   owner or root (`EPERM`); both to "now" (`touch`), also anyone
    ///   who may write the file (`EACCES`).
    pub fn set_attr(&self, p: Perm, change: &AttrChange) -> Result<Option<u32>, Errno> {
        let mut mode = change.mode;
        if change.chown && !p.is_dir() {
            let sgid_exec = libc::S_ISGID | 0o010;
            let drop_sgid = p.mode & libc::S_ISGID != 0
                && (p.mode & sgid_exec == sgid_exec || !self.in_group_or_root(p.gid));
            let m = mode.unwrap_or(p.mode & 0o7777);
            let killed = m & !(libc::S_ISUID | if drop_sgid { libc::S_ISGID } else { 0 });
            if killed != m {
                mode = Some(killed);
            }
        }
        if let Some(uid) = change.uid {
            let owner_keeps = self.uid == p.uid && uid == p.uid;
            if !owner_keeps && !self.is_root() {
                return Err(Errno::EPERM);
            }
        }
        if let Some(gid) = change.gid {
            let owner_may = self.uid == p.uid && (gid == p.gid || self.in_group(gid));
            if !owner_may && !self.is_root() {
                return Err(Errno::EPERM);
            }
        }
        if let Some(m) = mode.as_mut() {
            if !self.owns(p) {
                return Err(Errno::EPERM);
            }
            if !self.in_group_or_root(change.gid.unwrap_or(p.gid)) {
                *m &= !libc::S_ISGID;
            }
        }
        match change.times {
            Times::Keep => {}
            Times::Explicit if !self.owns(p) => return Err(Errno::EPERM),
            Times::Explicit => {}
            Times::Touch if !self.owns(p) => self.may(p, MAY_WRITE)?,
            Times::Touch => {}
        }
        Ok(mode)
    }
}

/// An attribute change as [`Creds::set_attr`] judges it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttrChange {
    /// New permission bits.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// A `chown`: the change sets neither mode nor times (set-ID bits
    /// are cleared).
    pub chown: bool,
    /// Which time change it is.
    pub times: Times,
}

/// How a change sets a file's access and modification times, as
/// `utimensat` distinguishes them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Times {
    /// Neither time changes.
    #[default]
    Keep,
    /// Both set to the time of the change (`UTIME_NOW` twice, or no
    /// times at all).
    Touch,
    /// At least one set to a value, or one to "now" with the other left.
    Explicit,
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIR: u32 = libc::S_IFDIR;
    const REG: u32 = libc::S_IFREG;

    #[test]
    fn exactly_one_class_applies() {
        let owner = Creds::new(1000, 1000);
        // The owner is refused by its own class even if others may.
        assert!(!owner.permits(REG | 0o077, 1000, 1000, MAY_READ));
        assert!(owner.permits(REG | 0o400, 1000, 1000, MAY_READ));
        let member = Creds::with_groups(1001, 1001, &[50]).unwrap();
        assert!(member.permits(REG | 0o040, 1000, 50, MAY_READ));
        assert!(!member.permits(REG | 0o004, 1000, 50, MAY_READ));
        let other = Creds::new(1002, 1002);
        assert!(other.permits(REG | 0o006, 1000, 50, MAY_READ | MAY_WRITE));
        assert!(!other.permits(REG | 0o004, 1000, 50, MAY_READ | MAY_WRITE));
    }

    #[test]
    fn root_executes_only_what_someone_may() {
        let root = Creds::default();
        assert!(root.permits(REG, 5, 5, MAY_READ | MAY_WRITE));
        assert!(!root.permits(REG | 0o600, 5, 5, MAY_EXEC));
        assert!(root.permits(REG | 0o001, 5, 5, MAY_EXEC));
        assert!(root.permits(DIR, 5, 5, MAY_EXEC));
    }

    fn perm(mode: u32, uid: u32, gid: u32) -> Perm {
        Perm { mode, uid, gid }
    }

    const ME: u32 = 1000;
    const THEM: u32 = 1001;

    #[test]
    fn deleting_needs_write_and_search_and_the_sticky_rule() {
        let me = Creds::with_groups(ME, ME, &[50]).unwrap();
        let open = perm(DIR | 0o777, 0, 0);
        let theirs = perm(REG | 0o666, THEM, THEM);
        assert_eq!(me.may_delete_in(open, theirs), Ok(()));
        for dir in [DIR | 0o755, DIR | 0o775, DIR | 0o776] {
            assert_eq!(
                me.may_delete_in(perm(dir, 0, 0), theirs),
                Err(Errno::EACCES)
            );
        }
        // Sticky: the file's owner, the directory's, or root.
        let sticky = perm(DIR | 0o1777, 0, 0);
        assert_eq!(me.may_delete_in(sticky, theirs), Err(Errno::EPERM));
        assert_eq!(me.may_delete_in(sticky, perm(REG, ME, 0)), Ok(()));
        assert_eq!(me.may_delete_in(perm(DIR | 0o1777, ME, 0), theirs), Ok(()));
        assert_eq!(Creds::default().may_delete_in(sticky, theirs), Ok(()));
        // Permission first: a sticky directory without write says EACCES.
        let closed = perm(DIR | 0o1755, 0, 0);
        assert_eq!(me.may_delete_in(closed, theirs), Err(Errno::EACCES));
        assert_eq!(me.may_create_in(closed), Err(Errno::EACCES));
        assert_eq!(me.may_create_in(perm(DIR | 0o070, 0, 50)), Ok(()));
    }

    #[test]
    fn a_final_symlink_in_an_open_sticky_directory_is_followed_by_few() {
        let me = Creds::new(ME, ME);
        let tmp = perm(DIR | 0o1777, 0, 0);
        let theirs = perm(libc::S_IFLNK | 0o777, THEM, THEM);
        assert_eq!(me.may_follow(tmp, theirs), Err(Errno::EACCES));
        // Root is no exception.
        assert_eq!(Creds::default().may_follow(tmp, theirs), Err(Errno::EACCES));
        assert_eq!(me.may_follow(tmp, perm(libc::S_IFLNK, ME, 0)), Ok(()));
        // Owned by the directory's owner; a directory not sticky, or not
        // writable by others.
        assert_eq!(me.may_follow(perm(DIR | 0o1777, THEM, 0), theirs), Ok(()));
        assert_eq!(me.may_follow(perm(DIR | 0o777, 0, 0), theirs), Ok(()));
        assert_eq!(me.may_follow(perm(DIR | 0o1775, 0, 0), theirs), Ok(()));
    }

    #[test]
    fn hard_links_to_anothers_file_need_a_safe_source() {
        let me = Creds::new(ME, ME);
        assert_eq!(me.may_hard_link(perm(REG | 0o606, THEM, THEM)), Ok(()));
        for unsafe_source in [
            REG | 0o604,
            REG | 0o4606,
            REG | 0o2676,
            DIR | 0o777,
            libc::S_IFLNK | 0o777,
        ] {
            assert_eq!(
                me.may_hard_link(perm(unsafe_source, THEM, THEM)),
                Err(Errno::EPERM),
                "{unsafe_source:o}"
            );
        }
        // A set-group-ID file the group may not execute is no program.
        assert_eq!(me.may_hard_link(perm(REG | 0o2666, THEM, THEM)), Ok(()));
        assert_eq!(me.may_hard_link(perm(REG | 0o4000, ME, ME)), Ok(()));
        assert_eq!(
            Creds::default().may_hard_link(perm(DIR, THEM, THEM)),
            Ok(())
        );
    }

    #[test]
    fn a_set_group_id_program_made_outside_ones_groups_loses_the_bit() {
        let me = Creds::with_groups(ME, ME, &[50]).unwrap();
        let sgid_dir = |gid| perm(DIR | 0o2777, 0, gid);
        assert_eq!(me.create_mode(sgid_dir(60), REG | 0o2755), REG | 0o755);
        assert_eq!(me.create_mode(sgid_dir(50), REG | 0o2755), REG | 0o2755);
        assert_eq!(me.create_mode(sgid_dir(60), REG | 0o2745), REG | 0o2745);
        assert_eq!(me.create_mode(sgid_dir(60), DIR | 0o2755), DIR | 0o2755);
        assert_eq!(
            me.create_mode(perm(DIR | 0o777, 0, 60), REG | 0o2755),
            REG | 0o2755
        );
        assert_eq!(
            Creds::default().create_mode(sgid_dir(60), REG | 0o2755),
            REG | 0o2755
        );
    }

    #[test]
    fn opens_check_the_access_asked_for() {
        let me = Creds::new(ME, ME);
        let f = |mode| perm(REG | mode, ME, ME);
        assert_eq!(me.may_open(f(0o400), MAY_READ), Ok(()));
        assert_eq!(me.may_open(f(0o400), MAY_WRITE), Err(Errno::EACCES));
        assert_eq!(me.may_open(f(0o200), MAY_READ), Err(Errno::EACCES));
        assert_eq!(
            me.may_open(f(0o600), MAY_READ | MAY_WRITE),
            Ok(()),
            "read and write"
        );
        assert_eq!(
            me.may_open(perm(DIR | 0o777, ME, ME), MAY_WRITE),
            Err(Errno::EISDIR)
        );
        assert_eq!(me.may_open(perm(DIR, ME, ME), MAY_READ), Err(Errno::EACCES));
        assert_eq!(
            Creds::default().may_open(perm(DIR, THEM, THEM), MAY_WRITE),
            Err(Errno::EISDIR)
        );
    }

    fn chown(uid: Option<u32>, gid: Option<u32>) -> AttrChange {
        AttrChange {
            uid,
            gid,
            chown: true,
            ..AttrChange::default()
        }
    }

    fn chmod(mode: u32) -> AttrChange {
        AttrChange {
            mode: Some(mode),
            ..AttrChange::default()
        }
    }

    fn times(times: Times) -> AttrChange {
        AttrChange {
            times,
            ..AttrChange::default()
        }
    }

    #[test]
    fn only_root_gives_a_file_away_and_owners_change_its_group_to_theirs() {
        let me = Creds::with_groups(ME, ME, &[50]).unwrap();
        let mine = perm(REG | 0o644, ME, ME);
        let theirs = perm(REG | 0o666, THEM, THEM);
        assert_eq!(
            me.set_attr(mine, &chown(Some(THEM), None)),
            Err(Errno::EPERM)
        );
        assert_eq!(me.set_attr(mine, &chown(Some(ME), None)), Ok(None));
        assert_eq!(me.set_attr(mine, &chown(None, Some(50))), Ok(None));
        assert_eq!(me.set_attr(mine, &chown(None, Some(60))), Err(Errno::EPERM));
        assert_eq!(
            me.set_attr(theirs, &chown(None, Some(50))),
            Err(Errno::EPERM)
        );
        assert_eq!(
            me.set_attr(theirs, &chown(Some(THEM), None)),
            Err(Errno::EPERM)
        );
        // chown(-1, -1) of another's file changes nothing, and may.
        assert_eq!(me.set_attr(theirs, &chown(None, None)), Ok(None));
        let root = Creds::default();
        assert_eq!(root.set_attr(theirs, &chown(Some(7), Some(8))), Ok(None));
    }

    #[test]
    fn a_chown_clears_set_id_bits_as_linux_does() {
        let me = Creds::with_groups(ME, ME, &[50]).unwrap();
        let root = Creds::default();
        let suid = perm(REG | 0o4755, ME, ME);
        assert_eq!(me.set_attr(suid, &chown(None, Some(50))), Ok(Some(0o755)));
        // Root's chown too.
        assert_eq!(root.set_attr(suid, &chown(Some(5), None)), Ok(Some(0o755)));
        // Set-group-ID: cleared if the group may execute...
        let sgid_x = perm(REG | 0o2755, ME, ME);
        assert_eq!(me.set_attr(sgid_x, &chown(None, Some(50))), Ok(Some(0o755)));
        assert_eq!(root.set_attr(sgid_x, &chown(None, None)), Ok(Some(0o755)));
        // ...or the caller is not in the file's group, and not root.
        let sgid = perm(REG | 0o2644, ME, 60);
        assert_eq!(me.set_attr(sgid, &chown(None, Some(50))), Ok(Some(0o644)));
        assert_eq!(root.set_attr(sgid, &chown(None, Some(50))), Ok(None));
        let sgid_mine = perm(REG | 0o2644, ME, ME);
        assert_eq!(me.set_attr(sgid_mine, &chown(None, Some(50))), Ok(None));
        // Not a directory's.
        let dir = perm(DIR | 0o2755, ME, ME);
        assert_eq!(me.set_attr(dir, &chown(None, Some(50))), Ok(None));
        // Another's set-user-ID file: chown(-1, -1) would change its mode.
        let theirs = perm(REG | 0o4755, THEM, THEM);
        assert_eq!(me.set_attr(theirs, &chown(None, None)), Err(Errno::EPERM));
    }

    #[test]
    fn chmod_is_the_owners_and_keeps_set_group_id_only_in_its_groups() {
        let me = Creds::with_groups(ME, ME, &[50]).unwrap();
        assert_eq!(
            me.set_attr(perm(REG | 0o644, THEM, ME), &chmod(0o600)),
            Err(Errno::EPERM)
        );
        assert_eq!(
            me.set_attr(perm(REG, ME, 50), &chmod(0o2755)),
            Ok(Some(0o2755))
        );
        assert_eq!(
            me.set_attr(perm(REG, ME, 60), &chmod(0o6755)),
            Ok(Some(0o4755))
        );
        assert_eq!(
            me.set_attr(perm(DIR, ME, 60), &chmod(0o3777)),
            Ok(Some(0o1777))
        );
        assert_eq!(
            Creds::default().set_attr(perm(REG, ME, 60), &chmod(0o2755)),
            Ok(Some(0o2755))
        );
    }

    #[test]
    fn times_need_the_owner_and_now_also_write_permission() {
        let me = Creds::new(ME, ME);
        let writable = perm(REG | 0o666, THEM, THEM);
        let readable = perm(REG | 0o644, THEM, THEM);
        assert_eq!(
            me.set_attr(writable, &times(Times::Explicit)),
            Err(Errno::EPERM)
        );
        assert_eq!(me.set_attr(writable, &times(Times::Touch)), Ok(None));
        assert_eq!(
            me.set_attr(readable, &times(Times::Touch)),
            Err(Errno::EACCES)
        );
        let mine = perm(REG, ME, ME);
        assert_eq!(me.set_attr(mine, &times(Times::Explicit)), Ok(None));
        assert_eq!(me.set_attr(mine, &times(Times::Touch)), Ok(None));
        assert_eq!(
            Creds::default().set_attr(readable, &times(Times::Explicit)),
            Ok(None)
        );
    }

    #[test]
    fn too_many_groups_are_refused() {
        let many: Vec<u32> = (0..=u32::try_from(GROUPS_MAX).unwrap()).collect();
        assert!(Creds::with_groups(1, 1, &many).is_none());
        let c = Creds::with_groups(1, 1, &many[..GROUPS_MAX]).unwrap();
        assert_eq!(c.groups().len(), GROUPS_MAX);
        assert!(c.in_group(7));
    }
}
