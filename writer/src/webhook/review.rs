//! What the admission webhook decides for one request: creating or changing (the
//! spec of) a tenant resource in a namespace the service does not serve is refused;
//! a GitOpsDeployment into its own namespace (the home environment), and a SyncRun
//! of one — its revision chooses what runs with the home role — is allowed only when
//! the requester could grant the home role there themselves (`escalation`). What it
//! allowed after that check it records (`admission_approval`, by UID and
//! generation): the writer stores home intent only when it finds that approval.
//! Deletes, `/status` and metadata-only changes are always allowed, so a finalizer
//! can always be released.
//!
//! Before any of that, every created or changed spec gets the writer's own rules
//! (`crate::validate`, through `spec_check`), so what a schema cannot express is
//! refused at apply time with the reason and message the controller would write.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DynamicObject};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde_json::Value;

use gitops_shared::db::admission_approval::{ApprovedKind, admission_approval_record};
use gitops_shared::db::pooled;

use crate::context::WriterContext;
use crate::webhook::escalation::Escalation;
use crate::webhook::spec_check;

/// The webhook's state.
pub struct Reviewer {
    pub ctx: Arc<WriterContext>,
    pub escalation: Escalation,
}

/// The AppStudio layer's group and its binding kind.
const APPSTUDIO_GROUP: &str = "appstudio.redhat.com";
const BINDING_KIND: &str = "SnapshotEnvironmentBinding";

/// The controlling owner reference of `object` when it is an AppStudio binding.
pub fn appstudio_binding_owner(object: &DynamicObject) -> Option<&OwnerReference> {
    object.metadata.owner_references.as_deref()?.iter().find(|owner| {
        owner.controller == Some(true)
            && owner.kind == BINDING_KIND
            && owner.api_version.split('/').next() == Some(APPSTUDIO_GROUP)
    })
}

/// The metric label of a request's kind.
pub fn kind_label(request: &AdmissionRequest<DynamicObject>) -> &'static str {
    match request.kind.kind.as_str() {
        "GitOpsDeployment" => "GitOpsDeployment",
        "GitOpsDeploymentSyncRun" => "GitOpsDeploymentSyncRun",
        "GitOpsDeploymentManagedEnvironment" => "GitOpsDeploymentManagedEnvironment",
        "GitOpsDeploymentRepositoryCredential" => "GitOpsDeploymentRepositoryCredential",
        _ => "other",
    }
}

fn spec(object: Option<&DynamicObject>) -> Option<&Value> {
    object.and_then(|o| o.data.get("spec"))
}

/// Whether a GitOpsDeployment's spec goes to its own namespace (no environment).
pub fn goes_home(spec: Option<&Value>) -> bool {
    spec.and_then(|s| s.pointer("/destination/environment")).and_then(Value::as_str).is_none_or(str::is_empty)
}

impl Reviewer {
    pub async fn review(&self, request: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
        let allow = AdmissionResponse::from(request);
        if request.kind.group != crate::api::GROUP || request.sub_resource.is_some() {
            return allow;
        }
        let changes_spec = match request.operation {
            Operation::Create => true,
            Operation::Update => spec(request.object.as_ref()) != spec(request.old_object.as_ref()),
            _ => false,
        };
        if !changes_spec {
            return allow;
        }
        let Some(namespace) = request.namespace.as_deref() else { return allow };
        match self.served(namespace).await {
            Ok(()) => {}
            Err(message) => return deny(allow, message),
        }
        if let Err(invalid) = spec_check::check(request, namespace, self.ctx.api_url_allow_private) {
            return refuse_invalid(allow, &invalid);
        }
        if request.operation == Operation::Create
            && request.kind.kind == "GitOpsDeploymentSyncRun"
            && let Some(refusal) = self.sync_run_of_automated(namespace, spec(request.object.as_ref())).await
        {
            return refuse_invalid(allow, &refusal);
        }
        let (kind, must_check) = match request.kind.kind.as_str() {
            "GitOpsDeployment" => (ApprovedKind::Deployment, goes_home(spec(request.object.as_ref()))),
            // Every sync run is checked: what the writer finds stored may go home even
            // when the live deployment does not (a spec changed to something invalid
            // keeps its stored row), and only an approved run may sync one that does.
            "GitOpsDeploymentSyncRun" => (ApprovedKind::SyncRun, true),
            _ => return allow,
        };
        if !must_check {
            return allow;
        }
        if kind == ApprovedKind::Deployment && self.made_by_appstudio_for_a_binding(request, namespace).await {
            return self.approve(allow, request, kind).await;
        }
        let Some(role) = self.ctx.home_status.role() else {
            return deny(
                allow,
                "the GitOps service cannot act in this namespace now (its home role is missing); ask the operator"
                    .to_owned(),
            );
        };
        match self.escalation.may_grant(&request.user_info, namespace, &role).await {
            Ok(()) => self.approve(allow, request, kind).await,
            Err(_)
                if kind == ApprovedKind::SyncRun
                    && !self.sync_run_goes_home(namespace, spec(request.object.as_ref())).await =>
            {
                // A run of a deployment to another cluster: allowed, but not approved,
                // so the writer refuses it should the stored deployment go home.
                allow
            }
            Err(refusal) => deny(allow, refusal.0),
        }
    }

