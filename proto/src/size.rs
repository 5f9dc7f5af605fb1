//! Sizes as people write them: `4M`, `64k`, `1.5G`, `16GB`, `1048576`. K/M/G/T (and KiB, MiB,
//! GiB, TiB) are binary, as `lfs setstripe -S 4M` means; KB/MB/GB/TB are decimal, as disk and
//! network figures are quoted. Every size the command line, the mount's layout attribute and
//! the testbed's experiments take goes through [`parse_size`].

/// The largest size taken: beyond it a byte count no longer fits a file offset.
pub const MAX_SIZE: u64 = 1 << 62;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("not a size: {0:?}")]
    NotANumber(String),
    #[error("unknown unit {unit:?} in {text:?} (K, M, G, T are binary; KB, MB, GB, TB decimal)")]
    UnknownUnit { unit: String, text: String },
    #[error("size {0:?} is too large")]
    TooLarge(String),
}

/// Parses a size in bytes.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim() {
        "" | "B" | "b" => 1,
        "K" | "k" | "KiB" => 1 << 10,
        "M" | "m" | "MiB" => 1 << 20,
        "G" | "g" | "GiB" => 1 << 30,
        "T" | "t" | "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        u => {
            return Err(SizeError::UnknownUnit {
                unit: u.to_owned(),
                text: text.to_owned(),
            })
        }
    };
    let too_large = || SizeError::TooLarge(text.to_owned());
    let bytes = if num.contains('.') {
        let n: f64 = num
            .parse()
            .map_err(|_| SizeError::NotANumber(text.to_owned()))?;
        let b = (n * mult as f64).round();
        if !b.is_finite() || b > MAX_SIZE as f64 {
            return Err(too_large());
        }
        b as u64
    } else {
        let n: u64 = num
            .parse()
            .map_err(|_| SizeError::NotANumber(text.to_owned()))?;
        n.checked_mul(mult).ok_or_else(too_large)?
    };
    if bytes > MAX_SIZE {
        return Err(too_large());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_decimal_units_mean_what_lfs_and_disk_figures_mean() {
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("16GB"), Ok(16_000_000_000));
        assert_eq!(parse_size("1.4TB"), Ok(1_400_000_000_000));
        assert_eq!(parse_size("1.5M"), Ok(3 << 19));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
    }

    #[test]
    fn bad_sizes_are_refused_by_name() {
        assert!(matches!(
            parse_size("4X"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(parse_size("M"), Err(SizeError::NotANumber(_))));
        assert!(parse_size("-1").is_err());
        assert!(matches!(
            parse_size("99999999T"),
            Err(SizeError::TooLarge(_))
        ));
        assert!(matches!(
            parse_size("1e30"),
            Err(SizeError::UnknownUnit { .. })
        ));
    }
}
