//! What every reconciler gets: the client, the settings, and the errors they share.

use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

/// The layer's settings (flags of `gitops-appstudio run`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long a binding whose Application does not exist is kept before it is
    /// deleted (the Application may simply not be created yet).
    pub orphan_binding_delay: Duration,
    /// When a tenant's input cannot be turned into core resources, look again after this.
    pub user_error_requeue: Duration,
    /// Every object is reconciled again after this, whatever happened (anti-entropy).
    pub resync_interval: Duration,
    /// At most this many bindings are reconciled at once (0: no limit). Each holds
    /// a connection to the API server while it waits; changes that arrive for a
    /// binding meanwhile are reconciled once, together, when its turn comes.
    pub binding_concurrency: u16,
    /// How long a promotion may wait for its deployments before it fails.
    pub promotion_timeout: Duration,
    /// How often a waiting promotion looks again (changes of its binding wake it sooner).
    pub promotion_poll: Duration,
    /// How often a DeploymentTarget being deleted looks again whether its SpaceRequest
    /// is gone, and a deleted claim whether its target is (their watches wake them
    /// sooner). The original's 30 seconds.
    pub reclaim_poll: Duration,
    /// How long the SpaceRequest of a deleted target may be terminating while it
    /// reports `UnableToTerminate` before the target is `Failed`. The original's 2 minutes.
    pub space_request_termination_timeout: Duration,
    /// Serve only this namespace (default: all).
    pub namespace: Option<String>,
    /// Loopback and link-local API URLs are accepted (`--api-url-allow-private`).
    pub api_url_allow_private: bool,
    /// Which namespaces are tenants: the core's selection (selector, name patterns,
    /// reserved namespaces), so the layer makes nothing where the core serves nobody.
    pub tenancy: gitops_shared::tenancy::NamespacePolicy,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            orphan_binding_delay: Duration::from_secs(180),
            user_error_requeue: Duration::from_secs(10),
            resync_interval: Duration::from_secs(600),
            binding_concurrency: 16,
            promotion_timeout: Duration::from_secs(600),
            promotion_poll: Duration::from_secs(15),
            reclaim_poll: Duration::from_secs(30),
            space_request_termination_timeout: Duration::from_secs(120),
            namespace: None,
            api_url_allow_private: false,
            tenancy: gitops_shared::tenancy::NamespacePolicy::default(),
        }
    }
}

/// Shared by the reconciles of every controller.
#[derive(Clone)]
pub struct Context {
    pub client: kube::Client,
    pub settings: Settings,
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// The served namespaces' metadata, from a watch (see [`namespace_closed`]).
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
}

impl Context {
    /// The context, and the watch that keeps its namespace store (to be polled
    /// for as long as the controllers run).
    pub fn new(
        client: kube::Client,
        settings: Settings,
        metrics: std::sync::Arc<crate::metrics::Metrics>,
    ) -> (Context, impl std::future::Future<Output = ()> + Send + 'static) {
        let api = kube::Api::<PartialObjectMeta<Namespace>>::all(client.clone());
        let config = match &settings.namespace {
            Some(namespace) => watcher::Config::default().fields(&format!("metadata.name={namespace}")),
            None => watcher::Config::default(),
        };
        let (namespaces, writer) = reflector::store();
        let watch = watcher(api, config)
            .default_backoff()
            .modify(|namespace| namespace.metadata.managed_fields = None)
            .reflect(writer)
            .for_each(|_| std::future::ready(()));
        (Context { client, settings, metrics, namespaces }, watch)
    }

    /// The API of a namespaced kind in the namespaces the layer serves.
    pub fn served<K>(&self) -> kube::Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        match &self.settings.namespace {
            Some(namespace) => kube::Api::namespaced(self.client.clone(), namespace),
            None => kube::Api::all(self.client.clone()),
        }
    }
}

/// Why a reconcile failed (retried with backoff). Tenant mistakes are not errors:
/// they become conditions.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("could not {action}")]
    Kube { action: &'static str, source: kube::Error },
    #[error("the object has no {0}")]
    Incomplete(&'static str),
    #[error("the watches have not listed {0} yet")]
    NotListed(&'static str),
    #[error("could not encode {what}")]
    Encode { what: &'static str, source: serde_json::Error },
}

/// A Kubernetes call's error, NotFound as None.
pub fn found<T>(result: Result<T, kube::Error>, action: &'static str) -> Result<Option<T>, ReconcileError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(source) => Err(ReconcileError::Kube { action, source }),
    }
}

/// A delete whose NotFound counts as done.
pub fn deleted<T>(result: Result<T, kube::Error>, action: &'static str) -> Result<(), ReconcileError> {
    found(result, action).map(|_| ())
}

/// What keeps the layer from acting in a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closed {
    /// Gone or being deleted: nothing is written into it.
    Terminating,
    /// Not a tenant namespace: the reason and message the object's condition gets.
    NotServed(&'static str, String),
}

/// Whether the layer may act in `name`: it exists, is not being deleted, and the
/// tenancy policy serves it. Read from the namespace store; a namespace the store
/// does not hold (not listed yet, or made a moment ago) is read from the API server.
pub async fn namespace_closed(ctx: &Context, name: &str) -> Result<Option<Closed>, ReconcileError> {
    let metadata = match ctx.namespaces.get(&ObjectRef::new(name)) {
        Some(namespace) => namespace.metadata.clone(),
        None => {
            let namespaces = kube::Api::<Namespace>::all(ctx.client.clone());
            match namespaces.get_metadata_opt(name).await {
                Ok(Some(namespace)) => namespace.metadata,
                Ok(None) => return Ok(Some(Closed::Terminating)),
                Err(source) => return Err(ReconcileError::Kube { action: "read the namespace", source }),
            }
        }
    };
    if metadata.deletion_timestamp.is_some() {
        return Ok(Some(Closed::Terminating));
    }
    let labels = metadata.labels.unwrap_or_default();
    Ok(ctx.settings.tenancy.serves(name, &labels).err().map(|not| Closed::NotServed(not.reason(), not.message(name))))
}