    /// Whether the AppStudio layer (`--appstudio-identity`) asks for a deployment
    /// whose controlling owner is a SnapshotEnvironmentBinding that exists in the
    /// namespace with that UID: the layer's own webhook checked whoever made the
    /// binding, and its Environment, go home. Anyone else, a deployment of the
    /// layer's without such an owner, or an owner that cannot be read, is judged
    /// as any requester is.
    async fn made_by_appstudio_for_a_binding(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        namespace: &str,
    ) -> bool {
        let Some(identity) = self.ctx.appstudio_identity.as_deref() else { return false };
        if request.user_info.username.as_deref() != Some(identity) {
            return false;
        }
        let Some(owner) = request.object.as_ref().and_then(appstudio_binding_owner) else { return false };
        let resource = kube::api::ApiResource {
            group: APPSTUDIO_GROUP.into(),
            version: "v1alpha1".into(),
            api_version: format!("{APPSTUDIO_GROUP}/v1alpha1"),
            kind: BINDING_KIND.into(),
            plural: "snapshotenvironmentbindings".into(),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(self.ctx.kube.clone(), namespace, &resource);
        match api.get_opt(&owner.name).await {
            Ok(Some(binding)) => binding.metadata.uid.as_deref() == Some(owner.uid.as_str()),
            Ok(None) => false,
            Err(error) => {
                tracing::warn!(tenant.ns = %namespace, binding = %owner.name, error = %error,
                    "could not read the binding that owns an AppStudio deployment");
                false
            }
        }
    }

    /// Records the approval of this object at this generation, then allows it; a
    /// failure to record refuses (the writer would refuse it anyway). A dry run
    /// stores nothing, so nothing is recorded for it (`sideEffects: NoneOnDryRun`).
    async fn approve(
        &self,
        allow: AdmissionResponse,
        request: &AdmissionRequest<DynamicObject>,
        kind: ApprovedKind,
    ) -> AdmissionResponse {
        if request.dry_run {
            return allow;
        }
        let meta = request.object.as_ref().map(|o| &o.metadata);
        let uid = meta.and_then(|m| m.uid.as_deref()).and_then(|u| uuid::Uuid::parse_str(u).ok());
        let generation = meta.and_then(|m| m.generation);
        let (Some(uid), Some(generation)) = (uid, generation) else {
            return deny(allow, "the request carries no object UID or generation to approve; try again".to_owned());
        };
        let requester = request.user_info.username.clone().unwrap_or_default();
        let recorded = match pooled(&self.ctx.pool).await {
            Ok(client) => admission_approval_record(&client, uid, generation, kind, &requester).await,
            Err(error) => Err(error),
        };
        match recorded {
            Ok(()) => allow,
            Err(error) => {
                tracing::warn!(error = %gitops_shared::telemetry::error_chain(&error), "could not record an admission approval");
                deny(allow, "the GitOps service could not record this approval now; try again".to_owned())
            }
        }
    }

    async fn served(&self, namespace: &str) -> Result<(), String> {
        // As the writer's namespace watcher last saw it; read when not seen yet.
        if let Some(labels) = self.ctx.served.labels_of(namespace) {
            return self.ctx.served.serves(namespace, &labels).map_err(|not| not.message(namespace));
        }
        let api: Api<Namespace> = Api::all(self.ctx.kube.clone());
        let labels = match api.get_opt(namespace).await {
            Ok(object) => object.and_then(|o| o.metadata.labels).unwrap_or_default(),
            Err(error) => {
                tracing::warn!(%error, tenant.ns = %namespace, "could not read a namespace for an admission review");
                return Err("the GitOps service could not read this namespace now; try again".to_owned());
            }
        };
        self.ctx.served.serves(namespace, &labels).map_err(|not| not.message(namespace))
    }

    /// A refusal when a new SyncRun names a GitOpsDeployment that exists and is
    /// automated (the controller refuses it too, should that change later).
    async fn sync_run_of_automated(&self, namespace: &str, spec: Option<&Value>) -> Option<crate::validate::Invalid> {
        let name = spec.and_then(|s| s.get("gitopsDeploymentName")).and_then(Value::as_str)?;
        let api: Api<crate::api::GitOpsDeployment> = Api::namespaced(self.ctx.kube.clone(), namespace);
        let deployment = api.get_opt(name).await.ok()??;
        (deployment.spec.type_ == "automated").then(|| {
            crate::validate::Invalid::new(
                crate::controller::REASON_DEPLOYMENT_AUTOMATED,
                format!("GitOpsDeployment {name:?} is automated; sync runs are only for manual deployments"),
            )
        })
    }

    /// Whether a SyncRun names a deployment into its own namespace — or one that
    /// does not exist yet (it might be one when it comes).
    async fn sync_run_goes_home(&self, namespace: &str, spec: Option<&Value>) -> bool {
        let Some(name) = spec.and_then(|s| s.get("gitopsDeploymentName")).and_then(Value::as_str) else { return false };
        let api: Api<crate::api::GitOpsDeployment> = Api::namespaced(self.ctx.kube.clone(), namespace);
        match api.get_opt(name).await {
            Ok(Some(deployment)) => deployment.spec.destination.environment.as_deref().is_none_or(str::is_empty),
            Ok(None) | Err(_) => true,
        }
    }
}

/// A spec the rules refuse: 422 Invalid, `reason: message` as the condition would say.
fn refuse_invalid(response: AdmissionResponse, invalid: &crate::validate::Invalid) -> AdmissionResponse {
    let mut response = response.deny(format!("{}: {}", invalid.reason, invalid.message));
    response.result.code = 422;
    response.result.reason = "Invalid".to_owned();
    response
}

fn deny(response: AdmissionResponse, message: String) -> AdmissionResponse {
    let mut response = response.deny(message);
    response.result.code = 403;
    response.result.reason = "Forbidden".to_owned();
    response
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{appstudio_binding_owner, goes_home};

    #[test]
    fn only_a_controlling_appstudio_binding_is_the_layers_owner() {
        let object = |owners: serde_json::Value| -> kube::api::DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeployment",
                "metadata": {"name": "d", "ownerReferences": owners}
            }))
            .expect("an object")
        };
        let owner = |api_version: &str, kind: &str, controller: bool| json!({"apiVersion": api_version, "kind": kind, "name": "b", "uid": "u", "controller": controller});
        let found = object(json!([owner("appstudio.redhat.com/v1alpha1", "SnapshotEnvironmentBinding", true)]));
        assert_eq!(appstudio_binding_owner(&found).map(|o| o.uid.as_str()), Some("u"));
        for owners in [
            json!([owner("appstudio.redhat.com/v1alpha1", "SnapshotEnvironmentBinding", false)]),
            json!([owner("example.invalid/v1alpha1", "SnapshotEnvironmentBinding", true)]),
            json!([owner("appstudio.redhat.com/v1alpha1", "Environment", true)]),
            json!([]),
        ] {
            assert!(appstudio_binding_owner(&object(owners.clone())).is_none(), "{owners}");
        }
    }

    #[test]
    fn a_deployment_without_an_environment_goes_home() {
        assert!(goes_home(Some(&json!({"destination": {}}))));
        assert!(goes_home(Some(&json!({"destination": {"environment": ""}}))));
        assert!(goes_home(Some(&json!({}))));
        assert!(!goes_home(Some(&json!({"destination": {"environment": "prod"}}))));
    }
}
