//! Reading as an isolated daemon client (ARCHITECTURE.md §2, "daemon
//! mode + threat model"): a client the daemon does not trust maps neither
//! the index nor the image, so every read is a request Kfs checks against
//! its credentials. Attributes come back in the reply; directory entries,
//! symlink targets and file data come back in this thread's part of the
//! staging area, which this thread alone uses between its request and the
//! next. The trusted and embedded clients never come here.

use std::collections::VecDeque;
use std::io;
use std::path::Path;
use std::sync::Arc;

use kucofs_common::index::{DirEntryInfo, DirentOff, Ino, InodeAttr, InodeOff, Kind};
use kucofs_common::proto::{At, Listed, Node, Reply, Request, STAGE_BYTES};
use kucofs_common::Errno;

use crate::dir::ReadDir;
use crate::fs::{bytes, common_err, err, Inner};

impl Inner {
    /// Sends `req` from this thread's slot and returns the reply and the
    /// slot, whose part of the staging area holds what Kfs wrote for it.
    fn call_staged(self: &Arc<Self>, req: &Request<'_>) -> io::Result<(Reply, usize)> {
        let slot = self.slot()?;
        Ok((self.call_as(slot, req)?, slot))
    }

    /// The first `len` bytes of `slot`'s part of the staging area.
    fn staged(&self, slot: usize, len: u64) -> io::Result<Vec<u8>> {
        let staging = self.conn.staging().ok_or_else(|| err(Errno::EOPNOTSUPP))?;
        if len > STAGE_BYTES {
            return Err(err(Errno::EPROTO));
        }
        let mut out = vec![0u8; usize::try_from(len).map_err(|_| err(Errno::EPROTO))?];
        staging
            .try_read(slot as u64 * STAGE_BYTES, &mut out)
            .map_err(common_err)?;
        Ok(out)
    }

    /// The attributes of what `at` names.
    pub(crate) fn stat_of(self: &Arc<Self>, at: At<'_>) -> io::Result<InodeAttr> {
        self.call_here(&Request::Stat { at })?
            .into_attr()
            .map_err(err)
    }

    /// The target of the symlink `at` names.
    pub(crate) fn read_link_of(self: &Arc<Self>, at: At<'_>) -> io::Result<Vec<u8>> {
        let (reply, slot) = self.call_staged(&Request::ReadLink { at })?;
        self.staged(slot, reply.into_size().map_err(err)?)
    }

    /// Entries of directory `dir` after the key `after`, as Kfs lists
    /// them, and whether more follow.
    pub(crate) fn list(
        self: &Arc<Self>,
        dir: Node,
        after: Option<(u64, &[u8])>,
    ) -> io::Result<(Vec<DirEntryInfo>, bool)> {
        let req = Request::ReadDir {
            dir: At::Node(dir),
            after,
        };
        let (reply, slot) = self.call_staged(&req)?;
        let Reply::Listing {
            entries,
            bytes,
            more,
        } = reply
        else {
            return Err(err(Errno::EPROTO));
        };
        let buf = self.staged(slot, u64::from(bytes))?;
        let listed = Listed::decode_all(&buf, entries).map_err(err)?;
        let out = listed
            .iter()
            .map(|l| DirEntryInfo {
                offset: DirentOff::NULL,
                hash: l.hash,
                name: l.name.to_vec(),
                inode: l.inode,
                ino: l.ino,
                kind: l.kind,
            })
            .collect();
        Ok((out, more))
    }

    /// Reads file `ino` (open here for reading) from `offset` into `buf`
    /// through Kfs, a staging slot's worth at a time; the bytes read (0 at
    /// or past the end).
    pub(crate) fn read_file(
        self: &Arc<Self>,
        ino: Ino,
        buf: &mut [u8],
        offset: u64,
    ) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let want = (buf.len() - done).min(crate::file::to_len(STAGE_BYTES));
            let req = Request::Read {
                ino,
                offset: offset + done as u64,
                len: u32::try_from(want).map_err(|_| err(Errno::EINVAL))?,
            };
            let (reply, slot) = self.call_staged(&req)?;
            let n = reply.into_size().map_err(err)?;
            if n > want as u64 {
                return Err(err(Errno::EPROTO));
            }
            if n == 0 {
                break;
            }
            let got = self.staged(slot, n)?;
            buf[done..done + got.len()].copy_from_slice(&got);
            done += got.len();
        }
        Ok(done)
    }
}

impl ReadDir {
    /// A listing of the directory `path` names, through Kfs: the first
    /// batch is fetched now, so that a directory the caller may not read
    /// is refused here, as `opendir` refuses it.
    pub(crate) fn isolated(fs: &Arc<Inner>, path: &Path) -> io::Result<ReadDir> {
        let a = fs.stat_of(At::Path {
            path: bytes(path),
            follow: true,
        })?;
        if a.kind() != Some(Kind::Dir) {
            return Err(err(Errno::ENOTDIR));
        }
        let node = Node {
            ino: a.ino,
            inode: a.offset,
            gen: a.gen,
        };
        let (batch, more) = fs.list(node, None)?;
        let mut r = ReadDir {
            fs: fs.clone(),
            path: path.to_path_buf(),
            dir: a.offset.get(),
            gen: a.gen,
            ino: a.ino,
            after: None,
            buf: VecDeque::new(),
            done: !more,
        };
        r.after = batch.last().map(|e| (e.hash, e.name.clone()));
        r.buf.extend(batch);
        Ok(r)
    }

    /// The next batch through Kfs (see [`ReadDir::isolated`]); `false`
    /// once the directory has no more, or is gone.
    pub(crate) fn next_isolated(&mut self) -> io::Result<bool> {
        let node = Node {
            ino: self.ino,
            inode: InodeOff::new(self.dir),
            gen: self.gen,
        };
        let after = self.after.clone();
        let (batch, more) = match self
            .fs
            .list(node, after.as_ref().map(|(h, n)| (*h, n.as_slice())))
        {
            Ok(b) => b,
            // The directory was removed: nothing more to list.
            Err(e) if e.raw_os_error() == Some(libc::ESTALE) => return Ok(false),
            Err(e) => return Err(e),
        };
        self.after = batch.last().map(|e| (e.hash, e.name.clone()));
        self.buf.extend(batch);
        Ok(more)
    }
}
