//! The Kfs thread: polls its clients' request slots, applies each request
//! to the volume, replies, and keeps house (reclamation, checkpoints) when
//! idle (ARCHITECTURE.md §2, §5).
//!
//! Polling backs off adaptively: while requests arrive it spins; after
//! [`ServerConfig::spin`] without work it yields the CPU between polls;
//! after [`ServerConfig::yield_for`] it sleeps on the doorbell until a
//! client rings. On a 2-core machine a spinning Kfs takes a core from the
//! application, so the spin window is short.
//!
//! In embedded mode a client thread may also apply its request itself,
//! through [`Direct`]: it takes the lock the Kfs thread holds while
//! serving, so there is still exactly one writer at a time and every change
//! takes the same path (check, durable log entry, apply), but the request
//! crosses no core. Such threads also keep house, every
//! `DIRECT_HOUSEKEEPING` requests, while the Kfs thread sleeps: it wakes
//! when a protection batch reaches its deadline and when they tell it to
//! populate pages ahead of use (see `Nudge`).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kucofs_common::channel::{Doorbell, Segment, SLOTS};
use kucofs_common::proto::{Creds, Reply, Request, RequestKind, REQUEST_MAX};
use kucofs_common::Errno;
use parking_lot::Mutex;

use crate::namespace::now_ns;
use crate::provision::{Behind, Provisioner};
use crate::volume::{make_deferred, Caller, Readers, Volume, Warmer};
use crate::{Error, Result};
use kucofs_common::pm::{Protection, Protector};

/// How the Kfs thread polls.
#[derive(Debug, Clone, Copy)]
pub struct ServerConfig {
    /// Keep spinning this long after the last request.
    pub spin: Duration,
    /// Then yield between polls this long before sleeping.
    pub yield_for: Duration,
    /// Sleep at most this long between housekeeping rounds.
    pub sleep: Duration,
    /// Checkpoint after this long without requests, if the log holds any.
    pub idle_checkpoint: Duration,
    /// For an image on tmpfs: hold the log, the index and the data pages
    /// in huge pages (2 MiB), made as they come into use or, for the data
    /// pages without [`ServerConfig::huge_ahead`], once writes pause (see
    /// [`Volume::enable_huge_pages`]). `None` (the default) leaves the
    /// choice to whoever starts Kfs: the embedded library turns them on;
    /// Kfs alone takes `None` as off.
    pub huge_pages: Option<bool>,
    /// With huge pages: make the data chunks just ahead of the grants huge
    /// as they are provisioned, rather than allocate them in small pages
    /// and make them huge once Kfs has been quiet a while (see
    /// [`Behind`]). Pays where no protection change splits a client's
    /// huge mappings of the pages it writes. `None` (the default) leaves
    /// the choice to whoever starts Kfs: the embedded library turns it on
    /// for a view whose protection never changes (protection keys); Kfs
    /// alone takes `None` as off.
    pub huge_ahead: Option<bool>,
    /// Evict a client whose thread holds back reclamation with one reader
    /// epoch this long (ARCHITECTURE.md §9): Kfs stops waiting for it and
    /// closes its connection ([`Client::hangup`]). `None` (the default)
    /// never does: in embedded mode the one client is the process Kfs runs
    /// in. `kucofs serve` evicts after 5 s.
    pub evict_after: Option<Duration>,
    /// How long a client may keep writing a file another client waits
    /// for before it loses the lease (ARCHITECTURE.md §8).
    pub lease_wait: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            spin: Duration::from_micros(50),
            yield_for: Duration::from_millis(2),
            sleep: Duration::from_millis(100),
            idle_checkpoint: Duration::from_millis(500),
            huge_pages: None,
            huge_ahead: None,
            evict_after: None,
            lease_wait: crate::volume::LEASE_WAIT,
        }
    }
}

const KINDS: usize = RequestKind::ALL.len();

/// Adds `n` to a counter only the holder of the volume's lock changes
/// (readers load it with `Relaxed`, and may see it a little behind);
/// returns the old value.
fn bump(counter: &AtomicU64, n: u64) -> u64 {
    let old = counter.load(Ordering::Relaxed);
    counter.store(old.wrapping_add(n), Ordering::Relaxed);
    old
}

/// Counters the Kfs thread keeps, readable from any thread.
#[derive(Debug)]
pub struct Stats {
    started: Instant,
    count: [AtomicU64; KINDS],
    /// Requests timed, and their total time.
    timed: [AtomicU64; KINDS],
    ns: [AtomicU64; KINDS],
    reclaimed: AtomicU64,
    direct: AtomicU64,
    /// The longest timed request since [`Kfs::take_longest_pause`] last
    /// asked, in ns.
    longest: AtomicU64,
}

impl Stats {
    fn new() -> Stats {
        Stats {
            started: Instant::now(),
            count: Default::default(),
            timed: Default::default(),
            ns: Default::default(),
            reclaimed: AtomicU64::new(0),
            direct: AtomicU64::new(0),
            longest: AtomicU64::new(0),
        }
    }

