//! Checkpoints: the whole namespace serialized into one of the two
//! checkpoint slots, so the log can start over (DESIGN §10).
//!
//! A checkpoint is written into the slot not in use, persisted, and only
//! then named by the superblock (with the log sequence it covers): a crash
//! at any point leaves either the old checkpoint with the old log, or the
//! new one with the log restarting after it.
//!
//! The body is a stream of records, each inode before any entry naming it:
//!
//! ```text
//! inode: 1u8, ino u64, mode u32, nlink u32, uid u32, gid u32, size u64,
//!        atime i64, mtime i64, ctime i64, btime i64, target (u32 len + bytes)
//! pages: 3u8, ino u64, runs u32, then per run: file page u64, data page u64,
//!        pages u32 (after a regular file's inode record, if it holds any)
//! entry: 2u8, parent ino u64, ino u64, name (u32 len + bytes)
//! ```

use kucofs_common::codec::{Reader, Writer};
use kucofs_common::format::{CheckpointHeader, CheckpointRef, Geometry, CHECKPOINT_HEADER_SIZE};
use kucofs_common::index::{InodeAttr, NAME_MAX, PATH_MAX};
use kucofs_common::pm::Region;
use kucofs_common::proto::Creds;
use kucofs_common::Errno;

use crate::namespace::Namespace;

const INODE: u8 = 1;
const ENTRY: u8 = 2;
const PAGES: u8 = 3;

/// Bytes a checkpoint is written in at a time.
const CHUNK: usize = 1 << 20;

/// Where a checkpoint body goes as it is made: a chunk buffer, written out
/// (non-temporal) whenever it fills, with the checksum kept running.
struct Sink<'a> {
    region: &'a Region,
    buf: Vec<u8>,
    /// Region offset the next chunk goes to, and the slot's end.
    at: u64,
    end: u64,
    crc: u32,
    failed: Option<Errno>,
}

impl Sink<'_> {
    fn drain(&mut self) {
        if self.failed.is_none() && !self.buf.is_empty() {
            let n = self.buf.len() as u64;
            if self.at + n > self.end {
                self.failed = Some(Errno::ENOSPC);
            } else if self.region.write_nt(self.at, &self.buf).is_err() {
                self.failed = Some(Errno::EIO);
            } else {
                self.crc = kucofs_common::checksum::crc32c_append(self.crc, &self.buf);
                self.at += n;
            }
        }
        self.buf.clear();
    }

    fn maybe_drain(&mut self) {
        if self.buf.len() >= CHUNK {
            self.drain();
        }
    }
}

/// Serializes the namespace straight into checkpoint `slot`, covering the
/// log before `seq`, and persists it: the body a chunk at a time as it is
/// made (a namespace of millions of files needs no buffer its size), then
/// the header. `ENOSPC` if it does not fit.
pub fn write(
    region: &Region,
    g: &Geometry,
    slot: u8,
    seq: u64,
    ns: &Namespace,
) -> Result<(), Errno> {
    let area = g.checkpoint_slot(slot);
    let body = area.offset() + CHECKPOINT_HEADER_SIZE as u64;
    let mut sink = Sink {
        region,
        buf: Vec::with_capacity(CHUNK + 4096),
        at: body,
        end: area.offset() + area.len(),
        crc: 0,
        failed: None,
    };
    let (mut inodes, mut entries) = (0, 0);
    ns.for_each_inode(|a| {
        inodes += 1;
        let mut w = Writer(&mut sink.buf);
        w.u8(INODE);
        w.u64(a.ino);
        for v in [a.mode, a.nlink, a.uid, a.gid] {
            w.u32(v);
        }
        w.u64(a.size);
        for t in [a.atime, a.mtime, a.ctime, a.btime] {
            w.u64(t as u64);
        }
        w.bytes(&ns.reader().readlink(a.offset).unwrap_or_default());
        if a.kind() == Some(kucofs_common::index::Kind::File) {
            let mut runs: Vec<(u64, u64, u32)> = Vec::new();
            ns.file_pages(a.offset, |fp, dp| match runs.last_mut() {
                Some(r) if r.0 + u64::from(r.2) == fp && r.1 + u64::from(r.2) == dp => r.2 += 1,
                _ => runs.push((fp, dp, 1)),
            });
            if !runs.is_empty() {
                w.u8(PAGES);
                w.u64(a.ino);
                w.u32(runs.len() as u32);
                for (fp, dp, n) in runs {
                    w.u64(fp);
                    w.u64(dp);
                    w.u32(n);
                }
            }
        }
        sink.maybe_drain();
    });
    ns.for_each_entry(|parent, name, ino| {
        entries += 1;
        let mut w = Writer(&mut sink.buf);
        w.u8(ENTRY);
        w.u64(parent);
        w.u64(ino);
        w.bytes(name);
        sink.maybe_drain();
    });
    sink.drain();
    if let Some(e) = sink.failed {
        return Err(e);
    }
    let header = CheckpointHeader::with_crc(seq, sink.at - body, sink.crc, inodes, entries);
    region
        .write_nt(area.offset(), &header.encode())
        .map_err(|_| Errno::EIO)?;
    region.fence();
    Ok(())
}

