//! What an Application deployed, modelled (opt-in, `StandinOptions::live_resources`):
//! one ConfigMap per Application in its destination namespace, named after the
//! Application and tracked as Argo CD tracks resources (the instance label carries
//! the Application's name). Synced Applications make or adopt it: an existing one is
//! updated in place, keeping its UID, as Argo CD adopts live resources under the same
//! Application name. Every write stamps it with the Argo CD namespace that wrote it.
//! Deleting an Application prunes it only while Argo CD's resources finalizer is on
//! the Application; without the finalizer (a release) it stays. So tests can assert
//! "nothing was pruned, it was adopted and not recreated" by watching these objects.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::application::AppSpec;

/// The label Argo CD's default tracking puts on what an Application deployed.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// On a live object: the Argo CD namespace (the instance) that last wrote it.
pub const WRITTEN_BY_ANNOTATION: &str = "argocd-standin.gitops.invalid/written-by";
/// The field manager of live objects' writes.
const FIELD_MANAGER: &str = "argocd-application-controller";

/// The live object of Application `name` in `namespace`, when there is one.
pub async fn live_object(client: &Client, namespace: &str, name: &str) -> Result<Option<ConfigMap>, kube::Error> {
    Api::<ConfigMap>::namespaced(client.clone(), namespace).get_opt(name).await
}

/// Makes or adopts the live object of a synced Application; writes only when what
/// it holds or who wrote it differs. A destination this API server cannot reach
/// (no such namespace, another cluster) holds nothing: Ok(false).
pub async fn apply(client: &Client, instance: &str, app: &str, spec: &AppSpec) -> Result<bool, kube::Error> {
    let namespace = spec.destination.namespace.as_str();
    if namespace.is_empty() {
        return Ok(false);
    }
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let data = BTreeMap::from([
        ("repoURL".to_owned(), spec.source.repo_url.clone()),
        ("path".to_owned(), spec.source.path.clone()),
        ("targetRevision".to_owned(), spec.source.target_revision.clone()),
    ]);
    let current = match api.get_opt(app).await {
        Ok(current) => current,
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 403 => return Ok(false),
        Err(error) => return Err(error),
    };
    if let Some(current) = &current
        && current.data.as_ref() == Some(&data)
        && current.annotations().get(WRITTEN_BY_ANNOTATION).map(String::as_str) == Some(instance)
    {
        return Ok(false);
    }
    let object = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": app, "namespace": namespace,
            "labels": {INSTANCE_LABEL: app},
            "annotations": {WRITTEN_BY_ANNOTATION: instance},
        },
        "data": data,
    });
    match api.patch(app, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&object)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 403 => Ok(false),
        Err(error) => Err(error),
    }
}

/// Prunes the live object of an Application being deleted under the resources
/// finalizer.
pub async fn prune(client: &Client, app: &str, spec: &AppSpec) -> Result<(), kube::Error> {
    let namespace = spec.destination.namespace.as_str();
    if namespace.is_empty() {
        return Ok(());
    }
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    match api.delete(app, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 403 => Ok(()),
        Err(error) => Err(error),
    }
}
