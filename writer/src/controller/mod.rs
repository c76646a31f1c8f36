//! The writer's controllers: a watcher per kind feeds the work queue with the keys
//! of objects in namespaces whose shard this writer owns (and, when configured, in
//! the allowed namespaces only); N workers reconcile them. When the owned shards
//! change, every known object of a newly owned shard is queued again, so a shard
//! that moves here is reconciled from the current objects.
//!
//! Credential Secrets are watched in the same scope, but a Secret event only
//! queues the environments and repository credentials whose last reconcile named
//! it (an in-memory index built by those reconciles); other Secrets are ignored.
//!
//! Here: the shared types (errors, outcomes, settings, [`Controllers`]) and
//! `run_controllers`. Beside it: `watchers` and `worker` (the loop), `cache` (what
//! the controllers remember and the questions answered from it), `condition` (the
//! writer's condition and `refuse`), `credential` (Secrets and the one tombstone
//! path), one module per kind, `namespace` (tenant cleanup), `tenant` (placement)
//! and `home` (the tenant's own namespace as a destination).

mod cache;
mod condition;
mod credential;
mod deployment;
pub mod egress;
mod environment;
mod events;
mod finalizer_marks;
mod home;
mod namespace;
mod object;
pub mod repository_check;
mod repository_credential;
mod resync;
mod sync_run;
mod tenant;
mod watchers;
mod worker;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gitops_shared::db::DbError;
use gitops_shared::model::ManagedEnvironmentId;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub use deployment::{
    REASON_HOME_UNAVAILABLE, REASON_NO_ENGINE, REASON_QUOTA_EXCEEDED, REASON_REQUESTER_UNVERIFIED, WAIT_FOR_PRUNING,
};
pub use environment::{CONNECTION_CONDITION, REASON_CONNECTION_CHECK_DISABLED, REASON_SECRET_NOT_FOUND};
pub use environment::{connection, service_account};
pub use home::{
    DEFAULT_HOME_CLUSTER_ROLE, DEFAULT_HOME_NAMESPACE, HOME_IDENTITY, HomeSettings, HomeStatus, TENANT_NAMESPACE_LABEL,
    check_loop, check_once, home_account_name, home_binding,
};
pub use object::{CONDITION, FINALIZER, REASON_ACCEPTED, RESOURCES_FINALIZER};
pub use sync_run::{REASON_DEPLOYMENT_AUTOMATED, REASON_DEPLOYMENT_NOT_FOUND};

pub(crate) use condition::HasConditions;
use condition::{refuse, set_condition, set_conditions};
pub(crate) use watchers::next_or_cancelled;
use watchers::{requeue_on_shard_change, watch_kind, watch_namespaces, watch_secrets};
use worker::worker;

use crate::api::{
    GitOpsDeployment, GitOpsDeploymentManagedEnvironment, GitOpsDeploymentRepositoryCredential, GitOpsDeploymentSyncRun,
};
use crate::context::WriterContext;
use crate::metrics::Inventory;
use crate::work_queue::{Key, Kind};

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
    /// The object changed since it was read (its status was patched meanwhile):
    /// reconcile again at once on the fresh object.
    #[error("the object changed while it was reconciled")]
    StatusMoved,
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
    /// Finished well, and to be looked at again after this long (periodic checks).
    Revisit(Duration),
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
    /// How often anti-entropy compares rows with resources.
    pub resync_interval: Duration,
    /// Most rows one anti-entropy pass may tombstone.
    pub resync_max_tombstones: usize,
}

