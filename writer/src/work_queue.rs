//! The writer's work queue: the watchers push object keys, workers pop them and
//! reconcile the object as it is now (re-read from the API server), so the queue
//! holds keys, never objects. A key waits at most once (pushing it again while it
//! waits changes nothing), so the queue is bounded by the number of objects; a key
//! pushed while a worker has it runs once more afterwards. Namespaces take turns:
//! each has its own line and a worker takes the head of the next namespace's line,
//! so a namespace with thousands of objects cannot starve the others.
//!
//! A key whose reconcile failed comes back after an exponential backoff with jitter
//! (`retry_later`), counted per key until it reconciles without error (`forget`), so
//! the failure counts are bounded by the number of failing objects.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The resource kinds the writer reconciles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Deployment,
    SyncRun,
    Environment,
    RepositoryCredential,
    /// A tenant namespace (name = namespace): clean up its tenant once it went.
    Namespace,
}

impl Kind {
    pub const ALL: [Kind; 5] =
        [Kind::Deployment, Kind::SyncRun, Kind::Environment, Kind::RepositoryCredential, Kind::Namespace];
    /// The kinds of tenant resources (each has a watcher and a row table).
    pub const TENANT_RESOURCES: [Kind; 4] =
        [Kind::Deployment, Kind::SyncRun, Kind::Environment, Kind::RepositoryCredential];

    /// The Kubernetes kind, as in metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Deployment => "GitOpsDeployment",
            Kind::SyncRun => "GitOpsDeploymentSyncRun",
            Kind::Environment => "GitOpsDeploymentManagedEnvironment",
            Kind::RepositoryCredential => "GitOpsDeploymentRepositoryCredential",
            Kind::Namespace => "Namespace",
        }
    }
}

/// The delay before the first retry of a failed reconcile; it doubles per failure.
pub const RETRY_BASE: Duration = Duration::from_millis(500);
/// The longest delay between retries.
pub const RETRY_CAP: Duration = Duration::from_secs(120);

/// The delay before retrying after the `failures`-th failure in a row (1 = the
/// first): `RETRY_BASE` doubled per failure, at most `RETRY_CAP`, then scaled down
/// by jitter to between half and all of it (`unit` in [0, 1) picks where), so keys
/// that failed together do not come back together.
pub fn retry_delay(failures: u32, unit: f64) -> Duration {
    gitops_shared::backoff::exponential(failures, RETRY_BASE, RETRY_CAP, unit)
}

/// One object: kind, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

#[derive(Default)]
struct State {
    waiting: HashSet<Key>,
    lines: HashMap<String, VecDeque<Key>>,
    /// Namespaces with a non-empty line, in turn order.
    turns: VecDeque<String>,
    running: HashSet<Key>,
    /// Keys pushed while running: pushed again when done.
    again: HashSet<Key>,
    /// Keys whose last reconciles failed: how many times in a row.
    failures: HashMap<Key, u32>,
}

/// A shared, de-duplicating, namespace-fair queue of keys.
#[derive(Clone, Default)]
pub struct WorkQueue {
    state: Arc<Mutex<State>>,
    ready: Arc<Notify>,
}

