//! The stand-in's Kubernetes side: a `kube::runtime::Controller` over the
//! Applications of one namespace (re-triggered when an AppProject, a repository
//! Secret or a branch head's ConfigMap changes) that
//! reads each Application and its project, asks `status::plan` what Argo CD would
//! write, and writes it as one JSON merge patch on the main resource, as Argo CD
//! does. Deletion removes Argo CD's resources finalizer. Only ordinary client
//! features are used (list/watch, get, merge patch with a `resourceVersion`
//! precondition), so the same code runs against a real API server and the
//! emulator.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::application::AppSpec;
use super::destination::{Destinations, PROBE_TTL, loopback_address, unreachable_message};
use super::heads::{HEAD_LABEL, Head, HeadStore};
use super::knobs::DESTINATION as DESTINATION_KNOB;
use super::knobs::Knobs;
use super::live;
use super::loop_guard::{LoopGuard, MAX_SELF_WRITES};
use super::project::{ProjectRules, normalize_repo_url};
use super::project_index::ProjectIndex;
use super::repository::{REPOSITORY_SELECTOR, Repositories, RepositoryCredential, source_error};
use super::status::{PlanInput, deletion_held_patch, plan};
use super::{StandinError, StandinOptions};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};

/// Argo CD's finalizer: delete the Application's resources before the Application.
pub const RESOURCES_FINALIZER: &str = "resources-finalizer.argocd.argoproj.io";
/// The field manager of every write, as Argo CD's controller names itself.
pub const FIELD_MANAGER: &str = "argocd-application-controller";
/// How often a reconcile re-reads and retries after a 409 Conflict.
const CONFLICT_ATTEMPTS: usize = 5;
/// Requeue delay after a failed reconcile.
const ERROR_REQUEUE: Duration = Duration::from_secs(2);

/// `applications.argoproj.io/v1alpha1`.
pub fn application_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"), "applications")
}

/// `appprojects.argoproj.io/v1alpha1`.
pub fn app_project_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AppProject"), "appprojects")
}

/// Why one reconcile failed; logged, then retried after a short delay.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("{action} Application {name}")]
    Application {
        action: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("read AppProject {name}")]
    Project {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("serialise Application {name}")]
    Serialize {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("list the repository Secrets for Application {name}")]
    Repositories {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("list the branch heads for Application {name}")]
    Heads {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("Application {name} still conflicted after {CONFLICT_ATTEMPTS} attempts")]
    Conflicts { name: String },
    #[error("{action} the live object of Application {name}")]
    Live {
        action: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
}

impl ReconcileError {
    fn kube_status(&self) -> Option<u16> {
        match self {
            ReconcileError::Application { source: kube::Error::Api(status), .. } => Some(status.code),
            _ => None,
        }
    }
}

struct Context {
    client: Client,
    apps: Api<DynamicObject>,
    projects: Api<DynamicObject>,
    namespace: String,
    options: StandinOptions,
    loop_guard: LoopGuard,
    destinations: Destinations,
    repositories: Arc<Repositories>,
    heads: Arc<HeadStore>,
    /// Which Applications name which project (for project events).
    index: Arc<ProjectIndex>,
    /// The controller's view of the Applications (to drop what went away).
    store: kube::runtime::reflector::Store<DynamicObject>,
    app_resource: ApiResource,
}

impl Context {
    /// Whether Application `name` is still in the controller's view.
    fn alive(&self, name: &str) -> bool {
        let key = ObjectRef::new_with(name, self.app_resource.clone()).within(&self.namespace);
        self.store.get(&key).is_some()
    }

    /// Drops state of Applications that went away, once there is as much of it as
    /// there are Applications (amortised over the reconciles that made it).
    fn prune(&self) {
        let live = self.store.len();
        if self.index.len() > 2 * live + 100 {
            self.index.retain(|name| self.alive(name));
        }
        if self.loop_guard.len() > 2 * live + 100 {
            let uids: std::collections::HashSet<String> =
                self.store.state().iter().filter_map(|app| app.uid()).collect();
            self.loop_guard.retain(|uid| uids.contains(uid));
        }
    }
}

/// Runs the controller until `cancel` fires; in-flight reconciles finish first.
/// Publishes `version` as Argo CD does: the image tag of the application
/// controller's StatefulSet (nothing runs it; only its spec is read).
async fn publish_version(client: &Client, namespace: &str, version: &str) -> Result<(), kube::Error> {
    let name = "argocd-application-controller";
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(client.clone(), namespace);
    let labels = serde_json::json!({"app.kubernetes.io/name": name});
    let set = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 0,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": name, "image": format!("quay.io/argoproj/argocd:{version}")}]},
            },
        },
    });
    sets.patch(name, &kube::api::PatchParams::apply("argocd-standin").force(), &kube::api::Patch::Apply(set)).await?;
    Ok(())
}

