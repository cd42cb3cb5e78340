use std::collections::BTreeMap;

use kucofs_common::format::PageNo;
use kucofs_common::index::blockmap::{EntrySource, PAGE};
use kucofs_common::index::{Ino, InodeOff, Kind};
use kucofs_common::pm::Recorder;
use kucofs_common::proto::{At, Entry, OpenAt};
use parking_lot::Mutex;

use super::*;
use crate::provision::Behind;
use crate::recovery::RecoveryError;
use crate::store::LoadError;

/// What [`Volume::handle`] answers.
type Answer = std::result::Result<Reply, Errno>;

/// The fields of an answer the tests below look at, whatever its kind: 0
/// or the errno; a node's inode number and offset; a grant's first page;
/// a grant's first count, a size, or 1 for an open that created its file
/// in `value`; a grant's runs.
trait Fields {
    fn errno(&self) -> i32;
    fn ino(&self) -> Ino;
    fn inode(&self) -> InodeOff;
    fn page(&self) -> u64;
    fn value(&self) -> u64;
    fn granted(&self) -> std::vec::IntoIter<(u64, u64)>;
}

impl Fields for Answer {
    fn errno(&self) -> i32 {
        self.as_ref().err().map_or(0, |e| e.get())
    }
    fn ino(&self) -> Ino {
        self.and_then(Reply::into_node)
            .map_or(Ino::default(), |n| n.ino)
    }
    fn inode(&self) -> InodeOff {
        self.and_then(Reply::into_node)
            .map_or(InodeOff::NULL, |n| n.inode)
    }
    fn page(&self) -> u64 {
        self.and_then(Reply::into_grant)
            .map_or(0, |g| g.first().0.get())
    }
    fn value(&self) -> u64 {
        match *self {
            Ok(Reply::Grant(g)) => g.first().1,
            Ok(Reply::Size(s)) => s,
            Ok(Reply::Open { created, .. }) => u64::from(created),
            _ => 0,
        }
    }
    fn granted(&self) -> std::vec::IntoIter<(u64, u64)> {
        let runs: Vec<_> = self.and_then(Reply::into_grant).map_or(Vec::new(), |g| {
            g.runs().map(|(s, n)| (s.get(), n)).collect()
        });
        runs.into_iter()
    }
}

const ME: Caller = Caller {
    client: 0,
    slot: 0,
    creds: Creds::new(0, 0),
};

fn shm_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("kucofs-volume-")
        .tempdir_in("/dev/shm")
        .unwrap()
}

/// A fresh 16 MiB image, opened (the directory holds it).
fn volume() -> (tempfile::TempDir, std::path::PathBuf, Volume) {
    volume_of(16 << 20)
}

/// A fresh volume on an image of `bytes`.
fn volume_of(bytes: u64) -> (tempfile::TempDir, std::path::PathBuf, Volume) {
    let dir = shm_dir();
    let path = dir.path().join("img");
    crate::mkfs(&path, bytes, false).unwrap();
    let v = Volume::open(&path).unwrap();
    (dir, path, v)
}

/// A fresh volume on a sparse image of `bytes`, whose data pages take
/// memory as they are provisioned or granted.
fn sparse_volume_of(bytes: u64) -> (tempfile::TempDir, std::path::PathBuf, Volume) {
    use kucofs_common::pm::{Hardware, Space};
    let dir = shm_dir();
    let path = dir.path().join("img");
    let persist = std::sync::Arc::new(Hardware::new());
    crate::mkfs_with(&path, bytes, false, Space::Sparse, persist).unwrap();
    let v = Volume::open(&path).unwrap();
    assert!(!v.image().region().is_reserved());
    (dir, path, v)
}

/// Opens (creating) `path` for writing.
fn open_for_write(v: &mut Volume, who: Caller, path: &str) -> Answer {
    v.handle(
        &Request::Open {
            at: OpenAt::Entry(Entry::Path(path.as_bytes())),
            flags: kucofs_common::proto::open::WRITE | kucofs_common::proto::open::CREATE,
            mode: 0o644,
            hint: None,
        },
        who,
    )
}

/// A commit of region pages `start..start + len` as file `ino`'s pages
/// from `first`, naming size `size`.
fn commit(ino: Ino, first: u64, size: u64, start: u64, len: u32) -> Request<'static> {
    let mut extents = kucofs_common::proto::Extents::new();
    extents.push(PageNo::new(start), len);
    Request::Commit {
        ino,
        first,
        size,
        extents,
    }
}

fn create(v: &mut Volume, path: &str, dir: bool) -> Answer {
    let mode = if dir {
        libc::S_IFDIR | 0o755
    } else {
        libc::S_IFREG | 0o644
    };
    v.handle(
        &Request::Create {
            at: Entry::Path(path.as_bytes()),
            mode,
            target: b"",
            hint: None,
        },
        ME,
    )
}

/// The whole tree as (path -> (kind, nlink, mode)).
fn tree(ns: &Namespace) -> BTreeMap<String, (Kind, u32, u32, u64)> {
    let r = ns.reader();
    let mut out = BTreeMap::new();
    let mut stack = vec![(r.root(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let mut es = Vec::new();
        r.read_dir(dir, None, usize::MAX, &mut es);
        for e in es {
            let path = format!("{prefix}/{}", String::from_utf8_lossy(&e.name));
            let a = r.attr(e.inode).unwrap();
            out.insert(path.clone(), (e.kind, a.nlink, a.mode, a.ino.get()));
            if e.kind == Kind::Dir {
                stack.push((e.inode, path));
            }
        }
    }
    out
}

#[test]
fn a_tree_survives_a_clean_close_and_a_crash() {
    let (_dir, path, mut v) = volume();
    assert!(!v.image().superblock().clean);
    let _ = create(&mut v, "a", true);
    let _ = create(&mut v, "a/f", false);
    let _ = v.handle(
        &Request::Link {
            from: At::Path {
                path: b"a/f",
                follow: false,
            },
            to: Entry::Path(b"g"),
            hint: None,
        },
        ME,
    );
    let before = tree(v.namespace());
    assert_eq!(before.len(), 3);
    v.close().unwrap();
    assert!(crate::inspect(&path).unwrap().superblock.clean);

    let mut v = Volume::open(&path).unwrap();
    assert_eq!(tree(v.namespace()), before);
    assert_eq!(v.replayed().entries, 0, "a clean close leaves an empty log");
    // Changes after the reopen, then a crash: the log carries them.
    let _ = create(&mut v, "a/h", false);
    let _ = v.handle(
        &Request::Unlink {
            at: Entry::Path(b"g"),
            rmdir: false,
            hint: None,
        },
        ME,
    );
    let after = tree(v.namespace());
    drop(v);
    assert!(!crate::inspect(&path).unwrap().superblock.clean);
    let v = Volume::open(&path).unwrap();
    assert_eq!(v.replayed().entries, 2);
    assert_eq!(tree(v.namespace()), after);
}

#[test]
fn checkpoints_taken_as_the_log_fills_lose_nothing() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    // An 8 MiB image has a 512 KiB log: a checkpoint every ~3000 changes.
    crate::mkfs(&path, 8 << 20, false).unwrap();
    let mut v = Volume::open(&path).unwrap();
    let _ = create(&mut v, "d", true);
    for i in 0..8000 {
        let r = create(&mut v, &format!("d/file-with-a-longish-name-{i}"), false);
        assert_eq!(r.errno(), 0, "create {i}");
        if i % 2 == 0 {
            let p = format!("d/file-with-a-longish-name-{i}");
            assert_eq!(
                v.handle(
                    &Request::Unlink {
                        at: Entry::Path(p.as_bytes()),
                        rmdir: false,
                        hint: None
                    },
                    ME
                )
                .errno(),
                0
            );
        }
    }
    assert!(v.checkpoints() >= 3, "only {} checkpoints", v.checkpoints());
    let expected = tree(v.namespace());
    drop(v);
    let v = Volume::open(&path).unwrap();
    assert_eq!(tree(v.namespace()), expected);
    assert_eq!(expected.len(), 1 + 4000);
}

/// Runs `act` on a volume opened on `path` with a recorder, and checks the
/// crash images of it: the durable image at its reply recovers to the state
/// after it (`what` names the change lost otherwise), and every image a
/// crash could leave at one of its fences to the state before or after.
/// `state` reads the state of a volume, live or recovered; `prepare` runs
/// before the recording starts. Returns what `prepare` returned, and the
/// state after.
fn check_crash_images<T: PartialEq + std::fmt::Debug, P>(
    path: &std::path::Path,
    what: &str,
    prepare: impl FnOnce(&mut Volume) -> P,
    act: impl FnOnce(&mut Volume, &P),
    state: impl Fn(&Volume, &P) -> T,
) -> (P, T) {
    let rec = Arc::new(Recorder::new());
    let mut v = Volume::open_with(path, rec.clone()).unwrap();
    let p = prepare(&mut v);
    let before = state(&v, &p);
    let images = Arc::new(Mutex::new(Vec::new()));
    let sink = images.clone();
    rec.on_fence(move |cp| {
        sink.lock()
            .extend(cp.images(1 << 12).expect("few stores in flight"))
    });
    act(&mut v, &p);
    let after = state(&v, &p);
    // After the reply, the durable image alone must hold the change.
    let durable = rec.durable_image();
    let images = std::mem::take(&mut *images.lock());
    drop(v);
    assert!(!images.is_empty());
    let recovered = |image: &[u8]| {
        let img_path = path.with_extension("crash");
        std::fs::write(&img_path, image).unwrap();
        state(&Volume::open(&img_path).unwrap(), &p)
    };
    assert_eq!(
        recovered(&durable),
        after,
        "an acknowledged {what} was lost"
    );
    for image in &images {
        let t = recovered(image);
        assert!(
            t == before || t == after,
            "a crash image recovered to neither state: {t:?}"
        );
    }
    (p, after)
}

#[test]
fn every_crash_image_of_a_create_recovers_to_before_or_after() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    crate::mkfs(&path, 1 << 20, false).unwrap();
    check_crash_images(
        &path,
        "create",
        |v| {
            let _ = create(v, "keep", false);
        },
        |v, _| assert_eq!(create(v, "new", true).errno(), 0),
        |v, _| tree(v.namespace()),
    );
}

