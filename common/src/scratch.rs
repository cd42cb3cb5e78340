//! Short-lived word buffers for the hot paths (a commit's pages, a read's
//! map entries): on the stack for the few pages most requests name, on the
//! heap beyond.

/// Words a buffer holds on the stack.
const STACK_WORDS: usize = 16;

/// Runs `f` on `n` zeroed words, without allocating when `n` is small.
pub fn with_words<R>(n: usize, f: impl FnOnce(&mut [u64]) -> R) -> R {
    if n <= STACK_WORDS {
        let mut small = [0u64; STACK_WORDS];
        f(&mut small[..n])
    } else {
        f(&mut vec![0; n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_length_gets_exactly_that_many_zeroed_words() {
        for n in [0, 1, STACK_WORDS, STACK_WORDS + 1, 300] {
            let got = with_words(n, |w| {
                assert!(w.iter().all(|&x| x == 0));
                w.fill(7);
                w.len()
            });
            assert_eq!(got, n);
        }
    }
}
