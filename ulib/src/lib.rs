//! Ulib, the KucoFS client library that applications link: path resolution,
//! metadata and file reads straight from the read-only mapped index and
//! region, and requests to Kfs for every change.
//!
//! The library grows with the metadata path (index, channels, the `Fs`
//! handle); today it re-exports the pieces it will stand on.

pub use kucofs_common as common;
pub use kucofs_kfs as kfs;
