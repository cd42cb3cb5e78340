//! Byte sizes as people write them: `64M`, `4G`, `512KiB`, `1048576`.

/// Parses a size: a whole number optionally followed by `K`, `M`, `G`, `T`
/// or `P` (powers of 1024), optionally followed by `iB` or `B`. Case does
/// not matter. Returns a sentence saying what is wrong otherwise.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits == 0 {
        return Err(format!(
            "size {text:?} does not start with a number (try 64M or 4G)"
        ));
    }
    let number: u64 = t[..digits]
        .parse()
        .map_err(|_| format!("size {text:?} is too large"))?;
    let unit = t[digits..].trim().to_ascii_lowercase();
    let unit = unit
        .strip_suffix("ib")
        .or_else(|| unit.strip_suffix('b'))
        .unwrap_or(&unit);
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        "p" => 50,
        _ => {
            return Err(format!(
                "size {text:?} has an unknown unit (use K, M, G, T or P)"
            ))
        }
    };
    number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {text:?} is too large"))
}

/// Formats a byte count with a binary unit, e.g. `64.0 MiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("4g"), Ok(4 << 30));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("2MB"), Ok(2 << 20));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size(" 1T "), Ok(1 << 40));
    }

    #[test]
    fn bad_sizes_get_a_sentence() {
        for bad in [
            "",
            "M",
            "-1G",
            "1.5G",
            "12Q",
            "99999999999999999999",
            "16384P",
        ] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.starts_with("size "), "{bad:?}: {e}");
        }
    }

    #[test]
    fn sizes_format_readably() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(64 << 20), "64.0 MiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
    }
}
