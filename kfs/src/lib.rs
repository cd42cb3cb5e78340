//! Kfs, the one trusted thread of KucoFS that applies every metadata change.
//!
//! This crate makes file systems ([`mkfs`]), opens and validates images
//! ([`Image`]), and inspects them ([`inspect`]).

pub mod arena;
pub mod crashtest;
pub mod daemon;
mod error;
pub mod fsck;
pub mod image;
mod intmap;
pub mod log;
pub mod namespace;
pub mod pages;
pub mod provision;
pub mod record;
pub mod recovery;
pub mod server;
pub mod store;
pub mod volume;

pub use error::{Error, Result};
pub use fsck::{fsck, FsckReport};
pub use image::{inspect, mkfs, mkfs_with, Image, ImageReport};
pub use server::{Client, Detacher, Direct, Kfs, ServerConfig, StatsSnapshot};
pub use volume::{Caller, Volume, WarmEntry, Warmer};
