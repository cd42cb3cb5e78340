//! How a client process attaches to a Kfs daemon (ARCHITECTURE.md §2,
//! §5): over a Unix stream socket, the client says which protocol it
//! speaks ([`Hello`]); the daemon answers ([`Welcome`]) with the client's
//! number and, as `SCM_RIGHTS`, the descriptors of its request segment,
//! the doorbell and its staging area (read-write) and, for a trusted
//! client only, of the index and the image (opened read-only, so that no
//! mapping of them in the client can be made writable); an isolated
//! client gets neither and reads through requests (ARCHITECTURE.md §2,
//! "daemon mode + threat model"). A daemon serving with trusted writes
//! (`kucofs serve --trusted-writes`) hands its trusted clients the image
//! opened read-write instead, and no staging area: they write file data
//! into pool pages themselves, as an embedded client does. The socket stays open while the client
//! is attached: the daemon learns of the client's end when it closes, and
//! the client of the daemon's.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::proto::PROTO_VERSION;
use crate::Errno;

/// Descriptors a [`Welcome`] to a trusted client carries, in this order:
/// segment, doorbell, staging area, index, image.
pub const WELCOME_FDS: usize = 5;
/// Descriptors a [`Welcome`] to an isolated client carries, in this
/// order: segment, doorbell, staging area.
pub const ISOLATED_FDS: usize = 3;
/// Descriptors a [`Welcome`] with [`Welcome::direct_writes`] carries, in
/// this order: segment, doorbell, index, image (read-write).
pub const DIRECT_FDS: usize = 4;

const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"KucoHelo");
const WELCOME_MAGIC: u64 = u64::from_le_bytes(*b"KucoWelc");
/// Encoded size of a [`Hello`].
pub const HELLO_SIZE: usize = 16;
/// Encoded size of a [`Welcome`].
pub const WELCOME_SIZE: usize = 32;

/// A client's first message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The protocol the client speaks ([`PROTO_VERSION`]).
    pub version: u16,
}

impl Hello {
    /// This build's hello.
    pub const fn current() -> Hello {
        Hello {
            version: PROTO_VERSION,
        }
    }

    /// The fixed encoding.
    pub fn encode(&self) -> [u8; HELLO_SIZE] {
        let mut b = [0u8; HELLO_SIZE];
        b[..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[8..10].copy_from_slice(&self.version.to_le_bytes());
        b
    }

    /// Decodes a hello; `EPROTO` for anything else.
    pub fn decode(b: &[u8; HELLO_SIZE]) -> Result<Hello, Errno> {
        let (magic, rest) = b.split_at(8);
        if magic != HELLO_MAGIC.to_le_bytes() || rest[2..].iter().any(|&x| x != 0) {
            return Err(Errno::EPROTO);
        }
        Ok(Hello {
            version: u16::from_le_bytes([rest[0], rest[1]]),
        })
    }
}

/// The daemon's answer: the client's number and the index's reserved
/// size, or why it refused (then no descriptor comes with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Welcome {
    /// The protocol the daemon speaks.
    pub version: u16,
    /// The client's number at Kfs, or the errno of a refusal.
    pub result: Result<u32, Errno>,
    /// Bytes of address space to map the index over (it grows up to
    /// that without being mapped again).
    pub index_reserve: u64,
    /// The client is trusted: the index and the image come with the
    /// welcome. Otherwise it is isolated, and reads through requests.
    pub trusted: bool,
    /// The trusted client writes file data into pool pages through a
    /// writable mapping of the image (it comes read-write, and no
    /// staging area comes); otherwise its writes go through its staging
    /// area ([`crate::proto::Request::Write`]). Only with `trusted`.
    pub direct_writes: bool,
}

impl Welcome {
    /// The fixed encoding.
    pub fn encode(&self) -> [u8; WELCOME_SIZE] {
        let mut b = [0u8; WELCOME_SIZE];
        b[..8].copy_from_slice(&WELCOME_MAGIC.to_le_bytes());
        b[8..10].copy_from_slice(&self.version.to_le_bytes());
        b[10] = u8::from(self.trusted);
        b[11] = u8::from(self.direct_writes);
        match self.result {
            Ok(client) => b[12..16].copy_from_slice(&client.to_le_bytes()),
            Err(e) => b[16..20].copy_from_slice(&e.get().to_le_bytes()),
        }
        b[24..32].copy_from_slice(&self.index_reserve.to_le_bytes());
        b
    }

    /// Decodes a welcome; `EPROTO` for anything else.
    pub fn decode(b: &[u8; WELCOME_SIZE]) -> Result<Welcome, Errno> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[24..32]);
        // Each flag is 0 or 1, and only a trusted client writes directly.
        if b[..8] != WELCOME_MAGIC.to_le_bytes()
            || b[10] > 1
            || b[11] > b[10]
            || b[20..24] != [0; 4]
        {
            return Err(Errno::EPROTO);
        }
        let errno = u32_at(16).cast_signed();
        let result = match errno {
            0 => Ok(u32_at(12)),
            e if u32_at(12) == 0 => Err(Errno::new(e).ok_or(Errno::EPROTO)?),
            _ => return Err(Errno::EPROTO),
        };
        Ok(Welcome {
            version: u16::from_le_bytes([b[8], b[9]]),
            result,
            index_reserve: u64::from_le_bytes(w),
            trusted: b[10] == 1,
            direct_writes: b[11] == 1,
        })
    }
}

