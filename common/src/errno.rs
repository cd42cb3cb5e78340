//! POSIX error numbers as a type, so that every file-system result says
//! which errno it carries.

use std::fmt;
use std::io;

/// A POSIX errno: a number in `1..=`[`Errno::MAX`], never 0 (success is
/// no errno) and never negative, so a value of this type always names a
/// failure a caller can hand to `io::Error::from_raw_os_error`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(i32);

impl Errno {
    /// The largest errno (Linux reserves `-4095..=-1` for errors in a
    /// system call's return value).
    pub const MAX: i32 = 4095;

    /// The errno `n`, or `None` if `n` is not in `1..=`[`Errno::MAX`].
    #[inline]
    pub const fn new(n: i32) -> Option<Errno> {
        if n >= 1 && n <= Errno::MAX {
            Some(Errno(n))
        } else {
            None
        }
    }

    /// The number.
    #[inline]
    pub const fn get(self) -> i32 {
        self.0
    }
}

macro_rules! errnos {
    ($($name:ident),* $(,)?) => {
        impl Errno {
            $(
                #[allow(missing_docs)]
                pub const $name: Errno = Errno(libc::$name);
            )*

            /// The symbolic name ("ENOENT"), if it is one of ours.
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $(libc::$name => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }
    };
}

errnos!(
    EPERM,
    ENOENT,
    EIO,
    EBADF,
    EAGAIN,
    ENOMEM,
    EACCES,
    EFAULT,
    EBUSY,
    ETXTBSY,
    EEXIST,
    EXDEV,
    ENOTDIR,
    EISDIR,
    EINVAL,
    ENFILE,
    EMFILE,
    EFBIG,
    ENOSPC,
    EROFS,
    EMLINK,
    ERANGE,
    ENAMETOOLONG,
    ENOSYS,
    ENOTEMPTY,
    ELOOP,
    EOVERFLOW,
    EPROTO,
    ESTALE,
    ENOTCONN,
    EOPNOTSUPP,
    E2BIG,
);

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "Errno({})", self.0),
        }
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", io::Error::from_raw_os_error(self.0))
    }
}

impl std::error::Error for Errno {}

impl From<Errno> for io::Error {
    fn from(e: Errno) -> io::Error {
        io::Error::from_raw_os_error(e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_numbers_in_range_are_errnos() {
        assert_eq!(Errno::new(0), None);
        assert_eq!(Errno::new(-1), None);
        assert_eq!(Errno::new(i32::MIN), None);
        assert_eq!(Errno::new(Errno::MAX + 1), None);
        assert_eq!(Errno::new(i32::MAX), None);
        assert_eq!(Errno::new(1), Some(Errno::EPERM));
        assert_eq!(Errno::new(libc::ENOENT), Some(Errno::ENOENT));
        assert_eq!(Errno::new(Errno::MAX).map(Errno::get), Some(Errno::MAX));
    }

    #[test]
    fn every_named_errno_is_in_range_and_round_trips() {
        for e in [Errno::EPERM, Errno::EIO, Errno::EOPNOTSUPP, Errno::EPROTO] {
            assert_eq!(Errno::new(e.get()), Some(e));
            assert!(e.name().is_some());
        }
        assert_eq!(format!("{:?}", Errno::new(4000).unwrap()), "Errno(4000)");
    }
}
