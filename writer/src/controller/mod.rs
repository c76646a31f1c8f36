//! The writer's controllers: a watcher per kind feeds the work queue with the keys
//! of objects in namespaces whose shard this writer owns (and, when configured, in
//! the allowed namespaces only); N workers reconcile them. When the owned shards
//! change, every known object of a newly owned shard is queued again, so a shard
//! that moves here is reconciled from the current objects.
//!
//! Credential Secrets are watched in the same scope, but a Secret event only
//! queues the environments and repository credentials whose last reconcile named
//! it (an in-memory index built by those reconciles); other Secrets are ignored.

mod credential;
mod deployment;
mod environment;
mod home;
mod namespace;
mod object;
mod repository_credential;
mod sync_run;
mod tenant;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use gitops_shared::db::{DbError, in_txn_retrying};
use gitops_shared::telemetry::error_chain;
use gitops_shared::tenancy::NotServed;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub use deployment::{
    REASON_HOME_UNAVAILABLE, REASON_NO_ENGINE, REASON_QUOTA_EXCEEDED, REASON_REQUESTER_UNVERIFIED, WAIT_FOR_PRUNING,
};
pub use environment::{CONNECTION_CONDITION, REASON_CONNECTION_CHECK_DISABLED, REASON_SECRET_NOT_FOUND};
pub use home::{
    DEFAULT_HOME_CLUSTER_ROLE, DEFAULT_HOME_NAMESPACE, HOME_IDENTITY, HomeSettings, HomeStatus, TENANT_NAMESPACE_LABEL,
    check_loop, check_once, home_account_name, home_binding,
};
pub use object::{CONDITION, FINALIZER, REASON_ACCEPTED};
pub use sync_run::{REASON_DEPLOYMENT_AUTOMATED, REASON_DEPLOYMENT_NOT_FOUND};

use crate::api::{
    Condition, GitOpsDeployment, GitOpsDeploymentManagedEnvironment, GitOpsDeploymentRepositoryCredential,
    GitOpsDeploymentSyncRun,
};
use crate::context::WriterContext;
use crate::metrics::{Inventory, Outcome};
use crate::queue::{Key, Kind};
use crate::shard::shard_of;

