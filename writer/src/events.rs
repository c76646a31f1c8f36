//! Kubernetes Events on the tenant resources for their transitions (accepted,
//! refused, applied and ready, unavailable, stalled, deleted), through kube's
//! recorder (`events.k8s.io/v1`, repeated events aggregated into a series).
//! The recorder does not rate-limit, so each object has a token bucket: a burst of
//! 25, then one event per 5 minutes. Publishing never fails a reconcile: an event
//! that cannot be written is logged and dropped.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Events an object may publish at once.
pub const BURST: f64 = 25.0;
/// After the burst, one event per this long.
pub const REFILL_EVERY: Duration = Duration::from_secs(300);
/// Buckets kept before full ones (objects that went quiet) are dropped.
const BUCKETS_KEPT: usize = 10_000;

/// A token bucket: `tokens` left at `at`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(now: Instant) -> Bucket {
        Bucket { tokens: BURST, at: now }
    }

    fn refilled(self, now: Instant) -> Bucket {
        let gained = now.saturating_duration_since(self.at).as_secs_f64() / REFILL_EVERY.as_secs_f64();
        Bucket { tokens: (self.tokens + gained).min(BURST), at: now }
    }
}

/// Per-object rate limits in front of the recorder.
#[derive(Default)]
pub struct RateLimit {
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimit {
    /// Whether the object `key` may publish one more event at `now` (taking a token).
    pub fn allow(&self, key: &str, now: Instant) -> bool {
        let mut buckets = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if buckets.len() > BUCKETS_KEPT {
            buckets.retain(|_, bucket| bucket.refilled(now).tokens < BURST);
        }
        let bucket = buckets.entry(key.to_owned()).or_insert_with(|| Bucket::full(now)).refilled(now);
        let allowed = bucket.tokens >= 1.0;
        let tokens = if allowed { bucket.tokens - 1.0 } else { bucket.tokens };
        buckets.insert(key.to_owned(), Bucket { tokens, at: now });
        allowed
    }
}

/// The writer's event publisher.
pub struct TenantEvents {
    recorder: Recorder,
    limit: RateLimit,
}

/// One transition worth telling the tenant.
pub struct Transition {
    pub warning: bool,
    /// `PascalCase`, e.g. `Accepted`, `Stalled`.
    pub reason: String,
    /// What the service did, e.g. `Store`, `Apply`.
    pub action: &'static str,
    pub note: String,
}

impl TenantEvents {
    pub fn new(client: kube::Client, writer_id: &str) -> TenantEvents {
        let reporter = Reporter { controller: "gitops-service-writer".into(), instance: Some(writer_id.to_owned()) };
        TenantEvents { recorder: Recorder::new(client, reporter), limit: RateLimit::default() }
    }

    /// Publishes `transition` on `object` (unless its bucket is empty).
    pub async fn publish<K>(&self, object: &K, transition: Transition)
    where
        K: Resource<DynamicType = ()>,
    {
        let reference = object.object_ref(&());
        let key = reference.uid.clone().unwrap_or_default();
        if !self.limit.allow(&key, Instant::now()) {
            tracing::debug!(object = ?reference.name, reason = %transition.reason, "event dropped by the rate limit");
            return;
        }
        let event = Event {
            type_: if transition.warning { EventType::Warning } else { EventType::Normal },
            reason: transition.reason,
            note: Some(truncate(transition.note, 1000)),
            action: transition.action.to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(%error, tenant.ns = ?reference.namespace, object = ?reference.name, "could not publish an event");
        }
    }
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_event_per_refill_period() {
        let limit = RateLimit::default();
        let start = Instant::now();
        let allowed = (0..30).filter(|_| limit.allow("a", start)).count();
        assert_eq!(allowed, 25, "the burst");
        assert!(!limit.allow("a", start + REFILL_EVERY / 2), "half a period is not a token");
        assert!(limit.allow("a", start + REFILL_EVERY), "one more after a period");
        assert!(!limit.allow("a", start + REFILL_EVERY), "and only one");
        assert!(limit.allow("b", start), "each object has its own bucket");
    }

    #[test]
    fn notes_are_cut_at_a_character_boundary() {
        let text = "é".repeat(600);
        let cut = truncate(text, 1000);
        assert!(cut.len() <= 1000 && cut.chars().all(|c| c == 'é'));
    }
}
