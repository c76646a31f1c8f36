//! Capped exponential backoff with jitter, the one shape every retry in the
//! service takes (failed operations, failed reconciles, failed sweeps), so that
//! things that failed together do not come back together.

use std::time::Duration;

/// The wait after the `failures`-th failure in a row (1 = the first): `first`
/// doubled per failure, at most `cap`, then scaled by jitter to between half and
/// all of it (`unit` in [0, 1) picks where).
pub fn exponential(failures: u32, first: Duration, cap: Duration, unit: f64) -> Duration {
    let doublings = failures.saturating_sub(1).min(30);
    let nominal = first.saturating_mul(1u32 << doublings).min(cap);
    nominal.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
}

/// A random number in [0, 1) from the operating system (0.5 if it has none).
pub fn unit_random() -> f64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        return 0.5;
    }
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_first_to_the_cap_within_jitter() {
        let (first, cap) = (Duration::from_secs(1), Duration::from_secs(60));
        let nominal: Vec<Duration> = (1..=8).map(|n| exponential(n, first, cap, 1.0)).collect();
        let secs: Vec<u64> = nominal.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(exponential(3, first, cap, 0.0), Duration::from_secs(2), "jitter halves at most");
        assert_eq!(exponential(u32::MAX, first, cap, 1.0), cap, "no overflow");
        assert_eq!(exponential(0, first, cap, 1.0), first, "0 counts as the first failure");
        let unit = unit_random();
        assert!((0.0..1.0).contains(&unit));
    }
}
