//! Byte counts as people read and write them: `1.23 GiB` out, `6G` / `512MiB` / `1.5g` in.

const MIB: u64 = 1 << 20;

/// `1.23 GiB`, `456.7 MiB`, `12 KiB`.
pub fn fmt_bytes(b: u64) -> String {
    let f = b as f64;
    if f >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", f / (1u64 << 30) as f64)
    } else if f >= MIB as f64 {
        format!("{:.1} MiB", f / MIB as f64)
    } else {
        format!("{} KiB", b / 1024)
    }
}

/// Parses `6G`, `512M`, `3GiB`, `1.5g`, `123456` (bytes).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let x: f64 =
        num.parse().map_err(|_| format!("{s:?} is not a size; write e.g. 6G, 512M or 3GiB"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1u64,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => return Err(format!("unknown size unit {u:?} in {s:?}; use K, M, G or T")),
    };
    if !(x.is_finite() && x > 0.0) {
        return Err(format!("size {s:?} must be positive"));
    }
    Ok((x * mult as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_bytes("6G"), Ok(6 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5g"), Ok(3 << 29));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("3X").is_err());
    }

    #[test]
    fn sizes_print_in_the_largest_unit_under_them() {
        assert_eq!(fmt_bytes(3 << 29), "1.50 GiB");
        assert_eq!(fmt_bytes(456 * MIB + MIB / 2), "456.5 MiB");
        assert_eq!(fmt_bytes(12 * 1024), "12 KiB");
    }
}
