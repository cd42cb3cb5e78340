//! Persistent memory: the mapped [`Region`], the bounds-checked [`Media`] view
//! the persistence backends work on, and the backends themselves
//! ([`Hardware`] and the crash-image [`Recorder`]).
//!
//! Raw pointers into a mapping never leave this module. Everything outside
//! reaches the mapped bytes through bounds-checked methods that copy in or
//! out, or through atomics at checked, aligned offsets; nobody ever gets a
//! `&mut [u8]` into shared memory, because another mapping (a client's
//! read-only view, another process) may be reading it at the same time.

mod cpu;
mod huge;
pub mod keys;
mod mapping;
mod persist;
mod recorder;
mod region;
mod shm;

pub use cpu::{prefetch, FlushInstr};
pub use mapping::{Media, HUGE_PAGE};
pub use persist::{Hardware, Persist};
pub use recorder::{CrashPoint, CrashState, InFlight, InFlightKind, Landed, Prefixes, Recorder};
pub use region::{
    allocated, is_dax, MapMode, PoolWriter, Protection, Protector, Region, RegionView, Space,
    BATCH_PAGES, BATCH_TIME,
};
pub use shm::{Shm, ShmView, Words};

/// Size of a CPU cache line, the unit in which stores become persistent.
pub const CACHE_LINE: usize = 64;
