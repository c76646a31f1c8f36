//! Environment → `managed-environment-<env>`, ported from the original's
//! environment end-to-end cases, plus the fixes: a stale ManagedEnvironment goes when
//! an Environment drops its cluster, and a ManagedEnvironment the core refuses shows
//! in the Environment's conditions.

use gitops_appstudio::api::{
    Condition, DeploymentTarget, DeploymentTargetClaim, DeploymentTargetClaimSpec,
    DeploymentTargetKubernetesClusterCredentials, DeploymentTargetSpec, Environment, EnvironmentSpec,
    KubernetesClusterCredentials, UnstableEnvironmentConfiguration,
};
use gitops_appstudio::environment::desired::INVALID_ENVIRONMENT;
use gitops_appstudio::environment::{CLAIM_NOT_FOUND, CLAIM_NOT_FOUND_MESSAGE, MANAGED_ENVIRONMENT_REFUSED};
use gitops_appstudio::names::{ANN_BIND_COMPLETED, ENVIRONMENT_SECRET_LABEL, MANAGED_ENVIRONMENT_SECRET_TYPE};
use gitops_appstudio::webhook::rules;
use gitops_writer::api::GitOpsDeploymentManagedEnvironment;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use super::{Ground, ground, ground_strict};
use crate::support::eventually;

pub(crate) const API_URL: &str = "https://127.0.0.1:6443";

pub(crate) fn credentials_env(name: &str, credentials: KubernetesClusterCredentials) -> Environment {
    Environment::new(
        name,
        EnvironmentSpec {
            display_name: name.to_owned(),
            deployment_strategy: "AppStudioAutomated".into(),
            unstable_configuration_fields: Some(UnstableEnvironmentConfiguration {
                cluster_type: Some("OpenShift".into()),
                kubernetes_credentials: credentials,
            }),
            ..EnvironmentSpec::default()
        },
    )
}

pub(crate) fn credentials(secret: &str, target_namespace: &str) -> KubernetesClusterCredentials {
    KubernetesClusterCredentials {
        target_namespace: target_namespace.to_owned(),
        api_url: API_URL.to_owned(),
        cluster_credentials_secret: secret.to_owned(),
        ..KubernetesClusterCredentials::default()
    }
}

pub(crate) fn claim_env(name: &str, claim: &str) -> Environment {
    let mut env =
        Environment::new(name, EnvironmentSpec { display_name: name.to_owned(), ..EnvironmentSpec::default() });
    env.spec.configuration.target.deployment_target_claim.claim_name = claim.to_owned();
    env
}

/// A claim and a target bound to each other (as the binder leaves them).
pub(crate) async fn bound_pair(g: &Ground, claim: &str, target: &str, default_namespace: &str, secret: &str) {
    g.create(&DeploymentTarget::new(
        target,
        DeploymentTargetSpec {
            deployment_target_class_name: "test-class".into(),
            kubernetes_credentials: DeploymentTargetKubernetesClusterCredentials {
                default_namespace: default_namespace.to_owned(),
                api_url: "https://127.0.0.1:7443".into(),
                cluster_credentials_secret: secret.to_owned(),
                allow_insecure_skip_tls_verify: true,
            },
            claim_ref: Some(claim.to_owned()),
        },
    ))
    .await;
    g.patch_status::<DeploymentTarget>(target, json!({"phase": "Bound"})).await;
    let mut bound = DeploymentTargetClaim::new(
        claim,
        DeploymentTargetClaimSpec {
            deployment_target_class_name: "test-class".into(),
            target_name: Some(target.to_owned()),
        },
    );
    bound.metadata.annotations = Some([(ANN_BIND_COMPLETED.to_owned(), "true".to_owned())].into());
    g.create(&bound).await;
    g.patch_status::<DeploymentTargetClaim>(claim, json!({"phase": "Bound"})).await;
}

async fn managed_env_where(
    g: &Ground,
    env: &str,
    what: &str,
    check: impl Fn(&GitOpsDeploymentManagedEnvironment) -> bool,
) -> GitOpsDeploymentManagedEnvironment {
    let name = format!("managed-environment-{env}");
    eventually(what, || async { g.get::<GitOpsDeploymentManagedEnvironment>(&name).await.filter(|m| check(m)) }).await
}

fn conditions(env: &Environment) -> Vec<Condition> {
    env.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default()
}

fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

async fn env_conditions_where(
    g: &Ground,
    env: &str,
    what: &str,
    check: impl Fn(&[Condition]) -> bool,
) -> Vec<Condition> {
    eventually(what, || async {
        let conditions = conditions(&g.get::<Environment>(env).await?);
        check(&conditions).then_some(conditions)
    })
    .await
}

#[tokio::test]
async fn a_missing_claim_and_both_modes_are_reported_with_the_originals_conditions() {
    let g = ground("as-env-errors").await;
    g.create(&claim_env("missing-claim", "dtc-doesnt-exist")).await;
    let conditions = env_conditions_where(&g, "missing-claim", "the claim-not-found conditions", |c| {
        find(c, "Reconciled").is_some()
    })
    .await;
    let error = find(&conditions, "ErrorOccurred").expect("ErrorOccurred");
    assert_eq!((error.status.as_str(), error.reason.as_str()), ("True", "ErrorOccurred"));
    let reconciled = find(&conditions, "Reconciled").expect("Reconciled");
    assert_eq!(
        (reconciled.status.as_str(), reconciled.reason.as_str(), reconciled.message.as_str()),
        ("False", CLAIM_NOT_FOUND, CLAIM_NOT_FOUND_MESSAGE)
    );
    assert!(!reconciled.last_transition_time.is_empty());

    let mut both = credentials_env("both", credentials("creds", "ns1"));
    both.spec.configuration.target.deployment_target_claim.claim_name = "some-claim".into();
    g.create(&both).await;
    let conditions =
        env_conditions_where(&g, "both", "the InvalidEnvironment conditions", |c| find(c, "Reconciled").is_some())
            .await;
    let reconciled = find(&conditions, "Reconciled").expect("Reconciled");
    assert_eq!(reconciled.reason, "InvalidEnvironment");
    assert_eq!(
        reconciled.message,
        "Environment is invalid since it cannot have both DeploymentTargetClaim and credentials configuration set"
    );
    assert!(g.get::<GitOpsDeploymentManagedEnvironment>("managed-environment-both").await.is_none());

    // Fixing it resolves the conditions (they stay, flipped, with empty messages). The
    // Secret comes first: a reconcile between the fix and a later Secret would report
    // the missing Secret, and its resolution, instead.
    g.secret("creds", MANAGED_ENVIRONMENT_SECRET_TYPE, "kubeconfig-text").await;
    g.patch::<Environment>(
        "both",
        json!({"spec": {"configuration": {"target": {"deploymentTargetClaim": {"claimName": ""}}}}}),
    )
    .await;
    managed_env_where(&g, "both", "the ManagedEnvironment once valid", |_| true).await;
    let conditions = env_conditions_where(&g, "both", "resolved conditions", |c| {
        find(c, "Reconciled").is_some_and(|r| r.status == "True")
    })
    .await;
    let error = find(&conditions, "ErrorOccurred").expect("ErrorOccurred");
    assert_eq!((error.status.as_str(), error.message.as_str()), ("False", ""));
    assert_eq!(find(&conditions, "Reconciled").expect("Reconciled").reason, "InvalidEnvironmentResolved");
}