/// A commit's log entry is written before the index takes the change and
/// fenced after, before the reply: the durable image at the reply holds
/// it, and one taken at the fence's start (the entry may not have drained)
/// recovers to before or after the write.
#[test]
fn a_commit_is_durable_at_its_reply_and_whole_in_every_crash_image() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    crate::mkfs(&path, 16 << 20, false).unwrap();
    let ((_, g), after) = check_crash_images(
        &path,
        "write",
        |v| a_file_and_a_grant(v, 2),
        |v, (f, g)| {
            assert_eq!(
                v.handle(&commit(f.ino(), 1, 2 * 4096, g.page(), 1), ME)
                    .errno(),
                0
            )
        },
        |v, (f, _)| {
            let inode = v.ns.file_inode(f.ino()).unwrap();
            let mut pages = Vec::new();
            v.ns.file_pages(inode, |p, d| pages.push((p, d.get())));
            let size = v.ns.shm_u64(inode.size());
            (size, pages)
        },
    );
    assert_eq!(after, (2 * 4096, vec![(1, g.page())]));
}

/// A client thread applying its own commit copies the commit's data just
/// before, with non-temporal stores it does not fence (the commit's checks
/// run while they drain): the commit fences them before its log entry, so
/// no crash image holds the entry without the data it names.
#[test]
fn a_commit_fences_the_data_stored_before_it_ahead_of_its_entry() {
    let dir = shm_dir();
    let path = dir.path().join("img");
    crate::mkfs(&path, 16 << 20, false).unwrap();
    let data = [0x5a_u8; 64];
    let (_, after) = check_crash_images(
        &path,
        "write",
        |v| a_file_and_a_grant(v, 1),
        |v, (f, g)| {
            let region = v.image.region();
            region.write_nt(g.page() * PAGE, &data).unwrap();
            assert_eq!(
                v.handle(&commit(f.ino(), 0, 64, g.page(), 1), ME).errno(),
                0
            )
        },
        |v, (f, _)| {
            let inode = v.ns.file_inode(f.ino()).unwrap();
            let mut pages = Vec::new();
            v.ns.file_pages(inode, |p, d| pages.push((p, d.get())));
            let held = pages.first().map(|&(_, d)| {
                let mut b = [0u8; 64];
                v.image.region().read(d * PAGE, &mut b).unwrap();
                b.to_vec()
            });
            (pages.len(), held)
        },
    );
    assert_eq!(after, (1, Some(data.to_vec())));
}

/// Clients 0 (`ME`) and 1, without views; client 0 has file "f" open for
/// writing. Returns client 1 and the open.
fn two_clients_one_writing(v: &mut Volume) -> (Caller, Answer) {
    v.attach_client(0, None, Default::default(), None);
    v.attach_client(1, None, Default::default(), None);
    let f = open_for_write(v, ME, "f");
    assert_eq!(f.errno(), 0);
    (Caller { client: 1, ..ME }, f)
}

/// Write leases and pools belong to a client: a second client may open a
/// leased file for writing but not commit to it without the lease, nor
/// commit pages of another client's pool, and a client that goes away
/// gives back its leases, its opens (dropping an unlinked file it kept)
/// and its unused pool pages.
#[test]
fn a_detached_client_loses_its_leases_opens_and_pools() {
    let (_dir, _, mut v) = volume();
    let (other, f) = two_clients_one_writing(&mut v);
    let truncating = Request::Open {
        at: OpenAt::Entry(Entry::Path(b"f")),
        flags: kucofs_common::proto::open::WRITE | kucofs_common::proto::open::TRUNC,
        mode: 0,
        hint: None,
    };
    // Another client's write may be under way: no truncation at open.
    assert_eq!(v.handle(&truncating, other).errno(), libc::ETXTBSY);
    assert_eq!(open_for_write(&mut v, other, "f").errno(), 0);
    let free = v.pages().free_pages();
    let g = v.handle(&Request::Grant { pages: 8 }, ME);
    assert_eq!((g.errno(), g.value()), (0, 8));
    let commit = commit(f.ino(), 0, 10, g.page(), 1);
    // Not the lease holder: refused (it may ask for the lease); the
    // holder: accepted.
    assert_eq!(v.handle(&commit, other).errno(), libc::ESTALE);
    assert_eq!(v.handle(&commit, ME).errno(), 0);
    let close = Request::Close {
        ino: f.ino(),
        write: true,
    };
    assert_eq!(v.handle(&close, other).errno(), 0);
    // Without a write open there is no lease to ask for.
    let lease = Request::Lease { ino: f.ino() };
    assert_eq!(v.handle(&lease, other).errno(), libc::EBADF);
    // Unlinked while open, the file stays until its opener goes.
    assert_eq!(
        v.handle(
            &Request::Unlink {
                at: Entry::Path(b"f"),
                rmdir: false,
                hint: None
            },
            ME
        )
        .errno(),
        0
    );
    assert_eq!(v.namespace().file_inode(f.ino()), Ok(f.inode()));
    v.detach_client(0).unwrap();
    assert_eq!(v.namespace().file_inode(f.ino()), Err(Errno::ENOENT));
    // Seven unused pool pages came back at once; the committed one waits
    // for its grace period.
    assert_eq!(v.pages().free_pages(), free - 1);
    assert!(v.reclaim_now() > 0);
    assert_eq!(v.pages().free_pages(), free);
    let g2 = open_for_write(&mut v, other, "f");
    assert_eq!(g2.errno(), 0);
    v.close().unwrap();
}

/// The lease moves between clients that write one file (ARCHITECTURE.md
/// §8): at once when the holder is not writing; at the end of its write
/// (the request its slot marks last) when it is; at once after the bound
/// whatever it does. A commit made under a generation the lease no longer
/// has is refused with `ESTALE`, and so is one of a client that lost it.
#[test]
fn leases_move_between_writers_at_the_ends_of_their_writes() {
    use kucofs_common::channel::Segment;
    let (_dir, _, mut v) = volume();
    let (other, f) = two_clients_one_writing(&mut v);
    let (mine, theirs) = (Segment::create().unwrap(), Segment::create().unwrap());
    v.set_readers(std::sync::Arc::new(parking_lot::Mutex::new(vec![
        (0, mine.map_again().unwrap()),
        (1, theirs.map_again().unwrap()),
    ])));
    assert_eq!(open_for_write(&mut v, other, "f").errno(), 0);
    let lease = Request::Lease { ino: f.ino() };
    let ino = f.ino().get();
    let grant = |v: &mut Volume, who| v.handle(&Request::Grant { pages: 4 }, who).page();
    let (my_pages, their_pages) = (grant(&mut v, ME), grant(&mut v, other));
    let mine_at = |p: u64| commit(f.ino(), 0, 10, my_pages + p, 1);
    let theirs_at = |p: u64| commit(f.ino(), 0, 10, their_pages + p, 1);

    // The holder (ME, since its open) is not writing: the lease moves.
    let g1 = v.handle(&lease, other);
    assert_eq!(g1.errno(), 0);
    assert_eq!(v.handle(&mine_at(0), ME).errno(), libc::ESTALE);
    // Asked again by the holder: the same generation.
    assert_eq!(v.handle(&lease, other), g1);

    // The other client writes (marked, not yet last): ME waits.
    theirs.mark_write(0, ino, g1.value());
    assert_eq!(v.handle(&lease, ME).errno(), libc::EAGAIN);
    assert_eq!(v.handle(&theirs_at(0), other).errno(), 0);
    assert_eq!(v.handle(&lease, ME).errno(), libc::EAGAIN);
    // Its last request: the lease goes to ME as soon as it is applied.
    theirs.mark_last(0);
    assert_eq!(v.handle(&theirs_at(1), other).errno(), 0);
    let g2 = v.handle(&lease, ME);
    assert_eq!(g2.errno(), 0);
    assert!(g2.value() > g1.value());
    // The other client's next write, made under the old generation, is
    // refused; ME's, under the new one, is applied.
    theirs.mark_write(0, ino, g1.value());
    assert_eq!(v.handle(&theirs_at(2), other).errno(), libc::ESTALE);
    mine.mark_write(0, ino, g2.value());
    assert_eq!(v.handle(&mine_at(1), ME).errno(), 0);
    theirs.clear_write(0);

    // ME stays marked as a stopped writer would: past the bound the lease
    // is taken anyway, and ME's late commit is refused.
    v.set_lease_wait(std::time::Duration::ZERO);
    let g3 = v.handle(&lease, other);
    assert_eq!(g3.errno(), 0);
    assert!(g3.value() > g2.value());
    assert_eq!(v.handle(&mine_at(2), ME).errno(), libc::ESTALE);
    theirs.mark_write(0, ino, g3.value());
    assert_eq!(v.handle(&theirs_at(3), other).errno(), 0);
    v.close().unwrap();
}

