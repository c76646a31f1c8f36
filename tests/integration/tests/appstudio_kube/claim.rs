//! DeploymentTargetClaims and DeploymentTargets, ported from the original's binder
//! and dev-sandbox provisioner cases (the test plays the sandbox operator by writing
//! SpaceRequest status), plus the fixes: binding sets the target's claimRef, and a
//! missing class is reported.

use gitops_appstudio::api::{
    DeploymentTarget, DeploymentTargetClaim, DeploymentTargetClaimSpec, DeploymentTargetClass,
    DeploymentTargetClassSpec, DeploymentTargetKubernetesClusterCredentials, DeploymentTargetSpec, SpaceRequest,
};
use gitops_appstudio::claim::provision::{ANN_PROVISIONED_BY, DEVSANDBOX, LABEL_DT, LABEL_DTC, TIER};
use gitops_appstudio::names::{
    ANN_BIND_COMPLETED, ANN_BOUND_BY_CONTROLLER, ANN_DT_PROVISIONER, FINALIZER_BINDER, FINALIZER_DT,
};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use gitops_testkit::cluster::TestCluster;

use super::{Ground, ground};
use crate::support::eventually;

/// A class of the test's own (classes are cluster-scoped); deleted when dropped.
pub(super) struct Class {
    pub(super) name: String,
}

impl Drop for Class {
    fn drop(&mut self) {
        let name = self.name.clone();
        // A client of its own on a runtime of its own: the test's client lives on the
        // test's runtime, which this thread blocks.
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            runtime.block_on(async {
                let client = TestCluster::get().await.admin().await;
                Api::<DeploymentTargetClass>::all(client).delete(&name, &DeleteParams::default()).await.ok()
            });
        })
        .join();
    }
}

pub(super) async fn class(g: &Ground, policy: &str) -> Class {
    class_of(g, &policy.to_lowercase(), DEVSANDBOX, policy).await
}

/// A class `<namespace>-<suffix>` of `provisioner`.
pub(super) async fn class_of(g: &Ground, suffix: &str, provisioner: &str, policy: &str) -> Class {
    let name = format!("{}-{suffix}", g.ns());
    let api = Api::<DeploymentTargetClass>::all(g.client.clone());
    let class = DeploymentTargetClass::new(
        &name,
        DeploymentTargetClassSpec {
            provisioner: provisioner.into(),
            reclaim_policy: policy.into(),
            ..DeploymentTargetClassSpec::default()
        },
    );
    api.create(&PostParams::default(), &class).await.expect("create the class");
    Class { name }
}

pub(super) fn target(name: &str, class: &str, claim: Option<&str>) -> DeploymentTarget {
    DeploymentTarget::new(
        name,
        DeploymentTargetSpec {
            deployment_target_class_name: class.into(),
            kubernetes_credentials: DeploymentTargetKubernetesClusterCredentials {
                default_namespace: "space".into(),
                api_url: "https://127.0.0.1:6443".into(),
                cluster_credentials_secret: "dt-secret".into(),
                allow_insecure_skip_tls_verify: false,
            },
            claim_ref: claim.map(str::to_owned),
        },
    )
}

pub(super) fn claim(name: &str, class: &str, target: Option<&str>) -> DeploymentTargetClaim {
    DeploymentTargetClaim::new(
        name,
        DeploymentTargetClaimSpec {
            deployment_target_class_name: class.into(),
            target_name: target.map(str::to_owned),
        },
    )
}

