//! Kubernetes Events on the tenant resources for their transitions (accepted,
//! refused, applied and ready, unavailable, stalled, deleted), as `events.k8s.io/v1`
//! Events. A transition repeated on the same object within [`SERIES_WINDOW`] (same
//! type, action, reason and note) patches the first event into a series (its count
//! and when last seen) instead of adding one more. A different note is a new event:
//! the API server keeps an event's note as it was created.
//!
//! The publisher keeps its own series memory rather than kube's recorder: that one
//! keeps a clone of every event it published for six minutes, keyed by an object
//! reference that includes the resource version (so a new version never joins a
//! series), and walks all of them on every publish. At tens of thousands of tenant
//! resources that was most of the writer's heap, and time linear in the events of the
//! last six minutes on every publish. Here one entry per series holds the event's
//! name and count, and expired ones are swept once per [`SWEEP_EVERY`].
//!
//! Events are also rate-limited per object: a token bucket with a burst of 25, then
//! one event per 5 minutes. Publishing never fails a reconcile: an event that cannot
//! be written is logged and dropped.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};

/// Events an object may publish at once.
pub const BURST: f64 = 25.0;
/// After the burst, one event per this long.
pub const REFILL_EVERY: Duration = Duration::from_secs(300);
/// Buckets kept before full ones (objects that went quiet) are swept.
const BUCKETS_KEPT: usize = 10_000;
/// A repeated transition joins the series of the event published for it this recently.
pub const SERIES_WINDOW: Duration = Duration::from_secs(360);
/// The rate limit and the series memory drop what has expired at most this often
/// (a sweep walks all of them).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The controller named as the reporter of every event.
const REPORTING_CONTROLLER: &str = "gitops-service-writer";

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

/// Per-object rate limits in front of the publisher.
#[derive(Default)]
pub struct RateLimit {
    buckets: Mutex<Buckets>,
}

#[derive(Default)]
struct Buckets {
    by_object: HashMap<String, Bucket>,
    swept_at: Option<Instant>,
}

impl RateLimit {
    /// Whether the object `key` may publish one more event at `now` (taking a token).
    pub fn allow(&self, key: &str, now: Instant) -> bool {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        if buckets.by_object.len() > BUCKETS_KEPT && due(buckets.swept_at, now) {
            buckets.by_object.retain(|_, bucket| bucket.refilled(now).tokens < BURST);
            buckets.swept_at = Some(now);
        }
        let bucket = buckets.by_object.get(key).map_or_else(|| Bucket::full(now), |b| b.refilled(now));
        let allowed = bucket.tokens >= 1.0;
        let tokens = if allowed { bucket.tokens - 1.0 } else { bucket.tokens };
        buckets.by_object.insert(key.to_owned(), Bucket { tokens, at: now });
        allowed
    }

    #[cfg(test)]
    fn kept(&self) -> usize {
        self.buckets.lock().unwrap_or_else(PoisonError::into_inner).by_object.len()
    }
}

/// Whether a sweep last done at `swept_at` is due again at `now`.
fn due(swept_at: Option<Instant>, now: Instant) -> bool {
    swept_at.is_none_or(|at| now.saturating_duration_since(at) >= SWEEP_EVERY)
}

/// What makes two events one series: the object and the transition, note included.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey {
    /// The object's UID (kind, namespace and name when it has none).
    regarding: String,
    warning: bool,
    action: &'static str,
    reason: String,
    /// A hash of the note (the notes themselves would be most of the memory).
    note: u64,
}

fn note_hash(note: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(note)
}

/// The event a series is kept in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Series {
    name: String,
    /// Occurrences so far, the first included.
    count: i32,
    last: Instant,
}

/// The series of the last [`SERIES_WINDOW`].
#[derive(Default)]
struct SeriesMemory {
    by_key: HashMap<SeriesKey, Series>,
    swept_at: Option<Instant>,
}

impl SeriesMemory {
    /// The series `key` joins at `now`, if one is recent enough.
    fn current(&mut self, key: &SeriesKey, now: Instant) -> Option<Series> {
        if due(self.swept_at, now) {
            self.by_key.retain(|_, series| live(series, now));
            self.swept_at = Some(now);
        }
        self.by_key.get(key).filter(|series| live(series, now)).cloned()
    }
}

fn live(series: &Series, now: Instant) -> bool {
    now.saturating_duration_since(series.last) < SERIES_WINDOW
}