/// A client whose thread holds a reader epoch past the bound is evicted
/// (ARCHITECTURE.md §9): its segment says so before anything it may read
/// is freed, reclamation stops waiting for it, the daemon is told to
/// close its connection, and its requests fail with `ENOTCONN`; the
/// other client is untouched.
#[test]
fn a_client_holding_its_reader_epoch_too_long_is_evicted() {
    use kucofs_common::channel::Segment;
    let (_dir, _, mut v) = volume();
    let (other, _f) = two_clients_one_writing(&mut v);
    let (mine, theirs) = (Segment::create().unwrap(), Segment::create().unwrap());
    v.set_readers(std::sync::Arc::new(parking_lot::Mutex::new(vec![
        (0, mine.map_again().unwrap()),
        (1, theirs.map_again().unwrap()),
    ])));
    // Client 1 enters a read section and stays; then a file is made and
    // removed, which retires index items it might be reading.
    theirs.pin(5, || v.namespace().epoch());
    assert_eq!(create(&mut v, "g", false).errno(), 0);
    let unlink = Request::Unlink {
        at: Entry::Path(b"g"),
        rmdir: false,
        hint: None,
    };
    assert_eq!(v.handle(&unlink, ME).errno(), 0);
    // Without eviction, nothing is freed while it stays.
    assert_eq!(v.reclaim_now(), 0);
    assert_eq!(v.reclaim_now(), 0);
    assert!(!theirs.evicted());
    // With a bound (zero here: the first look is past it), it is evicted.
    v.set_eviction(Some(std::time::Duration::ZERO));
    assert!(v.reclaim_now() > 0);
    assert!(theirs.evicted());
    assert!(!mine.evicted());
    assert_eq!(v.take_evicted(), vec![1]);
    assert_eq!(v.take_evicted(), Vec::<u32>::new());
    assert_eq!(v.handle(&Request::Ping, other).errno(), libc::ENOTCONN);
    assert_eq!(create(&mut v, "h", false).errno(), 0);
    v.detach_client(1).unwrap();
    v.close().unwrap();
}

/// Client 0, attached under batched protection with a view of its own,
/// and its open for writing of file "f".
fn batched_writer(v: &mut Volume) -> (kucofs_common::pm::RegionView, Answer) {
    let view = v.image().region().view().unwrap();
    v.attach_client(
        0,
        view.protector(),
        kucofs_common::pm::Protection::Batched,
        None,
    );
    let f = open_for_write(v, ME, "f");
    assert_eq!(f.errno(), 0);
    (view, f)
}

/// A [`batched_writer`] (client 0), and client 1 attached under `off`
/// with a view of its own: client 0's view, its open of "f", client 1's
/// view and client 1.
fn batched_writer_and_a_client_under_off(
    v: &mut Volume,
) -> (
    kucofs_common::pm::RegionView,
    Answer,
    kucofs_common::pm::RegionView,
    Caller,
) {
    let (view, f) = batched_writer(v);
    let other_view = v.image().region().view().unwrap();
    v.attach_client(
        1,
        other_view.protector(),
        kucofs_common::pm::Protection::Off,
        None,
    );
    (view, f, other_view, Caller { client: 1, ..ME })
}

/// Grants client 0 (a [`batched_writer`] of `f`) `pages` pool pages and
/// commits file page 0 of `f` into the first of them, then into the
/// second, so the first is replaced; then lets the batch expire. Returns
/// the grant's reply.
fn replace_a_page_within_a_batch(v: &mut Volume, f: &Answer, pages: u32) -> Answer {
    let g = v.handle(&Request::Grant { pages }, ME);
    assert_eq!(g.errno(), 0);
    for page in [g.page(), g.page() + 1] {
        assert_eq!(v.handle(&commit(f.ino(), 0, 1, page, 1), ME).errno(), 0);
    }
    let_the_batches_expire(v);
    g
}

/// Waits out the batches' time bound, then has them flipped as Kfs would.
fn let_the_batches_expire(v: &mut Volume) {
    std::thread::sleep(kucofs_common::pm::BATCH_TIME + std::time::Duration::from_millis(2));
    v.expire_protection();
}

/// The read and write letters ("rw" or "r-") of region page `page` in
/// `view`, from `/proc/self/maps`.
fn perms(view: &kucofs_common::pm::RegionView, page: u64) -> String {
    let addr = view.window_address() + usize::try_from(page * 4096).unwrap();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .find_map(|l| {
            let (range, rest) = l.split_once(' ')?;
            let (a, b) = range.split_once('-')?;
            let (a, b) = (
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            );
            (a <= addr && addr < b).then(|| rest[..2].to_owned())
        })
        .unwrap()
}

/// Pool pages are writable in the client's view; a commit makes its pages
/// read-only again at once under strict protection, and under batched
/// protection once `BATCH_TIME` has passed (when Kfs next keeps house).
#[test]
fn committed_pages_become_read_only_as_the_protection_mode_says() {
    use kucofs_common::pm::Protection;
    let (_dir, _, mut v) = volume();
    let view = v.image().region().view().unwrap();
    for (client, mode) in [(0, Protection::Strict), (1, Protection::Batched)] {
        let me = Caller { client, ..ME };
        v.attach_client(client, view.protector(), mode, None);
        let f = open_for_write(&mut v, me, &format!("f{client}"));
        assert_eq!(f.errno(), 0);
        let g = v.handle(&Request::Grant { pages: 4 }, me);
        assert_eq!(g.errno(), 0);
        assert_eq!(perms(&view, g.page()), "rw");
        assert_eq!(v.handle(&commit(f.ino(), 0, 1, g.page(), 1), me).errno(), 0);
        match mode {
            Protection::Strict => assert_eq!(perms(&view, g.page()), "r-"),
            _ => {
                assert_eq!(perms(&view, g.page()), "rw");
                let_the_batches_expire(&mut v);
                assert_eq!(perms(&view, g.page()), "r-");
            }
        }
        // The rest of the pool stays writable.
        assert_eq!(perms(&view, g.page() + 1), "rw");
    }
    v.close().unwrap();
}

/// How far the coarse clock that stamps changes lags the precise one.
fn coarse_tick() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_getres(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    assert_eq!(rc, 0, "clock_getres");
    std::time::Duration::new(
        u64::try_from(ts.tv_sec).expect("a resolution is not negative"),
        u32::try_from(ts.tv_nsec).expect("below a second"),
    )
}

/// Under batched protection a batch is made read-only once it holds
/// `BATCH_PAGES` committed pages, without waiting for its time bound.
#[test]
fn a_batch_is_made_read_only_once_it_holds_batch_pages() {
    use kucofs_common::pm::{BATCH_PAGES, BATCH_TIME};
    // Large enough that one grant may hand out more than a batch (a grant
    // takes at most an eighth of the free pages).
    let (_dir, _, mut v) = volume_of(64 << 20);
    let (view, f) = batched_writer(&mut v);
    let g = v.handle(
        &Request::Grant {
            pages: u32::try_from(BATCH_PAGES + 1).unwrap(),
        },
        ME,
    );
    assert_eq!(g.errno(), 0);
    assert_eq!(g.value(), BATCH_PAGES + 1);
    // Commits of up to 256 pages each: few enough to fit inside the
    // batch's time bound even in a debug build.
    let commit_run = |v: &mut Volume, first: u64, n: u64| {
        let c = commit(
            f.ino(),
            first,
            (first + n - 1) * 4096 + 1,
            g.page() + first,
            u32::try_from(n).unwrap(),
        );
        assert_eq!(v.handle(&c, ME).errno(), 0);
    };
    let started = std::time::Instant::now();
    let mut first = 0;
    while first < BATCH_PAGES - 1 {
        let n = (BATCH_PAGES - 1 - first).min(256);
        commit_run(&mut v, first, n);
        first += n;
    }
    // A batch opens at its first commit's stamp less the lead a stamp may
    // have on the coarse clock, and closes when a stamp reaches its
    // deadline: it may expire this much sooner than the time bound, by
    // this test's clock.
    let lead = std::time::Duration::from_nanos(
        u64::try_from(crate::namespace::STAMP_LEAD).expect("a positive lead"),
    );
    let bound = BATCH_TIME.saturating_sub(2 * lead + coarse_tick());
    let fast = started.elapsed() < bound;
    if fast {
        // One page short of a batch, and inside its time bound.
        assert_eq!(perms(&view, g.page()), "rw");
    }
    commit_run(&mut v, BATCH_PAGES - 1, 1);
    if !fast || started.elapsed() >= bound {
        println!(
            "SKIPPED: the commits outlasted the batch's time bound, which may have flushed it \
             (the page bound was not what was checked)"
        );
        return;
    }
    for i in [0, BATCH_PAGES - 1] {
        assert_eq!(perms(&view, g.page() + i), "r-", "page {i}");
    }
    // The pool's last page was not committed: still writable.
    assert_eq!(perms(&view, g.page() + BATCH_PAGES), "rw");
    v.close().unwrap();
}