    /// Runs `f`, a request of `kind`, counting it, and timing about one
    /// request in 8 (two clock reads per request would cost a few percent
    /// of a create); the timed ones stand for all of their kind. Callers
    /// hold the volume's lock, so the counters have one writer at a time
    /// and a load and a store add to them, cheaper than a locked add.
    fn served<R>(&self, kind: RequestKind, f: impl FnOnce() -> R) -> R {
        // `RequestKind::ALL` lists the kinds in declaration order.
        let i = kind as usize;
        let n = bump(&self.count[i], 1);
        // Pseudo-random, not periodic: costly requests that recur with a
        // period (a table doubling every 2^k entries) must be sampled too.
        if n.wrapping_mul(crate::intmap::PHI) >> 61 != 0 {
            return f();
        }
        let t0 = Instant::now();
        let r = f();
        // A request would have to run 584 years to be truncated.
        #[allow(clippy::cast_possible_truncation)]
        let ns = t0.elapsed().as_nanos() as u64;
        bump(&self.timed[i], 1);
        bump(&self.ns[i], ns);
        // One writer at a time (see above); a reader that takes the value
        // between the load and the store loses nothing but this request.
        if ns > self.longest.load(Ordering::Relaxed) {
            self.longest.store(ns, Ordering::Relaxed);
        }
        r
    }

    /// A copy of the counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let per_kind: Vec<(RequestKind, u64, u64)> = RequestKind::ALL
            .iter()
            .enumerate()
            .map(|(i, &k)| {
                let n = self.count[i].load(Ordering::Relaxed);
                let timed = self.timed[i].load(Ordering::Relaxed).max(1);
                // Total service time, extrapolated from the timed requests.
                let ns = u128::from(self.ns[i].load(Ordering::Relaxed)) * u128::from(n)
                    / u128::from(timed);
                (k, n, u64::try_from(ns).unwrap_or(u64::MAX))
            })
            .filter(|&(_, n, _)| n > 0)
            .collect();
        StatsSnapshot {
            uptime: self.started.elapsed(),
            busy: Duration::from_nanos(per_kind.iter().map(|k| k.2).sum()),
            per_kind,
            // The volume's own counters are filled in by `Kfs::stats`.
            checkpoints: 0,
            replayed: 0,
            checkpoint_time: Duration::ZERO,
            longest_checkpoint: Duration::ZERO,
            reclaimed: self.reclaimed.load(Ordering::Relaxed),
            hints_used: 0,
            hints_stale: 0,
            hints_absent: 0,
            direct: self.direct.load(Ordering::Relaxed),
        }
    }
}

/// Kfs's counters at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsSnapshot {
    /// Since the thread started.
    pub uptime: Duration,
    /// Time spent serving requests.
    pub busy: Duration,
    /// Per request type: (type, count, total service time in ns, estimated
    /// from one request in 8).
    pub per_kind: Vec<(RequestKind, u64, u64)>,
    /// Checkpoints taken (retirements of the log into the store).
    pub checkpoints: u64,
    /// Log records replayed when the file system was opened.
    pub replayed: u64,
    /// Time spent retiring the log, and the longest retirement.
    pub checkpoint_time: Duration,
    #[allow(missing_docs)]
    pub longest_checkpoint: Duration,
    /// Index items and data pages reclaimed after their grace period.
    pub reclaimed: u64,
    /// Pre-located addresses used as sent.
    pub hints_used: u64,
    /// Pre-located addresses found stale (Kfs searched itself).
    pub hints_stale: u64,
    /// Lookups in requests that came without addresses.
    pub hints_absent: u64,
    /// Requests applied directly by client threads (embedded mode).
    pub direct: u64,
}

impl StatsSnapshot {
    /// Requests served.
    pub fn served(&self) -> u64 {
        self.per_kind.iter().map(|k| k.1).sum()
    }

    /// Mean service time `L` of one request type.
    pub fn mean(&self, kind: RequestKind) -> Option<Duration> {
        self.per_kind
            .iter()
            .find(|k| k.0 == kind)
            .map(|&(_, n, ns)| Duration::from_nanos(ns / n.max(1)))
    }
}

impl fmt::Display for StatsSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = self.busy.as_secs_f64() * 100.0 / self.uptime.as_secs_f64().max(1e-9);
        writeln!(
            f,
            "kfs: {} requests ({} applied directly by client threads) in {:.1?} ({pct:.1}% busy), {} index items and data pages reclaimed",
            self.served(),
            self.direct,
            self.uptime,
            self.reclaimed
        )?;
        writeln!(
            f,
            "kfs: {} retirements of the log into the store, {:.1?} in all, the longest {:.1?}",
            self.checkpoints, self.checkpoint_time, self.longest_checkpoint
        )?;
        writeln!(
            f,
            "kfs: pre-located addresses: {} used, {} stale, {} requests without",
            self.hints_used, self.hints_stale, self.hints_absent
        )?;
        for &(k, n, ns) in &self.per_kind {
            writeln!(
                f,
                "kfs:   {k:?}: {n} served, mean service time L = {} ns",
                ns / n.max(1)
            )?;
        }
        Ok(())
    }
}

