//! Crash-state exploration: runs file-system operations on a small image
//! under a [`Recorder`], and at every fence of every operation (and of the
//! checkpoints, the clean close and recovery itself) builds the crash
//! images the hardware allows, recovers each one and checks it.
//!
//! A crash image is the durable image at a fence plus, for at most `k` of
//! the cache lines that have stores in flight, a non-empty program-order
//! prefix of that line's stores ([`CrashPoint::for_each_bounded`]); images
//! that repeat one already built at the same fence are skipped. Every image
//! must recover ([`Volume::open_with`] on a copy) to the state after the
//! last acknowledged request or, when the crash fell inside a request, to
//! the state before or after that request (a change is all or nothing, and
//! an acknowledged one is never lost). The state compared is a canonical
//! model of the tree ([`Tree`]): every path with its kind, link count,
//! mode, owner, times, size, contents or symlink target, and which paths
//! name the same inode. Times are compared exactly: each change's log
//! entry carries the times it set, so recovery gives back the ones
//! acknowledged, not the clock's reading at replay. The
//! recovered file system must then keep working (a file created, written
//! and read back), close cleanly, and leave an image [`fsck`](fn@crate::fsck)
//! finds clean; fsck of the crash image itself must read it and see the
//! entries recovery saw.
//!
//! [`CrashPoint::for_each_bounded`]: kucofs_common::pm::CrashPoint::for_each_bounded
//!
//! The explorer drives Kfs through the same entry points Kfs's own callers
//! use ([`crate::mkfs_with`], [`Volume::open_with`], [`Volume::handle`],
//! [`Volume::checkpoint`], [`Volume::close`], the index reader): how many
//! fences a request makes and what a checkpoint writes are Kfs's business,
//! and every fence is explored wherever it falls.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kucofs_common::format::{PageNo, PAGE_LEN};
use kucofs_common::index::blockmap::{entry_page, EntrySource, MapReader, PAGE};
use kucofs_common::index::{InodeOff, Kind};
use kucofs_common::pm::{
    CrashState, Hardware, Landed, Prefixes, Protection, Recorder, Space, CACHE_LINE,
};
use kucofs_common::proto::{
    self, open, At, Creds, Entry, Extents, OpenAt, Reply, Request, SetAttrs,
};
use kucofs_common::Errno;
use parking_lot::Mutex;

use crate::volume::{Caller, Volume};

/// Errors that stop an exploration before it can check anything (a crash
/// image that fails a check is a [`Violation`], not an error).
#[derive(Debug, thiserror::Error)]
pub enum CrashtestError {
    /// `--seq` other than 1 or 2.
    #[error("sequences of {0} operations are not explored (1 or 2)")]
    Seq(u32),
    /// `--filter` matched no operation.
    #[error("no operation's name contains {filter:?} (the operations: {names})")]
    NoMatch { filter: String, names: String },
    /// Making or writing a scratch file failed.
    #[error("{action} {path}: {cause}")]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },
    /// Making, opening or closing an image failed.
    #[error(transparent)]
    Kfs(#[from] crate::Error),
    /// The starting tree could not be built.
    #[error("building the starting tree: {0}")]
    Setup(String),
}

type Result<T, E = CrashtestError> = std::result::Result<T, E>;

/// What to explore.
#[derive(Debug, Clone)]
pub struct Config {
    /// Most in-flight cache lines a crash image takes stores from.
    pub k: usize,
    /// Operations in a sequence: 1 (each alone) or 2 (every ordered pair).
    pub seq: u32,
    /// Only operations whose name contains this (for pairs: either one).
    pub filter: Option<String>,
    /// Explore only this many sequences, picked pseudo-randomly by `seed`.
    pub sample: Option<usize>,
    /// Seed of the sample.
    pub seed: u64,
    /// Size of the image, in bytes.
    pub image_size: u64,
    /// Where scratch images go (a directory made inside it, removed after).
    pub dir: PathBuf,
    /// Explore only shard `i` of `n`, `(i, n)`: every `n`th group of
    /// sequences (those starting with the same operation) from the `i`th,
    /// so that `n` processes can share an exploration.
    pub shard: (usize, usize),
    /// Also crash at every fence of a checkpoint and of the clean close
    /// after each sequence.
    pub checkpoints: bool,
    /// Also crash at every fence of the recovery of each fence's durable
    /// image.
    pub recovery: bool,
    /// A deliberate fault, to show that the explorer reports what it must.
    pub fault: Fault,
}

impl Default for Config {
    fn default() -> Self {
        let shm = Path::new("/dev/shm");
        Config {
            k: 2,
            seq: 1,
            filter: None,
            sample: None,
            seed: 1,
            image_size: 1 << 20,
            dir: if shm.is_dir() {
                shm.into()
            } else {
                std::env::temp_dir()
            },
            shard: (0, 1),
            checkpoints: true,
            recovery: true,
            fault: Fault::None,
        }
    }
}

/// A fault the explorer can be told to make, so that a test can see it
/// report violations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// None: the explorer checks Kfs as it is.
    #[default]
    None,
    /// Every crash image is replaced by the starting image before it is
    /// recovered, as a recovery that lost everything since the last clean
    /// close would leave it.
    RollBack,
}