/// Under batched protection, a batch's flush makes read-only every page
/// it committed that a file still holds, and leaves writable the pool
/// pages between them and the pages replaced since. A replaced page
/// granted to another client becomes writable for that client only.
#[test]
fn a_batch_flush_spares_pool_pages_and_replaced_pages() {
    let (_dir, _, mut v) = volume();
    let (view, f, other_view, other) = batched_writer_and_a_client_under_off(&mut v);
    // File page 0 lives in g.inode, then in g.inode + 1.
    let g = replace_a_page_within_a_batch(&mut v, &f, 4);
    assert_eq!(perms(&view, g.page() + 1), "r-", "in the file");
    assert_eq!(perms(&view, g.page()), "rw", "replaced");
    assert_eq!(perms(&view, g.page() + 2), "rw", "in the pool");
    // Once free, the replaced page is the lowest free page; another client
    // (under `off`, which takes the lowest) gets it, writable for it only.
    v.reclaim_now();
    let o = v.handle(&Request::Grant { pages: 1 }, other);
    assert_eq!(o.errno(), 0);
    assert_eq!(o.page(), g.page());
    assert_eq!(perms(&view, g.page()), "r-");
    assert_eq!(perms(&other_view, g.page()), "rw");
    // A batch of two runs with a pool page between them: one flush, and
    // the pool page stays writable.
    let g = v.handle(&Request::Grant { pages: 4 }, ME);
    assert_eq!(g.errno(), 0);
    for (page, at) in [(1, g.page()), (2, g.page() + 2)] {
        let c = commit(f.ino(), page, page * 4096 + 1, at, 1);
        assert_eq!(v.handle(&c, ME).errno(), 0);
    }
    let_the_batches_expire(&mut v);
    let got: Vec<String> = (0..4).map(|i| perms(&view, g.page() + i)).collect();
    assert_eq!(got, ["r-", "rw", "r-", "rw"]);
    v.close().unwrap();
}

/// Under batched protection, a page replaced within its batch is still
/// writable once free, so the next grant to the same client takes it (the
/// lowest free page) and changes no protection, where a read-only one
/// would have sent the grant to a long run of fresh pages.
#[test]
fn a_page_replaced_within_its_batch_is_granted_back_writable() {
    let (_dir, _, mut v) = volume();
    let (view, f) = batched_writer(&mut v);
    let g = replace_a_page_within_a_batch(&mut v, &f, 4);
    v.reclaim_now();
    let again = v.handle(&Request::Grant { pages: 1 }, ME);
    assert_eq!(again.errno(), 0);
    assert_eq!((again.page(), again.value()), (g.page(), 1));
    assert_eq!(perms(&view, g.page()), "rw");
    // It takes a commit like any pool page.
    assert_eq!(
        v.handle(&commit(f.ino(), 1, 4097, g.page(), 1), ME).errno(),
        0
    );
    v.close().unwrap();
}

/// A grant made with protection changes deferred leaves its pages as they
/// were until the caller makes the changes it takes; the next grant, not
/// deferred, makes its own at once. A grant taken back is free again, and
/// granted again it is made writable again.
#[test]
fn deferred_protection_changes_wait_for_the_caller() {
    let (_dir, _, mut v) = volume();
    let (view, _f) = batched_writer(&mut v);
    // Any request first tops up the metadata store's stock of pages.
    let _ = v.handle(&Request::Ping, ME);
    let free = v.pages().free_pages();
    let g = v.handle_deferred(&Request::Grant { pages: 4 }, ME);
    assert_eq!(g.errno(), 0);
    assert_eq!(perms(&view, g.page()), "r-", "deferred");
    let changes = v.take_protection_changes();
    assert!(!changes.is_empty());
    let order = v.protection_order();
    let order = order.lock();
    assert_eq!(changes.make(), []);
    drop(order);
    assert_eq!(perms(&view, g.page()), "rw");
    assert_eq!(perms(&view, g.page() + 3), "rw");
    let h = v.handle(&Request::Grant { pages: 4 }, ME);
    assert_eq!(h.errno(), 0);
    assert_eq!(perms(&view, h.page()), "rw", "not deferred");
    assert!(v.take_protection_changes().is_empty());
    // Taken back as after a failed change: free again, and counted
    // neither writable nor read-only, so a batched grant passes the short
    // run over for the long one after the pool, where one counted
    // writable would be handed out with no change.
    let failed = [Failure {
        client: 0,
        first: g.page(),
        pages: g.value(),
        writable: true,
    }];
    let grant = Request::Grant { pages: 4 };
    let r = v.deferred_changes_failed(&failed, &grant, ME, g);
    assert_eq!(r.errno(), libc::EIO);
    assert_eq!(v.pages().free_pages(), free - h.value());
    assert_eq!(v.pages().lowest_free(u64::MAX), Some((g.page(), g.value())));
    let again = v.handle(&Request::Grant { pages: 4 }, ME);
    assert_eq!((again.errno(), again.page()), (0, h.page() + h.value()));
    v.close().unwrap();
}

/// A page whose change to read-only failed counts as not known, so the
/// next decision about it (here: a grant of it to another client) makes
/// it read-only again, where one counted read-only would be passed over
/// and stay writable.
#[test]
fn a_page_whose_change_failed_is_changed_at_the_next_decision() {
    let (_dir, _, mut v) = volume();
    let (view, f, other_view, other) = batched_writer_and_a_client_under_off(&mut v);
    let g = v.handle(&Request::Grant { pages: 4 }, ME);
    assert_eq!(g.errno(), 0);
    assert_eq!(v.handle(&commit(f.ino(), 0, 1, g.page(), 1), ME).errno(), 0);
    let_the_batches_expire(&mut v);
    assert_eq!(perms(&view, g.page()), "r-");
    // As if that flip had failed: still writable, and said so.
    view.protector().unwrap().set(g.page(), 1, true).unwrap();
    v.protection_failed(&[Failure {
        client: 0,
        first: g.page(),
        pages: 1,
        writable: false,
    }]);
    // Replaced, freed, and granted to the other client.
    assert_eq!(
        v.handle(&commit(f.ino(), 0, 1, g.page() + 1, 1), ME)
            .errno(),
        0
    );
    v.reclaim_now();
    let o = v.handle(&Request::Grant { pages: 1 }, other);
    assert_eq!((o.errno(), o.page()), (0, g.page()));
    assert_eq!(perms(&view, g.page()), "r-");
    assert_eq!(perms(&other_view, g.page()), "rw");
    v.close().unwrap();
}

#[test]
fn a_write_open_closed_as_a_read_one_is_refused_and_keeps_its_lease_until_closed_right() {
    let (_dir, _, mut v) = volume();
    let (other, f) = two_clients_one_writing(&mut v);
    let close = |write| Request::Close {
        ino: f.ino(),
        write,
    };
    assert_eq!(v.handle(&close(false), ME).errno(), libc::EBADF);
    // ME keeps the lease: another client's truncating open is refused.
    let truncating = Request::Open {
        at: OpenAt::Entry(Entry::Path(b"f")),
        flags: kucofs_common::proto::open::WRITE | kucofs_common::proto::open::TRUNC,
        mode: 0,
        hint: None,
    };
    assert_eq!(v.handle(&truncating, other).errno(), libc::ETXTBSY);
    assert_eq!(v.handle(&close(true), ME).errno(), 0);
    assert_eq!(v.handle(&truncating, other).errno(), 0);
    v.close().unwrap();
}

/// Attaches client 0 with no view, opens "f" for writing and grants the
/// client `pages` pages: the file and the grant.
fn a_file_and_a_grant(v: &mut Volume, pages: u32) -> (Answer, Answer) {
    v.attach_client(0, None, Default::default(), None);
    let f = open_for_write(v, ME, "f");
    let g = v.handle(&Request::Grant { pages }, ME);
    assert_eq!(g.errno(), 0);
    (f, g)
}

