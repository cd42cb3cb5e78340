//! The connection between Ulib and Kfs (ARCHITECTURE.md §2, §5): everything
//! Ulib needs to hand Kfs a request and take its reply.
//!
//! Every connection has this process's request segment, one slot per
//! client thread, and the doorbell that wakes a sleeping Kfs: the path a
//! request takes to a Kfs thread in this process, and the path a Kfs in
//! another process would serve too. With the `embedded` feature (the
//! default), a connection may also hold the Kfs it runs in this process:
//! then a thread may apply its own request under Kfs's lock instead
//! ([`Direct`](kucofs_kfs::Direct), [`crate::Config::direct`]), warm the
//! cache ahead of a commit ([`Warmer`]), and reach the embedded-only
//! operations (checkpoints, counters, a simulated crash). Without the
//! feature there is no Kfs to run in this process, and opening an image
//! fails with an `Unsupported` error.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use kucofs_common::channel::{Doorbell, Segment};
use kucofs_common::pm::RegionView;
use kucofs_common::proto::{Creds, Reply, Request};
use kucofs_common::Errno;

use crate::fs::err;

#[cfg(feature = "embedded")]
pub(crate) use kucofs_kfs::Warmer;

/// Without an embedded Kfs there is nothing to warm the cache with: this
/// type has no value, so the code that warms is never reached.
#[cfg(not(feature = "embedded"))]
#[derive(Debug)]
pub(crate) enum Warmer {}

/// Where [`Warmer::map`] found an entry; no value, as [`Warmer`] has none.
#[cfg(not(feature = "embedded"))]
#[derive(Debug, Clone, Copy)]
pub(crate) enum WarmEntry {}

#[cfg(not(feature = "embedded"))]
impl Warmer {
    pub(crate) fn map(
        &self,
        _inode: kucofs_common::index::InodeOff,
        _page: u64,
    ) -> Option<WarmEntry> {
        match *self {}
    }

    pub(crate) fn replaced(&self, entry: WarmEntry) {
        match entry {}
    }
}

/// The error for opening an image in a build without an embedded Kfs.
#[cfg(not(feature = "embedded"))]
pub(crate) fn unsupported() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "kucofs-ulib was built without its `embedded` feature: it cannot run \
         Kfs in this process, and connecting to a Kfs daemon is not supported \
         yet",
    )
}

/// Request slot `slot` (an index into the segment's slots) as the
/// protocol numbers it.
// A slot is below `SLOTS` (128): it fits a `u32`.
#[allow(clippy::cast_possible_truncation)]
#[inline]
pub(crate) fn slot_number(slot: usize) -> u32 {
    slot as u32
}

/// The most pages a commit applied directly copies under the volume's
/// lock when it is free (see [`Connection::commit_after`]): the lock is
/// held meanwhile, so only short copies. A 4 KiB write's copy takes a few
/// hundred nanoseconds to drain.
#[cfg(feature = "embedded")]
const FILL_LOCKED_PAGES: u64 = 4;

/// This process's connection to Kfs.
#[derive(Debug)]
pub(crate) struct Connection {
    /// The credentials this process's changes are made with.
    creds: Creds,
    /// Kfs has stopped: requests fail with `ENOTCONN` (files may outlive
    /// the `Fs` they were opened from).
    closed: AtomicBool,
    segment: Segment,
    doorbell: Doorbell,
    /// The connection to a Kfs daemon; `None` for a Kfs in this process.
    /// It stays open while this process is attached: the daemon forgets
    /// the client when it closes, and this side learns of the daemon's
    /// end from it.
    daemon: Option<std::os::unix::net::UnixStream>,
    /// A daemon's client's staging area (see [`Connection::staging`]).
    staging: Option<kucofs_common::pm::Shm>,
    /// The Kfs running in this process; `None` for one that is not.
    #[cfg(feature = "embedded")]
    embedded: Option<Embedded>,
}

