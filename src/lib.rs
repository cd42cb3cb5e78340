//! KucoFS, a user-space persistent-memory file system: the library an
//! application links ([`Fs`] and friends, shaped like `std::fs`), re-exported
//! from its crates.
//!
//! ```no_run
//! # fn main() -> std::io::Result<()> {
//! let fs = kucofs::Fs::create("/dev/shm/example.img", 64 << 20)?;
//! fs.create_dir_all("a/b")?;
//! fs.create_file("a/b/hello")?;
//! assert!(fs.metadata("a/b/hello")?.is_file());
//! fs.close()
//! # }
//! ```

pub use kucofs_ulib::*;

/// The README's Rust example, run as a doctest so that it stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
