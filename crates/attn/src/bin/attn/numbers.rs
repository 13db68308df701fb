//! The command line's numbers: counts of things (batch, heads, tokens, runs, threads) read so
//! that a bad value is an error naming what is allowed, never "unexpected argument", a silent
//! substitute or a hang.

/// The most CPU worker threads `--threads` takes: a pool is started before anything runs, and
/// one of 100,000 threads spent minutes starting them.
pub const MAX_THREADS: usize = 1024;

/// A whole number, written as digits (`4096`) or in integral scientific notation (`1e6`,
/// `2.5e3`), as a user copies sizes from a paper.
fn whole(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let bad = || format!("expected a whole number (e.g. 4096 or 1e6), got `{text}`");
    if t.starts_with('-') {
        return Err(format!("expected a whole number, not a negative one, got `{text}`"));
    }
    let too_big = || format!("`{text}` is larger than this machine's counts ({})", usize::MAX);
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t.parse().map_err(|_| too_big());
    }
    let (mantissa, exponent) = t.split_once(['e', 'E']).ok_or_else(bad)?;
    let exponent: u32 = exponent.parse().map_err(|_| bad())?;
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    // The mantissa's fraction digits must fit inside the exponent: 2.5e3 is 2500, 2.5e0 is not whole.
    let shift = exponent.checked_sub(frac.len() as u32).ok_or_else(bad)?;
    let base: usize = digits.parse().map_err(|_| too_big())?;
    10usize.checked_pow(shift).and_then(|p| base.checked_mul(p)).ok_or_else(too_big)
}

/// A count of at least 1 (`--batch`, `--seq`, `--iters`, ...).
pub fn count(text: &str) -> Result<usize, String> {
    match whole(text)? {
        0 => Err(format!("expected at least 1, got `{text}`")),
        n => Ok(n),
    }
}

/// A count that may be 0 (`--warmup`, `--check-rows`).
pub fn count_or_zero(text: &str) -> Result<usize, String> {
    whole(text)
}

/// `--threads`: 1 to [`MAX_THREADS`].
pub fn threads(text: &str) -> Result<usize, String> {
    let n = whole(text)?;
    if (1..=MAX_THREADS).contains(&n) {
        return Ok(n);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Err(format!("expected 1 to {MAX_THREADS} worker threads (this machine has {cores} cores), got `{text}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_take_digits_and_integral_scientific_notation() {
        assert_eq!(count("4096"), Ok(4096));
        assert_eq!(count("1e6"), Ok(1_000_000));
        assert_eq!(count("2.5e3"), Ok(2500));
        assert_eq!(count(" 7 "), Ok(7));
        assert_eq!(count_or_zero("0"), Ok(0));
        assert_eq!(threads("8"), Ok(8));
    }

    #[test]
    fn bad_counts_say_what_is_allowed() {
        for (text, says) in [
            ("-1", "not a negative one"),
            ("0", "at least 1"),
            ("abc", "whole number"),
            ("2.5", "whole number"),
            ("2.55e1", "whole number"),
            ("1e", "whole number"),
            ("1e99", "larger than"),
            ("99999999999999999999", "larger than"),
        ] {
            let e = count(text).unwrap_err();
            assert!(e.contains(says) && e.contains(text.trim()), "{text}: {e}");
        }
        for text in ["0", "100000", "-3"] {
            let e = threads(text).unwrap_err();
            assert!(e.contains("1 to 1024") || e.contains("negative"), "{text}: {e}");
        }
    }
}