pub(super) async fn run_controller(
    client: Client,
    namespace: &str,
    options: StandinOptions,
    cancel: CancellationToken,
) -> Result<(), StandinError> {
    let app_resource = application_resource();
    let apps: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &app_resource);
    let projects: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &app_project_resource());
    // Fail fast, with a clear error, when the CRDs are not served.
    for (kind, api) in [("Application", &apps), ("AppProject", &projects)] {
        api.list(&ListParams::default().limit(1)).await.map_err(|source| StandinError::NotServed {
            kind,
            namespace: namespace.to_owned(),
            source,
        })?;
    }
    if let Err(error) = publish_version(&client, namespace, &options.version).await {
        warn!(argocd.ns = namespace, %error, "could not publish the stand-in's version");
    }
    info!(argocd.ns = namespace, version = %options.version, "Argo CD stand-in started");

    let controller = Controller::new_with(apps.clone(), watcher::Config::default(), app_resource.clone());
    let store = controller.store();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let repositories = Arc::new(Repositories::new(secrets.clone()));
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let heads = Arc::new(HeadStore::new(config_maps.clone()));
    let index = Arc::new(ProjectIndex::default());
    let context = Arc::new(Context {
        client,
        apps,
        projects: projects.clone(),
        namespace: namespace.to_owned(),
        options: options.clone(),
        loop_guard: LoopGuard::default(),
        destinations: Destinations::default(),
        repositories: repositories.clone(),
        heads: heads.clone(),
        index: index.clone(),
        store: store.clone(),
        app_resource: app_resource.clone(),
    });
    let repository_store = store.clone();
    let repository_resource = app_resource.clone();
    let head_store = store.clone();
    let head_resource = app_resource.clone();
    let app_namespace = namespace.to_owned();
    controller
        .watches(secrets, watcher::Config::default().labels(REPOSITORY_SELECTOR), move |secret: Secret| {
            // A repository Secret changed: the Applications of its repository are
            // judged again, by a fresh list.
            repositories.touched();
            let url = RepositoryCredential::from_secret(&secret).map(|c| c.url).unwrap_or_default();
            repository_store
                .state()
                .into_iter()
                .filter(|app| !url.is_empty() && normalize_repo_url(&source_of(app)) == url)
                .map(|app| ObjectRef::from_obj_with(app.as_ref(), repository_resource.clone()))
                .collect::<Vec<_>>()
        })
        .watches(config_maps, watcher::Config::default().labels(HEAD_LABEL), move |config_map: ConfigMap| {
            // A branch head moved (or came, or went): the Applications of its
            // repository resolve their branch again, by a fresh list.
            heads.touched();
            let url = Head::from_config_map(&config_map).map(|head| head.url).unwrap_or_default();
            head_store
                .state()
                .into_iter()
                .filter(|app| !url.is_empty() && normalize_repo_url(&source_of(app)) == url)
                .map(|app| ObjectRef::from_obj_with(app.as_ref(), head_resource.clone()))
                .collect::<Vec<_>>()
        })
        .watches_with(projects, app_project_resource(), watcher::Config::default(), move |project: DynamicObject| {
            // A project changed: the Applications that name it are re-checked (an
            // index lookup, never a scan of every Application).
            let mut refs = Vec::new();
            for app in index.apps_of(&project.name_any()) {
                let key = ObjectRef::new_with(&app, app_resource.clone()).within(&app_namespace);
                if store.get(&key).is_some() {
                    refs.push(key);
                } else {
                    index.remove(&app);
                }
            }
            refs
        })
        .with_config(ControllerConfig::default().concurrency(options.concurrency))
        .graceful_shutdown_on(cancel.cancelled_owned())
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => debug!(app.name = %object.name, "reconciled"),
                Err(controller::Error::ReconcilerFailed(error, object)) => {
                    warn!(app.name = %object.name, error = %error, cause = ?std::error::Error::source(&error).map(ToString::to_string), "reconcile failed");
                }
                Err(controller::Error::ObjectNotFound(object)) => debug!(app.name = %object.name, "object gone before reconcile"),
                Err(error) => warn!(error = %error, "Application watch failed; retrying"),
            }
        })
        .await;
    info!(argocd.ns = namespace, "Argo CD stand-in stopped");
    Ok(())
}

fn source_of(app: &DynamicObject) -> String {
    let value = app.data.get("spec").cloned().map(|spec| json!({"spec": spec})).unwrap_or(Value::Null);
    AppSpec::from_object(&value).source.repo_url
}