/// One crash image that failed a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The operations of the sequence ("rename-dir then chmod").
    pub ops: String,
    /// Where the crash fell: an operation's name, "checkpoint", "close",
    /// or the recovery of an image of one of those.
    pub phase: String,
    /// For a crash inside a recovery: the fence of the phase whose
    /// durable image was being recovered (0 otherwise).
    pub source: u64,
    /// The fence of the phase at which it fell (0: the phase's first;
    /// for a crash inside a recovery, that recovery's fence).
    pub fence: u64,
    /// The in-flight lines the image took stores from.
    pub lines: Vec<Landed>,
    /// What was wrong.
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "violation: {}: crash in {} at fence {}, lines [",
            self.ops, self.phase, self.fence
        )?;
        for (i, l) in self.lines.iter().enumerate() {
            write!(f, "{}{l}", if i == 0 { "" } else { " " })?;
        }
        // One line per violation, whatever the message holds.
        write!(f, "]: {}", self.what.replace('\n', " "))
    }
}

/// What an exploration did.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Sequences run.
    pub sequences: u64,
    /// Crash states checked: one per distinct image at each fence (and
    /// per fence of the recoveries explored).
    pub checked: u64,
    /// Crash images the bound allowed, before images that repeat one at
    /// the same fence were left out.
    pub bounded: u64,
    /// Images recovered (an image seen before in the same sequence is
    /// checked against the states allowed where it appeared again, without
    /// recovering it again).
    pub recovered: u64,
    /// Recovered crash images in which fsck found problems before
    /// recovery (each must still be clean after recovery and a clean
    /// close).
    pub raw_problems: u64,
    /// Operations refused in a sequence (the second of a pair may find
    /// what it needs gone).
    pub refused: u64,
    /// Every failed check.
    pub violations: Vec<Violation>,
    /// Time taken.
    pub elapsed: Duration,
}

impl Summary {
    fn add(&mut self, o: &Summary) {
        self.sequences += o.sequences;
        self.checked += o.checked;
        self.bounded += o.bounded;
        self.recovered += o.recovered;
        self.raw_problems += o.raw_problems;
        self.refused += o.refused;
        self.violations.extend(o.violations.iter().cloned());
    }
}

/// What the explorer tells its caller as it goes.
#[derive(Debug)]
pub enum Event<'a> {
    /// A group of sequences is done: an operation alone, or every pair
    /// starting with it.
    Group {
        /// The group's name.
        name: &'a str,
        /// What its sequences did.
        summary: &'a Summary,
    },
    /// A check failed.
    Violation(&'a Violation),
}

/// A file-system operation the explorer runs.
#[derive(Debug, Clone, Copy)]
pub struct Op {
    /// Its short name (what `--filter` matches).
    pub name: &'static str,
    action: Action,
}