/// Where the free pages lie scattered, as random overwrites leave them, a
/// grant hands out several runs in one reply, all in the caller's pool,
/// and no more pages than asked for.
#[test]
fn a_grant_among_scattered_free_pages_hands_out_several_runs() {
    let (_dir, path, mut v) = volume();
    let (f, g) = a_file_and_a_grant(&mut v, 64);
    assert_eq!(
        g.granted().count(),
        1,
        "a fresh volume's free pages are one run"
    );
    // Every other page of the pool back: free singles, the lowest pages.
    for p in (0..64).step_by(2) {
        let unpool = Request::Unpool {
            slot: ME.slot,
            start: PageNo::new(g.page() + p),
            pages: 1,
        };
        assert_eq!(v.handle(&unpool, ME).errno(), 0);
    }
    let r = v.handle(&Request::Grant { pages: 8 }, ME);
    assert_eq!(r.errno(), 0);
    let runs: Vec<(u64, u64)> = r.granted().collect();
    let singles: Vec<(u64, u64)> = (0..=kucofs_common::proto::GRANT_RUNS as u64)
        .map(|i| (g.page() + 2 * i, 1))
        .collect();
    assert_eq!(runs, singles);
    // A page of the last run is the caller's to commit.
    let (last, _) = runs[kucofs_common::proto::GRANT_RUNS];
    assert_eq!(v.handle(&commit(f.ino(), 0, 4096, last, 1), ME).errno(), 0);
    // No more than asked: a grant of 2 takes two singles.
    let two = v.handle(&Request::Grant { pages: 2 }, ME);
    assert_eq!(two.granted().map(|(_, n)| n).sum::<u64>(), 2);
    v.close().unwrap();
    assert!(crate::fsck(&path).unwrap().problems.is_empty());
}

#[test]
fn a_commit_of_pages_past_the_size_it_names_is_refused() {
    let (_dir, path, mut v) = volume();
    let (f, g) = a_file_and_a_grant(&mut v, 1);
    let commit = |first, size| commit(f.ino(), first, size, g.page(), 1);
    // Page 100 starts at byte 409,600: a size of 1 does not reach it.
    assert_eq!(v.handle(&commit(100, 1), ME).errno(), libc::EINVAL);
    assert_eq!(v.handle(&commit(100, 100 * 4096), ME).errno(), libc::EINVAL);
    assert_eq!(v.handle(&commit(100, 100 * 4096 + 1), ME).errno(), 0);
    v.close().unwrap();
    assert!(crate::fsck(&path).unwrap().problems.is_empty());
}

/// A warmer finds the block-map entry a commit made, and refuses a page
/// the map does not reach and an inode outside the index without
/// panicking (it is handed unchecked offsets from client threads).
#[test]
fn a_warmer_finds_the_entry_a_commit_made() {
    let (_dir, _, mut v) = volume();
    let (f, g) = a_file_and_a_grant(&mut v, 2);
    assert_eq!(
        v.handle(&commit(f.ino(), 3, 4 * 4096, g.page() + 1, 1), ME)
            .errno(),
        0
    );
    let w = v.warmer();
    let e = w.map(f.inode(), 3).unwrap();
    assert_eq!(
        kucofs_common::index::blockmap::entry_page(v.ns.shm_u64(e.0)).get(),
        g.page() + 1
    );
    w.replaced(e);
    assert!(w.map(f.inode(), 1 << 40).is_none());
    // Inode offsets past the index, and one that wraps around.
    assert!(w.map(InodeOff::new(1 << 50), 3).is_none());
    assert!(w.map(InodeOff::new(u64::MAX - 7), 3).is_none());
    // Entries at offsets past the index, unaligned, or holding no page.
    for at in [u64::MAX, 1 << 50, 3, 0] {
        w.replaced(WarmEntry(at));
    }
}

#[test]
fn a_clean_close_with_an_unlinked_file_open_leaves_an_fsck_clean_image() {
    let (_dir, path, mut v) = volume();
    let (f, g) = a_file_and_a_grant(&mut v, 2);
    assert_eq!(
        v.handle(&commit(f.ino(), 0, 8192, g.page(), 2), ME).errno(),
        0
    );
    let unlink = Request::Unlink {
        at: Entry::Path(b"f"),
        rmdir: false,
        hint: None,
    };
    assert_eq!(v.handle(&unlink, ME).errno(), 0);
    v.close().unwrap();
    let report = crate::fsck(&path).unwrap();
    assert!(report.problems.is_empty(), "{report}");
}

/// Kfs's own truncating open, as a client that cannot cut the file itself
/// asks for it: an open that creates the file reports it (`value` 1) and
/// changes nothing more; one of a file that exists, even empty, sets its
/// modification time, as on Linux.
#[test]
fn a_truncating_open_changes_an_existing_file_and_reports_a_created_one() {
    use kucofs_common::proto::open::{CREATE, TRUNC, WRITE};
    let (_dir, _, mut v) = volume();
    v.attach_client(0, None, Default::default(), None);
    let open = |v: &mut Volume, flags| {
        let r = v.handle(
            &Request::Open {
                at: OpenAt::Entry(Entry::Path(b"f")),
                flags,
                mode: 0o644,
                hint: None,
            },
            ME,
        );
        assert_eq!(r.errno(), 0);
        let mtime = v.namespace().reader().attr(r.inode()).unwrap().mtime;
        assert_eq!(
            v.handle(
                &Request::Close {
                    ino: r.ino(),
                    write: true
                },
                ME
            )
            .errno(),
            0
        );
        (r.value(), mtime)
    };
    let (created, made) = open(&mut v, WRITE | CREATE | TRUNC);
    assert_eq!(created, 1);
    let (again, cut) = open(&mut v, WRITE | CREATE | TRUNC);
    assert_eq!(again, 0);
    assert!(cut > made, "mtime {made} unchanged by a truncating open");
    v.close().unwrap();
}

/// The 2 MiB chunks of the region that `area` overlaps.
fn chunks_of(area: kucofs_common::format::Area) -> std::ops::Range<u64> {
    let chunk = kucofs_common::pm::HUGE_PAGE as u64;
    area.offset() / chunk..(area.offset() + area.len()).div_ceil(chunk)
}

/// Enables huge pages for `v`; false (the test skips) for an image not
/// on tmpfs. An image on DAX (as the kernel says of its file) has none
/// made however much is provisioned, its pages being the device's own,
/// which the kernel maps huge by itself where they line up: that is
/// checked before the test skips.
fn enable_huge_pages(v: &Volume) -> bool {
    let on = v.enable_huge_pages();
    if !on {
        let region = v.image().region();
        if kucofs_common::pm::is_dax(region.path()) == Some(true) {
            let mut p = v.provisioner();
            while p.step(Behind::Now) {}
            assert!(!region.can_make_huge());
            assert_eq!(region.huge_bytes(), 0, "huge pages made of a DAX image");
            println!("SKIPPED: huge pages are made of images on tmpfs, not on DAX");
        } else {
            println!("SKIPPED: the test image is not on tmpfs");
        }
    }
    on
}

/// Runs a provisioner of `v` until nothing is due; false (the test skips)
/// if the kernel makes no huge pages of tmpfs.
fn provision_everything(v: &Volume) -> bool {
    let mut p = v.provisioner();
    while p.step(Behind::Now) {}
    let made = v.image().region().can_make_huge();
    if !made {
        println!("SKIPPED: this kernel makes no huge pages of tmpfs (MADV_COLLAPSE)");
    }
    made
}

/// Provisions `v` with huge pages, the first chunk asked for failing as
/// if the kernel had no huge page free, until that chunk waits for a
/// retry; the provisioner, or `None` (the test skips) where the image or
/// kernel makes no huge pages.
fn provisioning_with_a_failed_chunk(v: &Volume) -> Option<crate::provision::Provisioner> {
    if !enable_huge_pages(v) {
        return None;
    }
    let region = v.image().region();
    region.fail_next_huge();
    let mut p = v.provisioner();
    while !region.huge_retry_due() && p.step(Behind::Now) {}
    if !region.can_make_huge() {
        println!("SKIPPED: this kernel makes no huge pages of tmpfs (MADV_COLLAPSE)");
        return None;
    }
    assert!(region.huge_retry_due(), "no chunk failed");
    Some(p)
}

/// Without huge pages, provisioning has a sparse image allocate the data
/// pages just ahead of the grants, where a grant of fresh pages goes
/// next, so that the client does not wait for the kernel to allocate and
/// clear them when it maps them into its view.
#[test]
fn provisioning_allocates_the_data_pages_ahead_of_the_grants() {
    let (_dir, path, v) = sparse_volume_of(128 << 20);
    let data = v.image().superblock().geometry.data;
    // Fresh: the pages before the data pages have their memory, and the
    // data pages none (but what a tmpfs that allocates in huge pages
    // rounds up to one).
    let before = allocated(&path);
    assert!(before >= data.offset() && before < data.offset() + (2 << 20));
    let mut p = v.provisioner();
    while p.step(Behind::Now) {}
    assert!(!v.image().region().can_make_huge());
    let ahead = crate::provision::AHEAD.min(data.len());
    let got = allocated(&path) - data.offset();
    assert!(got >= ahead, "{got} bytes of data allocated, not {ahead}");
}