/// One client the Kfs thread serves.
#[derive(Debug)]
pub struct Client {
    /// Kfs's mapping of the client's request segment.
    pub segment: Segment,
    /// The credentials its changes are made with.
    pub creds: Creds,
    /// How Kfs changes the protection of the client's view of the region
    /// (embedded mode: the view is in Kfs's own process).
    pub protector: Option<Protector>,
    /// When its committed pages become read-only again.
    pub protection: Protection,
    /// Kfs's mapping of its staging area (moved to the volume when the
    /// client is attached), for a client that cannot write into the image
    /// itself (see
    /// [`Request::Write`]).
    pub staging: Option<kucofs_common::pm::Shm>,
    /// The client's connection, for a client in another process: Kfs
    /// shuts it down when it evicts the client, and the daemon then
    /// detaches it as for any closed connection.
    pub hangup: Option<std::os::unix::net::UnixStream>,
}

/// A running Kfs thread.
#[derive(Debug)]
pub struct Kfs {
    thread: Option<JoinHandle<Result<()>>>,
    stop: Arc<AtomicBool>,
    crash: Arc<AtomicBool>,
    doorbell: Arc<Doorbell>,
    stats: Arc<Stats>,
    clients: Arc<Mutex<Vec<(u32, Client)>>>,
    /// Clients to forget (see [`Kfs::detach`]).
    leaving: Arc<Mutex<Vec<u32>>>,
    /// Set when `clients` or `leaving` has news for the Kfs thread.
    new_clients: Arc<AtomicBool>,
    next_client: std::sync::atomic::AtomicU32,
    readers: Readers,
    volume: Shared,
    nudge: Arc<Nudge>,
    /// The volume's [protection order](Volume::protection_order).
    order: Arc<Mutex<()>>,
    /// The image's path, for errors.
    path: std::path::PathBuf,
}

/// Detaches clients from Kfs ([`Kfs::detach`]) without holding the
/// [`Kfs`] itself: one per thread watching a client's connection.
#[derive(Debug, Clone)]
pub struct Detacher {
    leaving: Arc<Mutex<Vec<u32>>>,
    new_clients: Arc<AtomicBool>,
    /// To wake the Kfs thread.
    doorbell: Arc<Doorbell>,
}

impl Detacher {
    /// As [`Kfs::detach`].
    pub fn detach(&self, id: u32) {
        self.leaving.lock().push(id);
        self.new_clients.store(true, Ordering::Release);
        self.doorbell.wake();
    }
}

/// The volume, locked by whoever applies requests (the Kfs thread, or a
/// client thread applying directly). `None` once Kfs has stopped.
type Shared = Arc<Mutex<Option<Volume>>>;

/// A client thread's way to apply requests itself while Kfs is idle
/// (embedded mode only: the caller runs Kfs's code in Kfs's process).
#[derive(Debug, Clone)]
pub struct Direct {
    volume: Shared,
    stats: Arc<Stats>,
    nudge: Arc<Nudge>,
    /// The volume's [protection order](Volume::protection_order).
    order: Arc<Mutex<()>>,
    /// `None` if Kfs had stopped when this was made.
    warmer: Option<Warmer>,
}

/// Locks `m`, spinning first while the holder is likely to be done soon:
/// a direct request holds the volume's lock for a few hundred
/// nanoseconds, less than sleeping and waking again costs.
fn lock_spinning<T>(m: &Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
    for _ in 0..SPINS {
        if !m.is_locked() {
            if let Some(g) = m.try_lock() {
                return g;
            }
        }
        std::hint::spin_loop();
    }
    m.lock()
}

/// How many times [`lock_spinning`] looks at the lock, with a pause
/// between looks, before it waits as usual: microseconds to tens of
/// microseconds, as the CPU's pause is short or long. A spinner may take
/// the lock ahead of a sleeping waiter (the Kfs thread); the lock's own
/// fairness hands it over to a waiter that has slept long.
const SPINS: u32 = 2000;

/// Client threads applying requests directly keep house every this many
/// of them (a round frees about as many replaced pages).
const DIRECT_HOUSEKEEPING: u64 = 256;

/// Buckets of the directories' table doublings the Kfs thread migrates in
/// a round of housekeeping while idle, before it polls again: about 100
/// µs in a directory of millions of entries, the most a request arriving
/// meanwhile waits for. A doubling
/// to 2^23 buckets takes 16,384 rounds, under two seconds of idle time.
pub const IDLE_GROW_STEP: u64 = 256;

/// With huge pages, the Kfs thread makes huge the data chunks writers
/// outran only once no request has come for this long, and then at a
/// pace (see [`Behind`]): reads send none, so a file being read gets its
/// huge pages while writers' pages stay undisturbed.
const QUIET: Duration = Duration::from_millis(50);

