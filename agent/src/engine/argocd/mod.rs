//! The Argo CD engine: Applications, AppProjects and cluster/repository Secrets
//! in one instance's namespace, written with server-side apply (field manager
//! `gitops-agent`, `force`), syncs requested through a merge patch on `.operation`
//! under their own field manager, terminations as the Argo CD CLI does them.
//! Errors are classified here: 409/429/5xx and connection failures are transient;
//! 400/403/422 and other refusals are permanent. Application status is watched
//! and read in `status`.

pub mod fingerprint;
pub mod objects;
pub mod probe;
pub mod status;

use std::collections::BTreeMap;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::{
    ApplicationSpec, ClusterSpec, Engine, EngineError, ObjectKind, OperationPhase, OperationView, OwnedObject,
    OwnedPage, ProjectSpec, Removal, RepositorySpec, StatusEvent, SyncRequest,
};
use crate::names::{FIELD_MANAGER, MANAGED_BY_LABEL, MANAGED_BY_VALUE, SYNC_FIELD_MANAGER, TENANT_ID_LABEL};
use gitops_shared::model::TenantId;

/// Tries at removing the resources finalizer before a conflict is left to the queue's retry.
const RELEASE_ATTEMPTS: u32 = 5;

/// `applications.argoproj.io/v1alpha1`.
pub fn application_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"), "applications")
}

/// `appprojects.argoproj.io/v1alpha1`.
pub fn app_project_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AppProject"), "appprojects")
}

/// Argo CD's settings ConfigMap.
const ARGOCD_CM: &str = "argocd-cm";

/// The StatefulSet of Argo CD's application controller, whose image tag is the
/// instance's version (the name every Argo CD install and the operator give it).
pub const APPLICATION_CONTROLLER: &str = "argocd-application-controller";

/// The version in an image reference: its tag (`quay.io/argoproj/argocd:v2.14.2`
/// → `v2.14.2`), without a digest; None for an untagged image.
pub fn image_version(image: &str) -> Option<String> {
    let image = image.split('@').next().unwrap_or(image);
    let last = image.rsplit('/').next().unwrap_or(image);
    let (_, tag) = last.split_once(':')?;
    (!tag.is_empty()).then(|| tag.to_owned())
}

/// One Argo CD instance, reached through `client`, reading `namespace`.
#[derive(Clone)]
pub struct ArgoCdEngine {
    client: Client,
    namespace: String,
}

impl std::fmt::Debug for ArgoCdEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArgoCdEngine").field("namespace", &self.namespace).finish_non_exhaustive()
    }
}

