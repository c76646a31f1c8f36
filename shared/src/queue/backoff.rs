//! Retry policy: capped exponential backoff with jitter, and the attempt limit.

use std::time::Duration;

/// How failed operations are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts (claims) before an operation is dead-lettered as `failed`.
    pub max_attempts: i32,
    /// Delay after the first failure, before jitter.
    pub base: Duration,
    /// Upper bound for any delay.
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { max_attempts: 8, base: Duration::from_secs(1), cap: Duration::from_secs(300) }
    }
}

impl RetryPolicy {
    /// The delay after failed attempt number `attempts` (1-based): `base · 2^(n−1)`,
    /// capped, then scaled by a random factor in [0.5, 1.0) so that retries of many
    /// operations that failed together spread out.
    pub fn delay(&self, attempts: i32) -> Duration {
        let exponent = u32::try_from(attempts.saturating_sub(1)).unwrap_or(0).min(30);
        let raw = self.base.saturating_mul(1u32 << exponent).min(self.cap);
        raw.mul_f64(0.5 + 0.5 * unit_random())
    }
}

/// A random number in [0, 1) from the operating system.
fn unit_random() -> f64 {
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
    fn delays_grow_exponentially_within_jitter_and_stop_at_the_cap() {
        let policy = RetryPolicy { max_attempts: 10, base: Duration::from_millis(100), cap: Duration::from_secs(2) };
        for attempt in 1..=10 {
            let nominal = Duration::from_millis(100 * (1u64 << (attempt - 1))).min(Duration::from_secs(2));
            let delay = policy.delay(attempt);
            assert!(delay >= nominal / 2 && delay < nominal, "attempt {attempt}: {delay:?} vs {nominal:?}");
        }
        assert!(policy.delay(i32::MAX) <= Duration::from_secs(2));
    }
}
