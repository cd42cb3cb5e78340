//! FxMark-style benchmarks of KucoFS, always measured beside the kernel's
//! own file system in the same run.
//!
//! The metadata workloads of FxMark (Min et al., USENIX ATC 2016) run on
//! any [`Backend`]: a `dir:PATH` of a kernel file system today, KucoFS
//! through its library once it has a path-based API. A [`suite::Plan`]
//! runs every workload at every thread count on every backend; the
//! [`report`] puts them side by side, the first backend as the baseline.
//! The persistence primitives are benchmarked by
//! `cargo bench -p kucofs-common`.

pub mod backend;
pub mod error;
pub mod harness;
pub mod machine;
pub mod report;
pub mod rng;
pub mod suite;
#[cfg(test)]
mod testing;
pub mod workload;

pub use backend::Backend;
pub use error::{Error, Result};
pub use harness::Budget;
pub use workload::Workload;
