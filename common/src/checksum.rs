//! CRC-32C, the checksum of every on-media structure and request.
//!
//! Most checksummed things are short: a log entry of one cache line, a
//! request of a few dozen bytes. For those the `crc32c` crate's set-up
//! (it splits its input into three interleaved streams) costs more than
//! the bytes: a plain loop of the CPU's `crc32` instruction, eight bytes a
//! step, is about three times faster below `SHORT` bytes. Longer inputs,
//! and CPUs without SSE 4.2, go to the crate. Both compute the same
//! function, so either may check what the other made.

/// Inputs up to this many bytes take the plain loop.
const SHORT: usize = 256;

/// CRC-32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// CRC-32C of the bytes whose CRC-32C is `crc` followed by `data`.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    if data.len() <= SHORT && std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE 4.2, the only feature `short` needs.
        unsafe { short(crc, data) }
    } else {
        crc32c::crc32c_append(crc, data)
    }
}

/// The plain loop: the bit-reflected CRC-32C register, inverted on entry
/// and exit as the crate's is.
#[target_feature(enable = "sse4.2")]
fn short(crc: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut c = u64::from(!crc);
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        c = _mm_crc32_u64(c, u64::from_le_bytes(b));
    }
    // The 64-bit form of the instruction leaves the register in the low 32
    // bits and zeros above them: nothing is lost.
    #[allow(clippy::cast_possible_truncation)]
    let mut c = c as u32;
    for &b in words.remainder() {
        c = _mm_crc32_u8(c, b);
    }
    !c
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn known_values() {
        // The standard check value of CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c_append(crc32c(b"1234"), b"56789"), 0xe306_9283);
    }

    proptest! {
        #[test]
        fn short_inputs_agree_with_the_crate(
            crc in any::<u32>(),
            data in proptest::collection::vec(any::<u8>(), 0..=SHORT + 40),
        ) {
            prop_assert_eq!(crc32c_append(crc, &data), crc32c::crc32c_append(crc, &data));
        }
    }
}
