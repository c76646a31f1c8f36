//! `gitopsctl instance provision` and `decommission`: engine instances the service
//! makes itself on its host cluster. Provisioning creates the instance's namespace,
//! a Role and RoleBinding there for the agents (the rights of
//! `ops/deploy/agent/role.yaml`, in that namespace only: never a ClusterRole on
//! Secrets) and an `ArgoCD` resource of the Argo CD Operator
//! (`argoproj.io/v1beta1`) with the requested version and the resource tracking
//! method pinned to `label` (Argo CD 3.0 changed the default to annotation; instances
//! that tracked differently could not adopt each other's tenants), waits until the
//! operator reports it `Available`, and registers it. Decommissioning drains it,
//! waits until no tenant is left, purges its operation history (completed,
//! superseded and failed operations: nothing else refers to it), removes its
//! registration, then deletes the `ArgoCD` resource and the namespace.

use std::time::{Duration, Instant};

use gitops_shared::db::engine_instance::{self, engine_instance_by_name};
use gitops_shared::model::EngineInstanceId;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};

use crate::CtlError;

/// The field manager of what provisioning writes.
const FIELD_MANAGER: &str = "gitopsctl-provision";
/// The name of the `ArgoCD` resource, the Role and the RoleBinding it makes.
pub const ARGOCD_NAME: &str = "argocd";
pub const AGENT_ROLE: &str = "gitops-agent";
/// The resource tracking method provisioned instances are pinned to.
pub const TRACKING_METHOD: &str = "label";
/// How often the operator's report is read while waiting.
const POLL: Duration = Duration::from_millis(250);

/// `argocds.argoproj.io/v1beta1`, the Argo CD Operator's kind.
pub fn argocd_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("argoproj.io", "v1beta1", "ArgoCD"), "argocds")
}

/// What to provision.
#[derive(Debug, Clone)]
pub struct ProvisionRequest {
    pub name: String,
    /// The instance's namespace (default: its name).
    pub namespace: Option<String>,
    /// The Argo CD version (default: the operator's).
    pub version: Option<String>,
    pub capacity: i32,
    /// The agents' ServiceAccounts (`namespace/name`) the RoleBinding names.
    pub agents: Vec<String>,
    /// How long to wait for the operator.
    pub wait: Duration,
}

fn kube_error(action: &str, error: kube::Error) -> CtlError {
    CtlError::Refused(format!("could not {action}: {error}"))
}

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// The agents' rights in an instance's namespace (as `ops/deploy/agent/role.yaml`).
pub fn agent_role(namespace: &str) -> Result<Role, CtlError> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": AGENT_ROLE, "namespace": namespace,
                     "labels": {"app.kubernetes.io/part-of": "gitops-service"}},
        "rules": [
            {"apiGroups": ["argoproj.io"], "resources": ["applications", "appprojects"], "verbs": ["*"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]},
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["argocd-cm"], "verbs": ["get"]},
            {"apiGroups": ["apps"], "resources": ["statefulsets"],
             "resourceNames": ["argocd-application-controller"], "verbs": ["get"]},
        ],
    }))
    .map_err(|error| CtlError::Refused(format!("could not build the agents' Role: {error}")))
}

