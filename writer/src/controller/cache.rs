//! What the controllers remember between reconciles, kept on [`Controllers`]: the
//! objects the watchers know, the Secrets credential resources read, the namespaces
//! as last seen (UID, labels, terminating), the home environments with a fresh token
//! and the namespaces whose home identity needs making again; and the questions
//! answered from them (is this namespace served, owned, terminating).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use gitops_shared::db::{DbError, in_pooled_txn_retrying};
use gitops_shared::model::ManagedEnvironmentId;
use gitops_shared::tenancy::NotServed;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use uuid::Uuid;

use super::{Controllers, NamespaceState, ReconcileError, Seen, namespace_state_of};
use crate::shard::shard_of;
use crate::work_queue::{Key, Kind};

impl Controllers {
    /// Whether `namespace` is reserved (never a tenant, whatever its labels).
    pub(super) fn reserved(&self, namespace: &str) -> bool {
        matches!(self.ctx.served.serves(namespace, &Default::default()), Err(NotServed::Reserved(_)))
    }

    /// Whether the service serves `namespace` (as the namespace watcher last saw its labels).
    pub(crate) fn serves(&self, namespace: &str) -> Result<(), NotServed> {
        let labels = self.ctx.served.labels_of(namespace).unwrap_or_default();
        self.ctx.served.serves(namespace, &labels)
    }

    /// [`Self::serves`], reading the namespace first when the watcher has not seen it
    /// yet (its labels decide).
    pub(super) async fn serves_read(&self, namespace: &str) -> Result<Result<(), NotServed>, ReconcileError> {
        if self.namespace_cached(namespace).is_none() {
            self.namespace_state(namespace).await?;
        }
        Ok(self.serves(namespace))
    }

    pub(super) fn owns(&self, namespace: &str) -> bool {
        (self.namespaces.is_empty() || self.namespaces.contains(namespace))
            && self.shards.borrow().contains(&shard_of(namespace))
    }

    pub(super) fn offer(&self, key: Key) {
        if self.owns(&key.namespace) {
            self.ctx.queue.push(key);
            self.ctx.metrics.queue_depth.store(self.ctx.queue.len() as u64, Ordering::Relaxed);
        }
    }