/// How client threads applying requests directly reach the Kfs thread,
/// which sleeps while they work. They keep house themselves, under the
/// lock they hold anyway; a Kfs thread waking to do it would run beside
/// them, and on a machine with few cores that costs them more than the
/// work: every protection change they make must then interrupt its core
/// to flush its TLB, and it holds their lock meanwhile. They wake it only
/// for what must happen in the background (page provisioning) or on time
/// (a batch's deadline, when the writer stops committing).
#[derive(Debug)]
struct Nudge {
    doorbell: Doorbell,
    /// Set before the doorbell is rung. SeqCst, as the doorbell's sleeping
    /// flag: the Kfs thread checks this after saying it sleeps, and a
    /// nudger rings after setting it, so one of them sees the other.
    wanted: AtomicBool,
    /// The page provisioning the Kfs thread runs.
    provision: Mutex<Option<Provisioner>>,
}

impl Nudge {
    fn wake(&self) {
        self.wanted.store(true, Ordering::SeqCst);
        self.doorbell.ring();
    }
}

impl Direct {
    /// The [`Warmer`] for a commit this thread is about to apply: `None`
    /// if Kfs had stopped when this handle was made.
    pub fn warmer(&self) -> Option<&Warmer> {
        self.warmer.as_ref()
    }

    /// Applies `req` on the calling thread, waiting for the volume's lock
    /// if another thread (a client, or Kfs keeping house) holds it;
    /// `None` if Kfs has stopped. Waiting beats queueing: a queued request
    /// would wait for the same lock, in the Kfs thread.
    ///
    /// The protection changes the request calls for are made after the
    /// lock is released, before the reply is returned (see
    /// [`Changes`](crate::volume::Changes)): another thread's commit need
    /// not wait for them.
    pub fn try_apply(
        &self,
        req: &Request<'_>,
        caller: Caller,
    ) -> Option<std::result::Result<Reply, Errno>> {
        self.apply_locked(lock_spinning(&self.volume), req, caller)
    }

    /// Runs `fill` on the calling thread, then applies `req` as
    /// [`Direct::try_apply`] does; `Ok(None)` if Kfs has stopped (`fill`
    /// has run), `Err` if `fill` failed (`req` is not applied). For a
    /// commit whose pages `fill` copies with non-temporal stores: if
    /// nobody holds the volume's lock, `fill` runs under it, so that the
    /// commit's checks and the encoding of its log entry run while those
    /// stores drain (the commit fences them before it stores the entry,
    /// see [`Log::append_prepared`](crate::log::Log::append_prepared)),
    /// where taking the lock after them would wait for the drain first (a
    /// locked instruction orders every earlier store). If the lock is
    /// held, `fill` runs before waiting for it, so that nobody waits for
    /// the copy. Callers keep `fill` short (a few pages): other threads
    /// may wait for it. `fill` must not apply a request itself: the lock
    /// it may run under is not re-entrant.
    pub fn try_apply_after<E>(
        &self,
        req: &Request<'_>,
        caller: Caller,
        fill: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<Option<std::result::Result<Reply, Errno>>, E> {
        let free = self.volume.try_lock();
        fill()?;
        let guard = free.unwrap_or_else(|| lock_spinning(&self.volume));
        Ok(self.apply_locked(guard, req, caller))
    }

    /// [`Direct::try_apply`] under the volume's lock, `guard`, which it
    /// releases.
    fn apply_locked(
        &self,
        mut guard: parking_lot::MutexGuard<'_, Option<Volume>>,
        req: &Request<'_>,
        caller: Caller,
    ) -> Option<std::result::Result<Reply, Errno>> {
        let volume = guard.as_mut()?;
        let reply = self
            .stats
            .served(req.kind(), || volume.handle_deferred(req, caller));
        let n = bump(&self.stats.direct, 1) + 1;
        let mut wake = volume.take_wake_kfs();
        if n.is_multiple_of(DIRECT_HOUSEKEEPING) {
            keep_house(volume, &self.stats);
            // A provisioning Kfs thread holds the lock, and is awake. A
            // request applied here means Kfs is not quiet: nothing is due
            // behind the writes.
            wake |= self
                .nudge
                .provision
                .try_lock()
                .is_some_and(|p| p.as_ref().is_some_and(|p| p.is_due(Behind::Hold)));
        }
        let reply = make_deferred(guard, &self.volume, &self.order, req, caller, reply);
        if wake {
            self.nudge.wake();
        }
        Some(reply)
    }
}

impl Kfs {
    /// Starts the Kfs thread on `volume`. Clients ring `doorbell`.
    pub fn start(volume: Volume, doorbell: &Doorbell, config: ServerConfig) -> Result<Kfs> {
        let stop = Arc::new(AtomicBool::new(false));
        let crash = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Stats::new());
        let clients = Arc::new(Mutex::new(Vec::new()));
        let new_clients = Arc::new(AtomicBool::new(false));
        let leaving = Arc::new(Mutex::new(Vec::new()));
        let readers = Readers::default();
        let mut volume = volume;
        volume.set_readers(readers.clone());
        volume.set_eviction(config.evict_after);
        volume.set_lease_wait(config.lease_wait);
        if config.huge_pages == Some(true) {
            volume.enable_huge_pages();
        }
        let nudge = Arc::new(Nudge {
            doorbell: doorbell.map_again().map_err(Error::Region)?,
            wanted: AtomicBool::new(false),
            provision: Mutex::new(Some({
                let mut p = volume.provisioner();
                p.set_huge_ahead(config.huge_ahead == Some(true));
                p
            })),
        });
        let order = volume.protection_order();
        let path = volume.image().region().path().to_path_buf();
        let shared: Shared = Arc::new(Mutex::new(Some(volume)));
        let io = Error::Region;
        let bell = doorbell.map_again().map_err(io)?;
        let thread = {
            let (stop, crash, stats, clients, leaving, new_clients, shared, nudge) = (
                stop.clone(),
                crash.clone(),
                stats.clone(),
                clients.clone(),
                leaving.clone(),
                new_clients.clone(),
                shared.clone(),
                nudge.clone(),
            );
            std::thread::Builder::new()
                .name("kfs".into())
                .spawn(move || {
                    let mut s = Server {
                        nudge,
                        volume: shared.clone(),
                        clients: Vec::new(),
                        doorbell: bell,
                        stats,
                        config,
                    };
                    s.run(&stop, &clients, &leaving, &new_clients);
                    // Its hold on the region goes with the thread, as the
                    // volume's does: a stopped Kfs must not keep the image
                    // locked for as long as a client keeps a `Direct`.
                    s.nudge.provision.lock().take();
                    let volume = shared.lock().take();
                    match volume {
                        // A simulated crash: no checkpoint, no clean flag.
                        Some(v) if crash.load(Ordering::Acquire) => {
                            drop(v);
                            Ok(())
                        }
                        Some(v) => v.close(),
                        None => Ok(()),
                    }
                })
                .map_err(|cause| Error::ThreadStart {
                    path: path.clone(),
                    cause,
                })?
        };
        Ok(Kfs {
            thread: Some(thread),
            stop,
            crash,
            doorbell: Arc::new(doorbell.map_again().map_err(io)?),
            stats,
            clients,
            leaving,
            new_clients,
            next_client: std::sync::atomic::AtomicU32::new(0),
            readers,
            volume: shared,
            nudge,
            order,
            path,
        })
    }

