//! Kfs in a process of its own, serving client processes (ARCHITECTURE.md
//! §2): it opens the image, starts the Kfs thread, and listens on a Unix
//! socket. A client that connects says which protocol it speaks
//! ([`Hello`]); the daemon makes it a request segment, attaches it to Kfs
//! with the credentials the kernel gives for the socket's peer
//! (`SO_PEERCRED`, and its supplementary groups, `SO_PEERGROUPS`: a peer
//! in more than [`GROUPS_MAX`] is refused with `E2BIG`), and hands it
//! ([`Welcome`]) the segment and the doorbell and its staging area (where
//! it leaves the data of its writes, which Kfs copies into the image),
//! and, to a trusted client only ([`Trust`]), the index and the image
//! opened read-only: nothing the client maps of those can be made
//! writable. Any other client is isolated: it maps nothing of the file
//! system, and reads through requests Kfs checks against its credentials
//! (ARCHITECTURE.md §2, "daemon mode + threat model"). With trusted writes
//! ([`Trust::writes`]), a trusted client gets the image opened read-write
//! and no staging area instead: it writes file data into pool pages
//! itself, as an embedded client does. The connection then stays
//! open; when it closes (the client closed the file system, or died) Kfs
//! forgets the client: its leases, pool pages, open files and reader
//! epochs.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kucofs_common::access::GROUPS_MAX;
use kucofs_common::attach::{
    recv_with_fds, send_with_fds, Hello, Welcome, DIRECT_FDS, HELLO_SIZE, ISOLATED_FDS, WELCOME_FDS,
};
use kucofs_common::channel::{Doorbell, Segment, SLOTS};
use kucofs_common::pm::{Protection, Shm};
use kucofs_common::proto::{Creds, PROTO_VERSION, STAGE_BYTES};
use kucofs_common::Errno;

use crate::server::{Client, Detacher, Kfs, ServerConfig};
use crate::volume::Volume;
use crate::{Error, Result};

/// How long a client that connected has to say hello.
const HELLO_WAIT: Duration = Duration::from_secs(2);
/// How long a client's thread may hold back reclamation with one reader
/// epoch before the daemon evicts the client, unless the configuration
/// says otherwise: far longer than any read section takes (a read of a
/// GiB takes a fraction of a second), short enough that the other
/// clients' freed pages come back before their pools run dry.
pub const EVICT_AFTER: Duration = Duration::from_secs(5);
/// How often the accepting loop looks at the stop flag while idle.
const STOP_POLL: Duration = Duration::from_millis(20);

/// Which clients the daemon trusts with read-only mappings of the whole
/// index and image, through which they can read every file's data and
/// every directory's names whatever the permissions: root (who may read
/// everything anyway), the daemon's own user (who can open the image
/// itself), and, only if asked for, the members of one group. Every
/// other client is isolated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trust {
    /// A group whose members are trusted too (`kucofs serve
    /// --trusted-group`). This weakens isolation: each member can read
    /// every file in the image through its mappings.
    pub group: Option<u32>,
    /// Trusted clients get the image read-write, and write file data
    /// into the pool pages Kfs grants them through their own mapping
    /// (`kucofs serve --trusted-writes`): no copy by Kfs. This weakens
    /// the file system's safety: such a client can store into any byte
    /// of the image, any file's data and the on-media metadata records,
    /// and so corrupt the file system for every client; Kfs still checks
    /// each of its metadata requests (ARCHITECTURE.md §2).
    pub writes: bool,
}

impl Trust {
    /// Whether a client with `creds` gets the mappings.
    pub fn trusts(&self, creds: &Creds) -> bool {
        creds.is_root()
            || creds.uid == rustix::process::geteuid().as_raw()
            || self.group.is_some_and(|g| creds.in_group(g))
    }
}

/// What the daemon hands every client: descriptors it duplicates for each.
struct Handout {
    trust: Trust,
    doorbell: Doorbell,
    index: OwnedFd,
    index_reserve: u64,
    region: std::fs::File,
    /// The image opened read-write, with [`Trust::writes`] only.
    region_rw: Option<std::fs::File>,
}

