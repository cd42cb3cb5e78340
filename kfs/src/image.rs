//! Making, opening and inspecting images: mkfs, superblock selection, and
//! the read-only report behind `kucofs info`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kucofs_common::format::{
    scan_log_with, Geometry, GeometryError, Superblock, SuperblockFault, FORMAT_VERSION, PAGE_SIZE,
    SUPERBLOCK_OFFSETS, SUPERBLOCK_SIZE,
};
use kucofs_common::pm::{allocated, Hardware, MapMode, Persist, Region, RegionView, Space};
use kucofs_common::proto::Creds;
use kucofs_common::size::format_size;

use crate::namespace::Namespace;
use crate::pages::Pages;
use crate::{Error, Result};
use kucofs_common::format::meta::BatchWriter;

/// Which superblock copy an image was opened from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copy {
    /// Page 0.
    A,
    /// Page 1.
    B,
}

/// An open, validated image: the writable region and its current superblock.
#[derive(Debug)]
pub struct Image {
    region: Arc<Region>,
    superblock: Superblock,
    copy: Copy,
}

/// Formats `path` as an empty KucoFS of `size` bytes (rounded down to whole
/// pages) and returns its superblock. Refuses an existing file unless
/// `force`, and sizes outside the format's range. A new file's memory is
/// reserved ([`Space::Reserved`]).
pub fn mkfs(path: &Path, size: u64, force: bool) -> Result<Superblock> {
    mkfs_with(
        path,
        size,
        force,
        Space::Reserved,
        Arc::new(Hardware::new()),
    )
}

/// [`mkfs`] with a chosen space for a file (see [`Space`]) and
/// persistence backend.
pub fn mkfs_with(
    path: &Path,
    size: u64,
    force: bool,
    space: Space,
    persist: Arc<dyn Persist>,
) -> Result<Superblock> {
    let geometry = Geometry::for_size(size).map_err(|e| match e {
        GeometryError::TooSmall { size, min } => kucofs_common::Error::TooSmall {
            path: path.into(),
            size,
            min,
        },
        GeometryError::TooLarge { size, max } => kucofs_common::Error::TooLarge {
            path: path.into(),
            size,
            max,
        },
        GeometryError::Inconsistent(why) => kucofs_common::Error::Unusable {
            path: path.into(),
            why: why.into(),
        },
    })?;
    let region = Region::create_with(path, geometry.size, force, space, persist)?;
    let made = format(&region, path, geometry);
    if made.is_err() {
        region.discard();
    }
    made
}

/// Lays out an empty file system of `geometry` in `region`, just made at
/// `path`, and returns its superblock.
fn format(region: &Region, path: &Path, geometry: Geometry) -> Result<Superblock> {
    reserve_metadata(region, &geometry)?;
    // A reused device (or a file that kept its blocks) may hold an old
    // image: clear the superblock pages, the log (old entries must never
    // replay) and the owner table (no page belongs to anything yet).
    let clear = [
        (0, SUPERBLOCK_OFFSETS[1] + PAGE_SIZE),
        (geometry.log.offset(), geometry.log.len()),
        (geometry.owners.offset(), geometry.owners.len()),
    ];
    // A file just truncated reads as zeros already: clearing it would only
    // allocate memory (or blocks) for nothing.
    if !region.is_fresh() {
        for (offset, len) in clear {
            region.fill(offset, len, 0)?;
            region.flush(offset, len)?;
        }
        region.fence();
    }
    // The root directory, owned by whoever makes the file system, is the
    // store's first record, written as a retirement writes records.
    let root = Creds::current();
    let unusable = |why: String| kucofs_common::Error::Unusable {
        path: path.into(),
        why,
    };
    let mut ns = Namespace::with_store(root, crate::namespace::now_ns(), &geometry)
        .map_err(|e| unusable(format!("making the root directory failed: {e}")))?;
    let mut pages = Pages::new(&geometry, [], []).map_err(|e| unusable(e.to_string()))?;
    let mut batch = BatchWriter::new();
    let reserve = |p: u64| region.reserve(p * PAGE_SIZE, PAGE_SIZE).is_ok();
    crate::store::retire(&mut ns, &mut pages, &mut batch, &reserve, u64::MAX)
        .map_err(|e| unusable(format!("writing the root directory failed: {e}")))?;
    crate::volume::apply_batch(region, &geometry, batch.bytes())
        .map_err(|e| unusable(e.to_string()))?;
    let superblock = Superblock {
        seq: 1,
        compat: 0,
        incompat: 0,
        clean: true,
        uuid: new_uuid(),
        // The clock reads 0 before the epoch, so a stamp is never negative.
        created_ns: u64::try_from(crate::namespace::now_ns()).unwrap_or(0),
        geometry,
        log_seq: 1,
    };
    write_superblock(region, &superblock)?;
    Ok(superblock)
}