/// A Kfs running in this process.
#[cfg(feature = "embedded")]
#[derive(Debug)]
struct Embedded {
    /// This process's number at Kfs (what its direct requests name as
    /// [`Caller::client`](kucofs_kfs::Caller::client)).
    client: u32,
    /// `None` once it has stopped.
    kfs: parking_lot::Mutex<Option<kucofs_kfs::Kfs>>,
    /// Where threads apply their own requests ([`crate::Config::direct`]).
    direct: Option<kucofs_kfs::Direct>,
}

impl Connection {
    /// A connection through `segment` (this side's mapping of the request
    /// segment Kfs serves) and `doorbell`, with no Kfs in this process:
    /// every request is queued to Kfs through the slots, as made with
    /// `creds`.
    pub(crate) fn queued(segment: Segment, doorbell: Doorbell, creds: Creds) -> Self {
        Connection {
            creds,
            closed: AtomicBool::new(false),
            segment,
            doorbell,
            daemon: None,
            staging: None,
            #[cfg(feature = "embedded")]
            embedded: None,
        }
    }

    /// A connection to the Kfs daemon at the other end of `socket`,
    /// which handed this process `segment` and `doorbell`, and `staging`
    /// unless it trusts this process to write into the image itself.
    pub(crate) fn daemon(
        segment: Segment,
        doorbell: Doorbell,
        creds: Creds,
        socket: std::os::unix::net::UnixStream,
        staging: Option<kucofs_common::pm::Shm>,
    ) -> Self {
        let mut conn = Connection::queued(segment, doorbell, creds);
        conn.daemon = Some(socket);
        conn.staging = staging;
        conn
    }

    /// The staging area of a daemon's client, which cannot write into
    /// the image: its writes leave their data there for Kfs to copy
    /// ([`Request::Write`]). `None` for a Kfs in this process, and for a
    /// daemon's client it trusts with writes (ARCHITECTURE.md §2), which
    /// writes into pool pages as an embedded client does.
    #[inline]
    pub(crate) fn staging(&self) -> Option<&kucofs_common::pm::Shm> {
        self.staging.as_ref()
    }

    /// False once the daemon's end of the connection has closed (the
    /// daemon stopped or died); always true for a Kfs in this process.
    fn peer_alive(&self) -> bool {
        let Some(socket) = &self.daemon else {
            return true;
        };
        let mut byte = [0u8; 1];
        let alive = match rustix::net::recv(
            socket,
            &mut byte,
            rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
        ) {
            // The daemon sends nothing after its welcome: 0 bytes is the
            // end of the connection.
            Ok((0, _)) => false,
            Ok(_) => true,
            Err(e) => e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::INTR,
        };
        if !alive {
            self.closed.store(true, Ordering::Release);
        }
        alive
    }

    /// Starts Kfs on `volume` in this process and connects to it, as a
    /// client whose view of the region Kfs changes through `protector`
    /// with `protection`; `direct` lets threads apply their own requests.
    #[cfg(feature = "embedded")]
    pub(crate) fn embedded(
        volume: kucofs_kfs::Volume,
        server: kucofs_kfs::ServerConfig,
        protector: Option<kucofs_common::pm::Protector>,
        protection: kucofs_common::pm::Protection,
        direct: bool,
    ) -> io::Result<Self> {
        use crate::fs::{common_err, kfs_err};
        let segment = Segment::create().map_err(common_err)?;
        let doorbell = Doorbell::create().map_err(common_err)?;
        let creds = Creds::current();
        let kfs = kucofs_kfs::Kfs::start(volume, &doorbell, server).map_err(kfs_err)?;
        let direct = direct.then(|| kfs.direct());
        let client = kfs
            .attach(kucofs_kfs::Client {
                segment: segment.map_again().map_err(common_err)?,
                creds,
                protector,
                protection,
                staging: None,
                hangup: None,
            })
            .map_err(kfs_err)?;
        let mut conn = Connection::queued(segment, doorbell, creds);
        conn.embedded = Some(Embedded {
            client,
            kfs: parking_lot::Mutex::new(Some(kfs)),
            direct,
        });
        Ok(conn)
    }

