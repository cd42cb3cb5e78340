//! A persistence backend for tests that keeps, beside the live mapping, the
//! image the media would hold if the machine crashed now.
//!
//! A store reaches that *durable* image only when the hardware would
//! guarantee it: a cached store once its cache line was flushed and a fence
//! followed, a non-temporal store once a fence followed. Everything else is
//! *in flight*: it may or may not have reached the media at a crash, because
//! caches write lines back whenever they like. At any moment the allowed crash
//! images are the durable image plus, for every cache line, some prefix (in
//! program order) of that line's in-flight stores; [`CrashPoint::images`]
//! builds them, and [`Recorder::on_fence`] hands a test every fence. Their
//! number is the product over lines of (stores + 1), far too many once a
//! fence has pages in flight, so [`CrashPoint::for_each_bounded`] yields
//! those in which at most `k` lines hold any of their in-flight stores
//! (about lines^k of them). A missing flush or fence shows with one or two
//! such lines: an entry durable without the data it names, a superblock
//! without the checkpoint it points to.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use super::mapping::Media;
use super::persist::Persist;
use super::CACHE_LINE;
use crate::Result;

/// What state an in-flight store is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlightKind {
    /// A cached store whose line was not flushed since.
    Stored,
    /// A cached store whose line was flushed, waiting for a fence.
    Flushed,
    /// A non-temporal store waiting for a fence.
    NonTemporal,
}

/// A store that is not yet guaranteed persistent. Stores are split at cache
/// line boundaries, so `bytes` never crosses a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    /// Program order of the store (increasing across the recorder's life).
    pub seq: u64,
    /// Offset of the first byte in the region.
    pub offset: usize,
    /// The bytes stored.
    pub bytes: Vec<u8>,
    /// Its state.
    pub kind: InFlightKind,
}

impl InFlight {
    fn line(&self) -> usize {
        self.offset / CACHE_LINE
    }
}

/// The media as seen at one fence, just before the fence takes effect.
#[derive(Debug)]
pub struct CrashPoint<'a> {
    /// How many fences came before this one.
    pub fence: u64,
    /// Bytes guaranteed on the media.
    pub durable: &'a [u8],
    /// Stores that may or may not be on the media.
    pub in_flight: &'a [InFlight],
}

impl CrashPoint<'_> {
    /// Number of distinct crash images this point allows (saturating).
    pub fn image_count(&self) -> u64 {
        lines(self.in_flight)
            .values()
            .fold(1u64, |n, stores| n.saturating_mul(stores.len() as u64 + 1))
    }

    /// Every crash image the hardware allows here, or `None` if there are
    /// more than `limit` of them.
    pub fn images(&self, limit: u64) -> Option<Vec<Vec<u8>>> {
        if self.image_count() > limit {
            return None;
        }
        let lines: Vec<Vec<&InFlight>> = lines(self.in_flight).into_values().collect();
        let mut images = Vec::new();
        // An odometer over "how many of each line's stores landed".
        let mut landed = vec![0usize; lines.len()];
        loop {
            let mut image = self.durable.to_vec();
            for (stores, &n) in lines.iter().zip(&landed) {
                for s in &stores[..n] {
                    image[s.offset..s.offset + s.bytes.len()].copy_from_slice(&s.bytes);
                }
            }
            images.push(image);
            let mut i = 0;
            loop {
                if i == lines.len() {
                    return Some(images);
                }
                landed[i] += 1;
                if landed[i] <= lines[i].len() {
                    break;
                }
                landed[i] = 0;
                i += 1;
            }
        }
    }
}

/// One cache line of a crash image chosen by
/// [`CrashPoint::for_each_bounded`]: the first `stores` of the line's
/// in-flight stores (in program order) reached the media, the rest did not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Landed {
    /// Offset in the region of the line's first byte.
    pub line: usize,
    /// How many of its in-flight stores landed (at least 1).
    pub stores: usize,
    /// How many it had in flight.
    pub of: usize,
}

