//! The cache warmer of direct commits (ARCHITECTURE.md §8): a client
//! thread about to apply its own commit starts loading, while its data
//! pages drain, what the commit will read under the volume's lock.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use kucofs_common::index::blockmap::{entry_page, MapReader};
use kucofs_common::index::InodeOff;
use kucofs_common::pm::{Shm, Words};

use super::Volume;
use crate::pages::PageTableAddr;

/// Warms the cache for a commit a client thread is about to apply
/// directly: while its data pages drain to memory, it starts loading the
/// block-map entry and the page state the commit will read under the
/// volume's lock, which a random overwrite would otherwise miss one after
/// another there. Hints only: nothing is changed. It reads the index
/// outside any reader epoch, so it may walk items Kfs has since reused
/// (the index stays mapped and every load is bounds-checked, so that
/// cannot fault); what it finds then is a useless load, never acted on.
#[derive(Debug, Clone)]
pub struct Warmer {
    /// The index, as Kfs maps it (the client's read-only view is another
    /// mapping of it, with other TLB entries).
    index: Arc<Shm>,
    states: PageTableAddr,
    /// The store's owner entries (a replaced page's is cleared).
    owners: Option<PageTableAddr>,
}

impl Warmer {
    /// Starts loading the block-map entry of file page `page` of the
    /// inode at `inode`, and its neighbours on the cache line: the walk
    /// down to the leaf loads the inode's map word and the inner nodes
    /// above the leaf (one for every 63 nodes below it), and only the
    /// leaf's line is prefetched.
    /// Returns where the entry is, for [`Warmer::replaced`]; `None` for a
    /// page the map does not reach.
    pub fn map(&self, inode: InodeOff, page: u64) -> Option<WarmEntry> {
        let at = MapReader::of_inode(&*self.index, inode).slot(page)?;
        self.index.prefetch(at);
        Some(WarmEntry(at))
    }

    /// Starts loading the state and the owner entry of the data page the
    /// entry at `entry` names: the page a commit replaces. Best once
    /// [`Warmer::map`] had time to load the entry.
    pub fn replaced(&self, entry: WarmEntry) {
        // Relaxed: a hint; Kfs reads the entry again under the lock.
        let e = self.index.load_u64(entry.0, Ordering::Relaxed);
        if e != 0 {
            self.states.prefetch(entry_page(e).get());
            if let Some(owners) = &self.owners {
                owners.prefetch(entry_page(e).get());
            }
        }
    }
}

/// Where [`Warmer::map`] found a block-map entry.
#[derive(Debug, Clone, Copy)]
pub struct WarmEntry(pub(super) u64);

impl Volume {
    /// A [`Warmer`] for client threads applying commits directly.
    pub fn warmer(&self) -> Warmer {
        Warmer {
            index: self.ns.arena().shm_handle(),
            states: self.pages.state_addr(),
            owners: self.ns.store().owner_addr(),
        }
    }
}