/// Errors no class was found for (treated as transient); counted process-wide.
pub static UNCLASSIFIED_ERRORS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Turns a kube error into a classified engine error: the object refused (400,
/// 405, 413, 415, 422) is permanent; the agent's identity refused (401, 403) or
/// a missing namespace or resource type (404) is the instance's fault; 409 is a
/// conflict; throttling, timeouts, 5xx and connection failures are transient, and
/// so is anything else (counted, so that it gets a class).
pub fn classify(action: String, error: kube::Error) -> EngineError {
    enum Class {
        Refused(String),
        Instance,
        Conflict,
        Transient,
        Unclassified,
    }
    let class = match &error {
        kube::Error::Api(status) => match status.code {
            400 | 405 | 413 | 415 | 422 => Class::Refused(status.message.clone()),
            401 | 403 | 404 => Class::Instance,
            409 => Class::Conflict,
            408 | 410 | 429 | 500.. => Class::Transient,
            _ => Class::Unclassified,
        },
        kube::Error::SerdeError(e) => Class::Refused(e.to_string()),
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::Auth(_) => Class::Transient,
        _ => Class::Unclassified,
    };
    let source: crate::engine::BoxError = Box::new(error);
    match class {
        Class::Refused(reason) => {
            let tenant_message = format!("Argo CD refused to {action}: {reason}");
            EngineError::Refused { tenant_message, action, source }
        }
        Class::Instance => EngineError::Instance { action, source },
        Class::Conflict => EngineError::Conflict { action, source },
        Class::Transient => EngineError::Transient { action, source },
        Class::Unclassified => {
            UNCLASSIFIED_ERRORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(%action, error = %gitops_shared::telemetry::error_chain(source.as_ref()), "unclassified Argo CD error: retried as transient");
            EngineError::Transient { action, source }
        }
    }
}

fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

fn owned_by_us(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels.and_then(|l| l.get(MANAGED_BY_LABEL)).is_some_and(|v| v == MANAGED_BY_VALUE)
}

impl ArgoCdEngine {
    pub fn new(client: Client, namespace: impl Into<String>) -> Self {
        ArgoCdEngine { client, namespace: namespace.into() }
    }

    /// The Argo CD namespace this engine writes to.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn applications(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.namespace, &application_resource())
    }

    fn projects(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.namespace, &app_project_resource())
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn apply<K, T>(api: &Api<K>, what: &str, name: &str, object: &T) -> Result<(), EngineError>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
        T: Serialize + std::fmt::Debug,
    {
        api.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(object))
            .await
            .map(|_| ())
            .map_err(|e| classify(format!("apply {what} {name}"), e))
    }

    /// Deletes `name` if it is ours (an object without our label is not touched)
    /// and reports whether it is gone, judged by a fresh read.
    async fn delete<K>(api: Api<K>, what: &str, name: &str) -> Result<Removal, EngineError>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let read = |e| classify(format!("read {what} {name}"), e);
        let Some(existing) = api.get_opt(name).await.map_err(read)? else { return Ok(Removal::Gone) };
        if !owned_by_us(existing.meta().labels.as_ref()) {
            tracing::warn!(object.kind = what, object.name = name, "not deleting an object the agent does not own");
            return Ok(Removal::Gone);
        }
        if existing.meta().deletion_timestamp.is_none() {
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => return Ok(Removal::Gone),
                Err(e) => return Err(classify(format!("delete {what} {name}"), e)),
            }
        }
        let still = api.get_opt(name).await.map_err(|e| classify(format!("read {what} {name}"), e))?;
        Ok(if still.is_some() { Removal::Pending } else { Removal::Gone })
    }

    async fn merge(
        &self,
        name: &str,
        manager: &str,
        patch: serde_json::Value,
        action: &str,
    ) -> Result<(), EngineError> {
        let params = PatchParams { field_manager: Some(manager.to_owned()), ..PatchParams::default() };
        self.applications()
            .patch(name, &params, &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| classify(format!("{action} on Application {name}"), e))
    }

    /// One page of the owned objects of `kind` (`limit` 0: all of them), those
    /// with label `also` too when given.
    async fn list_page(
        &self,
        kind: ObjectKind,
        from: Option<&str>,
        limit: u32,
        also: Option<(&str, &str)>,
    ) -> Result<OwnedPage, EngineError> {
        let mut selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}");
        if let Some((label, value)) = also {
            selector.push_str(&format!(",{label}={value}"));
        }
        match kind {
            ObjectKind::Cluster => selector.push_str(&format!(",{}=cluster", objects::SECRET_TYPE_LABEL)),
            ObjectKind::Repository => selector.push_str(&format!(",{}=repository", objects::SECRET_TYPE_LABEL)),
            ObjectKind::Application | ObjectKind::Project => {}
        }
        let mut params = ListParams::default().labels(&selector);
        if limit > 0 {
            params = params.limit(limit);
        }
        if let Some(from) = from {
            params = params.continue_token(from);
        }
        match kind {
            ObjectKind::Application => Self::page(self.applications(), kind, &params).await,
            ObjectKind::Project => Self::page(self.projects(), kind, &params).await,
            ObjectKind::Cluster | ObjectKind::Repository => Self::page(self.secrets(), kind, &params).await,
        }
    }

    async fn page<K>(api: Api<K>, kind: ObjectKind, params: &ListParams) -> Result<OwnedPage, EngineError>
    where
        K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
    {
        let list = api.list(params).await.map_err(|e| classify(format!("list {kind:?} objects"), e))?;
        let next = list.metadata.continue_.filter(|c| !c.is_empty());
        let objects = list
            .items
            .into_iter()
            .map(|item| {
                let value = serde_json::to_value(&item).unwrap_or(serde_json::Value::Null);
                let (drifted, generation) = fingerprint::inspect(kind, &value);
                let spec_text = |pointer: &str| {
                    (kind == ObjectKind::Application)
                        .then(|| value.pointer(pointer).and_then(|v| v.as_str()).map(str::to_owned))
                        .flatten()
                };
                let meta = item.meta();
                OwnedObject {
                    kind,
                    name: meta.name.clone().unwrap_or_default(),
                    labels: meta.labels.clone().unwrap_or_default(),
                    deleting: meta.deletion_timestamp.is_some(),
                    destination_namespace: spec_text("/spec/destination/namespace"),
                    project: spec_text("/spec/project"),
                    destination_server: spec_text("/spec/destination/server"),
                    drifted,
                    generation,
                }
            })
            .collect();
        Ok(OwnedPage { objects, next })
    }
}