/// Why a reconcile did not finish; it is retried.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("could not {action} through the Kubernetes API")]
    Kube { action: &'static str, source: kube::Error },
    #[error("could not {what}")]
    Patch { what: &'static str, source: serde_json::Error },
    #[error("the object has no UID")]
    NoUid,
    /// Its namespace is terminating or gone; the namespace's cleanup takes over.
    #[error("the namespace is being deleted")]
    NamespaceGone,
    #[error("{0}")]
    Unexpected(&'static str),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// How a reconcile ended.
pub enum Next {
    /// Nothing to do (gone, or not this writer's).
    Done,
    /// Finished; the outcome is counted.
    Settled(Settled),
    /// Look again after this long.
    Retry(Duration),
}

pub enum Settled {
    Ok,
    /// Refused with a condition; the condition's reason.
    Invalid(&'static str),
}

/// The controllers' tunables.
#[derive(Debug, Clone, Copy)]
pub struct ControllerSettings {
    pub workers: usize,
    /// Most GitOpsDeployments per namespace (counted under the tenant's row lock).
    pub max_deployments: i64,
    /// An engine instance is healthy when its agents reported within this window.
    pub healthy_within: Duration,
    /// When to look again at a resource that waits (quota, no instance, missing deployment).
    pub retry_delay: Duration,
    /// A deletion that waits for pruning is woken by the agent's confirmation in the
    /// status feed; this is the fallback second look at the row.
    pub prune_poll: Duration,
}

impl Default for ControllerSettings {
    fn default() -> Self {
        ControllerSettings {
            workers: 16,
            max_deployments: 500,
            healthy_within: Duration::from_secs(120),
            retry_delay: Duration::from_secs(10),
            prune_poll: Duration::from_secs(60),
        }
    }
}

/// The running controllers' shared state.
pub struct Controllers {
    pub ctx: Arc<WriterContext>,
    pub settings: ControllerSettings,
    shards: watch::Receiver<Vec<i32>>,
    /// Empty: every namespace.
    namespaces: BTreeSet<String>,
    /// Every object the watchers have seen and not seen deleted.
    known: Mutex<HashSet<Key>>,
    /// Watchers that have not finished their first listing.
    unsynced: AtomicUsize,
    /// Environment and repository credential keys → the Secret name they read last.
    secret_refs: Mutex<HashMap<Key, String>>,
    /// Namespaces in scope as the namespace watcher last saw them.
    namespace_states: Mutex<HashMap<String, NamespaceState>>,
    /// Home environments known to have a fresh token: namespace UID → (id, renew at).
    home: Mutex<HashMap<Uuid, (i64, std::time::SystemTime)>>,
    /// Namespaces whose home identity was deleted or changed under the writer: the
    /// next reconcile makes it again and requests a new token.
    home_damaged: Mutex<HashSet<String>>,
}

/// A namespace as the writer needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NamespaceState {
    pub uid: Uuid,
    /// Deletion has begun (`deletionTimestamp` set).
    pub terminating: bool,
    /// Its labels (the operator selects tenant namespaces by them).
    pub labels: std::collections::BTreeMap<String, String>,
}

/// The work-queue key of a namespace's tenant cleanup.
pub(crate) fn namespace_key(namespace: &str) -> Key {
    Key { kind: Kind::Namespace, namespace: namespace.to_owned(), name: namespace.to_owned() }
}

impl Controllers {
    /// Whether `namespace` is reserved (never a tenant, whatever its labels).
    fn reserved(&self, namespace: &str) -> bool {
        matches!(self.ctx.served.serves(namespace, &Default::default()), Err(NotServed::Reserved(_)))
    }

    /// Whether the service serves `namespace` (as the namespace watcher last saw its labels).
    pub(crate) fn serves(&self, namespace: &str) -> Result<(), NotServed> {
        let labels = self.namespace_cached(namespace).map(|state| state.labels).unwrap_or_default();
        self.ctx.served.serves(namespace, &labels)
    }

    /// Refuses an object in a namespace the service does not serve: its condition
    /// says why, and nothing is written (no finalizer, no rows, no identity). Rows
    /// and Argo CD objects of a namespace that stopped being served stay as they
    /// are; a deletion goes on as usual (the caller handles deleting objects).
    async fn refuse_unserved<K>(
        &self,
        api: &Api<K>,
        name: &str,
        namespace: &str,
    ) -> Result<Option<Next>, ReconcileError>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug + HasConditions,
    {
        // A namespace the watcher has not seen yet is read first (its labels decide).
        if self.namespace_cached(namespace).is_none() {
            self.namespace_state(namespace).await?;
        }
        let Err(not_served) = self.serves(namespace) else { return Ok(None) };
        let Some(object) = api.get_opt(name).await.map_err(|source| ReconcileError::Kube { action: "read", source })?
        else {
            return Ok(Some(Next::Done));
        };
        if object.meta().deletion_timestamp.is_some() {
            return Ok(None);
        }
        let reason = not_served.reason();
        set_condition(api, &object, true, reason, &not_served.message(namespace)).await?;
        Ok(Some(Next::Settled(Settled::Invalid(reason))))
    }

    fn owns(&self, namespace: &str) -> bool {
        (self.namespaces.is_empty() || self.namespaces.contains(namespace))
            && self.shards.borrow().contains(&shard_of(namespace))
    }

    fn offer(&self, key: Key) {
        if self.owns(&key.namespace) {
            self.ctx.queue.push(key);
            self.ctx.metrics.queue_depth.store(self.ctx.queue.len() as u64, Ordering::Relaxed);
        }
    }

    /// Counts a watcher's first complete listing (once per watcher, `synced` tracks
    /// it); the writer is ready when every watcher has listed.
    fn first_listing_done(&self, synced: &mut bool) {
        if std::mem::replace(synced, true) {
            return;
        }
        if self.unsynced.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.ctx.metrics.ready.store(true, Ordering::Relaxed);
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashSet<Key>> {
        self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn secret_refs(&self) -> std::sync::MutexGuard<'_, HashMap<Key, String>> {
        self.secret_refs.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records that `key` reads the Secret `secret` in its namespace.
    fn refer(&self, key: Key, secret: &str) {
        self.secret_refs().insert(key, secret.to_owned());
    }

    fn unrefer(&self, key: &Key) {
        self.secret_refs().remove(key);
    }

    /// Queues the referrers of a Secret that changed.
    fn secret_changed(&self, namespace: &str, name: &str) {
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
    fn deployments_again(&self, namespace: &str) {
        let keys: Vec<Key> =
            self.known().iter().filter(|k| k.kind == Kind::Deployment && k.namespace == namespace).cloned().collect();
        for key in keys {
            self.offer(key);
        }
    }

    /// Queues every known object of `namespace` (whether it is served changed).
    fn namespace_again(&self, namespace: &str) {
        let keys: Vec<Key> = self.known().iter().filter(|k| k.namespace == namespace).cloned().collect();
        for key in keys {
            self.offer(key);
        }
    }

    /// [`in_txn_retrying`], timed into the transaction histogram (retries included).
    async fn in_txn<T, F>(&self, client: &mut tokio_postgres::Client, body: F) -> Result<T, DbError>
    where
        F: for<'t> FnMut(
            &'t tokio_postgres::Transaction<'t>,
        ) -> futures_util::future::BoxFuture<'t, Result<T, DbError>>,
    {
        let started = std::time::Instant::now();
        let outcome = in_txn_retrying(client, body).await;
        self.ctx.metrics.transaction.observe(started.elapsed());
        outcome
    }

    fn namespace_states(&self) -> std::sync::MutexGuard<'_, HashMap<String, NamespaceState>> {
        self.namespace_states.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn home_cache(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, (i64, std::time::SystemTime)>> {
        self.home.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records that the home identity of `namespace` needs making again, and queues
    /// the namespace's deployments (those going to their own namespace repair it).
    fn home_damaged(&self, namespace: &str) {
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
    fn take_home_damaged(&self, namespace: &str) -> bool {
        self.home_damaged.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(namespace)
    }

    /// Drops the cached home environments of tenants that were cleaned up.
    fn forget_home(&self, namespace_uids: &[Uuid]) {
        let mut cache = self.home_cache();
        for uid in namespace_uids {
            cache.remove(uid);
        }
    }

    /// The UID of `namespace` as the watcher last saw it.
    fn namespace_uid_cached(&self, namespace: &str) -> Option<Uuid> {
        self.namespace_states().get(namespace).map(|state| state.uid)
    }

    /// The namespace as the watcher last saw it.
    fn namespace_cached(&self, namespace: &str) -> Option<NamespaceState> {
        self.namespace_states().get(namespace).cloned()
    }

    /// The namespace now: from the watcher, or read when the watcher has not seen
    /// it yet (a namespace made a moment before its first resource). None: gone.
    async fn namespace_state(&self, namespace: &str) -> Result<Option<NamespaceState>, ReconcileError> {
        if let Some(state) = self.namespace_cached(namespace) {
            return Ok(Some(state));
        }
        let api: Api<Namespace> = Api::all(self.ctx.kube.clone());
        let object = api
            .get_opt(namespace)
            .await
            .map_err(|source| ReconcileError::Kube { action: "read the namespace", source })?;
        let state = object.map(|object| namespace_state_of(&object.metadata)).transpose()?;
        if let Some(state) = &state {
            self.namespace_states().entry(namespace.to_owned()).or_insert_with(|| state.clone());
        }
        Ok(state)
    }

    /// The UID of a live namespace; [`ReconcileError::NamespaceGone`] once it is
    /// terminating or gone (nothing new is written for it then).
    async fn namespace_uid(&self, namespace: &str) -> Result<Uuid, ReconcileError> {
        match self.namespace_state(namespace).await? {
            Some(state) if !state.terminating => Ok(state.uid),
            _ => Err(ReconcileError::NamespaceGone),
        }
    }
}

impl Inventory for Controllers {
    fn owned_counts(&self) -> (u64, u64) {
        let known = self.known();
        let mut namespaces = HashSet::new();
        let mut deployments = 0;
        for key in known.iter().filter(|key| self.owns(&key.namespace)) {
            namespaces.insert(key.namespace.as_str());
            if key.kind == Kind::Deployment {
                deployments += 1;
            }
        }
        (namespaces.len() as u64, deployments)
    }

    fn unserved_namespaces(&self) -> u64 {
        let namespaces: HashSet<String> =
            self.known().iter().filter(|key| self.owns(&key.namespace)).map(|key| key.namespace.clone()).collect();
        namespaces.iter().filter(|namespace| self.serves(namespace).is_err()).count() as u64
    }
}

fn namespace_state_of(meta: &ObjectMeta) -> Result<NamespaceState, ReconcileError> {
    Ok(NamespaceState {
        uid: uid(meta)?,
        terminating: meta.deletion_timestamp.is_some(),
        labels: meta.labels.clone().unwrap_or_default(),
    })
}

pub(crate) fn uid(meta: &ObjectMeta) -> Result<Uuid, ReconcileError> {
    meta.uid.as_deref().and_then(|u| Uuid::parse_str(u).ok()).ok_or(ReconcileError::NoUid)
}

/// Sets the writer's condition (and `observedGeneration`) when it changed.
async fn set_condition<K>(
    api: &Api<K>,
    object: &K,
    error: bool,
    reason: &str,
    message: &str,
) -> Result<(), ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + HasConditions,
{
    set_conditions(api, object, error, reason, message, None).await
}

/// [`set_condition`], with one more condition of another type set in the same patch.
async fn set_conditions<K>(
    api: &Api<K>,
    object: &K,
    error: bool,
    reason: &str,
    message: &str,
    extra: Option<Condition>,
) -> Result<(), ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + HasConditions,
{
    let generation = object.meta().generation;
    let now = object::now_rfc3339();
    let new = object::condition(error, reason, message, generation, &now);
    let existing = object.conditions();
    let unchanged_generation = object.observed_generation() == generation;
    let mut merged = object::merged_conditions(&existing, new);
    if let Some(extra) = extra {
        let base = merged.clone().unwrap_or_else(|| existing.clone());
        if let Some(next) = object::merged_conditions(&base, extra) {
            merged = Some(next);
        }
    }
    match merged {
        None if unchanged_generation => Ok(()),
        None => object::patch_status(api, &object.meta().name.clone().unwrap_or_default(), existing, generation).await,
        Some(conditions) => {
            object::patch_status(api, &object.meta().name.clone().unwrap_or_default(), conditions, generation).await
        }
    }
}

/// Read access to the status the writer patches.
pub(crate) trait HasConditions {
    fn conditions(&self) -> Vec<crate::api::Condition>;
    fn observed_generation(&self) -> Option<i64>;
}

impl HasConditions for GitOpsDeployment {
    fn conditions(&self) -> Vec<crate::api::Condition> {
        self.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default()
    }
    fn observed_generation(&self) -> Option<i64> {
        self.status.as_ref().and_then(|s| s.observed_generation)
    }
}

impl HasConditions for GitOpsDeploymentManagedEnvironment {
    fn conditions(&self) -> Vec<crate::api::Condition> {
        self.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default()
    }
    fn observed_generation(&self) -> Option<i64> {
        self.status.as_ref().and_then(|s| s.observed_generation)
    }
}

impl HasConditions for GitOpsDeploymentRepositoryCredential {
    fn conditions(&self) -> Vec<crate::api::Condition> {
        self.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default()
    }
    fn observed_generation(&self) -> Option<i64> {
        self.status.as_ref().and_then(|s| s.observed_generation)
    }
}

impl HasConditions for GitOpsDeploymentSyncRun {
    fn conditions(&self) -> Vec<crate::api::Condition> {
        self.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default()
    }
    fn observed_generation(&self) -> Option<i64> {
        self.status.as_ref().and_then(|s| s.observed_generation)
    }
}

/// Runs the watchers and workers until `cancel`; workers finish their current item.
pub async fn run_controllers(
    ctx: Arc<WriterContext>,
    settings: ControllerSettings,
    shards: watch::Receiver<Vec<i32>>,
    namespaces: Vec<String>,
    cancel: CancellationToken,
) {
    let scopes: Vec<Option<String>> =
        if namespaces.is_empty() { vec![None] } else { namespaces.iter().cloned().map(Some).collect() };
    let ctl = Arc::new(Controllers {
        unsynced: AtomicUsize::new(scopes.len() * 5),
        ctx,
        settings,
        shards: shards.clone(),
        namespaces: namespaces.into_iter().collect(),
        known: Mutex::new(HashSet::new()),
        secret_refs: Mutex::new(HashMap::new()),
        namespace_states: Mutex::new(HashMap::new()),
        home: Mutex::new(HashMap::new()),
        home_damaged: Mutex::new(HashSet::new()),
    });
    let mut tasks = JoinSet::new();
    for scope in &scopes {
        tasks.spawn(watch_kind::<GitOpsDeployment>(ctl.clone(), scope.clone(), Kind::Deployment, cancel.clone()));
        tasks.spawn(watch_kind::<GitOpsDeploymentSyncRun>(ctl.clone(), scope.clone(), Kind::SyncRun, cancel.clone()));
        tasks.spawn(watch_kind::<GitOpsDeploymentManagedEnvironment>(
            ctl.clone(),
            scope.clone(),
            Kind::Environment,
            cancel.clone(),
        ));
        tasks.spawn(watch_kind::<GitOpsDeploymentRepositoryCredential>(
            ctl.clone(),
            scope.clone(),
            Kind::RepositoryCredential,
            cancel.clone(),
        ));
        tasks.spawn(watch_secrets(ctl.clone(), scope.clone(), cancel.clone()));
        tasks.spawn(watch_namespaces(ctl.clone(), scope.clone(), cancel.clone()));
        tasks.spawn(home::watch_identity(ctl.clone(), scope.clone(), cancel.clone()));
    }
    tasks.spawn(home::renew_loop(ctl.clone(), cancel.clone()));
    tasks.spawn(requeue_on_shard_change(ctl.clone(), shards, cancel.clone()));
    for _ in 0..settings.workers.max(1) {
        tasks.spawn(worker(ctl.clone(), cancel.clone()));
    }
    while tasks.join_next().await.is_some() {}
}

/// The next item of a watch stream; None once `cancel` fires or the stream ends.
pub(crate) async fn next_or_cancelled<S: futures_util::Stream + Unpin>(
    events: &mut S,
    cancel: &CancellationToken,
) -> Option<S::Item> {
    tokio::select! {
        () = cancel.cancelled() => None,
        event = events.next() => event,
    }
}

/// Whether the writer finished with `object` as it is: not being deleted, holding
/// the finalizer, and accepted at its current generation.
fn settled<K: Resource + HasConditions>(object: &K) -> bool {
    let meta = object.meta();
    meta.deletion_timestamp.is_none()
        && object::has_finalizer(object)
        && object.conditions().iter().any(|c| {
            c.type_ == CONDITION
                && c.status == "False"
                && c.observed_generation.is_some()
                && c.observed_generation == meta.generation
        })
}

async fn watch_kind<K>(ctl: Arc<Controllers>, scope: Option<String>, kind: Kind, cancel: CancellationToken)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + HasConditions
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = match &scope {
        Some(namespace) => Api::namespaced(ctl.ctx.kube.clone(), namespace),
        None => Api::all(ctl.ctx.kube.clone()),
    };
    let mut events = watcher::watcher(api, watcher::Config::default()).default_backoff().boxed();
    let mut synced = false;
    // A SyncRun also waits on its deployment and its sync: always look again.
    let filter_settled = kind != Kind::SyncRun;
    while let Some(event) = next_or_cancelled(&mut events, &cancel).await {
        let key = |object: &K| Key {
            kind,
            namespace: object.meta().namespace.clone().unwrap_or_default(),
            name: object.meta().name.clone().unwrap_or_default(),
        };
        match event {
            Ok(Event::Apply(object)) => {
                let key = key(&object);
                ctl.known().insert(key.clone());
                // Our own writes (finalizer, condition) and the status loop's come
                // back as events; an object already settled at its generation has
                // nothing new for the writer. Other causes (a Secret, an
                // environment, a shard move) queue keys directly.
                if !(filter_settled && settled(&object)) {
                    ctl.offer(key);
                }
            }
            Ok(Event::InitApply(object)) => {
                // Everything is looked at once after a (re)start.
                let key = key(&object);
                ctl.known().insert(key.clone());
                ctl.offer(key);
            }
            Ok(Event::Delete(object)) => {
                let key = key(&object);
                ctl.known().remove(&key);
                ctl.offer(key);
            }
            Ok(Event::InitDone) => ctl.first_listing_done(&mut synced),
            Ok(Event::Init) => {}
            Err(error) => tracing::warn!(%error, ?kind, "watch failed; retrying"),
        }
    }
}

/// Keeps `namespace_states` and queues the cleanup of each namespace that starts
/// terminating or goes; after the first listing, looks for tenants whose namespace
/// went while no writer watched.
async fn watch_namespaces(ctl: Arc<Controllers>, scope: Option<String>, cancel: CancellationToken) {
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(ctl.ctx.kube.clone());
    let config = match &scope {
        Some(namespace) => watcher::Config::default().fields(&format!("metadata.name={namespace}")),
        None => watcher::Config::default(),
    };
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut synced = false;
    // Names seen in the listing under way (a relist drops namespaces that went meanwhile).
    let mut listing: HashSet<String> = HashSet::new();
    while let Some(event) = next_or_cancelled(&mut events, &cancel).await {
        match event {
            Ok(Event::Apply(object) | Event::InitApply(object)) => {
                let name = object.metadata.name.clone().unwrap_or_default();
                let Ok(state) = namespace_state_of(&object.metadata) else { continue };
                listing.insert(name.clone());
                let (terminating, uid, labels) = (state.terminating, state.uid, state.labels.clone());
                let before = ctl.namespace_states().insert(name.clone(), state);
                // Terminating, or made again under the same name: the old tenant goes.
                let replaced = before.as_ref().is_some_and(|b| b.uid != uid);
                if terminating || replaced {
                    ctl.offer(namespace_key(&name));
                }
                // Selected or unselected by a label change: look at its objects again.
                if before.is_some_and(|b| b.labels != labels) {
                    ctl.namespace_again(&name);
                }
            }
            Ok(Event::Delete(object)) => {
                let name = object.metadata.name.clone().unwrap_or_default();
                ctl.namespace_states().remove(&name);
                ctl.offer(namespace_key(&name));
            }
            Ok(Event::Init) => listing.clear(),
            Ok(Event::InitDone) => {
                let gone: Vec<String> = {
                    let mut states = ctl.namespace_states();
                    let in_scope = |name: &String| scope.as_ref().is_none_or(|only| only == name);
                    let gone: Vec<String> =
                        states.keys().filter(|name| in_scope(name) && !listing.contains(*name)).cloned().collect();
                    for name in &gone {
                        states.remove(name);
                    }
                    gone
                };
                for name in gone {
                    ctl.offer(namespace_key(&name));
                }
                ctl.first_listing_done(&mut synced);
                if let Err(error) = namespace::queue_missing(&ctl).await {
                    tracing::warn!(error = %error_chain(&error), "could not look for tenants of deleted namespaces");
                }
            }
            Err(error) => tracing::warn!(%error, "namespace watch failed; retrying"),
        }
    }
}

/// Queues the referrers of each Secret that is created, changed or deleted.
async fn watch_secrets(ctl: Arc<Controllers>, scope: Option<String>, cancel: CancellationToken) {
    // Only names matter here (metadata-only requests); the reconcile reads the Secret.
    let api: Api<PartialObjectMeta<Secret>> = match &scope {
        Some(namespace) => Api::namespaced(ctl.ctx.kube.clone(), namespace),
        None => Api::all(ctl.ctx.kube.clone()),
    };
    let mut events = watcher::watcher(api, watcher::Config::default()).default_backoff().boxed();
    while let Some(event) = next_or_cancelled(&mut events, &cancel).await {
        match event {
            Ok(Event::Apply(object) | Event::InitApply(object) | Event::Delete(object)) => {
                let namespace = object.metadata.namespace.unwrap_or_default();
                if ctl.owns(&namespace) {
                    ctl.secret_changed(&namespace, &object.metadata.name.unwrap_or_default());
                }
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "Secret watch failed; retrying"),
        }
    }
}

async fn requeue_on_shard_change(
    ctl: Arc<Controllers>,
    mut shards: watch::Receiver<Vec<i32>>,
    cancel: CancellationToken,
) {
    let mut before: BTreeSet<i32> = BTreeSet::new();
    loop {
        let now: BTreeSet<i32> = shards.borrow_and_update().iter().copied().collect();
        ctl.ctx.metrics.shards_owned.store(now.len() as u64, Ordering::Relaxed);
        let gained: BTreeSet<i32> = now.difference(&before).copied().collect();
        if !gained.is_empty() {
            let keys: Vec<Key> =
                ctl.known().iter().filter(|k| gained.contains(&shard_of(&k.namespace))).cloned().collect();
            for key in keys {
                ctl.offer(key);
            }
            // Tenants of the new shards whose namespace went while no writer watched.
            if ctl.ctx.metrics.is_ready()
                && let Err(error) = namespace::queue_missing(&ctl).await
            {
                tracing::warn!(error = %error_chain(&error), "could not look for tenants of deleted namespaces");
            }
        }
        before = now;
        tokio::select! {
            () = cancel.cancelled() => return,
            changed = shards.changed() => if changed.is_err() { return },
        }
    }
}

async fn worker(ctl: Arc<Controllers>, cancel: CancellationToken) {
    // The tenant and deployment gauges are read from `known` when rendered.
    let known = Arc::downgrade(&ctl);
    let inventory: std::sync::Weak<dyn Inventory> = known;
    ctl.ctx.metrics.set_inventory(inventory);
    while let Some(key) = ctl.ctx.queue.pop(&cancel).await {
        ctl.ctx.metrics.queue_depth.store(ctl.ctx.queue.len() as u64, Ordering::Relaxed);
        let outcome = if ctl.owns(&key.namespace) {
            match key.kind {
                Kind::Deployment => deployment::reconcile(&ctl, &key.namespace, &key.name).await,
                Kind::SyncRun => sync_run::reconcile(&ctl, &key.namespace, &key.name).await,
                Kind::Environment => environment::reconcile(&ctl, &key.namespace, &key.name).await,
                Kind::RepositoryCredential => repository_credential::reconcile(&ctl, &key.namespace, &key.name).await,
                Kind::Namespace => namespace::reconcile(&ctl, &key.namespace).await,
            }
        } else {
            Ok(Next::Done)
        };
        let metrics = &ctl.ctx.metrics;
        if outcome.is_ok() {
            ctl.ctx.queue.forget(&key);
        }
        match outcome {
            Ok(Next::Done) => {}
            Ok(Next::Settled(Settled::Ok)) => metrics.reconciled(key.kind, Outcome::Ok),
            Ok(Next::Settled(Settled::Invalid(reason))) => {
                metrics.reconciled(key.kind, Outcome::Invalid);
                metrics.validation_failed(key.kind, reason);
            }
            // The namespace's own cleanup runs from its key; nothing to retry here.
            Err(ReconcileError::NamespaceGone) => ctl.ctx.queue.forget(&key),
            Ok(Next::Retry(delay)) => {
                metrics.reconciled(key.kind, Outcome::Retry);
                ctl.ctx.queue.push_after(key.clone(), delay, &cancel);
            }
            Err(error) => {
                metrics.reconciled(key.kind, Outcome::Failed);
                let retry_in = ctl.ctx.queue.retry_later(key.clone(), &cancel);
                tracing::warn!(
                    error = %error_chain(&error),
                    tenant.ns = %key.namespace,
                    object = %key.name,
                    retry_in_ms = retry_in.as_millis() as u64,
                    "reconcile failed; retrying"
                );
            }
        }
        ctl.ctx.queue.done(&key);
    }
}
