//! Dynamically provisioned DeploymentTargets going away, and the SpaceRequest
//! controller's edge cases, ported from the original's `dt_dtc_dtclass`,
//! `devsandboxdeployment` and `sandboxprovisioner` cases. The test plays the sandbox
//! operator: it writes SpaceRequest status and removes the operator's finalizer.
//!
//! Where the original waited ("Consistently") to show that something does not
//! happen, these tests wait instead until the controller in question has finished
//! a reconcile that began after the state was written (the layer's reconcile
//! counters, read in-process), and then look.

use std::sync::Arc;
use std::time::Duration;

use gitops_appstudio::api::{DeploymentTarget, DeploymentTargetClaim, SpaceRequest, SpaceRequestSpec};
use gitops_appstudio::claim::provision::{FINALIZER_TOOLCHAIN, LABEL_DT, LABEL_DTC, TIER};
use gitops_appstudio::context::Settings;
use gitops_appstudio::metrics::Metrics;
use gitops_appstudio::names::ANN_DT_PROVISIONER;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

use super::claim::{
    assert_bound, claim, claim_phase, claim_where, class, class_of, target, target_phase, target_where,
};
use super::{Ground, ground_counted, reconciled_since_now};
use crate::support::eventually;

/// How long a SpaceRequest may report `UnableToTerminate` before its target fails
/// (the original's 2 minutes).
const TERMINATION_TIMEOUT: Duration = Duration::from_secs(1);

/// A ground whose controllers count their reconciles into the returned metrics, with
/// the reclaimer's delays in fractions of a second.
async fn counted_ground(purpose: &str) -> (Ground, Arc<Metrics>) {
    let settings = Settings {
        api_url_allow_private: true,
        reclaim_poll: Duration::from_millis(100),
        space_request_termination_timeout: TERMINATION_TIMEOUT,
        ..Settings::default()
    };
    let metrics = Arc::new(Metrics::default());
    (ground_counted(purpose, settings, metrics.clone()).await, metrics)
}

/// Edits `name`'s labels (any kind of the ground), so its controller looks again.
async fn nudge<K>(g: &Ground, name: &str, round: u32)
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let patch = json!({"metadata": {"labels": {"nudge": round.to_string()}}});
    g.api::<K>().patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("nudge");
}

