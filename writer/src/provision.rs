//! Engine instances the service makes itself on its host cluster, by an
//! operator's `gitopsctl instance provision` or the fleet watch's automatic
//! scale-up (`crate::scale_up`). Provisioning creates the instance's namespace, a
//! Role and RoleBinding there for the agents (the rights of
//! `ops/deploy/agent/role.yaml`, in that namespace only: never a ClusterRole on
//! Secrets) and an `ArgoCD` resource of the Argo CD Operator
//! (`argoproj.io/v1beta1`) with the requested version and the resource tracking
//! method pinned to `label` (Argo CD 3.0 changed the default to annotation; instances
//! that tracked differently could not adopt each other's tenants), waits until the
//! operator reports it `Available`, and registers it — with its host cluster, so an
//! agent started with `--host-cluster` serves it without a new Deployment.

use std::time::{Duration, Instant};

use gitops_shared::db::DbError;
use gitops_shared::db::engine_instance::{
    self, ProvisionedBy, Registration, check_host_cluster, engine_instance_by_name,
};
use gitops_shared::model::EngineInstanceId;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use tokio_postgres::Client;

/// Why an instance could not be provisioned.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// Refused, or the cluster said no; the message says why.
    #[error("{0}")]
    Refused(String),
    #[error("could not {action}")]
    Db { action: &'static str, source: DbError },
}

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
    /// The host cluster it is registered with (agents started with
    /// `--host-cluster` of that name serve it without a new Deployment).
    pub host_cluster: Option<String>,
    /// Who asks (recorded on the instance).
    pub provisioned_by: ProvisionedBy,
}

fn kube_error(action: &str, error: kube::Error) -> ProvisionError {
    ProvisionError::Refused(format!("could not {action}: {error}"))
}

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// The agents' rights in an instance's namespace (as `ops/deploy/agent/role.yaml`).
pub fn agent_role(namespace: &str) -> Result<Role, ProvisionError> {
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
    .map_err(|error| ProvisionError::Refused(format!("could not build the agents' Role: {error}")))
}

/// On a namespace `provision` made: the instance it was made for.
pub const PROVISIONED_INSTANCE_LABEL: &str = "managed-gitops.redhat.com/provisioned-instance";

/// The instance a namespace was provisioned for, by its label.
pub fn provisioned_instance(namespace: &Namespace) -> Option<&str> {
    namespace.metadata.labels.as_ref()?.get(PROVISIONED_INSTANCE_LABEL).map(String::as_str)
}

/// Creates and registers an instance (see the module); returns its id.
pub async fn provision(
    client: &Client,
    kube: kube::Client,
    request: &ProvisionRequest,
) -> Result<EngineInstanceId, ProvisionError> {
    if engine_instance_by_name(client, &request.name).await.is_ok() {
        return Err(ProvisionError::Refused(format!("engine instance {:?} is registered already", request.name)));
    }
    if let Some(host) = &request.host_cluster {
        check_host_cluster(host).map_err(|e| ProvisionError::Refused(e.to_string()))?;
    }
    let namespace = request.namespace.clone().unwrap_or_else(|| request.name.clone());
    // Checked before anything is made on the cluster.
    for (what, value) in [("instance name", &request.name), ("namespace", &namespace)] {
        if !engine_instance::is_dns_label(value) {
            return Err(ProvisionError::Refused(format!(
                "{what} {value:?} is not a DNS label (a-z, 0-9, '-', at most 63)"
            )));
        }
    }
    if request.capacity <= 0 {
        return Err(ProvisionError::Refused("capacity must be positive".into()));
    }
    let mut subjects = Vec::new();
    for agent in &request.agents {
        let Some((ns, name)) = agent.split_once('/').filter(|(ns, name)| !ns.is_empty() && !name.is_empty()) else {
            return Err(ProvisionError::Refused(format!("agent ServiceAccount {agent:?} is not NAMESPACE/NAME")));
        };
        subjects.push(serde_json::json!({"kind": "ServiceAccount", "name": name, "namespace": ns}));
    }
    // The namespace is the instance's own: one that exists already (a tenant's, the
    // service's, another instance's) is never taken over, unless an earlier run of
    // this provision made it (its label names this instance).
    let namespaces: Api<Namespace> = Api::all(kube.clone());
    let existing = namespaces.get_opt(&namespace).await.map_err(|e| kube_error("read the namespace", e))?;
    if let Some(existing) = existing
        && provisioned_instance(&existing) != Some(request.name.as_str())
    {
        return Err(ProvisionError::Refused(format!(
            "namespace {namespace:?} exists and was not made for instance {:?}: provision makes a namespace of its own \
             (choose another with --namespace)",
            request.name
        )));
    }
    let object = serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": namespace, "labels": {
            "app.kubernetes.io/managed-by": "gitops-service", PROVISIONED_INSTANCE_LABEL: request.name}},
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
            return Err(ProvisionError::Refused(format!(
                "the Argo CD Operator did not report {namespace}/{ARGOCD_NAME} Available within {:?} (phase {}); \
                 nothing was registered",
                request.wait,
                phase.unwrap_or("none")
            )));
        }
        tokio::time::sleep(POLL).await;
    }
    let registration =
        Registration { host_cluster: request.host_cluster.as_deref(), provisioned_by: Some(request.provisioned_by) };
    engine_instance::engine_instance_register(client, &request.name, &namespace, request.capacity, registration)
        .await
        .map_err(|source| ProvisionError::Db { action: "register the engine instance", source })
}