impl Default for ControllerSettings {
    fn default() -> Self {
        ControllerSettings {
            workers: 16,
            max_deployments: 500,
            healthy_within: Duration::from_secs(120),
            retry_delay: Duration::from_secs(10),
            prune_poll: Duration::from_secs(60),
            resync_interval: Duration::from_secs(300),
            resync_max_tombstones: 50,
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
    known: Mutex<HashMap<Key, Seen>>,
    /// Tenant-resource watch stores (kind, scope) whose listing is under way:
    /// anti-entropy compares rows only with stores listed since their last relist.
    relisting: Mutex<HashSet<(Kind, Option<String>)>>,
    /// Wakes the anti-entropy pass (shards gained).
    resync_wanted: tokio::sync::Notify,
    /// Watchers that have not finished their first listing.
    unsynced: AtomicUsize,
    /// Environment and repository credential keys → the Secret name they read last.
    secret_refs: Mutex<HashMap<Key, String>>,
    /// Namespaces in scope as the namespace watcher last saw them.
    namespace_states: Mutex<HashMap<String, NamespaceState>>,
    /// Home environments known to have a fresh token: namespace UID → (id, renew at).
    home: Mutex<HashMap<Uuid, (ManagedEnvironmentId, std::time::SystemTime)>>,
    /// Namespaces whose home identity was deleted or changed under the writer: the
    /// next reconcile makes it again and requests a new token.
    home_damaged: Mutex<HashSet<String>>,
    /// Finalizer writes of reconciles under way, and what their watch events
    /// should do (`Controllers::finalizing`).
    finalizing: Mutex<finalizer_marks::FinalizerMarks>,
}

/// What the watch store holds of a tenant resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    pub uid: Option<Uuid>,
    pub generation: Option<i64>,
    /// What its conditions told the tenant (events are published when it changes).
    pub shown: events::Shown,
}

impl Seen {
    fn of<K: kube::Resource + condition::HasConditions>(object: &K) -> Seen {
        let meta = object.meta();
        Seen {
            uid: meta.uid.as_deref().and_then(|u| Uuid::parse_str(u).ok()),
            generation: meta.generation,
            shown: events::Shown::of(&object.conditions()),
        }
    }
}

/// A namespace as the writer needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NamespaceState {
    pub uid: Uuid,
    /// Deletion has begun (`deletionTimestamp` set).
    pub terminating: bool,
}

/// The work-queue key of a namespace's tenant cleanup.
pub(crate) fn namespace_key(namespace: &str) -> Key {
    Key { kind: Kind::Namespace, namespace: namespace.to_owned(), name: namespace.to_owned() }
}

impl Inventory for Controllers {
    fn owned_counts(&self) -> (u64, u64) {
        let known = self.known();
        let mut namespaces = HashSet::new();
        let mut deployments = 0;
        for key in known.keys().filter(|key| self.owns(&key.namespace)) {
            namespaces.insert(key.namespace.as_str());
            if key.kind == Kind::Deployment {
                deployments += 1;
            }
        }
        (namespaces.len() as u64, deployments)
    }

    fn unserved_namespaces(&self) -> u64 {
        let namespaces: HashSet<String> =
            self.known().keys().filter(|key| self.owns(&key.namespace)).map(|key| key.namespace.clone()).collect();
        namespaces.iter().filter(|namespace| self.serves(namespace).is_err()).count() as u64
    }
}

fn namespace_state_of(meta: &ObjectMeta) -> Result<NamespaceState, ReconcileError> {
    Ok(NamespaceState { uid: uid(meta)?, terminating: meta.deletion_timestamp.is_some() })
}

pub(crate) fn uid(meta: &ObjectMeta) -> Result<Uuid, ReconcileError> {
    meta.uid.as_deref().and_then(|u| Uuid::parse_str(u).ok()).ok_or(ReconcileError::NoUid)
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
        known: Mutex::new(HashMap::new()),
        relisting: Mutex::new(
            scopes.iter().flat_map(|scope| Kind::TENANT_RESOURCES.map(|kind| (kind, scope.clone()))).collect(),
        ),
        resync_wanted: tokio::sync::Notify::new(),
        secret_refs: Mutex::new(HashMap::new()),
        namespace_states: Mutex::new(HashMap::new()),
        home: Mutex::new(HashMap::new()),
        home_damaged: Mutex::new(HashSet::new()),
        finalizing: Mutex::default(),
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
    tasks.spawn(service_account::renew_loop(ctl.clone(), cancel.clone()));
    tasks.spawn(requeue_on_shard_change(ctl.clone(), shards, cancel.clone()));
    tasks.spawn(resync::resync_loop(ctl.clone(), cancel.clone()));
    for _ in 0..settings.workers.max(1) {
        tasks.spawn(worker(ctl.clone(), cancel.clone()));
    }
    while tasks.join_next().await.is_some() {}
}
