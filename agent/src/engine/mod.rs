//! The engine boundary: what the reconciler asks of a GitOps engine, in the
//! engine's own terms but without its API types. The reconciler reads rows and
//! builds these specs; an engine (today only Argo CD, `argocd`) turns them into
//! objects. A second engine implements this trait without touching the queue or
//! the rows. Application status comes back as a stream of engine-neutral
//! `StatusEvent`s, which the agent's status watcher (`crate::status`) maps to rows.

pub mod argocd;
pub mod release;
pub mod self_fence;

use std::collections::BTreeMap;
use std::fmt;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use gitops_shared::db::credential::{ClusterCredentials, RepositoryCredentials};
use gitops_shared::model::TenantId;

/// A boxed error source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A deployment: one engine application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplicationSpec {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub project: String,
    pub repo_url: String,
    pub path: String,
    pub target_revision: String,
    pub server: String,
    pub namespace: String,
    /// Automated: prune + self-heal. Manual: syncs only on request.
    pub automated: bool,
    pub create_namespace: bool,
    /// The row generation it was built from (written on the object for the sweep).
    pub generation: Option<i64>,
}

/// A tenant's project: everything its applications may use, nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectSpec {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub source_repos: Vec<String>,
    /// (server, namespace) pairs; never a wildcard namespace.
    pub destinations: Vec<(String, String)>,
    /// Cluster-scoped resources are permitted by the project: only in the project
    /// of an environment that allows them (see `argocd::objects::project`).
    pub cluster_resources: bool,
}

/// A managed environment's cluster credentials. `Debug` (via the credentials')
/// never shows secret values.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub display_name: String,
    pub server: String,
    pub project: String,
    pub namespaces: Vec<String>,
    pub cluster_resources: bool,
    pub insecure: bool,
    pub credentials: ClusterCredentials,
    /// The row generation it was built from (written on the object for the sweep).
    pub generation: Option<i64>,
}

/// A repository credential.
#[derive(Debug, Clone)]
pub struct RepositorySpec {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub project: String,
    pub url: String,
    pub credentials: RepositoryCredentials,
    /// The row generation it was built from (written on the object for the sweep).
    pub generation: Option<i64>,
}

/// Where a deletion stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The object is gone (a read returns NotFound).
    Gone,
    /// Deletion began but the object is still there (finalizers at work).
    Pending,
}

/// A sync to request on an application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncRequest {
    pub application: String,
    pub revision: String,
    pub correlation_id: String,
}

/// The operation side of an application as the engine reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperationView {
    /// The correlation id of a requested operation not yet picked up (`Some("")`
    /// when one is pending without an id).
    pub requested: Option<String>,
    /// The current or last operation.
    pub state: Option<ObservedOperation>,
}

/// One operation's progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedOperation {
    pub correlation_id: Option<String>,
    pub phase: OperationPhase,
    pub synced_revision: Option<String>,
    pub message: Option<String>,
    /// RFC 3339.
    pub started_at: Option<String>,
    /// RFC 3339.
    pub finished_at: Option<String>,
}

/// Phases of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperationPhase {
    Running,
    Terminating,
    Succeeded,
    Failed,
    Error,
    Unknown,
}

impl OperationPhase {
    pub fn is_finished(self) -> bool {
        matches!(self, OperationPhase::Succeeded | OperationPhase::Failed | OperationPhase::Error)
    }
}

/// What the engine reports about one of its applications, in neutral terms: the
/// labels and name that lead back to the row, and the fields the agent records in
/// `application_state` and `sync_operation`. Timestamps that move without anything
/// changing (Argo CD's `reconciledAt`, `observedAt`) are left out, so two
/// observations are equal when nothing a reader cares about changed.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedApplication {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub sync_status: Option<String>,
    pub sync_revision: Option<String>,
    pub health_status: Option<String>,
    pub health_message: Option<String>,
    /// A JSON array of the resources the application manages.
    pub resources: serde_json::Value,
    /// A JSON array of the application's conditions.
    pub conditions: serde_json::Value,
    /// The current or last operation, as the engine reports it (JSON, stored as is).
    pub operation_state: Option<serde_json::Value>,
    /// The same operation, parsed (phase, correlation id, revision, times).
    pub operation: Option<ObservedOperation>,
    /// The source and destination the engine last reconciled against (JSON).
    pub reconciled_state: Option<serde_json::Value>,
}