    /// A handle for applying requests directly from client threads of this
    /// process.
    pub fn direct(&self) -> Direct {
        Direct {
            volume: self.volume.clone(),
            stats: self.stats.clone(),
            nudge: self.nudge.clone(),
            order: self.order.clone(),
            warmer: self.volume.lock().as_ref().map(Volume::warmer),
        }
    }

    /// Adds a client; Kfs serves it from its next poll. Returns the
    /// client's number (what its direct requests name as [`Caller::client`]).
    pub fn attach(&self, mut client: Client) -> Result<u32> {
        let id = self.next_client.fetch_add(1, Ordering::Relaxed);
        // Mapped before anything of the client is recorded: a client
        // attached without its staging area would count as one that may
        // hold a pool.
        let epochs = client.segment.map_again().map_err(Error::Region)?;
        if let Some(v) = self.volume.lock().as_mut() {
            v.attach_client(
                id,
                client.protector.clone(),
                client.protection,
                client.staging.take(),
            );
        }
        self.readers.lock().push((id, epochs));
        self.clients.lock().push((id, client));
        self.new_clients.store(true, Ordering::Release);
        self.doorbell.wake();
        Ok(id)
    }

    /// Forgets client `id` (its process closed its connection or died):
    /// the Kfs thread stops serving its slots and releases its leases,
    /// pool pages, open files and reader epochs.
    pub fn detach(&self, id: u32) {
        self.detacher().detach(id);
    }

    /// A handle that detaches clients from another thread.
    pub fn detacher(&self) -> Detacher {
        Detacher {
            leaving: self.leaving.clone(),
            new_clients: self.new_clients.clone(),
            doorbell: self.doorbell.clone(),
        }
    }

    /// Kfs's counters. Those the volume keeps itself (pre-located address
    /// checks, checkpoints) are read under its lock, here rather than on
    /// every request.
    pub fn stats(&self) -> StatsSnapshot {
        let mut s = self.stats.snapshot();
        if let Some(v) = self.volume.lock().as_ref() {
            let h = v.namespace().hint_stats();
            (s.hints_used, s.hints_stale, s.hints_absent) = (h.used, h.stale, h.absent);
            s.checkpoints = v.checkpoints();
            s.replayed = v.replayed().entries;
            let r = v.retirements();
            (s.checkpoint_time, s.longest_checkpoint) = (r.total, r.longest);
        }
        s
    }

    /// Writes a checkpoint now if the log holds changes since the last
    /// one, after freeing what no reader can still see (what Kfs would do
    /// at its next idle round). True if it checkpointed.
    pub fn checkpoint(&self) -> std::result::Result<bool, kucofs_common::Errno> {
        let mut guard = self.volume.lock();
        let Some(v) = guard.as_mut() else {
            return Ok(false);
        };
        keep_house(v, &self.stats);
        v.checkpoint_if_dirty()
    }

