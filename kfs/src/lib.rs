//! Kfs, the one trusted thread of KucoFS that applies every metadata change.
//!
//! This crate makes file systems ([`mkfs`]), opens and validates images
//! ([`Image`]), and inspects them ([`inspect`]).

mod error;
pub mod image;

pub use error::{Error, Result};
pub use image::{inspect, mkfs, Image, ImageReport};
