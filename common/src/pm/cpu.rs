//! The x86-64 instructions that make stores persistent: cache-line write-back
//! or flush, the store fence, and non-temporal stores; and the copy that
//! reads take out of a mapping.
//!
//! Stable Rust has intrinsics for `clflush`, `sfence` and the streaming stores
//! but not for `clwb` or `clflushopt`, so those two are emitted with `asm!`,
//! and only after CPUID said the CPU has them.

use std::arch::asm;
use std::arch::x86_64::{__cpuid, __cpuid_count, __m128i, _mm_clflush, _mm_loadu_si128};
use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_storeu_si256, _mm256_stream_si256};
use std::arch::x86_64::{_mm_prefetch, _mm_sfence, _mm_stream_si128, _MM_HINT_T0};
use std::fmt;
use std::sync::OnceLock;

use super::CACHE_LINE;

/// The instruction used to write a cache line back to persistent memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushInstr {
    /// Writes the line back and may keep it cached (best: later reads hit).
    Clwb,
    /// Writes back and evicts the line; weakly ordered, so many can overlap.
    Clflushopt,
    /// Writes back and evicts; serialised with other flushes (slowest).
    Clflush,
}

impl FlushInstr {
    /// The best instruction this CPU offers, detected once from CPUID.
    pub fn detect() -> FlushInstr {
        static DETECTED: OnceLock<FlushInstr> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            // CPUID leaf 7, sub-leaf 0: EBX bit 24 is CLWB, bit 23 CLFLUSHOPT.
            // Leaf 0 reports the highest leaf; leaf 7 only exists when it is >= 7.
            let max_leaf = __cpuid(0).eax;
            let ebx = if max_leaf >= 7 {
                __cpuid_count(7, 0).ebx
            } else {
                0
            };
            if ebx & (1 << 24) != 0 {
                FlushInstr::Clwb
            } else if ebx & (1 << 23) != 0 {
                FlushInstr::Clflushopt
            } else {
                // CLFLUSH (leaf 1, EDX bit 19) is part of SSE2, which every
                // x86-64 CPU has.
                FlushInstr::Clflush
            }
        })
    }

    /// Writes back every cache line that overlaps `[addr, addr + len)`.
    ///
    /// # Safety
    ///
    /// `[addr, addr + len)` must lie inside one live mapping.
    pub(super) unsafe fn flush(self, addr: *const u8, len: usize) {
        if len == 0 {
            return;
        }
        let first = addr as usize & !(CACHE_LINE - 1);
        let end = addr as usize + len;
        let mut line = first;
        while line < end {
            let p = line as *const u8;
            match self {
                // SAFETY: `p` is the start of a cache line that overlaps the
                // caller's mapped range; a write-back of a mapped line has no
                // effect on memory contents. CPUID reported CLWB.
                FlushInstr::Clwb => unsafe {
                    asm!("clwb [{0}]", in(reg) p, options(nostack, preserves_flags));
                },
                // SAFETY: as above; CPUID reported CLFLUSHOPT.
                FlushInstr::Clflushopt => unsafe {
                    asm!("clflushopt [{0}]", in(reg) p, options(nostack, preserves_flags));
                },
                // SAFETY: as above; CLFLUSH is baseline on x86-64.
                FlushInstr::Clflush => unsafe { _mm_clflush(p) },
            }
            line += CACHE_LINE;
        }
    }
}

impl fmt::Display for FlushInstr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FlushInstr::Clwb => "clwb",
            FlushInstr::Clflushopt => "clflushopt",
            FlushInstr::Clflush => "clflush",
        })
    }
}

/// Orders every earlier flush and non-temporal store before every later store:
/// once it retires, those bytes are in the persistence domain.
pub(super) fn sfence() {
    // SAFETY: SFENCE has no operands and no memory-safety preconditions; SSE
    // is baseline on x86-64.
    unsafe { _mm_sfence() }
}