/// Writes both superblock copies, A then B, each persisted before the next:
/// a crash during either leaves the other one valid.
fn write_superblock(region: &Region, sb: &Superblock) -> Result<()> {
    let bytes = sb.encode();
    for offset in SUPERBLOCK_OFFSETS {
        region.write_persist(offset, &bytes)?;
    }
    Ok(())
}

/// Reads both superblock copies through `read` (which copies bytes at an
/// offset, as far as the image has them) and picks the one to use.
pub(crate) fn select_superblock(
    path: &Path,
    len: u64,
    read: impl Fn(u64, &mut [u8]) -> kucofs_common::Result<()>,
) -> Result<(Superblock, Copy)> {
    let decode = |offset: u64| -> Result<Result<Superblock, SuperblockFault>> {
        let mut buf = [0u8; SUPERBLOCK_SIZE];
        // A short image holds part of a copy or none of it; the missing bytes
        // stay zero, which fails the magic or the checksum.
        let have = usize::try_from(len.saturating_sub(offset))
            .map_or(SUPERBLOCK_SIZE, |n| n.min(SUPERBLOCK_SIZE));
        if have > 0 {
            read(offset, &mut buf[..have])?;
        }
        Ok(Superblock::decode(&buf))
    };
    let a = decode(SUPERBLOCK_OFFSETS[0])?;
    let b = decode(SUPERBLOCK_OFFSETS[1])?;
    // An intact copy written by a newer build wins over an older valid one:
    // using the older copy would roll the file system back.
    for copy in [&a, &b] {
        match copy {
            Err(SuperblockFault::UnsupportedVersion(version)) => {
                return Err(Error::UnsupportedVersion {
                    path: path.into(),
                    version: *version,
                    supported: FORMAT_VERSION,
                })
            }
            Err(SuperblockFault::UnsupportedFeatures(bits)) => {
                return Err(Error::UnsupportedFeatures {
                    path: path.into(),
                    bits: *bits,
                })
            }
            _ => {}
        }
    }
    let chosen = match (a, b) {
        (Ok(a), Ok(b)) if b.seq > a.seq => (b, Copy::B),
        (Ok(a), _) => (a, Copy::A),
        (Err(_), Ok(b)) => (b, Copy::B),
        (Err(SuperblockFault::NoMagic), Err(SuperblockFault::NoMagic)) => {
            return Err(Error::NotKucofs { path: path.into() })
        }
        (Err(a), Err(b)) => {
            return Err(Error::BothCorrupt {
                path: path.into(),
                a,
                b,
            })
        }
    };
    if len < chosen.0.geometry.size {
        return Err(Error::TooShort {
            path: path.into(),
            len,
            needed: chosen.0.geometry.size,
        });
    }
    Ok(chosen)
}

/// Gives a sparse image's superblocks, log and owner table their memory
/// (see [`Space`]), all the pages before the data pages (about 1/256 of a
/// large image): Kfs stores to them, and a store to a page the file
/// system under the image has no room for would kill the process. Grants
/// and the metadata store reserve the data pages they take.
fn reserve_metadata(region: &Region, g: &Geometry) -> Result<()> {
    region.reserve(0, g.data.offset())?;
    Ok(())
}

impl Image {
    /// Opens and validates an image for exclusive use: both superblock
    /// copies are checked and the newer valid one is used.
    pub fn open(path: &Path) -> Result<Image> {
        Image::open_with(path, Arc::new(Hardware::new()))
    }

