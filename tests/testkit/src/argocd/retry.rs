//! Argo CD's retry of a failed sync operation, as the operation asks for it
//! (`operation.retry`, copied from `spec.syncPolicy.retry` for automated syncs):
//! `limit` attempts more (negative: without limit), the n-th after
//! `backoff.duration × factor^(n-1)`, at most `backoff.maxDuration` (Argo CD's
//! defaults: 5 s, 2, 3 min). While it waits, the operation stays `Running` with
//! `retryCount` and `finishedAt` of the failed attempt, and a message saying when it
//! tries again. Without a retry strategy a failure is final. Pure, unit-tested.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

const DEFAULT_DURATION: Duration = Duration::from_secs(5);
const DEFAULT_FACTOR: u32 = 2;
const DEFAULT_MAX: Duration = Duration::from_secs(180);

/// An operation's retry strategy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Strategy {
    /// Attempts after the first; `None`: without limit.
    pub limit: Option<u64>,
    pub duration: Duration,
    pub factor: u32,
    pub max: Duration,
}

impl Strategy {
    /// The strategy of `operation.retry`; `None` when there is none (or its
    /// limit is 0).
    pub fn of(operation: &Value) -> Option<Strategy> {
        let retry = operation.get("retry").filter(|r| r.is_object())?;
        let limit = match retry.get("limit").and_then(Value::as_i64).unwrap_or(0) {
            0 => return None,
            n if n < 0 => None,
            n => Some(n.unsigned_abs()),
        };
        let backoff = retry.get("backoff").unwrap_or(&Value::Null);
        let duration = backoff.get("duration").and_then(Value::as_str).and_then(parse_duration);
        let factor = backoff.get("factor").and_then(Value::as_u64).and_then(|f| u32::try_from(f).ok());
        let max = backoff.get("maxDuration").and_then(Value::as_str).and_then(parse_duration);
        Some(Strategy {
            limit,
            duration: duration.unwrap_or(DEFAULT_DURATION),
            factor: factor.unwrap_or(DEFAULT_FACTOR),
            max: max.unwrap_or(DEFAULT_MAX),
        })
    }

    /// Whether attempt number `retry_count + 1` (after the first) may run.
    pub fn allows(&self, retry_count: u64) -> bool {
        self.limit.is_none_or(|limit| retry_count < limit)
    }

    /// The wait before retry number `n` (1-based).
    pub fn backoff(&self, n: u64) -> Duration {
        let mut wait = self.duration;
        for _ in 1..n {
            wait = wait.saturating_mul(self.factor);
            if wait >= self.max {
                return self.max;
            }
        }
        wait.min(self.max)
    }
}

/// A Go duration as Argo CD writes them: `5s`, `3m`, `1m30s`, `500ms`, `1h`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let number: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let part = match &rest[..unit] {
            "ms" => Duration::from_millis(number),
            "s" => Duration::from_secs(number),
            "m" => Duration::from_secs(number.checked_mul(60)?),
            "h" => Duration::from_secs(number.checked_mul(3600)?),
            _ => return None,
        };
        total = total.checked_add(part)?;
        rest = &rest[unit..];
    }
    Some(total)
}

/// How long until the waiting retry of `state` is due (zero: now); `None` when
/// the state is not waiting for a retry.
pub fn due_in(state: &Value, strategy: &Strategy, now: Timestamp) -> Option<Duration> {
    let count = state.get("retryCount").and_then(Value::as_u64).filter(|n| *n > 0)?;
    let failed_at: Timestamp = state.get("finishedAt").and_then(Value::as_str)?.parse().ok()?;
    let wait = strategy.backoff(count);
    let elapsed = now.as_second().saturating_sub(failed_at.as_second()).max(0).unsigned_abs();
    Some(wait.saturating_sub(Duration::from_secs(elapsed)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_duration("3m"), Some(Duration::from_secs(180)));
        assert_eq!(parse_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        for bad in ["", "5", "s", "5x", "-5s"] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_original_services_strategy_doubles_from_5_s_to_3_min_without_limit() {
        let operation =
            json!({"retry": {"limit": -1, "backoff": {"duration": "5s", "factor": 2, "maxDuration": "3m"}}});
        let strategy = Strategy::of(&operation).expect("a strategy");
        assert!(strategy.allows(1_000_000));
        let waits: Vec<u64> = (1..=8).map(|n| strategy.backoff(n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 180, 180]);
        assert_eq!(strategy.backoff(u64::MAX).as_secs(), 180);
    }

    #[test]
    fn limits_and_no_strategy() {
        assert_eq!(Strategy::of(&json!({})), None);
        assert_eq!(Strategy::of(&json!({"retry": {"limit": 0}})), None);
        let two = Strategy::of(&json!({"retry": {"limit": 2}})).expect("a strategy");
        assert!(two.allows(0) && two.allows(1) && !two.allows(2));
        assert_eq!((two.duration, two.factor, two.max), (DEFAULT_DURATION, DEFAULT_FACTOR, DEFAULT_MAX));
    }

    #[test]
    fn a_waiting_retry_is_due_after_its_backoff() {
        let strategy = Strategy::of(&json!({"retry": {"limit": -1}})).expect("a strategy");
        let state = json!({"retryCount": 2, "finishedAt": "2030-01-01T00:00:00Z"});
        let at = |s: &str| s.parse::<Timestamp>().expect("time");
        assert_eq!(due_in(&state, &strategy, at("2030-01-01T00:00:04Z")), Some(Duration::from_secs(6)));
        assert_eq!(due_in(&state, &strategy, at("2030-01-01T00:00:10Z")), Some(Duration::ZERO));
        assert_eq!(due_in(&json!({"finishedAt": "2030-01-01T00:00:00Z"}), &strategy, at("2030-01-01T00:00:10Z")), None);
    }
}