fn error_policy(_app: Arc<DynamicObject>, _error: &ReconcileError, _context: Arc<Context>) -> Action {
    Action::requeue(ERROR_REQUEUE)
}

async fn reconcile(app: Arc<DynamicObject>, context: Arc<Context>) -> Result<Action, ReconcileError> {
    let name = app.name_any();
    let span = info_span!("reconcile", app.name = %name, argocd.ns = %context.namespace);
    async move {
        let mut object = app.as_ref().clone();
        for attempt in 1..=CONFLICT_ATTEMPTS {
            match reconcile_object(&object, &context).await {
                Err(error) if error.kube_status() == Some(409) => {
                    debug!(attempt, "conflict; re-reading the Application");
                    match context.apps.get_opt(&name).await {
                        Ok(Some(fresh)) => object = fresh,
                        Ok(None) => return Ok(Action::await_change()),
                        Err(source) => return Err(ReconcileError::Application { action: "re-read", name, source }),
                    }
                }
                Err(error) if error.kube_status() == Some(404) => return Ok(Action::await_change()),
                other => return other,
            }
        }
        Err(ReconcileError::Conflicts { name })
    }
    .instrument(span)
    .await
}

async fn reconcile_object(app: &DynamicObject, context: &Context) -> Result<Action, ReconcileError> {
    let name = app.name_any();
    let mut annotations = app.annotations().clone();
    if let Some(health) = &context.options.health {
        annotations.entry(super::knobs::HEALTH.to_owned()).or_insert_with(|| health.clone());
    }
    let object =
        serde_json::to_value(app).map_err(|source| ReconcileError::Serialize { name: name.clone(), source })?;
    let now = Timestamp::now();
    if app.metadata.deletion_timestamp.is_some() {
        return finalize(app, &object, &annotations, now, context).await;
    }

    let project_name = AppSpec::from_object(&object).project;
    // Indexed before the project is read: a project change after the read finds it.
    context.index.set(&name, &project_name);
    context.prune();
    let project = if is_object_name(&project_name) {
        context
            .projects
            .get_opt(&project_name)
            .await
            .map_err(|source| ReconcileError::Project { name: project_name.clone(), source })?
    } else {
        None
    };
    let rules = match &project {
        Some(project) => {
            let json = serde_json::to_value(project)
                .map_err(|source| ReconcileError::Serialize { name: name.clone(), source })?;
            Some(ProjectRules::from_object(&json))
        }
        None => None,
    };
    let spec = AppSpec::from_object(&object);
    let destination_error = destination_error(&spec, &annotations, context).await;
    let credentials = context
        .repositories
        .current()
        .await
        .map_err(|source| ReconcileError::Repositories { name: name.clone(), source })?;
    let source_error = source_error(&credentials, &spec.source.repo_url, &spec.project);
    let heads = context.heads.current().await.map_err(|source| ReconcileError::Heads { name: name.clone(), source })?;
    let plan = plan(&PlanInput {
        object: &object,
        annotations: &annotations,
        project: rules.as_ref(),
        controller_namespace: &context.namespace,
        now,
        resync: context.options.resync,
        destination_error: destination_error.as_deref(),
        source_error: source_error.as_deref(),
        heads: &heads,
    });
    if !plan.unknown_knobs.is_empty() {
        warn!(knobs = ?plan.unknown_knobs, "ignoring stand-in knob annotations it does not know");
    }
    match plan.patch {
        // A fixed point: no chain of own writes to guard any more.
        None => context.loop_guard.forget(&app.uid().unwrap_or_default()),
        Some(patch) => {
            if write(context, app, patch, "write the status of").await? {
                info!(
                    sync = %plan.sync_status,
                    health = %plan.health_status,
                    operation = plan.operation_phase.as_deref(),
                    "status written"
                );
            }
        }
    }
    if context.options.live_resources && plan.sync_status == "Synced" {
        let spec = AppSpec::from_object(&object);
        let made = live::apply(&context.client, &context.namespace, &name, &spec)
            .await
            .map_err(|source| ReconcileError::Live { action: "apply", name: name.clone(), source })?;
        if made {
            info!(destination.ns = %spec.destination.namespace, "live object written");
        }
    }
    // A destination that does not answer is looked at again once its probe expires.
    let requeue_after = match (plan.requeue_after, destination_error.is_some()) {
        (Some(after), true) => Some(after.min(PROBE_TTL)),
        (None, true) => Some(PROBE_TTL),
        (after, false) => after,
    };
    Ok(requeue_after.map_or_else(Action::await_change, Action::requeue))
}

