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

    use super::goes_home;

    #[test]
    fn a_deployment_without_an_environment_goes_home() {
        assert!(goes_home(Some(&json!({"destination": {}}))));
        assert!(goes_home(Some(&json!({"destination": {"environment": ""}}))));
        assert!(goes_home(Some(&json!({}))));
        assert!(!goes_home(Some(&json!({"destination": {"environment": "prod"}}))));
    }
}
