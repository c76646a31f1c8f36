//! The writer's work queue: the watchers push object keys, workers pop them and
//! reconcile the object as it is now (re-read from the API server), so the queue
//! holds keys, never objects. A key waits at most once (pushing it again while it
//! waits changes nothing), so the queue is bounded by the number of objects; a key
//! pushed while a worker has it runs once more afterwards. Namespaces take turns:
//! each has its own line and a worker takes the head of the next namespace's line,
//! so a namespace with thousands of objects cannot starve the others.

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
}
