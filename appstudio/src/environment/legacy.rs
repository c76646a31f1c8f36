//! ManagedEnvironments made by the original service name their Environment in an
//! owner reference of the wrong group (`managed-gitops.redhat.com/v1alpha1`,
//! kind `Environment`), which Kubernetes' garbage collector cannot follow. This
//! controller deletes such a ManagedEnvironment once no Environment of that name and
//! UID exists in its namespace.

use std::sync::Arc;

use futures_util::StreamExt;
use gitops_writer::api::GitOpsDeploymentManagedEnvironment;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::api::Environment;
use crate::context::{Context, ReconcileError, deleted, found};
use crate::names::managed_environment_name;

/// The `apiVersion` of the original's owner references.
pub const LEGACY_OWNER_API_VERSION: &str = "managed-gitops.redhat.com/v1alpha1";

/// The Environment (name, UID) a ManagedEnvironment's legacy owner reference names.
pub fn legacy_owner(managed: &GitOpsDeploymentManagedEnvironment) -> Option<(String, String)> {
    managed
        .owner_references()
        .iter()
        .find(|o| o.api_version == LEGACY_OWNER_API_VERSION && o.kind == "Environment")
        .map(|o| (o.name.clone(), o.uid.clone()))
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static) {
    let config = watcher::Config::default();
    let controller = Controller::new(ctx.served::<GitOpsDeploymentManagedEnvironment>(), config.clone());
    let store = controller.store();
    controller
        // Only a ManagedEnvironment that exists: most Environments (those without a
        // target) have none, and a trigger for a missing object ends as an error
        // that would count as a failed reconcile.
        .watches(ctx.served::<Environment>(), config, move |env| {
            let namespace = env.namespace().unwrap_or_default();
            let managed = ObjectRef::new(&managed_environment_name(&env.name_any())).within(&namespace);
            store.get(&managed).map(|_| managed)
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| {
            let metrics = ctx.metrics.clone();
            async move {
                metrics.outcome("environment_legacy_owner", &result);
                if let Err(error) = result {
                    tracing::debug!(error = %gitops_shared::telemetry::error_chain(&error), "environment_legacy_owner reconcile");
                }
            }
        })
        .await;
}

fn error_policy(_: Arc<GitOpsDeploymentManagedEnvironment>, error: &ReconcileError, _: Arc<Context>) -> Action {
    tracing::warn!(error = %gitops_shared::telemetry::error_chain(error), "legacy owner check failed; retrying");
    Action::requeue(std::time::Duration::from_secs(5))
}

async fn reconcile(
    managed: Arc<GitOpsDeploymentManagedEnvironment>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let Some((owner, uid)) = legacy_owner(&managed) else { return Ok(Action::await_change()) };
    let namespace = managed.namespace().ok_or(ReconcileError::Incomplete("namespace"))?;
    let environments = Api::<Environment>::namespaced(ctx.client.clone(), &namespace);
    let alive = found(environments.get_metadata(&owner).await, "read the Environment")?
        .is_some_and(|env| env.metadata.uid.as_deref() == Some(uid.as_str()));
    if !alive {
        let api = Api::<GitOpsDeploymentManagedEnvironment>::namespaced(ctx.client.clone(), &namespace);
        tracing::info!(tenant.ns = %namespace, name = %managed.name_any(), "deleting a ManagedEnvironment whose Environment is gone");
        deleted(api.delete(&managed.name_any(), &DeleteParams::default()).await, "delete the ManagedEnvironment")?;
    }
    Ok(Action::await_change())
}
