//! Redo records: one per metadata change, written to the operation log
//! before the change is applied, and replayed in order at recovery. Each
//! names inodes by number (offsets differ after a restart) and carries every
//! value the change chose (inode number, time), so replay is deterministic;
//! each is also idempotent, so replaying one already applied changes nothing.

use std::borrow::Cow;

use kucofs_common::codec::{Reader, Writer};
use kucofs_common::index::Ino;
pub use kucofs_common::proto::{Extents, SetAttrs};
use kucofs_common::Errno;

/// One metadata change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'a> {
    /// A new inode `ino` named `name` in directory `parent`.
    Create {
        parent: Ino,
        name: Cow<'a, [u8]>,
        ino: Ino,
        mode: u32,
        uid: u32,
        gid: u32,
        time: i64,
        /// A symlink's target (empty otherwise).
        target: Cow<'a, [u8]>,
    },
    /// A new name for existing inode `ino`.
    Link {
        parent: Ino,
        name: Cow<'a, [u8]>,
        ino: Ino,
        time: i64,
    },
    /// Removal of the name (of a file, symlink or empty directory `ino`).
    Unlink {
        parent: Ino,
        name: Cow<'a, [u8]>,
        ino: Ino,
        time: i64,
    },
    /// Move of `ino` from one name to another, replacing what was there.
    Rename {
        src_parent: Ino,
        src_name: Cow<'a, [u8]>,
        dst_parent: Ino,
        dst_name: Cow<'a, [u8]>,
        ino: Ino,
        time: i64,
    },
    /// Attribute change of `ino`.
    SetAttr {
        ino: Ino,
        attrs: SetAttrs,
        time: i64,
    },
    /// A copy-on-write commit: pages `first..` of file `ino` now live in
    /// the data pages `extents` name, in order, and the file is `size`
    /// bytes long. The data pages were persisted before this record.
    Write {
        ino: Ino,
        first: u64,
        extents: Extents,
        size: u64,
        time: i64,
    },
    /// File `ino` is cut or extended to `size` bytes; pages past the end
    /// are dropped.
    Truncate { ino: Ino, size: u64, time: i64 },
}

/// Operation codes in the log.
pub mod op {
    #![allow(missing_docs)]
    pub const CREATE: u16 = 1;
    pub const LINK: u16 = 2;
    pub const UNLINK: u16 = 3;
    pub const RENAME: u16 = 4;
    pub const SETATTR: u16 = 5;
    pub const WRITE: u16 = 6;
    pub const TRUNCATE: u16 = 7;
    /// Part of a retirement's batch of store records (not a [`Record`](super::Record)).
    pub const BATCH: u16 = 16;
    /// The end of a retirement's batch: its first entry's sequence number
    /// and its entry count.
    pub const BATCH_END: u16 = 17;
}

const NAME: usize = kucofs_common::index::NAME_MAX;
const PATH: usize = kucofs_common::index::PATH_MAX;