    /// [`Image::open`] with a chosen persistence backend.
    pub fn open_with(path: &Path, persist: Arc<dyn Persist>) -> Result<Image> {
        let region = Region::open_with(path, persist)?;
        let (superblock, copy) =
            select_superblock(path, region.len(), |off, buf| region.read(off, buf))?;
        reserve_metadata(&region, &superblock.geometry)?;
        Ok(Image {
            region: Arc::new(region),
            superblock,
            copy,
        })
    }

    /// The writable region.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// A handle on the region, for provisioning it from another thread.
    pub fn region_handle(&self) -> Arc<Region> {
        self.region.clone()
    }

    /// The superblock in force.
    pub fn superblock(&self) -> &Superblock {
        &self.superblock
    }

    /// The copy it was read from.
    pub fn copy(&self) -> Copy {
        self.copy
    }

    /// Records whether the file system is cleanly unmounted: cleared while a
    /// Kfs has it open, set at a clean close.
    pub fn set_clean(&mut self, clean: bool) -> Result<()> {
        let mut sb = self.superblock.clone();
        sb.clean = clean;
        self.update_superblock(sb)
    }

    /// Makes `sb` (with the next sequence number) the superblock in force.
    pub fn update_superblock(&mut self, mut sb: Superblock) -> Result<()> {
        sb.seq = self.superblock.seq + 1;
        write_superblock(&self.region, &sb)?;
        self.superblock = sb;
        self.copy = Copy::A;
        Ok(())
    }
}

/// What `kucofs info` reports about an image.
#[derive(Debug, Clone)]
pub struct ImageReport {
    /// The image's path.
    pub path: PathBuf,
    /// Bytes in the image file or device.
    pub image_len: u64,
    /// The superblock in force.
    pub superblock: Superblock,
    /// Which copy that is, and whether the other one is valid too.
    pub copy: Copy,
    /// Whether the other copy is valid.
    pub other_copy_valid: bool,
    /// Data pages files hold, as the owner table says.
    pub file_pages: u64,
    /// Data pages the metadata store holds: inode table, directory
    /// entries, symlink targets.
    pub store: crate::store::StoreUse,
    /// Owner entries that are not ones the format allows.
    pub bad_owners: u64,
    /// Valid entries in the operation log.
    pub log_entries: u64,
    /// Bytes those entries occupy.
    pub log_bytes: u64,
    /// How the image maps.
    pub mode: MapMode,
    /// Bytes of memory (or blocks) an image file has allocated; `None`
    /// for a device, which has all of its own.
    pub allocated: Option<u64>,
}

/// Reads an image without changing it and reports on it. Fails while a Kfs
/// has the image open.
pub fn inspect(path: &Path) -> Result<ImageReport> {
    use kucofs_common::format::meta::Owner;
    let view = RegionView::open(path)?;
    let (sb, copy) = select_superblock(path, view.len(), |off, buf| view.read(off, buf))?;
    let g = sb.geometry;
    let other = match copy {
        Copy::A => SUPERBLOCK_OFFSETS[1],
        Copy::B => SUPERBLOCK_OFFSETS[0],
    };
    let mut buf = [0u8; SUPERBLOCK_SIZE];
    view.read(other, &mut buf)?;
    let other_copy_valid = Superblock::decode(&buf).is_ok();

    let (mut file_pages, mut bad_owners) = (0u64, 0u64);
    let mut store = crate::store::StoreUse::default();
    let mut page = vec![0u8; kucofs_common::format::PAGE_LEN];
    for i in 0..g.owners.pages {
        view.read(g.owners.offset() + i * PAGE_SIZE, &mut page)?;
        let first = i * kucofs_common::format::OWNERS_PER_PAGE;
        for (j, e) in page.chunks_exact(8).enumerate() {
            if first + j as u64 >= g.data.pages {
                break;
            }
            let v = u64::from_le_bytes(e.try_into().expect("8 bytes"));
            match Owner::decode(v) {
                Some(Owner::Free) => {}
                Some(Owner::File { .. }) => file_pages += 1,
                Some(Owner::Inodes { .. }) => store.inode_pages += 1,
                Some(Owner::Entries { .. }) => store.entry_pages += 1,
                Some(Owner::Target { .. }) => store.target_pages += 1,
                None => bad_owners += 1,
            }
        }
    }

    let (mut log_entries, mut log_bytes) = (0u64, 0u64);
    scan_log_with(
        g.log.len(),
        &kucofs_common::format::Lap::of(&sb),
        |at, buf| view.read(g.log.offset() + at, buf).is_ok(),
        |at, h, _| {
            log_entries += 1;
            log_bytes = at + h.footprint();
        },
    );
    Ok(ImageReport {
        path: path.into(),
        image_len: view.len(),
        superblock: sb,
        copy,
        other_copy_valid,
        file_pages,
        store,
        bad_owners,
        log_entries,
        log_bytes,
        mode: view.mode(),
        allocated: std::fs::metadata(path).ok().as_ref().and_then(allocated),
    })
}

