//! What the binding controller reads from its own watches instead of asking the API
//! server on every reconcile: the bindings, Environments, Applications (metadata
//! only), Snapshots and GitOpsDeployments of the namespaces it serves.
//!
//! Each watch also wakes the bindings its objects concern (only for a change of
//! what a binding reads: see [`super::changes`]), and a reflector writes an object
//! into its store before the wake-up leaves it, so a reconcile sees at least the
//! version that woke it. A store may lag behind the API server by an event; what
//! a reconcile decides on a stale object is corrected by the reconcile the newer
//! object wakes. Objects are trimmed before they are stored (managed fields, and of
//! a deployment's status all but its sync and health), so a store of ten thousand
//! deployments stays a few megabytes.

use std::fmt::Debug;

use futures_util::{Stream, StreamExt, TryStreamExt};
use gitops_writer::api::GitOpsDeployment;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::changes::{self, Changes};
use super::index::Index;
use crate::api::{Application, Environment, Snapshot, SnapshotEnvironmentBinding};
use crate::context::{Context, ReconcileError};

/// How long a reconcile waits for the stores' first lists before it fails (and is
/// retried).
const LIST_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The stores; see the module's documentation.
#[derive(Clone)]
pub struct Cache {
    pub bindings: Store<SnapshotEnvironmentBinding>,
    /// Bindings by namespace, application and environment ([`pair_key`]).
    pub pairs: Index<SnapshotEnvironmentBinding>,
    /// GitOpsDeployments by the UID of the binding that controls them.
    pub owned: Index<GitOpsDeployment>,
    pub environments: Store<Environment>,
    pub applications: Store<PartialObjectMeta<Application>>,
    pub snapshots: Store<Snapshot>,
    pub deployments: Store<GitOpsDeployment>,
}

/// The watch streams that fill the stores, to be handed to the controller as its
/// triggers (the controller polls them; nothing else does).
pub struct Feeds {
    /// The bindings themselves: the controller's own stream.
    pub bindings: Fed<SnapshotEnvironmentBinding>,
    pub environments: Fed<Environment>,
    pub applications: Fed<PartialObjectMeta<Application>>,
    pub snapshots: Fed<Snapshot>,
    pub deployments: Fed<GitOpsDeployment>,
}

/// A watch stream, through a store, of the objects it was asked for (every one
/// touched, or only those that exist).
pub type Fed<K> = std::pin::Pin<Box<dyn Stream<Item = Result<K, watcher::Error>> + Send>>;

impl Cache {
    /// The stores and the streams that fill them.
    pub fn new(ctx: &Context, config: &watcher::Config) -> (Cache, Feeds) {
        let pairs = Index::new(|binding: &SnapshotEnvironmentBinding| {
            Some(pair_key(
                &binding.namespace().unwrap_or_default(),
                &binding.spec.application,
                &binding.spec.environment,
            ))
        });
        let owned = Index::new(|deployment: &GitOpsDeployment| {
            deployment.owner_references().iter().find(|o| o.controller == Some(true)).map(|o| o.uid.clone())
        });
        let (bindings, binding_feed) =
            reflected(ctx.served(), config, trim_meta, Some(pairs.clone()), Some(changes::binding_inputs), Feed::Own);
        let (environments, environment_feed) =
            reflected(ctx.served(), config, trim_meta, None, Some(changes::environment_inputs), Feed::Touched);
        let (snapshots, snapshot_feed) =
            reflected(ctx.served(), config, trim_meta, None, Some(changes::snapshot_inputs), Feed::Touched);
        let (deployments, deployment_feed) = reflected(
            ctx.served(),
            config,
            trim_deployment,
            Some(owned.clone()),
            Some(changes::deployment_inputs),
            Feed::Touched,
        );
        let (applications, application_feed) =
            reflected(ctx.served(), config, trim_meta, None, Some(changes::application_inputs), Feed::Touched);
        let cache = Cache { bindings, pairs, owned, environments, applications, snapshots, deployments };
        let feeds = Feeds {
            bindings: binding_feed,
            environments: environment_feed,
            applications: application_feed,
            snapshots: snapshot_feed,
            deployments: deployment_feed,
        };
        (cache, feeds)
    }