/// The bytes of memory the image file at `path` has.
fn allocated(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512
}

/// A chunk the kernel would not make huge when provisioning asked, for a
/// reason of the moment, is asked for again once nothing else is due, and
/// ends up huge like the rest.
#[test]
fn provisioning_asks_again_for_a_chunk_the_kernel_would_not_make_huge() {
    let (_dir, _, v) = volume();
    let Some(mut p) = provisioning_with_a_failed_chunk(&v) else {
        return;
    };
    while p.step(Behind::Now) {}
    let region = v.image().region();
    assert!(
        !region.huge_retry_due(),
        "the failed chunk was not asked for again"
    );
    // As many chunks huge as on a volume where none failed.
    let (_dir2, _, w) = volume();
    assert!(enable_huge_pages(&w) && provision_everything(&w));
    assert_eq!(region.huge_bytes(), w.image().region().huge_bytes());
}

/// After a retry, the next chunk waiting for one is not asked for before
/// its wait is over, and is once it is.
#[test]
fn a_retry_of_a_chunk_the_kernel_would_not_make_huge_waits_for_the_last() {
    let (_dir, _, v) = volume();
    let Some(mut p) = provisioning_with_a_failed_chunk(&v) else {
        return;
    };
    let region = v.image().region();
    // The next chunk asked for fails too: another of those still due, or
    // the first retry. Either way one retry happened and one chunk waits.
    region.fail_next_huge();
    while p.step(Behind::Now) {}
    assert!(region.huge_retry_due());
    assert!(!p.is_due(Behind::Now), "a retry did not wait for the last");
    let before = region.huge_bytes();
    std::thread::sleep(crate::provision::RETRY_FIRST);
    assert!(p.is_due(Behind::Now));
    assert!(p.step(Behind::Now));
    assert_eq!(region.huge_bytes(), before + (2 << 20));
}

/// With huge pages enabled, provisioning makes the data pages ahead of
/// the grants huge, not only the log: on a 16 MiB image, whose log is
/// 1 MiB, the region's huge pages grow past what the log's chunks hold.
#[test]
fn provisioning_with_huge_pages_makes_the_data_pages_huge() {
    let (_dir, _, v) = volume();
    if !enable_huge_pages(&v) || !provision_everything(&v) {
        return;
    }
    let region = v.image().region();
    let log_chunks = chunks_of(v.image().superblock().geometry.log).count() as u64;
    assert!(
        region.huge_bytes() > log_chunks * (2 << 20),
        "{} bytes huge; the log's chunks hold {}",
        region.huge_bytes(),
        log_chunks * (2 << 20)
    );
}

/// A chunk that grants reached before provisioning did (a writer outran
/// the Kfs thread) is made huge too, once nothing ahead is due: with
/// every data page granted before the first step, nothing lies ahead of
/// the grants, and still every whole chunk of the data pages ends huge.
#[test]
fn chunks_granted_before_provisioning_reached_them_are_made_huge_after() {
    let (_dir, _, mut v) = volume();
    if !enable_huge_pages(&v) {
        return;
    }
    v.attach_client(0, None, Default::default(), None);
    while v.handle(&Request::Grant { pages: 4096 }, ME).errno() == 0 {}
    assert_eq!(v.pages().free_pages(), 0);
    if !provision_everything(&v) {
        return;
    }
    assert_eq!(v.image().region().huge_bytes(), huge_in_the_end(&v));
}

/// The whole 2 MiB chunks of `v`'s region that provisioning makes huge
/// in the end: the log's, and the data pages' (the region's last chunk
/// may be cut short), as bytes.
fn huge_in_the_end(v: &Volume) -> u64 {
    let chunk = kucofs_common::pm::HUGE_PAGE as u64;
    let len = v.image().region().len();
    let g = v.image().superblock().geometry;
    let mut huge: Vec<u64> = chunks_of(g.log).collect();
    huge.extend(chunks_of(g.data).filter(|c| (c + 1) * chunk <= len));
    huge.sort_unstable();
    huge.dedup();
    huge.len() as u64 * chunk
}

/// Without huge pages ahead of the grants, provisioning allocates the
/// data pages ahead in small pages, and makes them huge only when told
/// Kfs has been quiet: then one chunk at a time, a pace apart, or all at
/// once when told so (as a settle does).
#[test]
fn without_huge_pages_ahead_data_pages_are_made_huge_only_once_kfs_is_quiet() {
    use crate::provision::BEHIND_PACE;
    let (_dir, path, v) = sparse_volume_of(16 << 20);
    if !enable_huge_pages(&v) {
        return;
    }
    let region = v.image().region();
    let g = v.image().superblock().geometry;
    let mut p = v.provisioner();
    p.set_huge_ahead(false);
    while p.step(Behind::Hold) {}
    if !region.can_make_huge() {
        println!("SKIPPED: this kernel makes no huge pages of tmpfs (MADV_COLLAPSE)");
        return;
    }
    // Only the log's chunks are huge; the data pages ahead are allocated.
    let log_chunks = chunks_of(g.log).count() as u64;
    assert_eq!(region.huge_bytes(), log_chunks * (2 << 20));
    let ahead = crate::provision::AHEAD.min(g.data.len());
    let got = allocated(&path) - g.data.offset();
    assert!(got >= ahead, "{got} bytes of data allocated, not {ahead}");
    assert!(!p.is_due(Behind::Hold), "data made huge while Kfs was busy");
    assert!(p.behind_pending(), "a sleeping Kfs thread would not wake");
    // Quiet: a chunk at a time, a pace apart (the first may be the log's,
    // huge already), until one is made.
    let before = region.huge_bytes();
    for _ in 0..4 {
        assert!(p.is_due(Behind::Paced));
        assert!(p.step(Behind::Paced));
        let stepped = std::time::Instant::now();
        let again = p.is_due(Behind::Paced);
        if stepped.elapsed() < BEHIND_PACE / 2 {
            assert!(!again, "a second chunk without waiting for the pace");
        }
        std::thread::sleep(BEHIND_PACE);
        if region.huge_bytes() > before {
            break;
        }
    }
    // The chunks one step's 2 MiB of data pages overlap: two where the
    // data pages start inside a chunk.
    let grown = region.huge_bytes() - before;
    assert!(
        grown == 2 << 20 || grown == 4 << 20,
        "{grown} bytes made huge"
    );
    // All at once: every data chunk ends huge.
    while p.step(Behind::Now) {}
    assert_eq!(region.huge_bytes(), huge_in_the_end(&v));
    assert!(!p.behind_pending());
}

/// A run given back from a pool ([`Request::Unpool`]) becomes free pages:
/// read-only in the client's view at once under strict protection, still
/// writable under batched (as pages a batch left writable are). Only the
/// caller's own pools can be given back, and only unused pages of them.
#[test]
fn unpooled_pages_are_free_and_read_only_under_strict_protection() {
    use kucofs_common::pm::Protection;
    let (_dir, _, mut v) = volume();
    let view = v.image().region().view().unwrap();
    for (client, mode, after) in [
        (0, Protection::Strict, "r-"),
        (1, Protection::Batched, "rw"),
    ] {
        let me = Caller { client, ..ME };
        let other_slot = Caller { slot: 1, ..me };
        v.attach_client(client, view.protector(), mode, None);
        let g = v.handle(&Request::Grant { pages: 4 }, other_slot);
        assert_eq!((g.errno(), g.value()), (0, 4));
        assert_eq!(perms(&view, g.page()), "rw");
        let unpool = |start, pages| Request::Unpool {
            slot: 1,
            start: PageNo::new(start),
            pages,
        };
        // Another client cannot give back this client's pool.
        let stranger = Caller { client: 7, ..me };
        assert_eq!(
            v.handle(&unpool(g.page(), 2), stranger).errno(),
            libc::EINVAL
        );
        let free = v.pages().free_pages();
        assert_eq!(v.handle(&unpool(g.page(), 2), me).errno(), 0);
        assert_eq!(v.pages().free_pages(), free + 2);
        assert_eq!(perms(&view, g.page()), after);
        // Given back already: refused the second time.
        assert_eq!(v.handle(&unpool(g.page(), 2), me).errno(), libc::EINVAL);
        // The rest of the pool stays the slot's, writable.
        assert_eq!(perms(&view, g.page() + 2), "rw");
        assert_eq!(v.handle(&unpool(g.page() + 2, 2), me).errno(), 0);
    }
    v.close().unwrap();
}

fn symlink(v: &mut Volume, path: &str, target: &[u8]) -> Answer {
    v.handle(
        &Request::Create {
            at: Entry::Path(path.as_bytes()),
            mode: libc::S_IFLNK | 0o777,
            target,
            hint: None,
        },
        ME,
    )
}

