//! The little-endian field encoding shared by request records, redo
//! records and checkpoints: fixed-width integers, optional values as a
//! 0/1 flag and a value, byte strings as a `u32` length and the bytes (or,
//! where every byte counts, a `u8` or `u16` length).
//! Reading is bounds-checked throughout; any malformed input is `EPROTO`.

use crate::Errno;

/// Appends fields to a buffer.
#[derive(Debug)]
pub struct Writer<'a>(pub &'a mut Vec<u8>);

impl Writer<'_> {
    /// One byte.
    #[inline]
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    /// A `u16`.
    #[inline]
    pub fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// A `u32`.
    #[inline]
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// A `u64`.
    #[inline]
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// A flag, as a `u32` 0 or 1.
    #[inline]
    pub fn bool(&mut self, v: bool) {
        self.u32(u32::from(v));
    }
    /// A length-prefixed byte string.
    ///
    /// # Panics
    ///
    /// If `b` is 4 GiB or longer: callers bound their strings far below
    /// that (requests to `PATH_MAX`) before encoding.
    #[inline]
    pub fn bytes(&mut self, b: &[u8]) {
        self.u32(u32::try_from(b.len()).expect("a byte string field under 4 GiB"));
        self.0.extend_from_slice(b);
    }
    /// A byte string of at most 255 bytes with a `u8` length;
    /// `ENAMETOOLONG` (nothing written) if it is longer.
    #[inline]
    pub fn bytes8(&mut self, b: &[u8]) -> Result<(), Errno> {
        let n = u8::try_from(b.len()).map_err(|_| Errno::ENAMETOOLONG)?;
        self.u8(n);
        self.0.extend_from_slice(b);
        Ok(())
    }
    /// A byte string of at most 65,535 bytes with a `u16` length;
    /// `ENAMETOOLONG` (nothing written) if it is longer.
    #[inline]
    pub fn bytes16(&mut self, b: &[u8]) -> Result<(), Errno> {
        let n = u16::try_from(b.len()).map_err(|_| Errno::ENAMETOOLONG)?;
        self.u16(n);
        self.0.extend_from_slice(b);
        Ok(())
    }
    /// An optional `u32`.
    #[inline]
    pub fn opt32(&mut self, v: Option<u32>) {
        self.bool(v.is_some());
        self.u32(v.unwrap_or(0));
    }
    /// An optional `i64`.
    #[inline]
    pub fn opt64(&mut self, v: Option<i64>) {
        self.bool(v.is_some());
        self.u64(v.unwrap_or(0).cast_unsigned());
    }
}

/// Reads fields from a buffer.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, at: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], Errno> {
        let end = self.at.checked_add(n).ok_or(Errno::EPROTO)?;
        let s = self.buf.get(self.at..end).ok_or(Errno::EPROTO)?;
        self.at = end;
        Ok(s)
    }
    /// One byte.
    pub fn u8(&mut self) -> Result<u8, Errno> {
        Ok(self.take(1)?[0])
    }
    /// A `u16`.
    pub fn u16(&mut self) -> Result<u16, Errno> {
        let mut w = [0u8; 2];
        w.copy_from_slice(self.take(2)?);
        Ok(u16::from_le_bytes(w))
    }
    /// A `u32`.
    pub fn u32(&mut self) -> Result<u32, Errno> {
        let mut w = [0u8; 4];
        w.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(w))
    }
    /// A `u64`.
    pub fn u64(&mut self) -> Result<u64, Errno> {
        let mut w = [0u8; 8];
        w.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(w))
    }
    /// A flag; anything but 0 or 1 is malformed.
    pub fn bool(&mut self) -> Result<bool, Errno> {
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Errno::EPROTO),
        }
    }
    /// A length-prefixed byte string of at most `max` bytes.
    pub fn bytes(&mut self, max: usize) -> Result<&'a [u8], Errno> {
        let n = self.u32()? as usize;
        self.sized(n, max)
    }
    /// A byte string with a `u8` length, of at most `max` bytes.
    pub fn bytes8(&mut self, max: usize) -> Result<&'a [u8], Errno> {
        let n = usize::from(self.u8()?);
        self.sized(n, max)
    }
    /// A byte string with a `u16` length, of at most `max` bytes.
    pub fn bytes16(&mut self, max: usize) -> Result<&'a [u8], Errno> {
        let n = usize::from(self.u16()?);
        self.sized(n, max)
    }
    /// The `n` bytes a length just read announced, if `n <= max`.
    fn sized(&mut self, n: usize, max: usize) -> Result<&'a [u8], Errno> {
        if n > max {
            return Err(Errno::EPROTO);
        }
        self.take(n)
    }
    /// An optional `u32`.
    pub fn opt32(&mut self) -> Result<Option<u32>, Errno> {
        let some = self.bool()?;
        let v = self.u32()?;
        Ok(some.then_some(v))
    }
    /// An optional `i64`.
    pub fn opt64(&mut self) -> Result<Option<i64>, Errno> {
        let some = self.bool()?;
        let v = self.u64()?.cast_signed();
        Ok(some.then_some(v))
    }
    /// True once every byte was read.
    pub fn done(&self) -> bool {
        self.at == self.buf.len()
    }
}
