//! Sizes and durations as people write them (`4M`, `1GiB`, `90s`, `7d`), and bytes as people
//! read them: what every command line of strait parses and prints.

use anyhow::{bail, Context, Result};

/// Parse a size such as `4M`, `128K`, `1G`, `1GiB` or `4096`.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let num_end = lower
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(lower.len());
    let (num, unit) = lower.split_at(num_end);
    let n: f64 = num
        .parse()
        .with_context(|| format!("size {s:?}: not a number"))?;
    let mult: u64 = match unit.trim() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => bail!("size {s:?}: unknown unit {other:?} (use K, M, G or T)"),
    };
    if n < 0.0 {
        bail!("size {s:?} is negative");
    }
    Ok((n * mult as f64) as u64)
}

/// Parse a duration such as `7d`, `12h`, `30m`, `90s`, `250ms` (or `0`) into milliseconds.
pub fn parse_duration_ms(s: &str) -> Result<u64> {
    let t = s.trim();
    if t == "0" {
        return Ok(0);
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .with_context(|| format!("{s:?} is not a duration (e.g. 7d, 12h, 30m, 90s)"))?;
    let mul: u64 = match unit.trim() {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "" => bail!("{s:?}: give a unit (ms, s, m, h, d)"),
        u => bail!("{s:?}: unknown unit {u:?} (ms, s, m, h, d)"),
    };
    n.checked_mul(mul)
        .with_context(|| format!("{s:?} is too long"))
}

/// `n` bytes in the largest binary unit that keeps it at 1 or more (`4.0 MiB`).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4M").unwrap(), 4 << 20);
        assert_eq!(parse_size("128K").unwrap(), 128 << 10);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("4Q").is_err());
        assert!(parse_size("big").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("1h").unwrap(), 3_600_000);
        assert_eq!(parse_duration_ms("90s").unwrap(), 90_000);
        assert_eq!(parse_duration_ms("250ms").unwrap(), 250);
        assert_eq!(parse_duration_ms("0").unwrap(), 0);
        assert_eq!(parse_duration_ms("0s").unwrap(), 0);
        assert!(parse_duration_ms("5").is_err());
        assert!(parse_duration_ms("5y").is_err());
        assert!(parse_duration_ms("h").is_err());
    }
}