    /// The credentials changes are made with.
    pub(crate) fn creds(&self) -> Creds {
        self.creds
    }

    /// Enters the index for reading from `slot` (see [`Segment::pin`]).
    pub(crate) fn pin(&self, slot: usize, epoch: impl Fn() -> u64) {
        self.segment.pin(slot, epoch);
    }

    /// Leaves the index (see [`Segment::unpin`]); `ENOTCONN` if the
    /// daemon evicted this client meanwhile (ARCHITECTURE.md §9): what the
    /// read section loaded may come from memory Kfs reused.
    pub(crate) fn unpin(&self, slot: usize) -> Result<(), Errno> {
        self.segment.unpin(slot);
        // A Kfs in this process never evicts it.
        if self.daemon.is_some() && self.segment.evicted() {
            self.closed.store(true, Ordering::Release);
            return Err(Errno::ENOTCONN);
        }
        Ok(())
    }

    /// Marks `slot` as writing file `ino` under lease generation `lease`
    /// (see [`Segment::mark_write`]).
    pub(crate) fn mark_write(&self, slot: usize, ino: u64, lease: u64) {
        self.segment.mark_write(slot, ino, lease);
    }

    /// Says that `slot`'s next request ends its write (see
    /// [`Segment::mark_last`]).
    pub(crate) fn mark_last(&self, slot: usize) {
        self.segment.mark_last(slot);
    }

    /// Clears `slot`'s write mark.
    pub(crate) fn clear_write(&self, slot: usize) {
        self.segment.clear_write(slot);
    }

    /// Where `slot`'s requests may be applied on this thread, and who
    /// they come from as Kfs knows it; `None` if direct application is off
    /// or Kfs is not in this process.
    #[cfg(feature = "embedded")]
    #[inline]
    fn direct(&self, slot: usize) -> Option<(&kucofs_kfs::Direct, kucofs_kfs::Caller)> {
        let e = self.embedded.as_ref()?;
        let caller = kucofs_kfs::Caller {
            client: e.client,
            slot: slot_number(slot),
            creds: self.creds,
        };
        Some((e.direct.as_ref()?, caller))
    }

    /// Applies `req` on this thread (see [`crate::Config::direct`]);
    /// `None` if direct application is off, Kfs is not in this process, or
    /// it has stopped.
    #[inline]
    pub(crate) fn try_direct(&self, slot: usize, req: &Request<'_>) -> Option<io::Result<Reply>> {
        #[cfg(feature = "embedded")]
        {
            let (direct, caller) = self.direct(slot)?;
            let reply = direct.try_apply(req, caller)?;
            Some(reply.map_err(err))
        }
        #[cfg(not(feature = "embedded"))]
        {
            let _ = (slot, req);
            None
        }
    }

    /// Hands `req` to the Kfs thread through `slot` and waits for the
    /// reply (`ENOTCONN` once Kfs has stopped).
    pub(crate) fn queue(&self, slot: usize, req: &Request<'_>) -> io::Result<Reply> {
        if self.closed.load(Ordering::Acquire) {
            return Err(err(Errno::ENOTCONN));
        }
        self.segment
            .call_while(slot, &self.doorbell, req, &|| self.peer_alive())
            .map_err(err)
    }

    /// Sends `req` from `slot` (this thread's): applied directly if
    /// possible, else queued.
    #[inline]
    pub(crate) fn call(&self, slot: usize, req: &Request<'_>) -> io::Result<Reply> {
        match self.try_direct(slot, req) {
            Some(r) => r,
            None => self.queue(slot, req),
        }
    }