/// One change in the engine's applications of the service.
#[derive(Debug, Clone, PartialEq)]
pub enum StatusEvent {
    /// An application was created or its status changed (or it was relisted).
    Applied(Box<ObservedApplication>),
    /// The application of this name is gone.
    Deleted(String),
    /// The stream (re)started: every application will be reported again, so
    /// whatever a consumer remembers from before may be stale.
    Restarted,
}

/// Kinds of objects an engine keeps for the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    Application,
    Project,
    Cluster,
    Repository,
}

/// An object of the service found in the engine (for the sweep).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedObject {
    pub kind: ObjectKind,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Deletion has begun.
    pub deleting: bool,
    /// An application's destination namespace as the engine holds it (None for
    /// other kinds, or when it has none).
    pub destination_namespace: Option<String>,
    /// The project an application names (None for other kinds).
    pub project: Option<String>,
    /// An application's destination server as the engine holds it (None for other kinds).
    pub destination_server: Option<String>,
    /// What the agent owns in it no longer matches the spec hash it carries (or it
    /// carries none): changed behind the agent's back, or written by an older agent.
    pub drifted: bool,
    /// The row generation it was last built from, as it says (None: it does not say).
    pub generation: Option<i64>,
}

impl ObjectKind {
    /// Every kind, in the order the sweep pages through them.
    pub const ALL: [ObjectKind; 4] =
        [ObjectKind::Application, ObjectKind::Project, ObjectKind::Cluster, ObjectKind::Repository];
}

/// One page of the service's objects of one kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnedPage {
    pub objects: Vec<OwnedObject>,
    /// Where the next page starts; None after the last.
    pub next: Option<String>,
}

/// What the engine's progress probe saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgressStamp {
    /// The engine cannot tell: it is not judged on progress.
    Unsupported,
    /// The probe exists (or was just made) but was never stamped.
    Unstamped,
    /// The stamp now; progress is a stamp that changed.
    Stamp(String),
}

/// A failed engine call, classified: transient failures are retried, refusals are
/// not. Messages name the action; the source keeps the detail for operators.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Unavailable, throttled, timed out, or failed in a way nobody classified:
    /// try again later, for as long as it takes.
    #[error("could not {action} (transient)")]
    Transient {
        action: String,
        #[source]
        source: BoxError,
    },
    /// The object changed under us (409): try again at once.
    #[error("could not {action}: it changed meanwhile")]
    Conflict {
        action: String,
        #[source]
        source: BoxError,
    },
    /// The instance, not the object, is at fault (the agent's identity is refused,
    /// the Argo CD namespace or its resource types are missing): every operation
    /// fails alike until an operator fixes it; retried, never dead-lettered.
    #[error("could not {action}: the Argo CD instance is unavailable to this agent")]
    Instance {
        action: String,
        #[source]
        source: BoxError,
    },
    #[error("could not {action}: refused")]
    Refused {
        action: String,
        /// What the tenant may read (sanitised again before it is stored).
        tenant_message: String,
        #[source]
        source: BoxError,
    },
}

/// What another instance must share for its engine to adopt what this one
/// deployed under the same application names (Argo CD: `argocd-cm`'s
/// `application.resourceTrackingMethod`, `application.instanceLabelKey` and
/// `installationID`, with Argo CD's defaults for keys not set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdoptionSettings {
    pub tracking_method: String,
    pub instance_label_key: String,
    pub installation_id: String,
}

