//! Sizes as a user writes them: `4096`, `64K`, `256M`, `8G`.

/// Parses a byte count with an optional binary suffix (K, M, G or T, either
/// case, meaning 2^10 ... 2^40); `None` if it is not one or overflows.
pub fn parse(text: &str) -> Option<u64> {
    let t = text.trim();
    let (num, shift) = match t.char_indices().last()? {
        (i, 'K' | 'k') => (&t[..i], 10),
        (i, 'M' | 'm') => (&t[..i], 20),
        (i, 'G' | 'g') => (&t[..i], 30),
        (i, 'T' | 't') => (&t[..i], 40),
        _ => (t, 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_are_binary_and_either_case() {
        assert_eq!(parse("4096"), Some(4096));
        assert_eq!(parse("64k"), Some(64 << 10));
        assert_eq!(parse(" 256M "), Some(256 << 20));
        assert_eq!(parse("8G"), Some(8 << 30));
        assert_eq!(parse("1t"), Some(1 << 40));
    }

    #[test]
    fn non_sizes_and_overflows_are_none() {
        for bad in ["", "M", "-1", "1.5G", "12X", "99999999999T"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
