//! Reads for an isolated client (ARCHITECTURE.md §2, "daemon mode +
//! threat model"): a daemon's client that maps neither the index nor the
//! image asks Kfs for attributes, directory entries, symlink targets and
//! file data, and Kfs answers only what the caller's credentials allow:
//! search permission on every directory of a path, read permission on a
//! directory it lists, and a file's data only through an open that was
//! allowed to read it. Bulk answers (entries, targets, data) go into the
//! caller's slot of its staging area; Kfs only writes there, and reads
//! nothing back.
//!
//! A node a request names (inode number, offset and generation) is
//! checked against Kfs's inode table: one that is gone or reused is
//! `ESTALE`, and an offset the client made up names nothing. Reaching a
//! node by number skips the path, so Kfs checks what a path would have
//! needed: a directory is reachable if the caller may search every
//! directory above it; anything else only while the caller has it open,
//! or for root (who may search every directory). The same rule holds for
//! the nodes a change or an open names ([`Volume::may_name`]).

use kucofs_common::access::{MAY_EXEC, MAY_READ};
use kucofs_common::index::blockmap::{entry_page, EntrySource, MapReader, PAGE};
use kucofs_common::index::{IndexReader, Ino, InodeOff, Kind, NAME_MAX, PATH_MAX};
use kucofs_common::pm::Shm;
use kucofs_common::proto::{
    At, Entry, Listed, Node, OpenAt, Reply, Request, LISTED_HEAD, STAGE_BYTES,
};
use kucofs_common::Errno;

use super::{Caller, Volume};
use crate::pages::page_index;

/// Entries one listing reads: they fit a slot's part of the staging
/// area however long their names.
const LIST_MAX: usize = 1024;
const _: () = assert!(((LIST_MAX * (LISTED_HEAD + NAME_MAX)) as u64) <= STAGE_BYTES);

/// Whether `caller` may `want` on inode `inode`.
fn permits(r: &IndexReader<'_, Shm>, caller: Caller, inode: InodeOff, want: u32) -> bool {
    r.attr(inode)
        .is_some_and(|a| caller.creds.permits(a.mode, a.uid, a.gid, want))
}

impl Volume {
    /// The inode a request names, checked as the module says.
    fn inode_at(&self, at: At<'_>, caller: Caller) -> Result<InodeOff, Errno> {
        match at {
            At::Path { path, follow } => self.ns.resolve_as(path, follow, &caller.creds),
            At::Node(n) => self.reachable(n, caller),
        }
    }

    /// The inode of node `n` if it is live and `caller` may reach it
    /// without a path.
    fn reachable(&self, n: Node, caller: Caller) -> Result<InodeOff, Errno> {
        self.ns.node_inode(n)?;
        let r = self.ns.reader();
        if r.kind(n.inode) != Some(Kind::Dir) {
            let open = caller.creds.is_root()
                || self
                    .data
                    .clients
                    .get(&caller.client)
                    .is_some_and(|c| c.opens.contains_key(&n.ino));
            return if open {
                Ok(n.inode)
            } else {
                Err(Errno::EACCES)
            };
        }
        // Up to the root, each directory above searchable; a chain longer
        // than any path could be is damage, not a directory.
        let mut cur = n.inode;
        for _ in 0..PATH_MAX {
            if cur == r.root() {
                return Ok(n.inode);
            }
            cur = r.parent(cur);
            if r.kind(cur) != Some(Kind::Dir) {
                return Err(Errno::EIO);
            }
            if !permits(&r, caller, cur, MAY_EXEC) {
                return Err(Errno::EACCES);
            }
        }
        Err(Errno::EIO)
    }