/// Serves `image` to client processes connecting on `socket` until `stop`
/// is set, then closes the image cleanly. `ready` runs once clients can
/// connect. A socket file left by a daemon that is gone is replaced; one
/// a live daemon answers on is an error.
pub fn serve(
    image: &Path,
    socket: &Path,
    config: ServerConfig,
    trust: Trust,
    stop: &AtomicBool,
    ready: impl FnOnce(),
) -> Result<()> {
    let volume = Volume::open(image)?;
    // A client process stopped inside a read must not stop reclamation
    // for the others (ARCHITECTURE.md §9).
    let config = ServerConfig {
        evict_after: config.evict_after.or(Some(EVICT_AFTER)),
        ..config
    };
    let shm = volume.namespace().shm();
    let io = Error::Region;
    let index = shm.read_only_fd().map_err(io)?;
    let index_reserve = shm.reserve();
    let region = volume.image().region().read_only_file().map_err(io)?;
    let region_rw = if trust.writes {
        Some(volume.image().region().read_write_file().map_err(io)?)
    } else {
        None
    };
    let doorbell = Doorbell::create().map_err(io)?;
    let listener = bind(socket)?;
    let kfs = Kfs::start(volume, &doorbell, config)?;
    let handout = Handout {
        trust,
        doorbell,
        index,
        index_reserve,
        region,
        region_rw,
    };
    ready();
    let served = accept_until(socket, &listener, &kfs, &handout, stop);
    drop(listener);
    let _ = std::fs::remove_file(socket);
    // What it served, for whoever reads the daemon's log: requests and
    // their mean service time by kind.
    eprint!("{}", kfs.stats());
    // Clients still attached meet a closed connection and `ENOTCONN`.
    let closed = kfs.shutdown();
    served.and(closed)
}

/// Listens on `socket`, replacing a socket file no daemon answers on.
fn bind(socket: &Path) -> Result<UnixListener> {
    let failed = |cause| Error::Socket {
        path: socket.into(),
        cause,
    };
    if socket.exists() {
        if UnixStream::connect(socket).is_ok() {
            return Err(Error::SocketInUse {
                path: socket.into(),
            });
        }
        std::fs::remove_file(socket).map_err(failed)?;
    }
    let listener = UnixListener::bind(socket).map_err(failed)?;
    listener.set_nonblocking(true).map_err(failed)?;
    Ok(listener)
}

fn accept_until(
    socket: &Path,
    listener: &UnixListener,
    kfs: &Kfs,
    handout: &Handout,
    stop: &AtomicBool,
) -> Result<()> {
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, _)) => {
                // A client that fails its handshake is dropped: it meets a
                // closed connection, and nothing of it stays at Kfs.
                if let Ok((id, stream)) = welcome(stream, kfs, handout) {
                    watch(id, stream, kfs.detacher());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(STOP_POLL);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(cause) => {
                return Err(Error::Socket {
                    path: socket.into(),
                    cause,
                })
            }
        }
    }
    Ok(())
}