pub(super) fn claim_phase(claim: &DeploymentTargetClaim) -> &str {
    claim.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

pub(super) fn target_phase(target: &DeploymentTarget) -> &str {
    target.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

pub(super) async fn claim_where(
    g: &Ground,
    name: &str,
    what: &str,
    check: impl Fn(&DeploymentTargetClaim) -> bool,
) -> DeploymentTargetClaim {
    eventually(what, || async { g.get::<DeploymentTargetClaim>(name).await.filter(|c| check(c)) }).await
}

pub(super) async fn target_where(
    g: &Ground,
    name: &str,
    what: &str,
    check: impl Fn(&DeploymentTarget) -> bool,
) -> DeploymentTarget {
    eventually(what, || async { g.get::<DeploymentTarget>(name).await.filter(|t| check(t)) }).await
}

fn success(conditions: Option<&Vec<gitops_appstudio::api::Condition>>) -> bool {
    conditions.into_iter().flatten().any(|c| c.type_ == "ErrorOccurred" && c.status == "False" && c.reason == "Success")
}

/// Waits until claim and target are bound to each other, and checks the marks.
pub(super) async fn assert_bound(g: &Ground, claim_name: &str, target_name: &str, by_controller: bool) {
    let claim = claim_where(g, claim_name, "the claim Bound", |c| {
        claim_phase(c) == "Bound" && c.annotations().contains_key(ANN_BIND_COMPLETED)
    })
    .await;
    assert_eq!(claim.spec.target_name.as_deref(), Some(target_name));
    assert_eq!(claim.annotations().get(ANN_BOUND_BY_CONTROLLER).is_some(), by_controller);
    assert!(claim.finalizers().iter().any(|f| f == FINALIZER_BINDER));
    claim_where(g, claim_name, "the claim's Success condition", |c| success(c.status.as_ref().map(|s| &s.conditions)))
        .await;
    let target = target_where(g, target_name, "the target Bound", |t| {
        target_phase(t) == "Bound" && success(t.status.as_ref().map(|s| &s.conditions))
    })
    .await;
    assert!(target.finalizers().iter().any(|f| f == FINALIZER_DT));
    assert_eq!(target.spec.claim_ref.as_deref(), Some(claim_name), "the target is reserved for the claim");
}

#[tokio::test]
async fn claims_bind_named_reserved_and_free_targets() {
    let g = ground("as-claim-bind").await;
    let class = class(&g, "Retain").await;
    // A claim naming a target that does not exist yet is Pending, then binds it.
    g.create(&claim("named", &class.name, Some("dt-named"))).await;
    claim_where(&g, "named", "the claim Pending", |c| claim_phase(c) == "Pending").await;
    g.create(&target("dt-named", &class.name, None)).await;
    assert_bound(&g, "named", "dt-named", false).await;

    // A target reserved for a claim (claimRef) binds it.
    g.create(&target("dt-reserved", &class.name, Some("reserved"))).await;
    g.create(&claim("reserved", &class.name, None)).await;
    assert_bound(&g, "reserved", "dt-reserved", true).await;

    // A free target of the class binds a claim without a target.
    g.create(&target("dt-free", &class.name, None)).await;
    g.create(&claim("free", &class.name, None)).await;
    assert_bound(&g, "free", "dt-free", true).await;

    // No target left: the claim is marked for a provisioner and waits.
    g.create(&claim("waiting", &class.name, None)).await;
    let waiting = claim_where(&g, "waiting", "the claim marked for provisioning", |c| {
        c.annotations().contains_key(ANN_DT_PROVISIONER) && claim_phase(c) == "Pending"
    })
    .await;
    assert_eq!(waiting.annotations().get(ANN_DT_PROVISIONER), Some(&class.name), "the value is the class name");

    // A target claimed by another claim is refused with the original's message.
    g.create(&claim("thief", &class.name, Some("dt-named"))).await;
    claim_where(&g, "thief", "the already-claimed condition", |c| {
        c.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.status == "True"
                    && c.message == "DeploymentTargetClaim wants to claim a DeploymentTarget that is already claimed"
            })
        })
    })
    .await;
    for name in ["named", "reserved", "free", "waiting", "thief"] {
        g.api::<DeploymentTargetClaim>().delete(name, &DeleteParams::default()).await.expect("delete");
    }
    for name in ["named", "reserved", "free", "waiting", "thief"] {
        eventually("the claim gone", || async { g.get::<DeploymentTargetClaim>(name).await.is_none().then_some(()) })
            .await;
    }
}

