//! FxMark-style benchmarks of KucoFS, always measured beside the kernel's
//! own file system in the same run.
//!
//! The workloads arrive with the metadata and data paths; the persistence
//! primitives are benchmarked today by `cargo bench -p kucofs-common`.