    /// Waits until every store holds its first complete list, so an object missing
    /// from a store is missing from the API server too (as of that list). A watch
    /// that cannot list (a kind not installed, access refused) fails the reconcile
    /// after a while, to be retried, rather than holding it.
    pub async fn ready(&self) -> Result<(), ReconcileError> {
        let lists = async {
            // A writer is dropped only when the controller stops, and its reconciles with it.
            let _ = tokio::join!(
                self.bindings.wait_until_ready(),
                self.environments.wait_until_ready(),
                self.applications.wait_until_ready(),
                self.snapshots.wait_until_ready(),
                self.deployments.wait_until_ready(),
            );
        };
        tokio::time::timeout(LIST_WAIT, lists).await.map_err(|_| {
            ReconcileError::NotListed("bindings, Environments, Applications, Snapshots and GitOpsDeployments")
        })
    }

    pub fn environment(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Environment>> {
        self.environments.get(&ObjectRef::new(name).within(namespace))
    }

    pub fn application_exists(&self, namespace: &str, name: &str) -> bool {
        self.applications.get(&ObjectRef::new(name).within(namespace)).is_some()
    }

    pub fn snapshot(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Snapshot>> {
        self.snapshots.get(&ObjectRef::new(name).within(namespace))
    }

    pub fn deployment(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<GitOpsDeployment>> {
        self.deployments.get(&ObjectRef::new(name).within(namespace))
    }

    /// The deployments the binding with `uid` controls.
    pub fn owned_by(&self, uid: &str) -> Vec<std::sync::Arc<GitOpsDeployment>> {
        let members = self.owned.members(uid);
        members.iter().filter_map(|(namespace, name)| self.deployment(namespace, name)).collect()
    }

    /// The bindings of `namespace` for `application` and `environment`.
    pub fn bindings_for(
        &self,
        namespace: &str,
        application: &str,
        environment: &str,
    ) -> Vec<std::sync::Arc<SnapshotEnvironmentBinding>> {
        let members = self.pairs.members(&pair_key(namespace, application, environment));
        members
            .iter()
            .filter_map(|(namespace, name)| self.bindings.get(&ObjectRef::new(name).within(namespace)))
            .collect()
    }
}

/// The key of a binding's namespace, application and environment (none of them
/// can hold a `/`).
fn pair_key(namespace: &str, application: &str, environment: &str) -> String {
    format!("{namespace}/{application}/{environment}")
}

/// Which objects the stream of a store gives its controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Feed {
    /// Every object touched, deletions too: the triggers of another kind's controller.
    Touched,
    /// Only objects that exist, for the controller of the kind itself, as
    /// `Controller::new` has it (a deleted one would be looked up in the store, not
    /// found, and counted as a failed reconcile).
    Own,
}

/// A store of `api`'s objects, trimmed by `trim` (and followed by `index`), and the
/// stream that fills it, giving the objects `feed` says; with a `fingerprint`, only
/// those whose fingerprint changed (see [`changes`]).
pub(crate) fn reflected<K>(
    api: Api<K>,
    config: &watcher::Config,
    trim: fn(&mut K),
    index: Option<Index<K>>,
    fingerprint: Option<fn(&K) -> u64>,
    feed: Feed,
) -> (Store<K>, Fed<K>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let events = watcher(api, config.clone())
        .default_backoff()
        .modify(trim)
        .inspect_ok(move |event| {
            if let Some(index) = &index {
                index.apply(event);
            }
        })
        .reflect(writer);
    let mut changes = fingerprint.map(Changes::new);
    let events = events.filter(move |event| {
        let wakes = match (&mut changes, event) {
            (Some(changes), Ok(event)) => changes.wakes(event),
            _ => true,
        };
        std::future::ready(wakes)
    });
    let objects = match feed {
        Feed::Touched => events.touched_objects().boxed(),
        Feed::Own => events.applied_objects().boxed(),
    };
    (store, objects)
}

/// Drops an object's managed fields, which no controller of the layer reads and
/// which are often most of a small object's size.
pub(crate) fn trim_meta<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// Keeps of a deployment what a binding reads: names, labels, owners, spec, and the
/// sync and health of its status.
fn trim_deployment(deployment: &mut GitOpsDeployment) {
    let meta = &mut deployment.metadata;
    meta.managed_fields = None;
    meta.annotations = None;
    meta.finalizers = None;
    meta.resource_version = None;
    meta.creation_timestamp = None;
    meta.generation = None;
    meta.uid = None;
    if let Some(labels) = meta.labels.as_mut() {
        labels.retain(|key, _| key.contains(crate::names::APPSTUDIO_LABEL_MARK));
    }
    if let Some(status) = deployment.status.as_mut() {
        status.conditions.clear();
        status.resources.clear();
        status.reconciled_state = None;
        status.operation_state = None;
        status.observed_generation = None;
        if let Some(health) = status.health.as_mut() {
            health.message = None;
        }
    }
}
