//! FxMark-style benchmarks of KucoFS, always measured beside the kernel's
//! own file system in the same run.
//!
//! FxMark's metadata workloads (MWCL, MWCM, MRPL, MRPM, MWUL, MWRL), its
//! data workloads (DRBL, DRBM, DWOL, DWOM, DWAL, DWSL) and two of random
//! 4 KiB I/O (RNDRD, RNDWR) (Min et al., USENIX ATC 2016; see [`workload`])
//! run on any [`Backend`]: a `dir:PATH` of a kernel file system, KucoFS
//! through its library (`kucofs`), or KucoFS served by a daemon
//! (`kucofs-daemon`), with workers on threads or, as FxMark runs them,
//! in processes of their own ([`process`]). Data goes through the
//! [`backend::FileHandle`]s a backend opens. A [`suite::Plan`] runs every workload at every thread count on
//! every backend; the [`report`] puts them side by side, the first backend
//! as the baseline, with the bandwidth of the data workloads. The
//! persistence primitives are benchmarked by `cargo bench -p
//! kucofs-common`; [`medium`] measures what the machine charges for the
//! data path's building blocks (page protection, persisting a page, a
//! read through a view with small pages); [`roundtrip`] what a daemon's
//! client pays per request and what the daemon spends serving it.

pub mod backend;
pub mod error;
pub mod harness;
pub mod machine;
pub mod medium;
pub mod open;
pub mod process;
pub mod report;
pub mod rng;
pub mod roundtrip;
pub mod suite;
#[cfg(test)]
mod testing;
pub mod workload;

pub use backend::Backend;
pub use error::{Error, Result};
pub use harness::Budget;
pub use workload::Workload;