#[tokio::test]
async fn credentials_fields_follow_into_the_managed_environment_without_conditions() {
    let g = ground("as-env-creds").await;
    g.secret("creds", MANAGED_ENVIRONMENT_SECRET_TYPE, "kubeconfig-text").await;
    let mut creds = credentials("creds", "team");
    creds.allow_insecure_skip_tls_verify = true;
    let env = g.create(&credentials_env("staging", creds)).await;
    let managed = managed_env_where(&g, "staging", "the ManagedEnvironment", |m| {
        m.spec.allow_insecure_skip_tls_verify == Some(true)
    })
    .await;
    assert_eq!(managed.spec.api_url, API_URL);
    assert_eq!(managed.spec.credentials_secret, "creds");
    let owner = &managed.owner_references()[0];
    assert_eq!(
        (owner.api_version.as_str(), owner.kind.as_str(), owner.name.as_str(), Some(&owner.uid)),
        ("appstudio.redhat.com/v1alpha1", "Environment", "staging", env.metadata.uid.as_ref())
    );

    g.patch::<Environment>(
        "staging",
        json!({"spec": {"unstableConfigurationFields": {"allowInsecureSkipTLSVerify": false}}}),
    )
    .await;
    managed_env_where(&g, "staging", "insecure turned off", |m| m.spec.allow_insecure_skip_tls_verify == Some(false))
        .await;

    g.patch::<Environment>(
        "staging",
        json!({"spec": {"unstableConfigurationFields": {"namespaces": ["a", "b"], "clusterResources": true}}}),
    )
    .await;
    managed_env_where(&g, "staging", "namespaces and cluster resources copied", |m| {
        m.spec.namespaces == Some(vec!["a".into(), "b".into()]) && m.spec.cluster_resources == Some(true)
    })
    .await;
    g.patch::<Environment>("staging", json!({"spec": {"unstableConfigurationFields": {"namespaces": ["c"]}}})).await;
    managed_env_where(&g, "staging", "namespaces updated", |m| m.spec.namespaces == Some(vec!["c".into()])).await;
    g.patch::<Environment>(
        "staging",
        json!({"spec": {"unstableConfigurationFields": {"namespaces": null, "clusterResources": null}}}),
    )
    .await;
    managed_env_where(&g, "staging", "namespaces and cluster resources removed", |m| {
        m.spec.namespaces.is_none() && m.spec.cluster_resources == Some(false)
    })
    .await;
    let env = g.get::<Environment>("staging").await.expect("the Environment");
    assert!(conditions(&env).is_empty(), "no condition on the happy path: {:?}", env.status);

    // Dropping the cluster removes what was made for it (the original kept it).
    g.patch::<Environment>("staging", json!({"spec": {"unstableConfigurationFields": null}})).await;
    eventually("the stale ManagedEnvironment deleted", || async {
        g.get::<GitOpsDeploymentManagedEnvironment>("managed-environment-staging").await.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_bound_claim_gives_the_targets_cluster_and_a_copy_of_its_opaque_secret() {
    let g = ground("as-env-claim").await;
    g.secret("dt-secret", "Opaque", "first").await;
    bound_pair(&g, "dtc", "dt", "space", "dt-secret").await;
    g.create(&claim_env("test-env", "dtc")).await;
    let managed = managed_env_where(&g, "test-env", "the ManagedEnvironment from the target", |_| true).await;
    assert_eq!(managed.spec.api_url, "https://127.0.0.1:7443");
    assert_eq!(managed.spec.credentials_secret, "managed-environment-secret-test-env");
    assert_eq!(managed.spec.allow_insecure_skip_tls_verify, Some(true));
    assert_eq!(managed.spec.namespaces, Some(vec!["space".to_owned()]));
    let copy = g.get::<Secret>("managed-environment-secret-test-env").await.expect("the copy");
    assert_eq!(copy.type_.as_deref(), Some(MANAGED_ENVIRONMENT_SECRET_TYPE));
    assert_eq!(copy.labels().get(ENVIRONMENT_SECRET_LABEL).map(String::as_str), Some("test-env"));
    assert_eq!(copy.data.expect("data")["kubeconfig"].0, b"first");

    // The source changes: the copy follows.
    g.patch::<Secret>("dt-secret", json!({"stringData": {"kubeconfig": "second"}})).await;
    eventually("the copy updated", || async {
        let copy = g.get::<Secret>("managed-environment-secret-test-env").await?;
        (copy.data?.get("kubeconfig")?.0 == b"second").then_some(())
    })
    .await;

    // The target changes URL, Secret and namespace: the ManagedEnvironment follows.
    g.secret("other-secret", MANAGED_ENVIRONMENT_SECRET_TYPE, "third").await;
    g.patch::<DeploymentTarget>(
        "dt",
        json!({"spec": {"kubernetesCredentials": {"apiURL": "https://127.0.0.1:8443",
            "clusterCredentialsSecret": "other-secret", "defaultNamespace": ""}}}),
    )
    .await;
    managed_env_where(&g, "test-env", "the ManagedEnvironment follows the target", |m| {
        m.spec.api_url == "https://127.0.0.1:8443"
            && m.spec.credentials_secret == "other-secret"
            && m.spec.namespaces.is_none()
    })
    .await;
    eventually("the unused copy deleted", || async {
        g.get::<Secret>("managed-environment-secret-test-env").await.is_none().then_some(())
    })
    .await;

    // Back to the Opaque Secret, then it is deleted: the copy goes and the condition says why.
    g.patch::<DeploymentTarget>(
        "dt",
        json!({"spec": {"kubernetesCredentials": {"clusterCredentialsSecret": "dt-secret"}}}),
    )
    .await;
    managed_env_where(&g, "test-env", "the copy used again", |m| {
        m.spec.credentials_secret == "managed-environment-secret-test-env"
    })
    .await;
    g.api::<Secret>().delete("dt-secret", &DeleteParams::default()).await.expect("delete the source");
    eventually("the copy deleted with its source", || async {
        g.get::<Secret>("managed-environment-secret-test-env").await.is_none().then_some(())
    })
    .await;
    let conditions = env_conditions_where(&g, "test-env", "SecretNotFound", |c| {
        find(c, "Reconciled").is_some_and(|r| r.reason == "SecretNotFound")
    })
    .await;
    assert_eq!(
        find(&conditions, "Reconciled").expect("Reconciled").message,
        "the secret dt-secret referenced by the Environment resource was not found"
    );
}

#[tokio::test]
async fn an_unbound_claim_waits_without_a_condition_and_an_empty_namespace_gives_none() {
    let g = ground("as-env-unbound").await;
    g.secret("dt-secret", MANAGED_ENVIRONMENT_SECRET_TYPE, "k").await;
    g.create(&DeploymentTargetClaim::new(
        "pending",
        DeploymentTargetClaimSpec { deployment_target_class_name: "test-class".into(), target_name: None },
    ))
    .await;
    g.create(&claim_env("waiting", "pending")).await;
    // A second Environment whose claim is bound shows the controller at work; by
    // then the first has been reconciled at least as often (one queue, both created).
    bound_pair(&g, "dtc", "dt", "", "dt-secret").await;
    g.create(&claim_env("bound", "dtc")).await;
    let managed = managed_env_where(&g, "bound", "the bound Environment's ManagedEnvironment", |_| true).await;
    assert_eq!(managed.spec.namespaces, None, "no default namespace: no limit");
    assert_eq!(managed.spec.credentials_secret, "dt-secret", "a managed-environment Secret is used as it is");
    assert!(g.get::<GitOpsDeploymentManagedEnvironment>("managed-environment-waiting").await.is_none());
    assert!(conditions(&g.get::<Environment>("waiting").await.expect("env")).is_empty());

    // A target reserved for the waiting claim appears: the binder binds them, and
    // the Environment follows.
    let reserved = DeploymentTarget::new(
        "dt-for-pending",
        DeploymentTargetSpec {
            deployment_target_class_name: "test-class".into(),
            kubernetes_credentials: DeploymentTargetKubernetesClusterCredentials {
                default_namespace: "space".into(),
                api_url: "https://127.0.0.1:9443".into(),
                cluster_credentials_secret: "dt-secret".into(),
                allow_insecure_skip_tls_verify: false,
            },
            claim_ref: Some("pending".into()),
        },
    );
    g.create(&reserved).await;
    let managed = managed_env_where(&g, "waiting", "the waiting Environment's ManagedEnvironment", |_| true).await;
    assert_eq!(managed.spec.api_url, "https://127.0.0.1:9443");
    assert!(conditions(&g.get::<Environment>("waiting").await.expect("env")).is_empty());
}

#[tokio::test]
async fn a_refused_managed_environment_is_shown_on_the_environment() {
    let g = ground("as-env-refused").await;
    g.secret("creds", MANAGED_ENVIRONMENT_SECRET_TYPE, "k").await;
    // Nothing the layer's own rules look at, but the core's schema refuses it.
    let mut creds = credentials("creds", "team");
    creds.namespaces = vec!["Not_A_Namespace".into()];
    g.create(&credentials_env("bad-namespaces", creds)).await;
    let conditions =
        env_conditions_where(&g, "bad-namespaces", "the refusal", |c| find(c, "Reconciled").is_some()).await;
    let reconciled = find(&conditions, "Reconciled").expect("Reconciled");
    assert_eq!(reconciled.reason, MANAGED_ENVIRONMENT_REFUSED);
    assert!(reconciled.message.contains("managed-environment-bad-namespaces"), "{}", reconciled.message);
    assert!(reconciled.message.contains("namespaces"), "names the field: {}", reconciled.message);
}

/// Where no webhook is installed, the controller applies its rules: an API URL
/// that is not `https`, or (without `--api-url-allow-private`) points at loopback,
/// and a DeploymentTarget's likewise, become `InvalidEnvironment`, and no
/// ManagedEnvironment is made for them.
#[tokio::test]
async fn the_controller_refuses_what_the_webhook_would_without_making_a_managed_environment() {
    let g = ground_strict("as-env-rules").await;
    g.secret("creds", MANAGED_ENVIRONMENT_SECRET_TYPE, "k").await;
    let mut plain = credentials("creds", "team");
    plain.api_url = "http://cluster.example.invalid:6443".into();
    g.create(&credentials_env("plain-http", plain)).await;
    // Loopback: fine in the other tests' settings, refused in these.
    g.create(&credentials_env("loopback", credentials("creds", "team"))).await;
    let mut public = credentials("creds", "team");
    public.api_url = "https://cluster.example.invalid:6443".into();
    g.create(&credentials_env("public", public)).await;
    g.secret("target-creds", "Opaque", "k").await;
    bound_pair(&g, "claim", "target", "team", "target-creds").await;
    g.create(&claim_env("by-target", "claim")).await;
    for (env, says) in [
        ("plain-http", rules::API_URL_SENTENCE),
        ("loopback", "apiURL points at a loopback"),
        ("by-target", "DeploymentTarget target: spec.kubernetesCredentials.apiURL points at a loopback"),
    ] {
        let conditions = env_conditions_where(&g, env, "the refusal", |c| find(c, "Reconciled").is_some()).await;
        let reconciled = find(&conditions, "Reconciled").expect("Reconciled");
        assert_eq!(reconciled.reason, INVALID_ENVIRONMENT, "{env}");
        assert!(reconciled.message.contains(says), "{env}: {}", reconciled.message);
    }
    // The valid one is made; it is the witness that the controller ran on all four.
    managed_env_where(&g, "public", "the public Environment's ManagedEnvironment", |_| true).await;
    for env in ["plain-http", "loopback", "by-target"] {
        let name = format!("managed-environment-{env}");
        assert!(g.get::<GitOpsDeploymentManagedEnvironment>(&name).await.is_none(), "{name} was made");
    }
}

#[tokio::test]
async fn managed_environments_of_gone_environments_are_deleted_whichever_owner_reference() {
    let g = ground("as-env-owners").await;
    // The original's owner reference (wrong group) to an Environment that does not exist.
    let legacy: GitOpsDeploymentManagedEnvironment = serde_json::from_value(json!({
        "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeploymentManagedEnvironment",
        "metadata": {"name": "managed-environment-name", "ownerReferences": [{
            "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "Environment",
            "name": "name", "uid": "4c4a6c65-0000-4000-8000-000000000001"}]},
        "spec": {"apiURL": API_URL, "credentialsSecret": "creds"}
    }))
    .expect("a ManagedEnvironment");
    // Unrelated, without such an owner: left alone.
    let mut own = legacy.clone();
    own.metadata.name = Some("tenant-own".into());
    own.metadata.owner_references = None;
    g.api::<GitOpsDeploymentManagedEnvironment>().create(&PostParams::default(), &own).await.expect("create");
    g.api::<GitOpsDeploymentManagedEnvironment>().create(&PostParams::default(), &legacy).await.expect("create");
    eventually("the legacy-owned ManagedEnvironment deleted", || async {
        g.get::<GitOpsDeploymentManagedEnvironment>("managed-environment-name").await.is_none().then_some(())
    })
    .await;
    assert!(g.get::<GitOpsDeploymentManagedEnvironment>("tenant-own").await.is_some());

    // Deleting an Environment takes its ManagedEnvironment with it (garbage collection).
    g.secret("creds", MANAGED_ENVIRONMENT_SECRET_TYPE, "k").await;
    g.create(&credentials_env("short-lived", credentials("creds", "team"))).await;
    managed_env_where(&g, "short-lived", "the ManagedEnvironment", |_| true).await;
    g.api::<Environment>().delete("short-lived", &DeleteParams::foreground()).await.expect("delete");
    eventually("the ManagedEnvironment collected", || async {
        g.get::<GitOpsDeploymentManagedEnvironment>("managed-environment-short-lived").await.is_none().then_some(())
    })
    .await;
}