    /// Counts a watcher's first complete listing (once per watcher, `synced` tracks
    /// it); the writer is ready when every watcher has listed.
    pub(super) fn first_listing_done(&self, synced: &mut bool) {
        if std::mem::replace(synced, true) {
            return;
        }
        if self.unsynced.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.ctx.metrics.set_ready();
        }
    }

    pub(super) fn known(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Seen>> {
        self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn relisting(&self) -> std::sync::MutexGuard<'_, HashSet<(Kind, Option<String>)>> {
        self.relisting.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn secret_refs(&self) -> std::sync::MutexGuard<'_, HashMap<Key, String>> {
        self.secret_refs.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records that `key` reads the Secret `secret` in its namespace.
    pub(super) fn refer(&self, key: Key, secret: &str) {
        self.secret_refs().insert(key, secret.to_owned());
    }

    pub(super) fn unrefer(&self, key: &Key) {
        self.secret_refs().remove(key);
    }

    /// Queues the referrers of a Secret that changed.
    pub(super) fn secret_changed(&self, namespace: &str, name: &str) {
        let referrers: Vec<Key> = self
            .secret_refs()
            .iter()
            .filter(|(key, secret)| key.namespace == namespace && secret.as_str() == name)
            .map(|(key, _)| key.clone())
            .collect();
        for key in referrers {
            self.offer(key);
        }
    }

    /// Queues every known GitOpsDeployment of `namespace` (an environment they may
    /// name appeared, changed or went).
    pub(super) fn deployments_again(&self, namespace: &str) {
        let keys: Vec<Key> =
            self.known().keys().filter(|k| k.kind == Kind::Deployment && k.namespace == namespace).cloned().collect();
        for key in keys {
            self.offer(key);
        }
    }

    /// Queues every known object of `namespace` (whether it is served changed).
    pub(super) fn namespace_again(&self, namespace: &str) {
        let keys: Vec<Key> = self.known().keys().filter(|k| k.namespace == namespace).cloned().collect();
        for key in keys {
            self.offer(key);
        }
    }

    /// [`in_pooled_txn_retrying`], timed into the transaction histogram (retries
    /// included).
    pub(super) async fn in_txn<T, F>(
        &self,
        client: &mut gitops_shared::db::PooledConnection,
        body: F,
    ) -> Result<T, DbError>
    where
        F: for<'t> FnMut(
            &'t gitops_shared::db::PooledTransaction<'t>,
        ) -> futures_util::future::BoxFuture<'t, Result<T, DbError>>,
    {
        let started = std::time::Instant::now();
        let outcome = in_pooled_txn_retrying(client, body).await;
        self.ctx.metrics.transaction.observe(started.elapsed());
        outcome
    }

    pub(super) fn namespace_states(&self) -> std::sync::MutexGuard<'_, HashMap<String, NamespaceState>> {
        self.namespace_states.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn home_cache(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<Uuid, (ManagedEnvironmentId, std::time::SystemTime)>> {
        self.home.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records that the home identity of `namespace` needs making again, and queues
    /// the namespace's deployments (those going to their own namespace repair it).
    pub(super) fn home_damaged(&self, namespace: &str) {
        // A namespace on its way out loses the identity with everything else (one
        // not listed yet, at a start, is repaired: the listing may come later).
        // Recorded whether or not this writer owns the namespace's shard now: at a
        // start the identity watch lists before the shards are taken.
        if self.namespace_cached(namespace).is_some_and(|state| state.terminating) {
            return;
        }
        self.home_damaged.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(namespace.to_owned());
        self.deployments_again(namespace);
    }

    /// Whether the home identity of `namespace` was damaged (and forgets it).
    pub(super) fn take_home_damaged(&self, namespace: &str) -> bool {
        self.home_damaged.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(namespace)
    }

    /// Drops the cached home environments of tenants that were cleaned up.
    pub(super) fn forget_home(&self, namespace_uids: &[Uuid]) {
        let mut cache = self.home_cache();
        for uid in namespace_uids {
            cache.remove(uid);
        }
    }

    /// The UID of `namespace` as the watcher last saw it.
    pub(super) fn namespace_uid_cached(&self, namespace: &str) -> Option<Uuid> {
        self.namespace_states().get(namespace).map(|state| state.uid)
    }

    /// The namespace as the watcher last saw it.
    pub(super) fn namespace_cached(&self, namespace: &str) -> Option<NamespaceState> {
        self.namespace_states().get(namespace).cloned()
    }

    /// The namespace now: from the watcher, or read when the watcher has not seen
    /// it yet (a namespace made a moment before its first resource). None: gone.
    pub(super) async fn namespace_state(&self, namespace: &str) -> Result<Option<NamespaceState>, ReconcileError> {
        if let Some(state) = self.namespace_cached(namespace) {
            return Ok(Some(state));
        }
        let api: Api<Namespace> = Api::all(self.ctx.kube.clone());
        let object = api
            .get_opt(namespace)
            .await
            .map_err(|source| ReconcileError::Kube { action: "read the namespace", source })?;
        let state = object.as_ref().map(|object| namespace_state_of(&object.metadata)).transpose()?;
        if let (Some(state), Some(object)) = (&state, &object) {
            if self.ctx.served.labels_of(namespace).is_none() {
                self.ctx.served.remember(namespace, object.metadata.labels.clone().unwrap_or_default());
            }
            self.namespace_states().entry(namespace.to_owned()).or_insert_with(|| state.clone());
        }
        Ok(state)
    }

    /// The UID of a live namespace; [`ReconcileError::NamespaceGone`] once it is
    /// terminating or gone (nothing new is written for it then).
    pub(super) async fn namespace_uid(&self, namespace: &str) -> Result<Uuid, ReconcileError> {
        match self.namespace_state(namespace).await? {
            Some(state) if !state.terminating => Ok(state.uid),
            _ => Err(ReconcileError::NamespaceGone),
        }
    }
}