    /// Does now, on the calling thread, the provisioning that is due: the
    /// index and the log populated ahead of use, the data pages allocated
    /// ahead of the grants, with huge pages enabled every data chunk below
    /// made huge (those ahead too, with [`ServerConfig::huge_ahead`]) as
    /// the Kfs thread would once quiet, but without its pace, and a chunk
    /// the kernel would not make huge asked for again if its wait is over
    /// (see [`ServerConfig::huge_pages`]). The Kfs thread does this while
    /// idle, a step at a time; this takes the provisioning for one step at
    /// a time too, so the Kfs thread can serve requests in between. Once
    /// Kfs has stopped there is nothing to do.
    pub fn provision(&self) {
        while self
            .nudge
            .provision
            .lock()
            .as_mut()
            .is_some_and(|p| p.step(Behind::Now))
        {}
    }

    /// Bytes of the region and the index held in huge pages (see
    /// [`ServerConfig::huge_pages`]); `None` once the volume is closed.
    pub fn huge_bytes(&self) -> Option<u64> {
        self.volume.lock().as_ref().map(Volume::huge_bytes)
    }

    /// The longest time Kfs served nothing else since the last call: the
    /// longer of the longest timed request (one in 8 is timed) and the
    /// longest retirement of the log (each is timed). A retirement runs
    /// inside the request whose change called for it, or on its own when
    /// Kfs is idle.
    pub fn take_longest_pause(&self) -> Duration {
        let sampled = Duration::from_nanos(self.stats.longest.swap(0, Ordering::Relaxed));
        let retired = self
            .volume
            .lock()
            .as_mut()
            .map_or(Duration::ZERO, Volume::take_longest_retirement);
        sampled.max(retired)
    }

    fn stop(&mut self) -> Result<()> {
        self.stop.store(true, Ordering::Release);
        self.doorbell.wake();
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| {
                Err(Error::ThreadPanicked {
                    path: self.path.clone(),
                })
            }),
            None => Ok(()),
        }
    }

    /// Stops the thread after the requests in flight, checkpoints, and
    /// marks the image clean.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop()
    }

    /// Stops the thread as a crash would: no checkpoint, no clean flag (the
    /// next open recovers from the log). For tests.
    pub fn crash(mut self) {
        self.crash.store(true, Ordering::Release);
        let _ = self.stop();
    }
}

impl Drop for Kfs {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

struct Server {
    nudge: Arc<Nudge>,
    volume: Shared,
    clients: Vec<(u32, Client)>,
    doorbell: Doorbell,
    stats: Arc<Stats>,
    config: ServerConfig,
}

impl Server {
    fn run(
        &mut self,
        stop: &AtomicBool,
        incoming: &Mutex<Vec<(u32, Client)>>,
        leaving: &Mutex<Vec<u32>>,
        new_clients: &AtomicBool,
    ) {
        let mut buf = [0u8; REQUEST_MAX];
        let mut last_work = Instant::now();
        let mut since_reclaim = 0u32;
        let mut polls = 0u32;
        let mut direct_seen = 0u64;
        let mut last_direct = Instant::now();
        // Set when requests were served since the clock was last read:
        // `last_work` is brought up to date at the next clock read (at
        // most 64 empty polls later), not at every request.
        let mut worked = false;
        loop {
            // A plain load first: the swap, a locked instruction, only
            // when a client came or went.
            if new_clients.load(Ordering::Relaxed) && new_clients.swap(false, Ordering::AcqRel) {
                self.clients.append(&mut incoming.lock());
                let gone = std::mem::take(&mut *leaving.lock());
                if !gone.is_empty() {
                    self.clients.retain(|(id, _)| !gone.contains(id));
                    if let Some(v) = self.volume.lock().as_mut() {
                        for id in gone {
                            // A client's leases, pool pages, opens and
                            // reader epochs go with it; a failure here
                            // (an unpin of a file already gone) leaves
                            // nothing of it in use.
                            let _ = v.detach_client(id);
                        }
                    }
                }
            }
            let served = self.poll(&mut buf);
            if served > 0 {
                worked = true;
                since_reclaim += served;
                if since_reclaim >= 1024 {
                    since_reclaim = 0;
                    self.keep_house();
                }
                continue;
            }
            if stop.load(Ordering::Acquire) {
                return;
            }
            // The clock is read every 64 empty polls, not every one.
            polls = polls.wrapping_add(1);
            if !polls.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            // Polling backs off by the time since the last queued request;
            // an idle checkpoint also waits for direct requests to stop.
            if std::mem::take(&mut worked) {
                last_work = Instant::now();
            }
            let direct = self.stats.direct.load(Ordering::Relaxed);
            if direct != direct_seen {
                direct_seen = direct;
                last_direct = Instant::now();
            }
            // Nothing queued: make pages ready ahead of use, a chunk at a
            // time (direct requests keep allocating while Kfs is idle).
            let idle = last_work.elapsed();
            let quiet = idle.min(last_direct.elapsed());
            let behind = if quiet >= QUIET {
                Behind::Paced
            } else {
                Behind::Hold
            };
            if self
                .nudge
                .provision
                .lock()
                .as_mut()
                .is_some_and(|p| p.step(behind))
            {
                continue;
            }
            if idle < self.config.spin {
                std::hint::spin_loop();
            } else if idle < self.config.yield_for {
                std::thread::yield_now();
            } else {
                if quiet >= self.config.idle_checkpoint {
                    if let Some(v) = self.volume.lock().as_mut() {
                        // Best effort: a failed idle checkpoint is retried
                        // when the log fills.
                        let _ = v.checkpoint_if_dirty();
                    }
                }
                let mut nap = self.keep_house_idle(last_direct.elapsed() < self.config.sleep);
                self.hang_up_evicted();
                let p = &self.nudge.provision;
                if p.lock().as_ref().is_some_and(Provisioner::behind_pending) {
                    nap = nap.min(crate::provision::BEHIND_PACE);
                }
                let clients = &self.clients;
                let wanted = &self.nudge.wanted;
                self.doorbell.sleep(nap, || {
                    stop.load(Ordering::Acquire)
                        || new_clients.load(Ordering::Acquire)
                        || wanted.load(Ordering::SeqCst)
                        || clients.iter().any(|c| c.1.segment.any_pending())
                });
                wanted.store(false, Ordering::SeqCst);
            }
        }
    }