/// Why the Application's destination does not answer: a loopback server is
/// probed (cached per server), any other host follows the `destination` knob.
async fn destination_error(
    spec: &AppSpec,
    annotations: &std::collections::BTreeMap<String, String>,
    context: &Context,
) -> Option<String> {
    let server = &spec.destination.server;
    if loopback_address(server).is_some() {
        return context.destinations.probe(server).await.err().map(|cause| unreachable_message(server, &cause));
    }
    let knobs = super::knobs::Knobs::from_annotations(annotations);
    let shown = if server.is_empty() { &spec.destination.name } else { server };
    knobs.destination_unreachable.then(|| {
        unreachable_message(
            shown,
            &format!("the server does not answer (stand-in knob {DESTINATION_KNOB}=unreachable)"),
        )
    })
}

/// Deletion: "prunes" (there is nothing to prune) and removes Argo CD's resources
/// finalizer, keeping any other finalizer; the `hang` knob holds it instead.
async fn finalize(
    app: &DynamicObject,
    object: &Value,
    annotations: &BTreeMap<String, String>,
    now: Timestamp,
    context: &Context,
) -> Result<Action, ReconcileError> {
    let finalizers = app.finalizers();
    if !finalizers.iter().any(|finalizer| is_resources_finalizer(finalizer)) {
        return Ok(Action::await_change());
    }
    if Knobs::from_annotations(annotations).finalizer_hangs {
        if let Some(patch) = deletion_held_patch(object, now)
            && write(context, app, patch, "mark held deletion of").await?
        {
            info!("deletion held by knob: finalizer stays");
        }
        return Ok(Action::await_change());
    }
    if context.options.live_resources {
        let name = app.name_any();
        live::prune(&context.client, &name, &AppSpec::from_object(object))
            .await
            .map_err(|source| ReconcileError::Live { action: "prune", name, source })?;
    }
    let remaining: Vec<&String> = finalizers.iter().filter(|finalizer| !is_resources_finalizer(finalizer)).collect();
    if write(context, app, json!({"metadata": {"finalizers": remaining}}), "remove the finalizer of").await? {
        context.loop_guard.forget(&app.uid().unwrap_or_default());
        context.index.remove(&app.name_any());
        info!("resources pruned; finalizer removed");
    }
    Ok(Action::await_change())
}

/// `resources-finalizer.argocd.argoproj.io` and its `/background`, `/foreground` forms.
fn is_resources_finalizer(finalizer: &str) -> bool {
    finalizer == RESOURCES_FINALIZER
        || finalizer.strip_prefix(RESOURCES_FINALIZER).is_some_and(|rest| rest.starts_with('/'))
}

/// A merge patch with the object's `resourceVersion` as precondition, so a write
/// computed from a stale read fails with 409 and is recomputed. `false`: the
/// loop guard refused it (logged).
async fn write(
    context: &Context,
    app: &DynamicObject,
    mut patch: Value,
    action: &'static str,
) -> Result<bool, ReconcileError> {
    let name = app.name_any();
    let uid = app.uid().unwrap_or_default();
    let before = app.resource_version().unwrap_or_default();
    if !context.loop_guard.allows(&uid, &before) {
        warn!(
            writes = MAX_SELF_WRITES,
            "not writing: the last writes did not stick (does the CRD prune fields the stand-in writes?); waiting for another change"
        );
        return Ok(false);
    }
    if let Some(patch) = patch.as_object_mut().filter(|_| !before.is_empty()) {
        let metadata = patch.entry("metadata").or_insert_with(|| json!({}));
        if let Some(metadata) = metadata.as_object_mut() {
            metadata.insert("resourceVersion".to_owned(), json!(before));
        }
    }
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.to_owned()), ..PatchParams::default() };
    let written = context
        .apps
        .patch(&name, &params, &Patch::Merge(&patch))
        .await
        .map_err(|source| ReconcileError::Application { action, name, source })?;
    context.loop_guard.record(&uid, &before, &written.resource_version().unwrap_or_default());
    Ok(true)
}

/// A name the API server could hold (a DNS-1123 subdomain); anything else is
/// not looked up (it would change the request path) and counts as missing.
fn is_object_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_finalizer_forms() {
        assert!(is_resources_finalizer(RESOURCES_FINALIZER));
        assert!(is_resources_finalizer("resources-finalizer.argocd.argoproj.io/background"));
        assert!(!is_resources_finalizer("resources-finalizer.argocd.argoproj.io.other"));
        assert!(!is_resources_finalizer("example.invalid/keep"));
    }

    #[test]
    fn object_names() {
        assert!(is_object_name("tenant-a.b"));
        for bad in ["", "Tenant", "a/b", "-a", "a-", "a b", "..%2f"] {
            assert!(!is_object_name(bad), "{bad}");
        }
    }
}