#[derive(Debug, Clone, Copy)]
enum Action {
    /// A file, directory or symlink (with its target).
    Create(&'static str, New),
    Link(&'static str, &'static str),
    Unlink(&'static str),
    Rmdir(&'static str),
    Rename(&'static str, &'static str),
    SetAttr(&'static str, SetAttrs),
    Truncate(&'static str, u64),
    /// `len` bytes of data tagged `tag` at an offset, or at the end.
    Write(&'static str, Option<u64>, u64, u8),
}

#[derive(Debug, Clone, Copy)]
enum New {
    File,
    Dir,
    Symlink(&'static str),
}

const fn attrs() -> SetAttrs {
    SetAttrs {
        mode: None,
        uid: None,
        gid: None,
        atime: None,
        mtime: None,
    }
}

/// Every operation, each on the starting tree ([`STARTING_TREE`]).
pub const OPS: &[Op] = &[
    op("create", Action::Create("a/new", New::File)),
    op("mkdir", Action::Create("b/newdir", New::Dir)),
    op("symlink", Action::Create("b/sl", New::Symlink("../a/f2"))),
    op("link", Action::Link("a/f2", "b/f2-link")),
    op("unlink", Action::Unlink("a/f2")),
    op("unlink-hardlinked", Action::Unlink("a/hl")),
    op("rmdir", Action::Rmdir("b/empty")),
    op("rename-file", Action::Rename("a/f2", "a/f2-renamed")),
    op("rename-file-across", Action::Rename("a/f2", "b/f2-moved")),
    op("rename-file-over", Action::Rename("a/f2", "a/f1")),
    op("rename-file-over-across", Action::Rename("a/sub/g", "b/h")),
    op("rename-dir", Action::Rename("a/sub", "a/sub-renamed")),
    op("rename-dir-across", Action::Rename("a/sub", "b/sub-moved")),
    op("rename-dir-over", Action::Rename("a/sub", "a/e")),
    op("rename-dir-over-across", Action::Rename("a/sub", "b/empty")),
    op(
        "chmod",
        Action::SetAttr(
            "a/f1",
            SetAttrs {
                mode: Some(0o600),
                ..attrs()
            },
        ),
    ),
    op(
        "chown",
        Action::SetAttr(
            "b/h",
            SetAttrs {
                uid: Some(1000),
                gid: Some(100),
                ..attrs()
            },
        ),
    ),
    op(
        "utimens",
        Action::SetAttr(
            "a/f2",
            SetAttrs {
                atime: Some(1_000_000_000),
                mtime: Some(2_000_000_000),
                ..attrs()
            },
        ),
    ),
    op("truncate-shrink", Action::Truncate("a/f1", 5000)),
    op("truncate-grow", Action::Truncate("a/f2", 20_000)),
    op("write-part", Action::Write("a/f1", Some(1000), 100, 0x51)),
    op(
        "write-pages",
        Action::Write("b/h", Some(4096), 3 * PAGE, 0x52),
    ),
    op("append", Action::Write("a/sub/g", None, 5000, 0x53)),
];

const fn op(name: &'static str, action: Action) -> Op {
    Op { name, action }
}

/// The tree every sequence starts from: directories (one empty in each of
/// two directories), files with data, a symlink and a hard link.
pub const STARTING_TREE: &[&str] = &[
    "a/",
    "a/f1 (8292 bytes)",
    "a/f2 (1000 bytes)",
    "a/e/",
    "a/sub/",
    "a/sub/g (300 bytes)",
    "b/",
    "b/h (5000 bytes, also a/hl)",
    "b/empty/",
    "top (10 bytes)",
    "link -> a/f1",
];

fn starting_tree() -> Vec<Action> {
    vec![
        Action::Create("a", New::Dir),
        Action::Create("a/e", New::Dir),
        Action::Create("a/sub", New::Dir),
        Action::Create("b", New::Dir),
        Action::Create("b/empty", New::Dir),
        Action::Write("a/f1", Some(0), 2 * PAGE + 100, 1),
        Action::Write("a/f2", Some(0), 1000, 2),
        Action::Write("a/sub/g", Some(0), 300, 3),
        Action::Write("b/h", Some(0), 5000, 4),
        Action::Write("top", Some(0), 10, 5),
        Action::Link("b/h", "a/hl"),
        Action::Create("link", New::Symlink("a/f1")),
    ]
}

/// The byte at file offset `pos` of data tagged `tag`: non-zero in the
/// first and last 64 bytes of every KiB, zero between. Lines of zeros
/// written over the zeros a fresh data page holds change no crash image,
/// so a page written costs eight lines of crash images, not 64, while a
/// page lost or misplaced still shows in the lines that hold data.
// A hash of the offset: taking its low bytes is the point.
#[allow(clippy::cast_possible_truncation)]
fn pattern(tag: u8, pos: u64) -> u8 {
    let in_kib = pos % 1024;
    if !(64..1024 - 64).contains(&in_kib) {
        (tag.wrapping_mul(37) ^ (pos as u8).wrapping_mul(13) ^ (pos >> 8) as u8) | 1
    } else {
        0
    }
}

/// The caller every request is made as: client 0, root.
const ME: Caller = Caller {
    client: 0,
    slot: 0,
    creds: Creds::new(0, 0),
};

/// One node of a [`Tree`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// File, directory or symlink.
    pub kind: Kind,
    /// Link count.
    pub nlink: u32,
    /// Type and permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// The first path (in path order) naming the same inode, if this is
    /// not it.
    pub same_as: Option<String>,
    /// A file's contents or a symlink's target (empty for a directory).
    pub data: Vec<u8>,
    /// Last access, modification and status change (ns since the epoch).
    pub times: [i64; 3],
}

/// The canonical model of a file system's state: every path ("" is the
/// root) and what it names.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tree(pub BTreeMap<String, Node>);

/// Largest file the model reads whole; a larger size is damage, shown by
/// the size alone.
const MODEL_FILE_MAX: u64 = 16 << 20;

impl Tree {
    /// The tree of `v`, read through its index and its region.
    pub fn of(v: &Volume) -> Tree {
        let r = v.namespace().reader();
        let region = v.image().region();
        let mut nodes = BTreeMap::new();
        let mut first_path: HashMap<u64, String> = HashMap::new();
        let mut stack = vec![(r.root(), String::new())];
        let mut visited = HashSet::new();
        let mut found = Vec::new();
        while let Some((inode, path)) = stack.pop() {
            found.push((path.clone(), inode));
            if r.kind(inode) != Some(Kind::Dir) || !visited.insert(inode) {
                continue;
            }
            let mut es = Vec::new();
            r.read_dir(inode, None, usize::MAX, &mut es);
            for e in es {
                let name = String::from_utf8_lossy(&e.name);
                let child = if path.is_empty() {
                    name.into_owned()
                } else {
                    format!("{path}/{name}")
                };
                stack.push((e.inode, child));
            }
        }
        found.sort();
        for (path, inode) in found {
            let Some(a) = r.attr(inode) else {
                continue;
            };
            let kind = a.kind().unwrap_or(Kind::File);
            let data = match kind {
                Kind::Dir => Vec::new(),
                Kind::Symlink => r.readlink(inode).unwrap_or_default(),
                Kind::File if a.size > MODEL_FILE_MAX => Vec::new(),
                Kind::File => {
                    let map = MapReader::of_inode(r.mem(), inode);
                    let size = usize::try_from(a.size).expect("at most MODEL_FILE_MAX");
                    let mut data = vec![0u8; size];
                    for (i, chunk) in data.chunks_mut(PAGE_LEN).enumerate() {
                        let page = entry_page(map.entry(i as u64));
                        if !page.is_none() && region.read(page.byte_offset(), chunk).is_err() {
                            // A page outside the region: unreadable, shown
                            // as bytes no write made.
                            chunk.fill(0xEE);
                        }
                    }
                    data
                }
            };
            let same_as = match first_path.get(&a.ino.get()) {
                Some(p) => Some(p.clone()),
                None => {
                    first_path.insert(a.ino.get(), path.clone());
                    None
                }
            };
            nodes.insert(
                path,
                Node {
                    kind,
                    nlink: a.nlink,
                    mode: a.mode,
                    uid: a.uid,
                    gid: a.gid,
                    size: a.size,
                    same_as,
                    data,
                    times: [a.atime, a.mtime, a.ctime],
                },
            );
        }
        Tree(nodes)
    }

    /// Directory entries (every path but the root's).
    pub fn entries(&self) -> u64 {
        self.0.len().saturating_sub(1) as u64
    }

    /// Up to `max` differences of `self` from `expected`, as phrases.
    pub fn differences(&self, expected: &Tree, max: usize) -> Vec<String> {
        let show = |p: &str| {
            if p.is_empty() {
                "/".to_owned()
            } else {
                p.to_owned()
            }
        };
        let mut out = Vec::new();
        for (path, want) in &expected.0 {
            let Some(got) = self.0.get(path) else {
                out.push(format!("{} missing", show(path)));
                continue;
            };
            let mut field = |name: &str, g: String, w: String| {
                if g != w {
                    out.push(format!("{} {name} {g}, not {w}", show(path)));
                }
            };
            field(
                "kind",
                format!("{:?}", got.kind),
                format!("{:?}", want.kind),
            );
            field("nlink", got.nlink.to_string(), want.nlink.to_string());
            field(
                "mode",
                format!("{:o}", got.mode),
                format!("{:o}", want.mode),
            );
            field(
                "owner",
                format!("{}:{}", got.uid, got.gid),
                format!("{}:{}", want.uid, want.gid),
            );
            field("size", got.size.to_string(), want.size.to_string());
            field(
                "same inode as",
                format!("{:?}", got.same_as),
                format!("{:?}", want.same_as),
            );
            field(
                "times",
                format!("{:?}", got.times),
                format!("{:?}", want.times),
            );
            if got.data != want.data {
                let at = got
                    .data
                    .iter()
                    .zip(&want.data)
                    .position(|(a, b)| a != b)
                    .unwrap_or(got.data.len().min(want.data.len()));
                out.push(format!("{} contents differ from byte {at}", show(path)));
            }
        }
        for path in self.0.keys() {
            if !expected.0.contains_key(path) {
                out.push(format!("{} unexpected", show(path)));
            }
        }
        out.truncate(max);
        out
    }
}

/// The states a crash image may recover to, with their names.
type Allowed<'a> = [(&'a str, &'a Tree)];

/// What recovering one image gave: its tree, or what failed first.
type Recovered = std::result::Result<Tree, String>;

/// The hash of one cache line of an image, at offset `line`.
fn line_hash(line: usize, bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = (line as u64).wrapping_add(1).wrapping_mul(K);
    for c in bytes.chunks(8) {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(K).rotate_left(29);
    }
    h ^= h >> 31;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^ (h >> 29)
}

/// A 64-bit hash of an image, the wrapping sum of one hash per cache line,
/// so that the image a choice of landed lines makes is hashed from its
/// durable image's hash by swapping those lines' terms.
fn image_hash(image: &[u8]) -> u64 {
    image
        .chunks(CACHE_LINE)
        .enumerate()
        .fold(0u64, |s, (i, c)| {
            s.wrapping_add(line_hash(i * CACHE_LINE, c))
        })
}

/// The hash of the image made of `durable` (whose hash is `hash`) with
/// the `landed` lines over it.
fn patched_hash(durable: &[u8], hash: u64, landed: &[(usize, Vec<u8>)]) -> u64 {
    landed.iter().fold(hash, |h, (line, bytes)| {
        let old = &durable[*line..*line + bytes.len()];
        h.wrapping_sub(line_hash(*line, old))
            .wrapping_add(line_hash(*line, bytes))
    })
}

/// The sequences `config` explores, before it is split into shards:
/// every operation alone or every ordered pair, those `filter` names, and
/// of those the sample asked for, grouped by their first operation.
pub fn sequences(config: &Config) -> Result<Vec<Vec<&'static Op>>> {
    let ops = select_ops(config)?;
    let all: Vec<Vec<&Op>> = match config.seq {
        1 => ops.iter().map(|&o| vec![o]).collect(),
        2 => OPS
            .iter()
            .flat_map(|a| OPS.iter().map(move |b| vec![a, b]))
            .filter(|s| {
                config
                    .filter
                    .as_deref()
                    .is_none_or(|f| s.iter().any(|o| o.name.contains(f)))
            })
            .collect(),
        n => return Err(CrashtestError::Seq(n)),
    };
    Ok(sample(all, config.sample, config.seed))
}

/// Explores what `config` asks for, telling `events` as it goes.
pub fn run(config: &Config, mut events: impl FnMut(Event<'_>)) -> Result<Summary> {
    let started = Instant::now();
    let sequences = sequences(config)?;
    let scratch = Scratch::new(&config.dir)?;
    let base = Base::build(config, &scratch)?;
    let env = Env {
        config,
        base: &base,
        checker: Checker {
            path: scratch.path("crash.img"),
            source: scratch.path("source.img"),
        },
        work: scratch.path("work.img"),
    };
    // Groups: the sequences starting with the same operation.
    let mut groups: Vec<Vec<Vec<&Op>>> = Vec::new();
    for s in sequences {
        match groups.last_mut() {
            Some(g) if g[0][0].name == s[0].name => g.push(s),
            _ => groups.push(vec![s]),
        }
    }
    let (shard, shards) = config.shard;
    let mut total = Summary::default();
    for group in groups.iter().skip(shard).step_by(shards.max(1)) {
        let mut sum = Summary::default();
        for s in group {
            let s = env.sequence(s)?;
            for v in &s.violations {
                events(Event::Violation(v));
            }
            sum.add(&s);
        }
        let name = match config.seq {
            1 => group[0][0].name.to_owned(),
            _ => format!("{} then ...", group[0][0].name),
        };
        events(Event::Group {
            name: &name,
            summary: &sum,
        });
        total.add(&sum);
    }
    total.elapsed = started.elapsed();
    Ok(total)
}

fn select_ops(config: &Config) -> Result<Vec<&'static Op>> {
    let ops: Vec<&Op> = OPS
        .iter()
        .filter(|o| config.filter.as_deref().is_none_or(|f| o.name.contains(f)))
        .collect();
    if ops.is_empty() {
        return Err(CrashtestError::NoMatch {
            filter: config.filter.clone().unwrap_or_default(),
            names: OPS.iter().map(|o| o.name).collect::<Vec<_>>().join(", "),
        });
    }
    Ok(ops)
}

/// `n` of `all` picked by a generator seeded with `seed`, in their order;
/// all of them without `n` (or with `n` at least their number).
fn sample<T>(all: Vec<T>, n: Option<usize>, seed: u64) -> Vec<T> {
    let Some(n) = n.filter(|&n| n < all.len()) else {
        return all;
    };
    let mut state = seed;
    let mut next = || {
        // splitmix64: the same picks for the same seed on every machine.
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut idx: Vec<usize> = (0..all.len()).collect();
    for i in 0..n {
        let j = i + usize::try_from(next() % (all.len() - i) as u64).expect("below all.len() - i");
        idx.swap(i, j);
    }
    let mut picked: Vec<usize> = idx[..n].to_vec();
    picked.sort_unstable();
    let mut all: Vec<Option<T>> = all.into_iter().map(Some).collect();
    picked.into_iter().filter_map(|i| all[i].take()).collect()
}

/// A scratch directory, removed with what it holds when dropped.
#[derive(Debug)]
struct Scratch(PathBuf);

impl Scratch {
    fn new(under: &Path) -> Result<Scratch> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = under.join(format!("kucofs-crashtest-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|cause| CrashtestError::Io {
            action: "making the scratch directory",
            path: dir.clone(),
            cause,
        })?;
        Ok(Scratch(dir))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The starting image: the starting tree, cleanly closed.
#[derive(Debug)]
struct Base {
    image: Vec<u8>,
}

impl Base {
    fn build(config: &Config, scratch: &Scratch) -> Result<Base> {
        let path = scratch.path("base.img");
        crate::mkfs_with(
            &path,
            config.image_size,
            true,
            Space::Reserved,
            Arc::new(Hardware::new()),
        )?;
        let mut v = Volume::open(&path)?;
        v.attach_client(ME.client, None, Protection::Off, None);
        for a in starting_tree() {
            let refused = perform(&mut v, &a, &mut |_| {});
            if let Some(e) = refused {
                return Err(CrashtestError::Setup(format!("{a:?}: {e}")));
            }
        }
        v.close()?;
        let image = std::fs::read(&path).map_err(|cause| CrashtestError::Io {
            action: "reading",
            path: path.clone(),
            cause,
        })?;
        Ok(Base { image })
    }
}

/// Performs `action` on `v` as a client would, calling `after` as each
/// request returns. Returns the errno that refused
/// it, if one did (the rest of it is then not made).
fn perform(v: &mut Volume, action: &Action, after: &mut dyn FnMut(&mut Volume)) -> Option<Errno> {
    let mut req = |v: &mut Volume, r: &Request<'_>| {
        let reply = v.handle(r, ME);
        after(v);
        reply
    };
    let result = (|| -> std::result::Result<(), Errno> {
        match *action {
            Action::Create(path, new) => {
                let (mode, target) = match new {
                    New::File => (libc::S_IFREG | 0o644, ""),
                    New::Dir => (libc::S_IFDIR | 0o755, ""),
                    New::Symlink(t) => (libc::S_IFLNK | 0o777, t),
                };
                req(
                    v,
                    &Request::Create {
                        at: Entry::Path(path.as_bytes()),
                        mode,
                        target: target.as_bytes(),
                        hint: None,
                    },
                )?;
            }
            Action::Link(from, to) => {
                req(
                    v,
                    &Request::Link {
                        from: At::Path {
                            path: from.as_bytes(),
                            follow: false,
                        },
                        to: Entry::Path(to.as_bytes()),
                        hint: None,
                    },
                )?;
            }
            Action::Unlink(path) | Action::Rmdir(path) => {
                req(
                    v,
                    &Request::Unlink {
                        at: Entry::Path(path.as_bytes()),
                        rmdir: matches!(action, Action::Rmdir(_)),
                        hint: None,
                    },
                )?;
            }
            Action::Rename(from, to) => {
                req(
                    v,
                    &Request::Rename {
                        from: Entry::Path(from.as_bytes()),
                        to: Entry::Path(to.as_bytes()),
                        noreplace: false,
                        hint_from: None,
                        hint_to: None,
                    },
                )?;
            }
            Action::SetAttr(path, attrs) => {
                req(
                    v,
                    &Request::SetAttr {
                        at: At::Path {
                            path: path.as_bytes(),
                            follow: false,
                        },
                        attrs,
                        now: Default::default(),
                    },
                )?;
            }
            Action::Truncate(path, size) => {
                let f = open_for_write(v, path, &mut req)?;
                let cut = req(v, &Request::Truncate { ino: f.ino, size });
                req(
                    v,
                    &Request::Close {
                        ino: f.ino,
                        write: true,
                    },
                )?;
                cut?;
            }
            Action::Write(path, at, len, tag) => {
                let f = open_for_write(v, path, &mut req)?;
                let written = write(v, &f, at, len, tag, &mut req);
                req(
                    v,
                    &Request::Close {
                        ino: f.ino,
                        write: true,
                    },
                )?;
                written?;
            }
        }
        Ok(())
    })();
    result.err()
}

type Req<'a> = dyn FnMut(&mut Volume, &Request<'_>) -> std::result::Result<Reply, Errno> + 'a;

fn open_for_write(
    v: &mut Volume,
    path: &str,
    req: &mut Req<'_>,
) -> std::result::Result<proto::Node, Errno> {
    req(
        v,
        &Request::Open {
            at: OpenAt::Entry(Entry::Path(path.as_bytes())),
            flags: open::WRITE | open::CREATE,
            mode: 0o644,
            hint: None,
        },
    )
    .and_then(Reply::into_node)
}

/// Writes `len` bytes tagged `tag` at `at` (or at the end) of the file
/// `f` opens, as a client does: pool pages granted, each page's new
/// contents (the old ones with the new bytes over them) stored into a
/// pool page with non-temporal stores that the commit fences, then one
/// commit naming them.
fn write(
    v: &mut Volume,
    f: &proto::Node,
    at: Option<u64>,
    len: u64,
    tag: u8,
    req: &mut Req<'_>,
) -> std::result::Result<(), Errno> {
    let old_size = v.namespace().reader().attr(f.inode).ok_or(Errno::EIO)?.size;
    let start = at.unwrap_or(old_size);
    let end = start + len;
    let (first, last) = (start / PAGE, (end - 1) / PAGE);
    let n = last - first + 1;
    let mut pool = Vec::new();
    while (pool.len() as u64) < n {
        // More than a grant can ask for takes more than one.
        let want = u32::try_from(n - pool.len() as u64).unwrap_or(u32::MAX);
        let g = req(v, &Request::Grant { pages: want })?.into_grant()?;
        for (page, count) in g.runs() {
            pool.extend(page.get()..page.get() + count);
        }
    }
    pool.truncate(usize::try_from(n).expect("no more than the pool's length"));
    let mut extents = Extents::new();
    let mut buf = vec![0u8; PAGE_LEN];
    for (i, &dest) in pool.iter().enumerate() {
        let page = first + i as u64;
        let base = page * PAGE;
        // The bytes before the old end are the file's; past it, zeros.
        buf.fill(0);
        let old = old_page(v, f.inode, page);
        let keep = old_size.saturating_sub(base).min(PAGE) as usize;
        buf[..keep].copy_from_slice(&old[..keep]);
        for (j, b) in buf.iter_mut().enumerate() {
            let pos = base + j as u64;
            if (start..end).contains(&pos) {
                *b = pattern(tag, pos);
            }
        }
        v.image()
            .region()
            .write_nt(dest * PAGE, &buf)
            .map_err(|_| Errno::EIO)?;
        if !extents.push(PageNo::new(dest), 1) {
            return Err(Errno::EINVAL);
        }
    }
    req(
        v,
        &Request::Commit {
            ino: f.ino,
            first,
            size: end.max(old_size),
            extents,
        },
    )?;
    Ok(())
}

/// The data of file page `page` of the file at `inode` (zeros for a hole).
fn old_page(v: &Volume, inode: InodeOff, page: u64) -> Vec<u8> {
    let r = v.namespace().reader();
    let mut data = vec![0u8; PAGE_LEN];
    let at = entry_page(MapReader::of_inode(r.mem(), inode).entry(page));
    if !at.is_none()
        && v.image()
            .region()
            .read(at.byte_offset(), &mut data)
            .is_err()
    {
        data.fill(0);
    }
    data
}

/// What every sequence of an exploration shares.
struct Env<'a> {
    config: &'a Config,
    base: &'a Base,
    checker: Checker,
    /// Where the image a sequence runs on lives.
    work: PathBuf,
}

/// A batch of crash points to check against the same allowed states.
struct Batch<'a> {
    ops: &'a str,
    phase: &'a str,
    /// Fence count at the phase's start.
    phase_start: u64,
    points: Vec<CrashState>,
    allowed: Vec<(&'a str, &'a Tree)>,
}

/// What recovering each image met in a sequence gave, by image hash: an
/// image met again (at another fence, or in a recovery) is compared with
/// the states allowed where it appears without being recovered again.
type Cache = HashMap<u64, Recovered>;

impl Env<'_> {
    /// Runs one sequence under a recorder and checks every crash image of
    /// it.
    fn sequence(&self, ops: &[&Op]) -> Result<Summary> {
        let label = ops
            .iter()
            .map(|o| o.name)
            .collect::<Vec<_>>()
            .join(" then ");
        let mut out = Summary {
            sequences: 1,
            ..Summary::default()
        };
        let mut cache = Cache::new();
        write_file(&self.work, &self.base.image)?;
        let rec = Arc::new(Recorder::new());
        let mut v = Volume::open_with(&self.work, rec.clone())?;
        v.attach_client(ME.client, None, Protection::Off, None);
        let captured: Arc<Mutex<Vec<CrashState>>> = Arc::default();
        let sink = captured.clone();
        rec.on_fence(move |cp| sink.lock().push(cp.to_state()));
        let mut state = Tree::of(&v);
        let failure = |phase: &str, fence, what| Violation {
            ops: label.clone(),
            phase: phase.into(),
            source: 0,
            fence,
            lines: Vec::new(),
            what,
        };
        for (i, op) in ops.iter().enumerate() {
            let phase_start = rec.fences();
            let mut failed = None;
            let refused = perform(&mut v, &op.action, &mut |v| {
                let after = Tree::of(v);
                let batch = Batch {
                    ops: &label,
                    phase: op.name,
                    phase_start,
                    points: std::mem::take(&mut *captured.lock()),
                    allowed: vec![("before", &state), ("after", &after)],
                };
                if let Err(e) = self.check(batch, &mut cache, &mut out) {
                    failed.get_or_insert(e);
                }
                state = after;
            });
            if let Some(e) = failed {
                return Err(e);
            }
            match refused {
                Some(errno) if i == 0 => out.violations.push(failure(
                    op.name,
                    rec.fences() - phase_start,
                    format!("the operation was refused on the starting tree: {errno}"),
                )),
                Some(_) => out.refused += 1,
                None => {}
            }
        }
        if !self.config.checkpoints {
            return Ok(out);
        }
        // Everything is acknowledged now: a crash in the checkpoint or the
        // close after must recover it all.
        let mut finish = |phase: &str, phase_start, done: std::result::Result<(), String>| {
            let batch = Batch {
                ops: &label,
                phase,
                phase_start,
                points: std::mem::take(&mut *captured.lock()),
                allowed: vec![("acknowledged", &state)],
            };
            self.check(batch, &mut cache, &mut out)?;
            if let Err(e) = done {
                let what = format!("the {phase} failed: {e}");
                out.violations
                    .push(failure(phase, rec.fences() - phase_start, what));
            }
            Ok::<_, CrashtestError>(())
        };
        let phase_start = rec.fences();
        let done = v.checkpoint().map_err(|e| e.to_string());
        finish("checkpoint", phase_start, done)?;
        let phase_start = rec.fences();
        let done = v.close().map_err(|e| e.to_string());
        finish("close", phase_start, done)?;
        Ok(out)
    }

    /// Checks every bounded crash image of the batch's points, and of the
    /// recovery of each point's durable image, against its allowed states.
    fn check(&self, batch: Batch<'_>, cache: &mut Cache, out: &mut Summary) -> Result<()> {
        let k = self.config.k;
        let mut found = Vec::new();
        let mut sources = HashSet::new();
        for s in &batch.points {
            let cp = s.point();
            out.bounded += cp.bounded_image_count(k);
            let durable = image_hash(&s.durable);
            let mut choices = Vec::new();
            cp.for_each_bounded(k, Prefixes::Distinct, |c| choices.push(c.to_vec()));
            out.checked += choices.len() as u64;
            for choice in choices {
                let landed = cp.landed_lines(&choice);
                let hash = patched_hash(&s.durable, durable, &landed);
                let image = (s.durable.as_slice(), landed.as_slice());
                if let Some(what) = self.check_one(cache, out, hash, &batch.allowed, image)? {
                    found.push(Violation {
                        ops: batch.ops.into(),
                        phase: batch.phase.into(),
                        source: 0,
                        fence: s.fence - batch.phase_start,
                        lines: choice,
                        what,
                    });
                }
            }
            // Fences with nothing new durable between them leave the same
            // image to recover.
            if self.config.recovery && sources.insert(durable) {
                found.extend(self.recovery(cache, out, &batch, s)?);
            }
        }
        out.violations.extend(found);
        Ok(())
    }

    /// Recovers the durable image of `point` under a recorder and checks
    /// every bounded crash image of each fence of that recovery against
    /// the states the point itself allows.
    fn recovery(
        &self,
        cache: &mut Cache,
        out: &mut Summary,
        batch: &Batch<'_>,
        point: &CrashState,
    ) -> Result<Vec<Violation>> {
        write_image(&self.checker.source, self.image_for((&point.durable, &[])))?;
        let rec = Arc::new(Recorder::new());
        let captured: Arc<Mutex<Vec<CrashState>>> = Arc::default();
        let sink = captured.clone();
        rec.on_fence(move |cp| sink.lock().push(cp.to_state()));
        // A recovery that fails is reported with the point's own image;
        // only the crashes inside one that runs are explored here.
        drop(Volume::open_with(&self.checker.source, rec.clone()));
        let points = std::mem::take(&mut *captured.lock());
        let source = point.fence - batch.phase_start;
        let phase = format!("the recovery of {} fence {source}", batch.phase);
        let k = self.config.k;
        let mut found = Vec::new();
        for p in &points {
            let cp = p.point();
            out.bounded += cp.bounded_image_count(k);
            let durable = image_hash(&p.durable);
            let mut choices = Vec::new();
            cp.for_each_bounded(k, Prefixes::Distinct, |c| choices.push(c.to_vec()));
            out.checked += choices.len() as u64;
            for choice in choices {
                let landed = cp.landed_lines(&choice);
                let hash = patched_hash(&p.durable, durable, &landed);
                let image = (p.durable.as_slice(), landed.as_slice());
                if let Some(what) = self.check_one(cache, out, hash, &batch.allowed, image)? {
                    found.push(Violation {
                        ops: batch.ops.into(),
                        phase: phase.clone(),
                        source,
                        fence: p.fence,
                        lines: choice,
                        what,
                    });
                }
            }
        }
        Ok(found)
    }

    /// The image a check recovers in place of `image` (itself, unless a
    /// fault says otherwise).
    fn image_for<'b>(&'b self, image: Image<'b>) -> Image<'b> {
        match self.config.fault {
            Fault::None => image,
            Fault::RollBack => (&self.base.image, &[]),
        }
    }

    /// Checks one crash image (hashing to `hash`) against `allowed`: what
    /// is wrong with it, or `None`.
    fn check_one(
        &self,
        cache: &mut Cache,
        out: &mut Summary,
        hash: u64,
        allowed: &Allowed<'_>,
        image: Image<'_>,
    ) -> Result<Option<String>> {
        let result = match cache.get(&hash) {
            Some(r) => r.clone(),
            None => {
                let (r, raw_problems) = self.checker.recover(self.image_for(image))?;
                out.recovered += 1;
                out.raw_problems += u64::from(raw_problems);
                cache.insert(hash, r.clone());
                r
            }
        };
        Ok(match result {
            Err(what) => Some(what),
            Ok(tree) if allowed.iter().any(|(_, t)| **t == tree) => None,
            Ok(tree) => Some(
                allowed
                    .iter()
                    .map(|(name, t)| format!("vs {name}: {}", tree.differences(t, 4).join(", ")))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
        })
    }
}

/// A crash image: the durable image, and lines (offset, bytes) over it.
type Image<'a> = (&'a [u8], &'a [(usize, Vec<u8>)]);

/// Writes `image` to `path`: the durable bytes, then the landed lines.
fn write_image(path: &Path, (durable, landed): Image<'_>) -> Result<()> {
    write_file(path, durable)?;
    if landed.is_empty() {
        return Ok(());
    }
    let io = |cause| CrashtestError::Io {
        action: "writing",
        path: path.into(),
        cause,
    };
    let f = File::options().write(true).open(path).map_err(io)?;
    for (at, bytes) in landed {
        f.write_all_at(bytes, *at as u64).map_err(io)?;
    }
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |action, cause| CrashtestError::Io {
        action,
        path: path.into(),
        cause,
    };
    let f = File::options()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| io("opening", e))?;
    f.set_len(bytes.len() as u64).map_err(|e| io("sizing", e))?;
    f.write_all_at(bytes, 0).map_err(|e| io("writing", e))
}

/// The scratch files a crash image is checked in.
#[derive(Debug)]
struct Checker {
    /// Where a crash image is written and recovered.
    path: PathBuf,
    /// Where the image whose recovery is explored is written.
    source: PathBuf,
}

/// The name of the file the check after recovery makes.
const PROBE: &str = "crashtest-probe";

impl Checker {
    /// Recovers `image` and checks what does not depend on the states
    /// allowed: fsck reads the crash image and sees the entries recovery
    /// sees, the recovered file system takes a new file with data and
    /// reads it back, and after a clean close fsck finds nothing wrong.
    /// Returns the recovered tree, or what failed; and whether fsck found
    /// problems in the crash image itself. Those are not failures: a crash
    /// may leave what recovery repairs (a superblock copy torn in its
    /// update, say), and the image after recovery and a clean close is
    /// what must be clean.
    fn recover(&self, image: Image<'_>) -> Result<(Recovered, bool)> {
        write_image(&self.path, image)?;
        let path = self.path.as_path();
        let mut raw_problems = false;
        let recovered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Recovered {
            let raw = crate::fsck(path).map_err(|e| format!("fsck of the crash image: {e}"))?;
            raw_problems = !raw.problems.is_empty();
            let mut v = Volume::open_with(path, Arc::new(Hardware::new()))
                .map_err(|e| format!("recovery failed: {e}"))?;
            let tree = Tree::of(&v);
            if raw.entries != tree.entries() {
                return Err(format!(
                    "fsck of the crash image sees {} entries, recovery {}",
                    raw.entries,
                    tree.entries()
                ));
            }
            keep_working(&mut v)?;
            v.close()
                .map_err(|e| format!("the recovered file system did not close: {e}"))?;
            let report =
                crate::fsck(path).map_err(|e| format!("fsck after recovery and close: {e}"))?;
            if let Some(p) = report.problems.first() {
                return Err(format!(
                    "fsck after recovery and a clean close: {p} ({} problems)",
                    report.problems.len()
                ));
            }
            Ok(tree)
        }))
        .unwrap_or_else(|panic| {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            Err(format!("panicked: {why}"))
        });
        Ok((recovered, raw_problems))
    }
}

/// A recovered volume still works: a new file takes a page of data,
/// reads it back, and leaves the rest of the tree as it was.
fn keep_working(v: &mut Volume) -> std::result::Result<(), String> {
    v.attach_client(ME.client, None, Protection::Off, None);
    let before = Tree::of(v);
    let len = PAGE + 10;
    let write = Action::Write(PROBE, Some(0), len, 0x77);
    let refused = perform(v, &write, &mut |_| {});
    if let Some(e) = refused {
        return Err(format!("writing a new file after recovery failed: {e}"));
    }
    let after = Tree::of(v);
    let want: Vec<u8> = (0..len).map(|p| pattern(0x77, p)).collect();
    match after.0.get(PROBE) {
        Some(n) if n.data == want && n.nlink == 1 => {}
        Some(_) => return Err("a file written after recovery reads back wrong".into()),
        None => return Err("a file created after recovery is missing".into()),
    }
    // The root's own attributes may change with the new entry.
    let (mut rest, mut before) = (after, before);
    for t in [&mut rest, &mut before] {
        t.0.remove(PROBE);
        t.0.remove("");
    }
    if rest != before {
        return Err(format!(
            "writing a new file after recovery changed the tree: {}",
            rest.differences(&before, 4).join(", ")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