    /// Checks that `caller` may name each node a change or an open names
    /// ([`Entry::In`], [`At::Node`], [`OpenAt::Node`]): live, and
    /// reachable as the module says. What a node-addressed request then
    /// meets is what its path form meets (`Namespace::prepare`).
    pub(super) fn may_name(&self, req: &Request<'_>, caller: Caller) -> Result<(), Errno> {
        let entry = |e: &Entry<'_>| match *e {
            Entry::In { dir, .. } => Some(dir),
            Entry::Path(_) => None,
        };
        let at = |a: &At<'_>| match *a {
            At::Node(n) => Some(n),
            At::Path { .. } => None,
        };
        let nodes = match req {
            Request::Create { at, .. } | Request::Unlink { at, .. } => [entry(at), None],
            Request::Link { from, to, .. } => [at(from), entry(to)],
            Request::Rename { from, to, .. } => [entry(from), entry(to)],
            Request::SetAttr { at: a, .. } => [at(a), None],
            Request::Open { at: o, .. } => match o {
                OpenAt::Entry(e) => [entry(e), None],
                OpenAt::Node(n) => [Some(*n), None],
            },
            _ => [None, None],
        };
        for n in nodes.into_iter().flatten() {
            self.reachable(n, caller)?;
        }
        Ok(())
    }

    /// `caller`'s slot of its staging area: where `bytes` go.
    fn to_staging(&self, caller: Caller, bytes: &[u8]) -> Result<(), Errno> {
        let staging = self
            .data
            .clients
            .get(&caller.client)
            .ok_or(Errno::EINVAL)?
            .staging
            .as_ref()
            .ok_or(Errno::EOPNOTSUPP)?;
        if bytes.len() as u64 > STAGE_BYTES {
            return Err(Errno::EIO);
        }
        staging
            .write(u64::from(caller.slot) * STAGE_BYTES, bytes)
            .map_err(|_| Errno::EFAULT)
    }

    /// [`Request::Stat`](kucofs_common::proto::Request::Stat).
    pub(super) fn stat(&self, at: At<'_>, caller: Caller) -> Result<Reply, Errno> {
        let inode = self.inode_at(at, caller)?;
        self.ns
            .reader()
            .attr(inode)
            .map(Reply::Attr)
            .ok_or(Errno::EIO)
    }

    /// [`Request::Lookup`](kucofs_common::proto::Request::Lookup).
    pub(super) fn lookup(&self, dir: Node, name: &[u8], caller: Caller) -> Result<Reply, Errno> {
        let d = self.reachable(dir, caller)?;
        let r = self.ns.reader();
        if r.kind(d) != Some(Kind::Dir) {
            return Err(Errno::ENOTDIR);
        }
        if !permits(&r, caller, d, MAY_EXEC) {
            return Err(Errno::EACCES);
        }
        let inode = match name {
            b"." => d,
            b".." => r.parent(d),
            _ => {
                kucofs_common::index::check_name(name)?;
                let e = r.lookup(d, name);
                if e.is_null() {
                    return Err(Errno::ENOENT);
                }
                r.dirent_inode(e)
            }
        };
        r.attr(inode).map(Reply::Attr).ok_or(Errno::EIO)
    }

    /// [`Request::ReadDir`](kucofs_common::proto::Request::ReadDir).
    pub(super) fn read_dir(
        &self,
        dir: At<'_>,
        after: Option<(u64, &[u8])>,
        caller: Caller,
    ) -> Result<Reply, Errno> {
        let dir = match dir {
            At::Path { path, .. } => At::Path { path, follow: true },
            n => n,
        };
        let d = self.inode_at(dir, caller)?;
        let r = self.ns.reader();
        if r.kind(d) != Some(Kind::Dir) {
            return Err(Errno::ENOTDIR);
        }
        if !permits(&r, caller, d, MAY_READ) {
            return Err(Errno::EACCES);
        }
        if let Some((_, name)) = after {
            kucofs_common::index::check_name(name)?;
        }
        let mut entries = Vec::new();
        let more = r.read_dir(d, after, LIST_MAX, &mut entries);
        let mut out = Vec::new();
        for e in &entries {
            Listed::of(e).encode(&mut out)?;
        }
        self.to_staging(caller, &out)?;
        Ok(Reply::Listing {
            entries: u32::try_from(entries.len()).map_err(|_| Errno::EIO)?,
            bytes: u32::try_from(out.len()).map_err(|_| Errno::EIO)?,
            more,
        })
    }

    /// [`Request::ReadLink`](kucofs_common::proto::Request::ReadLink).
    pub(super) fn read_link(&self, at: At<'_>, caller: Caller) -> Result<Reply, Errno> {
        let at = match at {
            At::Path { path, .. } => At::Path {
                path,
                follow: false,
            },
            n => n,
        };
        let inode = self.inode_at(at, caller)?;
        let target = self.ns.reader().readlink(inode).ok_or(Errno::EINVAL)?;
        self.to_staging(caller, &target)?;
        Ok(Reply::Size(target.len() as u64))
    }

    /// [`Request::Read`](kucofs_common::proto::Request::Read): the file's
    /// bytes from `offset`, copied page by page out of the image (zeros
    /// for a hole) into the caller's staging slot.
    pub(super) fn read_staged(
        &self,
        ino: Ino,
        offset: u64,
        len: u32,
        caller: Caller,
    ) -> Result<Reply, Errno> {
        let client = self.data.clients.get(&caller.client).ok_or(Errno::EINVAL)?;
        if !client.readable.contains_key(&ino) {
            return Err(Errno::EBADF);
        }
        if u64::from(len) > STAGE_BYTES {
            return Err(Errno::EINVAL);
        }
        let inode = self.ns.file_inode(ino)?;
        let size = self.ns.shm_u64(inode.size());
        let end = offset.saturating_add(u64::from(len)).min(size);
        if offset >= end {
            return Ok(Reply::Size(0));
        }
        let mut data = vec![0u8; page_index(end - offset)];
        let map = MapReader::of_inode(self.ns.shm(), inode);
        let region = self.image.region();
        let mut at = offset;
        while at < end {
            let page = at / PAGE;
            let upto = end.min((page + 1) * PAGE);
            let dst = &mut data[page_index(at - offset)..page_index(upto - offset)];
            let p = entry_page(map.entry(page));
            if !p.is_none() {
                region
                    .read(p.byte_offset() + at % PAGE, dst)
                    .map_err(|_| Errno::EIO)?;
            }
            at = upto;
        }
        self.to_staging(caller, &data)?;
        Ok(Reply::Size(data.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use kucofs_common::channel::SLOTS;
    use kucofs_common::pm::Shm;
    use kucofs_common::proto::{open, Creds, Request, SetAttrs};

    use super::*;

    const ROOT: Caller = Caller {
        client: 0,
        slot: 0,
        creds: Creds::new(0, 0),
    };
    const USER: Caller = Caller {
        client: 2,
        slot: 3,
        creds: Creds::new(1000, 1000),
    };

    fn staging() -> Shm {
        let len = STAGE_BYTES * SLOTS as u64;
        Shm::create("kucofs-test", len, len).unwrap()
    }

    fn ok(v: &mut Volume, req: &Request<'_>, who: Caller) -> Reply {
        v.handle(req, who)
            .unwrap_or_else(|e| panic!("{req:?}: {e:?}"))
    }

    fn make(v: &mut Volume, path: &[u8], mode: u32, target: &[u8]) {
        ok(
            v,
            &Request::Create {
                at: Entry::Path(path),
                mode,
                target,
                hint: None,
            },
            ROOT,
        );
    }

    fn chmod(v: &mut Volume, path: &[u8], mode: u32) {
        let attrs = SetAttrs {
            mode: Some(mode),
            ..SetAttrs::default()
        };
        ok(
            v,
            &Request::SetAttr {
                at: At::Path {
                    path,
                    follow: false,
                },
                attrs,
                now: Default::default(),
            },
            ROOT,
        );
    }

    fn path(path: &[u8], follow: bool) -> At<'_> {
        At::Path { path, follow }
    }

    fn node(a: &kucofs_common::index::InodeAttr) -> Node {
        Node {
            ino: a.ino,
            inode: a.offset,
            gen: a.gen,
        }
    }

    /// `who`'s staging slot's first `n` bytes.
    fn staged(s: &Shm, who: Caller, n: u64) -> Vec<u8> {
        let mut b = vec![0u8; page_index(n)];
        s.try_read(u64::from(who.slot) * STAGE_BYTES, &mut b)
            .unwrap();
        b
    }

    /// Root writes `data` at `offset` of `file` through its staging area.
    fn write(v: &mut Volume, s: &Shm, file: Ino, offset: u64, data: &[u8]) {
        s.write(u64::from(ROOT.slot) * STAGE_BYTES, data).unwrap();
        let len = u32::try_from(data.len()).unwrap();
        ok(
            v,
            &Request::Write {
                ino: file,
                offset,
                len,
            },
            ROOT,
        );
    }

    #[test]
    fn an_isolated_client_reads_what_its_credentials_allow_and_nothing_else() {
        let dir = tempfile::Builder::new()
            .prefix("kucofs-inspect-")
            .tempdir_in("/dev/shm")
            .unwrap();
        let image = dir.path().join("img");
        crate::mkfs(&image, 16 << 20, false).unwrap();
        let mut v = Volume::open(&image).unwrap();
        let (root_stage, user_stage) = (staging(), staging());
        v.attach_client(
            0,
            None,
            Default::default(),
            Some(root_stage.map_again().unwrap()),
        );
        v.attach_client(
            2,
            None,
            Default::default(),
            Some(user_stage.map_again().unwrap()),
        );
        make(&mut v, b"d", libc::S_IFDIR | 0o755, b"");
        make(&mut v, b"d/f", libc::S_IFREG | 0o644, b"");
        chmod(&mut v, b"d", 0o700);
        make(&mut v, b"pub", libc::S_IFDIR | 0o755, b"");
        make(&mut v, b"pub/l", libc::S_IFLNK | 0o777, b"data");
        make(&mut v, b"pub/secret", libc::S_IFREG | 0o600, b"");
        // A file of two runs of data with a hole between.
        let (file, _) = ok(
            &mut v,
            &Request::Open {
                at: OpenAt::Entry(Entry::Path(b"pub/data")),
                flags: open::WRITE | open::CREATE,
                mode: 0o644,
                hint: None,
            },
            ROOT,
        )
        .into_open()
        .unwrap();
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        write(&mut v, &root_stage, file.ino, 0, &big);
        write(&mut v, &root_stage, file.ino, 600_000, b"tail");
        let mut model = big.clone();
        model.resize(600_000, 0);
        model.extend_from_slice(b"tail");

        // Paths through a directory it may not search, and its listing.
        let stat = |v: &mut Volume, at: At<'_>| v.handle(&Request::Stat { at }, USER);
        assert_eq!(stat(&mut v, path(b"d/f", true)), Err(Errno::EACCES));
        let d = stat(&mut v, path(b"d", true)).unwrap().into_attr().unwrap();
        let list =
            |v: &mut Volume, dir: At<'_>, after| v.handle(&Request::ReadDir { dir, after }, USER);
        assert_eq!(list(&mut v, path(b"d", true), None), Err(Errno::EACCES));
        assert_eq!(list(&mut v, At::Node(node(&d)), None), Err(Errno::EACCES));
        let lookup =
            |v: &mut Volume, dir, name: &[u8]| v.handle(&Request::Lookup { dir, name }, USER);
        assert_eq!(lookup(&mut v, node(&d), b"f"), Err(Errno::EACCES));

        // What it may see.
        let p = stat(&mut v, path(b"pub", true))
            .unwrap()
            .into_attr()
            .unwrap();
        let found = lookup(&mut v, node(&p), b"data")
            .unwrap()
            .into_attr()
            .unwrap();
        assert_eq!((found.ino, found.size), (file.ino, 600_004));
        assert_eq!(
            stat(&mut v, path(b"pub/l", true))
                .unwrap()
                .into_attr()
                .unwrap(),
            found
        );
        assert_eq!(lookup(&mut v, node(&p), b"none"), Err(Errno::ENOENT));
        assert_eq!(lookup(&mut v, node(&p), b"a/b"), Err(Errno::EINVAL));
        let Ok(Reply::Listing {
            entries,
            bytes,
            more,
        }) = list(&mut v, path(b"pub", true), None)
        else {
            panic!("a listing");
        };
        let buf = staged(&user_stage, USER, u64::from(bytes));
        let listed = Listed::decode_all(&buf, entries).unwrap();
        let mut names: Vec<&[u8]> = listed.iter().map(|l| l.name).collect();
        names.sort_unstable();
        assert_eq!(names, [&b"data"[..], b"l", b"secret"]);
        assert!(!more);
        // From after the first entry, the others.
        let first = (listed[0].hash, listed[0].name);
        let Ok(Reply::Listing { entries, .. }) = list(&mut v, At::Node(node(&p)), Some(first))
        else {
            panic!("a listing");
        };
        assert_eq!(entries, 2);
        let target = v
            .handle(
                &Request::ReadLink {
                    at: path(b"pub/l", true),
                },
                USER,
            )
            .unwrap()
            .into_size()
            .unwrap();
        assert_eq!(staged(&user_stage, USER, target), b"data");

        // Nodes: a wrong generation, a made-up offset, a file not open.
        let stale = Node {
            gen: found.gen + 1,
            ..node(&found)
        };
        assert_eq!(stat(&mut v, At::Node(stale)), Err(Errno::ESTALE));
        let inside = Node {
            inode: InodeOff::new(found.offset.get() + 8),
            ..node(&found)
        };
        assert_eq!(stat(&mut v, At::Node(inside)), Err(Errno::ESTALE));
        assert_eq!(stat(&mut v, At::Node(node(&found))), Err(Errno::EACCES));

        // Data: only through an open allowed to read, a slot at a time.
        let read =
            |v: &mut Volume, ino, offset, len| v.handle(&Request::Read { ino, offset, len }, USER);
        assert_eq!(read(&mut v, file.ino, 0, 10), Err(Errno::EBADF));
        let open_read = |v: &mut Volume, path: &[u8]| {
            let req = Request::Open {
                at: OpenAt::Entry(Entry::Path(path)),
                flags: 0,
                mode: 0,
                hint: None,
            };
            v.handle(&req, USER).unwrap().into_open().unwrap().0
        };
        open_read(&mut v, b"pub/data");
        assert!(stat(&mut v, At::Node(node(&found))).is_ok());
        let mut got = Vec::new();
        while (got.len() as u64) < found.size + 10 {
            let len = u32::try_from(STAGE_BYTES).unwrap();
            let n = read(&mut v, file.ino, got.len() as u64, len)
                .unwrap()
                .into_size()
                .unwrap();
            if n == 0 {
                break;
            }
            got.extend(staged(&user_stage, USER, n));
        }
        assert!(got == model, "the file's bytes, the hole as zeros");
        let too_big = u32::try_from(STAGE_BYTES + 1).unwrap();
        assert_eq!(read(&mut v, file.ino, 0, too_big), Err(Errno::EINVAL));
        // A file it may not read: the open is refused, and without one
        // the data is too.
        let open_secret = Request::Open {
            at: OpenAt::Entry(Entry::Path(b"pub/secret")),
            flags: 0,
            mode: 0,
            hint: None,
        };
        assert_eq!(v.handle(&open_secret, USER), Err(Errno::EACCES));
        let secret = stat(&mut v, path(b"pub/secret", true))
            .unwrap()
            .into_attr()
            .unwrap();
        assert_eq!(read(&mut v, secret.ino, 0, 10), Err(Errno::EBADF));
        v.close().unwrap();
    }
}
