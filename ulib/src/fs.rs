//! The `Fs` handle: the connection to Kfs (see [`crate::connection`]), the
//! read-only views of index and region (none for an isolated daemon
//! client, which reads through requests, see [`crate::isolated`]), and one
//! request slot per thread that uses the handle.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use kucofs_common::channel::SLOTS;
use kucofs_common::format::PageNo;
use kucofs_common::index::layout::header_gen;
use kucofs_common::index::{IndexReader, Ino, Kind};
use kucofs_common::pm::{Protection, RegionView, ShmView};
use kucofs_common::proto::{At, Entry, Extents, Hint, Reply, Request, SetAttrs, TimesNow};
use kucofs_common::Errno;
#[cfg(feature = "embedded")]
use kucofs_kfs::{ServerConfig, StatsSnapshot};
use parking_lot::Mutex;

use crate::connection::{slot_number, Connection, Warmer};
use crate::dir::ReadDir;
use crate::metadata::{Metadata, Permissions, StatFs};

/// How a file system is opened.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Send Kfs the addresses Ulib found while resolving a path
    /// (collaborative indexing), with every request queued to the Kfs
    /// thread (a directly applied one resolves under the lock anyway, so it
    /// carries none; a daemon's client never sends them, see
    /// [`Fs::connect_with`]). Off: send bare paths and let Kfs resolve
    /// them, to measure what the addresses save.
    pub collaborative: bool,
    /// Let a thread apply its own request under Kfs's lock, instead of
    /// handing it to the Kfs thread and waiting for the reply (embedded
    /// mode only; the request takes the same checked, logged path). Off:
    /// every change crosses to the Kfs thread through the request slots.
    pub direct: bool,
    /// Bits cleared from the mode of everything created (like a process's
    /// umask). By default, the process's umask when the handle is opened.
    pub umask: u32,
    /// How long committed data pages stay writable (ARCHITECTURE.md §13).
    pub protection: Protection,
    /// How the Kfs thread polls (embedded only: the Kfs this process
    /// runs).
    #[cfg(feature = "embedded")]
    pub server: ServerConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            collaborative: true,
            direct: true,
            umask: process_umask(),
            protection: Protection::default(),
            #[cfg(feature = "embedded")]
            server: ServerConfig::default(),
        }
    }
}

/// The process's umask, read without changing it.
fn process_umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

pub(crate) fn err(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e.get())
}

pub(crate) fn common_err(e: kucofs_common::Error) -> io::Error {
    io::Error::new(
        io::Error::from_raw_os_error(e.errno()).kind(),
        e.to_string(),
    )
}

#[cfg(feature = "embedded")]
pub(crate) fn kfs_err(e: kucofs_kfs::Error) -> io::Error {
    io::Error::new(
        io::Error::from_raw_os_error(e.errno()).kind(),
        e.to_string(),
    )
}

static NEXT_FS_ID: AtomicU64 = AtomicU64::new(1);

/// What every handle on one open file system shares.
#[derive(Debug)]
pub(crate) struct Inner {
    id: u64,
    /// The index, read-only; `None` for an isolated client.
    index: Option<ShmView>,
    /// The region, read-only; `None` for an isolated client.
    region: Option<RegionView>,
    /// Each slot's page pool: runs of unused pages `(first, end)`, taken
    /// from the last.
    pools: Vec<Mutex<Vec<(u64, u64)>>>,
    /// Range locks of the files open in this process.
    range_locks: Mutex<std::collections::HashMap<Ino, Weak<crate::range_lock::RangeLock>>>,
    free_slots: Mutex<Vec<usize>>,
    /// How requests reach Kfs.
    pub(crate) conn: Connection,
    pub(crate) config: Config,
}

/// A thread's claim on a request slot; returned when the thread exits.
struct Lease {
    fs: u64,
    slot: usize,
    owner: Weak<Inner>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(fs) = self.owner.upgrade() {
            fs.free_slots.lock().push(self.slot);
        }
    }
}

thread_local! {
    static LEASES: RefCell<Vec<Lease>> = const { RefCell::new(Vec::new()) };
}