    /// Where this thread applies its own commits (embedded Kfs,
    /// [`crate::Config::direct`]), what warms the cache ahead of one
    /// ([`Warmer`]); `None` if commits go to Kfs.
    #[inline]
    pub(crate) fn warmer(&self) -> Option<&Warmer> {
        #[cfg(feature = "embedded")]
        {
            self.embedded.as_ref()?.direct.as_ref()?.warmer()
        }
        #[cfg(not(feature = "embedded"))]
        {
            None
        }
    }

    /// Runs `fill`, which copies the pages of the commit `req` into
    /// `slot`'s pool in `region` with non-temporal stores, and sends `req`
    /// from `slot`; the copy is durable before the commit's log entry is
    /// stored (ARCHITECTURE.md §8). Applied directly, a commit of at most
    /// [`FILL_LOCKED_PAGES`] pages leaves the copy unfenced for Kfs's code
    /// to fence, on this thread, before the entry (see
    /// [`Direct::try_apply_after`](kucofs_kfs::Direct::try_apply_after)):
    /// its checks then run while the copy drains. Otherwise the copy is
    /// fenced here first. Whatever the outcome, the copy has drained when
    /// this returns, so that pool pages a failed commit leaves behind hold
    /// no stores in flight when they go to another thread.
    pub(crate) fn commit_after(
        &self,
        slot: usize,
        req: &Request<'_>,
        pages: u64,
        region: &RegionView,
        fill: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<Reply> {
        #[cfg(feature = "embedded")]
        if let Some((d, caller)) = self.direct(slot).filter(|_| pages <= FILL_LOCKED_PAGES) {
            return match d.try_apply_after(req, caller, fill) {
                // Kfs fenced the copy before the commit's entry.
                Ok(Some(Ok(reply))) => Ok(reply),
                // Refused before its entry, a copy that failed, or Kfs
                // stopped: nothing fenced the copy.
                applied => {
                    region.fence();
                    match applied? {
                        Some(reply) => reply.map_err(err),
                        None => self.queue(slot, req),
                    }
                }
            };
        }
        #[cfg(not(feature = "embedded"))]
        let _ = pages;
        fill()?;
        region.fence();
        self.call(slot, req)
    }

    /// Refuses further requests and stops the Kfs in this process, cleanly
    /// or as a crash would (`crash`); the first call does it.
    pub(crate) fn stop(&self, crash: bool) -> io::Result<()> {
        self.closed.store(true, Ordering::Release);
        if let Some(socket) = &self.daemon {
            // The daemon forgets this client; its file system goes on.
            let _ = socket.shutdown(std::net::Shutdown::Both);
            return Ok(());
        }
        #[cfg(feature = "embedded")]
        if let Some(e) = &self.embedded {
            let kfs = e.kfs.lock().take();
            return match kfs {
                Some(k) if crash => {
                    k.crash();
                    Ok(())
                }
                Some(k) => k.shutdown().map_err(crate::fs::kfs_err),
                None => Ok(()),
            };
        }
        let _ = crash;
        Ok(())
    }

    /// `f` on the Kfs in this process; `None` once it has stopped, or for
    /// a Kfs in another process.
    #[cfg(feature = "embedded")]
    pub(crate) fn with_kfs<T>(&self, f: impl FnOnce(&kucofs_kfs::Kfs) -> T) -> Option<T> {
        self.embedded.as_ref()?.kfs.lock().as_ref().map(f)
    }
}

#[cfg(all(test, not(feature = "embedded")))]
mod tests {
    use crate::{Config, Fs};

    #[test]
    fn without_an_embedded_kfs_opening_and_making_images_say_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fs.img");
        let errs = [
            Fs::open(&image).unwrap_err(),
            Fs::open_with(&image, Config::default()).unwrap_err(),
            Fs::create(&image, 64 << 20).unwrap_err(),
            Fs::create_sparse(&image, 64 << 20).unwrap_err(),
        ];
        for e in errs {
            assert_eq!(e.kind(), std::io::ErrorKind::Unsupported);
            assert!(e.to_string().contains("`embedded` feature"), "{e}");
        }
        // Nothing was made.
        assert!(!image.exists());
    }
}