impl fmt::Display for ImageReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sb = &self.superblock;
        let g = &sb.geometry;
        let data = g.data.len();
        let pct = |part: u64, whole: u64| {
            if whole == 0 {
                0.0
            } else {
                part as f64 * 100.0 / whole as f64
            }
        };
        let area = |name: &str, a: kucofs_common::format::Area| {
            format!(
                "  {name:<12} pages {:>10} .. {:<10} ({})\n",
                a.start,
                a.end(),
                format_size(a.len())
            )
        };
        writeln!(f, "image:        {}", self.path.display())?;
        writeln!(f, "format:       KucoFS version {FORMAT_VERSION}")?;
        writeln!(f, "uuid:         {}", uuid_text(&sb.uuid))?;
        writeln!(f, "mapping:      {}", self.mode)?;
        writeln!(
            f,
            "size:         {} ({} bytes; the image holds {})",
            format_size(g.size),
            g.size,
            format_size(self.image_len)
        )?;
        if let Some(have) = self.allocated {
            let what = if have >= self.image_len {
                "reserved"
            } else {
                "sparse: data pages take memory as they come into use"
            };
            writeln!(
                f,
                "memory:       {} of {} allocated ({what})",
                format_size(have.min(self.image_len)),
                format_size(self.image_len),
            )?;
        }
        writeln!(
            f,
            "state:        {}",
            if sb.clean {
                "clean"
            } else {
                "not clean (recovery will replay the log)"
            }
        )?;
        writeln!(
            f,
            "superblock:   sequence {}, read from copy {:?}; the other copy is {}",
            sb.seq,
            self.copy,
            if self.other_copy_valid {
                "valid"
            } else {
                "NOT valid"
            }
        )?;
        writeln!(f, "geometry:")?;
        f.write_str(&area(
            "superblocks",
            kucofs_common::format::Area { start: 0, pages: 2 },
        ))?;
        f.write_str(&area("log", g.log))?;
        f.write_str(&area("owner table", g.owners))?;
        f.write_str(&area("data", g.data))?;
        let files = self.file_pages * PAGE_SIZE;
        let meta = self.store.pages() * PAGE_SIZE;
        writeln!(
            f,
            "space:        {} file data, {} metadata, {} free of {} data ({:.1}% used)",
            format_size(files),
            format_size(meta),
            format_size(data.saturating_sub(files + meta)),
            format_size(data),
            pct(files + meta, data)
        )?;
        writeln!(
            f,
            "metadata:     {} inode table, {} directory entries, {} symlink targets ({:.2}% of the data pages)",
            format_size(self.store.inode_pages * PAGE_SIZE),
            format_size(self.store.entry_pages * PAGE_SIZE),
            format_size(self.store.target_pages * PAGE_SIZE),
            pct(meta, data)
        )?;
        if self.bad_owners > 0 {
            writeln!(
                f,
                "owner table:  {} entries are not ones the format allows (run kucofs fsck)",
                self.bad_owners
            )?;
        }
        writeln!(
            f,
            "log:          {} entries, {} of {} ({:.1}% full; retired into the store every {} or so)",
            self.log_entries,
            format_size(self.log_bytes),
            format_size(g.log.len()),
            pct(self.log_bytes, g.log.len()),
            format_size(g.retire_bytes())
        )
    }
}

fn uuid_text(u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// A random UUID (version 4) from the kernel's generator, falling back to
/// the clock and process id if `/dev/urandom` cannot be read.
fn new_uuid() -> [u8; 16] {
    use std::io::Read;
    let mut u = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut u));
    if read.is_err() {
        u[..8].copy_from_slice(&crate::namespace::now_ns().to_le_bytes());
        u[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

#[cfg(test)]
mod tests;
