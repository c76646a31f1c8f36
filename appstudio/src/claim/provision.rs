//! Dynamic provisioning: a claim that no target matches is marked for its class's
//! provisioner, which makes a target reserved for it. [`Provisioner`] is the
//! interface; [`DevSandbox`] (`appstudio.redhat.com/devsandbox`, the original's
//! only one) asks the sandbox operator for a namespace with a SpaceRequest and,
//! once the request is Ready, turns it into the DeploymentTarget `<claim>-dt`
//! ([`run`], the SpaceRequest controller). Deleting that target (its claim went
//! and the class says `Delete`) deletes the SpaceRequest (`reclaim`).
//!
//! Everything resolves in the claim's namespace: the SpaceRequest, its Secret and
//! the target are the claim's neighbours.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde_json::json;

use crate::api::{
    DeploymentTarget, DeploymentTargetClaim, DeploymentTargetClass, DeploymentTargetKubernetesClusterCredentials,
    DeploymentTargetSpec, SpaceRequest, SpaceRequestSpec,
};
use crate::context::{Context, ReconcileError, deleted, found};
use crate::names::ANN_DT_PROVISIONER;

/// The dev sandbox provisioner's name, as classes name it.
pub const DEVSANDBOX: &str = "appstudio.redhat.com/devsandbox";
/// On a SpaceRequest: the claim it was made for.
pub const LABEL_DTC: &str = "appstudio.openshift.io/dtc";
/// On a SpaceRequest: the target made from it.
pub const LABEL_DT: &str = "appstudio.openshift.io/dt";
/// The SpaceRequest tier the layer asks for.
pub const TIER: &str = "appstudio-env";
/// The sandbox operator's finalizer, which the reclaimer also puts on a SpaceRequest
/// before deleting it, so the request stays until the operator has let go of it.
pub const FINALIZER_TOOLCHAIN: &str = "finalizer.toolchain.dev.openshift.com";
/// The SpaceRequest condition the sandbox operator reports on.
pub const CONDITION_READY: &str = "Ready";
/// The `Ready` reason of a SpaceRequest the operator failed to delete.
pub const REASON_UNABLE_TO_TERMINATE: &str = "UnableToTerminate";
/// On a provisioned target: who made it.
pub const ANN_PROVISIONED_BY: &str = "provisioner.appstudio.redhat.com/provisioned-by";
/// The phase of a target ready to be bound.
pub const PHASE_AVAILABLE: &str = "Available";

/// Makes (or has made) a target for a claim marked for provisioning.
pub trait Provisioner: Send + Sync {
    /// Starts provisioning for `claim` unless it is under way; idempotent.
    fn provision<'a>(
        &'a self,
        client: &'a kube::Client,
        claim: &'a DeploymentTargetClaim,
    ) -> BoxFuture<'a, Result<(), ReconcileError>>;
}

/// The provisioner a class names; None for one this layer does not run (another
/// component's, which makes the target itself).
pub fn provisioner(name: &str) -> Option<&'static dyn Provisioner> {
    (name == DEVSANDBOX).then_some(&DevSandbox as &dyn Provisioner)
}

/// The dev sandbox provisioner.
pub struct DevSandbox;

/// The SpaceRequests of `namespace` made for `claim` (label and tier).
pub async fn space_requests_of(
    api: &Api<SpaceRequest>,
    label: &str,
    value: &str,
) -> Result<Vec<SpaceRequest>, ReconcileError> {
    let params = ListParams::default().labels(&format!("{label}={value}"));
    let list =
        api.list(&params).await.map_err(|source| ReconcileError::Kube { action: "list SpaceRequests", source })?;
    Ok(list.items.into_iter().filter(|request| request.spec.tier_name == TIER).collect())
}

impl Provisioner for DevSandbox {
    fn provision<'a>(
        &'a self,
        client: &'a kube::Client,
        claim: &'a DeploymentTargetClaim,
    ) -> BoxFuture<'a, Result<(), ReconcileError>> {
        Box::pin(async move {
            let namespace = claim.namespace().ok_or(ReconcileError::Incomplete("namespace"))?;
            let name = claim.name_any();
            let api = Api::<SpaceRequest>::namespaced(client.clone(), &namespace);
            if !space_requests_of(&api, LABEL_DTC, &name).await?.is_empty() {
                return Ok(());
            }
            let request = SpaceRequest {
                metadata: ObjectMeta {
                    generate_name: Some(format!("{name}-")),
                    labels: Some(BTreeMap::from([(LABEL_DTC.to_owned(), name.clone())])),
                    ..ObjectMeta::default()
                },
                spec: SpaceRequestSpec { tier_name: TIER.to_owned(), target_cluster_roles: Vec::new() },
                status: None,
            };
            api.create(&PostParams::default(), &request)
                .await
                .map_err(|source| ReconcileError::Kube { action: "create the SpaceRequest", source })?;
            tracing::info!(tenant.ns = %namespace, claim = %name, "SpaceRequest created for the claim");
            Ok(())
        })
    }
}