impl fmt::Display for Landed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}:{}/{}", self.line, self.stores, self.of)
    }
}

/// Which crash images [`CrashPoint::for_each_bounded`] yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefixes {
    /// Every non-empty prefix of every chosen line.
    All,
    /// One choice per distinct image: a prefix that leaves its line as the
    /// durable image has it, or as a shorter prefix left it, makes an image
    /// that another choice (with that line left out, or at the shorter
    /// prefix) makes already, and is skipped.
    Distinct,
}

impl CrashPoint<'_> {
    /// The in-flight stores of each line, grouped in program order, with
    /// the line's offset.
    fn line_groups(&self) -> Vec<(usize, Vec<&InFlight>)> {
        lines(self.in_flight)
            .into_iter()
            .map(|(line, stores)| (line * CACHE_LINE, stores))
            .collect()
    }

    /// Number of crash images in which at most `k` lines hold some of
    /// their in-flight stores (each of those at one of its non-empty
    /// prefixes) and every other line holds none: the durable image alone,
    /// plus for every set of at most `k` lines the product of their store
    /// counts. Saturating.
    pub fn bounded_image_count(&self, k: usize) -> u64 {
        let counts: Vec<u64> = lines(self.in_flight)
            .values()
            .map(|s| s.len() as u64)
            .collect();
        bounded_count(&counts, k)
    }

    /// Calls `f` with every crash image in which at most `k` in-flight
    /// lines hold a non-empty program-order prefix of their stores (the
    /// durable image alone first, then the lines in increasing order of
    /// offset), as the list of lines chosen; with [`Prefixes::Distinct`],
    /// only one choice per distinct image. [`CrashPoint::image_of`] makes
    /// the image a choice describes. Returns how many choices `f` saw.
    pub fn for_each_bounded(
        &self,
        k: usize,
        prefixes: Prefixes,
        mut f: impl FnMut(&[Landed]),
    ) -> u64 {
        // Each line with its candidate prefix lengths.
        let mut options: Vec<(usize, usize, Vec<usize>)> = Vec::new();
        for (line, stores) in self.line_groups() {
            let all: Vec<usize> = (1..=stores.len()).collect();
            let kept = match prefixes {
                Prefixes::All => all,
                Prefixes::Distinct => {
                    let end = (line + CACHE_LINE).min(self.durable.len());
                    let mut bytes = self.durable[line..end].to_vec();
                    let mut seen = vec![bytes.clone()];
                    let mut kept = Vec::new();
                    for (i, s) in stores.iter().enumerate() {
                        let at = s.offset - line;
                        bytes[at..at + s.bytes.len()].copy_from_slice(&s.bytes);
                        if !seen.contains(&bytes) {
                            seen.push(bytes.clone());
                            kept.push(i + 1);
                        }
                    }
                    kept
                }
            };
            if !kept.is_empty() {
                options.push((line, stores.len(), kept));
            }
        }
        let mut chosen = Vec::with_capacity(k);
        let mut seen = 0u64;
        choose(&options, 0, k, &mut chosen, &mut |c| {
            seen += 1;
            f(c)
        });
        seen
    }

    /// The crash image in which exactly the lines of `choice` hold their
    /// stores' prefixes, written into `out` (resized to the region).
    pub fn image_of(&self, choice: &[Landed], out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(self.durable);
        for (line, bytes) in self.landed_lines(choice) {
            out[line..line + bytes.len()].copy_from_slice(&bytes);
        }
    }

    /// The bytes each line of `choice` holds in the image it makes, with
    /// the line's offset: the image is the durable one with these over it.
    pub fn landed_lines(&self, choice: &[Landed]) -> Vec<(usize, Vec<u8>)> {
        choice
            .iter()
            .map(|l| {
                let end = (l.line + CACHE_LINE).min(self.durable.len());
                let mut bytes = self.durable[l.line..end].to_vec();
                let mut stores: Vec<&InFlight> = self
                    .in_flight
                    .iter()
                    .filter(|s| s.line() == l.line / CACHE_LINE)
                    .collect();
                stores.sort_by_key(|s| s.seq);
                for s in stores.iter().take(l.stores) {
                    let at = s.offset - l.line;
                    bytes[at..at + s.bytes.len()].copy_from_slice(&s.bytes);
                }
                (l.line, bytes)
            })
            .collect()
    }

    /// An owned copy, to look at after the fence has passed.
    pub fn to_state(&self) -> CrashState {
        CrashState {
            fence: self.fence,
            durable: self.durable.to_vec(),
            in_flight: self.in_flight.to_vec(),
        }
    }
}