fn rename(v: &mut Volume, from: &str, to: &str) -> Answer {
    v.handle(
        &Request::Rename {
            from: Entry::Path(from.as_bytes()),
            to: Entry::Path(to.as_bytes()),
            noreplace: false,
            hint_from: None,
            hint_to: None,
        },
        ME,
    )
}

/// Renaming symlinks whose targets take pages of their own dirties each
/// one's inode again: a retirement rewrites the inode record, and writes
/// the target only once, when its page is taken. Every retirement fits
/// the log, and every change survives a clean close and a crash.
#[test]
fn renaming_symlinks_with_long_targets_loses_nothing_across_retirements() {
    for crash in [false, true] {
        let (_dir, path, mut v) = volume_of(16 << 20);
        let _ = create(&mut v, "d", true);
        let target = vec![b'x'; 4000];
        for i in 0..200 {
            assert_eq!(symlink(&mut v, &format!("d/s{i}"), &target).errno(), 0);
        }
        v.checkpoint().unwrap();
        for i in 0..200 {
            assert_eq!(
                rename(&mut v, &format!("d/s{i}"), &format!("d/t{i}")).errno(),
                0
            );
        }
        if !crash {
            v.checkpoint().unwrap();
        }
        let expected = tree(v.namespace());
        if crash {
            drop(v);
        } else {
            v.close().unwrap();
        }
        let v = Volume::open(&path).unwrap();
        assert_eq!(tree(v.namespace()), expected, "crash: {crash}");
        v.close().unwrap();
        assert!(crate::fsck(&path).unwrap().problems.is_empty());
    }
}

fn zero_line(path: &std::path::Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&[0u8; 64], at).unwrap();
}

/// A retirement's batch of several entries whose end never became durable,
/// then recovery's invalidation of the batch cut short at each point it
/// can be (it clears the entries' header lines from the last to the
/// first, each durable before the next): every such image recovers, to
/// the changes before the batch.
#[test]
fn a_crash_while_invalidating_a_batch_without_its_end_still_recovers() {
    // Big enough that the creates below do not start a retirement.
    let (_dir, path, mut v) = volume_of(1 << 30);
    let _ = create(&mut v, "d", true);
    let long = "n".repeat(200);
    v.checkpoint().unwrap();
    for i in 0..300 {
        assert_eq!(create(&mut v, &format!("d/{long}{i}"), false).errno(), 0);
    }
    let expected = tree(v.namespace());
    // The first half of a retirement: the batch logged, its end lost.
    let region = v.image.region();
    v.log.fence(region);
    v.batch.clear();
    let room = v.log.batch_room();
    crate::store::retire(&mut v.ns, &mut v.pages, &mut v.batch, &|_| true, room).unwrap();
    assert!(v.batch.bytes().len() > 65535, "{}", v.batch.bytes().len());
    v.log.append_batch(region, v.batch.bytes()).unwrap();
    let g = v.image.superblock().geometry;
    let end_at = g.log.offset() + v.log.fill() - 64;
    drop(v);
    zero_line(&path, end_at);
    let sb = crate::inspect(&path).unwrap().superblock;
    let view = kucofs_common::pm::RegionView::open(&path).unwrap();
    let stale = crate::recovery::scan(&sb, &|off, buf| view.read(off, buf).is_ok())
        .unwrap()
        .stale;
    drop(view);
    assert!(stale.len() >= 2, "{stale:?}");
    let original = std::fs::read(&path).unwrap();
    for cleared in 0..=stale.len() {
        std::fs::write(&path, &original).unwrap();
        for &at in stale.iter().rev().take(cleared) {
            zero_line(&path, g.log.offset() + at);
        }
        let v = Volume::open(&path).unwrap_or_else(|e| panic!("{cleared} cleared: {e}"));
        assert_eq!(tree(v.namespace()), expected, "{cleared} cleared");
    }
}

/// An owner entry naming an inode-table page the index cannot hold is
/// refused in a sentence, at once, with no allocation its size would call
/// for.
#[test]
fn an_inode_table_page_past_every_inode_number_is_refused() {
    use std::os::unix::fs::FileExt;
    let (_dir, path, v) = volume();
    let g = v.image().superblock().geometry;
    v.close().unwrap();
    let entry = kucofs_common::format::meta::Owner::Inodes {
        index: (1 << 28) - 1,
    }
    .encode()
    .unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&entry.to_le_bytes(), g.owner_offset(g.data.end() - 1))
        .unwrap();
    let err = Volume::open(&path).unwrap_err();
    // The store refused it, with the owner entry's page and index, and
    // the error names the image itself.
    let page = g.data.end() - 1;
    assert!(
        matches!(
            &err,
            Error::Recovery {
                path: p,
                cause: RecoveryError::Load(LoadError::InodeTableIndex { page: at, index }),
            } if *p == path && *at == page && *index == (1 << 28) - 1
        ),
        "{err:?}"
    );
    let err = err.to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(
        err.contains("inode table index 268435455 is out of range"),
        "{err}"
    );
}

/// Removals log few bytes each but a record write each in the store; a
/// retirement comes after at most [`crate::store::RETIRE_WRITES`] of
/// them, long before their bytes would call for one, so that its time
/// (Kfs's longest pause) stays bounded.
#[test]
fn a_retirement_comes_after_a_bounded_number_of_record_writes() {
    let (_dir, _path, mut v) = sparse_volume_of(8 << 30);
    let n = 30_000;
    for i in 0..n {
        assert_eq!(create(&mut v, &format!("/f{i}"), false).errno(), 0);
    }
    v.checkpoint().unwrap();
    let before = v.retirements().count;
    let mut most = 0;
    for i in 0..n {
        let path = format!("/f{i}");
        let req = Request::Unlink {
            at: Entry::Path(path.as_bytes()),
            rmdir: false,
            hint: None,
        };
        assert_eq!(v.handle(&req, ME).errno(), 0);
        most = most.max(v.ns.store().pending_writes());
    }
    assert!(most < crate::store::RETIRE_WRITES, "{most} writes pending");
    let retired = v.retirements().count - before;
    // Two writes a removal (the inode's record and the entry's).
    assert!(
        retired >= 2 * n / crate::store::RETIRE_WRITES,
        "{retired} retirements"
    );
}

/// Rewrites the store's entry record named `from` (in any directory) to
/// name `to` (of the same length), with a checksum that matches, as a
/// damaged or hostile image could.
fn rename_entry_record(path: &std::path::Path, from: &[u8], to: &[u8]) {
    use kucofs_common::format::meta::{encode_entry, slots_per_page, EntryRef, Owner, CELL};
    use kucofs_common::format::{Superblock, PAGE_LEN, PAGE_SIZE};
    use std::os::unix::fs::FileExt;
    assert_eq!(from.len(), to.len());
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut sb = vec![0u8; PAGE_LEN];
    f.read_exact_at(&mut sb, 0).unwrap();
    let g = Superblock::decode(&sb).unwrap().geometry;
    let mut page = vec![0u8; PAGE_LEN];
    for p in g.data.start..g.data.end() {
        let mut w = [0u8; 8];
        f.read_exact_at(&mut w, g.owner_offset(p)).unwrap();
        let Some(Owner::Entries { cells }) = Owner::decode(u64::from_le_bytes(w)) else {
            continue;
        };
        f.read_exact_at(&mut page, p * PAGE_SIZE).unwrap();
        let size = CELL * usize::from(cells);
        for s in 0..usize::try_from(slots_per_page(cells)).unwrap() {
            let b = &page[s * size..(s + 1) * size];
            let Some(e) = EntryRef::decode(b, cells).unwrap() else {
                continue;
            };
            if e.name == from {
                let mut out = Vec::new();
                encode_entry(e.parent, e.ino, e.kind, to, &mut out);
                f.write_all_at(&out, p * PAGE_SIZE + (s * size) as u64)
                    .unwrap();
                return;
            }
        }
    }
    panic!("no entry record names {from:?}");
}

/// A store whose entry records hold a name no directory can hold, or one
/// name twice in a directory, is refused in a sentence at open, the
/// error's variant saying which.
#[test]
fn entry_records_with_a_bad_or_repeated_name_are_refused() {
    type Check = fn(&LoadError) -> bool;
    let cases: [(&[u8], &str, Check); 2] = [
        (
            b"a/",
            "\"a/\" is not a name a directory can hold",
            |e| matches!(e, LoadError::BadName { name, errno, .. } if name == b"a/" && *errno == Errno::EINVAL),
        ),
        (
            b"ab",
            "EEXIST",
            |e| matches!(e, LoadError::LoadDir { parent: 1, errno } if *errno == Errno::EEXIST),
        ),
    ];
    for (to, why, check) in cases {
        let (_dir, path, mut v) = volume();
        let _ = create(&mut v, "/ab", false);
        let _ = create(&mut v, "/cd", false);
        v.close().unwrap();
        rename_entry_record(&path, b"cd", to);
        let err = Volume::open(&path).unwrap_err();
        let load = load_error(&err);
        assert!(check(load), "{load:?}");
        let err = err.to_string();
        assert!(err.contains(why), "{err}");
    }
}