/// Copies `len` bytes from `src` to `dst` so that they are persistent after
/// the next [`sfence`]: the aligned body with streaming stores (32 bytes
/// at a time where the CPU has AVX2, which fills a cache line's
/// write-combining buffer in two stores instead of four, else 16), the
/// unaligned head and tail with ordinary stores followed by a write-back.
///
/// # Safety
///
/// `src` must be valid for reads and `dst` for writes of `len` bytes, and the
/// two ranges must not overlap.
pub(super) unsafe fn copy_nt(dst: *mut u8, src: *const u8, len: usize, flush: FlushInstr) {
    let wide = std::arch::is_x86_feature_detected!("avx2");
    // SAFETY: the caller's guarantees, and AVX2 is asked for only if the
    // CPU has it.
    unsafe { copy_nt_as(dst, src, len, flush, wide) }
}

/// [`copy_nt`], with 32-byte streaming stores if `wide`.
///
/// # Safety
///
/// As [`copy_nt`], and the CPU has AVX2 if `wide`.
unsafe fn copy_nt_as(dst: *mut u8, src: *const u8, len: usize, flush: FlushInstr, wide: bool) {
    let step = if wide { 32 } else { 16 };
    let head = dst.align_offset(step).min(len);
    let body = (len - head) & !(step - 1);
    let tail = len - head - body;
    // The three parts split `[0, len)` into disjoint ranges that the caller
    // guarantees are valid and non-overlapping; addresses are computed with
    // wrapping_add (safe) and only dereferenced inside those ranges.
    if head > 0 {
        // SAFETY: `[0, head)` is inside both caller-guaranteed ranges.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
        // SAFETY: `[dst, dst + head)` is inside the caller's mapping.
        unsafe { flush.flush(dst, head) };
    }
    let (d, s) = (dst.wrapping_add(head), src.wrapping_add(head));
    if wide {
        // SAFETY: `[head, head + body)` is inside both ranges, `d` is
        // 32-byte aligned and `body` a multiple of 32; the caller says the
        // CPU has AVX2.
        unsafe { stream_32(d, s, body) };
    } else {
        // SAFETY: as above, with 16-byte alignment and multiple.
        unsafe { stream_16(d, s, body) };
    }
    if tail > 0 {
        let i = head + body;
        // SAFETY: `[i, i + tail) = [len - tail, len)` is inside both ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.wrapping_add(i), dst.wrapping_add(i), tail) };
        // SAFETY: inside the caller's mapping, as above.
        unsafe { flush.flush(dst.wrapping_add(i), tail) };
    }
}

/// Streams `len` bytes from `src` to `dst` 16 bytes at a time.
///
/// # Safety
///
/// As [`copy_nt`], and `dst` is 16-byte aligned and `len` a multiple of 16.
unsafe fn stream_16(dst: *mut u8, src: *const u8, len: usize) {
    let mut i = 0;
    while i < len {
        // SAFETY: `i + 16 <= len`, so the 16 source bytes are readable;
        // loadu accepts any alignment.
        let v = unsafe { _mm_loadu_si128(src.wrapping_add(i) as *const __m128i) };
        // SAFETY: the 16 destination bytes are writable and `dst + i` is
        // 16-byte aligned.
        unsafe { _mm_stream_si128(dst.wrapping_add(i) as *mut __m128i, v) };
        i += 16;
    }
}

/// Streams `len` bytes from `src` to `dst` 32 bytes at a time.
///
/// # Safety
///
/// As [`copy_nt`], `dst` is 32-byte aligned, `len` a multiple of 32, and
/// the CPU has AVX2.
#[target_feature(enable = "avx2")]
unsafe fn stream_32(dst: *mut u8, src: *const u8, len: usize) {
    let mut i = 0;
    while i < len {
        // SAFETY: `i + 32 <= len`, so the 32 source bytes are readable;
        // loadu accepts any alignment.
        let v = unsafe { _mm256_loadu_si256(src.wrapping_add(i) as *const __m256i) };
        // SAFETY: the 32 destination bytes are writable and `dst + i` is
        // 32-byte aligned.
        unsafe { _mm256_stream_si256(dst.wrapping_add(i) as *mut __m256i, v) };
        i += 32;
    }
}

