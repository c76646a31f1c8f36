//! `gitopsctl instance provision` and `decommission`. Provisioning itself lives in
//! the writer (`gitops_writer::provision`, shared with the automatic scale-up);
//! this adds the operator's side. Decommissioning drains an instance, waits until
//! no tenant is left, purges its operation history (completed, superseded and
//! failed operations: nothing else refers to it), removes its registration, then
//! deletes the `ArgoCD` resource and the namespace.

use std::time::{Duration, Instant};

use gitops_shared::db::engine_instance::{self, engine_instance_by_name};
use gitops_shared::model::EngineInstanceId;
pub use gitops_writer::provision::{
    AGENT_ROLE, ARGOCD_NAME, ProvisionError, ProvisionRequest, TRACKING_METHOD, agent_role, argocd_resource,
    provisioned_instance,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, DynamicObject};

use crate::CtlError;

/// How often the instance's tenants are counted while waiting.
const POLL: Duration = Duration::from_millis(250);

fn kube_error(action: &str, error: kube::Error) -> CtlError {
    CtlError::Refused(format!("could not {action}: {error}"))
}

/// Creates and registers an instance (`gitops_writer::provision`); returns its id.
pub async fn provision(
    database_url: &str,
    kube: kube::Client,
    request: &ProvisionRequest,
) -> Result<EngineInstanceId, CtlError> {
    let client = crate::connect(database_url).await?;
    gitops_writer::provision::provision(&client, kube, request).await.map_err(|error| match error {
        ProvisionError::Refused(message) => CtlError::Refused(message),
        ProvisionError::Db { action, source } => CtlError::Db { action, source },
    })
}

/// Drains, unregisters and deletes instance `name` (see the module); returns how
/// many operations of its history were purged.
pub async fn decommission(database_url: &str, kube: kube::Client, name: &str, wait: Duration) -> Result<u64, CtlError> {
    let mut client = crate::connect(database_url).await?;
    let instance = engine_instance_by_name(&client, name).await.map_err(CtlError::db("look up the engine instance"))?;
    // Only what provision made is deleted: an instance registered with `instance add`
    // runs in a namespace the service does not own.
    let namespaces: Api<Namespace> = Api::all(kube.clone());
    let namespace = namespaces
        .get_opt(&instance.argocd_namespace)
        .await
        .map_err(|e| kube_error("read the instance's namespace", e))?;
    let owned = namespace.as_ref().is_none_or(|ns| provisioned_instance(ns) == Some(name));
    if instance.provisioned_by.is_none() || !owned {
        return Err(CtlError::Refused(format!(
            "engine instance {name:?} was not provisioned by the service (namespace {:?} is not labelled {}={name}): \
             decommission deletes only what provision made; drain it and remove its registration instead",
            instance.argocd_namespace,
            gitops_writer::provision::PROVISIONED_INSTANCE_LABEL
        )));
    }
    crate::instance::drain(database_url, name).await?;
    let deadline = Instant::now() + wait;
    let purged = loop {
        let left = gitops_shared::db::tenant_move::tenant_placements(&client, None, Some(name))
            .await
            .map_err(CtlError::db("list the instance's tenants"))?;
        if left.is_empty() {
            match engine_instance::engine_instance_decommission(&mut client, instance.id).await {
                Ok(purged) => break purged,
                Err(gitops_shared::db::DbError::InstanceInUse { .. }) => {}
                Err(source) => return Err(CtlError::Db { action: "remove the engine instance", source }),
            }
        }
        if Instant::now() >= deadline {
            return Err(CtlError::Refused(format!(
                "{} tenants (or operations in flight) are still on {name:?} after {wait:?}; it stays cordoned and \
                 registered: run decommission again once they moved",
                left.len()
            )));
        }
        tokio::time::sleep(POLL).await;
    };
    let argocds: Api<DynamicObject> =
        Api::namespaced_with(kube.clone(), &instance.argocd_namespace, &argocd_resource());
    match argocds.delete(ARGOCD_NAME, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => return Err(kube_error("delete the ArgoCD resource", error)),
    }
    match namespaces.delete(&instance.argocd_namespace, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => return Err(kube_error("delete the instance's namespace", error)),
    }
    Ok(purged)
}

/// A client of the host cluster, as `kubectl` finds it (KUBECONFIG, then in-cluster).
pub async fn host_cluster() -> Result<kube::Client, CtlError> {
    kube::Client::try_default().await.map_err(|e| kube_error("reach the host cluster (set KUBECONFIG)", e))
}