/// Creates and registers an instance (see the module); returns its id.
pub async fn provision(
    database_url: &str,
    kube: kube::Client,
    request: &ProvisionRequest,
) -> Result<EngineInstanceId, CtlError> {
    let client = crate::connect(database_url).await?;
    if engine_instance_by_name(&client, &request.name).await.is_ok() {
        return Err(CtlError::Refused(format!("engine instance {:?} is registered already", request.name)));
    }
    let namespace = request.namespace.clone().unwrap_or_else(|| request.name.clone());
    // Checked before anything is made on the cluster.
    for (what, value) in [("instance name", &request.name), ("namespace", &namespace)] {
        if !engine_instance::is_dns_label(value) {
            return Err(CtlError::Refused(format!("{what} {value:?} is not a DNS label (a-z, 0-9, '-', at most 63)")));
        }
    }
    if request.capacity <= 0 {
        return Err(CtlError::Refused("capacity must be positive".into()));
    }
    let mut subjects = Vec::new();
    for agent in &request.agents {
        let Some((ns, name)) = agent.split_once('/').filter(|(ns, name)| !ns.is_empty() && !name.is_empty()) else {
            return Err(CtlError::Refused(format!("agent ServiceAccount {agent:?} is not NAMESPACE/NAME")));
        };
        subjects.push(serde_json::json!({"kind": "ServiceAccount", "name": name, "namespace": ns}));
    }
    let namespaces: Api<Namespace> = Api::all(kube.clone());
    let object = serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": namespace, "labels": {"app.kubernetes.io/managed-by": "gitops-service"}},
    });
    namespaces
        .patch(&namespace, &apply_params(), &Patch::Apply(object))
        .await
        .map_err(|e| kube_error(&format!("create namespace {namespace}"), e))?;
    let roles: Api<Role> = Api::namespaced(kube.clone(), &namespace);
    roles
        .patch(AGENT_ROLE, &apply_params(), &Patch::Apply(agent_role(&namespace)?))
        .await
        .map_err(|e| kube_error("create the agents' Role", e))?;
    let binding = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": AGENT_ROLE, "namespace": namespace,
                     "labels": {"app.kubernetes.io/part-of": "gitops-service"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": AGENT_ROLE},
        "subjects": subjects,
    });
    let bindings: Api<RoleBinding> = Api::namespaced(kube.clone(), &namespace);
    bindings
        .patch(AGENT_ROLE, &apply_params(), &Patch::Apply(binding))
        .await
        .map_err(|e| kube_error("bind the agents' Role", e))?;
    let mut spec = serde_json::json!({"resourceTrackingMethod": TRACKING_METHOD});
    if let Some(version) = &request.version {
        spec["version"] = serde_json::json!(version);
    }
    let argocd = serde_json::json!({
        "apiVersion": "argoproj.io/v1beta1", "kind": "ArgoCD",
        "metadata": {"name": ARGOCD_NAME, "namespace": namespace}, "spec": spec,
    });
    let argocds: Api<DynamicObject> = Api::namespaced_with(kube.clone(), &namespace, &argocd_resource());
    argocds
        .patch(ARGOCD_NAME, &apply_params(), &Patch::Apply(argocd))
        .await
        .map_err(|e| kube_error("create the ArgoCD resource (is the Argo CD Operator installed?)", e))?;
    let deadline = Instant::now() + request.wait;
    loop {
        let object = argocds.get_opt(ARGOCD_NAME).await.map_err(|e| kube_error("read the ArgoCD resource", e))?;
        let phase = object.as_ref().and_then(|o| o.data.pointer("/status/phase")).and_then(|p| p.as_str());
        if phase == Some("Available") {
            break;
        }
        if Instant::now() >= deadline {
            return Err(CtlError::Refused(format!(
                "the Argo CD Operator did not report {namespace}/{ARGOCD_NAME} Available within {:?} (phase {}); \
                 nothing was registered",
                request.wait,
                phase.unwrap_or("none")
            )));
        }
        tokio::time::sleep(POLL).await;
    }
    engine_instance::engine_instance_add(&client, &request.name, &namespace, request.capacity)
        .await
        .map_err(CtlError::db("register the engine instance"))
}

/// Drains, unregisters and deletes instance `name` (see the module); returns how
/// many operations of its history were purged.
pub async fn decommission(database_url: &str, kube: kube::Client, name: &str, wait: Duration) -> Result<u64, CtlError> {
    let mut client = crate::connect(database_url).await?;
    let instance = engine_instance_by_name(&client, name).await.map_err(CtlError::db("look up the engine instance"))?;
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
    let namespaces: Api<Namespace> = Api::all(kube);
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