#[tokio::test]
async fn deleting_claims_releases_or_deletes_their_targets_and_a_lost_target_shows() {
    let g = ground("as-claim-release").await;
    let retain = class(&g, "Retain").await;
    let delete = class(&g, "Delete").await;
    g.create(&target("dt-retain", &retain.name, None)).await;
    g.create(&claim("keep", &retain.name, Some("dt-retain"))).await;
    assert_bound(&g, "keep", "dt-retain", false).await;
    g.create(&target("dt-delete", &delete.name, None)).await;
    g.create(&claim("drop", &delete.name, Some("dt-delete"))).await;
    assert_bound(&g, "drop", "dt-delete", false).await;

    // Retain: the claim goes, the target stays Released and free.
    g.api::<DeploymentTargetClaim>().delete("keep", &DeleteParams::default()).await.expect("delete");
    eventually("the Retain claim gone", || async {
        g.get::<DeploymentTargetClaim>("keep").await.is_none().then_some(())
    })
    .await;
    target_where(&g, "dt-retain", "the target Released", |t| {
        target_phase(t) == "Released" && t.spec.claim_ref.is_none()
    })
    .await;

    // Delete: the target goes with the claim.
    g.api::<DeploymentTargetClaim>().delete("drop", &DeleteParams::default()).await.expect("delete");
    eventually("the Delete claim and its target gone", || async {
        (g.get::<DeploymentTargetClaim>("drop").await.is_none()
            && g.get::<DeploymentTarget>("dt-delete").await.is_none())
        .then_some(())
    })
    .await;

    // A bound claim whose target is deleted is Lost.
    g.create(&target("dt-lost", &retain.name, None)).await;
    g.create(&claim("orphan", &retain.name, Some("dt-lost"))).await;
    assert_bound(&g, "orphan", "dt-lost", false).await;
    g.api::<DeploymentTarget>().delete("dt-lost", &DeleteParams::default()).await.expect("delete");
    claim_where(&g, "orphan", "the claim Lost", |c| claim_phase(c) == "Lost").await;

    // A target of a class that does not exist says so (the original was silent).
    g.create(&target("dt-classless", "no-such-class", None)).await;
    target_where(&g, "dt-classless", "the missing class reported", |t| {
        t.status
            .as_ref()
            .is_some_and(|s| s.conditions.iter().any(|c| c.status == "True" && c.message.contains("no-such-class")))
    })
    .await;
    for name in ["orphan"] {
        g.api::<DeploymentTargetClaim>().delete(name, &DeleteParams::default()).await.expect("delete");
    }
    for name in ["dt-retain", "dt-classless"] {
        g.api::<DeploymentTarget>().delete(name, &DeleteParams::default()).await.expect("delete");
    }
    eventually("targets gone", || async {
        (g.get::<DeploymentTarget>("dt-retain").await.is_none()
            && g.get::<DeploymentTarget>("dt-classless").await.is_none())
        .then_some(())
    })
    .await;
}

