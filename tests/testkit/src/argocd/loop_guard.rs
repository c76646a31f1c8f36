//! A guard against write loops. The stand-in writes on the main resource, and
//! every write comes back as a watch event; `status::plan` reaches a fixed point,
//! but only if the API server stores what was written. A CRD of another shape
//! (an old Argo CD's, say) could prune a field on every write, and the stand-in
//! would write forever. The guard counts writes made directly on top of the
//! stand-in's own previous write; past a bound it refuses further ones until
//! someone else changes the object. A chain is forgotten once a reconcile writes
//! nothing (a fixed point), so the guard holds only objects being written now.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// Writes in a row on top of our own: more than any legitimate sequence needs
/// (status + Running, then Succeeded: 2).
pub const MAX_SELF_WRITES: u32 = 6;

/// Per-object chains of the stand-in's own consecutive writes.
#[derive(Debug, Default)]
pub struct LoopGuard {
    chains: Mutex<HashMap<String, Chain>>,
}

#[derive(Debug)]
struct Chain {
    /// The resourceVersion our last write produced.
    resource_version: String,
    writes: u32,
}

impl LoopGuard {
    /// Whether object `uid`, now at `resource_version`, may be written again.
    pub fn allows(&self, uid: &str, resource_version: &str) -> bool {
        let chains = self.chains.lock().unwrap_or_else(PoisonError::into_inner);
        chains.get(uid).is_none_or(|chain| chain.resource_version != resource_version || chain.writes < MAX_SELF_WRITES)
    }

    /// Records a write that took object `uid` from `before` to `after`.
    pub fn record(&self, uid: &str, before: &str, after: &str) {
        let mut chains = self.chains.lock().unwrap_or_else(PoisonError::into_inner);
        let writes = match chains.get(uid) {
            Some(chain) if chain.resource_version == before => chain.writes + 1,
            _ => 1,
        };
        chains.insert(uid.to_owned(), Chain { resource_version: after.to_owned(), writes });
    }

    /// Forgets object `uid` (it is going away, or reached a fixed point).
    pub fn forget(&self, uid: &str) {
        self.chains.lock().unwrap_or_else(PoisonError::into_inner).remove(uid);
    }

    /// Objects with a chain.
    pub fn len(&self) -> usize {
        self.chains.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Keeps only the chains of objects for which `alive` holds.
    pub fn retain(&self, alive: impl Fn(&str) -> bool) {
        self.chains.lock().unwrap_or_else(PoisonError::into_inner).retain(|uid, _| alive(uid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_a_chain_of_own_writes_until_someone_else_writes() {
        let guard = LoopGuard::default();
        let mut version = 1_u32;
        for _ in 0..MAX_SELF_WRITES {
            assert!(guard.allows("u", &version.to_string()));
            guard.record("u", &version.to_string(), &(version + 1).to_string());
            version += 1;
        }
        assert!(!guard.allows("u", &version.to_string()));
        // Another writer moved the object on: allowed again, chain restarts.
        assert!(guard.allows("u", "999"));
        guard.record("u", "999", "1000");
        assert!(guard.allows("u", "1000"));
        guard.forget("u");
        assert!(guard.allows("u", &version.to_string()));
    }
}