impl Engine for ArgoCdEngine {
    fn apply_project<'a>(&'a self, spec: &'a ProjectSpec) -> BoxFuture<'a, Result<(), EngineError>> {
        Box::pin(async move {
            Self::apply(&self.projects(), "AppProject", &spec.name, &objects::project(spec, &self.namespace)).await
        })
    }

    fn delete_project<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
        Box::pin(Self::delete(self.projects(), "AppProject", name))
    }

    fn apply_application<'a>(&'a self, spec: &'a ApplicationSpec) -> BoxFuture<'a, Result<(), EngineError>> {
        Box::pin(async move {
            let api = self.applications();
            // The API server refuses new finalizers once deletion began: an
            // Application on its way out is recreated after it is gone.
            let existing =
                api.get_opt(&spec.name).await.map_err(|e| classify(format!("read Application {}", spec.name), e))?;
            if existing.is_some_and(|app| app.metadata.deletion_timestamp.is_some()) {
                return Err(EngineError::Transient {
                    action: format!("apply Application {}", spec.name),
                    source: "the Application is still being deleted".into(),
                });
            }
            Self::apply(&api, "Application", &spec.name, &objects::application(spec, &self.namespace)).await
        })
    }

    fn delete_application<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
        Box::pin(Self::delete(self.applications(), "Application", name))
    }

    fn release_application<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
        Box::pin(async move {
            let api = self.applications();
            let mut attempt = 1;
            loop {
                let read = |e| classify(format!("read Application {name}"), e);
                let Some(existing) = api.get_opt(name).await.map_err(read)? else { return Ok(Removal::Gone) };
                if !owned_by_us(existing.metadata.labels.as_ref()) {
                    tracing::warn!(
                        object.kind = "Application",
                        object.name = name,
                        "not removing an object the agent does not own"
                    );
                    return Ok(Removal::Gone);
                }
                let finalizers = existing.metadata.finalizers.clone().unwrap_or_default();
                if !finalizers.iter().any(|f| objects::is_resources_finalizer(f)) {
                    break;
                }
                // A merge patch replaces the whole list (whoever set the finalizer), and
                // the resourceVersion makes it conditional on the list read: a change in
                // between (Argo CD writing status) is a conflict, and the list is read
                // again — never a lost finalizer of someone else.
                let remaining: Vec<&String> =
                    finalizers.iter().filter(|f| !objects::is_resources_finalizer(f)).collect();
                let patch = json!({"metadata": {
                    "resourceVersion": existing.metadata.resource_version,
                    "finalizers": if remaining.is_empty() { serde_json::Value::Null } else { json!(remaining) },
                }});
                let params = PatchParams { field_manager: Some(FIELD_MANAGER.to_owned()), ..PatchParams::default() };
                match api.patch(name, &params, &Patch::Merge(&patch)).await {
                    Ok(_) => break,
                    Err(kube::Error::Api(status)) if status.code == 409 && attempt < RELEASE_ATTEMPTS => attempt += 1,
                    Err(e) if is_not_found(&e) => return Ok(Removal::Gone),
                    Err(e) => return Err(classify(format!("remove the resources finalizer of Application {name}"), e)),
                }
            }
            Self::delete(api, "Application", name).await
        })
    }

    fn apply_cluster<'a>(&'a self, spec: &'a ClusterSpec) -> BoxFuture<'a, Result<(), EngineError>> {
        Box::pin(async move {
            Self::apply(&self.secrets(), "cluster Secret", &spec.name, &objects::cluster_secret(spec, &self.namespace))
                .await
        })
    }

    fn delete_cluster<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
        Box::pin(Self::delete(self.secrets(), "cluster Secret", name))
    }

    fn apply_repository<'a>(&'a self, spec: &'a RepositorySpec) -> BoxFuture<'a, Result<(), EngineError>> {
        Box::pin(async move {
            let secret = objects::repository_secret(spec, &self.namespace);
            Self::apply(&self.secrets(), "repository Secret", &spec.name, &secret).await
        })
    }

    fn delete_repository<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
        Box::pin(Self::delete(self.secrets(), "repository Secret", name))
    }

    fn operation<'a>(&'a self, application: &'a str) -> BoxFuture<'a, Result<Option<OperationView>, EngineError>> {
        Box::pin(async move {
            let app = self
                .applications()
                .get_opt(application)
                .await
                .map_err(|e| classify(format!("read Application {application}"), e))?;
            Ok(app.map(|app| {
                let value = serde_json::to_value(&app).unwrap_or_default();
                objects::operation_view(&value)
            }))
        })
    }

    fn request_sync<'a>(&'a self, request: &'a SyncRequest) -> BoxFuture<'a, Result<(), EngineError>> {
        Box::pin(async move {
            let patch = objects::sync_operation(&request.revision, &request.correlation_id);
            self.merge(&request.application, SYNC_FIELD_MANAGER, patch, "request a sync").await
        })
    }

    fn withdraw_sync<'a>(&'a self, application: &'a str) -> BoxFuture<'a, Result<(), EngineError>> {
        Box::pin(self.merge(application, SYNC_FIELD_MANAGER, json!({"operation": null}), "withdraw a sync"))
    }

    fn terminate<'a>(&'a self, application: &'a str) -> BoxFuture<'a, Result<(), EngineError>> {
        Box::pin(async move {
            // As `argocd app terminate-op`: only a running operation is terminated.
            let view = self.operation(application).await?;
            let running = view.and_then(|v| v.state).is_some_and(|s| s.phase == OperationPhase::Running);
            if !running {
                return Ok(());
            }
            let patch = json!({"status": {"operationState": {"phase": "Terminating"}}});
            self.merge(application, SYNC_FIELD_MANAGER, patch, "terminate a sync").await
        })
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(async move {
            let one = ListParams::default().limit(1);
            self.applications().list_metadata(&one).await.map_err(|e| classify("list Applications".into(), e))?;
            Ok(())
        })
    }

    fn probe_progress(&self) -> BoxFuture<'_, Result<crate::engine::ProgressStamp, EngineError>> {
        Box::pin(self.probe_progress_once())
    }

    fn adoption_settings(&self) -> BoxFuture<'_, Result<Option<crate::engine::AdoptionSettings>, EngineError>> {
        Box::pin(async move {
            let config: Api<k8s_openapi::api::core::v1::ConfigMap> =
                Api::namespaced(self.client.clone(), &self.namespace);
            let data = match config.get_opt(ARGOCD_CM).await {
                Ok(found) => found.and_then(|cm| cm.data).unwrap_or_default(),
                // Not allowed to read it: the settings are unknown, not a fault.
                Err(kube::Error::Api(status)) if status.code == 403 => return Ok(None),
                Err(error) => return Err(classify(format!("read ConfigMap {ARGOCD_CM}"), error)),
            };
            let setting = |key: &str, default: &str| {
                data.get(key).map(|v| v.trim()).filter(|v| !v.is_empty()).unwrap_or(default).to_owned()
            };
            Ok(Some(crate::engine::AdoptionSettings {
                tracking_method: setting("application.resourceTrackingMethod", "label"),
                instance_label_key: setting("application.instanceLabelKey", "app.kubernetes.io/instance"),
                installation_id: setting("installationID", ""),
            }))
        })
    }

    fn version(&self) -> BoxFuture<'_, Result<Option<String>, EngineError>> {
        Box::pin(async move {
            let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> =
                Api::namespaced(self.client.clone(), &self.namespace);
            let set = match sets.get_opt(APPLICATION_CONTROLLER).await {
                Ok(found) => found,
                // Not allowed to read it: the version is unknown, not a fault.
                Err(kube::Error::Api(status)) if status.code == 403 => return Ok(None),
                Err(error) => return Err(classify(format!("read StatefulSet {APPLICATION_CONTROLLER}"), error)),
            };
            let containers = set.and_then(|s| s.spec).and_then(|s| s.template.spec).map(|s| s.containers);
            let containers = containers.unwrap_or_default();
            let container = containers.iter().find(|c| c.name == APPLICATION_CONTROLLER).or_else(|| containers.first());
            Ok(container.and_then(|c| c.image.as_deref()).and_then(image_version))
        })
    }

    fn list_owned(&self) -> BoxFuture<'_, Result<Vec<OwnedObject>, EngineError>> {
        Box::pin(async move {
            let mut out = Vec::new();
            for kind in ObjectKind::ALL {
                out.extend(self.list_page(kind, None, 0, None).await?.objects);
            }
            Ok(out)
        })
    }

    fn list_tenant<'a>(
        &'a self,
        kind: ObjectKind,
        tenant: TenantId,
    ) -> BoxFuture<'a, Result<Vec<OwnedObject>, EngineError>> {
        Box::pin(async move {
            let tenant = tenant.0.to_string();
            Ok(self.list_page(kind, None, 0, Some((TENANT_ID_LABEL, &tenant))).await?.objects)
        })
    }

    fn list_owned_labelled<'a>(
        &'a self,
        label: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, Result<Vec<OwnedObject>, EngineError>> {
        Box::pin(async move {
            let mut out = Vec::new();
            for kind in ObjectKind::ALL {
                out.extend(self.list_page(kind, None, 0, Some((label, value))).await?.objects);
            }
            Ok(out)
        })
    }

    fn list_owned_page<'a>(
        &'a self,
        kind: ObjectKind,
        from: Option<&'a str>,
        limit: u32,
    ) -> BoxFuture<'a, Result<OwnedPage, EngineError>> {
        Box::pin(self.list_page(kind, from, limit, None))
    }

    fn status_events(&self) -> BoxStream<'_, Result<StatusEvent, EngineError>> {
        status::status_events(self.client.clone(), &self.namespace)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_version_is_the_image_tag() {
        use super::image_version;
        assert_eq!(image_version("quay.io/argoproj/argocd:v2.14.2").as_deref(), Some("v2.14.2"));
        assert_eq!(image_version("registry:5000/argocd:v3.0.1@sha256:abc").as_deref(), Some("v3.0.1"));
        assert_eq!(image_version("registry:5000/argocd"), None);
        assert_eq!(image_version("argocd:"), None);
    }

    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure(&format!("status {code}"), "").with_code(code).boxed())
    }

    #[test]
    fn errors_are_classed_by_who_can_fix_them() {
        let class = |code| match classify("apply Application a".into(), api(code)) {
            EngineError::Refused { .. } => "refused",
            EngineError::Instance { .. } => "instance",
            EngineError::Conflict { .. } => "conflict",
            EngineError::Transient { .. } => "transient",
        };
        for code in [400, 422] {
            assert_eq!(class(code), "refused", "{code}: the object is at fault");
        }
        for code in [401, 403, 404] {
            assert_eq!(class(code), "instance", "{code}: the agent's identity or the namespace");
        }
        assert_eq!(class(409), "conflict");
        for code in [408, 429, 500, 502, 503, 504] {
            assert_eq!(class(code), "transient", "{code}");
        }
        let before = UNCLASSIFIED_ERRORS.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(class(418), "transient", "unclassified codes are retried");
        assert!(UNCLASSIFIED_ERRORS.load(std::sync::atomic::Ordering::Relaxed) > before, "and counted");
        let refused = classify("apply Application a".into(), api(422));
        let EngineError::Refused { tenant_message, .. } = refused else { panic!("refused") };
        assert!(tenant_message.contains("Argo CD refused to apply Application a"), "{tenant_message}");
    }
}