/// The original's SpaceRequest cases end to end: a claim no target matches gets
/// one SpaceRequest; Ready (written here, as the sandbox operator would) it becomes
/// the target `<claim>-dt`, which the claim binds and an Environment uses; deleting
/// the claim of a Delete class takes target and SpaceRequest along.
#[tokio::test]
async fn a_claim_is_provisioned_a_sandbox_namespace_and_gives_it_back() {
    let g = ground("as-claim-sandbox").await;
    let class = class(&g, "Delete").await;
    g.create(&claim("dtc", &class.name, None)).await;
    let requests: Api<SpaceRequest> = g.api();
    let by_claim = ListParams::default().labels(&format!("{LABEL_DTC}=dtc"));
    let request =
        eventually("the SpaceRequest", || async { requests.list(&by_claim).await.ok()?.items.into_iter().next() })
            .await;
    let name = request.metadata.name.clone().expect("a name");
    assert!(name.starts_with("dtc-"), "generated from the claim's name: {name}");
    assert_eq!(request.spec.tier_name, TIER);
    assert!(request.spec.target_cluster_roles.is_empty());
    let claimed =
        claim_where(&g, "dtc", "the claim marked", |c| c.annotations().contains_key(ANN_DT_PROVISIONER)).await;
    assert_eq!(claim_phase(&claimed), "Pending");
    // Nudge the binder (a label): it must not ask twice.
    g.patch::<DeploymentTargetClaim>("dtc", json!({"metadata": {"labels": {"nudge": "1"}}})).await;
    claim_where(&g, "dtc", "the claim reconciled again", |c| c.labels().contains_key("nudge")).await;

    // The sandbox operator's part: the namespace and its Secret, then Ready.
    g.secret("sandbox-secret", "Opaque", "sandbox-kubeconfig").await;
    let status = json!({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "Provisioned", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        "targetClusterURL": "https://127.0.0.1:7443",
        "namespaceAccess": [{"name": "team-sandbox", "secretRef": "sandbox-secret"}],
    }});
    requests.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("Ready");
    assert_bound(&g, "dtc", "dtc-dt", true).await;
    let target = g.get::<DeploymentTarget>("dtc-dt").await.expect("the target");
    assert_eq!(target.annotations().get(ANN_PROVISIONED_BY).map(String::as_str), Some(DEVSANDBOX));
    assert_eq!(target.spec.deployment_target_class_name, class.name);
    let credentials = &target.spec.kubernetes_credentials;
    assert_eq!(
        (
            credentials.default_namespace.as_str(),
            credentials.api_url.as_str(),
            credentials.cluster_credentials_secret.as_str()
        ),
        ("team-sandbox", "https://127.0.0.1:7443", "sandbox-secret")
    );
    eventually("the SpaceRequest labelled with its target", || async {
        let request = requests.get(&name).await.ok()?;
        (request.labels().get(LABEL_DT).map(String::as_str) == Some("dtc-dt")).then_some(())
    })
    .await;
    assert_eq!(requests.list(&by_claim).await.expect("list").items.len(), 1, "one SpaceRequest per claim");

    // An Environment on the claim deploys to the sandbox namespace, with a copy of
    // its Opaque Secret.
    g.create(&super::environment::claim_env("sandbox", "dtc")).await;
    let managed = eventually("the ManagedEnvironment", || async {
        g.get::<gitops_writer::api::GitOpsDeploymentManagedEnvironment>("managed-environment-sandbox").await
    })
    .await;
    assert_eq!(managed.spec.api_url, "https://127.0.0.1:7443");
    assert_eq!(managed.spec.credentials_secret, "managed-environment-secret-sandbox");
    assert_eq!(managed.spec.namespaces.as_deref(), Some(&["team-sandbox".to_owned()][..]));

    // A Delete class: the claim's deletion takes the target and the SpaceRequest along,
    // once the sandbox operator lets go of the request (its finalizer).
    g.api::<gitops_appstudio::api::Environment>().delete("sandbox", &DeleteParams::default()).await.expect("delete");
    g.api::<DeploymentTargetClaim>().delete("dtc", &DeleteParams::default()).await.expect("delete the claim");
    eventually("the SpaceRequest being deleted", || async {
        requests.get_opt(&name).await.ok()?.filter(|r| r.metadata.deletion_timestamp.is_some())
    })
    .await;
    requests
        .patch(&name, &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": []}})))
        .await
        .expect("the operator lets go");
    eventually("claim, target and SpaceRequest gone", || async {
        let claim = g.get::<DeploymentTargetClaim>("dtc").await;
        let target = g.get::<DeploymentTarget>("dtc-dt").await;
        let request = requests.get_opt(&name).await.ok()?;
        (claim.is_none() && target.is_none() && request.is_none()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_claim_of_a_missing_class_says_so_and_asks_for_nothing() {
    let g = ground("as-claim-noclass").await;
    let missing = format!("{}-missing", g.ns());
    g.create(&claim("dtc", &missing, None)).await;
    let claim = claim_where(&g, "dtc", "the error condition", |c| {
        c.status.iter().flat_map(|s| &s.conditions).any(|c| c.type_ == "ErrorOccurred" && c.status == "True")
    })
    .await;
    let message = &claim.status.as_ref().expect("status").conditions[0].message;
    assert_eq!(
        message,
        &format!(
            "unable to handle provisioning of SpaceRequest: DeploymentTargetClaim dtc does not have a matching \
             DeploymentTargetClass {missing}: the resource could not be found on the cluster"
        )
    );
    assert_eq!(claim_phase(&claim), "Pending");
    let requests: Api<SpaceRequest> = g.api();
    assert!(requests.list(&ListParams::default()).await.expect("list").items.is_empty());
}