/// Number of ways to pick at most `k` of the lines, each with one of its
/// `counts` prefixes: the elementary symmetric sums e_0 .. e_k of the
/// counts, saturating.
fn bounded_count(counts: &[u64], k: usize) -> u64 {
    // e[j] after the first i lines: picks of j lines among them.
    let mut e = vec![0u64; k + 1];
    e[0] = 1;
    for &c in counts {
        for j in (1..=k).rev() {
            e[j] = e[j].saturating_add(e[j - 1].saturating_mul(c));
        }
    }
    e.iter().fold(0u64, |n, &x| n.saturating_add(x))
}

/// Every pick of at most `left` more lines from `options[from..]`, each at
/// one of its kept prefixes, added to `chosen`, in lexicographic order.
fn choose(
    options: &[(usize, usize, Vec<usize>)],
    from: usize,
    left: usize,
    chosen: &mut Vec<Landed>,
    f: &mut impl FnMut(&[Landed]),
) {
    f(chosen);
    if left == 0 {
        return;
    }
    for (i, (line, of, kept)) in options.iter().enumerate().skip(from) {
        for &stores in kept {
            chosen.push(Landed {
                line: *line,
                stores,
                of: *of,
            });
            choose(options, i + 1, left - 1, chosen, f);
            chosen.pop();
        }
    }
}

/// A [`CrashPoint`] copied out of the recorder: the media at one fence,
/// kept to build its crash images later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashState {
    /// How many fences came before this one.
    pub fence: u64,
    /// Bytes guaranteed on the media.
    pub durable: Vec<u8>,
    /// Stores that may or may not be on the media.
    pub in_flight: Vec<InFlight>,
}

impl CrashState {
    /// The crash point this state copies.
    pub fn point(&self) -> CrashPoint<'_> {
        CrashPoint {
            fence: self.fence,
            durable: &self.durable,
            in_flight: &self.in_flight,
        }
    }
}

/// In-flight stores grouped by cache line, each group in program order.
fn lines(in_flight: &[InFlight]) -> BTreeMap<usize, Vec<&InFlight>> {
    let mut by_line: BTreeMap<usize, Vec<&InFlight>> = BTreeMap::new();
    for s in in_flight {
        by_line.entry(s.line()).or_default().push(s);
    }
    for stores in by_line.values_mut() {
        stores.sort_by_key(|s| s.seq);
    }
    by_line
}