/// The SpaceRequest status a sandbox operator writes: `Ready` with `reason`, one
/// namespace and its Secret.
fn operator_status(reason: &str, secret: &str) -> serde_json::Value {
    json!({
        "conditions": [{"type": "Ready", "status": "True", "reason": reason, "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        "targetClusterURL": "https://127.0.0.1:7443",
        "namespaceAccess": [{"name": "team-sandbox", "secretRef": secret}],
    })
}

/// A claim of `class` without a target, provisioned: the test answers its
/// SpaceRequest as the sandbox operator would, and the claim binds `<claim>-dt`.
/// Returns the SpaceRequest's name.
async fn provisioned(g: &Ground, class: &str, claim_name: &str) -> String {
    g.create(&claim(claim_name, class, None)).await;
    let requests: Api<SpaceRequest> = g.api();
    let by_claim = ListParams::default().labels(&format!("{LABEL_DTC}={claim_name}"));
    let request =
        eventually("the SpaceRequest", || async { requests.list(&by_claim).await.ok()?.items.into_iter().next() })
            .await;
    let name = request.name_any();
    let secret = format!("{claim_name}-secret");
    g.secret(&secret, "Opaque", "sandbox-kubeconfig").await;
    g.patch_status::<SpaceRequest>(&name, operator_status("Provisioned", &secret)).await;
    let target_name = format!("{claim_name}-dt");
    assert_bound(g, claim_name, &target_name, true).await;
    eventually("the SpaceRequest labelled with its target", || async {
        let request = g.get::<SpaceRequest>(&name).await?;
        (request.labels().get(LABEL_DT) == Some(&target_name)).then_some(())
    })
    .await;
    name
}

/// Deletes the claim and waits until target and SpaceRequest are being deleted, the
/// request held by the sandbox operator's finalizer (the reclaimer puts it there).
async fn delete_claim_until_request_terminates(g: &Ground, claim_name: &str, request: &str) {
    g.api::<DeploymentTargetClaim>().delete(claim_name, &DeleteParams::default()).await.expect("delete the claim");
    target_where(g, &format!("{claim_name}-dt"), "the target being deleted", |t| {
        t.metadata.deletion_timestamp.is_some()
    })
    .await;
    let terminating = eventually("the SpaceRequest being deleted", || async {
        g.get::<SpaceRequest>(request).await.filter(|r| r.metadata.deletion_timestamp.is_some())
    })
    .await;
    assert!(
        terminating.finalizers().iter().any(|f| f == FINALIZER_TOOLCHAIN),
        "the reclaimer holds the request for the operator: {:?}",
        terminating.finalizers()
    );
}

/// The sandbox operator lets go of the request.
async fn release_request(g: &Ground, request: &str) {
    g.patch::<SpaceRequest>(request, json!({"metadata": {"finalizers": []}})).await;
}

/// Waits until the claim, the target and the SpaceRequest are all gone.
async fn all_gone(g: &Ground, claim_name: &str, target_name: &str, request: &str) {
    eventually("claim, target and SpaceRequest gone", || async {
        let claim = g.get::<DeploymentTargetClaim>(claim_name).await;
        let target = g.get::<DeploymentTarget>(target_name).await;
        let request = g.get::<SpaceRequest>(request).await;
        (claim.is_none() && target.is_none() && request.is_none()).then_some(())
    })
    .await;
}

/// Leaves the namespace empty of claims, targets and SpaceRequests (a finalizer left
/// behind would hold the namespace's deletion on a real cluster).
async fn clean(g: &Ground) {
    let all = ListParams::default();
    let deadline = std::time::Instant::now() + crate::support::DEADLINE;
    loop {
        let (Ok(claims), Ok(targets), Ok(requests)) = (
            g.api::<DeploymentTargetClaim>().list(&all).await,
            g.api::<DeploymentTarget>().list(&all).await,
            g.api::<SpaceRequest>().list(&all).await,
        ) else {
            assert!(std::time::Instant::now() < deadline, "timed out listing what to clean");
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let (claims, targets, requests) = (claims.items, targets.items, requests.items);
        if claims.is_empty() && targets.is_empty() && requests.is_empty() {
            return;
        }
        let left = |kind: &str, meta: &kube::api::ObjectMeta| {
            format!(
                "{kind} {} (deleting: {}, finalizers: {:?})",
                meta.name.as_deref().unwrap_or_default(),
                meta.deletion_timestamp.is_some(),
                meta.finalizers.as_deref().unwrap_or_default()
            )
        };
        let remaining: Vec<String> = (claims.iter().map(|c| left("claim", &c.metadata)))
            .chain(targets.iter().map(|t| left("target", &t.metadata)))
            .chain(requests.iter().map(|r| left("SpaceRequest", &r.metadata)))
            .collect();
        assert!(std::time::Instant::now() < deadline, "timed out cleaning up; left: {remaining:?}");
        for claim in claims.iter().filter(|c| c.metadata.deletion_timestamp.is_none()) {
            g.api::<DeploymentTargetClaim>().delete(&claim.name_any(), &DeleteParams::default()).await.ok();
        }
        for target in targets.iter().filter(|t| t.metadata.deletion_timestamp.is_none()) {
            g.api::<DeploymentTarget>().delete(&target.name_any(), &DeleteParams::default()).await.ok();
        }
        for request in &requests {
            let strip = json!({"metadata": {"finalizers": []}});
            let api = g.api::<SpaceRequest>();
            api.patch(&request.name_any(), &PatchParams::default(), &Patch::Merge(&strip)).await.ok();
            api.delete(&request.name_any(), &DeleteParams::default()).await.ok();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// dt_dtc 2: with a `Delete` class, deleting the claim deletes the target and its
/// SpaceRequest; while the request terminates, request, target and claim all stay
/// (the target `Released`, not `Failed`: the operator is not stuck); once the
/// operator lets go of the request, all three go.
#[tokio::test]
async fn a_terminating_space_request_keeps_its_target_and_claim_until_it_goes() {
    let (g, metrics) = counted_ground("as-dyn-terminating").await;
    let class = class(&g, "Delete").await;
    let request = provisioned(&g, &class.name, "dtc").await;
    delete_claim_until_request_terminates(&g, "dtc", &request).await;
    g.patch_status::<SpaceRequest>(&request, operator_status("Terminating", "dtc-secret")).await;

    reconciled_since_now(&metrics, "target", |round| nudge::<DeploymentTarget>(&g, "dtc-dt", round)).await;
    reconciled_since_now(&metrics, "claim", |round| nudge::<DeploymentTargetClaim>(&g, "dtc", round)).await;
    assert!(g.get::<SpaceRequest>(&request).await.is_some(), "the request terminates");
    let target = g.get::<DeploymentTarget>("dtc-dt").await.expect("the target waits for its SpaceRequest");
    assert_eq!(target_phase(&target), "Released", "terminating within time is no failure");
    let claim = g.get::<DeploymentTargetClaim>("dtc").await.expect("the claim waits for its target");
    assert!(claim.metadata.deletion_timestamp.is_some());

    release_request(&g, &request).await;
    all_gone(&g, "dtc", "dtc-dt", &request).await;
    clean(&g).await;
}

/// dt_dtc 3: with a `Retain` class, deleting the claim leaves target and SpaceRequest
/// alone; the target is `Released` with no claim.
#[tokio::test]
async fn a_retained_provisioned_target_outlives_its_claim_with_its_space_request() {
    let (g, metrics) = counted_ground("as-dyn-retain").await;
    let class = class(&g, "Retain").await;
    let request = provisioned(&g, &class.name, "dtc").await;
    g.api::<DeploymentTargetClaim>().delete("dtc", &DeleteParams::default()).await.expect("delete the claim");
    eventually("the claim gone", || async { g.get::<DeploymentTargetClaim>("dtc").await.is_none().then_some(()) })
        .await;
    target_where(&g, "dtc-dt", "the target Released and free", |t| {
        target_phase(t) == "Released" && t.spec.claim_ref.is_none()
    })
    .await;

    // The reclaimer and the SpaceRequest controller have looked since: neither the
    // target nor the orphaned request (its target's class says Retain) is deleted.
    reconciled_since_now(&metrics, "target", |round| nudge::<DeploymentTarget>(&g, "dtc-dt", round)).await;
    reconciled_since_now(&metrics, "spacerequest", |round| nudge::<SpaceRequest>(&g, &request, round)).await;
    let target = g.get::<DeploymentTarget>("dtc-dt").await.expect("the target stays");
    assert!(target.metadata.deletion_timestamp.is_none(), "the target is not being deleted");
    assert_eq!(target_phase(&target), "Released");
    let kept = g.get::<SpaceRequest>(&request).await.expect("the SpaceRequest stays");
    assert!(kept.metadata.deletion_timestamp.is_none(), "the SpaceRequest is not being deleted");
    clean(&g).await;
}

/// dt_dtc 4: a SpaceRequest that reports `UnableToTerminate` for longer than the
/// timeout makes its target `Failed` (and it stays so); when the operator finally
/// lets go of the request, target and claim go too.
#[tokio::test]
async fn a_space_request_unable_to_terminate_fails_its_target_until_it_goes() {
    let (g, metrics) = counted_ground("as-dyn-stuck").await;
    let class = class(&g, "Delete").await;
    let request = provisioned(&g, &class.name, "dtc").await;
    delete_claim_until_request_terminates(&g, "dtc", &request).await;
    g.patch_status::<SpaceRequest>(&request, operator_status("UnableToTerminate", "dtc-secret")).await;
    let failed = target_where(&g, "dtc-dt", "the target Failed", |t| target_phase(t) == "Failed").await;
    assert!(failed.metadata.deletion_timestamp.is_some());
    assert!(g.get::<SpaceRequest>(&request).await.is_some(), "the request still terminates");

    // Failed stays: neither the reclaimer nor the waiting claim's release rewrites it.
    reconciled_since_now(&metrics, "target", |round| nudge::<DeploymentTarget>(&g, "dtc-dt", round)).await;
    reconciled_since_now(&metrics, "claim", |round| nudge::<DeploymentTargetClaim>(&g, "dtc", round)).await;
    let target = g.get::<DeploymentTarget>("dtc-dt").await.expect("the target waits for its SpaceRequest");
    assert_eq!(target_phase(&target), "Failed");
    assert!(g.get::<DeploymentTargetClaim>("dtc").await.is_some(), "the claim waits for its target");

    release_request(&g, &request).await;
    all_gone(&g, "dtc", "dtc-dt", &request).await;
    clean(&g).await;
}

/// dt_dtc 5: deleting the provisioned target of a `Delete` class (its finalizer
/// removed first, as the original's test does) leaves the claim in place, `Lost`.
#[tokio::test]
async fn deleting_a_provisioned_target_leaves_its_claim_lost() {
    let (g, _metrics) = counted_ground("as-dyn-target-gone").await;
    let class = class(&g, "Delete").await;
    provisioned(&g, &class.name, "dtc").await;
    let targets = g.api::<DeploymentTarget>();
    // The reclaimer puts its finalizer back on a live target: strip and delete until
    // the target is gone.
    eventually("the target deleted without its finalizer", || async {
        if g.get::<DeploymentTarget>("dtc-dt").await.is_none() {
            return Some(());
        }
        let strip = json!({"metadata": {"finalizers": []}});
        targets.patch("dtc-dt", &PatchParams::default(), &Patch::Merge(&strip)).await.ok();
        targets.delete("dtc-dt", &DeleteParams::default()).await.ok();
        None
    })
    .await;
    let lost = claim_where(&g, "dtc", "the claim Lost", |c| claim_phase(c) == "Lost").await;
    assert!(lost.metadata.deletion_timestamp.is_none(), "the claim is not deleted with its target");
    assert_eq!(lost.spec.target_name.as_deref(), Some("dtc-dt"));
    clean(&g).await;
}

/// A SpaceRequest of a claim, tier `appstudio-env`, named `name`.
fn space_request(name: &str, claim_label: &str) -> SpaceRequest {
    let mut request = SpaceRequest::new(name, SpaceRequestSpec { tier_name: TIER.into(), ..Default::default() });
    request.metadata.labels = Some([(LABEL_DTC.to_owned(), claim_label.to_owned())].into());
    request
}

/// devsandboxdeployment 2: a Ready SpaceRequest of a claim that already has its
/// target (reserved by claimRef) is labelled with that target, and no second one is
/// made. The target is made first: the reclaimer keeps it reserved for the claim
/// that does not exist yet (it releases only a target that was bound).
#[tokio::test]
async fn a_ready_space_request_of_a_claim_with_a_target_makes_no_second_one() {
    let (g, metrics) = counted_ground("as-dyn-existing").await;
    let class = class(&g, "Retain").await;
    g.create(&target("existing-dt", &class.name, Some("dtc"))).await;
    reconciled_since_now(&metrics, "target", |round| nudge::<DeploymentTarget>(&g, "existing-dt", round)).await;
    let waiting = g.get::<DeploymentTarget>("existing-dt").await.expect("the target");
    assert_eq!(waiting.spec.claim_ref.as_deref(), Some("dtc"), "still reserved for the claim to come");
    assert_ne!(target_phase(&waiting), "Released");
    g.create(&claim("dtc", &class.name, None)).await;
    assert_bound(&g, "dtc", "existing-dt", true).await;
    g.create(&space_request("dtc-request", "dtc")).await;
    g.secret("dtc-secret", "Opaque", "sandbox-kubeconfig").await;
    g.patch_status::<SpaceRequest>("dtc-request", operator_status("Provisioned", "dtc-secret")).await;
    eventually("the SpaceRequest labelled with the existing target", || async {
        let request = g.get::<SpaceRequest>("dtc-request").await?;
        (request.labels().get(LABEL_DT).map(String::as_str) == Some("existing-dt")).then_some(())
    })
    .await;
    let targets = g.api::<DeploymentTarget>().list(&ListParams::default()).await.expect("list").items;
    let names: Vec<String> = targets.iter().map(ResourceExt::name_any).collect();
    assert_eq!(names, ["existing-dt"], "exactly one target for the claim");
    clean(&g).await;
}

/// devsandboxdeployment 3: a Ready SpaceRequest labelled with a claim that does not
/// exist makes no target.
#[tokio::test]
async fn a_ready_space_request_of_another_claim_makes_no_target() {
    let (g, metrics) = counted_ground("as-dyn-wrong-label").await;
    // A dev-sandbox class that keeps orphaned requests: the request stays to be looked at.
    let _retain = class(&g, "Retain").await;
    let missing = format!("{}-missing", g.ns());
    g.create(&claim("dtc", &missing, None)).await;
    g.create(&space_request("dtc-request", "wrongvalue")).await;
    g.secret("dtc-secret", "Opaque", "sandbox-kubeconfig").await;
    g.patch_status::<SpaceRequest>("dtc-request", operator_status("Provisioned", "dtc-secret")).await;
    reconciled_since_now(&metrics, "spacerequest", |round| nudge::<SpaceRequest>(&g, "dtc-request", round)).await;
    let targets = g.api::<DeploymentTarget>().list(&ListParams::default()).await.expect("list").items;
    assert!(targets.is_empty(), "no target: {:?}", targets.iter().map(ResourceExt::name_any).collect::<Vec<_>>());
    clean(&g).await;
}

/// sandboxprovisioner 3: a claim of a class whose provisioner is not the dev
/// sandbox's is marked for that provisioner, but the layer asks for no SpaceRequest.
#[tokio::test]
async fn a_claim_of_another_provisioner_gets_no_space_request() {
    let (g, metrics) = counted_ground("as-dyn-other").await;
    let class = class_of(&g, "other", "example.invalid/other-provisioner", "Delete").await;
    g.create(&claim("dtc", &class.name, None)).await;
    claim_where(&g, "dtc", "the claim marked for its provisioner", |c| {
        c.annotations().get(ANN_DT_PROVISIONER) == Some(&class.name) && claim_phase(c) == "Pending"
    })
    .await;
    // The binder has looked at the marked claim since: still no SpaceRequest.
    reconciled_since_now(&metrics, "claim", |round| nudge::<DeploymentTargetClaim>(&g, "dtc", round)).await;
    let requests = g.api::<SpaceRequest>().list(&ListParams::default()).await.expect("list").items;
    assert!(
        requests.is_empty(),
        "no SpaceRequest: {:?}",
        requests.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );
    assert_eq!(claim_phase(&g.get::<DeploymentTargetClaim>("dtc").await.expect("the claim")), "Pending");
    clean(&g).await;
}