/// The writer's event publisher.
pub struct TenantEvents {
    client: kube::Client,
    /// The reporting instance: this writer.
    instance: String,
    limit: RateLimit,
    series: Mutex<SeriesMemory>,
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
        TenantEvents { client, instance: writer_id.to_owned(), limit: RateLimit::default(), series: Mutex::default() }
    }

    fn series(&self) -> MutexGuard<'_, SeriesMemory> {
        self.series.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Publishes `transition` on `object` (unless its bucket is empty).
    pub async fn publish<K>(&self, object: &K, transition: Transition)
    where
        K: Resource<DynamicType = ()>,
    {
        let reference = object.object_ref(&());
        let Some(namespace) = reference.namespace.clone() else {
            tracing::debug!(object = ?reference.name, "no event for an object without a namespace");
            return;
        };
        let regarding = reference.uid.clone().unwrap_or_else(|| {
            format!(
                "{}/{namespace}/{}",
                reference.kind.as_deref().unwrap_or(""),
                reference.name.as_deref().unwrap_or("")
            )
        });
        let Transition { warning, reason, action, note } = transition;
        if !self.limit.allow(&regarding, Instant::now()) {
            tracing::debug!(object = ?reference.name, %reason, "event dropped by the rate limit");
            return;
        }
        let note = truncate(note, 1000);
        let key = SeriesKey { regarding, warning, action, reason, note: note_hash(&note) };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let current = self.series().current(&key, Instant::now());
        let published = match current {
            Some(series) => match self.repeat(&api, &series).await {
                Err(kube::Error::Api(status)) if status.code == 404 => self.create(&api, &reference, &key, note).await,
                repeated => repeated,
            },
            None => self.create(&api, &reference, &key, note).await,
        };
        match published {
            Ok(series) => {
                self.series().by_key.insert(key, series);
            }
            Err(error) => {
                tracing::warn!(%error, tenant.ns = %namespace, object = ?reference.name, "could not publish an event");
            }
        }
    }

    /// Counts one more occurrence on the series' event (only `series` may change).
    async fn repeat(&self, api: &Api<Event>, series: &Series) -> Result<Series, kube::Error> {
        let count = series.count.saturating_add(1);
        let patch = serde_json::json!({
            "series": EventSeries { count, last_observed_time: MicroTime(Timestamp::now()) },
        });
        api.patch(&series.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        Ok(Series { name: series.name.clone(), count, last: Instant::now() })
    }

    /// Creates the first event of the series `key`.
    async fn create(
        &self,
        api: &Api<Event>,
        reference: &ObjectReference,
        key: &SeriesKey,
        note: String,
    ) -> Result<Series, kube::Error> {
        let now = Timestamp::now();
        let name = event_name(reference.name.as_deref().unwrap_or(REPORTING_CONTROLLER), now.as_nanosecond());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: reference.namespace.clone(),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some(key.action.to_owned()),
            reason: Some(key.reason.clone()),
            note: Some(note),
            regarding: Some(reference.clone()),
            reporting_controller: Some(REPORTING_CONTROLLER.to_owned()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(if key.warning { "Warning" } else { "Normal" }.to_owned()),
            ..Event::default()
        };
        api.create(&PostParams::default(), &event).await?;
        Ok(Series { name, count: 1, last: Instant::now() })
    }
}

/// `<object>.<nanoseconds in hex>`, the object's name cut so that the whole stays
/// within the 253 characters of a Kubernetes name.
fn event_name(object: &str, nanos: i128) -> String {
    let stamp = format!("{nanos:x}");
    let room = 253 - 1 - stamp.len();
    // Object names are DNS subdomains (ASCII): a cut must end on a letter or digit.
    let prefix = object.get(..room.min(object.len())).unwrap_or(object).trim_end_matches(['.', '-']);
    format!("{prefix}.{stamp}")
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
    fn the_rate_limit_sweeps_quiet_objects_at_most_once_a_sweep_period() {
        let limit = RateLimit::default();
        let start = Instant::now();
        for i in 0..=BUCKETS_KEPT {
            assert!(limit.allow(&format!("o{i}"), start));
        }
        let first = start + REFILL_EVERY - SWEEP_EVERY / 2;
        assert!(limit.allow("a", first));
        assert_eq!(limit.kept(), BUCKETS_KEPT + 2, "nothing had refilled at the first sweep");
        // Every `o` bucket is full again now, but the last sweep was too recent.
        assert!(limit.allow("b", start + REFILL_EVERY));
        assert_eq!(limit.kept(), BUCKETS_KEPT + 3, "no second sweep within {SWEEP_EVERY:?} of the first");
        assert!(limit.allow("c", first + SWEEP_EVERY));
        assert_eq!(limit.kept(), 3, "the next sweep dropped every bucket that refilled");
    }

    #[test]
    fn a_series_lasts_its_window_and_expired_ones_are_swept() {
        let key = |reason: &str| SeriesKey {
            regarding: "3f1c".into(),
            warning: false,
            action: "Apply",
            reason: reason.into(),
            note: note_hash("applied"),
        };
        let start = Instant::now();
        let mut memory = SeriesMemory::default();
        memory.by_key.insert(key("Applied"), Series { name: "e1".into(), count: 1, last: start });
        let second = Duration::from_secs(1);
        let within = start + SERIES_WINDOW - second;
        assert_eq!(memory.current(&key("Applied"), within).map(|s| s.name), Some("e1".to_owned()));
        assert_eq!(memory.current(&key("Stalled"), within), None, "another transition is another series");
        assert_eq!(memory.current(&key("Applied"), start + SERIES_WINDOW), None, "past its window");
        assert_eq!(memory.by_key.len(), 1, "kept until the next sweep");
        assert_eq!(memory.current(&key("Applied"), within + SWEEP_EVERY), None);
        assert!(memory.by_key.is_empty(), "swept");
    }

    #[test]
    fn event_names_stay_within_a_kubernetes_name() {
        assert_eq!(event_name("app", 255), "app.ff");
        let stamp = i128::from(u64::MAX);
        let name = event_name(&"a".repeat(253), stamp);
        assert_eq!(name.len(), 253, "{name}");
        assert!(name.ends_with(".ffffffffffffffff"), "{name}");
        // The cut falls just after a dot or a dash: they go.
        let name = event_name(&format!("{}-.bbbb", "a".repeat(234)), stamp);
        assert_eq!(name, format!("{}.ffffffffffffffff", "a".repeat(234)));
    }

    #[test]
    fn notes_are_cut_at_a_character_boundary() {
        let text = "é".repeat(600);
        let cut = truncate(text, 1000);
        assert!(cut.len() <= 1000 && cut.chars().all(|c| c == 'é'));
    }
}
