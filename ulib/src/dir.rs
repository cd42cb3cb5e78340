//! Directory listings, shaped like `std::fs::ReadDir`.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::sync::Arc;

use kucofs_common::index::layout::TAG_INODE;
use kucofs_common::index::{DirEntryInfo, Ino, InodeOff};

use crate::fs::Inner;
use crate::metadata::{FileType, Metadata};

/// Entries fetched per visit to the index.
const BATCH: usize = 128;

/// An iterator over a directory's entries, in key order. Entries added or
/// removed while it runs may or may not appear, but every entry present
/// throughout appears exactly once: the listing resumes after the last key
/// it returned, not at a position.
#[derive(Debug)]
pub struct ReadDir {
    pub(crate) fs: Arc<Inner>,
    pub(crate) path: PathBuf,
    pub(crate) dir: u64,
    pub(crate) gen: u32,
    /// The directory's inode number (what an isolated client names it by
    /// with its offset and generation).
    pub(crate) ino: Ino,
    pub(crate) after: Option<(u64, Vec<u8>)>,
    pub(crate) buf: VecDeque<DirEntryInfo>,
    pub(crate) done: bool,
}

impl Iterator for ReadDir {
    type Item = io::Result<DirEntry>;

    fn next(&mut self) -> Option<io::Result<DirEntry>> {
        if self.buf.is_empty() && !self.done && self.fs.isolated() {
            match self.next_isolated() {
                Ok(more) => self.done = !more,
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
        if self.buf.is_empty() && !self.done {
            let mut batch = Vec::new();
            let (dir, gen) = (self.dir, self.gen);
            let after = self.after.clone();
            let res = self.fs.with_index(|r| {
                if !r.is_live(dir, TAG_INODE, Some(gen)) {
                    // The directory was removed: nothing more to list.
                    return false;
                }
                r.read_dir(
                    InodeOff::new(dir),
                    after.as_ref().map(|(h, n)| (*h, n.as_slice())),
                    BATCH,
                    &mut batch,
                )
            });
            match res {
                Ok(more) => self.done = !more,
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
            self.after = batch.last().map(|e| (e.hash, e.name.clone()));
            self.buf.extend(batch);
        }
        let e = self.buf.pop_front()?;
        Some(Ok(DirEntry {
            fs: self.fs.clone(),
            path: self.path.join(OsStr::from_bytes(&e.name)),
            info: e,
        }))
    }
}

/// One entry of a directory.
#[derive(Debug, Clone)]
pub struct DirEntry {
    fs: Arc<Inner>,
    path: PathBuf,
    info: DirEntryInfo,
}

impl DirEntry {
    /// The entry's full path (the listed directory's path joined with the
    /// name).
    pub fn path(&self) -> PathBuf {
        self.path.clone()
    }
    /// The entry's name.
    pub fn file_name(&self) -> OsString {
        OsString::from_vec(self.info.name.clone())
    }
    /// The type, from the entry itself (no inode read).
    pub fn file_type(&self) -> io::Result<FileType> {
        Ok(FileType(self.info.kind))
    }
    /// Inode number.
    pub fn ino(&self) -> u64 {
        self.info.ino.get()
    }
    /// The readdir cookie after this entry (its key hash).
    pub fn cookie(&self) -> u64 {
        self.info.hash
    }
    /// Metadata of what the entry names (not following a symlink).
    pub fn metadata(&self) -> io::Result<Metadata> {
        if self.fs.isolated() {
            let at = kucofs_common::proto::At::Path {
                path: crate::fs::bytes(&self.path),
                follow: false,
            };
            return self.fs.stat_of(at).map(Metadata);
        }
        let inode = self.info.inode;
        self.fs
            .with_index(|r| r.attr(inode))?
            .map(Metadata)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }
}