/// The operations the reconciler needs of a GitOps engine. Applies are
/// idempotent; deletes of absent objects succeed; nothing here touches a database.
pub trait Engine: Send + Sync + fmt::Debug + 'static {
    fn apply_project<'a>(&'a self, spec: &'a ProjectSpec) -> BoxFuture<'a, Result<(), EngineError>>;
    fn delete_project<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>>;
    fn apply_application<'a>(&'a self, spec: &'a ApplicationSpec) -> BoxFuture<'a, Result<(), EngineError>>;
    fn delete_application<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>>;
    /// Removes application `name` *without pruning* what it deployed: the engine's
    /// pruning finalizer is taken off first, then the object is deleted. An engine
    /// that cannot do this refuses (it never falls back to an ordinary delete).
    fn release_application<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
        Box::pin(async move {
            Err(EngineError::Refused {
                action: format!("remove application {name} without pruning"),
                tenant_message: "the deployment could not be removed safely; an operator has been notified".into(),
                source: "this engine cannot remove an application without pruning".into(),
            })
        })
    }
    fn apply_cluster<'a>(&'a self, spec: &'a ClusterSpec) -> BoxFuture<'a, Result<(), EngineError>>;
    fn delete_cluster<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>>;
    fn apply_repository<'a>(&'a self, spec: &'a RepositorySpec) -> BoxFuture<'a, Result<(), EngineError>>;
    fn delete_repository<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>>;
    /// The operation state of application `name`; None when it does not exist.
    fn operation<'a>(&'a self, application: &'a str) -> BoxFuture<'a, Result<Option<OperationView>, EngineError>>;
    /// Requests a sync (never through the ordinary apply).
    fn request_sync<'a>(&'a self, request: &'a SyncRequest) -> BoxFuture<'a, Result<(), EngineError>>;
    /// Withdraws a requested operation that has not started.
    fn withdraw_sync<'a>(&'a self, application: &'a str) -> BoxFuture<'a, Result<(), EngineError>>;
    /// Terminates the running operation of an application.
    fn terminate<'a>(&'a self, application: &'a str) -> BoxFuture<'a, Result<(), EngineError>>;
    /// Every object of the service in the engine (by the managed-by label).
    fn list_owned(&self) -> BoxFuture<'_, Result<Vec<OwnedObject>, EngineError>>;
    /// The objects of `kind` of one tenant (by the managed-by and tenant labels).
    /// Engines that can select by label should: this is read on every project
    /// reconcile, and a tenant has few objects of an instance's many.
    fn list_tenant<'a>(
        &'a self,
        kind: ObjectKind,
        tenant: TenantId,
    ) -> BoxFuture<'a, Result<Vec<OwnedObject>, EngineError>> {
        Box::pin(async move {
            let wanted = tenant.0.to_string();
            let owned = self.list_owned().await?;
            Ok(owned
                .into_iter()
                .filter(|o| o.kind == kind && o.labels.get(crate::names::TENANT_ID_LABEL) == Some(&wanted))
                .collect())
        })
    }
    /// The service's objects (every kind) whose label `label` is `value`: a
    /// selected list, never the whole instance. The default filters [`Engine::list_owned`].
    fn list_owned_labelled<'a>(
        &'a self,
        label: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, Result<Vec<OwnedObject>, EngineError>> {
        Box::pin(async move {
            let all = self.list_owned().await?;
            Ok(all.into_iter().filter(|o| o.labels.get(label).is_some_and(|v| v == value)).collect())
        })
    }
    /// One page (at most `limit`) of the service's objects of `kind`, from where
    /// `from` (a previous page's `next`) says; the first page when None. A sweep
    /// holds one page at a time, never the whole instance. The default lists
    /// everything at once (for engines too small to page).
    fn list_owned_page<'a>(
        &'a self,
        kind: ObjectKind,
        from: Option<&'a str>,
        limit: u32,
    ) -> BoxFuture<'a, Result<OwnedPage, EngineError>> {
        let _ = limit;
        Box::pin(async move {
            if from.is_some() {
                return Ok(OwnedPage::default());
            }
            let objects = self.list_owned().await?.into_iter().filter(|o| o.kind == kind).collect();
            Ok(OwnedPage { objects, next: None })
        })
    }
    /// Whether the engine's API answers this agent (a cheap read it needs anyway).
    fn probe(&self) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(async { Ok(()) })
    }
    /// A stamp that changes while the engine itself makes progress (Argo CD: a
    /// service-owned Application's `reconciledAt`, after the refresh asked by the
    /// previous call). Engines that cannot tell keep the default.
    fn probe_progress(&self) -> BoxFuture<'_, Result<ProgressStamp, EngineError>> {
        Box::pin(async { Ok(ProgressStamp::Unsupported) })
    }
    /// How the engine tracks what its applications deploy, which decides whether
    /// another instance can adopt them (None: it cannot tell).
    fn adoption_settings(&self) -> BoxFuture<'_, Result<Option<AdoptionSettings>, EngineError>> {
        Box::pin(async { Ok(None) })
    }
    /// The engine's version as the instance publishes it (Argo CD: the image tag of
    /// its application controller's StatefulSet); None when it cannot tell.
    fn version(&self) -> BoxFuture<'_, Result<Option<String>, EngineError>> {
        Box::pin(async { Ok(None) })
    }
    /// The status of the service's applications, as a stream that never ends on its
    /// own: errors are reported as items (always transient) and the stream retries
    /// with backoff; after a restart it begins with `StatusEvent::Restarted`.
    fn status_events(&self) -> BoxStream<'_, Result<StatusEvent, EngineError>>;
}
