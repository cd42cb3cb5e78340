//! The parts of KucoFS that every other crate stands on: the on-media
//! [`format`](mod@format), the persistent-memory [`pm`] region with its
//! persistence primitives, and the crate's [`Error`].
//!
//! KucoFS targets little-endian x86-64: the on-media structs are read and
//! written in native byte order, and the flush instructions are x86's.

#[cfg(not(all(target_arch = "x86_64", target_endian = "little")))]
compile_error!("KucoFS supports x86-64 only (little-endian media layout, clwb/clflushopt)");

pub mod access;
pub mod attach;
pub mod channel;
pub mod checksum;
pub mod codec;
pub mod errno;
pub mod error;
pub mod format;
pub mod index;
pub mod pm;
pub mod proto;
pub mod scratch;
pub mod size;

pub use errno::Errno;
pub use error::{Error, Result};