/// The binder's provisioning step for a Pending claim marked for a provisioner:
/// the error to report, if any.
pub async fn provision_for(ctx: &Context, claim: &DeploymentTargetClaim) -> Result<Option<String>, ReconcileError> {
    if !claim.annotations().contains_key(ANN_DT_PROVISIONER) {
        return Ok(None);
    }
    let class_name = &claim.spec.deployment_target_class_name;
    let classes = Api::<DeploymentTargetClass>::all(ctx.client.clone());
    let Some(class) = found(classes.get(class_name).await, "read the DeploymentTargetClass")? else {
        return Ok(Some(format!(
            "unable to handle provisioning of SpaceRequest: DeploymentTargetClaim {} does not have a matching \
             DeploymentTargetClass {class_name}: the resource could not be found on the cluster",
            claim.name_any()
        )));
    };
    if let Some(provisioner) = provisioner(&class.spec.provisioner) {
        provisioner.provision(&ctx.client, claim).await?;
    }
    Ok(None)
}

/// The target a Ready SpaceRequest with one namespace gives `claim`.
pub fn target_from(request: &SpaceRequest, claim: &DeploymentTargetClaim) -> Option<DeploymentTarget> {
    let status = request.status.as_ref()?;
    let ready = status.conditions.iter().any(|c| c.type_ == CONDITION_READY && c.status == "True");
    let [access] = status.namespace_access.as_slice() else { return None };
    if !ready {
        return None;
    }
    let claim_name = claim.name_any();
    let annotations = BTreeMap::from([(ANN_PROVISIONED_BY.to_owned(), DEVSANDBOX.to_owned())]);
    let labels = claim
        .annotations()
        .get(ANN_DT_PROVISIONER)
        .map(|value| BTreeMap::from([(ANN_DT_PROVISIONER.to_owned(), value.clone())]));
    Some(DeploymentTarget {
        metadata: ObjectMeta {
            name: Some(format!("{claim_name}-dt")),
            annotations: Some(annotations),
            labels,
            ..ObjectMeta::default()
        },
        spec: DeploymentTargetSpec {
            deployment_target_class_name: claim.spec.deployment_target_class_name.clone(),
            kubernetes_credentials: DeploymentTargetKubernetesClusterCredentials {
                default_namespace: access.name.clone(),
                api_url: status.target_cluster_url.clone(),
                cluster_credentials_secret: access.secret_ref.clone(),
                allow_insecure_skip_tls_verify: false,
            },
            claim_ref: Some(claim_name),
        },
        status: None,
    })
}

/// Runs the SpaceRequest controller until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static) {
    Controller::new(ctx.served::<SpaceRequest>(), watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, |_, _, ctx| Action::requeue(ctx.settings.user_error_requeue), ctx.clone())
        .for_each(|result| {
            let metrics = ctx.metrics.clone();
            async move {
                metrics.outcome("spacerequest", &result);
                if let Err(error) = result {
                    tracing::debug!(error = %gitops_shared::telemetry::error_chain(&error), "SpaceRequest reconcile");
                }
            }
        })
        .await;
}

