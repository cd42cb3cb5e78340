//! Who asks and what they may do: a caller's credentials and the POSIX
//! permission rule Kfs checks every change and open against
//! (ARCHITECTURE.md §2).

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

    #[test]
    fn too_many_groups_are_refused() {
        let many: Vec<u32> = (0..=u32::try_from(GROUPS_MAX).unwrap()).collect();
        assert!(Creds::with_groups(1, 1, &many).is_none());
        let c = Creds::with_groups(1, 1, &many[..GROUPS_MAX]).unwrap();
        assert_eq!(c.groups().len(), GROUPS_MAX);
        assert!(c.in_group(7));
    }
}