/// The store's load error an open failed with (a test failure for any
/// other error).
fn load_error(err: &Error) -> &crate::store::LoadError {
    match err {
        Error::Recovery {
            cause: RecoveryError::Load(load),
            ..
        } => load,
        _ => panic!("not a load error: {err:?}"),
    }
}

/// An inode record damaged in place fails its checksum: the store is
/// refused with the inode's number and page, and the record's fault as
/// the error's source.
#[test]
fn a_damaged_inode_record_is_refused_with_its_fault() {
    use kucofs_common::format::meta::{Owner, RecordFault, INODE_RECORD};
    use kucofs_common::format::PAGE_SIZE;
    use std::os::unix::fs::FileExt;
    let (_dir, path, v) = volume();
    let g = v.image().superblock().geometry;
    v.close().unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    // The data page holding inode table page 0, where the root's record is.
    let page = (g.data.start..g.data.end())
        .find(|&p| {
            let mut w = [0u8; 8];
            f.read_exact_at(&mut w, g.owner_offset(p)).unwrap();
            Owner::decode(u64::from_le_bytes(w)) == Some(Owner::Inodes { index: 0 })
        })
        .expect("inode table page 0");
    // A byte of the root's mtime, flipped.
    let at =
        page * PAGE_SIZE + crate::namespace::ROOT_INO * u64::try_from(INODE_RECORD).unwrap() + 40;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x5a], at).unwrap();
    drop(f);
    let err = Volume::open(&path).unwrap_err();
    let load = load_error(&err);
    assert!(
        matches!(
            load,
            LoadError::InodeRecord { ino: 1, page: p, fault: RecordFault::Checksum } if *p == page
        ),
        "{load:?}"
    );
    let source = std::error::Error::source(load).expect("the record's fault");
    assert_eq!(source.to_string(), "checksum mismatch");
    assert!(
        err.to_string()
            .contains(&format!("inode 1 (data page {page}): checksum mismatch")),
        "{err}"
    );
}

/// A user's files carry bytes the user chose into a retirement's batch
/// (times, names). Times set to a log entry header of a far sequence,
/// keyed as one who does not know the image's uuid would key it, end up
/// past the next lap's entries; recovery does not take them for
/// acknowledged entries after a torn one.
#[test]
fn times_chosen_to_look_like_a_log_entry_are_not_taken_for_one() {
    use kucofs_common::format::{Lap, LogEntryHeader};
    let (_dir, path, mut v) = volume();
    let seq = v.log.next_seq() + 1000;
    let guess = Lap::new(&[0; 16], v.image().superblock().log_seq);
    let h = LogEntryHeader::new(&guess, seq, 1, &[]).unwrap().encode();
    let atime = i64::from_le_bytes(h[..8].try_into().unwrap());
    let mtime = i64::from_le_bytes(h[8..].try_into().unwrap());
    v.checkpoint().unwrap();
    for i in 0..32 {
        let p = format!("f{i}");
        assert_eq!(create(&mut v, &p, false).errno(), 0);
        let r = v.handle(
            &Request::SetAttr {
                at: At::Path {
                    path: p.as_bytes(),
                    follow: false,
                },
                attrs: kucofs_common::proto::SetAttrs {
                    atime: Some(atime),
                    mtime: Some(mtime),
                    ..Default::default()
                },
                now: Default::default(),
            },
            ME,
        );
        assert_eq!(r.errno(), 0);
    }
    v.checkpoint().unwrap();
    let _ = create(&mut v, "after", false);
    let expected = tree(v.namespace());
    drop(v);
    let v = Volume::open(&path).unwrap();
    assert_eq!(tree(v.namespace()), expected);
}

/// A symlink dropped by the replay gives its target page up, but the image
/// names the page until a retirement clears its owner entry: recovery
/// counts it the store's until then, so that neither the retirement that
/// ends recovery nor a grant takes it while the image still says the
/// store holds it; and the file system opened after such a crash is
/// fsck-clean and grants no page the store holds.
#[test]
fn a_target_page_given_up_during_replay_stays_the_stores_until_cleared() {
    use kucofs_common::format::meta::Owner;
    let (_dir, path, mut v) = volume();
    assert_eq!(symlink(&mut v, "s", &[b't'; 100]).errno(), 0);
    v.checkpoint().unwrap();
    let g = v.image().superblock().geometry;
    let owner = |v: &Volume, p| v.namespace().store().owner(p);
    let target_page = (g.data.start..g.data.end())
        .find(|&p| matches!(owner(&v, p), Some(Owner::Target { .. })))
        .unwrap();
    let unlink = Request::Unlink {
        at: Entry::Path(b"s"),
        rmdir: false,
        hint: None,
    };
    assert_eq!(v.handle(&unlink, ME).errno(), 0);
    assert_eq!(create(&mut v, &"L".repeat(100), false).errno(), 0);
    drop(v);
    let sb = crate::inspect(&path).unwrap().superblock;
    let view = kucofs_common::pm::RegionView::open(&path).unwrap();
    let (ns, _, _) =
        crate::recovery::recover(&sb, &|off, buf| view.read(off, buf).is_ok()).unwrap();
    drop(view);
    let (_, store_pages) = crate::store::held_pages(&ns);
    assert!(store_pages.contains(&target_page), "{store_pages:?}");
    let mut v = Volume::open(&path).unwrap();
    v.attach_client(0, None, Default::default(), None);
    let grant = v.handle(&Request::Grant { pages: 64 }, ME);
    assert_eq!(grant.errno(), 0);
    for (s, n) in grant.granted() {
        for p in s..s + n {
            assert_eq!(owner(&v, p), Some(Owner::Free), "page {p} granted");
        }
    }
    v.close().unwrap();
    assert!(crate::fsck(&path).unwrap().problems.is_empty());
}

/// A write whose data Kfs copies from the caller's staging area lands in
/// the file with the bytes around it kept; one that is empty, larger
/// than a slot's staging area, past the largest file or without the
/// write lease is refused.
#[test]
fn a_staged_write_is_copied_into_the_file_and_checked_first() {
    use kucofs_common::proto::STAGE_BYTES;
    let (_dir, _path, mut v) = volume();
    let stage_len = STAGE_BYTES * kucofs_common::channel::SLOTS as u64;
    let staging = kucofs_common::pm::Shm::create("kucofs-test", stage_len, stage_len).unwrap();
    v.attach_client(
        0,
        None,
        Default::default(),
        Some(staging.map_again().unwrap()),
    );
    v.attach_client(1, None, Default::default(), None);
    let f = open_for_write(&mut v, ME, "f");
    let at = u64::from(ME.slot) * STAGE_BYTES;
    let write = |v: &mut Volume, offset: u64, data: &[u8]| {
        staging.write(at, data).unwrap();
        let len = u32::try_from(data.len()).unwrap();
        v.handle(
            &Request::Write {
                ino: f.ino(),
                offset,
                len,
            },
            ME,
        )
    };
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    assert_eq!(write(&mut v, 10, &big).value(), 300_010);
    assert_eq!(write(&mut v, 5000, b"inside").value(), 300_010);
    // Past the end in the last page: zeros between.
    assert_eq!(write(&mut v, 300_020, b"tail").value(), 300_024);
    let mut model = vec![0u8; 10];
    model.extend_from_slice(&big);
    model[5000..5006].copy_from_slice(b"inside");
    model.extend_from_slice(&[0; 10]);
    model.extend_from_slice(b"tail");
    let inode = f.inode();
    let got: Vec<u8> = (0..300_024u64.div_ceil(PAGE))
        .flat_map(|p| {
            let e = kucofs_common::index::blockmap::entry_page(
                kucofs_common::index::blockmap::MapReader::of_inode(v.ns.shm(), inode).entry(p),
            );
            let mut b = vec![0u8; 4096];
            v.image().region().read(e.byte_offset(), &mut b).unwrap();
            b
        })
        .take(300_024)
        .collect();
    assert!(got == model, "the file holds what was written");
    // Refused: empty, larger than the staging area, past the largest file,
    // without the lease.
    let req = |offset, len| Request::Write {
        ino: f.ino(),
        offset,
        len,
    };
    assert_eq!(v.handle(&req(0, 0), ME).errno(), libc::EINVAL);
    let too_big = u32::try_from(STAGE_BYTES + 1).unwrap();
    assert_eq!(v.handle(&req(0, too_big), ME).errno(), libc::EINVAL);
    assert_eq!(v.handle(&req(u64::MAX - 2, 4), ME).errno(), libc::EFBIG);
    let other = Caller { client: 1, ..ME };
    assert_eq!(v.handle(&req(0, 4), other).errno(), libc::EBADF);
    // Nor does it get a pool of pages to write into itself: it would hold
    // what other files left there.
    assert_eq!(
        v.handle(&Request::Grant { pages: 4 }, ME).errno(),
        libc::EPERM
    );
    v.close().unwrap();
}