impl Inner {
    /// This thread's slot, claimed on first use.
    pub(crate) fn slot(self: &Arc<Self>) -> io::Result<usize> {
        LEASES.with(|l| {
            let mut leases = l.borrow_mut();
            if let Some(lease) = leases.iter().find(|x| x.fs == self.id) {
                return Ok(lease.slot);
            }
            leases.retain(|x| x.owner.strong_count() > 0);
            let slot = self.free_slots.lock().pop().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!("all {SLOTS} request slots are taken by other threads"),
                )
            })?;
            leases.push(Lease {
                fs: self.id,
                slot,
                owner: Arc::downgrade(self),
            });
            Ok(slot)
        })
    }

    /// True for a daemon's isolated client: no index or region mapped,
    /// every read a request (see [`crate::isolated`]).
    pub(crate) fn isolated(&self) -> bool {
        self.index.is_none()
    }

    /// The read-only index, for loads that need no reader epoch (words of
    /// an inode Kfs keeps alive); `EOPNOTSUPP` for an isolated client.
    pub(crate) fn index(&self) -> io::Result<&ShmView> {
        self.index.as_ref().ok_or_else(|| err(Errno::EOPNOTSUPP))
    }

    /// The read-only region; `EOPNOTSUPP` for an isolated client.
    pub(crate) fn region(&self) -> io::Result<&RegionView> {
        self.region.as_ref().ok_or_else(|| err(Errno::EOPNOTSUPP))
    }

    /// Runs `f` on the index inside a reader epoch, so that nothing it
    /// reaches is reused before it returns; `EOPNOTSUPP` for an isolated
    /// client. `ENOTCONN`, and `f`'s result dropped, if the daemon evicted
    /// this client meanwhile (it held the epoch too long,
    /// ARCHITECTURE.md §9).
    pub(crate) fn with_index<R>(
        self: &Arc<Self>,
        f: impl FnOnce(IndexReader<'_, ShmView>) -> R,
    ) -> io::Result<R> {
        let index = self.index()?;
        let slot = self.slot()?;
        let r = IndexReader::new(index);
        self.conn.pin(slot, || r.epoch());
        let out = f(r);
        self.conn.unpin(slot).map_err(err)?;
        Ok(out)
    }

    /// Where this thread applies its own commits (embedded Kfs,
    /// [`Config::direct`]), what warms the cache ahead of one; `None` if
    /// commits go to Kfs.
    pub(crate) fn warmer(&self) -> Option<&Warmer> {
        self.conn.warmer()
    }

    /// Sends `req` from `slot` (this thread's): applied directly if
    /// possible, else queued.
    pub(crate) fn call_as(&self, slot: usize, req: &Request<'_>) -> io::Result<Reply> {
        self.conn.call(slot, req)
    }

    /// Runs `fill`, which copies the pages of the commit `req` into
    /// `slot`'s pool with non-temporal stores, and sends `req` from `slot`;
    /// the copy is durable before the commit's log entry is stored, and
    /// has drained when this returns (see [`Connection::commit_after`]).
    pub(crate) fn commit_after(
        &self,
        slot: usize,
        req: &Request<'_>,
        pages: u64,
        fill: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<Reply> {
        self.conn
            .commit_after(slot, req, pages, self.region()?, fill)
    }

    /// Sends `req` from this thread's slot.
    pub(crate) fn call_here(self: &Arc<Self>, req: &Request<'_>) -> io::Result<Reply> {
        let slot = self.slot()?;
        self.call_as(slot, req)
    }

    /// Takes up to `n` pages from `slot`'s pool, asking Kfs for more when
    /// it runs out. Fewer come back when a commit's extents are full or a
    /// grant fails after some were taken (the caller writes less, and asks
    /// again); an error (`ENOSPC` when the file system is full) only when
    /// none could be taken. Pages not taken stay in the pool.
    pub(crate) fn take_pages(&self, slot: usize, n: u64) -> io::Result<Extents> {
        let mut pool = self.pools[slot].lock();
        let mut out = Extents::new();
        let mut unpooled = false;
        while out.pages() < n {
            let Some(&(start, end)) = pool.last() else {
                let grant = Request::Grant {
                    pages: kucofs_common::proto::POOL_PAGES,
                };
                match self
                    .call_as(slot, &grant)
                    .and_then(|r| r.into_grant().map_err(err))
                {
                    Ok(g) => {
                        // The first run on top: taken first.
                        let below = pool.len();
                        pool.extend(g.runs().map(|(s, n)| (s.get(), s.get() + n)));
                        pool[below..].reverse();
                    }
                    // No page free: the pools of this process's other
                    // threads may hold some unused. Once per call, before
                    // settling for the pages taken so far (which would
                    // split the write's commit around the shortage).
                    Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && !unpooled => {
                        unpooled = true;
                        if self.unpool_others(slot) == 0 {
                            if out.pages() > 0 {
                                break;
                            }
                            return Err(e);
                        }
                    }
                    // Pages already taken are the caller's to write (its
                    // next request meets the failure): returning an error
                    // here would strand them, out of the pool and unused.
                    _ if out.pages() > 0 => break,
                    Err(e) => return Err(e),
                }
                continue;
            };
            // A run's count is a `u32`; a longer take (which no grant of
            // `POOL_PAGES` makes) takes the most one run holds, and the
            // caller asks again for the rest.
            let k = u32::try_from((n - out.pages()).min(end - start)).unwrap_or(u32::MAX);
            if !out.push(PageNo::new(start), k) {
                break;
            }
            let k = u64::from(k);
            if start + k == end {
                pool.pop();
            } else if let Some(top) = pool.last_mut() {
                top.0 += k;
            }
        }
        // The page the next write starts in: the CPU walks the page table
        // for it while this write goes on. Pool pages recycled after random
        // overwrites lie scattered, and a walk on the first store of the
        // copy into one stalls that copy.
        if let (Some(&(next, _)), Some(region)) = (pool.last(), &self.region) {
            region.prefetch_for_write(next * kucofs_common::format::PAGE_SIZE);
        }
        Ok(out)
    }

    /// Gives back to Kfs the pages in the pools of this process's slots
    /// other than `slot` (through `slot`); returns how many. A pool whose
    /// thread is taking from it at this moment is passed over, so that two
    /// threads doing this at once never wait for each other's pool.
    fn unpool_others(&self, slot: usize) -> u64 {
        let mut freed = 0;
        for (other, pool) in self.pools.iter().enumerate() {
            if other == slot {
                continue;
            }
            let Some(mut runs) = pool.try_lock() else {
                continue;
            };
            while let Some((start, end)) = runs.pop() {
                // A run Kfs refuses stays in the pool it came from (runs
                // come from grants, which are far shorter than `u32::MAX`).
                let given = u32::try_from(end - start).is_ok_and(|pages| {
                    let req = Request::Unpool {
                        slot: slot_number(other),
                        start: PageNo::new(start),
                        pages,
                    };
                    self.call_as(slot, &req).is_ok()
                });
                if !given {
                    runs.push((start, end));
                    break;
                }
                freed += end - start;
            }
        }
        freed
    }

    /// Gives pages taken by [`Inner::take_pages`] back to `slot`'s pool, in
    /// the order they were taken, when the write they were for failed
    /// before Kfs took them into a file (Kfs refuses a commit without
    /// taking any of its pages).
    pub(crate) fn untake_pages(&self, slot: usize, pages: &Extents) {
        let mut pool = self.pools[slot].lock();
        for e in pages.as_slice().iter().rev() {
            pool.push((e.start.get(), e.start.get() + u64::from(e.len)));
        }
    }

    /// The range lock of file `ino`, shared by every open of it here.
    pub(crate) fn range_lock(&self, ino: Ino) -> Arc<crate::range_lock::RangeLock> {
        let mut locks = self.range_locks.lock();
        if let Some(l) = locks.get(&ino).and_then(Weak::upgrade) {
            return l;
        }
        locks.retain(|_, w| w.strong_count() > 0);
        let l = Arc::new(crate::range_lock::RangeLock::new());
        locks.insert(ino, Arc::downgrade(&l));
        l
    }
}

pub(crate) fn bytes(p: &Path) -> &[u8] {
    p.as_os_str().as_bytes()
}

/// An open KucoFS file system.
///
/// `Fs` is `Send + Sync`: share it between threads by reference (or in an
/// `Arc`). Each thread that uses it gets its own request slot. Dropping it
/// closes the file system cleanly; [`Fs::close`] does the same and reports
/// errors.
#[derive(Debug)]
pub struct Fs {
    inner: Arc<Inner>,
}

impl Fs {
    /// Makes a new file system of `size` bytes in `image` (which must not
    /// exist yet) and opens it. An image file has all its memory reserved
    /// now, as a device has it: `ENOSPC` if the file system under it has
    /// no room for it (see [`Fs::create_sparse`]). Embedded only (Kfs's
    /// code makes the image): without the `embedded` feature, an
    /// `Unsupported` error.
    pub fn create(image: impl AsRef<Path>, size: u64) -> io::Result<Fs> {
        #[cfg(feature = "embedded")]
        {
            kucofs_kfs::mkfs(image.as_ref(), size, false).map_err(kfs_err)?;
            Fs::open(image)
        }
        #[cfg(not(feature = "embedded"))]
        {
            let _ = (image, size);
            Err(crate::connection::unsupported())
        }
    }

    /// [`Fs::create`], leaving a new image file sparse: its data pages
    /// take memory as Kfs hands them out (a grant with no room for them
    /// fails with `ENOSPC`), rather than all of it at once; its
    /// superblocks, log and owner table (about 1/250 of a large image)
    /// take theirs when it is made or opened (see
    /// [`Space`](kucofs_common::pm::Space)). For an image much larger than
    /// what it will hold. Embedded only, as [`Fs::create`].
    pub fn create_sparse(image: impl AsRef<Path>, size: u64) -> io::Result<Fs> {
        #[cfg(feature = "embedded")]
        {
            let persist = Arc::new(kucofs_common::pm::Hardware::new());
            let space = kucofs_common::pm::Space::Sparse;
            kucofs_kfs::mkfs_with(image.as_ref(), size, false, space, persist).map_err(kfs_err)?;
            Fs::open(image)
        }
        #[cfg(not(feature = "embedded"))]
        {
            let _ = (image, size);
            Err(crate::connection::unsupported())
        }
    }

    /// Attaches to the Kfs daemon (`kucofs serve IMAGE --socket PATH`)
    /// listening on `socket`: this process becomes one of its clients,
    /// sending every change to it. Needs no `embedded` feature. A client
    /// the daemon trusts (root, the daemon's own user, a member of its
    /// `--trusted-group`) reads the index and file data through read-only
    /// mappings it hands over; any other is isolated, maps nothing of the
    /// file system, and reads attributes, directories, symlinks and file
    /// data through requests the daemon checks against its credentials
    /// (ARCHITECTURE.md §2). Either way the daemon hands the image over
    /// read-only at most: file data this process writes goes through a
    /// staging area, from which Kfs copies it into the file, a chunk of up
    /// to 512 KiB at a time. The exception is a trusted client of a
    /// daemon serving with `--trusted-writes`: it gets the image
    /// read-write, and writes file data into pool pages Kfs grants it,
    /// as an embedded client does (with [`Protection::Off`]).
    pub fn connect(socket: impl AsRef<Path>) -> io::Result<Fs> {
        Fs::connect_with(socket, Config::default())
    }

    /// [`Fs::connect`] with a chosen configuration (of which the umask
    /// applies; the others are the daemon's).
    pub fn connect_with(socket: impl AsRef<Path>, config: Config) -> io::Result<Fs> {
        use kucofs_common::attach::{self, Hello, Welcome, DIRECT_FDS, WELCOME_FDS, WELCOME_SIZE};
        let path = socket.as_ref();
        let named = |e: io::Error, what: &str| {
            io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
        };
        let stream = std::os::unix::net::UnixStream::connect(path)
            .map_err(|e| named(e, "cannot connect to the KucoFS daemon at"))?;
        stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
        attach::send_with_fds(&stream, &Hello::current().encode(), &[])
            .map_err(|e| named(e, "the KucoFS daemon at"))?;
        let mut w = [0u8; WELCOME_SIZE];
        let fds = attach::recv_with_fds(&stream, &mut w)
            .map_err(|e| named(e, "no welcome from the KucoFS daemon at"))?;
        let welcome = Welcome::decode(&w).map_err(err)?;
        welcome.result.map_err(|e| {
            let why = if e == Errno::E2BIG {
                format!(
                    "this process is in more than {} supplementary groups, the most \
                     the daemon checks permissions with",
                    kucofs_common::access::GROUPS_MAX
                )
            } else {
                format!(
                    "{e}; it speaks protocol {}, this build {}",
                    welcome.version,
                    kucofs_common::proto::PROTO_VERSION
                )
            };
            io::Error::new(
                io::Error::from(e).kind(),
                format!(
                    "the KucoFS daemon at {} refused this client ({why})",
                    path.display()
                ),
            )
        })?;
        stream.set_read_timeout(None)?;
        let want = match (welcome.trusted, welcome.direct_writes) {
            (true, true) => DIRECT_FDS,
            (true, false) => WELCOME_FDS,
            (false, _) => attach::ISOLATED_FDS,
        };
        if fds.len() != want {
            return Err(err(Errno::EPROTO));
        }
        let mut fds = fds.into_iter();
        let mut next = || fds.next().ok_or_else(|| err(Errno::EPROTO));
        let (segment, doorbell) = (next()?, next()?);
        let segment = kucofs_common::channel::Segment::from_fd(segment).map_err(common_err)?;
        let doorbell = kucofs_common::channel::Doorbell::from_fd(doorbell).map_err(common_err)?;
        let staging = if welcome.direct_writes {
            None
        } else {
            let staging =
                kucofs_common::pm::Shm::from_fd(next()?, "kucofs-staging").map_err(common_err)?;
            if staging.len() != kucofs_common::proto::STAGE_BYTES * SLOTS as u64 {
                return Err(err(Errno::EPROTO));
            }
            Some(staging)
        };
        let (index, region) = if welcome.trusted {
            let index = ShmView::from_fd(next()?, "kucofs-index", welcome.index_reserve)
                .map_err(common_err)?;
            let image = std::fs::File::from(next()?);
            let region = if welcome.direct_writes {
                RegionView::from_file_writable(image, path)
            } else {
                RegionView::from_file(image, path)
            };
            (Some(index), Some(region.map_err(common_err)?))
        } else {
            (None, None)
        };
        let creds = kucofs_common::proto::Creds::current();
        let conn = Connection::daemon(segment, doorbell, creds, stream, staging);
        let mut config = config;
        config.direct = false;
        config.protection = Protection::Off;
        // No hints to a daemon (ARCHITECTURE.md §6): it trusts no address
        // a client sends, so it walks the path and checks the address at
        // about the cost of the search the address would spare it, while
        // finding it costs this thread a walk of its own before every
        // change (and an isolated client lacks the index to find it in).
        config.collaborative = false;
        Ok(Fs::connected(conn, index, region, config))
    }

    /// Opens the file system in `image`, recovering it if it was not closed
    /// cleanly, with Kfs running inside this process. Embedded only:
    /// without the `embedded` feature there is no Kfs to run here, and
    /// this fails with an `Unsupported` error.
    pub fn open(image: impl AsRef<Path>) -> io::Result<Fs> {
        Fs::open_with(image, Config::default())
    }

    /// [`Fs::open`] with a chosen configuration.
    pub fn open_with(image: impl AsRef<Path>, config: Config) -> io::Result<Fs> {
        #[cfg(feature = "embedded")]
        {
            Fs::open_embedded(image.as_ref(), config)
        }
        #[cfg(not(feature = "embedded"))]
        {
            let _ = (image, config);
            Err(crate::connection::unsupported())
        }
    }

    /// Opens `image` with Kfs running in this process.
    #[cfg(feature = "embedded")]
    fn open_embedded(image: &Path, config: Config) -> io::Result<Fs> {
        use kucofs_kfs::Volume;
        let volume = Volume::open(image).map_err(kfs_err)?;
        let index = volume.namespace().shm().view().map_err(common_err)?;
        let mut config = config;
        // Keys where the machine has them and the kernel tags the view;
        // otherwise batched page protection, the next fastest bounded mode
        // (a view the kernel would not tag is no reason to fail the open).
        let keyed = match config.protection {
            Protection::Keys => volume.image().region().keyed_view().ok().flatten(),
            _ => None,
        };
        let region = match keyed {
            Some(view) => view,
            None => {
                if config.protection == Protection::Keys {
                    config.protection = Protection::Batched;
                }
                volume.image().region().view().map_err(common_err)?
            }
        };
        // Kfs changes the view's page protection through this; a keyed
        // view has none, since its protection never changes. Huge pages:
        // reads go through a mapping whose protection never changes either
        // (see `RegionView`), which keeps them; the chunks a writer fills
        // are made huge ahead of it only where its pages' protection never
        // changes, and otherwise once writes pause (a protection change
        // inside a huge mapping splits it, and a chunk made huge under a
        // writer unmaps its pages).
        let protector = region.protector();
        config.server.huge_pages.get_or_insert(true);
        config.server.huge_ahead.get_or_insert(protector.is_none());
        let conn = Connection::embedded(
            volume,
            config.server,
            protector,
            config.protection,
            config.direct,
        )?;
        Ok(Fs::connected(conn, Some(index), Some(region), config))
    }

    /// A handle on the file system `conn` reaches, whose index and region
    /// this process reads through `index` and `region` (or, with neither,
    /// through requests).
    fn connected(
        conn: Connection,
        index: Option<ShmView>,
        region: Option<RegionView>,
        config: Config,
    ) -> Fs {
        Fs {
            inner: Arc::new(Inner {
                id: NEXT_FS_ID.fetch_add(1, Ordering::Relaxed),
                index,
                region,
                pools: (0..SLOTS).map(|_| Mutex::new(Vec::new())).collect(),
                range_locks: Mutex::default(),
                free_slots: Mutex::new((0..SLOTS).rev().collect()),
                conn,
                config,
            }),
        }
    }

    /// The protection mode in effect: the one asked for in [`Config`],
    /// except that [`Protection::Keys`] becomes [`Protection::Batched`]
    /// where the CPU or kernel has no memory protection keys.
    pub fn protection(&self) -> Protection {
        self.inner.config.protection
    }

    /// Closes the file system: Kfs finishes, checkpoints, and marks the
    /// image clean.
    pub fn close(self) -> io::Result<()> {
        self.stop(false)
    }

    /// Stops as a crash would: no retirement of the log, no clean flag;
    /// the next open recovers from the log. For crash tests. Embedded
    /// only (the `embedded` feature): it stops the Kfs running in this
    /// process.
    #[cfg(feature = "embedded")]
    pub fn simulate_crash(self) {
        let _ = self.stop(true);
    }

    /// Refuses further requests and stops Kfs, cleanly or as a crash
    /// would; the first of `close`, `simulate_crash` and drop does it.
    fn stop(&self, crash: bool) -> io::Result<()> {
        self.inner.conn.stop(crash)
    }

    /// Retires the log into the metadata store now, if anything changed
    /// since the last retirement: recovery then has nothing to replay.
    /// Kfs also retires on its own as the log fills and when it has been
    /// idle for a while; this is for a caller that wants that work done
    /// at a time of its choosing. Embedded only (the `embedded` feature):
    /// it acts on the Kfs running in this process.
    #[cfg(feature = "embedded")]
    pub fn checkpoint(&self) -> io::Result<()> {
        self.with_kfs(|k| k.checkpoint().map(drop))
    }

    /// Does now, on this thread, the background work Kfs has due: the
    /// provisioning that follows allocation (index and log pages populated
    /// ahead of use; with huge pages, the data pages made huge ahead of
    /// the writes and behind them, which copies what writes that outran
    /// it put in small pages) and a checkpoint. Kfs does this work on its
    /// own thread while idle, beside the application; this is for a caller
    /// that wants it over before a phase of its choosing, such as a
    /// benchmark's timed run after its setup wrote the files. Embedded
    /// only (the `embedded` feature): the work runs on the calling thread.
    #[cfg(feature = "embedded")]
    pub fn settle(&self) -> io::Result<()> {
        self.with_kfs(|k| {
            k.provision();
            k.checkpoint().map(drop)
        })
    }

    /// Bytes of the image and of the index that huge pages hold, with
    /// [`ServerConfig::huge_pages`](kucofs_kfs::ServerConfig::huge_pages)
    /// on (zero with it off, or where the kernel makes none). Embedded
    /// only (the `embedded` feature).
    #[cfg(feature = "embedded")]
    pub fn huge_page_bytes(&self) -> io::Result<u64> {
        self.with_kfs(|k| k.huge_bytes().ok_or(Errno::ENOTCONN))
    }

    /// `f` on the embedded Kfs; `ENOTCONN` once it has stopped.
    #[cfg(feature = "embedded")]
    fn with_kfs<T>(&self, f: impl FnOnce(&kucofs_kfs::Kfs) -> Result<T, Errno>) -> io::Result<T> {
        match self.inner.conn.with_kfs(f) {
            Some(r) => r.map_err(err),
            None => Err(err(Errno::ENOTCONN)),
        }
    }

    /// Kfs's counters (requests served, mean service time per type).
    /// Embedded only (the `embedded` feature): `None` for a Kfs that is
    /// not in this process, or once it has stopped.
    #[cfg(feature = "embedded")]
    pub fn kfs_stats(&self) -> Option<StatsSnapshot> {
        self.inner.conn.with_kfs(|k| k.stats())
    }

    /// The longest time Kfs served nothing else since the last call (see
    /// `Kfs::take_longest_pause`); `None` once it has stopped. Embedded
    /// only (the `embedded` feature).
    #[cfg(feature = "embedded")]
    pub fn take_longest_pause(&self) -> Option<std::time::Duration> {
        self.inner.conn.with_kfs(|k| k.take_longest_pause())
    }

    /// The configuration this handle was opened with.
    pub fn config(&self) -> Config {
        self.inner.config
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// Sends a change to Kfs: applied directly, or else queued with the
    /// addresses found for `path` if collaborative indexing is on.
    pub(crate) fn change<'p>(
        &self,
        path: &'p [u8],
        make: impl Fn(Option<Hint>) -> Request<'p>,
    ) -> io::Result<Reply> {
        let slot = self.inner.slot()?;
        if let Some(r) = self.inner.conn.try_direct(slot, &make(None)) {
            return r;
        }
        let hint = if self.inner.config.collaborative {
            self.inner.with_index(|r| r.locate(path))?
        } else {
            None
        };
        self.inner.conn.queue(slot, &make(hint))
    }

    fn create_node(&self, path: &Path, mode: u32, target: &[u8]) -> io::Result<Reply> {
        let p = bytes(path);
        self.change(p, |hint| Request::Create {
            at: Entry::Path(p),
            mode,
            target,
            hint,
        })
    }

    /// Creates an empty regular file; fails with `AlreadyExists` if the
    /// name exists (like `OpenOptions::create_new`).
    pub fn create_file(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let mode = libc::S_IFREG | (0o666 & !self.inner.config.umask);
        self.create_node(path.as_ref(), mode, b"").map(drop)
    }

    /// Creates a directory.
    pub fn create_dir(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let mode = libc::S_IFDIR | (0o777 & !self.inner.config.umask);
        self.create_node(path.as_ref(), mode, b"").map(drop)
    }

    /// Creates a directory and any missing parents.
    pub fn create_dir_all(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let path = path.as_ref();
        let mut so_far = PathBuf::new();
        for c in path.components() {
            so_far.push(c);
            if matches!(
                c,
                std::path::Component::RootDir | std::path::Component::CurDir
            ) {
                continue;
            }
            match self.create_dir(&so_far) {
                Ok(()) => {}
                Err(e)
                    if e.raw_os_error() == Some(libc::EEXIST)
                        && self.metadata(&so_far)?.is_dir() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Removes a file or symlink.
    pub fn remove_file(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let p = bytes(path.as_ref());
        self.change(p, |hint| Request::Unlink {
            at: Entry::Path(p),
            rmdir: false,
            hint,
        })
        .map(drop)
    }

    /// Removes an empty directory.
    pub fn remove_dir(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let p = bytes(path.as_ref());
        self.change(p, |hint| Request::Unlink {
            at: Entry::Path(p),
            rmdir: true,
            hint,
        })
        .map(drop)
    }

    /// Removes a directory and everything in it (not following symlinks).
    pub fn remove_dir_all(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let path = path.as_ref();
        for entry in self.read_dir(path)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                self.remove_dir_all(entry.path())?;
            } else {
                self.remove_file(entry.path())?;
            }
        }
        self.remove_dir(path)
    }

    fn rename_inner(&self, from: &Path, to: &Path, noreplace: bool) -> io::Result<()> {
        let (f, t) = (bytes(from), bytes(to));
        let make = |hint_from, hint_to| Request::Rename {
            from: Entry::Path(f),
            to: Entry::Path(t),
            noreplace,
            hint_from,
            hint_to,
        };
        let slot = self.inner.slot()?;
        if let Some(r) = self.inner.conn.try_direct(slot, &make(None, None)) {
            return r.map(drop);
        }
        let (hint_from, hint_to) = if self.inner.config.collaborative {
            self.inner.with_index(|r| (r.locate(f), r.locate(t)))?
        } else {
            (None, None)
        };
        self.inner
            .conn
            .queue(slot, &make(hint_from, hint_to))
            .map(drop)
    }

    /// Renames `from` to `to`, replacing `to` if it exists (POSIX rules).
    pub fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
        self.rename_inner(from.as_ref(), to.as_ref(), false)
    }

    /// Renames `from` to `to`, failing with `AlreadyExists` if `to` exists
    /// (`RENAME_NOREPLACE`).
    pub fn rename_noreplace(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
        self.rename_inner(from.as_ref(), to.as_ref(), true)
    }

    /// Makes `link` a new name for what `original` names.
    pub fn hard_link(&self, original: impl AsRef<Path>, link: impl AsRef<Path>) -> io::Result<()> {
        let (o, l) = (bytes(original.as_ref()), bytes(link.as_ref()));
        self.change(l, |hint| Request::Link {
            from: At::Path {
                path: o,
                follow: false,
            },
            to: Entry::Path(l),
            hint,
        })
        .map(drop)
    }

    /// Makes `link` a symbolic link to `original`.
    pub fn symlink(&self, original: impl AsRef<Path>, link: impl AsRef<Path>) -> io::Result<()> {
        self.create_node(
            link.as_ref(),
            libc::S_IFLNK | 0o777,
            bytes(original.as_ref()),
        )
        .map(drop)
    }

    /// The target of a symbolic link.
    pub fn read_link(&self, path: impl AsRef<Path>) -> io::Result<PathBuf> {
        let p = bytes(path.as_ref());
        if self.inner.isolated() {
            let at = At::Path {
                path: p,
                follow: false,
            };
            return Ok(PathBuf::from(
                <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(
                    self.inner.read_link_of(at)?,
                ),
            ));
        }
        let target = self.inner.with_index(|r| {
            let inode = r.resolve(p, false)?;
            r.readlink(inode).ok_or(Errno::EINVAL)
        })?;
        let target = target.map_err(err)?;
        Ok(PathBuf::from(
            <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(target),
        ))
    }

    fn stat(&self, path: &Path, follow: bool) -> io::Result<Metadata> {
        let p = bytes(path);
        if self.inner.isolated() {
            return self
                .inner
                .stat_of(At::Path { path: p, follow })
                .map(Metadata);
        }
        self.inner
            .with_index(|r| {
                r.resolve(p, follow)
                    .and_then(|i| r.attr(i).ok_or(Errno::ENOENT))
            })?
            .map(Metadata)
            .map_err(err)
    }

    /// Metadata of what `path` names, following symlinks.
    pub fn metadata(&self, path: impl AsRef<Path>) -> io::Result<Metadata> {
        self.stat(path.as_ref(), true)
    }

    /// Metadata of `path` itself, not following a final symlink.
    pub fn symlink_metadata(&self, path: impl AsRef<Path>) -> io::Result<Metadata> {
        self.stat(path.as_ref(), false)
    }

    /// True if `path` names something (following symlinks).
    pub fn exists(&self, path: impl AsRef<Path>) -> bool {
        self.metadata(path).is_ok()
    }

    /// Lists a directory.
    pub fn read_dir(&self, path: impl AsRef<Path>) -> io::Result<ReadDir> {
        let path = path.as_ref();
        let p = bytes(path);
        if self.inner.isolated() {
            return ReadDir::isolated(&self.inner, path);
        }
        let (dir, gen) = self
            .inner
            .with_index(|r| {
                let d = r.resolve(p, true)?;
                if r.kind(d) != Some(Kind::Dir) {
                    return Err(Errno::ENOTDIR);
                }
                Ok((d.get(), header_gen(r.header(d.get()))))
            })?
            .map_err(err)?;
        Ok(ReadDir {
            fs: self.inner.clone(),
            path: path.to_path_buf(),
            dir,
            gen,
            ino: Ino::new(0),
            after: None,
            buf: VecDeque::new(),
            done: false,
        })
    }

    fn set_attr(&self, path: &Path, follow: bool, attrs: SetAttrs) -> io::Result<()> {
        self.set_attr_now(path, follow, attrs, TimesNow::default())
    }

    fn set_attr_now(
        &self,
        path: &Path,
        follow: bool,
        attrs: SetAttrs,
        now: TimesNow,
    ) -> io::Result<()> {
        let req = Request::SetAttr {
            at: At::Path {
                path: bytes(path),
                follow,
            },
            attrs,
            now,
        };
        self.inner.call_here(&req).map(drop)
    }

    /// Changes permission bits (following symlinks).
    pub fn set_permissions(&self, path: impl AsRef<Path>, perm: Permissions) -> io::Result<()> {
        self.set_attr(
            path.as_ref(),
            true,
            SetAttrs {
                mode: Some(perm.mode()),
                ..SetAttrs::default()
            },
        )
    }

    /// Changes owner and/or group (following symlinks), like
    /// `std::os::unix::fs::chown`.
    pub fn chown(
        &self,
        path: impl AsRef<Path>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> io::Result<()> {
        self.set_attr(
            path.as_ref(),
            true,
            SetAttrs {
                uid,
                gid,
                ..SetAttrs::default()
            },
        )
    }

    /// Changes owner and/or group of a symlink itself.
    pub fn lchown(
        &self,
        path: impl AsRef<Path>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> io::Result<()> {
        self.set_attr(
            path.as_ref(),
            false,
            SetAttrs {
                uid,
                gid,
                ..SetAttrs::default()
            },
        )
    }

    /// Sets access and/or modification time (following symlinks); a
    /// time given as `None` is left as it is. Setting a time to a value
    /// takes the file's owner or root (`EPERM`).
    pub fn set_times(
        &self,
        path: impl AsRef<Path>,
        accessed: Option<SystemTime>,
        modified: Option<SystemTime>,
    ) -> io::Result<()> {
        let at = |t: Option<SystemTime>| t.map_or(SetTime::Omit, SetTime::At);
        self.utimens(path, at(accessed), at(modified))
    }

    /// Sets access and modification times to the time of the change, as
    /// `utimes(path, NULL)` (or `touch` on a file that exists): the
    /// file's owner, root, or anyone who may write the file (`EACCES`).
    pub fn set_times_now(&self, path: impl AsRef<Path>) -> io::Result<()> {
        self.utimens(path, SetTime::Now, SetTime::Now)
    }

    /// Sets access and modification times as `utimensat` does (following
    /// symlinks): each left, set to a value, or set to the time of the
    /// change. Both [`SetTime::Now`] is [`Fs::set_times_now`]; anything
    /// else that changes a time takes the file's owner or root (`EPERM`);
    /// both [`SetTime::Omit`] does nothing, not even look `path` up.
    pub fn utimens(
        &self,
        path: impl AsRef<Path>,
        accessed: SetTime,
        modified: SetTime,
    ) -> io::Result<()> {
        let (attrs, now) = times(accessed, modified)?;
        if attrs == SetAttrs::default() && now == TimesNow::default() {
            return Ok(());
        }
        self.set_attr_now(path.as_ref(), true, attrs, now)
    }

    /// File-system statistics, as Kfs counts them (one
    /// [`Request::Statfs`], in every mode).
    pub fn statfs(&self) -> io::Result<StatFs> {
        let slot = self.inner.slot()?;
        let s = self
            .inner
            .conn
            .call(slot, &Request::Statfs)?
            .into_statfs()
            .map_err(err)?;
        Ok(StatFs {
            block_size: u64::from(s.block_size),
            blocks: s.blocks,
            blocks_free: s.blocks_free,
            blocks_avail: s.blocks_avail,
            files: s.files,
            files_free: s.files_free,
            name_max: s.name_max,
        })
    }

    /// Sends Kfs a request that does nothing and waits for its reply: the
    /// round trip of a request, for a benchmark.
    pub fn ping(&self) -> io::Result<()> {
        let slot = self.inner.slot()?;
        self.inner.conn.call(slot, &Request::Ping).map(drop)
    }

    /// The credentials changes are made with.
    pub fn creds(&self) -> (u32, u32) {
        let c = self.inner.conn.creds();
        (c.uid, c.gid)
    }
}

/// A time [`Fs::utimens`] sets, as `utimensat` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    /// Left as it is (`UTIME_OMIT`).
    Omit,
    /// The time of the change (`UTIME_NOW`).
    Now,
    /// This time.
    At(SystemTime),
}

impl Drop for Fs {
    fn drop(&mut self) {
        let _ = self.stop(false);
    }
}

/// These need a Kfs to open an image with.
/// The changes and "now" flags that set the access and modification
/// times as `accessed` and `modified` say (`EOVERFLOW` for a time too
/// far from the epoch).
pub(crate) fn times(accessed: SetTime, modified: SetTime) -> io::Result<(SetAttrs, TimesNow)> {
    let mut attrs = SetAttrs::default();
    let mut now = TimesNow::default();
    let ns = |t: SystemTime| -> io::Result<i64> {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_nanos()).map_err(|_| err(Errno::EOVERFLOW)),
            Err(e) => i64::try_from(e.duration().as_nanos())
                .map(|v| -v)
                .map_err(|_| err(Errno::EOVERFLOW)),
        }
    };
    match accessed {
        SetTime::Omit => {}
        SetTime::Now => now.atime = true,
        SetTime::At(t) => attrs.atime = Some(ns(t)?),
    }
    match modified {
        SetTime::Omit => {}
        SetTime::Now => now.mtime = true,
        SetTime::At(t) => attrs.mtime = Some(ns(t)?),
    }
    Ok((attrs, now))
}