impl<'a> Record<'a> {
    /// The record with its byte strings copied, free of what it borrowed.
    pub fn into_owned(self) -> Record<'static> {
        let own = |c: Cow<'a, [u8]>| Cow::Owned(c.into_owned());
        match self {
            Record::Create {
                parent,
                name,
                ino,
                mode,
                uid,
                gid,
                time,
                target,
            } => Record::Create {
                parent,
                name: own(name),
                ino,
                mode,
                uid,
                gid,
                time,
                target: own(target),
            },
            Record::Link {
                parent,
                name,
                ino,
                time,
            } => Record::Link {
                parent,
                name: own(name),
                ino,
                time,
            },
            Record::Unlink {
                parent,
                name,
                ino,
                time,
            } => Record::Unlink {
                parent,
                name: own(name),
                ino,
                time,
            },
            Record::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
                ino,
                time,
            } => Record::Rename {
                src_parent,
                src_name: own(src_name),
                dst_parent,
                dst_name: own(dst_name),
                ino,
                time,
            },
            Record::SetAttr { ino, attrs, time } => Record::SetAttr { ino, attrs, time },
            Record::Write {
                ino,
                first,
                extents,
                size,
                time,
            } => Record::Write {
                ino,
                first,
                extents,
                size,
                time,
            },
            Record::Truncate { ino, size, time } => Record::Truncate { ino, size, time },
        }
    }

    /// True if applying the record may allocate index items (entries,
    /// inodes, a directory's table, block-map nodes); removals, attribute
    /// changes and truncation only unlink and retire.
    pub fn allocates(&self) -> bool {
        !matches!(
            self,
            Record::Unlink { .. } | Record::SetAttr { .. } | Record::Truncate { .. }
        )
    }

    /// The record's operation code.
    pub fn op(&self) -> u16 {
        match self {
            Record::Create { .. } => op::CREATE,
            Record::Link { .. } => op::LINK,
            Record::Unlink { .. } => op::UNLINK,
            Record::Rename { .. } => op::RENAME,
            Record::SetAttr { .. } => op::SETATTR,
            Record::Write { .. } => op::WRITE,
            Record::Truncate { .. } => op::TRUNCATE,
        }
    }

    /// Appends the payload encoding to `out`: names with a one-byte
    /// length and a symlink's target with a two-byte one, so that a create
    /// with a short name fits one cache line with its log entry header.
    /// `ENAMETOOLONG` for a name or target longer than those lengths hold
    /// (Kfs refuses such names before it logs anything).
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), Errno> {
        let mut w = Writer(out);
        match self {
            Record::Create {
                parent,
                name,
                ino,
                mode,
                uid,
                gid,
                time,
                target,
            } => {
                w.u64(parent.get());
                w.bytes8(name)?;
                w.u64(ino.get());
                w.u32(*mode);
                w.u32(*uid);
                w.u32(*gid);
                w.u64(time.cast_unsigned());
                w.bytes16(target)?;
            }
            Record::Link {
                parent,
                name,
                ino,
                time,
            }
            | Record::Unlink {
                parent,
                name,
                ino,
                time,
            } => {
                w.u64(parent.get());
                w.bytes8(name)?;
                w.u64(ino.get());
                w.u64(time.cast_unsigned());
            }
            Record::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
                ino,
                time,
            } => {
                w.u64(src_parent.get());
                w.bytes8(src_name)?;
                w.u64(dst_parent.get());
                w.bytes8(dst_name)?;
                w.u64(ino.get());
                w.u64(time.cast_unsigned());
            }
            Record::SetAttr { ino, attrs, time } => {
                w.u64(ino.get());
                attrs.encode(&mut w);
                w.u64(time.cast_unsigned());
            }
            Record::Write {
                ino,
                first,
                extents,
                size,
                time,
            } => {
                w.u64(ino.get());
                w.u64(*first);
                w.u64(*size);
                w.u64(time.cast_unsigned());
                extents.encode(&mut w);
            }
            Record::Truncate { ino, size, time } => {
                w.u64(ino.get());
                w.u64(*size);
                w.u64(time.cast_unsigned());
            }
        }
        Ok(())
    }

    /// Decodes a payload of operation `op`; `EPROTO` if it is malformed.
    pub fn decode(op: u16, payload: &'a [u8]) -> Result<Record<'a>, Errno> {
        let mut r = Reader::new(payload);
        let rec = match op {
            op::CREATE => Record::Create {
                parent: Ino::new(r.u64()?),
                name: Cow::Borrowed(r.bytes8(NAME)?),
                ino: Ino::new(r.u64()?),
                mode: r.u32()?,
                uid: r.u32()?,
                gid: r.u32()?,
                time: r.u64()?.cast_signed(),
                target: Cow::Borrowed(r.bytes16(PATH)?),
            },
            op::LINK | op::UNLINK => {
                let parent = Ino::new(r.u64()?);
                let name = Cow::Borrowed(r.bytes8(NAME)?);
                let ino = Ino::new(r.u64()?);
                let time = r.u64()?.cast_signed();
                if op == op::LINK {
                    Record::Link {
                        parent,
                        name,
                        ino,
                        time,
                    }
                } else {
                    Record::Unlink {
                        parent,
                        name,
                        ino,
                        time,
                    }
                }
            }
            op::RENAME => Record::Rename {
                src_parent: Ino::new(r.u64()?),
                src_name: Cow::Borrowed(r.bytes8(NAME)?),
                dst_parent: Ino::new(r.u64()?),
                dst_name: Cow::Borrowed(r.bytes8(NAME)?),
                ino: Ino::new(r.u64()?),
                time: r.u64()?.cast_signed(),
            },
            op::SETATTR => Record::SetAttr {
                ino: Ino::new(r.u64()?),
                attrs: SetAttrs::decode(&mut r)?,
                time: r.u64()?.cast_signed(),
            },
            op::WRITE => Record::Write {
                ino: Ino::new(r.u64()?),
                first: r.u64()?,
                size: r.u64()?,
                time: r.u64()?.cast_signed(),
                extents: Extents::decode(&mut r)?,
            },
            op::TRUNCATE => Record::Truncate {
                ino: Ino::new(r.u64()?),
                size: r.u64()?,
                time: r.u64()?.cast_signed(),
            },
            _ => return Err(Errno::EPROTO),
        };
        if !r.done() {
            return Err(Errno::EPROTO);
        }
        Ok(rec)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn name() -> impl Strategy<Value = Cow<'static, [u8]>> {
        proptest::collection::vec(any::<u8>(), 0..=255).prop_map(Cow::Owned)
    }

    fn ino() -> impl Strategy<Value = Ino> {
        any::<u64>().prop_map(Ino::new)
    }

    fn record() -> impl Strategy<Value = Record<'static>> {
        prop_oneof![
            (
                ino(),
                name(),
                ino(),
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
                any::<i64>(),
                name()
            )
                .prop_map(|(parent, name, ino, mode, uid, gid, time, target)| {
                    Record::Create {
                        parent,
                        name,
                        ino,
                        mode,
                        uid,
                        gid,
                        time,
                        target,
                    }
                }),
            (ino(), name(), ino(), any::<i64>()).prop_map(|(parent, name, ino, time)| {
                Record::Link {
                    parent,
                    name,
                    ino,
                    time,
                }
            }),
            (ino(), name(), ino(), any::<i64>()).prop_map(|(parent, name, ino, time)| {
                Record::Unlink {
                    parent,
                    name,
                    ino,
                    time,
                }
            }),
            (ino(), name(), ino(), name(), ino(), any::<i64>()).prop_map(
                |(src_parent, src_name, dst_parent, dst_name, ino, time)| {
                    Record::Rename {
                        src_parent,
                        src_name,
                        dst_parent,
                        dst_name,
                        ino,
                        time,
                    }
                }
            ),
            (
                ino(),
                any::<Option<u32>>(),
                any::<Option<u32>>(),
                any::<Option<i64>>(),
                any::<i64>()
            )
                .prop_map(|(ino, mode, uid, atime, time)| Record::SetAttr {
                    ino,
                    attrs: SetAttrs {
                        mode,
                        uid,
                        gid: None,
                        atime,
                        mtime: Some(5)
                    },
                    time
                }),
            (
                ino(),
                any::<u64>(),
                proptest::collection::vec((0u64..1 << 40, 1u32..300), 0..=8),
                any::<u64>(),
                any::<i64>()
            )
                .prop_map(|(ino, first, runs, size, time)| {
                    let mut extents = Extents::new();
                    for (start, len) in runs {
                        extents.push(kucofs_common::format::PageNo::new(start * 1024), len);
                    }
                    Record::Write {
                        ino,
                        first,
                        extents,
                        size,
                        time,
                    }
                }),
            (ino(), any::<u64>(), any::<i64>()).prop_map(|(ino, size, time)| Record::Truncate {
                ino,
                size,
                time
            }),
        ]
    }

    fn create(name: &[u8], target: &[u8]) -> Record<'static> {
        Record::Create {
            parent: Ino::new(1),
            name: Cow::Owned(name.to_vec()),
            ino: Ino::new(2),
            mode: libc::S_IFREG | 0o644,
            uid: 0,
            gid: 0,
            time: 3,
            target: Cow::Owned(target.to_vec()),
        }
    }

    #[test]
    fn the_commonest_entries_fit_one_line_with_their_header() {
        let line = |rec: Record<'_>| {
            let mut buf = Vec::new();
            rec.encode(&mut buf).unwrap();
            buf.len() + kucofs_common::format::LOG_ENTRY_HEADER_SIZE
        };
        // A create with a 9-byte name, an unlink of a 23-byte one, a
        // one-page write: 64 bytes each, and one byte more is a second line.
        assert_eq!(line(create(b"123456789", b"")), 64);
        let unlink = |name: &[u8]| Record::Unlink {
            parent: Ino::new(1),
            name: Cow::Owned(name.to_vec()),
            ino: Ino::new(2),
            time: 3,
        };
        assert_eq!(line(unlink(&[b'u'; 23])), 64);
        assert_eq!(line(unlink(&[b'u'; 24])), 65);
        let mut one = Extents::new();
        one.push(kucofs_common::format::PageNo::new(1 << 40), 1);
        let write = Record::Write {
            ino: Ino::new(2),
            first: 7,
            extents: one,
            size: 8 * 4096,
            time: 3,
        };
        assert!(line(write) <= 64);
    }

    #[test]
    fn a_name_or_target_too_long_for_its_length_is_refused() {
        let mut buf = Vec::new();
        let long = create(&[b'a'; 256], b"");
        assert_eq!(long.encode(&mut buf), Err(Errno::ENAMETOOLONG));
        let far = create(b"x", &vec![b'/'; 65_536]);
        assert_eq!(far.encode(&mut Vec::new()), Err(Errno::ENAMETOOLONG));
        assert!(create(&[b'a'; 255], &vec![b'/'; PATH])
            .encode(&mut buf)
            .is_ok());
    }

    proptest! {
        #[test]
        fn records_round_trip(rec in record()) {
            let mut buf = Vec::new();
            rec.encode(&mut buf).unwrap();
            prop_assert_eq!(Record::decode(rec.op(), &buf), Ok(rec.clone()));
            // Any truncation or extension is refused, never misread.
            for cut in 0..buf.len() {
                prop_assert_eq!(Record::decode(rec.op(), &buf[..cut]), Err(Errno::EPROTO));
            }
            buf.push(0);
            prop_assert_eq!(Record::decode(rec.op(), &buf), Err(Errno::EPROTO));
        }

        #[test]
        fn garbage_never_panics(op in 0u16..10, bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Record::decode(op, &bytes);
        }
    }
}
