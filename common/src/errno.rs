//! POSIX error numbers as a type, so that every file-system result says
//! which errno it carries.

use std::fmt;
use std::io;

/// A POSIX errno.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

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