#[cfg(all(test, feature = "embedded"))]
pub(crate) mod tests {
    use super::*;

    /// A fresh 64 MiB file system in a directory under `/dev/shm` named
    /// `prefix...` (dropping the directory removes its image).
    pub(crate) fn scratch(prefix: &str) -> (tempfile::TempDir, Fs) {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in("/dev/shm")
            .unwrap();
        let fs = Fs::create(dir.path().join("fs.img"), 64 << 20).unwrap();
        (dir, fs)
    }

    #[test]
    fn pages_given_back_after_a_failed_write_are_taken_first() {
        let (_dir, fs) = scratch("kucofs-pool-");
        let inner = fs.inner();
        let slot = inner.slot().unwrap();
        let first = inner.take_pages(slot, 3).unwrap();
        let second = inner.take_pages(slot, 2).unwrap();
        inner.untake_pages(slot, &second);
        inner.untake_pages(slot, &first);
        let again: Vec<PageNo> = inner.take_pages(slot, 6).unwrap().iter_pages().collect();
        let before: Vec<PageNo> = first.iter_pages().chain(second.iter_pages()).collect();
        assert_eq!(again[..5], before[..]);
        // The sixth is the pool's next page, not one taken before.
        assert!(!before.contains(&again[5]));
        fs.close().unwrap();
    }
}