    fn poll(&mut self, buf: &mut [u8; REQUEST_MAX]) -> u32 {
        let mut served = 0;
        let mut guard = None;
        for (id, c) in &self.clients {
            for w in 0..SLOTS / 64 {
                let mut bits = c.segment.take_pending(w);
                if bits == 0 {
                    continue;
                }
                // The volume is locked only while there is work, so client
                // threads may apply directly whenever Kfs is idle.
                let g = guard.get_or_insert_with(|| self.volume.lock());
                let Some(volume) = g.as_mut() else {
                    return served;
                };
                while bits != 0 {
                    let slot = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    // Lossless: a slot is below SLOTS.
                    #[allow(clippy::cast_possible_truncation)]
                    let slot_no = slot as u32;
                    let caller = Caller {
                        client: *id,
                        slot: slot_no,
                        creds: c.creds,
                    };
                    let stats = &self.stats;
                    c.segment.serve(slot, buf, |req| match req {
                        Ok(r) => stats.served(r.kind(), || volume.handle(&r, caller)),
                        Err(e) => stats.served(RequestKind::Malformed, || Err(e)),
                    });
                    served += 1;
                }
            }
        }
        served
    }

    fn keep_house(&mut self) {
        let evicted = match self.volume.lock().as_mut() {
            Some(volume) => {
                keep_house(volume, &self.stats);
                volume.take_evicted()
            }
            None => return,
        };
        self.hang_up(evicted);
    }

    /// Shuts down the connections of the clients the volume evicted.
    fn hang_up_evicted(&mut self) {
        let evicted = match self.volume.lock().as_mut() {
            Some(v) => v.take_evicted(),
            None => return,
        };
        self.hang_up(evicted);
    }