/// Below this many bytes [`copy_out`] leaves the copy to the C library
/// (names, small records): the slowdown below was measured on 4 KiB
/// copies, where the C library uses `rep movsb`.
const COPY_OUT_MIN: usize = 256;
// `copy_32` needs 32 bytes at least.
const _: () = assert!(COPY_OUT_MIN >= 32);

/// Copies `len` bytes from `src` to `dst` with ordinary loads and stores,
/// 32 bytes at a time where the CPU has AVX2, whatever the alignment of
/// either side. The C library's copy of larger blocks slows down two- to
/// fivefold on some CPUs (this machine's among them) when the destination
/// does not sit in its cache line where the source sits in its own, as an
/// application's buffer often does not against a page. This loop costs
/// the same at every offset, and about what the C library's copy costs
/// where the two are aligned.
///
/// # Safety
///
/// `src` must be valid for reads and `dst` for writes of `len` bytes, and the
/// two ranges must not overlap.
#[inline]
pub(super) unsafe fn copy_out(dst: *mut u8, src: *const u8, len: usize) {
    if len >= COPY_OUT_MIN && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the caller's guarantees; `len >= COPY_OUT_MIN >= 32`; the
        // CPU has AVX2.
        unsafe { copy_32(dst, src, len) }
    } else {
        // SAFETY: the caller's guarantees.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
    }
}

/// [`copy_out`] with AVX2: four 32-byte loads, then their four stores, per
/// 128 bytes; then 32 at a time, the last step ending at the end.
///
/// # Safety
///
/// As [`copy_out`], `len >= 32`, and the CPU has AVX2.
#[target_feature(enable = "avx2")]
unsafe fn copy_32(dst: *mut u8, src: *const u8, len: usize) {
    let s = |i: usize| src.wrapping_add(i) as *const __m256i;
    let d = |i: usize| dst.wrapping_add(i) as *mut __m256i;
    let mut i = 0;
    while i + 128 <= len {
        // SAFETY: here and in the seven blocks below, `i + 128 <= len`, so
        // the 32 bytes at each of `i`, `i + 32`, `i + 64` and `i + 96` are
        // readable at `src` and writable at `dst`; loadu and storeu accept
        // any alignment.
        let a = unsafe { _mm256_loadu_si256(s(i)) };
        // SAFETY: as above.
        let b = unsafe { _mm256_loadu_si256(s(i + 32)) };
        // SAFETY: as above.
        let c = unsafe { _mm256_loadu_si256(s(i + 64)) };
        // SAFETY: as above.
        let e = unsafe { _mm256_loadu_si256(s(i + 96)) };
        // SAFETY: as above.
        unsafe { _mm256_storeu_si256(d(i), a) };
        // SAFETY: as above.
        unsafe { _mm256_storeu_si256(d(i + 32), b) };
        // SAFETY: as above.
        unsafe { _mm256_storeu_si256(d(i + 64), c) };
        // SAFETY: as above.
        unsafe { _mm256_storeu_si256(d(i + 96), e) };
        i += 128;
    }
    // The rest in 32-byte steps, the last one ending at `len` (it may
    // overlap bytes already copied, with the same values): `len >= 32`.
    while i < len {
        let at = i.min(len - 32);
        // SAFETY: `at + 32 <= len`: readable at `src`, any alignment.
        let v = unsafe { _mm256_loadu_si256(s(at)) };
        // SAFETY: `at + 32 <= len`: writable at `dst`, any alignment.
        unsafe { _mm256_storeu_si256(d(at), v) };
        i += 32;
    }
}

