//! What the binding controller reads from its own watches instead of asking the API
//! server on every reconcile: the bindings, Environments, Applications (metadata
//! only), Snapshots and GitOpsDeployments of the namespaces it serves.
//!
//! Each watch also wakes the bindings its objects concern, and a reflector writes an
//! object into its store before the wake-up leaves it, so a reconcile sees at least
//! the version that woke it. A store may lag behind the API server by an event; what
//! a reconcile decides on a stale object is corrected by the reconcile the newer
//! object wakes. Objects are trimmed before they are stored (managed fields, and of
//! a deployment's status all but its sync and health), so a store of ten thousand
//! deployments stays a few megabytes.

use std::fmt::Debug;

use futures_util::{Stream, StreamExt};
use gitops_writer::api::GitOpsDeployment;
use kube::Resource;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

use crate::api::{Application, Environment, Snapshot, SnapshotEnvironmentBinding};
use crate::context::{Context, ReconcileError};

/// How long a reconcile waits for the stores' first lists before it fails (and is
/// retried).
const LIST_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The stores; see the module's documentation.
#[derive(Clone)]
pub struct Cache {
    pub bindings: Store<SnapshotEnvironmentBinding>,
    pub environments: Store<Environment>,
    pub applications: Store<PartialObjectMeta<Application>>,
    pub snapshots: Store<Snapshot>,
    pub deployments: Store<GitOpsDeployment>,
}

/// The watch streams that fill the stores, to be handed to the controller as its
/// triggers (the controller polls them; nothing else does).
pub struct Feeds {
    pub environments: Fed<Environment>,
    pub applications: Fed<PartialObjectMeta<Application>>,
    pub snapshots: Fed<Snapshot>,
    pub deployments: Fed<GitOpsDeployment>,
}

/// A watch stream, through a store, of the objects it touched.
pub type Fed<K> = std::pin::Pin<Box<dyn Stream<Item = Result<K, watcher::Error>> + Send>>;

impl Cache {
    /// The stores, with `bindings` the controller's own, and the streams that fill
    /// the others.
    pub fn new(ctx: &Context, bindings: Store<SnapshotEnvironmentBinding>, config: &watcher::Config) -> (Cache, Feeds) {
        let (environments, environment_feed) = reflected(ctx.served::<Environment>(), config, trim_meta);
        let (snapshots, snapshot_feed) = reflected(ctx.served::<Snapshot>(), config, trim_meta);
        let (deployments, deployment_feed) = reflected(ctx.served::<GitOpsDeployment>(), config, trim_deployment);
        let (applications, writer) = reflector::store();
        let application_feed = watcher(ctx.served::<PartialObjectMeta<Application>>(), config.clone())
            .default_backoff()
            .modify(|app: &mut PartialObjectMeta<Application>| app.metadata.managed_fields = None)
            .reflect(writer)
            .touched_objects()
            .boxed();
        let cache = Cache { bindings, environments, applications, snapshots, deployments };
        let feeds = Feeds {
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

    /// The deployments of `namespace` that `matches` accepts.
    pub fn deployments_where(
        &self,
        namespace: &str,
        matches: impl Fn(&GitOpsDeployment) -> bool,
    ) -> Vec<std::sync::Arc<GitOpsDeployment>> {
        self.deployments
            .state()
            .into_iter()
            .filter(|d| d.metadata.namespace.as_deref() == Some(namespace) && matches(d))
            .collect()
    }

    /// The bindings of `namespace` that `matches` accepts.
    pub fn bindings_where(
        &self,
        namespace: &str,
        matches: impl Fn(&SnapshotEnvironmentBinding) -> bool,
    ) -> Vec<std::sync::Arc<SnapshotEnvironmentBinding>> {
        self.bindings
            .state()
            .into_iter()
            .filter(|b| b.metadata.namespace.as_deref() == Some(namespace) && matches(b))
            .collect()
    }
}

/// A store of `api`'s objects, trimmed by `trim`, and the stream that fills it.
fn reflected<K>(api: Api<K>, config: &watcher::Config, trim: fn(&mut K)) -> (Store<K>, Fed<K>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let feed = watcher(api, config.clone()).default_backoff().modify(trim).reflect(writer).touched_objects().boxed();
    (store, feed)
}

fn trim_meta<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// Keeps of a deployment what a binding reads: names, labels, owners, spec, and the
/// sync and health of its status.
fn trim_deployment(deployment: &mut GitOpsDeployment) {
    deployment.metadata.managed_fields = None;
    deployment.metadata.annotations = None;
    if let Some(status) = deployment.status.as_mut() {
        status.conditions.clear();
        status.resources.clear();
        status.reconciled_state = None;
        status.operation_state = None;
    }
}