async fn reconcile(request: Arc<SpaceRequest>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let Some(claim_name) = request.labels().get(LABEL_DTC).cloned() else { return Ok(Action::await_change()) };
    if request.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = request.namespace().ok_or(ReconcileError::Incomplete("namespace"))?;
    let name = request.name_any();
    let requests = Api::<SpaceRequest>::namespaced(ctx.client.clone(), &namespace);
    let claims = Api::<DeploymentTargetClaim>::namespaced(ctx.client.clone(), &namespace);
    let Some(claim) = found(claims.get(&claim_name).await, "read the claim")? else {
        // Orphaned: its claim went. A Delete class (of this provisioner) takes the
        // namespace back; a Retain one keeps it.
        let classes = Api::<DeploymentTargetClass>::all(ctx.client.clone());
        let list = classes
            .list(&ListParams::default())
            .await
            .map_err(|source| ReconcileError::Kube { action: "list classes", source })?;
        let ours: Vec<&DeploymentTargetClass> =
            list.items.iter().filter(|c| c.spec.provisioner == DEVSANDBOX).collect();
        // Its class is its target's when it has one; else it is deleted only when
        // every class of the provisioner would.
        let target_class = match request.labels().get(LABEL_DT) {
            Some(target) => found(
                Api::<DeploymentTarget>::namespaced(ctx.client.clone(), &namespace).get(target).await,
                "read the SpaceRequest's target",
            )?
            .map(|t| t.spec.deployment_target_class_name),
            None => None,
        };
        let delete = match target_class {
            Some(class) => ours.iter().any(|c| c.name_any() == class && c.spec.reclaim_policy == super::RECLAIM_DELETE),
            None => ours.iter().all(|c| c.spec.reclaim_policy == super::RECLAIM_DELETE),
        };
        if ours.is_empty() {
            tracing::warn!(tenant.ns = %namespace, request = %name, "no DeploymentTargetClass of the dev sandbox provisioner: the orphaned SpaceRequest is kept");
        } else if delete {
            deleted(requests.delete(&name, &DeleteParams::default()).await, "delete the orphaned SpaceRequest")?;
        }
        return Ok(Action::await_change());
    };
    if claim.metadata.deletion_timestamp.is_some() {
        // The claim is going: a target made now would outlive it with nobody to bind.
        return Ok(Action::await_change());
    }
    let targets = Api::<DeploymentTarget>::namespaced(ctx.client.clone(), &namespace);
    let labelled = match request.labels().get(LABEL_DT) {
        Some(target) => found(targets.get(target).await, "read the provisioned target")?,
        None => None,
    };
    let existing = match labelled {
        Some(target) => Some(target),
        None => targets
            .list(&ListParams::default())
            .await
            .map_err(|source| ReconcileError::Kube { action: "list the DeploymentTargets", source })?
            .items
            .into_iter()
            .find(|t| t.spec.claim_ref.as_deref() == Some(claim_name.as_str())),
    };
    let target_name = match existing {
        Some(target) => target.name_any(),
        None => {
            let count = request.status.as_ref().map_or(0, |s| s.namespace_access.len());
            let Some(target) = target_from(&request, &claim) else {
                if count > 1 {
                    tracing::warn!(tenant.ns = %namespace, request = %name, count, "a SpaceRequest with more than one namespace is not used");
                }
                return Ok(Action::await_change());
            };
            let target_name = target.name_any();
            targets
                .create(&PostParams::default(), &target)
                .await
                .map_err(|source| ReconcileError::Kube { action: "create the provisioned target", source })?;
            let patch = json!({"status": {"phase": PHASE_AVAILABLE}});
            targets
                .patch_status(&target_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|source| ReconcileError::Kube { action: "make the target Available", source })?;
            tracing::info!(tenant.ns = %namespace, request = %name, target = %target_name, "target provisioned");
            target_name
        }
    };
    if request.labels().get(LABEL_DT) != Some(&target_name) {
        let patch = json!({"metadata": {"labels": {LABEL_DT: target_name}}});
        requests
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| ReconcileError::Kube { action: "label the SpaceRequest", source })?;
    }
    Ok(Action::requeue(ctx.settings.resync_interval))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Condition, DeploymentTargetClaimSpec, NamespaceAccess, SpaceRequestStatus};

    fn request(ready: &str, namespaces: &[&str]) -> SpaceRequest {
        let mut request =
            SpaceRequest::new("dtc-abcde", SpaceRequestSpec { tier_name: TIER.into(), ..Default::default() });
        request.status = Some(SpaceRequestStatus {
            conditions: vec![Condition { type_: "Ready".into(), status: ready.into(), ..Condition::default() }],
            target_cluster_url: "https://api.sandbox.example.invalid:6443".into(),
            namespace_access: namespaces
                .iter()
                .map(|n| NamespaceAccess { name: (*n).into(), secret_ref: format!("{n}-secret") })
                .collect(),
        });
        request
    }

    #[test]
    fn a_ready_request_with_one_namespace_gives_the_claims_target() {
        let mut claim = DeploymentTargetClaim::new(
            "dtc",
            DeploymentTargetClaimSpec {
                deployment_target_class_name: "isolation-level-namespace".into(),
                ..Default::default()
            },
        );
        claim.metadata.annotations =
            Some(BTreeMap::from([(ANN_DT_PROVISIONER.to_owned(), "isolation-level-namespace".to_owned())]));
        let target = target_from(&request("True", &["team-env"]), &claim).expect("a target");
        assert_eq!(target.metadata.name.as_deref(), Some("dtc-dt"));
        assert_eq!(target.spec.claim_ref.as_deref(), Some("dtc"));
        assert_eq!(target.spec.deployment_target_class_name, "isolation-level-namespace");
        let credentials = &target.spec.kubernetes_credentials;
        assert_eq!(credentials.default_namespace, "team-env");
        assert_eq!(credentials.cluster_credentials_secret, "team-env-secret");
        assert_eq!(credentials.api_url, "https://api.sandbox.example.invalid:6443");
        assert!(!credentials.allow_insecure_skip_tls_verify);
        assert_eq!(target.annotations().get(ANN_PROVISIONED_BY).map(String::as_str), Some(DEVSANDBOX));
        assert_eq!(target.labels().get(ANN_DT_PROVISIONER).map(String::as_str), Some("isolation-level-namespace"));
        assert!(target_from(&request("False", &["team-env"]), &claim).is_none(), "not ready");
        assert!(target_from(&request("True", &[]), &claim).is_none(), "no namespace yet");
        assert!(target_from(&request("True", &["a", "b"]), &claim).is_none(), "two namespaces");
        assert!(provisioner(DEVSANDBOX).is_some() && provisioner("example.invalid/other").is_none());
    }
}
