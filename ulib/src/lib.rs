//! Ulib, the KucoFS client library that applications link.
//!
//! [`Fs::open`] starts Kfs inside the application (embedded mode) and
//! returns a handle shaped like `std::fs`: paths resolve, `metadata` and
//! `read_dir` answer straight from the index mapped read-only into the
//! process, and every change goes to Kfs: applied by the calling thread
//! under Kfs's lock (the default in embedded mode), or queued to the Kfs
//! thread with the addresses Ulib already found (collaborative indexing).
//!
//! Running Kfs inside the application is the `embedded` cargo feature, on
//! by default. Without it this crate does not depend on Kfs, and
//! [`Fs::open`] fails with an `Unsupported` error: the handle reaches Kfs
//! only through its connection (the request slots a Kfs daemon would
//! serve too), and the embedded-only operations (`Fs::checkpoint`,
//! `Fs::settle`, `Fs::kfs_stats`, `Fs::simulate_crash`...) and
//! `ServerConfig`/`StatsSnapshot` are left out.
//!
//! ```no_run
//! # fn main() -> std::io::Result<()> {
//! let fs = kucofs_ulib::Fs::create("/dev/shm/example.img", 64 << 20)?;
//! fs.create_dir_all("a/b")?;
//! fs.create_file("a/b/hello")?;
//! assert!(fs.metadata("a/b/hello")?.is_file());
//! for entry in fs.read_dir("a/b")? {
//!     println!("{}", entry?.file_name().to_string_lossy());
//! }
//! fs.close()
//! # }
//! ```

mod at;
mod connection;
mod dir;
mod file;
mod fs;
mod isolated;
mod metadata;
pub mod range_lock;

pub use at::NewAttrs;
pub use dir::{DirEntry, ReadDir};
pub use file::{File, OpenOptions};
pub use fs::{Config, Fs, SetTime};
pub use kucofs_common::pm::Protection;
/// A node as Kfs names it (inode number, offset, generation): what the
/// node forms of [`Fs`]'s changes take ([`Metadata::node`]).
pub use kucofs_common::proto::Node;
#[cfg(feature = "embedded")]
pub use kucofs_kfs::{ServerConfig, StatsSnapshot};
pub use metadata::{FileType, Metadata, Permissions, StatFs};