impl WorkQueue {
    pub fn new() -> Self {
        WorkQueue::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A worker that panicked holding the lock left consistent sets behind.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks for `key` to be reconciled.
    pub fn push(&self, key: Key) {
        let mut state = self.lock();
        if state.running.contains(&key) {
            state.again.insert(key);
            return;
        }
        if !state.waiting.insert(key.clone()) {
            return;
        }
        let namespace = key.namespace.clone();
        let line = state.lines.entry(namespace.clone()).or_default();
        let was_empty = line.is_empty();
        line.push_back(key);
        if was_empty {
            state.turns.push_back(namespace);
        }
        drop(state);
        self.ready.notify_one();
    }

    /// Pushes `key` after `delay`, unless `cancel` fires first.
    pub fn push_after(&self, key: Key, delay: Duration, cancel: &CancellationToken) {
        let queue = self.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = cancel.cancelled() => {}
                () = tokio::time::sleep(delay) => queue.push(key),
            }
        });
    }

    /// Counts a failed reconcile of `key` and pushes it again after its backoff
    /// (unless `cancel` fires first); returns the delay.
    pub fn retry_later(&self, key: Key, cancel: &CancellationToken) -> Duration {
        let delay = self.failed(&key, gitops_shared::backoff::unit_random());
        self.push_after(key, delay, cancel);
        delay
    }

    /// Counts a failure of `key`; the delay before its retry.
    fn failed(&self, key: &Key, unit: f64) -> Duration {
        let mut state = self.lock();
        let failures = state.failures.entry(key.clone()).or_insert(0);
        *failures = failures.saturating_add(1);
        retry_delay(*failures, unit)
    }

    /// Forgets the failures of `key` (it reconciled without error, or is gone).
    pub fn forget(&self, key: &Key) {
        self.lock().failures.remove(key);
    }

    /// Keys with failures counted (failing now).
    pub fn failing(&self) -> usize {
        self.lock().failures.len()
    }

    /// Takes the next key without waiting.
    pub fn try_pop(&self) -> Option<Key> {
        let mut state = self.lock();
        let namespace = state.turns.pop_front()?;
        let line = state.lines.get_mut(&namespace)?;
        let key = line.pop_front()?;
        if line.is_empty() {
            state.lines.remove(&namespace);
        } else {
            state.turns.push_back(namespace);
        }
        state.waiting.remove(&key);
        state.running.insert(key.clone());
        Some(key)
    }

    /// Waits for the next key; None once `cancel` fires.
    pub async fn pop(&self, cancel: &CancellationToken) -> Option<Key> {
        loop {
            let notified = self.ready.notified();
            if let Some(key) = self.try_pop() {
                return Some(key);
            }
            tokio::select! {
                () = cancel.cancelled() => return None,
                () = notified => {}
            }
        }
    }

    /// Marks `key` finished; a push that came in meanwhile queues it again.
    pub fn done(&self, key: &Key) {
        let mut state = self.lock();
        state.running.remove(key);
        let again = state.again.remove(key);
        drop(state);
        if again {
            self.push(key.clone());
        }
    }

    /// Keys waiting (not counting running ones).
    pub fn len(&self) -> usize {
        self.lock().waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(namespace: &str, name: &str) -> Key {
        Key { kind: Kind::Deployment, namespace: namespace.into(), name: name.into() }
    }

    #[test]
    fn duplicates_wait_once() {
        let queue = WorkQueue::new();
        queue.push(key("a", "x"));
        queue.push(key("a", "x"));
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.try_pop(), Some(key("a", "x")));
        assert_eq!(queue.try_pop(), None);
    }

    #[test]
    fn namespaces_take_turns() {
        let queue = WorkQueue::new();
        for i in 0..100 {
            queue.push(key("flood", &i.to_string()));
        }
        queue.push(key("quiet", "one"));
        let first: Vec<String> = (0..2).filter_map(|_| queue.try_pop()).map(|k| k.namespace).collect();
        assert_eq!(first, ["flood", "quiet"], "the quiet namespace's key comes second, not 101st");
    }

    #[test]
    fn a_push_while_running_runs_again_after() {
        let queue = WorkQueue::new();
        queue.push(key("a", "x"));
        let running = queue.try_pop().expect("a key");
        queue.push(key("a", "x"));
        assert_eq!(queue.try_pop(), None, "not twice at once");
        queue.done(&running);
        assert_eq!(queue.try_pop(), Some(key("a", "x")));
    }

    #[test]
    fn retry_delays_double_from_half_a_second_to_two_minutes() {
        let nominal: Vec<Duration> = (1..=12).map(|n| retry_delay(n, 1.0)).collect();
        let ms = |m| Duration::from_millis(m);
        assert_eq!(
            nominal,
            [
                ms(500),
                ms(1000),
                ms(2000),
                ms(4000),
                ms(8000),
                ms(16_000),
                ms(32_000),
                ms(64_000),
                ms(120_000),
                ms(120_000),
                ms(120_000),
                ms(120_000)
            ]
        );
        assert_eq!(retry_delay(u32::MAX, 1.0), RETRY_CAP, "no overflow however long it fails");
        assert_eq!(retry_delay(0, 1.0), RETRY_BASE, "a count of 0 is treated as the first failure");
    }

    #[test]
    fn jitter_stays_between_half_and_all_of_the_nominal_delay() {
        for failures in [1, 2, 5, 9, 40] {
            let nominal = retry_delay(failures, 1.0);
            assert_eq!(retry_delay(failures, 0.0), nominal / 2);
            for unit in [0.0, 0.25, 0.5, 0.999_999, -1.0, 2.0] {
                let delay = retry_delay(failures, unit);
                assert!(delay >= nominal / 2 && delay <= nominal, "{failures} failures, unit {unit}: {delay:?}");
            }
        }
        for _ in 0..1000 {
            let unit = gitops_shared::backoff::unit_random();
            assert!((0.0..1.0).contains(&unit), "{unit}");
        }
    }

    #[test]
    fn failures_count_per_key_and_reset_when_forgotten() {
        let queue = WorkQueue::new();
        let (x, y) = (key("a", "x"), key("a", "y"));
        let delays: Vec<Duration> = (0..4).map(|_| queue.failed(&x, 1.0)).collect();
        assert_eq!(delays, [500, 1000, 2000, 4000].map(Duration::from_millis));
        assert_eq!(queue.failed(&y, 1.0), RETRY_BASE, "another key has its own count");
        assert_eq!(queue.failing(), 2);
        queue.forget(&x);
        assert_eq!(queue.failed(&x, 1.0), RETRY_BASE, "a success starts the backoff over");
        queue.forget(&x);
        queue.forget(&y);
        assert_eq!(queue.failing(), 0, "nothing kept for keys that reconcile");
    }

    #[tokio::test]
    async fn retry_later_pushes_the_key_back_unless_cancelled() {
        let queue = WorkQueue::new();
        let cancel = CancellationToken::new();
        let delay = queue.retry_later(key("a", "x"), &cancel);
        assert!(delay <= RETRY_BASE && delay >= RETRY_BASE / 2, "{delay:?}");
        let popped = tokio::time::timeout(Duration::from_secs(30), queue.pop(&cancel)).await.expect("pushed back");
        assert_eq!(popped, Some(key("a", "x")));
        assert_eq!(queue.failing(), 1, "counted until forgotten");
    }
}