/// The handshake with a client that connected: its hello, then its
/// segment and descriptors, or the reason it is refused.
fn welcome(stream: UnixStream, kfs: &Kfs, handout: &Handout) -> std::io::Result<(u32, UnixStream)> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(HELLO_WAIT))?;
    let mut hello = [0u8; HELLO_SIZE];
    // A hello carries no descriptor; any that came are dropped here.
    drop(recv_with_fds(&stream, &mut hello)?);
    let refuse = |e: Errno| {
        let w = Welcome {
            version: PROTO_VERSION,
            result: Err(e),
            index_reserve: 0,
            trusted: false,
            direct_writes: false,
        };
        let _ = send_with_fds(&stream, &w.encode(), &[]);
        std::io::Error::from(e)
    };
    match Hello::decode(&hello) {
        Ok(h) if h.version == PROTO_VERSION => {}
        _ => return Err(refuse(Errno::EPROTO)),
    }
    let peer = rustix::net::sockopt::socket_peercred(&stream)?;
    let (uid, gid) = (peer.uid.as_raw(), peer.gid.as_raw());
    let creds = match peer_groups(&stream)? {
        Some(groups) => Creds::with_groups(uid, gid, &groups).ok_or(Errno::E2BIG),
        None => Err(Errno::E2BIG),
    };
    let creds = creds.map_err(|e| {
        eprintln!(
            "kucofs serve: client pid {} (uid {uid}) refused: it is in more than \
             {GROUPS_MAX} supplementary groups, the most Kfs checks permissions with",
            peer.pid.as_raw_nonzero()
        );
        refuse(e)
    })?;
    let trusted = handout.trust.trusts(&creds);
    // A client that writes into the image itself has no staging area:
    // Kfs grants it pools as it does an embedded client (a client with a
    // staging area is refused them).
    let direct = handout.region_rw.as_ref().filter(|_| trusted);
    let segment = Segment::create().map_err(|_| refuse(Errno::ENOMEM))?;
    let kfs_side = segment.map_again().map_err(|_| refuse(Errno::ENOMEM))?;
    let staging = match direct {
        Some(_) => None,
        None => Some(staging_area().map_err(|_| refuse(Errno::ENOMEM))?),
    };
    let kfs_staging = match &staging {
        Some(s) => Some(s.map_again().map_err(|_| refuse(Errno::ENOMEM))?),
        None => None,
    };
    let id = kfs
        .attach(Client {
            segment: kfs_side,
            creds,
            // Kfs cannot change the protection of another process's
            // mappings: the client's view of the image is read-only, or,
            // with trusted writes, writable for good.
            protector: None,
            protection: Protection::Off,
            staging: kfs_staging,
            hangup: Some(stream.try_clone().map_err(|_| refuse(Errno::ENOMEM))?),
        })
        .map_err(|_| refuse(Errno::EIO))?;
    let w = Welcome {
        version: PROTO_VERSION,
        result: Ok(id),
        index_reserve: if trusted { handout.index_reserve } else { 0 },
        trusted,
        direct_writes: direct.is_some(),
    };
    // Its own segment and the doorbell; its staging area unless it
    // writes directly; to a trusted client the index and the image
    // (read-write for direct writes). An isolated client gets nothing of
    // the file system. Each layout is counted in `common::attach`.
    let mut fds = vec![segment.fd(), handout.doorbell.fd()];
    fds.extend(staging.as_ref().map(Shm::fd));
    if trusted {
        fds.push(handout.index.as_fd());
        fds.push(direct.unwrap_or(&handout.region).as_fd());
    }
    debug_assert!(fds.len() == ISOLATED_FDS || fds.len() == DIRECT_FDS || fds.len() == WELCOME_FDS);
    let sent = send_with_fds(&stream, &w.encode(), &fds);
    if let Err(e) = sent {
        kfs.detach(id);
        return Err(e);
    }
    stream.set_read_timeout(None)?;
    Ok((id, stream))
}

/// A new staging area: where a client leaves the data of its writes, a
/// part per slot; memory only where it writes. Sealed at its size: the
/// client holds it read-write, and must not be able to truncate it under
/// Kfs's mapping.
fn staging_area() -> kucofs_common::Result<Shm> {
    let stage_len = STAGE_BYTES * SLOTS as u64;
    let staging = Shm::create("kucofs-staging", stage_len, stage_len)?;
    staging.seal_size()?;
    Ok(staging)
}

/// The supplementary groups of the process at the other end of `stream`
/// when it connected (`SO_PEERGROUPS`); `None` if it is in more than
/// [`GROUPS_MAX`].
fn peer_groups(stream: &UnixStream) -> std::io::Result<Option<Vec<u32>>> {
    let mut groups: [libc::gid_t; GROUPS_MAX] = [0; GROUPS_MAX];
    let mut len = libc::socklen_t::try_from(std::mem::size_of_val(&groups))
        .map_err(|_| std::io::Error::from(Errno::EINVAL))?;
    // SAFETY: `groups` is a live, writable buffer of `len` bytes, and
    // `len` a live, writable length; SO_PEERGROUPS writes at most `len`
    // bytes of `gid_t`s into it and the length it wrote (or, with ERANGE,
    // the length it needs) into `len`.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERGROUPS,
            groups.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ERANGE) => Ok(None),
            _ => Err(e),
        };
    }
    let n = usize::try_from(len).unwrap_or(usize::MAX) / std::mem::size_of::<libc::gid_t>();
    Ok(groups.get(..n).map(<[u32]>::to_vec))
}

/// Waits, on a thread of its own, for client `id`'s connection to close,
/// then has Kfs forget the client.
fn watch(id: u32, mut stream: UnixStream, detacher: Detacher) {
    let on_thread = detacher.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("kfs-client-{id}"))
        .spawn(move || {
            // A client sends nothing after its hello: whatever it sends
            // is read and ignored until the connection closes.
            let mut buf = [0u8; 64];
            while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
            on_thread.detach(id);
        });
    if let Err(e) = spawned {
        // No thread to watch it: forget the client now (its connection
        // closes with the failed closure) rather than keep what it holds
        // for good.
        eprintln!("kucofs serve: client {id} dropped: cannot start a thread: {e}");
        detacher.detach(id);
    }
}
