//! File metadata, shaped like `std::fs::Metadata` and friends.

use std::io;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kucofs_common::index::{InodeAttr, Kind};

/// The type of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileType(pub(crate) Kind);

impl FileType {
    /// A directory.
    pub fn is_dir(&self) -> bool {
        self.0 == Kind::Dir
    }
    /// A regular file.
    pub fn is_file(&self) -> bool {
        self.0 == Kind::File
    }
    /// A symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.0 == Kind::Symlink
    }
}

/// Permission bits of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Permissions(pub(crate) u32);

impl Permissions {
    /// Permissions from mode bits (`0o644`); the file type bits are ignored.
    pub fn from_mode(mode: u32) -> Permissions {
        Permissions(mode & 0o7777)
    }
    /// The mode bits (permissions, setuid, setgid, sticky).
    pub fn mode(&self) -> u32 {
        self.0
    }
    /// True if nobody may write.
    pub fn readonly(&self) -> bool {
        self.0 & 0o222 == 0
    }
    /// Removes (or restores the owner's) write permission.
    pub fn set_readonly(&mut self, readonly: bool) {
        if readonly {
            self.0 &= !0o222;
        } else {
            self.0 |= 0o200;
        }
    }
}

/// Metadata of a file, read consistently from its inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metadata(pub(crate) InodeAttr);

fn time(ns: i64) -> SystemTime {
    match u64::try_from(ns) {
        Ok(after) => UNIX_EPOCH + Duration::from_nanos(after),
        Err(_) => UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs()),
    }
}

impl Metadata {
    /// The file's type.
    pub fn file_type(&self) -> FileType {
        FileType(self.0.kind().unwrap_or(Kind::File))
    }
    /// A directory.
    pub fn is_dir(&self) -> bool {
        self.file_type().is_dir()
    }
    /// A regular file.
    pub fn is_file(&self) -> bool {
        self.file_type().is_file()
    }
    /// A symbolic link (only from `symlink_metadata`).
    pub fn is_symlink(&self) -> bool {
        self.file_type().is_symlink()
    }
    /// Size in bytes (a symlink: its target's length).
    pub fn len(&self) -> u64 {
        self.0.size
    }
    /// True if the size is zero.
    pub fn is_empty(&self) -> bool {
        self.0.size == 0
    }
    /// 512-byte blocks the file's data pages take (0 for anything but a
    /// regular file).
    pub fn blocks(&self) -> u64 {
        if self.is_file() {
            self.0.entries * 8
        } else {
            0
        }
    }
    /// Permission bits.
    pub fn permissions(&self) -> Permissions {
        Permissions::from_mode(self.0.mode)
    }
    /// Last modification.
    pub fn modified(&self) -> io::Result<SystemTime> {
        Ok(time(self.0.mtime))
    }
    /// Last access.
    pub fn accessed(&self) -> io::Result<SystemTime> {
        Ok(time(self.0.atime))
    }
    /// Creation.
    pub fn created(&self) -> io::Result<SystemTime> {
        Ok(time(self.0.btime))
    }
    /// Inode number.
    pub fn ino(&self) -> u64 {
        self.0.ino.get()
    }
    /// Type and permission bits, as `st_mode`.
    pub fn mode(&self) -> u32 {
        self.0.mode
    }
    /// Number of hard links.
    pub fn nlink(&self) -> u64 {
        u64::from(self.0.nlink)
    }
    /// Owner.
    pub fn uid(&self) -> u32 {
        self.0.uid
    }
    /// Group.
    pub fn gid(&self) -> u32 {
        self.0.gid
    }
    /// Last status change, ns since the epoch.
    pub fn ctime_ns(&self) -> i64 {
        self.0.ctime
    }
    /// Last modification, ns since the epoch.
    pub fn mtime_ns(&self) -> i64 {
        self.0.mtime
    }
    /// Last access, ns since the epoch.
    pub fn atime_ns(&self) -> i64 {
        self.0.atime
    }
    /// Preferred I/O size.
    pub fn blksize(&self) -> u64 {
        kucofs_common::format::PAGE_SIZE
    }
}

/// File-system statistics, as `statfs(2)` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    /// Block (page) size.
    pub block_size: u64,
    /// Data pages in the file system.
    pub blocks: u64,
    /// Data pages no file holds (free ones, and those in write pools or
    /// waiting for readers to move on, which become free by themselves).
    pub blocks_free: u64,
    /// Free pages an unprivileged caller may use: all of them (none are
    /// kept back for root).
    pub blocks_avail: u64,
    /// Inodes in use plus those the free space can still hold (inodes
    /// take pages from the same free space as data).
    pub files: u64,
    /// Inodes the free space can still hold, each with a short-named
    /// entry.
    pub files_free: u64,
    /// Longest name.
    pub name_max: u64,
}
