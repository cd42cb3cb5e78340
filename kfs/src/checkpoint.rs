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

/// A serialized namespace.
#[derive(Debug)]
pub struct Body {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Inode records.
    pub inodes: u64,
    /// Entry records.
    pub entries: u64,
}

/// Serializes the namespace.
pub fn serialize(ns: &Namespace) -> Body {
    let mut bytes = Vec::new();
    let (mut inodes, mut entries) = (0, 0);
    // Two closures write into one buffer in turn, so it is shared through a
    // RefCell.
    let out = std::cell::RefCell::new(&mut bytes);
    ns.walk(
        |a, target| {
            inodes += 1;
            let mut b = out.borrow_mut();
            let mut w = Writer(&mut b);
            w.u8(INODE);
            w.u64(a.ino);
            for v in [a.mode, a.nlink, a.uid, a.gid] {
                w.u32(v);
            }
            w.u64(a.size);
            for t in [a.atime, a.mtime, a.ctime, a.btime] {
                w.u64(t as u64);
            }
            w.bytes(&target.unwrap_or_default());
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
        },
        |parent, name, ino| {
            entries += 1;
            let mut b = out.borrow_mut();
            let mut w = Writer(&mut b);
            w.u8(ENTRY);
            w.u64(parent);
            w.u64(ino);
            w.bytes(name);
        },
    );
    Body {
        bytes,
        inodes,
        entries,
    }
}

/// Writes a checkpoint covering the log before `seq` into `slot` and
/// persists it. `ENOSPC` if it does not fit.
pub fn write(region: &Region, g: &Geometry, slot: u8, seq: u64, body: &Body) -> Result<(), Errno> {
    let area = g.checkpoint_slot(slot);
    let total = (CHECKPOINT_HEADER_SIZE + body.bytes.len()) as u64;
    if total > area.len() {
        return Err(Errno::ENOSPC);
    }
    let header = CheckpointHeader::new(seq, &body.bytes, body.inodes, body.entries);
    let io = |_| Errno::EIO;
    region
        .write_nt(area.offset() + CHECKPOINT_HEADER_SIZE as u64, &body.bytes)
        .map_err(io)?;
    region
        .write_nt(area.offset(), &header.encode())
        .map_err(io)?;
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
    if crc32c::crc32c(&body) != h.body_crc {
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