/// Sends `bytes` on the stream socket `sock`, with `fds` as `SCM_RIGHTS`
/// on its first byte.
pub fn send_with_fds(sock: impl AsFd, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(WELCOME_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors for one message",
        ));
    }
    let mut sent = sendmsg(
        &sock,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    while sent < bytes.len() {
        let mut none = SendAncillaryBuffer::new(&mut []);
        let n = sendmsg(
            &sock,
            &[IoSlice::new(&bytes[sent..])],
            &mut none,
            SendFlags::NOSIGNAL,
        )?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        sent += n;
    }
    Ok(())
}

/// Receives exactly `buf.len()` bytes from the stream socket `sock`, and
/// the descriptors that came with them (at most [`WELCOME_FDS`], made
/// close-on-exec). `UnexpectedEof` if the peer closed first.
pub fn recv_with_fds(sock: impl AsFd, buf: &mut [u8]) -> io::Result<Vec<OwnedFd>> {
    let mut fds = Vec::new();
    let mut got = 0;
    while got < buf.len() {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(WELCOME_FDS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let msg = recvmsg(
            &sock,
            &mut [IoSliceMut::new(&mut buf[got..])],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = m {
                fds.extend(received);
            }
        }
        if msg.bytes == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += msg.bytes;
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_and_welcome_round_trip_and_refuse_what_they_are_not() {
        let h = Hello { version: 7 };
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert_eq!(Hello::decode(&bad), Err(Errno::EPROTO));
        let mut bad = h.encode();
        bad[15] = 1;
        assert_eq!(Hello::decode(&bad), Err(Errno::EPROTO));
        for result in [Ok(0), Ok(42), Err(Errno::EACCES)] {
            for (trusted, direct_writes) in [(false, false), (true, false), (true, true)] {
                let w = Welcome {
                    version: 4,
                    result,
                    index_reserve: 1 << 36,
                    trusted,
                    direct_writes,
                };
                assert_eq!(Welcome::decode(&w.encode()), Ok(w));
            }
        }
        // Trust is a flag: 0 or 1.
        let mut bad = Welcome {
            version: 4,
            result: Ok(1),
            index_reserve: 0,
            trusted: true,
            direct_writes: false,
        }
        .encode();
        bad[10] = 2;
        assert_eq!(Welcome::decode(&bad), Err(Errno::EPROTO));
        // Direct writes are a flag too, and for a trusted client only.
        let w = Welcome {
            version: 4,
            result: Ok(1),
            index_reserve: 0,
            trusted: true,
            direct_writes: true,
        };
        let mut bad = w.encode();
        bad[11] = 2;
        assert_eq!(Welcome::decode(&bad), Err(Errno::EPROTO));
        let mut bad = w.encode();
        bad[10] = 0;
        assert_eq!(Welcome::decode(&bad), Err(Errno::EPROTO));
        // Both a client number and an errno, or an errno out of range.
        let mut bad = Welcome {
            version: 4,
            result: Ok(3),
            index_reserve: 0,
            trusted: false,
            direct_writes: false,
        }
        .encode();
        bad[16] = 5;
        assert_eq!(Welcome::decode(&bad), Err(Errno::EPROTO));
        let mut bad = [0u8; WELCOME_SIZE];
        bad[..8].copy_from_slice(&WELCOME_MAGIC.to_le_bytes());
        bad[16..20].copy_from_slice(&(-3i32).to_le_bytes());
        assert_eq!(Welcome::decode(&bad), Err(Errno::EPROTO));
    }

    #[test]
    fn descriptors_cross_a_socket_with_their_message() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let shm = crate::pm::Shm::create("kucofs-test", 4096, 4096).unwrap();
        shm.store_u64(0, 99, std::sync::atomic::Ordering::Release)
            .unwrap();
        let ro = shm.read_only_fd().unwrap();
        send_with_fds(&a, b"0123456789abcdef", &[shm.fd(), ro.as_fd()]).unwrap();
        let mut buf = [0u8; 16];
        let fds = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!(&buf, b"0123456789abcdef");
        assert_eq!(fds.len(), 2);
        let mut fds = fds.into_iter();
        let rw = crate::pm::Shm::from_fd(fds.next().unwrap(), "rw").unwrap();
        assert_eq!(
            rw.try_load_u64(0, std::sync::atomic::Ordering::Acquire)
                .unwrap(),
            99
        );
        // The read-only one maps for reading, never for writing.
        let ro = fds.next().unwrap();
        assert!(crate::pm::Shm::from_fd(ro.try_clone().unwrap(), "ro").is_err());
        let view = crate::pm::ShmView::from_fd(ro, "ro", 4096).unwrap();
        use crate::pm::Words;
        assert_eq!(view.load_u64(0, std::sync::atomic::Ordering::Acquire), 99);
        drop(a);
        assert_eq!(
            recv_with_fds(&b, &mut buf).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }
}
