//! Retry policy: capped exponential backoff with jitter, and the attempt limit.

use std::time::Duration;

/// How failed operations are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Expired leases (claimers that crashed or stalled on it) before an operation
    /// is dead-lettered as `failed`; reported failures are retried by their class.
    pub max_attempts: i32,
    /// Delay after the first failure, before jitter.
    pub base: Duration,
    /// Upper bound for any delay.
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { max_attempts: 8, base: Duration::from_secs(1), cap: Duration::from_secs(60) }
    }
}

impl RetryPolicy {
    /// The delay after failed attempt number `attempts` (1-based): `base · 2^(n−1)`,
    /// capped, then scaled by a random factor in [0.5, 1.0) so that retries of many
    /// operations that failed together spread out.
    pub fn delay(&self, attempts: i32) -> Duration {
        let failures = u32::try_from(attempts).unwrap_or(0);
        crate::backoff::exponential(failures, self.base, self.cap, crate::backoff::unit_random())
    }
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