/// Reads the checkpoint `c` names through `read`, checking its header,
/// sequence and body checksum.
pub fn read(
    g: &Geometry,
    c: CheckpointRef,
    read: impl Fn(u64, &mut [u8]) -> bool,
) -> Result<(CheckpointHeader, Vec<u8>), String> {
    let area = g.checkpoint_slot(c.slot);
    let mut hb = [0u8; CHECKPOINT_HEADER_SIZE];
    if !read(area.offset(), &mut hb) {
        return Err("checkpoint slot is outside the image".into());
    }
    let h = CheckpointHeader::decode(&hb).map_err(|e| format!("slot {}: {e}", c.slot))?;
    if h.seq != c.seq {
        return Err(format!(
            "slot {} holds checkpoint {} but the superblock names {}",
            c.slot, h.seq, c.seq
        ));
    }
    if h.body_len > area.len() - CHECKPOINT_HEADER_SIZE as u64 {
        return Err(format!(
            "slot {}: body length {} overruns the slot",
            c.slot, h.body_len
        ));
    }
    let mut body = vec![0u8; h.body_len as usize];
    if !read(area.offset() + CHECKPOINT_HEADER_SIZE as u64, &mut body) {
        return Err("checkpoint body is outside the image".into());
    }
    if kucofs_common::checksum::crc32c(&body) != h.body_crc {
        return Err(format!(
            "slot {}: checkpoint body checksum mismatch",
            c.slot
        ));
    }
    Ok((h, body))
}