    /// Shuts down the connections of the clients `evicted`.
    fn hang_up(&self, evicted: Vec<u32>) {
        for id in evicted {
            let hangup = self.clients.iter().find(|c| c.0 == id);
            if let Some(socket) = hangup.and_then(|c| c.1.hangup.as_ref()) {
                eprintln!("kfs: client {id} evicted: it held a reader epoch too long");
                let _ = socket.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    /// Housekeeping before a sleep: flips the batches that are due, and
    /// reclaims and advances the directories' table doublings unless
    /// client threads applying directly (`direct`) hold the lock often
    /// (their own creates advance those). Returns how long to sleep: not
    /// at all while a doubling is under way, else until the earliest
    /// deadline of a batch still open, at most [`ServerConfig::sleep`];
    /// that wake-up time is told to the volume, so that a commit opening a
    /// batch due sooner wakes Kfs (see [`Nudge`]).
    fn keep_house_idle(&mut self, direct: bool) -> Duration {
        let mut guard = self.volume.lock();
        let Some(volume) = guard.as_mut() else {
            return self.config.sleep;
        };
        let growing = if direct {
            volume.expire_protection();
            false
        } else {
            keep_house(volume, &self.stats);
            volume.grow_step(IDLE_GROW_STEP)
        };
        let now = now_ns();
        let nap = match volume.batch_deadline() {
            _ if growing => Duration::ZERO,
            Some(d) => Duration::from_nanos(d.saturating_sub(now).max(0).cast_unsigned())
                .min(self.config.sleep),
            None => self.config.sleep,
        };
        // `nap` is at most the configured sleep; a sleep past an i64 of
        // nanoseconds (292 years) saturates, as the addition does.
        let nap_ns = i64::try_from(nap.as_nanos()).unwrap_or(i64::MAX);
        volume.plan_expiry_check(now.saturating_add(nap_ns));
        nap
    }
}

/// A round of [`Volume::keep_house`], counted in `stats`.
fn keep_house(volume: &mut Volume, stats: &Stats) {
    let n = volume.keep_house();
    bump(&stats.reclaimed, n as u64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use kucofs_common::proto::Entry;

    /// The spinning lock takes a free lock at once, and waits for a held
    /// one to be released (then sees what its holder wrote), also when the
    /// holder keeps it well past the spinning (20 ms).
    #[test]
    fn lock_spinning_waits_for_the_holder() {
        let m = Arc::new(Mutex::new(0u32));
        *lock_spinning(&m) += 1;
        for hold in [Duration::from_micros(1), Duration::from_millis(20)] {
            let g = m.lock();
            let (held, m2) = (Arc::new(AtomicBool::new(true)), m.clone());
            let h = {
                let held = held.clone();
                std::thread::spawn(move || {
                    let mut g = lock_spinning(&m2);
                    assert!(!held.load(Ordering::SeqCst));
                    *g += 1;
                })
            };
            std::thread::sleep(hold);
            let mut g = g;
            *g += 10;
            held.store(false, Ordering::SeqCst);
            drop(g);
            h.join().unwrap();
        }
        assert_eq!(*m.lock(), 23);
    }

    /// A running Kfs on a fresh image, one client attached, and a handle
    /// for applying that client's requests directly (the directory holds
    /// the image).
    fn direct_client() -> (tempfile::TempDir, Kfs, Direct, Caller) {
        let dir = tempfile::Builder::new()
            .prefix("kucofs-server-")
            .tempdir_in("/dev/shm")
            .unwrap();
        let image = dir.path().join("img");
        crate::mkfs(&image, 16 << 20, false).unwrap();
        let bell = Doorbell::create().unwrap();
        let kfs = Kfs::start(
            Volume::open(&image).unwrap(),
            &bell,
            ServerConfig::default(),
        )
        .unwrap();
        let client = kfs
            .attach(Client {
                segment: Segment::create().unwrap(),
                creds: Creds::default(),
                protector: None,
                protection: Protection::Off,
                staging: None,
                hangup: None,
            })
            .unwrap();
        let direct = kfs.direct();
        let caller = Caller {
            client,
            slot: 0,
            creds: Creds::default(),
        };
        (dir, kfs, direct, caller)
    }

    fn create(name: &[u8]) -> Request<'_> {
        Request::Create {
            at: Entry::Path(name),
            mode: libc::S_IFREG | 0o644,
            target: b"",
            hint: None,
        }
    }

    /// What runs before a request applied directly runs before the
    /// volume's lock is waited for when another thread holds it (nobody
    /// waits for it), and a failure of it leaves the request unapplied and
    /// the lock free.
    #[test]
    fn a_direct_fill_never_waits_for_the_lock_and_its_failure_applies_nothing() {
        let (_dir, _kfs, direct, caller) = direct_client();
        let held = direct.volume.lock();
        let (tx, rx) = std::sync::mpsc::channel();
        let other = direct.clone();
        let applier = std::thread::spawn(move || {
            other
                .try_apply_after(&create(b"a"), caller, || tx.send(()).map_err(|_| ()))
                .unwrap()
                .unwrap()
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the fill waited for a lock another thread held");
        drop(held);
        assert!(applier.join().unwrap().is_ok());

        let failed = direct.try_apply_after(&create(b"b"), caller, || Err("copy failed"));
        assert_eq!(failed.unwrap_err(), "copy failed");
        // Released (the Kfs thread may take it for a moment meanwhile).
        assert!(direct
            .volume
            .try_lock_for(Duration::from_secs(10))
            .is_some());
        let mut ran = false;
        let again = direct.try_apply_after(&create(b"b"), caller, || {
            ran = true;
            Ok::<(), ()>(())
        });
        assert!(ran);
        // "b" was not made by the failed call: this create makes it.
        assert!(again.unwrap().unwrap().is_ok());
        let exists = direct.try_apply(&create(b"b"), caller).unwrap();
        assert_eq!(exists, Err(Errno::EEXIST));
    }

    /// A directory's table doubling that the creates started, and left
    /// under way, is finished by the Kfs thread once nobody sends it
    /// anything.
    #[test]
    fn an_idle_kfs_finishes_a_doubling_under_way() {
        use kucofs_common::index::BucketTable;
        let (_dir, _kfs, direct, caller) = direct_client();
        // The root's published table: log2 of its buckets.
        let bits = || {
            let guard = direct.volume.lock();
            let ns = guard.as_ref().unwrap().namespace();
            let table = BucketTable::new(ns.arena().get(ns.reader().root().buckets()));
            ns.arena().get(table.bits())
        };
        for i in 0..300 {
            let name = format!("f{i}");
            let reply = direct.try_apply(&create(name.as_bytes()), caller).unwrap();
            assert!(reply.is_ok(), "{reply:?}");
        }
        // The 257th create began doubling the table to 512 buckets, and the
        // creates since migrated a step each: not all 256 old buckets.
        const { assert!(44 * crate::namespace::GROW_STEP < 256) };
        let deadline = Instant::now() + Duration::from_secs(60);
        while bits() != 9 {
            assert!(Instant::now() < deadline, "the doubling was left under way");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