/// Asks the CPU to start loading the cache line that holds `addr`, so a
/// later load of it hits (a hint). Any address will do: nothing is read
/// through it, and an address mapped to nothing is ignored.
#[inline]
pub fn prefetch(addr: usize) {
    // SAFETY: PREFETCHT0 never faults and changes no memory, whatever the
    // address; the pointer is not dereferenced.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(addr as *const i8) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `len` bytes that repeat only every 256, so a shifted copy shows.
    // Keeping the low byte of each value is the point.
    #[allow(clippy::cast_possible_truncation)]
    fn pattern(len: u32) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + 3) as u8).collect()
    }

    #[test]
    fn detection_is_stable_and_consistent_with_cpuinfo() {
        let a = FlushInstr::detect();
        assert_eq!(a, FlushInstr::detect());
        if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") {
            let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
            let has = |f: &str| flags.split_whitespace().any(|w| w == f);
            let expected = if has("clwb") {
                FlushInstr::Clwb
            } else if has("clflushopt") {
                FlushInstr::Clflushopt
            } else {
                FlushInstr::Clflush
            };
            assert_eq!(a, expected);
        }
    }

    #[test]
    fn the_copy_out_copies_every_alignment_and_length() {
        let src = pattern(1200);
        let lens = [
            0, 1, 31, 32, 33, 255, 256, 257, 287, 288, 300, 384, 415, 1000, 1024,
        ];
        for src_off in [0, 1, 8, 16, 33] {
            for dst_off in [0, 1, 8, 16, 31, 32, 63] {
                for len in lens {
                    let mut dst = vec![0u8; 1200];
                    // SAFETY: both buffers are live Vecs, the ranges are in
                    // bounds (offsets + len <= 1057 < 1200) and distinct.
                    unsafe {
                        copy_out(
                            dst.as_mut_ptr().wrapping_add(dst_off),
                            src.as_ptr().wrapping_add(src_off),
                            len,
                        )
                    };
                    assert_eq!(&dst[dst_off..dst_off + len], &src[src_off..src_off + len]);
                    assert!(dst[..dst_off].iter().all(|&b| b == 0));
                    assert!(dst[dst_off + len..].iter().all(|&b| b == 0));
                }
            }
        }
        // The vector copy itself, at the lengths the C library takes from
        // it above, where its last step overlaps.
        if std::arch::is_x86_feature_detected!("avx2") {
            for len in [32, 33, 63, 64, 95, 127, 128, 129, 200, 255] {
                let mut dst = vec![0u8; 300];
                // SAFETY: both buffers are live Vecs, the ranges are in
                // bounds (1 + 255 < 300) and distinct; `len >= 32`; the CPU
                // has AVX2.
                unsafe { copy_32(dst.as_mut_ptr().wrapping_add(1), src.as_ptr(), len) };
                assert_eq!(&dst[1..1 + len], &src[..len]);
                assert_eq!(dst[0], 0);
                assert!(dst[1 + len..].iter().all(|&b| b == 0));
            }
        }
    }

    #[test]
    fn non_temporal_copy_copies_every_alignment_and_length() {
        let src = pattern(300);
        let avx2 = std::arch::is_x86_feature_detected!("avx2");
        for wide in [false, avx2] {
            for dst_off in 0..33 {
                for len in [0, 1, 15, 16, 17, 31, 32, 33, 48, 64, 100, 255] {
                    let mut dst = vec![0u8; 320];
                    // SAFETY: both buffers are live Vecs, the ranges are in bounds
                    // (dst_off + len <= 288 < 320, len <= 300) and distinct.
                    // AVX2 is asked for only if the CPU has it.
                    unsafe {
                        copy_nt_as(
                            dst.as_mut_ptr().wrapping_add(dst_off),
                            src.as_ptr(),
                            len,
                            FlushInstr::detect(),
                            wide,
                        )
                    };
                    sfence();
                    assert_eq!(&dst[dst_off..dst_off + len], &src[..len]);
                    assert!(dst[..dst_off].iter().all(|&b| b == 0));
                    assert!(dst[dst_off + len..].iter().all(|&b| b == 0));
                }
            }
        }
    }
}