type FenceHook = Box<dyn FnMut(&CrashPoint<'_>) + Send>;

/// The recording backend. Attach it to one region
/// ([`Region::create_with`](super::Region::create_with) or
/// [`Region::open_with`](super::Region::open_with)).
pub struct Recorder {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    durable: Vec<u8>,
    in_flight: Vec<InFlight>,
    next_seq: u64,
    fences: u64,
    hook: Option<FenceHook>,
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.state.lock();
        f.debug_struct("Recorder")
            .field("size", &s.durable.len())
            .field("in_flight", &s.in_flight.len())
            .field("fences", &s.fences)
            .finish()
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    /// A recorder with an empty media; [`Persist::attach`] fills it.
    pub fn new() -> Recorder {
        Recorder {
            state: Mutex::new(State::default()),
        }
    }

    /// The image the media would hold after a crash now in which no in-flight
    /// store made it.
    pub fn durable_image(&self) -> Vec<u8> {
        self.state.lock().durable.clone()
    }

    /// The stores not yet guaranteed persistent, in program order.
    pub fn in_flight(&self) -> Vec<InFlight> {
        self.state.lock().in_flight.clone()
    }

    /// Number of fences so far.
    pub fn fences(&self) -> u64 {
        self.state.lock().fences
    }

    /// Calls `hook` at every fence, before the fence takes effect, with the
    /// crash point it ends. The hook runs under the recorder's lock: it must
    /// not call back into the recorder or the region.
    pub fn on_fence(&self, hook: impl FnMut(&CrashPoint<'_>) + Send + 'static) {
        self.state.lock().hook = Some(Box::new(hook));
    }

    /// Calls `f` with the crash point as it stands now.
    pub fn with_crash_point<R>(&self, f: impl FnOnce(&CrashPoint<'_>) -> R) -> R {
        let s = self.state.lock();
        f(&CrashPoint {
            fence: s.fences,
            durable: &s.durable,
            in_flight: &s.in_flight,
        })
    }

    fn record(&self, offset: usize, bytes: &[u8], kind: InFlightKind) {
        let mut s = self.state.lock();
        let mut at = 0;
        while at < bytes.len() {
            let off = offset + at;
            let line_end = (off / CACHE_LINE + 1) * CACHE_LINE;
            let n = (line_end - off).min(bytes.len() - at);
            let seq = s.next_seq;
            s.next_seq += 1;
            s.in_flight.push(InFlight {
                seq,
                offset: off,
                bytes: bytes[at..at + n].to_vec(),
                kind,
            });
            at += n;
        }
    }
}

impl Persist for Recorder {
    fn name(&self) -> String {
        "recorder".into()
    }

    fn attach(&self, media: Media<'_>) {
        let mut image = vec![0u8; media.len()];
        // Reading the whole mapping back cannot fail: the range is the mapping.
        if media.read(0, &mut image).is_ok() {
            let mut s = self.state.lock();
            s.durable = image;
            s.in_flight.clear();
        }
    }

    fn store(&self, media: Media<'_>, offset: usize, data: &[u8]) -> Result<()> {
        media.copy_in(offset, data)?;
        self.record(offset, data, InFlightKind::Stored);
        Ok(())
    }

    fn fill(&self, media: Media<'_>, offset: usize, len: usize, byte: u8) -> Result<()> {
        media.fill(offset, len, byte)?;
        self.record(offset, &vec![byte; len], InFlightKind::Stored);
        Ok(())
    }

    fn store_u64(
        &self,
        media: Media<'_>,
        offset: usize,
        value: u64,
        order: Ordering,
    ) -> Result<()> {
        media.store_u64(offset, value, order)?;
        self.record(offset, &value.to_le_bytes(), InFlightKind::Stored);
        Ok(())
    }

    fn store_nt(&self, media: Media<'_>, offset: usize, data: &[u8]) -> Result<()> {
        // The live mapping only needs the bytes; the recorder models the
        // non-temporal semantics itself.
        media.copy_in(offset, data)?;
        self.record(offset, data, InFlightKind::NonTemporal);
        Ok(())
    }

    fn flush(&self, media: Media<'_>, offset: usize, len: usize) -> Result<()> {
        media.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let first = offset / CACHE_LINE;
        let last = (offset + len - 1) / CACHE_LINE;
        let mut s = self.state.lock();
        for st in s.in_flight.iter_mut() {
            if st.kind == InFlightKind::Stored && (first..=last).contains(&st.line()) {
                st.kind = InFlightKind::Flushed;
            }
        }
        Ok(())
    }

    fn fence(&self) {
        let mut guard = self.state.lock();
        let s = &mut *guard;
        if let Some(hook) = s.hook.as_mut() {
            hook(&CrashPoint {
                fence: s.fences,
                durable: &s.durable,
                in_flight: &s.in_flight,
            });
        }
        s.fences += 1;
        let (done, still): (Vec<InFlight>, Vec<InFlight>) = std::mem::take(&mut s.in_flight)
            .into_iter()
            .partition(|st| st.kind != InFlightKind::Stored);
        for st in done {
            s.durable[st.offset..st.offset + st.bytes.len()].copy_from_slice(&st.bytes);
        }
        s.in_flight = still;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::pm::{Region, Space};

    fn region(dir: &tempfile::TempDir) -> (Region, Arc<Recorder>) {
        let rec = Arc::new(Recorder::new());
        let path = dir.path().join("img");
        let r = Region::create_with(&path, 64 * 1024, false, Space::Reserved, rec.clone()).unwrap();
        (r, rec)
    }

    #[test]
    fn unflushed_store_is_absent_from_the_crash_image() {
        let dir = tempfile::tempdir().unwrap();
        let (r, rec) = region(&dir);
        r.write(100, b"hello").unwrap();
        r.fence();
        assert_eq!(&rec.durable_image()[100..105], &[0; 5]);
        let f = rec.in_flight();
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].offset, f[0].kind), (100, InFlightKind::Stored));
        // The live mapping has it all along.
        let mut buf = [0u8; 5];
        r.read(100, &mut buf).unwrap();
        assert_eq!(&buf, b"hello");
    }

    /// A copy out of shared memory lands byte for byte in both the live
    /// mapping and, once fenced, the crash image (the recorder sees it as
    /// non-temporal stores); the same copy on the hardware backend lands
    /// in the live mapping. A source range outside the memory is refused.
    #[test]
    fn a_copy_from_shared_memory_is_a_non_temporal_store() {
        let dir = tempfile::tempdir().unwrap();
        let (r, rec) = region(&dir);
        let shm = crate::pm::Shm::create("kucofs-test", 8192, 8192).unwrap();
        let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        shm.write(1000, &data).unwrap();
        // An unaligned destination: a head and tail beside the streamed body.
        r.write_nt_from(4100, &shm, 1000, data.len()).unwrap();
        assert!(rec
            .in_flight()
            .iter()
            .all(|s| s.kind == InFlightKind::NonTemporal));
        r.fence();
        assert_eq!(&rec.durable_image()[4100..7100], &data[..]);
        let mut live = vec![0u8; data.len()];
        r.read(4100, &mut live).unwrap();
        assert_eq!(live, data);
        assert!(r.write_nt_from(0, &shm, 8000, 200).is_err());

        let hw = Region::create(&dir.path().join("hw"), 64 * 1024, false).unwrap();
        hw.write_nt_from(4100, &shm, 1000, data.len()).unwrap();
        hw.fence();
        hw.read(4100, &mut live).unwrap();
        assert_eq!(live, data);
        assert!(hw.write_nt_from(0, &shm, 8000, 200).is_err());
        assert!(hw.write_nt_from(64 * 1024 - 100, &shm, 0, 200).is_err());
    }

    #[test]
    fn flushed_and_fenced_store_is_present() {
        let dir = tempfile::tempdir().unwrap();
        let (r, rec) = region(&dir);
        r.write(4000, b"durable").unwrap();
        r.flush(4000, 7).unwrap();
        // Flushed but not fenced: in flight, not durable.
        assert_eq!(&rec.durable_image()[4000..4007], &[0; 7]);
        let f = rec.in_flight();
        assert!(f.iter().all(|s| s.kind == InFlightKind::Flushed));
        assert_eq!(f.iter().map(|s| s.bytes.len()).sum::<usize>(), 7);
        r.fence();
        assert_eq!(&rec.durable_image()[4000..4007], b"durable");
        assert!(rec.in_flight().is_empty());
    }

    #[test]
    fn stores_are_split_at_cache_lines_and_flushes_cover_whole_lines() {
        let dir = tempfile::tempdir().unwrap();
        let (r, rec) = region(&dir);
        // 100 bytes at 60 touch lines 0, 1 and 2.
        r.write(60, &[9u8; 100]).unwrap();
        assert_eq!(rec.in_flight().len(), 3);
        // Flushing one byte of line 1 flushes the whole line 1 and only it.
        r.flush(64 + 10, 1).unwrap();
        r.fence();
        let d = rec.durable_image();
        assert_eq!(&d[64..128], &[9u8; 64]);
        assert_eq!(&d[60..64], &[0u8; 4]);
        assert_eq!(&d[128..160], &[0u8; 32]);
        assert_eq!(rec.in_flight().len(), 2);
    }

    #[test]
    fn a_flush_persists_only_the_stores_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let (r, rec) = region(&dir);
        r.write(0, &[1]).unwrap();
        r.flush(0, 1).unwrap();
        r.write(1, &[2]).unwrap();
        r.fence();
        assert_eq!(&rec.durable_image()[..2], &[1, 0]);
        assert_eq!(rec.in_flight()[0].offset, 1);
    }

    #[test]
    fn non_temporal_store_needs_only_a_fence() {
        let dir = tempfile::tempdir().unwrap();
        let (r, rec) = region(&dir);
        r.write_nt(8192, &[5u8; 4096]).unwrap();
        assert!(rec
            .in_flight()
            .iter()
            .all(|s| s.kind == InFlightKind::NonTemporal));
        assert_eq!(rec.durable_image()[8192], 0);
        r.fence();
        assert_eq!(&rec.durable_image()[8192..12288], &[5u8; 4096][..]);
    }

    #[test]
    fn crash_images_are_every_per_line_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let (r, rec) = region(&dir);
        // Line 0: two stores in order; line 2: one store.
        r.write(0, &[1]).unwrap();
        r.write(0, &[2]).unwrap();
        r.write(128, &[3]).unwrap();
        let images = rec.with_crash_point(|cp| {
            assert_eq!(cp.image_count(), 3 * 2);
            assert!(cp.images(5).is_none());
            cp.images(6).unwrap()
        });
        let mut seen: Vec<(u8, u8)> = images.iter().map(|i| (i[0], i[128])).collect();
        seen.sort();
        assert_eq!(seen, vec![(0, 0), (0, 3), (1, 0), (1, 3), (2, 0), (2, 3)]);
    }

    /// Line 0 gets two stores, line 2 one, line 3 three, each of a byte
    /// no earlier store or the media held there.
    fn six_stores_on_three_lines(r: &Region) {
        r.write(0, &[1]).unwrap();
        r.write(1, &[2]).unwrap();
        r.write(128, &[3]).unwrap();
        r.write_nt(192, &[4]).unwrap();
        r.write(192, &[5]).unwrap();
        r.write(193, &[6]).unwrap();
    }

    #[test]
    fn bounded_crash_images_count_every_set_of_at_most_k_lines() {
        let dir = tempfile::tempdir().unwrap();
        let (r, rec) = region(&dir);
        six_stores_on_three_lines(&r);
        rec.with_crash_point(|cp| {
            // Store counts 2, 1, 3: e0 = 1, e1 = 6, e2 = 2 + 6 + 3, e3 = 6.
            let expected = [1, 7, 18, 24, 24];
            for (k, &n) in expected.iter().enumerate() {
                assert_eq!(cp.bounded_image_count(k), n, "k = {k}");
                let mut choices = Vec::new();
                let seen = cp.for_each_bounded(k, Prefixes::All, |c| choices.push(c.to_vec()));
                assert_eq!(seen, n, "k = {k}");
                assert_eq!(choices.len() as u64, n);
                assert!(choices.iter().all(|c| c.len() <= k));
                // The durable image alone comes first.
                assert!(choices[0].is_empty());
                let mut sorted = choices.clone();
                sorted.sort();
                sorted.dedup();
                assert_eq!(sorted.len(), choices.len(), "a choice repeated");
            }
            // With every line allowed, the images are the full set.
            let mut bounded = Vec::new();
            let mut buf = Vec::new();
            cp.for_each_bounded(3, Prefixes::All, |c| {
                cp.image_of(c, &mut buf);
                bounded.push(buf.clone());
            });
            let mut all = cp.images(100).unwrap();
            all.sort();
            bounded.sort();
            assert_eq!(bounded, all);
        });
    }

    #[test]
    fn a_bounded_choice_lands_exactly_its_lines_prefixes() {
        let dir = tempfile::tempdir().unwrap();
        let (r, rec) = region(&dir);
        six_stores_on_three_lines(&r);
        let state = rec.with_crash_point(|cp| cp.to_state());
        let cp = state.point();
        let mut image = Vec::new();
        let choice = [
            Landed {
                line: 0,
                stores: 1,
                of: 2,
            },
            Landed {
                line: 192,
                stores: 2,
                of: 3,
            },
        ];
        cp.image_of(&choice, &mut image);
        assert_eq!(image.len(), 64 * 1024);
        assert_eq!((image[0], image[1]), (1, 0));
        assert_eq!(image[128], 0, "line 2 was not chosen");
        assert_eq!((image[192], image[193]), (5, 0));
        assert_eq!(choice[1].to_string(), "0xc0:2/3");
        // The same image as the durable one with the chosen lines over it.
        let landed = cp.landed_lines(&choice);
        assert_eq!(landed.len(), 2);
        assert_eq!((landed[0].0, landed[1].0), (0, 192));
        assert_eq!(landed[0].1, image[..64]);
        assert_eq!(landed[1].1, image[192..256]);
    }

    #[test]
    fn distinct_bounded_images_skip_prefixes_that_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (r, rec) = region(&dir);
        // Line 0: a zero over the zero the media holds, then a 7, then a 7
        // again; line 1: a zero only; line 2: one real change.
        r.write(0, &[0]).unwrap();
        r.write(0, &[7]).unwrap();
        r.write(0, &[7]).unwrap();
        r.write(64, &[0; 8]).unwrap();
        r.write(130, &[9]).unwrap();
        rec.with_crash_point(|cp| {
            assert_eq!(cp.bounded_image_count(2), 1 + 5 + (3 + 3 + 1));
            let mut choices = Vec::new();
            let n = cp.for_each_bounded(2, Prefixes::Distinct, |c| choices.push(c.to_vec()));
            // Line 0 only at prefix 2 (its first 7), line 2 at prefix 1.
            let l0 = Landed {
                line: 0,
                stores: 2,
                of: 3,
            };
            let l2 = Landed {
                line: 128,
                stores: 1,
                of: 1,
            };
            assert_eq!(choices, vec![vec![], vec![l0], vec![l0, l2], vec![l2]]);
            assert_eq!(n, 4);
            // Every image the bound allows is one of those four.
            let mut distinct = std::collections::BTreeSet::new();
            let mut buf = Vec::new();
            for c in &choices {
                cp.image_of(c, &mut buf);
                distinct.insert(buf.clone());
            }
            assert_eq!(distinct.len(), 4);
            cp.for_each_bounded(2, Prefixes::All, |c| {
                cp.image_of(c, &mut buf);
                assert!(distinct.contains(&buf), "{c:?} makes an image not counted");
            });
        });
    }

    #[test]
    fn the_fence_hook_sees_what_is_in_flight_at_each_fence() {
        let dir = tempfile::tempdir().unwrap();
        let (r, rec) = region(&dir);
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let s = seen.clone();
        rec.on_fence(move |cp| {
            s.lock()
                .push((cp.fence, cp.in_flight.len(), cp.image_count()))
        });
        r.write(0, &[1]).unwrap();
        r.flush(0, 1).unwrap();
        r.fence();
        r.write(64, &[1]).unwrap();
        r.write(128, &[1]).unwrap();
        r.fence();
        assert_eq!(*seen.lock(), vec![(0, 1, 2), (1, 2, 4)]);
        assert_eq!(rec.fences(), 2);
    }

    #[test]
    fn out_of_range_operations_are_refused_and_not_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let (r, rec) = region(&dir);
        assert!(r.write(64 * 1024 - 2, &[0; 4]).is_err());
        assert!(r.flush(u64::MAX - 1, 10).is_err());
        assert!(r.write_nt(1 << 40, &[1]).is_err());
        assert!(rec.in_flight().is_empty());
    }
}
