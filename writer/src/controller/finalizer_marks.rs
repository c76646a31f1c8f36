//! The finalizer write of a reconcile comes back as a watch event of the object.
//! That event brings nothing the reconcile did not see (it goes on from the object
//! the patch returned), yet it would queue the key to be reconciled once more: at
//! tens of thousands of new resources, one extra intent transaction each. The marks
//! here let the watcher leave exactly that event alone, and nothing else.
//!
//! The event and the patch's response race. A mark is made before the patch; an
//! event of the key that comes while the patch is in flight is held. When the patch
//! returns, a held event of the version it made was the write itself; any other held
//! version queues the key again, as does any held event when the patch failed. An
//! event after the patch returned is left alone only when it is the version made.

use std::collections::HashMap;
use std::sync::{MutexGuard, PoisonError};

use super::Controllers;
use crate::work_queue::Key;

impl Controllers {
    pub(super) fn finalizing_marks(&self) -> MutexGuard<'_, FinalizerMarks> {
        self.finalizing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks that a reconcile of `key` is about to add the finalizer (see
    /// [`FinalizerMarks`]). The returned write is told the version the patch made;
    /// dropped untold (the patch failed), it queues `key` again if an event was held.
    pub(super) fn finalizing(&self, key: Key) -> FinalizerWrite<'_> {
        self.finalizing_marks().begin(key.clone());
        FinalizerWrite { ctl: self, key: Some(key) }
    }

    fn finalizer_written(&self, key: Key, made: Option<&str>) {
        let again = self.finalizing_marks().end(key.clone(), made);
        if again {
            self.offer(key);
        }
    }
}

/// A finalizer write in flight; see [`Controllers::finalizing`].
pub(super) struct FinalizerWrite<'a> {
    ctl: &'a Controllers,
    key: Option<Key>,
}

impl FinalizerWrite<'_> {
    /// The patch made `version` of the object.
    pub(super) fn made(mut self, version: Option<&str>) {
        if let Some(key) = self.key.take() {
            self.ctl.finalizer_written(key, version);
        }
    }
}

impl Drop for FinalizerWrite<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.ctl.finalizer_written(key, None);
        }
    }
}

/// Finalizer writes of reconciles under way, by key.
#[derive(Debug, Default)]
pub(crate) struct FinalizerMarks {
    by_key: HashMap<Key, Mark>,
}

#[derive(Debug, Default)]
struct Mark {
    /// The version the write made, once its response came.
    made: Option<String>,
    /// Versions of the events that came while the write was in flight.
    held: Vec<String>,
}

impl FinalizerMarks {
    /// A reconcile of `key` is about to add the finalizer.
    pub(crate) fn begin(&mut self, key: Key) {
        self.by_key.insert(key, Mark::default());
    }

    /// Whether an update event of `key` at `version` is left alone: it is the version
    /// a finalizer write made, or it is held until that write returns. A made
    /// version is forgotten at the next event either way.
    pub(crate) fn event(&mut self, key: &Key, version: Option<&str>) -> bool {
        let Some(mark) = self.by_key.get_mut(key) else { return false };
        match &mark.made {
            Some(made) => {
                let own = Some(made.as_str()) == version;
                self.by_key.remove(key);
                own
            }
            None => {
                mark.held.push(version.unwrap_or_default().to_owned());
                true
            }
        }
    }

    /// The finalizer write of `key` returned: `made` is the version it made (None:
    /// it failed). Whether the key must be queued again for the events held meanwhile.
    pub(crate) fn end(&mut self, key: Key, made: Option<&str>) -> bool {
        let Some(mark) = self.by_key.remove(&key) else { return false };
        match made {
            Some(made) if mark.held.is_empty() => {
                self.by_key.insert(key, Mark { made: Some(made.to_owned()), held: Vec::new() });
                false
            }
            Some(made) => mark.held.iter().any(|held| held != made),
            None => !mark.held.is_empty(),
        }
    }

    /// The object is gone: its deletion event queues the key.
    pub(crate) fn forget(&mut self, key: &Key) {
        self.by_key.remove(key);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::work_queue::Kind;

    fn key(name: &str) -> Key {
        Key { kind: Kind::Deployment, namespace: "team".into(), name: name.into() }
    }

    #[test]
    fn only_the_version_the_write_made_is_left_alone() {
        let mut marks = FinalizerMarks::default();
        assert!(!marks.event(&key("a"), Some("7")), "no write, no mark");
        marks.begin(key("a"));
        assert!(!marks.end(key("a"), Some("8")));
        assert!(!marks.event(&key("b"), Some("8")), "another object");
        assert!(marks.event(&key("a"), Some("8")), "the write itself");
        assert!(!marks.event(&key("a"), Some("8")), "forgotten after one event");
        marks.begin(key("a"));
        assert!(!marks.end(key("a"), Some("10")));
        assert!(!marks.event(&key("a"), Some("11")), "a later change is news");
        assert_eq!(marks.len(), 0, "and the mark is gone");
    }

    #[test]
    fn events_held_while_the_write_was_in_flight_are_settled_when_it_returns() {
        let mut marks = FinalizerMarks::default();
        marks.begin(key("a"));
        assert!(marks.event(&key("a"), Some("8")), "held");
        assert!(!marks.end(key("a"), Some("8")), "it was the write: nothing to do again");
        assert_eq!(marks.len(), 0);

        marks.begin(key("a"));
        assert!(marks.event(&key("a"), Some("9")));
        assert!(marks.event(&key("a"), Some("10")));
        assert!(marks.end(key("a"), Some("9")), "another version came too: again");

        marks.begin(key("a"));
        assert!(marks.event(&key("a"), Some("11")));
        assert!(marks.end(key("a"), None), "the write failed: the held event counts");
        marks.begin(key("a"));
        assert!(!marks.end(key("a"), None), "failed with nothing held");
        assert_eq!(marks.len(), 0);
    }

    #[test]
    fn a_deletion_forgets_the_mark() {
        let mut marks = FinalizerMarks::default();
        marks.begin(key("a"));
        marks.forget(&key("a"));
        assert!(!marks.end(key("a"), Some("8")), "nothing held for a forgotten mark");
        assert!(!marks.event(&key("a"), Some("8")));
    }
}