/// Rebuilds a namespace from a checkpoint body.
pub fn load(body: &[u8]) -> Result<Namespace, String> {
    let mut ns = Namespace::new(Creds::default(), 0).map_err(|e| format!("index: {e}"))?;
    let mut r = Reader::new(body);
    let bad = |what: &str, e: Errno| format!("checkpoint {what}: {e:?}");
    let mut n = 0u64;
    while !r.done() {
        n += 1;
        let tag = r.u8().map_err(|e| bad("record", e))?;
        match tag {
            INODE => {
                let mut a = InodeAttr {
                    offset: 0,
                    gen: 0,
                    ino: r.u64().map_err(|e| bad("inode", e))?,
                    mode: 0,
                    nlink: 0,
                    uid: 0,
                    gid: 0,
                    size: 0,
                    atime: 0,
                    mtime: 0,
                    ctime: 0,
                    btime: 0,
                    entries: 0,
                };
                let mut fields = || -> Result<&[u8], Errno> {
                    a.mode = r.u32()?;
                    a.nlink = r.u32()?;
                    a.uid = r.u32()?;
                    a.gid = r.u32()?;
                    a.size = r.u64()?;
                    a.atime = r.u64()? as i64;
                    a.mtime = r.u64()? as i64;
                    a.ctime = r.u64()? as i64;
                    a.btime = r.u64()? as i64;
                    r.bytes(PATH_MAX)
                };
                let target = fields().map_err(|e| bad("inode", e))?;
                ns.load_inode(&a, target)
                    .map_err(|e| format!("checkpoint record {n}: inode {}: {e:?}", a.ino))?;
            }
            ENTRY => {
                let mut fields = || -> Result<(u64, u64, &[u8]), Errno> {
                    Ok((r.u64()?, r.u64()?, r.bytes(NAME_MAX)?))
                };
                let (parent, ino, name) = fields().map_err(|e| bad("entry", e))?;
                ns.load_entry(parent, name, ino).map_err(|e| {
                    format!(
                        "checkpoint record {n}: entry {:?} in {parent} -> {ino}: {e:?}",
                        String::from_utf8_lossy(name)
                    )
                })?;
            }
            PAGES => {
                let mut head = || -> Result<(u64, u32), Errno> { Ok((r.u64()?, r.u32()?)) };
                let (ino, runs) = head().map_err(|e| bad("pages", e))?;
                let inode = ns.reader().inode_by_ino(ino);
                let a = ns.reader().attr(inode);
                let Some(a) = a.filter(|a| a.kind() == Some(kucofs_common::index::Kind::File))
                else {
                    return Err(format!(
                        "checkpoint record {n}: pages of {ino}, which is no regular file"
                    ));
                };
                for _ in 0..runs {
                    let mut run =
                        || -> Result<(u64, u64, u32), Errno> { Ok((r.u64()?, r.u64()?, r.u32()?)) };
                    let (fp, dp, len) = run().map_err(|e| bad("pages", e))?;
                    if dp.checked_add(u64::from(len)).is_none()
                        || fp.checked_add(u64::from(len)).is_none()
                    {
                        return Err(format!("checkpoint record {n}: pages of {ino} overflow"));
                    }
                    // Loaded a commit's worth at a time.
                    let mut done = 0u64;
                    while done < u64::from(len) {
                        let k = (u64::from(len) - done).min(256);
                        let pages: Vec<u64> = (dp + done..dp + done + k).collect();
                        ns.load_pages(inode, fp + done, &pages, &a)
                            .map_err(|e| format!("checkpoint record {n}: pages of {ino}: {e:?}"))?;
                        done += k;
                    }
                }
            }
            t => return Err(format!("checkpoint record {n}: unknown type {t}")),
        }
    }
    Ok(ns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kucofs_common::proto::Request;

    /// A namespace of `files` files with long names in one directory.
    fn namespace(files: usize) -> Namespace {
        let mut ns = Namespace::new(Creds::default(), 1).unwrap();
        let mkdir = Request::Create {
            path: b"d",
            mode: libc::S_IFDIR | 0o755,
            target: b"",
            hint: None,
        };
        ns.execute(&mkdir, Creds::default()).unwrap();
        for i in 0..files {
            let path = format!("d/{i:0>60}");
            let create = Request::Create {
                path: path.as_bytes(),
                mode: libc::S_IFREG | 0o644,
                target: b"",
                hint: None,
            };
            ns.execute(&create, Creds::default()).unwrap();
        }
        ns
    }

    fn entries(ns: &Namespace) -> Vec<(u64, Vec<u8>, u64)> {
        let mut out = Vec::new();
        ns.walk(|_, _| {}, |p, n, i| out.push((p, n.to_vec(), i)));
        out.sort();
        out
    }

    #[test]
    fn a_body_of_several_chunks_reads_back_and_one_too_big_is_enospc() {
        let dir = tempfile::tempdir().unwrap();
        let g = Geometry::for_size(64 << 20).unwrap();
        let region = Region::create(&dir.path().join("img"), g.size, false).unwrap();
        // About 150 bytes a file: three chunks (3 MB) in a 4 MiB slot.
        let ns = namespace(20_000);
        write(&region, &g, 1, 7, &ns).unwrap();
        let read_at = |off: u64, buf: &mut [u8]| region.read(off, buf).is_ok();
        let (h, body) = read(&g, CheckpointRef { slot: 1, seq: 7 }, read_at).unwrap();
        assert!(body.len() > 2 * CHUNK, "{} bytes", body.len());
        assert_eq!((h.inodes, h.entries), (20_002, 20_001));
        assert_eq!(entries(&load(&body).unwrap()), entries(&ns));
        // A namespace the slot cannot hold: refused, and the checkpoint
        // already in the other slot is untouched.
        write(&region, &g, 0, 8, &namespace(3_000)).unwrap();
        assert_eq!(
            write(&region, &g, 1, 9, &namespace(60_000)),
            Err(Errno::ENOSPC)
        );
        assert!(read(&g, CheckpointRef { slot: 0, seq: 8 }, read_at).is_ok());
    }
}
